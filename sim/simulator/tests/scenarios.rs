//! The simulator's scenarios, each over many seeds (together at least 500 in CI;
//! `KUPORT_SIM_SEEDS=<n>` runs n per scenario). A failing seed prints its violations and
//! replays with `KUPORT_SIM_SEED=<seed> cargo test -p kuport-simulator --test scenarios <test>`.

use std::time::Duration;

use kuport_sim::apiserver::{Failure, RequestFilter};
use kuport_simulator::record::Violation;
use kuport_simulator::scenario::{self, Scenario, Variant, class, portmap, run_seed, seeds};
use kuport_simulator::world::{Stack, World, WorldError};

const MAPPINGS: (&str, &str) = ("kuport.wlz.li/v1alpha1", "PortMap");
const CLASSES: (&str, &str) = ("kuport.wlz.li/v1alpha1", "PortMapClass");

fn pause(w: &mut World, max_ms: usize) -> Result<(), WorldError> {
    let span = Duration::from_millis(20 + w.rng.below(max_ms) as u64);
    w.run_for(span)
}

/// Two classes on n1 and n2 (Single `public`, Multi `vip`), pods `alpha` on n3 and `beta` on
/// n1, three mappings.
fn two_classes(w: &mut World) -> Result<(), WorldError> {
    w.create(&class("public", 0, &["n1", "n2"], false))?;
    w.create(&class("vip", 1, &["n1", "n2"], true))?;
    w.place_pod("alpha", Some("n3"), true)?;
    w.place_pod("beta", Some("n1"), true)?;
    w.create(&portmap("alpha", "public", 3000, "alpha"))?;
    w.create(&portmap("beta", "public", 3001, "beta"))?;
    w.create(&portmap("alpha-vip", "vip", 4000, "alpha"))?;
    w.changed();
    Ok(())
}

fn move_a_pod(w: &mut World, nodes: &[&str]) -> Result<(), WorldError> {
    let service = *w.pick(&["alpha", "beta"]);
    let mut choices: Vec<Option<&str>> = nodes.iter().map(|n| Some(*n)).collect();
    choices.push(None);
    let node = *w.pick(&choices);
    let ready = w.rng.below(4) != 0;
    w.place_pod(service, node, ready)
}

/// The API faults of a six-round scenario: 5xx answers to a fifth of the requests from round 1,
/// cleared in round 3 with every watch cut.
fn api_faults(w: &mut World, round: usize) {
    match round {
        1 => w
            .api
            .faults()
            .fail_fraction(0.2, Failure::InternalError, RequestFilter::any()),
        3 => {
            w.api.faults().clear();
            w.api.faults().close_watches();
        }
        _ => {}
    }
}

/// Pods move and flip readiness under 5xx bursts, a watch cut and a stalled server.
fn steady(w: &mut World) -> Result<(), WorldError> {
    two_classes(w)?;
    pause(w, 2000)?;
    for round in 0..6 {
        match round {
            1 | 3 => api_faults(w, round),
            4 => {
                // A slow server: every request waits until it resumes.
                w.pause_api(true);
                pause(w, 2000)?;
                w.pause_api(false);
            }
            _ => {}
        }
        move_a_pod(w, &["n1", "n2", "n3"])?;
        pause(w, 1500)?;
    }
    Ok(())
}

