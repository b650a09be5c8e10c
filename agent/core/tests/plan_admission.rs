//! Admission (`Accepted`) and conflicts: one test per reason, and the order they are checked in.

use kuport_core::plan::AcceptedReason as A;
use kuport_testkit::cluster::*;
use serde_json::{Value, json};

fn cluster() -> Cluster {
    Cluster::new()
        .node("w1", "100.64.0.1")
        .node("w2", "100.64.0.2")
        .namespace("games", json!({"kuport.wlz.li/public": "allowed"}))
        .namespace("other", json!({}))
        .class_json(
            "public",
            json!({"nodes": nodes_json(&[("w1", &["enp1s0", "wt0"]), ("w2", &["wt0", "eth0"])]),
                   "ports": {"min": 1024, "max": 40000, "reserved": [3005, 8080]},
                   "namespaceSelector": {"matchLabels": {"kuport.wlz.li/public": "allowed"}},
                   "returnPath": {"mode": "Vxlan"}}),
            Value::Null,
        )
        .class_json(
            "open",
            none_spec(&[("w1", &["wt0"]), ("w2", &["lan0"])]),
            Value::Null,
        )
}

fn accepted(c: &Cluster, ns: &str, name: &str) -> (A, String) {
    let plan = c.plan("w1");
    let d = decision(&plan, ns, name);
    (d.accepted.reason, d.accepted.message.clone())
}

#[test]
fn each_admission_reason() {
    let cases: Vec<(&str, Pm, A, &str)> = vec![
        (
            "valid",
            pm("games", "ok", "public", 3000).end(3004),
            A::Valid,
            "",
        ),
        (
            "class missing",
            pm("games", "x", "nope", 3000),
            A::ClassNotFound,
            "PortMapClass \"nope\" does not exist",
        ),
        (
            "endPort below port",
            pm("games", "x", "public", 3000).end(2999),
            A::InvalidPortRange,
            "endPort 2999 is lower than port 3000",
        ),
        (
            "namespace not selected",
            pm("other", "x", "public", 3000),
            A::NamespaceNotSelected,
            "namespace other does not match",
        ),
        (
            "namespace missing",
            pm("ghost", "x", "public", 3000),
            A::NamespaceNotSelected,
            "namespace ghost was not found",
        ),
        (
            "below window",
            pm("games", "x", "public", 1000),
            A::PortOutOfRange,
            "port 1000 lie outside the window 1024-40000",
        ),
        (
            "range leaves window",
            pm("games", "x", "public", 39999).end(40001),
            A::PortOutOfRange,
            "ports 39999-40001",
        ),
        (
            "port zero",
            pm("games", "x", "public", 0),
            A::PortOutOfRange,
            "outside the window",
        ),
        (
            "port above 65535",
            pm("open", "x", "open", 70000),
            A::PortOutOfRange,
            "outside the window 1-65535",
        ),
        (
            "reserved inside range",
            pm("games", "x", "public", 3000).end(3009),
            A::PortReserved,
            "port 3005 is reserved by class public",
        ),
        (
            "reserved single",
            pm("games", "x", "public", 8080),
            A::PortReserved,
            "port 8080 is reserved",
        ),
        (
            "interface unknown",
            pm("games", "x", "public", 3000).ifaces(&["wt0", "eth9"]),
            A::InterfaceNotInClass,
            "interface eth9 is not given to any node by class public",
        ),
    ];
    for (what, p, reason, message) in cases {
        let c = cluster().portmap(p.clone());
        let (got, msg) = accepted(&c, &p.namespace, &p.name);
        assert_eq!(got, reason, "{what}: {msg}");
        assert!(
            msg.contains(message),
            "{what}: message {msg:?} lacks {message:?}"
        );
        if reason == A::Valid {
            assert!(msg.is_empty());
        }
    }
}

