//! The pass loop: watch the cluster, plan, program the host, write the status this node owns.
//!
//! Generic over the host (`Host`) and built on any `kube::Client`, so the same code runs on a
//! node, in the simulator and in tests with several agents in one process.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kuport_core::api::{PortMap, PortMapClass};
use kuport_core::ir::{HostState, MarkLayout, Rule};
use kuport_core::plan::{Plan, Writes, plan};
use kuport_core::snapshot::{
    CILIUM_CONFIG, CniFacts, HostFacts, KernelRefusal, Snapshot, node_internal_ip,
};
use kuport_host::{ApplyReport, FactsQuery, Host, HostError, LinkEvent, Refusal};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::events::EventSink;
use super::failure::PassError;
use super::health::Health;
use super::lifecycle::{self, Lookup, RemovalWatch, StopAction, StopPolicy};
use super::metrics::Metrics;
use super::relevance::{PassInput, Wanted};
use super::status::StatusWriter;
use super::status_task::{StatusDone, StatusJob, StatusTask};
use super::trim::Trim;

/// Opens a stream of link events for the given underlay devices (besides kuport's own `kup-*`
/// links). Called again whenever the underlay device the host reports changes.
pub type LinkWatch =
    Box<dyn FnMut(Vec<String>) -> Result<mpsc::Receiver<LinkEvent>, HostError> + Send + Sync>;

/// Sees (and may change) every plan a pass computes, before it is applied and its status
/// written: the simulator records each agent's decisions through it, and injects deliberately
/// broken decisions to prove its invariants catch them.
pub type PassHook = Arc<dyn Fn(&Snapshot, &mut Plan) + Send + Sync>;

/// How long each read deciding a stop may take (three reads fit well inside the DaemonSet's
/// termination grace period).
const STOP_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// Settings of the runtime.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// This node's name (its Node object).
    pub node_name: String,
    /// How often the host layer compares against the kernel instead of the last applied state.
    pub resync: Duration,
    /// How long the loop waits after a change for more changes to coalesce with it.
    pub debounce: Duration,
    /// First delay before a failed pass is retried; it doubles up to `retry_max`.
    pub retry_min: Duration,
    /// Longest delay between retries.
    pub retry_max: Duration,
    /// How long one API request of a pass may take.
    pub api_timeout: Duration,
    /// The mark bits the datapath uses.
    pub marks: MarkLayout,
    /// What a stop does with the datapath (keep it for the next agent by default).
    pub stop_policy: StopPolicy,
    /// The agent's own listening ports: mappings are refused them on the addresses they bind.
    pub agent_ports: Vec<u16>,
    /// Where wall-clock time comes from: the plan's `now` (claim ages, condition times) and
    /// status timestamps. The simulator gives each agent its own skewed, simulated clock.
    pub clock: Clock,
    /// Seeds the jitter of the watches' retry delays (so agents restarted together do not
    /// retry in step). The simulator fixes it so a run replays exactly.
    pub jitter_seed: u64,
    /// Computes the plan on a blocking thread (the default: a large plan must not hold an
    /// async worker). The simulator computes it inline, where another thread would make a run
    /// depend on the operating system's scheduler.
    pub plan_on_blocking_thread: bool,
}

/// A source of wall-clock time.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Timestamp + Send + Sync>);

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self(Arc::new(Timestamp::now))
    }

    /// A clock reading `now`.
    pub fn from_fn(now: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    /// The time now.
    pub fn now(&self) -> Timestamp {
        (self.0)()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Clock({})", self.now())
    }
}

impl AgentConfig {
    /// The defaults of agent.md for `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            resync: Duration::from_secs(300),
            debounce: Duration::from_millis(50),
            retry_min: Duration::from_millis(200),
            retry_max: Duration::from_secs(30),
            api_timeout: Duration::from_secs(10),
            marks: MarkLayout::default(),
            stop_policy: StopPolicy::Keep,
            agent_ports: Vec::new(),
            clock: Clock::system(),
            jitter_seed: jitter_seed_for(&process_start_identity()),
            plan_on_blocking_thread: true,
        }
    }
}

/// Mixes the process id and the start time: distinct on every start of every agent.
fn process_start_identity() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}/{nanos}", std::process::id())
}

/// A 64-bit seed from a string (FNV-1a: the seed needs spreading, not secrecy).
fn jitter_seed_for(source: &str) -> u64 {
    source.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

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
    link_watch: Option<LinkWatch>,
    pass_hook: Option<PassHook>,
    /// What the kernel refused in the last apply, by mapping: planned into this node's class
    /// rows until an apply succeeds in full.
    refusals: Vec<KernelRefusal>,
    /// When the mapping counters were last read from the host.
    counters_read: Option<Instant>,
    /// The last apply's sweep of stale conntrack entries failed: the pass is retried soon
    /// (the host sweeps again on the next apply) though nothing else needs it.
    conntrack_owed: bool,
    /// The last pass's snapshot (less the classes, which went to the status writes): the next
    /// pass takes every object the stores still hold at the same version from it instead of
    /// copying it again.
    previous: Snapshot,
}

/// The mapping counters are read from the host at most this often (and on every verifying
/// pass): reading them runs `nft`, and a busy cluster runs many passes a second.
const COUNTER_REFRESH: Duration = Duration::from_secs(10);

