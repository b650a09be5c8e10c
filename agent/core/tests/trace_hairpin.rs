//! Clients inside the cluster, through the packet tracer (`datapath.md`, "Clients inside the
//! cluster"): a pod on the accepting node, the accepting node's own processes, the pod's node
//! (and the pods it masquerades) and a pod dialing its own mapping each reach the mapping
//! through its published address, with the source translation the document gives; pod-to-pod
//! flows and the node's other connections are untouched, and a spoofed pod address or a port
//! nobody published is not taken. Each case also shows the tracer noticing its rule taken away.

use std::net::{IpAddr, Ipv4Addr};

use kuport_core::api::Protocol;
use kuport_core::ir::{ChainId, HostState, MarkLayout, Rule};
use kuport_core::trace::{CtState, Packet, RouteDecision, trace};
use kuport_testkit::cluster::*;
use serde_json::json;

const EDGE_PUBLIC: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));
const EDGE_MESH: IpAddr = IpAddr::V4(Ipv4Addr::new(100, 64, 0, 1));
const WORKER_MESH: IpAddr = IpAddr::V4(Ipv4Addr::new(100, 64, 0, 2));
const THIRD_MESH: IpAddr = IpAddr::V4(Ipv4Addr::new(100, 64, 0, 3));
/// A pod on edge-a (the accepting node), not the endpoint.
const EDGE_POD: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 0, 7));
/// The endpoint of the same-node cases, on edge-a.
const LOCAL_ENDPOINT: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 0, 5));
/// The endpoint of the cross-node cases, on worker-b.
const REMOTE_ENDPOINT: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 1, 5));

fn local_mark() -> u32 {
    MarkLayout::default().local()
}

fn edge_facts() -> kuport_core::snapshot::HostFacts {
    facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    )
}

/// games/gs (UDP 3000) on edge-a's enp1s0 and wt0, its pod on worker-b.
fn remote() -> Cluster {
    edge_and_worker()
        .row("public", "worker-b", json!({}), 1420)
        .claim("public", "edge-a/worker-b", 0)
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
}

/// games/gs (UDP 3000) on edge-a's enp1s0 and wt0, its pod on edge-a; and a TCP range.
fn same_node() -> HostState {
    edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
        .endpoint_full(
            "games",
            "range",
            "game",
            "TCP",
            "gs-0",
            "edge-a",
            "10.244.0.5",
            27015,
            None,
        )
        .portmap(pm("games", "range", "public", 27015).end(27020).tcp())
        .plan_with("edge-a", &edge_facts())
        .host_state
}

fn edge() -> HostState {
    remote().plan_with("edge-a", &edge_facts()).host_state
}

fn worker() -> HostState {
    remote()
        .plan_with("worker-b", &facts(&[], "wt0", 1400))
        .host_state
}

