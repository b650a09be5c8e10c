//! `kuport-lab scale`: the scale harness (`kuport_simulator::scale`), thousands of nodes on
//! this machine, its report as JSON (`docs/performance.md`, "Scale harness"). No root needed.
//! `__scale-agent` is the agent process the harness starts for its memory.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use kuport_simulator::scale::{self, Config, process::AgentArgs};

/// The harness's flags.
#[derive(clap::Args)]
pub struct ScaleArgs {
    /// Nodes in the cluster (each with its Node and Lease, updated at the kubelet's rates).
    #[arg(long)]
    nodes: usize,
    /// PortMaps, each with its own Service, EndpointSlice and Pod.
    #[arg(long)]
    portmaps: usize,
    /// Nodes every class accepts on.
    #[arg(long, default_value_t = 10)]
    accepting: usize,
    /// Agents to run on the other nodes, where the pods are (default 20; the rest are counted
    /// by the model the report describes).
    #[arg(long)]
    pod_agents: Option<usize>,
    /// Pod moves per second in the churn window.
    #[arg(long, default_value_t = 1.0)]
    churn: f64,
    /// Node flaps (NotReady for 20 s, then Ready) per minute in the churn window.
    #[arg(long, default_value_t = 1.0)]
    flaps: f64,
    /// The churn window, simulated seconds.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// The idle window, simulated seconds.
    #[arg(long, default_value_t = 600)]
    idle: u64,
    /// Pod moves one at a time (requests per move).
    #[arg(long, default_value_t = 8)]
    moves: usize,
    /// New PortMaps one at a time (time to Programmed).
    #[arg(long, default_value_t = 20)]
    new_portmaps: usize,
    /// The generator's seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip the two agent processes that measure `agent_rss_mib`.
    #[arg(long)]
    no_processes: bool,
    /// Write the report (JSON) here.
    #[arg(long)]
    report: PathBuf,
}

/// Runs the harness, prints the report and writes it to `--report`.
pub fn run(args: ScaleArgs) -> Result<ExitCode> {
    let mut config = Config::new(args.nodes, args.portmaps);
    config.accepting = args.accepting.min(args.nodes);
    config.pod_agents = args.pod_agents;
    config.churn = args.churn;
    config.flaps_per_minute = args.flaps;
    config.duration = Duration::from_secs(args.duration);
    config.idle = Duration::from_secs(args.idle);
    config.moves = args.moves;
    config.new_portmaps = args.new_portmaps;
    config.seed = args.seed;
    if !args.no_processes {
        config.agent_exe = Some(std::env::current_exe().context("finding kuport-lab itself")?);
    }
    let report = scale::run(&config).map_err(|e| anyhow!("scale: {e}"))?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(dir) = args.report.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.report, format!("{json}\n"))
        .with_context(|| format!("writing {}", args.report.display()))?;
    println!("{json}");
    Ok(ExitCode::SUCCESS)
}

/// The agent process's flags.
#[derive(clap::Args)]
pub struct AgentProcessArgs {
    #[arg(long)]
    server: String,
    #[arg(long)]
    node: String,
    #[arg(long)]
    index: usize,
    #[arg(long)]
    classes: usize,
    #[arg(long, allow_hyphen_values = true)]
    ahead_ms: i64,
}

/// `__scale-agent`: one agent until it settled, then its memory as a JSON line.
pub fn agent(args: AgentProcessArgs) -> Result<ExitCode> {
    scale::process::agent_main(&AgentArgs {
        server: args.server,
        node: args.node,
        index: args.index,
        classes: args.classes,
        ahead_ms: args.ahead_ms,
    })
    .map_err(|e| anyhow!("scale agent: {e}"))?;
    Ok(ExitCode::SUCCESS)
}
