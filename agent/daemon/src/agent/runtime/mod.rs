//! The pass loop: watch the cluster, plan, program the host, write the status this node owns.
//!
//! Generic over the host (`Host`) and built on any `kube::Client`, so the same code runs on a
//! node, in the simulator and in tests with several agents in one process.
//!
//! This module is the loop itself: what wakes it and in which order. Its parts, each with its
//! own tests: `inputs` (the watches and the pass's snapshot of them), `schedule` (when the next
//! pass runs, whether it verifies, which passes' writes are out), `pass` (one pass up to the
//! datapath), `facts` (what a pass asks of the host), `links` (the host's events), `stop`
//! (what a stop does with the datapath), `config` (the settings).

mod config;
mod facts;
mod inputs;
mod links;
mod pass;
mod schedule;
mod slices;
mod stop;
mod watch;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kuport_core::plan::Plan;
use kuport_core::snapshot::{KernelRefusal, Snapshot};
use kuport_host::probe::LinkProber;
use kuport_host::{Host, HostError, HostEvent};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use config::AgentConfig;
use inputs::{Inputs, start_inputs, wait_synced};
use links::HostChanges;
use pass::Applied;
use schedule::{InFlight, PassOutcome, Schedule, Started};
use watch::Watch;

use super::events::EventSink;
use super::failure::PassError;
use super::health::Health;
use super::lifecycle::StopAction;
use super::metrics::Metrics;
use super::relevance::Wanted;
use super::status::{NodeObjects, StatusWriter};
use super::status_task::{StatusDone, StatusTask};

/// Opens a stream of host events for the given underlay devices (besides kuport's own `kup-*`
/// links, rules, routes, link addresses and nftables table; `kuport_host::HostEvents::open`).
/// Called again whenever the underlay device the host reports changes, or the stream ended.
pub type HostWatch =
    Box<dyn FnMut(Vec<String>) -> Result<mpsc::Receiver<HostEvent>, HostError> + Send + Sync>;

/// Sees (and may change) every plan a pass computes, before it is applied and its status
/// written: the simulator records each agent's decisions through it, and injects deliberately
/// broken decisions to prove its invariants catch them.
pub type PassHook = Arc<dyn Fn(&Snapshot, &mut Plan) + Send + Sync>;

