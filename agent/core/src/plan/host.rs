//! Emission: what this node must own, by role (`datapath.md`, "Rules by role").

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

use super::classes::{ClassState, pair_key};
use super::index::Index;
use super::mapping::Working;
use crate::ir::{
    ChainId, Counter, DnatRule, HostState, IpRule, LINK_PREFIX, LINK_TTL, LOCAL_MARK, Link,
    MAIN_TABLE, PREF_LOOP_GUARD, PREF_REPLY, PortRange, RP_FILTER_LOOSE, Route, Rule, SnatRule,
    VXLAN_OVERHEAD, link_mark,
};
use crate::snapshot::HostFacts;

/// nft comments (and kuport's counter names) hold at most this many bytes.
pub const NFT_TEXT_MAX: usize = 128;

/// The first 8 hex digits of the text's sha256: identical on every node, short enough for
/// interface names (15 bytes) and nft names.
fn short_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Device name of the link from this node to `peer` in `class`.
pub fn link_name(class: &str, peer: &str) -> String {
    format!("{LINK_PREFIX}{}", short_hash(&format!("{class}/{peer}")))
}

/// `text` if it fits nft's limit, else its head plus `~` and 8 hex digits of its sha256.
pub fn fit_nft_text(text: &str) -> String {
    if text.len() <= NFT_TEXT_MAX {
        return text.to_owned();
    }
    let hash = short_hash(text);
    let mut cut = NFT_TEXT_MAX - hash.len() - 1;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hash}", &text[..cut])
}

/// A usable link between a programming node and the pod's node, as seen from `this_node`.
struct LinkEnds {
    net: Ipv4Net,
    own: Ipv4Addr,
    peer: Ipv4Addr,
    own_ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    slot: u32,
}

/// The link between `this_node` and `peer`, if its claim landed and both ends have an
/// InternalIP. Nothing that uses a slot is emitted before that.
fn usable_link(index: &Index, class: &ClassState, this_node: &str, peer: &str) -> Option<LinkEnds> {
    if !class.builds_links() {
        return None;
    }
    let key = pair_key(this_node, peer);
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
        own_ip: index.internal_ip(this_node)?,
        peer_ip: index.internal_ip(peer)?,
        slot,
    })
}

struct Emitter<'a> {
    index: &'a Index<'a>,
    facts: &'a HostFacts,
    node: &'a str,
    state: HostState,
    chains: BTreeMap<ChainId, Vec<Rule>>,
}

/// Everything `this_node` must own.
pub fn emit(
    index: &Index,
    classes: &BTreeMap<&str, ClassState>,
    work: &[Working],
    this_node: &str,
    facts: &HostFacts,
) -> HostState {
    let mut e = Emitter {
        index,
        facts,
        node: this_node,
        state: HostState::default(),
        chains: BTreeMap::new(),
    };
    for w in work.iter().filter(|w| w.decision.emits) {
        let Some(class) = classes.get(w.decision.class.as_str()) else {
            continue;
        };
        e.mapping(class, w);
    }
    let any = !e.chains.is_empty() || !e.state.links.is_empty();
    if any {
        e.push(ChainId::Mangle, Rule::RestoreReplyMark);
        e.push(ChainId::Fwd, Rule::ClampMssOut);
        e.push(ChainId::Fwd, Rule::ClampMssIn);
    }
    let mut state = e.state;
    state.nft.chains = e.chains.into_iter().collect();
    state.normalise();
    state
}

