//! The datapath IR: a typed, sorted description of everything kuport owns on one node. The host
//! layer applies it; [`crate::render`] prints its nftables part as `nft list table ip kuport`
//! would.
//!
//! Every collection is sorted and deduplicated by [`HostState::normalise`], so two equal plans
//! give byte-identical renderings.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use crate::api::Protocol;
use crate::keys::{MappingKey, Name};

/// nftables table kuport owns: one per address family (`ip kuport`, `ip6 kuport`).
pub const TABLE: &str = "kuport";

/// An address family: which of kuport's two tables a rule is in, which ip rules and routes a
/// netlink request names, and how nft spells the family's matches.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum Family {
    /// IPv4: `table ip kuport`.
    #[default]
    #[serde(rename = "IPv4")]
    V4,
    /// IPv6: `table ip6 kuport`.
    #[serde(rename = "IPv6")]
    V6,
}

impl Family {
    /// Both families, IPv4 first.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address.
    pub fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// True for IPv4 (the serialised default, left out of the JSON).
    pub fn is_v4(&self) -> bool {
        *self == Family::V4
    }

    /// The table's family as nft writes it, and the keyword of its address matches (`ip
    /// daddr`, `ip6 daddr`).
    pub fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    /// nft's type of an address of the family.
    pub fn addr_type(self) -> &'static str {
        match self {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }

    /// The stand-in address steering moves a mapped destination to.
    pub fn stand_in(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(STAND_IN),
            Family::V6 => IpAddr::V6(STAND_IN6),
        }
    }

    /// The family's name as Kubernetes writes it (`IPv4`, `IPv6`).
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
/// Routing tables kuport owns are numbered from here: `LINK_TABLE_BASE + link id`.
pub const LINK_TABLE_BASE: u32 = 0x6b70_0000;
/// The address every mapped destination is moved to before a host firewall sees it (the
/// steering stage): one link-local address per node, never assigned to a device and never
/// routed, because DNAT replaces it before routing. Its /24 is reserved: refused as a class
/// subnet.
pub const STAND_IN: Ipv4Addr = Ipv4Addr::new(169, 254, 107, 1);
/// The block [`STAND_IN`] belongs to.
pub const STAND_IN_BLOCK: (Ipv4Addr, u8) = (Ipv4Addr::new(169, 254, 107, 0), 24);

/// The IPv6 stand-in: an address of the discard-only prefix `100::/64` (RFC 6666), which no
/// network routes and no host holds, so it can never be a client's or a pod's destination.
pub const STAND_IN6: Ipv6Addr = Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0x6b70, 1);
/// The block [`STAND_IN6`] belongs to: refused as a class's IPv6 link subnet.
pub const STAND_IN6_BLOCK: (Ipv6Addr, u8) = (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64);

/// True for an address in [`STAND_IN_BLOCK`]: kuport refuses it as a node's or an interface's
/// address, since steering would move traffic for it onto the stand-in.
pub fn in_stand_in_block(addr: Ipv4Addr) -> bool {
    let (block, len) = STAND_IN_BLOCK;
    let mask = u32::MAX << (32 - u32::from(len));
    u32::from(addr) & mask == u32::from(block) & mask
}

/// True for an address in either family's stand-in block.
pub fn in_any_stand_in_block(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => in_stand_in_block(a),
        IpAddr::V6(a) => {
            let (block, len) = STAND_IN6_BLOCK;
            let mask = u128::MAX << (128 - u32::from(len));
            u128::from(a) & mask == u128::from(block) & mask
        }
    }
}
/// ip rule priority of the loop guard (link mark to the peer's InternalIP → main).
pub const PREF_LOOP_GUARD: u32 = 101;
/// ip rule priority of the reply steering rules.
pub const PREF_REPLY: u32 = 102;
/// The main routing table.
pub const MAIN_TABLE: u32 = 254;
/// Prefix of every link device kuport owns.
pub const LINK_PREFIX: &str = "kup-";
/// Outer TTL of link packets.
pub const LINK_TTL: u8 = 64;
/// Loose reverse-path filtering.
pub const RP_FILTER_LOOSE: u8 = 2;
/// Bytes VXLAN over IPv4 adds to a packet.
pub const VXLAN_OVERHEAD: u32 = 50;

