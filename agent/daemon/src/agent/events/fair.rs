//! The Events waiting to be published, shared fairly between tenants. Pure: every call is
//! handed `now`.
//!
//! A tenant is the namespace of the object an Event regards (`""` for the cluster-scoped
//! classes, the administrator's). The agent's budget (a burst of [`BURST`], then [`PER_SECOND`])
//! is spent on the tenants in turn, one Event each, so a tenant raising a hundred Events a
//! second delays another's next Event by one turn, never drops it. A repeat of an Event still
//! waiting (same object, reason, type and action) is merged into it: counted, with the newest
//! note, as Kubernetes' own recorders aggregate repeats. What a tenant can have waiting is
//! bounded ([`TENANT_QUEUE`] distinct Events, [`QUEUE`] in all): past that the tenant waiting
//! longest in line (the one with the most) loses its oldest Normal Event first, and a Warning
//! only to a newer Warning of its own. A Warning whose publishing failed is tried again
//! ([`FairQueue::retry`]) for up to [`RETRY_FOR`].

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::time::Duration;

use tokio::time::Instant;

use super::PendingEvent;
use crate::agent::budget::TokenBucket;

/// Burst of the agent's Event budget: an agent starting on a node with dozens of mappings
/// reports each one's first conditions and their first flips (a burst of 10 dropped a clash
/// reported seconds after start in the lab).
pub(crate) const BURST: f64 = 50.0;
/// Sustained Events per second of the agent.
pub(crate) const PER_SECOND: f64 = 5.0;
/// Distinct Events one tenant may have waiting.
pub(crate) const TENANT_QUEUE: usize = 32;
/// Events waiting in all (each holds a note of up to 1 KiB).
pub(crate) const QUEUE: usize = 1024;
/// A failed Warning is tried again after this, doubling ...
const RETRY_MIN: Duration = Duration::from_secs(1);
/// ... up to this ...
const RETRY_MAX: Duration = Duration::from_secs(60);
/// ... for this long after it was raised (an Event older than the API server keeps Events, an
/// hour by default, would be gone again at once).
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(3600);

/// What makes two Events one (the object, reason, type and action: what Kubernetes' own
/// recorders key a series on); the note may differ, and the newest is kept.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct EventKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub reason: String,
    pub warning: bool,
    pub action: &'static str,
}

impl EventKey {
    pub fn of(ev: &PendingEvent) -> Self {
        let r = &ev.regarding;
        Self {
            kind: r.kind.clone().unwrap_or_default(),
            namespace: r.namespace.clone().unwrap_or_default(),
            name: r.name.clone().unwrap_or_default(),
            uid: r.uid.clone().unwrap_or_default(),
            reason: ev.reason.clone(),
            warning: ev.warning,
            action: ev.action,
        }
    }

    /// The tenant the Event counts against: its object's namespace.
    pub fn tenant(&self) -> &str {
        &self.namespace
    }
}

/// One Event waiting, with the repeats merged into it.
#[derive(Clone, Debug)]
pub(crate) struct Waiting {
    pub key: EventKey,
    pub event: PendingEvent,
    /// How many times it was raised (1, plus each repeat merged).
    pub count: u32,
    /// When it was first raised.
    pub raised: Instant,
    /// Failed publishes so far.
    pub attempts: u32,
    /// Not to be published before this (a retry's backoff).
    pub not_before: Instant,
}

/// What [`FairQueue::push`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued as a new Event.
    Queued,
    /// Merged into the same Event waiting.
    Merged,
    /// Queued, and to make room an older Event of `tenant` was dropped (or, `queued` false, the
    /// new one was: a Normal Event of a tenant with only Warnings waiting).
    Dropped { tenant: String, queued: bool },
}

/// What to do next.
#[derive(Debug)]
pub(crate) enum Next {
    /// Publish this (its token is spent).
    Publish(Box<Waiting>),
    /// Nothing can go before then (no token, or every Event waits for its retry).
    At(Instant),
    /// Nothing waits.
    Idle,
}

/// The Events waiting, by tenant, and the budget they share.
#[derive(Debug)]
pub(crate) struct FairQueue {
    tenants: BTreeMap<String, VecDeque<Waiting>>,
    /// The tenant served last: the next turn is the next tenant after it.
    served: Option<String>,
    total: usize,
    budget: TokenBucket,
    /// Events dropped per tenant since [`FairQueue::take_drops`] last asked.
    drops: BTreeMap<String, u64>,
}

