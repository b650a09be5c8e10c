//! One simulated cluster for one seed: the API server model and N agents as turmoil hosts, a
//! driver that changes the cluster in-process, and the faults the scenario asks for.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
    TypeMeta,
};
use kuport::agent::{Agent, AgentConfig, CancellationToken, Clock, Health, PassHook};
use kuport_core::api::{PortMap, PortMapClass, PortMapNode};
use kuport_core::ir::Family;
use kuport_core::snapshot::{CniFacts, HostFacts, Snapshot};
use kuport_host::MemoryHost;
use kuport_sim::apiserver::{ApiServer, SplitMix64};
use serde_json::Value;

use crate::net::{self, API_HOST, API_PORT, RequestCount, Tamper};
use crate::record::{Observations, Violations};
use crate::sync::lock;

/// The simulated wall clock starts here (any fixed instant: runs must not depend on the day).
const EPOCH_SECONDS: i64 = 1_800_000_000;

/// Something that went wrong running the world (not an invariant: the harness itself).
pub type WorldError = Box<dyn std::error::Error>;

/// Per node: what survives the agent (its host), and what the checks read.
pub struct NodeSlot {
    /// The node's kernel state: kept across agent crashes, as on a real node.
    pub host: MemoryHost,
    /// The facts its host reports.
    pub facts: HostFacts,
    /// Requests this node's agents made.
    pub requests: Arc<RequestCount>,
    /// Milliseconds this node's clock is ahead of (or behind) simulated time.
    pub skew_ms: Arc<AtomicI64>,
    /// Whether the agent is running (not crashed).
    pub running: bool,
    /// Whether the node's agent is cut off from the API server.
    pub partitioned: bool,
    /// Whether the node left the cluster (its agent stays down).
    pub removed: bool,
    /// The running agent's health (replaced at each start): whether it owes a write.
    pub health: Arc<Mutex<Health>>,
}

/// How a world is built.
#[derive(Clone)]
pub struct WorldConfig {
    /// Every random choice derives from it.
    pub seed: u64,
    /// Node names; each runs an agent.
    pub nodes: Vec<String>,
    /// A broken variant's plan change, run on every agent's every pass.
    pub plan_fault: Option<PassHook>,
    /// A broken variant's wire change, applied to every agent's requests.
    pub wire_fault: Option<Tamper>,
    /// A dual-stack cluster: every Node also advertises an IPv6 pod CIDR and every node's
    /// public interface also has an IPv6 address ([`facts_for`]), so Services may list their
    /// pods over IPv6.
    pub dual_stack: bool,
}

/// The families a Service lists its pod in (one EndpointSlice each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stack {
    /// IPv4 alone, as every Service of an IPv4 cluster.
    #[default]
    V4,
    /// IPv4 and IPv6.
    Dual,
    /// IPv6 alone.
    V6,
}

impl Stack {
    /// Its families, IPv4 first.
    pub fn families(self) -> &'static [Family] {
        match self {
            Stack::V4 => &[Family::V4],
            Stack::Dual => &[Family::V4, Family::V6],
            Stack::V6 => &[Family::V6],
        }
    }
}

/// Where the scenario put a Service's pod, and in which families it is listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The families the Service lists its pod in.
    pub stack: Stack,
    /// The pod's node; none: the Service has no pod.
    pub node: Option<String>,
    /// Whether the pod is ready.
    pub ready: bool,
    /// The families whose slice exists (a slice stays, emptied or not, until its family
    /// leaves the stack).
    pub listed: Vec<Family>,
}

/// A mapping's endpoint as the scenario's placement of its Service's pod predicts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEndpoint {
    /// The pod's node.
    pub node: String,
    /// Its address: IPv4 when the Service lists IPv4, else IPv6.
    pub address: IpAddr,
    /// Its IPv6 address beside the IPv4 one, for a dual-stack Service.
    pub address6: Option<IpAddr>,
}

