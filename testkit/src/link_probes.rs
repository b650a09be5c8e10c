//! kuport's link probes seen from outside the agent, for the proofs that forged answers are not
//! believed (`kuport-echo forge-probes` and `kuport-echo old-probe`):
//!
//! - [`forge`]: a forger in a pod. It cannot see the probes, so it sprays what an answer looks
//!   like: every sequence number of a window, from the peer's link address and the probe port
//!   (raw IPv4: a pod has `CAP_NET_RAW` under the runtimes' default capabilities), small, with
//!   a nonce it can only guess; and, optionally, a request the node's probe socket would answer
//!   toward the peer.
//! - [`old_probe`]: the agent's prober as it was before its answers had to carry a nonce and the
//!   probe's size: a socket on the link address bound to no device, an answer matched by the
//!   peer's address, its kind and its sequence number alone. The control: what the forger does
//!   to that matching.
//!
//! The wire format is written out here on purpose, not taken from the agent: a proof that
//! reads the agent's own encoder would follow it when it changes.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::ops::Range;
use std::time::{Duration, Instant};

/// The probes' UDP port.
pub const PORT: u16 = 4794;
const MAGIC: &[u8; 8] = b"kuprobe1";
const REQUEST: u8 = 1;
const ANSWER: u8 = 2;
/// Magic, kind, sequence number: all an answer needed before nonces.
const OLD_HEADER: usize = 17;
/// The header with the 16-byte nonce: the size of a small probe now.
const HEADER: usize = OLD_HEADER + 16;

/// A probe's payload: magic, `kind`, `seq`, zeros up to `len` bytes (at least the header of its
/// format: 17 bytes).
pub fn payload(kind: u8, seq: u64, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len.max(OLD_HEADER)];
    p[..8].copy_from_slice(MAGIC);
    p[8] = kind;
    p[9..OLD_HEADER].copy_from_slice(&seq.to_be_bytes());
    p
}

/// Whether `packet` answers `seq` as the prober matched before nonces: magic, kind, sequence
/// number, whatever its length.
pub fn old_match(packet: &[u8], seq: u64) -> bool {
    packet.len() >= OLD_HEADER
        && &packet[..8] == MAGIC
        && packet[8] == ANSWER
        && packet[9..OLD_HEADER] == seq.to_be_bytes()
}

/// A whole IPv4 packet carrying `payload` in UDP from `src` to `dst`, both checksums set.
pub fn ipv4_udp(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&src.ip().octets());
    p.extend_from_slice(&dst.ip().octets());
    let ip_sum = checksum(&[&p[..20]]);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    p.extend_from_slice(&src.port().to_be_bytes());
    p.extend_from_slice(&dst.port().to_be_bytes());
    p.extend_from_slice(&(udp_len as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&src.ip().octets());
    pseudo.extend_from_slice(&dst.ip().octets());
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(udp_len as u16).to_be_bytes());
    let udp_sum = match checksum(&[&pseudo, &p[20..]]) {
        // 0 means "no checksum" in UDP: the same sum is sent as all ones.
        0 => 0xffff,
        s => s,
    };
    p[26..28].copy_from_slice(&udp_sum.to_be_bytes());
    p
}

/// The Internet checksum over the concatenation of `parts` (each of even length but the last).
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for part in parts {
        for pair in part.chunks(2) {
            let word = u16::from_be_bytes([pair[0], pair.get(1).copied().unwrap_or(0)]);
            sum += u32::from(word);
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// What the forger sends.
#[derive(Clone, Debug)]
pub struct Forgery {
    /// The peer's link address: the forged source.
    pub from: Ipv4Addr,
    /// The prober's link address.
    pub to: Ipv4Addr,
    /// The sequence numbers answered, each once per round.
    pub seqs: Range<u64>,
    /// Between rounds.
    pub every: Duration,
    /// A request to send each round too (from the peer's address, as the peer's probe).
    pub request_seq: Option<u64>,
}

impl Forgery {
    /// One round's packets.
    pub fn packets(&self) -> Vec<Vec<u8>> {
        let src = SocketAddrV4::new(self.from, PORT);
        let dst = SocketAddrV4::new(self.to, PORT);
        let mut out: Vec<Vec<u8>> = self
            .seqs
            .clone()
            .map(|seq| ipv4_udp(src, dst, &payload(ANSWER, seq, HEADER)))
            .collect();
        if let Some(seq) = self.request_seq {
            out.push(ipv4_udp(src, dst, &payload(REQUEST, seq, HEADER)));
        }
        out
    }
}

/// Sends the forgery's rounds until killed; `ready` is called once the first round is out.
pub fn forge(f: &Forgery, mut ready: impl FnMut()) -> std::io::Result<()> {
    use rustix::net::{AddressFamily, SendFlags, SocketType, ipproto};
    // IPPROTO_RAW: the packet is written whole, its source address included.
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::RAW, Some(ipproto::RAW))?;
    let packets = f.packets();
    let dst = SocketAddr::V4(SocketAddrV4::new(f.to, 0));
    let mut first = true;
    loop {
        for p in &packets {
            rustix::net::sendto(&fd, p, SendFlags::empty(), &dst)?;
        }
        if std::mem::take(&mut first) {
            ready();
        }
        std::thread::sleep(f.every);
    }
}

/// What [`old_probe`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OldProbeOutcome {
    /// Probes the old matching took as answered.
    pub answered: u32,
    /// Probes it took as lost.
    pub lost: u32,
    /// Requests from the peer's address it answered (as the old socket did).
    pub requests: u32,
}

