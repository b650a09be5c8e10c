//! The datapath IR: a typed, sorted description of everything kuport owns on one node. The host
//! layer applies it; [`crate::render`] prints its nftables part as `nft list table ip kuport`
//! would.
//!
//! Every collection is sorted and deduplicated by [`HostState::normalise`], so two equal plans
//! give byte-identical renderings.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::api::Protocol;

/// nftables table kuport owns (family `ip`).
pub const TABLE: &str = "kuport";
/// The local mark: "this flow's replies leave by the main table".
pub const LOCAL_MARK: u32 = 0x6b70_0000;
/// Mask selecting kuport's mark space (`0x6b70xxxx`).
pub const MARK_MASK: u32 = 0xffff_0000;
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

/// kuport's four chains, in the order they are created (and listed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ChainId {
    /// nat prerouting, `dstnat - 10`: DNAT rules, each marking its flow.
    Pre,
    /// nat postrouting, `srcnat - 10`: identity SNAT claiming kuport's flows.
    Post,
    /// filter prerouting, `mangle + 10`: arrival-link save and reply restore.
    Mangle,
    /// filter forward, `mangle`: TCP MSS clamp on kuport's links.
    Fwd,
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
}

impl ChainId {
    /// All chains in creation order.
    pub const ALL: [ChainId; 4] = [ChainId::Pre, ChainId::Post, ChainId::Mangle, ChainId::Fwd];

    /// The chain's name (`kup-` prefixed: `mark`, `fwd`, `dnat`, `snat` are nft keywords).
    pub fn name(self) -> &'static str {
        match self {
            ChainId::Pre => "kup-pre",
            ChainId::Post => "kup-post",
            ChainId::Mangle => "kup-mangle",
            ChainId::Fwd => "kup-fwd",
        }
    }

    /// `nat` or `filter`.
    pub fn chain_type(self) -> &'static str {
        match self {
            ChainId::Pre | ChainId::Post => "nat",
            ChainId::Mangle | ChainId::Fwd => "filter",
        }
    }

    /// The hook the chain attaches to.
    pub fn hook(self) -> Hook {
        match self {
            ChainId::Pre | ChainId::Mangle => Hook::Prerouting,
            ChainId::Post => Hook::Postrouting,
            ChainId::Fwd => Hook::Forward,
        }
    }

    /// The priority as an integer: nft accepts a string priority in JSON, reports success and
    /// creates a chain with no hook, so the host layer must always write this number.
    pub fn priority(self) -> i32 {
        match self {
            ChainId::Pre => -110,
            ChainId::Post => 90,
            ChainId::Mangle => -140,
            ChainId::Fwd => -150,
        }
    }

    /// The short label used in counter names and metrics (`pre`, `post`).
    pub fn label(self) -> &'static str {
        match self {
            ChainId::Pre => "pre",
            ChainId::Post => "post",
            ChainId::Mangle => "mangle",
            ChainId::Fwd => "fwd",
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
    /// kup-mangle: a reply of a kuport flow takes its flow's mark as packet mark, so ip rules
    /// route it back the way the request came.
    RestoreReplyMark,
    /// kup-mangle: a request arriving over link `iface` records the link's mark in its flow.
    SaveArrivalLink {
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
    /// kup-post: identity source NAT claiming a kuport flow before any CNI masquerade.
    IdentitySnat(SnatRule),
}

/// A DNAT rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DnatRule {
    /// Input interface matched.
    pub iif: String,
    /// Destination address matched (the link end, on the pod's node); none on an accepting node.
    pub daddr: Option<Ipv4Addr>,
    /// Protocol matched.
    pub protocol: Protocol,
    /// Destination ports matched.
    pub ports: PortRange,
    /// Mark written into the flow (the local mark on an accepting node).
    pub set_ct_mark: Option<u32>,
    /// New destination address.
    pub to: Ipv4Addr,
    /// New destination port: set only for a single port translated to a different pod port.
    pub to_port: Option<u16>,
    /// Named counter of the mapping in this chain.
    pub counter: String,
    /// The mapping (`namespace/name`, cut to nft's 128 bytes).
    pub comment: String,
}

/// An identity SNAT rule.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnatRule {
    /// Destination address matched (after DNAT).
    pub daddr: Ipv4Addr,
    /// Protocol matched.
    pub protocol: Protocol,
    /// Destination ports matched (after DNAT).
    pub ports: PortRange,
    /// Named counter of the mapping in this chain.
    pub counter: String,
    /// The mapping.
    pub comment: String,
}

/// A named counter object: one per mapping and chain, so counts survive rule changes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Counter {
    /// Object name (`pre/<namespace>/<name>`, cut with a hash suffix when too long). Counter
    /// objects carry no comment: the `nftables` crate's counter object has no such field, and the
    /// name already says which mapping it counts.
    pub name: String,
    /// The chain whose rules reference it.
    pub chain: ChainId,
    /// The mapping's namespace.
    pub namespace: String,
    /// The mapping's name.
    pub mapping: String,
}

/// kuport's nftables table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NftTable {
    /// Named counters, sorted by name.
    pub counters: Vec<Counter>,
    /// Rules of each chain, in chain order; each list sorted.
    pub chains: Vec<(ChainId, Vec<Rule>)>,
}

impl NftTable {
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
    /// Rule priority.
    pub priority: u32,
    /// Packet mark matched (full 32-bit mask).
    pub fwmark: u32,
    /// Destination matched, when any.
    pub to: Option<Ipv4Net>,
    /// Table looked up (254 = main).
    pub table: u32,
}

/// A route in one of kuport's tables.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// Routing table.
    pub table: u32,
    /// Destination; `None` is the default route.
    pub to: Option<Ipv4Net>,
    /// Gateway.
    pub via: Ipv4Addr,
    /// Output device.
    pub dev: String,
}

/// Everything kuport must own on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    /// The `ip kuport` table.
    pub nft: NftTable,
    /// Return links, sorted by name.
    pub links: Vec<Link>,
    /// ip rules, sorted.
    pub rules: Vec<IpRule>,
    /// Routes, sorted.
    pub routes: Vec<Route>,
}

impl HostState {
    /// Sorts and deduplicates every collection, so equal states compare and render equal.
    pub fn normalise(&mut self) {
        self.nft.counters.sort();
        self.nft.counters.dedup();
        self.nft.chains.sort_by_key(|(chain, _)| *chain);
        for (_, rules) in &mut self.nft.chains {
            rules.sort();
            rules.dedup();
        }
        self.links.sort();
        self.links.dedup();
        self.rules.sort();
        self.rules.dedup();
        self.routes.sort();
        self.routes.dedup();
    }
}

/// The mark (and routing table) of a link with the given VNI: kuport's mark space plus the
/// VNI's low 16 bits.
pub fn link_mark(vni: u32) -> u32 {
    LOCAL_MARK | (vni & 0xffff)
}
