//! Real Cilium on the local cluster (`kuport-lab cluster --cni cilium-tunnel|cilium-native`):
//! the binaries `e2e/cilium/build.sh` builds from source, run as a user's DaemonSet would run
//! them, but as processes beside each node's kubelet.
//!
//! - One `cilium-operator-generic` in the underlay namespace (where the API server listens): it
//!   registers Cilium's CRDs and garbage-collects identities.
//! - One `cilium-agent` per node, in the node's network namespace and in a mount namespace of
//!   its own below the node's (the one containerd, the kubelet and the CNI plugin share): there
//!   the node's own bpffs is at `/sys/fs/bpf` and its own directory at `/run/cilium` (the agent's
//!   API socket, which `cilium-cni` dials), as the DaemonSet's host mounts give them; and the
//!   host-wide `kernel.*` and `net.core.*` sysctls are read-only, so the agent's attempts to
//!   change them (`kernel.unprivileged_bpf_disabled=1` cannot be undone until a reboot) fail
//!   with the warnings Cilium prints inside kind, and leave the host as it was.
//! - The agent's configuration is `kube-system/cilium-config` (what kuport reads), written to
//!   the API server and, as the DaemonSet mounts it, to a directory per node.
//! - The agent writes the CNI configuration (`cilium-cni`, `portmap` chained for `hostPort`)
//!   once it is ready, and the lab copies it into the node's CNI directory, so a node turns
//!   Ready only with Cilium up. The agents start once the kubelets registered their Nodes'
//!   addresses, as a DaemonSet's would. Not written there by the agent itself:
//!   it replaces the file by a rename, which containerd 1.6's watcher misses (the reload it
//!   tries on the temporary file's removal finds no configuration, and none follows), so the
//!   node would stay `NetworkPluginNotReady`.
//! - The operator runs in a mount namespace of its own too, with its own `/run/cilium` (it
//!   keeps a socket and its health history there).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::realnode::NodeSpec;
use crate::scenario::Cni;
use crate::sys::Lab;
use crate::topology::UL_NS;

/// The binaries `e2e/cilium/build.sh` writes into its cache directory.
pub const BINARIES: [&str; 4] = [
    "cilium-agent",
    "cilium-operator-generic",
    "cilium-cni",
    "cilium-dbg",
];

/// Where clang and llc 19 are (Debian's clang-19 and llvm-19): first on the agent's PATH.
pub const LLVM_BIN: &str = "/usr/lib/llvm-19/bin";

/// The cache directory of `e2e/cilium/build.sh` holds everything the cluster runs.
pub fn check_binaries(dir: &Path) -> Result<()> {
    for b in BINARIES {
        if !dir.join(b).is_file() {
            bail!(
                "no {b} in {}: build Cilium with e2e/cilium/build.sh",
                dir.display()
            );
        }
    }
    if !dir.join("bpf/bpf_lxc.c").is_file() {
        bail!(
            "no bpf/ sources in {}: build Cilium with e2e/cilium/build.sh",
            dir.display()
        );
    }
    for tool in ["clang", "llc"] {
        if !Path::new(LLVM_BIN).join(tool).is_file() {
            bail!("no {LLVM_BIN}/{tool}: apt-get install clang-19 llvm-19");
        }
    }
    Ok(())
}

