//! Ports something else on an accepting node takes traffic for, and who keeps them: NodePorts
//! and hostPorts (DNAT rules no socket table shows), the default system-reserved window, and
//! claims that outlive their holder until the administrator releases them.

use kuport_core::api::{
    DEFAULT_SYSTEM_RESERVED, PortSpan, Protocol, RELEASE_HELD_PORTS_ANNOTATION,
};
use kuport_core::ir::ProgrammedPort;
use kuport_core::ir::{ChainId, Rule};
use kuport_core::plan::{AcceptedReason as A, Plan};
use kuport_core::snapshot::{HostFacts, HostSocket};
use kuport_testkit::cluster::*;
use serde_json::json;

fn edge_facts() -> HostFacts {
    facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    )
}

/// edge-a accepts class `public` (opted in to every system-reserved port); team-b's mapping
/// `steal` asks for TCP `port`, served by its own pod on edge-a.
fn attacker(port: i32) -> Cluster {
    edge_and_worker()
        .namespace("team-a", json!({}))
        .namespace("team-b", json!({}))
        .without_system_reserved("public")
        .endpoint_full(
            "team-b",
            "steal",
            "game",
            "TCP",
            "steal-0",
            "edge-a",
            "10.244.0.9",
            port,
            Some(true),
        )
        .portmap(pm("team-b", "steal", "public", port).tcp())
}

fn accepted(c: &Cluster, namespace: &str, name: &str) -> (A, String) {
    let plan = c.plan_with("edge-a", &edge_facts());
    let d = decision(&plan, namespace, name);
    (d.accepted.reason, d.accepted.message.clone())
}

/// The ports edge-a's plan steers (captures).
fn captured(plan: &Plan) -> Vec<u16> {
    plan.host_state
        .nft
        .rules(ChainId::Steer)
        .iter()
        .filter_map(|r| match r {
            Rule::Steer(s) | Rule::MarkRequest(s) => Some(s.ports.first),
            _ => None,
        })
        .collect()
}

fn socket(protocol: Protocol, port: u16) -> HostSocket {
    HostSocket {
        protocol,
        address: "0.0.0.0".parse().expect("ip"),
        port,
        holder: None,
    }
}

#[test]
fn another_namespaces_nodeport_is_refused_naming_the_service() {
    let c = attacker(31000).node_port_service("team-a", "web", "TCP", 31000);
    // Before edge-a's row reports the NodePort, edge-a captures nothing on it.
    let first = c.plan_with("edge-a", &edge_facts());
    assert!(!captured(&first).contains(&31000), "{:?}", captured(&first));
    // Once it does, every agent refuses the mapping.
    let c = c.land_rows("edge-a", &edge_facts());
    let (reason, message) = accepted(&c, "team-b", "steal");
    assert_eq!(reason, A::PortInUse, "{message}");
    assert!(
        message.contains("NodePort of Service team-a/web on node edge-a holds TCP port 31000"),
        "{message}"
    );
    assert_eq!(
        c.plan("worker-b").portmaps,
        c.plan_with("edge-a", &edge_facts()).portmaps,
        "every agent decides the same"
    );
    // Another protocol on the same number is not held.
    let udp = attacker(31000).node_port_service("team-a", "web", "UDP", 31000);
    let udp = udp.land_rows("edge-a", &edge_facts());
    assert_eq!(accepted(&udp, "team-b", "steal").0, A::Valid);
    // Control: without the Service the same mapping is accepted and captures the port.
    let free = attacker(31000).land_rows("edge-a", &edge_facts());
    assert_eq!(accepted(&free, "team-b", "steal").0, A::Valid);
    assert!(captured(&free.plan_with("edge-a", &edge_facts())).contains(&31000));
}

