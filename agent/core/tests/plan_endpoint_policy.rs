//! Endpoints kuport delivers to: only pod addresses of the cluster. An EndpointSlice is whatever
//! the namespace's writers put in it, so a node's address, loopback, link-local space, kuport's
//! own blocks and anything outside the pod networks are skipped, and a mapping left with none
//! says why.

use k8s_openapi::api::core::v1::ConfigMap;
use kuport_core::ir::{ChainId, Rule};
use kuport_core::plan::{Plan, ProgrammedReason as P};
use kuport_core::snapshot::CniFacts;
use kuport_testkit::cluster::*;
use proptest::prelude::*;
use serde_json::json;

fn edge_facts() -> kuport_core::snapshot::HostFacts {
    facts(
        &[("enp1s0", "203.0.113.9"), ("wt0", "100.64.0.1")],
        "wt0",
        1400,
    )
}

/// The tenant's mapping `games/gs` (UDP 3000) whose Service lists one endpoint at `address` on
/// `node`.
fn listing(address: &str, node: &str) -> Cluster {
    edge_and_worker()
        .row("public", "worker-b", json!({}), 1420)
        .claim_built("public", "edge-a/worker-b", 0)
        .endpoint("games", "gs", "gs-0", node, address, 3000)
        .portmap(pm("games", "gs", "public", 3000))
}

fn programmed(plan: &Plan) -> (P, String) {
    let d = decision(plan, "games", "gs");
    let p = d.programmed.clone().expect("accepted");
    (p.reason, p.message)
}

