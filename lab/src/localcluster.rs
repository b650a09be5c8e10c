//! `kuport-lab cluster`: a real Kubernetes cluster in the lab's network. The lab's kindnet
//! topology (underlay, WireGuard mesh, internet side, VPN client, pod ranges routed over the
//! mesh) with real nodes in its node namespaces (see [`crate::realnode`]), the control plane of
//! `e2e/controlplane` with every controller and the scheduler, and the images given imported
//! into every node's containerd. It stays up until SIGINT or SIGTERM, then removes everything
//! it made; `kuport-lab down` does the same from another process.
//!
//! When the cluster is Ready it writes a description (JSON, see [`Description`]) that
//! `cargo e2e run --cluster local` reads: the kubeconfig, the namespace kubectl runs in (the
//! API server listens on the lab's underlay), the nodes' addresses and the clients'.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde::Serialize;

use crate::realnode::{self, NodeSpec};
use crate::runner::enter_netns;
use crate::scenario::{Cni, Scenario};
use crate::sys::{self, Lab};
use crate::topology::{self, API_ADDR, CLIENT_IP, CLIENT_NS, Topology, UL_NS};

/// The cluster's shape: the kindnet cross-node scenario's network (two public edges, a worker,
/// a VPN client), with no steps: the end-to-end driver brings its own. `cni: kindnet` unless
/// real Cilium is asked for (see [`shape`]).
const SHAPE: &str = "name: local-cluster
cni: kindnet
nodes:
  - {name: edge-a, public: true}
  - {name: worker-b}
  - {name: edge-c, public: true}
vpnClients: [player-1]
steps: []
";

/// Where the description goes by default.
pub const DESCRIPTION: &str = "/run/kuport-lab/cluster.json";

/// Options of `kuport-lab cluster`.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Docker archives to import into every node's containerd (the agent image, the workload
    /// image, the pause image `registry.k8s.io/pause:3.10`), under the names they carry.
    #[arg(long = "image", value_name = "ARCHIVE")]
    pub images: Vec<PathBuf>,
    /// Write the cluster's description here once every node is Ready.
    #[arg(long, default_value = DESCRIPTION)]
    pub describe: PathBuf,
    /// The node-lifecycle controller's `--node-monitor-grace-period` (a test cluster's is
    /// shorter than the 40 s default so a stopped kubelet is noticed within a test).
    #[arg(long, default_value = "10s")]
    pub node_monitor_grace_period: String,
    /// The pod network: `kindnet` (the bridge plugin on each node's range, routed over the
    /// mesh), or real Cilium built from source, `cilium-tunnel` (VXLAN on 8472 over the mesh)
    /// or `cilium-native` (the pod ranges routed over the mesh).
    #[arg(long, default_value = "kindnet", value_parser = parse_cni)]
    pub cni: Cni,
    /// Real Cilium's binaries and bpf/ sources: the directory e2e/cilium/build.sh prints.
    #[arg(long, value_name = "DIR")]
    pub cilium_dir: Option<PathBuf>,
    /// Replace or add one `cilium-config` setting (repeatable), for example
    /// `enable-host-legacy-routing=false` to try the BPF host routing the guide warns against.
    #[arg(long = "cilium-set", value_name = "KEY=VALUE")]
    pub cilium_set: Vec<String>,
}

fn parse_cni(text: &str) -> Result<Cni, String> {
    serde_saphyr::from_str(text)
        .map_err(|_| format!("{text}: expected kindnet, cilium-tunnel or cilium-native"))
}

/// The shape with the pod network asked for.
fn shape(cni: Cni) -> String {
    let name = match cni {
        Cni::Kindnet => "kindnet",
        Cni::CiliumTunnel => "cilium-tunnel",
        Cni::CiliumNative => "cilium-native",
    };
    SHAPE.replace("cni: kindnet", &format!("cni: {name}"))
}

