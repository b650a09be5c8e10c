//! Node, pod and client shapes for the traffic suites (`traffic.rs`, `stale_flows.rs`,
//! `hardening.rs`): namespaces wired like a cluster's nodes under an emulated CNI masquerade,
//! `kuport-echo` responders and probes, the apply of a plan's IR inside a node, and the
//! clusters and states those suites share (one node; an edge and a worker over a link).

use kuport_core::ir::{HostState, Rule};
use kuport_host::{Host, LinuxHost};
use kuport_testkit::cluster::{Cluster, edge_and_worker, facts, pm};
use kuport_testkit::netns::Netns;
use kuport_testkit::process::Proc;
use serde_json::json;

use super::{block_on, child, namespace, sh};

/// `kuport-echo` of this build (kuport-testkit's binary: cargo builds it for this test only when
/// it is missing or older than its source, and only once a test runs as root).
pub fn echo() -> &'static str {
    static ECHO: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ECHO.get_or_init(|| {
        let path = kuport_testkit::bins::echo().unwrap_or_else(|e| panic!("kuport-echo: {e:#}"));
        path.to_str().expect("a UTF-8 path").to_owned()
    })
}
pub const CLIENT: &str = "203.0.113.50";
pub const DIALED: &str = "203.0.113.9";

/// Applies the HostState in `KUPORT_STATE_FILE` in this namespace and exits once the sweep of
/// stale conntrack entries it asked for has ended; the kernel keeps it.
pub fn child_apply_file() {
    let path = std::env::var("KUPORT_STATE_FILE").expect("state file");
    let state: HostState =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("state");
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        host.apply(&state, true).await.expect("apply");
        assert!(
            host.wait_for_sweeps(std::time::Duration::from_secs(10))
                .await,
            "the conntrack sweep did not end"
        );
    });
}

pub fn apply(ns: &Netns, state: &HostState) {
    apply_with(ns, state, "apply_file");
}

pub fn apply_with(ns: &Netns, state: &HostState, body: &str) {
    let path = std::env::temp_dir().join(format!("{}-state.json", ns.name()));
    std::fs::write(&path, serde_json::to_string(state).expect("json")).expect("write state");
    child(
        ns,
        body,
        &[("KUPORT_STATE_FILE", path.to_str().expect("utf-8"))],
    );
    let _ = std::fs::remove_file(&path);
}

pub fn without_identity_snat(mut state: HostState) -> HostState {
    for (_, rules) in &mut state.nft.chains {
        rules.retain(|r| !matches!(r, Rule::IdentitySnat(_)));
    }
    state
}

/// Connects `a`'s new device `a_dev` to `b`'s new device `b_dev`.
pub fn wire(a: &Netns, a_dev: &str, a_addr: &str, b: &Netns, b_dev: &str, b_addr: &str) {
    sh(&format!(
        "ip link add {a_dev} netns {} type veth peer name {b_dev} netns {}",
        a.name(),
        b.name()
    ));
    a.sh(&format!(
        "ip addr add {a_addr} dev {a_dev} && ip link set {a_dev} up"
    ));
    b.sh(&format!(
        "ip addr add {b_addr} dev {b_dev} && ip link set {b_dev} up"
    ));
}

#[derive(Clone, Copy, PartialEq)]
pub enum Cni {
    CiliumLike,
    KindnetLike,
}

/// The emulated CNI masquerade of a node (`pod_cidr` is the node's own pod /24).
pub fn cni(node: &Netns, style: Cni, pod_cidr: &str, accepting: bool) {
    let rules = match style {
        Cni::CiliumLike => format!(
            "oifname \"cilium_host\" ip saddr != {pod_cidr} counter masquerade\n\
             ip saddr 10.244.0.0/16 oifname != \"cilium_*\" ip daddr != 10.244.0.0/16 counter masquerade"
        ),
        Cni::KindnetLike => {
            let mut r =
                "ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 counter masquerade".to_owned();
            if accepting {
                r.push_str("\noifname != \"lo\" ip daddr 169.254.0.0/16 counter masquerade");
            }
            r
        }
    };
    node.sh(&format!(
        "nft -f - <<'END'\ntable ip cni {{\n chain post {{ type nat hook postrouting priority srcnat; policy accept;\n{rules}\n }}\n}}\nEND"
    ));
}

pub fn node(tag: &str) -> Netns {
    let ns = namespace(tag);
    ns.sh("sysctl -qw net.ipv4.ip_forward=1");
    ns
}

pub fn pod(tag: &str, node: &Netns, addr: &str, gw: &str) -> Netns {
    let p = namespace(tag);
    wire(
        &p,
        "eth0",
        &format!("{addr}/24"),
        node,
        "cilium_host",
        &format!("{gw}/24"),
    );
    p.sh(&format!("ip route add default via {gw}"));
    p
}

/// Starts responders in the pod and waits until they listen.
pub fn responders(pod: &Netns, specs: &[(&str, &str)]) -> Vec<Proc> {
    specs
        .iter()
        .map(|(proto, ports)| {
            let mut proc = pod
                .spawn(echo(), &["serve", proto, ports])
                .expect("responder starts");
            let out = proc.take_stdout().expect("stdout");
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)
                .expect("ready line");
            assert_eq!(line.trim(), "ready", "responder {proto} {ports}");
            proc
        })
        .collect()
}

/// The internet client every suite dials from: namespace `name`, its `c0` at CLIENT wired to
/// `node`'s public interface `enp1s0` at DIALED.
pub fn public_client(name: &str, node: &Netns) -> Netns {
    let client = namespace(name);
    wire(
        &client,
        "c0",
        &format!("{CLIENT}/24"),
        node,
        "enp1s0",
        &format!("{DIALED}/24"),
    );
    client
}

