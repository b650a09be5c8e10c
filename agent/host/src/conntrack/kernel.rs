//! The kernel's conntrack table over ctnetlink (`NETLINK_NETFILTER`, subsystem
//! `NFNL_SUBSYS_CTNETLINK`): a dump of the table (IPv4 and IPv6) read datagram by datagram
//! into one fixed buffer, each entry handed on as it is parsed; and deletes by original tuple,
//! a batch in one `sendmsg`. Hand-written, like the nftables generation request: kuport needs
//! two requests and five attributes of the answer (`kernel/wire.rs`). Needs `CAP_NET_ADMIN` in
//! the node's network namespace, which the agent already has for everything else.
//!
//! The dump asks the kernel to filter nothing. ctnetlink can filter a dump by mark, and since
//! Linux 5.8 by tuple, but it walks the whole hash table (every namespace's entries) with
//! softirqs off on its CPU until it has a datagram's worth to send: a filter that matches a
//! few entries of a million held one `recv` for 168 ms on kernel 6.18, while an unfiltered
//! dump returns every 170 or so entries (`docs/decisions.md`, "Stale conntrack entries").

mod wire;

use std::ops::ControlFlow;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use super::{ConntrackTable, Deleted, Flow};
use wire::{Dump, ENOENT, answers, dump_request, parse_dump, push_delete};

/// A dump datagram is at most 32 KiB (the kernel sizes them by the reader's buffer, capped
/// there); twice that leaves room.
const RECV_BUFFER: usize = 64 * 1024;
/// What the answers to a batch of deletes can take: a refusal is 36 bytes (`NETLINK_CAP_ACK`
/// leaves the request out of it), one per datagram.
const ANSWER_BUFFER: usize = 4 * 1024;
/// `MSG_TRUNC`: recv reports a datagram's real length, so a cut one is noticed.
const MSG_TRUNC: i32 = 0x20;
/// `MSG_DONTWAIT`.
const MSG_DONTWAIT: i32 = 0x40;
/// `ENOBUFS`: the socket's receive queue overflowed and answers were dropped.
const ENOBUFS: i32 = 105;

/// The conntrack table of the network namespace the agent runs in.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelConntrack;

impl ConntrackTable for KernelConntrack {
    fn walk(&self, each: &mut dyn FnMut(Flow) -> ControlFlow<()>) -> Result<(), String> {
        let mut socket = Ctnetlink::open(RECV_BUFFER)?;
        let seq = socket.next_seq();
        socket.send(&dump_request(seq), "asking for the table")?;
        loop {
            let datagram = socket.recv(0, "reading the table")?;
            match parse_dump(datagram, each)? {
                Dump::More => {}
                // Closing the socket ends a dump stopped half way.
                Dump::Done | Dump::Stopped => return Ok(()),
            }
        }
    }

    fn delete(&self, flows: &[Flow]) -> Deleted {
        if flows.is_empty() {
            return Deleted::default();
        }
        let mut socket = match Ctnetlink::open(ANSWER_BUFFER).and_then(|s| {
            s.socket
                .set_cap_ack(true)
                .map_err(|e| format!("asking for short answers: {e}"))?;
            Ok(s)
        }) {
            Ok(s) => s,
            Err(e) => return Deleted::all_refused(flows.len(), e),
        };
        let first = socket.seq.wrapping_add(1);
        let mut batch = Vec::with_capacity(flows.len() * 96);
        for (i, flow) in flows.iter().enumerate() {
            let seq = socket.next_seq();
            push_delete(&mut batch, seq, flow, i + 1 == flows.len());
        }
        if let Err(e) = socket.send(&batch, "sending deletes") {
            return Deleted::all_refused(flows.len(), e);
        }
        read_answers(&mut socket, flows, first)
    }
}

/// Counts the kernel's answers to the batch of `flows` whose first request is `first`. The
/// kernel handles a batch inside `sendmsg`, so every answer is queued when it returns: they are
/// read without waiting, up to the last request's, which is always answered.
fn read_answers(socket: &mut Ctnetlink, flows: &[Flow], first: u32) -> Deleted {
    let mut out = Deleted::default();
    let mut answered = 0;
    let last = flows.len() - 1;
    let mut trouble = None;
    loop {
        let datagram = match socket.recv_io(MSG_DONTWAIT) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(ENOBUFS) => {
                trouble = Some("the socket's receive queue overflowed".to_owned());
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => {
                trouble = Some(format!("reading the answers: {e}"));
                break;
            }
        };
        for answer in answers(datagram) {
            let Ok((seq, code)) = answer else { continue };
            let i = seq.wrapping_sub(first) as usize;
            let Some(flow) = flows.get(i) else { continue };
            answered += 1;
            match code {
                0 => {}
                ENOENT => out.gone += 1,
                code => {
                    out.refused += 1;
                    if out.first_error.is_none() {
                        let words = std::io::Error::from_raw_os_error(code);
                        out.first_error = Some(format!("{}: {words}", describe(flow)));
                    }
                }
            }
            if i == last {
                out.deleted = flows.len() - out.gone - out.refused;
                return out;
            }
        }
    }
    // The last request's answer never came: the rest of the batch is not known to be deleted.
    let unknown = flows.len() - out.gone - out.refused;
    out.refused += unknown;
    out.first_error.get_or_insert_with(|| {
        let why = trouble.unwrap_or_else(|| "no answer to the last request".to_owned());
        format!("{unknown} deletes unconfirmed ({answered} answers read): {why}")
    });
    out
}

/// A flow as the `conntrack` tool would name it.
pub fn describe(flow: &Flow) -> String {
    format!(
        "{} {} -> {} (reply from {}, mark {:#x})",
        flow.protocol.lower(),
        flow.source,
        flow.destination,
        flow.reply_source,
        flow.mark
    )
}

/// A netfilter netlink socket connected to the kernel, with one receive buffer.
struct Ctnetlink {
    socket: Socket,
    seq: u32,
    buffer: Vec<u8>,
}

impl Ctnetlink {
    fn open(buffer: usize) -> Result<Self, String> {
        let mut socket =
            Socket::new(NETLINK_NETFILTER).map_err(|e| format!("netlink socket: {e}"))?;
        socket
            .bind_auto()
            .map_err(|e| format!("binding the netlink socket: {e}"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| format!("connecting the netlink socket: {e}"))?;
        Ok(Self {
            socket,
            seq: 0,
            buffer: Vec::with_capacity(buffer),
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send(&self, msg: &[u8], what: &str) -> Result<(), String> {
        self.socket
            .send(msg, 0)
            .map(|_| ())
            .map_err(|e| format!("{what}: {e}"))
    }

    /// One datagram into the buffer (`flags` besides `MSG_TRUNC`).
    fn recv(&mut self, flags: i32, what: &str) -> Result<&[u8], String> {
        self.recv_io(flags).map_err(|e| format!("{what}: {e}"))
    }

    fn recv_io(&mut self, flags: i32) -> std::io::Result<&[u8]> {
        self.buffer.clear();
        let len = self.socket.recv(&mut self.buffer, flags | MSG_TRUNC)?;
        if len > self.buffer.len() {
            return Err(std::io::Error::other(format!(
                "a datagram of {len} bytes, larger than the {}-byte buffer",
                self.buffer.capacity()
            )));
        }
        Ok(&self.buffer)
    }
}