impl Emitter<'_> {
    fn push(&mut self, chain: ChainId, rule: Rule) {
        self.chains.entry(chain).or_default().push(rule);
    }

    fn counter(&mut self, chain: ChainId, namespace: &str, name: &str) -> (String, String) {
        let comment = fit_nft_text(&format!("{namespace}/{name}"));
        let counter = fit_nft_text(&format!("{}/{namespace}/{name}", chain.label()));
        self.state.nft.counters.push(Counter {
            name: counter.clone(),
            chain,
            namespace: namespace.to_owned(),
            mapping: name.to_owned(),
        });
        (counter, comment)
    }

    fn mapping(&mut self, class: &ClassState, w: &Working) {
        let d = &w.decision;
        let (Some(ep), Some(ports)) = (&d.endpoint, d.ports) else {
            return;
        };
        let translated = (!ports.is_range() && ports.first != ep.port).then_some(ep.port);
        let pod_ports = translated.map_or(ports, PortRange::single);
        let binds = |node: &str| d.bindings.get(node).is_some_and(|i| !i.is_empty());

        // Accepting role.
        if d.programming_nodes.iter().any(|n| n == self.node) && binds(self.node) {
            let target = if ep.node == self.node {
                Some((ep.address, translated, pod_ports))
            } else {
                usable_link(self.index, class, self.node, &ep.node).map(|l| {
                    self.link(class, &ep.node, &l);
                    (l.peer, None, ports)
                })
            };
            if let Some((to, to_port, snat_ports)) = target {
                let ifaces = d.bindings.get(self.node).cloned().unwrap_or_default();
                for iface in ifaces {
                    self.dnat(d, iface, None, Some(LOCAL_MARK), to, to_port, ports);
                }
                self.snat(d, to, snat_ports);
                self.state.rules.push(IpRule {
                    priority: PREF_REPLY,
                    fwmark: LOCAL_MARK,
                    to: None,
                    table: MAIN_TABLE,
                });
            }
        }

        // Pod node role: the far half of every usable link from a programming node.
        let node = self.node;
        if ep.node == node {
            for p in d
                .programming_nodes
                .iter()
                .filter(|p| **p != node && binds(p))
            {
                let Some(l) = usable_link(self.index, class, self.node, p) else {
                    continue;
                };
                let dev = self.link(class, p, &l);
                let mark = link_mark(class.vni + l.slot);
                self.push(
                    ChainId::Mangle,
                    Rule::SaveArrivalLink {
                        iface: dev.clone(),
                        mark,
                    },
                );
                self.dnat(
                    d,
                    dev.clone(),
                    Some(l.own),
                    None,
                    ep.address,
                    translated,
                    ports,
                );
                self.snat(d, ep.address, pod_ports);
                let peer_host = Ipv4Net::new(l.peer_ip, 32).ok();
                self.state.rules.push(IpRule {
                    priority: PREF_LOOP_GUARD,
                    fwmark: mark,
                    to: peer_host,
                    table: MAIN_TABLE,
                });
                self.state.rules.push(IpRule {
                    priority: PREF_REPLY,
                    fwmark: mark,
                    to: None,
                    table: mark,
                });
                self.state.routes.push(Route {
                    table: mark,
                    to: None,
                    via: l.peer,
                    dev,
                });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn dnat(
        &mut self,
        d: &super::MappingDecision,
        iif: String,
        daddr: Option<Ipv4Addr>,
        set_ct_mark: Option<u32>,
        to: Ipv4Addr,
        to_port: Option<u16>,
        ports: PortRange,
    ) {
        let (counter, comment) = self.counter(ChainId::Pre, &d.namespace, &d.name);
        let rule = DnatRule {
            iif,
            daddr,
            protocol: d.protocol,
            ports,
            set_ct_mark,
            to,
            to_port,
            counter,
            comment,
        };
        self.push(ChainId::Pre, Rule::Dnat(rule));
    }

    fn snat(&mut self, d: &super::MappingDecision, daddr: Ipv4Addr, ports: PortRange) {
        let (counter, comment) = self.counter(ChainId::Post, &d.namespace, &d.name);
        let rule = SnatRule {
            daddr,
            protocol: d.protocol,
            ports,
            counter,
            comment,
        };
        self.push(ChainId::Post, Rule::IdentitySnat(rule));
    }

    /// Adds the link to `peer` (once) and returns its device name.
    fn link(&mut self, class: &ClassState, peer: &str, l: &LinkEnds) -> String {
        let name = link_name(class.name, peer);
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
            mtu,
            mark: link_mark(vni),
            ttl: LINK_TTL,
            rp_filter: RP_FILTER_LOOSE,
        });
        name
    }
}
