//! A conntrack table in memory for unprivileged tests: entries a test puts there, every
//! listing and delete counted, a listing or a delete that can be made to fail. A delete naming
//! an id matches only the entry with that id, as in the kernel.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{ConntrackTable, Deleted, Flow};

/// What the fake holds.
#[derive(Debug, Default)]
pub struct FakeTable {
    pub flows: Vec<Flow>,
    /// Listings served.
    pub listings: usize,
    /// Entries deleted, in order.
    pub deleted: Vec<Flow>,
    /// When set, the next listing fails with this message (then it is cleared).
    pub fail_next_listing: Option<String>,
    /// While set, every delete is refused with this message.
    pub refuse_deletes: Option<String>,
}

/// The fake table; clones share it.
#[derive(Clone, Debug, Default)]
pub struct FakeConntrack(Arc<Mutex<FakeTable>>);

impl FakeConntrack {
    pub fn with(flows: Vec<Flow>) -> Self {
        let fake = Self::default();
        fake.lock().flows = flows;
        fake
    }

    pub fn lock(&self) -> MutexGuard<'_, FakeTable> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ConntrackTable for FakeConntrack {
    fn flows(&self) -> Result<Vec<Flow>, String> {
        let mut t = self.lock();
        t.listings += 1;
        match t.fail_next_listing.take() {
            Some(e) => Err(e),
            None => Ok(t.flows.clone()),
        }
    }

    fn delete(&self, flows: &[Flow]) -> Deleted {
        let mut t = self.lock();
        let mut out = Deleted::default();
        for flow in flows {
            if let Some(e) = &t.refuse_deletes {
                out.errors.push(e.clone());
                continue;
            }
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
        out
    }
}