/// Nodes go not ready and come back, one joins, one leaves; the class and a mapping are edited.
fn nodes(w: &mut World) -> Result<(), WorldError> {
    w.create(&class("public", 0, &["n1", "n2", "n3"], false))?;
    w.create(&class("vip", 1, &["n1", "n2"], true))?;
    w.place_pod("alpha", Some("n4"), true)?;
    w.place_pod("beta", Some("n2"), true)?;
    w.create(&portmap("alpha", "public", 3000, "alpha"))?;
    w.create(&portmap("beta", "vip", 3001, "beta"))?;
    w.changed();
    pause(w, 2000)?;
    let mut events: Vec<usize> = (0..7).collect();
    // The order of the events is the seed's.
    for i in (1..events.len()).rev() {
        events.swap(i, w.rng.below(i + 1));
    }
    for event in events {
        match event {
            0 | 1 => {
                let node = *w.pick(&["n1", "n2", "n3"]);
                w.set_node_ready(node, false)?;
                w.changed();
                pause(w, 1500)?;
                w.set_node_ready(node, true)?;
            }
            2 => w.add_node("n5")?,
            3 => w.remove_node("n4")?,
            4 => {
                let mode = *w.pick(&["Single", "Multi"]);
                w.edit(CLASSES, None, "vip", |c| {
                    c["spec"]["servingMode"] = mode.into();
                    c["spec"]["nodes"]["n3"] = serde_json::json!({"interfaces": ["eth0"]});
                })?;
            }
            5 => {
                // A mapping's port is immutable: a new port is a new PortMap.
                let port = 3100 + w.rng.below(50) as u16;
                w.delete(MAPPINGS, Some("games"), "alpha")?;
                w.create(&portmap("alpha", "public", port, "alpha"))?;
            }
            _ => move_a_pod(w, &["n1", "n2", "n3", "n5"])?,
        }
        w.changed();
        pause(w, 1500)?;
    }
    Ok(())
}

/// Agents crash (their hosts keep the datapath) and restart, one is cut off from the API server
/// while more changes go by than the watch history holds (410, relist), a 409 storm hits status
/// writes, and every agent restarts in turn.
fn crashes(w: &mut World) -> Result<(), WorldError> {
    two_classes(w)?;
    pause(w, 2000)?;
    let victim = *w.pick(&["n1", "n2", "n3"]);
    w.crash(victim);
    move_a_pod(w, &["n1", "n2", "n3"])?;
    pause(w, 2000)?;
    w.restart(victim);
    pause(w, 1000)?;

    let cut = *w.pick(&["n1", "n2", "n3"]);
    w.partition(cut, true);
    move_a_pod(w, &["n1", "n2", "n3"])?;
    for i in 0..230 {
        w.create(&serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("noise-{i}"), "namespace": "games"},
        }))?;
    }
    pause(w, 3000)?;
    w.partition(cut, false);
    pause(w, 1000)?;

    w.api
        .faults()
        .fail_fraction(0.5, Failure::Conflict, RequestFilter::writes().status());
    move_a_pod(w, &["n1", "n2", "n3"])?;
    pause(w, 2000)?;
    w.api.faults().clear();

    for node in ["n1", "n2", "n3"] {
        w.crash(node);
        w.run_for(Duration::from_millis(300))?;
        w.restart(node);
        pause(w, 800)?;
    }
    Ok(())
}

/// Many mappings at once from pods on several nodes (concurrent link claims) with agents'
/// clocks minutes apart; then the mappings go and a day passes: every claim is collected.
fn claims(w: &mut World) -> Result<(), WorldError> {
    w.skew("n3", 90_000);
    w.skew("n4", -90_000);
    w.create(&class("public", 0, &["n1", "n2"], false))?;
    let services = ["s1", "s2", "s3", "s4", "s5", "s6"];
    for (i, service) in services.iter().enumerate() {
        let node = *w.pick(&["n1", "n2", "n3", "n4", "n5"]);
        w.place_pod(service, Some(node), true)?;
        w.create(&portmap(service, "public", 3000 + i as u16, service))?;
    }
    w.changed();
    pause(w, 4000)?;
    for service in services {
        w.delete(MAPPINGS, Some("games"), service)?;
    }
    w.changed();
    w.run_for(Duration::from_secs(3))?;
    w.jump_clocks(Duration::from_secs(25 * 3600));
    // Passes come on events or the resync (30 s here): give one a chance after the day.
    w.run_for(Duration::from_secs(35))?;
    let left = w
        .object("kuport.wlz.li/v1alpha1", "portmapclasses", "", "public")
        .and_then(|c| c["status"]["links"].as_array().cloned())
        .unwrap_or_default();
    if !left.is_empty() {
        let keys: Vec<String> = left.iter().map(|l| l["key"].to_string()).collect();
        w.violations.found.push(Violation {
            at: w.elapsed(),
            invariant: "claim GC",
            detail: format!(
                "claims unused for 25 h are still there: {}",
                keys.join(", ")
            ),
        });
    }
    Ok(())
}

