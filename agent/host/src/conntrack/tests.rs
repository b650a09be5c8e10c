//! Which entries are stale, over the golden states. `sweep_tests.rs` covers the sweep and
//! when it runs; `tests/stale_flows.rs` proves with real packets that the kernel agrees.

use kuport_core::ir::HostState;

use super::*;
use crate::netlink::tests::golden;

pub(super) const MASK: u32 = 0xff;
pub(super) const CLIENT: &str = "198.51.100.10";

pub(super) fn flow(proto: Protocol, dst: &str, reply: &str, mark: u32) -> Flow {
    Flow {
        protocol: proto,
        source: format!("{CLIENT}:40000").parse().expect("source"),
        destination: dst.parse().expect("destination"),
        reply_source: reply.parse().expect("reply source"),
        mark,
        zone: 0,
        id: Some(1),
    }
}

pub(super) fn udp(dst: &str, reply: &str, mark: u32) -> Flow {
    flow(Protocol::Udp, dst, reply, mark)
}

pub(super) fn translations(case: &str) -> Translations {
    Translations::of(&golden(case), MASK)
}

#[test]
fn an_accepting_nodes_flow_is_stale_once_its_target_or_mapping_changes() {
    // enp1s0 203.0.113.9 udp 3000 → the link to the pod's node, 169.254.77.1:3000, local mark 1.
    let t = translations("accepting-remote-pod");
    let current = udp("203.0.113.9:3000", "169.254.77.1:3000", 0x1);
    assert!(!t.is_stale(&current), "translated as programmed");
    assert!(
        !t.is_stale(&Flow {
            mark: 0x1bd01,
            ..current.clone()
        }),
        "another datapath's bits beside kuport's are not judged"
    );
    assert!(
        t.is_stale(&udp("203.0.113.9:3000", "169.254.77.3:3000", 0x1)),
        "the endpoint moved: the flow still goes over the old link"
    );
    assert!(
        t.is_stale(&udp("203.0.113.9:3000", "169.254.77.1:4000", 0x1)),
        "the pod port changed"
    );
    assert!(
        t.is_stale(&udp("203.0.113.9:3001", "169.254.77.1:3001", 0x1)),
        "a kuport flow of a port no longer mapped"
    );
    assert!(
        t.is_stale(&udp("203.0.113.9:3000", "203.0.113.9:3000", 0)),
        "a flow that reached the node before the port was mapped stays on the node"
    );
    assert!(
        !t.is_stale(&udp("100.64.0.1:3000", "169.254.77.1:3000", 0x1)),
        "wt0 is bound too"
    );
    assert!(
        t.is_stale(&udp("192.0.2.7:3000", "169.254.77.1:3000", 0x1)),
        "an address the node no longer captures on"
    );
}

#[test]
fn flows_of_clients_inside_the_cluster_are_judged_like_any_client() {
    // A pod of the accepting node, the node's own process (kup-out) and the pod's node (its
    // source SNATed to the link end) all dialed a published address: their entries carry the
    // local mark and the link as their reply source, as an outside client's do.
    let t = translations("accepting-remote-pod");
    for (source, dst) in [
        ("10.244.0.7:40000", "203.0.113.9:3000"),
        ("203.0.113.9:40000", "203.0.113.9:3000"),
        ("100.64.0.1:40000", "100.64.0.1:3000"),
        ("100.64.0.2:40000", "100.64.0.1:3000"),
    ] {
        let inside = Flow {
            source: source.parse().expect("source"),
            ..udp(dst, "169.254.77.1:3000", 0x1)
        };
        assert!(
            !t.is_stale(&inside),
            "{source} → {dst}: translated as programmed"
        );
        // Control: the same flow toward a link that is gone is stale.
        let moved = Flow {
            reply_source: "169.254.77.3:3000".parse().expect("reply source"),
            ..inside.clone()
        };
        assert!(t.is_stale(&moved), "{source} → {dst}");
    }
    // The node's own connection to a published address from before the mapping (no mark, the
    // node itself answering): stale, as a client's would be, so its next packet meets kup-out.
    let own = Flow {
        source: "203.0.113.9:40000".parse().expect("source"),
        ..udp("203.0.113.9:3000", "203.0.113.9:3000", 0)
    };
    assert!(t.is_stale(&own));
}

