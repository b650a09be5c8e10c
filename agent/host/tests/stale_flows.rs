//! Conntrack entries of kuport's flows through real packets: when what a node translates
//! changes (the pod moves, the mapping goes and comes back), the apply's sweep deletes the
//! entries of flows no longer translated that way, so a long-lived flow follows the mapping at
//! its next packet, while every other entry (another mapping's, another table's DNAT, the
//! node's own service) keeps its kernel id; with negative controls that sweep nothing.
//! Root only; own harness (see `netns/mod.rs`).

mod netns;

use std::process::ExitCode;

use kuport_core::ir::HostState;
use kuport_host::conntrack::{ConntrackTable, KernelConntrack};
use kuport_host::{Host, LinuxHost};
use kuport_testkit::cluster::{edge_and_worker, facts, pm};
use kuport_testkit::netns::Netns;
use kuport_testkit::process::Proc;
use netns::topology::{
    CLIENT, Cni, DIALED, answer_field, answer_outcome, apply, apply_with, child_apply_file, cni,
    cross_cluster_with_gs_at, cross_states, cross_topology, echo, node, pod, public_client,
    same_node_state, wire,
};
use netns::{block_on, child, namespace};

const TESTS: &[netns::Test] = &[
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
];

const CHILDREN: &[netns::Test] = &[
    ("apply_file", child_apply_file),
    ("apply_file_without_sweep", child_apply_file_without_sweep),
    ("list_flows", child_list_flows),
];

fn main() -> ExitCode {
    netns::harness(TESTS, CHILDREN)
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
        assert!(!report.conntrack_sweep_asked);
    });
}

/// Prints this namespace's conntrack table, one flow a line: `<proto> <source> <destination>
/// <reply source> <mark> <id>` (the kernel's listing through kuport's own reader).
fn child_list_flows() {
    let mut flows = Vec::new();
    KernelConntrack
        .walk(&mut |f| {
            flows.push(f);
            std::ops::ControlFlow::Continue(())
        })
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

/// One ask of a flow from a fixed client port (a game client's socket): the outcome, the tag
/// of the responder that answered (empty for an untagged one) and the address it saw.
fn ask_flow(client: &Netns, port: u16, source_port: u16) -> (String, String, String) {
    let out = client.try_sh(&format!(
        "{} ask udp {DIALED}:{port} --timeout-ms 2000 --source-port {source_port}",
        echo()
    ));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (
        answer_outcome(&text),
        answer_field(&text, "tag"),
        answer_field(&text, "peer"),
    )
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
    let client = public_client("sf-client", &node);
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
