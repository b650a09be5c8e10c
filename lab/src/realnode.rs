//! A real Kubernetes node inside a lab node's network namespace: its own containerd (Debian's
//! 1.6, runc, the standard CNI plugins), a kubelet registered as a Node whose InternalIP is the
//! node's mesh address, and kube-proxy in nftables mode.
//!
//! What several nodes on one host must not share, each gets its own:
//! - a mount namespace (made by containerd's wrapper, entered by its kubelet) in which the
//!   paths containerd and the kubelet use whatever their flags say are bind mounts of the
//!   node's own directories: `/var/lib/kubelet/device-plugins` (wiped at every kubelet start),
//!   `/var/log/containers`, `/var/lib/cni` and `/run/containerd` (the shims' sockets). Every
//!   mount a node makes (these, the pods' volumes, the containers' root filesystems) dies with
//!   that namespace, so nothing is left in the host's;
//! - a cgroup root `kl-<node>` in every hierarchy (two kubelets on one root kill each other's
//!   pods as orphans), which also holds the node's containerd, shims and kubelet, so stopping a
//!   node kills whatever it started;
//! - containerd's root, state, sockets and runc root, and the kubelet's root and certificate
//!   directories under `/var/lib/kuport-lab/cluster/<node>`.
//!
//! The network namespace is entered with `nsenter --net` and not `ip netns exec`, which would
//! remount `/sys` and hide the cgroup hierarchies from the kubelet and runc.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::hostres;
use crate::sys::{self, Lab};

/// Where the nodes' data lives (removed whole at teardown).
pub const DATA_ROOT: &str = "/var/lib/kuport-lab/cluster";
/// containerd and runc from Debian, and the CNI plugins' directory.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The sandbox image every node's containerd runs (imported, never pulled).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// The cluster's pod range (each node routes its /24 to the others over the mesh).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// Host paths the kubelet or containerd use whatever their flags say; each node binds its own
/// directory (the first name, under its data directory) over them.
const PRIVATE_PATHS: [(&str, &str); 4] = [
    ("device-plugins", "/var/lib/kubelet/device-plugins"),
    ("log-containers", "/var/log/containers"),
    ("cni-state", "/var/lib/cni"),
    ("run-containerd", "/run/containerd"),
];

/// Host-wide sysctls a kubelet sets at start (`setupKernelTunables`); the lab restores them.
pub const KUBELET_SYSCTLS: [&str; 6] = [
    "/proc/sys/vm/overcommit_memory",
    "/proc/sys/vm/panic_on_oom",
    "/proc/sys/kernel/panic",
    "/proc/sys/kernel/panic_on_oops",
    "/proc/sys/kernel/keys/root_maxkeys",
    "/proc/sys/kernel/keys/root_maxbytes",
];

/// One node to run.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    /// Its network namespace (`kl-<name>`).
    pub netns: String,
    /// The InternalIP: the node's mesh address.
    pub mesh: Ipv4Addr,
    /// Its public address, when it has one (kube-proxy serves NodePorts there too).
    pub public: Option<Ipv4Addr>,
    /// Its pod range (`10.244.<i>.0/24`).
    pub pod_cidr: String,
    /// Real Cilium's binaries (`e2e/cilium/build.sh`'s cache), when Cilium is the node's CNI
    /// instead of the bridge plugin.
    pub cilium: Option<PathBuf>,
}

impl NodeSpec {
    pub fn dir(&self) -> PathBuf {
        Path::new(DATA_ROOT).join(&self.name)
    }

    /// Where a node with real Cilium keeps its CNI plugins: the bridge plugins and Cilium's.
    pub fn cilium_cni_bin_dir(&self) -> PathBuf {
        self.dir().join("cni-bin")
    }