#[test]
fn a_health_check_nodeport_is_held_too() {
    let mut c = attacker(32100);
    let svc = serde_json::from_value(json!({"metadata": {"name": "lb", "namespace": "team-a"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                 "healthCheckNodePort": 32100,
                 "ports": [{"protocol": "TCP", "port": 443, "nodePort": 31443}]}}))
    .expect("service");
    c.snapshot.services.push(svc);
    let c = c.land_rows("edge-a", &edge_facts());
    let (reason, message) = accepted(&c, "team-b", "steal");
    assert_eq!(reason, A::PortInUse);
    assert!(
        message.contains("health-check NodePort of Service team-a/lb"),
        "{message}"
    );
}

#[test]
fn a_hostport_of_a_pod_on_the_accepting_node_is_refused_naming_the_pod() {
    let c = attacker(8443)
        .host_port_pod("ingress", "nginx-0", "edge-a", "TCP", 8443, None)
        .land_rows("edge-a", &edge_facts());
    let (reason, message) = accepted(&c, "team-b", "steal");
    assert_eq!(reason, A::PortInUse, "{message}");
    assert!(
        message.contains("hostPort of Pod ingress/nginx-0 on node edge-a holds TCP port 8443"),
        "{message}"
    );
    // A hostPort on a node that does not accept the class holds nothing there.
    let elsewhere = attacker(8443)
        .host_port_pod("ingress", "nginx-1", "worker-b", "TCP", 8443, None)
        .land_rows("edge-a", &edge_facts());
    assert_eq!(accepted(&elsewhere, "team-b", "steal").0, A::Valid);
    // A hostIP narrows it to that address: wt0's address is bound by the mapping...
    let on_wt0 = attacker(8443)
        .host_port_pod(
            "ingress",
            "nginx-0",
            "edge-a",
            "TCP",
            8443,
            Some("100.64.0.1"),
        )
        .land_rows("edge-a", &edge_facts());
    assert_eq!(accepted(&on_wt0, "team-b", "steal").0, A::PortInUse);
    // ...another address is not.
    let other = attacker(8443)
        .host_port_pod(
            "ingress",
            "nginx-0",
            "edge-a",
            "TCP",
            8443,
            Some("192.0.2.7"),
        )
        .land_rows("edge-a", &edge_facts());
    assert_eq!(accepted(&other, "team-b", "steal").0, A::Valid);
    // A finished Pod holds nothing.
    let mut done = attacker(8443).host_port_pod("ingress", "job-0", "edge-a", "TCP", 8443, None);
    done.snapshot.pods[0]
        .status
        .get_or_insert_with(Default::default)
        .phase = Some("Succeeded".into());
    let done = done.land_rows("edge-a", &edge_facts());
    assert_eq!(accepted(&done, "team-b", "steal").0, A::Valid);
}

#[test]
fn a_hostport_on_the_accepting_interfaces_ipv6_address_is_refused_and_another_is_not() {
    let mut f = edge_facts();
    f.interfaces6.insert(
        "enp1s0".to_owned(),
        "2001:db8:203::9".parse().expect("ipv6"),
    );
    let at = |host_ip: &str| {
        attacker(8443)
            .host_port_pod("ingress", "nginx-0", "edge-a", "TCP", 8443, Some(host_ip))
            .land_rows("edge-a", &f)
    };
    let (reason, message) = accepted(&at("2001:db8:203::9"), "team-b", "steal");
    assert_eq!(reason, A::PortInUse, "{message}");
    assert!(
        message.contains("hostPort of Pod ingress/nginx-0"),
        "{message}"
    );
    // Control: an IPv6 address the mapping does not bind holds nothing it captures.
    assert_eq!(
        accepted(&at("2001:db8:999::1"), "team-b", "steal").0,
        A::Valid
    );
    // `::` is every address, as `0.0.0.0` is.
    assert_eq!(accepted(&at("::"), "team-b", "steal").0, A::PortInUse);
}

