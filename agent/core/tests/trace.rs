//! The packet tracer over the plan's datapath: what each node's rules do to a client's request,
//! its reply, a forwarded packet and an injected link frame. The unprivileged twin of the lab's
//! probes; each check also shows the tracer noticing a rule taken away.

use std::net::Ipv4Addr;

use kuport_core::api::Protocol;
use kuport_core::ir::{ChainId, HostState, MAIN_TABLE, Rule};
use kuport_core::trace::{Packet, RouteDecision, trace};
use kuport_testkit::cluster::*;
use serde_json::json;

const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const EDGE_PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);
const EDGE_MESH: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 1);
const WORKER_MESH: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 2);
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);

fn ip(text: &str) -> Ipv4Addr {
    text.parse().expect("ipv4")
}

/// games/gs (UDP 3000) on edge-a's enp1s0 and wt0, its pod on worker-b.
fn cluster() -> Cluster {
    edge_and_worker()
        .row("public", "worker-b", json!({}), 1420)
        .claim("public", "edge-a/worker-b", 0)
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
}

fn edge() -> HostState {
    let f = facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    );
    cluster().plan_with("edge-a", &f).host
}

fn worker() -> HostState {
    cluster()
        .plan_with("worker-b", &facts(&[], "wt0", 1400))
        .host
}

fn request(iif: &str, daddr: Ipv4Addr, local: &[Ipv4Addr]) -> Packet {
    let mut p = Packet::new(iif, CLIENT, daddr, Protocol::Udp, 3000);
    p.local = local.to_vec();
    p
}

fn without(state: &HostState, chain: ChainId, drop: impl Fn(&Rule) -> bool) -> HostState {
    let mut out = state.clone();
    for (c, rules) in &mut out.nft.chains {
        if *c == chain {
            rules.retain(|r| !drop(r));
        }
    }
    out
}

#[test]
fn the_accepting_node_steers_a_clients_request_into_the_link_with_its_source_kept() {
    let edge = edge();
    let link = &edge.links[0];
    let local = edge.nft.marks.local();
    let t = trace(
        &edge,
        &request("enp1s0", EDGE_PUBLIC, &[EDGE_PUBLIC, EDGE_MESH]),
    );
    assert!(t.steered && t.dropped.is_none(), "{t:?}");
    assert_eq!(
        t.dnat,
        Some((link.peer_address, 3000)),
        "to the pod node's link end"
    );
    assert_eq!(t.ct_mark, local, "the flow remembers it came in here");
    assert_eq!(t.meta_mark, local, "strict rp_filter follows kuport's mark");
    assert!(
        t.identity_snat,
        "the source is claimed before any masquerade"
    );
    assert_eq!(t.counters, ["pre/games/gs", "post/games/gs"]);
    assert_eq!(t.route, Some(RouteDecision::Main));
    // The same from a VPN client on wt0.
    let mut vpn = request("wt0", EDGE_MESH, &[EDGE_PUBLIC, EDGE_MESH]);
    vpn.saddr = ip("100.64.1.1");
    assert_eq!(trace(&edge, &vpn).dnat, Some((link.peer_address, 3000)));

    // Control: without the steering stage nothing is DNATed (DNAT takes steered packets only).
    let unsteered = without(&edge, ChainId::Steer, |r| matches!(r, Rule::Steer(_)));
    let t = trace(&unsteered, &request("enp1s0", EDGE_PUBLIC, &[EDGE_PUBLIC]));
    assert_eq!(t.dnat, None);
    assert!(!t.identity_snat);
}

