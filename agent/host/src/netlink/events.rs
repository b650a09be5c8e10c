//! Which rtnetlink notifications are host events for the agent: a change to a `kup-*` link or
//! the underlay device (by anyone), and a change by another program to one of kuport's ip
//! rules, to a route in one of kuport's tables, or to an address of a `kup-*` link.
//!
//! The kernel stamps a rule, route or address notification with the netlink port of the socket
//! whose request caused it, so the agent's own changes (made over its one rtnetlink
//! connection, whose port it bound itself) are recognised exactly and dropped: an apply never
//! wakes the agent for what it just did. Link notifications carry no reliable port (most
//! kernels send 0), so link events keep coming for the agent's own changes too; a pass that
//! finds the kernel as wanted changes nothing and wakes nobody, so that echo ends after one.
//!
//! An IPv4 address notification names its device (its label); an IPv6 one carries only the
//! device's index, so the `kup-*` links' indexes are kept in [`LinkNames`] (seeded by a link
//! dump, then kept by the link notifications that pass through [`classify`]). The kernel sends
//! IPv6 address notifications with port 0 whoever asked, so the agent's own IPv6 link ends come
//! back once, as its links do; the kernel's link-local addresses never count.

use std::collections::BTreeMap;
use std::net::IpAddr;

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};

use kuport_core::ir::{LINK_PREFIX, MarkLayout};

use super::kernel::{parse_route, parse_rule};
use super::{in_table_space, owned_rule};
use crate::host::{HostEvent, HostEventKind};

/// What the agent's rtnetlink events are filtered by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// The netlink port of the agent's own rtnetlink connection: notifications caused by its
    /// requests are its own changes. `None` drops nothing as the agent's own.
    pub own_port: Option<u32>,
    /// The underlay devices (besides `kup-*` links) whose link changes count.
    pub underlay: Vec<String>,
    /// The mark layout whose ip rules are kuport's.
    pub marks: MarkLayout,
}

/// The `kup-*` links by interface index: how an IPv6 address notification, which names no
/// device, is known to be on one of kuport's links.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkNames(BTreeMap<u32, String>);

impl LinkNames {
    /// Records what a link notification or a link dump's entry says: a `kup-*` link under its
    /// index, or (deleted, or renamed to something else) no longer.
    pub fn observe(&mut self, link: &LinkMessage, removed: bool) {
        let index = link.header.index;
        match link_name(link) {
            Some(name) if !removed && name.starts_with(LINK_PREFIX) => {
                self.0.insert(index, name);
            }
            _ => {
                self.0.remove(&index);
            }
        }
    }

    /// The `kup-*` link with interface index `index`, if any.
    pub fn get(&self, index: u32) -> Option<&str> {
        self.0.get(&index).map(String::as_str)
    }
}

