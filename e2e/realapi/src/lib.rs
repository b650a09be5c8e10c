//! Test support: a real Kubernetes control plane (etcd, kube-apiserver and optionally
//! kube-controller-manager) on free loopback ports, started the way controller-runtime's envtest
//! starts one: an admin authenticated by a static token, service-account keys made at start,
//! `--advertise-address=127.0.0.1` and RBAC authorization. The binaries come from
//! `e2e/controlplane` (`just control-plane`), which builds them into a cache keyed by the
//! Kubernetes version.
//!
//! Every process is stopped by pid when the [`ControlPlane`] is dropped, which also happens when
//! a test panics; the scratch directory (certificates, etcd data, logs, the kubeconfig) goes with
//! it, except after a panic, when it is kept and its path printed so the logs can be read.
//!
//! Tests call [`ControlPlane::start_or_skip`]: without the binaries it prints one line and
//! returns `None`, unless `KUPORT_REQUIRE_REAL_APISERVER=1`, when it panics instead.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kuport_testkit::process::Proc;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, SemaphorePermit};

/// The agent's ClusterRole as the DaemonSet ships it (the one named [`AGENT_ROLE_NAME`]).
pub const AGENT_ROLE_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/manifests/clusterrole.yaml"
);
/// The agent's namespaced Roles and their RoleBindings as shipped: reading `cilium-config` in
/// kube-system, and its own Pod and DaemonSet (the stop decision). Bound to whichever account
/// a test runs the agent as.
pub const AGENT_NAMESPACED_RBAC: [&str; 2] = [
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/manifests/role-cilium-config.yaml"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/manifests/role-lifecycle.yaml"
    ),
];
/// The admission policy that keeps each agent to its own node's part of a class status, and its
/// binding, as shipped.
pub const CLASS_STATUS_POLICY_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/manifests/class-status-policy.yaml"
);
/// The name of the agent's ClusterRole in [`AGENT_ROLE_FILE`].
pub const AGENT_ROLE_NAME: &str = "kuport-agent";
/// The generated CRDs the product ships.
pub const CRD_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds");
/// Set to 1 to turn "binaries missing" from a skip into a failure (CI sets it).
pub const REQUIRE_ENV: &str = "KUPORT_REQUIRE_REAL_APISERVER";

const CONTROLPLANE_GO_MOD: &str = include_str!("../../controlplane/go.mod");
const READY_DEADLINE: Duration = Duration::from_secs(90);
const ADMIN_USER: &str = "kuport-admin";

/// How many control planes one test process runs at once (they are CPU heavy on small
/// machines). Tests queue on it inside [`ControlPlane::start`].
static RUNNING: Semaphore = Semaphore::const_new(1);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Other(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

/// The Kubernetes release `e2e/controlplane/go.mod` pins (`v1.X.Y`).
pub fn kubernetes_version() -> Option<&'static str> {
    CONTROLPLANE_GO_MOD.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let first = words.next()?;
        let (module, version) = if first == "require" {
            (words.next()?, words.next()?)
        } else {
            (first, words.next()?)
        };
        (module == "k8s.io/kubernetes").then_some(version)
    })
}

/// Where the binaries are: `KUPORT_CONTROLPLANE_DIR`, else
/// `${KUPORT_CONTROLPLANE_CACHE:-/var/cache/kuport/controlplane}/<kubernetes version>`.
pub fn binary_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KUPORT_CONTROLPLANE_DIR") {
        return PathBuf::from(dir);
    }
    let root = std::env::var_os("KUPORT_CONTROLPLANE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/kuport/controlplane"));
    root.join(kubernetes_version().unwrap_or("unknown"))
}

fn binaries_present(dir: &Path) -> bool {
    ["etcd", "kube-apiserver", "kube-controller-manager"]
        .iter()
        .all(|b| dir.join(b).is_file())
}

/// Whether the control-plane binaries of this Kubernetes version are built.
pub fn is_built() -> bool {
    binaries_present(&binary_dir())
}

/// Whether a missing control plane fails (CI) rather than skips (a developer's machine).
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// What to start besides etcd and kube-apiserver.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Start kube-controller-manager running only these controllers (for example
    /// `namespace-controller`, `endpointslice-controller`, `node-lifecycle-controller`). Empty:
    /// no controller-manager.
    pub controllers: Vec<String>,
    /// Serve the API on this address and port instead of a free loopback port (the lab serves
    /// it on its underlay, where the agents of the other namespaces reach it). etcd stays on
    /// loopback.
    pub listen: Option<std::net::SocketAddrV4>,
}

/// The control plane of a whole cluster (the local cluster of real kubelets,
/// `cargo e2e run --cluster local`), on top of [`Options`]: Node authorization and the
/// NodeRestriction admission plugin with a token per kubelet, the `kubernetes` Service's
/// endpoints kept by the apiserver (pods reach it through kube-proxy), every default controller
/// with the cluster's root CA published, and the kube-scheduler.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// The kubelets' node names: each gets a token as `system:node:<name>` in `system:nodes`.
    pub nodes: Vec<String>,
    /// How long the node-lifecycle controller waits for a heartbeat before it marks a node
    /// NotReady (`--node-monitor-grace-period`, for example `10s`).
    pub node_monitor_grace_period: String,
}

