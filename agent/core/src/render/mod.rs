//! nft text of kuport's table. [`rule_text`] writes one IR rule in nft's grammar (the chains'
//! own rules: the guard, the marks, the MSS clamps); [`layout`] turns the per-mapping rules into
//! set and map elements behind a few lookup rules, which is what the kernel holds;
//! [`transaction`] diffs two layouts into one atomic `nft -f -` script, and a [`Transaction`]
//! is that script as the host sends it, able to leave out the mappings nft refused; [`nft_text`]
//! is the listing `kuport plan --output nft` shows.

use std::fmt::Write as _;

use crate::ir::{ChainId, DnatRule, Family, LINK_PREFIX, MarkLayout, NftTable, Rule, SteerRule};

pub mod layout;
pub mod transaction;

pub use layout::{
    Layout, Listing, Planned, layout, layout_with_owners, listing_text, parse_listing,
};
pub use transaction::{LineOf, Transaction, script, transaction, transaction_lines};

/// The table as nft lists it (elements sorted), counters at zero; empty when the node needs no
/// table.
pub fn nft_text(table: &NftTable) -> String {
    if table.is_empty() {
        return String::new();
    }
    listing_text(&layout(table).layout, &std::collections::BTreeMap::new())
}

/// nft lists standard priorities by name, relative to the family's well-known values.
fn symbolic_priority(chain: ChainId) -> &'static str {
    match chain {
        ChainId::Guard => "raw",
        // nft names a priority only within 10 of a standard one.
        ChainId::Steer => "-130",
        ChainId::Pre => "dstnat - 10",
        ChainId::Post => "srcnat - 10",
        ChainId::Mangle => "mangle + 10",
        ChainId::Fwd => "mangle",
        // The output hook has no standard nat name nft would use here.
        ChainId::Out => "-110",
    }
}

fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "'"))
}

/// `<key> & <mask> <op> <value>`, as nft lists it: a mask of leading ones (a prefix) is shown
/// as `<key> [!= ]<value>/<len>`, any other mask as a bitwise AND.
fn masked_cmp(key: &str, mask: u32, negate: bool, value: u32) -> String {
    let len = mask.leading_ones();
    if mask != 0 && mask.checked_shl(len).unwrap_or(0) == 0 {
        let op = if negate { "!= " } else { "" };
        format!("{key} {op}{value:#010x}/{len}")
    } else {
        let op = if negate { "!=" } else { "==" };
        format!("{key} & {mask:#010x} {op} {value:#010x}")
    }
}

fn masked_eq(key: &str, marks: MarkLayout, value: u32) -> String {
    masked_cmp(key, marks.mask, false, value)
}

/// `<key> set <key> & ~mask | value`: writes kuport's bits and keeps the others. nft lists the
/// AND operand with the value's bits folded in.
fn masked_set(key: &str, marks: MarkLayout, value: u32) -> String {
    format!(
        "{key} set {key} & {:#010x} | {value:#010x}",
        !marks.mask | value
    )
}

/// What starts a steered flow: only a flow's first packet (`ct state new`; conntrack never
/// gives that state to a reply), so the node's own connections from a port in a mapped range,
/// and their replies, are never rewritten.
pub const NEW_FLOW: &str = "ct state new";

/// The destination types the node delivers locally, as nft lists them: the link guard drops
/// every one of them on a link port unless the frame is a link peer's unicast.
pub const RECEIVED_TYPES: &str = "{ local, broadcast, anycast, multicast }";

/// `ip` or `ip6`, for an address of the family.
fn ip_of(addr: std::net::IpAddr) -> &'static str {
    Family::of(addr).nft()
}

/// A prefix as nft lists it: a host-length one as the bare address, any other as
/// `address/length` (its host bits cleared).
fn prefix_text(net: ipnet::IpNet) -> String {
    if net.prefix_len() == net.max_prefix_len() {
        net.addr().to_string()
    } else {
        net.trunc().to_string()
    }
}

