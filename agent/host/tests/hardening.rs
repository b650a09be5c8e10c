//! The datapath's hardening, each with a negative control that puts back the rule it
//! replaces: a flow's later packets behind an exit node's default route under strict
//! reverse-path filtering, the node's own connections from ports tenants map, and link frames to
//! every kind of destination against the link guard.
//! Root only; own harness (see `netns/mod.rs`).

mod netns;

use std::process::ExitCode;

use kuport_core::ir::{HostState, Rule};
use kuport_testkit::cluster::{edge_and_worker, facts, pm};
use kuport_testkit::netns::Netns;
use netns::namespace;
use netns::topology::{
    CLIENT, Cni, DIALED, apply, ask, assert_client_seen, child_apply_file, cni, cross_states,
    cross_topology, node, pod, probe, public_client, responders, wire,
};

const TESTS: &[netns::Test] = &[
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

const CHILDREN: &[netns::Test] = &[("apply_file", child_apply_file)];

fn main() -> ExitCode {
    netns::harness(TESTS, CHILDREN)
}

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
        .ports_per_namespace("public", 65536)
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
    let client = public_client("own-client", &node);
    let server = namespace("own-server");
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