/// The host event `msg` is for the agent, if any. A link notification also updates `links`.
pub fn classify(
    filter: &EventFilter,
    links: &mut LinkNames,
    msg: &NetlinkMessage<RouteNetlinkMessage>,
) -> Option<HostEvent> {
    let inner = match &msg.payload {
        NetlinkPayload::Overrun(_) => {
            return Some(HostEvent {
                kind: HostEventKind::Lost,
                what: "rtnetlink events (the socket's buffer overflowed)".to_owned(),
                removed: false,
            });
        }
        NetlinkPayload::InnerMessage(inner) => inner,
        _ => return None,
    };
    if let Some(event) = link_event(filter, links, inner) {
        return Some(event);
    }
    // A port of 0 is the kernel's own doing (an address going with its deleted link, say):
    // not the agent's request, so it counts.
    let own = filter
        .own_port
        .is_some_and(|p| p != 0 && p == msg.header.port_number);
    if own {
        return None;
    }
    match inner {
        RouteNetlinkMessage::NewRule(r) | RouteNetlinkMessage::DelRule(r) => {
            let removed = matches!(inner, RouteNetlinkMessage::DelRule(_));
            let k = parse_rule(r);
            let fwmark = k
                .fwmark
                .filter(|m| owned_rule(k.priority, *m, k.fwmask, filter.marks))?;
            Some(HostEvent {
                kind: HostEventKind::Rule,
                what: format!(
                    "ip rule pref {} fwmark {fwmark:#x}/{:#x} lookup {}",
                    k.priority, k.fwmask, k.table
                ),
                removed,
            })
        }
        RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r) => {
            let removed = matches!(inner, RouteNetlinkMessage::DelRoute(_));
            let k = parse_route(r);
            in_table_space(k.table).then(|| HostEvent {
                kind: HostEventKind::Route,
                what: match k.to {
                    Some(to) => format!("route {to} table {}", k.table),
                    None => format!("route default table {}", k.table),
                },
                removed,
            })
        }
        RouteNetlinkMessage::NewAddress(a) | RouteNetlinkMessage::DelAddress(a) => {
            let removed = matches!(inner, RouteNetlinkMessage::DelAddress(_));
            let (label, address) = address_of(a);
            // The kernel's own link-local address of a link (and its duplicate address
            // detection's updates) is not kuport's.
            if address.is_some_and(is_link_local) {
                return None;
            }
            let device = match label {
                Some(label) => label,
                None => links.get(a.header.index)?.to_owned(),
            };
            let shown = address.map_or_else(
                || "?".to_owned(),
                |address| format!("{address}/{}", a.header.prefix_len),
            );
            device.starts_with(LINK_PREFIX).then(|| HostEvent {
                kind: HostEventKind::Address,
                what: format!("address {shown} on {device}"),
                removed,
            })
        }
        _ => None,
    }
}

/// A change to a `kup-*` link or an underlay device, whoever made it.
fn link_event(
    filter: &EventFilter,
    links: &mut LinkNames,
    inner: &RouteNetlinkMessage,
) -> Option<HostEvent> {
    let (link, removed) = match inner {
        RouteNetlinkMessage::NewLink(l) => (l, false),
        RouteNetlinkMessage::DelLink(l) => (l, true),
        _ => return None,
    };
    links.observe(link, removed);
    let name = link_name(link)?;
    (name.starts_with(LINK_PREFIX) || filter.underlay.contains(&name))
        .then(|| HostEvent::link(name, removed))
}

fn link_name(link: &LinkMessage) -> Option<String> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

/// An address notification's label (its device's name for a device's own IPv4 addresses; IPv6
/// addresses have none) and its address.
fn address_of(msg: &AddressMessage) -> (Option<String>, Option<IpAddr>) {
    let mut label = None;
    let mut local = None;
    let mut address = None;
    for a in &msg.attributes {
        match a {
            AddressAttribute::Label(l) => label = Some(l.clone()),
            AddressAttribute::Local(v) => local = Some(*v),
            AddressAttribute::Address(v) => address = Some(*v),
            _ => {}
        }
    }
    (label, local.or(address))
}

