//! Emission: what this node must own, by role (`datapath.md`, "Rules by role").

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::MappingDecision;
use super::fast_hash::{FastMap, FastSet};
use super::holders::{self, Holder};
use super::index::Index;
use super::pod_network;
use super::state::{ClassState, Working, link_name, yields_to};
use crate::api::{ClassNodeStatus, is_preflight};
use crate::ir::{
    ChainId, Counter, DnatRule, Family, HairpinRule, HostState, IpRule, LINK_TTL, Link, MAIN_TABLE,
    PREF_LOOP_GUARD, PREF_REPLY, PortRange, RP_FILTER_LOOSE, Route, Rule, SnatRule, SteerRule,
    VXLAN_OVERHEAD,
};
use crate::keys::{MappingKey, Name, NodePair};
use crate::snapshot::HostFacts;
use crate::text::short_hash;

/// nft comments (and kuport's counter names) hold at most this many bytes.
pub const NFT_TEXT_MAX: usize = 128;

/// `text` if it fits nft's limit, else its head plus `_` and 8 hex digits of its sha256 (`_`
/// never occurs in a Kubernetes name, and nft reads it unquoted in an object name).
pub fn fit_nft_text(text: &str) -> String {
    if text.len() <= NFT_TEXT_MAX {
        return text.to_owned();
    }
    shortened(text)
}

/// [`fit_nft_text`] of a text already owned: kept as it is when it fits.
fn fit_nft_text_owned(text: String) -> String {
    if text.len() <= NFT_TEXT_MAX {
        return text;
    }
    shortened(&text)
}

/// A text longer than nft allows, cut and tagged with a hash of the whole.
fn shortened(text: &str) -> String {
    let hash = short_hash(text);
    let mut cut = NFT_TEXT_MAX - hash.len() - 1;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_{hash}", &text[..cut])
}

/// A usable link between a programming node and the pod's node, as seen from `this_node`.
#[derive(Clone, Copy)]
struct LinkEnds<'a> {
    net: Ipv4Net,
    own: Ipv4Addr,
    peer: Ipv4Addr,
    /// The ends' inner IPv6 addresses (the class's IPv6 prefix with the IPv4 end as its low
    /// bits): used once an IPv6 mapping crosses the link.
    own6: Option<Ipv6Addr>,
    peer6: Option<Ipv6Addr>,
    own_ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    /// The peer's IPv6 InternalIP, on a dual-stack node: a client address, as `peer_ip`.
    peer_ip6: Option<Ipv6Addr>,
    /// The peer's row in the link's class: its `hostAddresses` are client addresses too.
    peer_row: Option<&'a ClassNodeStatus>,
    /// The peer's own pod CIDRs, from its Node: its pods are clients to translate too.
    peer_pods: &'a [IpNet],
    slot: u32,
}

impl LinkEnds<'_> {
    /// This node's end in `family`.
    fn own_in(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => Some(IpAddr::V4(self.own)),
            Family::V6 => self.own6.map(IpAddr::V6),
        }
    }

    /// The source NAT of the clients that must not reach the pod's node as themselves
    /// (`Rule::LinkPeerSnat`), in `family`. IPv4: either end's InternalIP. IPv6: the peer's
    /// IPv6 InternalIP only, on a dual-stack mesh; this node's own IPv6 address needs none, as
    /// no loop guard sends IPv6 to the mesh and the pod's reply follows the link back. In
    /// either family also every host address the peer lists in its row of the class: the pod's
    /// node reaching this node over a LAN or public segment arrives from one of those, and
    /// would drop a request with its own address as the source. A peer listing an address not
    /// its own changes only flows to its own endpoints (the rule matches the peer's end).
    /// Last the peer's own pod CIDRs from its Node (the control plane's word, not the peer's):
    /// a pod there reaching this node unmasqueraded (Cilium's native routing leaves a pod's
    /// traffic to a node address alone) would get the pod node's reply straight from the
    /// endpoint, or its own packet back when it dials its own mapping.
    fn peer_snats(&self, family: Family, mark: u32) -> Vec<Rule> {
        let mut clients: Vec<IpNet> = self
            .peer_hosts(family)
            .into_iter()
            .map(IpNet::from)
            .collect();
        let Some((peer_end, own_end)) = self.peer_in(family).zip(self.own_in(family)) else {
            return Vec::new();
        };
        let pods = self
            .peer_pods
            .iter()
            .filter(|n| Family::of(n.addr()) == family);
        clients.extend(pods);
        clients
            .into_iter()
            .map(|client| Rule::LinkPeerSnat {
                mark,
                client,
                peer_end,
                own_end,
            })
            .collect()
    }

    /// The host addresses [`Self::peer_snats`] translates in `family`, sorted after the
    /// InternalIPs.
    fn peer_hosts(&self, family: Family) -> Vec<IpAddr> {
        let mut clients: Vec<IpAddr> = match family {
            Family::V4 => vec![self.own_ip.into(), self.peer_ip.into()],
            Family::V6 => self.peer_ip6.into_iter().map(IpAddr::V6).collect(),
        };
        let mut listed: Vec<IpAddr> = self
            .peer_row
            .iter()
            .flat_map(|r| &r.host_addresses)
            .filter_map(|a| a.trim().parse::<IpAddr>().ok())
            .filter(|a| Family::of(*a) == family && !clients.contains(a))
            .collect();
        listed.sort_unstable();
        listed.dedup();
        clients.extend(listed);
        clients
    }

    /// The peer's end in `family`.
    fn peer_in(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => Some(IpAddr::V4(self.peer)),
            Family::V6 => self.peer6.map(IpAddr::V6),
        }
    }
}