/// A dual-stack cluster of n1..n3 with a Single class `public` and a Multi class `vip` on n1
/// and n2; `alpha` dual-stack on n3, `beta` IPv6-only on n1, `gamma` IPv4-only on n2 (the
/// control: it must stay off IPv6); five mappings.
fn dual_stack_classes(w: &mut World) -> Result<(), WorldError> {
    w.create(&class("public", 0, &["n1", "n2"], false))?;
    w.create(&class("vip", 1, &["n1", "n2"], true))?;
    w.set_stack("alpha", Stack::Dual);
    w.set_stack("beta", Stack::V6);
    w.place_pod("alpha", Some("n3"), true)?;
    w.place_pod("beta", Some("n1"), true)?;
    w.place_pod("gamma", Some("n2"), true)?;
    w.create(&portmap("alpha", "public", 3000, "alpha"))?;
    w.create(&portmap("beta", "public", 3001, "beta"))?;
    w.create(&portmap("gamma", "public", 3002, "gamma"))?;
    w.create(&portmap("alpha-vip", "vip", 4000, "alpha"))?;
    w.create(&portmap("beta-vip", "vip", 4001, "beta"))?;
    w.changed();
    Ok(())
}

/// Dual-stack: pods of every family move between nodes (a dual-stack pod's two slices change
/// one after the other, in either order) and flip readiness, under 5xx bursts and a watch cut.
fn dual_stack(w: &mut World) -> Result<(), WorldError> {
    dual_stack_classes(w)?;
    pause(w, 2000)?;
    for round in 0..6 {
        api_faults(w, round);
        let service = *w.pick(&["alpha", "beta", "gamma"]);
        let node = *w.pick(&[Some("n1"), Some("n2"), Some("n3"), None]);
        let ready = w.rng.below(4) != 0;
        w.place_pod(service, node, ready)?;
        pause(w, 1500)?;
    }
    Ok(())
}

/// Dual-stack failover: a Multi class `vip` on n1..n3 and a Single class `public` on n1 and n2;
/// `alpha` dual-stack on n4, `beta` IPv6-only on n3. In an order the seed picks: an accepting
/// node goes not ready and comes back (the serving node moves, the Multi class loses and regains
/// a programming node); a pod's node fails and its pod is rescheduled elsewhere; an agent
/// crashes while a pod moves; a dual-stack node joins and takes a pod; `vip` turns Single or
/// Multi; `alpha` changes families (IPv4-only, IPv6-only or dual-stack again).
fn dual_stack_failover(w: &mut World) -> Result<(), WorldError> {
    w.create(&class("vip", 1, &["n1", "n2", "n3"], true))?;
    w.create(&class("public", 0, &["n1", "n2"], false))?;
    w.set_stack("alpha", Stack::Dual);
    w.set_stack("beta", Stack::V6);
    w.place_pod("alpha", Some("n4"), true)?;
    w.place_pod("beta", Some("n3"), true)?;
    w.create(&portmap("alpha-vip", "vip", 4000, "alpha"))?;
    w.create(&portmap("beta-vip", "vip", 4001, "beta"))?;
    w.create(&portmap("alpha", "public", 3000, "alpha"))?;
    w.create(&portmap("beta", "public", 3001, "beta"))?;
    w.changed();
    pause(w, 2000)?;
    let mut events: Vec<usize> = (0..6).collect();
    for i in (1..events.len()).rev() {
        events.swap(i, w.rng.below(i + 1));
    }
    for event in events {
        failover_event(w, event)?;
        w.changed();
        pause(w, 1500)?;
    }
    Ok(())
}