    /// The cgroup root of this node, under every hierarchy.
    pub fn cgroup(&self) -> String {
        format!("kl-{}", self.name)
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    fn path(&self, rel: &str) -> String {
        self.dir().join(rel).display().to_string()
    }
}

/// containerd's configuration (version 2, containerd 1.6): everything under the node's
/// directory, cgroupfs, the imported pause image, CNI from the node's own configuration
/// directory.
pub fn containerd_config(n: &NodeSpec) -> String {
    let cni_bin = match n.cilium {
        Some(_) => n.cilium_cni_bin_dir().display().to_string(),
        None => CNI_BIN_DIR.to_owned(),
    };
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The lab's sandbox lacks CAP_SYS_RESOURCE: never lower a container's oom_score_adj below
  # containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"#,
        root = n.path("containerd/root"),
        state = n.path("containerd/state"),
        sock = n.containerd_socket().display(),
        opt = n.path("containerd/opt"),
        runc = n.path("runc"),
        cni_conf = n.path("cni/net.d"),
    )
}

/// The CNI configuration: a `bridge` on the node's pod range with `host-local` addresses and
/// no masquerade (the lab's kindnet-shaped rule masquerades only what leaves the pod range, so
/// a pod on another node sees the pod's own address), and `portmap` for `hostPort`.
pub fn cni_config(n: &NodeSpec) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "kuport-lab",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": n.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": n.path("cni/ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// The kubelet's configuration. cgroup v1 allowed (this host's hierarchy), cgroupfs with the
/// node's own root, a short lease (renewed every 2 s) so the node-lifecycle controller's
/// shortened grace period cannot flap, evictions and image garbage collection out of the way of
/// a shared disk, and the read-only API of a test cluster (see docs/lab.md, "Local cluster").
pub fn kubelet_config(n: &NodeSpec) -> String {
    let cgroup = n.cgroup();
    let logs = n.path("pod-logs");
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
cgroupsPerQOS: true
address: {mesh}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://{sock}
podLogsDir: {logs}
failSwapOn: false
protectKernelDefaults: false
nodeLeaseDurationSeconds: 8
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
maxPods: 30
shutdownGracePeriod: 0s
"#,
        mesh = n.mesh,
        sock = n.containerd_socket().display(),
    )
}

/// kube-proxy's configuration: nftables mode, NodePorts on the node's own addresses only, and
/// the host-wide conntrack sysctls left alone.
pub fn kube_proxy_config(n: &NodeSpec, kubeconfig: &Path) -> String {
    let mut addresses = vec![format!("{}/32", n.mesh)];
    addresses.extend(n.public.map(|p| format!("{p}/32")));
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: {name}
clusterCIDR: {CLUSTER_CIDR}
nodePortAddresses: [{addresses}]
clientConnection:
  kubeconfig: {kubeconfig}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
"#,
        name = n.name,
        addresses = addresses.join(", "),
        kubeconfig = kubeconfig.display(),
    )
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Creates cgroup `name` (and `name/runtime`) in every hierarchy, the cpuset ones with the
/// parent's CPUs and memory nodes (an empty cpuset takes no task).
fn make_cgroups(lab: &mut Lab, name: &str) -> Result<()> {
    lab.note_cgroup(name)?;
    for h in hostres::hierarchies() {
        let mut parent = h.clone();
        for part in [name.to_owned(), format!("{name}/runtime")] {
            let dir = h.join(&part);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("creating cgroup {}", dir.display()))?;
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let from = parent.join(file);
                if from.exists() {
                    let value = std::fs::read_to_string(&from)
                        .with_context(|| format!("reading {}", from.display()))?;
                    std::fs::write(dir.join(file), value.trim())
                        .with_context(|| format!("writing {}/{file}", dir.display()))?;
                }
            }
            parent = dir;
        }
    }
    Ok(())
}

/// The shell line that moves the shell into the node's runtime cgroup in every hierarchy.
pub fn join_cgroup_line(name: &str) -> String {
    format!(
        "for h in {root}/*/; do [ -e \"${{h}}{name}/runtime/cgroup.procs\" ] && echo $$ > \"${{h}}{name}/runtime/cgroup.procs\"; done",
        root = hostres::CGROUP_ROOT
    )
}