#[test]
fn the_default_window_keeps_the_nodeport_range_and_node_service_ports_back() {
    let spans: Vec<String> = DEFAULT_SYSTEM_RESERVED
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(spans.contains(&"30000-32767".to_owned()), "{spans:?}");
    for port in [22, 6443, 10250, 10256, 30000, 31000, 32767] {
        let c = edge_and_worker()
            .endpoint_full(
                "games",
                "gs",
                "game",
                "TCP",
                "gs-0",
                "edge-a",
                "10.244.0.5",
                port,
                Some(true),
            )
            .portmap(pm("games", "gs", "public", port).tcp());
        let plan = c.plan("edge-a");
        let d = decision(&plan, "games", "gs");
        assert_eq!(d.accepted.reason, A::PortReserved, "port {port}");
        assert!(
            d.accepted.message.contains("systemReserved"),
            "{}",
            d.accepted.message
        );
    }
    // A range touching the NodePort range names the first port it shares with it.
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 29990)
        .portmap(pm("games", "gs", "public", 29990).end(30010));
    let plan = c.plan("edge-a");
    let message = &decision(&plan, "games", "gs").accepted.message;
    assert!(message.starts_with("port 30000 is kept back"), "{message}");
    // Ports around them are admitted.
    for port in [1024, 29999, 32768] {
        let c = edge_and_worker()
            .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", port)
            .portmap(pm("games", "gs", "public", port));
        assert_eq!(
            decision(&c.plan("edge-a"), "games", "gs").accepted.reason,
            A::Valid,
            "port {port}"
        );
    }
    // The administrator opts in by narrowing the list, or emptying it.
    let mut c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 31000)
        .portmap(pm("games", "gs", "public", 31000));
    c.class_mut("public").spec.ports.system_reserved = vec![PortSpan::range(30000, 30999)];
    assert_eq!(
        decision(&c.plan("edge-a"), "games", "gs").accepted.reason,
        A::Valid
    );
}

#[test]
fn a_class_written_with_a_partial_port_window_still_gets_the_system_reserved_default() {
    // The README's and the integration guide's classes give only min and max.
    let spec = json!({"nodes": nodes_json(&[("edge-a", &["wt0"])]),
        "ports": {"min": 1024, "max": 65535},
        "returnPath": {"mode": "Vxlan"}});
    let class: kuport_core::api::PortMapClassSpec = serde_json::from_value(spec).expect("spec");
    assert_eq!(class.ports.system_reserved, DEFAULT_SYSTEM_RESERVED);
}

/// edge-a's facts with a host daemon listening on TCP `port` on every address.
fn with_daemon(port: u16) -> HostFacts {
    let mut f = edge_facts();
    f.sockets = vec![socket(Protocol::Tcp, port)];
    f
}

fn held_row(c: &Cluster) -> Vec<kuport_core::api::HeldPort> {
    let class = c
        .snapshot
        .classes
        .iter()
        .find(|k| k.metadata.name.as_deref() == Some("public"))
        .expect("class");
    class
        .status
        .as_ref()
        .and_then(|s| s.nodes.iter().find(|r| r.name == "edge-a"))
        .map(|r| r.held_ports.clone())
        .unwrap_or_default()
}

#[test]
fn a_daemon_restart_never_hands_its_port_to_a_waiting_mapping() {
    // The daemon holds 7000; the tenant's mapping is refused.
    let c = attacker(7000).land_rows("edge-a", &with_daemon(7000));
    assert_eq!(accepted(&c, "team-b", "steal").0, A::PortInUse);
    // The daemon restarts: its socket is gone for a while. The claim stays, the mapping stays
    // refused, and edge-a captures nothing on the port.
    let gone = c.land_rows("edge-a", &edge_facts());
    let held = held_row(&gone);
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].absent_since.is_some(), "{held:?}");
    let (reason, message) = accepted(&gone, "team-b", "steal");
    assert_eq!(reason, A::PortInUse, "{message}");
    assert!(
        message.contains("keeps its claim while it is gone"),
        "{message}"
    );
    assert!(message.contains(RELEASE_HELD_PORTS_ANNOTATION), "{message}");
    assert!(!captured(&gone.plan_with("edge-a", &edge_facts())).contains(&7000));
    // Many passes later, and after an agent restart (nothing applied yet), the same.
    let later = gone
        .clone()
        .land_rows("edge-a", &edge_facts())
        .land_rows("edge-a", &edge_facts());
    assert_eq!(held_row(&later), held, "the claim is stable: no row churn");
    assert_eq!(accepted(&later, "team-b", "steal").0, A::PortInUse);
    // The daemon binds again: the claim is live again and still yields to nobody.
    let back = later.land_rows("edge-a", &with_daemon(7000));
    let held = held_row(&back);
    assert!(
        held[0].absent_since.is_none() && held[0].yields_to.is_empty(),
        "{held:?}"
    );
    assert_eq!(accepted(&back, "team-b", "steal").0, A::PortInUse);
}

