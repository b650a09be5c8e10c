//! A conntrack table in memory for unprivileged tests: entries a test puts there, every walk
//! and delete counted, a walk or a delete that can be made to fail, and walks that can be held
//! at their start (to see what happens while a sweep runs). A delete naming an id matches only
//! the entry with that id, as in the kernel.

use std::ops::ControlFlow;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{ConntrackTable, Deleted, Flow};

/// What the fake holds.
#[derive(Debug, Default)]
pub struct FakeTable {
    pub flows: Vec<Flow>,
    /// Walks started.
    pub listings: usize,
    /// Walks that reached their end.
    pub walked: usize,
    /// Entries deleted, in order.
    pub deleted: Vec<Flow>,
    /// Entries walks have handed out so far.
    pub handed: usize,
    /// Each delete call (each batch): its size, and how many entries walks had handed out
    /// when it came.
    pub batches: Vec<(usize, usize)>,
    /// When set, the next walk fails with this message (then it is cleared).
    pub fail_next_listing: Option<String>,
    /// While set, every delete is refused with this message.
    pub refuse_deletes: Option<String>,
    /// While true, a walk waits at its start (after counting itself) until it is cleared.
    pub held: bool,
}

/// The fake table; clones share it.
#[derive(Clone, Debug, Default)]
pub struct FakeConntrack(Arc<(Mutex<FakeTable>, Condvar)>);

impl FakeConntrack {
    pub fn with(flows: Vec<Flow>) -> Self {
        let fake = Self::default();
        fake.lock().flows = flows;
        fake
    }

    pub fn lock(&self) -> MutexGuard<'_, FakeTable> {
        self.0.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds every walk at its start until [`FakeConntrack::release`].
    pub fn hold(&self) {
        self.lock().held = true;
    }

    pub fn release(&self) {
        self.lock().held = false;
        self.0.1.notify_all();
    }

    /// Waits until `cond` holds of the table (checked at each change it is told of, and every
    /// 10 ms); false after 10 s.
    pub fn wait_until(&self, cond: impl Fn(&FakeTable) -> bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut t = self.lock();
        while !cond(&t) {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            t = self
                .0
                .1
                .wait_timeout(t, Duration::from_millis(10))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

impl ConntrackTable for FakeConntrack {
    fn walk(&self, each: &mut dyn FnMut(Flow) -> ControlFlow<()>) -> Result<(), String> {
        let snapshot = {
            let mut t = self.lock();
            t.listings += 1;
            self.0.1.notify_all();
            while t.held {
                t = self.0.1.wait(t).unwrap_or_else(PoisonError::into_inner);
            }
            if let Some(e) = t.fail_next_listing.take() {
                return Err(e);
            }
            // Entries are handed over unlocked: `each` deletes through the table meanwhile.
            t.flows.clone()
        };
        for flow in snapshot {
            self.lock().handed += 1;
            if each(flow).is_break() {
                return Ok(());
            }
        }
        self.lock().walked += 1;
        self.0.1.notify_all();
        Ok(())
    }

    fn delete(&self, flows: &[Flow]) -> Deleted {
        let mut t = self.lock();
        let handed = t.handed;
        t.batches.push((flows.len(), handed));
        if let Some(e) = &t.refuse_deletes {
            return Deleted::all_refused(flows.len(), e.clone());
        }
        let mut out = Deleted::default();
        for flow in flows {
            let same = |f: &Flow| {
                f.protocol == flow.protocol
                    && f.source == flow.source
                    && f.destination == flow.destination
                    && f.zone == flow.zone
                    && flow.id.is_none_or(|id| f.id == Some(id))
            };
            match t.flows.iter().position(same) {
                Some(i) => {
                    let gone = t.flows.remove(i);
                    t.deleted.push(gone);
                    out.deleted += 1;
                }
                None => out.gone += 1,
            }
        }
        drop(t);
        self.0.1.notify_all();
        out
    }
}
