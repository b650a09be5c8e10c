//! What every watch shares: the settings and channels each watch task gets ([`Watch`]), its
//! list page size and retry delays, and whether an event can change a pass.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::mpsc;

use crate::agent::metrics::Metrics;
use crate::agent::relevance::{PassInput, Wanted};

/// Objects per page of a watch's list. A page is held whole, untrimmed, while it is read
/// (kube's default is 500); objects may carry up to 256 KiB of annotations each, so 500 of them
/// would be 128 MiB before trimming. 50 keeps a page under about 13 MiB at worst and costs a
/// relist of 10,000 PortMaps 200 requests instead of 20.
pub(super) const LIST_PAGE_SIZE: u32 = 50;

/// Whether `event` can change a pass, judged against the object `store` holds before it is
/// applied: an object replaced in place by what it reads (`PassInput`), every one created or
/// deleted, and every object of a relist (each possibly changed while the watch was away).
pub(super) fn passes<K: PassInput + 'static>(
    event: &watcher::Event<K>,
    store: &Store<K>,
    wanted: &Wanted,
) -> bool {
    match event {
        watcher::Event::Apply(new) => store
            .get(&ObjectRef::from_obj(new))
            .is_none_or(|old| K::changes_a_pass(&old, new, wanted)),
        _ => true,
    }
}

/// What every watch shares: where to mark the node dirty, what its status writes want (to
/// judge which events can change a pass), the metrics, the seed of its retry jitter.
#[derive(Clone)]
pub(super) struct Watch {
    /// This node's name: some kinds are watched only for it.
    pub node: String,
    pub dirty: mpsc::Sender<()>,
    pub wanted: Wanted,
    pub metrics: Arc<Metrics>,
    pub jitter_seed: u64,
    /// How long one request of a watch's own (a fetch of slices) may take.
    pub api_timeout: Duration,
}

/// The watches' retry delays: kube-runtime's default policy (0.8 s doubling to 30 s, reset
/// after 2 min without errors, jittered), with the jitter drawn from `seed`.
pub(super) fn watch_backoff(seed: u64) -> impl kube::runtime::utils::Backoff {
    let policy = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(800))
        .with_max_delay(Duration::from_secs(30))
        .with_factor(2.0)
        .without_max_times()
        .with_jitter()
        .with_jitter_seed(seed);
    kube::runtime::utils::ResetTimerBackoff::new(
        kube::runtime::watcher::ExponentialBackoff::from(policy),
        Duration::from_secs(120),
    )
}
