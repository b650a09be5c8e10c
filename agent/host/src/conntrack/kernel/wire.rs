//! ctnetlink's bytes: the requests kuport sends (a dump of the table, a batch of deletes) and
//! the answers it reads (entries, acknowledgements and refusals), parsed in place without an
//! allocation per attribute.
//!
//! Layout: a netlink header (host byte order), `nfgenmsg` (family, version, resource id), then
//! attributes whose 4-byte headers are in host byte order and whose values are in network
//! byte order; nested attributes carry `NLA_F_NESTED` in their type.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr as IpSocketAddr};
use std::ops::ControlFlow;

use kuport_core::api::Protocol;

use super::super::Flow;

const SUBSYS_CTNETLINK: u16 = 1 << 8;
/// `IPCTNL_MSG_CT_NEW`: what a dump answers with.
const CT_NEW: u16 = SUBSYS_CTNETLINK;
/// `IPCTNL_MSG_CT_GET`.
const CT_GET: u16 = SUBSYS_CTNETLINK | 1;
/// `IPCTNL_MSG_CT_DELETE`.
const CT_DELETE: u16 = SUBSYS_CTNETLINK | 2;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const HEADER: usize = 16;
const NFGENMSG: usize = 4;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_MARK: u16 = 8;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
pub(super) const ENOENT: i32 = 2;

// ---- requests ----

/// Starts a message at the end of `buf` (its length is set by [`finish`]); returns where it
/// starts.
fn begin(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: u8) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
    // nfgenmsg: the family, NFNETLINK_V0, resource id 0.
    buf.extend_from_slice(&[family, 0, 0, 0]);
    start
}

/// Sets the length of the message started at `start`. Every attribute is padded to 4 bytes,
/// so the next message of a batch starts aligned.
fn finish(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

fn message(kind: u16, flags: u16, seq: u32, family: u8, attrs: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(HEADER + NFGENMSG + attrs.len());
    let start = begin(&mut msg, kind, flags, seq, family);
    msg.extend_from_slice(attrs);
    finish(&mut msg, start);
    msg
}

fn attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = (4 + value.len()) as u16;
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    pad(buf);
}

fn nested(buf: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    fill(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// A dump of the whole table: both families (`AF_UNSPEC` filters none out).
pub(super) fn dump_request(seq: u32) -> Vec<u8> {
    message(CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, AF_UNSPEC, &[])
}

/// Appends to `buf` the delete of `flow`'s entry: its original tuple, its zone when not the
/// default, and its id, so a newer entry of the same tuple is left alone (the kernel answers
/// ENOENT). With `ack` the kernel answers even a success; without, only a refusal, so a batch
/// asks only its last delete for an answer and knows every earlier one is answered by then.
pub(super) fn push_delete(buf: &mut Vec<u8>, seq: u32, flow: &Flow, ack: bool) {
    let family = if flow.source.is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    };
    let flags = if ack {
        NLM_F_REQUEST | NLM_F_ACK
    } else {
        NLM_F_REQUEST
    };
    let start = begin(buf, CT_DELETE, flags, seq, family);
    nested(buf, CTA_TUPLE_ORIG, |t| {
        nested(t, CTA_TUPLE_IP, |ip| {
            match (flow.source.ip(), flow.destination.ip()) {
                (IpAddr::V4(src), IpAddr::V4(dst)) => {
                    attr(ip, CTA_IP_V4_SRC, &src.octets());
                    attr(ip, CTA_IP_V4_DST, &dst.octets());
                }
                (src, dst) => {
                    attr(ip, CTA_IP_V6_SRC, &v6_octets(src));
                    attr(ip, CTA_IP_V6_DST, &v6_octets(dst));
                }
            }
        });
        nested(t, CTA_TUPLE_PROTO, |p| {
            attr(p, CTA_PROTO_NUM, &[protocol_number(flow.protocol)]);
            attr(p, CTA_PROTO_SRC_PORT, &flow.source.port().to_be_bytes());
            attr(
                p,
                CTA_PROTO_DST_PORT,
                &flow.destination.port().to_be_bytes(),
            );
        });
    });
    if flow.zone != 0 {
        attr(buf, CTA_ZONE, &flow.zone.to_be_bytes());
    }
    if let Some(id) = flow.id {
        attr(buf, CTA_ID, &id.to_be_bytes());
    }
    finish(buf, start);
}

/// An address's 16 bytes as an IPv6 tuple names it (an IPv4 one as IPv4-mapped, which a flow
/// of one family never mixes).
fn v6_octets(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
    }
}