/// The IPv4 Service range of the control plane, the first of `--service-cluster-ip-range`: a
/// Service that names no family is IPv4, and the range's first address is the `kubernetes`
/// Service, which the serving certificate names in cluster mode.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The IPv6 Service range, the second of `--service-cluster-ip-range`, which makes the control
/// plane dual-stack: Services with `ipFamilies` of IPv6 get their cluster IPs from it and the
/// EndpointSlice controller writes their IPv6 slices. A unique local /112 (kube-apiserver
/// refuses an IPv6 range wider than /108), apart from every address the lab uses.
pub const SERVICE_CIDR6: &str = "fd00:10::/112";
const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";

/// A running control plane. Dropping it kills every process it started and removes its files.
pub struct ControlPlane {
    url: String,
    token: String,
    /// Per kubelet in cluster mode: (node name, its token).
    node_tokens: Vec<(String, String)>,
    dir: Option<tempfile::TempDir>,
    kubeconfig: PathBuf,
    audit_log: PathBuf,
    // Killed in reverse start order: controller-manager, apiserver, etcd.
    children: Vec<(&'static str, Proc)>,
    _permit: SemaphorePermit<'static>,
}

/// Ports this process has handed out, so two control planes of one test binary never pick the
/// same one between the check and the server's own bind.
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// The lowest port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// A loopback port that is free now, chosen below the kernel's ephemeral range: a port taken
/// from that range (what binding port 0 gives) can be taken again by any outgoing connection
/// before the server binds it, which once failed a CI run with `address already in use`.
fn free_port() -> Result<u16, Error> {
    let high = ephemeral_low().clamp(12_000, 65_535);
    let low = 10_000u16;
    let span = u32::from(high - low);
    for _ in 0..256 {
        let mut seed = [0u8; 4];
        read_urandom(&mut seed)?;
        let port = low + u16::try_from(u32::from_le_bytes(seed) % span).unwrap_or(0);
        let mut handed = HANDED_OUT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if handed.contains(&port) || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        handed.insert(port);
        return Ok(port);
    }
    Err(Error::Other(format!(
        "no free loopback port found in {low}-{high} after 256 tries"
    )))
}

fn read_urandom(bytes: &mut [u8]) -> Result<(), Error> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(bytes))
        .map_err(io("read /dev/urandom"))
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(io(format!("write {}", path.display())))
}

/// Writes a file holding a credential, readable by its owner only (0600, from its creation).
fn write_private(path: &Path, contents: &str) -> Result<(), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let what = || format!("write {}", path.display());
    if path.exists() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(io(what()))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(io(what()))
}

fn random_token() -> Result<String, Error> {
    let mut bytes = [0u8; 24];
    read_urandom(&mut bytes)?;
    let mut token = String::new();
    for b in bytes {
        let _ = write!(token, "{b:02x}");
    }
    Ok(token)
}

struct Pki {
    ca: String,
    serving_cert: String,
    serving_key: String,
    sa_key: String,
    sa_pub: String,
}

fn make_pki(also_serve: Option<std::net::Ipv4Addr>, cluster: bool) -> Result<Pki, Error> {
    let err = |what: &'static str| move |e: rcgen::Error| Error::Other(format!("{what}: {e}"));
    let ca_key = rcgen::KeyPair::generate().map_err(err("generate the CA key"))?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(err("CA certificate parameters"))?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kuport-realapi-ca");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca =
        rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(err("self-sign the CA"))?;
    let serving_key = rcgen::KeyPair::generate().map_err(err("generate the serving key"))?;
    let mut names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    names.extend(also_serve.map(|a| a.to_string()));
    if cluster {
        // Pods reach the apiserver as the `kubernetes` Service (in-cluster configuration).
        names.extend(
            [
                KUBERNETES_SERVICE_IP,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ]
            .map(str::to_owned),
        );
    }
    let mut params =
        rcgen::CertificateParams::new(names).map_err(err("serving certificate parameters"))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let serving = params
        .signed_by(&serving_key, &ca)
        .map_err(err("sign the serving certificate"))?;
    let sa = rcgen::KeyPair::generate().map_err(err("generate the service-account key"))?;
    Ok(Pki {
        ca: ca.pem(),
        serving_cert: serving.pem(),
        serving_key: serving_key.serialize_pem(),
        sa_key: sa.serialize_pem(),
        sa_pub: sa.public_key_pem(),
    })
}

