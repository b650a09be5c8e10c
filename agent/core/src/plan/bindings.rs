//! Binding sets and port holdings for conflict detection.
//!
//! A mapping can bind the (node, interface) pairs its class gives, narrowed by its own interface
//! list. Mappings with the same class and the same narrowing share one binding set, and a
//! cluster has few distinct sets. Holdings are therefore kept per (protocol, set): a new mapping
//! is checked only against the sets that intersect its own, each an interval map of disjoint
//! accepted ranges, so admission costs O(log n) per intersecting set instead of one lookup per
//! (node, interface) of the class.

use std::collections::{BTreeMap, BTreeSet};

use super::fast_hash::FastMap;
use crate::api::{PortMapClass, Protocol};
use crate::ir::PortRange;

/// Identifies a distinct binding set.
pub type SetId = usize;

/// One distinct binding set.
pub struct BindingSet {
    /// Interface names each node binds (every node the class names; possibly empty lists).
    pub by_node: BTreeMap<String, Vec<String>>,
    /// The (node, interface) pairs, as sorted ids.
    ids: Vec<u32>,
    /// The sets sharing a pair with this one (itself included when it has a pair), by
    /// ascending id, each with the smallest pair id they share: all a conflict check walks.
    /// Kept up to date as sets are interned, so no check compares two sets' pairs.
    neighbours: Vec<(SetId, u32)>,
}

/// Interned binding sets and the holdings of accepted mappings.
#[derive(Default)]
pub struct Bindings {
    /// node → interface → id, ids in sorted order of the pair (looked up by borrowed names).
    pair_ids: BTreeMap<String, BTreeMap<String, u32>>,
    pairs: Vec<(String, String)>,
    sets: Vec<BindingSet>,
    /// Sets of mappings that narrow the class's interfaces, by class: each with its sorted,
    /// deduplicated interface list. A class has few, so a walk finds one without building a
    /// key.
    narrowed: FastMap<String, Vec<(Vec<String>, SetId)>>,
    /// Sets of mappings that narrow nothing, by class: the common case, looked up without
    /// allocating.
    whole_class: FastMap<String, SetId>,
    /// Every interface some node of the class carries, per class.
    offered: BTreeMap<String, BTreeSet<String>>,
    /// Accepted ranges per protocol, indexed by set (empty for a set that holds nothing): first
    /// port → (last port, holder).
    holdings: BTreeMap<Protocol, Vec<Held>>,
}

/// The accepted ranges of one (protocol, set).
#[derive(Default)]
struct Held {
    /// First port → (last port, holder). A holder is the mapping's position in conflict order
    /// ([`Holder`]): its name is only written out for the few mappings refused for a conflict.
    ranges: BTreeMap<u16, (u16, Holder)>,
    /// Every held port as a bit, for the first [`SETS_WITH_BITS`] sets: nearly every mapping
    /// asks for ports no other mapping holds, and a bit test says so without searching the
    /// ranges (the search was most of admitting a mapping).
    bits: Option<PortBits>,
}

/// How many sets (per protocol) keep their held ports as bits: 8 KiB each, so a pass with
/// thousands of distinct sets still spends at most 1 MiB on them.
const SETS_WITH_BITS: SetId = 64;

/// One bit per port number.
struct PortBits(Box<[u64]>);

impl PortBits {
    const WORDS: usize = (u16::MAX as usize + 1) / 64;

    fn new() -> Self {
        Self(vec![0; Self::WORDS].into_boxed_slice())
    }

    fn set(&mut self, ports: PortRange) {
        for port in ports.first..=ports.last {
            let (word, bit) = (usize::from(port) / 64, port % 64);
            if let Some(w) = self.0.get_mut(word) {
                *w |= 1 << bit;
            }
        }
    }

    /// Whether any port of `ports` is set.
    fn any(&self, ports: PortRange) -> bool {
        let (first, last) = (usize::from(ports.first), usize::from(ports.last));
        (first / 64..=last / 64).any(|word| {
            let low = if word == first / 64 { first % 64 } else { 0 };
            let high = if word == last / 64 { last % 64 } else { 63 };
            // Bits low..=high of the word.
            let mask = (u64::MAX >> (63 - high)) & (u64::MAX << low);
            self.0.get(word).is_some_and(|w| w & mask != 0)
        })
    }
}

