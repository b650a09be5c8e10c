//! Many tenants in one class: each namespace's port quota, PortMaps whose Service does not
//! exist, and PortMaps a class refuses outright leaving nothing behind in it (no held-port
//! claims, no binding sets), with every list a node writes bounded.

use kuport_core::api::NamespacePorts;
use kuport_core::plan::{AcceptedReason as A, Plan};
use kuport_core::snapshot::HostFacts;
use kuport_testkit::cluster::*;
use serde_json::json;

fn edge_facts() -> HostFacts {
    facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    )
}

fn reason(plan: &Plan, namespace: &str, name: &str) -> (A, String) {
    let d = decision(plan, namespace, name);
    (d.accepted.reason, d.accepted.message.clone())
}

/// Two tenants in class `public` (edge-a accepts), the administrator's quota `quota` per
/// namespace.
fn tenants(quota: i32) -> Cluster {
    edge_and_worker()
        .namespace("team-a", json!({}))
        .namespace("team-b", json!({}))
        .ports_per_namespace("public", quota)
}

fn at(c: Cluster, namespace: &str, name: &str, created: &str, port: i32, end: i32) -> Cluster {
    c.portmap(
        pm(namespace, name, "public", port)
            .end(end)
            .created(created),
    )
}

#[test]
fn a_namespace_past_its_quota_is_refused_and_holds_nothing() {
    let c = tenants(100);
    let c = at(c, "team-a", "first", "2026-01-01T00:00:00Z", 20000, 20079);
    let c = at(c, "team-a", "second", "2026-01-02T00:00:00Z", 21000, 21029);
    let c = at(c, "team-a", "third", "2026-01-03T00:00:00Z", 22000, 22019);
    // team-b asks for the very ports team-a was refused: they are free.
    let c = at(c, "team-b", "other", "2026-01-04T00:00:00Z", 21000, 21029);
    let plan = c.plan_with("edge-a", &edge_facts());
    assert_eq!(reason(&plan, "team-a", "first").0, A::Valid);
    let (why, message) = reason(&plan, "team-a", "second");
    assert_eq!(why, A::PortQuotaExceeded, "{message}");
    assert!(
        message.contains("namespace team-a already holds 80 of its 100 ports in class public")
            && message.contains("30 ports more"),
        "{message}"
    );
    // The refusal took nothing from the count: 20 more fit.
    assert_eq!(reason(&plan, "team-a", "third").0, A::Valid);
    assert_eq!(reason(&plan, "team-b", "other").0, A::Valid);
    // The class status lists each namespace's use against its quota.
    let write = plan
        .writes
        .class_rows
        .iter()
        .find(|w| w.class == "public")
        .expect("edge-a writes its row of public");
    let listed = |ns: &str, used: i64| NamespacePorts {
        namespace: ns.to_owned(),
        used_ports: used,
        quota_ports: 100,
    };
    assert_eq!(
        write.namespaces,
        [listed("team-a", 100), listed("team-b", 30)]
    );
}

#[test]
fn the_oldest_mappings_keep_their_ports_when_the_quota_shrinks() {
    // Created in the opposite order of their names: conflict order is creation time.
    let c = tenants(1024);
    let c = at(c, "team-a", "b-old", "2026-01-01T00:00:00Z", 20000, 20599);
    let c = at(c, "team-a", "a-new", "2026-01-02T00:00:00Z", 21000, 21399);
    let plan = c.plan_with("edge-a", &edge_facts());
    assert_eq!(reason(&plan, "team-a", "a-new").0, A::Valid);
    let shrunk = c.ports_per_namespace("public", 700);
    let plan = shrunk.plan_with("edge-a", &edge_facts());
    assert_eq!(reason(&plan, "team-a", "b-old").0, A::Valid);
    assert_eq!(reason(&plan, "team-a", "a-new").0, A::PortQuotaExceeded);
}

#[test]
fn a_whole_window_range_is_refused_by_the_default_quota_and_a_named_namespace_may_have_more() {
    let squat = |c: Cluster| {
        c.without_system_reserved("public")
            .portmap(pm("team-a", "squat", "public", 10000).end(65535))
    };
    let c = squat(edge_and_worker().namespace("team-a", json!({})));
    let plan = c.plan_with("edge-a", &edge_facts());
    let (why, message) = reason(&plan, "team-a", "squat");
    assert_eq!(why, A::PortQuotaExceeded, "{message}");
    assert!(message.contains("its 1024 ports"), "{message}");
    // Control: the administrator names the namespace with a larger quota.
    let mut c = squat(edge_and_worker().namespace("team-a", json!({})));
    c.class_mut("public")
        .spec
        .ports
        .namespace_quotas
        .insert("team-a".to_owned(), 70000);
    let plan = c.plan_with("edge-a", &edge_facts());
    assert_eq!(reason(&plan, "team-a", "squat").0, A::Valid);
}

#[test]
fn tcp_and_udp_count_apart_and_a_zero_quota_admits_nothing() {
    let c = tenants(2);
    let c = at(c, "team-a", "udp", "2026-01-01T00:00:00Z", 20000, 20000);
    let c = c.portmap(
        pm("team-a", "tcp", "public", 20000)
            .tcp()
            .created("2026-01-02T00:00:00Z"),
    );
    let c = at(c, "team-a", "more", "2026-01-03T00:00:00Z", 20001, 20001);
    let plan = c.plan_with("edge-a", &edge_facts());
    assert_eq!(reason(&plan, "team-a", "more").0, A::PortQuotaExceeded);
    let none = tenants(0).portmap(pm("team-a", "udp", "public", 20000));
    let plan = none.plan_with("edge-a", &edge_facts());
    assert_eq!(reason(&plan, "team-a", "udp").0, A::PortQuotaExceeded);
}