/// Probes as the agent did before nonces, from `from` (bound to no device) to `to`: `count`
/// probes of `size` bytes of IP packet (sequence numbers 3, 5, 7, ...: full-size ones), one
/// every `interval`, each answered when a datagram from the peer's probe port matching its
/// sequence number ([`old_match`]) arrives before the next is sent. Requests from the peer's
/// probe port are answered with the same bytes, as that socket did.
pub fn old_probe(
    from: Ipv4Addr,
    to: Ipv4Addr,
    size: usize,
    count: u32,
    interval: Duration,
) -> std::io::Result<OldProbeOutcome> {
    let socket = UdpSocket::bind(SocketAddrV4::new(from, PORT))?;
    let peer = SocketAddr::V4(SocketAddrV4::new(to, PORT));
    let mut out = OldProbeOutcome::default();
    let mut buf = vec![0u8; 65536];
    for round in 1..=u64::from(count) {
        let seq = round * 2 + 1;
        socket.send_to(&payload(REQUEST, seq, size.saturating_sub(28)), peer)?;
        let deadline = Instant::now() + interval;
        let mut answered = false;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            socket.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            let (n, who) = match socket.recv_from(&mut buf) {
                Ok(got) => got,
                Err(e) if is_timeout(&e) => break,
                Err(e) => return Err(e),
            };
            if who != peer {
                continue;
            }
            let packet = &mut buf[..n];
            if n >= OLD_HEADER && &packet[..8] == MAGIC && packet[8] == REQUEST {
                packet[8] = ANSWER;
                socket.send_to(packet, peer)?;
                out.requests += 1;
            } else if !answered && old_match(packet, seq) {
                answered = true;
            }
        }
        if answered {
            out.answered += 1;
        } else {
            out.lost += 1;
        }
    }
    Ok(out)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packets_checksums_verify() {
        let src = SocketAddrV4::new(Ipv4Addr::new(169, 254, 77, 1), PORT);
        let dst = SocketAddrV4::new(Ipv4Addr::new(169, 254, 77, 0), PORT);
        let p = ipv4_udp(src, dst, &payload(ANSWER, 9, HEADER));
        assert_eq!(p.len(), 20 + 8 + HEADER);
        assert_eq!(checksum(&[&p[..20]]), 0, "the IP header sums to zero");
        let mut pseudo = Vec::from(&p[12..20]);
        pseudo.extend_from_slice(&[0, 17, 0, (8 + HEADER) as u8]);
        assert_eq!(
            checksum(&[&pseudo, &p[20..]]),
            0,
            "UDP with its pseudo-header"
        );
    }

    #[test]
    fn the_old_matching_takes_any_answer_with_the_sequence_number() {
        let forged = payload(ANSWER, 7, HEADER);
        assert!(old_match(&forged, 7));
        assert!(!old_match(&forged, 9));
        assert!(!old_match(&payload(REQUEST, 7, HEADER), 7));
    }

    #[test]
    fn a_round_answers_every_sequence_number_of_the_window_and_the_request() {
        let f = Forgery {
            from: Ipv4Addr::new(169, 254, 77, 1),
            to: Ipv4Addr::new(169, 254, 77, 0),
            seqs: 0..4,
            every: Duration::from_millis(100),
            request_seq: Some(99),
        };
        let packets = f.packets();
        assert_eq!(packets.len(), 5);
        assert!(old_match(&packets[3][28..], 3));
        assert_eq!(packets[4][28 + 8], REQUEST);
    }
}
