//! A packet tracer over the datapath IR: what a node's kuport rules do to one packet, without a
//! kernel. It follows the chains in hook order (guard, mangle, steering and DNAT in prerouting,
//! then kuport's ip rules and routes, then the identity SNAT in postrouting) with the same match
//! and set semantics as the rendered nft text (`render::rule_text`), and reports the verdict,
//! the rewrites, the marks and the route. The plan tests use it as the unprivileged twin of the
//! lab: a client's request DNATed with its source kept, the reply marked into the right link, a
//! forwarded packet untouched.
//!
//! It traces kuport's rules only: conntrack is the caller's (pass the flow's state and mark,
//! and whether the packet is a reply), and other datapaths' rules are not modelled. A packet of
//! an established flow is not steered and not DNATed by kuport's rules (NAT chains see only a
//! flow's first packet): conntrack's binding translates it, which the caller knows.

use std::net::IpAddr;

use crate::api::Protocol;
use crate::ir::{
    ChainId, Family, HairpinRule, HostState, LINK_PREFIX, MAIN_TABLE, NftTable, PortRange, Rule,
    SteerRule,
};

/// What conntrack knows of a packet's flow when it reaches kuport's chains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CtState {
    /// The first packet of a flow (`ct state new`; never a reply).
    #[default]
    New,
    /// A packet of a flow conntrack already holds (either direction).
    Established,
    /// No conntrack entry (`notrack`): ct expressions match nothing.
    Untracked,
}

/// A packet as it reaches a node, with what conntrack knows of its flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The interface it arrives on.
    pub iif: String,
    /// Source address.
    pub saddr: IpAddr,
    /// Destination address (of the source's family: the packet's family picks the table).
    pub daddr: IpAddr,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Destination port.
    pub dport: u16,
    /// The packet mark it arrives with (another datapath may have set bits).
    pub meta_mark: u32,
    /// Its flow's conntrack mark.
    pub ct_mark: u32,
    /// True for a packet of the reply direction of its flow.
    pub reply: bool,
    /// Its flow's conntrack state.
    pub ct_state: CtState,
    /// The node's own addresses (`fib daddr type local`).
    pub local: Vec<IpAddr>,
    /// The broadcast addresses of the node's subnets (`fib daddr type broadcast`, besides
    /// 255.255.255.255 and 0.0.0.0/8, which always are).
    pub broadcast: Vec<IpAddr>,
    /// Anycast addresses in the node's local table (`fib daddr type anycast`).
    pub anycast: Vec<IpAddr>,
    /// The destination before steering moved it to the stand-in (conntrack's original tuple),
    /// set by the tracer.
    pub original_daddr: Option<IpAddr>,
    /// Sent by one of the node's own processes: it passes the output hook (kup-out), never
    /// prerouting.
    pub local_out: bool,
    /// The interface a forwarded packet leaves by after routing (postrouting's `oifname`);
    /// empty when unknown.
    pub oif: String,
}

/// How the node's local routing table types an address, as `fib daddr type` reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrType {
    /// None of the others: not for the node (forwarded, if routed at all).
    Unicast,
    /// One of the node's own addresses.
    Local,
    /// A broadcast address.
    Broadcast,
    /// An anycast address of the node.
    Anycast,
    /// A multicast group.
    Multicast,
}

impl Packet {
    /// The type of the packet's destination on this node (the kernel's order: the limited
    /// broadcast and 0.0.0.0/8 first, then multicast, then the local table).
    pub fn daddr_type(&self) -> AddrType {
        let d = self.daddr;
        let limited = matches!(d, IpAddr::V4(v4) if v4.is_broadcast() || v4.octets()[0] == 0);
        if limited {
            AddrType::Broadcast
        } else if d.is_multicast() {
            AddrType::Multicast
        } else if self.local.contains(&d) {
            AddrType::Local
        } else if self.broadcast.contains(&d) {
            AddrType::Broadcast
        } else if self.anycast.contains(&d) {
            AddrType::Anycast
        } else {
            AddrType::Unicast
        }
    }
}

impl Packet {
    /// A first packet of a new flow, unmarked.
    pub fn new(
        iif: &str,
        saddr: impl Into<IpAddr>,
        daddr: impl Into<IpAddr>,
        protocol: Protocol,
        dport: u16,
    ) -> Self {
        Self {
            iif: iif.to_owned(),
            saddr: saddr.into(),
            daddr: daddr.into(),
            protocol,
            dport,
            meta_mark: 0,
            ct_mark: 0,
            reply: false,
            ct_state: CtState::New,
            local: Vec::new(),
            broadcast: Vec::new(),
            anycast: Vec::new(),
            original_daddr: None,
            local_out: false,
            oif: String::new(),
        }
    }