#[test]
fn the_pod_node_delivers_to_the_pod_and_sends_the_reply_back_over_the_link() {
    let worker = worker();
    let link = worker.links[0].clone();
    let mut arrival = request("", link.address.addr(), &[WORKER_MESH, link.address.addr()]);
    arrival.iif = link.name.clone();
    let t = trace(&worker, &arrival);
    assert!(t.steered, "{t:?}");
    assert_eq!(t.dnat, Some((POD, 3000)));
    assert_eq!(t.ct_mark, link.mark, "the flow remembers its arrival link");
    assert!(
        t.identity_snat,
        "the pod sees the client, not a CNI masquerade"
    );
    assert_eq!(t.route, Some(RouteDecision::Main));

    // The pod's reply: conntrack holds the link's mark; kuport routes it into the link.
    let mut reply = Packet::new("lxc0", POD, CLIENT, Protocol::Udp, 40000);
    reply.reply = true;
    reply.ct_mark = t.ct_mark;
    let r = trace(&worker, &reply);
    assert_eq!(r.meta_mark, link.mark);
    assert_eq!(
        r.route,
        Some(RouteDecision::Via {
            table: worker.nft.marks.table(link.mark),
            via: link.peer_address,
            dev: link.name.clone(),
        })
    );

    // Control: without the arrival link's mark the reply takes the node's own default route.
    let unsaved = without(&worker, ChainId::Mangle, |r| {
        matches!(r, Rule::SaveArrivalLink { .. })
    });
    let t = trace(&unsaved, &arrival);
    reply.ct_mark = t.ct_mark;
    assert_eq!(trace(&unsaved, &reply).route, Some(RouteDecision::Main));
}

#[test]
fn forwarded_traffic_is_untouched() {
    let edge = edge();
    // Pod to pod through edge-a's mesh interface, on the mapped port, to another address.
    let mut p = Packet::new(
        "wt0",
        ip("10.244.1.7"),
        ip("10.244.0.9"),
        Protocol::Udp,
        3000,
    );
    p.local = vec![EDGE_PUBLIC, EDGE_MESH];
    let t = trace(&edge, &p);
    assert!(!t.steered && t.dnat.is_none() && !t.identity_snat, "{t:?}");
    assert_eq!((t.meta_mark, t.ct_mark), (0, 0));
    assert_eq!(t.daddr, ip("10.244.0.9"));
    assert_eq!(t.route, Some(RouteDecision::Main));
}

#[test]
fn the_link_guard_admits_only_link_peers() {
    let edge = edge();
    let port = edge.links[0].port;
    let frame = |from: Ipv4Addr| {
        let mut p = Packet::new("wt0", from, EDGE_MESH, Protocol::Udp, port);
        p.local = vec![EDGE_PUBLIC, EDGE_MESH];
        p
    };
    let peer = trace(&edge, &frame(WORKER_MESH));
    assert!(peer.untracked && peer.dropped.is_none(), "{peer:?}");
    let stranger = trace(&edge, &frame(ip("100.64.1.1")));
    assert_eq!(stranger.dropped.as_deref(), Some("guard/4790"));
    // From the internet side too.
    let mut internet = frame(CLIENT);
    internet.iif = "enp1s0".into();
    internet.daddr = EDGE_PUBLIC;
    assert_eq!(
        trace(&edge, &internet).dropped.as_deref(),
        Some("guard/4790")
    );
    // Control: without the drop rule the stranger's frame goes on to the kernel's socket.
    let open = without(&edge, ChainId::Guard, |r| {
        matches!(r, Rule::GuardDrop { .. })
    });
    assert_eq!(trace(&open, &frame(ip("100.64.1.1"))).dropped, None);
}

#[test]
fn a_packet_another_datapath_marked_keeps_its_mark_and_is_still_delivered() {
    let edge = edge();
    let mut p = request("wt0", EDGE_MESH, &[EDGE_PUBLIC, EDGE_MESH]);
    p.meta_mark = 0x1bd00; // netbird's, compared exactly later by its own rules
    let t = trace(&edge, &p);
    assert_eq!(t.meta_mark, 0x1bd00, "kuport left the packet mark alone");
    assert_eq!(t.ct_mark, edge.nft.marks.local());
    assert!(t.dnat.is_some());
    // kuport's rules do not route it (the mesh's own rules do).
    assert_eq!(t.route, Some(RouteDecision::Main));
    assert!(edge.rules.iter().all(|r| r.table == MAIN_TABLE));
}