/// What `cargo e2e run --cluster local` needs to know about the running cluster.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    /// The admin's kubeconfig (CA inline).
    pub kubeconfig: PathBuf,
    /// The network namespace to run kubectl and helm in (the API server's).
    pub api_netns: String,
    pub api_server: String,
    pub nodes: Vec<NodeDescription>,
    /// The internet client's namespace and address.
    pub internet: Client,
    pub vpn_clients: Vec<Client>,
    /// The prober (`kuport-echo`) the clients run.
    pub echo: PathBuf,
    /// The lab's pid (SIGTERM takes the cluster down).
    pub pid: u32,
    /// `kindnet`, `cilium-tunnel` or `cilium-native`.
    pub cni: String,
    /// Under real Cilium: the directory of its binaries (`cilium-dbg` among them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cilium: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDescription {
    pub name: String,
    pub netns: String,
    pub mesh: Ipv4Addr,
    pub public: Option<Ipv4Addr>,
    pub pod_cidr: String,
    /// Under real Cilium: its agent's API (`cilium-dbg -H <this> status`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cilium_api: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Client {
    pub name: String,
    pub netns: String,
    pub address: Ipv4Addr,
}

fn describe(topo: &Topology, kubeconfig: &Path, specs: &[NodeSpec], cni: Cni) -> Description {
    let cilium = specs.first().and_then(|n| n.cilium.clone());
    Description {
        kubeconfig: kubeconfig.to_path_buf(),
        api_netns: UL_NS.to_owned(),
        api_server: format!("https://{API_ADDR}"),
        nodes: topo
            .nodes
            .iter()
            .map(|n| NodeDescription {
                name: n.name.clone(),
                netns: n.ns.clone(),
                mesh: n.mesh,
                public: n.public,
                pod_cidr: n.pod_cidr.clone(),
                cilium_api: specs
                    .iter()
                    .find(|s| s.name == n.name && s.cilium.is_some())
                    .map(crate::realcilium::api_socket),
            })
            .collect(),
        internet: Client {
            name: "internet".into(),
            netns: CLIENT_NS.into(),
            address: CLIENT_IP,
        },
        vpn_clients: topo
            .mesh
            .iter()
            .filter(|m| !m.is_node)
            .map(|m| Client {
                name: m.name.clone(),
                netns: m.ns.clone(),
                address: m.mesh,
            })
            .collect(),
        echo: topo.bins.join(kuport_testkit::bins::ECHO),
        pid: std::process::id(),
        cni: shape(cni)
            .lines()
            .find_map(|l| l.strip_prefix("cni: "))
            .unwrap_or_default()
            .to_owned(),
        cilium,
    }
}

/// The node binaries must come from the same build as the control plane.
fn check_binaries(bin: &Path) -> Result<()> {
    for b in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kube-proxy",
    ] {
        if !bin.join(b).is_file() {
            bail!(
                "no {b} in {}: build the Kubernetes binaries with e2e/controlplane/build.sh",
                bin.display()
            );
        }
    }
    Ok(())
}

/// `kuport-lab cluster`: up, Ready, described, then down on a signal.
pub fn run(args: ClusterArgs) -> Result<ExitCode> {
    let bin = kuport_realapi::binary_dir();
    check_binaries(&bin)?;
    for image in &args.images {
        if !image.is_file() {
            bail!("image archive {} does not exist", image.display());
        }
    }
    let cilium = match (args.cni.is_cilium(), &args.cilium_dir) {
        (true, Some(dir)) => {
            crate::prereq::ensure_cilium_tools()?;
            crate::realcilium::check_binaries(dir)?;
            Some(dir.clone())
        }
        (true, None) => bail!(
            "--cni {:?} needs --cilium-dir (e2e/cilium/build.sh prints it)",
            args.cni
        ),
        (false, _) => None,
    };
    crate::prereq::ensure_cluster_tools()?;
    let bins = crate::prereq::binaries()?;
    let scenario: Scenario =
        serde_saphyr::from_str(&shape(args.cni)).context("the local cluster's built-in shape")?;
    let (mut lab, original, rt) = crate::session()?;
    let result = rt.block_on(async {
        let up = async {
            lab.set_scenario(&scenario.name)?;
            let topo = topology::build_network(&mut lab, &scenario, &bins, cilium.is_none())?;
            let started = Instant::now();
            let cp = start(&mut lab, &topo, &bin, &args, cilium.as_deref()).await?;
            eprintln!(
                "kuport-lab: cluster Ready in {:.1} s; description in {}",
                started.elapsed().as_secs_f64(),
                args.describe.display()
            );
            Ok::<_, anyhow::Error>(cp)
        };
        let cp = tokio::select! {
            cp = up => cp?,
            () = stop_signal() => bail!("interrupted while starting"),
        };
        stop_signal().await;
        eprintln!("kuport-lab: stopping the cluster");
        drop(cp);
        Ok(())
    });
    let _ = crate::runner::enter_netns_of(&original);
    let _ = std::fs::remove_file(&args.describe);
    let left = lab.teardown();
    if !left.is_empty() {
        bail!("teardown left: {}", left.join(", "));
    }
    result?;
    eprintln!("kuport-lab: cluster removed");
    Ok(ExitCode::SUCCESS)
}

