//! Changes to the sysctls the node checks read, as the kernel announces them: an `RTM_NEWNETCONF`
//! on the IPv4 or IPv6 netconf group (`RTNLGRP_IPV4_NETCONF`, `RTNLGRP_IPV6_NETCONF`) names a
//! device's index (or `all`, `default`), the one setting written and its new value.
//!
//! What the kernel sends (measured on 6.18, `docs/decisions.md`): a write of `rp_filter` or of a
//! device's `forwarding` announces that device (or `all`, `default`) alone; a write of
//! `net.ipv4.ip_forward`, `net.ipv4.conf.all.forwarding` or `net.ipv6.conf.all.forwarding`
//! announces `all`, `default` and then every device; a value written again unchanged announces
//! nothing; a new device announces all its settings in one message, a deleted one an
//! `RTM_DELNETCONF`; `src_valid_mark` and `accept_local` are never announced, nor anything set
//! through rtnetlink's per-device configuration (how kuport sets its links'), whose change is a
//! link notification instead.
//!
//! Events, each waking a verifying pass that reads the checks again: `forwarding` of `all` in
//! either family (the `ipForward` and `ipv6Forward` checks), and `rp_filter` of `all`, of
//! `default` (a device never written to follows it) and of a `kup-*` link (the `rpFilter`
//! check). Everything else is dropped: other devices' settings and the per-device copies of a
//! forwarding write (no check reads them), settings no check reads, and a device's appearance
//! or removal (its link notification is the event, for the links that matter).
//!
//! Written over raw netlink like `nft_events.rs`: `rtnetlink`'s message types do not parse
//! netconf messages (its multicast connection drops them as undecodable).

use netlink_sys::{AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket, protocols::NETLINK_ROUTE};
use tokio::sync::mpsc;

use super::events::LinkNames;
use crate::host::{HostEvent, HostEventKind};

/// `RTNLGRP_IPV4_NETCONF`.
const GROUP_IPV4: u32 = 24;
/// `RTNLGRP_IPV6_NETCONF`.
const GROUP_IPV6: u32 = 25;
/// `RTM_NEWNETCONF`.
const NEWNETCONF: u16 = 80;
/// `NLMSG_OVERRUN`.
const NLMSG_OVERRUN: u16 = 4;
/// The netlink message header.
const HEADER: usize = 16;
/// `struct netconfmsg` (its family), padded to four bytes.
const NETCONFMSG: usize = 4;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `NETCONFA_IFINDEX`.
const ATTR_IFINDEX: u16 = 1;
/// `NETCONFA_FORWARDING`.
const ATTR_FORWARDING: u16 = 2;
/// `NETCONFA_RP_FILTER`.
const ATTR_RP_FILTER: u16 = 3;
/// `NETCONFA_IFINDEX_ALL`.
const IFINDEX_ALL: i32 = -1;
/// `NETCONFA_IFINDEX_DEFAULT`.
const IFINDEX_DEFAULT: i32 = -2;

/// One announcement: a family's setting of a device (or `all`, `default`) and its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netconf {
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// The device's index, or `-1` (`all`), `-2` (`default`).
    pub ifindex: i32,
    /// Every setting the message carries (attribute type, value): one for a sysctl written,
    /// all of them for a new device.
    pub settings: Vec<(u16, i32)>,
}

/// What a datagram of the netconf groups said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum News {
    /// Its `RTM_NEWNETCONF` messages (others dropped).
    Announced(Vec<Netconf>),
    /// The socket's buffer overflowed: announcements were lost.
    Lost,
}

/// The `RTM_NEWNETCONF` messages of one datagram; an overrun message makes it [`News::Lost`].
pub fn parse(datagram: &[u8]) -> News {
    let mut found = Vec::new();
    let mut at = 0;
    while let (Some(len), Some(kind)) = (u32_at(datagram, at), u16_at(datagram, at + 4)) {
        let len = len as usize;
        if len < HEADER || at + len > datagram.len() {
            break;
        }
        match kind {
            NLMSG_OVERRUN => return News::Lost,
            NEWNETCONF => found.extend(message(&datagram[at + HEADER..at + len])),
            _ => {}
        }
        at += (len + 3) & !3;
    }
    News::Announced(found)
}

