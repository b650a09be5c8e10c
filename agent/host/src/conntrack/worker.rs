//! The sweep off the agent's pass. A walk of a million-entry table takes about a second, and a
//! tenant can ask for one at every endpoint change, so an apply only asks for a sweep and
//! returns; one thread per host runs the sweeps, one at a time. A newer request replaces one
//! not yet started, and one that comes while a sweep runs hands the running sweep its newer
//! translations at its next batch and runs in full after it (the part already walked was
//! judged by the older ones). While an apply changes the datapath ([`SweepWorker::hold`]) the
//! sweep deletes nothing: it waits for the apply's translations, so an entry the new rules
//! made is never judged by the old ones. A failed sweep is retried by the thread itself, 200 ms
//! after the failure and doubling to 30 s, until one succeeds or a newer request comes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Checkpoint, ConntrackTable, Sweep, Translations, sweep_with};

/// Told how each sweep ended, on the sweeping thread (the agent counts them in its metrics).
pub type SweepObserver = Arc<dyn Fn(&Sweep) + Send + Sync>;

/// The first delay before a failed sweep runs again; it doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// When the host asks for a sweep: after an apply whose translations differ from those last
/// asked for (the first apply of a host included), and on a verifying pass of a node that
/// translates something. An unchanged pass asks for nothing, and neither does a resync of a
/// node kuport does not use; a failed sweep is the worker's to retry.
#[derive(Debug, Default)]
pub struct Sweeper {
    /// The translations of the last request.
    asked: Option<Translations>,
}

impl Sweeper {
    /// Whether a sweep is owed for translations `now` (verifying or not).
    pub fn due(&self, now: &Translations, verify: bool) -> bool {
        self.asked.as_ref() != Some(now) || (verify && !now.is_empty())
    }

    /// Records that a sweep for `now` was asked for.
    pub fn asked(&mut self, now: Translations) {
        self.asked = Some(now);
    }
}

/// The host's sweeping thread: started at the first request, stopped when dropped (a sweep
/// under way stops at its next entry).
pub struct SweepWorker {
    shared: Arc<Shared>,
    started: bool,
}

struct Shared {
    table: Arc<dyn ConntrackTable>,
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
}

struct State {
    /// The newest request: its number (from 1) and the translations to judge by.
    asked: Option<(u64, Arc<Translations>)>,
    /// The number of the request the running (or last) sweep started for.
    started: u64,
    running: bool,
    /// Applies changing the datapath now.
    holds: usize,
    /// When a failed sweep runs again.
    retry_at: Option<Instant>,
    retry_delay: Duration,
    observer: Option<SweepObserver>,
}

/// What the thread does next.
enum Next {
    Run(u64, Arc<Translations>),
    /// Wait for a change, or at most this long (a retry).
    Wait(Option<Duration>),
}

impl State {
    fn next(&self, now: Instant) -> Next {
        let Some((number, translations)) = &self.asked else {
            return Next::Wait(None);
        };
        if self.holds > 0 {
            return Next::Wait(None);
        }
        if *number > self.started {
            return Next::Run(*number, translations.clone());
        }
        match self.retry_at {
            Some(at) if at <= now => Next::Run(*number, translations.clone()),
            Some(at) => Next::Wait(Some(at - now)),
            None => Next::Wait(None),
        }
    }

    fn idle(&self) -> bool {
        let queued = self.asked.as_ref().is_some_and(|(n, _)| *n > self.started);
        !self.running && !queued && self.retry_at.is_none()
    }
}

/// An apply changing the datapath: the sweep deletes nothing while it lives.
pub struct Hold {
    shared: Arc<Shared>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.shared.lock().holds -= 1;
        self.shared.changed.notify_all();
    }
}

impl SweepWorker {
    /// A worker sweeping `table`; no thread runs until the first request.
    pub fn new(table: Arc<dyn ConntrackTable>) -> Self {
        let state = State {
            asked: None,
            started: 0,
            running: false,
            holds: 0,
            retry_at: None,
            retry_delay: RETRY_MIN,
            observer: None,
        };
        Self {
            shared: Arc::new(Shared {
                table,
                state: Mutex::new(state),
                changed: Condvar::new(),
                stop: AtomicBool::new(false),
            }),
            started: false,
        }
    }

