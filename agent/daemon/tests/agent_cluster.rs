//! Three agents in one process, each with an in-memory host, against the API server model over
//! real TCP. Every wait is on a condition with a deadline; nothing asserts on timing.
//!
//! The tests that need no fault hook also run against a real kube-apiserver (`kuport-realapi`),
//! with the agents authenticated as a ServiceAccount bound to the agent's shipped ClusterRole.
//! Every request the role refuses fails the test at once, naming the verb and resource
//! (read from the apiserver's audit log); a control test removes one verb and sees exactly that.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ListParams, PostParams};
use kuport::agent::{
    Agent, AgentConfig, AgentError, CancellationToken, Health, LinkWatch, Metrics, StopPolicy,
    WriteKind, WriteResult, health_router, metrics_router,
};
use kuport_core::api::{PortMap, PortMapClass};
use kuport_core::ir::Rule;
use kuport_core::snapshot::HostFacts;
use kuport_host::{LinkEvent, MappingCounter, MemoryHost};
use kuport_sim::apiserver::{ApiServer, Failure, RequestFilter};
use kuport_testkit::objects::{
    self, DAEMONSET_NAMESPACE, agent_daemonset, agent_pod, endpoint, pm, slice, vxlan_spec,
};
use kuport_testkit::wait;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const DEADLINE: Duration = Duration::from_secs(30);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(25);

struct RunningAgent {
    name: String,
    host: MemoryHost,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), AgentError>>>,
}

/// Which API server the agents talk to.
enum Backend {
    Model(ApiServer),
    Real(kuport_realapi::ControlPlane),
}

/// Which API server a shared test runs against.
enum Target {
    Model,
    /// A real control plane; the agents run under this ClusterRole.
    Real(Box<ClusterRole>),
}

const AGENT_NAMESPACE: &str = "kuport";
const AGENT_ACCOUNT: &str = "kuport-agent";

struct Cluster {
    backend: Backend,
    /// The test's own (admin) client.
    client: kube::Client,
    url: String,
    /// The agents' client on a real server (the ServiceAccount's token).
    agent_client: Option<kube::Client>,
    agents: Vec<RunningAgent>,
    last_rbac_check: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// How long one API request of the agents started next may take.
    api_timeout: Duration,
}

fn client_for(url: &str) -> kube::Client {
    kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client")
}

fn facts(node: usize) -> HostFacts {
    HostFacts {
        interfaces: [(
            "eth0".to_owned(),
            format!("203.0.113.{node}").parse().expect("ip"),
        )]
        .into_iter()
        .collect(),
        underlay_device: Some("wg0".to_owned()),
        underlay_mtu: Some(1420),
        ..HostFacts::default()
    }
}

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("object")
}

impl Cluster {
    async fn start() -> Self {
        Self::start_with(Duration::from_secs(3600)).await
    }

