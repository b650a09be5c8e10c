//! The scale harness's report: one JSON object, every field described in
//! `docs/performance.md` ("Scale harness"). Rates are per second of simulated time.

use std::collections::BTreeMap;

use serde::Serialize;

/// What a run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Nodes in the cluster (Node objects, each with its Lease).
    pub nodes: usize,
    /// PortMaps (each with its Service, EndpointSlice and Pod).
    pub portmaps: usize,
    /// Nodes every class accepts on.
    pub accepting: usize,
    /// Classes (one per 25,000 PortMaps, each on an interface of its own).
    pub classes: usize,
    /// The generator's seed.
    pub seed: u64,
    /// Which agents ran and which were counted by the model instead.
    pub agents: Agents,
    /// The largest object any agent wrote, as the API server sent it back.
    pub largest_object_bytes: LargestObject,
    /// API requests of the agents in an idle cluster.
    pub idle_requests_per_second: IdleRequests,
    /// API requests of every agent together per pod moved, one move at a time.
    pub requests_per_pod_move: PodMoves,
    /// 409 answers to agents' requests, by phase.
    pub conflicts: Conflicts,
    /// Watch bytes one agent receives per second in an idle cluster.
    pub idle_watch_bytes_per_second_per_agent: WatchBytes,
    /// What the simulated kubelets sent.
    pub kubelet: Kubelet,
    /// A new PortMap (its Service, pod and slice already there) to `Programmed=True` stored:
    /// the 99th percentile, simulated milliseconds.
    pub portmap_to_programmed_p99_ms: f64,
    /// The same, whole.
    pub portmap_to_programmed: Latency,
    /// Peak and settled resident memory of one agent process of each kind; null when not run.
    pub agent_rss_mib: Option<Rss>,
    /// One plan pass over the final cluster (`plan_with(…, Detail::Written)`), median of 5,
    /// wall milliseconds on this machine.
    pub plan_pass_ms: PlanPass,
    /// Pod moves and node flaps at the churn rate.
    pub churn: Churn,
    /// The PortMaps by their stored `Programmed` condition at the end (`True`, or the reason
    /// it is not), and `none` for those without one.
    pub programmed: BTreeMap<String, usize>,
    /// How long each phase took to settle, simulated seconds.
    pub settle_seconds: BTreeMap<String, f64>,
    /// Simulated seconds the run covered.
    pub simulated_seconds: f64,
    /// Wall seconds the run took.
    pub wall_seconds: f64,
}

/// Which agents ran.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Agents {
    /// Accepting nodes' agents run (all of them).
    pub accepting: usize,
    /// Agents run on nodes no class accepts on: the nodes the PortMaps' pods are on.
    pub pod_only: usize,
    /// Nodes whose agent did not run; their requests are modeled from the pod-only agents'.
    pub modeled: usize,
}

/// The largest object an agent wrote, and how it grew as more agents joined.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LargestObject {
    /// Its JSON's size.
    pub bytes: u64,
    /// Its kind, as the model serves it.
    pub kind: String,
    /// `namespace/name` or `name`.
    pub name: String,
    /// Its resource (`group/plural`).
    pub resource: String,
    /// The largest write once the first half of the pod-only agents had settled, with them.
    pub with_half_the_agents: u64,
    /// How many agents ran then.
    pub agents_then: usize,
    /// Bytes the largest write grew per pod-only agent added between the two.
    pub growth_per_pod_agent: f64,
    /// The largest write extrapolated to every node holding pods (every node no class
    /// accepts on): `bytes + growth_per_pod_agent × modeled`.
    pub extrapolated_bytes: f64,
}

/// Idle requests per second.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IdleRequests {
    /// Every agent that ran, together.
    pub measured: f64,
    /// Per accepting agent.
    pub per_accepting_agent: f64,
    /// Per pod-only agent.
    pub per_pod_only_agent: f64,
    /// Every node of the cluster: the accepting agents measured, and every other node at the
    /// pod-only agents' rate.
    pub modeled_all_agents: f64,
    /// The window, simulated seconds.
    pub window_seconds: f64,
}

/// Requests per pod move.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PodMoves {
    /// Every agent's requests for each move.
    pub requests: Vec<u64>,
    /// The agents that wrote anything for each move.
    pub writing_nodes: Vec<u64>,
    /// What each move's writes were to, by resource (`group/plural`).
    pub writes_by_resource: Vec<BTreeMap<String, u64>>,
    /// Requests per move, median.
    pub median: f64,
    /// Requests per move, mean.
    pub mean: f64,
    /// Requests per node that wrote (the target's "node whose own state changed").
    pub per_writing_node: f64,
}

/// 409 answers, by phase.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Conflicts {
    /// While the agents first settled.
    pub settling: u64,
    /// In the idle window.
    pub idle: u64,
    /// Over the pod moves one at a time.
    pub moves: u64,
    /// Over the churn window.
    pub churn: u64,
    /// Writes answered 422 (a guarded patch whose test failed) over the whole run.
    pub refused_writes: u64,
}

/// Watch bytes per second one agent receives (the mean over the agents that ran).
#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchBytes {
    /// From kuport's own API group.
    pub kuport: f64,
    /// The same for a cluster where every node's agent runs: `kuport` × (the idle requests of
    /// every node, modeled ÷ measured) × (the largest object extrapolated ÷ measured), as if
    /// every idle write sent every watcher an object of the largest's size.
    pub kuport_modeled_all_agents: f64,
    /// From Nodes and Leases (the kubelets' heartbeats).
    pub kubernetes_heartbeats: f64,
    /// From every other Kubernetes resource.
    pub other_kubernetes: f64,
    /// By resource (`group/plural`).
    pub by_resource: BTreeMap<String, f64>,
}

/// What the simulated kubelets sent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Kubelet {
    /// Node status reports per second, every node together.
    pub node_status_updates_per_second: f64,
    /// Lease renewals per second, every node together.
    pub lease_renewals_per_second: f64,
    /// One Node object's size.
    pub node_object_bytes: u64,
    /// One Lease object's size.
    pub lease_object_bytes: u64,
}

/// A latency's distribution, simulated milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Samples taken.
    pub samples: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// Samples never programmed within the limit.
    pub not_programmed: usize,
}

/// One agent process's memory, MiB.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Rss {
    /// An accepting node's agent.
    pub accepting: ProcessMemory,
    /// A pod-only node's agent.
    pub pod_only: ProcessMemory,
}

/// One process's memory.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessMemory {
    /// `VmHWM` once it settled.
    pub peak: f64,
    /// `VmRSS` once it settled.
    pub settled: f64,
    /// Wall seconds it took to settle.
    pub settled_after_seconds: f64,
}

/// Plan pass times, wall milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PlanPass {
    /// An accepting node's pass.
    pub accepting: f64,
    /// A pod-only node's pass.
    pub pod_only: f64,
}

/// The churn window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Churn {
    /// Pod moves made.
    pub pod_moves: u64,
    /// Node flaps made (NotReady, then Ready again).
    pub node_flaps: u64,
    /// Its length, simulated seconds.
    pub seconds: f64,
    /// Every agent's requests per second.
    pub requests_per_second: f64,
    /// Watch bytes per second per agent, every resource.
    pub watch_bytes_per_second_per_agent: f64,
}

/// The `p`-th quantile (0..=1) of `samples` (nearest rank); 0 for none.
pub fn quantile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