/// kuport's chains, in the order they are created (and listed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ChainId {
    /// filter prerouting, `raw`: the link guard (UDP to a link port only from link peers, to a
    /// unicast address of the node).
    Guard,
    /// filter prerouting, `mangle + 20`: the steering stage (a new flow to a mapped port on one
    /// of the node's own addresses is marked and moved to the stand-in, past host firewalls).
    Steer,
    /// nat prerouting, `dstnat - 10`: DNAT rules, each marking its flow.
    Pre,
    /// nat postrouting, `srcnat - 10`: identity SNAT claiming kuport's flows.
    Post,
    /// filter prerouting, `mangle + 10`: arrival-link save, and the packet mark restored from
    /// the flow's for replies and later requests.
    Mangle,
    /// filter forward, `mangle`: TCP MSS clamp on kuport's links.
    Fwd,
    /// nat output, `-110`: the node's own processes dialing one of its own published addresses
    /// (locally originated packets never pass prerouting) are DNATed as a client's would be.
    Out,
}

/// The nft hook a chain attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// prerouting
    Prerouting,
    /// postrouting
    Postrouting,
    /// forward
    Forward,
    /// output (locally originated packets)
    Output,
}

impl Hook {
    /// The hook as nft writes it.
    pub fn name(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Postrouting => "postrouting",
            Hook::Forward => "forward",
            Hook::Output => "output",
        }
    }
}

impl ChainId {
    /// All chains in creation order.
    pub const ALL: [ChainId; 7] = [
        ChainId::Guard,
        ChainId::Steer,
        ChainId::Pre,
        ChainId::Post,
        ChainId::Mangle,
        ChainId::Fwd,
        ChainId::Out,
    ];

    /// The chain's name (`kup-` prefixed: `mark`, `fwd`, `dnat`, `snat` are nft keywords).
    pub fn name(self) -> &'static str {
        match self {
            ChainId::Guard => "kup-guard",
            ChainId::Steer => "kup-steer",
            ChainId::Pre => "kup-pre",
            ChainId::Post => "kup-post",
            ChainId::Mangle => "kup-mangle",
            ChainId::Fwd => "kup-fwd",
            ChainId::Out => "kup-out",
        }
    }

    /// `nat` or `filter`.
    pub fn chain_type(self) -> &'static str {
        match self {
            ChainId::Pre | ChainId::Post | ChainId::Out => "nat",
            ChainId::Guard | ChainId::Steer | ChainId::Mangle | ChainId::Fwd => "filter",
        }
    }

    /// The hook the chain attaches to.
    pub fn hook(self) -> Hook {
        match self {
            ChainId::Guard | ChainId::Steer | ChainId::Pre | ChainId::Mangle => Hook::Prerouting,
            ChainId::Post => Hook::Postrouting,
            ChainId::Fwd => Hook::Forward,
            ChainId::Out => Hook::Output,
        }
    }

    /// The priority as an integer: nft accepts a string priority in JSON, reports success and
    /// creates a chain with no hook, so the host layer must always write this number.
    ///
    /// The steering stage sits between -150 (a mesh's mangle mark, netbird's, which must still
    /// see the node's own address) and -110 (a host firewall's filter chain, Talos's, which
    /// drops new connections to the node's addresses); the guard runs before conntrack.
    pub fn priority(self) -> i32 {
        match self {
            ChainId::Guard => -300,
            ChainId::Steer => -130,
            ChainId::Pre => -110,
            ChainId::Post => 90,
            ChainId::Mangle => -140,
            ChainId::Fwd => -150,
            ChainId::Out => -110,
        }
    }

    /// The short label used in counter names and metrics (`pre`, `post`).
    pub fn label(self) -> &'static str {
        match self {
            ChainId::Guard => "guard",
            ChainId::Steer => "steer",
            ChainId::Pre => "pre",
            ChainId::Post => "post",
            ChainId::Mangle => "mangle",
            ChainId::Fwd => "fwd",
            ChainId::Out => "out",
        }
    }
}

/// An inclusive port range (`first == last` for one port).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PortRange {
    /// First port.
    pub first: u16,
    /// Last port (inclusive).
    pub last: u16,
}

impl PortRange {
    /// One port.
    pub fn single(port: u16) -> Self {
        Self {
            first: port,
            last: port,
        }
    }

    /// True when the two ranges share a port.
    pub fn overlaps(&self, other: &PortRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }

    /// True for a range of more than one port.
    pub fn is_range(&self) -> bool {
        self.first != self.last
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_range() {
            write!(f, "{}-{}", self.first, self.last)
        } else {
            write!(f, "{}", self.first)
        }
    }
}