fn spawn(
    name: &'static str,
    binary: &Path,
    args: &[String],
    log: &Path,
) -> Result<(&'static str, Proc), Error> {
    let out = std::fs::File::create(log).map_err(io(format!("create {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io(format!("reopen {}", log.display())))?;
    let child = Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(io(format!("start {}", binary.display())))?;
    Ok((name, Proc::adopt(child, name)))
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Whether the control plane can start here; prints the one skip line for `test` when not
/// (and panics instead under `KUPORT_REQUIRE_REAL_APISERVER=1`).
pub fn available_or_skip(test: &str) -> bool {
    let dir = binary_dir();
    if binaries_present(&dir) {
        return true;
    }
    assert!(
        !required(),
        "{test}: no control-plane binaries in {} and {REQUIRE_ENV}=1 (build them: just control-plane)",
        dir.display()
    );
    eprintln!(
        "skipping {test}: no control-plane binaries in {} (build them: just control-plane)",
        dir.display()
    );
    false
}

/// `role` without `verb` on `resource` (for example `portmaps/status`): rules granting it are
/// split so every other grant stays. For the RBAC control tests.
pub fn without_verb(mut role: ClusterRole, resource: &str, verb: &str) -> ClusterRole {
    let mut rules = Vec::new();
    for mut rule in role.rules.take().unwrap_or_default() {
        let resources = rule.resources.clone().unwrap_or_default();
        if resources.iter().any(|r| r == resource) && rule.verbs.iter().any(|v| v == verb) {
            let mut narrowed = rule.clone();
            narrowed.resources = Some(vec![resource.to_owned()]);
            narrowed.verbs.retain(|v| v != verb);
            rule.resources = Some(resources.into_iter().filter(|r| r != resource).collect());
            if rule.resources.as_ref().is_some_and(|r| !r.is_empty()) {
                rules.push(rule);
            }
            if !narrowed.verbs.is_empty() {
                rules.push(narrowed);
            }
        } else {
            rules.push(rule);
        }
    }
    role.rules = Some(rules);
    role
}

impl ControlPlane {
    /// Starts a control plane, or returns `None` after printing one line when the binaries are
    /// not built (panicking instead under `KUPORT_REQUIRE_REAL_APISERVER=1`). `test` names the
    /// caller in that line.
    pub async fn start_or_skip(test: &str, options: Options) -> Option<Self> {
        if !available_or_skip(test) {
            return None;
        }
        let dir = binary_dir();
        match Self::start(&dir, options).await {
            Ok(cp) => Some(cp),
            Err(e) => panic!("{test}: starting the control plane: {e}"),
        }
    }

    /// Starts etcd and kube-apiserver (and kube-controller-manager when asked) from `bin` and
    /// waits until the apiserver reports ready.
    pub async fn start(bin: &Path, options: Options) -> Result<Self, Error> {
        Self::start_with(bin, options, None).await
    }

    /// Starts the control plane of a whole cluster (see [`ClusterOptions`]): etcd,
    /// kube-apiserver, kube-controller-manager with every default controller, and
    /// kube-scheduler. `options.controllers` is ignored.
    pub async fn start_cluster(
        bin: &Path,
        options: Options,
        cluster: &ClusterOptions,
    ) -> Result<Self, Error> {
        Self::start_with(bin, options, Some(cluster)).await
    }

    /// Starts, and starts again on fresh ports (at most three times) when a server lost its
    /// port to another process between the choice and its bind.
    async fn start_with(
        bin: &Path,
        options: Options,
        cluster: Option<&ClusterOptions>,
    ) -> Result<Self, Error> {
        let mut attempt = 1;
        loop {
            match Self::start_once(bin, options.clone(), cluster).await {
                Err(e) if attempt < 3 && e.to_string().contains("address already in use") => {
                    eprintln!(
                        "kuport-realapi: a port was taken before its server bound it; starting again"
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(
        bin: &Path,
        options: Options,
        cluster: Option<&ClusterOptions>,
    ) -> Result<Self, Error> {
        let permit = RUNNING
            .acquire()
            .await
            .map_err(|e| Error::Other(format!("wait for a control-plane slot: {e}")))?;
        sweep_abandoned(&std::env::temp_dir());
        let tmp = tempfile::Builder::new()
            .prefix(SCRATCH_PREFIX)
            .tempdir()
            .map_err(io("create the control plane's scratch directory"))?;
        let root = tmp.path().to_path_buf();
        let nodes = cluster.map(|c| c.nodes.as_slice()).unwrap_or_default();
        let (token, node_tokens) = write_credentials(&root, &options, cluster.is_some(), nodes)?;
        let etcd_port = free_port()?;
        let (api_ip, api_port) = match options.listen {
            Some(l) => (l.ip().to_string(), l.port()),
            None => ("127.0.0.1".to_owned(), free_port()?),
        };
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let url = format!("https://{api_ip}:{api_port}");
        let mut cp = Self {
            url: url.clone(),
            token,
            node_tokens,
            kubeconfig: root.join("kubeconfig"),
            audit_log: root.join("audit.log"),
            dir: Some(tmp),
            children: Vec::new(),
            _permit: permit,
        };
        cp.children.push(spawn(
            "etcd",
            &bin.join("etcd"),
            &etcd_args(&root, &etcd_url, free_port()?),
            &root.join("etcd.log"),
        )?);
        let api_args = apiserver_args(&root, &etcd_url, &api_ip, api_port, cluster.is_some());
        cp.children.push(spawn(
            "kube-apiserver",
            &bin.join("kube-apiserver"),
            &api_args,
            &root.join("kube-apiserver.log"),
        )?);
        cp.record_pids()?;
        cp.write_kubeconfig()?;
        cp.wait_ready("kube-apiserver.log").await?;
        if let Some(cluster) = cluster {
            cp.start_cluster_components(bin, cluster)?;
        } else if !options.controllers.is_empty() {
            cp.start_controllers(bin, &options.controllers)?;
        }
        Ok(cp)
    }

    /// kube-controller-manager running only `controllers`.
    fn start_controllers(&mut self, bin: &Path, controllers: &[String]) -> Result<(), Error> {
        let kcm_args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--controllers={}", controllers.join(",")),
            "--leader-elect=false".to_owned(),
            "--secure-port=0".to_owned(),
            "--use-service-account-credentials=false".to_owned(),
            // Node-lifecycle: mark a node NotReady 10s after its last heartbeat.
            "--node-monitor-grace-period=10s".to_owned(),
            "--node-monitor-period=1s".to_owned(),
            "--v=1".to_owned(),
        ];
        let log = self.root().join("kube-controller-manager.log");
        self.children.push(spawn(
            "kube-controller-manager",
            &bin.join("kube-controller-manager"),
            &kcm_args,
            &log,
        )?);
        self.record_pids()
    }

    /// kube-controller-manager with every default controller (the cluster's root CA published
    /// for the pods' service-account volumes) and kube-scheduler, both as the admin.
    fn start_cluster_components(
        &mut self,
        bin: &Path,
        cluster: &ClusterOptions,
    ) -> Result<(), Error> {
        let root = self.root().to_path_buf();
        let s = |p: &str| root.join(p).display().to_string();
        let kubeconfig = self.kubeconfig.display().to_string();
        let kcm_args = vec![
            format!("--kubeconfig={kubeconfig}"),
            "--controllers=*".to_owned(),
            "--leader-elect=false".to_owned(),
            "--secure-port=0".to_owned(),
            "--use-service-account-credentials=false".to_owned(),
            format!("--root-ca-file={}", s("ca.crt")),
            format!("--service-account-private-key-file={}", s("sa.key")),
            format!(
                "--node-monitor-grace-period={}",
                cluster.node_monitor_grace_period
            ),
            "--node-monitor-period=1s".to_owned(),
            "--v=1".to_owned(),
        ];
        self.children.push(spawn(
            "kube-controller-manager",
            &bin.join("kube-controller-manager"),
            &kcm_args,
            &root.join("kube-controller-manager.log"),
        )?);
        let scheduler_args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--leader-elect=false".to_owned(),
            "--secure-port=0".to_owned(),
            "--v=1".to_owned(),
        ];
        self.children.push(spawn(
            "kube-scheduler",
            &bin.join("kube-scheduler"),
            &scheduler_args,
            &root.join("kube-scheduler.log"),
        )?);
        self.record_pids()
    }

    /// The kubeconfig of node `node`'s kubelet (its token, the CA inline), as JSON text.
    pub fn node_kubeconfig(&self, node: &str) -> Result<String, Error> {
        let (_, token) = self
            .node_tokens
            .iter()
            .find(|(n, _)| n == node)
            .ok_or_else(|| Error::Other(format!("no kubelet token for node {node}")))?;
        self.self_contained_kubeconfig(&format!("system:node:{node}"), token)
    }

    /// The admin's kubeconfig with the CA inline (readable from any mount namespace), as JSON.
    pub fn admin_kubeconfig_inline(&self) -> Result<String, Error> {
        self.self_contained_kubeconfig(ADMIN_USER, &self.token)
    }

    fn self_contained_kubeconfig(&self, user: &str, token: &str) -> Result<String, Error> {
        use base64_light as b64;
        let ca_path = self.root().join("ca.crt");
        let ca = std::fs::read(&ca_path).map_err(io(format!("read {}", ca_path.display())))?;
        Ok(json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "kuport-local", "cluster": {
                "server": self.url, "certificate-authority-data": b64::encode(&ca)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "kuport-local", "context": {"cluster": "kuport-local", "user": user}}],
            "current-context": "kuport-local",
        })
        .to_string())
    }

    fn root(&self) -> &Path {
        self.dir
            .as_ref()
            .map(tempfile::TempDir::path)
            .unwrap_or_else(|| Path::new("/nonexistent"))
    }

    /// Writes `pids`: this process's pid, then each child's, so a later start can stop the
    /// processes of a test process that was killed before its drop ran.
    fn record_pids(&self) -> Result<(), Error> {
        let mut text = format!("{}\n", std::process::id());
        for (_, child) in &self.children {
            let _ = writeln!(text, "{}", child.pid());
        }
        write(&self.root().join("pids"), &text)
    }

    fn write_kubeconfig(&self) -> Result<(), Error> {
        let ca = self.root().join("ca.crt");
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kuport-realapi", "cluster": {
                "server": self.url, "certificate-authority": ca.display().to_string()}}],
            "users": [{"name": ADMIN_USER, "user": {"token": self.token}}],
            "contexts": [{"name": "kuport-realapi",
                          "context": {"cluster": "kuport-realapi", "user": ADMIN_USER}}],
            "current-context": "kuport-realapi",
        });
        write(&self.kubeconfig, &config.to_string())
    }

    async fn wait_ready(&mut self, log: &str) -> Result<(), Error> {
        let client = self.admin_client().await?;
        let deadline = tokio::time::Instant::now() + READY_DEADLINE;
        let mut last;
        loop {
            let exited = self
                .children
                .iter_mut()
                .find_map(|(name, child)| match child.exited() {
                    Ok(Some(status)) => Some((*name, status)),
                    _ => None,
                });
            if let Some((name, status)) = exited {
                return Err(Error::Other(format!(
                    "{name} exited with {status} before the apiserver was ready; its log ends:\n{}",
                    tail(&self.root().join(format!("{name}.log")), 30)
                )));
            }
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Other(format!("build GET /readyz: {e}")))?;
            match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "kube-apiserver at {} not ready after {READY_DEADLINE:?} (last answer: {last}); {log} ends:\n{}",
                    self.url,
                    tail(&self.root().join(log), 30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The apiserver's URL (`https://127.0.0.1:<port>`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// An admin kubeconfig (token in `system:masters`, the generated CA) for kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The audit log (every request at Metadata level).
    pub fn audit_log(&self) -> &Path {
        &self.audit_log
    }

    /// A kubeconfig (as JSON, which is YAML) for `user` with `token`, trusting the generated CA.
    fn kubeconfig_for(&self, user: &str, token: &str) -> Value {
        let ca = self.root().join("ca.crt");
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {
                "server": self.url, "certificate-authority": ca.display().to_string()}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": user}}],
            "current-context": "c",
        })
    }

    async fn client_for_user(&self, user: &str, token: &str) -> Result<kube::Client, Error> {
        let config = self.kubeconfig_for(user, token);
        let kubeconfig: Kubeconfig = serde_json::from_value(config)
            .map_err(|e| Error::Other(format!("kubeconfig for {user}: {e}")))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Other(format!("client config for {user}: {e}")))?;
        kube::Client::try_from(config).map_err(kube_err(format!("client for {user}")))
    }

    /// A client authenticated as the admin (`system:masters`).
    pub async fn admin_client(&self) -> Result<kube::Client, Error> {
        self.client_for_user(ADMIN_USER, &self.token).await
    }

    /// Creates the CRDs in `dir` (every `*.yaml`) and waits until each is `Established` and its
    /// resource is served.
    pub async fn install_crds(&self, dir: &Path) -> Result<Vec<String>, Error> {
        let client = self.admin_client().await?;
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut created = Vec::new();
        for file in yaml_files(dir)? {
            let text =
                std::fs::read_to_string(&file).map_err(io(format!("read {}", file.display())))?;
            let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)
                .map_err(|e| Error::Other(format!("parse {}: {e}", file.display())))?;
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.create(&PostParams::default(), &crd)
                .await
                .map_err(kube_err(format!(
                    "create CRD {name} from {}",
                    file.display()
                )))?;
            created.push((name, crd));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for (name, crd) in &created {
            wait_established(&api, name, deadline).await?;
            wait_served(&client, name, crd, deadline).await?;
        }
        Ok(created.into_iter().map(|(n, _)| n).collect())
    }

    /// Creates the ServiceAccount `namespace/name`, the ClusterRole `role` and a binding of one
    /// to the other, and returns a client authenticated with a token issued for that account.
    pub async fn service_account_client(
        &self,
        namespace: &str,
        name: &str,
        role: &ClusterRole,
    ) -> Result<kube::Client, Error> {
        let token = self.service_account_token(namespace, name, role).await?;
        self.client_for_user(&format!("system:serviceaccount:{namespace}:{name}"), &token)
            .await
    }

    /// Writes a kubeconfig for the ServiceAccount `namespace/name` with `token` to `path`,
    /// readable by its owner only (for a process of its own, such as an agent).
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        token: &str,
        path: &Path,
    ) -> Result<(), Error> {
        let user = format!("system:serviceaccount:{namespace}:{name}");
        write_private(path, &self.kubeconfig_for(&user, token).to_string())
    }

    /// A client authenticated as the ServiceAccount `namespace/name` with `token` (for example
    /// one from [`ControlPlane::pod_token`]).
    pub async fn client_with_token(
        &self,
        namespace: &str,
        name: &str,
        token: &str,
    ) -> Result<kube::Client, Error> {
        self.client_for_user(&format!("system:serviceaccount:{namespace}:{name}"), token)
            .await
    }

    /// A token of the ServiceAccount `namespace/account` bound to the Pod `namespace/pod`, as
    /// the kubelet asks for the token it projects into a Pod: the API server names the Pod's
    /// node in it (`authentication.kubernetes.io/node-name`), and the token stops working when
    /// the Pod is deleted.
    pub async fn pod_token(
        &self,
        namespace: &str,
        account: &str,
        pod: &str,
    ) -> Result<String, Error> {
        let admin = self.admin_client().await?;
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), namespace);
        let uid = pods
            .get(pod)
            .await
            .map_err(kube_err(format!("read Pod {namespace}/{pod}")))?
            .metadata
            .uid
            .ok_or_else(|| Error::Other(format!("Pod {namespace}/{pod} has no uid")))?;
        let request: TokenRequest = from_json(json!({"spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid},
        }}))?;
        self.issue_token(&admin, namespace, account, &request).await
    }

    /// Creates the ServiceAccount `namespace/name` (and its namespace), the ClusterRole `role`
    /// and a binding of one to the other, and the shipped namespaced Roles bound to it.
    pub async fn create_service_account(
        &self,
        namespace: &str,
        name: &str,
        role: &ClusterRole,
    ) -> Result<(), Error> {
        let admin = self.admin_client().await?;
        let pp = PostParams::default();
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        let ns: Namespace = from_json(json!({"metadata": {"name": namespace}}))?;
        match namespaces.create(&pp, &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(kube_err(format!("create namespace {namespace}"))(e)),
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
        let account: ServiceAccount = from_json(json!({"metadata": {"name": name}}))?;
        accounts
            .create(&pp, &account)
            .await
            .map_err(kube_err(format!(
                "create ServiceAccount {namespace}/{name}"
            )))?;
        let role_name = role.metadata.name.clone().unwrap_or_default();
        Api::<ClusterRole>::all(admin.clone())
            .create(&pp, role)
            .await
            .map_err(kube_err(format!("create ClusterRole {role_name}")))?;
        let binding: ClusterRoleBinding = from_json(json!({
            "metadata": {"name": format!("{role_name}-{namespace}-{name}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "namespace": namespace, "name": name}],
        }))?;
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&pp, &binding)
            .await
            .map_err(kube_err(format!(
                "bind ClusterRole {role_name} to {namespace}/{name}"
            )))?;
        self.bind_namespaced_roles(&admin, namespace, name).await
    }

    /// Creates the ServiceAccount as [`ControlPlane::create_service_account`] does and returns
    /// a token bound to no object: one that names no node.
    async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        role: &ClusterRole,
    ) -> Result<String, Error> {
        self.create_service_account(namespace, name, role).await?;
        self.unbound_token(namespace, name).await
    }

    /// A token of the existing ServiceAccount `namespace/name` bound to no object (what
    /// `kubectl create token` gives): it names no node.
    pub async fn unbound_token(&self, namespace: &str, name: &str) -> Result<String, Error> {
        let admin = self.admin_client().await?;
        let request: TokenRequest = from_json(json!({"spec": {"expirationSeconds": 3600}}))?;
        self.issue_token(&admin, namespace, name, &request).await
    }

    async fn issue_token(
        &self,
        admin: &kube::Client,
        namespace: &str,
        name: &str,
        request: &TokenRequest,
    ) -> Result<String, Error> {
        let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
        let issued = accounts
            .create_token_request(name, &PostParams::default(), request)
            .await
            .map_err(kube_err(format!("request a token for {namespace}/{name}")))?;
        issued.status.and_then(|s| s.token).ok_or_else(|| {
            Error::Other(format!(
                "token request for {namespace}/{name} returned no token"
            ))
        })
    }

    /// Creates the ValidatingAdmissionPolicies and their bindings in `file` (for example
    /// [`CLASS_STATUS_POLICY_FILE`]). The API server enforces a new policy a moment later (its
    /// admission plugin learns of it through a watch): callers wait for a request it refuses.
    pub async fn install_admission_policies(&self, file: &Path) -> Result<Vec<String>, Error> {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let admin = self.admin_client().await?;
        let pp = PostParams::default();
        let text = std::fs::read_to_string(file).map_err(io(format!("read {}", file.display())))?;
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .map_err(|e| Error::Other(format!("parse {}: {e}", file.display())))?;
        let mut created = Vec::new();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
            match doc["kind"].as_str() {
                Some("ValidatingAdmissionPolicy") => {
                    let policy: ValidatingAdmissionPolicy = from_json(doc)?;
                    Api::<ValidatingAdmissionPolicy>::all(admin.clone())
                        .create(&pp, &policy)
                        .await
                        .map_err(kube_err(format!("create {what}")))?;
                }
                Some("ValidatingAdmissionPolicyBinding") => {
                    let binding: ValidatingAdmissionPolicyBinding = from_json(doc)?;
                    Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
                        .create(&pp, &binding)
                        .await
                        .map_err(kube_err(format!("create {what}")))?;
                }
                _ => {
                    return Err(Error::Other(format!(
                        "{}: unexpected {what}",
                        file.display()
                    )));
                }
            }
            created.push(what);
        }
        Ok(created)
    }

    /// Creates the shipped namespaced Roles ([`AGENT_NAMESPACED_RBAC`]) and binds each to the
    /// ServiceAccount `namespace/name`, whatever subject the file names. A Role for a namespace
    /// other than kube-system lives in the account's own namespace (as the chart installs it).
    async fn bind_namespaced_roles(
        &self,
        admin: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<(), Error> {
        let pp = PostParams::default();
        for file in AGENT_NAMESPACED_RBAC {
            let text = std::fs::read_to_string(file).map_err(io(format!("read {file}")))?;
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .map_err(|e| Error::Other(format!("parse {file}: {e}")))?;
            for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
                if doc["metadata"]["namespace"] != "kube-system" {
                    doc["metadata"]["namespace"] = json!(namespace);
                }
                let ns = doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(namespace)
                    .to_owned();
                let what = format!("{} {ns}/{}", doc["kind"], doc["metadata"]["name"]);
                match doc["kind"].as_str() {
                    Some("Role") => {
                        let role: Role = from_json(doc)?;
                        Api::<Role>::namespaced(admin.clone(), &ns)
                            .create(&pp, &role)
                            .await
                            .map_err(kube_err(format!("create {what}")))?;
                    }
                    Some("RoleBinding") => {
                        doc["subjects"] = json!([{"kind": "ServiceAccount",
                            "namespace": namespace, "name": name}]);
                        let binding: RoleBinding = from_json(doc)?;
                        Api::<RoleBinding>::namespaced(admin.clone(), &ns)
                            .create(&pp, &binding)
                            .await
                            .map_err(kube_err(format!("create {what}")))?;
                    }
                    _ => return Err(Error::Other(format!("{file}: unexpected {what}"))),
                }
            }
        }
        Ok(())
    }

    /// Every request of `user` the apiserver refused with 403, as
    /// `"<verb> <resource>[/<subresource>] <namespace>/<name>: <message>"`, sorted.
    pub fn forbidden_requests(&self, user: &str) -> Result<Vec<String>, Error> {
        Ok(self
            .audit_events(user)?
            .into_iter()
            .filter(|e| e.code == 403)
            .map(|e| format!("{}: {}", e.request, e.message))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }

    /// The distinct `"<verb> <group>/<resource>[/<subresource>]"` requests `user` made that the
    /// apiserver allowed, sorted.
    pub fn allowed_requests(&self, user: &str) -> Result<Vec<String>, Error> {
        Ok(self
            .audit_events(user)?
            .into_iter()
            .filter(|e| e.code != 403)
            .map(|e| e.kind)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect())
    }

    fn audit_events(&self, user: &str) -> Result<Vec<AuditEvent>, Error> {
        let text = std::fs::read_to_string(&self.audit_log)
            .map_err(io(format!("read {}", self.audit_log.display())))?;
        let mut events = Vec::new();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if event["stage"] != "ResponseComplete" || event["user"]["username"] != user {
                continue;
            }
            let r = &event["objectRef"];
            let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
            let mut resource = s(&r["resource"]);
            if let Some(sub) = r["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            let verb = s(&event["verb"]);
            let group = s(&r["apiGroup"]);
            events.push(AuditEvent {
                code: event["responseStatus"]["code"].as_u64().unwrap_or(0),
                request: format!("{verb} {resource} {}/{}", s(&r["namespace"]), s(&r["name"])),
                kind: format!("{verb} {group}/{resource}"),
                message: s(&event["responseStatus"]["message"]),
            });
        }
        Ok(events)
    }
}