#[test]
fn a_mapping_whose_service_does_not_exist_holds_no_port_until_it_does() {
    let squatter = |c: Cluster| {
        c.portmap(pm("team-a", "squat", "public", 20000).created("2026-01-01T00:00:00Z"))
            .without_service("team-a", "squat")
            .portmap(pm("team-b", "real", "public", 20000).created("2026-01-02T00:00:00Z"))
    };
    let c = squatter(tenants(1024));
    let plan = c.plan_with("edge-a", &edge_facts());
    let (why, message) = reason(&plan, "team-a", "squat");
    assert_eq!(why, A::ServiceNotFound, "{message}");
    assert!(
        message.contains("Service team-a/squat does not exist"),
        "{message}"
    );
    // The later mapping of the same port is not refused for a conflict.
    assert_eq!(reason(&plan, "team-b", "real").0, A::Valid);
    // An EndpointSlice of the Service is enough (a dump taken without Services has them).
    let with_slice = squatter(tenants(1024)).endpoint(
        "team-a",
        "squat",
        "squat-0",
        "worker-b",
        "10.244.1.9",
        7777,
    );
    let plan = with_slice.plan_with("edge-a", &edge_facts());
    assert_eq!(reason(&plan, "team-a", "squat").0, A::Valid);
    assert_eq!(reason(&plan, "team-b", "real").0, A::PortConflict);
}

/// Class `public` selects only namespaces labelled `kuport/public: "yes"`; team-a is, outsider
/// is not. edge-a's Service `shop/web` has NodePort `port`.
fn selective(port: i32) -> Cluster {
    let mut c = edge_and_worker()
        .without_system_reserved("public")
        .namespace("team-a", json!({"kuport/public": "yes"}))
        .namespace("outsider", json!({}))
        .node_port_service("shop", "web", "UDP", port);
    c.class_mut("public").spec.namespace_selector = Some(
        serde_json::from_value(json!({"matchLabels": {"kuport/public": "yes"}})).expect("selector"),
    );
    c
}

fn held(c: &Cluster) -> Vec<i32> {
    let plan = c.plan_with("edge-a", &edge_facts());
    let write = plan.writes.class_rows.iter().find(|w| w.class == "public");
    write
        .map(|w| w.row.held_ports.iter().map(|h| h.port).collect())
        .unwrap_or_default()
}

#[test]
fn a_portmap_of_a_namespace_the_class_does_not_select_makes_no_claim() {
    let outsider = selective(31000).portmap(pm("outsider", "probe", "public", 31000));
    assert_eq!(held(&outsider), Vec::<i32>::new());
    // Control: the same PortMap in a selected namespace makes edge-a report the NodePort.
    let tenant = selective(31000).portmap(pm("team-a", "probe", "public", 31000));
    assert_eq!(held(&tenant), [31000]);
}

#[test]
fn a_nodes_held_ports_are_bounded_and_the_rest_counted() {
    let mut c = selective(30000).ports_per_namespace("public", 65535);
    for i in 1..300 {
        c = c.node_port_service("shop", &format!("web-{i}"), "UDP", 30000 + i);
    }
    let c = c.portmap(pm("team-a", "wide", "public", 30000).end(30299));
    let plan = c.plan_with("edge-a", &edge_facts());
    let write = plan
        .writes
        .class_rows
        .iter()
        .find(|w| w.class == "public")
        .expect("edge-a's row");
    assert_eq!(write.row.held_ports.len(), 256);
    assert_eq!(write.row.held_ports.first().map(|h| h.port), Some(30000));
    let note = write
        .row
        .warnings
        .iter()
        .find(|w| w.contains("more ports held"))
        .expect("a warning counts the held ports left out");
    assert!(
        note.starts_with("44 more ports held on this node"),
        "{note}"
    );
}

/// A PortMap refused `ServiceNotFound` holds nothing; when its Service comes, it counts as
/// created then, so it does not take back a port another mapping was accepted for meanwhile.
#[test]
fn a_service_that_comes_late_takes_no_port_back() {
    let with_ghost_service = |created: &str| {
        let mut c = tenants(1024)
            .portmap(pm("team-a", "ghost", "public", 20000).created("2026-01-01T00:00:00Z"))
            .without_service("team-a", "ghost")
            .portmap(pm("team-b", "real", "public", 20000).created("2026-01-02T00:00:00Z"));
        c.snapshot.services.push(typed(
            json!({"metadata": {"name": "ghost", "namespace": "team-a",
                                "creationTimestamp": created},
                   "spec": {"ports": [{"name": "game", "port": 7777}]}}),
            "service",
        ));
        c.plan_with("edge-a", &edge_facts())
    };
    let late = with_ghost_service("2026-01-03T00:00:00Z");
    assert_eq!(reason(&late, "team-b", "real").0, A::Valid);
    let (why, message) = reason(&late, "team-a", "ghost");
    assert_eq!(why, A::PortConflict, "{message}");
    assert!(message.contains("held by team-b/real"), "{message}");
    // Control: a Service older than the other mapping leaves the earlier PortMap first.
    let early = with_ghost_service("2025-12-31T00:00:00Z");
    assert_eq!(reason(&early, "team-a", "ghost").0, A::Valid);
    assert_eq!(reason(&early, "team-b", "real").0, A::PortConflict);
}