/// One nftables rule kuport owns. Variants are ordered as they appear within a chain.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Rule {
    /// kup-guard: link frames from the link peers on the underlay device, addressed to one of
    /// the node's own addresses (`fib daddr type local`: unicast, never a broadcast or multicast
    /// destination), are let through and left untracked (a host firewall's `ct state new` drop
    /// then cannot see them).
    GuardAllow {
        /// The underlay device.
        device: String,
        /// The link port.
        port: u16,
        /// The peers' underlay addresses, sorted.
        peers: Vec<Ipv4Addr>,
    },
    /// kup-guard: anything else the node would receive on a link port is dropped and counted:
    /// every destination the kernel delivers locally (`fib daddr type` local, broadcast,
    /// anycast or multicast), on every interface. The kernel's VXLAN socket listens on every
    /// address and would take a frame from anyone, a broadcast or multicast one included.
    /// Forwarded traffic on the port (for another address) is not matched.
    GuardDrop {
        /// The link port.
        port: u16,
        /// The named counter of the drops.
        counter: String,
    },
    /// kup-steer: the first packet of a new flow (`ct state new`, which conntrack gives only
    /// to the original direction) to one of this node's own addresses on a mapped port, that
    /// no other datapath has marked, gets kuport's local mark as packet mark, so strict
    /// reverse-path filtering follows kuport's fwmark rule (with `src_valid_mark`). A packet
    /// another datapath marked (netbird marks its mesh traffic and checks the exact value
    /// later) is left as it is. Later packets of the flow take the mark from
    /// [`Rule::RestoreRequestMark`].
    MarkRequest(SteerRule),
    /// kup-steer: the first packet of a new flow to one of this node's own addresses on a
    /// mapped port records the flow's mark and is moved to the stand-in address, out of a host
    /// firewall's way. Only new flows: a reply of the node's own connection from a port in a
    /// mapped range is an established flow's and is never rewritten; later packets of a
    /// steered flow are translated by conntrack's NAT, which needs no steering.
    Steer(SteerRule),
    /// kup-mangle: a reply of a kuport flow takes its flow's mark as packet mark (kuport's
    /// bits only), so ip rules route it back the way the request came.
    RestoreReplyMark {
        /// The mark value restored.
        mark: u32,
    },
    /// kup-mangle: a later packet of a kuport flow in the original direction (the client's),
    /// that no other datapath marked, takes its flow's mark as packet mark, as its first
    /// packet did in kup-steer: strict reverse-path filtering checks every forwarded packet,
    /// so each one needs the mark that makes the check follow kuport's fwmark rule.
    RestoreRequestMark {
        /// The mark value restored (the local mark).
        mark: u32,
    },
    /// kup-mangle: a request arriving over link `iface` records the link's mark in its flow.
    SaveArrivalLink {
        /// The link device.
        iface: String,
        /// The link's mark.
        mark: u32,
    },
    /// kup-mangle (IPv6 only): a request arriving over link `iface` also carries the link's mark
    /// in its packet mark, so a mark-aware reverse-path check (`fib saddr . mark . iif`, IPv6's
    /// strict filter: IPv6 has no `rp_filter` sysctl to loosen per link) finds its way back
    /// into the link; the pod-address rules at the loop guard's priority keep the request
    /// itself going to the pod.
    MarkArrival {
        /// The link device.
        iface: String,
        /// The link's mark.
        mark: u32,
    },
    /// kup-fwd: clamp TCP MSS to the route MTU of packets leaving through a kuport link.
    ClampMssOut,
    /// kup-fwd: clamp TCP MSS to the route MTU of packets arriving from a kuport link.
    ClampMssIn,
    /// kup-pre: destination NAT of one mapping on one input interface.
    Dnat(DnatRule),
    /// kup-steer, kup-pre and kup-out: one published address of a mapping for clients inside
    /// the cluster (`datapath.md`, "Clients inside the cluster"): a pod dialing it is steered
    /// whatever pod device its packet arrives on (not a bound interface nor the underlay), and the node's own processes dialing
    /// it are DNATed in the output hook, to the same target as the mapping's DNAT.
    Hairpin(HairpinRule),
    /// kup-post: a hairpin flow from a pod to a pod of this same node is masqueraded to the
    /// node's address on the pod's interface, so the reply comes back through the node (the
    /// two pods may share a bridge, and a pod dialing its own mapping would see its own
    /// address as the source). Rendered ahead of the identity SNAT, which would keep the source.
    HairpinMasquerade {
        /// The flow mark a hairpin flow carries (the local mark).
        mark: u32,
    },
    /// kup-post, on an accepting node: a flow toward the pod's node over a link whose client is
    /// the InternalIP of either end, or in the pod node's pod CIDR, takes this node's end of
    /// the link as its source. The pod's node itself, a pod it masquerades, or one of its pods
    /// arriving with its own address (Cilium's native routing leaves a pod's traffic to a node
    /// address unmasqueraded) dialing a published address: that node drops a request with its
    /// own address as source, would deliver the reply to itself before any route of the link,
    /// and would hand a pod's reply straight back to the client pod, or to the pod itself, from
    /// the wrong address. This node's own process dialing its own InternalIP: the pod node's
    /// loop guard sends a reply to that address over the mesh instead of the link, with a
    /// source the mesh does not admit. Rendered ahead of the identity SNAT.
    LinkPeerSnat {
        /// The flow mark (the local mark).
        mark: u32,
        /// The clients translated: the InternalIP of one end of the link or a host address the
        /// pod's node lists (host-length), or one of the pod node's pod CIDRs.
        client: IpNet,
        /// The pod node's end of the link: the DNAT target.
        peer_end: IpAddr,
        /// This node's end of the link: the new source.
        own_end: IpAddr,
    },
    /// kup-post: identity source NAT claiming a kuport flow before any CNI masquerade.
    IdentitySnat(SnatRule),
}

