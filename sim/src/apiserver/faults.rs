//! Fault hooks: a handle tests hold to make the model misbehave the ways a real API server does
//! (failed requests, stalls, delayed, reordered or cut watch streams). Every random choice comes
//! from a seeded generator, so a run replays exactly from its seed.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::error::ApiError;

/// A small deterministic generator (SplitMix64). Written out rather than taken from `rand` so a
/// seed's stream never changes with a dependency upgrade; it is only used for fault placement,
/// uids and generated names, not for anything needing statistical quality.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform index below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % (n.max(1) as u64)) as usize
    }
}

/// The error an injected failure answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// 500 InternalError.
    InternalError,
    /// 429 TooManyRequests (with `Retry-After: 1`).
    TooManyRequests,
    /// 409 Conflict, as a storm of optimistic-concurrency failures.
    Conflict,
    /// 422 Invalid from admission: what kube-apiserver answers when a ValidatingAdmissionPolicy
    /// whose validation says `reason: Invalid` denies the request (a refusal the writer must
    /// not take for a conflict, nor retry as one).
    Denied,
    /// 422 Invalid as kube-apiserver answers a JSON patch that does not apply (a `test` op that
    /// failed: another writer moved what it guards).
    PatchNotApplied,
}

/// The name of the policy a [`Failure::Denied`] answer names.
pub const DENYING_POLICY: &str = "injected-fault";

impl Failure {
    /// The error answered for a request about `what` (`<resource>.<group> "<name>"`), whose
    /// `Status` details are `details`.
    pub(crate) fn to_error(self, what: &str, details: serde_json::Value) -> ApiError {
        match self {
            Self::InternalError => {
                ApiError::internal(format!("Internal error occurred: injected fault on {what}"))
            }
            Self::TooManyRequests => ApiError::new(
                429,
                "TooManyRequests",
                format!(
                    "the server has received too many requests and has asked us to try again later (injected fault on {what})"
                ),
            ),
            Self::Conflict => ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {what}: the object has been modified; please apply your changes to the latest version and try again (injected fault)"
                ),
            ),
            Self::Denied => {
                ApiError::denied(what, DENYING_POLICY, "denied by an injected fault", details)
            }
            Self::PatchNotApplied => ApiError::patch_not_applied(),
        }
    }
}

/// Which requests a fault rule applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFilter {
    /// Only these verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`); empty means every verb.
    pub verbs: Vec<String>,
    /// Only this resource (plural, e.g. `portmaps`); `None` means every resource.
    pub resource: Option<String>,
    /// Only the `status` subresource when true.
    pub status_only: bool,
}

impl RequestFilter {
    /// Every resource request.
    pub fn any() -> Self {
        Self::default()
    }

    /// Only writes (create, update, patch, delete, deletecollection).
    pub fn writes() -> Self {
        Self {
            verbs: ["create", "update", "patch", "delete", "deletecollection"]
                .map(str::to_owned)
                .to_vec(),
            ..Self::default()
        }
    }

    /// Restricts the filter to one resource.
    pub fn resource(mut self, plural: &str) -> Self {
        self.resource = Some(plural.to_owned());
        self
    }

    /// Restricts the filter to status subresource requests.
    pub fn status(mut self) -> Self {
        self.status_only = true;
        self
    }

    fn matches(&self, req: &RequestInfo<'_>) -> bool {
        (self.verbs.is_empty() || self.verbs.iter().any(|v| v == req.verb))
            && self.resource.as_deref().is_none_or(|r| r == req.resource)
            && (!self.status_only || req.status)
    }
}

/// What the fault layer knows about a resource request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestInfo<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    pub status: bool,
}

#[derive(Clone, Debug)]
struct Rule {
    failure: Failure,
    filter: RequestFilter,
    /// Fail this many more matching requests; `None` for a fraction rule.
    remaining: Option<u32>,
    fraction: f64,
}

#[derive(Debug)]
struct FaultState {
    rng: SplitMix64,
    rules: Vec<Rule>,
    injected: u64,
    watch_delay: Duration,
    reorder_watch: bool,
    /// Requests matching the filter are answered only after the delay.
    slow: Option<(RequestFilter, Duration)>,
    /// Slowed requests now being held, and the most held at once.
    slowed_now: usize,
    slowed_most: usize,
}

/// The fault handle. Cheap to clone; every clone controls the same server.
#[derive(Clone, Debug)]
pub struct Faults {
    state: Arc<Mutex<FaultState>>,
    paused: Arc<watch::Sender<bool>>,
    close_epoch: Arc<watch::Sender<u64>>,
}

impl Faults {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            state: Arc::new(Mutex::new(FaultState {
                rng: SplitMix64::new(seed),
                rules: Vec::new(),
                injected: 0,
                watch_delay: Duration::ZERO,
                reorder_watch: false,
                slow: None,
                slowed_now: 0,
                slowed_most: 0,
            })),
            paused: Arc::new(watch::channel(false).0),
            close_epoch: Arc::new(watch::channel(0).0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        // A panic while holding this lock cannot leave the state half-written (every update is
        // a single assignment or push), so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails the next `n` resource requests matching `filter` with `failure`.
    pub fn fail_next(&self, n: u32, failure: Failure, filter: RequestFilter) {
        self.lock().rules.push(Rule {
            failure,
            filter,
            remaining: Some(n),
            fraction: 1.0,
        });
    }

    /// Fails each resource request matching `filter` with probability `fraction` (clamped to
    /// `[0, 1]`), drawn from the seeded generator, until [`Faults::clear`].
    pub fn fail_fraction(&self, fraction: f64, failure: Failure, filter: RequestFilter) {
        self.lock().rules.push(Rule {
            failure,
            filter,
            remaining: None,
            fraction: fraction.clamp(0.0, 1.0),
        });
    }

    /// Removes every failure rule and watch distortion, and resumes a paused server.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.rules.clear();
        state.watch_delay = Duration::ZERO;
        state.slow = None;
        state.reorder_watch = false;
        drop(state);
        self.resume();
    }