fn is_link_local(address: IpAddr) -> bool {
    matches!(address, IpAddr::V6(a) if a.is_unicast_link_local())
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use kuport_core::ir::{LINK_TABLE_BASE, PREF_REPLY};
    use netlink_packet_route::link::LinkMessage;
    use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
    use netlink_packet_route::rule::{RuleAttribute, RuleMessage};
    use rtnetlink::packet_core::NetlinkHeader;

    use super::*;

    const OWN: u32 = 4242;

    fn filter() -> EventFilter {
        EventFilter {
            own_port: Some(OWN),
            underlay: vec!["wt0".to_owned()],
            marks: MarkLayout::default(),
        }
    }

    fn from(port: u32, inner: RouteNetlinkMessage) -> NetlinkMessage<RouteNetlinkMessage> {
        let mut header = NetlinkHeader::default();
        header.port_number = port;
        NetlinkMessage::new(header, NetlinkPayload::InnerMessage(inner))
    }

    fn rule(priority: u32, fwmark: u32, fwmask: u32) -> RuleMessage {
        let mut r = RuleMessage::default();
        r.attributes = vec![
            RuleAttribute::Priority(priority),
            RuleAttribute::FwMark(fwmark),
            RuleAttribute::FwMask(fwmask),
            RuleAttribute::Table(LINK_TABLE_BASE + 1),
        ];
        r
    }

    fn kuport_rule() -> RuleMessage {
        let marks = MarkLayout::default();
        rule(
            PREF_REPLY,
            marks.link_mark(1).expect("a link mark"),
            marks.mask,
        )
    }

    fn route(table: u32) -> RouteMessage {
        let mut r = RouteMessage::default();
        r.header.destination_prefix_length = 24;
        r.attributes = vec![
            RouteAttribute::Table(table),
            RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::new(10, 244, 2, 0))),
        ];
        r
    }

    fn address(label: &str) -> AddressMessage {
        let mut a = AddressMessage::default();
        a.header.prefix_len = 31;
        a.attributes = vec![
            AddressAttribute::Local(IpAddr::V4(Ipv4Addr::new(169, 254, 64, 1))),
            AddressAttribute::Label(label.to_owned()),
        ];
        a
    }

    fn link(name: &str) -> LinkMessage {
        indexed_link(1, name)
    }

    fn indexed_link(index: u32, name: &str) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.header.index = index;
        l.attributes = vec![LinkAttribute::IfName(name.to_owned())];
        l
    }

    /// An IPv6 address notification: the device only by its index, as the kernel sends it.
    fn address6(index: u32, address: &str) -> AddressMessage {
        let mut a = AddressMessage::default();
        a.header.index = index;
        a.header.prefix_len = 127;
        a.attributes = vec![AddressAttribute::Address(
            address.parse().expect("an address"),
        )];
        a
    }

    fn kind(msg: NetlinkMessage<RouteNetlinkMessage>) -> Option<(HostEventKind, bool)> {
        classify(&filter(), &mut LinkNames::default(), &msg).map(|e| (e.kind, e.removed))
    }

    #[test]
    fn an_ipv6_address_of_a_kup_link_is_known_by_the_links_index() {
        use RouteNetlinkMessage::*;
        let ip = 31337;
        let mut links = LinkNames::default();
        let seen = |links: &mut LinkNames, msg| {
            classify(&filter(), links, &from(ip, msg)).map(|e| (e.kind, e.removed, e.what))
        };
        // Index 7 is not known as a kup-* link yet.
        assert_eq!(
            seen(&mut links, DelAddress(address6(7, "fd6b:7570::a9fe:4000"))),
            None
        );
        // The link's notification (the agent's own, port 0 or not) teaches its index.
        assert!(seen(&mut links, NewLink(indexed_link(7, "kup-public-2"))).is_some());
        assert_eq!(
            seen(&mut links, DelAddress(address6(7, "fd6b:7570::a9fe:4000"))),
            Some((
                HostEventKind::Address,
                true,
                "address fd6b:7570::a9fe:4000/127 on kup-public-2".to_owned()
            ))
        );
        // The kernel's link-local address of the link (and its updates) is not kuport's.
        assert_eq!(seen(&mut links, NewAddress(address6(7, "fe80::1"))), None);
        // Another device's IPv6 address is not an event.
        assert!(seen(&mut links, NewLink(indexed_link(8, "eth0"))).is_none());
        assert_eq!(
            seen(&mut links, DelAddress(address6(8, "2001:db8::1"))),
            None
        );
        // The agent's own change is not an event (control: another program's is, above).
        assert_eq!(
            classify(
                &filter(),
                &mut links,
                &from(OWN, NewAddress(address6(7, "fd6b::1")))
            ),
            None
        );
        // Deleted, the index is forgotten: a later device may reuse it.
        assert!(seen(&mut links, DelLink(indexed_link(7, "kup-public-2"))).is_some());
        assert_eq!(seen(&mut links, NewAddress(address6(7, "fd6b::1"))), None);
    }

    #[test]
    fn a_link_renamed_away_from_kup_is_forgotten() {
        let mut links = LinkNames::default();
        links.observe(&indexed_link(3, "kup-public-2"), false);
        links.observe(&indexed_link(4, "wt0"), false);
        assert_eq!(links.get(3), Some("kup-public-2"));
        assert_eq!(links.get(4), None, "only kup-* links are kept");
        links.observe(&indexed_link(3, "renamed"), false);
        assert_eq!(links.get(3), None);
    }

    #[test]
    fn another_programs_change_to_kuports_rule_route_or_address_is_an_event() {
        use RouteNetlinkMessage::*;
        let ip = 31337;
        assert_eq!(
            kind(from(ip, DelRule(kuport_rule()))),
            Some((HostEventKind::Rule, true))
        );
        assert_eq!(
            kind(from(ip, NewRule(kuport_rule()))),
            Some((HostEventKind::Rule, false)),
            "a rule replaced by hand is drift too"
        );
        assert_eq!(
            kind(from(ip, DelRoute(route(LINK_TABLE_BASE + 3)))),
            Some((HostEventKind::Route, true))
        );
        assert_eq!(
            kind(from(ip, DelAddress(address("kup-public-2")))),
            Some((HostEventKind::Address, true))
        );
        let e = classify(
            &filter(),
            &mut LinkNames::default(),
            &from(ip, DelRoute(route(LINK_TABLE_BASE + 3))),
        )
        .expect("e");
        assert_eq!(
            e.what,
            format!("route 10.244.2.0/24 table {}", LINK_TABLE_BASE + 3)
        );
    }

    #[test]
    fn the_agents_own_changes_are_not_events() {
        use RouteNetlinkMessage::*;
        for msg in [
            DelRule(kuport_rule()),
            NewRule(kuport_rule()),
            DelRoute(route(LINK_TABLE_BASE + 3)),
            NewAddress(address("kup-public-2")),
            DelAddress(address("kup-public-2")),
        ] {
            assert_eq!(kind(from(OWN, msg.clone())), None, "{msg:?}");
            // Control: the same notification caused by another socket is an event.
            assert!(kind(from(OWN + 1, msg)).is_some());
        }
        // The kernel's own doing (port 0) is never the agent's.
        let unbound = EventFilter {
            own_port: Some(0),
            ..filter()
        };
        let mut links = LinkNames::default();
        assert!(classify(&unbound, &mut links, &from(0, DelRule(kuport_rule()))).is_some());
    }

    #[test]
    fn other_programs_state_is_not_an_event() {
        use RouteNetlinkMessage::*;
        let ip = 31337;
        // The mesh's rule at 105, a rule at kuport's priority under another mask, the main
        // table, another device's address.
        assert_eq!(kind(from(ip, DelRule(rule(105, 0x1, 0xff)))), None);
        assert_eq!(
            kind(from(ip, DelRule(rule(PREF_REPLY, 0x100, 0xf00)))),
            None
        );
        assert_eq!(kind(from(ip, DelRoute(route(254)))), None);
        assert_eq!(kind(from(ip, DelAddress(address("eth0")))), None);
        assert_eq!(kind(from(ip, DelLink(link("eth0")))), None);
    }

    #[test]
    fn link_changes_count_whoever_made_them_and_an_overrun_is_lost_events() {
        use RouteNetlinkMessage::*;
        for (msg, removed) in [
            (DelLink(link("kup-public-2")), true),
            (NewLink(link("kup-public-2")), false),
            (DelLink(link("wt0")), true),
        ] {
            assert_eq!(kind(from(OWN, msg)), Some((HostEventKind::Link, removed)));
        }
        let mut header = NetlinkHeader::default();
        header.port_number = 0;
        let overrun = NetlinkMessage::new(header, NetlinkPayload::Overrun(Vec::new()));
        assert_eq!(kind(overrun), Some((HostEventKind::Lost, false)));
    }
}
