//! What the agent tests share: a cluster of agents in one process, each with an in-memory host,
//! against the API server model over real TCP or a real kube-apiserver (`kuport-realapi`), and
//! the waits and reads the tests make on it. Every wait is on a condition with a deadline;
//! nothing asserts on timing.
//!
//! On a real server the agents authenticate as a ServiceAccount bound to the agent's shipped
//! ClusterRole. Every request the role refuses fails the test at once, naming the verb and
//! resource (read from the apiserver's audit log).

// Each test file is its own crate and uses only part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, PostParams};
use kuport::agent::{
    Agent, AgentConfig, AgentError, CancellationToken, Clock, Health, HostWatch, Metrics, PassHook,
    RowsIn, StopPolicy,
};
use kuport_core::api::{PortMap, PortMapClass};
use kuport_core::ir::Rule;
use kuport_host::MemoryHost;
use kuport_sim::apiserver::ApiServer;
use kuport_testkit::cluster::agent_host_facts;
use kuport_testkit::objects::{self, endpoint, pm, slice, vxlan_spec};
use kuport_testkit::wait;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

pub const DEADLINE: Duration = Duration::from_secs(30);
/// How often a wait looks again.
pub const POLL: Duration = Duration::from_millis(25);

pub struct RunningAgent {
    pub name: String,
    pub host: MemoryHost,
    pub metrics: Arc<Metrics>,
    pub health: Health,
    pub shutdown: CancellationToken,
    pub task: Option<JoinHandle<Result<(), AgentError>>>,
}

/// Which API server the agents talk to.
pub enum Backend {
    Model(ApiServer),
    Real(kuport_realapi::ControlPlane),
}

/// Which API server a shared test runs against.
pub enum Target {
    Model,
    /// A real control plane; the agents run under this ClusterRole.
    Real(Box<ClusterRole>),
}

/// A pass hook for each agent, by its name.
pub type PassHooks = Arc<dyn Fn(&str) -> PassHook + Send + Sync>;

pub const AGENT_NAMESPACE: &str = "kuport";
pub const AGENT_ACCOUNT: &str = "kuport-agent";

pub struct Cluster {
    pub backend: Backend,
    /// The test's own (admin) client.
    pub client: kube::Client,
    pub url: String,
    /// The agents' client on a real server (the ServiceAccount's token).
    pub agent_client: Option<kube::Client>,
    pub agents: Vec<RunningAgent>,
    pub last_rbac_check: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// How long one API request of the agents started next may take.
    pub api_timeout: Duration,
    /// Gives each agent started next a pass hook, by the agent's name.
    pub pass_hooks: Option<PassHooks>,
    /// The wall clock of the agents started next (the system's when `None`).
    pub clock: Option<Clock>,
    /// Where the agents started next write their rows (`--rows-in`).
    pub rows_in: RowsIn,
}

pub fn client_for(url: &str) -> kube::Client {
    kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client")
}

pub fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("object")
}

/// Waits until `check` holds, failing with `what` after the deadline (tests on the model only,
/// where no role is enforced).
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait::eventually(what, DEADLINE, POLL, check).await;
}