/// Every DNAT target in `plan`.
fn dnat_targets(plan: &Plan) -> Vec<String> {
    plan.host_state
        .nft
        .rules(ChainId::Pre)
        .iter()
        .filter_map(|r| match r {
            Rule::Dnat(d) => Some(d.to.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_endpoint_at_the_accepting_nodes_own_address_is_never_used() {
    let c = listing("100.64.0.1", "edge-a");
    let plan = c.plan_with("edge-a", &edge_facts());
    let (reason, message) = programmed(&plan);
    assert_eq!(reason, P::EndpointNotAllowed);
    assert!(
        message.contains("100.64.0.1 on node edge-a (pod gs-0) is an address of node edge-a"),
        "{message}"
    );
    let d = decision(&plan, "games", "gs");
    assert!(d.endpoint.is_none());
    assert_eq!(d.rejected_endpoints.len(), 1);
    assert!(
        plan.host_state.nft.rules(ChainId::Pre).is_empty(),
        "nothing is programmed"
    );
    // Every agent says the same.
    assert_eq!(programmed(&c.plan("worker-b")).0, P::EndpointNotAllowed);
    // Control: a pod address on the same node is programmed.
    let pod = listing("10.244.0.5", "edge-a").plan_with("edge-a", &edge_facts());
    assert_eq!(programmed(&pod).0, P::AllNodesReady);
    assert!(dnat_targets(&pod).iter().any(|t| t.contains("10.244.0.5")));
}

#[test]
fn every_kind_of_non_pod_address_is_refused_with_its_own_words() {
    for (address, node, words) in [
        ("100.64.0.2", "worker-b", "an address of node worker-b"),
        ("203.0.113.9", "edge-a", "an address of node edge-a"),
        ("127.0.0.1", "edge-a", "a loopback address"),
        ("169.254.1.1", "worker-b", "a link-local address"),
        ("169.254.107.1", "edge-a", "kuport's stand-in block"),
        (
            "169.254.77.4",
            "worker-b",
            "the return-link subnet of class public",
        ),
        ("0.0.0.0", "edge-a", "not a unicast address"),
        ("224.0.0.5", "edge-a", "not a unicast address"),
        (
            "192.168.7.7",
            "worker-b",
            "outside the cluster's pod networks (10.244.0.0/16)",
        ),
    ] {
        let plan = listing(address, node).plan_with("edge-a", &edge_facts());
        let (reason, message) = programmed(&plan);
        assert_eq!(reason, P::EndpointNotAllowed, "{address}: {message}");
        assert!(message.contains(words), "{address}: {message}");
        assert!(
            plan.host_state.nft.rules(ChainId::Pre).is_empty(),
            "{address}"
        );
    }
}

#[test]
fn a_node_address_of_any_type_counts() {
    let mut c = listing("198.51.100.77", "worker-b");
    let node = c
        .snapshot
        .nodes
        .iter_mut()
        .find(|n| n.metadata.name.as_deref() == Some("worker-b"))
        .expect("node");
    let addresses = node
        .status
        .as_mut()
        .and_then(|s| s.addresses.as_mut())
        .expect("addresses");
    addresses.push(
        serde_json::from_value(json!({"type": "ExternalIP", "address": "198.51.100.77"}))
            .expect("address"),
    );
    // Inside a pod network too: a node address is refused first.
    c.class_mut("public").spec.pod_networks = vec!["198.51.100.0/24".into()];
    let (reason, message) = programmed(&c.plan("edge-a"));
    assert_eq!(reason, P::EndpointNotAllowed);
    assert!(message.contains("an address of node worker-b"), "{message}");
}

#[test]
fn a_rejected_endpoint_is_skipped_for_another_ready_pod() {
    let c = listing("100.64.0.1", "edge-a").endpoint(
        "games",
        "gs",
        "gs-1",
        "worker-b",
        "10.244.1.5",
        3000,
    );
    let plan = c.plan_with("edge-a", &edge_facts());
    let d = decision(&plan, "games", "gs");
    let ep = d.endpoint.as_ref().expect("the pod is chosen");
    assert_eq!(ep.address.to_string(), "10.244.1.5");
    assert_eq!(programmed(&plan).0, P::AllNodesReady);
    assert_eq!(d.rejected_endpoints[0].address.to_string(), "100.64.0.1");
    // Without the check, the node address (edge-a ranks first, being accepting) would win.
}

#[test]
fn without_any_known_pod_network_no_endpoint_is_used_until_the_administrator_names_one() {
    let mut c = listing("10.244.1.5", "worker-b");
    for node in &mut c.snapshot.nodes {
        node.spec = None;
    }
    let (reason, message) = programmed(&c.plan("edge-a"));
    assert_eq!(reason, P::EndpointNotAllowed);
    assert!(message.contains("not in a known pod network"), "{message}");
    assert!(message.contains("spec.podNetworks"), "{message}");
    // The class names the pod network (Calico IPAM, a cloud CNI, ...).
    let mut named = c.clone();
    named.class_mut("public").spec.pod_networks = vec!["10.244.0.0/16".into()];
    assert_eq!(programmed(&named.plan("edge-a")).0, P::AllNodesReady);
    // Another class's networks do not count for this one.
    let mut elsewhere = c.clone();
    elsewhere.push_class(
        "other",
        CREATED,
        json!({"nodes": nodes_json(&[("edge-a", &["wt0"])]),
               "podNetworks": ["10.244.0.0/16"],
               "returnPath": {"mode": "Vxlan", "vxlan": {"subnet": "169.254.78.0/24", "vni": 9000}}}),
        serde_json::Value::Null,
    );
    assert_eq!(
        programmed(&elsewhere.plan("edge-a")).0,
        P::EndpointNotAllowed
    );
    // Cilium's cluster pool counts, read from its ConfigMap.
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cilium-config",
        "namespace": "kube-system"}, "data": {"cluster-pool-ipv4-cidr": "10.0.0.0/8 10.244.0.0/16",
        "routing-mode": "tunnel"}}))
    .expect("configmap");
    let mut pool = c.clone();
    pool.snapshot.cni = Some(CniFacts::from_cilium_config(&cm));
    assert_eq!(programmed(&pool.plan("edge-a")).0, P::AllNodesReady);
    // Not when Cilium's IPAM takes addresses from elsewhere (here: the Nodes' podCIDRs).
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cilium-config",
        "namespace": "kube-system"}, "data": {"cluster-pool-ipv4-cidr": "10.244.0.0/16",
        "ipam": "kubernetes"}}))
    .expect("configmap");
    pool.snapshot.cni = Some(CniFacts::from_cilium_config(&cm));
    assert_eq!(programmed(&pool.plan("edge-a")).0, P::EndpointNotAllowed);
}

#[test]
fn the_rejection_message_is_bounded() {
    let mut c = listing("127.0.0.1", "edge-a");
    for i in 2..40 {
        c = c.endpoint(
            "games",
            "gs",
            &format!("gs-{i}"),
            "edge-a",
            &format!("127.0.0.{i}"),
            3000,
        );
    }
    let plan = c.plan("edge-a");
    let d = decision(&plan, "games", "gs");
    assert_eq!(d.rejected_endpoints.len(), 8, "the first few are listed");
    let (_, message) = programmed(&plan);
    assert!(message.ends_with("and 31 more"), "{message}");
}