/// An address and port as nft writes a NAT target: `[addr]:port` for IPv6.
fn addr_port(addr: std::net::IpAddr, port: u16) -> String {
    match addr {
        std::net::IpAddr::V4(a) => format!("{a}:{port}"),
        std::net::IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// The match part of a steering rule, with a trailing space.
fn steer_match(r: &SteerRule) -> String {
    format!(
        "{NEW_FLOW} iifname {} {} daddr {} {} dport {} ",
        quote(&r.iif),
        ip_of(r.daddr),
        r.daddr,
        r.protocol.lower(),
        r.ports
    )
}

/// One rule as nft lists it (and as a transaction adds it: nft reads its own listing back):
/// one arm per rule kind, the whole grammar kuport writes in one place (the longer rules in
/// functions of their own below). `family` is the table's: a rule without an address of its
/// own (the hairpin masquerade) is spelled for it.
pub fn rule_text(rule: &Rule, marks: MarkLayout, family: Family) -> String {
    match rule {
        Rule::GuardAllow {
            device,
            port,
            peers,
        } => guard_allow_text(device, *port, peers),
        Rule::GuardDrop { port, counter } => format!(
            "udp dport {port} fib daddr type {RECEIVED_TYPES} counter name {} drop",
            quote(counter)
        ),
        Rule::MarkRequest(r) => format!(
            "{}{} {}",
            steer_match(r),
            masked_cmp("meta mark", !marks.mask, false, 0),
            masked_set("meta mark", marks, r.mark.unwrap_or(marks.local()))
        ),
        Rule::Steer(r) => steer_text(r, marks),
        Rule::RestoreReplyMark { mark } => format!(
            "ct direction reply {} counter packets 0 bytes 0 {}",
            masked_eq("ct mark", marks, *mark),
            masked_set("meta mark", marks, *mark)
        ),
        Rule::RestoreRequestMark { mark } => format!(
            "ct direction original {} {} counter packets 0 bytes 0 {}",
            masked_eq("ct mark", marks, *mark),
            masked_cmp("meta mark", !marks.mask, false, 0),
            masked_set("meta mark", marks, *mark)
        ),
        Rule::SaveArrivalLink { iface, mark } => format!(
            "iifname {} ct direction original counter packets 0 bytes 0 {}",
            quote(iface),
            masked_set("ct mark", marks, *mark)
        ),
        Rule::MarkArrival { iface, mark } => format!(
            "iifname {} ct direction original counter packets 0 bytes 0 {}",
            quote(iface),
            masked_set("meta mark", marks, *mark)
        ),
        Rule::ClampMssOut => {
            format!("oifname \"{LINK_PREFIX}*\" tcp flags syn tcp option maxseg size set rt mtu")
        }
        Rule::ClampMssIn => {
            format!("iifname \"{LINK_PREFIX}*\" tcp flags syn tcp option maxseg size set rt mtu")
        }
        Rule::Dnat(r) => dnat_text(r, marks),
        Rule::Hairpin(r) => hairpin_text(r),
        Rule::HairpinMasquerade { mark } => format!(
            "{} ct original {} saddr @{HAIRPIN_SOURCES} oifname != \"{LINK_PREFIX}*\" counter packets 0 bytes 0 masquerade",
            masked_eq("ct mark", marks, *mark),
            family.nft()
        ),
        Rule::LinkPeerSnat {
            mark,
            client,
            peer_end,
            own_end,
        } => {
            let ip = ip_of(client.addr());
            format!(
                "{} {ip} saddr {} {ip} daddr {peer_end} counter packets 0 bytes 0 snat to {own_end}",
                masked_eq("ct mark", marks, *mark),
                prefix_text(*client)
            )
        }
        Rule::IdentitySnat(r) => format!(
            "{} {ip} daddr {} {} dport {} counter name {} snat to {ip} saddr comment {}",
            masked_cmp("ct mark", marks.mask, true, 0),
            r.daddr,
            r.protocol.lower(),
            r.ports,
            quote(&r.counter),
            quote(&r.comment),
            ip = ip_of(r.daddr),
        ),
    }
}

/// The set of pod networks a hairpin client's address must lie in.
pub const HAIRPIN_SOURCES: &str = "hairpin-sources";
/// The set of interfaces a hairpin client's packet must not arrive on.
pub const HAIRPIN_EXTERNAL: &str = "hairpin-external";

/// A hairpin element as `kuport plan --output text` names it; the kernel holds it as elements
/// of the `hairpin-*` set and maps behind constant lookup rules (`layout`).
fn hairpin_text(r: &crate::ir::HairpinRule) -> String {
    let to = match r.to_port {
        Some(port) => addr_port(r.to, port),
        None => r.to.to_string(),
    };
    format!(
        "hairpin {} daddr {} {} dport {} dnat to {to} comment {}",
        ip_of(r.daddr),
        r.daddr,
        r.protocol.lower(),
        r.ports,
        quote(&r.comment)
    )
}

/// The link guard's rule letting the link's peers reach its port.
fn guard_allow_text(device: &str, port: u16, peers: &[std::net::Ipv4Addr]) -> String {
    let peers: Vec<String> = peers.iter().map(ToString::to_string).collect();
    let set = if peers.len() == 1 {
        peers[0].clone()
    } else {
        format!("{{ {} }}", peers.join(", "))
    };
    format!(
        "iifname {} ip saddr {set} udp dport {port} fib daddr type local notrack accept",
        quote(device)
    )
}

/// A steering rule: marks the new flow (when the mapping has a link) and points it at the
/// stand-in address the DNAT rules match.
fn steer_text(r: &SteerRule, marks: MarkLayout) -> String {
    let mut text = steer_match(r);
    if let Some(mark) = r.mark {
        let _ = write!(text, "{} ", masked_set("ct mark", marks, mark));
    }
    let family = Family::of(r.daddr);
    let _ = write!(
        text,
        "{} daddr set {} comment {}",
        family.nft(),
        family.stand_in(),
        quote(&r.comment)
    );
    text
}

/// A DNAT rule: the stand-in address (and the link's mark) on the mapped ports, counted, to
/// the pod.
fn dnat_text(r: &DnatRule, marks: MarkLayout) -> String {
    let family = Family::of(r.to);
    let mut text = format!(
        "iifname {} {} daddr {} ",
        quote(&r.iif),
        family.nft(),
        family.stand_in()
    );
    if let Some(mark) = r.mark {
        let _ = write!(text, "{} ", masked_eq("ct mark", marks, mark));
    }
    let _ = write!(
        text,
        "{} dport {} counter name {} ",
        r.protocol.lower(),
        r.ports,
        quote(&r.counter)
    );
    match r.to_port {
        Some(port) => {
            let _ = write!(text, "dnat to {}", addr_port(r.to, port));
        }
        None => {
            let _ = write!(text, "dnat to {}", r.to);
        }
    }
    let _ = write!(text, " comment {}", quote(&r.comment));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_compares_take_the_form_nft_lists() {
        assert_eq!(
            masked_cmp("meta mark", 0xffff_ff00, false, 0),
            "meta mark 0x00000000/24"
        );
        assert_eq!(
            masked_cmp("ct mark", 0xff00_0000, true, 0),
            "ct mark != 0x00000000/8"
        );
        assert_eq!(
            masked_cmp("ct mark", 0xff, false, 1),
            "ct mark & 0x000000ff == 0x00000001"
        );
        assert_eq!(
            masked_cmp("ct mark", 0xff, true, 0),
            "ct mark & 0x000000ff != 0x00000000"
        );
        assert_eq!(
            masked_cmp("meta mark", 0xffff_00ff, false, 0),
            "meta mark & 0xffff00ff == 0x00000000"
        );
    }

    #[test]
    fn a_link_peer_snat_names_a_host_as_its_address_and_a_range_as_its_prefix() {
        let snat = |client: &str| {
            let rule = Rule::LinkPeerSnat {
                mark: 1,
                client: client.parse().expect("a prefix"),
                peer_end: "169.254.77.1".parse().expect("an address"),
                own_end: "169.254.77.0".parse().expect("an address"),
            };
            rule_text(&rule, MarkLayout::default(), Family::V4)
        };
        assert_eq!(
            snat("100.64.0.2/32"),
            "ct mark & 0x000000ff == 0x00000001 ip saddr 100.64.0.2 ip daddr 169.254.77.1 counter packets 0 bytes 0 snat to 169.254.77.0"
        );
        assert_eq!(
            snat("10.244.2.0/24"),
            "ct mark & 0x000000ff == 0x00000001 ip saddr 10.244.2.0/24 ip daddr 169.254.77.1 counter packets 0 bytes 0 snat to 169.254.77.0"
        );
        assert_eq!(
            prefix_text("fd00:10:244:2::/64".parse().expect("v6")),
            "fd00:10:244:2::/64"
        );
        assert_eq!(prefix_text("fd00::2/128".parse().expect("v6")), "fd00::2");
    }

    #[test]
    fn a_masked_write_keeps_the_other_bits_as_nft_lists_it() {
        let marks = MarkLayout::default();
        assert_eq!(
            masked_set("ct mark", marks, 3),
            "ct mark set ct mark & 0xffffff03 | 0x00000003"
        );
    }
}