pub fn dnats(host: &MemoryHost) -> Vec<kuport_core::ir::DnatRule> {
    host.applied()
        .nft
        .chains
        .iter()
        .flat_map(|(_, rules)| rules)
        .filter_map(|r| match r {
            Rule::Dnat(d) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

pub fn dnat_targets(host: &MemoryHost) -> Vec<String> {
    dnats(host).into_iter().map(|d| d.to.to_string()).collect()
}

pub async fn programmed_true(c: &Cluster) -> bool {
    c.condition("Programmed")
        .await
        .is_some_and(|(s, _)| s == "True")
}

/// The passes every agent ran so far, however they ended.
pub fn passes(a: &RunningAgent) -> u64 {
    a.metrics.passes_ok() + a.metrics.passes_failed() + a.metrics.passes_superseded()
}

/// Waits until no agent has run a pass for half a second: their writes are done and the
/// watches have brought the statuses back.
pub async fn settle(c: &Cluster) {
    let mut last: Option<(Vec<u64>, tokio::time::Instant)> = None;
    c.eventually("the agents stop passing", || {
        let now: Vec<u64> = c.agents.iter().map(passes).collect();
        let quiet = match &last {
            Some((seen, since)) if *seen == now => since.elapsed() >= Duration::from_millis(500),
            _ => {
                last = Some((now, tokio::time::Instant::now()));
                false
            }
        };
        std::future::ready(quiet)
    })
    .await;
}

impl Cluster {
    pub async fn start() -> Self {
        Self::start_with(Duration::from_secs(3600)).await
    }

    pub async fn start_with(resync: Duration) -> Self {
        let server = ApiServer::builder().build().expect("model builds");
        let mut cluster = Self::on_model(server).await;
        cluster.seed().await;
        for i in 1..=3 {
            cluster.start_agent(i, resync);
        }
        cluster
    }

    /// A cluster on `target` with nothing seeded and no agent; `None` when the real control
    /// plane is not built here (one line printed; a failure under
    /// `KUPORT_REQUIRE_REAL_APISERVER=1`).
    pub async fn empty_on(target: Target, test: &str) -> Option<Self> {
        let role = match target {
            Target::Model => {
                let server = ApiServer::builder().build().expect("model builds");
                return Some(Self::on_model(server).await);
            }
            Target::Real(role) => role,
        };
        let cp = kuport_realapi::ControlPlane::start_or_skip(test, Default::default()).await?;
        cp.install_crds(std::path::Path::new(kuport_realapi::CRD_DIR))
            .await
            .expect("the shipped CRDs install");
        let agent_client = cp
            .service_account_client(AGENT_NAMESPACE, AGENT_ACCOUNT, &role)
            .await
            .expect("the agent's ServiceAccount, role and token");
        Some(Self {
            client: cp.admin_client().await.expect("admin client"),
            url: cp.url().to_owned(),
            agent_client: Some(agent_client),
            backend: Backend::Real(cp),
            agents: Vec::new(),
            last_rbac_check: std::sync::Mutex::new(None),
            api_timeout: Duration::from_secs(2),
            pass_hooks: None,
            clock: None,
            rows_in: RowsIn::Class,
        })
    }

    /// A seeded cluster on `target` with agents n1..n3.
    pub async fn start_on(target: Target, test: &str, resync: Duration) -> Option<Self> {
        let mut cluster = Self::empty_on(target, test).await?;
        cluster.seed().await;
        for i in 1..=3 {
            cluster.start_agent(i, resync);
        }
        Some(cluster)
    }

    pub async fn on_model(server: ApiServer) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(server.clone().serve(listener));
        Self {
            backend: Backend::Model(server),
            client: client_for(&url),
            url,
            agent_client: None,
            agents: Vec::new(),
            last_rbac_check: std::sync::Mutex::new(None),
            api_timeout: Duration::from_secs(2),
            pass_hooks: None,
            clock: None,
            rows_in: RowsIn::Class,
        }
    }

    /// The model; only the fault-hook tests call this, and they run on the model alone.
    pub fn model(&self) -> &ApiServer {
        match &self.backend {
            Backend::Model(server) => server,
            Backend::Real(_) => panic!("a model-only test ran against the real server"),
        }
    }

    /// The requests the agents' role refused so far (real server only), each naming the verb,
    /// the resource and the apiserver's message.
    pub fn rbac_refusals(&self) -> Vec<String> {
        match &self.backend {
            Backend::Model(_) => Vec::new(),
            Backend::Real(cp) => cp
                .forbidden_requests(&format!(
                    "system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_ACCOUNT}"
                ))
                .expect("the audit log reads"),
        }
    }

    /// On a real server, prints the distinct requests the agents made, so the role's unused
    /// grants show (an extra verb cannot fail a request, so it is reported, not asserted).
    pub fn report_agent_requests(&self) {
        if let Backend::Real(cp) = &self.backend {
            let used = cp
                .allowed_requests(&format!(
                    "system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_ACCOUNT}"
                ))
                .expect("the audit log reads");
            eprintln!("requests the agents made: {}", used.join("; "));
        }
    }

    /// Fails the test when the agents' role refused any request.
    pub fn assert_rbac_allowed_everything(&self) {
        let refused = self.rbac_refusals();
        assert!(
            refused.is_empty(),
            "the agent's ClusterRole refused {} request(s):\n{}",
            refused.len(),
            refused.join("\n")
        );
    }

    /// Waits until `check` holds, failing with `what` after the deadline, and at once when the
    /// agents' role refused a request.
    pub async fn eventually<F, Fut>(&self, what: &str, check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let rbac = || {
            let now = tokio::time::Instant::now();
            let mut last = self.last_rbac_check.lock().expect("lock");
            if last.is_none_or(|t| now.duration_since(t) > Duration::from_millis(250)) {
                *last = Some(now);
                self.assert_rbac_allowed_everything();
            }
        };
        wait::eventually_checking(what, DEADLINE, POLL, check, rbac).await;
    }

    pub fn start_agent(&mut self, i: usize, resync: Duration) {
        self.start_agent_with(i, resync, None);
    }

    pub fn start_agent_with(&mut self, i: usize, resync: Duration, links: Option<HostWatch>) {
        let host = MemoryHost::with_facts(agent_host_facts(i));
        self.start_agent_on(i, host, resync, links, StopPolicy::Keep);
    }

    /// Starts agent `n<i>` on `host` (a new agent on an old host models a restarted pod).
    pub fn start_agent_on(
        &mut self,
        i: usize,
        host: MemoryHost,
        resync: Duration,
        links: Option<HostWatch>,
        stop_policy: StopPolicy,
    ) {
        let name = format!("n{i}");
        let mut config = AgentConfig::new(name.clone());
        config.stop_policy = stop_policy;
        config.resync = resync;
        config.debounce = Duration::from_millis(20);
        config.retry_min = Duration::from_millis(50);
        config.retry_max = Duration::from_millis(500);
        config.api_timeout = self.api_timeout;
        config.rows_in = self.rows_in;
        if let Some(clock) = &self.clock {
            config.clock = clock.clone();
        }
        let client = match &self.agent_client {
            Some(client) => client.clone(),
            None => client_for(&self.url),
        };
        let mut agent = Agent::new(client, host.clone(), config);
        if let Some(links) = links {
            agent = agent.with_host_watch(links);
        }
        if let Some(hooks) = &self.pass_hooks {
            agent = agent.with_pass_hook(hooks(&name));
        }
        let shutdown = CancellationToken::new();
        let (metrics, health) = (agent.metrics(), agent.health());
        let task = tokio::spawn(agent.run(shutdown.clone()));
        self.agents.push(RunningAgent {
            name,
            host,
            metrics,
            health,
            shutdown,
            task: Some(task),
        });
    }

    /// Agents n1..n3 with an hour's resync (every pass then comes from an event), returning once
    /// the seeded mapping is Programmed=True.
    pub async fn start_agents_until_programmed(&mut self) {
        for i in 1..=3 {
            self.start_agent(i, Duration::from_secs(3600));
        }
        self.eventually("Programmed=True", || programmed_true(self))
            .await;
    }

    pub async fn seed(&self) {
        let pp = PostParams::default();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .create(&pp, &from(json!({"metadata": {"name": "games"}})))
            .await
            .expect("namespace");
        let nodes: Api<Node> = Api::all(self.client.clone());
        for i in 1..=3 {
            let node = objects::node(&format!("n{i}"), Some(&format!("10.0.0.{i}")), true);
            nodes.create(&pp, &from(node)).await.expect("node");
        }
        let classes: Api<PortMapClass> = Api::all(self.client.clone());
        let class = objects::class("public", vxlan_spec(&[("n1", &["eth0"])])).object();
        classes.create(&pp, &from(class)).await.expect("class");
        self.set_endpoint(Some(2), true).await;
        self.create_portmap("game", 3000).await;
    }

    /// A UDP PortMap `games/<name>` of class `public` on `port`, aimed at the `gameserver` pod.
    pub async fn create_portmap(&self, name: &str, port: u16) {
        let portmaps: Api<PortMap> = Api::namespaced(self.client.clone(), "games");
        let portmap = pm("games", name, "public", port.into()).service("gameserver", "game");
        portmaps
            .create(&PostParams::default(), &from(portmap.object()))
            .await
            .expect("portmap");
    }

    /// Puts the `gameserver` pod on node `n<node>` (creating or replacing the slice): its Pod
    /// object first, as the agents deliver only to their own node's Pods.
    pub async fn set_endpoint(&self, node: Option<usize>, create: bool) {
        if let Some(n) = node {
            let (name, ip) = (format!("n{n}"), format!("10.244.{n}.5"));
            put_pod(&self.client, "games", "gameserver-0", &name, &ip).await;
        }
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), "games");
        let mut gameserver =
            slice("games", "gameserver-abc", "gameserver").port("game", "UDP", 3000);
        if let Some(n) = node {
            let pod = endpoint(&format!("10.244.{n}.5"), &format!("n{n}"))
                .ready(true)
                .pod("games", "gameserver-0");
            gameserver = gameserver.endpoint(pod);
        }
        let mut slice = gameserver.object();
        if create {
            slices
                .create(&PostParams::default(), &from(slice))
                .await
                .expect("slice");
        } else {
            let current = slices.get("gameserver-abc").await.expect("slice");
            slice["metadata"]["resourceVersion"] = json!(current.metadata.resource_version);
            slices
                .replace("gameserver-abc", &PostParams::default(), &from(slice))
                .await
                .expect("slice replaced");
        }
    }

    pub fn agent(&self, name: &str) -> &RunningAgent {
        self.agents
            .iter()
            .find(|a| a.name == name)
            .expect("agent exists")
    }

    pub async fn portmap(&self) -> PortMap {
        Api::<PortMap>::namespaced(self.client.clone(), "games")
            .get("game")
            .await
            .expect("portmap")
    }

    /// The class `public` with the rows that count in its status (each node's own from its
    /// `PortMapNode`, as every reader takes them).
    pub async fn class(&self) -> PortMapClass {
        let mut class = Api::<PortMapClass>::all(self.client.clone())
            .get("public")
            .await
            .expect("class");
        let objects = Api::<kuport_core::api::PortMapNode>::all(self.client.clone())
            .list(&Default::default())
            .await
            .expect("PortMapNodes");
        kuport_core::plan::node_rows::with_node_rows(
            std::slice::from_mut(&mut class),
            &objects.items,
        );
        class
    }

    pub async fn condition(&self, type_: &str) -> Option<(String, String)> {
        self.portmap()
            .await
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_))
            .map(|c| (c.status, c.reason))
    }

    /// Stops one agent and forgets it; returns its host.
    pub async fn stop(&mut self, name: &str) -> MemoryHost {
        let at = self
            .agents
            .iter()
            .position(|a| a.name == name)
            .expect("agent exists");
        let mut a = self.agents.remove(at);
        a.shutdown.cancel();
        if let Some(task) = a.task.take() {
            task.await
                .expect("agent task")
                .expect("agent stops cleanly");
        }
        a.host
    }

    pub async fn stop_all(&mut self) {
        for a in &mut self.agents {
            a.shutdown.cancel();
            if let Some(task) = a.task.take() {
                task.await
                    .expect("agent task")
                    .expect("agent stops cleanly");
            }
        }
        self.assert_rbac_allowed_everything();
        self.report_agent_requests();
    }
}