const SCRATCH_PREFIX: &str = "kuport-realapi-";

/// Whether a process (not merely a thread: /proc also answers for thread ids) `pid` runs.
fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .is_some_and(|tgid| tgid.trim() == pid.to_string())
    })
}

/// Stops what a killed test process left behind: for each scratch directory whose owner (the
/// first pid in its `pids`) is gone, kills the recorded children that still run one of the
/// control-plane binaries (so a reused pid is never touched) and removes the directory.
fn sweep_abandoned(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let is_scratch = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(SCRATCH_PREFIX));
        let Ok(text) = std::fs::read_to_string(dir.join("pids")) else {
            continue;
        };
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        let Some((&owner, children)) = pids.split_first() else {
            continue;
        };
        if !is_scratch || pid_alive(owner) {
            continue;
        }
        for &pid in children {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let ours = exe.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                [
                    "etcd",
                    "kube-apiserver",
                    "kube-controller-manager",
                    "kube-scheduler",
                ]
                .contains(&n)
            });
            if ours {
                eprintln!(
                    "kuport-realapi: stopping pid {pid} ({}) left by the killed test process {owner}",
                    exe.display()
                );
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Standard base64 (RFC 4648, padded), for the kubeconfig's inline CA: a dozen lines instead of
/// a dependency.
mod base64_light {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub(super) fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn encodes_as_rfc_4648() {
            assert_eq!(super::encode(b""), "");
            assert_eq!(super::encode(b"f"), "Zg==");
            assert_eq!(super::encode(b"fo"), "Zm8=");
            assert_eq!(super::encode(b"foo"), "Zm9v");
            assert_eq!(super::encode(b"foobar"), "Zm9vYmFy");
        }
    }
}