impl Rule {
    /// The link guard's drop rule for `port`, counting into `guard/<port>`.
    pub fn guard_drop(port: u16) -> Rule {
        Rule::GuardDrop {
            port,
            counter: format!("guard/{port}"),
        }
    }
}

/// A steering rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SteerRule {
    /// Input interface matched.
    pub iif: String,
    /// The node's own address matched (the interface's address, or the link end).
    pub daddr: IpAddr,
    /// Protocol matched.
    pub protocol: Protocol,
    /// Destination ports matched.
    pub ports: PortRange,
    /// Mark written into the flow (the local mark, on an accepting node); none on the pod's
    /// node, where the arrival link's mark is already in the flow.
    pub mark: Option<u32>,
    /// The mapping.
    pub comment: Name,
}

/// A DNAT rule. It matches only steered packets (the stand-in address, and on an accepting node
/// the flow mark steering wrote): traffic not addressed to the node is never steered.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DnatRule {
    /// Input interface matched.
    pub iif: String,
    /// The flow mark an accepting node's steering wrote (matched under kuport's mask).
    pub mark: Option<u32>,
    /// Protocol matched.
    pub protocol: Protocol,
    /// Destination ports matched.
    pub ports: PortRange,
    /// New destination address.
    pub to: IpAddr,
    /// New destination port: set only for a single port translated to a different pod port.
    pub to_port: Option<u16>,
    /// Named counter of the mapping in this chain.
    pub counter: Name,
    /// The mapping (`namespace/name`, cut to nft's 128 bytes).
    pub comment: Name,
}

/// One published address of a mapping, served to clients inside the cluster: the steering of
/// a pod's packet (from a pod network, not arriving on a bound interface or the underlay) and
/// the output-hook DNAT of the node's own, both to `to`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HairpinRule {
    /// The published address (a bound interface's own address).
    pub daddr: IpAddr,
    /// Protocol matched.
    pub protocol: Protocol,
    /// Destination ports matched.
    pub ports: PortRange,
    /// The flow mark written (the local mark).
    pub mark: u32,
    /// New destination address: the mapping's DNAT target.
    pub to: IpAddr,
    /// New destination port, as [`DnatRule::to_port`].
    pub to_port: Option<u16>,
    /// The mapping's named counter in kup-pre (a hairpin flow counts as any new flow does).
    pub counter: Name,
    /// The mapping.
    pub comment: Name,
}

/// An identity SNAT rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnatRule {
    /// Destination address matched (after DNAT).
    pub daddr: IpAddr,
    /// Protocol matched.
    pub protocol: Protocol,
    /// Destination ports matched (after DNAT).
    pub ports: PortRange,
    /// Named counter of the mapping in this chain.
    pub counter: Name,
    /// The mapping.
    pub comment: Name,
}

/// A named counter object: one per mapping and chain, so counts survive rule changes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Counter {
    /// Object name (`pre/<namespace>/<name>`, cut with a hash suffix when too long). Counter
    /// objects carry no comment: the `nftables` crate's counter object has no such field, and the
    /// name already says which mapping it counts.
    pub name: Name,
    /// The chain whose rules reference it.
    pub chain: ChainId,
    /// The mapping's namespace.
    pub namespace: Name,
    /// The mapping's name.
    pub mapping: Name,
}

