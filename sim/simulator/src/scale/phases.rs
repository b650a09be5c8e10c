//! The simulated phases of a run, in order: create the cluster, start the agents in two halves
//! and let each settle, an idle window, pod moves one at a time, new PortMaps, the churn
//! window, then the plan timed over the final objects.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kuport_core::api::PortMap;
use kuport_sim::apiserver::{ApiServer, SplitMix64};
use tokio::time::Instant;

use super::agents::{self, Running, Setup};
use super::driver;
use super::generator::Cluster;
use super::report::{Agents, LargestObject, Report};
use super::wire::{self, WireCount};
use super::{Config, ScaleError, SimTime};

mod measure;

/// The longest the agents may take to settle after a phase.
pub(super) const SETTLE_LIMIT: Duration = Duration::from_secs(1800);

/// What the phases share.
pub(super) struct Run<'a> {
    pub config: &'a Config,
    pub cluster: &'a mut Cluster,
    pub api: ApiServer,
    pub driver: kube::Client,
    pub kubelets: Arc<WireCount>,
    pub agents: Vec<Running>,
    pub rng: SplitMix64,
    pub down: Arc<Mutex<BTreeSet<String>>>,
    pub time: Arc<SimTime>,
    pub report: Report,
}

impl Run<'_> {
    /// Waits for the agents to settle; records how long it took under `phase`.
    pub async fn settle(&mut self, phase: &str) -> Result<(), ScaleError> {
        let took = agents::settle(&self.agents, SETTLE_LIMIT)
            .await
            .ok_or_else(|| format!("{phase}: the agents did not settle in {SETTLE_LIMIT:?}"))?;
        eprintln!(
            "scale: {phase}: settled after {:.1} s simulated",
            took.as_secs_f64()
        );
        self.report
            .settle_seconds
            .insert(phase.to_owned(), took.as_secs_f64());
        Ok(())
    }

    /// The largest object any running agent wrote so far.
    fn largest(&self) -> wire::Largest {
        self.agents
            .iter()
            .map(|a| crate::sync::lock(&a.wire.largest_write).clone())
            .max_by_key(|l| l.bytes)
            .unwrap_or_default()
    }

    fn start_agents(&mut self, nodes: &[String], accepting: bool, setup: &Setup) {
        for node in nodes {
            let index = self.cluster.index(node);
            self.agents
                .push(agents::start(setup, node, index, accepting));
        }
    }
}

/// Runs every simulated phase; the report (less the agent processes' memory) and the model.
pub(super) async fn simulate(
    config: &Config,
    cluster: &mut Cluster,
    time: &Arc<SimTime>,
) -> Result<(Report, ApiServer), ScaleError> {
    let start = Instant::now();
    let clock = time.clock();
    let api = super::model(config.seed, &clock)?;
    let driver = wire::client(api.router(), Arc::default());
    create_all(&driver, cluster).await?;
    let kubelets = Arc::new(WireCount::default());
    let down = Arc::new(Mutex::new(BTreeSet::new()));
    let beats = tokio::spawn(driver::kubelets(
        wire::client(api.router(), kubelets.clone()),
        clock.clone(),
        cluster.nodes.clone(),
        down.clone(),
        config.seed,
    ));
    let mut run = Run {
        config,
        cluster,
        api: api.clone(),
        driver,
        kubelets,
        agents: Vec::new(),
        rng: SplitMix64::new(config.seed ^ 0xC4A2_0000_0000_0007),
        down,
        time: time.clone(),
        report: Report::default(),
    };
    start_and_settle(&mut run, &clock).await?;
    measure::idle(&mut run).await?;
    measure::moves(&mut run).await?;
    measure::new_portmaps(&mut run).await?;
    measure::churn(&mut run).await?;
    measure::plan_pass(&mut run).await?;
    run.report.programmed = programmed(&run.driver).await?;
    beats.abort();
    let mut report = std::mem::take(&mut run.report);
    describe(&mut report, &run, start.elapsed());
    Ok((report, api))
}