/// The link between `this_node` and `peer`, if its claim landed and both ends have an
/// InternalIP. Nothing that uses a slot is emitted before that.
fn usable_link<'a>(
    index: &'a Index<'a>,
    class: &ClassState,
    this_node: &str,
    peer: &str,
) -> Option<LinkEnds<'a>> {
    if !class.builds_links() {
        return None;
    }
    let key = NodePair::new(this_node, peer)?;
    if class.evicted.contains(&key) {
        // A serving pair takes this slot over: the link goes before the new one (same VNI)
        // is built.
        return None;
    }
    let slot = class.claims.get(&key)?.slot;
    let (net, even, odd) = class.slot_net(slot)?;
    let (own, peer_addr) = if this_node < peer {
        (even, odd)
    } else {
        (odd, even)
    };
    Some(LinkEnds {
        net,
        own,
        peer: peer_addr,
        own6: class.link_address6(own),
        peer6: class.link_address6(peer_addr),
        own_ip: index.internal_ip(this_node)?,
        peer_ip: index.internal_ip(peer)?,
        peer_ip6: index.internal_ip6(peer),
        peer_row: index.row(class.name, peer),
        peer_pods: index.addresses.pod_cidrs_of(peer),
        slot,
    })
}

/// The links this node holds in preflight classes: one to every other accepting node of each
/// such class it accepts in (only the link; no rule uses it but the guard and the probes).
fn preflight_peers<'a>(
    classes: &'a BTreeMap<&str, ClassState>,
    this_node: &str,
) -> Vec<(&'a ClassState<'a>, &'a str)> {
    classes
        .values()
        .filter(|c| is_preflight(c.class) && c.accepting.contains(&this_node))
        .flat_map(|c| {
            c.accepting
                .iter()
                .filter(move |peer| **peer != this_node)
                .map(move |peer| (c, *peer))
        })
        .collect()
}

struct Emitter<'a> {
    index: &'a Index<'a>,
    facts: &'a HostFacts,
    node: &'a str,
    state: HostState,
    /// Each table's chains, by family.
    chains: BTreeMap<(Family, ChainId), Vec<Rule>>,
    /// Link ids handed out in this plan, by link name.
    link_ids: BTreeMap<String, u32>,
    /// Names of the links this node builds for serving pairs: when ids run short, their ids on
    /// the host are kept for them, and any other link's id may be taken for one.
    serving_links: BTreeSet<String>,
    /// What holds ports on this node now (host sockets, NodePorts, its Pods' hostPorts).
    holders: Vec<Holder>,
    /// What [`Emitter::link_to`] found, by class then peer: thousands of mappings share a few
    /// links, and each link's name is a hash.
    links_made: FastMap<String, FastMap<String, MadeLink<'a>>>,
    /// What [`Emitter::counter`] made, by chain and mapping: a mapping's rules share their
    /// counter per chain.
    counters_made: FastMap<(Family, ChainId, *const MappingDecision), Name>,
    /// Each mapping's comment ([`Emitter::comment`]), which all its rules carry.
    comments_made: FastMap<*const MappingDecision, Name>,
    /// Links whose shared arrival rules ([`Emitter::arrival`]) are added, per family.
    arrivals: FastSet<(Family, String)>,
    /// Links (or none, for this node's own pods) whose shared accepting rules
    /// ([`Emitter::accepting_shared`]) are added, by family and the link's addresses.
    accepted_over: FastSet<(Family, Option<LinkAddresses>)>,
}

