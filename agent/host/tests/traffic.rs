//! Traffic through kuport's rules in namespaces shaped like nodes, pods and clients: the pod sees
//! the client's own address and the reply comes from the address dialed, same node and cross
//! node, under a Cilium-like and a kindnet-like masquerade (the shapes proven by hand in
//! `shared/reference/ctmark-proof.sh`), with negative controls that remove kuport's identity SNAT.
//! Then the hardening: a flow's later packets behind an exit node's default route, the node's
//! own connections from ports tenants map, and link frames to every kind of destination, each
//! with a control that puts back the rule it replaces.
//! Root only; own harness (see `netns/mod.rs`).

mod netns;

use std::process::ExitCode;

use kuport_core::ir::{HostState, Rule};
use kuport_host::conntrack::{ConntrackTable, KernelConntrack};
use kuport_host::{Host, LinuxHost};
use kuport_testkit::cluster::{Cluster, edge_and_worker, facts, pm};
use kuport_testkit::netns::Netns;
use kuport_testkit::process::Proc;
use netns::{block_on, child, namespace, sh};
use serde_json::json;

const TESTS: &[netns::Test] = &[
    (
        "same_node_udp_and_tcp_keep_the_client_address_under_cilium_like_masquerade",
        same_node_cilium,
    ),
    ("same_node_under_kindnet_like_masquerade", same_node_kindnet),
    (
        "without_identity_snat_the_pod_sees_the_node_under_cilium_like_masquerade",
        same_node_control,
    ),
    (
        "cross_node_keeps_the_client_address_under_both_masquerades_with_strict_rp_filter",
        cross_node,
    ),
    (
        "cross_node_without_identity_snat_the_pod_sees_a_masqueraded_address",
        cross_node_control,
    ),
    (
        "stale_flows_follow_the_mapping_and_every_other_entry_is_kept",
        stale_flows_same_node,
    ),
    (
        "without_the_sweep_a_long_lived_flow_stays_on_its_old_pod",
        stale_flows_control,
    ),
    (
        "the_pod_nodes_stale_flow_is_cleared_and_the_edges_kept",
        stale_flows_cross_node,
    ),
    (
        "later_packets_pass_strict_rp_filter_behind_an_exit_nodes_default_route",
        exit_node_later_packets,
    ),
    (
        "the_nodes_own_connections_keep_their_replies_across_mapped_ranges",
        own_connections,
    ),
    (
        "the_guard_drops_broadcast_multicast_and_strangers_frames_on_every_interface",
        guard_destinations,
    ),
];

const CHILDREN: &[netns::Test] = &[
    ("apply_file", child_apply_file),
    ("apply_file_without_sweep", child_apply_file_without_sweep),
    ("list_flows", child_list_flows),
];

fn main() -> ExitCode {
    netns::harness(TESTS, CHILDREN)
}

/// `kuport-echo` of this build (kuport-testkit's binary: cargo builds it for this test only when
/// it is missing or older than its source, and only once a test runs as root).
fn echo() -> &'static str {
    static ECHO: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ECHO.get_or_init(|| {
        let path = kuport_testkit::bins::echo().unwrap_or_else(|e| panic!("kuport-echo: {e:#}"));
        path.to_str().expect("a UTF-8 path").to_owned()
    })
}
const CLIENT: &str = "203.0.113.50";
const DIALED: &str = "203.0.113.9";

/// Applies the HostState in `KUPORT_STATE_FILE` in this namespace and exits; the kernel keeps it.
fn child_apply_file() {
    let path = std::env::var("KUPORT_STATE_FILE").expect("state file");
    let state: HostState =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("state");
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        host.apply(&state, true).await.expect("apply");
    });
}

/// The same with a host that sweeps no conntrack table: the datapath change alone.
fn child_apply_file_without_sweep() {
    let path = std::env::var("KUPORT_STATE_FILE").expect("state file");
    let state: HostState =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("state");
    block_on(async {
        let (conn, handle, _) = rtnetlink::new_connection().expect("netlink");
        tokio::spawn(conn);
        let mut host = LinuxHost::with_backends(
            kuport_host::netlink::RtNetlink::new(handle),
            kuport_host::nft::Nft::new(),
        );
        let report = host.apply(&state, true).await.expect("apply");
        assert!(!report.conntrack_swept);
    });
}

