//! Conntrack entries made to order, for the sweep's kernel test and bench: written as
//! `IPCTNL_MSG_CT_NEW` messages over ctnetlink, a batch of them per `sendmsg`, into the
//! table of the network namespace of the calling thread (a few seconds for a million, where
//! the `conntrack -I` tool takes a process per entry). Each entry's reply tuple is given
//! whole, so an entry can stand for a translated flow (its reply coming from the DNAT target)
//! without any rule having translated it. The entries go with their namespace.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context as _, Result, bail};
use netlink_sys::{Socket, SocketAddr as NetlinkAddr, protocols::NETLINK_NETFILTER};

/// One entry to make: UDP, original direction `source` → `destination`, answered from
/// `reply_source` (to `source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub source: SocketAddr,
    pub destination: SocketAddr,
    pub reply_source: SocketAddr,
    /// The conntrack mark.
    pub mark: u32,
}

const CT_NEW: u16 = 1 << 8;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TIMEOUT: u16 = 7;
const CTA_MARK: u16 = 8;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const IPPROTO_UDP: u8 = 17;
/// Entries per `sendmsg`.
const BATCH: usize = 256;
/// The host-wide limit every namespace's table is held to (writable in the initial namespace
/// only).
const CONNTRACK_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

/// Makes `entries` in the calling thread's namespace, each living `timeout_secs`; returns how
/// many were made. Fails at the first entry the kernel refuses (a full table says
/// `Cannot allocate memory`: raise `nf_conntrack_max`).
pub fn insert(entries: impl IntoIterator<Item = Entry>, timeout_secs: u32) -> Result<usize> {
    let mut socket = Socket::new(NETLINK_NETFILTER).context("netlink socket")?;
    socket.bind_auto().context("binding the netlink socket")?;
    socket
        .connect(&NetlinkAddr::new(0, 0))
        .context("connecting the netlink socket")?;
    socket
        .set_cap_ack(true)
        .context("asking for short answers")?;
    let mut made = 0;
    let mut seq = 0u32;
    let mut batch = Vec::with_capacity(BATCH * 112);
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        batch.clear();
        for entry in entries.by_ref().take(BATCH) {
            seq += 1;
            push_new(&mut batch, seq, &entry, timeout_secs);
            made += 1;
        }
        // Only the batch's last message asks for an answer (a refusal is answered anyway).
        set_ack_on_last(&mut batch);
        socket.send(&batch, 0).context("sending new entries")?;
        wait_for(&socket, seq)?;
    }
    Ok(made)
}

/// The number of entries in the calling thread's namespace (`/proc/sys/net` answers for the
/// namespace of the thread reading it).
pub fn count() -> Result<usize> {
    let path = "/proc/sys/net/netfilter/nf_conntrack_count";
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.trim().parse().context("parsing nf_conntrack_count")
}

fn push_new(buf: &mut Vec<u8>, seq: u32, entry: &Entry, timeout_secs: u32) {
    let start = buf.len();
    let flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL;
    let family = if entry.source.is_ipv4() { 2 } else { 10 };
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&CT_NEW.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[family, 0, 0, 0]);
    nested(buf, CTA_TUPLE_ORIG, |b| {
        tuple(b, entry.source, entry.destination);
    });
    nested(buf, CTA_TUPLE_REPLY, |b| {
        tuple(b, entry.reply_source, entry.source);
    });
    attr(buf, CTA_TIMEOUT, &timeout_secs.to_be_bytes());
    if entry.mark != 0 {
        attr(buf, CTA_MARK, &entry.mark.to_be_bytes());
    }
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// Sets `NLM_F_ACK` on the last message of `batch`.
fn set_ack_on_last(batch: &mut [u8]) {
    let mut at = 0;
    let mut last = 0;
    while at + 16 <= batch.len() {
        last = at;
        let len = u32::from_ne_bytes([batch[at], batch[at + 1], batch[at + 2], batch[at + 3]]);
        at += len as usize;
    }
    let flags = u16::from_ne_bytes([batch[last + 6], batch[last + 7]]) | NLM_F_ACK;
    batch[last + 6..last + 8].copy_from_slice(&flags.to_ne_bytes());
}

/// Reads answers up to the one to request `last`; the first refusal is an error.
fn wait_for(socket: &Socket, last: u32) -> Result<()> {
    let mut buf = Vec::with_capacity(8192);
    loop {
        buf.clear();
        socket.recv(&mut buf, 0).context("reading the answers")?;
        let mut at = 0;
        while at + 20 <= buf.len() {
            let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            let seq = u32::from_ne_bytes([buf[at + 8], buf[at + 9], buf[at + 10], buf[at + 11]]);
            if kind == NLMSG_ERROR {
                let code =
                    i32::from_ne_bytes([buf[at + 16], buf[at + 17], buf[at + 18], buf[at + 19]]);
                if code != 0 {
                    bail!(
                        "the kernel refused entry {seq}: {}",
                        std::io::Error::from_raw_os_error(-code)
                    );
                }
                if seq == last {
                    return Ok(());
                }
            }
            at += len.max(20).next_multiple_of(4);
        }
    }
}

fn tuple(buf: &mut Vec<u8>, from: SocketAddr, to: SocketAddr) {
    nested(buf, CTA_TUPLE_IP, |b| match (from.ip(), to.ip()) {
        (IpAddr::V4(f), IpAddr::V4(t)) => {
            attr(b, 1, &f.octets());
            attr(b, 2, &t.octets());
        }
        (f, t) => {
            attr(b, 3, &v6(f));
            attr(b, 4, &v6(t));
        }
    });
    nested(buf, CTA_TUPLE_PROTO, |b| {
        attr(b, 1, &[IPPROTO_UDP]);
        attr(b, 2, &from.port().to_be_bytes());
        attr(b, 3, &to.port().to_be_bytes());
    });
}

fn v6(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

fn attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

fn nested(buf: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    fill(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// The host's `nf_conntrack_max`, raised for a test or bench that fills a table past it; the
/// old value is written back when dropped.
#[must_use = "the limit is restored when this is dropped"]
pub struct RaisedMax(Option<String>);

impl RaisedMax {
    /// Raises the limit to `at_least` when it is lower (from the initial namespace), saying so
    /// on stderr; changes nothing otherwise.
    pub fn to(at_least: u64) -> Result<Self> {
        let old = std::fs::read_to_string(CONNTRACK_MAX)
            .with_context(|| format!("reading {CONNTRACK_MAX}"))?;
        let now: u64 = old.trim().parse().context("parsing nf_conntrack_max")?;
        if now >= at_least {
            return Ok(Self(None));
        }
        std::fs::write(CONNTRACK_MAX, at_least.to_string())
            .with_context(|| format!("raising {CONNTRACK_MAX} to {at_least}"))?;
        eprintln!("{CONNTRACK_MAX} raised from {now} to {at_least}, until the run ends");
        Ok(Self(Some(old)))
    }
}

impl Drop for RaisedMax {
    fn drop(&mut self) {
        if let Some(old) = &self.0
            && let Err(e) = std::fs::write(CONNTRACK_MAX, old.trim())
        {
            eprintln!("restoring {CONNTRACK_MAX} to {}: {e}", old.trim());
        }
    }
}