    async fn start_with(resync: Duration) -> Self {
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
    async fn empty_on(target: Target, test: &str) -> Option<Self> {
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
        })
    }

    /// A seeded cluster on `target` with agents n1..n3.
    async fn start_on(target: Target, test: &str, resync: Duration) -> Option<Self> {
        let mut cluster = Self::empty_on(target, test).await?;
        cluster.seed().await;
        for i in 1..=3 {
            cluster.start_agent(i, resync);
        }
        Some(cluster)
    }

    async fn on_model(server: ApiServer) -> Self {
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
        }
    }

    /// The model; only the fault-hook tests call this, and they run on the model alone.
    fn model(&self) -> &ApiServer {
        match &self.backend {
            Backend::Model(server) => server,
            Backend::Real(_) => panic!("a model-only test ran against the real server"),
        }
    }

    /// The requests the agents' role refused so far (real server only), each naming the verb,
    /// the resource and the apiserver's message.
    fn rbac_refusals(&self) -> Vec<String> {
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
    fn report_agent_requests(&self) {
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
    fn assert_rbac_allowed_everything(&self) {
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
    async fn eventually<F, Fut>(&self, what: &str, check: F)
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

    fn start_agent(&mut self, i: usize, resync: Duration) {
        self.start_agent_with(i, resync, None);
    }

    fn start_agent_with(&mut self, i: usize, resync: Duration, links: Option<LinkWatch>) {
        let host = MemoryHost::with_facts(facts(i));
        self.start_agent_on(i, host, resync, links, StopPolicy::Keep);
    }

    /// Starts agent `n<i>` on `host` (a new agent on an old host models a restarted pod).
    fn start_agent_on(
        &mut self,
        i: usize,
        host: MemoryHost,
        resync: Duration,
        links: Option<LinkWatch>,
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
        let client = match &self.agent_client {
            Some(client) => client.clone(),
            None => client_for(&self.url),
        };
        let mut agent = Agent::new(client, host.clone(), config);
        if let Some(links) = links {
            agent = agent.with_link_watch(links);
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
    async fn start_agents_until_programmed(&mut self) {
        for i in 1..=3 {
            self.start_agent(i, Duration::from_secs(3600));
        }
        self.eventually("Programmed=True", || programmed_true(self))
            .await;
    }

    async fn seed(&self) {
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
    async fn create_portmap(&self, name: &str, port: u16) {
        let portmaps: Api<PortMap> = Api::namespaced(self.client.clone(), "games");
        let portmap = pm("games", name, "public", port.into()).service("gameserver", "game");
        portmaps
            .create(&PostParams::default(), &from(portmap.object()))
            .await
            .expect("portmap");
    }

    /// Puts the `gameserver` pod on node `n<node>` (creating or replacing the slice).
    async fn set_endpoint(&self, node: Option<usize>, create: bool) {
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

    fn agent(&self, name: &str) -> &RunningAgent {
        self.agents
            .iter()
            .find(|a| a.name == name)
            .expect("agent exists")
    }

    async fn portmap(&self) -> PortMap {
        Api::<PortMap>::namespaced(self.client.clone(), "games")
            .get("game")
            .await
            .expect("portmap")
    }

    async fn class(&self) -> PortMapClass {
        Api::<PortMapClass>::all(self.client.clone())
            .get("public")
            .await
            .expect("class")
    }

    async fn condition(&self, type_: &str) -> Option<(String, String)> {
        self.portmap()
            .await
            .status
            .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_))
            .map(|c| (c.status, c.reason))
    }

    /// Stops one agent and forgets it; returns its host.
    async fn stop(&mut self, name: &str) -> MemoryHost {
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

    async fn stop_all(&mut self) {
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

/// Waits until `check` holds, failing with `what` after the deadline (tests on the model only,
/// where no role is enforced).
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait::eventually(what, DEADLINE, POLL, check).await;
}

fn dnats(host: &MemoryHost) -> Vec<kuport_core::ir::DnatRule> {
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

fn dnat_targets(host: &MemoryHost) -> Vec<String> {
    dnats(host).into_iter().map(|d| d.to.to_string()).collect()
}

async fn programmed_true(c: &Cluster) -> bool {
    c.condition("Programmed")
        .await
        .is_some_and(|(s, _)| s == "True")
}

async fn remote_pod_gets_a_link_and_is_programmed_by_the_right_node(target: Target) {
    let Some(mut c) = Cluster::start_on(
        target,
        "remote_pod_gets_a_link_and_is_programmed_by_the_right_node",
        Duration::from_secs(3600),
    )
    .await
    else {
        return;
    };
    c.eventually("Accepted=True", || async {
        c.condition("Accepted")
            .await
            .is_some_and(|(s, _)| s == "True")
    })
    .await;
    c.eventually("the pod node's link claim lands", || async {
        c.class()
            .await
            .status
            .is_some_and(|s| s.links.iter().any(|l| l.key == "n1/n2"))
    })
    .await;
    // The serving node DNATs toward the pod node's end of the link; the pod node DNATs on
    // to the pod.
    c.eventually(
        "the serving node programs the DNAT over the link",
        || async {
            let n1 = c.agent("n1").host.applied();
            n1.links.len() == 1
                && dnat_targets(&c.agent("n1").host) == [n1.links[0].peer_address.to_string()]
        },
    )
    .await;
    c.eventually("the pod node delivers to the pod", || async {
        dnat_targets(&c.agent("n2").host).contains(&"10.244.2.5".to_owned())
    })
    .await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    // The link exists at both ends, and the bystander programs nothing.
    assert_eq!(c.agent("n2").host.applied().links.len(), 1);
    assert_eq!(c.agent("n3").host.applied(), Default::default());
    // The serving node is the only PortMap status writer; n3 writes nothing at all.
    for (node, writes) in [("n2", 0), ("n3", 0)] {
        assert_eq!(
            c.agent(node)
                .metrics
                .status_writes_of(WriteKind::PortMap, WriteResult::Written),
            writes,
            "{node} must not write the PortMap status"
        );
    }
    assert!(
        c.agent("n1")
            .metrics
            .status_writes_of(WriteKind::PortMap, WriteResult::Written)
            > 0
    );
    assert_eq!(c.agent("n3").metrics.status_writes_written(), 0);
    // Only n1 has a row: n2 proposed a claim but is not an accepting node.
    let rows: Vec<String> = c
        .class()
        .await
        .status
        .map(|s| s.nodes.into_iter().map(|n| n.name).collect())
        .unwrap_or_default();
    assert_eq!(rows, ["n1"]);

    // The pod moves to the serving node itself: the link goes, the DNAT follows.
    c.set_endpoint(Some(1), false).await;
    c.eventually("the DNAT follows the pod", || async {
        dnat_targets(&c.agent("n1").host) == ["10.244.1.5"]
    })
    .await;
    c.eventually("the old link is gone on both ends", || async {
        c.agent("n1").host.applied().links.is_empty()
            && c.agent("n2").host.applied().links.is_empty()
    })
    .await;
    c.eventually("the status names the new endpoint", || async {
        c.portmap()
            .await
            .status
            .and_then(|s| s.endpoint)
            .is_some_and(|e| e.node == "n1")
    })
    .await;
    c.eventually("the unused claim is marked for collection", || async {
        c.class().await.status.is_some_and(|s| {
            s.links
                .iter()
                .any(|l| l.key == "n1/n2" && l.unused_since.is_some())
        })
    })
    .await;
    c.stop_all().await;
}

async fn status_writer_changes_hands_when_no_node_serves(target: Target) {
    let Some(mut c) = Cluster::start_on(
        target,
        "status_writer_changes_hands_when_no_node_serves",
        Duration::from_secs(3600),
    )
    .await
    else {
        return;
    };
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    // Take n1 out of the class: nobody accepts, so the writer is the pod's node (n2).
    let before = c
        .agent("n2")
        .metrics
        .status_writes_of(WriteKind::PortMap, WriteResult::Written);
    let classes: Api<PortMapClass> = Api::all(c.client.clone());
    let mut class = c.class().await;
    class.spec.nodes = [(
        "n3".to_owned(),
        kuport_core::api::ClassNode {
            interfaces: vec!["missing0".to_owned()],
        },
    )]
    .into_iter()
    .collect();
    classes
        .replace("public", &PostParams::default(), &class)
        .await
        .expect("class replaced");
    c.eventually("the old serving node's rules go", || async {
        dnat_targets(&c.agent("n1").host).is_empty()
    })
    .await;
    c.eventually("a new writer reports Programmed=False", || async {
        c.condition("Programmed")
            .await
            .is_some_and(|(s, _)| s == "False")
    })
    .await;
    // The writer counts a write only after the API server answered it, so the condition can be
    // read before the count moves: wait for the count too.
    let written = |node: &str| {
        c.agent(node)
            .metrics
            .status_writes_of(WriteKind::PortMap, WriteResult::Written)
    };
    c.eventually("another node took over the PortMap status", || async {
        written("n2") + written("n3") > before
    })
    .await;
    // n1 no longer accepts: its row is removed, and n3's (not ready) row appears.
    c.eventually("rows follow the class's nodes", || async {
        c.class().await.status.is_some_and(|s| {
            s.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>() == ["n3"]
                && !s.nodes[0].ready
        })
    })
    .await;
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pod_nodes_claim_links_concurrently_and_get_distinct_slots() {
    let mut c = Cluster::start().await;
    c.eventually("first link lands", || async {
        c.class()
            .await
            .status
            .is_some_and(|s| s.links.iter().any(|l| l.key == "n1/n2"))
    })
    .await;
    // A second mapping whose pod is on n3, plus a conflict storm on class status writes.
    c.model().faults().fail_next(
        6,
        Failure::Conflict,
        RequestFilter::writes().resource("portmapclasses").status(),
    );
    let pp = PostParams::default();
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "games");
    slices
        .create(
            &pp,
            &from(
                slice("games", "voice-abc", "voice")
                    .port("voice", "UDP", 4000)
                    .endpoint(endpoint("10.244.3.7", "n3").ready(true))
                    .object(),
            ),
        )
        .await
        .expect("slice");
    Api::<PortMap>::namespaced(c.client.clone(), "games")
        .create(
            &pp,
            &from(
                pm("games", "voice", "public", 4000)
                    .service("voice", "voice")
                    .object(),
            ),
        )
        .await
        .expect("portmap");
    c.eventually("both claims land on distinct slots", || async {
        c.class().await.status.is_some_and(|s| {
            let slots: Vec<i32> = s.links.iter().map(|l| l.slot).collect();
            s.links.len() == 2 && slots[0] != slots[1]
        })
    })
    .await;
    c.eventually("the serving node holds both links", || async {
        c.agent("n1").host.applied().links.len() == 2
    })
    .await;
    assert!(c.model().faults().injected() >= 1, "the storm was injected");
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_storms_on_portmap_status_converge() {
    let mut c = Cluster::start().await;
    c.model().faults().fail_next(
        20,
        Failure::Conflict,
        RequestFilter::writes().resource("portmaps").status(),
    );
    c.eventually("Programmed=True despite 409s", || programmed_true(&c))
        .await;
    assert!(
        c.agent("n1")
            .metrics
            .status_writes_of(WriteKind::PortMap, WriteResult::Conflict)
            > 0,
        "the writer saw the conflicts"
    );
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_keeps_the_datapath_and_converges_after() {
    let mut c = Cluster::start_with(Duration::from_millis(300)).await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    c.eventually("the pod node delivers to the pod", || async {
        dnat_targets(&c.agent("n2").host).contains(&"10.244.2.5".to_owned())
    })
    .await;
    let failed_before = c.agent("n1").metrics.passes_failed();
    let (n1_nft, n2_state) = (
        c.agent("n1").host.applied().nft,
        c.agent("n2").host.applied(),
    );
    c.model().faults().pause();
    // A host change during the outage: the next resync pass wants to write n1's row and cannot.
    c.agent("n1").host.lock().facts.underlay_mtu = Some(1400);
    c.eventually("a pass fails on the unreachable API server", || async {
        c.agent("n1").metrics.passes_failed() > failed_before
    })
    .await;
    for a in &c.agents {
        assert_eq!(a.host.lock().teardowns, 0, "{}: nothing torn down", a.name);
    }
    // n1 re-applied its link with the new MTU; its rules, and all of n2, are untouched.
    assert_eq!(
        c.agent("n1").host.applied().nft,
        n1_nft,
        "the mapping keeps being served during the outage"
    );
    assert_eq!(
        c.agent("n2").host.applied(),
        n2_state,
        "the pod node keeps its half"
    );
    c.model().faults().resume();
    c.eventually("the row reports the new MTU after the outage", || async {
        c.class().await.status.is_some_and(|s| {
            s.nodes
                .iter()
                .any(|n| n.name == "n1" && n.underlay_mtu == Some(1400))
        })
    })
    .await;
    assert_eq!(c.agent("n1").host.lock().teardowns, 0);
    c.stop_all().await;
}

async fn a_plain_stop_keeps_the_datapath_and_a_resync_after_convergence_writes_nothing(
    target: Target,
) {
    let Some(mut c) = Cluster::start_on(
        target,
        "a_plain_stop_keeps_the_datapath_and_a_resync_after_convergence_writes_nothing",
        Duration::from_millis(300),
    )
    .await
    else {
        return;
    };
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    // Converged: wait until a full set of resync passes has run with no write at all.
    let writes = |c: &Cluster| -> u64 {
        c.agents
            .iter()
            .map(|a| a.metrics.status_writes_written())
            .sum()
    };
    let mut stable = (writes(&c), c.agent("n1").metrics.passes_ok());
    c.eventually("two resync passes in a row write nothing", || {
        let now = (writes(&c), c.agent("n1").metrics.passes_ok());
        let done = now.0 == stable.0 && now.1 >= stable.1 + 2;
        if now.0 != stable.0 {
            stable = now;
        }
        async move { done }
    })
    .await;

    let n1 = c.agent("n1").host.clone();
    let programmed = n1.applied();
    assert!(!programmed.nft.is_empty(), "programmed before shutdown");
    c.stop_all().await;
    assert_eq!(n1.lock().teardowns, 0, "a plain stop keeps the datapath");
    assert_eq!(n1.applied(), programmed, "for the next agent to adopt");
    for a in &c.agents {
        assert!(!a.health.is_alive(), "{} stopped", a.name);
    }
}

/// The DaemonSet `kuport-system/kuport-agent` and one Pod of it per node, as the cluster's
/// controllers would have made them; returns the DaemonSet's uid.
async fn install_daemonset(c: &Cluster) -> String {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Pod;
    let pp = PostParams::default();
    Api::<Namespace>::all(c.client.clone())
        .create(
            &pp,
            &from(objects::namespace(DAEMONSET_NAMESPACE, Value::Null)),
        )
        .await
        .expect("namespace");
    let ds: DaemonSet = Api::namespaced(c.client.clone(), DAEMONSET_NAMESPACE)
        .create(&pp, &from(agent_daemonset()))
        .await
        .expect("daemonset");
    let uid = ds.metadata.uid.expect("the model assigns a uid");
    for i in 1..=3 {
        Api::<Pod>::namespaced(c.client.clone(), DAEMONSET_NAMESPACE)
            .create(&pp, &from(agent_pod(&format!("n{i}"), &uid)))
            .await
            .expect("pod");
    }
    uid
}

fn owner_policy(i: usize) -> StopPolicy {
    StopPolicy::Owner {
        pod: format!("kuport-agent-n{i}"),
        namespace: "kuport-system".into(),
    }
}

/// Restarting agents (a rollout) keeps every node's datapath and the new agent adopts it;
/// deleting the DaemonSet (an uninstall) makes the stopping agent remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_tears_down_only_when_its_daemonset_is_gone() {
    let mut c = Cluster::start().await;
    install_daemonset(&c).await;
    // Replace the three agents with ones that know their Pod, on the same hosts.
    let resync = Duration::from_secs(3600);
    for i in 1..=3 {
        let host = c.stop(&format!("n{i}")).await;
        c.start_agent_on(i, host, resync, None, owner_policy(i));
    }
    eventually("Programmed=True", || programmed_true(&c)).await;
    let n1 = c.agent("n1").host.clone();
    eventually("n1 programs the mapping", || async {
        !dnat_targets(&n1).is_empty()
    })
    .await;

    // A rollout: n1's agent stops while its DaemonSet stands, and a new one takes over.
    let programmed = n1.applied();
    let host = c.stop("n1").await;
    assert_eq!(host.lock().teardowns, 0, "an update keeps the datapath");
    assert_eq!(host.applied(), programmed);
    c.start_agent_on(1, host, resync, None, owner_policy(1));
    eventually("the new n1 agent is ready", || async {
        c.agent("n1").health.is_ready()
    })
    .await;
    assert_eq!(n1.lock().teardowns, 0);
    assert_eq!(
        n1.applied(),
        programmed,
        "the new agent adopted the same datapath"
    );

    // An uninstall: the DaemonSet is deleted, then its pods stop.
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(c.client.clone(), "kuport-system")
        .delete("kuport-agent", &Default::default())
        .await
        .expect("delete daemonset");
    for name in ["n1", "n2", "n3"] {
        let host = c.stop(name).await;
        assert_eq!(host.lock().teardowns, 1, "{name} removes the datapath");
        assert_eq!(host.applied(), Default::default(), "{name} is clean");
    }
}

/// An agent that cannot reach the API server at stop keeps the datapath, even when it knows its
/// Pod: an outage is never a reason to remove anything. (A removal its watches saw before the
/// outage is: `lifecycle.rs` tests that.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_at_stop_keeps_the_datapath() {
    let mut c = Cluster::start().await;
    install_daemonset(&c).await;
    let host = c.stop("n1").await;
    c.start_agent_on(1, host, Duration::from_secs(3600), None, owner_policy(1));
    eventually("n1 programs the mapping", || async {
        !dnat_targets(&c.agent("n1").host).is_empty()
    })
    .await;
    c.model().faults().pause();
    let host = c.stop("n1").await;
    c.model().faults().resume();
    assert_eq!(host.lock().teardowns, 0, "no answer, no teardown");
    assert!(!dnat_targets(&host).is_empty());
    c.stop_all().await;
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_readiness_metrics_and_events() {
    let mut c = Cluster::on_model(ApiServer::builder().build().expect("model")).await;
    // Hold the API server so the first pass cannot happen before readiness is checked.
    c.model().faults().pause();
    c.start_agent(1, Duration::from_secs(3600));
    let n1 = c.agent("n1");
    n1.host.lock().counters = vec![MappingCounter {
        namespace: "games".into(),
        name: "game".into(),
        chain: kuport_core::ir::ChainId::Pre,
        packets: 42,
        bytes: 4200,
    }];
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = http.local_addr().expect("addr");
    let router = health_router(n1.health.clone()).merge(metrics_router(n1.metrics.clone()));
    tokio::spawn(async move { axum::serve(http, router).await });

    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(http_get(addr, "/readyz").await.0, 503, "no pass yet");
    c.model().faults().resume();
    c.seed().await;
    c.start_agent(2, Duration::from_secs(3600));
    c.start_agent(3, Duration::from_secs(3600));
    c.eventually("ready after the first pass", || async {
        http_get(addr, "/readyz").await.0 == 200
    })
    .await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;

    let (code, text) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    for series in [
        "kuport_pass_duration_seconds_bucket",
        "kuport_passes_total{result=\"ok\"}",
        "kuport_pass_failures_total{stage=\"status\"}",
        "kuport_mappings{condition=\"Programmed\",reason=\"AllNodesReady\"} 1",
        "kuport_links_programmed 1",
        "kuport_status_writes_total{kind=\"portmap\",result=\"written\"}",
        "kuport_status_conflict_retries_total{kind=\"portmapclass\"}",
        "kuport_last_successful_pass_timestamp_seconds",
        "kuport_mapping_packets_total{namespace=\"games\",name=\"game\",chain=\"pre\"} 42",
        "kuport_mapping_bytes_total{namespace=\"games\",name=\"game\",chain=\"pre\"} 4200",
    ] {
        assert!(text.contains(series), "/metrics lacks {series}:\n{text}");
    }

    // The Accepted and Programmed flips were announced on the PortMap.
    let events: Api<Event> = Api::namespaced(c.client.clone(), "games");
    c.eventually("events on the PortMap's flips", || async {
        let list = events.list(&ListParams::default()).await.expect("events");
        let reasons: Vec<String> = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("game"))
            .filter_map(|e| e.reason.clone())
            .collect();
        reasons.contains(&"Valid".to_owned()) && reasons.contains(&"AllNodesReady".to_owned())
    })
    .await;

    // The summaries the printer columns show, written with the fields they summarise.
    eventually(
        "the class's summary and the row's version and pass time",
        || async {
            c.class().await.status.is_some_and(|s| {
                s.ready_nodes == ["n1"]
                    && s.nodes_summary.as_deref() == Some("1/1 n1")
                    && s.nodes.iter().all(|n| {
                        n.agent_version.as_deref() == Some(env!("CARGO_PKG_VERSION"))
                            && n.last_pass_time.is_some()
                    })
            })
        },
    )
    .await;
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let status = portmaps
        .get("game")
        .await
        .expect("get the PortMap")
        .status
        .expect("status");
    let addresses: Vec<&str> = status
        .published
        .iter()
        .map(|p| p.address.as_str())
        .collect();
    assert!(!addresses.is_empty(), "{status:?}");
    assert_eq!(status.published_summary, Some(addresses.join(",")));
    assert_eq!(
        status.endpoint.and_then(|e| e.pod).as_deref(),
        Some("gameserver-0")
    );
    c.stop_all().await;
}

async fn a_link_event_rebuilds_the_datapath_at_once(target: Target) {
    let Some(mut c) = Cluster::empty_on(target, "a_link_event_rebuilds_the_datapath_at_once").await
    else {
        return;
    };
    c.seed().await;
    // The pod node's link events come from the test; the agent asks for the underlay device.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut rx = Some(rx);
    let seen = asked.clone();
    let watch: LinkWatch = Box::new(move |devices| {
        seen.lock().expect("lock").push(devices);
        rx.take().ok_or(kuport_host::HostError::Missing {
            stage: kuport_host::HostStage::Links,
            what: "a second link event stream".into(),
        })
    });
    c.start_agent(1, Duration::from_secs(3600));
    c.start_agent_with(2, Duration::from_secs(3600), Some(watch));
    c.start_agent(3, Duration::from_secs(3600));
    c.eventually("the pod node programs its half", || async {
        c.agent("n2").host.applied().links.len() == 1
    })
    .await;
    assert_eq!(
        asked.lock().expect("lock").first(),
        Some(&vec!["wg0".to_owned()])
    );
    let programmed = c.agent("n2").host.applied();
    // A restarted mesh daemon deletes every link bound to its device.
    c.agent("n2").host.lock().applied = Default::default();
    let link = programmed.links[0].name.clone();
    tx.send(LinkEvent {
        name: link,
        removed: true,
    })
    .await
    .expect("event sent");
    // No watch event and no resync is due: only the link event can cause this pass.
    c.eventually("the link and rules are rebuilt", || async {
        c.agent("n2").host.applied() == programmed
    })
    .await;
    c.stop_all().await;
}

/// Declares `model` and `real` tests in a module named after each shared test function; the
/// real one runs the agents under the shipped ClusterRole.
macro_rules! on_both_servers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn model() {
                super::$name(super::Target::Model).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn real() {
                let role = kuport_realapi::agent_role().expect("the agent's ClusterRole");
                super::$name(super::Target::Real(Box::new(role))).await;
            }
        }
    )*};
}

on_both_servers!(
    remote_pod_gets_a_link_and_is_programmed_by_the_right_node,
    status_writer_changes_hands_when_no_node_serves,
    a_plain_stop_keeps_the_datapath_and_a_resync_after_convergence_writes_nothing,
    a_link_event_rebuilds_the_datapath_at_once,
);

/// The control for the RBAC check: the first scenario, under the shipped role less `update` on
/// `portmaps/status`, fails with the apiserver's 403 naming that verb and resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_rbac_control_a_missing_verb_fails_with_a_403_naming_it() {
    let test = "real_rbac_control_a_missing_verb_fails_with_a_403_naming_it";
    if !kuport_realapi::available_or_skip(test) {
        return;
    }
    let role = kuport_realapi::without_verb(
        kuport_realapi::agent_role().expect("the agent's ClusterRole"),
        "portmaps/status",
        "update",
    );
    let scenario = tokio::spawn(remote_pod_gets_a_link_and_is_programmed_by_the_right_node(
        Target::Real(Box::new(role)),
    ));
    let failure = scenario
        .await
        .expect_err("the scenario must fail without update on portmaps/status");
    let payload = failure.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default();
    assert!(
        message.contains("the agent's ClusterRole refused")
            && message.contains("update portmaps/status games/game")
            && message.contains("cannot update resource \"portmaps/status\""),
        "the failure does not name the missing verb: {message}"
    );
}

/// A pass's PortMap status writes go out a few at a time, not one after another: against an API
/// server that answers each status write after 200 ms, several are held at once, and never more
/// than the agent's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portmap_status_writes_run_a_few_at_a_time() {
    let mut c = Cluster::empty_on(Target::Model, "writes-in-flight")
        .await
        .expect("model");
    c.seed().await;
    for i in 0..11u16 {
        c.create_portmap(&format!("extra-{i}"), 3001 + i).await;
    }
    c.model().faults().slow_down(
        RequestFilter::writes().resource("portmaps").status(),
        Duration::from_millis(200),
    );
    let hour = Duration::from_secs(3600);
    for i in 1..=3 {
        c.start_agent(i, hour);
    }
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    c.eventually("every PortMap has its status", || async {
        portmaps
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.len() == 12 && l.items.iter().all(|pm| pm.status.is_some()))
    })
    .await;
    let most = c.model().faults().most_slowed_at_once();
    assert!((2..=8).contains(&most), "{most} status writes held at once");
    c.stop_all().await;
}

/// The datapath never waits for status writes. With the API server holding every PortMap status
/// write for 5 s, the pod moves to the serving node and, while the write saying so is held, back:
/// the serving node follows it back within a bound far below the held write (before, the pass
/// loop sat in that write). The status then catches up with the newest move, not the held one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_status_write_does_not_hold_the_datapath() {
    const HELD: Duration = Duration::from_secs(5);
    let mut c = Cluster::empty_on(Target::Model, "held-status-write")
        .await
        .expect("model");
    // Longer than the held writes: they succeed, slowly, rather than time out.
    c.api_timeout = Duration::from_secs(20);
    c.seed().await;
    c.start_agents_until_programmed().await;
    let over_the_link = || {
        let n1 = c.agent("n1").host.applied();
        n1.links.len() == 1
            && dnat_targets(&c.agent("n1").host) == [n1.links[0].peer_address.to_string()]
    };
    c.eventually("the serving node DNATs over the link", || async {
        over_the_link()
    })
    .await;
    let written = || {
        c.agent("n1")
            .metrics
            .status_writes_of(WriteKind::PortMap, WriteResult::Written)
    };
    let written_before = written();
    c.model()
        .faults()
        .slow_down(RequestFilter::writes().resource("portmaps").status(), HELD);
    c.set_endpoint(Some(1), false).await;
    c.eventually("the serving node delivers to the pod on itself", || async {
        dnat_targets(&c.agent("n1").host) == ["10.244.1.5"]
    })
    .await;
    c.eventually("the status write of that move is held", || async {
        c.model().faults().most_slowed_at_once() >= 1
    })
    .await;
    let moved = tokio::time::Instant::now();
    c.set_endpoint(Some(2), false).await;
    c.eventually("the serving node DNATs over the link again", || async {
        over_the_link()
    })
    .await;
    let took = moved.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "the datapath followed the pod after {took:?}, with a status write held for {HELD:?}"
    );
    // Both moves are written, in order: the held one, then the newest, which took over from
    // the pass whose write was held.
    c.eventually("the status names the pod's node, n2, last", || async {
        written() >= written_before + 2
            && c.portmap()
                .await
                .status
                .and_then(|s| s.endpoint)
                .is_some_and(|e| e.node == "n2")
    })
    .await;
    assert!(c.agent("n1").metrics.passes_superseded() >= 1);
    c.stop_all().await;
}

