//! IPv6: a dual-stack or IPv6-only Service is served over IPv6 on every interface that has an
//! IPv6 address, in kuport's `ip6` table, with links carrying inner IPv6 over the IPv4 mesh.

use std::net::{IpAddr, Ipv6Addr};

use kuport_core::api::Protocol;
use kuport_core::ir::{ChainId, Family, HostState, MAIN_TABLE, PREF_REPLY, Rule};
use kuport_core::plan::ProgrammedReason as P;
use kuport_core::render::nft_text;
use kuport_core::snapshot::HostFacts;
use kuport_core::trace::{Packet, RouteDecision, trace};
use kuport_testkit::cluster::*;
use kuport_testkit::objects::{endpoint, slice};
use serde_json::json;

const EDGE_PUBLIC6: &str = "2001:db8:203::9";
const CLIENT6: &str = "2001:db8:198::10";
const POD6_EDGE: &str = "fd00:10:244::5";
const POD6_WORKER: &str = "fd00:10:244:1::5";

fn v6(text: &str) -> IpAddr {
    text.parse().expect("ipv6")
}

/// The IPv6 slice of service `gs` listing pod `pod` on `node` at `address`.
fn slice6(c: &mut Cluster, pod: &str, node: &str, address: &str) {
    let object = slice("games", &format!("gs-v6-{pod}"), "gs")
        .ipv6()
        .port("game", "UDP", 3000)
        .endpoint(endpoint(address, node).pod("games", pod).ready(true))
        .object();
    c.snapshot.endpoint_slices.push(typed(object, "slice"));
}

/// `c` with the dual-stack mapping `games/gs` (UDP 3000), its pod on `node` (edge-a or
/// worker-b) listed in both families' slices.
fn with_dual_stack_gs(c: Cluster, node: &str) -> Cluster {
    let (v4, v6) = match node {
        "edge-a" => ("10.244.0.5", POD6_EDGE),
        _ => ("10.244.1.5", POD6_WORKER),
    };
    let mut c = c
        .endpoint("games", "gs", "gs-0", node, v4, 3000)
        .portmap(pm("games", "gs", "public", 3000));
    slice6(&mut c, "gs-0", node, v6);
    c
}

/// edge-a and worker-b as in [`edge_and_worker`], each Node also advertising an IPv6 pod CIDR
/// (as a dual-stack cluster's Nodes do).
fn dual_stack_cluster() -> Cluster {
    let mut c = edge_and_worker();
    for (node, cidr) in c
        .snapshot
        .nodes
        .iter_mut()
        .zip(["fd00:10:244::/64", "fd00:10:244:1::/64"])
    {
        let spec = node.spec.get_or_insert_default();
        spec.pod_cidrs.get_or_insert_default().push(cidr.to_owned());
    }
    c
}

fn edge_facts() -> HostFacts {
    let mut f = facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    );
    f.interfaces6
        .insert("enp1s0".to_owned(), EDGE_PUBLIC6.parse().expect("ipv6"));
    f
}

fn worker_facts() -> HostFacts {
    facts(&[("wt0", "100.64.0.2")], "wt0", 1400)
}

/// (input interface, address) of each DNAT rule (its target) or steering rule (the address it
/// captures) in the table of `family`.
fn pairs(state: &HostState, family: Family, chain: ChainId) -> Vec<(String, IpAddr)> {
    state
        .table(family)
        .rules(chain)
        .iter()
        .filter_map(|r| match r {
            Rule::Dnat(d) => Some((d.iif.clone(), d.to)),
            Rule::Steer(s) => Some((s.iif.clone(), s.daddr)),
            _ => None,
        })
        .collect()
}

fn dnat_targets(state: &HostState, family: Family) -> Vec<(String, IpAddr)> {
    pairs(state, family, ChainId::Pre)
}

fn steered(state: &HostState, family: Family) -> Vec<(String, IpAddr)> {
    pairs(state, family, ChainId::Steer)
}