/// Why the agent stopped other than by cancellation.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A watch's store was dropped before it synced (its task ended).
    #[error("waiting for the {0} watch to sync: the watch ended")]
    WatchEnded(&'static str),
    /// Tearing the datapath down at shutdown (kuport being removed) failed.
    #[error("tearing down the datapath at shutdown: {0}")]
    Teardown(#[source] HostError),
    /// The task writing status ended on its own (it panicked: a bug).
    #[error("writing status: the status writer stopped: {0}")]
    StatusWriter(String),
}

/// One node's agent.
pub struct Agent<H: Host> {
    client: kube::Client,
    host: H,
    config: AgentConfig,
    metrics: Arc<Metrics>,
    health: Health,
    host_watch: Option<HostWatch>,
    pass_hook: Option<PassHook>,
    /// What the kernel refused in the last apply, by mapping: planned into this node's class
    /// rows until an apply succeeds in full.
    refusals: Vec<KernelRefusal>,
    /// When the mapping counters were last read from the host.
    counters_read: Option<Instant>,
    /// The probes across this node's return links: their verdicts are host facts of each
    /// pass, and a changed verdict starts one. `None` runs without probes (the simulator).
    probes: Option<LinkProber>,
    /// The last pass's snapshot (less the classes, which went to the status writes): the next
    /// pass takes every object the stores still hold at the same version from it instead of
    /// copying it again.
    previous: Snapshot,
}

/// Why the loop woke up.
enum Wake {
    /// A pass's status writes finished (or the status task stopped).
    Written(Result<StatusDone, String>),
    /// A watch event, the resync or a retry: a reason to pass.
    Pass,
    /// The host's event stream woke it: held for a pass (`None`: the stream ended).
    Host(Option<HostEvent>),
}

impl<H: Host> Agent<H> {
    /// An agent for `config.node_name` on `host`, talking to the API server through `client`.
    /// The host's sweeps of stale conntrack entries run off the pass; each is counted in the
    /// metrics as it ends.
    pub fn new(client: kube::Client, mut host: H, config: AgentConfig) -> Self {
        let metrics = Arc::new(Metrics::new());
        let counted = metrics.clone();
        host.observe_sweeps(Arc::new(move |sweep: &kuport_host::conntrack::Sweep| {
            counted.record_conntrack_sweep(sweep.cleared, sweep.error.is_some());
        }));
        Self {
            client,
            host,
            config,
            metrics,
            health: Health::default(),
            host_watch: None,
            pass_hook: None,
            refusals: Vec::new(),
            counters_read: None,
            previous: Snapshot::default(),
            probes: None,
        }
    }

    /// Probes every return link this node holds with `prober` (see [`LinkProber`]).
    pub fn with_link_probes(mut self, prober: LinkProber) -> Self {
        self.probes = Some(prober);
        self
    }

    /// Runs a verifying pass soon after the host reports a change to a `kup-*` link or the
    /// underlay device (a restarted mesh daemon deletes every link bound to its device), or
    /// another program changing kuport's rules, routes, link addresses or nftables table.
    pub fn with_host_watch(mut self, watch: HostWatch) -> Self {
        self.host_watch = Some(watch);
        self
    }

    /// Calls `hook` with every plan a pass computes (see [`PassHook`]).
    pub fn with_pass_hook(mut self, hook: PassHook) -> Self {
        self.pass_hook = Some(hook);
        self
    }

    /// The metrics, for `/metrics`.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Liveness and readiness, for `/healthz` and `/readyz`.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Runs until `shutdown` is cancelled, then stops as `config.stop_policy` says: by default
    /// it leaves the datapath for the next agent to adopt; under [`StopPolicy::Owner`] it removes
    /// everything kuport owns on the host only when kuport is being removed from the node.
    ///
    /// API errors never tear anything down: the host keeps its last applied state until a pass
    /// computes a new one.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), AgentError> {
        self.health.set_alive(true);
        let owner_task = self.learn_owner();
        let result = self.run_loop(&shutdown).await;
        self.health.set_alive(false);
        let action = self.stop_action(owner_task).await;
        let teardown = match action {
            StopAction::Keep(reason) => {
                tracing::info!("stopping: keeping the datapath ({reason})");
                Ok(())
            }
            StopAction::Teardown(reason) => {
                tracing::info!("stopping: tearing down the datapath ({reason})");
                self.host.teardown().await.map_err(AgentError::Teardown)
            }
        };
        result.and(teardown)
    }

    /// What every watch shares; `dirty` is where they mark the node dirty.
    fn watch(&self, dirty: mpsc::Sender<()>, wanted: Wanted) -> Watch {
        Watch {
            node: self.config.node_name.clone(),
            dirty,
            wanted,
            metrics: self.metrics.clone(),
            jitter_seed: self.config.jitter_seed,
            api_timeout: self.config.api_timeout,
        }
    }

    /// The task writing the status passes hand it, with its Events.
    fn start_status_task(&self, inputs: &Inputs) -> StatusTask {
        let events = EventSink::start(
            self.client.clone(),
            &self.config.node_name,
            self.metrics.clone(),
        );
        let writer = StatusWriter::new(
            self.client.clone(),
            self.config.node_name.clone(),
            self.metrics.clone(),
            events,
            self.config.api_timeout,
        )
        .with_watched_classes(inputs.raw_classes.clone())
        .with_node_objects(
            NodeObjects {
                objects: inputs.portmap_nodes.clone(),
                nodes: inputs.nodes.clone(),
            },
            self.config.rows_in,
        );
        StatusTask::start(writer, inputs.portmaps.clone(), self.config.clock.clone())
    }

    /// Waits for a reason to pass (a watch event, a host event, a retry, a resync), debounces,
    /// runs the pass, hands its status writes to the status task and follows the underlay with
    /// the host event stream; records each pass once its writes are reported. The decisions
    /// are in [`Schedule`] and [`InFlight`], the pass in `pass.rs`.
    async fn run_loop(&mut self, shutdown: &CancellationToken) -> Result<(), AgentError> {
        // Capacity 1: a full channel already means "dirty", so watch events coalesce here.
        let (dirty_tx, mut dirty_rx) = mpsc::channel::<()>(1);
        let wanted = Wanted::default();
        let inputs = start_inputs(&self.client, &self.watch(dirty_tx, wanted.clone()));
        let mut status = self.start_status_task(&inputs);
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            synced = wait_synced(&inputs) => synced?,
        }
        tracing::info!(node = %self.config.node_name, "every watch synced; starting passes");

        let probes_changed = self.probes.as_ref().map(LinkProber::changed);
        let mut host_changes = HostChanges::default();
        let mut schedule = Schedule::new(&self.config, Instant::now());
        let mut in_flight = InFlight::default();

        loop {
            // A host event means the kernel changed behind the agent's back: only a pass that
            // compares against the kernel (not the last applied state) can see what is gone.
            if !schedule.is_first() {
                self.note_settled(&in_flight, &schedule, &host_changes);
                // Biased (in this order) rather than random: a run must replay exactly in the
                // simulator. Reports of finished writes come first, so a pass starts on a
                // schedule that knows how the previous ones ended.
                let wake = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Ok(()),
                    done = status.done() => Wake::Written(done),
                    Some(()) = dirty_rx.recv() => Wake::Pass,
                    _ = notified(probes_changed.as_deref()) => Wake::Pass,
                    // Before the stream: a stream that never rests must not starve its pass.
                    _ = sleep_until_opt(host_changes.due_at()) => Wake::Pass,
                    event = host_changes.next() => Wake::Host(event),
                    _ = tokio::time::sleep_until(schedule.next_verify()) => Wake::Pass,
                    _ = sleep_until_opt(schedule.timer()) => Wake::Pass,
                };
                match wake {
                    Wake::Written(done) => {
                        let done = done.map_err(AgentError::StatusWriter)?;
                        self.writes_done(done, &mut in_flight, &mut schedule);
                        continue;
                    }
                    Wake::Host(event) => {
                        host_changes.woke(event, Instant::now(), &self.metrics);
                        continue;
                    }
                    Wake::Pass => {}
                }
                if !self.debounce(shutdown).await {
                    return Ok(());
                }
                while dirty_rx.try_recv().is_ok() {}
                host_changes.drain(Instant::now(), &self.metrics);
            }
            let host_changed = host_changes.take(Instant::now());
            let verify = schedule.start_pass(host_changed, Instant::now());
            let pass = in_flight.start(verify, Instant::now());
            let (applied, underlay) = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                o = self.pass(&inputs, verify) => o,
            };
            match applied {
                Applied::Failed(error) => {
                    let outcome = PassOutcome::failed(error);
                    self.end_pass(pass, outcome, &mut in_flight, &mut schedule);
                }
                Applied::Ok(to_write) => {
                    schedule.plan_changes_at(to_write.changes_at);
                    in_flight.hand_over(pass, to_write.refused);
                    if let Some(replaced) = status.submit(to_write.into_job(pass.id, &wanted)) {
                        self.superseded(replaced, &mut in_flight);
                    }
                }
            }
            host_changes.follow(self.host_watch.as_mut(), underlay);
        }
    }

    /// Whether the loop, about to wait, owes nothing ([`Health::is_settled`]): no pass's writes
    /// out, no retry or held write due, no host event held for a pass.
    fn note_settled(&self, in_flight: &InFlight, schedule: &Schedule, host: &HostChanges) {
        let settled = in_flight.is_empty() && !schedule.owes_pass() && host.due_at().is_none();
        self.health.set_settled(settled);
    }

    /// Lets a burst of watch events settle into one pass; false when shut down meanwhile. The
    /// loop is no longer settled from here: a pass is coming.
    async fn debounce(&self, shutdown: &CancellationToken) -> bool {
        self.health.set_settled(false);
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(self.config.debounce) => true,
        }
    }

    /// A pass's status writes were reported: the pass ends with what they came to, as it did
    /// when it wrote them itself. A pass whose writes a newer pass took over without any of
    /// them failing ends as superseded: it neither failed nor completed.
    fn writes_done(&self, done: StatusDone, in_flight: &mut InFlight, schedule: &mut Schedule) {
        let Some(writing) = in_flight.reported(done.pass) else {
            return;
        };
        let status = done.outcome;
        if status.written > 0 {
            tracing::info!(
                "status: {} written, {} unchanged, {} to recompute",
                status.written,
                status.unchanged,
                status.recompute
            );
        }
        if status.superseded && status.errors.is_empty() {
            self.metrics
                .observe_superseded(writing.pass.at.elapsed().as_secs_f64());
            tracing::debug!("status writes superseded by a newer pass's");
            return;
        }
        let held_until = status.held_until();
        let outcome = PassOutcome {
            failed: (!status.errors.is_empty()).then_some(PassError::Status(status.errors)),
            refused: writing.refused,
            recompute: status.recompute > 0,
            held_until,
        };
        self.end_pass(writing.pass, outcome, in_flight, schedule);
    }

    /// A pass whose writes were replaced before the status task started them.
    fn superseded(&self, id: u64, in_flight: &mut InFlight) {
        if let Some(writing) = in_flight.reported(id) {
            self.metrics
                .observe_superseded(writing.pass.at.elapsed().as_secs_f64());
        }
    }

    /// Records how `pass` ended and, unless a newer pass ended first, schedules the next.
    fn end_pass(
        &self,
        pass: Started,
        outcome: PassOutcome,
        in_flight: &mut InFlight,
        schedule: &mut Schedule,
    ) {
        let now_unix = self.config.clock.now().as_millisecond() as f64 / 1000.0;
        self.metrics.observe_pass(
            pass.at.elapsed().as_secs_f64(),
            outcome.failed.as_ref().map(PassError::stage),
            now_unix,
        );
        let newest = in_flight.take_for_schedule(pass.id);
        match &outcome.failed {
            None => self.health.set_ready(),
            Some(error) if newest => tracing::warn!(
                stage = error.stage().as_str(),
                "pass failed: {error}; retrying in {:?}",
                schedule.retry_delay()
            ),
            Some(error) => tracing::warn!(
                stage = error.stage().as_str(),
                "pass failed: {error}; a newer pass has ended since"
            ),
        }
        if newest {
            schedule.end_pass(&outcome, pass.verified, Instant::now());
        }
    }
}

/// A link verdict changed (never, without probes).
async fn notified(changed: Option<&tokio::sync::Notify>) {
    match changed {
        Some(changed) => changed.notified().await,
        None => std::future::pending().await,
    }
}

fn sleep_until_opt(at: Option<Instant>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    match at {
        Some(at) => Box::pin(tokio::time::sleep_until(at)),
        None => Box::pin(std::future::pending()),
    }
}