#[test]
fn the_claim_survives_the_asking_mapping_being_deleted_and_recreated() {
    let c = attacker(7000)
        .land_rows("edge-a", &with_daemon(7000))
        .land_rows("edge-a", &edge_facts());
    // The tenant deletes its mapping while the daemon is down...
    let mut deleted = c.clone();
    deleted.snapshot.portmaps.clear();
    let deleted = deleted.land_rows("edge-a", &edge_facts());
    assert_eq!(held_row(&deleted).len(), 1, "the claim stays");
    // ...and creates it again: still refused.
    let again = deleted.portmap(pm("team-b", "steal", "public", 7000).tcp());
    assert_eq!(accepted(&again, "team-b", "steal").0, A::PortInUse);
}

#[test]
fn the_administrator_releases_a_claim_whose_holder_is_gone() {
    let gone = attacker(7000)
        .land_rows("edge-a", &with_daemon(7000))
        .land_rows("edge-a", &edge_facts());
    let since = held_row(&gone)[0].absent_since.clone().expect("absent").0;
    let annotate = |c: &Cluster, at: &str| {
        let mut c = c.clone();
        c.class_mut("public")
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RELEASE_HELD_PORTS_ANNOTATION.into(), at.into());
        c
    };
    // A release time before the holder left releases nothing.
    let early = annotate(&gone, "2026-01-01T00:00:00Z").land_rows("edge-a", &edge_facts());
    assert_eq!(held_row(&early).len(), 1);
    // Nor does a value that is not a time.
    let junk = annotate(&gone, "now please").land_rows("edge-a", &edge_facts());
    assert_eq!(held_row(&junk).len(), 1);
    // A time at or after it drops the claim, and the mapping is accepted.
    let released = annotate(&gone, &since.to_string()).land_rows("edge-a", &edge_facts());
    assert!(held_row(&released).is_empty(), "{:?}", held_row(&released));
    assert_eq!(accepted(&released, "team-b", "steal").0, A::Valid);
    // A holder that is present is never released: its claim is live.
    let present = annotate(&attacker(7000), "2030-01-01T00:00:00Z")
        .land_rows("edge-a", &with_daemon(7000))
        .land_rows("edge-a", &with_daemon(7000));
    assert_eq!(held_row(&present).len(), 1);
    assert_eq!(accepted(&present, "team-b", "steal").0, A::PortInUse);
}

#[test]
fn earliest_wins_still_holds_for_a_mapping_forwarded_before_the_holder_came() {
    let forwarded = |mut f: HostFacts| {
        f.programmed_ports = vec![ProgrammedPort {
            mapping: "team-b/steal".into(),
            protocol: Protocol::Tcp,
            first: 7000,
            last: 7000,
        }];
        f
    };
    // The mapping was captured first; then the daemon came.
    let c = attacker(7000)
        .land_rows("edge-a", &edge_facts())
        .land_rows("edge-a", &forwarded(with_daemon(7000)));
    assert_eq!(held_row(&c)[0].yields_to, ["team-b/steal"]);
    assert_eq!(accepted(&c, "team-b", "steal").0, A::PortAlsoHeldByHost);
    assert!(captured(&c.plan_with("edge-a", &with_daemon(7000))).contains(&7000));
    // The daemon goes: the mapping keeps its port, with nothing left to say.
    let gone = c.land_rows("edge-a", &edge_facts());
    assert_eq!(accepted(&gone, "team-b", "steal").0, A::Valid);
    // The mapping is deleted: the claim yields to nobody any more, so another mapping on the
    // port is refused.
    let mut deleted = gone.clone();
    deleted.snapshot.portmaps.clear();
    let deleted = deleted.land_rows("edge-a", &edge_facts()).portmap(
        pm("team-b", "other", "public", 7000)
            .tcp()
            .service("steal", "game"),
    );
    assert!(held_row(&deleted)[0].yields_to.is_empty());
    assert_eq!(accepted(&deleted, "team-b", "other").0, A::PortInUse);
}