#[test]
fn a_dual_stack_service_on_the_accepting_node_is_served_over_both_families() {
    let mut c = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    slice6(&mut c, "gs-0", "edge-a", POD6_EDGE);
    let plan = c.plan_with("edge-a", &edge_facts());
    let d = decision(&plan, "games", "gs");
    let ep = d.endpoint.as_ref().expect("endpoint");
    assert_eq!(ep.address, "10.244.0.5".parse::<IpAddr>().expect("ip"));
    assert_eq!(ep.address6, Some(POD6_EDGE.parse().expect("ipv6")));
    assert_eq!(
        d.programmed.as_ref().map(|p| p.reason),
        Some(P::AllNodesReady)
    );

    let state = &plan.host_state;
    // IPv4 as before, on both interfaces.
    assert_eq!(steered(state, Family::V4).len(), 2);
    // IPv6 only where the interface has an IPv6 address, to the pod's IPv6 address.
    assert_eq!(
        steered(state, Family::V6),
        [("enp1s0".to_owned(), v6(EDGE_PUBLIC6))]
    );
    assert_eq!(
        dnat_targets(state, Family::V6),
        [("enp1s0".to_owned(), v6(POD6_EDGE))]
    );
    assert_eq!(state.nft6.family, Family::V6);
    assert!(
        state
            .rules
            .iter()
            .any(|r| r.family == Family::V6 && r.priority == PREF_REPLY && r.table == MAIN_TABLE),
        "{:?}",
        state.rules
    );
    // The published row names the interface's IPv6 address; wt0 has none.
    let rows: Vec<(&str, &str, &str)> = d
        .published
        .iter()
        .map(|p| {
            (
                p.interface.as_str(),
                p.address.as_str(),
                p.address6.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("enp1s0", "203.0.113.9", EDGE_PUBLIC6),
            ("wt0", "100.64.0.1", "")
        ]
    );
    // The status names both addresses of the pod.
    let write = plan
        .writes
        .portmaps
        .iter()
        .find(|w| w.name == "gs")
        .expect("status write");
    let endpoint = write.status.endpoint.as_ref().expect("endpoint status");
    assert_eq!(endpoint.address, "10.244.0.5");
    assert_eq!(endpoint.address6.as_deref(), Some(POD6_EDGE));
    // The IPv6 table as nft lists it.
    let text = nft_text(&state.nft6);
    assert!(text.starts_with("table ip6 kuport {"), "{text}");
    assert!(text.contains("ip6 daddr set 100::6b70:1"), "{text}");
    assert!(
        text.contains("\"enp1s0\" . 2001:db8:203::9 . udp . 3000"),
        "{text}"
    );
    assert!(text.contains("fd00:10:244::5 . 3000"), "{text}");
    assert!(
        !nft_text(&state.nft).contains("2001:db8"),
        "no IPv6 in the ip table"
    );
}

#[test]
fn an_ipv6_only_service_is_served_over_ipv6_alone() {
    let mut c = dual_stack_cluster().portmap(pm("games", "gs", "public", 3000));
    slice6(&mut c, "gs-0", "edge-a", POD6_EDGE);
    let plan = c.plan_with("edge-a", &edge_facts());
    let d = decision(&plan, "games", "gs");
    let ep = d
        .endpoint
        .as_ref()
        .expect("an IPv6-only Service has an endpoint");
    assert_eq!(ep.address, v6(POD6_EDGE));
    assert_eq!(ep.v4(), None);
    assert_eq!(
        d.programmed.as_ref().map(|p| p.reason),
        Some(P::AllNodesReady)
    );
    assert!(dnat_targets(&plan.host_state, Family::V4).is_empty());
    assert_eq!(
        dnat_targets(&plan.host_state, Family::V6),
        [("enp1s0".to_owned(), v6(POD6_EDGE))]
    );
    // Published only over IPv6: no IPv4 address is claimed for it.
    assert!(
        d.published.iter().all(|p| p.address.is_empty()),
        "{:?}",
        d.published
    );
}

/// An IPv6 endpoint outside the cluster's IPv6 pod networks, or at a node's own address, is
/// refused as an IPv4 one is.
#[test]
fn ipv6_endpoints_pass_the_same_address_policy() {
    for (address, reason) in [
        ("fd00:99::5", "outside the cluster's pod networks"),
        ("fe80::5", "a link-local address"),
        ("::1", "a loopback address"),
        ("::ffff:10.244.0.5", "an IPv4-mapped IPv6 address"),
        ("100::6b70:1", "kuport's stand-in block"),
        (
            "fd6b:7570::a9fe:4d00",
            "the return-link subnet of class public",
        ),
        // The first address of a Node's IPv6 pod CIDR is its CNI gateway, the node's own host
        // (cilium_host), as in IPv4.
        ("fd00:10:244::1", "an address of node edge-a"),
        ("fd00:10:244:1::1", "an address of node worker-b"),
    ] {
        let mut c = dual_stack_cluster().portmap(pm("games", "gs", "public", 3000));
        slice6(&mut c, "gs-0", "edge-a", address);
        let plan = c.plan_with("edge-a", &edge_facts());
        let d = decision(&plan, "games", "gs");
        assert!(d.endpoint.is_none(), "{address} must not be used");
        assert_eq!(d.rejected_endpoints.len(), 1, "{address}");
        assert!(
            d.rejected_endpoints[0].reason.contains(reason),
            "{address}: {}",
            d.rejected_endpoints[0].reason
        );
        assert!(plan.host_state.nft6.is_empty());
    }
    // Control: a pod address of the cluster is used.
    let mut c = dual_stack_cluster().portmap(pm("games", "gs", "public", 3000));
    slice6(&mut c, "gs-0", "edge-a", POD6_EDGE);
    assert!(
        decision(&c.plan_with("edge-a", &edge_facts()), "games", "gs")
            .endpoint
            .is_some()
    );
}

/// A dual-stack pod on another node: the accepting node DNATs IPv6 to the pod node's inner
/// IPv6 end of the link, the pod's node DNATs what arrives over the link to the pod, and the
/// reply is routed back into the link by an IPv6 rule and route; the link carries both.
#[test]
fn a_dual_stack_pod_across_a_link_is_reached_over_ipv6_with_the_client_kept() {
    let mut c = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
        .claim_built("public", "edge-a/worker-b", 0);
    slice6(&mut c, "gs-0", "worker-b", POD6_WORKER);
    let edge = c.plan_with("edge-a", &edge_facts()).host_state;
    let worker = c.plan_with("worker-b", &worker_facts()).host_state;

    let link = &edge.links[0];
    // Slot 0 of 169.254.77.0/24: edge-a (first by name) has .0, worker-b .1; the IPv6 ends
    // carry those in the low 32 bits of fd6b:7570::/96.
    let own6: Ipv6Addr = "fd6b:7570::a9fe:4d00".parse().expect("ipv6");
    let peer6: Ipv6Addr = "fd6b:7570::a9fe:4d01".parse().expect("ipv6");
    assert_eq!(
        link.address6.map(|n| (n.addr(), n.prefix_len())),
        Some((own6, 127))
    );
    assert_eq!(link.peer_address6, Some(peer6));
    assert_eq!(
        dnat_targets(&edge, Family::V6),
        [("enp1s0".to_owned(), IpAddr::V6(peer6))]
    );
    let wlink = &worker.links[0];
    assert_eq!(wlink.address6.map(|n| n.addr()), Some(peer6));
    assert_eq!(
        steered(&worker, Family::V6),
        [(wlink.name.clone(), IpAddr::V6(peer6))]
    );
    assert_eq!(
        dnat_targets(&worker, Family::V6),
        [(wlink.name.clone(), v6(POD6_WORKER))]
    );

    // The client's packet, traced through both nodes' rules.
    let mut request = Packet::new("enp1s0", v6(CLIENT6), v6(EDGE_PUBLIC6), Protocol::Udp, 3000);
    request.local = vec![v6(EDGE_PUBLIC6)];
    let t = trace(&edge, &request);
    assert!(t.steered, "{t:?}");
    assert_eq!(t.dnat, Some((IpAddr::V6(peer6), 3000)));
    assert!(t.identity_snat, "the client's address is kept: {t:?}");
    let mut arrived = Packet::new(
        &wlink.name,
        v6(CLIENT6),
        IpAddr::V6(peer6),
        Protocol::Udp,
        3000,
    );
    arrived.local = vec![IpAddr::V6(peer6)];
    let t = trace(&worker, &arrived);
    assert_eq!(t.dnat, Some((v6(POD6_WORKER), 3000)));
    assert!(t.identity_snat, "{t:?}");
    // The pod's reply takes the link's mark and leaves by the link's IPv6 route.
    let mut reply = Packet::new("lxc0", v6(POD6_WORKER), v6(CLIENT6), Protocol::Udp, 40000);
    reply.reply = true;
    reply.ct_state = kuport_core::trace::CtState::Established;
    reply.ct_mark = t.ct_mark;
    let t = trace(&worker, &reply);
    assert_eq!(
        t.route,
        Some(RouteDecision::Via {
            table: worker
                .rules
                .iter()
                .find(|r| r.family == Family::V6 && r.table != MAIN_TABLE)
                .expect("v6 rule")
                .table,
            via: IpAddr::V6(own6),
            dev: wlink.name.clone(),
        })
    );
    // Control: an IPv4-only Service leaves the links without IPv6 and the ip6 table empty.
    let v4_only = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
        .claim_built("public", "edge-a/worker-b", 0);
    let edge = v4_only.plan_with("edge-a", &edge_facts()).host_state;
    assert_eq!(edge.links[0].address6, None);
    assert!(edge.nft6.is_empty());
    assert!(edge.rules.iter().all(|r| r.family == Family::V4));
}

#[test]
fn a_class_ipv6_link_prefix_is_validated() {
    for (prefix, said) in [
        ("fd00::/100", "longer than /96"),
        ("10.0.0.0/8", "not an IPv6 CIDR"),
        ("fe80::/64", "not a unicast prefix"),
        ("100::/48", "stand-in"),
    ] {
        let mut c = dual_stack_cluster();
        let class = c.class_mut("public");
        class.spec.return_path.vxlan.subnet6 = prefix.to_owned();
        let plan = c.plan_with("edge-a", &edge_facts());
        let class = plan
            .classes
            .iter()
            .find(|c| c.name == "public")
            .expect("class");
        assert_eq!(class.ready.reason.as_str(), "InvalidSubnet", "{prefix}");
        assert!(
            class.ready.message.contains(said),
            "{prefix}: {}",
            class.ready.message
        );
    }
    // Control: the default and a custom /64 are valid.
    let mut c = dual_stack_cluster();
    c.class_mut("public").spec.return_path.vxlan.subnet6 = "fd12:3456::/64".to_owned();
    let plan = c.plan_with("edge-a", &edge_facts());
    let class = plan
        .classes
        .iter()
        .find(|c| c.name == "public")
        .expect("class");
    assert_eq!(class.ready.reason.as_str(), "Valid");
    assert_eq!(
        serde_json::to_value(
            &dual_stack_cluster().snapshot.classes[0]
                .spec
                .return_path
                .vxlan
        )
        .expect("json")["ipv6Subnet"],
        json!("fd6b:7570::/96")
    );
}

/// A serving node that forwards no IPv6 says so in the row's checks; a mapping served over IPv6
/// there is programmed (its IPv4 half works) with the reason in its message, and an IPv4-only
/// mapping is not told about IPv6.
#[test]
fn a_node_without_ipv6_forwarding_is_named_in_the_status_of_its_ipv6_mappings() {
    let failed = json!({"name": "ipv6Forward", "ok": false,
        "message": "net.ipv6.conf.all.forwarding is 0: the node forwards no IPv6 packet"});
    let with_check = |mut c: Cluster| {
        let status = c.class_mut("public").status.as_mut().expect("status");
        let row = status
            .nodes
            .iter_mut()
            .find(|r| r.name == "edge-a")
            .expect("row");
        row.checks.push(typed(failed.clone(), "check"));
        c
    };
    let mut dual = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    slice6(&mut dual, "gs-0", "edge-a", POD6_EDGE);
    let plan = with_check(dual).plan_with("edge-a", &edge_facts());
    let p = decision(&plan, "games", "gs")
        .programmed
        .clone()
        .expect("programmed");
    assert_eq!(p.reason, P::AllNodesReady);
    assert!(
        p.message
            .contains("on node edge-a, net.ipv6.conf.all.forwarding is 0"),
        "{}",
        p.message
    );
    // Control: the same node and check, an IPv4-only Service.
    let v4 = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let plan = with_check(v4).plan_with("edge-a", &edge_facts());
    let p = decision(&plan, "games", "gs")
        .programmed
        .clone()
        .expect("programmed");
    assert!(!p.message.contains("ipv6"), "{}", p.message);
}

/// A mapping served over IPv6 says where it has no IPv6 address to be reached at: an IPv6-only
/// mapping each bound interface without one (it publishes nothing there), a dual-stack mapping
/// a node none of whose bound interfaces has one (served there over IPv4 only).
#[test]
fn an_accepting_interface_without_an_ipv6_address_is_named_in_the_status_of_ipv6_mappings() {
    // edge-a binds enp1s0 and wt0; its row lists an IPv6 address for `ipv6` of them.
    let with_row6 = |mut c: Cluster, ipv6: &[&str]| {
        let status = c.class_mut("public").status.as_mut().expect("status");
        let row = status
            .nodes
            .iter_mut()
            .find(|r| r.name == "edge-a")
            .expect("row");
        row.addresses6 = ipv6
            .iter()
            .map(|i| ((*i).to_owned(), EDGE_PUBLIC6.to_owned()))
            .collect();
        c
    };
    let message = |c: Cluster| {
        let plan = c.plan_with("edge-a", &edge_facts());
        let p = decision(&plan, "games", "gs")
            .programmed
            .clone()
            .expect("programmed");
        assert_eq!(p.reason, P::AllNodesReady, "{}", p.message);
        p.message
    };
    let dual = || with_dual_stack_gs(dual_stack_cluster(), "edge-a");
    let only6 = || {
        let mut c = dual_stack_cluster().portmap(pm("games", "gs", "public", 3000));
        slice6(&mut c, "gs-0", "edge-a", POD6_EDGE);
        c
    };
    let none = "no bound interface (enp1s0, wt0) has an IPv6 address: this mapping is served there over IPv4 only";
    assert!(message(with_row6(dual(), &[])).contains(none));
    // One interface with IPv6 is enough for a dual-stack mapping: the rest serve IPv4.
    assert_eq!(message(with_row6(dual(), &["enp1s0"])), "");
    // An interface missing altogether (its row's message names it) does not hide that the one
    // present has no IPv6 address.
    let mut wt0_missing = with_row6(dual(), &[]);
    wt0_missing
        .class_mut("public")
        .status
        .as_mut()
        .expect("status")
        .nodes
        .iter_mut()
        .find(|r| r.name == "edge-a")
        .expect("row")
        .addresses
        .remove("wt0");
    let m = message(wt0_missing);
    assert!(
        m.contains("no bound interface (enp1s0) has an IPv6 address"),
        "{m}"
    );
    let wt0 = "on node edge-a, interface wt0 has no IPv6 address: this IPv6-only mapping is not served there";
    let m = message(with_row6(only6(), &["enp1s0"]));
    assert!(m.contains(wt0), "{m}");
    assert!(!m.contains("interface enp1s0"), "{m}");
    assert_eq!(message(with_row6(only6(), &["enp1s0", "wt0"])), "");
    // Control: an IPv4-only Service never mentions IPv6 addresses.
    let v4 = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    assert_eq!(message(with_row6(v4, &[])), "");
}

/// Return path `None` holds for IPv6 as for IPv4: a dual-stack mapping whose pod runs on the
/// accepting node is served over both families (no link needed), one whose pod runs elsewhere
/// has no way back in either family and is refused, with nothing in either table for it.
#[test]
fn return_path_none_serves_ipv6_on_the_accepting_node_only() {
    let none = |mut c: Cluster| {
        c.class_mut("public").spec.return_path.mode = kuport_core::api::ReturnPathMode::None;
        c
    };
    let local = with_dual_stack_gs(none(dual_stack_cluster()), "edge-a");
    let plan = local.plan_with("edge-a", &edge_facts());
    let d = decision(&plan, "games", "gs");
    assert_eq!(
        d.programmed.as_ref().map(|p| p.reason),
        Some(P::AllNodesReady)
    );
    assert_eq!(
        dnat_targets(&plan.host_state, Family::V6),
        [("enp1s0".to_owned(), v6(POD6_EDGE))]
    );
    assert!(plan.host_state.links.is_empty());

    let remote = with_dual_stack_gs(none(dual_stack_cluster()), "worker-b");
    let plan = remote.plan_with("edge-a", &edge_facts());
    let d = decision(&plan, "games", "gs");
    assert_eq!(
        d.programmed.as_ref().map(|p| p.reason),
        Some(P::ReturnPathUnavailable)
    );
    assert!(dnat_targets(&plan.host_state, Family::V6).is_empty());
    assert!(dnat_targets(&plan.host_state, Family::V4).is_empty());
    assert!(plan.host_state.links.is_empty());
    // Control: the same cluster with Vxlan serves the remote pod over IPv6 across a link (to
    // the peer's IPv6 end of it).
    let vxlan = with_dual_stack_gs(dual_stack_cluster(), "worker-b").claim_built(
        "public",
        "edge-a/worker-b",
        0,
    );
    let plan = vxlan.plan_with("edge-a", &edge_facts());
    let link6 = plan.host_state.links[0]
        .peer_address6
        .expect("the link carries IPv6");
    assert_eq!(
        dnat_targets(&plan.host_state, Family::V6),
        [("enp1s0".to_owned(), IpAddr::V6(link6))]
    );
}

/// The hardening properties the tracer shows for IPv4 hold in `ip6 kuport`: on a mapped port,
/// forwarded IPv6 traffic (pod to pod), a packet to an address that is not the node's own, and
/// the replies of the node's own IPv6 connections are left alone; only a new flow to the node's
/// own address is steered and translated (the control).
#[test]
fn ipv6_steering_takes_only_new_flows_to_the_nodes_own_addresses() {
    let c = with_dual_stack_gs(dual_stack_cluster(), "edge-a");
    let edge = c.plan_with("edge-a", &edge_facts()).host_state;
    let packet = |iif: &str, saddr: &str, daddr: &str| {
        let mut p = Packet::new(iif, v6(saddr), v6(daddr), Protocol::Udp, 3000);
        p.local = vec![v6(EDGE_PUBLIC6)];
        p
    };
    let untouched = |p: &Packet, what: &str| {
        let t = trace(&edge, p);
        assert!(!t.steered && t.dnat.is_none(), "{what}: {t:?}");
        assert_eq!(t.daddr, p.daddr, "{what}");
    };
    // Control: a new flow to the node's own public IPv6 address is the mapping's.
    let t = trace(&edge, &packet("enp1s0", CLIENT6, EDGE_PUBLIC6));
    assert!(t.steered, "{t:?}");
    assert_eq!(t.dnat, Some((v6(POD6_EDGE), 3000)));
    untouched(
        &packet("wt0", "fd00:10:244:1::7", "fd00:10:244::9"),
        "pod to pod through the node",
    );
    untouched(
        &packet("enp1s0", CLIENT6, "2001:db8:203::77"),
        "to a neighbour's address on the public segment",
    );
    let mut own_reply = packet("enp1s0", CLIENT6, EDGE_PUBLIC6);
    own_reply.reply = true;
    own_reply.ct_state = kuport_core::trace::CtState::Established;
    untouched(
        &own_reply,
        "a reply to the node's own connection from that port",
    );
}

/// IPv6 has no `rp_filter` sysctl kuport could loosen on its links: a strict check is a
/// `fib saddr . mark . iif` rule (firewalld's default IPv6_rpfilter). On the pod node, the
/// request over the link must find the link as the route back to the client under its packet
/// mark, and still be routed to the pod; the pod's reply, carrying the link's mark, must find
/// the pod's side as the route back to the pod.
#[test]
fn ipv6_link_arrivals_pass_a_mark_aware_strict_reverse_path_check() {
    let mut c = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
        .claim_built("public", "edge-a/worker-b", 0);
    slice6(&mut c, "gs-0", "worker-b", POD6_WORKER);
    let worker = c.plan_with("worker-b", &worker_facts()).host_state;
    let wlink = &worker.links[0];
    let own6 = IpAddr::V6(wlink.address6.expect("the link carries IPv6").addr());
    let back_into_link = RouteDecision::Via {
        table: worker
            .rules
            .iter()
            .find(|r| r.table != MAIN_TABLE)
            .expect("link rule")
            .table,
        via: IpAddr::V6(wlink.peer_address6.expect("peer end")),
        dev: wlink.name.clone(),
    };
    let mut arrived = Packet::new(&wlink.name, v6(CLIENT6), own6, Protocol::Udp, 3000);
    arrived.local = vec![own6];
    let t = trace(&worker, &arrived);
    assert_eq!(t.dnat, Some((v6(POD6_WORKER), 3000)));
    assert_eq!(t.route, Some(RouteDecision::Main), "on to the pod: {t:?}");
    assert_eq!(t.reverse_route, Some(back_into_link.clone()), "{t:?}");
    // A later packet of the flow (conntrack's binding already translated it) is marked again:
    // the mark is per packet.
    let mut later = arrived.later(t.ct_mark);
    later.daddr = v6(POD6_WORKER);
    let t = trace(&worker, &later);
    assert_eq!(t.route, Some(RouteDecision::Main), "{t:?}");
    assert_eq!(t.reverse_route, Some(back_into_link.clone()), "{t:?}");

    let mut reply = Packet::new("lxc0", v6(POD6_WORKER), v6(CLIENT6), Protocol::Udp, 40000);
    reply.reply = true;
    reply.ct_state = kuport_core::trace::CtState::Established;
    reply.ct_mark = t.ct_mark;
    let t = trace(&worker, &reply);
    assert_eq!(t.route, Some(back_into_link), "{t:?}");
    assert_eq!(t.reverse_route, Some(RouteDecision::Main), "{t:?}");
}

/// A host socket bound to the accepting interface's IPv6 address holds the port there, as one
/// bound to its IPv4 address does: the class row reports it, the node does not capture IPv6
/// traffic to it meanwhile, and admission refuses the mapping once the row says so. A socket
/// on an address the mapping does not bind holds nothing.
#[test]
fn a_host_socket_on_an_accepting_interfaces_ipv6_address_holds_the_port() {
    use kuport_core::plan::AcceptedReason as A;
    use kuport_core::snapshot::HostSocket;
    let mut c = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    slice6(&mut c, "gs-0", "edge-a", POD6_EDGE);
    let sock = |address: &str| HostSocket {
        protocol: Protocol::Udp,
        address: address.parse().expect("ip"),
        port: 3000,
        holder: None,
    };
    // Control first: a socket on another IPv6 address leaves the port to the mapping.
    let mut elsewhere = edge_facts();
    elsewhere.sockets = vec![sock("2001:db8:999::1")];
    let plan = c.plan_with("edge-a", &elsewhere);
    assert!(plan.writes.class_rows[0].row.held_ports.is_empty());
    assert_eq!(steered(&plan.host_state, Family::V6).len(), 1);

    let mut f = edge_facts();
    f.sockets = vec![sock(EDGE_PUBLIC6), sock("2001:db8:999::1")];
    let plan = c.plan_with("edge-a", &f);
    let row = plan.writes.class_rows[0].row.clone();
    let held: Vec<(&str, &str)> = row
        .held_ports
        .iter()
        .map(|h| (h.address.as_str(), h.holder.as_str()))
        .collect();
    assert_eq!(
        held,
        [(EDGE_PUBLIC6, "host UDP socket [2001:db8:203::9]:3000")]
    );
    assert!(
        steered(&plan.host_state, Family::V6).is_empty(),
        "not captured over IPv6 while admission has not seen the socket"
    );

    let status = c.class_mut("public").status.get_or_insert_default();
    status.nodes.retain(|r| r.name != "edge-a");
    status.nodes.push(row);
    let plan = c.plan_with("edge-a", &f);
    let d = decision(&plan, "games", "gs");
    assert_eq!(d.accepted.reason, A::PortInUse, "{}", d.accepted.message);
    assert!(
        d.accepted.message.contains("[2001:db8:203::9]:3000"),
        "{}",
        d.accepted.message
    );
}

/// Published rows name an interface's address only in the families the mapping is served in,
/// whichever mapping of the same bindings the plan publishes first: a dual-stack mapping beside
/// an IPv6-only one (`lobby`, named after it so it is published after it) on the same
/// interfaces publishes both addresses, the IPv6-only one no IPv4 address.
#[test]
fn mappings_sharing_bindings_are_published_in_their_own_families() {
    let mut c = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .endpoint6(
            "games",
            "lobby",
            "lobby-0",
            "edge-a",
            "fd00:10:244::6",
            3001,
        )
        .portmap(pm("games", "gs", "public", 3000))
        .portmap(pm("games", "lobby", "public", 3001));
    slice6(&mut c, "gs-0", "edge-a", POD6_EDGE);
    let plan = c.plan_with("edge-a", &edge_facts());
    let rows = |name: &str| -> Vec<(String, String)> {
        decision(&plan, "games", name)
            .published
            .iter()
            .filter(|p| p.interface == "enp1s0")
            .map(|p| (p.address.clone(), p.address6.clone()))
            .collect()
    };
    assert_eq!(
        rows("gs"),
        [("203.0.113.9".to_owned(), EDGE_PUBLIC6.to_owned())]
    );
    assert_eq!(rows("lobby"), [(String::new(), EDGE_PUBLIC6.to_owned())]);
}

/// Adds an IPv6 InternalIP to `node` (a dual-stack mesh: kubelet's `--node-ip` of both
/// families).
fn add_internal_ip6(c: &mut Cluster, node: &str, address: &str) {
    let node = c
        .snapshot
        .nodes
        .iter_mut()
        .find(|n| n.metadata.name.as_deref() == Some(node))
        .expect("node");
    node.status
        .get_or_insert_default()
        .addresses
        .get_or_insert_default()
        .push(k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: address.into(),
        });
}