#[test]
fn first_failing_reason_wins() {
    // Missing class beats a bad range; a bad range beats the namespace; the namespace beats the
    // window; the window beats a reserved port; a reserved port beats an unknown interface.
    let c = cluster()
        .portmap(pm("other", "a", "nope", 5).end(1))
        .portmap(pm("other", "b", "public", 5).end(1))
        .portmap(pm("other", "c", "public", 5))
        .portmap(pm("games", "d", "public", 5).ifaces(&["eth9"]))
        .portmap(pm("games", "e", "public", 8080).ifaces(&["eth9"]));
    let plan = c.plan("w1");
    let reasons: Vec<A> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|n| {
            plan.portmaps
                .iter()
                .find(|d| d.name == *n)
                .expect("decision")
                .accepted
                .reason
        })
        .collect();
    assert_eq!(
        reasons,
        [
            A::ClassNotFound,
            A::InvalidPortRange,
            A::NamespaceNotSelected,
            A::PortOutOfRange,
            A::PortReserved
        ]
    );
}

#[test]
fn unparsable_selector_selects_nothing() {
    let mut c = cluster();
    c.push_class(
        "weird",
        "2026-01-01T00:00:00Z",
        json!({"nodes": nodes_json(&[("w1", &["wt0"])]), "returnPath": {"mode": "None"},
               "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Sometimes"}]}}),
        Value::Null,
    );
    let c = c.portmap(pm("games", "x", "weird", 3000));
    let (reason, msg) = accepted(&c, "games", "x");
    assert_eq!(reason, A::NamespaceNotSelected);
    assert!(msg.contains("cannot be parsed"), "{msg}");
}

#[test]
fn each_class_selects_a_namespace_for_itself() {
    // Many mappings of one namespace, in two classes whose selectors disagree about it, and in
    // both orders of creation: what one class's selector said is never taken for the other's.
    let mut c = cluster();
    c.push_class(
        "games-only-not",
        "2026-01-01T00:00:00Z",
        json!({"nodes": nodes_json(&[("w1", &["wt0"])]), "returnPath": {"mode": "None"},
               "namespaceSelector": {"matchExpressions": [
                   {"key": "kuport.wlz.li/public", "operator": "DoesNotExist"}]}}),
        Value::Null,
    );
    let c = c
        .portmap(pm("games", "a1", "public", 3000))
        .portmap(pm("games", "b1", "games-only-not", 3100))
        .portmap(pm("games", "a2", "public", 3200))
        .portmap(pm("games", "b2", "games-only-not", 3300))
        .portmap(pm("other", "c1", "games-only-not", 3400))
        .portmap(pm("other", "d1", "public", 3500));
    for (ns, name, want) in [
        ("games", "a1", A::Valid),
        ("games", "a2", A::Valid),
        ("games", "b1", A::NamespaceNotSelected),
        ("games", "b2", A::NamespaceNotSelected),
        ("other", "c1", A::Valid),
        ("other", "d1", A::NamespaceNotSelected),
    ] {
        assert_eq!(accepted(&c, ns, name).0, want, "{ns}/{name}");
    }
}

#[test]
fn empty_selector_selects_every_namespace() {
    let c = cluster().portmap(pm("other", "x", "open", 3000));
    assert_eq!(accepted(&c, "other", "x").0, A::Valid);
}

#[test]
fn earlier_mapping_holds_the_port() {
    let c = cluster()
        .portmap(
            pm("games", "late", "public", 3002)
                .end(3004)
                .created("2026-02-01T00:00:00Z"),
        )
        .portmap(
            pm("games", "lobby", "public", 3000)
                .end(3003)
                .created("2026-01-01T00:00:00Z"),
        );
    assert_eq!(accepted(&c, "games", "lobby").0, A::Valid);
    let (reason, msg) = accepted(&c, "games", "late");
    assert_eq!(reason, A::PortConflict);
    assert!(
        msg.starts_with("ports 3002-3003 are held by games/lobby"),
        "{msg}"
    );
}

#[test]
fn same_creation_time_breaks_ties_by_namespace_then_name() {
    let c = cluster()
        .namespace("aaa", json!({"kuport.wlz.li/public": "allowed"}))
        .portmap(pm("games", "b", "public", 3000))
        .portmap(pm("games", "a", "public", 3000))
        .portmap(pm("aaa", "z", "public", 3000));
    assert_eq!(accepted(&c, "aaa", "z").0, A::Valid);
    assert_eq!(accepted(&c, "games", "a").0, A::PortConflict);
    let (_, msg) = accepted(&c, "games", "b");
    assert_eq!(msg, "port 3000 is held by aaa/z (UDP on w1/enp1s0)");
}

