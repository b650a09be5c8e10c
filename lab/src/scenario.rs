//! The scenario file format (`lab/scenarios/*.yaml`), a public contract: other tools write these
//! files, so fields are only ever added. Unknown fields are refused so a typo never silently
//! turns a check off.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub cni: Cni,
    pub nodes: Vec<NodeSpec>,
    #[serde(default)]
    pub vpn_clients: Vec<String>,
    #[serde(default)]
    pub mesh: MeshSpec,
    #[serde(default)]
    pub host: HostSpec,
    #[serde(default)]
    pub agent_args: Vec<String>,
    /// Extension: the agents run as the Pods of a DaemonSet `kuport-system/kuport-agent` the lab
    /// records in the API server (one Pod per node, owned by it), and know their Pod
    /// (`--pod-name`, `--pod-namespace`), as in a cluster: a stop keeps the datapath unless the
    /// DaemonSet was deleted.
    #[serde(default)]
    pub daemon_set: bool,
    /// Kubernetes YAML applied in order before the pods start.
    #[serde(default)]
    pub objects: String,
    #[serde(default)]
    pub pods: Vec<PodSpec>,
    pub steps: Vec<Step>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cni {
    CiliumTunnel,
    CiliumNative,
    Kindnet,
}

impl Cni {
    pub fn is_cilium(self) -> bool {
        matches!(self, Cni::CiliumTunnel | Cni::CiliumNative)
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    #[serde(default)]
    pub public: bool,
    /// The families of the InternalIPs its Node lists (its mesh addresses). Empty, the default:
    /// every family its `wt0` has. `[IPv6]` is a node whose kubelet has `--node-ip` set to its
    /// mesh IPv6 address only (needs `mesh: {ipv6: true}`).
    #[serde(default)]
    pub internal_ip_families: Vec<IpFamily>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshSpec {
    /// The mesh table (7120) also routes `default dev wt0`, as a netbird exit node does.
    #[serde(default)]
    pub exit_node: bool,
    /// netbird's nftables chains: a mangle chain at -150 that marks packets arriving on `wt0`
    /// for the node's own addresses with 0x1bd00, and a forward filter dropping forwarded `wt0`
    /// packets whose mark is not exactly that (pod-CIDR traffic excepted).
    #[serde(default)]
    pub netbird: bool,
    /// Each node's `wt0` also gets an IPv6 address, fd00:100:64::i/64 (its IPv4 one's last
    /// octets), allowed by its peers and listed as the Node's second InternalIP, as kubelet's
    /// `--node-ip` of both families does. The links still run over the mesh's IPv4.
    #[serde(default)]
    pub ipv6: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostSpec {
    #[serde(default)]
    pub rp_filter: RpFilter,
    /// A host firewall on every node.
    #[serde(default)]
    pub firewall: Option<Firewall>,
    /// Ports the firewall opens besides the mesh port, as `udp/3000` or `tcp/27015-27020`.
    #[serde(default)]
    pub open: Vec<String>,
    /// Host processes listening in a node's own namespace (on every address) before the
    /// objects are created, as sshd or a hostNetwork server would.
    #[serde(default)]
    pub listeners: Vec<HostListener>,
}

/// A process listening on a port of a node's own addresses (a TCP listener or a bound UDP
/// socket on `0.0.0.0`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostListener {
    pub node: String,
    pub protocol: Protocol,
    pub port: u16,
    /// Bind this address alone (a daemon with one listen address) instead of every address of
    /// both families; `${...}` placeholders are expanded, as in `hostExec`.
    #[serde(default)]
    pub address: Option<String>,
}

/// Host firewalls the lab can emulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Firewall {
    /// Talos's ingress firewall in block mode: a filter chain in prerouting at -110 that drops
    /// new connections to the node's own addresses unless a rule opens the port.
    Talos,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RpFilter {
    #[default]
    Loose,
    Strict,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// The Service whose EndpointSlice lists this pod; none: the pod is no endpoint.
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    pub ports: Vec<PodPort>,
    /// Extension: the IP families of the Service's EndpointSlices listing this pod, in the
    /// Service's order (`[IPv4]`, `[IPv6]`, `[IPv4, IPv6]` or `[IPv6, IPv4]`; default `[IPv4]`).
    /// Every pod has an address of each family; this picks the slices it is listed in. Pods of
    /// one Service must agree.
    #[serde(default = "ipv4_only")]
    pub ip_families: Vec<IpFamily>,
}

impl PodSpec {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod is listed in its Service's slices of `family`.
    pub fn has_family(&self, family: IpFamily) -> bool {
        self.ip_families.contains(&family)
    }
}

/// An IP family, written as the API writes it (`IPv4`, `IPv6`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub enum IpFamily {
    #[default]
    IPv4,
    IPv6,
}

impl IpFamily {
    /// The API's spelling (a Service's `ipFamilies`, a slice's `addressType`).
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::IPv4 => "IPv4",
            IpFamily::IPv6 => "IPv6",
        }
    }
}