#[test]
fn the_pod_nodes_ipv6_request_takes_the_link_end_as_its_source_and_its_reply_the_link() {
    const EDGE_MESH6: &str = "fd00:100:64::1";
    const WORKER_MESH6: &str = "fd00:100:64::2";
    const THIRD_MESH6: &str = "fd00:100:64::3";
    let mut c = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
        .claim_built("public", "edge-a/worker-b", 0);
    slice6(&mut c, "gs-0", "worker-b", POD6_WORKER);
    add_internal_ip6(&mut c, "edge-a", EDGE_MESH6);
    add_internal_ip6(&mut c, "worker-b", WORKER_MESH6);
    let mut facts = edge_facts();
    facts
        .interfaces6
        .insert("wt0".to_owned(), EDGE_MESH6.parse().expect("ipv6"));
    let edge = c.plan_with("edge-a", &facts).host_state;
    let link = edge.links[0].clone();
    let (own6, peer6) = (
        link.address6.expect("own end").addr(),
        link.peer_address6.expect("peer end"),
    );

    // worker-b dials edge-a's mesh IPv6 address from its own: the request leaves for the link
    // from edge-a's end, or worker-b would get a packet from itself and answer itself.
    let mut p = Packet::new("wt0", v6(WORKER_MESH6), v6(EDGE_MESH6), Protocol::Udp, 3000);
    p.local = vec![v6(EDGE_PUBLIC6), v6(EDGE_MESH6)];
    let t = trace(&edge, &p.leaving_by(&link.name));
    assert_eq!(t.dnat, Some((IpAddr::V6(peer6), 3000)));
    assert_eq!(t.snat_to, Some(IpAddr::V6(own6)), "{t:?}");
    // A third node, and edge-a's own address (no loop guard sends IPv6 to the mesh), keep
    // theirs.
    for kept in [THIRD_MESH6, EDGE_MESH6] {
        let mut other = p.clone();
        other.saddr = v6(kept);
        let t = trace(&edge, &other.leaving_by(&link.name));
        assert!(t.identity_snat && t.snat_to.is_none(), "{kept}: {t:?}");
    }
    // A pod of worker-b arriving with its own IPv6 address (not masqueraded) too: it is in
    // worker-b's IPv6 pod CIDR, which only its Node lists.
    let mut pod = p.clone();
    pod.saddr = v6("fd00:10:244:1::9");
    let t = trace(&edge, &pod.leaving_by(&link.name));
    assert_eq!(t.snat_to, Some(IpAddr::V6(own6)), "{t:?}");
    // The rules are in the ip6 table only, and name no IPv4 address: worker-b's address, then
    // its pod CIDR (edge-a's own is not translated).
    let snats: Vec<&Rule> = edge
        .table(Family::V6)
        .rules(ChainId::Post)
        .iter()
        .filter(|r| matches!(r, Rule::LinkPeerSnat { .. }))
        .collect();
    assert_eq!(snats.len(), 2, "{snats:?}");
    let text = nft_text(edge.table(Family::V6));
    for client in [WORKER_MESH6, "fd00:10:244:1::/64"] {
        assert!(
            text.contains(&format!(
                "ip6 saddr {client} ip6 daddr {peer6} counter packets 0 bytes 0 snat to {own6}"
            )),
            "{client}: {text}"
        );
    }

    // Control: a worker without an IPv6 InternalIP gets no rule (nothing to translate), and
    // without the rule worker-b's own address would reach its pod.
    let mut bare = dual_stack_cluster()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
        .claim_built("public", "edge-a/worker-b", 0);
    slice6(&mut bare, "gs-0", "worker-b", POD6_WORKER);
    let bare = bare.plan_with("edge-a", &facts).host_state;
    let t = trace(&bare, &p.leaving_by(&link.name));
    assert!(t.identity_snat && t.snat_to.is_none(), "{t:?}");
}