#[test]
fn flows_kuport_never_translated_are_left_alone() {
    let t = translations("accepting-remote-pod");
    for untouched in [
        // The node's own service, another table's DNAT, another datapath's mark.
        flow(Protocol::Tcp, "203.0.113.9:22", "203.0.113.9:22", 0),
        udp("203.0.113.9:7000", "10.244.0.9:7000", 0),
        udp("203.0.113.9:7000", "10.244.0.9:7000", 0x1bd00),
        // TCP on a port mapped for UDP only.
        flow(Protocol::Tcp, "203.0.113.9:3000", "203.0.113.9:3000", 0),
        // The node's own connection out, which happens to use the mapped port as its source.
        udp("192.0.2.53:53", "192.0.2.53:53", 0),
    ] {
        assert!(!t.is_stale(&untouched), "{untouched:?}");
    }
    // A node that translates nothing: only flows with kuport's mark are stale.
    let none = Translations::of(&HostState::default(), MASK);
    assert!(none.is_empty());
    assert!(none.is_stale(&udp("203.0.113.9:3000", "169.254.77.1:3000", 0x1)));
    assert!(!none.is_stale(&udp("203.0.113.9:3000", "203.0.113.9:3000", 0x1bd00)));
    // Under another mask, the same bits are not kuport's.
    let shifted = Translations::of(&HostState::default(), 0xff00_0000);
    assert!(!shifted.is_stale(&udp("203.0.113.9:3000", "169.254.77.1:3000", 0x1)));
}

#[test]
fn the_pod_nodes_flows_are_judged_by_their_arrival_link() {
    // kup-dcc4266d (mark 2, end 169.254.77.1) → 10.244.1.5:3000.
    let t = translations("pod-node-single");
    assert!(!t.is_stale(&udp("169.254.77.1:3000", "10.244.1.5:3000", 0x2)));
    assert!(
        t.is_stale(&udp("169.254.77.1:3000", "10.244.1.9:3000", 0x2)),
        "the pod moved within the node (or its address went to another pod)"
    );
    assert!(
        t.is_stale(&udp("169.254.77.1:3000", "10.244.1.5:3000", 0x3)),
        "the mark of a link this node no longer holds"
    );
    assert!(
        t.is_stale(&udp("169.254.77.1:3000", "169.254.77.1:3000", 0)),
        "a request that crossed the link before this node's half of it was programmed"
    );
    // Two links into one pod, a translated pod port.
    let t = translations("both-roles-multi");
    assert!(!t.is_stale(&udp("169.254.77.1:3000", "10.244.1.5:4000", 0x2)));
    assert!(!t.is_stale(&udp("169.254.77.3:3000", "10.244.1.5:4000", 0x3)));
    assert!(t.is_stale(&udp("169.254.77.3:3000", "10.244.1.5:4000", 0x2)));
    // The node's own accepting half of the same mapping (local mark).
    assert!(!t.is_stale(&udp("100.64.0.2:3000", "10.244.1.5:4000", 0x1)));
}

#[test]
fn ranges_and_translated_ports_are_followed_port_for_port() {
    let t = translations("same-node-range");
    let tcp = |dst: &str, reply: &str| flow(Protocol::Tcp, dst, reply, 0x1);
    assert!(!t.is_stale(&tcp("203.0.113.9:27050", "10.244.0.5:27050")));
    assert!(t.is_stale(&tcp("203.0.113.9:27050", "10.244.0.5:27015")));
    assert!(
        t.is_stale(&tcp("203.0.113.9:27116", "10.244.0.5:27116")),
        "past the range's end"
    );
    let t = translations("same-node-single-port");
    assert!(!t.is_stale(&udp("100.64.0.1:4000", "10.244.0.6:27000", 0x1)));
    assert!(t.is_stale(&udp("100.64.0.1:4000", "10.244.0.6:4000", 0x1)));
}

#[test]
fn an_ipv6_flow_is_judged_by_the_ipv6_dnat_of_its_mapping() {
    // A dual-stack mapping: the IPv4 and IPv6 steering rules share interface, protocol, port
    // and mark; each must be completed by its own family's DNAT, or every IPv6 flow reads as
    // stale and each sweep clears them all (found in the lab: a long-lived IPv6 flow of
    // another mapping lost at each endpoint change).
    let t = translations("dual-stack-accepting-remote-pod");
    let mut f = udp("[2001:db8:203::9]:3000", "[fd6b:7570::a9fe:4d01]:3000", 1);
    f.source = "[2001:db8:198::10]:40000".parse().expect("source");
    assert!(!t.is_stale(&f), "{t:?}");
    let mut elsewhere = f.clone();
    elsewhere.reply_source = "[fd6b:7570::a9fe:4d03]:3000".parse().expect("reply");
    assert!(t.is_stale(&elsewhere));
    let v4 = udp("203.0.113.9:3000", "169.254.77.1:3000", 1);
    assert!(!t.is_stale(&v4));
    // The pod's node: the arrival link's mark, the pod's IPv6 address.
    let t = translations("dual-stack-pod-node");
    let pod6 = t
        .ports
        .keys()
        .find(|(a, _, _)| a.is_ipv6())
        .map(|k| k.0)
        .expect("an IPv6 steering key");
    let target = t.ports[&(pod6, Protocol::Udp, 3000)][0];
    assert!(target.to.is_ipv6(), "{t:?}");
}