/// One of kuport's nftables tables: every address in it is of its family.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NftTable {
    /// The table's family (`ip kuport` or `ip6 kuport`); left out of the JSON for IPv4.
    #[serde(default, skip_serializing_if = "Family::is_v4")]
    pub family: Family,
    /// The mark bits the rules read and write.
    #[serde(default)]
    pub marks: MarkLayout,
    /// Named counters, sorted by name.
    pub counters: Vec<Counter>,
    /// Rules of each chain, in chain order; each list sorted.
    pub chains: Vec<(ChainId, Vec<Rule>)>,
    /// The pod networks a hairpin client's address must lie in (aggregated, sorted): the
    /// `hairpin-sources` set. Empty: no pod is steered by its destination alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hairpin_sources: Vec<IpNet>,
    /// The interfaces a hairpin client's packet must not arrive on (sorted): the node's bound
    /// interfaces and its underlay device, where a pod address could only be spoofed. A pod's
    /// own device is not named: its name is the CNI's (a bridge, a veth per pod), and the route
    /// back to a pod need not leave by it (Cilium routes its pod CIDR via `cilium_host` while a
    /// pod's packets arrive on its `lxc` device).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hairpin_external: Vec<String>,
}

impl NftTable {
    /// Sorts and deduplicates every collection.
    pub fn normalise(&mut self) {
        self.counters.sort_unstable();
        self.counters.dedup();
        self.hairpin_sources = IpNet::aggregate(&self.hairpin_sources);
        self.hairpin_external.sort_unstable();
        self.hairpin_external.dedup();
        self.chains.sort_by_key(|(chain, _)| *chain);
        for (_, rules) in &mut self.chains {
            rules.sort_unstable();
            rules.dedup();
        }
    }

    /// An empty table of `family`.
    pub fn empty(family: Family) -> Self {
        Self {
            family,
            ..Self::default()
        }
    }

    fn empty_v6() -> Self {
        Self::empty(Family::V6)
    }

    /// True when the node needs no table at all.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty() && self.chains.iter().all(|(_, rules)| rules.is_empty())
    }

    /// The rules of one chain.
    pub fn rules(&self, chain: ChainId) -> &[Rule] {
        self.chains
            .iter()
            .find(|(c, _)| *c == chain)
            .map_or(&[], |(_, rules)| rules.as_slice())
    }

    /// The DNAT rules of `kup-pre`, in order.
    pub fn dnat_rules(&self) -> impl Iterator<Item = &DnatRule> {
        self.rules(ChainId::Pre).iter().filter_map(|r| match r {
            Rule::Dnat(d) => Some(d),
            _ => None,
        })
    }

    /// Which mapping (`namespace/name`) each rule belongs to, keyed by the rule's comment: the
    /// DNAT and SNAT rules name their counter, and a steering rule shares its DNAT's comment.
    /// Rules of no mapping (guard, marks, MSS clamps) have no entry.
    pub fn owners(&self) -> RuleOwners {
        let by_counter: BTreeMap<&str, String> = self
            .counters
            .iter()
            .map(|c| {
                let owner = MappingKey::new(&c.namespace, &c.mapping).into_string();
                (c.name.as_str(), owner)
            })
            .collect();
        let mut by_comment = BTreeMap::new();
        for (_, rules) in &self.chains {
            for rule in rules {
                let (comment, counter) = match rule {
                    Rule::Dnat(d) => (&d.comment, &d.counter),
                    Rule::Hairpin(h) => (&h.comment, &h.counter),
                    Rule::IdentitySnat(s) => (&s.comment, &s.counter),
                    _ => continue,
                };
                if let Some(owner) = by_counter.get(counter.as_str()) {
                    by_comment.insert(comment.to_string(), owner.clone());
                }
            }
        }
        let by_counter = by_counter
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        RuleOwners {
            by_counter,
            by_comment,
        }
    }

    /// This table without the rules and counters of the given mappings (`namespace/name`):
    /// what is applied when the kernel refused those mappings' rules, so only they stop.
    pub fn without_mappings(&self, mappings: &BTreeSet<String>) -> NftTable {
        let owners = self.owners();
        let mut out = self.clone();
        out.counters
            .retain(|c| !mappings.contains(MappingKey::new(&c.namespace, &c.mapping).as_str()));
        for (_, rules) in &mut out.chains {
            rules.retain(|r| owners.of_rule(r).is_none_or(|o| !mappings.contains(o)));
        }
        out
    }
}