/// A link's ends and its nodes' InternalIPs: (own end, peer end, own InternalIP, peer's).
type LinkAddresses = (Ipv4Addr, Ipv4Addr, Ipv4Addr, Ipv4Addr);

/// A usable link and, when it got a mark, its device name and mark.
type MadeLink<'a> = Option<(LinkEnds<'a>, Option<(String, u32)>)>;

/// Everything `this_node` must own.
pub fn emit(
    index: &Index,
    classes: &BTreeMap<&str, ClassState>,
    work: &[Working],
    this_node: &str,
    facts: &HostFacts,
) -> HostState {
    let mut e = Emitter::new(index, this_node, facts);
    let emitting: Vec<(&ClassState, &Working)> = work
        .iter()
        .filter(|w| w.decision.emits)
        .filter_map(|w| Some((classes.get(w.decision.class.as_str())?, w)))
        .collect();
    // Thousands of mappings share a few links: hash each (class, peer) once.
    // Only the names reach the state, through the sorted set below: a hash set dedups them.
    let serving_pairs: FastSet<(&str, &str)> = emitting
        .iter()
        .flat_map(|(class, w)| w.decision.links.iter().map(move |l| (class.name, l)))
        .filter_map(|(class, l)| Some((class, l.peer_of(this_node)?)))
        .collect();
    e.serving_links = serving_pairs
        .into_iter()
        .map(|(class, peer)| link_name(class, peer))
        .collect();
    // Serving links first, standby links after: when the node's link marks run short, the links
    // that carry traffic take them, and standby links get what is left.
    for (class, w) in &emitting {
        e.mapping(class, w);
    }
    for (class, w) in &emitting {
        e.standby(class, w);
    }
    // Preflight links last, and never serving: they take only ids no real link holds, so a
    // preflight on a live cluster moves no mapping's link.
    for (class, peer) in preflight_peers(classes, this_node) {
        e.link_to(class, peer);
    }
    e.guard();
    e.finish(index)
}

impl Emitter<'_> {
    /// The state: both tables' chains, the MSS clamps, the hairpin sets per family, the links'
    /// IPv6 ends where IPv6 crosses them.
    fn finish(mut self, index: &Index) -> HostState {
        for family in Family::ALL {
            let has_rules = self.chains.keys().any(|(f, _)| *f == family);
            if has_rules || (family == Family::V4 && !self.state.links.is_empty()) {
                self.push_in(family, ChainId::Fwd, Rule::ClampMssOut);
                self.push_in(family, ChainId::Fwd, Rule::ClampMssIn);
            }
        }
        let pod_networks = index.addresses.all_pod_networks();
        let external: Vec<String> = self
            .state
            .valid_mark_interfaces
            .iter()
            .cloned()
            .chain(self.facts.underlay_device.clone())
            .collect();
        let mut state = self.state;
        for family in Family::ALL {
            let mut chains: BTreeMap<ChainId, Vec<Rule>> = self
                .chains
                .iter()
                .filter(|((f, _), _)| *f == family)
                .map(|((_, c), rules)| (*c, rules.clone()))
                .collect();
            let table = state.table_mut(family);
            table.family = family;
            table.marks = self.facts.marks;
            let hairpins = chains
                .get(&ChainId::Pre)
                .is_some_and(|rules| rules.iter().any(|r| matches!(r, Rule::Hairpin(_))));
            if hairpins {
                let of_family: Vec<IpNet> = pod_networks
                    .iter()
                    .filter(|n| Family::of(n.addr()) == family)
                    .copied()
                    .collect();
                table.hairpin_sources = IpNet::aggregate(&of_family);
                // Where a pod address can only be spoofed: the interfaces this node accepts on
                // (every one that has a hairpin entry is among them) and the underlay.
                table.hairpin_external = external.clone();
            }
            if table.hairpin_sources.is_empty() {
                // No pod is steered by its destination without a pod network to check it
                // against, and the masquerade reads the same set.
                if let Some(post) = chains.get_mut(&ChainId::Post) {
                    post.retain(|r| !matches!(r, Rule::HairpinMasquerade { .. }));
                }
            }
            table.chains = chains.into_iter().collect();
        }
        state.normalise();
        state
    }
}