/// One simulated cluster.
pub struct World {
    /// The turmoil simulation.
    pub sim: turmoil::Sim<'static>,
    /// The model (shared with its turmoil host).
    pub api: ApiServer,
    /// Simulated milliseconds since the start (what every clock reads).
    pub now_ms: Arc<AtomicU64>,
    /// Nodes by name.
    pub nodes: BTreeMap<String, NodeSlot>,
    /// What the agents decided, pass by pass.
    pub observations: Arc<Mutex<Observations>>,
    /// Every invariant violation seen so far.
    pub violations: Violations,
    /// The scenario's random choices.
    pub rng: SplitMix64,
    /// The classes created (the per-step checks read their status).
    pub classes: std::collections::BTreeSet<String>,
    /// Input changes the script made.
    pub changes: u64,
    /// The model is paused (every request waits): the checks, which read it, wait too.
    pub(crate) api_paused: bool,
    /// When the last input change was made, while the agents have not converged on it.
    pub(crate) pending_change: Option<Duration>,
    /// When convergence was last checked.
    pub(crate) last_check: Duration,
    /// From each change (or burst of changes) to every agent's convergence on it.
    pub convergence: Vec<Duration>,
    /// Where each Service's pod is, by Service (`World::place_pod`).
    pub pods: BTreeMap<String, Placement>,
    driver_rt: tokio::runtime::Runtime,
    driver: kube::Client,
    config: WorldConfig,
}

fn epoch() -> Timestamp {
    Timestamp::from_second(EPOCH_SECONDS).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn clock(now_ms: &Arc<AtomicU64>, skew_ms: Option<Arc<AtomicI64>>) -> Clock {
    let now_ms = now_ms.clone();
    Clock::from_fn(move || {
        let skew = skew_ms.as_ref().map_or(0, |s| s.load(Ordering::Relaxed));
        let at = now_ms.load(Ordering::Relaxed) as i64 + skew;
        epoch()
            .checked_add(SignedDuration::from_millis(at))
            .unwrap_or(epoch())
    })
}

/// The address `n` after `first` (counting on past the last octet, for clusters of hundreds).
fn nth_after(first: Ipv4Addr, n: usize) -> Ipv4Addr {
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    Ipv4Addr::from(u32::from(first).saturating_add(n))
}

/// The IPv6 address `n` after `first`.
fn nth_after6(first: Ipv6Addr, n: usize) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(first).saturating_add(n as u128))
}

/// The number in a node's name (`n12`: 12; none: 0): the pod CIDRs [`World::create_node`]
/// gives it and the address [`pod_address`] gives its pods.
fn node_number(node: &str) -> usize {
    let digits = node.trim_start_matches(|c: char| !c.is_ascii_digit());
    digits.parse().unwrap_or(0)
}

/// Address `host` of node `node`'s IPv6 pod /64, fd00:10:244:<number>::.
fn pod_net6(node: &str, host: u16) -> Ipv6Addr {
    let net = u16::try_from(node_number(node)).unwrap_or(u16::MAX);
    Ipv6Addr::new(0xfd00, 0x10, 0x244, net, 0, 0, 0, host)
}

/// The pod CIDR of node `node` in `family`: 10.244.<number>.0/24 (counting on into 10.245
/// past 255), fd00:10:244:<number>::/64.
fn pod_cidr(node: &str, family: Family) -> String {
    match family {
        Family::V4 => {
            let number = node_number(node);
            format!(
                "{}/24",
                nth_after(Ipv4Addr::new(10, 244, 0, 0), number * 256)
            )
        }
        Family::V6 => format!("{}/64", pod_net6(node, 0)),
    }
}

/// The address in `family` of a pod on node `node`: .5 (::5) of the node's pod CIDR.
pub fn pod_address(node: &str, family: Family) -> IpAddr {
    match family {
        Family::V4 => {
            let number = node_number(node);
            IpAddr::V4(nth_after(Ipv4Addr::new(10, 244, 0, 5), number * 256))
        }
        Family::V6 => IpAddr::V6(pod_net6(node, 5)),
    }
}

/// The facts a node's in-memory host reports: one public interface (IPv4 203.0.113.<index+1>,
/// and in a dual-stack cluster 2001:db8:203::<index+1>) and a mesh underlay.
pub fn facts_for(index: usize, dual_stack: bool) -> HostFacts {
    let mut facts = HostFacts::default();
    facts.interfaces.insert(
        "eth0".to_owned(),
        nth_after(Ipv4Addr::new(203, 0, 113, 1), index),
    );
    if dual_stack {
        facts.interfaces6.insert(
            "eth0".to_owned(),
            nth_after6(Ipv6Addr::new(0x2001, 0xdb8, 0x203, 0, 0, 0, 0, 1), index),
        );
    }
    facts.underlay_device = Some("wg0".to_owned());
    facts.underlay_mtu = Some(1420);
    facts
}