/// Whether a pass reads the mapping counters: the first pass, a verifying one, or one at least
/// [`COUNTER_REFRESH`] after the last read.
fn counters_due(verify: bool, last: Option<Instant>, now: Instant) -> bool {
    verify || last.is_none_or(|at| now >= at + COUNTER_REFRESH)
}

/// The watched kinds, declared once: each becomes a store in `Inputs`, a reflector started by
/// `start_inputs`, a wait in `wait_synced` and a list in the pass's [`Snapshot`] (the field
/// named after `=>`). Adding a kind is one line here, one field in `Snapshot` and a `PassInput`
/// impl saying which of its changes a pass reads.
macro_rules! watched_kinds {
    ($($field:ident: $kind:ty => $snapshot:ident;)*) => {
        /// The watched objects.
        struct Inputs {
            $($field: Store<$kind>,)*
            /// `kube-system/cilium-config`, watched by name: at most one object.
            cni: Store<ConfigMap>,
            tasks: Vec<JoinHandle<()>>,
        }

        fn start_inputs(client: &kube::Client, watch: &Watch) -> Inputs {
            let mut tasks = Vec::new();
            $(
                let ($field, task) = reflect::<$kind>(
                    Api::all(client.clone()),
                    <$kind as PassInput>::watch_config(&watch.node),
                    watch,
                    stringify!($kind),
                );
                tasks.push(task);
            )*
            let (ns, name) = CILIUM_CONFIG;
            let (cni, task) = reflect::<ConfigMap>(
                Api::namespaced(client.clone(), ns),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
                watch,
                "ConfigMap",
            );
            tasks.push(task);
            Inputs { $($field,)* cni, tasks }
        }

        /// Waits until every watch has listed once.
        async fn wait_synced(inputs: &Inputs) -> Result<(), AgentError> {
            $(
                inputs
                    .$field
                    .wait_until_ready()
                    .await
                    .map_err(|_| AgentError::WatchEnded(stringify!($kind)))?;
            )*
            inputs
                .cni
                .wait_until_ready()
                .await
                .map_err(|_| AgentError::WatchEnded("ConfigMap"))?;
            Ok(())
        }

        impl Inputs {
            /// Every watched object, each kind sorted by namespace and name; objects `previous`
            /// (the last snapshot) holds at the version the store holds are moved from it, the
            /// others copied from the store.
            fn snapshot(&self, previous: Snapshot) -> Snapshot {
                Snapshot {
                    $($snapshot: refresh(&self.$field, previous.$snapshot),)*
                    cni: self.cni.state().first().map(|cm| CniFacts::from_cilium_config(cm)),
                }
            }
        }
    };
}

watched_kinds! {
    classes: PortMapClass => classes;
    portmaps: PortMap => portmaps;
    slices: EndpointSlice => endpoint_slices;
    nodes: Node => nodes;
    namespaces: Namespace => namespaces;
    services: Service => services;
    pods: Pod => pods;
}

/// A store's objects sorted by namespace and name (a store lists in hash order, which must not
/// reach the plan, nor make a simulated run differ), taking each from `previous` (sorted the
/// same way) when it holds the object at the same `resourceVersion` (the API server gives every
/// change a new one), and copying it from the store otherwise. A pass after one event then
/// copies one object instead of every object of every store.
fn refresh<K>(store: &Store<K>, previous: Vec<K>) -> Vec<K>
where
    K: Clone + kube::Resource<DynamicType = ()> + 'static,
{
    fn key<K: kube::Resource>(o: &K) -> (Option<&str>, Option<&str>) {
        (o.meta().namespace.as_deref(), o.meta().name.as_deref())
    }
    let mut current = store.state();
    current.sort_by(|a, b| key(a.as_ref()).cmp(&key(b.as_ref())));
    let mut previous = previous.into_iter().peekable();
    current
        .iter()
        .map(|o| {
            let o = o.as_ref();
            while previous.next_if(|p| key(p) < key(o)).is_some() {}
            let version = o.meta().resource_version.as_deref();
            previous
                .next_if(|p| {
                    key(p) == key(o)
                        && version.is_some()
                        && p.meta().resource_version.as_deref() == version
                })
                .unwrap_or_else(|| o.clone())
        })
        .collect()
}

impl Drop for Inputs {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// When the next pass runs and whether it compares with the kernel: the first pass and one
/// every resync verify; a failed verifying pass is owed until one succeeds; a failed, refused
/// or to-be-recomputed pass is retried after a delay doubling from `retry_min` to `retry_max`.
#[derive(Debug)]
struct Schedule {
    first: bool,
    next_verify: Instant,
    retry_at: Option<Instant>,
    retry_delay: Duration,
    verify_owed: bool,
    resync: Duration,
    retry_min: Duration,
    retry_max: Duration,
}

impl Schedule {
    fn new(config: &AgentConfig, now: Instant) -> Self {
        Self {
            first: true,
            next_verify: now,
            retry_at: None,
            retry_delay: config.retry_min,
            verify_owed: false,
            resync: config.resync,
            retry_min: config.retry_min,
            retry_max: config.retry_max,
        }
    }