/// A first packet from a pod of the node, arriving on the CNI's device.
fn from_pod(saddr: IpAddr, daddr: IpAddr, protocol: Protocol, dport: u16) -> Packet {
    let mut p = Packet::new("cilium_host", saddr, daddr, protocol, dport);
    p.local = vec![EDGE_PUBLIC, EDGE_MESH];
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
fn a_pod_on_the_accepting_node_reaches_the_remote_pod_with_its_own_address() {
    let edge = edge();
    let link = edge.links[0].clone();
    for published in [EDGE_PUBLIC, EDGE_MESH] {
        let p = from_pod(EDGE_POD, published, Protocol::Udp, 3000).leaving_by(&link.name);
        let t = trace(&edge, &p);
        assert!(t.steered, "{published}: {t:?}");
        assert_eq!(
            t.dnat,
            Some((IpAddr::V4(link.peer_address), 3000)),
            "{published}"
        );
        assert_eq!(
            t.ct_mark,
            local_mark(),
            "the flow's replies come back by main"
        );
        assert!(
            t.identity_snat && !t.masquerade && t.snat_to.is_none(),
            "{t:?}"
        );
        assert_eq!(t.counters, ["pre/games/gs", "post/games/gs"]);
    }
    // The pod's node sees the pod's own address over the link and answers back over it.
    let worker = worker();
    let wlink = &worker.links[0];
    let mut arrived = Packet::new(
        &wlink.name,
        EDGE_POD,
        IpAddr::V4(wlink.address.addr()),
        Protocol::Udp,
        3000,
    );
    arrived.local = vec![IpAddr::V4(wlink.address.addr())];
    let t = trace(&worker, &arrived);
    assert_eq!(t.dnat, Some((REMOTE_ENDPOINT, 3000)));
    assert!(t.identity_snat);
    // Control: without the hairpin lookups the pod's packet is not steered at all.
    let bare = without(&edge, ChainId::Pre, |r| matches!(r, Rule::Hairpin(_)));
    let t = trace(&bare, &from_pod(EDGE_POD, EDGE_PUBLIC, Protocol::Udp, 3000));
    assert!(!t.steered && t.dnat.is_none(), "{t:?}");
}

#[test]
fn only_a_pod_of_the_node_dialing_a_published_port_is_steered() {
    let edge = edge();
    // A pod-to-pod flow on the mapped port, a port nobody published, the link port: untouched.
    for (daddr, dport) in [
        (REMOTE_ENDPOINT, 3000),
        (EDGE_PUBLIC, 3001),
        (EDGE_MESH, 4790),
    ] {
        let t = trace(&edge, &from_pod(EDGE_POD, daddr, Protocol::Udp, dport));
        assert!(!t.steered && t.dnat.is_none(), "{daddr}:{dport}: {t:?}");
        assert_eq!((t.daddr, t.ct_mark, t.meta_mark), (daddr, 0, 0));
    }
    // The other protocol on the published port: not published.
    let t = trace(&edge, &from_pod(EDGE_POD, EDGE_PUBLIC, Protocol::Tcp, 3000));
    assert!(!t.steered);
    // A pod address spoofed on a bound interface or the underlay, to the other interface's
    // published address (its own one is the interface's ordinary capture): never a pod's.
    for (iif, daddr) in [("enp1s0", EDGE_MESH), ("wt0", EDGE_PUBLIC)] {
        let mut spoofed = from_pod(EDGE_POD, daddr, Protocol::Udp, 3000);
        spoofed.iif = iif.into();
        assert!(!trace(&edge, &spoofed).steered, "{iif}");
    }
    // A pod on its own device whatever its name (Cilium's lxc device, whose pod CIDR routes
    // via cilium_host; kindnet's veth; a bridge).
    for iif in ["lxc1a2b3c", "veth7", "cni0"] {
        let mut pod = from_pod(EDGE_POD, EDGE_MESH, Protocol::Udp, 3000);
        pod.iif = iif.into();
        assert!(trace(&edge, &pod).steered, "{iif}");
    }
    // A source outside every pod network, on a pod's device: not a pod.
    let t = trace(
        &edge,
        &from_pod(
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 80)),
            EDGE_PUBLIC,
            Protocol::Udp,
            3000,
        ),
    );
    assert!(!t.steered);
    // A reply (the pod answering a connection to the published address) is never steered.
    let mut reply = from_pod(EDGE_POD, EDGE_PUBLIC, Protocol::Udp, 3000);
    reply.reply = true;
    reply.ct_state = CtState::Established;
    assert!(!trace(&edge, &reply).steered);
    // Control: the same first packet from the pod is steered.
    assert!(trace(&edge, &from_pod(EDGE_POD, EDGE_MESH, Protocol::Udp, 3000)).steered);
}

