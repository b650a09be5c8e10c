//! Binding sets and port holdings for conflict detection.
//!
//! A mapping can bind the (node, interface) pairs its class gives, narrowed by its own interface
//! list. Two mappings conflict when their port ranges overlap on a pair both can bind.
//!
//! Pairs are grouped into atoms: the pairs of one interface name that the same classes give
//! (for example every node of class `public` carrying `enp1s0`, none of which another class
//! names with it). A mapping's pairs are always whole atoms, since narrowing is by interface
//! name, so two mappings share a pair exactly when they share an atom. Holdings are therefore
//! kept per (protocol, atom), each an interval map of disjoint accepted ranges, and a mapping is
//! checked against the few atoms of its own pairs. The atoms come from the classes alone (what
//! the administrator wrote), so what tenants write in their lists never multiplies the work:
//! memory and time grow with the mappings times the atoms of each, whatever the lists.
//!
//! Mappings whose narrowing comes to the same pairs also share one binding set (the interface
//! names each node binds, which resolution reuses), interned by those pairs rather than by how
//! the list was spelled.

use std::collections::{BTreeMap, BTreeSet};

use super::fast_hash::FastMap;
use crate::api::{PortMapClass, Protocol};
use crate::ir::PortRange;

/// Identifies a distinct binding set.
pub type SetId = usize;

/// Identifies an atom: pairs of one interface name given by the same classes.
type AtomId = usize;

/// One distinct binding set.
pub struct BindingSet {
    /// Interface names each node binds (every node the class names; possibly empty lists).
    pub by_node: BTreeMap<String, Vec<String>>,
    /// The atoms its pairs make up, by ascending smallest pair.
    atoms: Vec<AtomId>,
}

/// Interned binding sets and the holdings of accepted mappings.
#[derive(Default)]
pub struct Bindings {
    /// node → interface → id, ids in sorted order of the pair (looked up by borrowed names).
    pair_ids: BTreeMap<String, BTreeMap<String, u32>>,
    pairs: Vec<(String, String)>,
    /// Each pair's atom.
    pair_atom: Vec<AtomId>,
    /// Each atom's smallest pair: where a conflict on the atom is reported.
    atom_first_pair: Vec<u32>,
    sets: Vec<BindingSet>,
    /// Sets by class and atoms: two spellings of one narrowing share a set.
    by_atoms: FastMap<(String, Vec<AtomId>), SetId>,
    /// Sets of mappings that narrow the class's interfaces, by class and sorted, deduplicated
    /// interface list: a list seen before costs one lookup.
    narrowed: FastMap<(String, Vec<String>), SetId>,
    /// Sets of mappings that narrow nothing, by class: the common case, looked up without
    /// allocating.
    whole_class: FastMap<String, SetId>,
    /// Every interface some node of the class carries, per class.
    offered: BTreeMap<String, BTreeSet<String>>,
    /// Accepted ranges per protocol, indexed by atom (empty for an atom that holds nothing).
    holdings: BTreeMap<Protocol, Vec<Held>>,
}

/// The accepted ranges of one (protocol, atom).
#[derive(Default)]
struct Held {
    /// First port → (last port, holder). A holder is the mapping's position in conflict order
    /// ([`Holder`]): its name is only written out for the few mappings refused for a conflict.
    ranges: BTreeMap<u16, (u16, Holder)>,
    /// Every held port as a bit, for the first [`ATOMS_WITH_BITS`] atoms: nearly every mapping
    /// asks for ports no other mapping holds, and a bit test says so without searching the
    /// ranges (the search was most of admitting a mapping).
    bits: Option<PortBits>,
}