/// A pool of endpoint addresses, each with the node it claims to run on: pod addresses and the
/// kinds of non-pod address an EndpointSlice could list.
const POOL: &[(&str, &str)] = &[
    ("10.244.0.5", "edge-a"),
    ("10.244.1.5", "worker-b"),
    ("10.244.1.6", "worker-b"),
    ("100.64.0.1", "edge-a"),
    ("100.64.0.2", "worker-b"),
    ("203.0.113.9", "edge-a"),
    ("127.0.0.1", "edge-a"),
    ("169.254.107.1", "worker-b"),
    ("169.254.77.1", "worker-b"),
    ("192.168.1.1", "worker-b"),
];

proptest! {
    /// Whatever the slices list and in whatever order: the chosen endpoint is a pod address,
    /// the same one, and the same endpoints are rejected.
    #[test]
    fn only_pod_addresses_are_chosen_whatever_the_order(
        picks in proptest::sample::subsequence((0..POOL.len()).collect::<Vec<_>>(), 1..POOL.len()),
        seed in any::<u64>(),
    ) {
        let build = |order: &[usize]| {
            let mut c = edge_and_worker()
                .row("public", "worker-b", json!({}), 1420)
                .claim_built("public", "edge-a/worker-b", 0)
                .portmap(pm("games", "gs", "public", 3000));
            for i in order {
                let (address, node) = POOL[*i];
                c = c.endpoint("games", "gs", &format!("p{i}"), node, address, 3000);
            }
            c
        };
        let mut shuffled = picks.clone();
        // A deterministic shuffle from the seed.
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            shuffled.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let a = build(&picks).plan("edge-a");
        let b = build(&shuffled).plan("edge-a");
        let (da, db) = (decision(&a, "games", "gs"), decision(&b, "games", "gs"));
        prop_assert_eq!(da.endpoint.as_ref().map(|e| e.address), db.endpoint.as_ref().map(|e| e.address));
        let rejected = |d: &kuport_core::plan::MappingDecision| {
            d.rejected_endpoints.iter().map(|r| (r.address, r.reason.clone())).collect::<Vec<_>>()
        };
        prop_assert_eq!(rejected(da), rejected(db));
        if let Some(ep) = &da.endpoint {
            prop_assert!(ep.address.to_string().starts_with("10.244."), "{}", ep.address);
        }
        let any_pod = picks.iter().any(|i| POOL[*i].0.starts_with("10.244."));
        prop_assert_eq!(da.endpoint.is_some(), any_pod);
        if !any_pod {
            prop_assert_eq!(da.programmed.as_ref().map(|p| p.reason), Some(P::EndpointNotAllowed));
        }
    }
}

#[test]
fn the_cni_gateway_inside_a_nodes_pod_cidr_is_refused_by_every_agent() {
    // The fixtures' Nodes list 10.244.0.0/16: its first address is where a bridge CNI puts the
    // node's own gateway.
    let (reason, message) = programmed(&listing("10.244.0.1", "worker-b").plan("edge-a"));
    assert_eq!(reason, P::EndpointNotAllowed);
    assert!(message.contains("the CNI's gateway"), "{message}");
    // Cilium names its cilium_host address in a Node annotation.
    let mut c = listing("10.244.1.77", "worker-b");
    c.snapshot.nodes[1]
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            "network.cilium.io/ipv4-cilium-host".into(),
            "10.244.1.77".into(),
        );
    let (reason, message) = programmed(&c.plan("edge-a"));
    assert_eq!(reason, P::EndpointNotAllowed);
    assert!(message.contains("own host in its pod CIDR"), "{message}");
    // Control: the next address is a pod's.
    assert_eq!(
        programmed(&listing("10.244.0.2", "worker-b").plan("edge-a")).0,
        P::AllNodesReady
    );
}