/// A mapping holding ports: its position among the index's PortMaps (in conflict order).
pub type Holder = usize;

/// A conflict: who holds which ports, and one (node, interface) both could bind.
pub struct Conflict {
    pub holder: Holder,
    pub shared_ports: PortRange,
    pub node: String,
    pub iface: String,
}

impl Bindings {
    /// Interns every (node, interface) pair the classes name, in sorted order.
    pub fn new<'a>(classes: impl Iterator<Item = &'a PortMapClass>) -> Self {
        let mut all = BTreeSet::new();
        for class in classes {
            for (node, spec) in &class.spec.nodes {
                for iface in &spec.interfaces {
                    all.insert((node.clone(), iface.clone()));
                }
            }
        }
        let pairs: Vec<(String, String)> = all.into_iter().collect();
        let mut pair_ids: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
        for (id, (node, iface)) in (0u32..).zip(&pairs) {
            pair_ids
                .entry(node.clone())
                .or_default()
                .insert(iface.clone(), id);
        }
        Bindings {
            pair_ids,
            pairs,
            ..Default::default()
        }
    }

    /// The binding set of a mapping in `class` asking for `requested` interfaces.
    pub fn set_of(
        &mut self,
        class_name: &str,
        class: &PortMapClass,
        requested: &[String],
    ) -> SetId {
        if let (true, Some(id)) = (requested.is_empty(), self.whole_class.get(class_name)) {
            return *id;
        }
        let mut wanted: Vec<&str> = requested.iter().map(String::as_str).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let known = self.narrowed.get(class_name).and_then(|sets| {
            sets.iter()
                .find(|(ifaces, _)| ifaces.iter().map(String::as_str).eq(wanted.iter().copied()))
        });
        if let (false, Some((_, id))) = (requested.is_empty(), known) {
            return *id;
        }
        let filter: BTreeSet<&str> = wanted.iter().copied().collect();
        let mut by_node = BTreeMap::new();
        let mut ids = Vec::new();
        for (node, spec) in &class.spec.nodes {
            let mut ifaces: Vec<String> = spec
                .interfaces
                .iter()
                .filter(|i| filter.is_empty() || filter.contains(i.as_str()))
                .cloned()
                .collect();
            ifaces.sort();
            ifaces.dedup();
            let node_ids = self.pair_ids.get(node);
            ids.extend(
                ifaces
                    .iter()
                    .filter_map(|iface| node_ids.and_then(|n| n.get(iface)).copied()),
            );
            by_node.insert(node.clone(), ifaces);
        }
        ids.sort_unstable();
        let id = self.sets.len();
        let mut neighbours = Vec::new();
        for (other, set) in self.sets.iter_mut().enumerate() {
            if let Some(pair) = first_shared(&ids, &set.ids) {
                set.neighbours.push((id, pair));
                neighbours.push((other, pair));
            }
        }
        if let Some(first) = ids.first() {
            neighbours.push((id, *first));
        }
        self.sets.push(BindingSet {
            by_node,
            ids,
            neighbours,
        });
        if requested.is_empty() {
            self.whole_class.insert(class_name.to_owned(), id);
        } else {
            let wanted = wanted.into_iter().map(str::to_owned).collect();
            self.narrowed
                .entry(class_name.to_owned())
                .or_default()
                .push((wanted, id));
        }
        id
    }

    /// The first requested interface no node of the class carries.
    pub fn first_unoffered<'r>(
        &mut self,
        class_name: &str,
        class: &PortMapClass,
        requested: &'r [String],
    ) -> Option<&'r str> {
        if requested.is_empty() {
            return None;
        }
        if !self.offered.contains_key(class_name) {
            let all = class
                .spec
                .nodes
                .values()
                .flat_map(|n| n.interfaces.iter().cloned())
                .collect();
            self.offered.insert(class_name.to_owned(), all);
        }
        let offered = self.offered.get(class_name)?;
        let mut wanted: Vec<&str> = requested.iter().map(String::as_str).collect();
        wanted.sort_unstable();
        wanted.into_iter().find(|i| !offered.contains(*i))
    }

    pub fn set(&self, id: SetId) -> &BindingSet {
        &self.sets[id]
    }

    /// The conflict a new range would have: among held ranges of the same protocol in sets
    /// sharing a (node, interface) with `set`, the one on the smallest shared pair (then the
    /// highest first port). `None` when the range is free.
    pub fn conflict(&self, protocol: Protocol, set: SetId, ports: PortRange) -> Option<Conflict> {
        let held = self.holdings.get(&protocol)?;
        let mut best: Option<(u32, std::cmp::Reverse<u16>, Holder, PortRange)> = None;
        for (other, pair) in self.sets[set].neighbours.iter().copied() {
            let Some(held) = held.get(other) else {
                continue;
            };
            if held.bits.as_ref().is_some_and(|bits| !bits.any(ports)) {
                continue;
            }
            // Held ranges in one set are disjoint: walk back from the last one starting at or
            // before our last port while they could still reach our first port.
            for (first, (last, by)) in held.ranges.range(..=ports.last).rev() {
                let theirs = PortRange {
                    first: *first,
                    last: *last,
                };
                if theirs.overlaps(&ports) {
                    let candidate = (pair, std::cmp::Reverse(*first), *by, theirs);
                    if best
                        .as_ref()
                        .is_none_or(|b| (candidate.0, candidate.1) < (b.0, b.1))
                    {
                        best = Some(candidate);
                    }
                    break;
                }
                if *last < ports.first {
                    break;
                }
            }
        }
        let (pair, _, holder, theirs) = best?;
        let (node, iface) = self.pairs[pair as usize].clone();
        let shared_ports = PortRange {
            first: ports.first.max(theirs.first),
            last: ports.last.min(theirs.last),
        };
        Some(Conflict {
            holder,
            shared_ports,
            node,
            iface,
        })
    }

    /// Records an accepted range.
    pub fn hold(&mut self, protocol: Protocol, set: SetId, ports: PortRange, holder: Holder) {
        if self.sets[set].ids.is_empty() {
            return;
        }
        let held = self.holdings.entry(protocol).or_default();
        if held.len() <= set {
            held.resize_with(set + 1, Held::default);
        }
        if let Some(held) = held.get_mut(set) {
            held.ranges.insert(ports.first, (ports.last, holder));
            if set < SETS_WITH_BITS {
                held.bits.get_or_insert_with(PortBits::new).set(ports);
            }
        }
    }
}

