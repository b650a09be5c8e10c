//! Golden renderings of the datapath IR for each node role, and checks of what each role emits.
//! Regenerate the files with `KUPORT_BLESS=1 cargo test -p kuport-core --test plan_golden`.

use kuport_core::ir::{ChainId, MarkLayout, Rule};
use kuport_core::plan::Plan;
use kuport_core::render::nft_text;
use kuport_core::report::PlanReport;
use kuport_testkit::cluster::*;
use serde_json::{Value, json};

fn golden(case: &str, plan: &Plan) {
    let dir = format!("{}/testdata/golden", env!("CARGO_MANIFEST_DIR"));
    let nft = nft_text(&plan.host_state.nft);
    let report = PlanReport::new(plan);
    let host = serde_json::to_string_pretty(&json!({
        "links": report.host.links, "rules": report.host.rules, "routes": report.host.routes
    }))
    .expect("json")
        + "\n";
    // The IR itself, so the host layer's kernel tests apply exactly these states.
    let ir = serde_json::to_string_pretty(&plan.host_state).expect("json") + "\n";
    let mut files = vec![
        (format!("{case}.nft"), nft),
        (format!("{case}.host.json"), host),
        (format!("{case}.ir.json"), ir),
    ];
    // The IPv6 table, for the cases that have one.
    if !plan.host_state.nft6.is_empty() {
        files.push((format!("{case}.nft6"), nft_text(&plan.host_state.nft6)));
    }
    for (file, actual) in files {
        let path = format!("{dir}/{file}");
        if std::env::var_os("KUPORT_BLESS").is_some() {
            std::fs::write(&path, &actual).expect("write golden file");
            continue;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e} (run with KUPORT_BLESS=1)"));
        assert!(
            expected == actual,
            "{file} differs from the rendering:\n--- expected\n{expected}\n--- actual\n{actual}"
        );
    }
}

/// kup-pre's rules split into the DNAT rules and the hairpin entries.
fn dnats_and_hairpins(pre: &[Rule]) -> (Vec<&Rule>, Vec<&Rule>) {
    let dnats = pre.iter().filter(|r| matches!(r, Rule::Dnat(_))).collect();
    let hairpins = pre
        .iter()
        .filter(|r| matches!(r, Rule::Hairpin(_)))
        .collect();
    (dnats, hairpins)
}

fn host_facts() -> kuport_core::snapshot::HostFacts {
    facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    )
}

#[test]
fn empty() {
    let plan = edge_and_worker().plan_with("edge-a", &host_facts());
    assert!(
        plan.host_state.nft.is_empty()
            && plan.host_state.links.is_empty()
            && plan.host_state.rules.is_empty()
    );
    golden("empty", &plan);
}

#[test]
fn same_node_single_port() {
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .endpoint_full(
            "games",
            "rcon",
            "game",
            "UDP",
            "rcon-0",
            "edge-a",
            "10.244.0.6",
            27000,
            None,
        )
        .portmap(pm("games", "gs", "public", 3000))
        .portmap(pm("games", "rcon", "public", 4000).ifaces(&["wt0"]));
    let plan = c.plan_with("edge-a", &host_facts());
    let pre = plan.host_state.nft.rules(ChainId::Pre);
    let (dnats, hairpins) = dnats_and_hairpins(pre);
    assert_eq!(dnats.len(), 3, "two interfaces for gs, one for rcon");
    assert!(
        dnats
            .iter()
            .all(|r| matches!(r, Rule::Dnat(d) if d.mark == Some(MarkLayout::default().local())))
    );
    assert_eq!(hairpins.len(), 3, "one published address per DNAT");
    assert!(plan.host_state.links.is_empty() && plan.host_state.routes.is_empty());
    assert_eq!(
        plan.host_state.rules.len(),
        1,
        "one local-mark rule however many mappings"
    );
    golden("same-node-single-port", &plan);
}

#[test]
fn same_node_range() {
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 27015)
        .portmap(pm("games", "gs", "public", 27015).end(27115).tcp())
        .endpoint_full(
            "games",
            "gs",
            "game",
            "TCP",
            "gs-0",
            "edge-a",
            "10.244.0.5",
            27015,
            None,
        );
    let plan = c.plan_with("edge-a", &host_facts());
    golden("same-node-range", &plan);
}

fn remote_single() -> Cluster {
    edge_and_worker()
        .row("public", "worker-b", json!({}), 1420)
        .claim("public", "edge-a/worker-b", 0)
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000))
}

