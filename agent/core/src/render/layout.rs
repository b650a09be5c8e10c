//! kuport's table as the kernel holds it. The IR lists one rule per mapping and interface; the
//! kernel gets a constant handful of rules per chain that look the packet up in sets and maps,
//! and every mapping becomes elements of those (the way kube-proxy's nftables mode does it). A
//! new flow then costs a few hash lookups whatever the number of mappings, and a change is a
//! few element adds and deletes instead of a rewritten chain.
//!
//! Which sets and maps exist follows from the rules' shapes: the flow mark a rule writes or
//! matches (none on a pod's node, where the arrival link's mark is in the flow already) and
//! whether it covers one port (a hash map) or a range (an interval map, which costs the kernel
//! far more per element, so single ports never go there). Per-mapping counters stay exact:
//! the DNAT and SNAT rules count through a map from the same key to the mapping's named counter.
//!
//! [`Layout`] is compared, not text: the kernel lists hash-map elements in its own order, so a
//! listing is parsed ([`parse_listing`]) and the element sets compared.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::ir::{ChainId, Family, HairpinRule, MarkLayout, NftTable, PortRange, Rule, TABLE};

use super::{
    HAIRPIN_EXTERNAL, HAIRPIN_SOURCES, NEW_FLOW, masked_cmp, masked_eq, masked_set, quote,
    rule_text, symbolic_priority,
};

/// A set or a map of kuport's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Store {
    /// True for a map (elements have a value), false for a set.
    pub map: bool,
    /// The type as nft lists it (`ifname . inet_proto . inet_service : counter`).
    pub type_text: String,
    /// The `flags` line's text, empty when none (`interval` for ranges).
    pub flags: String,
    /// Anything else nft listed in the block (kuport writes nothing else): a difference here
    /// means someone changed the store.
    pub extra: Vec<String>,
    /// Elements: key → value as nft lists them (the value is empty in a set).
    pub elements: BTreeMap<String, String>,
}

/// A chain of kuport's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// The base chain's `type … hook … priority …; policy …;` line as nft lists it; empty for a
    /// chain without a hook (kuport has none).
    pub header: String,
    /// Rule lines as nft lists them.
    pub rules: Vec<String>,
}

/// kuport's table: what is compared with the kernel and diffed into a transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// The table's family (`ip kuport`, `ip6 kuport`): kept by an empty layout too, so a
    /// transaction to it deletes the right table.
    pub family: Family,
    /// Named counters.
    pub counters: BTreeSet<String>,
    /// Sets and maps by name.
    pub stores: BTreeMap<String, Store>,
    /// Chains by name.
    pub chains: BTreeMap<String, Chain>,
    /// Table-level lines nft listed that kuport never writes (flags, comment).
    pub extra: Vec<String>,
}

impl Layout {
    /// True when the node needs no table (of this family).
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty() && self.stores.is_empty() && self.chains.is_empty()
    }

    /// An empty layout of `family`.
    pub fn empty(family: Family) -> Self {
        Self {
            family,
            ..Self::default()
        }
    }

    /// Elements across every store.
    pub fn element_count(&self) -> usize {
        self.stores.values().map(|s| s.elements.len()).sum()
    }
}

/// Which mapping (`namespace/name`) each element and counter of a [`Layout`] belongs to: nft
/// reports a refused line by number, and a refusal must stop only its own mapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owners {
    /// (store, key) → mapping.
    pub elements: BTreeMap<(String, String), String>,
    /// Counter name → mapping.
    pub counters: BTreeMap<String, String>,
}

/// The table the kernel should hold for `table`, and who owns each element.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Planned {
    /// The layout.
    pub layout: Layout,
    /// Owners of its elements and counters.
    pub owners: Owners,
}

/// How many ports a rule's element covers: one (a hash map) or a range (an interval map).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Width {
    Port,
    Range,
}

impl Width {
    fn of(ports: PortRange) -> Self {
        if ports.is_range() {
            Width::Range
        } else {
            Width::Port
        }
    }

    fn label(self) -> &'static str {
        match self {
            Width::Port => "port",
            Width::Range => "range",
        }
    }

    fn flags(self) -> &'static str {
        match self {
            Width::Port => "",
            Width::Range => "interval",
        }
    }
}