fn failover_event(w: &mut World, event: usize) -> Result<(), WorldError> {
    match event {
        0 => {
            let node = *w.pick(&["n1", "n2", "n3"]);
            w.set_node_ready(node, false)?;
            w.changed();
            pause(w, 1500)?;
            w.set_node_ready(node, true)?;
        }
        1 => {
            // The pod's node fails; its pod comes up on another node.
            let service = *w.pick(&["alpha", "beta"]);
            let from = w.pods[service]
                .node
                .clone()
                .unwrap_or_else(|| "n4".to_owned());
            w.set_node_ready(&from, false)?;
            let to = elsewhere(w, &from);
            w.place_pod(service, Some(to), true)?;
            pause(w, 1500)?;
            w.set_node_ready(&from, true)?;
        }
        2 => {
            let victim = *w.pick(&["n1", "n2", "n3"]);
            w.crash(victim);
            let node = *w.pick(&["n1", "n2", "n3", "n4"]);
            w.place_pod("alpha", Some(node), true)?;
            pause(w, 1500)?;
            w.restart(victim);
        }
        3 => {
            w.add_node("n5")?;
            pause(w, 500)?;
            let service = *w.pick(&["alpha", "beta"]);
            w.place_pod(service, Some("n5"), true)?;
        }
        4 => {
            let mode = *w.pick(&["Single", "Multi"]);
            w.edit(CLASSES, None, "vip", |c| {
                c["spec"]["servingMode"] = mode.into()
            })?;
        }
        _ => {
            let stack = *w.pick(&[Stack::V4, Stack::V6, Stack::Dual]);
            let node = w.pods["alpha"].node.clone();
            w.set_stack("alpha", stack);
            w.place_pod("alpha", node.as_deref(), true)?;
        }
    }
    Ok(())
}

/// A node other than `from` among n1..n4, picked by the seed.
fn elsewhere(w: &mut World, from: &str) -> &'static str {
    let others: Vec<&'static str> = ["n1", "n2", "n3", "n4"]
        .into_iter()
        .filter(|n| *n != from)
        .collect();
    others[w.rng.below(others.len())]
}

pub const STEADY: Scenario = Scenario {
    name: "steady",
    nodes: &["n1", "n2", "n3"],
    script: steady,
    dual_stack: false,
};
pub const NODES: Scenario = Scenario {
    name: "nodes",
    nodes: &["n1", "n2", "n3", "n4"],
    script: nodes,
    dual_stack: false,
};
pub const CRASHES: Scenario = Scenario {
    name: "crashes",
    nodes: &["n1", "n2", "n3"],
    script: crashes,
    dual_stack: false,
};
pub const CLAIMS: Scenario = Scenario {
    name: "claims",
    nodes: &["n1", "n2", "n3", "n4", "n5"],
    script: claims,
    dual_stack: false,
};
pub const DUAL_STACK: Scenario = Scenario {
    name: "dual-stack",
    nodes: &["n1", "n2", "n3"],
    script: dual_stack,
    dual_stack: true,
};
pub const DUAL_STACK_FAILOVER: Scenario = Scenario {
    name: "dual-stack failover",
    nodes: &["n1", "n2", "n3", "n4"],
    script: dual_stack_failover,
    dual_stack: true,
};

fn run_clean(s: &Scenario, first: u64, count: u64) {
    let summary = scenario::run(s, &seeds(first, count), &Variant::default());
    assert!(
        summary.failures.is_empty(),
        "{}: failing seeds {:?}",
        summary.line,
        summary.failures.iter().map(|f| f.0).collect::<Vec<_>>()
    );
}

#[test]
fn steady_cluster_with_moving_pods_under_api_faults() {
    run_clean(&STEADY, 1_000, 150);
}

#[test]
fn nodes_fail_join_and_leave_while_classes_change() {
    run_clean(&NODES, 2_000, 120);
}