#[test]
fn different_protocols_coexist() {
    let c = cluster()
        .portmap(pm("games", "u", "public", 3000))
        .portmap(pm("games", "t", "public", 3000).tcp());
    assert_eq!(accepted(&c, "games", "u").0, A::Valid);
    assert_eq!(accepted(&c, "games", "t").0, A::Valid);
}

#[test]
fn disjoint_interfaces_coexist_and_shared_ones_conflict() {
    // Different classes conflict only where they share a (node, interface).
    let c = cluster()
        .portmap(
            pm("games", "pub-enp", "public", 3000)
                .ifaces(&["enp1s0"])
                .created("2026-01-01T00:00:00Z"),
        )
        .portmap(
            pm("games", "open-lan", "open", 3000)
                .ifaces(&["lan0"])
                .created("2026-01-02T00:00:00Z"),
        )
        .portmap(
            pm("games", "open-wt", "open", 3000)
                .ifaces(&["wt0"])
                .created("2026-01-03T00:00:00Z"),
        )
        .portmap(
            pm("games", "pub-wt", "public", 3000)
                .ifaces(&["wt0"])
                .created("2026-01-04T00:00:00Z"),
        );
    assert_eq!(accepted(&c, "games", "pub-enp").0, A::Valid);
    assert_eq!(accepted(&c, "games", "open-lan").0, A::Valid);
    assert_eq!(accepted(&c, "games", "open-wt").0, A::Valid);
    let (reason, msg) = accepted(&c, "games", "pub-wt");
    assert_eq!(reason, A::PortConflict);
    assert!(msg.contains("held by games/open-wt"), "{msg}");
}

#[test]
fn refused_mappings_hold_no_ports() {
    let c = cluster()
        .portmap(pm("other", "refused", "public", 3000).created("2026-01-01T00:00:00Z"))
        .portmap(pm("games", "later", "public", 3000).created("2026-01-02T00:00:00Z"));
    assert_eq!(accepted(&c, "other", "refused").0, A::NamespaceNotSelected);
    assert_eq!(accepted(&c, "games", "later").0, A::Valid);
}

#[test]
fn conflict_checks_every_named_node_not_only_ready_ones() {
    let c = Cluster::new()
        .node("w1", "100.64.0.1")
        .unready_node("w2", "100.64.0.2")
        .namespace("games", json!({}))
        .class_json(
            "a",
            none_spec(&[("w1", &["wt0"]), ("w2", &["lan0"])]),
            Value::Null,
        )
        .class_json("b", none_spec(&[("w2", &["lan0"])]), Value::Null)
        .portmap(pm("games", "first", "a", 3000).created("2026-01-01T00:00:00Z"))
        .portmap(pm("games", "second", "b", 3000).created("2026-01-02T00:00:00Z"));
    let (reason, msg) = accepted(&c, "games", "second");
    assert_eq!(reason, A::PortConflict, "{msg}");
    assert!(msg.contains("w2/lan0"), "{msg}");
}

#[test]
fn a_range_conflicts_with_a_port_inside_it() {
    let c = cluster()
        .portmap(pm("games", "single", "public", 3007).created("2026-01-01T00:00:00Z"))
        .portmap(
            pm("games", "below", "public", 2500)
                .end(2999)
                .created("2026-01-02T00:00:00Z"),
        )
        .portmap(
            pm("games", "above", "public", 3008)
                .end(3010)
                .created("2026-01-02T00:00:00Z"),
        );
    assert_eq!(
        accepted(&c, "games", "below").0,
        A::Valid,
        "ranges next to a held port coexist"
    );
    assert_eq!(accepted(&c, "games", "above").0, A::Valid);
    let c = cluster()
        .portmap(pm("games", "single", "public", 3007).created("2026-01-01T00:00:00Z"))
        .portmap(
            pm("games", "range", "public", 3006)
                .end(3009)
                .created("2026-01-03T00:00:00Z"),
        );
    let (reason, msg) = accepted(&c, "games", "range");
    assert_eq!(reason, A::PortConflict);
    assert_eq!(msg, "port 3007 is held by games/single (UDP on w1/enp1s0)");
}