#[test]
fn the_accepting_nodes_own_process_is_translated_in_the_output_hook() {
    let edge = edge();
    let link = edge.links[0].clone();
    for published in [EDGE_PUBLIC, EDGE_MESH] {
        let p = Packet::local(published, published, Protocol::Udp, 3000).leaving_by(&link.name);
        let t = trace(&edge, &p);
        assert_eq!(
            t.dnat,
            Some((IpAddr::V4(link.peer_address), 3000)),
            "{published}"
        );
        assert_eq!(t.ct_mark, local_mark());
        if published == EDGE_MESH {
            // Its InternalIP: the pod node's loop guard would send the reply over the mesh.
            assert_eq!(t.snat_to, Some(IpAddr::V4(link.address.addr())), "{t:?}");
        } else {
            assert!(
                t.identity_snat && t.snat_to.is_none(),
                "its own address is kept"
            );
        }
    }
    // The node's other connections: another port, another node, a later packet: untouched.
    for (daddr, dport) in [(EDGE_PUBLIC, 3001), (WORKER_MESH, 3000)] {
        let t = trace(
            &edge,
            &Packet::local(EDGE_MESH, daddr, Protocol::Udp, dport),
        );
        assert!(t.dnat.is_none() && t.ct_mark == 0, "{daddr}:{dport}: {t:?}");
    }
    let later = Packet::local(EDGE_MESH, EDGE_MESH, Protocol::Udp, 3000).later(0);
    assert!(trace(&edge, &later).dnat.is_none());
    // Control: without the hairpin entries the node's own packet stays its own.
    let bare = without(&edge, ChainId::Pre, |r| matches!(r, Rule::Hairpin(_)));
    let t = trace(
        &bare,
        &Packet::local(EDGE_MESH, EDGE_MESH, Protocol::Udp, 3000),
    );
    assert!(t.dnat.is_none());
}

#[test]
fn the_pod_nodes_own_request_takes_the_link_end_as_its_source_and_its_reply_the_link() {
    let edge = edge();
    let link = edge.links[0].clone();
    let mut p = Packet::new("wt0", WORKER_MESH, EDGE_MESH, Protocol::Udp, 3000);
    p.local = vec![EDGE_PUBLIC, EDGE_MESH];
    let t = trace(&edge, &p.leaving_by(&link.name));
    assert_eq!(t.dnat, Some((IpAddr::V4(link.peer_address), 3000)));
    assert_eq!(t.snat_to, Some(IpAddr::V4(link.address.addr())), "{t:?}");
    assert!(!t.identity_snat);
    // A third node keeps its own address.
    let mut third = p.clone();
    third.saddr = THIRD_MESH;
    let t = trace(&edge, &third.leaving_by(&link.name));
    assert!(t.identity_snat && t.snat_to.is_none(), "{t:?}");
    // On the pod's node the request comes from the edge's link end (not its own address),
    // and the pod's reply to it goes back over the link.
    let worker = worker();
    let wlink = worker.links[0].clone();
    let own_end = IpAddr::V4(wlink.address.addr());
    let mut arrived = Packet::new(
        &wlink.name,
        IpAddr::V4(link.address.addr()),
        own_end,
        Protocol::Udp,
        3000,
    );
    arrived.local = vec![own_end, WORKER_MESH];
    let t = trace(&worker, &arrived);
    assert_eq!(t.dnat, Some((REMOTE_ENDPOINT, 3000)));
    assert!(t.identity_snat);
    let mut reply = Packet::new(
        "cilium_host",
        REMOTE_ENDPOINT,
        IpAddr::V4(link.address.addr()),
        Protocol::Udp,
        40000,
    );
    reply.reply = true;
    reply.ct_state = CtState::Established;
    reply.ct_mark = wlink.mark;
    let t = trace(&worker, &reply);
    assert!(
        matches!(&t.route, Some(RouteDecision::Via { dev, .. }) if *dev == wlink.name),
        "{t:?}"
    );
    // Control: without the rule the pod's node would get its own address as the source.
    let bare = without(&edge, ChainId::Post, |r| {
        matches!(r, Rule::LinkPeerSnat { .. })
    });
    let t = trace(&bare, &p.leaving_by(&link.name));
    assert!(t.identity_snat && t.snat_to.is_none());
}