/// `link` for no mark (a pod's node: the arrival link's mark is in the flow), else the mark.
fn mark_tag(mark: Option<u32>) -> String {
    match mark {
        None => "link".to_owned(),
        Some(mark) => format!("mark-{mark:#010x}"),
    }
}

const PRE_KEY: &str = "iifname . meta l4proto . th dport";
const PRE_TYPE: &str = "ifname . inet_proto . inet_service";

/// The family-specific words of the lookups, written once per table.
struct Words {
    /// `ip` or `ip6`.
    ip: &'static str,
    /// The stand-in address.
    stand_in: std::net::IpAddr,
    steer_key: String,
    steer_type: String,
    /// The identity SNAT's key; a hairpin element's key is the same (the published address as
    /// the packet carries it before steering).
    daddr_key: String,
    daddr_type: String,
    /// A hairpin key after steering moved the packet to the stand-in: conntrack's original
    /// tuple.
    hairpin_original_key: String,
    /// A DNAT target's type: address and port, or the address alone (a range keeps its ports).
    to_port_type: String,
    to_type: &'static str,
}

impl Words {
    fn of(family: Family) -> Self {
        let ip = family.nft();
        let addr = family.addr_type();
        Self {
            ip,
            stand_in: family.stand_in(),
            steer_key: format!("iifname . {ip} daddr . meta l4proto . th dport"),
            steer_type: format!("ifname . {addr} . inet_proto . inet_service"),
            daddr_key: format!("{ip} daddr . meta l4proto . th dport"),
            daddr_type: format!("{addr} . inet_proto . inet_service"),
            hairpin_original_key: format!("ct original {ip} daddr . meta l4proto . th dport"),
            to_port_type: format!("{addr} . inet_service"),
            to_type: addr,
        }
    }

    fn to_type(&self, width: Width) -> &str {
        match width {
            Width::Port => &self.to_port_type,
            Width::Range => self.to_type,
        }
    }

    /// The DNAT statement: nft maps to an address and port only with the family named.
    fn dnat(&self, width: Width) -> String {
        match width {
            Width::Port => format!("dnat {} to", self.ip),
            Width::Range => "dnat to".to_owned(),
        }
    }
}

/// Builds a [`Planned`] layout from the IR.
struct Builder {
    marks: MarkLayout,
    words: Words,
    /// Whether to record owners (only tracing a refusal needs them).
    with_owners: bool,
    planned: Planned,
    steer: BTreeSet<(Option<u32>, Width)>,
    pre: BTreeSet<(Option<u32>, Width)>,
    post: BTreeSet<Width>,
    /// Hairpin groups: (the flow mark, width).
    hairpin: BTreeSet<(u32, Width)>,
    /// Whether pods are steered by destination (the table names pod networks).
    hairpin_sources: bool,
    /// Port ranges already placed in an interval store group, by (group, key prefix): a later
    /// range gets only the ports no earlier one covers (the kernel refuses overlaps; the first
    /// rule in IR order wins, as the first matching rule of a chain would).
    taken: BTreeMap<(String, String), Vec<PortRange>>,
}

/// The kernel layout of `table`, without owners.
pub fn layout(table: &NftTable) -> Planned {
    build(table, false)
}

/// The kernel layout of `table` with the mapping each element and counter belongs to: what a
/// refused transaction is traced with (the same lines as [`layout`]'s).
pub fn layout_with_owners(table: &NftTable) -> Planned {
    build(table, true)
}

