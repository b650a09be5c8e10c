//! What the plan's stages share: the state of each class and of each mapping as the pass fills
//! it in, and the few readings more than one stage makes of it. The stages (`classes`,
//! `mapping`, `emit`, `status`) depend on this module and never on each other, so each can be
//! read, and changed, on its own.
//!
//! The order of a pass (`plan()`): `classes` evaluates each class's settings; `mapping` admits
//! and resolves every PortMap into a [`Working`]; `classes` assigns link slots from the links
//! they need; `mapping` gates `Programmed`; `emit` builds this node's host state and `status`
//! its writes from the same [`ClassState`]s and [`Working`]s.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::jiff::Timestamp;

use super::bindings::SetId;
use super::fast_hash::FastMap;
use super::reasons::{ClassReason, Outcome};
use super::{MappingDecision, NeededLink};
use crate::api::{ClassNodeStatus, LinkClaim, PortMap, PortMapClass, Protocol, ReturnPathMode};
use crate::ir::LINK_PREFIX;
use crate::keys::{Name, NodePair};
use crate::snapshot::{HostFacts, KernelRefusal};
use crate::text::short_hash;

/// A landed claim, as read from the class status.
#[derive(Clone, Debug)]
pub struct Claim {
    pub slot: u32,
    pub unused_since: Option<Timestamp>,
}

/// Everything the plan knows about one class.
pub struct ClassState<'a> {
    pub name: &'a str,
    pub class: &'a PortMapClass,
    /// Sorted by name (the serving order).
    pub accepting: Vec<&'a str>,
    /// Each accepting node's place in `accepting`: asked for every mapping's endpoint, a hash
    /// instead of a search comparing names.
    pub rank: FastMap<&'a str, usize>,
    /// `accepting` as the pass's shared names: each mapping's serving node (and each endpoint
    /// on an accepting node) takes its copy from here, found by rank, not by hashing the name.
    pub accepting_names: Vec<Name>,
    pub mode: ReturnPathMode,
    /// Parsed, masked subnet of a Vxlan class with usable settings.
    pub subnet: Option<Ipv4Net>,
    /// Parsed, masked IPv6 link prefix of the same class (at most a /96).
    pub subnet6: Option<Ipv6Net>,
    pub vni: u32,
    pub port: u16,
    /// How many /31 slots can be used (bounded by the subnet and by the VNI space).
    pub usable_slots: u32,
    /// Why the class's own return-path settings cannot be used (InvalidSubnet,
    /// ReturnPathOverlap or VxlanPortConflict): the class then builds no link.
    pub invalid: Option<Outcome<ClassReason>>,
    /// Valid landed claims by pair.
    pub claims: BTreeMap<NodePair, Claim>,
    /// Needed pairs without a claim that got a free slot (identical on every node).
    pub proposals: BTreeMap<NodePair, u32>,
    /// Serving pairs without a claim, without a free slot and without a standby claim to take
    /// over.
    pub exhausted: BTreeSet<NodePair>,
    /// Standby-only pairs without a claim and without a free slot.
    pub standby_exhausted: BTreeSet<NodePair>,
    /// Needed pairs (serving and standby), each with the nodes that propose it: the pod-side
    /// node of the pair for each mapping needing it.
    pub needed: BTreeMap<NodePair, BTreeSet<String>>,
    /// Needed pairs some mapping needs as serving (its programming node's link); the rest of
    /// `needed` is standby only.
    pub serving: BTreeSet<NodePair>,
    /// Proposals that take over a standby claim's slot: serving pair -> standby pair.
    pub replacing: BTreeMap<NodePair, NodePair>,
    /// Landed standby claims a serving pair takes over: no longer used for links, so both ends
    /// tear the standby link down before the new claim's link (same VNI) is built.
    pub evicted: BTreeSet<NodePair>,
    pub ready: Outcome<ClassReason>,
}

impl ClassState<'_> {
    /// True when the class may build links (Vxlan, with valid settings).
    pub fn builds_links(&self) -> bool {
        self.mode == ReturnPathMode::Vxlan && self.invalid.is_none() && self.subnet.is_some()
    }

    /// The slot of `pair`: landed claim first, then this pass's global proposal.
    pub fn slot_of(&self, pair: &NodePair) -> Option<(u32, bool)> {
        if let Some(claim) = self
            .claims
            .get(pair)
            .filter(|_| !self.evicted.contains(pair))
        {
            return Some((claim.slot, true));
        }
        self.proposals.get(pair).map(|slot| (*slot, false))
    }

    /// The /31 of a slot, as (network, even address, odd address).
    pub fn slot_net(&self, slot: u32) -> Option<(Ipv4Net, Ipv4Addr, Ipv4Addr)> {
        let subnet = self.subnet?;
        let base = u32::from(subnet.network()).checked_add(slot.checked_mul(2)?)?;
        let net = Ipv4Net::new(Ipv4Addr::from(base), 31).ok()?;
        Some((net, Ipv4Addr::from(base), Ipv4Addr::from(base + 1)))
    }

    /// The IPv6 address of a link end whose IPv4 link address is `v4`: the class's IPv6 prefix
    /// with `v4` as its low 32 bits.
    pub fn link_address6(&self, v4: Ipv4Addr) -> Option<Ipv6Addr> {
        let prefix = self.subnet6?;
        Some(Ipv6Addr::from(
            u128::from(prefix.network()) | u128::from(u32::from(v4)),
        ))
    }
}