/// `c` with each Node's pod CIDR its own (edge-a 10.244.0.0/24, worker-b 10.244.1.0/24, a
/// third node worker-c 10.244.2.0/24), as the control plane allocates them.
fn own_pod_cidrs(c: Cluster) -> Cluster {
    let mut c = c.node("worker-c", "100.64.0.3");
    for node in &mut c.snapshot.nodes {
        let cidr = match node.metadata.name.as_deref() {
            Some("edge-a") => "10.244.0.0/24",
            Some("worker-b") => "10.244.1.0/24",
            _ => "10.244.2.0/24",
        };
        let spec = node.spec.get_or_insert_default();
        spec.pod_cidr = Some(cidr.to_owned());
        spec.pod_cidrs = Some(vec![cidr.to_owned()]);
    }
    c
}

/// Under Cilium's native routing a pod's traffic to a node address is not masqueraded: a pod
/// of the pod's node reaches the edge with its own address. It is in that node's pod CIDR, so
/// the edge takes it to its link end as it does the node's InternalIP; the endpoint dialing
/// its own mapping the same. A pod of the edge or of a third node keeps its own address.
#[test]
fn an_unmasqueraded_pod_of_the_pod_node_takes_the_link_end_as_its_source() {
    let edge = own_pod_cidrs(remote())
        .plan_with("edge-a", &edge_facts())
        .host_state;
    let link = edge.links[0].clone();
    let arriving = |saddr: IpAddr, iif: &str| {
        let mut p = Packet::new(iif, saddr, EDGE_MESH, Protocol::Udp, 3000);
        p.local = vec![EDGE_PUBLIC, EDGE_MESH];
        p.leaving_by(&link.name)
    };
    let worker_pod = IpAddr::V4(Ipv4Addr::new(10, 244, 1, 9));
    for client in [worker_pod, REMOTE_ENDPOINT] {
        let t = trace(&edge, &arriving(client, "wt0"));
        assert_eq!(t.dnat, Some((IpAddr::V4(link.peer_address), 3000)));
        assert_eq!(
            t.snat_to,
            Some(IpAddr::V4(link.address.addr())),
            "{client}: {t:?}"
        );
    }
    let third_pod = IpAddr::V4(Ipv4Addr::new(10, 244, 2, 9));
    let t = trace(&edge, &arriving(third_pod, "wt0"));
    assert!(t.identity_snat && t.snat_to.is_none(), "{t:?}");
    let t = trace(
        &edge,
        &from_pod(EDGE_POD, EDGE_MESH, Protocol::Udp, 3000).leaving_by(&link.name),
    );
    assert!(t.identity_snat && t.snat_to.is_none(), "{t:?}");
    // Only worker-b's pod CIDR, toward worker-b's end of the link.
    let prefixes: Vec<String> = edge
        .nft
        .rules(ChainId::Post)
        .iter()
        .filter_map(|r| match r {
            Rule::LinkPeerSnat {
                client, peer_end, ..
            } if client.prefix_len() < 32 => Some(format!("{client} {peer_end}")),
            _ => None,
        })
        .collect();
    assert_eq!(prefixes, [format!("10.244.1.0/24 {}", link.peer_address)]);
    // Control: without that rule the pod's own address goes over the link, and worker-b
    // would hand the reply to the client pod (or the pod itself) from the wrong address.
    let bare = without(
        &edge,
        ChainId::Post,
        |r| matches!(r, Rule::LinkPeerSnat { client, .. } if client.prefix_len() < 32),
    );
    let t = trace(&bare, &arriving(worker_pod, "wt0"));
    assert!(t.identity_snat && t.snat_to.is_none(), "{t:?}");
}