/// `kube-system/cilium-config` for a mode: the settings docs/integration.md recommends (legacy
/// host routing, kube-proxy kept, iptables masquerade), on a cgroup v1 host (no socket load
/// balancing), without the parts this cluster has no binaries or use for (Envoy, Hubble, the
/// health endpoints, ClusterMesh).
///
/// `overrides` (`kuport-lab cluster --cilium-set key=value`) replace or add settings, for
/// trying a configuration the guide warns against.
pub fn config(cni: Cni, overrides: &[String]) -> Result<Config> {
    let mut c: BTreeMap<&str, &str> = [
        ("cluster-name", "default"),
        ("cluster-id", "0"),
        ("identity-allocation-mode", "crd"),
        ("ipam", "kubernetes"),
        ("k8s-require-ipv4-pod-cidr", "true"),
        ("enable-ipv4", "true"),
        ("enable-ipv6", "false"),
        ("enable-host-legacy-routing", "true"),
        ("kube-proxy-replacement", "false"),
        ("bpf-lb-sock", "false"),
        ("enable-bpf-masquerade", "false"),
        ("enable-ipv4-masquerade", "true"),
        ("enable-l7-proxy", "false"),
        ("external-envoy-proxy", "false"),
        ("enable-hubble", "false"),
        ("enable-health-checking", "false"),
        ("enable-endpoint-health-checking", "false"),
        ("cni-chaining-mode", "portmap"),
        ("cni-exclusive", "true"),
        ("auto-direct-node-routes", "false"),
        ("operator-api-serve-addr", "127.0.0.1:9234"),
        ("enable-metrics", "false"),
        ("prometheus-serve-addr", ""),
        ("operator-prometheus-serve-addr", ""),
    ]
    .into_iter()
    .collect();
    match cni {
        Cni::CiliumTunnel => {
            c.insert("routing-mode", "tunnel");
            c.insert("tunnel-protocol", "vxlan");
            c.insert("tunnel-port", "8472");
        }
        Cni::CiliumNative => {
            c.insert("routing-mode", "native");
            // The pod ranges are routed over the mesh (the lab's routes, as netbird routes a
            // site's networks): Cilium leaves traffic to them unmasqueraded.
            c.insert("ipv4-native-routing-cidr", crate::realnode::CLUSTER_CIDR);
        }
        Cni::Kindnet => bail!("kindnet is not Cilium"),
    }
    let mut c: Config = c
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for o in overrides {
        let (k, v) = o
            .split_once('=')
            .with_context(|| format!("--cilium-set {o}: expected key=value"))?;
        c.insert(k.to_owned(), v.to_owned());
    }
    Ok(c)
}

/// `kube-system/cilium-config`'s data.
pub type Config = BTreeMap<String, String>;

/// The ConfigMap as the API server takes it.
pub fn config_map(config: &Config) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cilium-config", "namespace": "kube-system"},
        "data": config,
    })
}

/// Writes the configuration as the DaemonSet's volume holds it: one file per key.
fn write_config_dir(dir: &Path, config: &Config) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (k, v) in config {
        std::fs::write(dir.join(k), v)
            .with_context(|| format!("writing {}", dir.join(k).display()))?;
    }
    Ok(())
}

pub use crate::realnode::run_dir;

/// `unix://` address of the node's agent API, as `cilium-dbg -H` takes it.
pub fn api_socket(n: &NodeSpec) -> String {
    format!("unix://{}", run_dir(n).join("cilium.sock").display())
}

/// Starts the operator in the underlay namespace (the API server's), with its own
/// `/run/cilium` under `data`.
pub fn start_operator(
    lab: &mut Lab,
    cilium: &Path,
    kubeconfig: &Path,
    settings: &Config,
    data: &Path,
) -> Result<i32> {
    let config = data.join("operator-config");
    write_config_dir(&config, settings)?;
    let run = data.join("run");
    std::fs::create_dir_all(&run).with_context(|| format!("creating {}", run.display()))?;
    lab.create_host_dir(Path::new("/run/cilium"))?;
    let netns = format!("--net=/run/netns/{UL_NS}");
    let script = format!(
        "mount --bind {run} /run/cilium
export CILIUM_K8S_NAMESPACE=kube-system
exec {operator} --config-dir={config} --k8s-kubeconfig-path={kubeconfig}",
        run = run.display(),
        operator = cilium.join("cilium-operator-generic").display(),
        config = config.display(),
        kubeconfig = kubeconfig.display(),
    );
    lab.spawn_direct(
        "cilium-operator",
        "cilium-operator",
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
    )
}