/// The passes every agent ran so far, however they ended.
fn passes(a: &RunningAgent) -> u64 {
    a.metrics.passes_ok() + a.metrics.passes_failed() + a.metrics.passes_superseded()
}

/// Waits until no agent has run a pass for half a second: their writes are done and the
/// watches have brought the statuses back.
async fn settle(c: &Cluster) {
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

/// A watch event changing nothing a pass reads runs no pass: a row's pass time refreshed, a
/// kubelet's heartbeat, and on the nodes that do not write it a PortMap's status written over.
/// The node that writes that status puts its own back, and its own write coming back runs no
/// pass either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_changing_nothing_a_pass_reads_run_no_pass() {
    let mut c = Cluster::start().await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    c.eventually("the pod node delivers to the pod", || async {
        dnat_targets(&c.agent("n2").host).contains(&"10.244.2.5".to_owned())
    })
    .await;
    settle(&c).await;
    let before: Vec<u64> = c.agents.iter().map(passes).collect();
    let ignored = |kind: &str| -> Vec<u64> {
        c.agents
            .iter()
            .map(|a| a.metrics.watch_events(kind, false))
            .collect()
    };
    let ignored_before: Vec<Vec<u64>> = ["PortMapClass", "Node", "PortMap"]
        .into_iter()
        .map(ignored)
        .collect();
    let pp = PostParams::default();

    // Every row's pass time moved, as each agent refreshes it once a minute (half a minute
    // ago: another time than the one stored, and recent enough for n1 to keep it).
    let classes: Api<PortMapClass> = Api::all(c.client.clone());
    let mut class = c.class().await;
    let recently = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(30))
        .expect("a time");
    for row in class.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
        row.last_pass_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            recently,
        ));
    }
    classes
        .replace_status("public", &pp, &class)
        .await
        .expect("class status written");
    // A kubelet's heartbeat on n3.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let mut n3 = nodes.get_status("n3").await.expect("node n3");
    for cond in n3
        .status
        .iter_mut()
        .flat_map(|s| s.conditions.iter_mut().flatten())
    {
        cond.last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    }
    nodes
        .replace_status("n3", &pp, &n3)
        .await
        .expect("node status written");
    // The PortMap's status written over by someone other than its writer, n1.
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let mut game = c.portmap().await;
    let message = |pm: &PortMap| -> Option<String> {
        pm.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == "Programmed")
            .map(|c| c.message.clone())
    };
    let programmed = message(&game);
    for cond in game.status.iter_mut().flat_map(|s| s.conditions.iter_mut()) {
        cond.message = "written by hand".into();
    }
    portmaps
        .replace_status("game", &pp, &game)
        .await
        .expect("portmap status written");

    c.eventually("n1 puts its status back", || async {
        message(&c.portmap().await) == programmed
    })
    .await;
    // Every agent has seen every one of those events (and n2 and n3 the status put back).
    c.eventually("every agent ignored the events", || async {
        let now: Vec<Vec<u64>> = ["PortMapClass", "Node", "PortMap"]
            .into_iter()
            .map(ignored)
            .collect();
        (0..c.agents.len()).all(|i| {
            let portmap_events = if c.agents[i].name == "n1" { 1 } else { 2 };
            now[0][i] > ignored_before[0][i]
                && now[1][i] > ignored_before[1][i]
                && now[2][i] >= ignored_before[2][i] + portmap_events
        })
    })
    .await;
    for (a, before) in c.agents.iter().zip(&before) {
        if a.name == "n1" {
            assert!(passes(a) > *before, "n1 ran a pass to put its status back");
        } else {
            assert_eq!(passes(a), *before, "{} ran a pass", a.name);
        }
    }
    c.stop_all().await;
}