/// Creates every generated object, printing progress.
async fn create_all(driver: &kube::Client, cluster: &Cluster) -> Result<(), ScaleError> {
    let wall = std::time::Instant::now();
    for (i, object) in cluster.objects.iter().enumerate() {
        driver::create(driver, object).await?;
        if (i + 1) % 20_000 == 0 {
            eprintln!(
                "scale: {} of {} objects created",
                i + 1,
                cluster.objects.len()
            );
        }
    }
    eprintln!(
        "scale: {} objects created in {:.1} s",
        cluster.objects.len(),
        wall.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Starts the accepting nodes' agents and the first half of the pod-only ones, lets them
/// settle, notes the largest write, then the second half: how the largest object grows with
/// the nodes writing to it.
async fn start_and_settle(
    run: &mut Run<'_>,
    clock: &kuport::agent::Clock,
) -> Result<(), ScaleError> {
    let setup = Setup {
        api: run.api.clone(),
        clock: clock.clone(),
        seed: run.config.seed,
        classes: run.cluster.classes.len(),
    };
    let pod_nodes = run.cluster.pod_nodes.clone();
    let (first, second) = pod_nodes.split_at(pod_nodes.len() / 2);
    let accepting = run.cluster.accepting.clone();
    run.start_agents(&accepting, true, &setup);
    run.start_agents(first, false, &setup);
    run.settle("first half").await?;
    let half = run.largest();
    let agents_then = run.agents.len();
    run.start_agents(second, false, &setup);
    run.settle("second half").await?;
    run.report.conflicts.settling = agents::total(&run.agents).conflicts;
    let whole = run.largest();
    let growth = if second.is_empty() {
        0.0
    } else {
        (whole.bytes as f64 - half.bytes as f64) / second.len() as f64
    };
    let modeled = run.cluster.nodes.len() - run.agents.len();
    run.report.largest_object_bytes = LargestObject {
        bytes: whole.bytes,
        kind: kind_of(&run.api, &whole.resource),
        name: whole.name.clone(),
        resource: whole.resource.clone(),
        with_half_the_agents: half.bytes,
        agents_then,
        growth_per_pod_agent: growth,
        extrapolated_bytes: whole.bytes as f64 + growth * modeled as f64,
    };
    Ok(())
}

/// The PortMaps by their stored `Programmed` condition: `True`, or its reason (a PortMap not
/// accepted has none: `not accepted: <reason>`).
async fn programmed(driver: &kube::Client) -> Result<BTreeMap<String, usize>, ScaleError> {
    let all = kube::Api::<PortMap>::all(driver.clone())
        .list(&kube::api::ListParams::default())
        .await?;
    let mut out = BTreeMap::new();
    for pm in all.items {
        let condition = pm
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Programmed"));
        let accepted = pm
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Accepted"));
        let key = match (condition, accepted) {
            (Some(c), _) if c.status == "True" => "True".to_owned(),
            (Some(c), _) => c.reason.clone(),
            (None, Some(a)) if a.status != "True" => format!("not accepted: {}", a.reason),
            (None, _) => "none".to_owned(),
        };
        *out.entry(key).or_default() += 1;
    }
    Ok(out)
}

/// The kind the model serves `resource` (`group/plural`) as.
fn kind_of(api: &ApiServer, resource: &str) -> String {
    let (group, plural) = resource.rsplit_once('/').unwrap_or(("", resource));
    api.resources()
        .iter()
        .find(|r| r.group == group && r.plural == plural)
        .map_or_else(String::new, |r| r.kind.clone())
}

/// The parts of the report that describe the run rather than measure it.
fn describe(report: &mut Report, run: &Run<'_>, simulated: Duration) {
    let config = run.config;
    report.nodes = config.nodes;
    report.portmaps = config.portmaps;
    report.accepting = run.cluster.accepting.len();
    report.classes = run.cluster.classes.len();
    report.seed = config.seed;
    let accepting = run.agents.iter().filter(|a| a.accepting).count();
    report.agents = Agents {
        accepting,
        pod_only: run.agents.len() - accepting,
        modeled: config.nodes - run.agents.len(),
    };
    report.conflicts.refused_writes = agents::total(&run.agents).refused;
    report.simulated_seconds = simulated.as_secs_f64();
    let object = |plural: &str, ns: &str, name: &str, version: &str| {
        run.api
            .object(version, plural, ns, name)
            .and_then(|o| serde_json::to_vec(&o).ok())
            .map_or(0, |b| b.len() as u64)
    };
    let first = run.cluster.nodes.first().map_or("", String::as_str);
    report.kubelet.node_object_bytes = object("nodes", "", first, "v1");
    report.kubelet.lease_object_bytes =
        object("leases", "kube-node-lease", first, "coordination.k8s.io/v1");
}