impl NftTable {
    /// This table without the rules that lead into the `gone` links (see
    /// [`HostState::without_links`]).
    fn cut_links(&mut self, gone: &[&Link]) {
        let on_gone = |iif: &str| gone.iter().any(|l| l.name == iif);
        let far_end = |to: IpAddr| {
            gone.iter().any(|l| {
                IpAddr::V4(l.peer_address) == to || l.peer_address6.map(IpAddr::V6) == Some(to)
            })
        };
        let gone_mark = |mark: u32| gone.iter().any(|l| l.mark == mark);
        for (_, rules) in &mut self.chains {
            rules.retain(|r| match r {
                Rule::Dnat(d) => !on_gone(&d.iif) && !far_end(d.to),
                Rule::Hairpin(h) => !far_end(h.to),
                Rule::LinkPeerSnat { peer_end, .. } => !far_end(*peer_end),
                Rule::IdentitySnat(s) => !far_end(s.daddr),
                Rule::SaveArrivalLink { iface, .. } | Rule::MarkArrival { iface, .. } => {
                    !on_gone(iface)
                }
                Rule::RestoreReplyMark { mark } => !gone_mark(*mark),
                _ => true,
            });
        }
        let dnats: Vec<(String, Name)> = self
            .rules(ChainId::Pre)
            .iter()
            .filter_map(|r| match r {
                Rule::Dnat(d) => Some((d.iif.clone(), d.comment.clone())),
                _ => None,
            })
            .collect();
        for (_, rules) in &mut self.chains {
            rules.retain(|r| match r {
                Rule::Steer(st) | Rule::MarkRequest(st) => {
                    dnats.iter().any(|(i, c)| *i == st.iif && *c == st.comment)
                }
                _ => true,
            });
        }
    }
}

/// The mapping each rule and counter of a table belongs to (see [`NftTable::owners`]).
#[derive(Clone, Debug, Default)]
pub struct RuleOwners {
    by_counter: BTreeMap<String, String>,
    by_comment: BTreeMap<String, String>,
}

impl RuleOwners {
    /// The mapping a rule belongs to; `None` for rules of no mapping.
    pub fn of_rule(&self, rule: &Rule) -> Option<&String> {
        match rule {
            Rule::Dnat(d) => self.by_counter.get(d.counter.as_str()),
            Rule::Hairpin(h) => self.by_counter.get(h.counter.as_str()),
            Rule::IdentitySnat(s) => self.by_counter.get(s.counter.as_str()),
            Rule::Steer(st) | Rule::MarkRequest(st) => self.by_comment.get(st.comment.as_str()),
            _ => None,
        }
    }

    /// The mapping a named counter counts.
    pub fn of_counter(&self, name: &str) -> Option<&String> {
        self.by_counter.get(name)
    }

    /// Every mapping that has a rule in `table` (whose owners these are), sorted.
    pub fn mappings_in(&self, table: &NftTable) -> BTreeSet<String> {
        table
            .chains
            .iter()
            .flat_map(|(_, rules)| rules.iter())
            .filter_map(|r| self.of_rule(r).cloned())
            .collect()
    }
}

/// A VXLAN return link: bound to the underlay device, no learning (both ends are fixed), one VNI
/// per link so the kernel never refuses a second device with the same VNI and port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    /// Device name: `kup-` + 8 hex digits of sha256(`<class>/<peer node>`).
    pub name: String,
    /// The class the link belongs to.
    pub class: String,
    /// The peer node.
    pub peer: String,
    /// VXLAN network identifier (class VNI + slot).
    pub vni: u32,
    /// UDP port (the class's).
    pub port: u16,
    /// The underlay device the link is bound to (holding the local address); unknown without
    /// host facts.
    pub device: Option<String>,
    /// This node's InternalIP (outer source).
    pub local: Ipv4Addr,
    /// The peer's InternalIP (outer destination).
    pub remote: Ipv4Addr,
    /// This node's end of the /31.
    pub address: Ipv4Net,
    /// The peer's end of the /31.
    pub peer_address: Ipv4Addr,
    /// This node's inner IPv6 address (a /127 of the class's IPv6 link subnet): present when
    /// the link carries IPv6 mappings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<Ipv6Net>,
    /// The peer's inner IPv6 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_address6: Option<Ipv6Addr>,
    /// Link MTU; unknown without host facts.
    pub mtu: Option<u32>,
    /// The link's mark (and routing table number).
    pub mark: u32,
    /// Outer TTL of the encapsulated packets.
    pub ttl: u8,
    /// Reverse-path filtering on the link device: always loose (2). Strict filtering drops
    /// every cross-node packet on arrival; the kernel takes the maximum of `all` and the
    /// device's value, so loose on kuport's own devices loosens nothing else.
    pub rp_filter: u8,
}

/// An ip rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpRule {
    /// The family (`ip rule` or `ip -6 rule`); left out of the JSON for IPv4.
    #[serde(default, skip_serializing_if = "Family::is_v4")]
    pub family: Family,
    /// Rule priority.
    pub priority: u32,
    /// Packet mark matched, under `fwmask`.
    pub fwmark: u32,
    /// The bits of the packet mark compared (kuport's mask).
    pub fwmask: u32,
    /// Destination matched, when any (of the rule's family).
    pub to: Option<IpNet>,
    /// Table looked up (254 = main).
    pub table: u32,
}