/// worker-b's refusal of games/gs with `message` lands in the class status: edge-a's plan then,
/// which forwards nothing.
fn report_worker_b_refusal(c: &mut Cluster, message: String) -> Plan {
    c.report_refused("public", "worker-b", "games/gs", &message);
    let edge = c.plan_with("edge-a", &edge_facts());
    assert!(dnat_targets(&edge).is_empty(), "{:?}", dnat_targets(&edge));
    edge
}

/// worker-b's plan refuses the one mapping with `message`, delivers nothing, and its status
/// starts with `says`.
fn assert_refused_by_worker_b(pod: &Plan, message: &str, says: &str) {
    assert_eq!(pod.writes.refusals.len(), 1, "{:?}", pod.writes.refusals);
    assert_eq!(pod.writes.refusals[0].message, message);
    assert!(
        pod.host_state.nft.rules(ChainId::Pre).is_empty(),
        "worker-b delivers nothing to the refused endpoint"
    );
    let (reason, text) = programmed(pod);
    assert_eq!(reason, P::HostRefused);
    assert!(text.starts_with(says), "{text}");
}

#[test]
fn the_endpoints_node_refuses_an_address_of_its_own_host_and_no_node_forwards_it() {
    use kuport_core::plan::local_endpoint_message;
    // 10.244.1.50 is inside the pod network, but worker-b holds it (a gateway no Node lists).
    let c = listing("10.244.1.50", "worker-b");
    let mut own = facts(&[], "wt0", 1400);
    own.local_addresses = vec!["10.244.1.50".parse().expect("ip")];
    let pod = c.plan_with("worker-b", &own);
    let message = local_endpoint_message("10.244.1.50".parse().expect("ip"));
    assert_refused_by_worker_b(
        &pod,
        &message,
        "on node worker-b, the endpoint address 10.244.1.50",
    );
    // Control: without the address on the host, worker-b builds its half.
    assert!(
        !c.plan_with("worker-b", &facts(&[], "wt0", 1400))
            .host_state
            .nft
            .rules(ChainId::Pre)
            .is_empty()
    );

    // Once worker-b's report lands, edge-a stops forwarding toward it and says why.
    let forwarding = c.plan_with("edge-a", &edge_facts());
    assert!(!dnat_targets(&forwarding).is_empty(), "before the report");
    let mut reported = c.clone();
    let edge = report_worker_b_refusal(&mut reported, message);
    assert_eq!(programmed(&edge).0, P::HostRefused);
    // Another refusal by worker-b (its kernel's) leaves edge-a's datapath as it was.
    reported
        .class_mut("public")
        .status
        .as_mut()
        .expect("status")
        .refused[0]
        .message = "the kernel refused its nftables rules: no".into();
    assert_eq!(
        reported.plan_with("edge-a", &edge_facts()).host_state,
        forwarding.host_state
    );
}

/// A node's row counts as its addresses only in its own class: node edge-c, which class
/// `partner` names, lists the tenant pod's address in its row there, and the `public` class's
/// mapping to that pod is still programmed.
#[test]
fn a_row_of_another_class_vetoes_no_endpoint() {
    let veto = |class: &str| {
        let mut c = listing("10.244.1.6", "worker-b")
            .node("edge-c", "100.64.0.3")
            .class_json(
                "partner",
                json!({"nodes": {"edge-c": {"interfaces": ["enp1s0"]}},
                       "returnPath": {"mode": "None"}}),
                serde_json::Value::Null,
            );
        if class == "public" {
            c.class_mut("public").spec.nodes.insert(
                "edge-c".into(),
                serde_json::from_value(json!({"interfaces": ["enp1s0"]})).expect("node"),
            );
        }
        c.row(class, "edge-c", json!({"enp1s0": "10.244.1.6"}), 1400)
    };
    let c = veto("partner");
    let plan = c.plan_with("edge-a", &edge_facts());
    let (reason, message) = programmed(&plan);
    assert_eq!(reason, P::AllNodesReady, "{message}");
    let endpoint = decision(&plan, "games", "gs")
        .endpoint
        .as_ref()
        .map(|e| e.address);
    assert_eq!(endpoint, Some("10.244.1.6".parse().expect("ip")));
    // Control: the same row in the mapping's own class refuses it there.
    let own = veto("public").plan_with("edge-a", &edge_facts());
    let (reason, message) = programmed(&own);
    assert_eq!(reason, P::EndpointNotAllowed, "{message}");
    assert!(message.contains("an address of node edge-c"), "{message}");
}