// ---- answers ----

/// The netlink messages of one datagram: (type, flags, seq, payload after the header).
fn messages(buf: &[u8]) -> impl Iterator<Item = Result<(u16, u32, &[u8]), String>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + HEADER > buf.len() {
            return None;
        }
        let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        if len < HEADER || at + len > buf.len() {
            at = buf.len();
            return Some(Err(format!(
                "a netlink message of {len} bytes where {} remain",
                buf.len() - at.min(buf.len())
            )));
        }
        let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
        let seq = u32::from_ne_bytes([buf[at + 8], buf[at + 9], buf[at + 10], buf[at + 11]]);
        let payload = &buf[at + HEADER..at + len];
        at += (len + 3) & !3;
        Some(Ok((kind, seq, payload)))
    })
}

/// The errno of an error message's payload (0 for an acknowledgement).
fn error_code(payload: &[u8]) -> Result<i32, String> {
    let code = payload
        .get(..4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or("a short netlink error message")?;
    Ok(-code)
}

/// How far one dump datagram took the walk.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Dump {
    /// More datagrams follow.
    More,
    /// The table is complete.
    Done,
    /// The reader stopped it.
    Stopped,
}

/// Hands the flows of one dump datagram to `each`, in order.
pub(super) fn parse_dump(
    buf: &[u8],
    each: &mut dyn FnMut(Flow) -> ControlFlow<()>,
) -> Result<Dump, String> {
    for message in messages(buf) {
        let (kind, _, payload) = message?;
        match kind {
            CT_NEW => {
                if let Some(flow) = parse_flow(payload)
                    && each(flow).is_break()
                {
                    return Ok(Dump::Stopped);
                }
            }
            NLMSG_DONE => return Ok(Dump::Done),
            NLMSG_ERROR => {
                let code = error_code(payload)?;
                return Err(format!(
                    "the kernel refused the dump: {}",
                    std::io::Error::from_raw_os_error(code)
                ));
            }
            other => return Err(format!("an unexpected netlink message of type {other:#x}")),
        }
    }
    Ok(Dump::More)
}

/// The kernel's answers in one datagram: (request sequence number, errno; 0 acknowledges).
pub(super) fn answers(buf: &[u8]) -> impl Iterator<Item = Result<(u32, i32), String>> + '_ {
    messages(buf).filter_map(|message| match message {
        Ok((NLMSG_ERROR, seq, payload)) => Some(error_code(payload).map(|code| (seq, code))),
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    })
}

/// The attributes of `buf`: (type without flags, value). Stops at the first malformed one.
fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let header = buf.get(at..at + 4)?;
        let len = u16::from_ne_bytes([header[0], header[1]]) as usize;
        let kind = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
        if len < 4 {
            return None;
        }
        let value = buf.get(at + 4..at + len)?;
        at += (len + 3) & !3;
        Some((kind, value))
    })
}

fn be16(value: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(value.get(..2)?.try_into().ok()?))
}

fn be32(value: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(value.get(..4)?.try_into().ok()?))
}

fn ipv4(value: &[u8]) -> Option<IpAddr> {
    let b: [u8; 4] = value.get(..4)?.try_into().ok()?;
    Some(IpAddr::V4(Ipv4Addr::from(b)))
}

fn ipv6(value: &[u8]) -> Option<IpAddr> {
    let b: [u8; 16] = value.get(..16)?.try_into().ok()?;
    Some(IpAddr::V6(Ipv6Addr::from(b)))
}