/// A route in one of kuport's tables.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// Routing table.
    pub table: u32,
    /// Destination; `None` is the default route (of the gateway's family).
    pub to: Option<IpNet>,
    /// Gateway.
    pub via: IpAddr,
    /// Output device.
    pub dev: String,
}

/// Everything kuport must own on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    /// The `ip kuport` table.
    pub nft: NftTable,
    /// The `ip6 kuport` table: the IPv6 twin of every IPv4 mapping rule; left out of the JSON
    /// when empty.
    #[serde(
        default = "NftTable::empty_v6",
        skip_serializing_if = "NftTable::is_empty"
    )]
    pub nft6: NftTable,
    /// Return links, sorted by name.
    pub links: Vec<Link>,
    /// ip rules, sorted.
    pub rules: Vec<IpRule>,
    /// Routes, sorted.
    pub routes: Vec<Route>,
    /// Interfaces whose reverse-path check must honour packet marks (`src_valid_mark`): the
    /// accepting interfaces, sorted.
    #[serde(default)]
    pub valid_mark_interfaces: Vec<String>,
}

/// A port range one mapping captures as an accepting node: what [`HostState::accepting_ports`]
/// reads from an applied state, and what the agent reports back among its host facts (a host
/// socket seen later yields to the mapping).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProgrammedPort {
    /// The mapping, `namespace/name`.
    pub mapping: String,
    /// Its protocol.
    pub protocol: Protocol,
    /// First port.
    pub first: u16,
    /// Last port.
    pub last: u16,
}

impl Default for HostState {
    fn default() -> Self {
        Self {
            nft: NftTable::empty(Family::V4),
            nft6: NftTable::empty(Family::V6),
            links: Vec::new(),
            rules: Vec::new(),
            routes: Vec::new(),
            valid_mark_interfaces: Vec::new(),
        }
    }
}

impl HostState {
    /// Both tables, IPv4 first.
    pub fn tables(&self) -> [&NftTable; 2] {
        [&self.nft, &self.nft6]
    }

    /// Both tables, mutably.
    pub fn tables_mut(&mut self) -> [&mut NftTable; 2] {
        [&mut self.nft, &mut self.nft6]
    }

    /// The table of `family`.
    pub fn table(&self, family: Family) -> &NftTable {
        match family {
            Family::V4 => &self.nft,
            Family::V6 => &self.nft6,
        }
    }

    /// The table of `family`, mutably.
    pub fn table_mut(&mut self, family: Family) -> &mut NftTable {
        match family {
            Family::V4 => &mut self.nft,
            Family::V6 => &mut self.nft6,
        }
    }

