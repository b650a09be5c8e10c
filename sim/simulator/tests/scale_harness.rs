//! The scale harness (`kuport_simulator::scale`): its generator is a function of the seed and
//! the node names as a set, and a small run's report carries every field the docs describe,
//! each measured (`docs/performance.md`, "Scale harness").

use std::collections::BTreeSet;
use std::time::Duration;

use kuport_simulator::scale::generator::{Shape, generate, node_name};
use kuport_simulator::scale::{Config, run};
use serde_json::Value;

fn shape(seed: u64, nodes: Vec<String>) -> Shape {
    Shape {
        seed,
        nodes,
        portmaps: 600,
        accepting: 3,
        pod_agents: 5,
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(node_name).collect()
}

#[test]
fn the_same_seed_and_nodes_in_any_order_give_the_same_cluster() {
    let sorted = generate(&shape(7, names(40)));
    let mut shuffled = names(40);
    let mut rng = kuport_sim::apiserver::SplitMix64::new(99);
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.below(i + 1));
    }
    assert_ne!(shuffled, names(40), "the shuffle moved something");
    assert_eq!(generate(&shape(7, shuffled)), sorted);
    let other = generate(&shape(8, names(40)));
    assert_ne!(
        (other.accepting.clone(), other.placement.clone()),
        (sorted.accepting.clone(), sorted.placement.clone()),
        "another seed chooses otherwise"
    );
}

#[test]
fn the_generated_cluster_is_consistent() {
    let c = generate(&shape(3, names(40)));
    assert_eq!(c.accepting.len(), 3);
    assert_eq!(c.pod_nodes.len(), 5);
    assert!(c.pod_nodes.iter().all(|n| !c.accepting.contains(n)));
    assert_eq!(c.placement.len(), 600);
    assert!(c.placement.iter().all(|n| c.pod_nodes.contains(n)));
    let kinds = |kind: &str| c.objects.iter().filter(|o| o["kind"] == kind).count();
    for (kind, count) in [
        ("Node", 40),
        ("Lease", 40),
        ("PortMap", 600),
        ("Service", 600),
        ("EndpointSlice", 600),
        ("Pod", 600),
        ("PortMapClass", 1),
    ] {
        assert_eq!(kinds(kind), count, "{kind}");
    }
    let unique = |kind: &str, field: &dyn Fn(&Value) -> String| {
        let all: Vec<String> = c
            .objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .map(field)
            .collect();
        all.iter().collect::<BTreeSet<_>>().len() == all.len()
    };
    assert!(unique("PortMap", &|o| format!(
        "{}/{}",
        o["spec"]["className"], o["spec"]["port"]
    )));
    assert!(unique("Pod", &|o| o["status"]["podIP"].to_string()));
    let reserved = kuport_core::api::DEFAULT_SYSTEM_RESERVED;
    let kept_back = |port: i64| {
        reserved
            .iter()
            .any(|r| i64::from(r.port) <= port && port <= i64::from(r.end_port.unwrap_or(r.port)))
    };
    assert!(
        c.objects
            .iter()
            .filter(|o| o["kind"] == "PortMap")
            .all(|o| !kept_back(o["spec"]["port"].as_i64().unwrap_or(0))),
        "no PortMap asks for a port a class keeps back"
    );
    assert!(unique("Node", &|o| o["status"]["addresses"][0]["address"]
        .to_string()));
}

fn field<'a>(report: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(report, |v, k| &v[k])
}

/// A small run: every field the issue asks for is there and measured.
#[test]
fn a_small_run_reports_every_field() {
    let mut config = Config::new(8, 12);
    config.accepting = 2;
    config.idle = Duration::from_secs(300);
    config.duration = Duration::from_secs(10);
    config.moves = 2;
    config.new_portmaps = 2;
    let report = serde_json::to_value(run(&config).expect("the harness runs")).expect("json");
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    assert_eq!(report["nodes"], 8);
    assert_eq!(report["portmaps"], 12);
    assert_eq!(field(&report, "agents.accepting"), 2);
    assert_eq!(field(&report, "agents.pod_only"), 6);
    assert_eq!(field(&report, "agents.modeled"), 0);
    let positive = |path: &str| field(&report, path).as_f64().is_some_and(|v| v > 0.0);
    for path in [
        "largest_object_bytes.bytes",
        "idle_requests_per_second.window_seconds",
        "requests_per_pod_move.mean",
        "idle_watch_bytes_per_second_per_agent.kubernetes_heartbeats",
        "kubelet.lease_renewals_per_second",
        "kubelet.node_object_bytes",
        "portmap_to_programmed_p99_ms",
        "plan_pass_ms.accepting",
        "plan_pass_ms.pod_only",
        "churn.pod_moves",
        "simulated_seconds",
    ] {
        assert!(positive(path), "{path}: {}", field(&report, path));
    }
    for path in ["largest_object_bytes.kind", "largest_object_bytes.name"] {
        assert!(
            field(&report, path).as_str().is_some_and(|s| !s.is_empty()),
            "{path}"
        );
    }
    for path in [
        "idle_requests_per_second.measured",
        "conflicts.idle",
        "idle_watch_bytes_per_second_per_agent.kuport",
    ] {
        assert!(field(&report, path).is_number(), "{path}");
    }
    assert_eq!(field(&report, "portmap_to_programmed.samples"), 2);
    assert_eq!(field(&report, "portmap_to_programmed.not_programmed"), 0);
    assert!(
        report["agent_rss_mib"].is_null(),
        "no agent processes without a binary"
    );
}