impl FairQueue {
    pub fn new(now: Instant) -> Self {
        Self {
            tenants: BTreeMap::new(),
            served: None,
            total: 0,
            budget: TokenBucket::full(BURST, PER_SECOND, now),
            drops: BTreeMap::new(),
        }
    }

    /// How many Events wait.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.total
    }

    /// Queues `event`, raised at `now`.
    pub fn push(&mut self, event: PendingEvent, now: Instant) -> Pushed {
        let key = EventKey::of(&event);
        let tenant = key.tenant().to_owned();
        if let Some(same) = self
            .tenants
            .get_mut(&tenant)
            .and_then(|q| q.iter_mut().find(|w| w.key == key))
        {
            same.count = same.count.saturating_add(1);
            same.event = event;
            return Pushed::Merged;
        }
        let waiting = Waiting {
            key,
            event,
            count: 1,
            raised: now,
            attempts: 0,
            not_before: now,
        };
        self.insert(tenant, waiting, false)
    }

    /// Queues a Warning whose publishing failed, to try again after a backoff; false (and
    /// counted as dropped) when it was raised more than [`RETRY_FOR`] ago.
    pub fn retry(&mut self, mut waiting: Waiting, now: Instant) -> bool {
        let tenant = waiting.key.tenant().to_owned();
        if now.saturating_duration_since(waiting.raised) >= RETRY_FOR {
            *self.drops.entry(tenant).or_default() += 1;
            return false;
        }
        waiting.attempts += 1;
        let backoff = RETRY_MIN.saturating_mul(1 << waiting.attempts.min(16).saturating_sub(1));
        waiting.not_before = now + backoff.min(RETRY_MAX);
        // A newer occurrence waiting takes this one's count; else it goes first in its line.
        if let Some(same) = self
            .tenants
            .get_mut(&tenant)
            .and_then(|q| q.iter_mut().find(|w| w.key == waiting.key))
        {
            same.count = same.count.saturating_add(waiting.count);
            same.raised = same.raised.min(waiting.raised);
            return true;
        }
        !matches!(
            self.insert(tenant, waiting, true),
            Pushed::Dropped { queued: false, .. }
        )
    }

    /// Puts `waiting` in its tenant's line (at the front when `first`), making room first.
    fn insert(&mut self, tenant: String, waiting: Waiting, first: bool) -> Pushed {
        let warning = waiting.key.warning;
        let own_full = self
            .tenants
            .get(&tenant)
            .is_some_and(|q| q.len() >= TENANT_QUEUE);
        let victim = if own_full {
            Some(tenant.clone())
        } else if self.total >= QUEUE {
            self.longest()
        } else {
            None
        };
        let mut pushed = Pushed::Queued;
        if let Some(victim) = victim {
            let queued = self.evict(&victim, warning || victim != tenant);
            *self.drops.entry(victim.clone()).or_default() += 1;
            pushed = Pushed::Dropped {
                tenant: victim,
                queued,
            };
            if !queued {
                return pushed;
            }
        }
        let line = self.tenants.entry(tenant).or_default();
        if first {
            line.push_front(waiting);
        } else {
            line.push_back(waiting);
        }
        self.total += 1;
        pushed
    }

    /// The tenant with the most Events waiting (the first by name among equals).
    fn longest(&self) -> Option<String> {
        let most = self.tenants.values().map(VecDeque::len).max()?;
        self.tenants
            .iter()
            .find(|(_, q)| q.len() == most)
            .map(|(t, _)| t.clone())
    }

    /// Drops the oldest Normal Event of `tenant`, else (when `warnings`) its oldest Warning.
    /// False when nothing was dropped (the newcomer is then the one dropped).
    fn evict(&mut self, tenant: &str, warnings: bool) -> bool {
        let Some(line) = self.tenants.get_mut(tenant) else {
            return false;
        };
        let at = line
            .iter()
            .position(|w| !w.key.warning)
            .or_else(|| warnings.then_some(0).filter(|_| !line.is_empty()));
        let Some(at) = at else {
            return false;
        };
        line.remove(at);
        self.total -= 1;
        if line.is_empty() {
            self.tenants.remove(tenant);
        }
        true
    }

    /// The next Event to publish: the next tenant in turn with one that may go, if the budget
    /// has a token for it.
    pub fn next(&mut self, now: Instant) -> Next {
        let mut soonest: Option<Instant> = None;
        let mut found: Option<(String, usize)> = None;
        for (tenant, line) in self.in_turn() {
            match line.iter().position(|w| w.not_before <= now) {
                Some(at) => {
                    found = Some((tenant.clone(), at));
                    break;
                }
                None => {
                    let due = line.iter().map(|w| w.not_before).min();
                    soonest = soonest.into_iter().chain(due).min();
                }
            }
        }
        let Some((tenant, at)) = found else {
            return soonest.map_or(Next::Idle, Next::At);
        };
        if let Err(then) = self.budget.take(now) {
            return Next::At(then);
        }
        let Some(line) = self.tenants.get_mut(&tenant) else {
            return Next::Idle;
        };
        let Some(waiting) = line.remove(at) else {
            return Next::Idle;
        };
        if line.is_empty() {
            self.tenants.remove(&tenant);
        }
        self.total -= 1;
        self.served = Some(tenant);
        Next::Publish(Box::new(waiting))
    }

    /// The tenants' lines, starting with the one after the tenant served last.
    fn in_turn(&self) -> impl Iterator<Item = (&String, &VecDeque<Waiting>)> {
        let split = self.served.as_ref().map_or(0, |served| {
            self.tenants
                .range::<String, _>((Bound::Unbounded, Bound::Included(served)))
                .count()
        });
        self.tenants
            .iter()
            .skip(split)
            .chain(self.tenants.iter().take(split))
    }

    /// The Events dropped per tenant since the last call.
    pub fn take_drops(&mut self) -> BTreeMap<String, u64> {
        std::mem::take(&mut self.drops)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;

    use super::*;

    fn event(namespace: &str, name: &str, reason: &str, warning: bool) -> PendingEvent {
        PendingEvent {
            regarding: ObjectReference {
                kind: Some("PortMap".into()),
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{namespace}-{name}")),
                ..ObjectReference::default()
            },
            warning,
            reason: reason.into(),
            note: format!("{reason} of {namespace}/{name}"),
            action: "UpdateStatus",
        }
    }

    /// Publishes what the budget allows over `seconds` from `t0` (every 10 ms); returns the
    /// Events in the order they went.
    fn drain(q: &mut FairQueue, t0: Instant, seconds: u64) -> Vec<Waiting> {
        let mut out = Vec::new();
        let mut now = t0;
        while now <= t0 + Duration::from_secs(seconds) {
            while let Next::Publish(w) = q.next(now) {
                out.push(*w);
            }
            now += Duration::from_millis(10);
        }
        out
    }

    #[test]
    fn a_tenant_flooding_delays_anothers_warning_by_one_turn_and_drops_only_its_own() {
        let t0 = Instant::now();
        let mut q = FairQueue::new(t0);
        // Namespace a toggles its 200 PortMaps' interfaces: an Event each, twice over.
        for round in 0..2 {
            for i in 0..200 {
                let warning = round == 1;
                q.push(
                    event("a", &format!("pm{i}"), "NoInterfaceOnNode", warning),
                    t0,
                );
            }
        }
        // Then b's mapping is refused a port.
        assert_eq!(
            q.push(event("b", "gs", "PortConflict", true), t0),
            Pushed::Queued
        );
        let drops = q.take_drops();
        assert!(drops.get("a").is_some_and(|n| *n > 0), "{drops:?}");
        assert!(!drops.contains_key("b"), "b loses nothing: {drops:?}");
        let published = drain(&mut q, t0, 0);
        let at = published
            .iter()
            .position(|w| w.key.namespace == "b")
            .expect("b's Warning is published");
        assert!(at <= 1, "b's turn comes at once: published {at}th");
        assert_eq!(published[at].event.reason, "PortConflict");
        // What waited (a's 32 newest, b's one) fits the burst.
        assert_eq!(published.len(), TENANT_QUEUE + 1);
    }

    #[test]
    fn the_tenants_take_turns_within_the_budget() {
        let t0 = Instant::now();
        let mut q = FairQueue::new(t0);
        for i in 0..TENANT_QUEUE {
            q.push(event("a", &format!("pm{i}"), "NoReadyEndpoint", true), t0);
            q.push(event("b", &format!("pm{i}"), "NoReadyEndpoint", true), t0);
        }
        // Two seconds: the burst, then five a second.
        let published = drain(&mut q, t0, 2);
        assert_eq!(published.len(), 60);
        let turns: String = published.iter().map(|w| w.key.namespace.as_str()).collect();
        assert_eq!(turns, "ab".repeat(30));
    }

    #[test]
    fn repeats_waiting_are_one_event_counted_with_the_newest_note() {
        let t0 = Instant::now();
        let mut q = FairQueue::new(t0);
        for i in 0..5 {
            let mut e = event("a", "gs", "ReturnLinkDown", true);
            e.note = format!("probe {i} lost");
            let pushed = q.push(e, t0 + Duration::from_millis(i));
            assert_eq!(
                pushed,
                if i == 0 {
                    Pushed::Queued
                } else {
                    Pushed::Merged
                }
            );
        }
        assert_eq!(q.len(), 1);
        let Next::Publish(w) = q.next(t0) else {
            panic!("one to publish");
        };
        assert_eq!((w.count, w.event.note.as_str()), (5, "probe 4 lost"));
        assert!(matches!(q.next(t0), Next::Idle));
    }

    #[test]
    fn a_full_line_drops_its_oldest_normal_event_and_keeps_warnings_for_warnings() {
        let t0 = Instant::now();
        let mut q = FairQueue::new(t0);
        q.push(event("a", "w0", "PortConflict", true), t0);
        for i in 1..TENANT_QUEUE {
            q.push(event("a", &format!("n{i}"), "AllNodesReady", false), t0);
        }
        // Full: a new Warning drops the oldest Normal, not the Warning.
        let pushed = q.push(event("a", "w1", "PortInUse", true), t0);
        assert_eq!(
            pushed,
            Pushed::Dropped {
                tenant: "a".into(),
                queued: true
            }
        );
        let mut reasons: Vec<String> = drain(&mut q, t0, 20)
            .into_iter()
            .filter(|w| w.key.warning)
            .map(|w| w.key.name)
            .collect();
        reasons.sort();
        assert_eq!(reasons, ["w0", "w1"]);

        // A line of Warnings only: a Normal newcomer is the one dropped.
        let mut q = FairQueue::new(t0);
        for i in 0..TENANT_QUEUE {
            q.push(event("a", &format!("w{i}"), "PortConflict", true), t0);
        }
        let pushed = q.push(event("a", "n", "AllNodesReady", false), t0);
        assert_eq!(
            pushed,
            Pushed::Dropped {
                tenant: "a".into(),
                queued: false
            }
        );
        assert_eq!(q.len(), TENANT_QUEUE);
    }

    #[test]
    fn past_the_total_the_longest_line_pays() {
        let t0 = Instant::now();
        let mut q = FairQueue::new(t0);
        // Tenants t0000..: each one event, and tenant "big" with its line full.
        for i in 0..TENANT_QUEUE {
            q.push(event("big", &format!("w{i}"), "PortConflict", true), t0);
        }
        for i in 0..(QUEUE - TENANT_QUEUE) {
            q.push(event(&format!("t{i:04}"), "gs", "AllNodesReady", false), t0);
        }
        assert_eq!(q.len(), QUEUE);
        let pushed = q.push(event("new", "gs", "PortConflict", true), t0);
        assert_eq!(
            pushed,
            Pushed::Dropped {
                tenant: "big".into(),
                queued: true
            }
        );
        assert_eq!(q.len(), QUEUE);
    }

    #[test]
    fn a_failed_warning_is_tried_again_later_until_it_is_too_old() {
        let t0 = Instant::now();
        let mut q = FairQueue::new(t0);
        q.push(event("b", "gs", "PortConflict", true), t0);
        let Next::Publish(w) = q.next(t0) else {
            panic!("published");
        };
        // Publishing failed: it waits for its backoff, then goes again.
        assert!(q.retry(*w, t0));
        assert!(matches!(q.next(t0), Next::At(at) if at == t0 + RETRY_MIN));
        let Next::Publish(w) = q.next(t0 + RETRY_MIN) else {
            panic!("tried again");
        };
        assert_eq!(w.attempts, 1);
        // A repeat raised meanwhile takes its count.
        q.push(event("b", "gs", "PortConflict", true), t0 + RETRY_MIN);
        assert!(q.retry(*w, t0 + RETRY_MIN));
        let Next::Publish(w) = q.next(t0 + RETRY_MIN) else {
            panic!("the repeat goes");
        };
        assert_eq!(w.count, 2);
        // An hour after it was raised it is given up, and counted.
        assert!(!q.retry(*w, t0 + RETRY_FOR));
        assert_eq!(q.take_drops().get("b"), Some(&1));
    }
}