impl<'a> Emitter<'a> {
    fn new(index: &'a Index<'a>, this_node: &'a str, facts: &'a HostFacts) -> Self {
        Emitter {
            holders: holders::on_node(&index.node_ports, &index.host_ports, this_node, facts),
            index,
            facts,
            node: this_node,
            state: HostState::default(),
            chains: BTreeMap::new(),
            link_ids: BTreeMap::new(),
            serving_links: BTreeSet::new(),
            links_made: FastMap::default(),
            counters_made: FastMap::default(),
            comments_made: FastMap::default(),
            arrivals: FastSet::default(),
            accepted_over: FastSet::default(),
        }
    }

    /// A rule of the IPv4 table (the guard's, which the IPv4 underlay alone carries).
    fn push(&mut self, chain: ChainId, rule: Rule) {
        self.push_in(Family::V4, chain, rule);
    }

    fn push_in(&mut self, family: Family, chain: ChainId, rule: Rule) {
        self.chains.entry((family, chain)).or_default().push(rule);
    }

    /// The counter of the mapping's rules in `chain`, and their comment; the counter is
    /// declared once. Made ones are found by the decision's address (decisions do not move
    /// while the rules are emitted), so asking again allocates no key, and every rule shares
    /// one copy of each text.
    fn counter(&mut self, family: Family, chain: ChainId, d: &MappingDecision) -> (Name, Name) {
        let comment = self.comment(d);
        let key = (family, chain, std::ptr::from_ref(d));
        if let Some(made) = self.counters_made.get(&key) {
            return (made.clone(), comment);
        }
        // `chain/namespace/name`, joined by hand: `format!` cost more than the rest of this.
        let label = chain.label();
        let mut text = String::with_capacity(label.len() + d.namespace.len() + d.name.len() + 2);
        for part in [label, "/", &d.namespace, "/", &d.name] {
            text.push_str(part);
        }
        let counter = Name::from(fit_nft_text_owned(text));
        self.state.table_mut(family).counters.push(Counter {
            name: counter.clone(),
            chain,
            namespace: d.namespace.clone(),
            mapping: Name::from(d.name.as_str()),
        });
        self.counters_made.insert(key, counter.clone());
        (counter, comment)
    }

    /// The comment of every rule of the mapping: `namespace/name`, cut to fit nft.
    fn comment(&mut self, d: &MappingDecision) -> Name {
        self.comments_made
            .entry(std::ptr::from_ref(d))
            .or_insert_with(|| {
                Name::from(fit_nft_text_owned(
                    MappingKey::new(&d.namespace, &d.name).into_string(),
                ))
            })
            .clone()
    }

