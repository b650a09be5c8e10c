//! The host's events: one stream, opened for the underlay device the host reports and opened
//! again when that device changes or the stream ends. An event means the kernel changed behind
//! the agent's back (a `kup-*` link or the underlay, or another program changing kuport's ip
//! rules, routes, link addresses or nftables table, or a write of a sysctl a node check reads;
//! the host leaves the agent's own changes out, `kuport_host::HostEvents`), so the pass it
//! starts compares against the kernel, repairs what is gone and reads the checks again.
//!
//! Events are held until a pass takes them: a burst (a firewall reload announces its whole
//! ruleset) is one pass, and passes for host events alone start at most once per
//! [`EVENT_SPACING`], so a program that keeps deleting what the agent puts back costs one
//! pass a second, not a loop. Any pass that starts meanwhile (a watch event, a retry) takes
//! them too, and verifies.

use std::collections::BTreeMap;
use std::time::Duration;

use kuport_host::{HostEvent, HostEventKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::HostWatch;
use crate::agent::metrics::Metrics;

/// The least time from one pass that answered host events to the next pass started for host
/// events alone. The first event after a quiet second is answered at once (after the loop's
/// debounce).
pub(super) const EVENT_SPACING: Duration = Duration::from_secs(1);

/// The open event stream, if any, the underlay devices it was opened for, and the events no
/// pass has taken yet.
#[derive(Default)]
pub(super) struct HostChanges {
    rx: Option<mpsc::Receiver<HostEvent>>,
    underlay: Option<Vec<String>>,
    /// Events no pass took yet, by kind, with the first one of each (for the log).
    pending: BTreeMap<HostEventKind, (usize, HostEvent)>,
    /// When the first of the pending events came.
    pending_since: Option<Instant>,
    /// When the last pass that took events started.
    answered_at: Option<Instant>,
}

impl HostChanges {
    /// The next event; `None` when the stream ended. Never ready while no stream is open.
    pub(super) async fn next(&mut self) -> Option<HostEvent> {
        match self.rx.as_mut() {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// The loop woke up on the stream with `event` at `now`: it is held for a pass. A stream
    /// that ended is forgotten, to be opened again after the next pass, and counts as lost
    /// events: what changed while it was closed is unknown.
    pub(super) fn woke(&mut self, event: Option<HostEvent>, now: Instant, metrics: &Metrics) {
        let event = event.unwrap_or_else(|| {
            self.rx = None;
            self.underlay = None;
            HostEvent {
                kind: HostEventKind::Lost,
                what: "the host event stream ended".to_owned(),
                removed: false,
            }
        });
        metrics.record_host_event(event.kind);
        self.pending_since.get_or_insert(now);
        let entry = self.pending.entry(event.kind).or_insert((0, event));
        entry.0 += 1;
    }

    /// Takes the events that came while the loop debounced.
    pub(super) fn drain(&mut self, now: Instant, metrics: &Metrics) {
        let mut queued = Vec::new();
        if let Some(rx) = self.rx.as_mut() {
            while let Ok(event) = rx.try_recv() {
                queued.push(event);
            }
        }
        for event in queued {
            self.woke(Some(event), now, metrics);
        }
    }

    /// When a pass is due for the held events (`None`: none held): at once, but no sooner than
    /// [`EVENT_SPACING`] after the last pass that took events.
    pub(super) fn due_at(&self) -> Option<Instant> {
        let since = self.pending_since?;
        Some(match self.answered_at {
            Some(at) => since.max(at + EVENT_SPACING),
            None => since,
        })
    }

    /// A pass starts at `now`: whether it takes held events (and so must verify). Says in the
    /// log what it answers.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        if self.pending_since.take().is_none() {
            return false;
        }
        self.answered_at = Some(now);
        let pending = std::mem::take(&mut self.pending);
        let events: usize = pending.values().map(|(n, _)| n).sum();
        let kinds: Vec<&str> = pending.keys().map(|k| k.as_str()).collect();
        let first = pending.values().next().map(|(_, e)| e);
        tracing::info!(
            events,
            kinds = %kinds.join(","),
            first = first.map_or("", |e| e.what.as_str()),
            removed = first.is_some_and(|e| e.removed),
            "host state changed under the agent: running a verifying pass"
        );
        true
    }

    /// After a pass: (re)opens the stream through `watch` once the pass knows the underlay
    /// devices, or when they changed. A stream that cannot be opened is asked for again after
    /// the next pass.
    pub(super) fn follow(&mut self, watch: Option<&mut HostWatch>, underlay: Option<Vec<String>>) {
        let (Some(watch), Some(underlay)) = (watch, underlay) else {
            return;
        };
        if self.underlay.as_ref() == Some(&underlay) {
            return;
        }
        match watch(underlay.clone()) {
            Ok(rx) => {
                self.rx = Some(rx);
                self.underlay = Some(underlay);
            }
            Err(e) => tracing::warn!("watching host events: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use kuport_host::{HostError, HostStage};

    use super::*;

    type Senders = Arc<Mutex<Vec<mpsc::Sender<HostEvent>>>>;

    /// A host watch recording the devices it is asked for; each open gets a new channel, whose
    /// sender is kept in `senders`.
    fn recording_watch(asked: Arc<Mutex<Vec<Vec<String>>>>, senders: Senders) -> HostWatch {
        Box::new(move |devices| {
            asked.lock().expect("lock").push(devices);
            let (tx, rx) = mpsc::channel(1024);
            senders.lock().expect("lock").push(tx);
            Ok(rx)
        })
    }

    fn opened() -> (HostChanges, Senders, Arc<Mutex<Vec<Vec<String>>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let senders = Senders::default();
        let mut watch = recording_watch(asked.clone(), senders.clone());
        let mut changes = HostChanges::default();
        changes.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        (changes, senders, asked)
    }

    fn removed(kind: HostEventKind, what: &str) -> HostEvent {
        HostEvent {
            kind,
            what: what.to_owned(),
            removed: true,
        }
    }

    fn send(senders: &Senders, event: HostEvent) {
        senders.lock().expect("lock")[0]
            .try_send(event)
            .expect("sent");
    }

    #[test]
    fn the_stream_is_opened_once_per_underlay_and_again_when_it_changes() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let mut watch = recording_watch(asked.clone(), Senders::default());
        let mut changes = HostChanges::default();
        changes.follow(Some(&mut watch), None);
        changes.follow(None, Some(vec!["wg0".to_owned()]));
        assert!(
            asked.lock().expect("lock").is_empty(),
            "nothing to open yet"
        );
        changes.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        changes.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        changes.follow(Some(&mut watch), Some(vec!["wg1".to_owned()]));
        assert_eq!(
            *asked.lock().expect("lock"),
            [vec!["wg0".to_owned()], vec!["wg1".to_owned()]]
        );
    }

    #[test]
    fn an_ended_stream_counts_as_lost_events_and_is_opened_again() {
        let metrics = Metrics::new();
        let (mut changes, _senders, asked) = opened();
        let t0 = Instant::now();
        changes.woke(None, t0, &metrics);
        assert_eq!(
            changes.due_at(),
            Some(t0),
            "what changed meanwhile is unknown"
        );
        assert_eq!(metrics.host_events(HostEventKind::Lost), 1);
        assert!(changes.take(t0), "the pass verifies");
        let senders = Senders::default();
        let mut watch = recording_watch(asked.clone(), senders);
        changes.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        assert_eq!(asked.lock().expect("lock").len(), 2, "opened again");
    }

    #[test]
    fn a_stream_that_cannot_be_opened_is_asked_for_again() {
        let mut tries = 0;
        let mut watch: HostWatch = Box::new(move |_| {
            tries += 1;
            Err(HostError::Missing {
                stage: HostStage::Links,
                what: format!("a host event stream (try {tries})"),
            })
        });
        let mut changes = HostChanges::default();
        changes.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        assert!(changes.underlay.is_none(), "not opened");
        changes.follow(Some(&mut watch), Some(vec!["wg0".to_owned()]));
        assert!(changes.rx.is_none());
    }

    #[test]
    fn a_burst_of_events_is_one_verifying_pass_and_each_is_counted() {
        let metrics = Metrics::new();
        let (mut changes, senders, _) = opened();
        let t0 = Instant::now();
        assert_eq!(changes.due_at(), None, "nothing held");
        assert!(
            !changes.take(t0),
            "a pass without events does not verify for them"
        );
        // A firewall reload: the table, then a rule and a route, queued while debouncing.
        changes.woke(
            Some(removed(HostEventKind::Nftables, "table ip kuport")),
            t0,
            &metrics,
        );
        send(&senders, removed(HostEventKind::Rule, "ip rule pref 102"));
        send(
            &senders,
            removed(HostEventKind::Route, "route default table 1"),
        );
        changes.drain(t0 + Duration::from_millis(50), &metrics);
        assert_eq!(changes.due_at(), Some(t0), "due since the first");
        assert!(changes.take(t0 + Duration::from_millis(50)));
        assert!(!changes.take(t0 + Duration::from_millis(60)), "taken once");
        assert_eq!(changes.due_at(), None);
        for kind in [
            HostEventKind::Nftables,
            HostEventKind::Rule,
            HostEventKind::Route,
        ] {
            assert_eq!(metrics.host_events(kind), 1, "{kind:?}");
        }
    }

    #[test]
    fn passes_for_host_events_alone_are_spaced() {
        let metrics = Metrics::new();
        let (mut changes, _, _) = opened();
        let t0 = Instant::now();
        changes.woke(Some(removed(HostEventKind::Rule, "r")), t0, &metrics);
        assert!(changes.take(t0));
        let soon = t0 + Duration::from_millis(100);
        changes.woke(Some(removed(HostEventKind::Rule, "r")), soon, &metrics);
        assert_eq!(
            changes.due_at(),
            Some(t0 + EVENT_SPACING),
            "no sooner than the spacing"
        );
        // A pass that starts for another reason meanwhile takes them (and verifies).
        assert!(changes.take(soon + Duration::from_millis(10)));
        // After a quiet spell, an event is due at once.
        let later = t0 + Duration::from_secs(5);
        changes.woke(Some(removed(HostEventKind::Rule, "r")), later, &metrics);
        assert_eq!(changes.due_at(), Some(later));
    }

    /// A simulated host under the loop's rules: a pass that verifies repairs what was removed,
    /// and each change it makes is announced back to it (the worst case: the host filters
    /// none of its own changes out, as with link events). Returns the times passes started.
    fn simulate(removals: &[Duration], horizon: Duration) -> Vec<Duration> {
        let metrics = Metrics::new();
        let (mut changes, senders, _) = opened();
        let t0 = Instant::now();
        let tick = Duration::from_millis(10);
        let pass_takes = Duration::from_millis(30);
        let mut broken = false;
        let mut echo_at: Option<Duration> = None;
        let mut busy_until = Duration::ZERO;
        let mut passes = Vec::new();
        let mut now = Duration::ZERO;
        while now <= horizon {
            if removals.iter().any(|r| *r >= now && *r < now + tick) {
                broken = true;
                send(&senders, removed(HostEventKind::Rule, "deleted by hand"));
            }
            if echo_at.is_some_and(|at| at <= now) {
                echo_at = None;
                send(
                    &senders,
                    removed(HostEventKind::Link, "the agent's own change"),
                );
            }
            changes.drain(t0 + now, &metrics);
            let due = changes.due_at().is_some_and(|at| at <= t0 + now);
            if due && now >= busy_until && changes.take(t0 + now) {
                passes.push(now);
                busy_until = now + pass_takes;
                if broken {
                    // The repair is a change of the agent's: announced back during the pass.
                    broken = false;
                    echo_at = Some(now + pass_takes / 2);
                }
            }
            now += tick;
        }
        passes
    }

    #[test]
    fn the_agents_own_repair_announced_back_costs_one_pass_and_no_more() {
        let passes = simulate(&[Duration::from_secs(1)], Duration::from_secs(60));
        // The repair, then one pass for its own echo, which finds the kernel as wanted and
        // changes nothing, so nothing is announced again.
        assert_eq!(passes.len(), 2, "{passes:?}");
        assert!(
            passes[0] < Duration::from_millis(1100),
            "answered at once: {passes:?}"
        );
        assert!(passes[1] - passes[0] >= EVENT_SPACING, "{passes:?}");
        // Control: without removals, no pass at all.
        assert!(simulate(&[], Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn a_program_that_keeps_deleting_costs_one_pass_per_spacing() {
        // Something deletes kuport's rule every 20 ms for 10 s.
        let fights: Vec<Duration> = (0..500).map(|i| Duration::from_millis(20 * i)).collect();
        let passes = simulate(&fights, Duration::from_secs(10));
        let most = (10 * 1000 / EVENT_SPACING.as_millis() + 1) as usize;
        assert!(passes.len() <= most, "{} passes: {passes:?}", passes.len());
        assert!(
            passes.len() >= most - 1,
            "still repaired each second: {passes:?}"
        );
        for pair in passes.windows(2) {
            assert!(pair[1] - pair[0] >= EVENT_SPACING, "{passes:?}");
        }
    }
}