fn ipv4_only() -> Vec<IpFamily> {
    vec![IpFamily::IPv4]
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodPort {
    #[serde(default)]
    pub name: Option<String>,
    pub protocol: Protocol,
    pub port: u16,
    /// Extension: the responder also listens on every port up to this one (a port range).
    #[serde(default)]
    pub end_port: Option<u16>,
}

/// TCP or UDP, written `TCP`/`UDP` as in the API.
pub use kuport_core::api::Protocol;

/// One step; the YAML key names the kind.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Step {
    Wait(Wait),
    Probe(Probe),
    Parallel(Vec<Step>),
    MovePod(MovePod),
    SetReady(SetReady),
    SetNodeReady(SetNodeReady),
    Apply(String),
    Delete(Delete),
    RestartAgent(AgentSignal),
    StopAgent(AgentSignal),
    StartAgent(NodeRef),
    StopApiServer(Empty),
    StartApiServer(Empty),
    RestartMesh(NodeRef),
    StopResponder(Responder),
    StartResponder(Responder),
    HostExec(HostExec),
    SnapshotHost(Snapshot),
    CompareHost(Snapshot),
    ExpectHostClean(NodeRef),
    Sleep(Sleep),
    ExpectStatus(ExpectStatus),
    ExpectHost(ExpectHost),
    /// Extension: kubectl against the lab's API server, checking its exit status and output.
    Kubectl(CommandCheck),
    /// Extension: `kuport status` against the lab's API server, checked the same way.
    KuportStatus(CommandCheck),
    /// Extension: `kuport preflight` against the lab's API server, checked the same way.
    KuportPreflight(CommandCheck),
    RollingRestart(RollingRestart),
    Cleanup(NodeRef),
    /// Extension: starts a host listener in a node's namespace mid-scenario.
    HostListener(HostListener),
    /// Extension: stops a host listener the scenario started (a daemon stopping or restarting).
    StopHostListener(HostListener),
    /// Extension: waits until every running agent is idle.
    Settle(Settle),
}

