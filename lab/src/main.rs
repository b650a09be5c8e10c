//! `kuport-lab`: a fake cluster in network namespaces on one Linux host (underlay bridge,
//! wireguard-go mesh, internet side, CNI emulation, pods running echo responders), the real
//! `kuport agent` on every node against the API server model, and scenario files that probe the
//! datapath from real clients. `cargo lab` runs every scenario in `lab/scenarios/`.

mod agentpods;
mod cluster;
mod hostbench;
mod hostres;
mod image;
mod labbench;
mod localcluster;
mod prereq;
mod probe;
mod realcilium;
mod realnode;
mod record;
mod report;
mod routed;
mod runner;
mod scale;
mod scenario;
mod sys;
mod topology;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kuport-lab",
    args_conflicts_with_subcommands = true,
    version,
    about = "kuport's network-namespace lab: proves the datapath end to end with the real agent",
    long_about = "kuport's network-namespace lab. Builds a fake cluster out of network namespaces \
(underlay bridge, wireguard-go mesh, internet clients, VPN clients, an emulated CNI, pods running \
echo responders), runs the real `kuport agent` on every node against the API server model, and \
probes every mapping from real clients. Needs root. Without a subcommand it runs every scenario \
in lab/scenarios/ (what `cargo lab` does)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a subcommand: the options of `run` (so `cargo lab --report r.json` works).
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Scenario files; none: every `*.yaml` in lab/scenarios/.
    files: Vec<PathBuf>,
    /// Also write the JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Leave the last scenario's lab up and print how to enter it (`kuport-lab down` removes it).
    #[arg(long)]
    keep: bool,
    /// Run every agent from this image (an OCI archive, as `deploy/image/build-local.sh`
    /// writes): its own root filesystem, read-only, as UID 0 with only CAP_NET_ADMIN.
    #[arg(long, value_name = "ARCHIVE")]
    agent_image: Option<PathBuf>,
    /// The API server: the model (default), or the real control plane built by
    /// `just control-plane`, with the real EndpointSlice and node-lifecycle controllers.
    #[arg(long, value_enum, default_value = "model")]
    apiserver: runner::ApiServer,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenario files (default: every scenario in lab/scenarios/), print a table, exit 1 on
    /// any failure.
    Run(RunArgs),
    /// Remove everything a lab created (namespaces, processes), by the names and pids recorded.
    Down,
    /// Load and check scenario files without running them (no root needed): prints `ok
    /// <file> (<scenario>)` for each, or the first error naming the file and the field.
    Check {
        /// Scenario files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Start a real Kubernetes cluster in the lab's network: containerd, kubelet and
    /// kube-proxy in every node namespace, the control plane of e2e/controlplane with the
    /// scheduler and every controller; import the images given; write the cluster's
    /// description when every node is Ready; remove everything on SIGINT or SIGTERM.
    Cluster(localcluster::ClusterArgs),
    /// Print the directory holding kuport's binaries of this build (kuport, kuport-sim,
    /// kuport-echo), building them first only when missing or older than the sources, as
    /// every other command does: binaries a `cargo test --workspace` just built are used as
    /// they are.
    Bins,
    /// Measure the datapath and the control plane; print the results as a Markdown table.
    Bench {
        /// Also write the results into this Markdown file, between the lab-bench markers.
        #[arg(long)]
        write: Option<PathBuf>,
        /// Only this part: `lab` (through a fake cluster), `links` (the link health rows of the
        /// lab part), `tcp` (its TCP throughput rows and the offload experiment), `ipv6` (the
        /// IPv6 rows of both parts), `host` (nft, flows, memory, conntrack), `host-ipv6` (the
        /// host part's IPv6 rows: UDP flows through an IPv6 node), `memory` (the host part's
        /// agent memory rows) or `conntrack` (the memory and time of a sweep of stale
        /// conntrack entries, up to 1,000,000 entries). With `--write`, a partial run replaces
        /// its own rows and keeps the others.
        #[arg(long)]
        only: Option<String>,
    },
    /// The scale harness: a generated cluster of thousands of nodes in the API server model,
    /// the real agent code as tasks on simulated time, kubelet heartbeats, pod moves and node
    /// flaps; prints a JSON report of object sizes, API requests, conflicts, watch bytes,
    /// latency, memory and plan time (`docs/performance.md`, "Scale harness"). No root needed.
    Scale(scale::ScaleArgs),
    /// One agent process of the scale harness (started by `scale` for its memory).
    #[command(name = "__scale-agent", hide = true)]
    ScaleAgent(scale::AgentProcessArgs),
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = hostbench::hidden_main(&args) {
        return code;
    }
    let cli = Cli::parse();
    let cli = match cli.command {
        Some(Command::Scale(args)) => return exit_code(scale::run(args)),
        Some(Command::ScaleAgent(args)) => return exit_code(scale::agent(args)),
        _ => cli,
    };
    if let Some(Command::Check { files }) = &cli.command {
        return check(files);
    }
    if !rustix::process::geteuid().is_root() {
        return not_root(&args);
    }
    let result = match cli.command {
        None => run(cli.run),
        Some(Command::Run(a)) => run(a),
        Some(Command::Down) => sys::down().map(|line| {
            let _ = std::fs::remove_dir_all(image::unpack_dir());
            if !line.is_empty() {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }),
        Some(Command::Bench { write, only }) => bench(write, only.as_deref()),
        Some(Command::Check { files }) => Ok(check(&files)),
        Some(Command::Cluster(args)) => localcluster::run(args),
        Some(Command::Bins) => prereq::binaries().map(|dir| {
            println!("{}", dir.display());
            ExitCode::SUCCESS
        }),
        Some(Command::Scale(_) | Command::ScaleAgent(_)) => Ok(ExitCode::SUCCESS),
    };
    exit_code(result)
}

/// The exit code of a command's result, its error printed.
fn exit_code(result: Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kuport-lab: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Exits 2 with the exact sudo command (absolute paths: sudo loses rustup's PATH).
fn not_root(args: &[String]) -> ExitCode {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "kuport-lab".into());
    let mut line = format!("sudo {exe}");
    for a in args.iter().skip(1) {
        line.push(' ');
        line.push_str(a);
    }
    if args.len() <= 1 {
        line.push_str(" run");
    }
    eprintln!("kuport-lab needs root (it creates network namespaces). Run:\n  {line}");
    ExitCode::from(2)
}

/// The directory of the committed scenarios (this crate's `scenarios/`).
fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

fn run(args: RunArgs) -> Result<ExitCode> {
    let RunArgs {
        files,
        report: report_path,
        keep,
        agent_image,
        apiserver,
    } = args;
    if apiserver == runner::ApiServer::Real && (keep || agent_image.is_some()) {
        anyhow::bail!(
            "--apiserver real runs the control plane inside this process: it cannot be kept, and an agent in the image cannot read its certificate authority"
        );
    }
    let scenarios = load_scenarios(files)?;
    prereq::ensure_tools()?;
    let bins = prereq::binaries()?;
    let image = match &agent_image {
        Some(archive) => {
            eprintln!(
                "kuport-lab: unpacking the agent image {}",
                archive.display()
            );
            Some(image::AgentImage::unpack(archive)?)
        }
        None => None,
    };
    let (mut lab, original, rt) = session()?;
    let mut report = report::Report::default();
    let count = scenarios.len();
    for (i, s) in scenarios.iter().enumerate() {
        let keep_this = keep && i + 1 == count;
        eprintln!("kuport-lab: [{}/{count}] {}", i + 1, s.name);
        let interrupted = rt.block_on(async {
            tokio::select! {
                (r, kept) = runner::run_scenario(&mut lab, s, &bins, image.as_ref(), apiserver, &original, keep_this) => {
                    eprintln!("kuport-lab:   {} in {:.1} s", if r.ok { "ok" } else { "FAILED" }, r.seconds);
                    report.push(r);
                    if let Some(topo) = kept {
                        print_keep(&topo);
                    }
                    false
                }
                _ = tokio::signal::ctrl_c() => true,
            }
        });
        if interrupted {
            let _ = runner::enter_netns_of(&original);
            let left = lab.teardown();
            eprintln!("kuport-lab: interrupted; removed the lab (left: {left:?})");
            return Ok(ExitCode::from(130));
        }
    }
    if let (true, Some(image)) = (keep, image) {
        image.keep();
    }
    finish(&report, report_path, keep)
}

/// `check`: loads every file as `run` would, creating nothing; exit 2 on the first that does not
/// load.
fn check(files: &[PathBuf]) -> ExitCode {
    for f in files {
        match scenario::load(f) {
            Ok(s) => {
                // A reader that went away (`| head`) is no failure of the files.
                let _ = writeln!(std::io::stdout(), "ok {} ({})", f.display(), s.name);
            }
            Err(e) => {
                eprintln!("kuport-lab: {e:#}");
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}

/// The scenarios of `files`, or of every file in the scenarios directory when none is named.
fn load_scenarios(files: Vec<PathBuf>) -> Result<Vec<scenario::Scenario>> {
    let files = if files.is_empty() {
        scenario::files_in(&scenarios_dir())?
    } else {
        files
    };
    let mut scenarios = Vec::new();
    for f in &files {
        scenarios.push(scenario::load(f)?);
    }
    Ok(scenarios)
}

/// Prints the report's table, writes it to `report_path` when given, and counts a host left
/// unclean (without `keep`) as one more failure.
fn finish(report: &report::Report, report_path: Option<PathBuf>, keep: bool) -> Result<ExitCode> {
    print!("{}", report::table(report));
    if let Some(path) = report_path {
        let text = serde_json::to_string_pretty(report).context("encoding the report")?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("report: {}", path.display());
    }
    let mut failed = report.failed;
    if !keep {
        let left = leftovers();
        if !left.is_empty() {
            println!("left behind after the lab: {}", left.join(", "));
            failed += usize::from(report.failed == 0);
        }
    }
    println!("{} passed, {} failed", report.passed, failed);
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The lab's record, a handle on the namespace the lab started in (to come back to after each
/// scenario: the API client's thread moves into the lab's underlay) and the runtime.
fn session() -> Result<(sys::Lab, std::fs::File, tokio::runtime::Runtime)> {
    let lab = sys::Lab::open()?;
    let original = std::fs::File::open("/proc/thread-self/ns/net")
        .context("opening this thread's network namespace")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    Ok((lab, original, rt))
}

/// Namespaces or processes of the lab still present after a run that did not `--keep`.
fn leftovers() -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("kl-"))
                .map(|n| format!("namespace {n}"))
                .collect()
        })
        .unwrap_or_default();
    let state =
        std::fs::read_to_string(Path::new(sys::RUN_DIR).join("state.json")).unwrap_or_default();
    if let Ok(s) = serde_json::from_str::<record::LabState>(&state) {
        for p in s.processes {
            if Path::new(&format!("/proc/{}", p.pid)).exists() {
                left.push(format!("process {} ({})", p.pid, p.what));
            }
        }
    }
    left
}

fn print_keep(topo: &topology::Topology) {
    println!("\nThe lab is up (kuport-lab down removes it). Enter a namespace:");
    for n in &topo.nodes {
        println!("  node {:<12} ip netns exec {} bash", n.name, n.ns);
    }
    for m in topo.mesh.iter().filter(|m| !m.is_node) {
        println!("  {:<17} ip netns exec {} bash", m.name, m.ns);
    }
    for (key, p) in &topo.pods {
        println!(
            "  pod {:<13} ip netns exec {} bash    ({} and {} on {})",
            key, p.ns, p.ip, p.ip6, p.node
        );
    }
    println!(
        "  internet client   ip netns exec {} bash",
        topology::CLIENT_NS
    );
    println!(
        "kubectl against the lab's API server:\n  ip netns exec {} kubectl --kubeconfig {} get portmaps -A",
        topology::UL_NS,
        topo.kubeconfig.display()
    );
    println!(
        "wg of a node: nsenter -t <wireguard-go pid> -m -n wg   (pids in {}/state.json)",
        sys::RUN_DIR
    );
}

/// What `bench --only` takes.
const ONLY: [&str; 8] = [
    "lab",
    "links",
    "tcp",
    "ipv6",
    "host",
    "host-ipv6",
    "memory",
    "conntrack",
];

fn bench(write: Option<PathBuf>, only: Option<&str>) -> Result<ExitCode> {
    prereq::ensure_tools()?;
    if only.is_some_and(|o| !ONLY.contains(&o)) {
        anyhow::bail!("--only takes {}", ONLY.join(", "));
    }
    // The conntrack sweep runs in this binary alone.
    let bins = if only == Some("conntrack") {
        PathBuf::new()
    } else {
        prereq::binaries()?
    };
    let mut measurements = Vec::new();
    if !matches!(only, Some("host" | "host-ipv6" | "memory" | "conntrack")) {
        let (mut lab, original, rt) = session()?;
        let part = match only {
            Some("links") => labbench::Part::Links,
            Some("tcp") => labbench::Part::Tcp,
            Some("ipv6") => labbench::Part::Ipv6,
            _ => labbench::Part::All,
        };
        eprintln!("kuport-lab bench: the datapath and endpoint changes through a lab");
        measurements.extend(rt.block_on(labbench::run(&mut lab, &bins, &original, part))?);
    }
    if only.is_none_or(|o| o == "host") {
        eprintln!("kuport-lab bench: host-level measurements");
        measurements.extend(hostbench::run(&bins)?);
    }
    if only == Some("conntrack") {
        eprintln!("kuport-lab bench: a conntrack sweep");
        measurements.extend(hostbench::run_conntrack()?);
    }
    if only == Some("memory") {
        eprintln!("kuport-lab bench: agent memory");
        measurements.extend(hostbench::run_memory(&bins)?);
    }
    if matches!(only, Some("ipv6" | "host-ipv6")) {
        eprintln!("kuport-lab bench: host-level measurements, IPv6");
        measurements.extend(hostbench::run_ipv6(&bins)?);
    }
    let table = hostbench_table(&measurements);
    print!("{table}");
    if let Some(path) = write {
        if only.is_some() {
            prereq::merge_between_markers(&path, &table)?;
        } else {
            prereq::write_between_markers(&path, &table)?;
        }
        println!("written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn hostbench_table(ms: &[hostbench::Measurement]) -> String {
    let mut out = String::from(
        "| measure | value | samples | baseline | target | met | note |\n|---|---|---|---|---|---|---|\n",
    );
    for m in ms {
        out.push_str(&format!(
            "| {} | {:.3} {} | {} | {} | {} | {} | {} |\n",
            m.name,
            m.value,
            m.unit,
            m.samples,
            m.baseline
                .map(|b| format!("{b:.3}"))
                .unwrap_or_else(|| "-".into()),
            m.target,
            match m.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            },
            m.note
        ));
    }
    out
}