/// A pod CIDR is the node's pods only when no other Node lists an overlapping one and it holds
/// no Node's address: a pool every Node lists, or a range a node's address is in, would
/// translate other nodes' pods or outside clients too.
#[test]
fn a_pod_cidr_shared_with_another_node_or_holding_a_node_address_is_not_translated() {
    let prefix_snats = |c: Cluster| {
        c.plan_with("edge-a", &edge_facts())
            .host_state
            .nft
            .rules(ChainId::Post)
            .iter()
            .filter(|r| matches!(r, Rule::LinkPeerSnat { client, .. } if client.prefix_len() < 32))
            .count()
    };
    // Every Node lists the cluster's /16 (the fixtures' default).
    assert_eq!(prefix_snats(remote()), 0);
    // worker-b's CIDR inside edge-a's, and one holding worker-b's own InternalIP.
    for (edge_cidr, worker_cidr) in [
        ("10.244.0.0/16", "10.244.1.0/24"),
        ("10.244.0.0/24", "100.64.0.0/24"),
    ] {
        let mut c = own_pod_cidrs(remote());
        for node in &mut c.snapshot.nodes {
            let cidr = match node.metadata.name.as_deref() {
                Some("edge-a") => edge_cidr,
                Some("worker-b") => worker_cidr,
                _ => continue,
            };
            let spec = node.spec.get_or_insert_default();
            spec.pod_cidr = Some(cidr.to_owned());
            spec.pod_cidrs = Some(vec![cidr.to_owned()]);
        }
        assert_eq!(prefix_snats(c), 0, "{edge_cidr} {worker_cidr}");
    }
    // Control: apart, each its own node's.
    assert_eq!(prefix_snats(own_pod_cidrs(remote())), 1);
}

#[test]
fn a_pod_reaching_a_pod_of_its_own_node_or_itself_is_masqueraded() {
    let edge = same_node();
    for client in [EDGE_POD, LOCAL_ENDPOINT] {
        for (protocol, port) in [(Protocol::Udp, 3000), (Protocol::Tcp, 27018)] {
            let p = from_pod(client, EDGE_PUBLIC, protocol, port).leaving_by("cilium_host");
            let t = trace(&edge, &p);
            assert_eq!(
                t.dnat,
                Some((LOCAL_ENDPOINT, port)),
                "{client} {protocol:?}"
            );
            assert!(t.masquerade && !t.identity_snat, "{client}: {t:?}");
        }
    }
    // An outside client and the node's own process keep their addresses.
    let mut outside = Packet::new(
        "enp1s0",
        Ipv4Addr::new(198, 51, 100, 10),
        EDGE_PUBLIC,
        Protocol::Udp,
        3000,
    );
    outside.local = vec![EDGE_PUBLIC, EDGE_MESH];
    let t = trace(&edge, &outside.leaving_by("cilium_host"));
    assert!(t.identity_snat && !t.masquerade);
    let own =
        Packet::local(EDGE_PUBLIC, EDGE_PUBLIC, Protocol::Udp, 3000).leaving_by("cilium_host");
    let t = trace(&edge, &own);
    assert_eq!(t.dnat, Some((LOCAL_ENDPOINT, 3000)));
    assert!(t.identity_snat && !t.masquerade);
    // Control: without the masquerade the pod's own address would be kept (and the reply
    // would go straight back over the bridge, or to the pod itself).
    let bare = without(&edge, ChainId::Post, |r| {
        matches!(r, Rule::HairpinMasquerade { .. })
    });
    let t = trace(
        &bare,
        &from_pod(EDGE_POD, EDGE_PUBLIC, Protocol::Udp, 3000).leaving_by("cilium_host"),
    );
    assert!(t.identity_snat && !t.masquerade);
}

#[test]
fn no_pod_network_known_means_no_pod_is_steered_by_destination() {
    let mut edge = edge();
    edge.nft.hairpin_sources.clear();
    let t = trace(&edge, &from_pod(EDGE_POD, EDGE_PUBLIC, Protocol::Udp, 3000));
    assert!(!t.steered);
    // The node's own processes are still served.
    let t = trace(
        &edge,
        &Packet::local(EDGE_PUBLIC, EDGE_PUBLIC, Protocol::Udp, 3000),
    );
    assert!(t.dnat.is_some());
}