#[test]
fn agents_crash_are_cut_off_and_restart_in_turn() {
    run_clean(&CRASHES, 3_000, 120);
}

#[test]
fn concurrent_claims_with_skewed_clocks_are_collected_after_a_day() {
    run_clean(&CLAIMS, 4_000, 120);
}

#[test]
fn dual_stack_pods_move_across_nodes_and_families() {
    run_clean(&DUAL_STACK, 5_000, 100);
}

#[test]
fn dual_stack_nodes_fail_over_and_services_change_families() {
    run_clean(&DUAL_STACK_FAILOVER, 6_000, 60);
}

#[test]
fn a_seed_replays_exactly() {
    for s in [&STEADY, &CRASHES, &DUAL_STACK] {
        let first = run_seed(s, 77, &Variant::default()).expect("run");
        let again = run_seed(s, 77, &Variant::default()).expect("replay");
        assert_eq!(first.digest, again.digest, "{}: seed 77 replays", s.name);
        let other = run_seed(s, 78, &Variant::default()).expect("run");
        assert_ne!(
            first.digest, other.digest,
            "{}: another seed runs differently (the digest sees the run)",
            s.name
        );
    }
}

// ---- deliberately broken agents: each invariant must catch its bug, naming a seed ----

fn caught(s: &Scenario, variant: Variant, invariant: &str) {
    caught_saying(s, variant, invariant, "");
}

/// [`caught`], by a violation of `invariant` whose detail says `saying`.
fn caught_saying(s: &Scenario, variant: Variant, invariant: &str, saying: &str) {
    let summary = scenario::run(s, &seeds(9_000, 3), &variant);
    let found = summary.failures.iter().find(|(_, v)| {
        v.iter()
            .any(|v| v.invariant == invariant && v.detail.contains(saying))
    });
    let Some((seed, _)) = found else {
        panic!(
            "the broken variant went unnoticed by \"{invariant}\": {}",
            summary.line
        );
    };
    println!("  caught by \"{invariant}\" with seed {seed}");
}

/// The class written, as JSON, when `path` is a class status write replacing the object
/// (a compare-and-swap); a JSON patch (an array of operations) is not one.
fn class_status_body(path: &str, body: &bytes::Bytes) -> Option<serde_json::Value> {
    is_class_status(path)
        .then(|| serde_json::from_slice::<serde_json::Value>(body).ok())
        .flatten()
        .filter(serde_json::Value::is_object)
}

/// The operations of a class status write sent as a JSON patch (what one node alone changed),
/// when `path` is a class status write and `body` one.
fn class_status_patch(path: &str, body: &bytes::Bytes) -> Option<Vec<serde_json::Value>> {
    is_class_status(path)
        .then(|| serde_json::from_slice::<Vec<serde_json::Value>>(body).ok())
        .flatten()
}

/// Whether `path` is a class's status subresource.
fn is_class_status(path: &str) -> bool {
    path.contains("/portmapclasses/") && path.ends_with("/status")
}

#[test]
fn a_writer_rule_letting_every_node_write_is_caught() {
    let plan_fault: kuport::agent::PassHook = std::sync::Arc::new(|snapshot, plan| {
        let node = plan.node.clone();
        for d in &plan.portmaps {
            if d.status_writer.as_deref() == Some(node.as_str()) {
                continue;
            }
            let stored = snapshot.portmaps.iter().find(|p| {
                p.metadata.namespace.as_deref() == Some(&d.namespace)
                    && p.metadata.name.as_deref() == Some(&d.name)
            });
            plan.writes.portmaps.push(kuport_core::plan::PortMapWrite {
                namespace: d.namespace.to_string(),
                name: d.name.clone(),
                status: stored.and_then(|p| p.status.clone()).unwrap_or_default(),
                settling: false,
            });
        }
    });
    let variant = Variant {
        plan_fault: Some(plan_fault),
        wire_fault: None,
    };
    caught(&STEADY, variant, "single writer");
}