/// One message's body: the family, then attributes.
fn message(body: &[u8]) -> Option<Netconf> {
    let family = *body.first()?;
    let mut ifindex = None;
    let mut settings = Vec::new();
    let mut at = NETCONFMSG;
    while let (Some(alen), Some(kind)) = (u16_at(body, at), u16_at(body, at + 2)) {
        let alen = alen as usize;
        if alen < 4 || at + alen > body.len() {
            break;
        }
        if let Some(value) = i32_at(body, at + 4).filter(|_| alen >= 8) {
            match kind & 0x3fff {
                ATTR_IFINDEX => ifindex = Some(value),
                other => settings.push((other, value)),
            }
        }
        at += (alen + 3) & !3;
    }
    Some(Netconf {
        family,
        ifindex: ifindex?,
        settings,
    })
}

/// The host event an announcement is, if any (see the module's rules); `links` names the
/// `kup-*` links by index.
pub fn classify(n: &Netconf, links: &LinkNames) -> Option<HostEvent> {
    // One setting: a sysctl written. All of them: a device appearing.
    let [(setting, value)] = n.settings[..] else {
        return None;
    };
    let device = match n.ifindex {
        IFINDEX_ALL => "all",
        IFINDEX_DEFAULT => "default",
        index => links.get(u32::try_from(index).ok()?)?,
    };
    let name = match (n.family, setting, device) {
        (AF_INET, ATTR_FORWARDING, "all") => "net.ipv4.conf.all.forwarding",
        (AF_INET6, ATTR_FORWARDING, "all") => "net.ipv6.conf.all.forwarding",
        (AF_INET, ATTR_RP_FILTER, device) => {
            return Some(sysctl_event(format!(
                "net.ipv4.conf.{device}.rp_filter is now {value}"
            )));
        }
        _ => return None,
    };
    Some(sysctl_event(format!("{name} is now {value}")))
}

fn sysctl_event(what: String) -> HostEvent {
    HostEvent {
        kind: HostEventKind::Sysctl,
        what,
        removed: false,
    }
}

