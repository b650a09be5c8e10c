//! One agent as a process of its own, for its memory: the parent serves the model on a local
//! TCP port and starts `<exe> __scale-agent ...` for one accepting node and one pod-only node
//! in turn; each runs the real agent (in-memory host) on a multi-threaded runtime as
//! `kuport agent` does, waits until it has settled for [`QUIET`], and prints its `VmHWM` and
//! `VmRSS` as one JSON line.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use kuport::agent::{Agent, AgentConfig, CancellationToken, Clock};
use kuport_host::MemoryHost;
use kuport_sim::apiserver::ApiServer;
use serde::{Deserialize, Serialize};

use super::agents::facts;
use super::generator::Cluster;
use super::report::{ProcessMemory, Rss};
use super::{ScaleError, SimTime};

/// How long the agent process must stay settled before it reads its memory.
pub const QUIET: Duration = Duration::from_secs(3);
/// The longest an agent process may take to settle.
const LIMIT: Duration = Duration::from_secs(900);

/// What an agent process is told.
#[derive(Clone, Debug)]
pub struct AgentArgs {
    /// The model's URL.
    pub server: String,
    /// Its node.
    pub node: String,
    /// The node's number in the sorted node list (its interface addresses).
    pub index: usize,
    /// The classes' count (an interface each).
    pub classes: usize,
    /// How far the cluster's clock is ahead of the system clock.
    pub ahead_ms: i64,
}

/// What an agent process prints.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Measured {
    /// `VmHWM`, KiB.
    pub vm_hwm_kib: u64,
    /// `VmRSS`, KiB.
    pub vm_rss_kib: u64,
    /// Wall seconds until it settled.
    pub settled_after_seconds: f64,
    /// Whether it settled within the limit.
    pub settled: bool,
}

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The agent process: runs the agent until it settled, prints [`Measured`].
pub fn agent_main(args: &AgentArgs) -> Result<(), ScaleError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let measured = runtime.block_on(run_agent(args))?;
    println!("{}", serde_json::to_string(&measured)?);
    Ok(())
}

async fn run_agent(args: &AgentArgs) -> Result<Measured, ScaleError> {
    let url: http::Uri = args.server.parse()?;
    let client = kube::Client::try_from(kube::Config::new(url))?;
    let ahead = args.ahead_ms;
    let mut config = AgentConfig::new(&args.node);
    config.clock = Clock::from_fn(move || {
        let now = k8s_openapi::jiff::Timestamp::now();
        now.checked_add(k8s_openapi::jiff::SignedDuration::from_millis(ahead))
            .unwrap_or(now)
    });
    let agent = Agent::new(
        client,
        MemoryHost::with_facts(facts(args.index, args.classes)),
        config,
    );
    let health = agent.health();
    let stop = CancellationToken::new();
    let task = tokio::spawn(agent.run(stop.clone()));
    let start = std::time::Instant::now();
    let mut quiet_since: Option<std::time::Instant> = None;
    let mut measured = Measured::default();
    while start.elapsed() < LIMIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if !health.is_settled() {
            quiet_since = None;
            continue;
        }
        let since = *quiet_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= QUIET {
            measured.settled = true;
            measured.settled_after_seconds = (since - start).as_secs_f64();
            break;
        }
    }
    measured.vm_hwm_kib = status_kib("VmHWM:");
    measured.vm_rss_kib = status_kib("VmRSS:");
    stop.cancel();
    let _ = task.await;
    Ok(measured)
}

/// Serves `api` on a local port and runs one agent process for the first accepting node and
/// one for the first pod-only node, one after the other.
pub fn measure(
    exe: &Path,
    api: &ApiServer,
    cluster: &Cluster,
    time: &Arc<SimTime>,
) -> Result<Rss, ScaleError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let server = format!("http://{}", listener.local_addr()?);
    runtime.spawn(api.clone().serve(listener));
    let one = |node: Option<&String>| -> Result<ProcessMemory, ScaleError> {
        let Some(node) = node else {
            return Ok(ProcessMemory::default());
        };
        let args = AgentArgs {
            server: server.clone(),
            node: node.clone(),
            index: cluster.index(node),
            classes: cluster.classes.len(),
            ahead_ms: time.ahead_of_system_ms(),
        };
        let m = spawn(exe, &args)?;
        eprintln!("scale: agent process on {node}: {m:?}");
        let mib = |kib: u64| kib as f64 / 1024.0;
        Ok(ProcessMemory {
            peak: mib(m.vm_hwm_kib),
            settled: mib(m.vm_rss_kib),
            settled_after_seconds: m.settled_after_seconds,
        })
    };
    let rss = Rss {
        accepting: one(cluster.accepting.first())?,
        pod_only: one(cluster.pod_nodes.first())?,
    };
    drop(runtime);
    Ok(rss)
}

/// Runs `<exe> __scale-agent` with `args` and reads what it printed.
fn spawn(exe: &Path, args: &AgentArgs) -> Result<Measured, ScaleError> {
    let mut child = Command::new(exe)
        .arg("__scale-agent")
        .args(["--server", &args.server, "--node", &args.node])
        .args(["--index", &args.index.to_string()])
        .args(["--classes", &args.classes.to_string()])
        .args(["--ahead-ms", &args.ahead_ms.to_string()])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or("the agent process has no stdout")?;
    let last = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .filter(|l| l.starts_with('{'))
        .last();
    let status = child.wait()?;
    let line = last.ok_or_else(|| format!("the agent process printed nothing ({status})"))?;
    Ok(serde_json::from_str(&line)?)
}