#[test]
fn a_nodeport_that_came_after_the_mapping_yields_to_it() {
    let forwarded = {
        let mut f = edge_facts();
        f.programmed_ports = vec![ProgrammedPort {
            mapping: "team-b/steal".into(),
            protocol: Protocol::Tcp,
            first: 31000,
            last: 31000,
        }];
        f
    };
    let c = attacker(31000)
        .land_rows("edge-a", &edge_facts())
        .node_port_service("team-a", "web", "TCP", 31000)
        .land_rows("edge-a", &forwarded);
    assert_eq!(accepted(&c, "team-b", "steal").0, A::PortAlsoHeldByHost);
    assert!(captured(&c.plan_with("edge-a", &forwarded)).contains(&31000));
}

#[test]
fn absent_claims_are_bounded_keeping_the_most_recent() {
    use kuport_core::plan::MAX_ABSENT_CLAIMS;
    let mut c = attacker(7000);
    let n = MAX_ABSENT_CLAIMS + 3;
    let rows = c
        .class_mut("public")
        .status
        .as_mut()
        .expect("status")
        .nodes
        .iter_mut()
        .find(|r| r.name == "edge-a")
        .expect("row");
    for i in 0..n {
        rows.held_ports.push(
            serde_json::from_value(json!({"protocol": "UDP", "port": 40000 + i,
                "address": "0.0.0.0", "holder": "host UDP socket",
                "absentSince": format!("2026-05-{:02}T00:00:00Z", 1 + i % 28)}))
            .expect("held"),
        );
    }
    let c = c.land_rows("edge-a", &edge_facts());
    let held = held_row(&c);
    assert_eq!(held.len(), MAX_ABSENT_CLAIMS);
    let oldest_kept = held
        .iter()
        .filter_map(|h| h.absent_since.as_ref())
        .min()
        .expect("some");
    assert_eq!(
        oldest_kept.0.to_string(),
        "2026-05-02T00:00:00Z",
        "the three claims gone since May 1st went first"
    );
}

/// The ports edge-a's plan serves to clients inside the cluster (pods and its own processes).
fn published_inside(plan: &Plan) -> Vec<u16> {
    plan.host_state
        .nft
        .rules(ChainId::Pre)
        .iter()
        .filter_map(|r| match r {
            Rule::Hairpin(h) => Some(h.ports.first),
            _ => None,
        })
        .collect()
}

#[test]
fn a_port_a_host_daemon_holds_is_not_served_to_clients_inside_the_cluster_either() {
    // Before edge-a's row reports the daemon, the plan already leaves the port out of its
    // datapath: neither steered for outside clients nor published for pods and the node
    // itself (a pod would otherwise reach the tenant's pod instead of the host's daemon).
    let window = attacker(7000).plan_with("edge-a", &with_daemon(7000));
    assert!(captured(&window).is_empty());
    assert!(published_inside(&window).is_empty());
    // Once the row reports it, the mapping is refused and nothing of it is programmed.
    let refused = attacker(7000).land_rows("edge-a", &with_daemon(7000));
    let plan = refused.plan_with("edge-a", &with_daemon(7000));
    assert!(published_inside(&plan).is_empty());
    // Control: without the daemon the same mapping is published inside as well as outside.
    let free = attacker(7000).plan_with("edge-a", &edge_facts());
    assert_eq!(
        published_inside(&free),
        [7000, 7000],
        "enp1s0's and wt0's addresses"
    );
}
