//! The status writes of the latest pass, on a task of their own.
//!
//! A pass hands its writes over and returns to the loop at once: the datapath never waits for
//! the API server, so an event arriving while a slow or browned-out API server holds the writes
//! is applied as soon as it is planned. The task writes one pass's writes at a time, latest
//! wins: writes handed over while an earlier pass's are still being written supersede what of
//! those has not been sent yet (the requests already sent are answered first, so a status is
//! never overtaken by an older one), and writes not started yet are replaced outright. Every
//! pass handed over is reported exactly once, by its id, with what its writes came to.

use std::sync::{Arc, Mutex, PoisonError};

use kube::runtime::reflector::Store;
use kuport_core::api::{PortMap, PortMapClass};
use kuport_core::plan::Writes;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use super::clock::Clock;
use super::status::{StatusOutcome, StatusWriter};

/// One pass's writes.
pub(crate) struct StatusJob {
    /// The pass they come from.
    pub pass: u64,
    /// What its plan has this node write (shared with the watches, which compare the statuses
    /// they see with it).
    pub writes: Arc<Writes>,
    /// The classes as that pass saw them (the writes are merged into them first, to skip a
    /// request that would change nothing, and a row of this node they no longer mention goes).
    pub classes: Vec<PortMapClass>,
}

/// What one pass's writes came to.
#[derive(Debug)]
pub(crate) struct StatusDone {
    /// The pass.
    pub pass: u64,
    /// Its writes' outcome; `superseded` when a newer pass took over what was not sent yet.
    pub outcome: StatusOutcome,
}

/// The writes waiting for the task: at most one pass's, the latest.
#[derive(Default)]
struct Slot {
    next: Mutex<Option<StatusJob>>,
    ready: Notify,
}

impl Slot {
    fn take(&self) -> Option<StatusJob> {
        self.next
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn waiting(&self) -> bool {
        self.next
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

/// The handle the pass loop holds; dropping it stops the task (a stopping agent abandons its
/// writes, as it abandoned a pass in flight before).
pub(crate) struct StatusTask {
    slot: Arc<Slot>,
    done: mpsc::UnboundedReceiver<StatusDone>,
    task: JoinHandle<()>,
}

impl StatusTask {
    /// Starts the task. `portmaps` is the live PortMap store: each write compares against the
    /// object as watched when it is sent, not as the pass saw it.
    pub fn start(writer: StatusWriter, portmaps: Store<PortMap>, clock: Clock) -> Self {
        let slot = Arc::new(Slot::default());
        // Unbounded, yet bounded in practice: one report per pass handed over, and the loop
        // takes them whenever it waits.
        let (done_tx, done) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(writer, portmaps, clock, slot.clone(), done_tx));
        Self { slot, done, task }
    }

    /// Hands a pass's writes over. Returns the pass whose writes were still waiting and are
    /// now replaced before any of them was sent (it is reported here, not by the task).
    pub fn submit(&self, job: StatusJob) -> Option<u64> {
        let displaced = self
            .slot
            .next
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(job)
            .map(|old| old.pass);
        // A stored permit: the task sees the job even when it is not waiting yet.
        self.slot.ready.notify_one();
        displaced
    }

    /// The next report of a pass whose writes finished or were superseded; an error when the
    /// task ended, which it only does by panicking (a bug: the agent stops, as it did when the
    /// writes ran in the pass and panicked there). Not to be called again after an error.
    pub async fn done(&mut self) -> Result<StatusDone, String> {
        if let Some(done) = self.done.recv().await {
            return Ok(done);
        }
        match (&mut self.task).await {
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic".to_owned());
                Err(format!("it panicked: {message}"))
            }
            Err(e) => Err(format!("it was cancelled: {e}")),
            Ok(()) => Err("it ended".to_owned()),
        }
    }
}

impl Drop for StatusTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(
    writer: StatusWriter,
    portmaps: Store<PortMap>,
    clock: Clock,
    slot: Arc<Slot>,
    done: mpsc::UnboundedSender<StatusDone>,
) {
    let superseded = {
        let slot = slot.clone();
        move || slot.waiting()
    };
    loop {
        let Some(job) = slot.take() else {
            slot.ready.notified().await;
            continue;
        };
        // The time of the writes, not of the plan: a row's pass time and a claim's unused mark
        // say when they were written.
        let outcome = writer
            .write_all(
                &job.writes,
                &portmaps,
                &job.classes,
                clock.now(),
                &superseded,
            )
            .await;
        // The loop is gone only when the agent stops, and then so is this task.
        if done
            .send(StatusDone {
                pass: job.pass,
                outcome,
            })
            .is_err()
        {
            return;
        }
    }
}
