//! The loop's decisions, apart from its waiting: when the next pass runs and whether it
//! compares with the kernel, and which passes' status writes are still out. Pure: every
//! decision is handed `now`, so the tests drive them without a runtime or a clock.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::config::AgentConfig;
use crate::agent::failure::PassError;

/// The mapping counters are read from the host at most this often (and on every verifying
/// pass): reading them runs `nft`, and a busy cluster runs many passes a second.
const COUNTER_REFRESH: Duration = Duration::from_secs(10);

/// Whether a pass reads the mapping counters: the first pass, a verifying one, or one at least
/// [`COUNTER_REFRESH`] after the last read.
pub(super) fn counters_due(verify: bool, last: Option<Instant>, now: Instant) -> bool {
    verify || last.is_none_or(|at| now >= at + COUNTER_REFRESH)
}

/// When the next pass runs and whether it compares with the kernel: the first pass and one
/// every resync verify; a failed verifying pass is owed until one succeeds; a failed, refused
/// or to-be-recomputed pass is retried after a delay doubling from `retry_min` to `retry_max`.
#[derive(Debug)]
pub(super) struct Schedule {
    first: bool,
    next_verify: Instant,
    retry_at: Option<Instant>,
    retry_delay: Duration,
    verify_owed: bool,
    /// When the last plan changes by time alone (a preflight class's deadline).
    changes_at: Option<Instant>,
    resync: Duration,
    retry_min: Duration,
    retry_max: Duration,
}

impl Schedule {
    pub(super) fn new(config: &AgentConfig, now: Instant) -> Self {
        Self {
            first: true,
            next_verify: now,
            retry_at: None,
            retry_delay: config.retry_min,
            verify_owed: false,
            changes_at: None,
            resync: config.resync,
            retry_min: config.retry_min,
            retry_max: config.retry_max,
        }
    }

    /// A pass starts: whether it verifies against the kernel. It is the retry that was due, if
    /// one was: the loop waits for the next pass while this one's status writes go on, and a
    /// retry left due would start pass after pass until they ended.
    pub(super) fn start_pass(&mut self, link_changed: bool, now: Instant) -> bool {
        let verify = self.first || self.verify_owed || link_changed || now >= self.next_verify;
        self.first = false;
        self.retry_at = None;
        // Due: this pass plans past it (a plan whose pass fails is recomputed by the retry).
        if self.changes_at.is_some_and(|at| at <= now) {
            self.changes_at = None;
        }
        if verify {
            self.next_verify = now + self.resync;
        }
        verify
    }

    /// A pass ended with `outcome`. Passes may end in another order than they started (their
    /// status writes finish after the next pass began), so only a pass that verified pays a
    /// verify owed.
    pub(super) fn end_pass(&mut self, outcome: &PassOutcome, verified: bool, now: Instant) {
        if outcome.failed.is_some() {
            self.verify_owed |= verified;
        } else if verified {
            self.verify_owed = false;
        }
        if outcome.failed.is_some() || outcome.refused || outcome.recompute {
            self.retry_at = Some(now + self.retry_delay);
            self.retry_delay = (self.retry_delay * 2).min(self.retry_max);
        } else {
            self.retry_at = None;
            self.retry_delay = self.retry_min;
        }
        // A held status write is due then: a pass at that time writes it if it still stands
        // (no backoff: nothing failed).
        if let Some(due) = outcome.held_until {
            self.retry_at = Some(self.retry_at.map_or(due, |at| at.min(due)));
        }
    }

    /// The plan a pass applied changes by time alone at `at` (`Plan::changes_at`): a pass runs
    /// then, whatever the resync says.
    pub(super) fn plan_changes_at(&mut self, at: Option<Instant>) {
        self.changes_at = at;
    }

    /// When the last applied plan changes by time alone, if it does.
    #[cfg(test)]
    pub(super) fn changes_at(&self) -> Option<Instant> {
        self.changes_at
    }