    /// The usable link to `peer` in `class`, added (once) with its device name and mark when
    /// it gets one. Asked again for the same link, it answers what it found the first time: the
    /// link, its id and its mark cannot change within a pass.
    fn link_to(&mut self, class: &ClassState, peer: &str) -> MadeLink<'a> {
        if let Some(made) = self.links_made.get(class.name).and_then(|m| m.get(peer)) {
            return made.clone();
        }
        let made = usable_link(self.index, class, self.node, peer)
            .map(|l| (l, self.link(class, peer, &l)));
        self.links_made
            .entry(class.name.to_owned())
            .or_default()
            .insert(peer.to_owned(), made.clone());
        made
    }

    fn mapping(&mut self, class: &ClassState, w: &Working) {
        let d = &w.decision;
        let (Some(ep), Some(ports)) = (&d.endpoint, d.ports) else {
            return;
        };
        // The endpoint is an address of its node's own host, or of no Pod bound to that node:
        // that node leaves the mapping out (and says so), and no accepting node forwards it
        // toward the link.
        if pod_network::refused_endpoint(d, self.node, self.facts, &self.index.pod_addresses)
            .is_some()
            || pod_network::refused_by_endpoint_node(class.class, d)
        {
            return;
        }
        let translated = (!ports.is_range() && ports.first != ep.port).then_some(ep.port);
        let pod_ports = translated.map_or(ports, PortRange::single);
        let binds = |node: &str| d.bindings.get(node).is_some_and(|i| !i.is_empty());

        if d.programming_nodes.iter().any(|n| n == self.node) && binds(self.node) {
            self.accepting(class, d, translated, pod_ports, ports);
        }
        if ep.node == self.node {
            let peers: Vec<Name> = d
                .programming_nodes
                .iter()
                .filter(|p| **p != self.node && binds(p))
                .cloned()
                .collect();
            for p in peers {
                self.pod_half(class, d, &p, translated, pod_ports, ports);
            }
        }
    }

    /// The standby links of a mapping that touch this node. A standby accepting node builds
    /// only the link (its steering and DNAT are what moves with the serving node); the pod's node
    /// builds its whole half, whose rules match only traffic arriving over that link and so do
    /// nothing while the link is idle. When the serving node moves to a standby node, that node
    /// adds its steering and DNAT and nothing else changes anywhere.
    fn standby(&mut self, class: &ClassState, w: &Working) {
        let d = &w.decision;
        let (Some(ep), Some(ports)) = (&d.endpoint, d.ports) else {
            return;
        };
        if pod_network::refused_endpoint(d, self.node, self.facts, &self.index.pod_addresses)
            .is_some()
        {
            return;
        }
        let translated = (!ports.is_range() && ports.first != ep.port).then_some(ep.port);
        let pod_ports = translated.map_or(ports, PortRange::single);
        for link in &d.standby_links {
            let Some(peer) = link.peer_of(self.node) else {
                continue;
            };
            if ep.node == self.node {
                self.pod_half(class, d, peer, translated, pod_ports, ports);
            } else {
                self.link_to(class, peer);
            }
        }
    }

    /// The accepting role, in each family the endpoint has: steer each bound interface's own
    /// address, DNAT the steered packets to the pod (local) or to the pod node's end of the
    /// link, claim the flow's source NAT.
    fn accepting(
        &mut self,
        class: &ClassState,
        d: &MappingDecision,
        translated: Option<u16>,
        pod_ports: PortRange,
        ports: PortRange,
    ) {
        let Some(ep) = &d.endpoint else { return };
        let mut over_link = None;
        if ep.node != self.node {
            let Some((l, Some((dev, _)))) = self.link_to(class, &ep.node) else {
                return;
            };
            over_link = Some((l, dev));
        }
        for family in Family::ALL {
            let Some(pod) = ep.address_in(family) else {
                continue;
            };
            let target = match &over_link {
                None => Some((pod, translated, pod_ports)),
                Some((l, _)) => l.peer_in(family).map(|peer| (peer, None, ports)),
            };
            let Some(target) = target else { continue };
            if self.accept_in(family, class, d, target, ports) {
                if family == Family::V6
                    && let Some((l, dev)) = &over_link
                {
                    self.carry_v6(dev, l);
                }
                self.accepting_shared(family, over_link.as_ref().map(|(l, _)| *l));
            }
        }
    }

    /// The accepting rules of one family toward `to` (and its port): true when an interface
    /// of this node captures the mapping in that family.
    fn accept_in(
        &mut self,
        family: Family,
        class: &ClassState,
        d: &MappingDecision,
        (to, to_port, snat_ports): (IpAddr, Option<u16>, PortRange),
        ports: PortRange,
    ) -> bool {
        let local = self.facts.marks.local();
        let ifaces = d.bindings.get(self.node).cloned().unwrap_or_default();
        let mut any = false;
        for iface in ifaces {
            // Only packets addressed to the interface's own address are captured: an
            // interface whose address (in this family) is unknown captures nothing.
            let addr = match family {
                Family::V4 => self.facts.interface_address(&iface).map(IpAddr::V4),
                Family::V6 => self.facts.interface_address6(&iface).map(IpAddr::V6),
            };
            let Some(addr) = addr else { continue };
            if self.held_here(class.name, d, addr, ports) {
                continue;
            }
            self.steer(d, iface.clone(), addr, Some(local), ports);
            self.state.valid_mark_interfaces.push(iface.clone());
            self.dnat(d, iface, Some(local), to, to_port, ports);
            self.hairpin(d, addr, local, to, to_port, ports);
            any = true;
        }
        if any {
            self.snat(d, to, snat_ports);
        }
        any
    }

    /// The link's inner IPv6 ends, set once an IPv6 mapping crosses it.
    fn carry_v6(&mut self, dev: &str, l: &LinkEnds<'_>) {
        let Some(link) = self.state.links.iter_mut().find(|k| k.name == dev) else {
            return;
        };
        if link.address6.is_none() {
            link.address6 = l.own6.and_then(|a| Ipv6Net::new(a, 127).ok());
            link.peer_address6 = l.peer6;
        }
    }

    /// What every mapping this node accepts shares: per family and link it forwards over (or
    /// for its own pods), the source NAT of either end's address, and the reply marks and rule.
    /// The state is sorted and deduplicated in the end, so each is added once, not once per
    /// mapping.
    fn accepting_shared(&mut self, family: Family, over_link: Option<LinkEnds<'_>>) {
        let ends = over_link.map(|l| (l.own, l.peer, l.own_ip, l.peer_ip));
        if !self.accepted_over.insert((family, ends)) {
            return;
        }
        let local = self.facts.marks.local();
        match over_link {
            Some(l) => {
                for rule in l.peer_snats(family, local) {
                    self.push_in(family, ChainId::Post, rule);
                }
            }
            // A pod of this node dialing a pod of this node: see `Rule::HairpinMasquerade`.
            None => self.push_in(
                family,
                ChainId::Post,
                Rule::HairpinMasquerade { mark: local },
            ),
        }
        self.push_in(
            family,
            ChainId::Mangle,
            Rule::RestoreReplyMark { mark: local },
        );
        // Steering marks only a flow's first packet; strict rp_filter checks every one.
        self.push_in(
            family,
            ChainId::Mangle,
            Rule::RestoreRequestMark { mark: local },
        );
        self.state.rules.push(IpRule {
            family,
            priority: PREF_REPLY,
            fwmark: local,
            fwmask: self.facts.marks.mask,
            to: None,
            table: MAIN_TABLE,
        });
    }

    /// A socket of this host, a NodePort or a hostPort of a Pod here holds one of the mapping's
    /// ports on `addr` (or on every address) and has not yielded it to the mapping. Admission
    /// refuses such a mapping once this node's row reports the holder; this closes the window
    /// before that (a class and its mappings created together, a node newly named by a class),
    /// in which every agent, this one included, would otherwise accept and capture the port:
    /// sshd's traffic would reach the pod, and the capture would then count as "forwarded
    /// before the holder was seen".
    fn held_here(&self, class: &str, d: &MappingDecision, addr: IpAddr, ports: PortRange) -> bool {
        // Holders are sorted by protocol then port: only those in the range are looked at (a
        // cluster may have thousands of NodePorts).
        let from = self
            .holders
            .partition_point(|h| (h.protocol, h.port) < (d.protocol, ports.first));
        let mut in_range = self.holders[from..]
            .iter()
            .take_while(|h| h.protocol == d.protocol && h.port <= ports.last)
            .filter(|h| h.address.is_unspecified() || h.address == addr)
            .peekable();
        if in_range.peek().is_none() {
            return false;
        }
        let mapping = MappingKey::new(&d.namespace, &d.name);
        let stored_row = self.index.row(class, self.node);
        in_range.any(|s| {
            !yields_to(
                s.protocol,
                s.port,
                &s.address.to_string(),
                self.facts,
                stored_row,
            )
            .iter()
            .any(|m| mapping == *m)
        })
    }

    /// The pod node's half of the link from programming node `p`, in each family the endpoint
    /// has.
    fn pod_half(
        &mut self,
        class: &ClassState,
        d: &MappingDecision,
        p: &str,
        translated: Option<u16>,
        pod_ports: PortRange,
        ports: PortRange,
    ) {
        let Some(ep) = &d.endpoint else { return };
        let Some((l, Some((dev, mark)))) = self.link_to(class, p) else {
            return;
        };
        for family in Family::ALL {
            let (Some(pod), Some(own)) = (ep.address_in(family), l.own_in(family)) else {
                continue;
            };
            self.steer(d, dev.clone(), own, None, ports);
            self.dnat(d, dev.clone(), None, pod, translated, ports);
            self.snat(d, pod, pod_ports);
            if family == Family::V6 {
                self.carry_v6(&dev, &l);
                self.route_pod_by_main(mark, pod);
            }
            self.arrival(family, dev.clone(), mark, &l);
        }
    }

    /// IPv6 requests arriving over a link carry its mark (`Rule::MarkArrival`), which would
    /// send them back into the link; the pod's address under that mark is looked up in the
    /// main table instead, for the request and for a strict reverse-path check of the pod's
    /// reply (which carries the mark too).
    fn route_pod_by_main(&mut self, mark: u32, pod: IpAddr) {
        self.state.rules.push(IpRule {
            family: Family::of(pod),
            priority: PREF_LOOP_GUARD,
            fwmark: mark,
            fwmask: self.facts.marks.mask,
            to: Some(IpNet::from(pod)),
            table: MAIN_TABLE,
        });
    }

    /// What every mapping arriving over link `dev` in `family` shares: its marks, ip rules and
    /// route. The state is sorted and deduplicated in the end, so they are added once per link
    /// instead of once per mapping.
    fn arrival(&mut self, family: Family, dev: String, mark: u32, l: &LinkEnds<'_>) {
        if !self.arrivals.insert((family, dev.clone())) {
            return;
        }
        let Some(via) = l.peer_in(family) else { return };
        let marks = self.facts.marks;
        self.push_in(
            family,
            ChainId::Mangle,
            Rule::SaveArrivalLink {
                iface: dev.clone(),
                mark,
            },
        );
        if family == Family::V6 {
            self.push_in(
                family,
                ChainId::Mangle,
                Rule::MarkArrival {
                    iface: dev.clone(),
                    mark,
                },
            );
        }
        self.push_in(family, ChainId::Mangle, Rule::RestoreReplyMark { mark });
        let table = marks.table(mark);
        if family == Family::V4 {
            // The loop guard: a reply to the peer's InternalIP (IPv4, as the underlay is)
            // leaves by the main table, not back into the link.
            self.state.rules.push(IpRule {
                family,
                priority: PREF_LOOP_GUARD,
                fwmark: mark,
                fwmask: marks.mask,
                to: Ipv4Net::new(l.peer_ip, 32).ok().map(IpNet::V4),
                table: MAIN_TABLE,
            });
        }
        self.state.rules.push(IpRule {
            family,
            priority: PREF_REPLY,
            fwmark: mark,
            fwmask: marks.mask,
            to: None,
            table,
        });
        self.state.routes.push(Route {
            table,
            to: None,
            via,
            dev,
        });
    }

    /// The link guard: per underlay device and link port, the link peers' unicast frames to
    /// the node pass and everything else the node would receive on that port (broadcast,
    /// multicast and anycast destinations included, on any interface) is dropped and counted.
    fn guard(&mut self) {
        let mut peers: BTreeMap<(String, u16), Vec<Ipv4Addr>> = BTreeMap::new();
        for link in &self.state.links {
            if let Some(device) = &link.device {
                peers
                    .entry((device.clone(), link.port))
                    .or_default()
                    .push(link.remote);
            }
        }
        for ((device, port), mut addrs) in peers {
            addrs.sort();
            addrs.dedup();
            self.push(
                ChainId::Guard,
                Rule::GuardAllow {
                    device,
                    port,
                    peers: addrs,
                },
            );
            let drop = Rule::guard_drop(port);
            if let Rule::GuardDrop { counter, .. } = &drop {
                self.state.nft.counters.push(Counter {
                    name: Name::from(counter.as_str()),
                    chain: ChainId::Guard,
                    namespace: Name::from(""),
                    mapping: Name::from(""),
                });
            }
            self.push(ChainId::Guard, drop);
        }
    }

    fn steer(
        &mut self,
        d: &MappingDecision,
        iif: String,
        daddr: IpAddr,
        mark: Option<u32>,
        ports: PortRange,
    ) {
        let family = Family::of(daddr);
        let comment = self.comment(d);
        let rule = SteerRule {
            iif,
            daddr,
            protocol: d.protocol,
            ports,
            mark,
            comment,
        };
        if mark.is_some() {
            self.push_in(family, ChainId::Steer, Rule::MarkRequest(rule.clone()));
        }
        self.push_in(family, ChainId::Steer, Rule::Steer(rule));
    }

    /// The published address `daddr` of the mapping for clients inside the cluster.
    fn hairpin(
        &mut self,
        d: &MappingDecision,
        daddr: IpAddr,
        mark: u32,
        to: IpAddr,
        to_port: Option<u16>,
        ports: PortRange,
    ) {
        let family = Family::of(daddr);
        let (counter, comment) = self.counter(family, ChainId::Pre, d);
        let rule = HairpinRule {
            daddr,
            protocol: d.protocol,
            ports,
            mark,
            to,
            to_port,
            counter,
            comment,
        };
        self.push_in(family, ChainId::Pre, Rule::Hairpin(rule));
    }

    fn dnat(
        &mut self,
        d: &MappingDecision,
        iif: String,
        mark: Option<u32>,
        to: IpAddr,
        to_port: Option<u16>,
        ports: PortRange,
    ) {
        let family = Family::of(to);
        let (counter, comment) = self.counter(family, ChainId::Pre, d);
        let rule = DnatRule {
            iif,
            mark,
            protocol: d.protocol,
            ports,
            to,
            to_port,
            counter,
            comment,
        };
        self.push_in(family, ChainId::Pre, Rule::Dnat(rule));
    }

    fn snat(&mut self, d: &MappingDecision, daddr: IpAddr, ports: PortRange) {
        let family = Family::of(daddr);
        let (counter, comment) = self.counter(family, ChainId::Post, d);
        let rule = SnatRule {
            daddr,
            protocol: d.protocol,
            ports,
            counter,
            comment,
        };
        self.push_in(family, ChainId::Post, Rule::IdentitySnat(rule));
    }

    /// The id of link `name`: the one it already carries on the host when that is still free,
    /// else the lowest id neither handed out nor held by another link on the host. Stable ids
    /// keep the marks recorded in live flows pointing at the right link.
    fn link_id(&mut self, name: &str) -> Option<u32> {
        if let Some(id) = self.link_ids.get(name) {
            return Some(*id);
        }
        let marks = self.facts.marks;
        let taken = |id: u32, e: &Self| e.link_ids.values().any(|v| *v == id);
        // Whether another link on the host holds `id`: all of them count first, so no link's
        // id moves while a free one exists; then, for a serving link only, only serving links
        // count, so a serving link takes a standby link's id rather than go without one.
        let held = |id: u32, e: &Self, serving_only: bool| {
            e.facts.link_ids.iter().any(|(other, v)| {
                *v == id && other != name && (!serving_only || e.serving_links.contains(other))
            })
        };
        let serving = self.serving_links.contains(name);
        let free = |e: &Self, serving_only: bool| {
            (1..=marks.link_capacity()).find(|id| !taken(*id, e) && !held(*id, e, serving_only))
        };
        let id = match self.facts.link_ids.get(name) {
            Some(id) if marks.link_mark(*id).is_some() && !taken(*id, self) => *id,
            _ => free(self, false).or_else(|| serving.then(|| free(self, true)).flatten())?,
        };
        self.link_ids.insert(name.to_owned(), id);
        Some(id)
    }

    /// Adds the link to `peer` (once) and returns its device name and mark; `None` when the
    /// node has no mark left for another link.
    fn link(&mut self, class: &ClassState, peer: &str, l: &LinkEnds<'_>) -> Option<(String, u32)> {
        let name = link_name(class.name, peer);
        let id = self.link_id(&name)?;
        let mark = self.facts.marks.link_mark(id)?;
        let vni = class.vni + l.slot;
        let peer_mtu = self
            .index
            .row(class.name, peer)
            .and_then(|r| r.underlay_mtu)
            .and_then(|m| u32::try_from(m).ok());
        let mtu = self
            .facts
            .underlay_mtu
            .map(|own| peer_mtu.map_or(own, |p| own.min(p)))
            .map(|m| m.saturating_sub(VXLAN_OVERHEAD));
        self.state.links.push(Link {
            name: name.clone(),
            class: class.name.to_owned(),
            peer: peer.to_owned(),
            vni,
            port: class.port,
            device: self.facts.underlay_device.clone(),
            local: l.own_ip,
            remote: l.peer_ip,
            address: Ipv4Net::new(l.own, 31).unwrap_or(l.net),
            peer_address: l.peer,
            address6: None,
            peer_address6: None,
            mtu,
            mark,
            ttl: LINK_TTL,
            rp_filter: RP_FILTER_LOOSE,
        });
        Some((name, mark))
    }
}