    /// A first packet one of the node's own processes sends (the output hook; its source is
    /// the address the kernel chose).
    pub fn local(
        saddr: impl Into<IpAddr>,
        daddr: impl Into<IpAddr>,
        protocol: Protocol,
        dport: u16,
    ) -> Self {
        Self {
            local_out: true,
            ..Self::new("lo", saddr, daddr, protocol, dport)
        }
    }

    /// The packet's family: which of kuport's tables and ip rules it meets.
    pub fn family(&self) -> Family {
        Family::of(self.saddr)
    }

    /// The same packet leaving by `oif` after routing.
    pub fn leaving_by(&self, oif: &str) -> Self {
        Self {
            oif: oif.to_owned(),
            ..self.clone()
        }
    }

    /// A later packet of the same flow in the same direction: conntrack holds the flow and
    /// its mark (`ct_mark`), and the packet arrives as the first one did, unmarked.
    pub fn later(&self, ct_mark: u32) -> Self {
        Self {
            ct_state: CtState::Established,
            ct_mark,
            ..self.clone()
        }
    }
}

/// Where kuport's ip rules send the packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteDecision {
    /// No kuport rule matched, or one sent it to the main table: the host's own routing.
    Main,
    /// A kuport table routed it over a link.
    Via {
        /// The table.
        table: u32,
        /// The next hop.
        via: IpAddr,
        /// The device.
        dev: String,
    },
    /// A kuport rule chose a table that has no route for it.
    Unroutable {
        /// The table.
        table: u32,
    },
}

/// What kuport's rules did to the packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// Dropped, and by which counter.
    pub dropped: Option<String>,
    /// Accepted untracked by the link guard (ct expressions then match nothing).
    pub untracked: bool,
    /// Moved to the stand-in address by the steering stage.
    pub steered: bool,
    /// The destination after DNAT (address, port), when a DNAT rule took it.
    pub dnat: Option<(IpAddr, u16)>,
    /// An identity SNAT claimed the flow (its source is kept, no masquerade).
    pub identity_snat: bool,
    /// The source kuport translated the flow to: the node's address on the pod's interface
    /// for a hairpin between two pods of the node (`masquerade`, shown as `None` in
    /// `snat_to`), or this node's link end for the pod node's own request.
    pub masquerade: bool,
    /// The source address an SNAT rule wrote (the link end), when one did.
    pub snat_to: Option<IpAddr>,
    /// The packet mark after prerouting.
    pub meta_mark: u32,
    /// The flow's conntrack mark after prerouting.
    pub ct_mark: u32,
    /// The destination the route is looked up for.
    pub daddr: IpAddr,
    /// The route kuport's ip rules chose (none for a dropped packet).
    pub route: Option<RouteDecision>,
    /// The route back to the packet's source under its mark after prerouting: what a
    /// mark-aware strict reverse-path check (`fib saddr . mark . iif oif`, or `rp_filter` with
    /// `src_valid_mark`) looks up; it passes when the route leaves by the arrival interface.
    /// None for a dropped packet or one of the node's own.
    pub reverse_route: Option<RouteDecision>,
    /// Named counters the packet passed, in order.
    pub counters: Vec<String>,
}

/// Traces `packet` through the kuport rules of `state`.
pub fn trace(state: &HostState, packet: &Packet) -> Trace {
    let mut p = packet.clone();
    let mut t = Trace {
        dropped: None,
        untracked: false,
        steered: false,
        dnat: None,
        identity_snat: false,
        masquerade: false,
        snat_to: None,
        meta_mark: p.meta_mark,
        ct_mark: p.ct_mark,
        daddr: p.daddr,
        route: None,
        reverse_route: None,
        counters: Vec::new(),
    };
    if p.local_out {
        // The node's own packet: the output hook only (kup-out), then postrouting.
        out(state, &mut p, &mut t);
    } else {
        // Prerouting, in priority order: guard (-300), mangle (-140), steer (-130), DNAT (-110).
        if !guard(state, &mut p, &mut t) {
            return t;
        }
        mangle(state, &mut p);
        steer(state, &mut p, &mut t);
        dnat(state, &mut p, &mut t);
    }
    t.meta_mark = p.meta_mark;
    t.ct_mark = p.ct_mark;
    t.daddr = p.daddr;
    t.route = Some(route(state, &p));
    if !p.local_out {
        t.reverse_route = Some(route_to(state, p.family(), p.meta_mark, p.saddr));
    }
    identity_snat(state, &p, &mut t);
    t
}

/// The table of the packet's family.
fn table<'a>(state: &'a HostState, p: &Packet) -> &'a NftTable {
    state.table(p.family())
}

/// Writes kuport's bits of a mark word, keeping the others.
fn set_bits(state: &HostState, word: u32, value: u32) -> u32 {
    (word & !state.nft.marks.mask) | value
}

