//! Property tests: the plan is a function of the cluster alone. It never panics, gives the identical plan
//! whatever the order of its input lists (both tables byte for byte), and its global part is the
//! same on every node. IPv4-only Services leave IPv6 out entirely, and their IPv4 datapath is
//! byte for byte the one of a cluster without IPv6. The generated clusters do exercise both
//! families.
//!
//! The cluster model is in `common/model.rs`, its objects in `common/inputs.rs`, the
//! oracles in `common/oracles.rs`; cases per property:
//! `KUPORT_PROPTEST_CASES` (default 1000).

mod common;

use kuport_core::ir::Family;
use kuport_core::render::nft_text;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};

use common::inputs::*;
use common::model::*;
use common::oracles::*;

proptest! {
    #![proptest_config(config())]

    /// (a) The plan never panics, for every node of the cluster and for a node it does not know.
    #[test]
    fn plan_never_panics(m in model()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            prop_assert_eq!(p.node.as_str(), node);
        }
    }

    /// (b) Shuffling every input list yields the identical plan, for every node: both tables
    /// byte for byte, in clusters with and without return links.
    #[test]
    fn plan_is_deterministic_under_shuffles(m in model_or_linked(), seed in any::<u64>()) {
        let snap = snapshot(&m);
        let shuffled = shuffled(&snap, seed, false);
        for node in plan_nodes(&m) {
            let a = plan_of(&m, &snap, node);
            let b = plan_of(&m, &shuffled, node);
            for family in Family::ALL {
                prop_assert_eq!(
                    nft_text(a.host_state.table(family)),
                    nft_text(b.host_state.table(family)),
                    "node {}, {} table", node, family
                );
            }
            prop_assert_eq!(a, b, "node {}", node);
        }
    }

    /// (b') Shuffling the interface lists of class nodes and PortMaps too changes nothing but
    /// messages that quote those lists as written (a node's row names the first missing interface
    /// in spec order; `NoInterfaceOnNode` quotes the PortMap's list).
    #[test]
    fn plan_is_deterministic_under_interface_shuffles(m in model(), seed in any::<u64>()) {
        let snap = snapshot(&m);
        let shuffled = shuffled(&snap, seed, true);
        for node in plan_nodes(&m) {
            let a = without_messages(plan_of(&m, &snap, node));
            let b = without_messages(plan_of(&m, &shuffled, node));
            prop_assert_eq!(a, b, "node {}", node);
        }
    }

    /// (c) The global part does not depend on the computing node (nor on its host facts).
    #[test]
    fn global_part_is_the_same_on_every_node(m in model()) {
        let snap = snapshot(&m);
        let nodes = plan_nodes(&m);
        let first = global_part(&plan_of(&m, &snap, nodes[0]));
        for node in &nodes[1..] {
            let other = global_part(&plan_of(&m, &snap, node));
            prop_assert_eq!(&first.0, &other.0, "portmaps: {} vs {}", nodes[0], node);
            prop_assert_eq!(&first.1, &other.1, "classes: {} vs {}", nodes[0], node);
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// (m) IPv4-only Services leave IPv6 out: with every Service listed over IPv4 alone, no
    /// node has a rule in its `ip6` table, an IPv6 link end, an IPv6 ip rule or route, and no
    /// endpoint an IPv6 address; and the IPv4 datapath and every decision are those of the
    /// same cluster without any IPv6 (no IPv6 pod CIDR, no IPv6 interface address), the `ip`
    /// table byte for byte.
    #[test]
    fn ipv4_only_services_leave_ipv6_out(m in model_or_linked()) {
        let (v4, bare) = (ipv4_services_only(&m), without_ipv6(&m));
        let (snap, bare_snap) = (snapshot(&v4), snapshot(&bare));
        for node in plan_nodes(&m) {
            let a = plan_of(&v4, &snap, node);
            let b = plan_of(&bare, &bare_snap, node);
            let s = &a.host_state;
            prop_assert!(s.nft6.is_empty(), "node {}:\n{}", node, nft_text(&s.nft6));
            prop_assert!(s.nft6.hairpin_sources.is_empty(), "node {}", node);
            prop_assert!(
                s.links.iter().all(|l| l.address6.is_none() && l.peer_address6.is_none()),
                "node {}: {:?}", node, s.links
            );
            prop_assert!(s.rules.iter().all(|r| r.family == Family::V4), "node {}: {:?}", node, s.rules);
            prop_assert!(s.routes.iter().all(|r| r.via.is_ipv4()), "node {}: {:?}", node, s.routes);
            for d in &a.portmaps {
                prop_assert!(
                    d.endpoint.as_ref().is_none_or(|e| e.address.is_ipv4() && e.address6.is_none()),
                    "{}/{}: {:?}", d.namespace, d.name, d.endpoint
                );
            }
            prop_assert_eq!(nft_text(&s.nft), nft_text(&b.host_state.nft), "node {}", node);
            prop_assert_eq!(s, &b.host_state, "node {}", node);
            prop_assert_eq!(&a.portmaps, &b.portmaps, "node {}", node);
        }
    }
}

/// What the generated clusters exercise: how many clusters have at least one of each.
#[derive(Debug, Default)]
struct Seen {
    /// An endpoint at an IPv6 address (an IPv6-only Service).
    ipv6_only: usize,
    /// An IPv4 endpoint paired with its pod's IPv6 address.
    dual_stack_paired: usize,
    /// An IPv4 endpoint left unpaired although its Service has an IPv6 slice.
    dual_stack_unpaired: usize,
    /// An IPv4 endpoint without an IPv6 address.
    ipv4_only: usize,
    /// For comparison: a DNAT in some node's `ip` table.
    ip_table: usize,
    /// Rules in some node's `ip6` table.
    ip6_table: usize,
    /// For comparison: a link on some node.
    link: usize,
    /// A link with IPv6 ends.
    ipv6_link: usize,
    /// An IPv6 DNAT of what arrives over a link (the pod's node's half).
    ipv6_over_link: usize,
}

fn count(seen: &mut Seen, m: &Model) {
    let snap = snapshot(m);
    let p = plan_of(m, &snap, GHOST);
    let eps: Vec<_> = p
        .portmaps
        .iter()
        .filter_map(|d| d.endpoint.as_ref())
        .collect();
    let has_slice6 = |d: &kuport_core::plan::MappingDecision| {
        let pm = portmap_of(&snap, &d.namespace, &d.name);
        snap.endpoint_slices.iter().any(|s| {
            s.address_type == "IPv6"
                && s.metadata.namespace == pm.metadata.namespace
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    == Some(&pm.spec.service_ref.name)
        })
    };
    seen.ipv6_only += usize::from(eps.iter().any(|e| e.address.is_ipv6()));
    seen.dual_stack_paired += usize::from(eps.iter().any(|e| e.address6.is_some()));
    seen.dual_stack_unpaired += usize::from(p.portmaps.iter().any(|d| {
        d.endpoint
            .as_ref()
            .is_some_and(|e| e.address.is_ipv4() && e.address6.is_none())
            && has_slice6(d)
    }));
    seen.ipv4_only += usize::from(
        eps.iter()
            .any(|e| e.address.is_ipv4() && e.address6.is_none()),
    );
    let plans: Vec<_> = plan_nodes(m)
        .into_iter()
        .map(|n| plan_of(m, &snap, n))
        .collect();
    let states = || plans.iter().map(|p| &p.host_state);
    seen.ip_table +=
        usize::from(states().any(|s| !s.nft.rules(kuport_core::ir::ChainId::Pre).is_empty()));
    seen.ip6_table += usize::from(states().any(|s| !s.nft6.is_empty()));
    seen.link += usize::from(states().any(|s| !s.links.is_empty()));
    seen.ipv6_link += usize::from(states().any(|s| s.links.iter().any(|l| l.address6.is_some())));
    seen.ipv6_over_link += usize::from(states().any(|s| {
        s.nft6
            .rules(kuport_core::ir::ChainId::Pre)
            .iter()
            .any(|r| match r {
                kuport_core::ir::Rule::Dnat(d) => s.links.iter().any(|l| l.name == d.iif),
                _ => false,
            })
    }));
}

/// `count`s over `clusters` drawn from `strategy`, the same on every run (a fixed generator).
fn seen(strategy: impl Strategy<Value = Model>, clusters: usize) -> Seen {
    let mut runner =
        TestRunner::new_with_rng(config(), TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let mut seen = Seen::default();
    for _ in 0..clusters {
        let m = strategy.new_tree(&mut runner).expect("a cluster").current();
        count(&mut seen, &m);
    }
    seen
}

/// The generated clusters exercise both families: enough of them have an IPv6-only mapping, a
/// dual-stack mapping served at its pod's IPv6 address, one whose IPv6 slice does not pair, an
/// IPv4-only one, a node with rules in its `ip6` table, and (in the clusters leaning toward
/// links) a link carrying IPv6 and a pod's node taking IPv6 off a link. Without these the
/// properties above would hold vacuously for IPv6. The floors guard against a change of the
/// model that would leave IPv6 untested.
#[test]
fn the_generated_clusters_exercise_both_families() {
    const CLUSTERS: usize = 200;
    let any = seen(model(), CLUSTERS);
    let linked = seen(linked_model(), CLUSTERS);
    println!(
        "of {CLUSTERS} clusters, with at least one: {any:#?}\nleaning toward links: {linked:#?}"
    );
    for (what, n, at_least) in [
        ("an IPv6-only mapping", any.ipv6_only, 15),
        ("a dual-stack mapping paired", any.dual_stack_paired, 20),
        ("a dual-stack mapping unpaired", any.dual_stack_unpaired, 10),
        ("an IPv4 endpoint without IPv6", any.ipv4_only, 20),
        ("rules in an ip6 table", any.ip6_table, 8),
        ("a link with IPv6 ends", linked.ipv6_link, 20),
        ("IPv6 taken off a link", linked.ipv6_over_link, 20),
    ] {
        assert!(
            n >= at_least,
            "only {n} of {CLUSTERS} clusters have {what} (want {at_least})"
        );
    }
}