/// cilium-config is watched, not read per pass: creating it after the agents started refuses a
/// mapping on the CNI's overlay port, and deleting it takes the refusal back, with no other
/// object changing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cni_config_is_watched() {
    let mut c = Cluster::empty_on(Target::Model, "cni-watch")
        .await
        .expect("model");
    c.seed().await;
    c.start_agents_until_programmed().await;
    let configs: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(c.client.clone(), "kube-system");
    configs
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "cilium-config"},
                         "data": {"routing-mode": "tunnel", "tunnel-port": "3000"}})),
        )
        .await
        .expect("cilium-config");
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let accepted = || async {
        portmaps.get("game").await.ok().and_then(|pm| {
            pm.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Accepted")
                .map(|c| (c.status, c.reason))
        })
    };
    c.eventually("the overlay port is refused", || async {
        accepted().await == Some(("False".into(), "PortInUse".into()))
    })
    .await;
    configs
        .delete("cilium-config", &Default::default())
        .await
        .expect("delete");
    c.eventually("accepted again once the CNI config is gone", || async {
        accepted().await.is_some_and(|(s, _)| s == "True")
    })
    .await;
    c.stop_all().await;
}

/// The kernel of the pod's node refuses one mapping's rules: that mapping says so in status
/// (Programmed=False, HostRefused, the kernel's words, the node named), the class lists the
/// refusal under that node, and every other mapping on the node is programmed and written.
/// When the kernel takes the rules again, the mapping is programmed and the entry goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_mapping_is_reported_and_the_others_keep_working() {
    let mut c = Cluster::empty_on(Target::Model, "refusal")
        .await
        .expect("model");
    c.seed().await;
    c.create_portmap("other", 3001).await;
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let n2 = MemoryHost::with_facts(facts(2));
    n2.lock().refuse.insert(
        "games/game".into(),
        "Could not process rule: Operation not supported".into(),
    );
    let hour = Duration::from_secs(3600);
    c.start_agent(1, hour);
    c.start_agent_on(2, n2.clone(), hour, None, StopPolicy::Keep);
    c.start_agent(3, hour);

    let programmed = |name: &'static str| {
        let api = portmaps.clone();
        async move {
            api.get(name).await.ok().and_then(|pm| {
                pm.status?
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "Programmed")
                    .map(|c| (c.status, c.reason, c.message))
            })
        }
    };
    c.eventually("the other mapping is programmed", || async {
        programmed("other")
            .await
            .is_some_and(|(s, _, _)| s == "True")
    })
    .await;
    c.eventually("the refused mapping says why", || async {
        programmed("game").await.is_some_and(|(s, r, m)| {
            s == "False"
                && r == "HostRefused"
                && m == "on node n2, the kernel refused its nftables rules: Could not process rule: Operation not supported"
        })
    })
    .await;
    let refused = c.class().await.status.expect("status").refused;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(
        (refused[0].node.as_str(), refused[0].mapping.as_str()),
        ("n2", "games/game")
    );
    // n2 delivers the other mapping to the pod and nothing of the refused one.
    let comments: Vec<String> = dnats(&n2).into_iter().map(|d| d.comment).collect();
    assert_eq!(comments, ["games/other"]);
    assert_eq!(
        c.agent("n2")
            .metrics
            .encode()
            .expect("metrics")
            .lines()
            .find(|l| l.starts_with("kuport_host_refusals ")),
        Some("kuport_host_refusals 1")
    );

    // The kernel takes the rules again: the agent retries on its own (no watch event needed).
    n2.lock().refuse.clear();
    c.eventually(
        "the mapping is programmed once the kernel takes it",
        || async {
            programmed("game")
                .await
                .is_some_and(|(s, _, _)| s == "True")
        },
    )
    .await;
    c.eventually("the class entry is gone", || async {
        c.class().await.status.is_some_and(|s| s.refused.is_empty())
    })
    .await;
    c.stop_all().await;
}