/// kup-guard; false when the packet is dropped. A link peer's unicast frame to the node goes
/// on untracked; anything else the node would receive on a link port is dropped.
fn guard(state: &HostState, p: &mut Packet, t: &mut Trace) -> bool {
    let kind = p.daddr_type();
    for rule in table(state, p).rules(ChainId::Guard) {
        match rule {
            Rule::GuardAllow {
                device,
                port,
                peers,
            } if p.iif == *device
                && p.protocol == Protocol::Udp
                && p.dport == *port
                && matches!(p.saddr, IpAddr::V4(a) if peers.contains(&a))
                && kind == AddrType::Local =>
            {
                t.untracked = true;
                p.ct_state = CtState::Untracked;
                return true;
            }
            Rule::GuardDrop { port, counter }
                if p.protocol == Protocol::Udp && p.dport == *port && kind != AddrType::Unicast =>
            {
                t.counters.push(counter.clone());
                t.dropped = Some(counter.clone());
                return false;
            }
            _ => {}
        }
    }
    true
}

/// kup-mangle: a reply takes its flow's mark, and so does a later request no other datapath
/// marked; a request over a link records the link's (and, in IPv6, carries it). Untracked
/// packets have no flow.
fn mangle(state: &HostState, p: &mut Packet) {
    let mask = state.nft.marks.mask;
    if p.ct_state == CtState::Untracked {
        return;
    }
    for rule in table(state, p).rules(ChainId::Mangle) {
        match rule {
            Rule::RestoreReplyMark { mark } if p.reply && p.ct_mark & mask == *mark => {
                p.meta_mark = set_bits(state, p.meta_mark, *mark);
            }
            Rule::RestoreRequestMark { mark }
                if !p.reply && p.ct_mark & mask == *mark && p.meta_mark & !mask == 0 =>
            {
                p.meta_mark = set_bits(state, p.meta_mark, *mark);
            }
            Rule::SaveArrivalLink { iface, mark } if !p.reply && p.iif == *iface => {
                p.ct_mark = set_bits(state, p.ct_mark, *mark);
            }
            Rule::MarkArrival { iface, mark } if !p.reply && p.iif == *iface => {
                p.meta_mark = set_bits(state, p.meta_mark, *mark);
            }
            _ => {}
        }
    }
}

/// kup-steer, for a new flow's first packet only: the packet mark (unless another datapath
/// set one), the flow mark, the stand-in.
fn steer(state: &HostState, p: &mut Packet, t: &mut Trace) {
    let mask = state.nft.marks.mask;
    for rule in table(state, p).rules(ChainId::Steer) {
        match rule {
            Rule::MarkRequest(r) if steer_matches(r, p) && p.meta_mark & !mask == 0 => {
                let mark = r.mark.unwrap_or(state.nft.marks.local());
                p.meta_mark = set_bits(state, p.meta_mark, mark);
            }
            Rule::Steer(r) if steer_matches(r, p) => {
                if let Some(mark) = r.mark {
                    p.ct_mark = set_bits(state, p.ct_mark, mark);
                }
                p.daddr = p.family().stand_in();
                t.steered = true;
            }
            _ => {}
        }
    }
    if t.steered {
        return;
    }
    // The hairpin lookups come after the interfaces' own in the chain.
    let from_pod = p.ct_state == CtState::New
        && !p.reply
        && !table(state, p).hairpin_external.contains(&p.iif)
        && table(state, p)
            .hairpin_sources
            .iter()
            .any(|n| n.contains(&p.saddr));
    if let Some(h) = hairpin_of(state, p).filter(|_| from_pod) {
        if p.meta_mark & !mask == 0 {
            p.meta_mark = set_bits(state, p.meta_mark, h.mark);
        }
        p.ct_mark = set_bits(state, p.ct_mark, h.mark);
        p.original_daddr = Some(p.daddr);
        p.daddr = p.family().stand_in();
        t.steered = true;
    }
}

/// The hairpin element a packet's destination (before steering) falls in.
fn hairpin_of<'a>(state: &'a HostState, p: &Packet) -> Option<&'a HairpinRule> {
    let daddr = p.original_daddr.unwrap_or(p.daddr);
    table(state, p)
        .rules(ChainId::Pre)
        .iter()
        .find_map(|r| match r {
            Rule::Hairpin(h)
                if h.daddr == daddr && h.protocol == p.protocol && in_ports(h.ports, p.dport) =>
            {
                Some(h)
            }
            _ => None,
        })
}

/// kup-out: the node's own first packet to one of its published addresses is DNATed as a
/// client's would be, and its flow marked (a NAT chain: first packets only).
fn out(state: &HostState, p: &mut Packet, t: &mut Trace) {
    if p.ct_state != CtState::New {
        return;
    }
    if let Some(h) = hairpin_of(state, p) {
        p.ct_mark = set_bits(state, p.ct_mark, h.mark);
        t.counters.push(h.counter.to_string());
        p.daddr = h.to;
        p.dport = h.to_port.unwrap_or(p.dport);
        t.dnat = Some((p.daddr, p.dport));
    }
}