#[test]
fn a_gate_that_ignores_the_pod_nodes_acknowledgement_is_caught() {
    // Every pass declares every mapping with an endpoint programmed, acknowledged or not.
    let plan_fault: kuport::agent::PassHook = std::sync::Arc::new(|_snapshot, plan| {
        for w in &mut plan.writes.portmaps {
            if w.status.endpoint.is_none() {
                continue;
            }
            for c in &mut w.status.conditions {
                if c.type_ == "Programmed" {
                    c.status = "True".into();
                    c.reason = "AllNodesReady".into();
                }
            }
        }
    });
    let variant = Variant {
        plan_fault: Some(plan_fault),
        wire_fault: None,
    };
    caught(&STEADY, variant, "acknowledged");
}

#[test]
fn a_slot_landing_that_ignores_existing_claims_is_caught() {
    // The plan's own proposals are checked again by the merge (it lands a claim only on a free
    // slot), so the broken allocation is put where both meet: the written status itself.
    let wire_fault: kuport_simulator::net::Tamper = std::sync::Arc::new(|_node, parts, body| {
        let Some(mut status) = class_status_body(parts.uri.path(), &body) else {
            return body;
        };
        if let Some(links) = status["status"]["links"].as_array_mut() {
            for link in links {
                link["slot"] = 0.into();
            }
        }
        serde_json::to_vec(&status).map(Into::into).unwrap_or(body)
    });
    let variant = Variant {
        plan_fault: None,
        wire_fault: Some(wire_fault),
    };
    caught(&CLAIMS, variant, "unique slots");
}

#[test]
fn a_merge_that_overwrites_other_nodes_rows_is_caught() {
    let wire_fault: kuport_simulator::net::Tamper = std::sync::Arc::new(|node, parts, body| {
        if let Some(ops) = class_status_patch(parts.uri.path(), &body) {
            // A patch of this node's row becomes one of the whole list, with its row alone.
            let own_row = ops.iter().find_map(|op| {
                let path = op["path"].as_str()?;
                let row = path.strip_prefix("/status/nodes/")?;
                (!row.contains('/')).then(|| op.get("value").cloned())
            });
            let Some(row) = own_row else {
                return body;
            };
            let rows: Vec<serde_json::Value> = row.into_iter().collect();
            let patch = serde_json::json!([
                {"op": "replace", "path": "/status/nodes", "value": rows},
            ]);
            return serde_json::to_vec(&patch).map(Into::into).unwrap_or(body);
        }
        let Some(mut status) = class_status_body(parts.uri.path(), &body) else {
            return body;
        };
        if let Some(rows) = status["status"]["nodes"].as_array_mut() {
            rows.retain(|r| r["name"] == node);
        }
        serde_json::to_vec(&status).map(Into::into).unwrap_or(body)
    });
    let variant = Variant {
        plan_fault: None,
        wire_fault: Some(wire_fault),
    };
    caught(&STEADY, variant, "nothing lost");
}

#[test]
fn a_status_that_leaves_out_the_ipv6_addresses_is_caught() {
    // Every agent writes its PortMap statuses without their IPv6 addresses (the endpoint's and
    // the published ones), while its datapath serves IPv6 and every reason is right: only the
    // check of the stored addresses against the plan sees it.
    let plan_fault: kuport::agent::PassHook = std::sync::Arc::new(|_snapshot, plan| {
        for w in &mut plan.writes.portmaps {
            if let Some(ep) = &mut w.status.endpoint {
                ep.address6 = None;
            }
            let mut rows = w.status.published.to_vec();
            for row in &mut rows {
                row.address6.clear();
            }
            w.status.published = rows.into();
        }
    });
    let variant = Variant {
        plan_fault: Some(plan_fault),
        wire_fault: None,
    };
    caught_saying(
        &DUAL_STACK_FAILOVER,
        variant,
        "convergence",
        "stored endpoint",
    );
}