/// A failed sweep of stale conntrack entries does not fail the pass: it is counted, and the
/// host is asked again soon though no input changes; the retry's cleared entries are counted.
/// (The memory host scripts what the kernel's table would say.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_conntrack_sweep_is_counted_and_retried_without_an_event() {
    use kube::api::{Patch, PatchParams};
    let mut c = Cluster::empty_on(Target::Model, "conntrack")
        .await
        .expect("model");
    c.seed().await;
    let n1 = MemoryHost::with_facts(facts(1));
    let hour = Duration::from_secs(3600);
    c.start_agent_on(1, n1.clone(), hour, None, StopPolicy::Keep);
    c.start_agent(2, hour);
    c.start_agent(3, hour);
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    settle(&c).await;

    n1.lock().conntrack_sweeps.extend([
        Err("listing the conntrack table: Operation not permitted".to_owned()),
        Ok(2),
    ]);
    // One change every pass reads and that changes no plan: one pass on each node.
    Api::<Namespace>::all(c.client.clone())
        .patch(
            "games",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("namespace labelled");
    let metrics = c.agent("n1").metrics.clone();
    let series = |line: &str| {
        metrics
            .encode()
            .expect("metrics")
            .lines()
            .any(|l| l == line)
    };
    c.eventually(
        "the failed sweep is retried and its entries counted",
        || std::future::ready(metrics.conntrack_entries_cleared() == 2),
    )
    .await;
    assert!(series("kuport_conntrack_sweeps_total{result=\"failed\"} 1"));
    assert!(series("kuport_conntrack_sweeps_total{result=\"ok\"} 1"));
    assert!(series("kuport_conntrack_entries_cleared_total 2"));
    assert_eq!(metrics.passes_failed(), 0, "a failed sweep fails no pass");
    assert!(n1.lock().conntrack_sweeps.is_empty());
    c.stop_all().await;
}
