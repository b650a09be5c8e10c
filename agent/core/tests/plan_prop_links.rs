//! Property tests of return-link claims: unique slots per class, no link before its claim has
//! landed, and proposals that land once written.
//!
//! The cluster model is in `common/model.rs`, its objects in `common/inputs.rs`, the
//! oracles in `common/oracles.rs`; cases per property:
//! `KUPORT_PROPTEST_CASES` (default 1000).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use kuport_core::plan::Plan;
use proptest::prelude::*;

use common::inputs::*;
use common::model::*;
use common::oracles::*;

proptest! {
    #![proptest_config(config())]

    /// (f) Slots are unique per class: within each node's view of a class, and across the
    /// proposals of every node together with the landed claims.
    #[test]
    fn slots_are_unique_per_class(m in model()) {
        let snap = snapshot(&m);
        // (class, slot) -> keys proposed for it, by any node.
        let mut proposed: BTreeMap<(String, u32), BTreeSet<String>> = BTreeMap::new();
        // (class, slot) -> the standby claims a serving pair's proposal takes the slot over from.
        let mut replaced: BTreeMap<(String, u32), BTreeSet<String>> = BTreeMap::new();
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            for class in &p.classes {
                let mut slots = BTreeSet::new();
                for link in &class.links {
                    prop_assert!(
                        slots.insert(link.slot),
                        "node {}: class {} shows slot {} twice: {:?}", node, class.name, link.slot, class.links
                    );
                }
            }
            for claim in &p.writes.claims {
                proposed
                    .entry((claim.class.clone(), claim.slot))
                    .or_default()
                    .insert(claim.key.clone());
                if let Some(victim) = &claim.replaces {
                    replaced
                        .entry((claim.class.clone(), claim.slot))
                        .or_default()
                        .insert(victim.clone());
                }
            }
        }
        for ((class, slot), keys) in &proposed {
            prop_assert_eq!(keys.len(), 1, "class {} slot {} proposed for {:?}", class, slot, keys);
            let key = keys.first().expect("one key");
            let victims = replaced.get(&(class.clone(), *slot));
            prop_assert!(victims.is_none_or(|v| v.len() == 1), "class {} slot {} replaces {:?}", class, slot, victims);
            for landed in claims_of(&snap, class).iter().filter(|c| well_formed_key(&c.key)) {
                let taken_over = victims.is_some_and(|v| v.contains(&landed.key));
                prop_assert!(
                    !(i64::from(landed.slot) == i64::from(*slot) && landed.key != *key && !taken_over),
                    "class {} slot {} proposed for {} but held by landed {}",
                    class, slot, key, landed.key
                );
            }
        }
    }

    /// (g) No return link before its claim has landed: every link a node builds is a landed claim
    /// of its class for the pair (this node, peer), at the link's slot.
    #[test]
    fn links_only_for_landed_claims(m in model()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            for link in &p.host_state.links {
                let class = class_of(&snap, &link.class);
                let claims = claims_of(&snap, &link.class);
                let key = pair_key(node, &link.peer);
                let slot = i64::from(link.vni) - i64::from(class.spec.return_path.vxlan.vni);
                prop_assert!(
                    claims.iter().any(|c| c.key == key && i64::from(c.slot) == slot),
                    "node {} builds {:?} without a landed claim {} at slot {} (claims {:?})",
                    node, link, key, slot, claims
                );
            }
        }
    }

    /// (i) Proposals land: when every node writes what it planned from one snapshot, each pair
    /// proposed holds a landed claim afterwards, as the plan reads the class again. The plan hands
    /// each free slot to one pair and no write of the round takes a slot the plan saw free, so
    /// nothing may keep a proposal out: one that never lands leaves its pair without a link for
    /// good. The claim need not sit at the proposed slot: a GC drop in the same round can make
    /// the pair's own entry, ignored while it shared its slot with an earlier key, count again,
    /// and then that entry's slot is the one that counts.
    #[test]
    fn proposals_land_when_written(m in model(), seed in any::<u64>()) {
        let mut snap = snapshot(&m);
        let mut plans: Vec<Plan> = m.nodes.iter().map(|n| plan_of(&m, &snap, n.name)).collect();
        Rng(seed).shuffle(&mut plans);
        for p in &plans {
            write_status(&mut snap, p);
        }
        for p in plans.iter().filter(|p| !p.writes.claims.is_empty()) {
            let again = plan_of(&m, &snap, &p.node);
            for claim in &p.writes.claims {
                let landed = again
                    .classes
                    .iter()
                    .filter(|c| c.name == claim.class)
                    .flat_map(|c| &c.links)
                    .any(|l| l.key == claim.key && l.landed);
                prop_assert!(
                    landed,
                    "node {} proposed {} at slot {} in class {}, which did not land: {:?}",
                    p.node, claim.key, claim.slot, claim.class, claims_of(&snap, &claim.class)
                );
            }
        }
    }
}
