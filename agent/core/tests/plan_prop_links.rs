//! Property tests of return-link claims: unique slots per class, no link before its claim has
//! landed, proposals that land once written; and of the links' IPv6 ends: only where an IPv6
//! mapping crosses, inside the class's IPv6 prefix, unique.
//!
//! The cluster model is in `common/model.rs`, its objects in `common/inputs.rs`, the
//! oracles in `common/oracles.rs`; cases per property:
//! `KUPORT_PROPTEST_CASES` (default 1000).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;

use ipnet::Ipv6Net;
use kuport_core::ir::Link;
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

/// Why `link` on `node` may not carry IPv6 ends, if it may not: no mapping served over IPv6
/// crosses it (emitted, of its class, with the link among its serving or standby links and
/// the pod on one of its ends).
fn ipv6_uncalled_for(p: &Plan, node: &str, link: &Link) -> Option<String> {
    let key = pair_key(node, &link.peer);
    let crossing = p.portmaps.iter().any(|d| {
        let Some(ep) = d.endpoint.as_ref().filter(|e| e.v6().is_some()) else {
            return false;
        };
        d.emits
            && d.class.as_str() == link.class
            && (ep.node.as_str() == node || ep.node.as_str() == link.peer)
            && d.links
                .iter()
                .chain(&d.standby_links)
                .any(|l| l.key.as_str() == key)
    });
    (!crossing).then(|| format!("no IPv6 mapping crosses {key} in class {}", link.class))
}

/// What is wrong with the IPv6 ends of `link`: one end without the other, not a /127, outside
/// the class's `returnPath.vxlan.ipv6Subnet`, or not the class prefix with the IPv4 end as its
/// low 32 bits.
fn ipv6_end_faults(snap: &kuport_core::snapshot::Snapshot, link: &Link) -> Option<String> {
    let (own, peer) = match (link.address6, link.peer_address6) {
        (None, None) => return None,
        (Some(own), Some(peer)) => (own, peer),
        _ => return Some("one IPv6 end without the other".to_owned()),
    };
    let prefix: Ipv6Net = class_of(snap, &link.class)
        .spec
        .return_path
        .vxlan
        .subnet6
        .trim()
        .parse()
        .ok()?;
    let low = |a: Ipv6Addr| u128::from(a) as u32;
    let faults = [
        (own.prefix_len() != 127, "not a /127"),
        (
            !prefix.contains(&own.addr()) || !prefix.contains(&peer),
            "outside the class prefix",
        ),
        (
            low(own.addr()) != u32::from(link.address.addr()),
            "own end not the IPv4 end",
        ),
        (
            low(peer) != u32::from(link.peer_address),
            "peer end not the IPv4 end",
        ),
    ];
    let said: Vec<&str> = faults
        .iter()
        .filter(|(bad, _)| *bad)
        .map(|(_, s)| *s)
        .collect();
    (!said.is_empty()).then(|| format!("{} (prefix {prefix})", said.join(", ")))
}

proptest! {
    #![proptest_config(config())]

    /// (j) A link gets IPv6 ends only where a mapping served over IPv6 crosses it; they are the
    /// class's `returnPath.vxlan.ipv6Subnet` with the IPv4 ends as their low bits (a /127,
    /// both ends inside the prefix); and no IPv6 end is another's: on all nodes together, each
    /// address is one node's own end of one link, and never a peer end on that same node.
    #[test]
    fn link_ipv6_ends_only_where_ipv6_crosses(m in linked_model()) {
        let snap = snapshot(&m);
        let mut own_ends: BTreeMap<Ipv6Addr, (String, String)> = BTreeMap::new();
        let mut peer_ends: BTreeSet<(String, Ipv6Addr)> = BTreeSet::new();
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            for link in p.host_state.links.iter().filter(|l| l.address6.is_some() || l.peer_address6.is_some()) {
                if let Some(why) = ipv6_uncalled_for(&p, node, link) {
                    prop_assert!(false, "node {}: {} has IPv6 ends: {}", node, link.name, why);
                }
                if let Some(fault) = ipv6_end_faults(&snap, link) {
                    prop_assert!(false, "node {}: {:?}: {}", node, link, fault);
                }
                let (Some(own), Some(peer)) = (link.address6, link.peer_address6) else { continue };
                let holder = (node.to_owned(), link.name.clone());
                if let Some(other) = own_ends.insert(own.addr(), holder.clone()) {
                    prop_assert!(false, "{} is the own end of both {:?} and {:?}", own.addr(), other, holder);
                }
                peer_ends.insert((node.to_owned(), peer));
            }
        }
        for (node, peer) in &peer_ends {
            let clash = own_ends.get(peer).filter(|(n, _)| n == node);
            prop_assert!(clash.is_none(), "node {}: {} is both a peer end and its own end {:?}", node, peer, clash);
        }
    }
}

/// The checker itself: IPv6 ends that are not the IPv4 ends in the class prefix are told.
#[test]
fn an_ipv6_end_fault_is_told() {
    let class = kuport_testkit::objects::class(
        "public",
        serde_json::json!({"nodes": {"a": {"interfaces": ["eth0"]}},
            "returnPath": {"mode": "Vxlan", "vxlan": {"subnet": "169.254.77.0/24"}}}),
    )
    .object();
    let snap = kuport_core::snapshot::Snapshot {
        classes: vec![serde_json::from_value(class).expect("class")],
        ..Default::default()
    };
    let link = |own: &str, peer: &str| Link {
        name: "kup-x".to_owned(),
        class: "public".to_owned(),
        peer: "b".to_owned(),
        vni: 4242,
        port: 4790,
        device: None,
        local: "10.0.0.1".parse().expect("ip"),
        remote: "10.0.0.2".parse().expect("ip"),
        address: "169.254.77.0/31".parse().expect("net"),
        peer_address: "169.254.77.1".parse().expect("ip"),
        address6: Some(Ipv6Net::new(own.parse().expect("ipv6"), 127).expect("net")),
        peer_address6: Some(peer.parse().expect("ipv6")),
        mtu: None,
        mark: 2,
        ttl: 64,
        rp_filter: 2,
    };
    assert_eq!(
        ipv6_end_faults(&snap, &link("fd6b:7570::a9fe:4d00", "fd6b:7570::a9fe:4d01")),
        None
    );
    assert!(
        ipv6_end_faults(&snap, &link("fd6b:7570::a9fe:4d02", "fd6b:7570::a9fe:4d01")).is_some()
    );
    assert!(ipv6_end_faults(&snap, &link("fd00::a9fe:4d00", "fd6b:7570::a9fe:4d01")).is_some());
}
