//! One sweep of the table: each entry is judged as the dump brings it, the stale ones are kept
//! until a batch is full and then deleted together, so what the sweep holds is one receive
//! buffer and one batch, whatever the table holds (the kernel test
//! `agent/host/tests/conntrack_sweep.rs` measures it). Before each batch is deleted the sweep
//! asks its [`Checkpoint`]: the worker holds deletes while an apply is changing the datapath and
//! hands over the translations of that apply, so an entry judged by older rules is judged again
//! before it is deleted.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{ConntrackTable, Deleted, Flow, Translations};

/// Stale entries deleted together (one `sendmsg`). It bounds what a sweep holds (this many
/// entries and their delete messages, about 30 KiB) and what the kernel queues back (an
/// answer per refused delete, well inside a socket's default receive buffer).
pub const BATCH: usize = 128;

/// What a sweep is told before it deletes a batch.
#[derive(Clone, Debug)]
pub enum Checkpoint {
    /// Go on, judging by the same translations.
    Same,
    /// Newer translations were applied: the batch is judged again by them (an entry they
    /// translate as it is now is kept), and so is the rest of the table.
    Newer(Arc<Translations>),
    /// Stop now, deleting nothing more (the host is going away).
    Stop,
}

/// What one sweep of the table came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// TCP and UDP entries judged.
    pub listed: usize,
    /// Stale entries deleted.
    pub cleared: usize,
    /// Why the sweep failed, in part or whole (the listing, or deletes the kernel refused).
    pub error: Option<String>,
}

/// Walks `table` and deletes every entry stale by `translations` (see
/// [`Translations::is_stale`]).
pub fn sweep(table: &dyn ConntrackTable, translations: &Translations) -> Sweep {
    let never = AtomicBool::new(false);
    sweep_with(
        table,
        Arc::new(translations.clone()),
        &mut || Checkpoint::Same,
        &never,
    )
}

/// The same, asking `checkpoint` before each batch of deletes and stopping at the next entry
/// once `stop` is set.
pub fn sweep_with(
    table: &dyn ConntrackTable,
    translations: Arc<Translations>,
    checkpoint: &mut dyn FnMut() -> Checkpoint,
    stop: &AtomicBool,
) -> Sweep {
    let mut run = Sweeping {
        table,
        translations,
        checkpoint,
        stop,
        batch: Vec::with_capacity(BATCH),
        listed: 0,
        deleted: Deleted::default(),
        attempted: 0,
        stopped: false,
    };
    let walked = table.walk(&mut |flow| run.judge(flow));
    if !run.stopped {
        // What the walk judged stale is deleted even when the walk failed part way.
        let _ = run.flush();
    }
    run.outcome(walked)
}

/// A sweep under way.
struct Sweeping<'a> {
    table: &'a dyn ConntrackTable,
    translations: Arc<Translations>,
    checkpoint: &'a mut dyn FnMut() -> Checkpoint,
    stop: &'a AtomicBool,
    /// Stale entries not deleted yet: at most [`BATCH`].
    batch: Vec<Flow>,
    listed: usize,
    deleted: Deleted,
    /// Deletes sent.
    attempted: usize,
    stopped: bool,
}

impl Sweeping<'_> {
    fn judge(&mut self, flow: Flow) -> ControlFlow<()> {
        if self.stop.load(Ordering::Relaxed) {
            self.stopped = true;
            return ControlFlow::Break(());
        }
        self.listed += 1;
        if !self.translations.is_stale(&flow) {
            return ControlFlow::Continue(());
        }
        self.batch.push(flow);
        if self.batch.len() < BATCH {
            return ControlFlow::Continue(());
        }
        self.flush()
    }

    /// Deletes the batch, once the checkpoint allows it.
    fn flush(&mut self) -> ControlFlow<()> {
        match (self.checkpoint)() {
            Checkpoint::Same => {}
            Checkpoint::Newer(translations) => {
                self.batch.retain(|f| translations.is_stale(f));
                self.translations = translations;
            }
            Checkpoint::Stop => {
                self.stopped = true;
                self.batch.clear();
                return ControlFlow::Break(());
            }
        }
        if !self.batch.is_empty() {
            self.attempted += self.batch.len();
            self.deleted.add(self.table.delete(&self.batch));
            self.batch.clear();
        }
        ControlFlow::Continue(())
    }

    fn outcome(self, walked: Result<(), String>) -> Sweep {
        let mut errors = Vec::new();
        if let Err(e) = walked {
            errors.push(format!("listing the conntrack table: {e}"));
        }
        if let Some(first) = &self.deleted.first_error {
            errors.push(format!(
                "deleting stale conntrack entries: {} of {} refused, the first: {first}",
                self.deleted.refused, self.attempted
            ));
        }
        if self.stopped {
            errors.push("the sweep was stopped: the host is going away".to_owned());
        }
        Sweep {
            listed: self.listed,
            cleared: self.deleted.deleted,
            error: (!errors.is_empty()).then(|| errors.join("; ")),
        }
    }
}
