//! Changes to kuport's nftables table by other programs, as the kernel announces them on the
//! nftables multicast group (`NFNLGRP_NFTABLES`, what `nft monitor` reads).
//!
//! Every committed transaction is announced object by object (table, chain, rule, set,
//! element, counter), then closed by a NEWGEN message carrying the new ruleset generation and
//! the id of the process that committed it. The objects of a transaction are collected until
//! its NEWGEN; when some were in `table ip kuport` and the committer was not one of the `nft`
//! processes the agent itself ran ([`Committers`]), the transaction is a host event. So the
//! agent's own transactions (one per pass that changes the table) wake nothing, and an `nft
//! flush ruleset`, a `delete table ip kuport` or a flushed chain wakes it at once.
//!
//! Written over raw netlink like `nft_generation.rs`: the messages are a 4-byte header and
//! attributes, of which this reads the table's name and the NEWGEN's two numbers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use kuport_core::ir::TABLE;
use netlink_sys::{
    AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket, protocols::NETLINK_NETFILTER,
};
use tokio::sync::mpsc;

use crate::host::{HostEvent, HostEventKind};

/// `NFNLGRP_NFTABLES`.
const GROUP: u32 = 7;
/// `NFNL_SUBSYS_NFTABLES`.
const SUBSYS: u16 = 10;
/// `NFT_MSG_NEWGEN`.
const MSG_NEWGEN: u16 = 15;
/// `NLMSG_OVERRUN`.
const NLMSG_OVERRUN: u16 = 4;
/// `NFPROTO_IPV4`: kuport's IPv4 table is `ip`.
const FAMILY_IP: u8 = 2;
/// `NFPROTO_IPV6`: kuport's IPv6 table is `ip6`.
const FAMILY_IP6: u8 = 10;
/// `NFTA_GEN_PROC_PID`.
const GEN_PROC_PID: u16 = 2;
const HEADER: usize = 16;
const NFGENMSG: usize = 4;
/// How many of the agent's recent `nft` processes are remembered: one apply runs a few, and
/// their commits are announced before the apply returns.
const REMEMBERED: usize = 32;
/// At most this many objects are named in one event's text.
const NAMED: usize = 3;

/// The process ids of the `nft` programs the agent ran lately: a commit by one of them is the
/// agent's own. Recorded when the program starts, before it is given its script, so before it
/// can commit anything.
#[derive(Debug, Default)]
pub struct Committers(Mutex<VecDeque<u32>>);

impl Committers {
    /// `pid` is an `nft` the agent started.
    pub fn record(&self, pid: u32) {
        let mut pids = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pids.len() == REMEMBERED {
            pids.pop_front();
        }
        pids.push_back(pid);
    }

    /// Whether `pid` is an `nft` the agent started lately.
    pub fn contains(&self, pid: u32) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&pid)
    }
}

/// The objects of kuport's table announced since the last NEWGEN.
#[derive(Debug, Default)]
pub(crate) struct Transactions {
    touched: Vec<String>,
    count: usize,
    removed: bool,
    /// Which of kuport's tables were touched: the IPv4 one, the IPv6 one.
    tables: (bool, bool),
}

impl Transactions {
    /// Reads one datagram of announcements: the host events it closes.
    pub(crate) fn feed(&mut self, buf: &[u8], own: &Committers) -> Vec<HostEvent> {
        let mut events = Vec::new();
        let mut at = 0;
        while let Some(len) = u32_at(buf, at).map(|l| l as usize) {
            if len < HEADER || at + len > buf.len() {
                break;
            }
            let msg = &buf[at..at + len];
            if let Some(event) = self.message(msg, own) {
                events.push(event);
            }
            at += (len + 3) & !3;
        }
        events
    }

    fn message(&mut self, msg: &[u8], own: &Committers) -> Option<HostEvent> {
        let kind = u16_at(msg, 4)?;
        if kind == NLMSG_OVERRUN {
            return Some(lost());
        }
        if kind >> 8 != SUBSYS || msg.len() < HEADER + NFGENMSG {
            return None;
        }
        let op = kind & 0xff;
        if op == MSG_NEWGEN {
            let pid = attribute(msg, GEN_PROC_PID).and_then(be_u32);
            return self.close(pid, own);
        }
        let (verb, noun, name_attr) = describe(op)?;
        let family = msg[HEADER];
        if (family != FAMILY_IP && family != FAMILY_IP6)
            || attribute(msg, 1).map(c_str) != Some(TABLE)
        {
            return None;
        }
        if family == FAMILY_IP {
            self.tables.0 = true;
        } else {
            self.tables.1 = true;
        }
        self.count += 1;
        self.removed |= verb == "deleted";
        if self.touched.len() < NAMED {
            let name = attribute(msg, name_attr).map(c_str).unwrap_or_default();
            self.touched
                .push(format!("{verb} {noun} {name}").trim_end().to_owned());
        }
        None
    }