fn build(table: &NftTable, with_owners: bool) -> Planned {
    if table.is_empty() {
        return Planned {
            layout: Layout::empty(table.family),
            owners: Owners::default(),
        };
    }
    let mut b = Builder {
        marks: table.marks,
        words: Words::of(table.family),
        with_owners,
        planned: Planned::default(),
        steer: BTreeSet::new(),
        pre: BTreeSet::new(),
        post: BTreeSet::new(),
        hairpin: BTreeSet::new(),
        hairpin_sources: !table.hairpin_sources.is_empty(),
        taken: BTreeMap::new(),
    };
    b.planned.layout.family = table.family;
    b.sources(table);
    let owners = if with_owners {
        table.owners()
    } else {
        crate::ir::RuleOwners::default()
    };
    b.counters(table, &owners);
    let mut plain: BTreeMap<ChainId, Vec<String>> = BTreeMap::new();
    for chain in ChainId::ALL {
        for rule in table.rules(chain) {
            let owner = owners.of_rule(rule).cloned().unwrap_or_default();
            match rule {
                Rule::MarkRequest(r) | Rule::Steer(r) => {
                    let width = Width::of(r.ports);
                    b.steer.insert((r.mark, width));
                    let prefix =
                        format!("{} . {} . {}", quote(&r.iif), r.daddr, r.protocol.lower());
                    let group = format!("steer-{}-{}", mark_tag(r.mark), width.label());
                    b.place(&group, &[(group.clone(), None)], &prefix, r.ports, &owner);
                }
                Rule::Dnat(d) => {
                    let width = Width::of(d.ports);
                    b.pre.insert((d.mark, width));
                    let group = format!("pre-{}-{}", mark_tag(d.mark), width.label());
                    let prefix = format!("{} . {}", quote(&d.iif), d.protocol.lower());
                    let to = match width {
                        Width::Port => format!("{} . {}", d.to, d.to_port.unwrap_or(d.ports.first)),
                        Width::Range => d.to.to_string(),
                    };
                    let stores = [
                        (format!("{group}-count"), Some(quote(&d.counter))),
                        (format!("{group}-to"), Some(to)),
                    ];
                    b.place(&group, &stores, &prefix, d.ports, &owner);
                }
                Rule::Hairpin(h) => b.hairpin_rule(h, &owner),
                Rule::IdentitySnat(s) => {
                    let width = Width::of(s.ports);
                    b.post.insert(width);
                    let group = format!("post-{}", width.label());
                    let prefix = format!("{} . {}", s.daddr, s.protocol.lower());
                    let stores = [(format!("{group}-count"), Some(quote(&s.counter)))];
                    b.place(&group, &stores, &prefix, s.ports, &owner);
                }
                other => plain.entry(chain).or_default().push(rule_text(
                    other,
                    table.marks,
                    table.family,
                )),
            }
        }
    }
    b.finish(plain)
}

impl Builder {
    /// The table's named counters, each with its mapping when owners are recorded.
    fn counters(&mut self, table: &NftTable, owners: &crate::ir::RuleOwners) {
        for counter in &table.counters {
            self.planned
                .layout
                .counters
                .insert(counter.name.to_string());
            if let Some(owner) = owners.of_counter(&counter.name) {
                self.planned
                    .owners
                    .counters
                    .insert(counter.name.to_string(), owner.clone());
            }
        }
    }

    /// One published address of a mapping: an element of the `hairpin-<width>` set and of its
    /// count and target maps, all under one key.
    fn hairpin_rule(&mut self, h: &HairpinRule, owner: &str) {
        let width = Width::of(h.ports);
        self.hairpin.insert((h.mark, width));
        let group = format!("hairpin-{}", width.label());
        let prefix = format!("{} . {}", h.daddr, h.protocol.lower());
        let to = match width {
            Width::Port => format!("{} . {}", h.to, h.to_port.unwrap_or(h.ports.first)),
            Width::Range => h.to.to_string(),
        };
        let stores = [
            (group.clone(), None),
            (format!("{group}-count"), Some(quote(&h.counter))),
            (format!("{group}-to"), Some(to)),
        ];
        self.place(&group, &stores, &prefix, h.ports, owner);
    }

    /// The `hairpin-sources` set: the pod networks, one element each (the emitter aggregated
    /// them, so none overlaps another, which an interval set refuses; a /32 is listed as the
    /// bare address, as nft lists it); and the `hairpin-external` set, the interfaces a pod's
    /// packet never arrives on.
    fn sources(&mut self, table: &NftTable) {
        if table.hairpin_sources.is_empty() {
            return;
        }
        let elements = table
            .hairpin_sources
            .iter()
            .map(|net| {
                let key = if net.prefix_len() == net.max_prefix_len() {
                    net.addr().to_string()
                } else {
                    net.to_string()
                };
                (key, String::new())
            })
            .collect();
        self.planned.layout.stores.insert(
            HAIRPIN_SOURCES.to_owned(),
            Store {
                map: false,
                type_text: table.family.addr_type().to_owned(),
                flags: Width::Range.flags().to_owned(),
                extra: Vec::new(),
                elements,
            },
        );
        let external = table
            .hairpin_external
            .iter()
            .map(|name| (quote(name), String::new()))
            .collect();
        self.planned.layout.stores.insert(
            HAIRPIN_EXTERNAL.to_owned(),
            Store {
                map: false,
                type_text: "ifname".to_owned(),
                flags: String::new(),
                extra: Vec::new(),
                elements: external,
            },
        );
    }