    /// When a pass is due other than at the resync: a retry, or the plan changing by time.
    pub(super) fn timer(&self) -> Option<Instant> {
        match (self.retry_at, self.changes_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a pass is owed before the resync: a retry, or a held status write due.
    pub(super) fn owes_pass(&self) -> bool {
        self.retry_at.is_some()
    }

    /// Whether no pass has started yet (the first runs as soon as the watches synced).
    pub(super) fn is_first(&self) -> bool {
        self.first
    }

    /// When a verifying pass (the resync) is due.
    pub(super) fn next_verify(&self) -> Instant {
        self.next_verify
    }

    /// When a retry is due, if one is.
    #[cfg(test)]
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The delay the next failed, refused or to-be-recomputed pass is retried after.
    pub(super) fn retry_delay(&self) -> Duration {
        self.retry_delay
    }
}

/// A pass that started: its id, when, and whether it compares with the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Started {
    pub id: u64,
    pub at: Instant,
    pub verified: bool,
}

/// A pass whose status writes are with the status task.
#[derive(Debug)]
pub(super) struct Writing {
    pub pass: Started,
    /// The kernel refused part of its datapath.
    pub refused: bool,
}

/// Passes whose status writes have not been reported yet, by id, and the newest pass whose
/// outcome the schedule took: a pass ending after a newer one ended (its writes were slower
/// than the newer pass's datapath failed) is recorded, but must not undo the newer one's retry.
#[derive(Default)]
pub(super) struct InFlight {
    writing: BTreeMap<u64, Writing>,
    scheduled: Option<u64>,
    next_id: u64,
}

impl InFlight {
    /// A pass starts `at`: it gets an id larger than every one before.
    pub(super) fn start(&mut self, verified: bool, at: Instant) -> Started {
        Started {
            id: self.new_id(),
            at,
            verified,
        }
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Whether pass `id` is newer than every pass the schedule took (and now takes it).
    pub(super) fn take_for_schedule(&mut self, id: u64) -> bool {
        let newest = self.scheduled.is_none_or(|s| id > s);
        if newest {
            self.scheduled = Some(id);
        }
        newest
    }

    /// `pass` handed its writes to the status task.
    pub(super) fn hand_over(&mut self, pass: Started, refused: bool) {
        self.writing.insert(pass.id, Writing { pass, refused });
    }

    /// Whether no pass's status writes are out.
    pub(super) fn is_empty(&self) -> bool {
        self.writing.is_empty()
    }

    /// Pass `id`'s writes were reported (or replaced): what the pass was, the first time only.
    pub(super) fn reported(&mut self, id: u64) -> Option<Writing> {
        self.writing.remove(&id)
    }
}

/// What one pass came to.
pub(super) struct PassOutcome {
    pub failed: Option<PassError>,
    /// The kernel refused part of the datapath (reported in status): try again soon.
    pub refused: bool,
    /// Some status must be recomputed from fresher inputs: run again soon.
    pub recompute: bool,
    /// A status write was held back until then (`status.rs`, "held"): pass again then.
    pub held_until: Option<Instant>,
}

impl PassOutcome {
    /// A pass that failed before it had anything to write.
    pub(super) fn failed(error: PassError) -> Self {
        Self {
            failed: Some(error),
            refused: false,
            recompute: false,
            held_until: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_first_on_verify_and_then_at_most_every_refresh() {
        let t0 = Instant::now();
        assert!(counters_due(false, None, t0), "the first pass reads them");
        assert!(!counters_due(false, Some(t0), t0 + Duration::from_secs(1)));
        assert!(
            counters_due(true, Some(t0), t0 + Duration::from_secs(1)),
            "a verify reads them"
        );
        assert!(counters_due(false, Some(t0), t0 + COUNTER_REFRESH));
    }

    fn outcome(failed: bool, refused: bool) -> PassOutcome {
        PassOutcome {
            failed: failed.then(|| PassError::Status(vec!["refused".to_owned()])),
            refused,
            recompute: false,
            held_until: None,
        }
    }

    fn schedule() -> (Schedule, Instant) {
        let mut config = AgentConfig::new("n1");
        config.retry_min = Duration::from_millis(200);
        config.retry_max = Duration::from_millis(700);
        config.resync = Duration::from_secs(300);
        let now = Instant::now();
        (Schedule::new(&config, now), now)
    }

    #[test]
    fn a_plan_that_changes_by_time_alone_wakes_a_pass_once_then() {
        let (mut s, t0) = schedule();
        s.start_pass(false, t0);
        let at = t0 + Duration::from_secs(30);
        s.plan_changes_at(Some(at));
        assert_eq!(s.timer(), Some(at));
        s.start_pass(false, t0 + Duration::from_secs(1));
        assert_eq!(s.changes_at(), Some(at), "an earlier pass leaves it due");
        s.end_pass(&outcome(true, false), false, t0 + Duration::from_secs(1));
        assert_eq!(
            s.timer(),
            Some(t0 + Duration::from_millis(1200)),
            "a retry due first comes first"
        );
        s.start_pass(false, at);
        assert_eq!(s.changes_at(), None, "the pass at that time plans past it");
    }

    #[test]
    fn the_first_pass_and_each_resync_verify_and_others_do_not() {
        let (mut s, t0) = schedule();
        assert!(s.start_pass(false, t0), "the first pass verifies");
        s.end_pass(&outcome(false, false), true, t0);
        assert!(!s.start_pass(false, t0 + Duration::from_secs(1)));
        assert!(
            s.start_pass(true, t0 + Duration::from_secs(2)),
            "a link event verifies"
        );
        assert!(
            s.start_pass(false, t0 + Duration::from_secs(303)),
            "a resync verifies"
        );
    }

    #[test]
    fn a_failed_verifying_pass_is_owed_and_retries_back_off() {
        let (mut s, t0) = schedule();
        assert!(s.start_pass(false, t0));
        s.end_pass(&outcome(true, false), true, t0);
        assert_eq!(s.retry_at, Some(t0 + Duration::from_millis(200)));
        assert!(s.start_pass(false, t0), "the failed verify is owed");
        s.end_pass(&outcome(true, false), true, t0);
        assert_eq!(s.retry_at, Some(t0 + Duration::from_millis(400)));
        s.start_pass(false, t0);
        s.end_pass(&outcome(true, false), true, t0);
        s.start_pass(false, t0);
        s.end_pass(&outcome(true, false), true, t0);
        assert_eq!(
            s.retry_delay,
            Duration::from_millis(700),
            "capped at retry_max"
        );
        // A refusal (status written) retries too, without owing a verify.
        s.start_pass(false, t0);
        s.end_pass(&outcome(false, true), true, t0);
        assert!(s.retry_at.is_some() && !s.verify_owed);
        // A clean pass resets the delay and cancels the retry.
        s.start_pass(false, t0);
        s.end_pass(&outcome(false, false), false, t0);
        assert_eq!(
            (s.retry_at, s.retry_delay),
            (None, Duration::from_millis(200))
        );
    }

    #[test]
    fn a_started_pass_is_the_retry_that_was_due() {
        let (mut s, t0) = schedule();
        s.start_pass(false, t0);
        s.end_pass(&outcome(true, false), false, t0);
        assert!(s.retry_at.is_some());
        // The retry runs; its writes have not ended yet, and no other retry is due meanwhile.
        s.start_pass(false, t0 + Duration::from_millis(200));
        assert_eq!(s.retry_at, None);
        assert_eq!(
            s.retry_delay,
            Duration::from_millis(400),
            "the backoff stands"
        );
    }

    #[test]
    fn only_a_verifying_pass_pays_a_verify_owed() {
        let (mut s, t0) = schedule();
        assert!(s.start_pass(false, t0));
        // The next pass starts before the verifying pass's status writes fail.
        assert!(!s.start_pass(false, t0 + Duration::from_secs(1)));
        s.end_pass(&outcome(true, false), true, t0);
        s.end_pass(&outcome(false, false), false, t0);
        assert!(s.verify_owed, "the pass that ended clean did not verify");
        assert!(s.start_pass(false, t0 + Duration::from_secs(2)));
        s.end_pass(&outcome(false, false), true, t0);
        assert!(!s.verify_owed);
    }

    #[test]
    fn a_pass_ending_after_a_newer_one_leaves_the_schedule_to_it() {
        let mut in_flight = InFlight::default();
        let (older, newer) = (in_flight.new_id(), in_flight.new_id());
        assert!(in_flight.take_for_schedule(newer));
        assert!(!in_flight.take_for_schedule(older));
        let newest = in_flight.new_id();
        assert!(in_flight.take_for_schedule(newest));
    }

    /// A held status write brings a pass at its due time, without backing off the retries.
    #[test]
    fn a_held_write_passes_again_when_due() {
        let (mut s, t0) = schedule();
        assert!(s.start_pass(false, t0));
        let due = t0 + Duration::from_secs(1);
        let held = PassOutcome {
            held_until: Some(due),
            ..outcome(false, false)
        };
        s.end_pass(&held, true, t0);
        assert_eq!(s.retry_at(), Some(due));
        assert_eq!(s.retry_delay(), Duration::from_millis(200));
        // A failure's retry comes first when it is sooner.
        s.start_pass(false, t0);
        let both = PassOutcome {
            held_until: Some(due),
            ..outcome(true, false)
        };
        s.end_pass(&both, true, t0);
        assert_eq!(s.retry_at(), Some(t0 + Duration::from_millis(200)));
    }

    #[test]
    fn a_recompute_retries_soon_without_owing_a_verify() {
        let (mut s, t0) = schedule();
        assert!(s.start_pass(false, t0));
        let recompute = PassOutcome {
            failed: None,
            refused: false,
            recompute: true,
            held_until: None,
        };
        s.end_pass(&recompute, true, t0);
        assert_eq!(s.retry_at(), Some(t0 + Duration::from_millis(200)));
        assert!(!s.verify_owed);
        assert!(
            !s.start_pass(false, t0 + Duration::from_millis(200)),
            "the retry compares with the last applied state, not the kernel"
        );
    }

    #[test]
    fn a_verifying_pass_moves_the_next_resync_and_others_leave_it() {
        let (mut s, t0) = schedule();
        assert!(s.is_first());
        assert_eq!(s.next_verify(), t0, "the first pass is due at once");
        s.start_pass(false, t0);
        assert!(!s.is_first());
        assert_eq!(s.next_verify(), t0 + Duration::from_secs(300));
        s.start_pass(false, t0 + Duration::from_secs(10));
        assert_eq!(s.next_verify(), t0 + Duration::from_secs(300));
        // A link event's verifying pass counts as the resync: the next is a full period later.
        s.start_pass(true, t0 + Duration::from_secs(100));
        assert_eq!(s.next_verify(), t0 + Duration::from_secs(400));
        assert!(!s.start_pass(false, t0 + Duration::from_secs(350)));
    }

    #[test]
    fn the_retry_delay_is_the_one_the_next_failure_schedules() {
        let (mut s, t0) = schedule();
        s.start_pass(false, t0);
        let delay = s.retry_delay();
        s.end_pass(&outcome(true, false), true, t0);
        assert_eq!(s.retry_at(), Some(t0 + delay));
    }

    #[test]
    fn a_pass_handed_over_is_reported_once() {
        let mut in_flight = InFlight::default();
        let t0 = Instant::now();
        let first = in_flight.start(true, t0);
        let second = in_flight.start(false, t0);
        assert!(second.id > first.id, "ids grow");
        in_flight.hand_over(first, true);
        let writing = in_flight.reported(first.id).expect("handed over");
        assert_eq!((writing.pass, writing.refused), (first, true));
        assert!(in_flight.reported(first.id).is_none(), "reported once");
        assert!(in_flight.reported(second.id).is_none(), "never handed over");
    }
}