/// A running Pod bound to `node` at `ip`, as the kubelet reports it.
fn running_pod(name: &str, node: &str, ip: &str) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = kuport_testkit::objects::bound_pod(name, "gs", node, json!({"name": "c"}));
    pod["metadata"]["namespace"] = json!("games");
    pod["status"] = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]});
    typed(pod, "pod")
}

/// An EndpointSlice is the word of whoever wrote it. The endpoint's node delivers only to an
/// address of a Pod of the mapping's namespace bound to it (the scheduler's binding, the
/// kubelet's address), and reports any other; once its report lands no accepting node forwards
/// the mapping. Here the slice names worker-b with 10.244.1.77, an address no Pod of `games` on
/// worker-b has (another node's CNI gateway, say, which the plan cannot know under
/// cluster-pool IPAM, or another tenant's pod).
#[test]
fn the_endpoints_node_delivers_only_to_an_address_of_its_own_pods() {
    use kuport_core::plan::not_a_pod_message;
    let with_pods = |pods: Vec<k8s_openapi::api::core::v1::Pod>| {
        let mut c = listing("10.244.1.77", "worker-b");
        c.snapshot.pods = pods;
        c.snapshot.pods_listed = true;
        c
    };
    let address = "10.244.1.77".parse().expect("ip");
    let message = not_a_pod_message(address, "games");
    let bare = facts(&[], "wt0", 1400);
    for pods in [
        vec![],
        // A Pod with the address, but bound to another node.
        vec![running_pod("gs-0", "worker-c", "10.244.1.77")],
        // A Pod of worker-b with the address, but another tenant's.
        {
            let mut other = running_pod("private-0", "worker-b", "10.244.1.77");
            other.metadata.namespace = Some("team-a".into());
            vec![other]
        },
        // Its own Pod, but finished, and the address is a running Pod's of another tenant now.
        {
            let mut done = running_pod("gs-0", "worker-b", "10.244.1.77");
            done.status.as_mut().expect("status").phase = Some("Succeeded".into());
            let mut reused = running_pod("private-0", "worker-b", "10.244.1.77");
            reused.metadata.namespace = Some("team-a".into());
            vec![done, reused]
        },
    ] {
        let pod = with_pods(pods).plan_with("worker-b", &bare);
        assert_refused_by_worker_b(
            &pod,
            &message,
            "on node worker-b, the endpoint address 10.244.1.77 is not an address of a Pod of namespace games bound to this node",
        );
    }
    // Controls: a Pod of worker-b at that address (in any order among others), or Pods not
    // known at all (an offline dump without them), and worker-b builds its half.
    let mut pods = vec![
        running_pod("other", "worker-c", "10.244.2.9"),
        running_pod("gs-0", "worker-b", "10.244.1.77"),
        running_pod("more", "worker-b", "10.244.1.78"),
    ];
    for _ in 0..3 {
        pods.rotate_left(1);
        let plan = with_pods(pods.clone()).plan_with("worker-b", &bare);
        assert!(
            plan.writes.refusals.is_empty(),
            "{:?}",
            plan.writes.refusals
        );
        assert!(!plan.host_state.nft.rules(ChainId::Pre).is_empty());
    }
    let unknown = listing("10.244.1.77", "worker-b").plan_with("worker-b", &bare);
    assert!(!unknown.host_state.nft.rules(ChainId::Pre).is_empty());
    // A Pod that just ended keeps its address until a running Pod takes it (its endpoint goes
    // from the slice a moment later: no refusal in between).
    let mut done = running_pod("gs-0", "worker-b", "10.244.1.77");
    done.status.as_mut().expect("status").phase = Some("Failed".into());
    let ended = with_pods(vec![done]).plan_with("worker-b", &bare);
    assert!(
        ended.writes.refusals.is_empty(),
        "{:?}",
        ended.writes.refusals
    );

    // Once worker-b's report lands, edge-a stops forwarding toward it and says why.
    let mut reported = with_pods(vec![]);
    assert!(!dnat_targets(&reported.plan_with("edge-a", &edge_facts())).is_empty());
    let edge = report_worker_b_refusal(&mut reported, message);
    let (reason, text) = programmed(&edge);
    assert_eq!(reason, P::HostRefused);
    assert!(
        text.contains("not an address of a Pod of namespace games"),
        "{text}"
    );
}
