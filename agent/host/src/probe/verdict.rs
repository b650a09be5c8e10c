//! The verdict on one return link from its probes' outcomes: pure, so the hysteresis is tested
//! without sockets or clocks.
//!
//! A link goes down after [`ProbeSettings::down_after`] small probes in a row get no answer, or
//! after [`ProbeSettings::full_down_after`] full-size probes in a row get none while small ones
//! are answered (the path carries less than the link's MTU). It comes back up after
//! [`ProbeSettings::up_after`] answered small probes in a row (and, when it went down for its
//! MTU, an answered full-size probe). The first verdict on a new link is given at once by its
//! first answer, or after `down_after` losses.

use std::collections::VecDeque;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kuport_core::snapshot::LinkProbe;

/// How the probes run and judge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSettings {
    /// Between two small probes of one link (each link is jittered by up to a tenth of it).
    pub interval: Duration,
    /// Small probes in a row without an answer that take a link down.
    pub down_after: u32,
    /// Small probes in a row answered that bring a down link back.
    pub up_after: u32,
    /// A full-size probe rides along every this many small ones (and on every one while the
    /// last full-size probe was lost).
    pub full_every: u32,
    /// Full-size probes in a row lost while small ones are answered that take a link down.
    pub full_down_after: u32,
}

impl Default for ProbeSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(2),
            down_after: 3,
            up_after: 2,
            full_every: 15,
            full_down_after: 2,
        }
    }
}

/// Why a link is down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    NoAnswer,
    Mtu,
}

/// One link's verdict and the counts behind it.
#[derive(Clone, Debug)]
pub struct LinkVerdict {
    class: String,
    peer: String,
    /// How the peer is reached, for messages: its link address.
    peer_address: String,
    up: Option<bool>,
    cause: Option<Cause>,
    since: Option<Timestamp>,
    first_loss: Option<Timestamp>,
    small_lost: u32,
    small_answered: u32,
    full_lost: u32,
    full_size: Option<u32>,
    verified_mtu: Option<u32>,
    rtts: VecDeque<u32>,
}

/// Round trips kept for the median.
const RTT_SAMPLES: usize = 5;

impl LinkVerdict {
    /// A link not judged yet.
    pub fn new(class: &str, peer: &str, peer_address: &str) -> Self {
        Self {
            class: class.to_owned(),
            peer: peer.to_owned(),
            peer_address: peer_address.to_owned(),
            up: None,
            cause: None,
            since: None,
            first_loss: None,
            small_lost: 0,
            small_answered: 0,
            full_lost: 0,
            full_size: None,
            verified_mtu: None,
            rtts: VecDeque::new(),
        }
    }

    /// Whether the next round should carry a full-size probe: the first round does (a new
    /// link's MTU is verified at once, which `kuport preflight` waits for), then every
    /// `full_every` rounds, and every round while the last one was lost.
    pub fn wants_full(&self, round: u64, settings: &ProbeSettings) -> bool {
        self.full_size.is_none()
            || self.full_lost > 0
            || round.is_multiple_of(u64::from(settings.full_every.max(1)))
    }

    /// One small probe's outcome (`Some(rtt)` when answered). True when the verdict changed.
    pub fn small(&mut self, rtt: Option<Duration>, now: Timestamp, s: &ProbeSettings) -> bool {
        match rtt {
            Some(rtt) => {
                self.small_lost = 0;
                self.first_loss = None;
                self.small_answered = self.small_answered.saturating_add(1);
                self.rtts
                    .push_back(u32::try_from(rtt.as_micros()).unwrap_or(u32::MAX));
                while self.rtts.len() > RTT_SAMPLES {
                    self.rtts.pop_front();
                }
                let back = match (self.up, self.cause) {
                    (None, _) => true,
                    (Some(false), Some(Cause::NoAnswer)) => self.small_answered >= s.up_after,
                    _ => false,
                };
                back && self.set(true, None, now)
            }
            None => {
                self.small_answered = 0;
                self.small_lost = self.small_lost.saturating_add(1);
                self.first_loss.get_or_insert(now);
                self.small_lost >= s.down_after && self.set(false, Some(Cause::NoAnswer), now)
            }
        }
    }

    /// One full-size probe's outcome, `size` bytes of IP packet. True when the verdict changed.
    pub fn full(&mut self, answered: bool, size: u32, now: Timestamp, s: &ProbeSettings) -> bool {
        self.full_size = Some(size);
        if answered {
            self.full_lost = 0;
            // A size verified for the first time (or again after a loss) is news for the row,
            // though the verdict may stand.
            let newly = self.verified_mtu != Some(size);
            self.verified_mtu = Some(size);
            let back = self.cause == Some(Cause::Mtu) && self.set(true, None, now);
            return back || newly;
        }
        // A lost full-size probe says something only while small ones are answered.
        if self.small_lost > 0 {
            return false;
        }
        self.full_lost = self.full_lost.saturating_add(1);
        self.verified_mtu = None;
        self.full_lost >= s.full_down_after
            && self.cause != Some(Cause::NoAnswer)
            && self.set(false, Some(Cause::Mtu), now)
    }

    fn set(&mut self, up: bool, cause: Option<Cause>, now: Timestamp) -> bool {
        if self.up == Some(up) && self.cause == cause {
            return false;
        }
        self.up = Some(up);
        self.cause = cause;
        self.since = Some(now);
        true
    }

