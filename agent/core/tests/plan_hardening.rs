//! What an accepting node captures and what kuport refuses on its own: destination scoping by
//! the steering stage, ports the node depends on, interface names, the stand-in block, the mark
//! layout and stable link ids, and isolating a refused link.

use kuport_core::api::{Protocol, valid_interface_name};
use kuport_core::ir::{ChainId, MarkLayout, Rule, STAND_IN};
use kuport_core::plan::AcceptedReason as A;
use kuport_core::plan::ClassReason;
use kuport_testkit::cluster::*;
use serde_json::{Value, json};

fn edge_facts() -> kuport_core::snapshot::HostFacts {
    facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    )
}

fn remote() -> Cluster {
    edge_and_worker()
        .row("public", "worker-b", json!({}), 1420)
        .claim_built("public", "edge-a/worker-b", 0)
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
}

fn accepted(c: &Cluster, name: &str) -> (A, String) {
    let plan = c.plan("edge-a");
    let d = decision(&plan, "games", name);
    (d.accepted.reason, d.accepted.message.clone())
}

#[test]
fn accepting_nodes_steer_only_their_own_addresses_and_dnat_only_steered_packets() {
    let plan = remote().plan_with("edge-a", &edge_facts());
    let steer = plan.host_state.nft.rules(ChainId::Steer);
    let own: Vec<(String, String)> = steer
        .iter()
        .filter_map(|r| match r {
            Rule::Steer(s) => Some((s.iif.clone(), s.daddr.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(
        own,
        [
            ("enp1s0".to_owned(), "203.0.113.9".to_owned()),
            ("wt0".to_owned(), "100.64.0.1".to_owned())
        ],
        "each bound interface is matched on its own address only"
    );
    let local = MarkLayout::default().local();
    for rule in plan.host_state.nft.rules(ChainId::Pre) {
        match rule {
            Rule::Dnat(d) => assert_eq!(
                d.mark,
                Some(local),
                "an accepting DNAT needs the steering mark"
            ),
            // Clients inside the cluster: exactly the published (address, protocol, port)
            // tuples the interfaces' own steering takes, nothing else of the node.
            Rule::Hairpin(h) => {
                assert_eq!(h.mark, local);
                assert!(
                    own.iter().any(|(_, addr)| *addr == h.daddr.to_string()),
                    "a hairpin entry only for a steered address: {h:?}"
                );
                assert_eq!(
                    (h.protocol, h.ports.first, h.ports.last),
                    (Protocol::Udp, 3000, 3000)
                );
            }
            other => panic!("kup-pre holds DNAT and hairpin entries only: {other:?}"),
        }
    }
    let text = kuport_core::render::nft_text(&plan.host_state.nft);
    assert!(
        text.contains(&format!(
            "ip daddr {STAND_IN} ct mark & 0x000000ff == 0x00000001"
        )),
        "{text}"
    );
    // The hairpin DNAT too takes only what steering moved to the stand-in with the flow mark.
    assert!(
        text.contains(&format!(
            "ip daddr {STAND_IN} ct mark & 0x000000ff == 0x00000001 counter name ct original ip daddr"
        )),
        "{text}"
    );
    assert_eq!(
        plan.host_state.valid_mark_interfaces,
        ["enp1s0", "wt0"],
        "src_valid_mark on the accepting interfaces"
    );
}

#[test]
fn an_interface_without_a_known_address_captures_nothing() {
    let only_wt0 = facts(&[("wt0", "100.64.0.1")], "wt0", 1400);
    let plan = remote().plan_with("edge-a", &only_wt0);
    let ifaces: Vec<&str> = plan
        .host_state
        .nft
        .rules(ChainId::Pre)
        .iter()
        .filter_map(|r| match r {
            Rule::Dnat(d) => Some(d.iif.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ifaces, ["wt0"]);
}

#[test]
fn the_pod_node_steers_its_link_end_without_touching_the_packet_mark() {
    let plan = remote().plan_with("worker-b", &facts(&[], "wt0", 1400));
    let link = &plan.host_state.links[0];
    let steer = plan.host_state.nft.rules(ChainId::Steer);
    assert!(
        steer.iter().all(|r| matches!(r, Rule::Steer(s)
            if s.iif == link.name && s.daddr == link.address.addr() && s.mark.is_none())),
        "{steer:?}"
    );
    assert!(plan.host_state.valid_mark_interfaces.is_empty());
}

#[test]
fn the_link_guard_admits_only_link_peers_on_the_underlay() {
    for node in ["edge-a", "worker-b"] {
        let plan = remote().plan_with(node, &edge_facts());
        let guard = plan.host_state.nft.rules(ChainId::Guard);
        let peer = plan.host_state.links[0].remote;
        assert_eq!(
            guard,
            [
                Rule::GuardAllow {
                    device: "wt0".into(),
                    port: 4790,
                    peers: vec![peer],
                },
                Rule::GuardDrop {
                    port: 4790,
                    counter: "guard/4790".into(),
                },
            ],
            "{node}"
        );
    }
    let local_only = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
        .plan_with("edge-a", &edge_facts());
    assert!(
        local_only.host_state.nft.rules(ChainId::Guard).is_empty(),
        "no link, no guard"
    );
}

#[test]
fn link_ids_are_kept_from_the_host_and_new_links_take_a_free_one() {
    let c = remote();
    let fresh = c.plan_with("worker-b", &facts(&[], "wt0", 1400));
    let name = fresh.host_state.links[0].name.clone();
    let marks = MarkLayout::default();
    assert_eq!(
        fresh.host_state.links[0].mark,
        marks.link_mark(1).expect("id 1")
    );

    // The host already carries this link as id 7, and another (stale) link as id 1.
    let mut f = facts(&[], "wt0", 1400);
    f.link_ids.insert(name.clone(), 7);
    f.link_ids.insert("kup-00000000".into(), 1);
    let kept = c.plan_with("worker-b", &f);
    let link = &kept.host_state.links[0];
    assert_eq!(link.mark, marks.link_mark(7).expect("id 7"), "kept");
    let tables: Vec<u32> = kept.host_state.routes.iter().map(|r| r.table).collect();
    assert_eq!(tables, [marks.table(link.mark)]);

    // An id taken by another link on the host is not handed out.
    let mut f = facts(&[], "wt0", 1400);
    f.link_ids.insert("kup-00000000".into(), 1);
    let other = c.plan_with("worker-b", &f);
    assert_eq!(
        other.host_state.links[0].mark,
        marks.link_mark(2).expect("id 2")
    );
}

#[test]
fn mark_layouts_overlapping_other_datapaths_are_refused() {
    assert_eq!(MarkLayout::default().validate(), Ok(()));
    for (mask, who) in [
        (0x4000_u32, "kube-proxy"),
        (0x0f00, "Cilium"),
        (0xff00_0000, "Calico"),
        (0x0000_1000, "netbird"),
        (0x00f0_0000, "Tailscale"),
    ] {
        let err = MarkLayout {
            base: mask & mask.wrapping_neg(),
            mask,
        }
        .validate()
        .expect_err(who);
        assert!(err.contains(who), "{err}");
    }
    assert!(
        MarkLayout {
            base: 0,
            mask: 0xff
        }
        .validate()
        .is_err(),
        "zero base"
    );
    assert!(
        MarkLayout {
            base: 0x100,
            mask: 0xff
        }
        .validate()
        .is_err(),
        "base outside"
    );
    assert!(
        MarkLayout {
            base: 1,
            mask: 0x05
        }
        .validate()
        .is_err(),
        "not contiguous"
    );
    let small = MarkLayout {
        base: 0x10,
        mask: 0x70,
    };
    assert_eq!(small.validate(), Ok(()));
    assert_eq!(small.link_capacity(), 6);
    assert_eq!(small.link_mark(1), Some(0x20));
    assert_eq!(small.link_mark(6), Some(0x70));
    assert_eq!(small.link_mark(7), None);
    assert_eq!(small.link_id_of_table(small.table(0x30)), Some(2));
}

#[test]
fn a_non_default_layout_reaches_every_rule() {
    let marks = MarkLayout {
        base: 0x10,
        mask: 0xf0,
    };
    let mut f = edge_facts();
    f.marks = marks;
    let edge = remote().plan_with("edge-a", &f);
    let text = kuport_core::render::nft_text(&edge.host_state.nft);
    assert!(
        text.contains("ct mark & 0x000000f0 == 0x00000010"),
        "{text}"
    );
    assert!(
        edge.host_state
            .rules
            .iter()
            .all(|r| r.fwmask == 0xf0 && r.fwmark == 0x10)
    );
    let mut f = facts(&[], "wt0", 1400);
    f.marks = marks;
    let pod = remote().plan_with("worker-b", &f);
    assert_eq!(pod.host_state.links[0].mark, 0x20);
}

#[test]
fn ports_the_nodes_depend_on_are_refused() {
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 4790)
        .portmap(pm("games", "link", "public", 4790))
        .portmap(pm("games", "overlay", "public", 8470).end(8475))
        .portmap(pm("games", "tcp-ok", "public", 4790).tcp())
        .cni_port(8472);
    let (reason, message) = accepted(&c, "link");
    assert_eq!(reason, A::PortInUse);
    assert!(
        message.contains("return links of class public"),
        "{message}"
    );
    let (reason, message) = accepted(&c, "overlay");
    assert_eq!(reason, A::PortInUse);
    assert!(
        message.contains("UDP port 8472") && message.contains("CNI"),
        "{message}"
    );
    assert_eq!(accepted(&c, "tcp-ok").0, A::Valid, "another protocol");
}

#[test]
fn hostile_interface_names_are_refused_with_a_reason() {
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "eth0/1",
        "eth 0",
        "a\"b",
        "wt*",
        "averyveryverylong",
        "eth0:1",
        "br\\0",
        "é1",
    ] {
        assert!(!valid_interface_name(bad), "{bad:?}");
    }
    for good in [
        "eth0", "enp1s0", "wt0", "eth0.100", "br-lan", "wg_mesh", "a",
    ] {
        assert!(valid_interface_name(good), "{good:?}");
    }
    let c = Cluster::new()
        .node("edge-a", "100.64.0.1")
        .namespace("games", json!({}))
        .class_json(
            "public",
            vxlan_spec(&[("edge-a", &["wt0", "eth0\" accept"])]),
            Value::Null,
        )
        .portmap(pm("games", "all", "public", 3000))
        .portmap(pm("games", "narrowed", "public", 3001).ifaces(&["wt0"]));
    let (reason, message) = accepted(&c, "all");
    assert_eq!(reason, A::InvalidInterfaceName);
    assert!(message.contains("eth0\\\" accept"), "{message}");
    assert_eq!(
        accepted(&c, "narrowed").0,
        A::Valid,
        "a mapping that does not bind the bad name is unaffected"
    );
}

#[test]
fn a_class_subnet_over_the_stand_in_block_is_refused() {
    let c = Cluster::new().node("edge-a", "100.64.0.1").class_json(
        "public",
        json!({"nodes": nodes_json(&[("edge-a", &["wt0"])]),
                   "returnPath": {"mode": "Vxlan", "vxlan": {"subnet": "169.254.0.0/16"}}}),
        Value::Null,
    );
    let plan = c.plan("edge-a");
    let class = &plan.classes[0];
    assert_eq!(class.ready.reason, ClassReason::InvalidSubnet);
    assert!(
        class.ready.message.contains("stand-in"),
        "{}",
        class.ready.message
    );
}

#[test]
fn a_refused_link_takes_out_only_what_leads_into_it() {
    let pod = remote().plan_with("worker-b", &facts(&[], "wt0", 1400));
    let name = pod.host_state.links[0].name.clone();
    let cut = pod.host_state.without_links(std::slice::from_ref(&name));
    assert!(cut.links.is_empty() && cut.routes.is_empty() && cut.rules.is_empty());
    assert!(cut.nft.rules(ChainId::Pre).is_empty());
    assert!(
        cut.nft.rules(ChainId::Steer).is_empty(),
        "no steer without its DNAT"
    );
    assert_eq!(
        pod.host_state.without_links(&["kup-other".into()]),
        pod.host_state
    );

    // On the accepting node: the local mapping stays, the remote one goes.
    let c = remote()
        .endpoint("games", "local", "l-0", "edge-a", "10.244.0.7", 5000)
        .portmap(pm("games", "local", "public", 5000));
    let edge = c.plan_with("edge-a", &edge_facts());
    let link = edge.host_state.links[0].name.clone();
    let cut = edge.host_state.without_links(&[link]);
    let comments: Vec<&str> = cut
        .nft
        .rules(ChainId::Steer)
        .iter()
        .chain(cut.nft.rules(ChainId::Pre))
        .filter_map(|r| match r {
            Rule::Steer(s) | Rule::MarkRequest(s) => Some(s.comment.as_str()),
            Rule::Dnat(d) => Some(d.comment.as_str()),
            _ => None,
        })
        .collect();
    assert!(!comments.is_empty());
    assert!(comments.iter().all(|c| *c == "games/local"), "{comments:?}");
}

#[test]
fn the_transaction_sends_what_differs_and_recreates_what_cannot_change_in_place() {
    use kuport_core::render::{layout, transaction};
    let plan = remote().plan_with("edge-a", &edge_facts());
    let planned = layout(&plan.host_state.nft);
    let first = transaction(None, &planned);
    assert!(first.starts_with("add table ip kuport\n"), "{first}");
    assert!(first.contains("add counter ip kuport pre/games/gs\n"));
    assert!(first.contains(
        "add chain ip kuport kup-steer { type filter hook prerouting priority -130; policy accept; }"
    ));
    for (name, chain) in &planned.layout.chains {
        for rule in &chain.rules {
            let line = format!("add rule ip kuport {name} {rule}");
            assert!(first.contains(&line), "missing {line}");
        }
    }
    for (name, store) in &planned.layout.stores {
        for (key, value) in &store.elements {
            let line = format!(
                "add element ip kuport {name} {{ {} }}",
                kuport_core::render::layout::element_text(key, value)
            );
            assert!(first.contains(&line), "missing {line}");
        }
    }
    // Against itself: only the table line (nothing differs).
    assert_eq!(
        transaction(Some(&planned.layout), &planned),
        "add table ip kuport\n"
    );
    // A vanished mapping's counter is deleted, last.
    let mut held = planned.layout.clone();
    held.counters.insert("pre/games/gone".into());
    let script = transaction(Some(&held), &planned);
    assert_eq!(
        script,
        "add table ip kuport\ndelete counter ip kuport pre/games/gone\n"
    );
    // A chain at another priority cannot be changed in place: the table is made again.
    let mut held = planned.layout.clone();
    if let Some(c) = held.chains.get_mut("kup-steer") {
        c.header = "type filter hook prerouting priority -160; policy accept;".into();
    }
    let recreate = transaction(Some(&held), &planned);
    assert!(
        recreate.starts_with("add table ip kuport\ndelete table ip kuport\nadd table ip kuport\n")
    );
    assert_eq!(recreate.lines().count(), first.lines().count() + 2);
    let empty = kuport_core::render::Planned::default();
    assert_eq!(
        transaction(Some(&planned.layout), &empty),
        "delete table ip kuport\n"
    );
    assert_eq!(transaction(None, &empty), "");
}

/// edge-a's row reports a host socket on `port` bound to `address`.
fn with_held(c: Cluster, protocol: &str, port: i32, address: &str) -> Cluster {
    with_held_yielding(c, protocol, port, address, &[])
}

fn with_held_yielding(
    mut c: Cluster,
    protocol: &str,
    port: i32,
    address: &str,
    yields_to: &[&str],
) -> Cluster {
    let held = serde_json::from_value(json!({"protocol": protocol, "port": port,
        "address": address, "holder": format!("host {protocol} socket {address}:{port}"),
        "yieldsTo": yields_to}))
    .expect("held port");
    let status = c.class_mut("public").status.as_mut().expect("status");
    let row = status
        .nodes
        .iter_mut()
        .find(|r| r.name == "edge-a")
        .expect("edge-a row");
    row.held_ports.push(held);
    c
}

/// A mapping on sshd's port 22, in a class whose administrator opted in to the system-reserved
/// ports (22 is one by default): only the socket can refuse it.
fn ssh_cluster() -> Cluster {
    edge_and_worker()
        .without_system_reserved("public")
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 22)
        .portmap(pm("games", "ssh", "public", 22).tcp())
}

#[test]
fn a_port_a_host_socket_holds_on_an_accepting_node_is_refused_naming_the_socket() {
    let c = with_held(ssh_cluster(), "TCP", 22, "0.0.0.0");
    let (reason, message) = accepted(&c, "ssh");
    assert_eq!(reason, A::PortInUse);
    assert!(
        message.contains("host TCP socket 0.0.0.0:22") && message.contains("edge-a"),
        "{message}"
    );
    // Control: the same port over the other protocol, and a socket bound to an address the
    // mapping does not bind, take nothing from it.
    assert_eq!(
        accepted(&with_held(ssh_cluster(), "UDP", 22, "0.0.0.0"), "ssh").0,
        A::Valid
    );
    assert_eq!(
        accepted(&with_held(ssh_cluster(), "TCP", 22, "127.0.0.1"), "ssh").0,
        A::Valid
    );
    // Bound to wt0's address: refused for a mapping on every interface, not for one on enp1s0.
    let on_wt0 = with_held(ssh_cluster(), "TCP", 22, "100.64.0.1");
    assert_eq!(accepted(&on_wt0, "ssh").0, A::PortInUse);
    let enp_only = with_held(
        edge_and_worker()
            .without_system_reserved("public")
            .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 22)
            .portmap(pm("games", "ssh", "public", 22).tcp().ifaces(&["enp1s0"])),
        "TCP",
        22,
        "100.64.0.1",
    );
    assert_eq!(accepted(&enp_only, "ssh").0, A::Valid);
}

#[test]
fn a_mapping_the_node_forwarded_before_the_socket_appeared_keeps_its_port_and_says_so() {
    let c = with_held_yielding(ssh_cluster(), "TCP", 22, "0.0.0.0", &["games/ssh"]);
    let plan = c.plan("edge-a");
    let d = decision(&plan, "games", "ssh");
    assert_eq!(d.accepted.reason, A::PortAlsoHeldByHost);
    assert!(d.accepted.is_true(), "earliest wins: still accepted");
    assert!(
        d.accepted.message.contains("accepted first"),
        "{}",
        d.accepted.message
    );
    // The socket yields to another mapping only: this one is refused.
    let other = with_held_yielding(ssh_cluster(), "TCP", 22, "0.0.0.0", &["games/other"]);
    assert_eq!(accepted(&other, "ssh").0, A::PortInUse);
}

#[test]
fn a_socket_yields_to_what_the_node_already_forwarded_when_first_seen_and_remembers_it() {
    use kuport_core::api::Protocol;
    use kuport_core::ir::ProgrammedPort;
    let mut f = facts_with_sshd();
    let yields = |c: &Cluster, f: &kuport_core::snapshot::HostFacts| {
        let plan = c.plan_with("edge-a", f);
        plan.writes.class_rows[0].row.held_ports[0]
            .yields_to
            .clone()
    };
    // Seen before anything was forwarded on its port: it was there first.
    assert!(yields(&ssh_cluster(), &f).is_empty());
    // First seen while the datapath already captured the port for games/ssh.
    f.programmed_ports = vec![ProgrammedPort {
        mapping: "games/ssh".into(),
        protocol: Protocol::Tcp,
        first: 20,
        last: 30,
    }];
    assert_eq!(yields(&ssh_cluster(), &f), ["games/ssh"]);
    // Once reported, the row's record stands (an agent restart forgets what it applied).
    f.programmed_ports.clear();
    let reported = with_held_yielding(ssh_cluster(), "TCP", 22, "0.0.0.0", &["games/ssh"]);
    assert_eq!(yields(&reported, &f), ["games/ssh"]);
}

#[test]
fn the_class_row_reports_only_sockets_on_asked_ports_and_bound_addresses() {
    use kuport_core::api::Protocol;
    use kuport_core::snapshot::HostSocket;
    let sock = |protocol, address: &str, port| HostSocket {
        protocol,
        address: address.parse().expect("ip"),
        port,
        holder: None,
    };
    let mut f = edge_facts();
    f.sockets = vec![
        sock(Protocol::Tcp, "0.0.0.0", 22), // asked (ssh) and every address
        sock(Protocol::Tcp, "127.0.0.1", 22), // loopback: not a bound address
        sock(Protocol::Tcp, "0.0.0.0", 10250), // nobody asks for it
        sock(Protocol::Udp, "100.64.0.1", 3000), // asked, on wt0's address
        sock(Protocol::Udp, "10.9.9.9", 3000), // another address
    ];
    f.firewall_warnings = vec!["b".into(), "a".into(), "b".into()];
    let c = ssh_cluster()
        .endpoint("games", "gs3", "gs-1", "edge-a", "10.244.0.6", 3000)
        .portmap(pm("games", "udp", "public", 2999).end(3001));
    let plan = c.plan_with("edge-a", &f);
    let row = &plan.writes.class_rows[0].row;
    let held: Vec<(Protocol, i32, &str)> = row
        .held_ports
        .iter()
        .map(|h| (h.protocol, h.port, h.address.as_str()))
        .collect();
    assert_eq!(
        held,
        [
            (Protocol::Tcp, 22, "0.0.0.0"),
            (Protocol::Udp, 3000, "100.64.0.1")
        ]
    );
    assert_eq!(row.held_ports[0].holder, "host TCP listener 0.0.0.0:22");
    assert_eq!(row.warnings, ["a", "b"], "sorted, once each");
}

#[test]
fn a_programmed_mapping_names_a_firewall_known_to_drop_its_traffic() {
    let mut c = remote();
    let status = c.class_mut("public").status.as_mut().expect("status");
    for row in &mut status.nodes {
        if row.name == "edge-a" {
            row.warnings = vec!["the host firewall's chain inet filter forward drops".into()];
        }
    }
    let plan = c.plan("worker-b");
    let d = decision(&plan, "games", "gs");
    let programmed = d.programmed.as_ref().expect("programmed");
    assert!(programmed.is_true(), "{programmed:?}");
    assert!(
        programmed
            .message
            .contains("on node edge-a, the host firewall's chain inet filter forward drops"),
        "{}",
        programmed.message
    );
    // Control: without the warning the message is empty.
    let plan = remote().plan("worker-b");
    let d = decision(&plan, "games", "gs");
    assert_eq!(d.programmed.as_ref().expect("programmed").message, "");
}

#[test]
fn stand_in_addresses_are_refused_as_interface_and_node_addresses() {
    let f = facts(
        &[("enp1s0", "169.254.107.1"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    );
    let plan = remote().plan_with("edge-a", &f);
    let row = &plan.writes.class_rows[0].row;
    // The node still serves on its other interface, and says which it does not serve on.
    assert!(row.ready);
    assert!(
        row.message.as_deref().is_some_and(|m| m.contains("enp1s0")
            && m.contains("169.254.107.0/24")
            && m.ends_with("serving on wt0 only")),
        "{:?}",
        row.message
    );
    assert!(
        plan.host_state
            .nft
            .rules(ChainId::Steer)
            .iter()
            .all(|r| !matches!(r, Rule::Steer(s) if s.iif == "enp1s0")),
        "nothing is captured on it"
    );
    // A node whose InternalIP lies in the block has none kuport can use: no link to it.
    let c = Cluster::new()
        .node("edge-a", "100.64.0.1")
        .node("worker-b", "169.254.107.7")
        .namespace("games", json!({}))
        .class_json(
            "public",
            vxlan_spec(&[("edge-a", &["enp1s0", "wt0"])]),
            Value::Null,
        )
        .row("public", "edge-a", json!({"enp1s0": "203.0.113.9"}), 1400)
        .row("public", "worker-b", json!({}), 1420)
        .claim_built("public", "edge-a/worker-b", 0)
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let plan = c.plan("edge-a");
    assert!(
        plan.host_state.links.is_empty(),
        "{:?}",
        plan.host_state.links
    );
}

#[test]
fn the_applied_state_names_the_ports_it_captures_as_an_accepting_node() {
    use kuport_core::api::Protocol;
    let edge = remote().plan_with("edge-a", &edge_facts());
    let ports = edge.host_state.accepting_ports();
    assert_eq!(
        ports.len(),
        1,
        "one entry per mapping and port, not per interface"
    );
    assert_eq!(
        (
            ports[0].mapping.as_str(),
            ports[0].protocol,
            ports[0].first,
            ports[0].last
        ),
        ("games/gs", Protocol::Udp, 3000, 3000)
    );
    // The pod's node forwards link traffic but captures nothing of its own.
    let pod = remote().plan_with("worker-b", &facts(&[], "wt0", 1400));
    assert!(pod.host_state.accepting_ports().is_empty());
}

#[test]
fn a_refused_mapping_is_cut_alone_and_named_by_its_rules() {
    let c = remote()
        .endpoint("games", "local", "l-0", "edge-a", "10.244.0.7", 5000)
        .portmap(pm("games", "local", "public", 5000));
    let edge = c.plan_with("edge-a", &edge_facts());
    let owners = edge.host_state.nft.owners();
    assert_eq!(
        owners
            .mappings_in(&edge.host_state.nft)
            .into_iter()
            .collect::<Vec<_>>(),
        ["games/gs", "games/local"]
    );
    for rule in edge.host_state.nft.rules(ChainId::Steer) {
        assert!(
            owners.of_rule(rule).is_some(),
            "steering has an owner: {rule:?}"
        );
    }
    let cut = edge
        .host_state
        .nft
        .without_mappings(&["games/local".to_owned()].into_iter().collect());
    assert_eq!(
        owners.mappings_in(&cut).into_iter().collect::<Vec<_>>(),
        ["games/gs"]
    );
    assert!(cut.counters.iter().all(|c| c.mapping != "local"));
    // The guard and the marks belong to no mapping and stay.
    assert_eq!(
        cut.rules(ChainId::Guard),
        edge.host_state.nft.rules(ChainId::Guard)
    );
    assert_eq!(
        cut.rules(ChainId::Mangle),
        edge.host_state.nft.rules(ChainId::Mangle)
    );
    let mut reduced = edge.host_state.clone();
    reduced.nft = cut;
    assert_eq!(
        edge.host_state
            .mappings_cut_by(&reduced)
            .into_iter()
            .collect::<Vec<_>>(),
        ["games/local"]
    );
    // Every line of the transaction says what it adds, in the order it is written.
    let planned = kuport_core::render::layout(&edge.host_state.nft);
    let lines = kuport_core::render::transaction_lines(None, &planned);
    let script = kuport_core::render::transaction(None, &planned);
    assert_eq!(script.lines().count(), lines.len());
    for ((line, _), text) in lines.iter().zip(script.lines()) {
        assert_eq!(line, text);
    }
}

fn refusal(mapping: &str, message: &str) -> kuport_core::snapshot::KernelRefusal {
    kuport_core::snapshot::KernelRefusal {
        mapping: mapping.into(),
        message: message.into(),
        link: None,
    }
}

#[test]
fn a_refusal_is_reported_under_its_class_and_turns_programmed_false() {
    // worker-b (the pod's node, not an accepting node) refused the link of games/gs.
    let mut pod_facts = facts(&[], "wt0", 1400);
    pod_facts.refusals = vec![
        refusal(
            "games/gs",
            "the kernel refused its return link kup-x: VNI held",
        ),
        refusal("games/gone", "a mapping that no longer exists"),
    ];
    let pod = remote().plan_with("worker-b", &pod_facts);
    assert_eq!(pod.writes.refusals.len(), 1, "{:?}", pod.writes.refusals);
    assert_eq!(pod.writes.refusals[0].class, "public");
    assert_eq!(pod.writes.refusals[0].mapping, "games/gs");

    // The status writer (edge-a) reads worker-b's entry from the class status.
    let mut c = remote();
    c.report_refused(
        "public",
        "worker-b",
        "games/gs",
        "the kernel refused its return link kup-x: VNI held",
    );
    let plan = c.plan_with("edge-a", &edge_facts());
    let p = decision(&plan, "games", "gs")
        .programmed
        .clone()
        .expect("accepted");
    assert_eq!(p.reason, kuport_core::plan::ProgrammedReason::HostRefused);
    assert_eq!(
        p.message,
        "on node worker-b, the kernel refused its return link kup-x: VNI held"
    );
    // Its datapath is still asked for: the refused part is retried, nothing flaps.
    assert_eq!(
        plan.host_state,
        remote().plan_with("edge-a", &edge_facts()).host_state
    );

    // An entry of a node that no longer programs the mapping is ignored.
    c.class_mut("public")
        .status
        .as_mut()
        .expect("status")
        .refused[0]
        .node = "elsewhere".into();
    let plan = c.plan_with("edge-a", &edge_facts());
    assert!(
        decision(&plan, "games", "gs")
            .programmed
            .as_ref()
            .expect("accepted")
            .is_true()
    );

    // This node's own refusal counts at once, before any status round trip.
    let mut own = edge_facts();
    own.refusals = vec![refusal(
        "games/gs",
        "the kernel refused its nftables rules: no",
    )];
    let plan = remote().plan_with("edge-a", &own);
    let p = decision(&plan, "games", "gs")
        .programmed
        .clone()
        .expect("accepted");
    assert_eq!(p.reason, kuport_core::plan::ProgrammedReason::HostRefused);
    assert!(p.message.starts_with("on node edge-a, "), "{}", p.message);
}

/// The lab's isolation case: the pod's node refused the link, so it never acknowledged its end;
/// the refusal names the cause, not a missing ack that asks whether its agent runs.
#[test]
fn a_refused_link_end_that_never_acknowledged_is_reported_as_refused() {
    let unacknowledged = || {
        edge_and_worker()
            .row("public", "worker-b", json!({}), 1420)
            .claim("public", "edge-a/worker-b", 0)
            .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
            .portmap(pm("games", "gs", "public", 3000))
    };
    let programmed = |c: &Cluster| {
        let plan = c.plan_with("edge-a", &edge_facts());
        decision(&plan, "games", "gs")
            .programmed
            .clone()
            .expect("accepted")
    };
    // The control: without a refusal, the missing ack is the reason.
    let p = programmed(&unacknowledged());
    assert_eq!(
        p.reason,
        kuport_core::plan::ProgrammedReason::NotAcknowledged
    );
    let mut c = unacknowledged();
    c.class_mut("public")
        .status
        .get_or_insert_with(Default::default)
        .refused = vec![kuport_core::api::RefusedMapping {
        node: "worker-b".into(),
        mapping: "games/gs".into(),
        message: "the kernel refused its return link kup-x: VNI held".into(),
    }];
    let p = programmed(&c);
    assert_eq!(p.reason, kuport_core::plan::ProgrammedReason::HostRefused);
    assert_eq!(
        p.message,
        "on node worker-b, the kernel refused its return link kup-x: VNI held"
    );
}

#[test]
fn an_accepting_node_never_captures_a_port_its_own_socket_holds_before_its_row_says_so() {
    use kuport_core::api::Protocol;
    use kuport_core::ir::ProgrammedPort;
    let dnat_ports = |plan: &kuport_core::plan::Plan| -> Vec<u16> {
        plan.host_state
            .nft
            .rules(ChainId::Pre)
            .iter()
            .chain(plan.host_state.nft.rules(ChainId::Steer))
            .filter_map(|r| match r {
                Rule::Dnat(d) => Some(d.ports.first),
                Rule::Steer(s) | Rule::MarkRequest(s) => Some(s.ports.first),
                _ => None,
            })
            .collect()
    };
    let f = facts_with_sshd();
    // The class and the mapping were created together: edge-a's row does not report the
    // socket yet, so admission accepts the mapping; edge-a still captures nothing on 22.
    let c = ssh_served();
    let plan = c.plan_with("edge-a", &f);
    assert!(decision(&plan, "games", "ssh").accepted.is_true());
    assert!(dnat_ports(&plan).is_empty(), "{:?}", dnat_ports(&plan));
    // And the row it writes records that the socket yields to nobody.
    assert!(
        plan.writes.class_rows[0].row.held_ports[0]
            .yields_to
            .is_empty()
    );
    // Control: without the socket the port is captured.
    let plan = c.plan_with("edge-a", &edge_facts());
    assert!(dnat_ports(&plan).contains(&22));
    // A socket bound to another address takes nothing from the mapping.
    let mut elsewhere = f.clone();
    elsewhere.sockets[0].address = "127.0.0.1".parse().expect("ip");
    assert!(dnat_ports(&c.plan_with("edge-a", &elsewhere)).contains(&22));
    // Earliest wins: the node was already forwarding the port when the socket appeared.
    let mut forwarded = f.clone();
    forwarded.programmed_ports = vec![ProgrammedPort {
        mapping: "games/ssh".into(),
        protocol: Protocol::Tcp,
        first: 22,
        last: 22,
    }];
    assert!(dnat_ports(&c.plan_with("edge-a", &forwarded)).contains(&22));
    // Once the row records whom the socket yields to, that record decides.
    let yielded = with_held_yielding(ssh_served(), "TCP", 22, "0.0.0.0", &["games/ssh"]);
    assert!(dnat_ports(&yielded.plan_with("edge-a", &f)).contains(&22));
    let refused = with_held_yielding(ssh_served(), "TCP", 22, "0.0.0.0", &[]);
    assert!(dnat_ports(&refused.plan_with("edge-a", &forwarded)).is_empty());
}

/// `ssh_cluster` with a ready TCP endpoint, so the mapping is programmed.
fn ssh_served() -> Cluster {
    edge_and_worker()
        .without_system_reserved("public")
        .endpoint_full(
            "games",
            "sshd",
            "ssh",
            "TCP",
            "sshd-0",
            "edge-a",
            "10.244.0.5",
            22,
            Some(true),
        )
        .portmap(
            pm("games", "ssh", "public", 22)
                .tcp()
                .service("sshd", "ssh"),
        )
}

/// edge-a's facts with sshd listening on TCP 22 on every address.
fn facts_with_sshd() -> kuport_core::snapshot::HostFacts {
    let mut f = edge_facts();
    f.sockets = vec![kuport_core::snapshot::HostSocket {
        protocol: kuport_core::api::Protocol::Tcp,
        address: "0.0.0.0".parse().expect("ip"),
        port: 22,
        holder: None,
    }];
    f
}