    /// Adds the element `<prefix> . <ports>` to each store of a group (all stores of a group
    /// share their keys), unless an earlier rule holds those ports.
    fn place(
        &mut self,
        group: &str,
        stores: &[(String, Option<String>)],
        prefix: &str,
        ports: PortRange,
        owner: &str,
    ) {
        let pieces = if ports.is_range() {
            let taken = self
                .taken
                .entry((group.to_owned(), prefix.to_owned()))
                .or_default();
            let free = uncovered(ports, taken);
            taken.extend(free.iter().copied());
            free
        } else {
            vec![ports]
        };
        for piece in pieces {
            let key = format!("{prefix} . {piece}");
            for (store, value) in stores {
                let stores = &mut self.planned.layout.stores;
                if !stores.contains_key(store) {
                    stores.insert(store.clone(), Store::default());
                }
                let Some(entry) = stores.get_mut(store) else {
                    continue;
                };
                let elements = &mut entry.elements;
                if elements.contains_key(&key) {
                    // A set holds the steering rule and its mark request under one key; for a
                    // map the first rule in IR order wins, as the first matching rule would.
                    continue;
                }
                elements.insert(key.clone(), value.clone().unwrap_or_default());
                if self.with_owners && !owner.is_empty() {
                    self.planned
                        .owners
                        .elements
                        .insert((store.clone(), key.clone()), owner.to_owned());
                }
            }
        }
    }

    /// Declares the stores and writes the lookup rules, in a fixed order per chain.
    fn finish(mut self, mut plain: BTreeMap<ChainId, Vec<String>>) -> Planned {
        let mut steer = self.steer_lookups();
        let mut pre = self.pre_lookups();
        let (hairpin_steer, hairpin_pre, out) = self.hairpin_lookups();
        // A pod's packet on a bound interface matches the interface's own lookup first: both
        // move it alike.
        steer.extend(hairpin_steer);
        pre.extend(hairpin_pre);
        let mut lookups = BTreeMap::from([
            (ChainId::Steer, steer),
            (ChainId::Pre, pre),
            (ChainId::Post, self.post_lookups()),
            (ChainId::Out, out),
        ]);
        for chain in ChainId::ALL {
            // The chain's own rules first: in kup-post the hairpin masquerade and the link
            // peer's SNAT must come before the identity SNAT, which would keep the source.
            let mut rules = plain.remove(&chain).unwrap_or_default();
            rules.extend(lookups.remove(&chain).unwrap_or_default());
            self.planned.layout.chains.insert(
                chain.name().to_owned(),
                Chain {
                    header: chain_header(chain),
                    rules,
                },
            );
        }
        self.planned
    }

    /// kup-steer's lookups, one set per (mark, width): the mark request and the steering rule.
    fn steer_lookups(&mut self) -> Vec<String> {
        let marks = self.marks;
        let mut rules = Vec::new();
        for (mark, width) in std::mem::take(&mut self.steer) {
            let set = format!("steer-{}-{}", mark_tag(mark), width.label());
            self.declare(&set, false, self.words.steer_type.clone(), width);
            // Only a new flow's first packet: a reply never is one, so the node's own
            // connections from a port in a mapped range keep their replies; later packets of a
            // steered flow are translated by conntrack's NAT.
            let key = &self.words.steer_key;
            let mut steer = format!("{NEW_FLOW} {key} @{set} ");
            if let Some(mark) = mark {
                // Only a packet no other datapath marked takes kuport's mark (netbird checks
                // its own exact value later), so strict rp_filter follows kuport's fwmark rule.
                rules.push(format!(
                    "{NEW_FLOW} {key} @{set} {} {}",
                    masked_cmp("meta mark", !marks.mask, false, 0),
                    masked_set("meta mark", marks, mark)
                ));
                let _ = write!(steer, "{} ", masked_set("ct mark", marks, mark));
            }
            let _ = write!(steer, "{} daddr set {}", self.words.ip, self.words.stand_in);
            rules.push(steer);
        }
        rules
    }