/// Prepares the node's directories, cgroups and configuration, and starts containerd.
pub fn start_containerd(lab: &mut Lab, n: &NodeSpec) -> Result<i32> {
    let dir = n.dir();
    lab.create_host_dir(Path::new(DATA_ROOT))?;
    lab.add_data_dir(&dir)?;
    for (own, host) in PRIVATE_PATHS {
        std::fs::create_dir_all(dir.join(own))
            .with_context(|| format!("creating {}", dir.join(own).display()))?;
        lab.create_host_dir(Path::new(host))?;
    }
    write(&dir.join("containerd.toml"), &containerd_config(n))?;
    match &n.cilium {
        // Cilium's agent writes its own once it is ready.
        Some(cilium) => {
            std::fs::create_dir_all(dir.join("cni/net.d")).context("creating cni/net.d")?;
            lab.create_host_dir(Path::new("/run/cilium"))?;
            prepare_cilium_node(n, cilium)?;
        }
        None => write(
            &dir.join("cni/net.d/10-kuport-lab.conflist"),
            &cni_config(n),
        )?,
    }
    make_cgroups(lab, &n.cgroup())?;
    let mut script = vec![join_cgroup_line(&n.cgroup())];
    for (own, host) in PRIVATE_PATHS {
        script.push(format!("mount --bind {} {host}", dir.join(own).display()));
    }
    if n.cilium.is_some() {
        script.extend(cilium_mounts(n));
    }
    script.push(format!(
        "exec containerd --config {}",
        dir.join("containerd.toml").display()
    ));
    let script = script.join("\n");
    let netns = format!("--net=/run/netns/{}", n.netns);
    let pid = lab.spawn_direct(
        &format!("containerd-{}", n.name),
        "containerd",
        "nsenter",
        &[
            &netns,
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-ec",
            &script,
        ],
    )?;
    let sock = n.containerd_socket().display().to_string();
    let ready = sys::wait_until(Duration::from_secs(30), || {
        sys::run("ctr", &["--address", &sock, "version"]).is_ok()
    });
    if !ready {
        let log = std::fs::read_to_string(lab.log_path(&format!("containerd-{}", n.name)))
            .unwrap_or_default();
        bail!("containerd on {} did not answer within 30 s: {log}", n.name);
    }
    Ok(pid)
}

/// Imports a docker archive into the node's containerd, in the namespace the CRI uses.
pub fn import_image(n: &NodeSpec, archive: &Path) -> Result<()> {
    let sock = n.containerd_socket().display().to_string();
    sys::run(
        "ctr",
        &[
            "--address",
            &sock,
            "-n",
            "k8s.io",
            "images",
            "import",
            &archive.display().to_string(),
        ],
    )
    .with_context(|| format!("importing {} into {}", archive.display(), n.name))?;
    Ok(())
}

/// Starts the kubelet in containerd's mount namespace (it must see the mounts containerd and
/// runc make, and they must see the pods' volumes it makes).
pub fn start_kubelet(lab: &mut Lab, n: &NodeSpec, containerd_pid: i32, bin: &Path) -> Result<i32> {
    for path in KUBELET_SYSCTLS {
        lab.note_sysctl(path)?;
    }
    let dir = n.dir();
    write(&dir.join("kubelet.yaml"), &kubelet_config(n))?;
    let script = format!(
        "{join}\nexec {kubelet} --config={config} --kubeconfig={kubeconfig} --root-dir={root} --cert-dir={certs} --hostname-override={name} --node-ip={mesh} --v=1",
        join = join_cgroup_line(&n.cgroup()),
        kubelet = bin.join("kubelet").display(),
        config = dir.join("kubelet.yaml").display(),
        kubeconfig = dir.join("kubelet.kubeconfig").display(),
        root = dir.join("kubelet").display(),
        certs = dir.join("kubelet/pki").display(),
        name = n.name,
        mesh = n.mesh,
    );
    let target = containerd_pid.to_string();
    lab.spawn_direct(
        &format!("kubelet-{}", n.name),
        "kubelet",
        "nsenter",
        &[
            "--target", &target, "--mount", "--net", "--", "sh", "-ec", &script,
        ],
    )
}