/// kup-pre: the first DNAT rule that takes the steered packet (a NAT statement ends the chain).
/// The kernel runs NAT chains for a flow's first packet only.
fn dnat(state: &HostState, p: &mut Packet, t: &mut Trace) {
    let mask = state.nft.marks.mask;
    if p.ct_state != CtState::New {
        return;
    }
    for rule in table(state, p).rules(ChainId::Pre) {
        if let Rule::Dnat(r) = rule
            && p.iif == r.iif
            && p.daddr == p.family().stand_in()
            && r.mark.is_none_or(|m| p.ct_mark & mask == m)
            && p.protocol == r.protocol
            && in_ports(r.ports, p.dport)
        {
            t.counters.push(r.counter.to_string());
            p.daddr = r.to;
            p.dport = r.to_port.unwrap_or(p.dport);
            t.dnat = Some((p.daddr, p.dport));
            return;
        }
    }
    if p.daddr != p.family().stand_in() || p.original_daddr.is_none() {
        return;
    }
    if let Some(h) = hairpin_of(state, p).filter(|h| p.ct_mark & mask == h.mark) {
        t.counters.push(h.counter.to_string());
        p.daddr = h.to;
        p.dport = h.to_port.unwrap_or(p.dport);
        t.dnat = Some((p.daddr, p.dport));
    }
}

/// kup-post: the identity SNAT of a kuport flow, ahead of any masquerade (a NAT chain: a
/// flow's first packet only).
fn identity_snat(state: &HostState, p: &Packet, t: &mut Trace) {
    if p.ct_state != CtState::New {
        return;
    }
    let mask = state.nft.marks.mask;
    let original_saddr_pod = table(state, p)
        .hairpin_sources
        .iter()
        .any(|n| n.contains(&p.saddr));
    for rule in table(state, p).rules(ChainId::Post) {
        match rule {
            Rule::HairpinMasquerade { mark }
                if p.ct_mark & mask == *mark
                    && original_saddr_pod
                    && !p.oif.starts_with(LINK_PREFIX) =>
            {
                t.masquerade = true;
                return;
            }
            Rule::LinkPeerSnat {
                mark,
                client,
                peer_end,
                own_end,
            } if p.ct_mark & mask == *mark && client.contains(&p.saddr) && p.daddr == *peer_end => {
                t.snat_to = Some(*own_end);
                return;
            }
            _ => {}
        }
    }
    for rule in table(state, p).rules(ChainId::Post) {
        if let Rule::IdentitySnat(r) = rule
            && p.ct_mark & state.nft.marks.mask != 0
            && p.daddr == r.daddr
            && p.protocol == r.protocol
            && in_ports(r.ports, p.dport)
        {
            t.counters.push(r.counter.to_string());
            t.identity_snat = true;
            return;
        }
    }
}

fn steer_matches(r: &SteerRule, p: &Packet) -> bool {
    p.ct_state == CtState::New
        && !p.reply
        && p.iif == r.iif
        && p.daddr == r.daddr
        && p.protocol == r.protocol
        && in_ports(r.ports, p.dport)
}

fn in_ports(ports: PortRange, port: u16) -> bool {
    (ports.first..=ports.last).contains(&port)
}

/// kuport's ip rules in priority order; the first whose mark (and destination) matches picks
/// the table.
fn route(state: &HostState, p: &Packet) -> RouteDecision {
    route_to(state, p.family(), p.meta_mark, p.daddr)
}

/// kuport's ip rules and routes for a lookup of `daddr` under packet mark `mark`.
fn route_to(state: &HostState, family: Family, mark: u32, daddr: IpAddr) -> RouteDecision {
    let mut rules: Vec<_> = state.rules.iter().filter(|r| r.family == family).collect();
    rules.sort_by_key(|r| r.priority);
    let chosen = rules
        .into_iter()
        .find(|r| mark & r.fwmask == r.fwmark && r.to.is_none_or(|net| net.contains(&daddr)));
    let Some(rule) = chosen else {
        return RouteDecision::Main;
    };
    if rule.table == MAIN_TABLE {
        return RouteDecision::Main;
    }
    let found = state
        .routes
        .iter()
        .filter(|r| Family::of(r.via) == family)
        .find(|r| r.table == rule.table && r.to.is_none_or(|net| net.contains(&daddr)));
    match found {
        Some(r) => RouteDecision::Via {
            table: r.table,
            via: r.via,
            dev: r.dev.clone(),
        },
        None => RouteDecision::Unroutable { table: rule.table },
    }
}