/// Opens the netconf announcements of both families: each datagram's [`News`], until the
/// receiver is dropped or the socket fails (the channel then closes).
pub fn watch() -> Result<mpsc::Receiver<News>, std::io::Error> {
    let mut socket = TokioSocket::new(NETLINK_ROUTE)?;
    socket.socket_mut().bind(&SocketAddr::new(0, 0))?;
    socket.socket_mut().add_membership(GROUP_IPV4)?;
    socket.socket_mut().add_membership(GROUP_IPV6)?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut buf = Vec::with_capacity(1 << 16);
        loop {
            buf.clear();
            let news = match socket.recv(&mut buf).await {
                Ok(()) => parse(&buf),
                // ENOBUFS: announcements were dropped (a forwarding write on a node with
                // thousands of devices announces each of them).
                Err(e) if e.raw_os_error() == Some(105) => News::Lost,
                Err(e) => {
                    tracing::warn!("reading netconf events: {e}; the stream ends");
                    return;
                }
            };
            if tx.send(news).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    buf.get(at..at + 2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    buf.get(at..at + 4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn i32_at(buf: &[u8], at: usize) -> Option<i32> {
    u32_at(buf, at).map(|v| v as i32)
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};

    use super::*;

    /// A netconf message of `kind` as the kernel sends it: `family`, the index, the settings.
    fn msg(kind: u16, family: u8, ifindex: i32, settings: &[(u16, i32)]) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        for (t, v) in [(ATTR_IFINDEX, ifindex)].iter().chain(settings) {
            body.extend_from_slice(&8u16.to_ne_bytes());
            body.extend_from_slice(&t.to_ne_bytes());
            body.extend_from_slice(&v.to_ne_bytes());
        }
        let mut m = ((HEADER + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&body);
        m
    }

    fn links() -> LinkNames {
        let mut names = LinkNames::default();
        for (index, name) in [(7, "kup-public-2"), (3, "eth0")] {
            let mut l = LinkMessage::default();
            l.header.index = index;
            l.attributes = vec![LinkAttribute::IfName(name.to_owned())];
            names.observe(&l, false);
        }
        names
    }

    fn events(datagram: &[u8]) -> Vec<String> {
        match parse(datagram) {
            News::Announced(found) => found
                .iter()
                .filter_map(|n| classify(n, &links()))
                .map(|e| {
                    assert_eq!((e.kind, e.removed), (HostEventKind::Sysctl, false));
                    e.what
                })
                .collect(),
            News::Lost => vec!["lost".to_owned()],
        }
    }

    #[test]
    fn the_settings_the_checks_read_are_events() {
        let datagram = [
            msg(NEWNETCONF, AF_INET, IFINDEX_ALL, &[(ATTR_RP_FILTER, 1)]),
            msg(NEWNETCONF, AF_INET, IFINDEX_DEFAULT, &[(ATTR_RP_FILTER, 2)]),
            msg(NEWNETCONF, AF_INET, 7, &[(ATTR_RP_FILTER, 1)]),
            msg(NEWNETCONF, AF_INET, IFINDEX_ALL, &[(ATTR_FORWARDING, 0)]),
            msg(NEWNETCONF, AF_INET6, IFINDEX_ALL, &[(ATTR_FORWARDING, 0)]),
        ]
        .concat();
        assert_eq!(
            events(&datagram),
            [
                "net.ipv4.conf.all.rp_filter is now 1",
                "net.ipv4.conf.default.rp_filter is now 2",
                "net.ipv4.conf.kup-public-2.rp_filter is now 1",
                "net.ipv4.conf.all.forwarding is now 0",
                "net.ipv6.conf.all.forwarding is now 0",
            ]
        );
    }

    #[test]
    fn other_devices_settings_and_new_devices_are_not() {
        // A forwarding write's per-device copies, another device's rp_filter, a setting no
        // check reads (proxy_arp), a default forwarding, a device appearing with all its
        // settings, a device's removal.
        let datagram = [
            msg(
                NEWNETCONF,
                AF_INET,
                IFINDEX_DEFAULT,
                &[(ATTR_FORWARDING, 1)],
            ),
            msg(NEWNETCONF, AF_INET, 7, &[(ATTR_FORWARDING, 1)]),
            msg(NEWNETCONF, AF_INET6, 7, &[(ATTR_FORWARDING, 0)]),
            msg(NEWNETCONF, AF_INET, 3, &[(ATTR_RP_FILTER, 1)]),
            msg(NEWNETCONF, AF_INET, 99, &[(ATTR_RP_FILTER, 1)]),
            msg(NEWNETCONF, AF_INET, 7, &[(5, 1)]),
            msg(NEWNETCONF, AF_INET, IFINDEX_ALL, &[(5, 1)]),
            msg(
                NEWNETCONF,
                AF_INET,
                7,
                &[(ATTR_FORWARDING, 0), (ATTR_RP_FILTER, 2), (4, 0), (8, 0)],
            ),
            msg(81, AF_INET, 7, &[]),
        ]
        .concat();
        assert_eq!(events(&datagram), Vec::<String>::new());
        // Control: the same datagram with one announcement that counts says so.
        let with = [
            datagram,
            msg(NEWNETCONF, AF_INET, IFINDEX_ALL, &[(ATTR_RP_FILTER, 1)]),
        ]
        .concat();
        assert_eq!(events(&with).len(), 1);
    }

    #[test]
    fn an_overrun_is_lost_events_and_a_cut_datagram_is_read_as_far_as_it_is_whole() {
        let mut overrun = msg(NLMSG_OVERRUN, 0, 0, &[]);
        assert_eq!(events(&overrun), ["lost"]);
        overrun.truncate(HEADER - 1);
        assert_eq!(events(&overrun), Vec::<String>::new());
        let whole = msg(NEWNETCONF, AF_INET, IFINDEX_ALL, &[(ATTR_RP_FILTER, 1)]);
        let cut = [whole.clone(), whole[..whole.len() - 3].to_vec()].concat();
        assert_eq!(events(&cut).len(), 1);
        // A message without its index says nothing.
        let mut no_index = whole.clone();
        no_index[HEADER + NETCONFMSG + 2] = 9;
        assert_eq!(events(&no_index), Vec::<String>::new());
    }
}
