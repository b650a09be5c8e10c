//! What a link probe carries, and which answer counts: pure, so every check is tested without
//! sockets.
//!
//! A probe is `kuprobe1`, its kind (request or answer), a sequence number, a nonce of
//! [`NONCE`] bytes from the OS's random source, then padding up to its size. The peer answers
//! with the same bytes, the kind flipped. An answer counts only when everything of the probe
//! comes back: sequence number, nonce and size. The sequence number alone is guessable (it
//! counts rounds), so anyone who can put a datagram on the prober's address from the peer's
//! could otherwise answer for the peer: keep a link "up" that carries nothing, or "verify" an
//! MTU the path does not carry with a small datagram answering a full-size probe.
//!
//! Older agents sent the same header without the nonce, and answered by echoing whatever they
//! got: a new prober's nonce and size come back from an old peer, and a new peer answers an
//! old prober's shorter probes, so a rolling upgrade keeps its links up.

/// What a probe carries first: a probe from anything else is ignored.
pub const MAGIC: &[u8; 8] = b"kuprobe1";
/// A probe asking for an answer.
pub const REQUEST: u8 = 1;
/// An answer: the request's bytes with this kind.
pub const ANSWER: u8 = 2;
/// Bytes of the nonce: 128 bits, never guessed in the lifetime of a link.
pub const NONCE: usize = 16;
/// Magic, kind, sequence number: what a request must hold to be answered (older agents sent
/// no more).
pub const REQUEST_HEADER: usize = 8 + 1 + 8;
/// Magic, kind, sequence number, nonce: the smallest probe this agent sends.
pub const HEADER: usize = REQUEST_HEADER + NONCE;
/// IPv4 and UDP headers: a full-size probe's payload is the link MTU less these.
pub const IP_UDP_HEADERS: u32 = 28;

/// A probe sent: what its answer must bring back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Its sequence number.
    pub seq: u64,
    /// Its nonce.
    pub nonce: [u8; NONCE],
    /// Its length in bytes of UDP payload.
    pub len: usize,
}

impl Sent {
    /// A probe of `seq` with a fresh nonce: small, or `mtu` bytes of IP packet. An error when
    /// the OS gives no random bytes (then no probe is sent: a guessable one would be worse).
    pub fn new(seq: u64, mtu: Option<u32>) -> Result<Self, getrandom::Error> {
        let mut nonce = [0u8; NONCE];
        getrandom::fill(&mut nonce)?;
        Ok(Self::with_nonce(seq, nonce, mtu))
    }

    /// A probe with a given nonce (tests).
    pub fn with_nonce(seq: u64, nonce: [u8; NONCE], mtu: Option<u32>) -> Self {
        let len = mtu
            .map(|m| m.saturating_sub(IP_UDP_HEADERS) as usize)
            .unwrap_or(HEADER)
            .max(HEADER);
        Self { seq, nonce, len }
    }

    /// The request's bytes (zero padding after the nonce).
    pub fn request(&self) -> Vec<u8> {
        let mut packet = vec![0u8; self.len];
        packet[..8].copy_from_slice(MAGIC);
        packet[8] = REQUEST;
        packet[9..REQUEST_HEADER].copy_from_slice(&self.seq.to_be_bytes());
        packet[REQUEST_HEADER..HEADER].copy_from_slice(&self.nonce);
        packet
    }

    /// Whether `packet` answers this probe: an answer of the same length carrying its sequence
    /// number and nonce.
    pub fn answered_by(&self, packet: &[u8]) -> bool {
        packet.len() == self.len
            && parse(packet) == Some((ANSWER, self.seq))
            && packet[REQUEST_HEADER..HEADER] == self.nonce
    }
}

/// The kind and sequence number of a probe, when it is one (of this agent's or an older one's).
pub fn parse(packet: &[u8]) -> Option<(u8, u64)> {
    if packet.len() < REQUEST_HEADER || &packet[..8] != MAGIC {
        return None;
    }
    let seq = u64::from_be_bytes(packet[9..REQUEST_HEADER].try_into().ok()?);
    Some((packet[8], seq))
}

/// Turns a request into its answer in place; false (nothing changed) when it is not one.
pub fn answer_in_place(packet: &mut [u8]) -> bool {
    if !matches!(parse(packet), Some((REQUEST, _))) {
        return false;
    }
    packet[8] = ANSWER;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_of(sent: &Sent) -> Vec<u8> {
        let mut packet = sent.request();
        assert!(answer_in_place(&mut packet));
        packet
    }

    #[test]
    fn a_probe_is_recognised_by_its_magic_and_length() {
        let sent = Sent::with_nonce(7, [9; NONCE], None);
        let packet = answer_of(&sent);
        assert_eq!(packet.len(), HEADER);
        assert_eq!(parse(&packet), Some((ANSWER, 7)));
        assert_eq!(parse(&packet[..REQUEST_HEADER - 1]), None);
        let mut other = packet.clone();
        other[0] = b'X';
        assert_eq!(parse(&other), None);
    }

    #[test]
    fn the_echoed_probe_answers_it() {
        for mtu in [None, Some(1370)] {
            let sent = Sent::with_nonce(8, [0xa5; NONCE], mtu);
            assert!(sent.answered_by(&answer_of(&sent)), "{mtu:?}");
            assert!(!sent.answered_by(&sent.request()), "a request is no answer");
        }
        assert_eq!(Sent::with_nonce(1, [0; NONCE], Some(1370)).len, 1342);
    }

    #[test]
    fn an_answer_with_the_right_sequence_number_but_another_nonce_does_not_count() {
        let sent = Sent::with_nonce(8, [0xa5; NONCE], None);
        let mut forged = answer_of(&sent);
        forged[HEADER - 1] ^= 1;
        assert!(!sent.answered_by(&forged));
        // The match the probes had before nonces (sequence number and kind) takes it.
        assert_eq!(parse(&forged), Some((ANSWER, sent.seq)));
    }

    #[test]
    fn a_small_answer_to_a_full_size_probe_does_not_count() {
        let full = Sent::with_nonce(9, [3; NONCE], Some(1370));
        let answer = answer_of(&full);
        assert!(!full.answered_by(&answer[..HEADER]), "cut to the header");
        assert!(
            !full.answered_by(&answer[..answer.len() - 1]),
            "one byte short"
        );
        let mut longer = answer.clone();
        longer.push(0);
        assert!(!full.answered_by(&longer), "one byte more");
    }

    #[test]
    fn another_sequence_number_does_not_count() {
        let sent = Sent::with_nonce(10, [4; NONCE], None);
        let other = Sent::with_nonce(12, [4; NONCE], None);
        assert!(!sent.answered_by(&answer_of(&other)));
    }

    #[test]
    fn a_request_of_an_older_agent_is_answered_and_junk_is_not() {
        let mut old = Vec::from(&MAGIC[..]);
        old.push(REQUEST);
        old.extend_from_slice(&5u64.to_be_bytes());
        assert!(answer_in_place(&mut old));
        assert_eq!(parse(&old), Some((ANSWER, 5)));
        assert!(!answer_in_place(&mut old), "an answer is not answered");
        let mut junk = b"kuprobe2xxxxxxxxxxxxxxx".to_vec();
        assert!(!answer_in_place(&mut junk));
    }

    #[test]
    fn nonces_come_from_the_os_and_differ() {
        let a = Sent::new(1, None).expect("random bytes");
        let b = Sent::new(1, None).expect("random bytes");
        assert_ne!(a.nonce, b.nonce);
        assert_ne!(a.nonce, [0; NONCE]);
    }
}