/// A Namespace created: a change every agent's pass reads, which changes no status by itself.
pub async fn poke_every_agent(c: &Cluster, name: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": name}})),
        )
        .await
        .expect("namespace");
}

/// The underlay MTU in `node`'s row of class `public`.
pub async fn row_mtu(c: &Cluster, node: &str) -> Option<i32> {
    let class = c.class().await;
    let row = class.status?.nodes.into_iter().find(|r| r.name == node)?;
    row.underlay_mtu
}

/// Declares `model` and `real` tests in a module named after each shared test function; the
/// real one runs the agents under the shipped ClusterRole.
#[allow(unused_macros)] // as `dead_code` above: not every test file shares a scenario
macro_rules! on_both_servers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn model() {
                super::$name(crate::common::Target::Model).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn real() {
                let role = kuport_realapi::agent_role().expect("the agent's ClusterRole");
                super::$name(crate::common::Target::Real(Box::new(role))).await;
            }
        }
    )*};
}

#[allow(unused_imports)] // as the macro
pub(crate) use on_both_servers;

/// Pod `namespace/name` bound to `node` and running at `ip`, as the scheduler and the kubelet
/// would have it (the agents deliver only to addresses of their own node's Pods); one bound
/// elsewhere is replaced, since a Pod's node cannot change.
pub async fn put_pod(client: &kube::Client, namespace: &str, name: &str, node: &str, ip: &str) {
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    use kube::api::{DeleteParams, Patch, PatchParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    if let Some(pod) = pods.get_opt(name).await.expect("reading the Pod") {
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let has = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        if bound == Some(node) && has == Some(ip) {
            return;
        }
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .expect("deleting the Pod to move it");
        wait::eventually(
            "the moved Pod's old object to go",
            DEADLINE,
            POLL,
            || async { pods.get_opt(name).await.ok().flatten().is_none() },
        )
        .await;
    }
    // The real API server's ServiceAccount admission wants the namespace's `default` account,
    // which no controller makes here; the model has no ServiceAccounts (404).
    let account = json!({"metadata": {"name": "default", "namespace": namespace}});
    match Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &from(account))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => panic!("creating ServiceAccount {namespace}/default: {e}"),
    }
    let pod = objects::bound_pod(name, name, node, json!({"name": "c", "image": "game"}));
    pods.create(&PostParams::default(), &from(pod))
        .await
        .expect("creating the Pod");
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("writing the Pod's status");
}