    /// A pass starts: whether it verifies against the kernel. It is the retry that was due, if
    /// one was: the loop waits for the next pass while this one's status writes go on, and a
    /// retry left due would start pass after pass until they ended.
    fn start_pass(&mut self, link_changed: bool, now: Instant) -> bool {
        let verify = self.first || self.verify_owed || link_changed || now >= self.next_verify;
        self.first = false;
        self.retry_at = None;
        if verify {
            self.next_verify = now + self.resync;
        }
        verify
    }

    /// A pass ended with `outcome`. Passes may end in another order than they started (their
    /// status writes finish after the next pass began), so only a pass that verified pays a
    /// verify owed.
    fn end_pass(&mut self, outcome: &PassOutcome, verified: bool, now: Instant) {
        if outcome.failed.is_some() {
            self.verify_owed |= verified;
        } else if verified {
            self.verify_owed = false;
        }
        if outcome.failed.is_some() || outcome.refused || outcome.recompute {
            self.retry_at = Some(now + self.retry_delay);
            self.retry_delay = (self.retry_delay * 2).min(self.retry_max);
        } else {
            self.retry_at = None;
            self.retry_delay = self.retry_min;
        }
    }
}

/// What the datapath part of a pass came to.
enum Applied {
    /// It failed; nothing is written (a failed apply would have status claim what the host
    /// does not have).
    Failed(PassError),
    /// The datapath is applied; the writes go to the status task.
    Ok {
        writes: Writes,
        /// The classes the plan read (the writes are merged into them first).
        classes: Vec<PortMapClass>,
        /// The kernel refused part of the datapath.
        refused: bool,
    },
}

/// A pass whose status writes are with the status task.
struct Writing {
    started: Instant,
    verified: bool,
    refused: bool,
}

/// Passes whose status writes have not been reported yet, by id, and the newest pass whose
/// outcome the schedule took: a pass ending after a newer one ended (its writes were slower
/// than the newer pass's datapath failed) is recorded, but must not undo the newer one's retry.
#[derive(Default)]
struct InFlight {
    writing: BTreeMap<u64, Writing>,
    scheduled: Option<u64>,
    next_id: u64,
}

impl InFlight {
    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Whether pass `id` is newer than every pass the schedule took (and now takes it).
    fn take_for_schedule(&mut self, id: u64) -> bool {
        let newest = self.scheduled.is_none_or(|s| id > s);
        if newest {
            self.scheduled = Some(id);
        }
        newest
    }
}

/// Why the loop woke up.
enum Wake {
    /// A pass's status writes finished (or the status task stopped).
    Written(Result<StatusDone, String>),
    /// A reason to pass; with the link event when one woke it (`Some(None)`: the host's link
    /// event stream ended).
    Pass(Option<Option<LinkEvent>>),
}

/// What one pass came to.
struct PassOutcome {
    failed: Option<PassError>,
    /// The kernel refused part of the datapath (reported in status): try again soon.
    refused: bool,
    /// Some status must be recomputed from fresher inputs: run again soon.
    recompute: bool,
}

impl<H: Host> Agent<H> {
    /// An agent for `config.node_name` on `host`, talking to the API server through `client`.
    pub fn new(client: kube::Client, host: H, config: AgentConfig) -> Self {
        Self {
            client,
            host,
            config,
            metrics: Arc::new(Metrics::new()),
            health: Health::default(),
            link_watch: None,
            pass_hook: None,
            refusals: Vec::new(),
            counters_read: None,
            conntrack_owed: false,
            previous: Snapshot::default(),
        }
    }