/// One word of a `kuport-echo ask` answer line: the value of `key=`, empty when absent.
pub fn answer_field(text: &str, key: &str) -> String {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
        .to_owned()
}

/// The outcome of a `kuport-echo ask` answer line (`reply`, `timeout`, ...; `error` when empty).
pub fn answer_outcome(text: &str) -> String {
    text.split_whitespace().next().unwrap_or("error").to_owned()
}

/// Probes from the client; returns (outcome, peer the responder saw, client socket address).
pub fn probe(client: &Netns, proto: &str, port: u16, extra: &[&str]) -> (String, String, String) {
    ask(client, proto, &format!("{DIALED}:{port}"), extra)
}

/// `kuport-echo ask` from `client` to `target`; (outcome, peer the responder saw, client
/// socket address).
pub fn ask(client: &Netns, proto: &str, target: &str, extra: &[&str]) -> (String, String, String) {
    let mut args = vec!["ask", proto, target, "--timeout-ms", "3000"];
    args.extend_from_slice(extra);
    let out = client.try_sh(&format!("{} {}", echo(), args.join(" ")));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if text.is_empty() {
        eprintln!(
            "kuport-echo ask {target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (
        answer_outcome(&text),
        answer_field(&text, "peer"),
        answer_field(&text, "client"),
    )
}

pub fn assert_client_seen(client: &Netns, proto: &str, port: u16, extra: &[&str]) {
    let (outcome, peer, me) = probe(client, proto, port, extra);
    assert_eq!(
        outcome, "reply",
        "{proto} {port}: no reply from the dialed address"
    );
    assert_eq!(
        peer, me,
        "{proto} {port}: the pod saw {peer}, the client is {me}"
    );
    assert!(me.starts_with(CLIENT), "{me}");
}

pub fn same_node_state(c: &Cluster) -> HostState {
    let plan = c.plan_with("edge-a", &facts(&[("enp1s0", DIALED)], "enp1s0", 1500));
    assert!(!plan.host_state.nft.is_empty());
    plan.host_state
}

pub fn cross_cluster() -> Cluster {
    cross_cluster_with_gs_at("10.244.1.5")
}

/// The cross-node cluster with `games/gs`'s pod at `gs_address` on worker-b.
pub fn cross_cluster_with_gs_at(gs_address: &str) -> Cluster {
    edge_and_worker()
        .row("public", "worker-b", json!({}), 1500)
        .claim("public", "edge-a/worker-b", 0)
        .endpoint("games", "gs", "gs-0", "worker-b", gs_address, 3000)
        .endpoint_full(
            "games",
            "gt",
            "game",
            "TCP",
            "gs-0",
            "worker-b",
            "10.244.1.5",
            3000,
            None,
        )
        .endpoint("games", "range", "gs-0", "worker-b", "10.244.1.5", 4000)
        .portmap(pm("games", "gs", "public", 3000).ifaces(&["enp1s0"]))
        .portmap(pm("games", "gt", "public", 3000).tcp().ifaces(&["enp1s0"]))
        .portmap(
            pm("games", "range", "public", 4000)
                .end(4002)
                .ifaces(&["enp1s0"]),
        )
}

pub struct CrossNode {
    pub client: Netns,
    pub edge: Netns,
    pub worker: Netns,
    pub pod: Netns,
    pub responders: Vec<Proc>,
}

pub fn cross_topology(style: Cni) -> CrossNode {
    let edge = node("x-edge");
    let worker = node("x-worker");
    // Strict reverse-path filtering everywhere, as some distributions ship; new devices inherit
    // `default`.
    for n in [&edge, &worker] {
        n.sh("sysctl -qw net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.default.rp_filter=1");
    }
    let client = public_client("x-client", &edge);
    // The underlay both nodes' InternalIPs live on (the mesh, in the reference cluster).
    wire(
        &edge,
        "wt0",
        "100.64.0.1/24",
        &worker,
        "wt0",
        "100.64.0.2/24",
    );
    // Real nodes have a default route; the worker's leads to a gateway that does not exist, so a
    // reply that takes it is lost, as on a real site. (Even loose reverse-path filtering needs
    // some route back to the client's address.)
    worker.sh("ip route add default via 100.64.0.254");
    let pod = pod("x-pod", &worker, "10.244.1.5", "10.244.1.1");
    cni(&edge, style, "10.244.0.0/24", true);
    cni(&worker, style, "10.244.1.0/24", false);
    for n in [&edge, &worker] {
        n.sh("for f in /proc/sys/net/ipv4/conf/*/rp_filter; do case $f in */kup-*) ;; *) echo 1 > $f;; esac; done");
    }
    let responders = responders(
        &pod,
        &[("udp", "3000"), ("tcp", "3000"), ("udp", "4000-4002")],
    );
    CrossNode {
        client,
        edge,
        worker,
        pod,
        responders,
    }
}

pub fn cross_states(snat: bool) -> (HostState, HostState) {
    let c = cross_cluster();
    let edge = c
        .plan_with("edge-a", &facts(&[("enp1s0", DIALED)], "wt0", 1500))
        .host_state;
    let worker = c.plan_with("worker-b", &facts(&[], "wt0", 1500)).host_state;
    assert_eq!((edge.links.len(), worker.links.len()), (1, 1));
    if snat {
        (edge, worker)
    } else {
        (without_identity_snat(edge), without_identity_snat(worker))
    }
}