    /// The verdict as the plan reads it.
    pub fn fact(&self) -> LinkProbe {
        let message = match self.cause {
            Some(Cause::NoAnswer) => Some(format!(
                "no answer from {} ({}) to {} probes in a row across the link since {}",
                self.peer,
                self.peer_address,
                self.small_lost.max(1),
                self.first_loss
                    .or(self.since)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            )),
            Some(Cause::Mtu) => Some(format!(
                "full-size probes ({} bytes) to {} ({}) get no answer while small ones do: the path between the nodes carries less than the link's MTU",
                self.full_size.unwrap_or_default(),
                self.peer,
                self.peer_address
            )),
            None => None,
        };
        let mut sorted: Vec<u32> = self.rtts.iter().copied().collect();
        sorted.sort_unstable();
        LinkProbe {
            class: self.class.clone(),
            peer: self.peer.clone(),
            up: self.up,
            since: self.since,
            rtt_microseconds: sorted.get(sorted.len() / 2).copied(),
            verified_mtu: self.verified_mtu,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("time")
    }

    const RTT: Option<Duration> = Some(Duration::from_micros(700));

    #[test]
    fn the_first_answer_gives_up_and_three_losses_in_a_row_give_down() {
        let s = ProbeSettings::default();
        let mut v = LinkVerdict::new("c", "n2", "169.254.77.1");
        assert_eq!(v.fact().up, None, "no verdict before a probe");
        assert!(v.small(RTT, at(0), &s));
        assert_eq!((v.fact().up, v.fact().since), (Some(true), Some(at(0))));
        assert!(!v.small(None, at(2), &s));
        assert!(!v.small(None, at(4), &s), "two losses are not enough");
        assert!(v.small(None, at(6), &s));
        let fact = v.fact();
        assert_eq!((fact.up, fact.since), (Some(false), Some(at(6))));
        let message = fact.message.expect("a message");
        assert!(
            message.starts_with("no answer from n2 (169.254.77.1) to 3 probes in a row"),
            "{message}"
        );
        assert!(
            message.contains(&at(2).to_string()),
            "since the first loss: {message}"
        );
    }

    #[test]
    fn a_flapping_link_changes_its_verdict_rarely() {
        let s = ProbeSettings::default();
        let mut v = LinkVerdict::new("c", "n2", "x");
        v.small(RTT, at(0), &s);
        // Every other probe lost: never three in a row, so never down.
        let mut changes = 0;
        for i in 1..100 {
            let rtt = if i % 2 == 0 { RTT } else { None };
            changes += u32::from(v.small(rtt, at(i * 2), &s));
        }
        assert_eq!(changes, 0);
        // Down, then one answer between losses does not bring it back.
        for i in 0..3 {
            v.small(None, at(300 + i), &s);
        }
        assert_eq!(v.fact().up, Some(false));
        assert!(!v.small(RTT, at(310), &s), "one answer is not enough");
        assert!(!v.small(None, at(312), &s));
        assert!(!v.small(RTT, at(314), &s));
        assert!(v.small(RTT, at(316), &s), "two in a row bring it back");
        assert_eq!(v.fact().message, None);
    }

    #[test]
    fn full_size_probes_lost_while_small_ones_pass_report_the_mtu() {
        let s = ProbeSettings::default();
        let mut v = LinkVerdict::new("c", "n2", "169.254.77.1");
        v.small(RTT, at(0), &s);
        assert!(!v.full(false, 1370, at(0), &s));
        assert!(v.wants_full(1, &s), "after a loss, every round carries one");
        v.small(RTT, at(2), &s);
        assert!(v.full(false, 1370, at(2), &s));
        let fact = v.fact();
        assert_eq!(fact.up, Some(false));
        assert!(
            fact.message
                .expect("message")
                .contains("full-size probes (1370 bytes)")
        );
        assert_eq!(fact.verified_mtu, None);
        assert!(
            !v.small(RTT, at(4), &s),
            "small answers do not cure an MTU problem"
        );
        assert!(v.full(true, 1370, at(4), &s));
        assert_eq!(
            (v.fact().up, v.fact().verified_mtu),
            (Some(true), Some(1370))
        );
    }

    #[test]
    fn a_full_size_probe_lost_with_the_small_one_is_no_mtu_verdict() {
        let s = ProbeSettings::default();
        let mut v = LinkVerdict::new("c", "n2", "x");
        v.small(RTT, at(0), &s);
        for i in 1..=4 {
            v.small(None, at(i * 2), &s);
            v.full(false, 1370, at(i * 2), &s);
        }
        let message = v.fact().message.expect("message");
        assert!(message.starts_with("no answer"), "{message}");
    }

    #[test]
    fn the_round_trip_is_the_median_of_the_last_five() {
        let s = ProbeSettings::default();
        let mut v = LinkVerdict::new("c", "n2", "x");
        for (i, us) in [9000, 100, 200, 300, 400, 500].into_iter().enumerate() {
            v.small(Some(Duration::from_micros(us)), at(i as i64), &s);
        }
        assert_eq!(v.fact().rtt_microseconds, Some(300));
        assert!(v.wants_full(1, &s), "the first round verifies the MTU");
        assert!(
            v.full(true, 1370, at(7), &s),
            "a first verified MTU is news"
        );
        assert!(!v.full(true, 1370, at(9), &s), "the same one again is not");
        assert!(!v.wants_full(2, &s) && v.wants_full(15, &s));
    }
}