    /// Runs a pass at once when the host reports a change to a `kup-*` link or the underlay
    /// device (a restarted mesh daemon deletes every link bound to its device).
    pub fn with_link_watch(mut self, watch: LinkWatch) -> Self {
        self.link_watch = Some(watch);
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

    /// Under [`StopPolicy::Owner`], reads the agent's own Pod in the background (retrying until
    /// it answers) to learn the DaemonSet owning it, then watches that DaemonSet and its
    /// namespace for a sign of removal (the watch lives in the task's result until the stop).
    fn learn_owner(&self) -> Option<JoinHandle<Option<(lifecycle::Owner, RemovalWatch)>>> {
        let StopPolicy::Owner { pod, namespace } = self.config.stop_policy.clone() else {
            return None;
        };
        let client = self.client.clone();
        let health = self.health.clone();
        let timeout = self.config.api_timeout;
        let (retry_min, retry_max) = (self.config.retry_min, self.config.retry_max);
        Some(tokio::spawn(async move {
            let mut delay = retry_min;
            loop {
                match lifecycle::read_owner(&client, &pod, &namespace, timeout).await {
                    Lookup::Found(owner) => {
                        match &owner {
                            Some(o) => tracing::info!(
                                "running as Pod {namespace}/{pod} of DaemonSet {}/{}",
                                o.namespace,
                                o.name
                            ),
                            None => tracing::warn!(
                                "Pod {namespace}/{pod} has no DaemonSet owner: a stop will keep the datapath"
                            ),
                        }
                        return owner.map(|o| {
                            let watch = lifecycle::watch_removal(&client, &o, &health);
                            (o, watch)
                        });
                    }
                    Lookup::NotFound | Lookup::Denied | Lookup::Unauthorized => {
                        tracing::warn!(
                            "cannot read the agent's own Pod {namespace}/{pod}: removing kuport \
                             will not clean this node by itself (grant get on pods and \
                             daemonsets in {namespace}, or run `kuport cleanup`)"
                        );
                        return None;
                    }
                    Lookup::Failed(e) => {
                        tracing::debug!("reading Pod {namespace}/{pod}: {e}; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(retry_max);
                    }
                    Lookup::NotAsked => return None,
                }
            }
        }))
    }

    async fn stop_action(
        &self,
        owner_task: Option<JoinHandle<Option<(lifecycle::Owner, RemovalWatch)>>>,
    ) -> StopAction {
        match &self.config.stop_policy {
            StopPolicy::Keep => StopAction::Keep("the next agent adopts it".to_owned()),
            StopPolicy::Teardown => StopAction::Teardown("configured to".to_owned()),
            StopPolicy::Owner { pod, namespace } => {
                // A lookup still running gets the same bounded time as the stop's own
                // lookups, rather than being dropped because the stop came early.
                let learnt = match owner_task {
                    Some(mut task) => {
                        let bound = self.config.api_timeout.min(STOP_LOOKUP_TIMEOUT);
                        match tokio::time::timeout(bound, &mut task).await {
                            Ok(found) => found.ok().flatten(),
                            Err(_) => {
                                task.abort();
                                None
                            }
                        }
                    }
                    None => None,
                };
                let (owner_at_start, seen_removal) = match learnt {
                    Some((owner, watch)) => (Some(owner), watch.seen()),
                    None => (None, None),
                };
                let facts = lifecycle::gather(
                    &self.client,
                    pod,
                    namespace,
                    owner_at_start,
                    seen_removal,
                    self.config.api_timeout.min(STOP_LOOKUP_TIMEOUT),
                )
                .await;
                tracing::debug!(?facts, "deciding what to do with the datapath");
                lifecycle::decide(&facts)
            }
        }
    }

    /// Waits for a reason to pass (a watch event, a link event, a retry, a resync), debounces,
    /// runs the pass, hands its status writes to the status task and reopens the link event
    /// stream when the underlay changed; records each pass once its writes are reported. Long
    /// because the waiting is one `select!` over those sources; the decisions are in
    /// [`Schedule`].
    async fn run_loop(&mut self, shutdown: &CancellationToken) -> Result<(), AgentError> {
        // Capacity 1: a full channel already means "dirty", so watch events coalesce here.
        let (dirty_tx, mut dirty_rx) = mpsc::channel::<()>(1);
        let wanted = Wanted::default();
        let watch = Watch {
            node: self.config.node_name.clone(),
            dirty: dirty_tx,
            wanted: wanted.clone(),
            metrics: self.metrics.clone(),
            jitter_seed: self.config.jitter_seed,
        };
        let inputs = start_inputs(&self.client, &watch);
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
        );
        let mut status =
            StatusTask::start(writer, inputs.portmaps.clone(), self.config.clock.clone());

        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            synced = wait_synced(&inputs) => synced?,
        }
        tracing::info!(node = %self.config.node_name, "every watch synced; starting passes");

        let mut links: Option<mpsc::Receiver<LinkEvent>> = None;
        let mut watched_underlay: Option<Vec<String>> = None;
        let mut schedule = Schedule::new(&self.config, Instant::now());
        let mut in_flight = InFlight::default();

        loop {
            // A link event means the kernel changed behind the agent's back: only a pass that
            // compares against the kernel (not the last applied state) can see what is gone.
            let mut link_changed = false;
            if !schedule.first {
                // Biased (in this order) rather than random: a run must replay exactly in the
                // simulator. Reports of finished writes come first, so a pass starts on a
                // schedule that knows how the previous ones ended.
                let wake = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Ok(()),
                    done = status.done() => Wake::Written(done),
                    Some(()) = dirty_rx.recv() => Wake::Pass(None),
                    event = next_link_event(&mut links) => Wake::Pass(Some(event)),
                    _ = tokio::time::sleep_until(schedule.next_verify) => Wake::Pass(None),
                    _ = sleep_until_opt(schedule.retry_at) => Wake::Pass(None),
                };
                let link_event = match wake {
                    Wake::Written(done) => {
                        let done = done.map_err(AgentError::StatusWriter)?;
                        self.writes_done(done, &mut in_flight, &mut schedule);
                        continue;
                    }
                    Wake::Pass(event) => event,
                };
                match link_event {
                    Some(Some(e)) => {
                        link_changed = true;
                        tracing::info!(
                            link = %e.name,
                            removed = e.removed,
                            "link changed on the host: running a verifying pass"
                        );
                    }
                    // The host's event stream ended: open a new one after this pass.
                    Some(None) => {
                        links = None;
                        watched_underlay = None;
                    }
                    None => {}
                }
                // Let a burst of watch events settle into one pass.
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(self.config.debounce) => {}
                }
                while dirty_rx.try_recv().is_ok() {}
                if let Some(rx) = links.as_mut() {
                    while rx.try_recv().is_ok() {
                        link_changed = true;
                    }
                }
            }
            let verify = schedule.start_pass(link_changed, Instant::now());