/// One direction's tuple: (protocol number, source, destination).
fn parse_tuple(buf: &[u8]) -> Option<(u8, IpSocketAddr, IpSocketAddr)> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, None, None);
    for (kind, value) in attrs(buf) {
        match kind {
            CTA_TUPLE_IP => {
                for (kind, value) in attrs(value) {
                    match kind {
                        CTA_IP_V4_SRC => src = ipv4(value),
                        CTA_IP_V4_DST => dst = ipv4(value),
                        CTA_IP_V6_SRC => src = ipv6(value),
                        CTA_IP_V6_DST => dst = ipv6(value),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (kind, value) in attrs(value) {
                    match kind {
                        CTA_PROTO_NUM => proto = value.first().copied(),
                        CTA_PROTO_SRC_PORT => sport = be16(value),
                        CTA_PROTO_DST_PORT => dport = be16(value),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some((
        proto?,
        IpSocketAddr::new(src?, sport?),
        IpSocketAddr::new(dst?, dport?),
    ))
}

/// The flow of one `IPCTNL_MSG_CT_NEW` payload; `None` for anything but an IPv4 or IPv6 TCP
/// or UDP entry with both tuples.
fn parse_flow(payload: &[u8]) -> Option<Flow> {
    let family = *payload.first()?;
    if family != AF_INET && family != AF_INET6 {
        return None;
    }
    let (mut orig, mut reply, mut mark, mut zone, mut id) = (None, None, 0, 0, None);
    for (kind, value) in attrs(payload.get(NFGENMSG..)?) {
        match kind {
            CTA_TUPLE_ORIG => orig = parse_tuple(value),
            CTA_TUPLE_REPLY => reply = parse_tuple(value),
            CTA_MARK => mark = be32(value)?,
            CTA_ZONE => zone = be16(value)?,
            CTA_ID => id = be32(value),
            _ => {}
        }
    }
    let (number, source, destination) = orig?;
    let (_, reply_source, _) = reply?;
    // The tuples' addresses must be of the entry's family.
    if source.is_ipv6() != (family == AF_INET6) || reply_source.is_ipv6() != source.is_ipv6() {
        return None;
    }
    let protocol = match number {
        IPPROTO_TCP => Protocol::Tcp,
        IPPROTO_UDP => Protocol::Udp,
        _ => return None,
    };
    Some(Flow {
        protocol,
        source,
        destination,
        reply_source,
        mark,
        zone,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One delete, asking for an answer.
    fn delete_request(seq: u32, flow: &Flow) -> Vec<u8> {
        let mut buf = Vec::new();
        push_delete(&mut buf, seq, flow, true);
        buf
    }

    /// The flows of `buf`, collected, and how far the dump got.
    fn collect(buf: &[u8], flows: &mut Vec<Flow>) -> Result<Dump, String> {
        parse_dump(buf, &mut |f| {
            flows.push(f);
            ControlFlow::Continue(())
        })
    }

    /// Attributes as the kernel writes them (nested ones flagged), for answers built by hand.
    fn tuple(proto: u8, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut t = Vec::new();
        nested(&mut t, CTA_TUPLE_IP, |ip| {
            attr(ip, CTA_IP_V4_SRC, &src);
            attr(ip, CTA_IP_V4_DST, &dst);
        });
        nested(&mut t, CTA_TUPLE_PROTO, |p| {
            attr(p, CTA_PROTO_NUM, &[proto]);
            attr(p, CTA_PROTO_SRC_PORT, &sport.to_be_bytes());
            attr(p, CTA_PROTO_DST_PORT, &dport.to_be_bytes());
        });
        t
    }

    /// An IPv6 UDP entry: 2001:db8:198::10 dialing 2001:db8:203::9, DNATed to fd00:10:244:1::5.
    fn entry6() -> Vec<u8> {
        let v6 = |text: &str| text.parse::<Ipv6Addr>().expect("ipv6").octets();
        let tuple6 = |src: [u8; 16], sport: u16, dst: [u8; 16], dport: u16| {
            let mut t = Vec::new();
            nested(&mut t, CTA_TUPLE_IP, |ip| {
                attr(ip, CTA_IP_V6_SRC, &src);
                attr(ip, CTA_IP_V6_DST, &dst);
            });
            nested(&mut t, CTA_TUPLE_PROTO, |p| {
                attr(p, CTA_PROTO_NUM, &[IPPROTO_UDP]);
                attr(p, CTA_PROTO_SRC_PORT, &sport.to_be_bytes());
                attr(p, CTA_PROTO_DST_PORT, &dport.to_be_bytes());
            });
            t
        };
        let (client, node, pod) = (
            v6("2001:db8:198::10"),
            v6("2001:db8:203::9"),
            v6("fd00:10:244:1::5"),
        );
        let mut attrs = Vec::new();
        let orig = tuple6(client, 40000, node, 3000);
        let reply = tuple6(pod, 3000, client, 40000);
        nested(&mut attrs, CTA_TUPLE_ORIG, |b| b.extend_from_slice(&orig));
        nested(&mut attrs, CTA_TUPLE_REPLY, |b| b.extend_from_slice(&reply));
        attr(&mut attrs, CTA_MARK, &1u32.to_be_bytes());
        message(CT_NEW, 2, 7, AF_INET6, &attrs)
    }

    fn entry(family: u8, proto: u8, mark: u32, zone: Option<u16>) -> Vec<u8> {
        let mut attrs = Vec::new();
        let orig = tuple(proto, [198, 51, 100, 10], 40000, [203, 0, 113, 9], 3000);
        let reply = tuple(proto, [10, 244, 1, 5], 3000, [198, 51, 100, 10], 40000);
        nested(&mut attrs, CTA_TUPLE_ORIG, |b| b.extend_from_slice(&orig));
        nested(&mut attrs, CTA_TUPLE_REPLY, |b| b.extend_from_slice(&reply));
        attr(&mut attrs, 3, &0x18eu32.to_be_bytes()); // CTA_STATUS, not read
        attr(&mut attrs, CTA_MARK, &mark.to_be_bytes());
        attr(&mut attrs, CTA_ID, &0xdead_beefu32.to_be_bytes());
        if let Some(zone) = zone {
            attr(&mut attrs, CTA_ZONE, &zone.to_be_bytes());
        }
        let mut msg = message(CT_NEW, 2, 7, AF_INET, &attrs);
        msg[HEADER] = family;
        msg
    }

    fn done() -> Vec<u8> {
        let mut msg = message(NLMSG_DONE, 2, 7, AF_INET, &[]);
        msg.truncate(HEADER + 4);
        let len = msg.len() as u32;
        msg[..4].copy_from_slice(&len.to_ne_bytes());
        msg
    }

    fn error(seq: u32, errno: i32) -> Vec<u8> {
        let mut msg = Vec::new();
        msg.extend_from_slice(&((HEADER + 20) as u32).to_ne_bytes());
        msg.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&(-errno).to_ne_bytes());
        msg.extend_from_slice(&[0; 16]); // the request's header, echoed
        msg
    }

    #[test]
    fn a_dump_request_is_a_get_of_both_families() {
        let msg = dump_request(9);
        let mut want = Vec::new();
        want.extend_from_slice(&20u32.to_ne_bytes());
        want.extend_from_slice(&0x0101u16.to_ne_bytes());
        want.extend_from_slice(&0x0301u16.to_ne_bytes());
        want.extend_from_slice(&9u32.to_ne_bytes());
        want.extend_from_slice(&0u32.to_ne_bytes());
        want.extend_from_slice(&[AF_UNSPEC, 0, 0, 0]);
        assert_eq!(msg, want);
    }

    #[test]
    fn a_delete_names_the_original_tuple_zone_and_id_in_network_order() {
        let flow = Flow {
            protocol: Protocol::Udp,
            source: "198.51.100.10:40000".parse().expect("addr"),
            destination: "203.0.113.9:3000".parse().expect("addr"),
            reply_source: "10.244.1.5:3000".parse().expect("addr"),
            mark: 1,
            zone: 5,
            id: Some(0x0102_0304),
        };
        let msg = delete_request(3, &flow);
        let ne16 = |v: u16| v.to_ne_bytes();
        let mut want = Vec::new();
        want.extend_from_slice(&88u32.to_ne_bytes());
        want.extend_from_slice(&ne16(0x0102));
        want.extend_from_slice(&ne16(0x0005)); // request, ack
        want.extend_from_slice(&3u32.to_ne_bytes());
        want.extend_from_slice(&0u32.to_ne_bytes());
        want.extend_from_slice(&[2, 0, 0, 0]);
        // CTA_TUPLE_ORIG (nested), 52 bytes.
        want.extend_from_slice(&ne16(52));
        want.extend_from_slice(&ne16(0x8001));
        //   CTA_TUPLE_IP (nested): source and destination.
        want.extend_from_slice(&ne16(20));
        want.extend_from_slice(&ne16(0x8001));
        want.extend_from_slice(&ne16(8));
        want.extend_from_slice(&ne16(1));
        want.extend_from_slice(&[198, 51, 100, 10]);
        want.extend_from_slice(&ne16(8));
        want.extend_from_slice(&ne16(2));
        want.extend_from_slice(&[203, 0, 113, 9]);
        //   CTA_TUPLE_PROTO (nested): number (padded), ports big-endian (padded).
        want.extend_from_slice(&ne16(28));
        want.extend_from_slice(&ne16(0x8002));
        want.extend_from_slice(&ne16(5));
        want.extend_from_slice(&ne16(1));
        want.extend_from_slice(&[17, 0, 0, 0]);
        want.extend_from_slice(&ne16(6));
        want.extend_from_slice(&ne16(2));
        want.extend_from_slice(&[0x9c, 0x40, 0, 0]);
        want.extend_from_slice(&ne16(6));
        want.extend_from_slice(&ne16(3));
        want.extend_from_slice(&[0x0b, 0xb8, 0, 0]);
        // CTA_ZONE, CTA_ID.
        want.extend_from_slice(&ne16(6));
        want.extend_from_slice(&ne16(18));
        want.extend_from_slice(&[0, 5, 0, 0]);
        want.extend_from_slice(&ne16(8));
        want.extend_from_slice(&ne16(12));
        want.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(msg, want);

        // The default zone and an unknown id are left out.
        let plain = Flow {
            zone: 0,
            id: None,
            ..flow
        };
        assert_eq!(delete_request(3, &plain).len(), 72);
    }

    #[test]
    fn a_dump_yields_tcp_and_udp_entries_of_both_families_until_done() {
        let mut buf = entry(AF_INET, IPPROTO_UDP, 0x1bd01, None);
        buf.extend(entry(AF_INET, IPPROTO_TCP, 0, Some(7)));
        buf.extend(entry(AF_INET, 1, 0x1, None)); // ICMP: not a flow kuport translates
        buf.extend(entry(AF_INET6, IPPROTO_UDP, 0x1, None)); // IPv6 header, IPv4 tuples: left out
        buf.extend(entry6());
        let mut flows = Vec::new();
        assert_eq!(collect(&buf, &mut flows), Ok(Dump::More), "not done yet");
        assert_eq!(flows.len(), 3);
        let v6 = &flows[2];
        assert_eq!(v6.source, "[2001:db8:198::10]:40000".parse().expect("addr"));
        assert_eq!(
            v6.reply_source,
            "[fd00:10:244:1::5]:3000".parse().expect("addr")
        );
        // Its delete names the IPv6 tuple in an IPv6 message.
        let delete = delete_request(4, v6);
        assert_eq!(delete[HEADER], AF_INET6);
        assert!(
            delete.windows(16).any(|w| w
                == "2001:db8:198::10"
                    .parse::<Ipv6Addr>()
                    .expect("ipv6")
                    .octets()),
            "the client's address is in the tuple"
        );
        flows.truncate(2);
        let udp = &flows[0];
        assert_eq!(udp.protocol, Protocol::Udp);
        assert_eq!(udp.source, "198.51.100.10:40000".parse().expect("addr"));
        assert_eq!(udp.destination, "203.0.113.9:3000".parse().expect("addr"));
        assert_eq!(udp.reply_source, "10.244.1.5:3000".parse().expect("addr"));
        assert_eq!(
            (udp.mark, udp.zone, udp.id),
            (0x1bd01, 0, Some(0xdead_beef))
        );
        assert_eq!((flows[1].protocol, flows[1].zone), (Protocol::Tcp, 7));

        assert_eq!(collect(&done(), &mut flows), Ok(Dump::Done));
        assert_eq!(flows.len(), 2);
        assert!(
            collect(&error(7, 1), &mut flows)
                .expect_err("refused")
                .contains("refused the dump")
        );
        // A message claiming more bytes than the datagram holds is an error, not a panic.
        let mut cut = entry(AF_INET, IPPROTO_UDP, 0, None);
        cut.truncate(40);
        assert!(collect(&cut, &mut flows).is_err());
        // A reader that stops is handed nothing after.
        let mut seen = 0;
        let two = [
            entry(AF_INET, IPPROTO_UDP, 0, None),
            entry(AF_INET, IPPROTO_TCP, 0, None),
        ]
        .concat();
        let stopped = parse_dump(&two, &mut |_| {
            seen += 1;
            ControlFlow::Break(())
        });
        assert_eq!((stopped, seen), (Ok(Dump::Stopped), 1));
    }

    #[test]
    fn an_entry_missing_a_tuple_or_with_short_attributes_is_skipped() {
        let mut attrs = Vec::new();
        let orig = tuple(IPPROTO_UDP, [1, 2, 3, 4], 1, [5, 6, 7, 8], 2);
        nested(&mut attrs, CTA_TUPLE_ORIG, |b| b.extend_from_slice(&orig));
        let msg = message(CT_NEW, 2, 1, AF_INET, &attrs);
        assert_eq!(parse_flow(&msg[HEADER..]), None, "no reply tuple");
        let mut short = Vec::new();
        attr(&mut short, CTA_MARK, &[1, 2]);
        let msg = message(CT_NEW, 2, 1, AF_INET, &short);
        assert_eq!(parse_flow(&msg[HEADER..]), None);
        // An attribute whose length runs past the buffer ends the walk.
        assert_eq!(attrs_of_len(&[8, 0, 1, 0, 1, 2]), 0);
    }

    fn attrs_of_len(buf: &[u8]) -> usize {
        attrs(buf).count()
    }

    #[test]
    fn answers_name_their_request_and_errno() {
        let mut buf = error(3, ENOENT);
        buf.extend(error(4, 0));
        buf.extend(entry(AF_INET, IPPROTO_UDP, 0, None)); // not an answer: skipped
        buf.extend(error(5, 1));
        let got: Vec<_> = answers(&buf).collect();
        assert_eq!(got, vec![Ok((3, ENOENT)), Ok((4, 0)), Ok((5, 1))]);
        let mut short = error(6, 0);
        short.truncate(HEADER + 2);
        short[..4].copy_from_slice(&((HEADER + 2) as u32).to_ne_bytes());
        assert!(answers(&short).next().is_some_and(|a| a.is_err()));
    }

    #[test]
    fn a_batch_of_deletes_is_one_buffer_of_aligned_messages_asking_only_the_last_for_an_answer() {
        let flow = |port: u16, v6: bool| Flow {
            protocol: Protocol::Udp,
            source: if v6 {
                format!("[2001:db8::10]:{port}").parse().expect("addr")
            } else {
                format!("198.51.100.10:{port}").parse().expect("addr")
            },
            destination: if v6 {
                "[2001:db8::9]:3000".parse().expect("addr")
            } else {
                "203.0.113.9:3000".parse().expect("addr")
            },
            reply_source: if v6 {
                "[fd00::5]:3000".parse().expect("addr")
            } else {
                "10.244.1.5:3000".parse().expect("addr")
            },
            mark: 1,
            zone: port % 2,
            id: Some(u32::from(port)),
        };
        let flows = [flow(1, false), flow(2, true), flow(3, false)];
        let mut buf = Vec::new();
        for (i, f) in flows.iter().enumerate() {
            push_delete(&mut buf, 10 + i as u32, f, i == flows.len() - 1);
        }
        let mut at = 0;
        let mut seen = Vec::new();
        while at < buf.len() {
            let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("len")) as usize;
            assert_eq!(len % 4, 0, "message {} is padded", seen.len());
            let flags = u16::from_ne_bytes([buf[at + 6], buf[at + 7]]);
            let seq = u32::from_ne_bytes(buf[at + 8..at + 12].try_into().expect("seq"));
            // Each message is the one a single delete of the same flow would be.
            let i = seen.len();
            let alone = {
                let mut one = Vec::new();
                push_delete(&mut one, seq, &flows[i], i == flows.len() - 1);
                one
            };
            assert_eq!(&buf[at..at + len], &alone[..]);
            seen.push((seq, flags));
            at += len;
        }
        assert_eq!(seen, vec![(10, 0x1), (11, 0x1), (12, 0x5)]);
    }
}