/// Starts kube-proxy in the node's network namespace.
pub fn start_kube_proxy(lab: &mut Lab, n: &NodeSpec, bin: &Path, kubeconfig: &Path) -> Result<i32> {
    let config = n.dir().join("kube-proxy.yaml");
    write(&config, &kube_proxy_config(n, kubeconfig))?;
    let netns = format!("--net=/run/netns/{}", n.netns);
    let proxy = bin.join("kube-proxy").display().to_string();
    let config = format!("--config={}", config.display());
    lab.spawn_direct(
        &format!("kube-proxy-{}", n.name),
        "kube-proxy",
        "nsenter",
        &[&netns, "--", &proxy, &config, "--v=1"],
    )
}

/// The node's `/run/cilium` (bound over it in the node's mount namespace): the agent's API
/// socket is `<this>/cilium.sock` on the host, for `cilium-dbg -H`.
pub fn run_dir(n: &NodeSpec) -> PathBuf {
    n.dir().join("cilium-run")
}

/// Prepares the node's CNI binaries (before containerd starts).
pub fn prepare_cilium_node(n: &NodeSpec, cilium: &Path) -> Result<()> {
    let bin = n.cilium_cni_bin_dir();
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    for entry in
        std::fs::read_dir(CNI_BIN_DIR).with_context(|| format!("reading {}", CNI_BIN_DIR))?
    {
        let entry = entry?;
        std::os::unix::fs::symlink(entry.path(), bin.join(entry.file_name()))
            .with_context(|| format!("linking {}", entry.path().display()))?;
    }
    std::os::unix::fs::symlink(cilium.join("cilium-cni"), bin.join("cilium-cni"))
        .context("linking cilium-cni")?;
    std::fs::create_dir_all(run_dir(n)).context("creating the node's /run/cilium")?;
    Ok(())
}

/// Lines of the node's mount-namespace script (containerd's wrapper) that give the node its own
/// bpffs and `/run/cilium`.
pub fn cilium_mounts(n: &NodeSpec) -> Vec<String> {
    vec![
        "mount -t bpf bpf /sys/fs/bpf".to_owned(),
        format!("mount --bind {} /run/cilium", run_dir(n).display()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeSpec {
        NodeSpec {
            name: "edge-a".into(),
            netns: "kl-edge-a".into(),
            mesh: Ipv4Addr::new(100, 64, 0, 1),
            public: Some(Ipv4Addr::new(203, 0, 113, 1)),
            pod_cidr: "10.244.1.0/24".into(),
            cilium: None,
        }
    }

    #[test]
    fn every_node_path_is_its_own() {
        let n = node();
        let containerd = containerd_config(&n);
        for line in containerd.lines().filter(|l| l.contains('/')) {
            let shared = [PAUSE_IMAGE, CNI_BIN_DIR].iter().any(|s| line.contains(s));
            assert!(
                shared || line.contains("/var/lib/kuport-lab/cluster/edge-a/"),
                "{line}"
            );
        }
        let kubelet = kubelet_config(&n);
        assert!(kubelet.contains("cgroupRoot: /kl-edge-a\n"), "{kubelet}");
        assert!(kubelet.contains("failCgroupV1: false"), "{kubelet}");
        assert!(kubelet.contains("address: 100.64.0.1\n"), "{kubelet}");
    }

    #[test]
    fn the_bridge_does_not_masquerade_and_allocates_the_node_range() {
        let cni: serde_json::Value = serde_json::from_str(&cni_config(&node())).expect("json");
        let bridge = &cni["plugins"][0];
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.1.0/24");
        assert_eq!(cni["plugins"][1]["type"], "portmap");
    }

    #[test]
    fn node_ports_listen_on_the_node_addresses_only() {
        let text = kube_proxy_config(&node(), Path::new("/k"));
        assert!(
            text.contains("nodePortAddresses: [100.64.0.1/32, 203.0.113.1/32]"),
            "{text}"
        );
        assert!(text.contains("maxPerCore: 0"), "{text}");
    }
}