            let id = in_flight.new_id();
            let started = Instant::now();
            let (applied, underlay) = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                o = self.pass(&inputs, verify) => o,
            };
            match applied {
                Applied::Failed(error) => {
                    let outcome = PassOutcome {
                        failed: Some(error),
                        refused: false,
                        recompute: false,
                    };
                    self.end_pass(id, started, verify, outcome, &mut in_flight, &mut schedule);
                }
                Applied::Ok {
                    writes,
                    classes,
                    refused,
                } => {
                    let writing = Writing {
                        started,
                        verified: verify,
                        refused,
                    };
                    in_flight.writing.insert(id, writing);
                    let writes = Arc::new(writes);
                    wanted.set(writes.clone());
                    let job = StatusJob {
                        pass: id,
                        writes,
                        classes,
                    };
                    if let Some(replaced) = status.submit(job) {
                        self.superseded(replaced, &mut in_flight);
                    }
                }
            }

            // (Re)open the link event stream once the underlay device is known or changed.
            if let (Some(watch), Some(underlay)) = (self.link_watch.as_mut(), underlay)
                && watched_underlay.as_ref() != Some(&underlay)
            {
                match watch(underlay.clone()) {
                    Ok(rx) => {
                        links = Some(rx);
                        watched_underlay = Some(underlay);
                    }
                    Err(e) => tracing::warn!("watching link events: {e}"),
                }
            }
        }
    }

    /// A pass's status writes were reported: the pass ends with what they came to, as it did
    /// when it wrote them itself. A pass whose writes a newer pass took over without any of
    /// them failing ends as superseded: it neither failed nor completed.
    fn writes_done(&self, done: StatusDone, in_flight: &mut InFlight, schedule: &mut Schedule) {
        let Some(writing) = in_flight.writing.remove(&done.pass) else {
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
                .observe_superseded(writing.started.elapsed().as_secs_f64());
            tracing::debug!("status writes superseded by a newer pass's");
            return;
        }
        let outcome = PassOutcome {
            failed: (!status.errors.is_empty()).then_some(PassError::Status(status.errors)),
            refused: writing.refused,
            recompute: status.recompute > 0,
        };
        self.end_pass(
            done.pass,
            writing.started,
            writing.verified,
            outcome,
            in_flight,
            schedule,
        );
    }

    /// A pass whose writes were replaced before the status task started them.
    fn superseded(&self, id: u64, in_flight: &mut InFlight) {
        if let Some(writing) = in_flight.writing.remove(&id) {
            self.metrics
                .observe_superseded(writing.started.elapsed().as_secs_f64());
        }
    }

    /// Records how pass `id` ended and, unless a newer pass ended first, schedules the next.
    fn end_pass(
        &self,
        id: u64,
        started: Instant,
        verified: bool,
        outcome: PassOutcome,
        in_flight: &mut InFlight,
        schedule: &mut Schedule,
    ) {
        let now_unix = self.config.clock.now().as_millisecond() as f64 / 1000.0;
        self.metrics.observe_pass(
            started.elapsed().as_secs_f64(),
            outcome.failed.as_ref().map(PassError::stage),
            now_unix,
        );
        let newest = in_flight.take_for_schedule(id);
        match &outcome.failed {
            None => self.health.set_ready(),
            Some(error) if newest => tracing::warn!(
                stage = error.stage().as_str(),
                "pass failed: {error}; retrying in {:?}",
                schedule.retry_delay
            ),
            Some(error) => tracing::warn!(
                stage = error.stage().as_str(),
                "pass failed: {error}; a newer pass has ended since"
            ),
        }
        if newest {
            schedule.end_pass(&outcome, verified, Instant::now());
        }
    }

    /// One pass up to the datapath. Returns what it came to (with the status it leaves to write)
    /// and the underlay devices to watch for link events.
    async fn pass(&mut self, inputs: &Inputs, verify: bool) -> (Applied, Option<Vec<String>>) {
        let node = self.config.node_name.clone();

        // Every input, cilium-config included, comes from a watch: an unreachable API server
        // leaves the stores as they were, so a link event during an outage still repairs the
        // datapath from the last known objects.
        let mut snapshot = inputs.snapshot(std::mem::take(&mut self.previous));

        let mut query = facts_query(&snapshot, &node, self.config.marks);
        query.agent_ports = self.config.agent_ports.clone();
        let mut facts = match self.host.facts(&query).await {
            Ok(f) => f,
            Err(e) => {
                self.previous = snapshot;
                return (Applied::Failed(PassError::Facts(e)), None);
            }
        };
        facts.refusals = self.refusals.clone();
        let underlay = facts.underlay_device.clone().map(|d| vec![d]);

        let planned = self.plan_and_apply(&mut snapshot, facts, verify).await;
        // The classes go with the writes; the rest is the next pass's to reuse.
        let classes = match planned {
            Ok(_) => std::mem::take(&mut snapshot.classes),
            Err(_) => Vec::new(),
        };
        self.previous = snapshot;
        let mut plan = match planned {
            Ok(plan) => plan,
            Err(failed) => return (Applied::Failed(failed), underlay),
        };
        self.metrics.record_plan(&plan);
        let now = Instant::now();
        if counters_due(verify, self.counters_read, now) {
            self.counters_read = Some(now);
            match self.host.counters().await {
                Ok(counters) => self.metrics.set_mapping_counters(counters),
                Err(e) => tracing::warn!("reading kuport's nft counters: {e}"),
            }
        }
        let applied = Applied::Ok {
            writes: std::mem::take(&mut plan.writes),
            classes,
            // A failed conntrack sweep is retried like a refusal (soon, with backoff), but
            // reported in no status: the datapath itself is applied.
            refused: !self.refusals.is_empty() || self.conntrack_owed,
        };
        (applied, underlay)
    }

    /// Plans, applies, and when the kernel refused something new, plans again so the status
    /// says what it refused (the datapath asked for is the same; only this node's part of the
    /// class status changes). Returns the plan whose status is to be written.
    async fn plan_and_apply(
        &mut self,
        snapshot: &mut Snapshot,
        facts: HostFacts,
        verify: bool,
    ) -> Result<Plan, PassError> {
        let (mut plan, mut facts) = self.plan(snapshot, facts).await?;
        self.run_hook(snapshot, &mut plan);
        let report = self
            .host
            .apply(&plan.host_state, verify)
            .await
            .map_err(PassError::Apply)?;
        log_apply(&report, &plan.host_state, verify);
        if report.conntrack_swept {
            self.metrics
                .record_conntrack_sweep(report.conntrack_cleared, report.conntrack_error.is_some());
        }
        self.conntrack_owed = report.conntrack_error.is_some();
        let refused = Refusal::by_mapping(&report.refused);
        self.metrics.set_refusals(refused.len());
        if refused == self.refusals {
            return Ok(plan);
        }
        self.refusals = refused;
        facts.refusals = self.refusals.clone();
        let (mut plan, _) = self.plan(snapshot, facts).await?;
        self.run_hook(snapshot, &mut plan);
        Ok(plan)
    }

    /// Computes the plan over `snapshot`, lent to the plan's thread and put back (the next pass
    /// reuses its objects); hands the facts back for a second plan. When the plan panicked the
    /// snapshot is lost, and the next pass copies every object from the stores again.
    async fn plan(
        &self,
        snapshot: &mut Snapshot,
        facts: HostFacts,
    ) -> Result<(Plan, HostFacts), PassError> {
        let lent = std::mem::take(snapshot);
        let (plan, lent, facts) = compute_plan(
            lent,
            self.config.node_name.clone(),
            facts,
            &self.config.clock,
            self.config.plan_on_blocking_thread,
        )
        .await?;
        *snapshot = lent;
        Ok((plan, facts))
    }

    fn run_hook(&self, snapshot: &Snapshot, plan: &mut Plan) {
        if let Some(hook) = &self.pass_hook {
            hook(snapshot, plan);
        }
    }
}