    /// A transaction was committed by `pid`: an event when it touched kuport's table and was
    /// not the agent's own (a kernel that does not say who committed counts as another).
    fn close(&mut self, pid: Option<u32>, own: &Committers) -> Option<HostEvent> {
        let taken = std::mem::take(self);
        if taken.count == 0 || pid.is_some_and(|p| own.contains(p)) {
            return None;
        }
        let more = taken.count - taken.touched.len();
        let table = match taken.tables {
            (true, true) => format!("tables ip and ip6 {TABLE}"),
            (false, true) => format!("table ip6 {TABLE}"),
            _ => format!("table ip {TABLE}"),
        };
        let mut what = format!("{table}: {}", taken.touched.join(", "));
        if more > 0 {
            what.push_str(&format!(" and {more} more"));
        }
        if let Some(p) = pid {
            what.push_str(&format!(" (by process {p})"));
        }
        Some(HostEvent {
            kind: HostEventKind::Nftables,
            what,
            removed: taken.removed,
        })
    }
}

fn lost() -> HostEvent {
    HostEvent {
        kind: HostEventKind::Lost,
        what: "nftables events (the socket's buffer overflowed)".to_owned(),
        removed: false,
    }
}

/// What an nftables message announces, and which attribute names its object; `None` for
/// messages that announce no object of a table.
fn describe(op: u16) -> Option<(&'static str, &'static str, u16)> {
    Some(match op {
        0 => ("created", "table", 1),
        2 => ("deleted", "table", 1),
        3 => ("created", "chain", 3),
        5 => ("deleted", "chain", 3),
        6 => ("created", "rule in chain", 2),
        8 => ("deleted", "rule in chain", 2),
        9 => ("created", "set", 2),
        11 => ("deleted", "set", 2),
        12 => ("created", "elements of", 2),
        14 => ("deleted", "elements of", 2),
        18 => ("created", "object", 2),
        20 => ("deleted", "object", 2),
        22 => ("created", "flowtable", 2),
        24 => ("deleted", "flowtable", 2),
        _ => return None,
    })
}

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    buf.get(at..at + 2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    buf.get(at..at + 4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn be_u32(v: &[u8]) -> Option<u32> {
    v.get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// A NUL-terminated string attribute's text (empty when it is not UTF-8).
fn c_str(v: &[u8]) -> &str {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    std::str::from_utf8(&v[..end]).unwrap_or_default()
}

/// The value of the first top-level attribute of type `want` of a message.
fn attribute(msg: &[u8], want: u16) -> Option<&[u8]> {
    let mut at = HEADER + NFGENMSG;
    while let (Some(alen), Some(kind)) = (u16_at(msg, at), u16_at(msg, at + 2)) {
        let alen = alen as usize;
        if alen < 4 || at + alen > msg.len() {
            return None;
        }
        if kind & 0x3fff == want {
            return Some(&msg[at + 4..at + alen]);
        }
        at += (alen + 3) & !3;
    }
    None
}

/// Opens the nftables event stream: host events for changes other programs commit to
/// kuport's table, and a [`HostEventKind::Lost`] event when the socket's buffer overflowed.
/// The task reading it ends when the receiver is dropped (at the next announcement) or the
/// socket fails (the channel then closes).
pub fn watch(own: Arc<Committers>) -> Result<mpsc::Receiver<HostEvent>, std::io::Error> {
    let mut socket = TokioSocket::new(NETLINK_NETFILTER)?;
    socket.socket_mut().bind(&SocketAddr::new(0, 0))?;
    socket.socket_mut().add_membership(GROUP)?;
    // A large `nft -f` by another program (a firewall reload) announces thousands of objects
    // at once; a larger buffer keeps them, and an overflow still says so (ENOBUFS).
    if let Err(e) = socket.socket_mut().set_rx_buf_sz(4 << 20) {
        tracing::debug!("enlarging the nftables event buffer: {e}");
    }
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut transactions = Transactions::default();
        let mut buf = Vec::with_capacity(1 << 16);
        loop {
            buf.clear();
            let events = match socket.recv(&mut buf).await {
                Ok(()) => transactions.feed(&buf, &own),
                Err(e) if e.raw_os_error() == Some(105) => {
                    // ENOBUFS: announcements were dropped, a transaction's objects with them.
                    transactions = Transactions::default();
                    vec![lost()]
                }
                Err(e) => {
                    tracing::warn!("reading nftables events: {e}; the stream ends");
                    return;
                }
            };
            for event in events {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One announcement: `op` of the nftables subsystem, in `family`, with attributes.
    fn msg(op: u16, family: u8, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        for (t, value) in attrs {
            let alen = (4 + value.len()) as u16;
            body.extend_from_slice(&alen.to_ne_bytes());
            body.extend_from_slice(&t.to_ne_bytes());
            body.extend_from_slice(value);
            while !body.len().is_multiple_of(4) {
                body.push(0);
            }
        }
        let mut m = ((HEADER + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&((SUBSYS << 8) | op).to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&body);
        m
    }

    fn name(s: &str) -> Vec<u8> {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        v
    }

    fn object(op: u16, table: &str, attr: u16, object: &str) -> Vec<u8> {
        msg(op, FAMILY_IP, &[(1, name(table)), (attr, name(object))])
    }

    fn newgen(pid: Option<u32>) -> Vec<u8> {
        let mut attrs = vec![(1, 7u32.to_be_bytes().to_vec())];
        if let Some(p) = pid {
            attrs.push((GEN_PROC_PID, p.to_be_bytes().to_vec()));
            attrs.push((3, name("nft")));
        }
        msg(MSG_NEWGEN, 0, &attrs)
    }

    fn datagram(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn another_programs_deletion_of_kuports_table_is_one_event_at_its_commit() {
        let own = Committers::default();
        let mut t = Transactions::default();
        // `nft delete table ip kuport`: its rules, sets, chains, then the table; announced
        // across two datagrams, closed by the NEWGEN.
        let first = datagram(&[
            object(8, "kuport", 2, "pre"),
            object(11, "kuport", 2, "dnat_tcp"),
        ]);
        assert!(t.feed(&first, &own).is_empty(), "not committed yet");
        let second = datagram(&[
            object(5, "kuport", 3, "pre"),
            object(2, "kuport", 1, "kuport"),
            newgen(Some(999)),
        ]);
        let events = t.feed(&second, &own);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].kind, HostEventKind::Nftables);
        assert!(events[0].removed);
        assert_eq!(
            events[0].what,
            "table ip kuport: deleted rule in chain pre, deleted set dnat_tcp, deleted chain pre \
             and 1 more (by process 999)"
        );
    }

    #[test]
    fn the_agents_own_commits_and_other_tables_are_not_events() {
        let own = Committers::default();
        own.record(1234);
        let mut t = Transactions::default();
        let ours = datagram(&[object(14, "kuport", 2, "dnat_tcp"), newgen(Some(1234))]);
        assert!(t.feed(&ours, &own).is_empty(), "the agent's own nft");
        // Another table of the ip family, and a table named kuport of another family (inet).
        let foreign = datagram(&[
            object(2, "filter", 1, "filter"),
            msg(2, 1, &[(1, name("kuport"))]),
            newgen(Some(77)),
        ]);
        assert!(t.feed(&foreign, &own).is_empty());
        // Control: the same commit by another process is an event.
        let theirs = datagram(&[object(14, "kuport", 2, "dnat_tcp"), newgen(Some(1235))]);
        assert_eq!(t.feed(&theirs, &own).len(), 1);
        // kuport's IPv6 table is kuport's too.
        let v6 = datagram(&[
            msg(14, FAMILY_IP6, &[(1, name("kuport")), (2, name("kup-pre"))]),
            newgen(Some(1236)),
        ]);
        let events = t.feed(&v6, &own);
        assert_eq!(events.len(), 1);
        assert!(
            events[0].what.starts_with("table ip6 kuport: "),
            "{events:?}"
        );
    }

    #[test]
    fn a_kernel_that_names_no_committer_counts_as_another_program() {
        let own = Committers::default();
        own.record(1234);
        let mut t = Transactions::default();
        let events = t.feed(
            &datagram(&[object(6, "kuport", 2, "pre"), newgen(None)]),
            &own,
        );
        assert_eq!(events.len(), 1);
        assert!(!events[0].removed, "a rule added by hand is drift too");
        assert_eq!(events[0].what, "table ip kuport: created rule in chain pre");
    }

    #[test]
    fn an_overrun_is_lost_events_and_truncated_input_is_ignored() {
        let own = Committers::default();
        let mut t = Transactions::default();
        let mut overrun = vec![0u8; HEADER];
        overrun[..4].copy_from_slice(&(HEADER as u32).to_ne_bytes());
        overrun[4..6].copy_from_slice(&NLMSG_OVERRUN.to_ne_bytes());
        let events = t.feed(&overrun, &own);
        assert_eq!(events[0].kind, HostEventKind::Lost);
        let whole = object(2, "kuport", 1, "kuport");
        for cut in 0..whole.len() {
            assert!(t.feed(&whole[..cut], &own).is_empty(), "cut at {cut}");
        }
    }

    #[test]
    fn committers_remember_the_latest_pids() {
        let own = Committers::default();
        for pid in 0..(REMEMBERED as u32 + 5) {
            own.record(pid);
        }
        assert!(!own.contains(4), "forgotten");
        assert!(own.contains(5) && own.contains(REMEMBERED as u32 + 4));
    }
}