#[test]
fn accepting_node_with_remote_pod() {
    let plan = remote_single().plan_with("edge-a", &host_facts());
    let link = &plan.host_state.links[0];
    let (dnats, hairpins) = dnats_and_hairpins(plan.host_state.nft.rules(ChainId::Pre));
    assert!(
        dnats
            .iter()
            .all(|r| matches!(r, Rule::Dnat(d) if d.to == link.peer_address && d.mark.is_some()))
    );
    assert!(
        hairpins
            .iter()
            .all(|r| matches!(r, Rule::Hairpin(h) if h.to == link.peer_address))
    );
    assert!(
        plan.host_state.routes.is_empty(),
        "the accepting node replies by the main table"
    );
    golden("accepting-remote-pod", &plan);
}

/// [`remote_single`] with the pod dual-stack: the Nodes advertise IPv6 pod CIDRs and the
/// Service an IPv6 slice for the same pod.
fn remote_dual_stack() -> Cluster {
    remote_single().with_ipv6_pod_cidrs().endpoint6(
        "games",
        "gs",
        "gs-0",
        "worker-b",
        "fd00:10:244:1::5",
        3000,
    )
}

fn host_facts_dual_stack() -> kuport_core::snapshot::HostFacts {
    let mut f = host_facts();
    f.interfaces6.insert(
        "enp1s0".to_owned(),
        "2001:db8:203::9".parse().expect("ipv6"),
    );
    f
}

#[test]
fn dual_stack_accepting_node_with_remote_pod() {
    let plan = remote_dual_stack().plan_with("edge-a", &host_facts_dual_stack());
    let state = &plan.host_state;
    let link = &state.links[0];
    let peer6 = link.peer_address6.expect("the link carries IPv6");
    let (dnats, hairpins) = dnats_and_hairpins(state.nft6.rules(ChainId::Pre));
    assert_eq!(dnats.len(), 1, "enp1s0 alone has an IPv6 address");
    assert!(
        dnats
            .iter()
            .chain(&hairpins)
            .all(|r| matches!(r, Rule::Dnat(d) if d.to == peer6)
                || matches!(r, Rule::Hairpin(h) if h.to == peer6))
    );
    assert_eq!(
        state.nft.rules(ChainId::Pre),
        remote_single()
            .plan_with("edge-a", &host_facts())
            .host_state
            .nft
            .rules(ChainId::Pre),
        "IPv4 unchanged"
    );
    golden("dual-stack-accepting-remote-pod", &plan);
}

#[test]
fn dual_stack_pod_node() {
    let plan = remote_dual_stack().plan_with("worker-b", &facts(&[], "wt0", 1420));
    let state = &plan.host_state;
    assert_eq!(
        state.rules.len(),
        4,
        "the IPv4 loop guard and reply rule, the IPv6 pod-by-main and reply rules"
    );
    assert_eq!(state.routes.len(), 2, "the link's route in each family");
    golden("dual-stack-pod-node", &plan);
}

#[test]
fn dual_stack_same_node_with_hairpin() {
    let c = edge_and_worker()
        .with_ipv6_pod_cidrs()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .endpoint6("games", "gs", "gs-0", "edge-a", "fd00:10:244::5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let plan = c.plan_with("edge-a", &host_facts_dual_stack());
    let v6 = &plan.host_state.nft6;
    assert_eq!(
        v6.hairpin_sources
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["fd00:10:244::/63"],
        "the IPv6 pod networks, aggregated"
    );
    assert!(
        v6.rules(ChainId::Post)
            .iter()
            .any(|r| matches!(r, Rule::HairpinMasquerade { .. }))
    );
    golden("dual-stack-same-node", &plan);
}

#[test]
fn pod_node_single() {
    let plan = remote_single().plan_with("worker-b", &facts(&[], "wt0", 1420));
    assert_eq!(
        plan.host_state.rules.len(),
        2,
        "loop guard and reply rule of the one link"
    );
    assert_eq!(plan.host_state.routes.len(), 1);
    assert!(
        plan.host_state
            .nft
            .rules(ChainId::Mangle)
            .iter()
            .any(|r| matches!(r, Rule::SaveArrivalLink { .. }))
    );
    golden("pod-node-single", &plan);
}

fn multi() -> Cluster {
    three_nodes()
        .class_json(
            "vip",
            json!({"nodes": nodes_json(&[("edge-a", &["wt0"]), ("edge-c", &["wt0"]), ("worker-b", &["wt0"])]),
                   "servingMode": "Multi", "returnPath": {"mode": "Vxlan", "vxlan": {"vni": 5000}}}),
            Value::Null,
        )
        .row("vip", "edge-a", json!({"wt0": "100.64.0.1"}), 1400)
        .row("vip", "edge-c", json!({"wt0": "100.64.0.3"}), 1400)
        .row("vip", "worker-b", json!({"wt0": "100.64.0.2"}), 1400)
        .claim("vip", "edge-a/worker-b", 0)
        .claim("vip", "edge-c/worker-b", 1)
        .claim("vip", "edge-a/edge-c", 2)
}

#[test]
fn pod_node_multi_two_links() {
    // worker-b is not an accepting node of this class variant: it only receives over two links.
    let mut c = multi();
    c.class_mut("vip").spec.nodes.remove("worker-b");
    let c = c
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "vip", 3000));
    let plan = c.plan_with("worker-b", &facts(&[], "wt0", 1400));
    assert_eq!(plan.host_state.links.len(), 2);
    assert_eq!(plan.host_state.rules.len(), 4);
    assert_eq!(plan.host_state.routes.len(), 2);
    let mangle = plan.host_state.nft.rules(ChainId::Mangle);
    assert_eq!(mangle.len(), 4, "one save and one restore per link");
    golden("pod-node-multi-two-links", &plan);
}

