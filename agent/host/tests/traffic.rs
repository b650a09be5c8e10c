//! Traffic through kuport's rules in namespaces shaped like nodes, pods and clients: the pod sees
//! the client's own address and the reply comes from the address dialed, same node and cross
//! node, under a Cilium-like and a kindnet-like masquerade (the shapes first proven by hand with
//! a shell script of the original design), with negative controls that remove kuport's identity SNAT.
//! The conntrack sweep (`stale_flows.rs`) and the hardening (`hardening.rs`) are suites of their
//! own over the same shapes (`netns/topology.rs`).
//! Root only; own harness (see `netns/mod.rs`).
//! Clients inside the cluster through the applied rules alone (no agent): the node itself and
//! the pod itself dialing the published address, each with a control without the hairpin
//! entries.

mod netns;

use std::process::ExitCode;

use kuport_core::ir::{HostState, Rule};
use kuport_testkit::cluster::{Cluster, edge_and_worker, pm};
use kuport_testkit::netns::Netns;
use kuport_testkit::process::Proc;
use netns::topology::{
    Cni, DIALED, answer_field, answer_outcome, apply, assert_client_seen, child_apply_file, cni,
    cross_states, cross_topology, echo, node, pod, probe, public_client, responders,
    same_node_state, without_identity_snat,
};

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
        "the_node_itself_and_the_pod_itself_reach_the_mapping_through_its_published_address",
        same_node_inside_clients,
    ),
    (
        "the_accepting_node_itself_reaches_a_remote_pod_through_its_published_address",
        cross_node_inside_client,
    ),
];

const CHILDREN: &[netns::Test] = &[("apply_file", child_apply_file)];

fn main() -> ExitCode {
    netns::harness(TESTS, CHILDREN)
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

struct SameNode {
    client: Netns,
    node: Netns,
    pod: Netns,
    _responders: Vec<Proc>,
}

fn same_node_topology(style: Cni) -> SameNode {
    let node = node("sn-node");
    let client = public_client("sn-client", &node);
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
        pod,
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

// ---- clients inside the cluster ----

/// `kuport-echo ask` from `ns` to the published address: (outcome, the address that answered,
/// the peer the pod saw).
fn ask_published(ns: &Netns, proto: &str, port: u16) -> (String, String, String) {
    let out = ns.try_sh(&format!(
        "{} ask {proto} {DIALED}:{port} --timeout-ms 2000",
        echo()
    ));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (
        answer_outcome(&text),
        answer_field(&text, "from"),
        answer_field(&text, "peer"),
    )
}

/// `state` without the hairpin entries (what kuport held before serving inside clients).
fn without_hairpin(mut state: HostState) -> HostState {
    for (_, rules) in &mut state.nft.chains {
        rules.retain(|r| !matches!(r, Rule::Hairpin(_)));
    }
    state
}

fn same_node_inside_clients() {
    let t = same_node_topology(Cni::CiliumLike);
    let state = same_node_state(&same_node_cluster());
    apply(&t.node, &state);
    for proto in ["udp", "tcp"] {
        // The node's own process: through kup-out, its own address kept.
        let (outcome, from, peer) = ask_published(&t.node, proto, 3000);
        assert_eq!(outcome, "reply", "the node itself, {proto}");
        assert_eq!(
            from,
            format!("{DIALED}:3000"),
            "answered from the address dialed"
        );
        assert!(
            peer.starts_with(&format!("{DIALED}:")),
            "{proto}: the pod saw {peer}"
        );
        // The pod dialing its own mapping: masqueraded to the node's address on its interface.
        let (outcome, from, peer) = ask_published(&t.pod, proto, 3000);
        assert_eq!(outcome, "reply", "the pod itself, {proto}");
        assert_eq!(from, format!("{DIALED}:3000"));
        assert!(
            peer.starts_with("10.244.0.1:"),
            "{proto}: the pod saw {peer}"
        );
    }
    // An outside client still keeps its own address.
    assert_client_seen(&t.client, "udp", 3000, &[]);
    // Control: without the hairpin entries neither is served (nothing of the node listens: a
    // refusal, or silence when the kernel rate-limits its ICMP errors).
    apply(&t.node, &without_hairpin(state));
    for ns in [&t.node, &t.pod] {
        let (outcome, _, peer) = ask_published(ns, "udp", 3000);
        assert_ne!(
            outcome, "reply",
            "served without the hairpin entries: {peer}"
        );
    }
}

fn cross_node_inside_client() {
    let t = cross_topology(Cni::CiliumLike);
    let (edge, worker) = cross_states(true);
    apply(&t.edge, &edge);
    apply(&t.worker, &worker);
    for proto in ["udp", "tcp"] {
        // The edge's own process, under strict rp_filter: over the link, its address kept.
        let (outcome, from, peer) = ask_published(&t.edge, proto, 3000);
        assert_eq!(outcome, "reply", "the edge itself, {proto}");
        assert_eq!(from, format!("{DIALED}:3000"));
        assert!(
            peer.starts_with(&format!("{DIALED}:")),
            "{proto}: the pod saw {peer}"
        );
    }
    // Control: without the hairpin entries the edge's own packet stays on the edge.
    apply(&t.edge, &without_hairpin(edge));
    assert_ne!(ask_published(&t.edge, "udp", 3000).0, "reply");
}