struct AuditEvent {
    code: u64,
    request: String,
    kind: String,
    message: String,
}

fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, Error> {
    serde_json::from_value(v).map_err(|e| Error::Other(format!("build an object: {e}")))
}

/// The ClusterRole named `name` from a (multi-document) YAML file.
pub fn cluster_role_from(file: &Path, name: &str) -> Result<ClusterRole, Error> {
    let text = std::fs::read_to_string(file).map_err(io(format!("read {}", file.display())))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| Error::Other(format!("parse {}: {e}", file.display())))?;
    let doc = docs
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
        .ok_or_else(|| Error::Other(format!("{} holds no ClusterRole {name}", file.display())))?;
    from_json(doc)
}

/// The agent's ClusterRole as shipped (see [`AGENT_ROLE_FILE`]).
pub fn agent_role() -> Result<ClusterRole, Error> {
    cluster_role_from(Path::new(AGENT_ROLE_FILE), AGENT_ROLE_NAME)
}

/// Writes the certificates, keys, token file and audit policy into `root`; returns the admin's
/// token and each node's.
fn write_credentials(
    root: &Path,
    options: &Options,
    cluster: bool,
    nodes: &[String],
) -> Result<(String, Vec<(String, String)>), Error> {
    let path = |name: &str| root.join(name);
    let pki = make_pki(options.listen.map(|l| *l.ip()), cluster)?;
    write(&path("ca.crt"), &pki.ca)?;
    write(&path("apiserver.crt"), &pki.serving_cert)?;
    write(&path("apiserver.key"), &pki.serving_key)?;
    write(&path("sa.key"), &pki.sa_key)?;
    write(&path("sa.pub"), &pki.sa_pub)?;
    let token = random_token()?;
    let mut tokens = format!("{token},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n");
    let mut node_tokens = Vec::new();
    for node in nodes {
        let node_token = random_token()?;
        let user = format!("system:node:{node}");
        let _ = writeln!(tokens, "{node_token},{user},{user},\"system:nodes\"");
        node_tokens.push((node.clone(), node_token));
    }
    write(&path("tokens.csv"), &tokens)?;
    write(
        &path("audit-policy.yaml"),
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Metadata\n",
    )?;
    Ok((token, node_tokens))
}