    /// kup-pre's lookups, one per (mark, width): the counter map and the DNAT target map.
    fn pre_lookups(&mut self) -> Vec<String> {
        let marks = self.marks;
        let mut rules = Vec::new();
        for (mark, width) in std::mem::take(&mut self.pre) {
            let group = format!("pre-{}-{}", mark_tag(mark), width.label());
            let to_type = self.words.to_type(width).to_owned();
            self.declare(
                &format!("{group}-count"),
                true,
                format!("{PRE_TYPE} : counter"),
                width,
            );
            self.declare(
                &format!("{group}-to"),
                true,
                format!("{PRE_TYPE} : {to_type}"),
                width,
            );
            let mut rule = String::new();
            if width == Width::Port {
                // nft maps to an address and port only after a transport protocol match.
                rule.push_str("meta l4proto { tcp, udp } ");
            }
            let _ = write!(rule, "{} daddr {} ", self.words.ip, self.words.stand_in);
            if let Some(mark) = mark {
                let _ = write!(rule, "{} ", masked_eq("ct mark", marks, mark));
            }
            let dnat = self.words.dnat(width);
            let _ = write!(
                rule,
                "counter name {PRE_KEY} map @{group}-count {dnat} {PRE_KEY} map @{group}-to"
            );
            rules.push(rule);
        }
        rules
    }

    /// The hairpin lookups, one group per (mark, width): kup-steer's for a pod (its address in
    /// a pod network, arriving on neither a bound interface nor the underlay, where a pod
    /// address could only be spoofed) when pod networks are known, kup-pre's
    /// DNAT of what those moved to the stand-in (by the original destination conntrack keeps),
    /// and kup-out's for the node's own processes.
    fn hairpin_lookups(&mut self) -> (Vec<String>, Vec<String>, Vec<String>) {
        let marks = self.marks;
        let (mut steer, mut pre, mut out) = (Vec::new(), Vec::new(), Vec::new());
        for (mark, width) in std::mem::take(&mut self.hairpin) {
            let group = format!("hairpin-{}", width.label());
            let key_type = self.words.daddr_type.clone();
            let to_type = self.words.to_type(width).to_owned();
            self.declare(&group, false, key_type.clone(), width);
            self.declare(
                &format!("{group}-count"),
                true,
                format!("{key_type} : counter"),
                width,
            );
            self.declare(
                &format!("{group}-to"),
                true,
                format!("{key_type} : {to_type}"),
                width,
            );
            // nft maps to an address and port only after a transport protocol match.
            let l4 = match width {
                Width::Port => "meta l4proto { tcp, udp } ",
                Width::Range => "",
            };
            let dnat = self.words.dnat(width);
            let (ip, stand_in) = (self.words.ip, self.words.stand_in);
            let key = &self.words.daddr_key;
            let original = &self.words.hairpin_original_key;
            let flow_mark = masked_set("ct mark", marks, mark);
            if self.hairpin_sources {
                let from_pod = format!(
                    "{NEW_FLOW} {ip} saddr @{HAIRPIN_SOURCES} iifname != @{HAIRPIN_EXTERNAL} {key} @{group}"
                );
                steer.push(format!(
                    "{from_pod} {} {}",
                    masked_cmp("meta mark", !marks.mask, false, 0),
                    masked_set("meta mark", marks, mark)
                ));
                steer.push(format!("{from_pod} {flow_mark} {ip} daddr set {stand_in}"));
                pre.push(format!(
                    "{l4}{ip} daddr {stand_in} {} counter name {original} map @{group}-count {dnat} {original} map @{group}-to",
                    masked_eq("ct mark", marks, mark)
                ));
            }
            out.push(format!(
                "{l4}{key} @{group} {flow_mark} counter name {key} map @{group}-count {dnat} {key} map @{group}-to"
            ));
        }
        (steer, pre, out)
    }