/// A reflector for one kind: a store kept up to date by a watch that retries with backoff
/// (an API outage leaves the store as it was), marking the node dirty on every change that can
/// change a pass (`relevance`).
/// Objects per page of a watch's list. A page is held whole, untrimmed, while it is read
/// (kube's default is 500); objects may carry up to 256 KiB of annotations each, so 500 of them
/// would be 128 MiB before trimming. 50 keeps a page under about 13 MiB at worst and costs a
/// relist of 10,000 PortMaps 200 requests instead of 20.
const LIST_PAGE_SIZE: u32 = 50;

fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    watch: &Watch,
    kind: &'static str,
) -> (Store<K>, JoinHandle<()>)
where
    K: PassInput + Trim + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (reader, mut writer) = reflector::store();
    let stream = watcher(api, config.page_size(LIST_PAGE_SIZE))
        .backoff(watch_backoff(watch.jitter_seed ^ jitter_seed_for(kind)))
        // Only what a pass reads is kept (`trim.rs`): annotations, managed fields and the
        // rest would otherwise stay in memory for as long as the agent runs.
        .modify(K::trim);
    let store = reader.clone();
    let Watch {
        dirty,
        wanted,
        metrics,
        ..
    } = watch.clone();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!("watching {kind}: {e}");
                    continue;
                }
            };
            // Judged against the object the store holds before the event is applied.
            let passes = match &event {
                watcher::Event::Apply(new) => store
                    .get(&ObjectRef::from_obj(new))
                    .is_none_or(|old| K::changes_a_pass(&old, new, &wanted)),
                _ => true,
            };
            writer.apply_watcher_event(&event);
            metrics.record_watch_event(kind, passes);
            if passes {
                // Full means a pass is already due.
                let _ = dirty.try_send(());
            }
        }
    });
    (reader, task)
}

/// What every watch shares: where to mark the node dirty, what its status writes want (to
/// judge which events can change a pass), the metrics, the seed of its retry jitter.
#[derive(Clone)]
struct Watch {
    /// This node's name: some kinds are watched only for it.
    node: String,
    dirty: mpsc::Sender<()>,
    wanted: Wanted,
    metrics: Arc<Metrics>,
    jitter_seed: u64,
}

/// The facts this node's plan needs: the interfaces its classes give it, and its InternalIP.
fn facts_query(snapshot: &Snapshot, node: &str, marks: MarkLayout) -> FactsQuery {
    let mut interfaces: Vec<String> = snapshot
        .classes
        .iter()
        .filter_map(|c| c.spec.nodes.get(node))
        .flat_map(|n| n.interfaces.iter().cloned())
        .collect();
    interfaces.sort();
    interfaces.dedup();
    let internal_ip = snapshot
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))
        .and_then(node_internal_ip);
    FactsQuery {
        interfaces,
        internal_ip,
        marks,
        agent_ports: Vec::new(),
    }
}