    /// Asks for a sweep judged by `translations`, replacing a request not started yet. Fails
    /// only when the thread cannot be started (the request stays, for the next call to start
    /// it).
    pub fn request(&mut self, translations: Arc<Translations>) -> Result<(), String> {
        {
            let mut s = self.shared.lock();
            let number = s.asked.as_ref().map_or(1, |(n, _)| n + 1);
            s.asked = Some((number, translations));
        }
        self.shared.changed.notify_all();
        if !self.started {
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name("kuport-conntrack".to_owned())
                .spawn(move || run(&shared))
                .map_err(|e| format!("starting the conntrack sweep thread: {e}"))?;
            self.started = true;
        }
        Ok(())
    }

    /// Holds deletes until the returned guard drops (an apply is changing the datapath).
    pub fn hold(&self) -> Hold {
        self.shared.lock().holds += 1;
        Hold {
            shared: self.shared.clone(),
        }
    }

    /// Tells `observer` how each later sweep ends.
    pub fn observe(&self, observer: SweepObserver) {
        self.shared.lock().observer = Some(observer);
    }

    /// What waits for this worker to be idle, from any thread.
    pub fn idle(&self) -> Idle {
        Idle {
            shared: self.shared.clone(),
        }
    }
}

/// Waits for a worker to be idle.
pub struct Idle {
    shared: Arc<Shared>,
}

impl Idle {
    /// Blocks until no sweep runs, none is asked for and no retry is pending, or `timeout`
    /// passed; true when idle.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        loop {
            if s.idle() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self.shared.wait_timeout(s, deadline - now);
        }
    }
}

impl Drop for SweepWorker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed
            .wait(guard)
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_timeout<'a>(
        &self,
        guard: MutexGuard<'a, State>,
        timeout: Duration,
    ) -> MutexGuard<'a, State> {
        self.changed
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// The thread: sweeps while asked to, until the worker is dropped.
fn run(shared: &Shared) {
    while let Some((number, translations)) = next(shared) {
        let mut judged = number;
        let sweep = sweep_with(
            &*shared.table,
            translations,
            &mut || checkpoint(shared, &mut judged),
            &shared.stop,
        );
        if shared.stopped() {
            return;
        }
        ended(shared, &sweep);
    }
}

/// Waits for the next sweep to run; `None` once stopped.
fn next(shared: &Shared) -> Option<(u64, Arc<Translations>)> {
    let mut s = shared.lock();
    loop {
        if shared.stopped() {
            return None;
        }
        match s.next(Instant::now()) {
            Next::Run(number, translations) => {
                s.started = number;
                s.running = true;
                s.retry_at = None;
                return Some((number, translations));
            }
            Next::Wait(Some(at_most)) => s = shared.wait_timeout(s, at_most),
            Next::Wait(None) => s = shared.wait(s),
        }
    }
}

/// Before a batch of deletes: waits out the applies under way, then hands over translations
/// newer than those the sweep judged by (request `judged`).
fn checkpoint(shared: &Shared, judged: &mut u64) -> Checkpoint {
    let mut s = shared.lock();
    while s.holds > 0 && !shared.stopped() {
        s = shared.wait(s);
    }
    if shared.stopped() {
        return Checkpoint::Stop;
    }
    match &s.asked {
        Some((number, translations)) if *number > *judged => {
            *judged = *number;
            Checkpoint::Newer(translations.clone())
        }
        _ => Checkpoint::Same,
    }
}

/// Logs how a sweep ended and tells the observer, then records it (scheduling the retry of a
/// failed one): whoever waits for the worker to be idle finds the observer told.
fn ended(shared: &Shared, sweep: &Sweep) {
    let (observer, delay) = {
        let s = shared.lock();
        (s.observer.clone(), s.retry_delay)
    };
    if let Some(error) = &sweep.error {
        tracing::warn!(
            listed = sweep.listed,
            cleared = sweep.cleared,
            "{error}; the sweep runs again in {} ms",
            delay.as_millis()
        );
    }
    if sweep.cleared > 0 {
        tracing::info!(
            cleared = sweep.cleared,
            listed = sweep.listed,
            "cleared {} conntrack entries of flows no longer translated this way (their next packet starts a new flow)",
            sweep.cleared
        );
    }
    if let Some(observer) = observer {
        observer(sweep);
    }
    let mut s = shared.lock();
    s.running = false;
    if sweep.error.is_some() {
        s.retry_at = Some(Instant::now() + delay);
        s.retry_delay = (delay * 2).min(RETRY_MAX);
    } else {
        s.retry_delay = RETRY_MIN;
    }
    drop(s);
    shared.changed.notify_all();
}