    /// kup-post's lookups, one counter map per width: the identity SNAT.
    fn post_lookups(&mut self) -> Vec<String> {
        let marks = self.marks;
        let mut rules = Vec::new();
        for width in std::mem::take(&mut self.post) {
            let map = format!("post-{}-count", width.label());
            let key_type = &self.words.daddr_type;
            self.declare(&map, true, format!("{key_type} : counter"), width);
            rules.push(format!(
                "{} counter name {} map @{map} snat to {} saddr",
                masked_cmp("ct mark", marks.mask, true, 0),
                self.words.daddr_key,
                self.words.ip,
            ));
        }
        rules
    }

    fn declare(&mut self, name: &str, map: bool, type_text: String, width: Width) {
        let store = self
            .planned
            .layout
            .stores
            .entry(name.to_owned())
            .or_default();
        store.map = map;
        store.type_text = type_text;
        store.flags = width.flags().to_owned();
    }
}

/// The parts of `ports` that none of `taken` covers, in order.
fn uncovered(ports: PortRange, taken: &[PortRange]) -> Vec<PortRange> {
    let mut free = vec![ports];
    for t in taken {
        free = free
            .into_iter()
            .flat_map(|f| {
                let mut left = Vec::new();
                if !f.overlaps(t) {
                    left.push(f);
                    return left;
                }
                if f.first < t.first {
                    left.push(PortRange {
                        first: f.first,
                        last: t.first - 1,
                    });
                }
                if f.last > t.last {
                    left.push(PortRange {
                        first: t.last + 1,
                        last: f.last,
                    });
                }
                left
            })
            .collect();
    }
    free
}

/// A base chain's header line as nft lists it.
pub fn chain_header(chain: ChainId) -> String {
    format!(
        "type {} hook {} priority {}; policy accept;",
        chain.chain_type(),
        chain.hook().name(),
        symbolic_priority(chain)
    )
}

/// `nft list table ip kuport` for `layout`, counters at the given values (zero when absent).
/// Elements are listed sorted, one per line; nft itself lists hash-map elements in its own
/// order, which is why listings are parsed and compared, never compared as text.
pub fn listing_text(layout: &Layout, values: &BTreeMap<String, (u64, u64)>) -> String {
    let mut blocks = Vec::new();
    for name in &layout.counters {
        let (packets, bytes) = values.get(name).copied().unwrap_or((0, 0));
        blocks.push(format!(
            "\tcounter {name} {{\n\t\tpackets {packets} bytes {bytes}\n\t}}\n"
        ));
    }
    for (name, store) in &layout.stores {
        let kind = if store.map { "map" } else { "set" };
        let mut block = format!("\t{kind} {name} {{\n\t\ttype {}\n", store.type_text);
        if !store.flags.is_empty() {
            let _ = writeln!(block, "\t\tflags {}", store.flags);
        }
        for line in &store.extra {
            let _ = writeln!(block, "\t\t{line}");
        }
        if !store.elements.is_empty() {
            let items: Vec<String> = store
                .elements
                .iter()
                .map(|(k, v)| element_text(k, v))
                .collect();
            let _ = writeln!(
                block,
                "\t\telements = {{ {} }}",
                items.join(",\n\t\t\t     ")
            );
        }
        block.push_str("\t}\n");
        blocks.push(block);
    }
    for chain in ChainId::ALL {
        let Some(c) = layout.chains.get(chain.name()) else {
            continue;
        };
        blocks.push(chain_block(chain.name(), c));
    }
    for (name, c) in &layout.chains {
        if ChainId::ALL.iter().all(|id| id.name() != name) {
            blocks.push(chain_block(name, c));
        }
    }
    let mut head = format!("table {} {TABLE} {{\n", layout.family.nft());
    for line in &layout.extra {
        let _ = writeln!(head, "\t{line}");
    }
    format!("{head}{}}}\n", blocks.join("\n"))
}

fn chain_block(name: &str, chain: &Chain) -> String {
    let mut block = format!("\tchain {name} {{\n");
    if !chain.header.is_empty() {
        let _ = writeln!(block, "\t\t{}", chain.header);
    }
    for rule in &chain.rules {
        let _ = writeln!(block, "\t\t{rule}");
    }
    block.push_str("\t}\n");
    block
}