/// The entries of `links` that count as claims: a well-formed key and a slot below
/// `usable_slots`; when two claim one slot (only possible by hand), the first by key keeps it.
/// The plan and the status merge both read claims through this, so an entry the plan ignores
/// never keeps the merge from landing what the plan proposed instead.
pub fn valid_claims(links: &[LinkClaim], usable_slots: u32) -> BTreeMap<NodePair, Claim> {
    let mut by_key: Vec<&LinkClaim> = links.iter().collect();
    by_key.sort_by(|a, b| a.key.cmp(&b.key));
    let mut used = BTreeSet::new();
    let mut claims = BTreeMap::new();
    for link in by_key {
        let Ok(slot) = u32::try_from(link.slot) else {
            continue;
        };
        let Some(pair) = NodePair::parse(&link.key) else {
            continue;
        };
        if slot >= usable_slots || claims.contains_key(&pair) {
            continue;
        }
        if used.insert(slot) {
            claims.insert(
                pair,
                Claim {
                    slot,
                    unused_since: link.unused_since.as_ref().map(|t| t.0),
                },
            );
        }
    }
    claims
}

/// A mapping being resolved.
pub struct Working<'a> {
    pub pm: &'a PortMap,
    pub decision: MappingDecision,
    /// True when some programming node is not the pod's node.
    pub remote: bool,
    /// The mapping's binding set (when its class exists).
    pub set: Option<SetId>,
    /// What decides its programming nodes, bindings and published rows, once resolved: mappings
    /// with the same group share them.
    pub group: Option<Group<'a>>,
    /// Why no endpoint is used although ready ones exist (none is a pod address).
    pub endpoint_rejection: Option<String>,
    /// `Programmed` is false only while another agent takes the protocol's next step (see
    /// [`super::PortMapWrite::settling`]).
    pub settling: bool,
}

/// Class, binding set, and the serving node of a Single class (a Multi class programs every
/// accepting node, whichever serves).
pub type Group<'a> = (&'a str, SetId, Option<&'a str>);

/// Device name of the link from this node to `peer` in `class`.
pub fn link_name(class: &str, peer: &str) -> String {
    let mut key = String::with_capacity(class.len() + 1 + peer.len());
    key.push_str(class);
    key.push('/');
    key.push_str(peer);
    format!("{LINK_PREFIX}{}", short_hash(&key))
}

/// True when `refusal` is of a return link that, on `this_node`, `d` keeps only as a standby
/// link: the mapping's traffic does not use it, so losing it does not stop the mapping (the
/// agent logs the refusal; a failover to that edge would wait for the link).
pub fn standby_only(d: &MappingDecision, this_node: &str, refusal: &KernelRefusal) -> bool {
    let Some(link) = refusal.link.as_deref() else {
        return false;
    };
    let is = |l: &NeededLink| {
        l.peer_of(this_node)
            .is_some_and(|peer| link_name(&l.class, peer) == link)
    };
    !d.links.iter().any(is) && d.standby_links.iter().any(is)
}

/// Who keeps a held port: as recorded when the holder was first reported (so it survives agent
/// restarts), or, for a holder seen now for the first time, the mappings the datapath already
/// captured the port for. A holder present before kuport looked yields to nobody.
pub fn yields_to(
    protocol: Protocol,
    port: u16,
    address: &str,
    facts: &HostFacts,
    stored_row: Option<&ClassNodeStatus>,
) -> Vec<String> {
    let known = stored_row.and_then(|r| {
        r.held_ports
            .iter()
            .find(|h| h.protocol == protocol && h.port == i32::from(port) && h.address == address)
    });
    if let Some(known) = known {
        return known.yields_to.clone();
    }
    let mut mappings: Vec<String> = facts
        .programmed_ports
        .iter()
        .filter(|p| p.protocol == protocol && (p.first..=p.last).contains(&port))
        .map(|p| p.mapping.clone())
        .collect();
    mappings.sort();
    mappings.dedup();
    mappings
}