/// etcd on loopback, its data in `root`, without fsync (nothing of a test's store is kept).
fn etcd_args(root: &Path, etcd_url: &str, peer_port: u16) -> Vec<String> {
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    vec![
        "--name=default".to_owned(),
        format!("--data-dir={}", root.join("etcd").display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        "--unsafe-no-fsync=true".to_owned(),
        "--log-level=warn".to_owned(),
    ]
}

/// kube-apiserver's flags: token authentication, RBAC (and Node authorization with
/// NodeRestriction for a cluster), a blocking audit log.
fn apiserver_args(
    root: &Path,
    etcd_url: &str,
    api_ip: &str,
    api_port: u16,
    cluster: bool,
) -> Vec<String> {
    let s = |p: &str| root.join(p).display().to_string();
    let url = format!("https://{api_ip}:{api_port}");
    let mut args = vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--secure-port={api_port}"),
        format!("--bind-address={api_ip}"),
        format!("--advertise-address={api_ip}"),
        format!("--cert-dir={}", s("certs")),
        format!("--tls-cert-file={}", s("apiserver.crt")),
        format!("--tls-private-key-file={}", s("apiserver.key")),
        format!("--token-auth-file={}", s("tokens.csv")),
        format!(
            "--authorization-mode={}",
            if cluster { "Node,RBAC" } else { "RBAC" }
        ),
        format!("--service-account-key-file={}", s("sa.pub")),
        format!("--service-account-signing-key-file={}", s("sa.key")),
        format!("--service-account-issuer={url}"),
        format!("--service-cluster-ip-range={SERVICE_CIDR},{SERVICE_CIDR6}"),
        "--allow-privileged=true".to_owned(),
        format!("--audit-policy-file={}", s("audit-policy.yaml")),
        format!("--audit-log-path={}", s("audit.log")),
        "--audit-log-mode=blocking".to_owned(),
        "--v=1".to_owned(),
    ];
    if cluster {
        args.extend([
            "--enable-admission-plugins=NodeRestriction".to_owned(),
            // Logs, exec and port-forward dial the kubelet at the address the node reports.
            "--kubelet-preferred-address-types=InternalIP,Hostname".to_owned(),
        ]);
    } else {
        // The kubernetes Service cannot point at a loopback address; envtest turns it off
        // too. A cluster's apiserver listens on the lab's underlay and keeps it.
        args.push("--endpoint-reconciler-type=none".to_owned());
    }
    args
}