#[test]
fn node_both_accepting_and_holding_the_pod_multi() {
    let c = multi()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 4000)
        .portmap(pm("games", "gs", "vip", 3000));
    let plan = c.plan_with("worker-b", &facts(&[("wt0", "100.64.0.2")], "wt0", 1400));
    let d = decision(&plan, "games", "gs");
    assert_eq!(d.serving_node.as_deref(), Some("worker-b"));
    assert_eq!(*d.programming_nodes, ["edge-a", "edge-c", "worker-b"]);
    let (pre, _) = dnats_and_hairpins(plan.host_state.nft.rules(ChainId::Pre));
    assert_eq!(pre.len(), 3, "its own wt0 plus one per link");
    assert!(
        plan.host_state
            .rules
            .iter()
            .any(|r| r.fwmark == MarkLayout::default().local() && r.table == 254)
    );
    golden("both-roles-multi", &plan);
}

#[test]
fn filter_chains_hold_constant_rules_plus_one_per_link() {
    let mut c = remote_single();
    for i in 0..50 {
        let name = format!("m{i}");
        c = c
            .endpoint("games", &name, "p", "worker-b", "10.244.1.5", 4000 + i)
            .portmap(pm("games", &name, "public", 4000 + i));
    }
    for node in ["edge-a", "worker-b"] {
        let plan = c.plan_with(node, &host_facts());
        let links = plan.host_state.links.len();
        assert_eq!(plan.host_state.nft.rules(ChainId::Fwd).len(), 2, "{node}");
        let mangle = plan.host_state.nft.rules(ChainId::Mangle).len();
        assert!(
            mangle == 1 || mangle == 2 * links,
            "{node}: mangle has {mangle} rules for {links} links"
        );
        assert!(
            plan.host_state.nft.rules(ChainId::Pre).len() >= 51,
            "{node}"
        );
    }
}

#[test]
fn rendering_is_identical_for_shuffled_inputs() {
    let c = multi()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 4000)
        .endpoint("games", "gs2", "gs-1", "edge-a", "10.244.0.7", 3001)
        .portmap(pm("games", "gs", "vip", 3000))
        .portmap(pm("games", "gs2", "vip", 3001));
    let mut shuffled = c.clone();
    let s = &mut shuffled.snapshot;
    s.nodes.reverse();
    s.portmaps.reverse();
    s.endpoint_slices.reverse();
    s.classes.reverse();
    for class in &mut s.classes {
        if let Some(st) = class.status.as_mut() {
            st.links.reverse();
            st.nodes.reverse();
        }
    }
    for node in ["edge-a", "edge-c", "worker-b"] {
        let (a, b) = (
            c.plan_with(node, &host_facts()),
            shuffled.plan_with(node, &host_facts()),
        );
        assert_eq!(a, b, "{node}");
        assert_eq!(nft_text(&a.host_state.nft), nft_text(&b.host_state.nft));
    }
}

#[test]
fn long_names_are_cut_to_nft_limits_with_a_hash() {
    let long = "x".repeat(200);
    let cut = kuport_core::plan::fit_nft_text(&format!("games/{long}"));
    assert_eq!(cut.len(), 128);
    assert!(cut.starts_with("games/xxx") && cut.contains('_'));
    assert_ne!(
        cut,
        kuport_core::plan::fit_nft_text(&format!("games/{long}y")),
        "the hash keeps cut names apart"
    );
    assert_eq!(kuport_core::plan::fit_nft_text("games/gs"), "games/gs");
}