async fn stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kuport-lab: cannot watch SIGTERM ({e}); stop with Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn node_specs(topo: &Topology, cilium: Option<&Path>) -> Vec<NodeSpec> {
    topo.nodes
        .iter()
        .map(|n| NodeSpec {
            name: n.name.clone(),
            netns: n.ns.clone(),
            mesh: n.mesh,
            public: n.public,
            pod_cidr: n.pod_cidr.clone(),
            cilium: cilium.map(Path::to_path_buf),
        })
        .collect()
}

/// The control plane, the Node objects (with their pod ranges), then per node containerd with
/// the images, kubelet and kube-proxy; waits until every node is Ready.
async fn start(
    lab: &mut Lab,
    topo: &Topology,
    bin: &Path,
    args: &ClusterArgs,
    cilium: Option<&Path>,
) -> Result<kuport_realapi::ControlPlane> {
    let specs = node_specs(topo, cilium);
    let settings = match cilium {
        Some(_) => crate::realcilium::config(args.cni, &args.cilium_set)?,
        None => Default::default(),
    };
    sys::ip(&["netns", "exec", UL_NS, "ip", "link", "set", "lo", "up"])?;
    // The API server dials a kubelet (logs, exec, port-forward) at its InternalIP, the mesh
    // address: reach it over the node's underlay address.
    for n in &specs {
        let underlay = topo.mesh_member(&n.name)?.underlay;
        sys::ip_in(UL_NS, &format!("route add {}/32 via {underlay}", n.mesh))?;
    }
    enter_netns(&Path::new("/run/netns").join(UL_NS))?;
    let listen: std::net::SocketAddrV4 = API_ADDR.parse().context("the API address")?;
    let options = kuport_realapi::Options {
        controllers: Vec::new(),
        listen: Some(listen),
    };
    let cluster = kuport_realapi::ClusterOptions {
        nodes: specs.iter().map(|n| n.name.clone()).collect(),
        node_monitor_grace_period: args.node_monitor_grace_period.clone(),
    };
    let cp = kuport_realapi::ControlPlane::start_cluster(bin, options, &cluster)
        .await
        .context("starting the control plane")?;
    std::fs::write(&topo.kubeconfig, cp.admin_kubeconfig_inline()?)
        .with_context(|| format!("writing {}", topo.kubeconfig.display()))?;
    let client = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    create_nodes(&nodes, &specs).await?;
    if let Some(cilium) = cilium {
        start_cilium_operator(lab, &client, topo, cilium, &settings).await?;
    }
    let mut containerd = Vec::new();
    for n in &specs {
        containerd.push(realnode::start_containerd(lab, n)?);
        for image in &args.images {
            realnode::import_image(n, image)?;
        }
        std::fs::write(
            n.dir().join("kubelet.kubeconfig"),
            cp.node_kubeconfig(&n.name)?,
        )
        .context("writing a kubelet's kubeconfig")?;
        std::fs::write(
            n.dir().join("kube-proxy.kubeconfig"),
            cp.admin_kubeconfig_inline()?,
        )
        .context("writing kube-proxy's kubeconfig")?;
    }
    for (n, pid) in specs.iter().zip(&containerd) {
        realnode::start_kubelet(lab, n, *pid, bin)?;
        realnode::start_kube_proxy(lab, n, bin, &n.dir().join("kube-proxy.kubeconfig"))?;
    }
    if let Some(cilium) = cilium {
        start_cilium_agents(lab, &nodes, &specs, &containerd, cilium, &settings).await?;
    }
    wait_ready(&nodes, &specs, lab).await?;
    let text = serde_json::to_string_pretty(&describe(topo, &topo.kubeconfig, &specs, args.cni))
        .context("encoding the description")?;
    kuport_testkit::fs::write_atomically(&args.describe, &text)
        .with_context(|| format!("writing {}", args.describe.display()))?;
    Ok(cp)
}

/// The Node objects, each with the lab's pod range (routed over the mesh to that node): the
/// kubelet finds its Node already there and keeps it.
async fn create_nodes(nodes: &Api<Node>, specs: &[NodeSpec]) -> Result<()> {
    for n in specs {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": n.name},
            "spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]},
        }))
        .context("building a Node")?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating Node {}", n.name))?;
    }
    Ok(())
}