/// Prints this namespace's conntrack table, one flow a line: `<proto> <source> <destination>
/// <reply source> <mark> <id>` (the kernel's listing through kuport's own reader).
fn child_list_flows() {
    let flows = KernelConntrack
        .flows()
        .expect("listing the conntrack table");
    for f in flows {
        println!(
            "{} {} {} {} {:#x} {}",
            f.protocol.lower(),
            f.source,
            f.destination,
            f.reply_source,
            f.mark,
            f.id.unwrap_or(0)
        );
    }
}

fn apply(ns: &Netns, state: &HostState) {
    apply_with(ns, state, "apply_file");
}

fn apply_with(ns: &Netns, state: &HostState, body: &str) {
    let path = std::env::temp_dir().join(format!("{}-state.json", ns.name()));
    std::fs::write(&path, serde_json::to_string(state).expect("json")).expect("write state");
    child(
        ns,
        body,
        &[("KUPORT_STATE_FILE", path.to_str().expect("utf-8"))],
    );
    let _ = std::fs::remove_file(&path);
}

fn without_identity_snat(mut state: HostState) -> HostState {
    for (_, rules) in &mut state.nft.chains {
        rules.retain(|r| !matches!(r, Rule::IdentitySnat(_)));
    }
    state
}

/// Connects `a`'s new device `a_dev` to `b`'s new device `b_dev`.
fn wire(a: &Netns, a_dev: &str, a_addr: &str, b: &Netns, b_dev: &str, b_addr: &str) {
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
enum Cni {
    CiliumLike,
    KindnetLike,
}

/// The emulated CNI masquerade of a node (`pod_cidr` is the node's own pod /24).
fn cni(node: &Netns, style: Cni, pod_cidr: &str, accepting: bool) {
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

fn node(tag: &str) -> Netns {
    let ns = namespace(tag);
    ns.sh("sysctl -qw net.ipv4.ip_forward=1");
    ns
}

fn pod(tag: &str, node: &Netns, addr: &str, gw: &str) -> Netns {
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
fn responders(pod: &Netns, specs: &[(&str, &str)]) -> Vec<Proc> {
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

/// Probes from the client; returns (outcome, peer the responder saw, client socket address).
fn probe(client: &Netns, proto: &str, port: u16, extra: &[&str]) -> (String, String, String) {
    ask(client, proto, &format!("{DIALED}:{port}"), extra)
}

/// `kuport-echo ask` from `client` to `target`; (outcome, peer the responder saw, client
/// socket address).
fn ask(client: &Netns, proto: &str, target: &str, extra: &[&str]) -> (String, String, String) {
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
    let field = |k: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_owned()
    };
    let outcome = text.split_whitespace().next().unwrap_or("error").to_owned();
    (outcome, field("peer"), field("client"))
}

fn assert_client_seen(client: &Netns, proto: &str, port: u16, extra: &[&str]) {
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

// ---- same node ----

fn same_node_cluster() -> Cluster {
    edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .endpoint_full(
            "games",
            "gt",
            "game",
            "TCP",
            "gs-0",
            "edge-a",
            "10.244.0.5",
            3000,
            None,
        )
        .endpoint("games", "range", "gs-0", "edge-a", "10.244.0.5", 4000)
        .endpoint("games", "moved", "gs-0", "edge-a", "10.244.0.5", 6000)
        .portmap(pm("games", "gs", "public", 3000).ifaces(&["enp1s0"]))
        .portmap(pm("games", "gt", "public", 3000).tcp().ifaces(&["enp1s0"]))
        .portmap(
            pm("games", "range", "public", 4000)
                .end(4002)
                .ifaces(&["enp1s0"]),
        )
        .portmap(pm("games", "moved", "public", 5000).ifaces(&["enp1s0"]))
}

fn same_node_state(c: &Cluster) -> HostState {
    let plan = c.plan_with("edge-a", &facts(&[("enp1s0", DIALED)], "enp1s0", 1500));
    assert!(!plan.host_state.nft.is_empty());
    plan.host_state
}

struct SameNode {
    client: Netns,
    node: Netns,
    _pod: Netns,
    _responders: Vec<Proc>,
}

fn same_node_topology(style: Cni) -> SameNode {
    let node = node("sn-node");
    let client = namespace("sn-client");
    wire(
        &client,
        "c0",
        &format!("{CLIENT}/24"),
        &node,
        "enp1s0",
        &format!("{DIALED}/24"),
    );
    let pod = pod("sn-pod", &node, "10.244.0.5", "10.244.0.1");
    cni(&node, style, "10.244.0.0/24", true);
    let responders = responders(
        &pod,
        &[
            ("udp", "3000"),
            ("tcp", "3000"),
            ("udp", "4000-4002"),
            ("udp", "6000"),
        ],
    );
    SameNode {
        client,
        node,
        _pod: pod,
        _responders: responders,
    }
}

fn same_node_cilium() {
    let t = same_node_topology(Cni::CiliumLike);
    let c = same_node_cluster();
    apply(&t.node, &same_node_state(&c));
    assert_client_seen(&t.client, "udp", 3000, &[]);
    assert_client_seen(&t.client, "tcp", 3000, &[]);
    assert_client_seen(&t.client, "tcp", 3000, &["--bulk", "300000"]);
    for port in 4000..=4002 {
        assert_client_seen(&t.client, "udp", port, &[]);
    }
    assert_client_seen(&t.client, "udp", 5000, &[]);
    // A port no mapping holds refuses.
    assert_eq!(probe(&t.client, "udp", 3999, &[]).0, "refused");

    // Counters: the mapping counted the probes, and an update to another mapping keeps them.
    let counter = |name: &str| -> u64 {
        let out = t.node.sh(&format!("nft -j list counter ip kuport {name}"));
        let json: serde_json::Value = serde_json::from_str(&out).expect("json");
        json["nftables"][1]["counter"]["packets"]
            .as_u64()
            .expect("packets")
    };
    let before = counter("pre/games/gs");
    assert!(before >= 1, "the DNAT counter of games/gs counted nothing");
    let mut fewer = c.clone();
    fewer
        .snapshot
        .portmaps
        .retain(|p| p.metadata.name.as_deref() != Some("range"));
    apply(&t.node, &same_node_state(&fewer));
    assert_eq!(
        counter("pre/games/gs"),
        before,
        "the unchanged mapping's counter survived the update"
    );
    assert_eq!(
        probe(&t.client, "udp", 4000, &[]).0,
        "refused",
        "the removed mapping refuses"
    );
}

fn same_node_kindnet() {
    let t = same_node_topology(Cni::KindnetLike);
    apply(&t.node, &same_node_state(&same_node_cluster()));
    assert_client_seen(&t.client, "udp", 3000, &[]);
    assert_client_seen(&t.client, "tcp", 3000, &[]);
}

fn same_node_control() {
    let t = same_node_topology(Cni::CiliumLike);
    apply(
        &t.node,
        &without_identity_snat(same_node_state(&same_node_cluster())),
    );
    let (outcome, peer, _) = probe(&t.client, "udp", 3000, &[]);
    assert_eq!(outcome, "reply");
    assert!(
        peer.starts_with("10.244.0.1:"),
        "without kuport's identity SNAT the pod sees the node, saw {peer}"
    );
}

// ---- cross node ----

fn cross_cluster() -> Cluster {
    cross_cluster_with_gs_at("10.244.1.5")
}

/// The cross-node cluster with `games/gs`'s pod at `gs_address` on worker-b.
fn cross_cluster_with_gs_at(gs_address: &str) -> Cluster {
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

struct CrossNode {
    client: Netns,
    edge: Netns,
    worker: Netns,
    pod: Netns,
    responders: Vec<Proc>,
}

fn cross_topology(style: Cni) -> CrossNode {
    let edge = node("x-edge");
    let worker = node("x-worker");
    // Strict reverse-path filtering everywhere, as some distributions ship; new devices inherit
    // `default`.
    for n in [&edge, &worker] {
        n.sh("sysctl -qw net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.default.rp_filter=1");
    }
    let client = namespace("x-client");
    wire(
        &client,
        "c0",
        &format!("{CLIENT}/24"),
        &edge,
        "enp1s0",
        &format!("{DIALED}/24"),
    );
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

fn cross_states(snat: bool) -> (HostState, HostState) {
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

fn cross_node() {
    for style in [Cni::CiliumLike, Cni::KindnetLike] {
        let mut t = cross_topology(style);
        let (edge, worker) = cross_states(true);
        apply(&t.edge, &edge);
        apply(&t.worker, &worker);
        for n in [&t.edge, &t.worker] {
            let strict = n.sh("cat /proc/sys/net/ipv4/conf/all/rp_filter");
            assert_eq!(strict.trim(), "1", "rp_filter stays strict on the host");
        }
        assert_client_seen(&t.client, "udp", 3000, &[]);
        assert_client_seen(&t.client, "tcp", 3000, &[]);
        assert_client_seen(&t.client, "tcp", 3000, &["--bulk", "300000"]);
        for port in 4000..=4002 {
            assert_client_seen(&t.client, "udp", port, &[]);
        }
        // A stopped responder's ICMP port-unreachable follows the flow back to the client, which
        // takes it as an answer to what it dialed.
        t.responders[0].stop(std::time::Duration::ZERO);
        assert_eq!(probe(&t.client, "udp", 3000, &[]).0, "refused");
        let _ = &t.pod;
    }
}

fn cross_node_control() {
    for (style, seen) in [
        (Cni::CiliumLike, "10.244.1.1:"),
        (Cni::KindnetLike, "169.254.77.0:"),
    ] {
        let t = cross_topology(style);
        let (edge, worker) = cross_states(false);
        apply(&t.edge, &edge);
        apply(&t.worker, &worker);
        let (outcome, peer, _) = probe(&t.client, "udp", 3000, &[]);
        assert_eq!(outcome, "reply");
        assert!(
            peer.starts_with(seen),
            "without identity SNAT the pod should see {seen}…, saw {peer}"
        );
    }
}

// ---- stale flows ----

/// One ask of a flow from a fixed client port (a game client's socket): the outcome, the tag
/// of the responder that answered (empty for an untagged one) and the address it saw.
fn ask_flow(client: &Netns, port: u16, source_port: u16) -> (String, String, String) {
    let out = client.try_sh(&format!(
        "{} ask udp {DIALED}:{port} --timeout-ms 2000 --source-port {source_port}",
        echo()
    ));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let field = |k: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_owned()
    };
    let outcome = text.split_whitespace().next().unwrap_or("error").to_owned();
    (outcome, field("tag"), field("peer"))
}

/// The flow from `source_port` is answered by the responder tagged `tag`, which saw the
/// client's own address and port.
fn assert_answered_by(client: &Netns, port: u16, source_port: u16, tag: &str) {
    let (outcome, got, peer) = ask_flow(client, port, source_port);
    assert_eq!(
        (outcome.as_str(), got.as_str()),
        ("reply", tag),
        "the flow from :{source_port} to :{port}"
    );
    assert_eq!(peer, format!("{CLIENT}:{source_port}"), "what the pod saw");
}

/// This namespace's conntrack entries of the client, by its source port: `<destination>
/// <reply source> <mark> <id>`.
fn client_flows(ns: &Netns) -> std::collections::BTreeMap<u16, String> {
    child(ns, "list_flows", &[])
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let source: std::net::SocketAddrV4 = words.get(1)?.parse().ok()?;
            (source.ip().to_string() == CLIENT).then(|| (source.port(), words[2..].join(" ")))
        })
        .collect()
}

/// Starts UDP responders tagged `tag` on `ports` in `ns` and waits until they listen.
fn tagged_responder(ns: &Netns, ports: &str, tag: &str) -> Proc {
    let mut proc = ns
        .spawn(echo(), &["serve", "udp", ports, "--tag", tag])
        .expect("responder starts");
    let out = proc.take_stdout().expect("stdout");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).expect("ready line");
    assert_eq!(line.trim(), "ready", "responder {tag} on {ports}");
    proc
}

/// A node accepting on enp1s0 with two pods, `a` (10.244.0.5) and `b` (10.244.2.5), a
/// responder of the node's own on UDP 9000, and another table's DNAT of UDP 7000 to pod `a`
/// that marks its flows with bits outside kuport's mask (netbird's).
struct StaleTopology {
    client: Netns,
    node: Netns,
    _pods: Vec<Netns>,
    _responders: Vec<Proc>,
}

fn stale_topology() -> StaleTopology {
    let node = node("sf-node");
    let client = namespace("sf-client");
    wire(
        &client,
        "c0",
        &format!("{CLIENT}/24"),
        &node,
        "enp1s0",
        &format!("{DIALED}/24"),
    );
    let a = pod("sf-pod-a", &node, "10.244.0.5", "10.244.0.1");
    let b = namespace("sf-pod-b");
    wire(&b, "eth0", "10.244.2.5/24", &node, "pod_b", "10.244.2.1/24");
    b.sh("ip route add default via 10.244.2.1");
    cni(&node, Cni::CiliumLike, "10.244.0.0/24", true);
    node.sh(
        "nft -f - <<'END'\ntable ip foreign {\n chain pre { type nat hook prerouting priority dstnat; policy accept;\n  udp dport 7000 ct mark set 0x1bd00 dnat to 10.244.0.5:3000\n }\n}\nEND",
    );
    let responders = vec![
        tagged_responder(&a, "3000", "a"),
        tagged_responder(&a, "5000", "a"),
        tagged_responder(&b, "3000", "b"),
        tagged_responder(&node, "9000", "node"),
    ];
    StaleTopology {
        client,
        node,
        _pods: vec![a, b],
        _responders: responders,
    }
}

/// `games/gs` (UDP 3000) and `games/other` (UDP 5000) with `gs`'s pod at `gs_pod`, or without
/// `gs` at all.
fn stale_state(gs_pod: Option<&str>) -> HostState {
    let mut c = edge_and_worker()
        .endpoint("games", "other", "pod-a", "edge-a", "10.244.0.5", 5000)
        .portmap(pm("games", "other", "public", 5000).ifaces(&["enp1s0"]));
    if let Some(addr) = gs_pod {
        c = c
            .endpoint("games", "gs", "gs", "edge-a", addr, 3000)
            .portmap(pm("games", "gs", "public", 3000).ifaces(&["enp1s0"]));
    }
    same_node_state(&c)
}

/// A client keeps one UDP flow per mapping; the mapping's pod changes, the mapping goes and
/// comes back. Each time the flow follows what is programmed at its next packet, while the
/// entries of another mapping's flow, another table's DNAT and the node's own service are
/// left exactly as they were (same kernel id).
fn stale_flows_same_node() {
    let t = stale_topology();
    apply(&t.node, &stale_state(Some("10.244.0.5")));
    assert_answered_by(&t.client, 3000, 40000, "a");
    assert_answered_by(&t.client, 5000, 40001, "a");
    let (outcome, tag, _) = ask_flow(&t.client, 7000, 40002);
    assert_eq!(
        (outcome.as_str(), tag.as_str()),
        ("reply", "a"),
        "foreign DNAT"
    );
    assert_answered_by(&t.client, 9000, 40003, "node");
    let before = client_flows(&t.node);
    assert_eq!(
        before.keys().copied().collect::<Vec<_>>(),
        [40000, 40001, 40002, 40003],
        "{before:?}"
    );
    assert!(before[&40000].starts_with("203.0.113.9:3000 10.244.0.5:3000 0x1 "));
    assert!(before[&40002].contains(" 0x1bd00 "), "{before:?}");

    // The endpoint moves to pod b.
    apply(&t.node, &stale_state(Some("10.244.2.5")));
    let after = client_flows(&t.node);
    assert!(
        !after.contains_key(&40000),
        "the moved flow's entry is gone"
    );
    for port in [40001, 40002, 40003] {
        assert_eq!(
            after.get(&port),
            before.get(&port),
            "entry of :{port} untouched"
        );
    }
    assert_answered_by(&t.client, 3000, 40000, "b");

    // The mapping is deleted: the same flow is answered by nobody.
    apply(&t.node, &stale_state(None));
    assert_eq!(ask_flow(&t.client, 3000, 40000).0, "refused");
    assert_answered_by(&t.client, 5000, 40001, "a");

    // Mapped again while the client keeps sending: its flow, which had reached the node
    // itself, now reaches the pod.
    apply(&t.node, &stale_state(Some("10.244.2.5")));
    assert_answered_by(&t.client, 3000, 40000, "b");
}

/// Negative control: the same changes applied by a host that sweeps nothing. The rules
/// change (a new flow reaches pod b), but the kernel keeps the long-lived flow on its first
/// target, pod a, after the endpoint moved and even after the mapping is deleted.
fn stale_flows_control() {
    let t = stale_topology();
    apply(&t.node, &stale_state(Some("10.244.0.5")));
    assert_answered_by(&t.client, 3000, 40000, "a");
    apply_with(
        &t.node,
        &stale_state(Some("10.244.2.5")),
        "apply_file_without_sweep",
    );
    assert_answered_by(&t.client, 3000, 40010, "b");
    assert_answered_by(&t.client, 3000, 40000, "a");
    apply_with(&t.node, &stale_state(None), "apply_file_without_sweep");
    assert_eq!(ask_flow(&t.client, 3000, 40011).0, "refused");
    assert_answered_by(&t.client, 3000, 40000, "a");
}

/// Cross node: the pod moves to another pod on the same worker. The edge still sends the
/// mapping over the same link, so its entry is kept (its fresh host sweeps and finds it
/// current); the worker's entry, marked with the arrival link, is cleared, and the flow
/// reaches the new pod.
fn stale_flows_cross_node() {
    let t = cross_topology(Cni::CiliumLike);
    let b = namespace("x-pod-b");
    wire(
        &b,
        "eth0",
        "10.244.3.5/24",
        &t.worker,
        "pod_b",
        "10.244.3.1/24",
    );
    b.sh("ip route add default via 10.244.3.1");
    let _b_responder = tagged_responder(&b, "3000", "b");
    let (edge, worker) = cross_states(true);
    apply(&t.edge, &edge);
    apply(&t.worker, &worker);
    assert_answered_by(&t.client, 3000, 40000, "");
    let edge_before = client_flows(&t.edge);
    let worker_before = client_flows(&t.worker);
    assert!(edge_before[&40000].contains(" 0x1 "), "{edge_before:?}");
    assert!(
        worker_before[&40000].starts_with("169.254.77.1:3000 10.244.1.5:3000 0x2 "),
        "{worker_before:?}"
    );

    let moved = cross_cluster_with_gs_at("10.244.3.5");
    let edge_moved = moved
        .plan_with("edge-a", &facts(&[("enp1s0", DIALED)], "wt0", 1500))
        .host_state;
    let worker_moved = moved
        .plan_with("worker-b", &facts(&[], "wt0", 1500))
        .host_state;
    assert_eq!(edge_moved, edge, "the edge sends the mapping the same way");
    assert_ne!(worker_moved, worker);
    apply(&t.edge, &edge_moved);
    apply(&t.worker, &worker_moved);
    assert_eq!(
        client_flows(&t.edge),
        edge_before,
        "the edge's entry is kept"
    );
    assert!(!client_flows(&t.worker).contains_key(&40000));
    assert_answered_by(&t.client, 3000, 40000, "b");
}

// ---- hardening ----

/// An internet client behind a router, and an exit node's mesh table (netbird's shape): the
/// edge reaches the client's network only by its main table's default route, which netbird's
/// rule at 105 leaves out, so without kuport's mark the reverse path to the client is the mesh
/// and strict reverse-path filtering drops what came in on enp1s0. The client namespace plays
/// the router (its own address on the link stays the ARP source).
const FAR_CLIENT: &str = "198.51.100.10";

fn exit_node_routes(edge: &Netns, client: &Netns) {
    edge.sh(&format!(
        "ip rule add pref 105 lookup main suppress_prefixlength 0 \
         && ip rule add pref 110 lookup 7120 && ip route add default dev wt0 table 7120 \
         && ip route add default via {CLIENT} dev enp1s0"
    ));
    client.sh(&format!(
        "sysctl -qw net.ipv4.conf.all.arp_announce=2 net.ipv4.conf.c0.arp_announce=2 \
         && ip addr add {FAR_CLIENT}/32 dev c0 \
         && ip route replace {DIALED}/32 dev c0 src {FAR_CLIENT}"
    ));
}

fn without_request_mark_restore(mut state: HostState) -> HostState {
    for (_, rules) in &mut state.nft.chains {
        rules.retain(|r| !matches!(r, Rule::RestoreRequestMark { .. }));
    }
    state
}

fn exit_node_later_packets() {
    for restore in [true, false] {
        let t = cross_topology(Cni::CiliumLike);
        exit_node_routes(&t.edge, &t.client);
        let (edge, worker) = cross_states(true);
        let edge = if restore {
            edge
        } else {
            without_request_mark_restore(edge)
        };
        apply(&t.edge, &edge);
        apply(&t.worker, &worker);
        // One datagram is a flow's first packet, marked by the steering stage either way.
        let (outcome, peer, me) = probe(&t.client, "udp", 3000, &[]);
        assert_eq!(
            outcome, "reply",
            "restore {restore}: the first packet passes"
        );
        assert!(peer == me && me.starts_with(FAR_CLIENT), "{peer} {me}");
        let (outcome, _, _) = probe(&t.client, "tcp", 3000, &["--bulk", "300000"]);
        if restore {
            assert_eq!(outcome, "reply", "every packet of the flow passes");
        } else {
            // Control: the SYN passes, the rest of the flow is dropped by the strict check.
            assert_eq!(
                outcome, "timeout",
                "without the restore, later packets are dropped"
            );
        }
    }
}

// ---- the node's own connections ----

const SERVER: &str = "100.64.0.2";

/// UDP and TCP over the whole ephemeral range (32768-60999) on both of the node's interfaces,
/// to its own pod.
fn ephemeral_state() -> HostState {
    // The administrator opted the class in to the whole range (50000-50001 are node service
    // ports the default keeps back).
    let c = edge_and_worker()
        .without_system_reserved("public")
        .endpoint("games", "eph", "eph-0", "edge-a", "10.244.0.5", 32768)
        .endpoint_full(
            "games",
            "eph-tcp",
            "game",
            "TCP",
            "eph-0",
            "edge-a",
            "10.244.0.5",
            32768,
            None,
        )
        .portmap(pm("games", "eph", "public", 32768).end(60999))
        .portmap(pm("games", "eph-tcp", "public", 32768).end(60999).tcp());
    let f = facts(&[("enp1s0", DIALED), ("wt0", "100.64.0.1")], "wt0", 1500);
    let plan = c.plan_with("edge-a", &f);
    assert!(!plan.host_state.nft.is_empty());
    plan.host_state
}

/// The stateless steering rule kuport wrote before: every packet to a mapped port, replies of
/// the node's own connections too.
const OLD_STEER: &str = "iifname . ip daddr . meta l4proto . th dport @steer-mark-0x00000001-range ct mark set ct mark & 0xffffff01 | 0x00000001 ip daddr set 169.254.107.1";

fn own_connections() {
    let node = node("own-node");
    let client = namespace("own-client");
    let server = namespace("own-server");
    wire(
        &client,
        "c0",
        &format!("{CLIENT}/24"),
        &node,
        "enp1s0",
        &format!("{DIALED}/24"),
    );
    wire(
        &server,
        "s0",
        &format!("{SERVER}/24"),
        &node,
        "wt0",
        "100.64.0.1/24",
    );
    let pod = pod("own-pod", &node, "10.244.0.5", "10.244.0.1");
    cni(&node, Cni::CiliumLike, "10.244.0.0/24", true);
    let _pod_side = responders(&pod, &[("udp", "45000"), ("tcp", "45000")]);
    let _servers = [
        responders(&server, &[("udp", "7000"), ("tcp", "7000")]),
        responders(&client, &[("udp", "7000"), ("tcp", "7000")]),
    ];
    apply(&node, &ephemeral_state());
    // An outside client still reaches the mapping on a port of the range.
    assert_client_seen(&client, "udp", 45000, &[]);
    assert_client_seen(&client, "tcp", 45000, &[]);
    // The node's own connections from ports of the range, over the mesh (kubelet to the API
    // server) and out of its public interface, and a pod's connection masqueraded behind the
    // public address: each gets its replies.
    let own = |from: &Netns, proto: &str, target: &str, port: u16| {
        let port = port.to_string();
        ask(from, proto, target, &["--source-port", &port])
    };
    let mut port = 40000;
    for proto in ["udp", "tcp"] {
        for (from, target) in [
            (&node, format!("{SERVER}:7000")),
            (&node, format!("{CLIENT}:7000")),
            (&pod, format!("{CLIENT}:7000")),
        ] {
            port += 1;
            let (outcome, _, me) = own(from, proto, &target, port);
            assert_eq!(outcome, "reply", "{proto} to {target} from port {port}");
            assert!(me.ends_with(&format!(":{port}")), "{me}");
        }
    }
    // Control: with the stateless rule back, the node's own connection loses its replies.
    node.sh(&format!(
        "nft insert rule ip kuport kup-steer '{OLD_STEER}'"
    ));
    for proto in ["udp", "tcp"] {
        port += 1;
        let (outcome, _, _) = own(&node, proto, &format!("{SERVER}:7000"), port);
        assert_eq!(outcome, "timeout", "{proto}: the old rule steals the reply");
    }
}

// ---- the link guard ----

/// Frames for the accepting node's link (its VNI and port), from `ns` out of `dev`, aimed at
/// `remote` (a group for a multicast address) from `local`: an attacker's own VXLAN device,
/// pretending to be the link's far end and asking for the near end's address.
fn inject(ns: &Netns, dev: &str, local: &str, remote: &str) {
    // Without ping nothing is sent and every "not reached" below would hold vacuously.
    assert!(
        std::process::Command::new("sh")
            .args(["-c", "command -v ping"])
            .status()
            .is_ok_and(|s| s.success()),
        "ping is missing (apt-get install iputils-ping): the injection needs it"
    );
    let target = if remote
        .parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.is_multicast())
    {
        format!("group {remote}")
    } else {
        format!("remote {remote}")
    };
    ns.sh(&format!(
        "ip link add evil type vxlan id 4242 {target} local {local} dstport 4790 dev {dev} \
         && ip addr add 169.254.77.1/31 dev evil && ip link set evil up \
         && (ping -c 2 -i 0.2 -W 1 169.254.77.0 >/dev/null 2>&1; ip link del evil)"
    ));
}

fn link_rx(node: &Netns) -> u64 {
    node.sh("cat /sys/class/net/kup-*/statistics/rx_packets")
        .trim()
        .parse()
        .expect("rx_packets")
}

fn guard_drops(node: &Netns) -> u64 {
    let out = node.sh("nft -j list counter ip kuport guard/4790");
    let json: serde_json::Value = serde_json::from_str(&out).expect("json");
    json["nftables"][1]["counter"]["packets"]
        .as_u64()
        .expect("packets")
}

/// The link guard kuport wrote before: the peer's frames to any address, and drops only for
/// the node's own addresses.
const OLD_GUARD: [&str; 2] = [
    "iifname \"wt0\" ip saddr 100.64.0.2 udp dport 4790 notrack accept",
    "udp dport 4790 fib daddr type local counter name \"guard/4790\" drop",
];

fn guard_destinations() {
    // The accepting node of the golden case (link to 100.64.0.2, VNI 4242, port 4790); the
    // mesh side holds the link peer's address and a VPN client's, the public side a neighbour.
    let node = node("guard-node");
    let mesh = namespace("guard-mesh");
    let public = namespace("guard-pub");
    wire(&mesh, "m0", "100.64.0.2/16", &node, "wt0", "100.64.0.1/16");
    mesh.sh("ip addr add 100.64.1.1/16 dev m0");
    wire(
        &public,
        "p0",
        "203.0.113.20/24",
        &node,
        "enp1s0",
        &format!("{DIALED}/24"),
    );
    apply(&node, &netns::golden_ir("accepting-remote-pod"));
    let attacks: [(&Netns, &str, &str, &str); 8] = [
        (&mesh, "m0", "100.64.1.1", "100.64.255.255"),
        (&mesh, "m0", "100.64.1.1", "255.255.255.255"),
        (&mesh, "m0", "100.64.1.1", "224.0.0.1"),
        (&mesh, "m0", "100.64.1.1", "100.64.0.1"),
        (&public, "p0", "203.0.113.20", "203.0.113.255"),
        (&public, "p0", "203.0.113.20", DIALED),
        // The link peer itself, to anything but the node's own address.
        (&mesh, "m0", "100.64.0.2", "100.64.255.255"),
        (&mesh, "m0", "100.64.0.2", "224.0.0.1"),
    ];
    for (ns, dev, local, remote) in attacks {
        let (rx, drops) = (link_rx(&node), guard_drops(&node));
        inject(ns, dev, local, remote);
        assert_eq!(link_rx(&node), rx, "{local} -> {remote} reached the link");
        assert!(
            guard_drops(&node) > drops,
            "{local} -> {remote} not counted"
        );
    }
    // The peer's unicast frames arrive (the link works).
    let rx = link_rx(&node);
    inject(&mesh, "m0", "100.64.0.2", "100.64.0.1");
    assert!(link_rx(&node) > rx, "the peer's frames must reach the link");
    // Control: the old guard lets broadcast and multicast frames in, a peer's and a
    // stranger's.
    node.sh("nft flush chain ip kuport kup-guard");
    for rule in OLD_GUARD {
        node.sh(&format!("nft add rule ip kuport kup-guard '{rule}'"));
    }
    for (local, remote) in [
        ("100.64.1.1", "100.64.255.255"),
        ("100.64.1.1", "224.0.0.1"),
        ("100.64.0.2", "255.255.255.255"),
    ] {
        let rx = link_rx(&node);
        inject(&mesh, "m0", local, remote);
        assert!(link_rx(&node) > rx, "control: {local} -> {remote} got in");
    }
}
