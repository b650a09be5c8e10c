//! The packet tracer over the plan's datapath: what each node's rules do to a client's request,
//! its later packets and its reply, the node's own connections, a forwarded packet and injected
//! link frames. The unprivileged twin of the lab's probes; each check also shows the tracer
//! noticing a rule taken away.

use std::net::{IpAddr, Ipv4Addr};

use kuport_core::api::Protocol;
use kuport_core::ir::{ChainId, HostState, MAIN_TABLE, Rule};
use kuport_core::trace::{CtState, Packet, RouteDecision, trace};
use kuport_testkit::cluster::*;
use serde_json::json;

const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 10));
const EDGE_PUBLIC: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));
const EDGE_MESH: IpAddr = IpAddr::V4(Ipv4Addr::new(100, 64, 0, 1));
const WORKER_MESH: IpAddr = IpAddr::V4(Ipv4Addr::new(100, 64, 0, 2));
const POD: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 1, 5));

fn ip(text: &str) -> IpAddr {
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
    cluster().plan_with("edge-a", &f).host_state
}

fn worker() -> HostState {
    cluster()
        .plan_with("worker-b", &facts(&[], "wt0", 1400))
        .host_state
}

fn request(iif: &str, daddr: IpAddr, local: &[IpAddr]) -> Packet {
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
        Some((IpAddr::V4(link.peer_address), 3000)),
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
    assert_eq!(
        trace(&edge, &vpn).dnat,
        Some((IpAddr::V4(link.peer_address), 3000))
    );

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
    let mut arrival = request(
        "",
        IpAddr::V4(link.address.addr()),
        &[WORKER_MESH, IpAddr::V4(link.address.addr())],
    );
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
            via: IpAddr::V4(link.peer_address),
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
    let frame = |from: IpAddr| {
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

/// UDP and TCP over the whole ephemeral range (32768-60999) on both of edge-a's interfaces, as
/// a tenant whose class allows it may ask; the pod on worker-b.
fn ephemeral_edge() -> HostState {
    // The administrator opted the class in to the whole range (50000-50001 are node service
    // ports the default keeps back).
    let c = edge_and_worker()
        .without_system_reserved("public")
        .ports_per_namespace("public", 65536)
        .row("public", "worker-b", json!({}), 1420)
        .claim("public", "edge-a/worker-b", 0)
        .endpoint("games", "eph", "eph-0", "worker-b", "10.244.1.6", 32768)
        .endpoint_full(
            "games",
            "eph-tcp",
            "game",
            "TCP",
            "eph-0",
            "worker-b",
            "10.244.1.6",
            32768,
            Some(true),
        )
        .portmap(pm("games", "eph", "public", 32768).end(60999))
        .portmap(pm("games", "eph-tcp", "public", 32768).end(60999).tcp());
    let f = facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    );
    c.plan_with("edge-a", &f).host_state
}

#[test]
fn the_nodes_own_connections_keep_their_replies_whatever_ports_tenants_map() {
    let edge = ephemeral_edge();
    let locals = [EDGE_PUBLIC, EDGE_MESH];
    for protocol in [Protocol::Udp, Protocol::Tcp] {
        // A client's new flow to a port of the range is the mapping's.
        let mut client = Packet::new("enp1s0", CLIENT, EDGE_PUBLIC, protocol, 45000);
        client.local = locals.to_vec();
        assert!(trace(&edge, &client).dnat.is_some(), "{protocol:?}");
        // The reply of the node's own connection from port 40001 to the API server over the
        // mesh, and of a pod's connection masqueraded behind the public address: each arrives
        // at the node's address on a mapped port, in an established flow.
        for (iif, from, to) in [
            ("wt0", WORKER_MESH, EDGE_MESH),
            ("enp1s0", ip("192.0.2.80"), EDGE_PUBLIC),
        ] {
            let mut reply = Packet::new(iif, from, to, protocol, 40001);
            reply.local = locals.to_vec();
            reply.reply = true;
            reply.ct_state = CtState::Established;
            let t = trace(&edge, &reply);
            assert!(!t.steered && t.dnat.is_none(), "{protocol:?} {iif}: {t:?}");
            assert_eq!((t.daddr, t.meta_mark, t.ct_mark), (to, 0, 0), "untouched");
            // Control: the same packet as a flow's first one is steered, as the stateless
            // rules steered every packet (with nothing to undo it for a reply).
            let mut first = reply.clone();
            first.reply = false;
            first.ct_state = CtState::New;
            assert!(trace(&edge, &first).steered, "{protocol:?} {iif}");
        }
    }
}

#[test]
fn later_packets_of_a_steered_flow_keep_the_request_mark_but_are_not_steered_again() {
    let edge = edge();
    let local = edge.nft.marks.local();
    let first = request("enp1s0", EDGE_PUBLIC, &[EDGE_PUBLIC, EDGE_MESH]);
    let t = trace(&edge, &first);
    assert!(t.steered && t.dnat.is_some());
    let later = first.later(t.ct_mark);
    let l = trace(&edge, &later);
    assert!(!l.steered && l.dnat.is_none() && !l.identity_snat, "{l:?}");
    assert_eq!(
        l.daddr, EDGE_PUBLIC,
        "conntrack's binding translates it, no rule of kuport's"
    );
    assert_eq!(l.meta_mark, local, "strict rp_filter checks every packet");
    assert_eq!(l.ct_mark, local);
    assert_eq!(l.route, Some(RouteDecision::Main));
    // Another datapath's mark is left alone on later packets too.
    let mut netbird = later.clone();
    netbird.meta_mark = 0x1bd00;
    assert_eq!(trace(&edge, &netbird).meta_mark, 0x1bd00);
    // An untracked packet has no flow to take a mark from.
    let mut untracked = later.clone();
    untracked.ct_state = CtState::Untracked;
    assert_eq!(trace(&edge, &untracked).meta_mark, 0);
    // Control: without the restore, only the first packet carries the mark.
    let unrestored = without(&edge, ChainId::Mangle, |r| {
        matches!(r, Rule::RestoreRequestMark { .. })
    });
    assert_eq!(trace(&unrestored, &first).meta_mark, local);
    assert_eq!(trace(&unrestored, &later).meta_mark, 0);

    // The pod's node: a later packet over the link is not steered either, and its flow keeps
    // the arrival link's mark.
    let worker = worker();
    let link = worker.links[0].clone();
    let mut arrival = request(
        "",
        IpAddr::V4(link.address.addr()),
        &[WORKER_MESH, IpAddr::V4(link.address.addr())],
    );
    arrival.iif = link.name.clone();
    let t = trace(&worker, &arrival);
    assert!(t.steered);
    let l = trace(&worker, &arrival.later(t.ct_mark));
    assert!(!l.steered && l.dnat.is_none(), "{l:?}");
    assert_eq!((l.ct_mark, l.meta_mark), (link.mark, 0));
}

#[test]
fn the_link_guard_drops_broadcast_multicast_and_anycast_frames_even_from_a_peer() {
    let edge = edge();
    let port = edge.links[0].port;
    let mesh_broadcast = ip("100.64.255.255");
    let public_broadcast = ip("203.0.113.255");
    let anycast = ip("100.64.0.0");
    let frame = |iif: &str, from: IpAddr, to: IpAddr| {
        let mut p = Packet::new(iif, from, to, Protocol::Udp, port);
        p.local = vec![EDGE_PUBLIC, EDGE_MESH];
        p.broadcast = vec![mesh_broadcast, public_broadcast];
        p.anycast = vec![anycast];
        p
    };
    let stranger = ip("100.64.1.1");
    let neighbour = ip("203.0.113.254");
    for (iif, from, to) in [
        ("wt0", stranger, mesh_broadcast),
        ("wt0", stranger, IpAddr::V4(Ipv4Addr::BROADCAST)),
        ("wt0", stranger, ip("224.0.0.1")),
        ("wt0", stranger, ip("0.0.0.0")),
        ("wt0", stranger, anycast),
        ("enp1s0", neighbour, public_broadcast),
        ("enp1s0", neighbour, ip("239.1.2.3")),
        // A link peer is let in only with a unicast frame to the node.
        ("wt0", WORKER_MESH, mesh_broadcast),
        ("wt0", WORKER_MESH, IpAddr::V4(Ipv4Addr::BROADCAST)),
        ("wt0", WORKER_MESH, ip("224.0.0.1")),
        ("wt0", WORKER_MESH, anycast),
    ] {
        let t = trace(&edge, &frame(iif, from, to));
        assert_eq!(
            t.dropped.as_deref(),
            Some("guard/4790"),
            "{iif}: {from} -> {to}: {t:?}"
        );
    }
    let peer = trace(&edge, &frame("wt0", WORKER_MESH, EDGE_MESH));
    assert!(peer.untracked && peer.dropped.is_none(), "{peer:?}");
    // Traffic on the port for another address is forwarded, untouched: not dropped, and
    // tracked (a host firewall and the CNI see it as they would without kuport).
    for from in [stranger, WORKER_MESH] {
        let t = trace(&edge, &frame("wt0", from, ip("10.244.0.9")));
        assert!(t.dropped.is_none() && !t.untracked, "{from}: {t:?}");
    }
}