/// Cilium's configuration first (kuport reads it too), then the operator, which registers the
/// CRDs every agent waits for.
async fn start_cilium_operator(
    lab: &mut Lab,
    client: &kube::Client,
    topo: &Topology,
    cilium: &Path,
    settings: &crate::realcilium::Config,
) -> Result<()> {
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kube-system");
    let map = serde_json::from_value(crate::realcilium::config_map(settings))
        .context("building cilium-config")?;
    maps.create(&PostParams::default(), &map)
        .await
        .context("creating kube-system/cilium-config")?;
    let data = Path::new(realnode::DATA_ROOT).join("cilium-operator");
    lab.create_host_dir(Path::new(realnode::DATA_ROOT))?;
    lab.add_data_dir(&data)?;
    crate::realcilium::start_operator(lab, cilium, &topo.kubeconfig, settings, &data)?;
    Ok(())
}

/// As a DaemonSet's agent would, each agent starts once its kubelet registered the Node's
/// addresses: an agent that finds none picks a node address of its own (here the underlay's),
/// and its peers then tunnel to that instead of the InternalIP. Every agent at once (each
/// compiles its datapath, the slow part), then each node's CNI configuration once its agent is
/// ready.
async fn start_cilium_agents(
    lab: &mut Lab,
    nodes: &Api<Node>,
    specs: &[NodeSpec],
    containerd: &[i32],
    cilium: &Path,
    settings: &crate::realcilium::Config,
) -> Result<()> {
    wait_addresses(nodes, specs).await?;
    for (n, pid) in specs.iter().zip(containerd) {
        crate::realcilium::start_agent(
            lab,
            n,
            *pid,
            cilium,
            &n.dir().join("kube-proxy.kubeconfig"),
            settings,
            &realnode::join_cgroup_line(&n.cgroup()),
        )?;
    }
    for n in specs {
        crate::realcilium::install_cni_config(lab, n, Duration::from_secs(300))?;
    }
    Ok(())
}

/// Waits until every kubelet registered its Node's InternalIP (the node's mesh address).
async fn wait_addresses(nodes: &Api<Node>, specs: &[NodeSpec]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut waiting = Vec::new();
        for n in specs {
            let node = nodes
                .get(&n.name)
                .await
                .with_context(|| format!("reading Node {}", n.name))?;
            let mesh = n.mesh.to_string();
            let registered = node
                .status
                .and_then(|s| s.addresses)
                .unwrap_or_default()
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == mesh);
            if !registered {
                waiting.push(n.name.clone());
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the kubelets of {} registered no InternalIP within 120 s",
                waiting.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn wait_ready(nodes: &Api<Node>, specs: &[NodeSpec], lab: &Lab) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let mut waiting = Vec::new();
        for n in specs {
            let node = nodes
                .get(&n.name)
                .await
                .with_context(|| format!("reading Node {}", n.name))?;
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if !ready {
                waiting.push(n.name.clone());
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = waiting
                .iter()
                .map(|n| {
                    let log = std::fs::read_to_string(lab.log_path(&format!("kubelet-{n}")))
                        .unwrap_or_default();
                    let lines: Vec<&str> = log.lines().collect();
                    format!(
                        "kubelet-{n}:\n{}",
                        lines[lines.len().saturating_sub(15)..].join("\n")
                    )
                })
                .collect();
            bail!(
                "nodes {} not Ready after 180 s\n{}",
                waiting.join(", "),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_parses_as_a_kindnet_scenario() {
        let s: Scenario = serde_saphyr::from_str(SHAPE).expect("parses");
        assert_eq!(s.cni, crate::scenario::Cni::Kindnet);
        assert_eq!(s.nodes.len(), 3);
        assert!(s.steps.is_empty());
    }

    #[test]
    fn real_cilium_takes_the_same_shape_with_its_own_cni() {
        for (name, cni) in [
            ("cilium-tunnel", Cni::CiliumTunnel),
            ("cilium-native", Cni::CiliumNative),
            ("kindnet", Cni::Kindnet),
        ] {
            assert_eq!(parse_cni(name), Ok(cni));
            let s: Scenario = serde_saphyr::from_str(&shape(cni)).expect("parses");
            assert_eq!(s.cni, cni);
            assert_eq!(s.nodes.len(), 3);
        }
        assert!(parse_cni("calico").is_err());
    }
}