    /// The ports this state captures as an accepting node (steered DNAT), by mapping: what a
    /// host socket that appears later must yield to (earliest wins).
    pub fn accepting_ports(&self) -> Vec<ProgrammedPort> {
        let mut out: Vec<ProgrammedPort> = self
            .tables()
            .into_iter()
            .flat_map(|t| t.rules(ChainId::Pre))
            .filter_map(|r| match r {
                Rule::Dnat(d) if d.mark.is_some() => Some(ProgrammedPort {
                    mapping: d.comment.to_string(),
                    protocol: d.protocol,
                    first: d.ports.first,
                    last: d.ports.last,
                }),
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Sorts and deduplicates every collection, so equal states compare and render equal.
    pub fn normalise(&mut self) {
        for table in self.tables_mut() {
            table.normalise();
        }
        self.links.sort_unstable();
        self.links.dedup();
        self.rules.sort_unstable();
        self.rules.dedup();
        self.routes.sort_unstable();
        self.routes.dedup();
        self.valid_mark_interfaces.sort_unstable();
        self.valid_mark_interfaces.dedup();
    }

    /// The mappings (`namespace/name`) that lost at least one rule in `cut`, a reduced copy of
    /// this state: who a refused link or a refused rule takes out.
    pub fn mappings_cut_by(&self, cut: &HostState) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for family in Family::ALL {
            let kept: BTreeSet<&Rule> = cut
                .table(family)
                .chains
                .iter()
                .flat_map(|(_, rules)| rules.iter())
                .collect();
            let table = self.table(family);
            let owners = table.owners();
            out.extend(
                table
                    .chains
                    .iter()
                    .flat_map(|(_, rules)| rules.iter())
                    .filter(|r| !kept.contains(r))
                    .filter_map(|r| owners.of_rule(r).cloned()),
            );
        }
        out
    }

    /// This state without the named links and everything that leads into them: the rules on
    /// the link, the accepting DNAT toward its far end, its marks, rules and route. A steering
    /// rule whose DNAT is gone goes too, so no packet is moved to the stand-in address and then
    /// left unmatched. Applied when the kernel refuses a link, so only the mappings using it
    /// stop.
    pub fn without_links(&self, names: &[String]) -> HostState {
        let gone: Vec<&Link> = self
            .links
            .iter()
            .filter(|l| names.contains(&l.name))
            .collect();
        if gone.is_empty() {
            return self.clone();
        }
        let on_gone = |iif: &str| gone.iter().any(|l| l.name == iif);
        let gone_mark = |mark: u32| gone.iter().any(|l| l.mark == mark);
        let mut out = self.clone();
        out.links.retain(|l| !names.contains(&l.name));
        for table in out.tables_mut() {
            table.cut_links(&gone);
        }
        out.rules.retain(|r| !gone_mark(r.fwmark));
        out.routes.retain(|r| !on_gone(&r.dev));
        out
    }
}

/// The packet and conntrack mark bits kuport owns, and the values it writes into them.
///
/// kuport reads and writes only the bits of `mask` (every write keeps the other bits of the
/// word), so other datapaths' marks pass through untouched. The local mark ("this flow's replies
/// leave by the main table") is `base`; link `k` (1, 2, …) is `base + k` steps of the mask's
/// lowest bit. The default keeps to the low byte, which none of the datapaths in
/// [`KNOWN_MARKS`] uses: 254 links per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MarkLayout {
    /// The local mark's value, inside `mask`.
    pub base: u32,
    /// The bits kuport owns: one contiguous run.
    pub mask: u32,
}

/// Mark bits other datapaths own, which kuport's mask must not touch: (who, bits).
pub const KNOWN_MARKS: [(&str, u32); 5] = [
    ("kube-proxy (0x4000 masquerade, 0x8000 drop)", 0x0000_c000),
    ("Cilium (magic marks 0x0F00)", 0x0000_0f00),
    ("Calico (default mark mask 0xffff0000)", 0xffff_0000),
    ("netbird (0x1bd00)", 0x0001_bd00),
    ("Tailscale (0xff0000)", 0x00ff_0000),
];

impl Default for MarkLayout {
    fn default() -> Self {
        Self {
            base: 0x01,
            mask: 0xff,
        }
    }
}

impl MarkLayout {
    /// Checks the layout: a contiguous non-empty mask, a non-zero base inside it, and no bit
    /// another known datapath uses. The error says which rule failed.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_shape()?;
        let mask = self.mask;
        let clashes: Vec<String> = KNOWN_MARKS
            .iter()
            .filter(|(_, bits)| bits & mask != 0)
            .map(|(who, bits)| format!("{:#010x} used by {who}", bits & mask))
            .collect();
        if !clashes.is_empty() {
            return Err(format!(
                "the mark mask {mask:#010x} overlaps bits {}",
                clashes.join("; ")
            ));
        }
        Ok(())
    }

    /// Checks only that the layout is usable at all (contiguous mask, base inside it), not
    /// whether it overlaps another datapath.
    pub fn validate_shape(&self) -> Result<(), String> {
        let MarkLayout { base, mask } = *self;
        if mask == 0 {
            return Err("the mark mask is empty".to_owned());
        }
        let shifted = mask >> mask.trailing_zeros();
        if shifted & (shifted + 1) != 0 {
            return Err(format!(
                "the mark mask {mask:#010x} is not one contiguous run of bits"
            ));
        }
        if base & !mask != 0 || base == 0 {
            return Err(format!(
                "the mark base {base:#010x} must be non-zero and inside the mask {mask:#010x}"
            ));
        }
        Ok(())
    }

    fn step(&self) -> u32 {
        1 << self.mask.trailing_zeros()
    }

    /// The local mark.
    pub fn local(&self) -> u32 {
        self.base
    }

    /// How many link marks fit after the local mark.
    pub fn link_capacity(&self) -> u32 {
        let top = self.mask >> self.mask.trailing_zeros();
        top.saturating_sub(self.base >> self.mask.trailing_zeros())
    }

    /// The mark of link `id` (1-based), when it fits.
    pub fn link_mark(&self, id: u32) -> Option<u32> {
        (id >= 1 && id <= self.link_capacity()).then(|| self.base + id * self.step())
    }

    /// The routing table of the flows carrying `mark`.
    pub fn table(&self, mark: u32) -> u32 {
        LINK_TABLE_BASE + (mark >> self.mask.trailing_zeros())
    }

    /// The link id a kuport routing table stands for (the inverse of [`Self::table`]).
    pub fn link_id_of_table(&self, table: u32) -> Option<u32> {
        let value = table.checked_sub(LINK_TABLE_BASE)?;
        let base = self.base >> self.mask.trailing_zeros();
        let id = value.checked_sub(base)?;
        (id >= 1 && id <= self.link_capacity()).then_some(id)
    }
}