/// The `*.yaml` files of `dir`, sorted.
fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(format!("list {}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Waits until the CRD `name` reports `Established=True`.
async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    deadline: tokio::time::Instant,
) -> Result<(), Error> {
    loop {
        let got = api
            .get(name)
            .await
            .map_err(kube_err(format!("get CRD {name}")))?;
        let established = got
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if established {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Other(format!(
                "CRD {name} not Established after 60s: {:?}",
                got.status
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the CRD's resource answers a list: Established is set before every apiserver
/// handler serves the resource.
async fn wait_served(
    client: &kube::Client,
    name: &str,
    crd: &CustomResourceDefinition,
    deadline: tokio::time::Instant,
) -> Result<(), Error> {
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
        .unwrap_or_default();
    let resource = ApiResource {
        group: crd.spec.group.clone(),
        version: version.clone(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    };
    let dynamic: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    loop {
        match dynamic.list(&ListParams::default().limit(1)).await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(Error::Kube {
                    what: format!("list {name} after it was Established"),
                    source: e,
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // At once (no SIGTERM grace): nothing of a test's control plane is worth a clean
        // shutdown, and each guard reaps its process so no zombie or half-written etcd
        // directory outlives the test.
        for (_, child) in self.children.iter_mut().rev() {
            child.stop(Duration::ZERO);
        }
        if std::thread::panicking() {
            if std::env::var("KUPORT_REALAPI_KEEP").is_ok_and(|v| v == "1")
                && let Some(dir) = self.dir.take()
            {
                eprintln!(
                    "kuport-realapi: the test failed; control plane files and logs kept in {}",
                    dir.keep().display()
                );
            } else {
                eprintln!(
                    "kuport-realapi: the test failed; kube-apiserver's log ended:\n{}\n(set KUPORT_REALAPI_KEEP=1 to keep every log)",
                    tail(&self.root().join("kube-apiserver.log"), 10)
                );
            }
        }
    }
}

#[cfg(test)]
mod port_tests {
    use super::{ephemeral_low, free_port};

    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
        let low = ephemeral_low();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let port = free_port().expect("a free port");
            assert!(port >= 10_000 && port < low.max(12_000), "port {port}");
            assert!(seen.insert(port), "port {port} handed out twice");
        }
    }
}