/// An element as written and listed: `key` in a set, `key : value` in a map.
pub fn element_text(key: &str, value: &str) -> String {
    if value.is_empty() {
        key.to_owned()
    } else {
        format!("{key} : {value}")
    }
}

/// A parsed `nft list table ip kuport`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// The table's layout.
    pub layout: Layout,
    /// Counter values: name → (packets, bytes).
    pub counters: BTreeMap<String, (u64, u64)>,
}

/// Reads nft's listing of kuport's table (or of its counters alone). Whatever nft lists that
/// kuport never writes is kept (in `extra`, or as an unknown chain), so it compares unequal
/// and is repaired.
pub fn parse_listing(text: &str) -> Result<Listing, String> {
    let mut out = Listing::default();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next();
    let family = Family::ALL
        .into_iter()
        .find(|f| first == Some(format!("table {} {TABLE} {{", f.nft()).as_str()));
    match family {
        Some(family) => out.layout.family = family,
        None => {
            return Err(format!(
                "expected `table ip {TABLE} {{` or `table ip6 {TABLE} {{`, found {first:?}"
            ));
        }
    }
    while let Some(line) = lines.next() {
        if line == "}" {
            return Ok(out);
        }
        let Some(head) = line.strip_suffix(" {") else {
            out.layout.extra.push(line.to_owned());
            continue;
        };
        let (kind, name) = head
            .split_once(' ')
            .ok_or_else(|| format!("unreadable block `{line}`"))?;
        let body = block_body(&mut lines)?;
        match kind {
            "counter" => {
                out.counters.insert(name.to_owned(), counter_values(&body)?);
                out.layout.counters.insert(name.to_owned());
            }
            "set" | "map" => {
                out.layout
                    .stores
                    .insert(name.to_owned(), store(kind == "map", &body)?);
            }
            "chain" => {
                let mut chain = Chain::default();
                for (i, l) in body.into_iter().enumerate() {
                    if i == 0 && l.starts_with("type ") {
                        chain.header = l;
                    } else {
                        chain.rules.push(zero_counters(&l));
                    }
                }
                out.layout.chains.insert(name.to_owned(), chain);
            }
            _ => out.layout.extra.push(line.to_owned()),
        }
    }
    Err("the listing ends inside the table".to_owned())
}

/// A rule's anonymous counter values replaced by zero (named counters are read apart), so a
/// rule that counted traffic still compares equal to its rendering.
pub fn zero_counters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("packets ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "packets ".len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let tail = &after[digits..];
        if digits > 0 && tail.starts_with(" bytes ") {
            let b = &tail[" bytes ".len()..];
            let bdigits = b.bytes().take_while(u8::is_ascii_digit).count();
            if bdigits > 0 {
                out.push_str("packets 0 bytes 0");
                rest = &b[bdigits..];
                continue;
            }
        }
        out.push_str("packets ");
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The lines of a block up to its closing brace, an element list joined into one line.
fn block_body<'a>(lines: &mut impl Iterator<Item = &'a str>) -> Result<Vec<String>, String> {
    let mut body = Vec::new();
    while let Some(line) = lines.next() {
        if line == "}" {
            return Ok(body);
        }
        if line.starts_with("elements = {") {
            let mut joined = line.to_owned();
            while !joined.ends_with('}') {
                let next = lines
                    .next()
                    .ok_or("the listing ends inside an element list")?;
                joined.push(' ');
                joined.push_str(next);
            }
            body.push(joined);
        } else {
            body.push(line.to_owned());
        }
    }
    Err("the listing ends inside a block".to_owned())
}

fn counter_values(body: &[String]) -> Result<(u64, u64), String> {
    let line = body.first().map(String::as_str).unwrap_or_default();
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["packets", p, "bytes", b] => Ok((
            p.parse().map_err(|e| format!("counter packets {p}: {e}"))?,
            b.parse().map_err(|e| format!("counter bytes {b}: {e}"))?,
        )),
        _ => Err(format!("unreadable counter `{line}`")),
    }
}

