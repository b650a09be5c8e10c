//! Runs one scenario: builds its cluster, starts the API server and the agents, executes the
//! steps and tears everything down again.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kuport_testkit::objects;
use rustix::process::Signal;
use serde_json::{Value, json};

use crate::agentpods::{self, AGENT_HTTP, AgentPods};
use crate::cluster::{Cluster, condition};
use crate::image::{self, AgentImage};
use crate::probe;
use crate::report::{ScenarioReport, StepReport};
use crate::scenario::{self, Protocol, Scenario, SignalName, Step};
use crate::sys::{self, Lab};
use crate::topology::{self, API_ADDR, Topology, UL_NS};

/// The number of passes (ok and failed) the agent in `ns` has run, from its `/metrics`.
fn agent_passes(ns: &str) -> Result<u64> {
    let (_, body) = agentpods::http_get(ns, AGENT_HTTP, "/metrics", Duration::from_secs(2))
        .with_context(|| format!("reading the agent's metrics in {ns}"))?;
    passes_in(&body).with_context(|| format!("no kuport_passes_total in the metrics of {ns}"))
}

/// Sums `kuport_passes_total` over its labels in a Prometheus text exposition.
fn passes_in(text: &str) -> Option<u64> {
    let values: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with("kuport_passes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

pub use crate::sys::{enter_netns, enter_netns_of};

/// How long a `stopAgent` step waits for the agent's Pod to say so.
const POD_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which API server a scenario runs against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiServer {
    /// The API server model (`kuport-sim serve`); the lab writes slices and node readiness.
    #[default]
    Model,
    /// etcd, kube-apiserver and kube-controller-manager built from e2e/controlplane; the real
    /// EndpointSlice and node-lifecycle controllers write slices and node readiness, and the
    /// agents run as their ServiceAccount under the shipped ClusterRole.
    Real,
}

/// Where each agent's kubeconfig goes against the real control plane:
/// `agent-kubeconfig-<node>`, a token of the agents' ServiceAccount bound to the agent's Pod on
/// that node, as the kubelet projects it (the lab's own kubeconfig is the admin's).
fn agent_kubeconfig(node: &str) -> PathBuf {
    Path::new(sys::RUN_DIR).join(format!("agent-kubeconfig-{node}"))
}

/// The controllers the real control plane runs for the lab.
const REAL_CONTROLLERS: [&str; 2] = ["endpointslice-controller", "node-lifecycle-controller"];

pub struct Runner<'a> {
    pub lab: &'a mut Lab,
    pub topo: Topology,
    /// Agents run from this image instead of the built binary (`--agent-image`).
    image: Option<&'a AgentImage>,
    api: ApiServer,
    /// The real control plane, while it runs (dropping it stops it).
    control_plane: Option<kuport_realapi::ControlPlane>,
    cluster: Option<Cluster>,
    /// Keeps the agents' Pods and DaemonSet in step with the agent processes.
    agent_pods: Option<AgentPods>,
    snapshots: BTreeMap<(String, String), String>,
    /// The host listeners started, by (node, protocol, port), with their pids.
    host_listeners: BTreeMap<(String, Protocol, u16), i32>,
}

/// Runs a scenario; `keep` leaves its cluster up afterwards.
#[allow(clippy::too_many_arguments)]
pub async fn run_scenario(
    lab: &mut Lab,
    scenario: &Scenario,
    bins: &Path,
    image: Option<&AgentImage>,
    api: ApiServer,
    original_netns: &File,
    keep: bool,
) -> (ScenarioReport, Option<Topology>) {
    let started = Instant::now();
    let mut steps = Vec::new();
    let mut error = None;
    if let Err(e) = lab.set_scenario(&scenario.name) {
        error = Some(format!("{e:#}"));
    }
    let topo = match topology::build(lab, scenario, bins) {
        Ok(t) => Some(t),
        Err(e) => {
            error = Some(format!("building the topology: {e:#}"));
            None
        }
    };
    let mut kept = None;
    if let Some(topo) = topo {
        let mut runner = Runner {
            lab,
            topo,
            image,
            api,
            control_plane: None,
            cluster: None,
            agent_pods: None,
            snapshots: BTreeMap::new(),
            host_listeners: BTreeMap::new(),
        };
        match runner.start_cluster().await {
            Ok(()) => {
                for (i, step) in scenario.steps.iter().enumerate() {
                    steps.push(runner.step(step, i + 1).await);
                }
            }
            Err(e) => error = Some(format!("starting the cluster: {e:#}")),
        }
        if let Some(refused) = runner.rbac_refusals() {
            add_error(&mut error, refused);
        }
        if error.is_some() {
            runner.dump_logs(&mut error);
        } else if steps.iter().any(|s| !s.ok) {
            let mut note = None;
            runner.dump_logs(&mut note);
            error = note;
        }
        if keep {
            kept = Some(runner.topo);
        } else {
            runner.stop_agents();
        }
    }
    let _ = enter_netns_of(original_netns);
    if !keep {
        let left = lab.teardown();
        if !left.is_empty() {
            add_error(&mut error, format!("teardown left: {}", left.join(", ")));
        }
    }
    let ok =
        error.as_ref().is_none_or(|e| e.starts_with("agent logs")) && steps.iter().all(|s| s.ok);
    (
        ScenarioReport {
            name: scenario.name.clone(),
            ok: ok && !steps.is_empty(),
            seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            steps,
            error,
        },
        kept,
    )
}

/// Adds `text` to a scenario's error (after what it already says).
fn add_error(error: &mut Option<String>, text: String) {
    *error = Some(match error.take() {
        Some(e) => format!("{e}; {text}"),
        None => text,
    });
}

impl<'a> Runner<'a> {
    /// Builds a scenario's cluster and starts it, without running its steps (the benchmarks
    /// drive it themselves). On error the caller tears the lab down.
    pub async fn start(lab: &'a mut Lab, scenario: &Scenario, bins: &Path) -> Result<Self> {
        lab.set_scenario(&scenario.name)?;
        let topo = topology::build(lab, scenario, bins)?;
        let mut runner = Runner {
            lab,
            topo,
            image: None,
            api: ApiServer::Model,
            control_plane: None,
            cluster: None,
            agent_pods: None,
            snapshots: BTreeMap::new(),
            host_listeners: BTreeMap::new(),
        };
        runner.start_cluster().await?;
        Ok(runner)
    }
}

impl Runner<'_> {
    pub fn cluster(&self) -> Result<&Cluster> {
        self.cluster
            .as_ref()
            .context("the API client is not connected")
    }

    /// API server, Nodes, objects, pods, Services and slices, then the agents.
    async fn start_cluster(&mut self) -> Result<()> {
        match self.api {
            ApiServer::Model => self.start_model().await?,
            ApiServer::Real => self.start_real().await?,
        }
        let real = self.api == ApiServer::Real;
        let cluster = Cluster::connect(&self.topo.kubeconfig, real).await?;
        if self.topo.scenario.cni.is_cilium() {
            cluster.ensure_namespace("kube-system").await?;
            let mode = match self.topo.scenario.cni {
                scenario::Cni::CiliumNative => "native",
                _ => "tunnel",
            };
            cluster
                .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "cilium-config", "namespace": "kube-system"},
                    "data": {"routing-mode": mode, "tunnel-protocol": "vxlan"}}))
                .await?;
        }
        for node in &self.topo.nodes {
            cluster
                .register_node(
                    &node.name,
                    self.topo.internal_ips(node),
                    &node_pod_cidrs(&self.topo, node),
                    true,
                )
                .await?;
        }
        for listener in self.topo.scenario.host.listeners.clone() {
            self.start_host_listener(&listener)?;
        }
        if !self.topo.scenario.objects.trim().is_empty() {
            cluster.apply_yaml(&self.topo.scenario.objects).await?;
        }
        // Every scenario records the DaemonSet and its Pods: `kuport status` judges the agents
        // by them (and against the real control plane each agent's token is bound to its Pod).
        let nodes: Vec<String> = self.topo.nodes.iter().map(|n| n.name.clone()).collect();
        cluster.install_daemon_set(&nodes).await?;
        let kubelet_nodes: Vec<(String, String, std::net::Ipv4Addr)> = self
            .topo
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.ns.clone(), n.mesh))
            .collect();
        self.agent_pods = Some(AgentPods::start(
            &self.topo.kubeconfig,
            &Path::new("/run/netns").join(UL_NS),
            &kubelet_nodes,
            self.lab.log_path("agent-pods"),
        )?);
        if real {
            self.issue_agent_tokens(&nodes).await?;
        }
        self.cluster = Some(cluster);
        for pod in self.topo.scenario.pods.clone() {
            self.cluster()?.ensure_namespace(&pod.namespace).await?;
            topology::start_pod(self.lab, &mut self.topo, &pod, &pod.node)?;
        }
        topology::check_ipv6(&self.topo)?;
        self.sync_lone_pods().await?;
        let services: Vec<(String, String)> = self
            .topo
            .pods
            .values()
            .filter_map(|p| Some((p.spec.namespace.clone(), p.spec.service.clone()?)))
            .collect();
        for (ns, svc) in services {
            self.sync_service(&ns, &svc).await?;
        }
        for node in self.topo.nodes.clone() {
            self.start_agent(&node.name)?;
        }
        Ok(())
    }

    /// The Pod object of every pod no Service selects, bound to its node, as a kubelet would
    /// have it: a node's agent delivers only to the addresses of its own Pods (the pods of a
    /// Service get theirs with its endpoints, [`Self::sync_service`]).
    async fn sync_lone_pods(&self) -> Result<()> {
        for pod in self.topo.pods.values().filter(|p| p.spec.service.is_none()) {
            self.cluster()?
                .sync_pod(&pod.spec.namespace, &pod.spec.name, pod)
                .await?;
        }
        Ok(())
    }

    pub async fn sync_service(&self, namespace: &str, service: &str) -> Result<()> {
        let pods: Vec<_> = self
            .topo
            .pods
            .values()
            .filter(|p| p.spec.namespace == namespace && p.spec.service.as_deref() == Some(service))
            .collect();
        // The scenario's pods of one Service agree on their families (the scenario checks).
        let families = self
            .topo
            .scenario
            .pods
            .iter()
            .find(|p| p.namespace == namespace && p.service.as_deref() == Some(service))
            .map(|p| p.ip_families.clone())
            .unwrap_or_else(|| vec![scenario::IpFamily::IPv4]);
        self.cluster()?
            .sync_service(namespace, service, &pods, &families)
            .await
    }

    /// Starts a responder in a node's own namespace, listening on every address of the node;
    /// the lab records its pid and stops it with the rest.
    fn start_host_listener(&mut self, l: &scenario::HostListener) -> Result<i32> {
        let ns = self.topo.node(&l.node)?.ns.clone();
        let what = format!("host-listener-{}-{}-{}", l.node, l.protocol.lower(), l.port);
        let port = l.port.to_string();
        let address = l.address.as_deref().map(|a| self.expand(a)).transpose()?;
        let pid = topology::spawn_echo_on(
            self.lab,
            &self.topo,
            &ns,
            &what,
            l.protocol,
            &port,
            address.as_deref(),
        )?;
        self.host_listeners
            .insert((l.node.clone(), l.protocol, l.port), pid);
        Ok(pid)
    }

    /// Stops a host listener the scenario started, as a daemon stopping would.
    fn stop_host_listener(&mut self, l: &scenario::HostListener) -> Result<i32> {
        let pid = self
            .host_listeners
            .remove(&(l.node.clone(), l.protocol, l.port))
            .with_context(|| {
                format!(
                    "no host listener on {} {} port {} was started",
                    l.node,
                    l.protocol.as_str(),
                    l.port
                )
            })?;
        self.lab.stop(pid, Signal::TERM, Duration::from_secs(2))?;
        Ok(pid)
    }

    /// Against the real control plane: the requests of the agents that the API server refused
    /// (from the audit log: their ClusterRole, or the class status admission policy), as one
    /// error; a missing verb or a write the policy refuses fails the scenario even when the
    /// agent copes (an Event it could not write, a status write it retries).
    fn rbac_refusals(&self) -> Option<String> {
        let cp = self.control_plane.as_ref()?;
        let user = format!(
            "system:serviceaccount:{}:kuport-agent",
            crate::cluster::DAEMON_SET_NAMESPACE
        );
        match cp.forbidden_requests(&user) {
            Ok(refused) if refused.is_empty() => None,
            Ok(refused) => Some(format!(
                "the API server refused {} request(s) of the agents (RBAC or the class status policy): {}",
                refused.len(),
                refused.join("; ")
            )),
            Err(e) => Some(format!("reading the audit log: {e}")),
        }
    }

    /// The API server model in the underlay namespace; it writes the lab's kubeconfig.
    async fn start_model(&mut self) -> Result<()> {
        let kubeconfig = self.topo.kubeconfig.display().to_string();
        let sim = self.topo.bin("kuport-sim");
        // A kubeconfig left by the previous scenario would pass the readiness check below early.
        match std::fs::remove_file(&self.topo.kubeconfig) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing the old {kubeconfig}"));
            }
            _ => {}
        }
        let pid = self.lab.spawn(
            UL_NS,
            "apiserver",
            &sim,
            &["serve", "--listen", API_ADDR, "--kubeconfig", &kubeconfig],
        )?;
        self.topo.api_pid = Some(pid);
        enter_netns(&Path::new("/run/netns").join(UL_NS))?;
        let addr: std::net::SocketAddr = API_ADDR.parse().context("the API address")?;
        let path = self.topo.kubeconfig.clone();
        if !sys::wait_until(Duration::from_secs(15), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
                // An empty file parses as an empty kubeconfig, so ask for its context.
                && kube::config::Kubeconfig::read_from(&path)
                    .is_ok_and(|k| k.current_context.is_some())
        }) {
            bail!("the API server did not listen on {API_ADDR} and write {kubeconfig} within 15 s");
        }
        Ok(())
    }

    /// For each node, a token of the agents' ServiceAccount bound to the agent's Pod there (the
    /// kind the kubelet projects into the DaemonSet's Pods, which names the node), in the
    /// node's agent kubeconfig. The shipped admission policy refuses class status writes made
    /// with any other token.
    async fn issue_agent_tokens(&self, nodes: &[String]) -> Result<()> {
        let cp = self
            .control_plane
            .as_ref()
            .context("the real control plane is not running")?;
        let (namespace, account) = (crate::cluster::DAEMON_SET_NAMESPACE, objects::AGENT_ACCOUNT);
        for node in nodes {
            let pod = format!("{}-{node}", objects::AGENT_DAEMONSET);
            let token = cp
                .pod_token(namespace, account, &pod)
                .await
                .with_context(|| format!("a token bound to Pod {namespace}/{pod}"))?;
            cp.service_account_kubeconfig(namespace, account, &token, &agent_kubeconfig(node))
                .with_context(|| format!("the agent kubeconfig of {node}"))?;
        }
        Ok(())
    }

    /// The real control plane in the underlay namespace, serving on the lab's API address:
    /// the CRDs and the shipped class status admission policy installed, the admin's
    /// kubeconfig as the lab's, and the agents' ServiceAccount bound to the ClusterRole the
    /// DaemonSet ships (each agent's token comes later, bound to its Pod).
    async fn start_real(&mut self) -> Result<()> {
        let bin = kuport_realapi::binary_dir();
        if !kuport_realapi::is_built() {
            bail!(
                "the real control plane is not built in {}: run `just control-plane`",
                bin.display()
            );
        }
        sys::ip(&["netns", "exec", UL_NS, "ip", "link", "set", "lo", "up"])?;
        enter_netns(&Path::new("/run/netns").join(UL_NS))?;
        let listen: std::net::SocketAddrV4 = API_ADDR.parse().context("the API address")?;
        let options = kuport_realapi::Options {
            controllers: REAL_CONTROLLERS.iter().map(|c| (*c).to_owned()).collect(),
            listen: Some(listen),
        };
        let cp = kuport_realapi::ControlPlane::start(&bin, options)
            .await
            .context("starting the real control plane")?;
        cp.install_crds(Path::new(kuport_realapi::CRD_DIR))
            .await
            .context("installing the CRDs")?;
        cp.install_admission_policies(Path::new(kuport_realapi::CLASS_STATUS_POLICY_FILE))
            .await
            .context("installing the class status admission policy")?;
        // The admin's token: for root only.
        let admin = std::fs::read(cp.kubeconfig())
            .with_context(|| format!("reading {}", cp.kubeconfig().display()))?;
        sys::write_private(&self.topo.kubeconfig, &admin)?;
        let role = kuport_realapi::agent_role().context("the shipped agent ClusterRole")?;
        cp.create_service_account(
            crate::cluster::DAEMON_SET_NAMESPACE,
            objects::AGENT_ACCOUNT,
            &role,
        )
        .await
        .context("the agents' ServiceAccount")?;
        self.control_plane = Some(cp);
        Ok(())
    }

    fn start_agent(&mut self, node: &str) -> Result<()> {
        let ns = self.topo.node(node)?.ns.clone();
        // From the image, the kubeconfig is copied into the agent's own /run.
        let kubeconfig = match (self.image, self.api) {
            (Some(_), _) => image::KUBECONFIG_IN_IMAGE.to_owned(),
            (None, ApiServer::Real) => agent_kubeconfig(node).display().to_string(),
            (None, ApiServer::Model) => self.topo.kubeconfig.display().to_string(),
        };
        let mut args: Vec<String> = vec![
            "agent".into(),
            "--node-name".into(),
            node.into(),
            "--kubeconfig".into(),
            kubeconfig,
            "--health-addr".into(),
            AGENT_HTTP.into(),
            "--metrics-addr".into(),
            AGENT_HTTP.into(),
        ];
        if self.topo.scenario.daemon_set {
            args.extend([
                "--pod-name".into(),
                agentpods::pod_name(node),
                "--pod-namespace".into(),
                crate::cluster::DAEMON_SET_NAMESPACE.into(),
            ]);
        }
        args.extend(self.topo.scenario.agent_args.iter().cloned());
        let what = format!("agent-{node}");
        let pid = match self.image {
            None => {
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                self.lab
                    .spawn(&ns, &what, &self.topo.bin("kuport"), &refs)?
            }
            Some(image) => {
                let (program, args) = image.command(&self.topo.kubeconfig, &args);
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                self.lab.spawn_as(&ns, &what, "kuport", &program, &refs)?
            }
        };
        self.topo.agents.insert(node.to_string(), pid);
        if let Some(pods) = &self.agent_pods {
            pods.started(node, pid);
        }
        Ok(())
    }

    fn stop_agent(&mut self, node: &str, signal: SignalName) -> Result<()> {
        let pid = self
            .topo
            .agents
            .remove(node)
            .with_context(|| format!("no agent running on {node}"))?;
        let sig = match signal {
            SignalName::Term => Signal::TERM,
            SignalName::Kill => Signal::KILL,
        };
        let stopped = self.lab.stop(pid, sig, Duration::from_secs(15));
        if let Some(pods) = &self.agent_pods {
            pods.stopped(node, signal);
        }
        stopped
    }

    /// Waits until the agent Pod of `node` says what its process did last (a kubelet notices
    /// a stopped container at once; a step after a stop must see it): the detail's
    /// `agentPod` is `written`, or `not written` when the API server did not take it in time.
    fn pod_follows(&self, node: &str, detail: &mut Value) {
        if let Some(pods) = &self.agent_pods {
            let written = pods.wait_written(node, POD_WRITE_TIMEOUT);
            detail["agentPod"] = json!(if written { "written" } else { "not written" });
        }
    }

    /// Polls every running agent's pass counter until none has moved for the quiet interval.
    async fn settle(&self, s: &scenario::Settle) -> Result<(bool, Value)> {
        let quiet = Duration::from_millis(s.quiet_millis.unwrap_or(500));
        let deadline = Instant::now() + Duration::from_secs(s.timeout_seconds.unwrap_or(10));
        let started = Instant::now();
        let mut last: Option<BTreeMap<String, Result<u64, String>>> = None;
        let mut unchanged_since = Instant::now();
        loop {
            let mut now = BTreeMap::new();
            for node in self.topo.agents.keys() {
                let ns = &self.topo.node(node)?.ns;
                now.insert(node.clone(), agent_passes(ns).map_err(|e| format!("{e:#}")));
            }
            let idle = now.values().all(|p| matches!(p, Ok(n) if *n > 0));
            if last.as_ref() != Some(&now) {
                unchanged_since = Instant::now();
            } else if idle && unchanged_since.elapsed() >= quiet {
                let passes: BTreeMap<&String, u64> = now
                    .iter()
                    .filter_map(|(n, p)| Some((n, *p.as_ref().ok()?)))
                    .collect();
                return Ok((
                    true,
                    json!({"passes": passes, "waitedMillis": started.elapsed().as_millis() as u64}),
                ));
            }
            if Instant::now() >= deadline {
                let seen: BTreeMap<&String, String> = now
                    .iter()
                    .map(|(n, p)| (n, p.as_ref().map_or_else(Clone::clone, u64::to_string)))
                    .collect();
                return Ok((
                    false,
                    json!({"error": format!("agents still passing (or unreadable) after {:?}", started.elapsed()),
                           "passes": seen}),
                ));
            }
            last = Some(now);
            tokio::time::sleep(probe::POLL).await;
        }
    }

    /// SIGTERM every agent before its namespace goes (what an agent keeps goes with the
    /// namespace).
    pub fn stop_agents(&mut self) {
        let nodes: Vec<String> = self.topo.agents.keys().cloned().collect();
        for node in nodes {
            let _ = self.stop_agent(&node, SignalName::Term);
        }
    }

    /// Appends the tail of every agent log to the scenario error, so a failure explains itself.
    fn dump_logs(&self, error: &mut Option<String>) {
        let mut text = String::from("agent logs: ");
        for node in &self.topo.nodes {
            let path = self.lab.log_path(&format!("agent-{}", node.name));
            text.push_str(&format!("{} ", path.display()));
        }
        add_error(error, text);
    }

    pub async fn step(&mut self, step: &Step, index: usize) -> StepReport {
        let name = step
            .given_name()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}-{index}", step.kind()));
        let (ok, detail) = match self.exec(step).await {
            Ok(r) => r,
            Err(e) => (false, json!({"error": format!("{e:#}")})),
        };
        StepReport {
            kind: step.kind().to_string(),
            name,
            ok,
            detail,
        }
    }

    /// Runs one step: one arm per step kind, each a call or a line or two.
    async fn exec(&mut self, step: &Step) -> Result<(bool, Value)> {
        match step {
            Step::Probe(p) => Ok(probe::run(&self.topo, p).await),
            Step::Parallel(inner) => self.parallel(inner).await,
            Step::Wait(w) => self.wait(w).await,
            Step::ExpectStatus(e) => self.expect_status(e).await,
            Step::Settle(s) => self.settle(s).await,
            Step::Sleep(s) => {
                tokio::time::sleep(Duration::from_secs_f64(s.seconds.max(0.0))).await;
                Ok((true, json!({"seconds": s.seconds})))
            }
            Step::MovePod(m) => self.move_pod(m).await,
            Step::SetReady(r) => self.set_ready(r).await,
            Step::SetNodeReady(n) => self.set_node_ready(n).await,
            Step::Apply(yaml) => {
                let applied = self.cluster()?.apply_yaml(yaml).await?;
                Ok((true, json!({"applied": applied})))
            }
            Step::Delete(d) => {
                self.cluster()?
                    .delete(&d.kind, d.namespace.as_deref(), &d.name)
                    .await?;
                Ok((true, json!({"deleted": format!("{} {}", d.kind, d.name)})))
            }
            Step::RestartAgent(a) => {
                self.stop_agent(&a.node, a.signal)?;
                self.start_agent(&a.node)?;
                Ok((true, signalled(a)))
            }
            Step::StopAgent(a) => {
                self.stop_agent(&a.node, a.signal)?;
                let mut detail = signalled(a);
                self.pod_follows(&a.node, &mut detail);
                Ok((true, detail))
            }
            Step::StartAgent(a) => {
                self.start_agent(&a.node)?;
                Ok((true, json!({"node": a.node})))
            }
            Step::StopApiServer(_) => {
                api_outage(true)?;
                Ok((true, json!({"apiServer": "unreachable"})))
            }
            Step::StartApiServer(_) => {
                api_outage(false)?;
                Ok((true, json!({"apiServer": "reachable"})))
            }
            Step::RestartMesh(r) => {
                topology::restart_mesh(self.lab, &mut self.topo, &r.node)?;
                Ok((true, json!({"node": r.node})))
            }
            Step::StopResponder(r) => self.stop_responder(r),
            Step::StartResponder(r) => self.start_responder(r),
            Step::HostExec(h) => self.host_exec(h),
            Step::SnapshotHost(s) => self.snapshot_host(s),
            Step::CompareHost(s) => self.compare_host(s),
            Step::ExpectHostClean(n) => self.expect_host_clean(n),
            Step::ExpectHost(h) => self.expect_host(h),
            Step::Kubectl(c) => self.kubectl(c).await,
            Step::KuportStatus(c) => self.kuport_command("status", c).await,
            Step::KuportPreflight(c) => self.kuport_command("preflight", c).await,
            Step::RollingRestart(r) => self.rolling_restart(r),
            Step::HostListener(l) => {
                let pid = self.start_host_listener(l)?;
                Ok((
                    true,
                    json!({"node": l.node, "listening": format!("{}/{}", l.port, l.protocol.as_str()), "pid": pid}),
                ))
            }
            Step::StopHostListener(l) => {
                let pid = self.stop_host_listener(l)?;
                Ok((
                    true,
                    json!({"node": l.node, "stopped": format!("{}/{}", l.port, l.protocol.as_str()), "pid": pid}),
                ))
            }
            Step::Cleanup(n) => self.cleanup(n),
        }
    }

    /// Moves a pod to another node (a new address there) and updates its Service's endpoints.
    async fn move_pod(&mut self, m: &scenario::MovePod) -> Result<(bool, Value)> {
        let pod = topology::remove_pod(self.lab, &mut self.topo, &m.pod)?;
        topology::start_pod(self.lab, &mut self.topo, &pod.spec, &m.to)?;
        if let Some(p) = self.topo.pods.get_mut(&m.pod) {
            p.ready = pod.ready;
        }
        match &pod.spec.service {
            Some(svc) => self.sync_service(&pod.spec.namespace, svc).await?,
            None => {
                if let Some(moved) = self.topo.pods.get(&m.pod) {
                    self.cluster()?
                        .sync_pod(&pod.spec.namespace, &pod.spec.name, moved)
                        .await?;
                }
            }
        }
        let ip = self.topo.pods.get(&m.pod).map(|p| p.ip.to_string());
        Ok((
            true,
            json!({"pod": m.pod, "from": pod.node, "to": m.to, "address": ip}),
        ))
    }

    /// Marks a pod ready or not and updates its Service's endpoints.
    async fn set_ready(&mut self, r: &scenario::SetReady) -> Result<(bool, Value)> {
        let pod = self
            .topo
            .pods
            .get_mut(&r.pod)
            .with_context(|| format!("no pod {}", r.pod))?;
        pod.ready = r.ready;
        let (ns, svc) = (pod.spec.namespace.clone(), pod.spec.service.clone());
        if let Some(svc) = svc {
            self.sync_service(&ns, &svc).await?;
        }
        Ok((true, json!({"pod": r.pod, "ready": r.ready})))
    }

    /// Sets a node's Ready condition as its kubelet would.
    async fn set_node_ready(&self, n: &scenario::SetNodeReady) -> Result<(bool, Value)> {
        let node = self.topo.node(&n.node)?;
        self.cluster()?
            .set_node_ready(&n.node, self.topo.internal_ips(node), n.ready)
            .await?;
        Ok((true, json!({"node": n.node, "ready": n.ready})))
    }

    /// Stops one of a pod's responders (the pod stays, its port refuses).
    fn stop_responder(&mut self, r: &scenario::Responder) -> Result<(bool, Value)> {
        let pod = self
            .topo
            .pods
            .get_mut(&r.pod)
            .with_context(|| format!("no pod {}", r.pod))?;
        let pid = pod
            .responders
            .remove(&(r.protocol, r.port))
            .with_context(|| {
                format!(
                    "no {} responder on {} in {}",
                    r.protocol.as_str(),
                    r.port,
                    r.pod
                )
            })?;
        self.lab.stop(pid, Signal::TERM, Duration::from_secs(2))?;
        Ok((
            true,
            json!({"pod": r.pod, "stopped": format!("{}/{}", r.port, r.protocol.as_str())}),
        ))
    }

    /// Starts a responder in a pod again.
    fn start_responder(&mut self, r: &scenario::Responder) -> Result<(bool, Value)> {
        let mut pod = self
            .topo
            .pods
            .remove(&r.pod)
            .with_context(|| format!("no pod {}", r.pod))?;
        let started = topology::start_responder(self.lab, &self.topo, &mut pod, r.protocol, r.port);
        self.topo.pods.insert(r.pod.clone(), pod);
        started?;
        Ok((
            true,
            json!({"pod": r.pod, "started": format!("{}/{}", r.port, r.protocol.as_str())}),
        ))
    }

    /// Runs a shell command on a node (or a client, the router, a mesh member); the step passes
    /// when it exits 0.
    fn host_exec(&self, h: &scenario::HostExec) -> Result<(bool, Value)> {
        // Extension: `vpn:<client>` and `internet` run on a client instead of a node
        // (an attacker building its own VXLAN device, say), `router` on the internet
        // router, a neighbour on the public segment.
        let ns = if h.node == "internet" {
            topology::CLIENT_NS.to_string()
        } else if h.node == "router" {
            topology::INET_NS.to_string()
        } else if h.node.starts_with("vpn:") {
            self.topo.mesh_member(&h.node)?.ns.clone()
        } else {
            self.topo.node(&h.node)?.ns.clone()
        };
        let command = self.expand(&h.command)?;
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "sh", "-c", &command])
            .output()
            .context("running the host command")?;
        Ok((
            out.status.success(),
            json!({"node": h.node, "command": command, "exit": out.status.code(),
                   "output": String::from_utf8_lossy(&out.stdout).trim(),
                   "stderr": String::from_utf8_lossy(&out.stderr).trim()}),
        ))
    }

    /// Records what a node holds outside kuport, to compare after the agent has come and gone.
    fn snapshot_host(&mut self, s: &scenario::Snapshot) -> Result<(bool, Value)> {
        let listing = topology::foreign_listing(&self.topo.node(&s.node)?.ns)?;
        let lines = listing.lines().count();
        self.snapshots
            .insert((s.node.clone(), s.name.clone()), listing);
        Ok((
            true,
            json!({"node": s.node, "snapshot": s.name, "lines": lines}),
        ))
    }

    /// Compares what a node holds outside kuport with a snapshot: the step passes when nothing
    /// differs.
    fn compare_host(&self, s: &scenario::Snapshot) -> Result<(bool, Value)> {
        let before = self
            .snapshots
            .get(&(s.node.clone(), s.name.clone()))
            .with_context(|| format!("no snapshot {} of {}", s.name, s.node))?;
        let now = topology::foreign_listing(&self.topo.node(&s.node)?.ns)?;
        let diff = diff_lines(before, &now);
        Ok((
            diff.is_empty(),
            json!({"node": s.node, "snapshot": s.name, "lines": now.lines().count(), "differences": diff}),
        ))
    }

    /// Checks that a node holds nothing of kuport's (table, links, rules, routes).
    fn expect_host_clean(&self, n: &scenario::NodeRef) -> Result<(bool, Value)> {
        let left = topology::kuport_leftovers(&self.topo.node(&n.node)?.ns)?;
        Ok((
            left.is_empty(),
            json!({"node": n.node, "expected": [], "got": left}),
        ))
    }

    /// Runs kubectl against the lab's API server and checks its exit and output.
    async fn kubectl(&self, c: &scenario::CommandCheck) -> Result<(bool, Value)> {
        let kubectl = std::env::var("KUPORT_KUBECTL").unwrap_or_else(|_| "kubectl".to_owned());
        let kubeconfig = self.topo.kubeconfig.display().to_string();
        let mut command = vec![kubectl, "--kubeconfig".to_owned(), kubeconfig];
        command.extend(
            c.args
                .iter()
                .map(|a| self.expand(a))
                .collect::<Result<Vec<_>>>()?,
        );
        self.command_check(c, command).await
    }

    /// Runs `kuport <subcommand>` (status, preflight) against the lab's API server and checks its
    /// exit and output.
    async fn kuport_command(
        &self,
        subcommand: &str,
        c: &scenario::CommandCheck,
    ) -> Result<(bool, Value)> {
        let kubeconfig = self.topo.kubeconfig.display().to_string();
        let mut command = vec![
            self.topo.bin("kuport"),
            subcommand.to_owned(),
            "--kubeconfig".to_owned(),
            kubeconfig,
        ];
        command.extend(
            c.args
                .iter()
                .map(|a| self.expand(a))
                .collect::<Result<Vec<_>>>()?,
        );
        self.command_check(c, command).await
    }

    /// Runs `kuport cleanup` in a node's namespace; the step passes when it exits 0.
    fn cleanup(&self, n: &scenario::NodeRef) -> Result<(bool, Value)> {
        let ns = self.topo.node(&n.node)?.ns.clone();
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, &self.topo.bin("kuport"), "cleanup"])
            .output()
            .context("running kuport cleanup")?;
        Ok((
            out.status.success(),
            json!({"node": n.node, "exit": out.status.code(),
                   "stderr": String::from_utf8_lossy(&out.stderr).trim()}),
        ))
    }

    /// Restarts the agents one node at a time while probe loops run on their own thread (the
    /// restarts block this one), then reports what each loop sent and lost.
    fn rolling_restart(&mut self, r: &scenario::RollingRestart) -> Result<(bool, Value)> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};

        let nodes = r
            .nodes
            .clone()
            .unwrap_or_else(|| self.topo.nodes.iter().map(|n| n.name.clone()).collect());
        let loops = r
            .probes
            .iter()
            .map(|p| probe::prepare_loop(&self.topo, p, LOOP_ASK_TIMEOUT_MS))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<String> = r
            .probes
            .iter()
            .map(|p| {
                p.name
                    .clone()
                    .unwrap_or_else(|| format!("{}/{}", p.port, p.protocol.as_str()))
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let interval = Duration::from_secs_f64(1.0 / f64::from(r.rate));
        let started = Instant::now();
        let prober = {
            let stop = stop.clone();
            std::thread::spawn(move || -> Result<Vec<Vec<(u64, bool)>>> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the probe loops' runtime")?;
                Ok(rt.block_on(run_loops(loops, interval, stop, started)))
            })
        };
        let settle = Duration::from_secs_f64(r.settle_seconds.max(0.0));
        std::thread::sleep(settle);
        let mut restarts = Vec::new();
        let mut failure = None;
        for node in &nodes {
            let at = started.elapsed().as_millis();
            let result = self
                .stop_agent(node, r.signal)
                .and_then(|()| self.start_agent(node));
            restarts.push(json!({"node": node, "atMs": at, "ok": result.is_ok()}));
            if let Err(e) = result {
                failure = Some(format!("restarting the agent on {node}: {e:#}"));
                break;
            }
            std::thread::sleep(settle);
        }
        stop.store(true, Ordering::SeqCst);
        let results = prober
            .join()
            .map_err(|_| anyhow::anyhow!("the probe loop thread panicked"))??;
        let mut ok = failure.is_none();
        let mut report = Vec::new();
        let expected_min = (started.elapsed().as_secs_f64() * f64::from(r.rate) * 0.5) as u64;
        for (name, answers) in names.iter().zip(&results) {
            let sent = answers.len() as u64;
            let lost: Vec<u64> = answers.iter().filter(|a| !a.1).map(|a| a.0).collect();
            ok &= lost.is_empty() && sent >= expected_min;
            report.push(json!({
                "probe": name, "sent": sent, "lost": lost.len(),
                "lostAtMs": lost.iter().take(10).collect::<Vec<_>>(),
            }));
        }
        Ok((
            ok,
            json!({"rate": r.rate, "restarts": restarts, "loops": report,
                   "seconds": started.elapsed().as_secs_f64(), "error": failure}),
        ))
    }

    /// Replaces the [`PLACEHOLDERS`] (`${pod:ns/name}`, `${mesh:node}`, ...) in a host command.
    fn expand(&self, command: &str) -> Result<String> {
        let mut out = String::new();
        let mut rest = command;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find('}')
                .with_context(|| format!("unclosed ${{ in {command}"))?;
            let key = &rest[start + 2..start + end];
            let value = match key.split_once(':') {
                Some(("pod", pod)) => self
                    .topo
                    .pods
                    .get(pod)
                    .with_context(|| format!("no pod {pod}"))?
                    .ip
                    .to_string(),
                Some(("pod6", pod)) => self
                    .topo
                    .pods
                    .get(pod)
                    .with_context(|| format!("no pod {pod}"))?
                    .ip6
                    .to_string(),
                Some(("public6", node)) => self
                    .topo
                    .node(node)?
                    .public6
                    .with_context(|| format!("node {node} has no public address"))?
                    .to_string(),
                Some(("mesh", node)) => self.topo.node(node)?.mesh.to_string(),
                Some(("mesh6", node)) => self
                    .topo
                    .node(node)?
                    .mesh6
                    .with_context(|| {
                        format!("node {node} has no mesh IPv6 address (mesh: {{ipv6: true}})")
                    })?
                    .to_string(),
                Some(("public", node)) => self
                    .topo
                    .node(node)?
                    .public
                    .with_context(|| format!("node {node} has no public address"))?
                    .to_string(),
                // `wg` must run in the mount namespace of the member's wireguard-go, which
                // holds its private /run/wireguard.
                Some(("wg", member)) => format!(
                    "nsenter -t {} -m -n wg",
                    self.topo.mesh_member(member)?.wg_pid
                ),
                Some(("wgkey", member)) => self.topo.mesh_member(member)?.public_key.clone(),
                _ => bail!(
                    "unknown placeholder ${{{key}}} (use {})",
                    PLACEHOLDERS
                        .iter()
                        .map(|(name, arg)| format!("{name}:{arg}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            out.push_str(&value);
            rest = &rest[start + end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// Runs `command` in the API server's namespace until its exit status and output match
    /// `c`, or `c.timeoutSeconds` pass; reports the last run.
    async fn command_check(
        &self,
        c: &scenario::CommandCheck,
        command: Vec<String>,
    ) -> Result<(bool, Value)> {
        let wanted: Vec<String> = c
            .expect_output
            .iter()
            .map(|w| self.expand(w))
            .collect::<Result<_>>()?;
        let rejected: Vec<String> = c
            .reject_output
            .iter()
            .map(|w| self.expand(w))
            .collect::<Result<_>>()?;
        let started = Instant::now();
        let deadline = started + Duration::from_secs(c.timeout_seconds);
        loop {
            let out = tokio::process::Command::new("ip")
                .args(["netns", "exec", UL_NS])
                .args(&command)
                .output()
                .await
                .with_context(|| format!("running {}", command.join(" ")))?;
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let missing: Vec<&String> = wanted.iter().filter(|w| !stdout.contains(*w)).collect();
            let unwanted: Vec<&String> = rejected.iter().filter(|w| stdout.contains(*w)).collect();
            let exit = out.status.code();
            let ok = exit == Some(c.expect_exit) && missing.is_empty() && unwanted.is_empty();
            if ok || Instant::now() >= deadline {
                return Ok((
                    ok,
                    json!({"command": command.join(" "), "exit": exit, "expectExit": c.expect_exit,
                           "missing": missing, "unwanted": unwanted, "output": stdout.trim_end(),
                           "stderr": String::from_utf8_lossy(&out.stderr).trim(),
                           "seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0}),
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn parallel(&mut self, inner: &[Step]) -> Result<(bool, Value)> {
        if let Some(bad) = inner.iter().find(|s| !matches!(s, Step::Probe(_))) {
            bail!("parallel runs probes only, not {}", bad.kind());
        }
        let probes: Vec<&scenario::Probe> = inner
            .iter()
            .filter_map(|s| match s {
                Step::Probe(p) => Some(p),
                _ => None,
            })
            .collect();
        let topo = &self.topo;
        let futures = probes.into_iter().enumerate().map(|(i, p)| async move {
            let (ok, detail) = probe::run(topo, p).await;
            StepReport {
                kind: "probe".into(),
                name: p.name.clone().unwrap_or_else(|| format!("probe-{}", i + 1)),
                ok,
                detail,
            }
        });
        let reports = futures_util::future::join_all(futures).await;
        let ok = reports.iter().all(|r| r.ok);
        Ok((
            ok,
            json!({"steps": reports.iter().map(|r| json!({"kind": r.kind, "name": r.name, "ok": r.ok, "detail": r.detail})).collect::<Vec<_>>()}),
        ))
    }

    fn object_ref(spec: &str) -> Result<(String, String)> {
        let (ns, name) = spec
            .split_once('/')
            .with_context(|| format!("{spec}: give namespace/name"))?;
        Ok((ns.to_string(), name.to_string()))
    }

    async fn wait(&self, w: &scenario::Wait) -> Result<(bool, Value)> {
        let (kind, ns, name) = match (&w.portmap, &w.portmapclass) {
            (Some(pm), None) => {
                let (ns, name) = Self::object_ref(pm)?;
                ("PortMap", Some(ns), name)
            }
            (None, Some(class)) => ("PortMapClass", None, class.clone()),
            _ => bail!("wait: give exactly one of portmap and portmapclass"),
        };
        let deadline = Instant::now() + Duration::from_secs(w.timeout_seconds);
        let started = Instant::now();
        let mut got = Value::Null;
        loop {
            if let Ok(Some(obj)) = self.cluster()?.get(kind, ns.as_deref(), &name).await {
                let c = condition(&obj, &w.condition);
                got = json!(
                    c.as_ref()
                        .map(|(s, r, m)| json!({"status": s, "reason": r, "message": m}))
                );
                if let Some((status, reason, _)) = c
                    && status == w.status
                    && w.reason.as_ref().is_none_or(|r| *r == reason)
                {
                    return Ok((
                        true,
                        json!({"condition": w.condition, "got": got,
                        "seconds": started.elapsed().as_secs_f64()}),
                    ));
                }
            }
            if Instant::now() >= deadline {
                return Ok((
                    false,
                    json!({"expected": {"condition": w.condition, "status": w.status, "reason": w.reason}, "got": got}),
                ));
            }
            tokio::time::sleep(probe::POLL).await;
        }
    }

    async fn expect_status(&self, e: &scenario::ExpectStatus) -> Result<(bool, Value)> {
        let (ns, name) = Self::object_ref(&e.portmap)?;
        let expected = json!({
            "accepted": e.accepted, "programmed": e.programmed,
            "endpointNode": e.endpoint_node, "published": e.published,
        });
        let read = || async {
            let obj = self.cluster()?.get("PortMap", Some(&ns), &name).await?;
            let got = match &obj {
                Some(obj) => status_summary(obj),
                None => json!(null),
            };
            let matches = obj.is_some()
                && ["accepted", "programmed", "endpointNode", "published"]
                    .iter()
                    .all(|k| expected[k].is_null() || expected[k] == got[k]);
            Ok((matches, got))
        };
        let timing = StatusTiming {
            converge: Duration::from_secs(e.timeout_seconds),
            hold: Duration::from_secs(e.hold_seconds),
            poll: probe::POLL,
        };
        let (ok, mut detail) = converge_and_hold(read, timing).await?;
        detail["expected"] = expected;
        Ok((ok, detail))
    }

    fn expect_host(&self, h: &scenario::ExpectHost) -> Result<(bool, Value)> {
        let ns = &self.topo.node(&h.node)?.ns;
        let Some(mapping) = &h.nft_counter_non_zero else {
            bail!("expectHost: give nftCounterNonZero");
        };
        let table = sys::exec(ns, "nft", &["list", "table", "ip", kuport_core::ir::TABLE])?;
        let packets = counter_packets(&table, &format!("pre/{mapping}"));
        Ok((
            packets.is_some_and(|p| p > 0),
            json!({"node": h.node, "counter": format!("pre/{mapping}"), "packets": packets}),
        ))
    }
}

/// A Node's `spec.podCIDRs`: its IPv4 pod CIDR, and its IPv6 pod prefix too when the scenario
/// lists a pod in an IPv6 slice (a dual-stack cluster; an IPv4 one is written as before).
fn node_pod_cidrs<'a>(topo: &Topology, node: &'a topology::NodeInfo) -> Vec<&'a str> {
    let mut cidrs = vec![node.pod_cidr.as_str()];
    if topo.uses_ipv6() {
        cidrs.push(node.pod_cidr6.as_str());
    }
    cidrs
}

/// The placeholders [`Runner::expand`] replaces in `hostExec`, `kubectl`, `kuportStatus` and
/// `kuportPreflight` commands, with what each takes; `docs/lab.md` documents every one (a unit test checks).
pub const PLACEHOLDERS: &[(&str, &str)] = &[
    ("pod", "<ns>/<name>"),
    ("mesh", "<node>"),
    ("public", "<node>"),
    ("pod6", "<ns>/<name>"),
    ("public6", "<node>"),
    ("mesh6", "<node>"),
    ("wg", "<member>"),
    ("wgkey", "<member>"),
];

/// How long a status check waits for a match, how long the match must then last, and how often
/// it reads.
#[derive(Clone, Copy)]
struct StatusTiming {
    converge: Duration,
    hold: Duration,
    poll: Duration,
}

/// Reads until a read matches (within `converge`), then keeps reading for `hold`: passes only if
/// every read in the hold matched. The detail gives the last read (`got`) and, when the match
/// broke, after how long (`brokeAfterMillis`).
async fn converge_and_hold<F, Fut>(mut read: F, timing: StatusTiming) -> Result<(bool, Value)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(bool, Value)>>,
{
    let deadline = Instant::now() + timing.converge;
    let got = loop {
        let (matches, got) = read().await?;
        if matches {
            break got;
        }
        if Instant::now() >= deadline {
            return Ok((false, json!({"got": got})));
        }
        tokio::time::sleep(timing.poll).await;
    };
    let held_from = Instant::now();
    let mut last = got;
    while held_from.elapsed() < timing.hold {
        tokio::time::sleep(timing.poll).await;
        let (matches, got) = read().await?;
        if !matches {
            let broke = u64::try_from(held_from.elapsed().as_millis()).unwrap_or(u64::MAX);
            return Ok((false, json!({"got": got, "brokeAfterMillis": broke})));
        }
        last = got;
    }
    Ok((true, json!({"got": last})))
}

/// How long one ask of a probe loop waits for its answer.
const LOOP_ASK_TIMEOUT_MS: u64 = 1000;

/// Runs every loop until `stop`: one ask per `interval` per loop, each on its own task, so a
/// slow answer never delays the next ask. Returns, per loop, (milliseconds since `started`,
/// answered) for every ask.
async fn run_loops(
    loops: Vec<probe::Looped>,
    interval: Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    started: Instant,
) -> Vec<Vec<(u64, bool)>> {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let loops: Vec<std::sync::Arc<probe::Looped>> =
        loops.into_iter().map(std::sync::Arc::new).collect();
    let mut asks: Vec<Vec<(u64, tokio::task::JoinHandle<bool>)>> =
        (0..loops.len()).map(|_| Vec::new()).collect();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        ticker.tick().await;
        let at = started.elapsed().as_millis() as u64;
        for (i, l) in loops.iter().enumerate() {
            let l = l.clone();
            asks[i].push((at, tokio::spawn(async move { probe::ask_looped(&l).await })));
        }
    }
    let mut results = Vec::new();
    for per_loop in asks {
        let mut answers = Vec::new();
        for (at, task) in per_loop {
            answers.push((at, task.await.unwrap_or(false)));
        }
        results.push(answers);
    }
    results
}

/// Accepted and Programmed reasons, the endpoint node and the published rows of a PortMap.
fn status_summary(obj: &Value) -> Value {
    let published: Vec<String> = obj
        .pointer("/status/published")
        .and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    format!(
                        "{}/{}",
                        r.get("node").and_then(Value::as_str).unwrap_or(""),
                        r.get("interface").and_then(Value::as_str).unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "accepted": condition(obj, "Accepted").map(|c| c.1),
        "programmed": condition(obj, "Programmed").map(|c| c.1),
        "programmedMessage": condition(obj, "Programmed").map(|c| c.2),
        "endpointNode": obj.pointer("/status/endpoint/node"),
        "published": published,
    })
}

/// The packet count of a named counter in `nft list table` output.
fn counter_packets(listing: &str, name: &str) -> Option<u64> {
    let mut lines = listing.lines();
    while let Some(line) = lines.next() {
        if line.trim() == format!("counter {name} {{") {
            let next = lines.next()?;
            let mut words = next.split_whitespace();
            while let Some(w) = words.next() {
                if w == "packets" {
                    return words.next()?.parse().ok();
                }
            }
        }
    }
    None
}

/// Lines only in `before` (prefixed `-`) or only in `now` (`+`), at most 20.
fn diff_lines(before: &str, now: &str) -> Vec<String> {
    let a: Vec<&str> = before.lines().collect();
    let b: Vec<&str> = now.lines().collect();
    let mut out: Vec<String> = a
        .iter()
        .filter(|l| !b.contains(l))
        .map(|l| format!("-{l}"))
        .collect();
    out.extend(b.iter().filter(|l| !a.contains(l)).map(|l| format!("+{l}")));
    out.truncate(20);
    out
}

/// The detail of a step that signalled an agent: the node and the signal's name.
fn signalled(a: &scenario::AgentSignal) -> Value {
    json!({"node": a.node, "signal": format!("{:?}", a.signal).to_uppercase()})
}

/// The outage: the API server's namespace resets every connection to its port, so agents see
/// their watches fail and their reconnects refused, while the store keeps every object.
fn api_outage(on: bool) -> Result<()> {
    let port = API_ADDR.rsplit(':').next().unwrap_or("6443");
    if on {
        let table = format!(
            "table inet kuport-lab-outage {{\n chain in {{ type filter hook input priority 0; tcp dport {port} reject with tcp reset; }}\n chain out {{ type filter hook output priority 0; tcp sport {port} reject with tcp reset; }}\n}}\n"
        );
        sys::run_with_input("ip", &["netns", "exec", UL_NS, "nft", "-f", "-"], &table)?;
    } else {
        sys::exec(
            UL_NS,
            "nft",
            &["delete", "table", "inet", "kuport-lab-outage"],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs [`converge_and_hold`] over a scripted sequence of reads (the last one repeats);
    /// returns the verdict, the detail and how many reads it made.
    fn scripted(reads: &[bool], converge_ms: u64, hold_ms: u64) -> (bool, Value, usize) {
        let count = std::cell::Cell::new(0usize);
        let read = || {
            let n = count.get();
            count.set(n + 1);
            let matches = reads[n.min(reads.len() - 1)];
            async move { Ok((matches, json!(n))) }
        };
        let timing = StatusTiming {
            converge: Duration::from_millis(converge_ms),
            hold: Duration::from_millis(hold_ms),
            poll: Duration::from_millis(2),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let (ok, detail) = rt.block_on(converge_and_hold(read, timing)).expect("reads");
        (ok, detail, count.get())
    }

    #[test]
    fn every_placeholder_is_documented() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/lab.md"),
        )
        .expect("docs/lab.md");
        for (name, arg) in PLACEHOLDERS {
            let written = format!("${{{name}:{arg}}}");
            assert!(
                doc.contains(&written),
                "docs/lab.md does not document {written}"
            );
        }
    }

    #[test]
    fn a_status_held_passes_only_if_every_read_in_the_hold_matches() {
        let (ok, detail, _) = scripted(&[false, true], 1_000, 30);
        assert!(ok, "{detail}");
        let (ok, detail, _) = scripted(&[false, true, true, false], 1_000, 5_000);
        assert!(!ok, "a match that breaks fails the hold");
        assert_eq!(detail["got"], json!(3), "the read that broke it");
        assert!(detail["brokeAfterMillis"].is_u64(), "{detail}");
        let (ok, detail, _) = scripted(&[false], 20, 0);
        assert!(!ok);
        assert!(detail.get("brokeAfterMillis").is_none(), "{detail}");
        let (ok, _, reads) = scripted(&[true, false], 1_000, 0);
        assert!(ok, "without a hold one match is enough");
        assert_eq!(reads, 1);
    }

    #[test]
    fn passes_are_summed_over_results_and_absent_when_not_exported() {
        let text = "HTTP/1.0 200 OK\r\n\r\n# TYPE kuport_passes counter\nkuport_passes_total{result=\"failed\"} 2\nkuport_passes_total{result=\"ok\"} 7\nkuport_pass_failures_total{stage=\"links\"} 2\n";
        assert_eq!(passes_in(text), Some(9));
        assert_eq!(passes_in("# TYPE kuport_passes counter\n"), None);
    }

    #[test]
    fn counters_are_read_by_name_from_the_listing() {
        let listing = "table ip kuport {\n\tcounter post/games/gs {\n\t\tpackets 0 bytes 0\n\t}\n\n\tcounter pre/games/gs {\n\t\tpackets 7 bytes 420\n\t}\n}\n";
        assert_eq!(counter_packets(listing, "pre/games/gs"), Some(7));
        assert_eq!(counter_packets(listing, "post/games/gs"), Some(0));
        assert_eq!(counter_packets(listing, "pre/games/other"), None);
    }

    #[test]
    fn a_diff_names_lines_gone_and_lines_new() {
        assert!(diff_lines("a\nb\n", "a\nb\n").is_empty());
        assert_eq!(diff_lines("a\nb\n", "a\nc\n"), vec!["-b", "+c"]);
    }
}