    /// How many requests have been failed by injection so far.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Delays every batch of watch events by `delay` (zero turns it off).
    pub fn delay_watch_events(&self, delay: Duration) {
        self.lock().watch_delay = delay;
    }

    /// Shuffles each batch of watch events that are ready together (seeded).
    pub fn reorder_watch_events(&self, on: bool) {
        self.lock().reorder_watch = on;
    }

    /// Ends every open watch stream now, as a proxy or server restart does; clients resume
    /// from their last `resourceVersion`.
    pub fn close_watches(&self) {
        self.close_epoch.send_modify(|e| *e += 1);
    }

    /// How many watch streams are open now (each holds a receiver of the close signal from the
    /// moment its request is answered), so tests wait on a condition instead of wall time.
    pub fn open_watches(&self) -> usize {
        self.close_epoch.receiver_count()
    }

    /// Answers every request matching `filter` only after `delay` (a slow API server), and
    /// counts how many such requests it holds at once ([`Faults::most_slowed_at_once`]).
    pub fn slow_down(&self, filter: RequestFilter, delay: Duration) {
        let mut state = self.lock();
        state.slow = Some((filter, delay));
        state.slowed_most = 0;
    }

    /// The most slowed requests held at the same time since [`Faults::slow_down`].
    pub fn most_slowed_at_once(&self) -> usize {
        self.lock().slowed_most
    }

    /// Holds a request that matches the slow-down filter for its delay.
    pub(crate) async fn slow(&self, req: RequestInfo<'_>) {
        let delay = {
            let mut state = self.lock();
            let Some(delay) = state
                .slow
                .as_ref()
                .filter(|(f, _)| f.matches(&req))
                .map(|(_, d)| *d)
            else {
                return;
            };
            state.slowed_now += 1;
            state.slowed_most = state.slowed_most.max(state.slowed_now);
            delay
        };
        /// Counts the request out even when its connection is dropped during the delay.
        struct Held<'a>(&'a Faults);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                let mut state = self.0.lock();
                state.slowed_now = state.slowed_now.saturating_sub(1);
            }
        }
        let _held = Held(self);
        tokio::time::sleep(delay).await;
    }

    /// Holds every request (and watch delivery) until [`Faults::resume`].
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Releases held requests.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Waits while the server is paused.
    pub(crate) async fn wait_unpaused(&self) {
        let mut rx = self.paused.subscribe();
        // `wait_for` only errs when the sender is gone, and this handle owns the sender.
        let _ = rx.wait_for(|paused| !*paused).await;
    }

    pub(crate) fn close_receiver(&self) -> watch::Receiver<u64> {
        self.close_epoch.subscribe()
    }

    /// Decides whether this request fails, consuming a `fail_next` count when it does; `what`
    /// and `details` name the object as an answer does.
    pub(crate) fn check(
        &self,
        req: RequestInfo<'_>,
        what: &str,
        details: impl FnOnce() -> serde_json::Value,
    ) -> Option<ApiError> {
        let mut state = self.lock();
        let mut chosen = None;
        for i in 0..state.rules.len() {
            if !state.rules[i].filter.matches(&req) {
                continue;
            }
            let rule = state.rules[i].clone();
            let fire = match rule.remaining {
                Some(0) => false,
                Some(_) => true,
                None => state.rng.next_f64() < rule.fraction,
            };
            if fire {
                if let Some(n) = state.rules[i].remaining.as_mut() {
                    *n -= 1;
                }
                chosen = Some(rule.failure);
                break;
            }
        }
        state.rules.retain(|r| r.remaining != Some(0));
        let failure = chosen?;
        state.injected += 1;
        Some(failure.to_error(what, details()))
    }

    /// The watch distortions now in force, and a shuffle of `batch` when reordering is on.
    pub(crate) fn distort_batch<T>(&self, batch: &mut [T]) -> Duration {
        let mut state = self.lock();
        if state.reorder_watch {
            // Fisher-Yates with the seeded generator.
            for i in (1..batch.len()).rev() {
                let j = state.rng.below(i + 1);
                batch.swap(i, j);
            }
        }
        state.watch_delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> RequestInfo<'static> {
        RequestInfo {
            verb: "get",
            resource: "portmaps",
            status: false,
        }
    }

    #[test]
    fn fail_next_fires_exactly_n_times() {
        let faults = Faults::new(1);
        faults.fail_next(2, Failure::TooManyRequests, RequestFilter::any());
        let codes: Vec<Option<u16>> = (0..4)
            .map(|_| {
                faults
                    .check(req(), "x", || serde_json::Value::Null)
                    .map(|e| e.code)
            })
            .collect();
        assert_eq!(codes, [Some(429), Some(429), None, None]);
        assert_eq!(faults.injected(), 2);
    }

    #[test]
    fn filters_and_fractions_are_deterministic_per_seed() {
        let run = |seed| {
            let faults = Faults::new(seed);
            faults.fail_fraction(0.5, Failure::InternalError, RequestFilter::any());
            faults.fail_next(5, Failure::Conflict, RequestFilter::writes());
            (0..64)
                .map(|_| {
                    faults
                        .check(req(), "x", || serde_json::Value::Null)
                        .is_some()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        let fired = run(7).iter().filter(|f| **f).count();
        assert!((16..48).contains(&fired), "{fired} of 64 at 0.5");
    }
}