/// The plan, off the async workers unless configured inline; a panic in it fails the pass
/// instead of the agent. The snapshot and the facts are moved to the plan's thread and handed
/// back with the plan rather than copied for it (a snapshot holds every watched object).
async fn compute_plan(
    snapshot: Snapshot,
    node: String,
    facts: HostFacts,
    clock: &Clock,
    blocking: bool,
) -> Result<(Plan, Snapshot, HostFacts), PassError> {
    let now = clock.now();
    if blocking {
        return tokio::task::spawn_blocking(move || {
            let plan = plan(&snapshot, &node, &facts, now);
            (plan, snapshot, facts)
        })
        .await
        .map_err(|e| PassError::Plan(e.to_string()));
    }
    std::panic::catch_unwind(|| plan(&snapshot, &node, &facts, now))
        .map(|plan| (plan, snapshot, facts))
        .map_err(|_| PassError::Plan("the plan panicked".to_owned()))
}

/// The watches' retry delays: kube-runtime's default policy (0.8 s doubling to 30 s, reset
/// after 2 min without errors, jittered), with the jitter drawn from `seed`.
fn watch_backoff(seed: u64) -> impl kube::runtime::utils::Backoff {
    let policy = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(800))
        .with_max_delay(Duration::from_secs(30))
        .with_factor(2.0)
        .without_max_times()
        .with_jitter()
        .with_jitter_seed(seed);
    kube::runtime::utils::ResetTimerBackoff::new(
        kube::runtime::watcher::ExponentialBackoff::from(policy),
        Duration::from_secs(120),
    )
}

/// One info line per applied change; debug for a pass that changed nothing.
fn log_apply(report: &ApplyReport, state: &HostState, verify: bool) {
    for refusal in &report.refused {
        let mappings: Vec<&str> = refusal.mappings.iter().map(String::as_str).collect();
        tracing::warn!(
            unit = refusal.unit,
            mappings = mappings.join(","),
            "the kernel refused {}; the mappings using it are left out: {}",
            refusal.unit,
            refusal.message
        );
    }
    if let Some(error) = &report.conntrack_error {
        tracing::warn!("{error}; the next pass tries again");
    }
    if report.conntrack_cleared > 0 {
        tracing::info!(
            cleared = report.conntrack_cleared,
            "cleared {} conntrack entries of flows no longer translated this way (their next packet starts a new flow)",
            report.conntrack_cleared
        );
    }
    if report.mutations() == 0 {
        tracing::debug!(verify, "pass: datapath unchanged");
        return;
    }
    let dnat = state
        .nft
        .chains
        .iter()
        .flat_map(|(_, rules)| rules)
        .filter(|r| matches!(r, Rule::Dnat(_)))
        .count();
    tracing::info!(
        verify,
        nft_changed = report.nft_changed,
        nft_lines = report.nft_lines,
        links_created = report.links_created,
        links_updated = report.links_updated,
        links_deleted = report.links_deleted,
        rules_added = report.rules_added,
        rules_deleted = report.rules_deleted,
        routes_added = report.routes_added,
        routes_deleted = report.routes_deleted,
        "applied: {dnat} dnat, {} link, {} rules, {} routes",
        state.links.len(),
        state.rules.len(),
        state.routes.len()
    );
}