fn store(map: bool, body: &[String]) -> Result<Store, String> {
    let mut store = Store {
        map,
        ..Store::default()
    };
    for line in body {
        if let Some(t) = line.strip_prefix("type ") {
            store.type_text = t.to_owned();
        } else if let Some(f) = line.strip_prefix("flags ") {
            store.flags = f.to_owned();
        } else if let Some(list) = line.strip_prefix("elements = {") {
            let list = list.strip_suffix('}').unwrap_or(list);
            for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let (key, value) = if map {
                    let (k, v) = item
                        .split_once(" : ")
                        .ok_or_else(|| format!("a map element without a value: `{item}`"))?;
                    (k.to_owned(), v.to_owned())
                } else {
                    (item.to_owned(), String::new())
                };
                store.elements.insert(key, value);
            }
        } else {
            store.extra.push(line.clone());
        }
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroes_counter_values_only() {
        let text = "udp dport 3000 counter packets 1 bytes 2 dnat comment \"packets a\"";
        assert_eq!(
            zero_counters(text),
            "udp dport 3000 counter packets 0 bytes 0 dnat comment \"packets a\""
        );
        assert_eq!(zero_counters("packets x bytes 3"), "packets x bytes 3");
    }

    #[test]
    fn a_range_gets_only_the_ports_no_earlier_range_holds() {
        let r = |first, last| PortRange { first, last };
        assert_eq!(uncovered(r(10, 20), &[]), [r(10, 20)]);
        assert_eq!(uncovered(r(10, 20), &[r(12, 14)]), [r(10, 11), r(15, 20)]);
        assert_eq!(uncovered(r(10, 20), &[r(5, 30)]), []);
        assert_eq!(uncovered(r(10, 20), &[r(20, 30), r(1, 10)]), [r(11, 19)]);
        assert_eq!(uncovered(r(10, 20), &[r(21, 30)]), [r(10, 20)]);
    }

    #[test]
    fn a_listing_in_any_element_order_parses_to_the_same_layout() {
        let text = "table ip kuport {\n\tcounter pre/games/a {\n\t\tpackets 3 bytes 120\n\t}\n\tmap post-port-count {\n\t\ttype ipv4_addr . inet_proto . inet_service : counter\n\t\telements = { 10.0.0.2 . udp . 7 : \"post/games/b\", 10.0.0.1 . udp . 3000 : \"post/games/a\",\n\t\t\t     10.0.0.3 . tcp . 25 : \"post/games/c\" }\n\t}\n\n\tchain kup-post {\n\t\ttype nat hook postrouting priority srcnat - 10; policy accept;\n\t\tct mark & 0x000000ff != 0x00000000 counter name ip daddr . meta l4proto . th dport map @post-port-count snat to ip saddr\n\t}\n}\n";
        let listing = parse_listing(text).expect("parses");
        assert_eq!(listing.counters["pre/games/a"], (3, 120));
        let store = &listing.layout.stores["post-port-count"];
        assert!(store.map);
        assert_eq!(store.elements.len(), 3);
        assert_eq!(store.elements["10.0.0.3 . tcp . 25"], "\"post/games/c\"");
        let chain = &listing.layout.chains["kup-post"];
        assert_eq!(chain.header, chain_header(ChainId::Post));
        assert_eq!(chain.rules.len(), 1);
        // The listing kuport renders parses back to the same layout.
        let again =
            parse_listing(&listing_text(&listing.layout, &listing.counters)).expect("parses again");
        assert_eq!(again, listing);
    }

    #[test]
    fn what_kuport_never_writes_is_kept_so_it_compares_unequal() {
        let text = "table ip kuport {\n\tflags dormant\n\tset s {\n\t\ttype ipv4_addr\n\t\tsize 65535\n\t}\n\tchain extra {\n\t\taccept\n\t}\n}\n";
        let listing = parse_listing(text).expect("parses");
        assert_eq!(listing.layout.extra, ["flags dormant"]);
        assert_eq!(listing.layout.stores["s"].extra, ["size 65535"]);
        assert_eq!(listing.layout.chains["extra"].header, "");
        assert!(parse_listing("table ip kuport {\n\tchain x {\n").is_err());
        assert!(parse_listing("table ip other {\n}\n").is_err());
    }
}