impl World {
    /// Builds the cluster: the model, one agent per node (not yet stepped), the namespaces the
    /// scenarios use and a Ready Node object per node.
    pub fn new(config: WorldConfig) -> Result<Self, WorldError> {
        let now_ms = Arc::new(AtomicU64::new(0));
        let api = ApiServer::builder()
            .seed(config.seed)
            .history_limit(200)
            .bookmark_interval(Duration::from_secs(5))
            .clock(Arc::new({
                let clock = clock(&now_ms, None);
                move || clock.now()
            }))
            .build()?;
        let sim = turmoil::Builder::new()
            .rng_seed(config.seed)
            .tick_duration(Duration::from_millis(5))
            .simulation_duration(Duration::from_secs(3600 * 48))
            .min_message_latency(Duration::from_micros(200))
            .max_message_latency(Duration::from_millis(3))
            // The model's socket buffers every agent's segments in flight at once (eight watches
            // and the writes of each); turmoil's default of 64 holds a handful of agents only.
            .tcp_capacity(64 * config.nodes.len().max(1))
            .build();
        let driver_rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        let driver = {
            let _guard = driver_rt.enter();
            kube::Client::new(api.router(), "default")
        };
        let mut world = Self {
            sim,
            api,
            now_ms,
            nodes: BTreeMap::new(),
            observations: Arc::default(),
            violations: Violations::default(),
            rng: SplitMix64::new(config.seed ^ 0x5CE7_A210),
            classes: Default::default(),
            changes: 0,
            api_paused: false,
            pending_change: None,
            last_check: Duration::ZERO,
            convergence: Vec::new(),
            pods: BTreeMap::new(),
            driver_rt,
            driver,
            config,
        };
        world.start_api();
        world.create(&json_namespace("games"))?;
        for (i, name) in world.config.nodes.clone().iter().enumerate() {
            world.create_node(name, i, true)?;
            world.add_agent(name, i);
        }
        Ok(world)
    }

    fn start_api(&mut self) {
        let api = self.api.clone();
        self.sim.host(API_HOST, move || {
            let api = api.clone();
            async move {
                let listener = turmoil::net::TcpListener::bind(("0.0.0.0", API_PORT)).await?;
                api.serve(net::SimListener(listener)).await?;
                Ok(())
            }
        });
    }