async fn next_link_event(links: &mut Option<mpsc::Receiver<LinkEvent>>) -> Option<LinkEvent> {
    match links {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn sleep_until_opt(at: Option<Instant>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    match at {
        Some(at) => Box::pin(tokio::time::sleep_until(at)),
        None => Box::pin(std::future::pending()),
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::*;

    #[test]
    fn counters_are_read_first_on_verify_and_then_at_most_every_refresh() {
        let t0 = Instant::now();
        assert!(counters_due(false, None, t0), "the first pass reads them");
        assert!(!counters_due(false, Some(t0), t0 + Duration::from_secs(1)));
        assert!(
            counters_due(true, Some(t0), t0 + Duration::from_secs(1)),
            "a verify reads them"
        );
        assert!(counters_due(false, Some(t0), t0 + COUNTER_REFRESH));
    }

    fn outcome(failed: bool, refused: bool) -> PassOutcome {
        PassOutcome {
            failed: failed.then(|| PassError::Status(vec!["refused".to_owned()])),
            refused,
            recompute: false,
        }
    }

    fn schedule() -> (Schedule, Instant) {
        let mut config = AgentConfig::new("n1");
        config.retry_min = Duration::from_millis(200);
        config.retry_max = Duration::from_millis(700);
        config.resync = Duration::from_secs(300);
        let now = Instant::now();
        (Schedule::new(&config, now), now)
    }

    #[test]
    fn the_first_pass_and_each_resync_verify_and_others_do_not() {
        let (mut s, t0) = schedule();
        assert!(s.start_pass(false, t0), "the first pass verifies");
        s.end_pass(&outcome(false, false), true, t0);
        assert!(!s.start_pass(false, t0 + Duration::from_secs(1)));
        assert!(
            s.start_pass(true, t0 + Duration::from_secs(2)),
            "a link event verifies"
        );
        assert!(
            s.start_pass(false, t0 + Duration::from_secs(303)),
            "a resync verifies"
        );
    }

    #[test]
    fn a_failed_verifying_pass_is_owed_and_retries_back_off() {
        let (mut s, t0) = schedule();
        assert!(s.start_pass(false, t0));
        s.end_pass(&outcome(true, false), true, t0);
        assert_eq!(s.retry_at, Some(t0 + Duration::from_millis(200)));
        assert!(s.start_pass(false, t0), "the failed verify is owed");
        s.end_pass(&outcome(true, false), true, t0);
        assert_eq!(s.retry_at, Some(t0 + Duration::from_millis(400)));
        s.start_pass(false, t0);
        s.end_pass(&outcome(true, false), true, t0);
        s.start_pass(false, t0);
        s.end_pass(&outcome(true, false), true, t0);
        assert_eq!(
            s.retry_delay,
            Duration::from_millis(700),
            "capped at retry_max"
        );
        // A refusal (status written) retries too, without owing a verify.
        s.start_pass(false, t0);
        s.end_pass(&outcome(false, true), true, t0);
        assert!(s.retry_at.is_some() && !s.verify_owed);
        // A clean pass resets the delay and cancels the retry.
        s.start_pass(false, t0);
        s.end_pass(&outcome(false, false), false, t0);
        assert_eq!(
            (s.retry_at, s.retry_delay),
            (None, Duration::from_millis(200))
        );
    }

    #[test]
    fn a_started_pass_is_the_retry_that_was_due() {
        let (mut s, t0) = schedule();
        s.start_pass(false, t0);
        s.end_pass(&outcome(true, false), false, t0);
        assert!(s.retry_at.is_some());
        // The retry runs; its writes have not ended yet, and no other retry is due meanwhile.
        s.start_pass(false, t0 + Duration::from_millis(200));
        assert_eq!(s.retry_at, None);
        assert_eq!(
            s.retry_delay,
            Duration::from_millis(400),
            "the backoff stands"
        );
    }

    #[test]
    fn only_a_verifying_pass_pays_a_verify_owed() {
        let (mut s, t0) = schedule();
        assert!(s.start_pass(false, t0));
        // The next pass starts before the verifying pass's status writes fail.
        assert!(!s.start_pass(false, t0 + Duration::from_secs(1)));
        s.end_pass(&outcome(true, false), true, t0);
        s.end_pass(&outcome(false, false), false, t0);
        assert!(s.verify_owed, "the pass that ended clean did not verify");
        assert!(s.start_pass(false, t0 + Duration::from_secs(2)));
        s.end_pass(&outcome(false, false), true, t0);
        assert!(!s.verify_owed);
    }

    #[test]
    fn a_pass_ending_after_a_newer_one_leaves_the_schedule_to_it() {
        let mut in_flight = InFlight::default();
        let (older, newer) = (in_flight.new_id(), in_flight.new_id());
        assert!(in_flight.take_for_schedule(newer));
        assert!(!in_flight.take_for_schedule(older));
        let newest = in_flight.new_id();
        assert!(in_flight.take_for_schedule(newest));
    }
}

#[cfg(test)]
mod snapshot_tests {
    use super::*;

    fn config_map(namespace: &str, name: &str, version: &str, marker: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some(namespace.to_owned());
        cm.metadata.name = Some(name.to_owned());
        cm.metadata.resource_version = Some(version.to_owned());
        cm.data = Some([("from".to_owned(), marker.to_owned())].into());
        cm
    }

    fn marker(cm: &ConfigMap) -> (&str, &str, &str) {
        (
            cm.metadata.name.as_deref().unwrap_or_default(),
            cm.metadata.resource_version.as_deref().unwrap_or_default(),
            cm.data
                .as_ref()
                .and_then(|d| d.get("from"))
                .map_or("", String::as_str),
        )
    }

    #[test]
    fn unchanged_objects_are_taken_from_the_previous_snapshot_and_the_rest_copied() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        for cm in [
            config_map("a", "same", "1", "store"),
            config_map("a", "changed", "5", "store"),
            config_map("a", "new", "7", "store"),
            config_map("b", "same", "2", "store"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(cm));
        }
        // The marker tells where each object came from: at one version the API server's
        // objects are the same, so only the test can tell them apart.
        let previous = vec![
            config_map("a", "changed", "4", "previous"),
            config_map("a", "gone", "3", "previous"),
            config_map("a", "same", "1", "previous"),
            config_map("b", "same", "2", "previous"),
        ];
        let refreshed = refresh(&store, previous);
        let got: Vec<_> = refreshed.iter().map(marker).collect();
        assert_eq!(
            got,
            [
                ("changed", "5", "store"),
                ("new", "7", "store"),
                ("same", "1", "previous"),
                ("same", "2", "previous"),
            ]
        );
        assert_eq!(
            refreshed[3].metadata.namespace.as_deref(),
            Some("b"),
            "sorted by namespace, then name"
        );
    }

    #[test]
    fn an_object_without_a_version_is_always_copied() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let mut cm = config_map("a", "x", "1", "store");
        cm.metadata.resource_version = None;
        writer.apply_watcher_event(&watcher::Event::Apply(cm.clone()));
        let mut old = cm;
        old.data = Some([("from".to_owned(), "previous".to_owned())].into());
        let refreshed = refresh(&store, vec![old]);
        assert_eq!(marker(&refreshed[0]).2, "store");
    }
}