/// How many atoms (per protocol) keep their held ports as bits: 8 KiB each, so classes with
/// hundreds of atoms still spend at most 1 MiB on them.
const ATOMS_WITH_BITS: AtomId = 64;

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
    /// Interns every (node, interface) pair the classes name, in sorted order, and groups
    /// them into atoms.
    pub fn new<'a>(classes: impl Iterator<Item = &'a PortMapClass>) -> Self {
        // Each pair with the classes that give it (classes come in any order: sorted below).
        let mut givers: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
        for class in classes {
            let class_name = class.metadata.name.as_deref().unwrap_or_default();
            for (node, spec) in &class.spec.nodes {
                for iface in &spec.interfaces {
                    givers
                        .entry((node.clone(), iface.clone()))
                        .or_default()
                        .push(class_name);
                }
            }
        }
        let mut bindings = Bindings::default();
        // Atoms numbered by their smallest pair, as pairs come in sorted order.
        let mut atom_of: BTreeMap<(String, Vec<&str>), AtomId> = BTreeMap::new();
        for (id, ((node, iface), mut classes)) in (0u32..).zip(givers) {
            classes.sort_unstable();
            classes.dedup();
            let next = atom_of.len();
            let atom = *atom_of.entry((iface.clone(), classes)).or_insert(next);
            if atom == next {
                bindings.atom_first_pair.push(id);
            }
            bindings.pair_atom.push(atom);
            bindings
                .pair_ids
                .entry(node.clone())
                .or_default()
                .insert(iface.clone(), id);
            bindings.pairs.push((node, iface));
        }
        bindings
    }

    /// The binding set of a mapping in `class` asking for `requested` interfaces.
    pub fn set_of(
        &mut self,
        class_name: &str,
        class: &PortMapClass,
        requested: &[String],
    ) -> SetId {
        if requested.is_empty() {
            if let Some(id) = self.whole_class.get(class_name) {
                return *id;
            }
            let id = self.intern(class_name, class, &BTreeSet::new());
            self.whole_class.insert(class_name.to_owned(), id);
            return id;
        }
        let mut wanted: Vec<String> = requested.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let key = (class_name.to_owned(), wanted);
        if let Some(id) = self.narrowed.get(&key) {
            return *id;
        }
        let filter: BTreeSet<&str> = key.1.iter().map(String::as_str).collect();
        let id = self.intern(class_name, class, &filter);
        self.narrowed.insert(key, id);
        id
    }

    /// The set of the class's pairs whose interface `filter` names (every pair when empty),
    /// made when no set of the class has those pairs yet.
    fn intern(&mut self, class_name: &str, class: &PortMapClass, filter: &BTreeSet<&str>) -> SetId {
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
        let mut atoms: Vec<AtomId> = ids
            .iter()
            .filter_map(|pair| self.pair_atom.get(*pair as usize).copied())
            .collect();
        // Atoms are numbered by their smallest pair: ascending ids are ascending first pairs.
        atoms.sort_unstable();
        atoms.dedup();
        let key = (class_name.to_owned(), atoms);
        if let Some(id) = self.by_atoms.get(&key) {
            return *id;
        }
        let id = self.sets.len();
        self.sets.push(BindingSet {
            by_node,
            atoms: key.1.clone(),
        });
        self.by_atoms.insert(key, id);
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

    /// The conflict a new range would have: among held ranges of the same protocol on a
    /// (node, interface) `set` shares, the one on the smallest shared pair (then the highest
    /// first port). `None` when the range is free.
    pub fn conflict(&self, protocol: Protocol, set: SetId, ports: PortRange) -> Option<Conflict> {
        let held = self.holdings.get(&protocol)?;
        // The set's atoms by ascending smallest pair: the first with an overlapping range is
        // the one on the smallest shared pair (the whole atom is shared).
        let (atom, (theirs, holder)) = self.sets[set]
            .atoms
            .iter()
            .find_map(|atom| Some((*atom, held.get(*atom)?.overlapping(ports)?)))?;
        let pair = self.atom_first_pair[atom];
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

    /// Records an accepted range on every atom of `set`.
    pub fn hold(&mut self, protocol: Protocol, set: SetId, ports: PortRange, holder: Holder) {
        let Some(binding) = self.sets.get(set) else {
            return;
        };
        let held = self.holdings.entry(protocol).or_default();
        for atom in binding.atoms.iter().copied() {
            if held.len() <= atom {
                held.resize_with(atom + 1, Held::default);
            }
            if let Some(held) = held.get_mut(atom) {
                held.ranges.insert(ports.first, (ports.last, holder));
                if atom < ATOMS_WITH_BITS {
                    held.bits.get_or_insert_with(PortBits::new).set(ports);
                }
            }
        }
    }
}

impl Held {
    /// The held range overlapping `ports` with the highest first port, and its holder.
    fn overlapping(&self, ports: PortRange) -> Option<(PortRange, Holder)> {
        if self.bits.as_ref().is_some_and(|bits| !bits.any(ports)) {
            return None;
        }
        // Held ranges in one set are disjoint: walk back from the last one starting at or
        // before our last port while they could still reach our first port.
        for (first, (last, by)) in self.ranges.range(..=ports.last).rev() {
            let theirs = PortRange {
                first: *first,
                last: *last,
            };
            if theirs.overlaps(&ports) {
                return Some((theirs, *by));
            }
            if *last < ports.first {
                return None;
            }
        }
        None
    }
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

    /// Class `name` with nodes `nodes`, each carrying the interfaces `ifaces`.
    fn class_on(name: &str, nodes: std::ops::Range<usize>, ifaces: &[&str]) -> PortMapClass {
        let nodes: serde_json::Map<String, serde_json::Value> = nodes
            .map(|n| (format!("n{n}"), serde_json::json!({"interfaces": ifaces})))
            .collect();
        PortMapClass::new(
            name,
            serde_json::from_value(
                serde_json::json!({"nodes": nodes, "returnPath": {"mode": "None"}}),
            )
            .expect("a class spec"),
        )
    }

    fn class(ifaces: &[&str]) -> PortMapClass {
        class_on("c", 0..3, ifaces)
    }

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    impl Bindings {
        /// The sorted pair ids of a set, from the interface names it binds.
        fn pair_ids_of(&self, set: SetId) -> Vec<u32> {
            let mut ids: Vec<u32> = self.sets[set]
                .by_node
                .iter()
                .flat_map(|(node, ifaces)| {
                    ifaces
                        .iter()
                        .filter_map(move |i| self.pair_ids.get(node)?.get(i).copied())
                })
                .collect();
            ids.sort_unstable();
            ids
        }
    }

    #[test]
    fn lists_narrowing_to_the_same_pairs_share_one_set() {
        let class = class(&["eth0", "wg0"]);
        let mut bindings = Bindings::new(std::iter::once(&class));
        let whole = bindings.set_of("c", &class, &[]);
        // Thousands of distinct spellings: names no node carries, repeats, any order.
        for i in 0..2000 {
            let junk = format!("j{i:05}");
            let id = bindings.set_of("c", &class, &list(&["eth0", &junk]));
            let again = bindings.set_of("c", &class, &list(&[&junk, "eth0", "eth0"]));
            assert_eq!(id, again);
            let both = bindings.set_of("c", &class, &list(&["wg0", "eth0", &junk]));
            assert_eq!(both, whole, "both interfaces are the whole class");
        }
        // The whole class, eth0 alone: two sets, whatever the lists said.
        assert_eq!(bindings.sets.len(), 2);
        // Two atoms: eth0 and wg0 of the three nodes.
        assert_eq!(bindings.atom_first_pair.len(), 2);
    }

    #[test]
    fn atoms_split_where_classes_part() {
        // Class c gives n0..n2 eth0; class d gives n2..n4 eth0: n2's eth0 is both's.
        let c = class_on("c", 0..3, &["eth0"]);
        let d = class_on("d", 2..5, &["eth0"]);
        let bindings = Bindings::new([&c, &d].into_iter());
        // n0-n1 (c only), n2 (both), n3-n4 (d only).
        assert_eq!(bindings.atom_first_pair.len(), 3);
        assert_eq!(bindings.pair_atom, [0, 0, 1, 2, 2]);
    }

    proptest! {
        /// The atom index finds the conflict a naive walk over every held range finds: among
        /// held ranges of sets sharing a pair with the asked set, the one on the smallest
        /// shared pair, then the highest first port; in two classes that share some nodes.
        #[test]
        fn the_conflict_found_is_the_naive_one(
            asks in proptest::collection::vec(
                (
                    proptest::bool::ANY,
                    proptest::sample::subsequence(vec!["a", "b", "c", "d"], 0..=4),
                    1000u16..1040,
                    0u16..8,
                ),
                1..40,
            ),
        ) {
            let c = class_on("c", 0..3, &["a", "b", "c", "d"]);
            let e = class_on("e", 1..4, &["b", "c"]);
            let mut bindings = Bindings::new([&e, &c].into_iter());
            // What a naive check compares: each accepted range with its set's pairs.
            let mut accepted: Vec<(Vec<u32>, PortRange, Holder)> = Vec::new();
            for (holder, (in_e, ifaces, first, len)) in asks.into_iter().enumerate() {
                let ports = PortRange { first, last: first + len };
                let (name, class) = if in_e { ("e", &e) } else { ("c", &c) };
                let set = bindings.set_of(name, class, &list(&ifaces));
                let ids = bindings.pair_ids_of(set);
                let naive = accepted
                    .iter()
                    .filter(|(_, theirs, _)| theirs.overlaps(&ports))
                    .filter_map(|(their_ids, theirs, by)| {
                        let shared = ids.iter().find(|id| their_ids.contains(id))?;
                        Some((*shared, std::cmp::Reverse(theirs.first), *by))
                    })
                    .min();
                let found = bindings
                    .conflict(Protocol::Udp, set, ports)
                    .map(|c| (c.holder, (c.node, c.iface)));
                let expected = naive.map(|(pair, _, by)| (by, bindings.pairs[pair as usize].clone()));
                prop_assert_eq!(found.clone(), expected);
                if found.is_none() {
                    bindings.hold(Protocol::Udp, set, ports, holder);
                    if !ids.is_empty() {
                        accepted.push((ids, ports, holder));
                    }
                }
            }
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
