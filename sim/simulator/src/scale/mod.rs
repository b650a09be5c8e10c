//! The scale harness (`kuport-lab scale`, `docs/performance.md`, "Scale harness"): a generated
//! cluster of thousands of nodes in the API server model, the real agent code running as tasks
//! against it (every accepting node's agent, and a sample of the others'), the kubelets' Node
//! and Lease updates at their default rates, pod moves and node flaps; and a report of what it
//! cost: objects' sizes, requests, conflicts, watch bytes, latency, memory and plan time.
//!
//! Time is simulated: the agents and the model share one thread whose clock jumps ahead
//! whenever every task waits (tokio's paused clock), so an hour of an idle cluster costs only
//! the work done in it, and rates and latencies are those of the protocol (timers, debounces,
//! round trips), with compute taking no simulated time. The plan's own time is measured apart
//! (`plan_pass_ms`), in wall time.

pub mod agents;
pub mod driver;
pub mod generator;
pub mod kubelet;
mod phases;
pub mod process;
pub mod report;
pub mod wire;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kuport::agent::Clock;
use kuport_sim::apiserver::ApiServer;
use tokio::time::Instant;

pub use report::Report;

/// Something that stopped the run (not a measurement).
pub type ScaleError = Box<dyn std::error::Error + Send + Sync>;

/// The simulated wall clock starts here.
const EPOCH_SECONDS: i64 = 1_800_000_000;

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// PortMaps.
    pub portmaps: usize,
    /// Nodes the classes accept on (every one runs an agent).
    pub accepting: usize,
    /// Agents to run on nodes no class accepts on (the pods' nodes); `None`: 20.
    pub pod_agents: Option<usize>,
    /// Pod moves per second in the churn window.
    pub churn: f64,
    /// Node flaps (NotReady for 20 s, then Ready) per minute in the churn window.
    pub flaps_per_minute: f64,
    /// The churn window, simulated.
    pub duration: Duration,
    /// The idle window, simulated.
    pub idle: Duration,
    /// Pod moves made one at a time (requests per move).
    pub moves: usize,
    /// New PortMaps made one at a time (time to Programmed).
    pub new_portmaps: usize,
    /// Every random choice derives from it.
    pub seed: u64,
    /// A binary whose `__scale-agent` subcommand runs one agent process
    /// ([`process::agent_main`]) for `agent_rss_mib`; `None` leaves that field out.
    pub agent_exe: Option<PathBuf>,
}

impl Config {
    /// The defaults for `nodes` nodes and `portmaps` PortMaps.
    pub fn new(nodes: usize, portmaps: usize) -> Self {
        Self {
            nodes,
            portmaps,
            accepting: 10.min(nodes),
            pod_agents: None,
            churn: 1.0,
            flaps_per_minute: 1.0,
            duration: Duration::from_secs(60),
            idle: Duration::from_secs(600),
            moves: 8,
            new_portmaps: 20,
            seed: 1,
            agent_exe: None,
        }
    }

    /// The pod-only agents to run.
    pub fn pod_agents(&self) -> usize {
        let others = self.nodes.saturating_sub(self.accepting);
        self.pod_agents.unwrap_or(20).min(others)
    }
}

/// The harness's time: simulated while the paused runtime runs (the epoch plus the runtime's
/// time since `start`), then, after [`SimTime::go_real`], going on from where it stopped at
/// the wall clock's pace (for the agent processes, which run in real time).
pub struct SimTime {
    start: Instant,
    real: Mutex<Option<(std::time::Instant, Timestamp)>>,
}

impl SimTime {
    /// Simulated time starting now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            real: Mutex::new(None),
        })
    }

    /// Now.
    pub fn now(&self) -> Timestamp {
        if let Some((since, at)) = *crate::sync::lock(&self.real) {
            let ran = SignedDuration::try_from(since.elapsed()).unwrap_or_default();
            return at.checked_add(ran).unwrap_or(at);
        }
        let epoch = Timestamp::from_second(EPOCH_SECONDS).unwrap_or(Timestamp::UNIX_EPOCH);
        let since = SignedDuration::try_from(Instant::now() - self.start).unwrap_or_default();
        epoch.checked_add(since).unwrap_or(epoch)
    }

    /// From now on time passes with the wall clock, from the simulated time reached.
    pub fn go_real(&self) {
        let at = self.now();
        *crate::sync::lock(&self.real) = Some((std::time::Instant::now(), at));
    }

    /// How far this time is ahead of the system clock, in milliseconds.
    pub fn ahead_of_system_ms(&self) -> i64 {
        let system = Timestamp::now();
        self.now().duration_since(system).as_millis() as i64
    }

    /// A kuport clock reading it.
    pub fn clock(self: &Arc<Self>) -> Clock {
        let time = self.clone();
        Clock::from_fn(move || time.now())
    }
}

/// The model the run uses, on `clock`.
pub fn model(seed: u64, clock: &Clock) -> Result<ApiServer, ScaleError> {
    let clock = clock.clone();
    Ok(ApiServer::builder()
        .seed(seed)
        .history_limit(20_000)
        .clock(Arc::new(move || clock.now()))
        .build()?)
}

/// Runs the harness: the simulated phases on a paused-clock runtime, then, with
/// [`Config::agent_exe`], one agent process of each kind for its memory.
pub fn run(config: &Config) -> Result<Report, ScaleError> {
    let wall = std::time::Instant::now();
    let mut cluster = generator::generate(&generator::Shape {
        seed: config.seed,
        nodes: (0..config.nodes).map(generator::node_name).collect(),
        portmaps: config.portmaps,
        accepting: config.accepting,
        pod_agents: config.pod_agents(),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let time = runtime.block_on(async { SimTime::new() });
    let (mut report, api) = runtime.block_on(phases::simulate(config, &mut cluster, &time))?;
    drop(runtime);
    if let Some(exe) = &config.agent_exe {
        time.go_real();
        report.agent_rss_mib = Some(process::measure(exe, &api, &cluster, &time)?);
    }
    report.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(report)
}