/// Where the node's agent writes its CNI configuration once ready.
fn staged_cni_config(n: &NodeSpec) -> PathBuf {
    n.dir().join("cilium-cni/05-cilium.conflist")
}

/// Waits until the node's agent wrote its CNI configuration (it is ready), then copies it into
/// the node's CNI directory with one plain write, which containerd 1.6 notices.
pub fn install_cni_config(lab: &Lab, n: &NodeSpec, within: Duration) -> Result<()> {
    let staged = staged_cni_config(n);
    let ready = crate::sys::wait_until(within, || staged.is_file());
    if !ready {
        let log = std::fs::read_to_string(lab.log_path(&format!("cilium-agent-{}", n.name)))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        bail!(
            "cilium-agent on {} wrote no CNI configuration within {} s (not ready); its log ends:\n{}",
            n.name,
            within.as_secs(),
            lines[lines.len().saturating_sub(20)..].join("\n")
        );
    }
    let text = std::fs::read(&staged).with_context(|| format!("reading {}", staged.display()))?;
    let target = n.dir().join("cni/net.d/05-cilium.conflist");
    std::fs::write(&target, text).with_context(|| format!("writing {}", target.display()))
}

/// Starts the node's agent in the node's network namespace and a mount namespace below the
/// node's (see the module's documentation).
pub fn start_agent(
    lab: &mut Lab,
    n: &NodeSpec,
    containerd_pid: i32,
    cilium: &Path,
    kubeconfig: &Path,
    settings: &Config,
    join_cgroup: &str,
) -> Result<i32> {
    let dir = n.dir();
    let config = dir.join("cilium-config");
    write_config_dir(&config, settings)?;
    let staged = staged_cni_config(n);
    if let Some(parent) = staged.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let lib = dir.join("cilium-lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    let bpf = lib.join("bpf");
    if !bpf.exists() {
        std::os::unix::fs::symlink(cilium.join("bpf"), &bpf).context("linking bpf/")?;
    }
    let script = format!(
        "{join_cgroup}
for d in /proc/sys/kernel /proc/sys/net/core; do mount --bind $d $d; mount -o remount,bind,ro $d; done
export PATH={LLVM_BIN}:$PATH K8S_NODE_NAME={name} CILIUM_K8S_NAMESPACE=kube-system
exec {agent} --config-dir={config} --k8s-kubeconfig-path={kubeconfig} --lib-dir={lib} --write-cni-conf-when-ready={cni_conf}",
        name = n.name,
        agent = cilium.join("cilium-agent").display(),
        config = config.display(),
        kubeconfig = kubeconfig.display(),
        lib = lib.display(),
        cni_conf = staged.display(),
    );
    let target = containerd_pid.to_string();
    lab.spawn_direct(
        &format!("cilium-agent-{}", n.name),
        "cilium-agent",
        "nsenter",
        &[
            "--target",
            &target,
            "--mount",
            "--net",
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "slave",
            "--",
            "sh",
            "-ec",
            &script,
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_modes_keep_legacy_host_routing_and_kube_proxy() {
        for cni in [Cni::CiliumTunnel, Cni::CiliumNative] {
            let c = config(cni, &[]).expect("cilium");
            assert_eq!(c["enable-host-legacy-routing"], "true");
            assert_eq!(c["kube-proxy-replacement"], "false");
            assert_eq!(c["bpf-lb-sock"], "false");
        }
        assert_eq!(
            config(Cni::CiliumTunnel, &[]).expect("t")["tunnel-port"],
            "8472"
        );
        assert_eq!(
            config(Cni::CiliumNative, &[]).expect("n")["routing-mode"],
            "native"
        );
        assert!(config(Cni::Kindnet, &[]).is_err());
        let set = ["enable-host-legacy-routing=false".to_owned()];
        let c = config(Cni::CiliumTunnel, &set).expect("override");
        assert_eq!(c["enable-host-legacy-routing"], "false");
        assert!(config(Cni::CiliumTunnel, &["nokey".to_owned()]).is_err());
    }
}