/// The smallest id in both sorted lists.
fn first_shared(x: &[u32], y: &[u32]) -> Option<u32> {
    let (mut i, mut j) = (0, 0);
    while i < x.len() && j < y.len() {
        match x[i].cmp(&y[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return Some(x[i]),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The bit test says a port range is held exactly when one of its ports was set,
        /// ranges crossing word boundaries and the highest port included.
        #[test]
        fn port_bits_tell_held_ports(
            held in proptest::collection::vec((prop_oneof![0u16..600, 65_000u16..], 0u16..100), 0..12),
            asked in (prop_oneof![0u16..600, 65_000u16..], 0u16..100),
        ) {
            let range = |(first, len): (u16, u16)| PortRange {
                first,
                last: first.saturating_add(len),
            };
            let mut bits = PortBits::new();
            let mut naive = BTreeSet::new();
            for h in held.iter().copied().map(range) {
                bits.set(h);
                naive.extend(h.first..=h.last);
            }
            let asked = range(asked);
            let expected = (asked.first..=asked.last).any(|p| naive.contains(&p));
            prop_assert_eq!(bits.any(asked), expected);
        }
    }

    #[test]
    fn port_bits_edges() {
        let mut bits = PortBits::new();
        let one = |p| PortRange { first: p, last: p };
        bits.set(one(63));
        bits.set(one(u16::MAX));
        assert!(bits.any(one(63)));
        assert!(!bits.any(one(62)) && !bits.any(one(64)));
        assert!(bits.any(PortRange { first: 0, last: 63 }));
        assert!(bits.any(PortRange {
            first: 60,
            last: 200
        }));
        assert!(!bits.any(PortRange {
            first: 64,
            last: 65534
        }));
        assert!(bits.any(one(u16::MAX)));
    }
}