    fn add_agent(&mut self, name: &str, index: usize) {
        let facts = facts_for(index, self.config.dual_stack);
        let host = MemoryHost::with_facts(facts.clone());
        let slot = NodeSlot {
            host: host.clone(),
            facts,
            requests: Arc::default(),
            skew_ms: Arc::default(),
            running: true,
            partitioned: false,
            removed: false,
            health: Arc::default(),
        };
        let requests = slot.requests.clone();
        let health = slot.health.clone();
        let node_clock = clock(&self.now_ms, Some(slot.skew_ms.clone()));
        let observations = self.observations.clone();
        let plan_fault = self.config.plan_fault.clone();
        let wire_fault = self.config.wire_fault.clone();
        let node = name.to_owned();
        let jitter_seed = self.config.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9);
        self.sim.host(name, move || {
            let mut config = AgentConfig::new(node.clone());
            config.resync = Duration::from_secs(30);
            config.debounce = Duration::from_millis(20);
            config.retry_min = Duration::from_millis(50);
            config.retry_max = Duration::from_secs(2);
            config.api_timeout = Duration::from_secs(2);
            config.clock = node_clock.clone();
            config.jitter_seed = jitter_seed;
            config.plan_on_blocking_thread = false;
            let observe = observations.clone();
            let fault = plan_fault.clone();
            let observer_node = node.clone();
            let hook: PassHook = Arc::new(move |snapshot: &Snapshot, plan| {
                if let Some(fault) = &fault {
                    fault(snapshot, plan);
                }
                lock(&observe).record(&observer_node, snapshot, plan);
            });
            let client = net::client(&node, requests.clone(), wire_fault.clone());
            let agent = Agent::new(client, host.clone(), config).with_pass_hook(hook);
            *lock(&health) = agent.health();
            async move {
                agent.run(CancellationToken::new()).await?;
                Ok(())
            }
        });
        self.nodes.insert(name.to_owned(), slot);
    }

    /// Pauses the model (every request waits, a slow server) or resumes it.
    pub fn pause_api(&mut self, paused: bool) {
        if paused {
            self.api.faults().pause();
        } else {
            self.api.faults().resume();
        }
        self.api_paused = paused;
    }

    /// Counts one input change (for requests per change).
    pub fn changed(&mut self) {
        self.changes += 1;
        self.pending_change = Some(self.elapsed());
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        Duration::from_millis(self.now_ms.load(Ordering::Relaxed))
    }

    // Stepping the simulation (`run_for`) lives in `check`, beside the per-step checks it runs.

    /// The driver's client (in-process, outside the simulated network: it never fails by
    /// partition, only by the faults the model injects).
    fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.driver_rt.block_on(f)
    }

    /// Runs one driver request, retrying what an injected fault failed (a person retries).
    fn retrying<T, F, Fut>(&self, what: &str, mut request: F) -> Result<T, WorldError>
    where
        F: FnMut(kube::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, kube::Error>>,
    {
        let mut last = None;
        for _ in 0..50 {
            match self.block_on(request(self.driver.clone())) {
                Ok(v) => return Ok(v),
                Err(kube::Error::Api(e)) if e.code >= 500 || e.code == 429 || e.code == 409 => {
                    last = Some(e.to_string());
                }
                Err(e) => return Err(format!("{what}: {e}").into()),
            }
        }
        Err(format!("{what}: still failing after 50 tries: {last:?}").into())
    }

    /// Creates any object given as JSON (its apiVersion and kind decide the API).
    pub fn create(&mut self, object: &Value) -> Result<(), WorldError> {
        if object["kind"] == "PortMapClass"
            && let Some(name) = object["metadata"]["name"].as_str()
        {
            self.classes.insert(name.to_owned());
        }
        let (api_version, kind) = type_of(object);
        let ns = object["metadata"]["namespace"].as_str();
        let what = format!("creating {kind} {}", object["metadata"]["name"]);
        let obj: DynamicObject = serde_json::from_value(object.clone())?;
        let ar = resource(api_version, kind)?;
        self.retrying(&what, |c| {
            let api = dynamic(c, &ar, ns);
            let obj = obj.clone();
            async move { api.create(&PostParams::default(), &obj).await }
        })?;
        Ok(())
    }

    /// Changes an object: read, change its JSON, write back (retried on conflict).
    pub fn edit(
        &self,
        (api_version, kind): (&str, &str),
        ns: Option<&str>,
        name: &str,
        change: impl Fn(&mut Value),
    ) -> Result<(), WorldError> {
        let what = format!("editing {kind} {name}");
        let ar = resource(api_version, kind)?;
        self.retrying(&what, |c| {
            let api = dynamic(c, &ar, ns);
            let change = &change;
            async move {
                let obj = api.get(name).await?;
                let mut json = serde_json::to_value(&obj).map_err(kube::Error::SerdeError)?;
                change(&mut json);
                let obj: DynamicObject =
                    serde_json::from_value(json).map_err(kube::Error::SerdeError)?;
                api.replace(name, &PostParams::default(), &obj).await
            }
        })?;
        Ok(())
    }

    /// Deletes an object (gone already is fine).
    pub fn delete(
        &mut self,
        (api_version, kind): (&str, &str),
        ns: Option<&str>,
        name: &str,
    ) -> Result<(), WorldError> {
        if kind == "PortMapClass" {
            self.classes.remove(name);
        }
        let what = format!("deleting {kind} {name}");
        let ar = resource(api_version, kind)?;
        self.retrying(&what, |c| {
            let api = dynamic(c, &ar, ns);
            async move {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
    }

    /// Creates Node `name` with InternalIP 10.0.0.<index+1> (counting on into 10.0.1.0 past
    /// 255), Ready or not, and the pod CIDRs its pods' addresses come from ([`pod_cidr`] by the
    /// number in its name: the IPv4 one, and in a dual-stack cluster the IPv6 one after it).
    pub fn create_node(&mut self, name: &str, index: usize, ready: bool) -> Result<(), WorldError> {
        let cidr = pod_cidr(name, Family::V4);
        let mut cidrs = vec![cidr.clone()];
        if self.config.dual_stack {
            cidrs.push(pod_cidr(name, Family::V6));
        }
        let internal_ip = nth_after(Ipv4Addr::new(10, 0, 0, 1), index);
        self.create(&serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name},
            "spec": {"podCIDR": cidr, "podCIDRs": cidrs},
            "status": {
                "addresses": [{"type": "InternalIP", "address": internal_ip.to_string()}],
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
    }

    /// Sets Node `name`'s Ready condition (the status subresource, as the kubelet does).
    pub fn set_node_ready(&self, name: &str, ready: bool) -> Result<(), WorldError> {
        let what = format!("setting Node {name} Ready={ready}");
        self.retrying(&what, |c| {
            let api: Api<Node> = Api::all(c);
            let patch = serde_json::json!({"status": {"conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
            async move {
                api.patch_status(
                    name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
            }
        })?;
        Ok(())
    }

    /// Lists every object the plan reads: the snapshot every agent converges to.
    pub fn snapshot(&self) -> Result<Snapshot, WorldError> {
        fn list<K>(w: &World) -> Result<Vec<K>, WorldError>
        where
            K: kube::Resource<DynamicType = ()>
                + Clone
                + serde::de::DeserializeOwned
                + std::fmt::Debug,
        {
            let mut items = w.retrying("listing", |c| async move {
                Api::<K>::all(c).list(&ListParams::default()).await
            })?;
            let mut items = std::mem::take(&mut items.items);
            items.sort_by_key(|o| (o.meta().namespace.clone(), o.meta().name.clone()));
            Ok(items)
        }
        let cni = self.retrying("reading cilium-config", |c| async move {
            Api::<ConfigMap>::namespaced(c, "kube-system")
                .get_opt("cilium-config")
                .await
        })?;
        Ok(Snapshot {
            classes: list::<PortMapClass>(self)?,
            portmap_nodes: list::<PortMapNode>(self)?,
            portmaps: list::<PortMap>(self)?,
            endpoint_slices: list::<EndpointSlice>(self)?,
            nodes: list::<Node>(self)?,
            namespaces: list::<Namespace>(self)?,
            services: list::<Service>(self)?,
            services_listed: true,
            // Every Pod of the scenarios' Services (`World::place_pod`), as each agent lists
            // those of its own node.
            pods_listed: true,
            pods: list::<Pod>(self)?,
            cni: cni.as_ref().map(CniFacts::from_cilium_config),
        })
    }

    /// A stored object as JSON.
    pub fn object(&self, api_version: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
        self.api.object(api_version, plural, ns, name)
    }

    /// A node joins: its Node object (Ready) and its agent.
    pub fn add_node(&mut self, name: &str) -> Result<(), WorldError> {
        let index = self.nodes.len();
        self.create_node(name, index, true)?;
        self.add_agent(name, index);
        self.changed();
        Ok(())
    }

    /// A node leaves: its Node object is deleted and its agent stops for good.
    pub fn remove_node(&mut self, name: &str) -> Result<(), WorldError> {
        self.delete(("v1", "Node"), None, name)?;
        self.crash(name);
        if let Some(slot) = self.nodes.get_mut(name) {
            slot.removed = true;
        }
        self.changed();
        Ok(())
    }

    /// A digest of everything the run did that a replay must repeat: every status write of
    /// every node in order, the passes, the model's last resourceVersion.
    pub fn digest(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        for (name, slot) in &self.nodes {
            name.hash(&mut h);
            lock(&slot.requests.status_writes).hash(&mut h);
            slot.requests.all.load(Ordering::Relaxed).hash(&mut h);
        }
        lock(&self.observations).passes.hash(&mut h);
        self.api.resource_version().hash(&mut h);
        h.finish()
    }

    /// Crashes node `name`'s agent (its host state stays).
    pub fn crash(&mut self, name: &str) {
        if let Some(slot) = self.nodes.get_mut(name).filter(|s| s.running) {
            self.sim.crash(name);
            slot.running = false;
        }
    }

    /// Starts node `name`'s agent again after a crash.
    pub fn restart(&mut self, name: &str) {
        if let Some(slot) = self
            .nodes
            .get_mut(name)
            .filter(|s| !s.running && !s.removed)
        {
            self.sim.bounce(name);
            slot.running = true;
        }
    }

    /// Cuts node `name` off from the API server, or reconnects it.
    pub fn partition(&mut self, name: &str, cut: bool) {
        if let Some(slot) = self.nodes.get_mut(name) {
            if cut {
                self.sim.partition(name, API_HOST);
            } else {
                self.sim.repair(name, API_HOST);
            }
            slot.partitioned = cut;
        }
    }

    /// Sets how far node `name`'s clock is ahead of (negative: behind) simulated time.
    pub fn skew(&self, name: &str, by_ms: i64) {
        if let Some(slot) = self.nodes.get(name) {
            slot.skew_ms.store(by_ms, Ordering::Relaxed);
        }
    }

    /// Moves every node's clock forward by `by` (a day passing without simulating it).
    pub fn jump_clocks(&self, by: Duration) {
        for slot in self.nodes.values() {
            slot.skew_ms
                .fetch_add(by.as_millis() as i64, Ordering::Relaxed);
        }
    }

    /// Whether `node` accepts for `class` now: named by it, its Node present and Ready.
    pub fn accepting(&self, class: &str, node: &str) -> bool {
        let named = self
            .object("kuport.wlz.li/v1alpha1", "portmapclasses", "", class)
            .is_some_and(|c| c["spec"]["nodes"].get(node).is_some());
        let ready = self.object("v1", "nodes", "", node).is_some_and(|n| {
            n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        named && ready
    }

    /// The facts node `name`'s agent reads from its host now (link ids and captured ports
    /// follow what was applied), as the plan it converges to sees them.
    pub fn host_facts(&self, name: &str) -> Option<HostFacts> {
        let slot = self.nodes.get(name)?;
        let query = kuport_host::FactsQuery {
            interfaces: slot.facts.interfaces.keys().cloned().collect(),
            internal_ip: None,
            marks: kuport_core::ir::MarkLayout::default(),
            agent_ports: Vec::new(),
        };
        use kuport_host::Host;
        self.block_on(slot.host.facts(&query)).ok()
    }

    /// Node `name`'s clock now (simulated time plus its skew).
    pub fn node_now(&self, name: &str) -> Timestamp {
        let skew = self.nodes.get(name).map(|s| s.skew_ms.clone());
        clock(&self.now_ms, skew).now()
    }

    /// The endpoint of the mappings of a Service whose pod is placed so: the pod on its node at
    /// [`pod_address`] in the first family of its stack, and at its IPv6 address too for a
    /// dual-stack Service; none while the pod is not ready, nowhere, or on a node without a Node
    /// object (nobody advertises its pod CIDR then, so its address is no pod address).
    pub fn expected_endpoint(&self, placement: &Placement) -> Option<PodEndpoint> {
        let node = placement.node.as_deref().filter(|_| placement.ready)?;
        self.object("v1", "nodes", "", node)?;
        let families = placement.stack.families();
        Some(PodEndpoint {
            node: node.to_owned(),
            address: pod_address(node, families[0]),
            address6: (placement.stack == Stack::Dual).then(|| pod_address(node, Family::V6)),
        })
    }

    /// The running agents (not crashed, not cut off) that still owe something: a pass, a status
    /// write in flight or held back, a retry ([`Health::is_settled`]).
    pub fn unsettled(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, s)| s.running && !s.partitioned && !lock(&s.health).is_settled())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Requests every agent made so far.
    pub fn agent_requests(&self) -> u64 {
        self.nodes
            .values()
            .map(|s| s.requests.all.load(Ordering::Relaxed))
            .sum()
    }
}

fn type_of(object: &Value) -> (&str, &str) {
    (
        object["apiVersion"].as_str().unwrap_or("v1"),
        object["kind"].as_str().unwrap_or_default(),
    )
}

fn resource(api_version: &str, kind: &str) -> Result<ApiResource, WorldError> {
    let gvk = GroupVersionKind::try_from(&TypeMeta {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
    })?;
    Ok(ApiResource::from_gvk(&gvk))
}

fn dynamic(client: kube::Client, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client, ns, ar),
        None => Api::all_with(client, ar),
    }
}

fn json_namespace(name: &str) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}
