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
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshSpec {
    /// The mesh table (7120) also routes `default dev wt0`, as a netbird exit node does.
    #[serde(default)]
    pub exit_node: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostSpec {
    #[serde(default)]
    pub rp_filter: RpFilter,
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
}

impl PodSpec {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    Udp,
    Tcp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Udp => "UDP",
            Protocol::Tcp => "TCP",
        }
    }
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Udp => "udp",
            Protocol::Tcp => "tcp",
        }
    }
}

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
        }
    }

    /// The name given in the file, if any.
    pub fn given_name(&self) -> Option<&str> {
        match self {
            Step::Probe(p) => p.name.as_deref(),
            Step::Wait(w) => w.name.as_deref(),
            Step::ExpectStatus(e) => e.name.as_deref(),
            Step::HostExec(h) => h.name.as_deref(),
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
    /// `internet`, `vpn:<client>`, or (extension) `pod:<namespace>/<name>`.
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
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    pub node: String,
    pub interface: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Expect {
    Reply,
    Refused,
    Timeout,
    /// Extension: an ICMP "fragmentation needed" came back (a DF datagram too big for a link).
    FragmentationNeeded,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PodSees {
    #[default]
    Client,
    Other,
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
    /// A shell command; `${pod:<namespace>/<name>}` is replaced by that pod's address and
    /// `${mesh:<node>}` by that node's mesh address.
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
    }
    Ok(())
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