impl Step {
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Wait(_) => "wait",
            Step::Probe(_) => "probe",
            Step::Parallel(_) => "parallel",
            Step::MovePod(_) => "movePod",
            Step::SetReady(_) => "setReady",
            Step::SetNodeReady(_) => "setNodeReady",
            Step::Apply(_) => "apply",
            Step::Delete(_) => "delete",
            Step::RestartAgent(_) => "restartAgent",
            Step::StopAgent(_) => "stopAgent",
            Step::StartAgent(_) => "startAgent",
            Step::StopApiServer(_) => "stopApiServer",
            Step::StartApiServer(_) => "startApiServer",
            Step::RestartMesh(_) => "restartMesh",
            Step::StopResponder(_) => "stopResponder",
            Step::StartResponder(_) => "startResponder",
            Step::HostExec(_) => "hostExec",
            Step::SnapshotHost(_) => "snapshotHost",
            Step::CompareHost(_) => "compareHost",
            Step::ExpectHostClean(_) => "expectHostClean",
            Step::Sleep(_) => "sleep",
            Step::ExpectStatus(_) => "expectStatus",
            Step::ExpectHost(_) => "expectHost",
            Step::Kubectl(_) => "kubectl",
            Step::KuportStatus(_) => "kuportStatus",
            Step::KuportPreflight(_) => "kuportPreflight",
            Step::RollingRestart(_) => "rollingRestart",
            Step::Cleanup(_) => "cleanup",
            Step::HostListener(_) => "hostListener",
            Step::StopHostListener(_) => "stopHostListener",
            Step::Settle(_) => "settle",
        }
    }

    /// The name given in the file, if any.
    pub fn given_name(&self) -> Option<&str> {
        match self {
            Step::Probe(p) => p.name.as_deref(),
            Step::Wait(w) => w.name.as_deref(),
            Step::ExpectStatus(e) => e.name.as_deref(),
            Step::HostExec(h) => h.name.as_deref(),
            Step::Kubectl(c) | Step::KuportStatus(c) | Step::KuportPreflight(c) => {
                c.name.as_deref()
            }
            Step::RollingRestart(r) => r.name.as_deref(),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Wait {
    #[serde(default)]
    pub name: Option<String>,
    /// `namespace/name` of a PortMap.
    #[serde(default)]
    pub portmap: Option<String>,
    /// Extension: a PortMapClass by name.
    #[serde(default)]
    pub portmapclass: Option<String>,
    pub condition: String,
    pub status: String,
    /// Extension: also require this reason.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default = "default_wait")]
    pub timeout_seconds: u64,
}

fn default_wait() -> u64 {
    30
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Probe {
    #[serde(default)]
    pub name: Option<String>,
    /// `internet`, `vpn:<client>`, or (extensions) `pod:<namespace>/<name>` and `node:<name>`
    /// (the node's own namespace, its mesh address as the client's).
    pub from: String,
    pub to: Target,
    pub protocol: Protocol,
    pub port: u16,
    pub expect: Expect,
    /// UDP payload bytes.
    #[serde(default)]
    pub size: Option<usize>,
    #[serde(default = "yes")]
    pub dont_fragment: bool,
    /// TCP: bytes to send and receive back.
    #[serde(default)]
    pub bytes: Option<usize>,
    #[serde(default)]
    pub pod_sees: PodSees,
    /// Extension, with `expect: fragmentationNeeded`: the MTU the ICMP must name.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Extension: the pod (`namespace/name`) whose responder must be the one answering.
    #[serde(default)]
    pub answered_by: Option<String>,
    /// Extension: the client's source port (an ephemeral one when absent). Probes giving the same
    /// port from the same client are one flow to conntrack, as a client sending from one socket is.
    #[serde(default)]
    pub source_port: Option<u16>,
    /// Extension: the expectation must be met within this many seconds of the step's start:
    /// short asks (250 ms each) are repeated until one matches or the time is up.
    #[serde(default)]
    pub within_seconds: Option<f64>,
    /// Extension: the expectation must hold this long: asks are repeated over the period (each
    /// waiting its usual time) and every one must match.
    #[serde(default)]
    pub hold_seconds: Option<f64>,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// The node dialed (with `interface`).
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub interface: String,
    /// Extension: dial a pod's own address instead (`<namespace>/<name>`), as pod-to-pod
    /// traffic does; `node` and `interface` are then left out.
    #[serde(default)]
    pub pod: Option<String>,
    /// Extension: the address family dialed (`IPv4`, the default, or `IPv6`): the node's
    /// interface's (or the pod's) IPv6 address, from the client's IPv6 address. The mesh is
    /// IPv4 only, so `wt0` and VPN clients take `IPv4`.
    #[serde(default)]
    pub family: IpFamily,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Expect {
    Reply,
    Refused,
    Timeout,
    /// Extension: no answer of either kind: a timeout, or a refusal from the address dialed. For
    /// a path that must not deliver, where whether the node refuses or stays silent is not the
    /// point (a fixed agent may refuse where a broken one black-holes).
    NoAnswer,
    /// Extension: an ICMP "fragmentation needed" came back (a DF datagram too big for a link).
    FragmentationNeeded,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PodSees {
    #[default]
    Client,
    Other,
    /// Extension: whatever the pod saw is recorded (`detail.podSaw`), not judged; the reply
    /// must still come from the address and port dialed. For clients whose source the datapath
    /// translates (a node dialing its own address, a pod reaching its own node's pod).
    Any,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MovePod {
    pub pod: String,
    pub to: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetReady {
    pub pod: String,
    pub ready: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetNodeReady {
    pub node: String,
    pub ready: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Delete {
    pub kind: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub name: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum SignalName {
    #[default]
    Term,
    Kill,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSignal {
    pub node: String,
    #[serde(default)]
    pub signal: SignalName,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRef {
    pub node: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Responder {
    pub pod: String,
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostExec {
    #[serde(default)]
    pub name: Option<String>,
    pub node: String,
    /// A shell command; `${pod:<namespace>/<name>}` is replaced by that pod's address,
    /// `${mesh:<node>}` by that node's mesh address, `${wg:<member>}` by the command running
    /// `wg` beside that mesh member's `wireguard-go` and `${wgkey:<member>}` by its public key.
    pub command: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Snapshot {
    pub node: String,
    pub name: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sleep {
    pub seconds: f64,
}

/// Waits until every running agent is idle: each has finished at least one pass and none has
/// started another for `quietMillis`. Use it before a negative control breaks the datapath, so
/// a pass still owed (the verifying pass a link creation triggers) cannot repair the damage
/// mid-probe.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Settle {
    /// How long no agent may start a pass (500 ms: ten debounce intervals).
    #[serde(default)]
    pub quiet_millis: Option<u64>,
    /// Give up after this long (10 s).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpectStatus {
    #[serde(default)]
    pub name: Option<String>,
    pub portmap: String,
    #[serde(default)]
    pub accepted: Option<String>,
    #[serde(default)]
    pub programmed: Option<String>,
    #[serde(default)]
    pub endpoint_node: Option<String>,
    #[serde(default)]
    pub published: Option<Vec<String>>,
    /// Extension: how long to keep re-reading before failing (status converges).
    #[serde(default = "default_status_wait")]
    pub timeout_seconds: u64,
    /// Extension: once it matches, the status must keep matching for this long (re-read every
    /// poll); a status that flaps or turns fails the step. 0: matching once is enough.
    #[serde(default)]
    pub hold_seconds: u64,
}

fn default_status_wait() -> u64 {
    15
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpectHost {
    pub node: String,
    /// `namespace/name` of a PortMap whose DNAT counter must have counted a packet.
    #[serde(default)]
    pub nft_counter_non_zero: Option<String>,
}

/// A command run on the lab host with the lab's kubeconfig, re-run until its exit status and
/// output match or the timeout passes (statuses and summaries converge). `args` and
/// `expectOutput` may use `${pod:<ns>/<name>}`, `${mesh:<node>}` and `${public:<node>}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandCheck {
    #[serde(default)]
    pub name: Option<String>,
    /// Arguments after the command (`kubectl`, `kuport status` or `kuport preflight`).
    #[serde(default)]
    pub args: Vec<String>,
    /// The exit status wanted.
    #[serde(default)]
    pub expect_exit: i32,
    /// Strings standard output must contain, each.
    #[serde(default)]
    pub expect_output: Vec<String>,
    /// Strings standard output must not contain, any (pair it with `expectOutput` naming
    /// something that is there, so an empty answer does not pass).
    #[serde(default)]
    pub reject_output: Vec<String>,
    #[serde(default = "default_status_wait")]
    pub timeout_seconds: u64,
}

/// Extension: restarts every node's agent one at a time (SIGTERM, then a new agent, then
/// `settleSeconds`) while each probe runs in a loop at `rate` per second from before the first
/// stop until after the last start. Passes when no probe of any loop went unanswered.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollingRestart {
    #[serde(default)]
    pub name: Option<String>,
    /// The nodes in restart order; default every node in the scenario's order.
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
    /// Probes per second per loop.
    #[serde(default = "default_rate")]
    pub rate: u32,
    /// How long after starting a node's new agent the next node is restarted (and how long
    /// the loops run before the first stop and after the last start).
    #[serde(default = "default_settle")]
    pub settle_seconds: f64,
    #[serde(default)]
    pub signal: SignalName,
    /// The probes to loop; each must expect a reply.
    pub probes: Vec<Probe>,
}

fn default_rate() -> u32 {
    10
}

fn default_settle() -> f64 {
    3.0
}

/// Reads and checks one scenario file: the error names the file and the field.
pub fn load(path: &Path) -> Result<Scenario> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let scenario: Scenario = serde_saphyr::from_str(&text)
        .with_context(|| format!("{}: not a lab scenario", path.display()))?;
    validate(&scenario).with_context(|| format!("{}", path.display()))?;
    Ok(scenario)
}

fn validate(s: &Scenario) -> Result<()> {
    if s.nodes.is_empty() {
        bail!("scenario {}: no nodes", s.name);
    }
    if s.nodes.len() > 50 || s.vpn_clients.len() > 50 {
        bail!("scenario {}: at most 50 nodes and 50 VPN clients", s.name);
    }
    let known = |n: &str| s.nodes.iter().any(|x| x.name == n);
    for pod in &s.pods {
        if !known(&pod.node) {
            bail!("pod {}: node {} is not in nodes", pod.key(), pod.node);
        }
    }
    for (i, n) in s.nodes.iter().enumerate() {
        if s.nodes[..i].iter().any(|m| m.name == n.name) {
            bail!("node {} listed twice", n.name);
        }
        if n.internal_ip_families.contains(&IpFamily::IPv6) && !s.mesh.ipv6 {
            bail!(
                "node {}: internalIpFamilies lists IPv6, but the mesh is IPv4 only (mesh: {{ipv6: true}} gives wt0 an IPv6 address)",
                n.name
            );
        }
    }
    check_pod_families(s)?;
    let mut tcp_source_ports = std::collections::BTreeSet::new();
    for probe in s.steps.iter().flat_map(probes_of) {
        check_periods(probe)?;
        check_probe_family(probe, s.mesh.ipv6)?;
        let Some(port) = probe.source_port else {
            continue;
        };
        if probe.protocol == Protocol::Tcp && !tcp_source_ports.insert(port) {
            bail!(
                "probe to port {}: TCP sourcePort {port} is used twice (a closed TCP connection's port stays taken for a while)",
                probe.port
            );
        }
    }
    for step in &s.steps {
        if let Step::RollingRestart(r) = step {
            if r.probes.is_empty() || r.rate == 0 || r.rate > 100 {
                bail!("rollingRestart: give at least one probe and a rate of 1 to 100 per second");
            }
            if let Some(bad) = r
                .probes
                .iter()
                .find(|p| p.within_seconds.is_some() || p.hold_seconds.is_some())
            {
                bail!(
                    "rollingRestart: probe to port {} takes no withinSeconds or holdSeconds (a loop asks once per tick)",
                    bad.port
                );
            }
            if let Some(bad) = r.probes.iter().find(|p| p.expect != Expect::Reply) {
                bail!(
                    "rollingRestart: probe to port {} must expect a reply (a loop counts answers)",
                    bad.port
                );
            }
            for node in r.nodes.iter().flatten() {
                if !known(node) {
                    bail!("rollingRestart: node {node} is not in nodes");
                }
            }
        }
    }
    Ok(())
}

/// A probe's `withinSeconds` and `holdSeconds`: one at most, each a positive time of at most
/// five minutes, and neither in a rolling restart's loops (which ask once per tick).
fn check_periods(p: &Probe) -> Result<()> {
    match (p.within_seconds, p.hold_seconds) {
        (Some(_), Some(_)) => bail!(
            "probe to port {}: give withinSeconds or holdSeconds, not both",
            p.port
        ),
        (Some(t), None) | (None, Some(t)) if !(t > 0.0 && t <= 300.0) => bail!(
            "probe to port {}: withinSeconds and holdSeconds take 0 < seconds <= 300, not {t}",
            p.port
        ),
        _ => Ok(()),
    }
}

/// A pod's `ipFamilies`: one or two distinct families, and the same list for every pod of one
/// Service (a Service has one `ipFamilies`).
fn check_pod_families(s: &Scenario) -> Result<()> {
    for (i, pod) in s.pods.iter().enumerate() {
        let f = &pod.ip_families;
        if f.is_empty() || f.len() > 2 || (f.len() == 2 && f[0] == f[1]) {
            bail!(
                "pod {}: ipFamilies takes [IPv4], [IPv6], [IPv4, IPv6] or [IPv6, IPv4], not {f:?}",
                pod.key()
            );
        }
        let same_service = |o: &&PodSpec| {
            o.namespace == pod.namespace && o.service.is_some() && o.service == pod.service
        };
        if let Some(other) = s.pods[..i]
            .iter()
            .filter(same_service)
            .find(|o| o.ip_families != *f)
        {
            bail!(
                "pods {} and {} of Service {}: ipFamilies {:?} and {:?} differ (a Service has one list)",
                other.key(),
                pod.key(),
                pod.service.as_deref().unwrap_or_default(),
                other.ip_families,
                f
            );
        }
    }
    Ok(())
}

/// An IPv6 probe dials a public interface or a pod, or `wt0` on an IPv6 mesh: the mesh is
/// otherwise IPv4. A VPN client reaches the cluster only over the mesh, so in IPv6 it dials
/// `wt0` on an IPv6 mesh.
fn check_probe_family(p: &Probe, mesh_ipv6: bool) -> Result<()> {
    if p.to.family != IpFamily::IPv6 {
        return Ok(());
    }
    if p.from.starts_with("vpn:") && (!mesh_ipv6 || p.to.pod.is_some() || p.to.interface != "wt0") {
        bail!(
            "probe to port {} from {}: family IPv6: a VPN client reaches the cluster over the mesh only, so it dials wt0 on an IPv6 mesh (mesh: {{ipv6: true}})",
            p.port,
            p.from
        );
    }
    if p.to.pod.is_none() && p.to.interface == "wt0" && !mesh_ipv6 {
        bail!(
            "probe to port {}: family IPv6 on wt0: the mesh is IPv4 only (mesh: {{ipv6: true}} gives wt0 an IPv6 address)",
            p.port
        );
    }
    Ok(())
}

/// The probes of a step, those of `parallel` and `rollingRestart` included.
fn probes_of(step: &Step) -> Vec<&Probe> {
    match step {
        Step::Probe(p) => vec![p],
        Step::Parallel(steps) => steps.iter().flat_map(probes_of).collect(),
        Step::RollingRestart(r) => r.probes.iter().collect(),
        _ => Vec::new(),
    }
}

/// Every `*.yaml` in a directory, sorted by file name.
pub fn files_in(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_committed_scenario_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let files = files_in(&dir).expect("list scenarios");
        assert!(files.len() >= 10, "committed scenarios: {files:?}");
        let mut names = Vec::new();
        for f in files {
            let s = load(&f).unwrap_or_else(|e| panic!("{}: {e:#}", f.display()));
            assert!(!s.steps.is_empty(), "{} has no steps", s.name);
            assert!(!names.contains(&s.name), "two scenarios named {}", s.name);
            names.push(s.name);
        }
    }

    #[test]
    fn the_contract_example_parses_with_every_step_kind() {
        let yaml = r#"
name: example
cni: cilium-tunnel
nodes: [{name: edge-a, public: true}, {name: worker-b}]
vpnClients: [player-1]
mesh: {exitNode: false}
host: {rpFilter: loose}
agentArgs: ["--resync", "10s"]
objects: ""
pods:
  - {namespace: games, name: game-0, node: worker-b, service: gameserver,
     ports: [{name: game, protocol: UDP, port: 3000}]}
steps:
  - wait: {portmap: games/gameserver, condition: Programmed, status: "True", timeoutSeconds: 30}
  - probe: {name: internet-udp, from: internet, to: {node: edge-a, interface: enp1s0}, protocol: UDP, port: 3000, expect: reply}
  - probe: {from: internet, to: {node: edge-a, interface: enp1s0}, protocol: UDP, port: 3000, size: 1400, dontFragment: false, expect: reply}
  - probe: {from: internet, to: {node: edge-a, interface: enp1s0}, protocol: TCP, port: 3000, bytes: 300000, expect: reply}
  - probe: {from: internet, to: {node: edge-a, interface: enp1s0}, protocol: UDP, port: 3000, expect: reply, podSees: other}
  - parallel:
      - probe: {from: "vpn:player-1", to: {node: edge-a, interface: wt0}, protocol: UDP, port: 3000, expect: refused}
  - movePod: {pod: games/game-0, to: edge-a}
  - setReady: {pod: games/game-0, ready: false}
  - setNodeReady: {node: edge-a, ready: false}
  - apply: |
      apiVersion: v1
      kind: Namespace
      metadata: {name: x}
  - delete: {kind: PortMap, namespace: games, name: gameserver}
  - restartAgent: {node: edge-a, signal: TERM}
  - stopAgent: {node: edge-a, signal: KILL}
  - startAgent: {node: edge-a}
  - stopApiServer: {}
  - startApiServer: {}
  - restartMesh: {node: worker-b}
  - stopResponder: {pod: games/game-0, protocol: UDP, port: 3000}
  - startResponder: {pod: games/game-0, protocol: UDP, port: 3000}
  - hostExec: {node: worker-b, command: "ip rule del pref 101"}
  - snapshotHost: {node: worker-b, name: before}
  - compareHost: {node: worker-b, name: before}
  - expectHostClean: {node: worker-b}
  - sleep: {seconds: 2}
  - expectStatus: {portmap: games/gameserver, accepted: Valid, programmed: AllNodesReady, endpointNode: worker-b, published: ["edge-a/enp1s0", "edge-a/wt0"]}
  - expectHost: {node: worker-b, nftCounterNonZero: "games/gameserver"}
  - kubectl: {name: pm-columns, args: [get, pm, -A], expectOutput: ["${public:edge-a}"]}
  - kuportStatus: {args: [games/gameserver], expectExit: 1, expectOutput: [PortConflict], timeoutSeconds: 5}
  - kuportPreflight: {name: preflight, args: [--timeout, 30s], expectExit: 0, expectOutput: ["edge-a"], timeoutSeconds: 40}
  - rollingRestart: {name: rollout, rate: 10, settleSeconds: 2, probes: [{from: internet, to: {node: edge-a, interface: enp1s0}, protocol: UDP, port: 3000, expect: reply}]}
  - cleanup: {node: worker-b}
  - hostListener: {node: edge-a, protocol: TCP, port: 2222}
  - settle: {quietMillis: 500, timeoutSeconds: 10}
"#;
        let s: Scenario = serde_saphyr::from_str(yaml).expect("the lab.md example parses");
        validate(&s).expect("valid");
        let kinds: Vec<&str> = s.steps.iter().map(Step::kind).collect();
        assert_eq!(kinds.len(), 33);
        for kind in [
            "wait",
            "probe",
            "parallel",
            "movePod",
            "setReady",
            "setNodeReady",
            "apply",
            "delete",
            "restartAgent",
            "stopAgent",
            "startAgent",
            "stopApiServer",
            "startApiServer",
            "restartMesh",
            "stopResponder",
            "startResponder",
            "hostExec",
            "snapshotHost",
            "compareHost",
            "expectHostClean",
            "sleep",
            "expectStatus",
            "expectHost",
            "kubectl",
            "kuportStatus",
            "kuportPreflight",
            "rollingRestart",
            "cleanup",
            "hostListener",
            "settle",
        ] {
            assert!(kinds.contains(&kind), "{kind} missing");
        }
        let Step::Probe(p) = &s.steps[2] else {
            panic!("not a probe")
        };
        assert_eq!((p.size, p.dont_fragment), (Some(1400), false));
        assert_eq!(s.host.rp_filter, RpFilter::Loose);
    }

    #[test]
    fn a_typo_is_refused_not_ignored() {
        let yaml = "name: x\ncni: kindnet\nnodes: [{name: a}]\nsteps:\n  - probe: {from: internet, to: {node: a, interface: wt0}, protocol: UDP, port: 1, expect: reply, podsees: other}\n";
        let err = serde_saphyr::from_str::<Scenario>(yaml).expect_err("unknown field");
        assert!(format!("{err}").contains("podsees"), "{err}");
        let yaml = "name: x\ncni: calico\nnodes: [{name: a}]\nsteps: []\n";
        assert!(serde_saphyr::from_str::<Scenario>(yaml).is_err());
    }

    #[test]
    fn a_rolling_restart_loops_only_probes_expecting_replies() {
        let base = "name: x\ncni: kindnet\nnodes: [{name: a}]\nsteps:\n  - rollingRestart: {probes: [{from: internet, to: {node: a, interface: eth0}, protocol: UDP, port: 1, expect: EXPECT}]}\n";
        let ok: Scenario =
            serde_saphyr::from_str(&base.replace("EXPECT", "reply")).expect("parses");
        validate(&ok).expect("valid");
        let Step::RollingRestart(r) = &ok.steps[0] else {
            panic!("not a rolling restart")
        };
        assert_eq!(
            (r.rate, r.settle_seconds, r.signal),
            (10, 3.0, SignalName::Term)
        );
        let refused: Scenario =
            serde_saphyr::from_str(&base.replace("EXPECT", "refused")).expect("parses");
        assert!(validate(&refused).is_err());
        let unknown: Scenario = serde_saphyr::from_str(
            &base
                .replace("EXPECT", "reply")
                .replace("{probes", "{nodes: [b], probes"),
        )
        .expect("parses");
        assert!(validate(&unknown).is_err());
    }

    #[test]
    fn a_tcp_source_port_is_used_once() {
        let probe = |proto: &str, port: u16| {
            format!(
                "      - probe: {{from: internet, to: {{node: a, interface: eth0}}, protocol: {proto}, port: 1, expect: reply, sourcePort: {port}}}\n"
            )
        };
        let base = "name: x\ncni: kindnet\nnodes: [{name: a}]\nsteps:\n  - parallel:\n".to_string();
        let udp: Scenario =
            serde_saphyr::from_str(&(base.clone() + &probe("UDP", 40000) + &probe("UDP", 40000)))
                .expect("parses");
        validate(&udp).expect("a UDP port repeated is one flow");
        let Step::Parallel(steps) = &udp.steps[0] else {
            panic!("not parallel")
        };
        let Step::Probe(p) = &steps[0] else {
            panic!("not a probe")
        };
        assert_eq!(p.source_port, Some(40000));
        let tcp: Scenario =
            serde_saphyr::from_str(&(base.clone() + &probe("TCP", 40000) + &probe("TCP", 40001)))
                .expect("parses");
        validate(&tcp).expect("distinct TCP ports");
        let twice: Scenario =
            serde_saphyr::from_str(&(base + &probe("TCP", 40000) + &probe("TCP", 40000)))
                .expect("parses");
        let err = validate(&twice).expect_err("TCP port used twice");
        assert!(format!("{err}").contains("sourcePort 40000"), "{err}");
    }

    #[test]
    fn a_probe_takes_one_period_within_bounds() {
        let with = |extra: &str| -> Result<()> {
            let yaml = format!(
                "name: x\ncni: kindnet\nnodes: [{{name: a}}]\nsteps:\n  - probe: {{from: internet, to: {{node: a, interface: eth0}}, protocol: UDP, port: 1, expect: noAnswer{extra}}}\n"
            );
            let s: Scenario = serde_saphyr::from_str(&yaml).expect("parses");
            validate(&s)
        };
        with("").expect("no period");
        with(", holdSeconds: 5").expect("a hold");
        with(", withinSeconds: 2").expect("a bound");
        let both = with(", holdSeconds: 5, withinSeconds: 2").expect_err("both");
        assert!(format!("{both}").contains("not both"), "{both}");
        for bad in ["0", "-1", "301"] {
            let err = with(&format!(", holdSeconds: {bad}")).expect_err(bad);
            assert!(format!("{err}").contains("0 < seconds <= 300"), "{err}");
        }
    }

    #[test]
    fn a_pod_on_an_unknown_node_is_refused() {
        let yaml = "name: x\ncni: kindnet\nnodes: [{name: a}]\npods: [{namespace: n, name: p, node: b}]\nsteps: [{sleep: {seconds: 1}}]\n";
        let s: Scenario = serde_saphyr::from_str(yaml).expect("parses");
        let err = validate(&s).expect_err("unknown node");
        assert!(format!("{err}").contains("node b"), "{err}");
    }

    /// A scenario with `pods` (YAML flow entries) and one probe step.
    fn with_pods_and_probe(pods: &str, probe: &str) -> Result<Scenario> {
        let yaml = format!(
            "name: x\ncni: cilium-tunnel\nnodes: [{{name: a, public: true}}, {{name: b}}]\nvpnClients: [v]\npods: [{pods}]\nsteps:\n  - probe: {{{probe}}}\n"
        );
        let s: Scenario = serde_saphyr::from_str(&yaml)?;
        validate(&s)?;
        Ok(s)
    }

    const PROBE: &str =
        "from: internet, to: {node: a, interface: enp1s0}, protocol: UDP, port: 1, expect: reply";

    #[test]
    fn a_node_lists_an_ipv6_internal_ip_only_on_an_ipv6_mesh() {
        let with = |mesh: &str| {
            let yaml = format!(
                "name: x\ncni: cilium-tunnel\n{mesh}nodes: [{{name: a, public: true}}, {{name: b, internalIpFamilies: [IPv6]}}]\nsteps: [{{sleep: {{seconds: 1}}}}]\n"
            );
            let s: Scenario = serde_saphyr::from_str(&yaml).expect("parses");
            validate(&s).map(|()| s)
        };
        let s = with("mesh: {ipv6: true}\n").expect("an IPv6 mesh");
        assert_eq!(s.nodes[1].internal_ip_families, [IpFamily::IPv6]);
        assert!(s.nodes[0].internal_ip_families.is_empty());
        let err = with("").expect_err("an IPv4 mesh");
        assert!(
            format!("{err}").contains("node b: internalIpFamilies"),
            "{err}"
        );
    }

    #[test]
    fn a_vpn_client_dials_ipv6_only_to_wt0_on_an_ipv6_mesh() {
        let on_mesh = |mesh: &str, to: &str| {
            let yaml = format!(
                "name: x\ncni: cilium-tunnel\n{mesh}nodes: [{{name: a, public: true}}, {{name: b}}]\nvpnClients: [v]\npods: [{{namespace: n, name: p, node: b, service: s, ipFamilies: [IPv4, IPv6]}}]\nsteps:\n  - probe: {{from: \"vpn:v\", to: {to}, protocol: UDP, port: 1, expect: reply}}\n"
            );
            let s: Scenario = serde_saphyr::from_str(&yaml).expect("parses");
            validate(&s)
        };
        let wt0 = "{node: a, interface: wt0, family: IPv6}";
        on_mesh("mesh: {ipv6: true}\n", wt0).expect("IPv6 to wt0 on an IPv6 mesh");
        for (mesh, to) in [
            ("", wt0),
            (
                "mesh: {ipv6: true}\n",
                "{node: a, interface: enp1s0, family: IPv6}",
            ),
            ("mesh: {ipv6: true}\n", "{pod: n/p, family: IPv6}"),
        ] {
            let err = on_mesh(mesh, to).expect_err(to);
            assert!(
                format!("{err}").contains("over the mesh only"),
                "{mesh}{to}: {err}"
            );
        }
        on_mesh("", "{node: a, interface: wt0}").expect("IPv4 to wt0");
    }

    #[test]
    fn ip_families_default_to_ipv4_and_take_the_four_lists() {
        let s = with_pods_and_probe("{namespace: n, name: p, node: b, service: s}", PROBE)
            .expect("no ipFamilies");
        assert_eq!(s.pods[0].ip_families, vec![IpFamily::IPv4]);
        assert!(s.pods[0].has_family(IpFamily::IPv4) && !s.pods[0].has_family(IpFamily::IPv6));
        for (yaml, want) in [
            ("[IPv4]", vec![IpFamily::IPv4]),
            ("[IPv6]", vec![IpFamily::IPv6]),
            ("[IPv4, IPv6]", vec![IpFamily::IPv4, IpFamily::IPv6]),
            ("[IPv6, IPv4]", vec![IpFamily::IPv6, IpFamily::IPv4]),
        ] {
            let pod = format!("{{namespace: n, name: p, node: b, service: s, ipFamilies: {yaml}}}");
            let s = with_pods_and_probe(&pod, PROBE).unwrap_or_else(|e| panic!("{yaml}: {e:#}"));
            assert_eq!(s.pods[0].ip_families, want, "{yaml}");
        }
    }

    #[test]
    fn a_bad_ip_family_list_is_refused() {
        let pod = |families: &str| {
            format!("{{namespace: n, name: p, node: b, service: s, ipFamilies: {families}}}")
        };
        for bad in ["[IPv5]", "[ipv6]", "IPv6", "[inet6]"] {
            assert!(with_pods_and_probe(&pod(bad), PROBE).is_err(), "{bad}");
        }
        for bad in ["[]", "[IPv6, IPv6]", "[IPv4, IPv6, IPv4]"] {
            let err = with_pods_and_probe(&pod(bad), PROBE).expect_err(bad);
            assert!(
                format!("{err}").contains("ipFamilies takes"),
                "{bad}: {err}"
            );
        }
        let two = "{namespace: n, name: p, node: b, service: s, ipFamilies: [IPv4, IPv6]}, {namespace: n, name: q, node: a, service: s}";
        let err = with_pods_and_probe(two, PROBE).expect_err("two lists for one Service");
        assert!(format!("{err}").contains("differ"), "{err}");
        let other_service = "{namespace: n, name: p, node: b, service: s, ipFamilies: [IPv6]}, {namespace: n, name: q, node: a, service: t}";
        with_pods_and_probe(other_service, PROBE).expect("two Services, two lists");
    }

    #[test]
    fn a_probe_dials_ipv4_unless_told_ipv6_and_never_over_the_mesh() {
        let pod = "{namespace: n, name: p, node: b, service: s, ipFamilies: [IPv4, IPv6]}";
        let probe_of = |s: &Scenario| match &s.steps[0] {
            Step::Probe(p) => p.clone(),
            _ => panic!("not a probe"),
        };
        let s = with_pods_and_probe(pod, PROBE).expect("IPv4 by default");
        assert_eq!(probe_of(&s).to.family, IpFamily::IPv4);
        let v6 = "from: internet, to: {node: a, interface: enp1s0, family: IPv6}, protocol: TCP, port: 1, expect: reply, podSees: client";
        let s = with_pods_and_probe(pod, v6).expect("IPv6 to a public interface");
        assert_eq!(probe_of(&s).to.family, IpFamily::IPv6);
        let to_pod = "from: \"pod:n/p\", to: {pod: n/p, family: IPv6}, protocol: UDP, port: 1, expect: reply, podSees: any";
        with_pods_and_probe(pod, to_pod).expect("IPv6 to a pod");
        let mesh = "from: internet, to: {node: a, interface: wt0, family: IPv6}, protocol: UDP, port: 1, expect: reply";
        let err = with_pods_and_probe(pod, mesh).expect_err("IPv6 on wt0");
        assert!(format!("{err}").contains("IPv4 only"), "{err}");
        let vpn = "from: \"vpn:v\", to: {node: a, interface: enp1s0, family: IPv6}, protocol: UDP, port: 1, expect: reply";
        let err = with_pods_and_probe(pod, vpn).expect_err("IPv6 from a VPN client");
        assert!(format!("{err}").contains("over the mesh only"), "{err}");
        let bad = "from: internet, to: {node: a, interface: enp1s0, family: IPv7}, protocol: UDP, port: 1, expect: reply";
        assert!(with_pods_and_probe(pod, bad).is_err());
    }
}