/// The pod's node (or a pod it masquerades) dialling the published public address from its LAN
/// address: the accepting node knows that address from the pod node's row of the class
/// (`hostAddresses`) and translates it as it does the InternalIP; an address listed in the
/// row of another node, or not listed at all, is an ordinary client.
#[test]
fn the_pod_nodes_lan_address_listed_in_its_row_takes_the_link_end_as_its_source() {
    const WORKER_LAN: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 1, 12));
    const THIRD_LAN: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 1, 13));
    let listing = |addresses: &[&str]| {
        edge_and_worker()
            .row("public", "worker-b", json!({}), 1420)
            .host_addresses("public", "worker-b", addresses)
            .host_addresses("public", "worker-c", &["192.168.1.13"])
            .claim("public", "edge-a/worker-b", 0)
            .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
            .portmap(pm("games", "gs", "public", 3000))
            .plan_with("edge-a", &edge_facts())
            .host_state
    };
    let edge = listing(&["2001:db8::12", "192.168.1.12", "not an address"]);
    let link = edge.links[0].clone();
    let mut p = Packet::new("enp1s0", WORKER_LAN, EDGE_PUBLIC, Protocol::Udp, 3000);
    p.local = vec![EDGE_PUBLIC, EDGE_MESH];
    let t = trace(&edge, &p.leaving_by(&link.name));
    assert_eq!(t.dnat, Some((IpAddr::V4(link.peer_address), 3000)));
    assert_eq!(t.snat_to, Some(IpAddr::V4(link.address.addr())), "{t:?}");
    // Another node's listing changes nothing for this link: that client keeps its address.
    p.saddr = THIRD_LAN;
    let t = trace(&edge, &p.leaving_by(&link.name));
    assert!(t.identity_snat && t.snat_to.is_none(), "{t:?}");
    // Control: not listed, the pod node's LAN address would reach it as its own source.
    let unlisted = listing(&[]);
    let mut p = Packet::new("enp1s0", WORKER_LAN, EDGE_PUBLIC, Protocol::Udp, 3000);
    p.local = vec![EDGE_PUBLIC, EDGE_MESH];
    let t = trace(&unlisted, &p.leaving_by(&link.name));
    assert!(t.identity_snat && t.snat_to.is_none(), "{t:?}");
    // The rules are the same whatever order the row lists its addresses in.
    let shuffled = listing(&[
        "192.168.1.12",
        "not an address",
        "2001:db8::12",
        "192.168.1.12",
    ]);
    assert_eq!(shuffled.nft, edge.nft);
}

/// The pod's node lists its addresses on a segment in its row of each class whose links it
/// holds: not loopback, link-local or link addresses; sorted, IPv4 first, at most 16 of each
/// family. A node holding no link of the class lists none.
#[test]
fn the_pod_node_lists_its_host_addresses_where_it_holds_link_ends() {
    let mut facts = facts(&[], "wt0", 1400);
    facts.segment_addresses = [
        "2001:db8::12",
        "127.0.0.1",
        "192.168.1.12",
        "100.64.0.2",
        "fe80::1",
        "169.254.77.1",
        "::1",
        "10.244.1.1",
    ]
    .iter()
    .map(|a| a.parse().expect("an address"))
    .collect();
    let plan = remote().plan_with("worker-b", &facts);
    let row = &plan
        .writes
        .class_rows
        .iter()
        .find(|w| w.class == "public")
        .expect("worker-b writes its row of the link it holds")
        .row;
    assert!(!row.links.is_empty(), "{row:?}");
    assert_eq!(
        row.host_addresses,
        ["10.244.1.1", "100.64.0.2", "192.168.1.12", "2001:db8::12"]
    );
    // Many addresses of one family do not crowd out the other's.
    let mut crowded = facts.clone();
    crowded
        .segment_addresses
        .extend((1..=40).map(|i| std::net::IpAddr::V4(Ipv4Addr::new(10, 96, 0, i))));
    let plan = remote().plan_with("worker-b", &crowded);
    let row = &plan.writes.class_rows[0].row;
    assert_eq!(row.host_addresses.len(), 17, "{:?}", row.host_addresses);
    assert_eq!(
        row.host_addresses.last().map(String::as_str),
        Some("2001:db8::12")
    );
    // Control: with no link held there is no row, and nothing listed.
    let alone = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
        .plan_with("worker-b", &facts);
    assert!(
        alone
            .writes
            .class_rows
            .iter()
            .all(|w| w.row.host_addresses.is_empty()),
        "{:?}",
        alone.writes.class_rows
    );
}
