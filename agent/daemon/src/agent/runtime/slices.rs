//! The EndpointSlice watch, and what it keeps: the slices of the Services some PortMap refers
//! to, as `slice_decode.rs` decodes them, and nothing of any other slice.
//!
//! The watch sees every slice in the cluster (its RBAC and the API server's watch cache allow no
//! narrower one that follows the PortMaps), but a slice of a Service no PortMap refers to is
//! dropped as its event arrives: any tenant may create slices, up to 1,000 endpoints each, and
//! every agent keeping them is how unrelated slices once took every agent past its memory
//! limit. The Services whose slices are kept ([`Services`], shared with the passes) are the
//! ones the PortMaps of the last pass referred to; each pass brings them up to date before it
//! reads the slices ([`Slices::follow`]):
//!
//! - a Service a PortMap came to refer to is added, and its slices fetched at once (one list
//!   with `labelSelector=kubernetes.io/service-name=<name>` in its namespace), the pass waiting
//!   for them, so its first plan sees the endpoints the Service has; a fetch that fails is
//!   retried with backoff, and marks the node dirty when it lands;
//! - a Service no PortMap refers to any more is removed, and its slices dropped.
//!
//! One task owns the store, the set and the fetches, so they happen in one order with the
//! watch's events: a Service is added before its fetch starts, so every event of its slices the
//! task takes after the fetch is kept (an older one among them is followed by the newer ones,
//! the watch delivering every change in order), and every change before it is in what the fetch
//! lists (a list without a `resourceVersion` is the latest state). The watch's first list waits
//! for the PortMap watch to sync, so it keeps the slices of the Services referred to then and no
//! pass has to fetch them one by one. A relist (`Init` to `InitDone`) fills a buffer that
//! replaces the store when it ends: the slices of Services removed meanwhile are dropped from it
//! again then, and the Services added meanwhile fetched again.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kuport_core::api::PortMap;
use kuport_core::snapshot::SERVICE_NAME_LABEL;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::config::jitter_seed_for;
use super::watch::{Watch, passes, watch_backoff};

/// Slices per page of the slice watch's list. Every slice of the cluster passes through a page,
/// decoded whole before those of Services no PortMap refers to are dropped, and a slice may
/// list 1,000 endpoints (about 340 KB of JSON): 10 keeps a page near 3.4 MB and its decoded
/// endpoints near as much, where the other watches' 50 measured 76 MiB more peak RSS with
/// 100 MB of unrelated slices (`docs/performance.md`). A relist of 10,000 slices takes 1,000
/// requests (served from etcd unless the API server's list snapshots are on); relists are rare:
/// a watch resumes from its resource version.
const SLICE_PAGE_SIZE: u32 = 10;
use crate::agent::relevance::{ServiceKey, Services, referred_services};
use crate::agent::slice_decode::LeanSlice;

/// The metrics' name of the kind.
const KIND: &str = "EndpointSlice";
/// First delay before a failed fetch is tried again; it doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The Services whose slices the agent keeps, shared by the watch's task (which alone changes
/// them) and the passes (which ask it to).
#[derive(Clone, Debug, Default)]
struct Kept(Arc<Mutex<Services>>);

impl Kept {
    fn lock(&self) -> std::sync::MutexGuard<'_, Services> {
        // Every change is one insert or remove: a panic cannot leave the set half-changed.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A pass's request: Services to add (their slices fetched) and to remove (their slices
/// dropped); `done` answers once the fetches ended.
struct Follow {
    add: Vec<ServiceKey>,
    remove: Vec<ServiceKey>,
    done: oneshot::Sender<()>,
}

/// Lists every slice of one Service (namespace, name): the API server, or a test's.
type Lister = Arc<
    dyn Fn(String, String) -> BoxFuture<'static, Result<Vec<EndpointSlice>, String>> + Send + Sync,
>;

/// The slice watch as a pass sees it.
pub(super) struct Slices {
    pub(super) store: Store<EndpointSlice>,
    kept: Kept,
    requests: mpsc::Sender<Follow>,
    portmaps_known: watch::Sender<bool>,
}

impl Slices {
    /// Lets the watch list the slices: the PortMap store has synced. Told by the one task
    /// waiting for the stores to sync rather than waited for here, since a store's
    /// `wait_until_ready` wakes only the last of two tasks waiting on it at once.
    pub(super) fn portmaps_synced(&self) {
        self.portmaps_known.send_replace(true);
    }

    /// Makes the store keep the slices of exactly the Services `portmaps` refer to before a pass
    /// reads it: removes the others, and adds the new ones, waiting up to `wait` for their
    /// slices to be fetched (a pass that waited longer plans without them; the fetch marks the
    /// node dirty when it lands).
    pub(super) async fn follow(&self, portmaps: &[PortMap], wait: Duration) {
        let wanted = referred_services(portmaps);
        let (add, remove) = self.kept.lock().changes_to(&wanted);
        if add.is_empty() && remove.is_empty() {
            return;
        }
        let (done, answered) = oneshot::channel();
        let adding = add.len();
        if self
            .requests
            .send(Follow { add, remove, done })
            .await
            .is_err()
        {
            return;
        }
        if tokio::time::timeout(wait, answered).await.is_err() {
            tracing::warn!(
                services = adding,
                "fetching the EndpointSlices of Services a PortMap came to refer to took over {wait:?}: this pass plans without them, the next one follows when they land"
            );
        }
    }
}

/// Starts the slice watch; its first list waits for [`Slices::portmaps_synced`].
pub(super) fn start(
    client: &kube::Client,
    watch: &Watch,
    portmaps: Store<PortMap>,
) -> (Slices, JoinHandle<()>) {
    let (store, writer) = reflector::store();
    let (requests, received) = mpsc::channel(4);
    let kept = Kept::default();
    let (lister_client, timeout) = (client.clone(), watch.api_timeout);
    let lister: Lister = Arc::new(move |namespace, name| {
        let client = lister_client.clone();
        Box::pin(async move { list_service(client, timeout, &namespace, &name).await })
    });
    let task = SliceTask::new(writer, kept.clone(), watch.clone(), lister);
    let (portmaps_known, known) = watch::channel(false);
    let api: Api<LeanSlice> = Api::all(client.clone());
    let handle = tokio::spawn(task.run(api, received, portmaps, known));
    let slices = Slices {
        store,
        kept,
        requests,
        portmaps_known,
    };
    (slices, handle)
}

/// The task owning the store, the kept Services and the fetches.
struct SliceTask {
    lister: Lister,
    writer: Writer<EndpointSlice>,
    store: Store<EndpointSlice>,
    kept: Kept,
    watch: Watch,
    /// A relist is under way: what it lists goes to a buffer that replaces the store at its end.
    relisting: bool,
    /// Services added during a relist, fetched again once it ends.
    added_while_relisting: Vec<ServiceKey>,
    /// Services whose fetch failed, tried again at `retry`.
    unfetched: BTreeSet<ServiceKey>,
    retry: Option<Instant>,
    backoff: Duration,
}

impl SliceTask {
    fn new(writer: Writer<EndpointSlice>, kept: Kept, watch: Watch, lister: Lister) -> Self {
        Self {
            lister,
            store: writer.as_reader(),
            writer,
            kept,
            watch,
            relisting: false,
            added_while_relisting: Vec::new(),
            unfetched: BTreeSet::new(),
            retry: None,
            backoff: RETRY_MIN,
        }
    }

    async fn run(
        mut self,
        api: Api<LeanSlice>,
        mut requests: mpsc::Receiver<Follow>,
        portmaps: Store<PortMap>,
        mut known: watch::Receiver<bool>,
    ) {
        // The first list keeps the slices of the Services referred to once the PortMaps are
        // known, instead of the first pass fetching each Service's.
        if known.wait_for(|known| *known).await.is_err() {
            return;
        }
        *self.kept.lock() = Services::of(portmaps.state().iter().map(AsRef::as_ref));
        let stream = watcher(api, watcher::Config::default().page_size(SLICE_PAGE_SIZE)).backoff(
            watch_backoff(self.watch.jitter_seed ^ jitter_seed_for(KIND)),
        );
        let mut stream = std::pin::pin!(stream);
        loop {
            // Biased: a pass waits on its request, and the watch's events queue meanwhile.
            tokio::select! {
                biased;
                Some(follow) = requests.recv() => self.follow(follow).await,
                () = sleep_until(self.retry) => self.retry().await,
                event = stream.next() => match event {
                    Some(Ok(event)) => self.on_event(event).await,
                    Some(Err(e)) => tracing::warn!("watching {KIND}: {e}"),
                    None => return,
                },
            }
        }
    }

    /// One watch event: kept, judged and applied when it concerns a kept Service, dropped
    /// otherwise.
    async fn on_event(&mut self, event: watcher::Event<LeanSlice>) {
        use watcher::Event;
        let event = match event {
            Event::Apply(s) => self.kept_or_gone(s.0),
            Event::InitApply(s) => self.kept_slice(&s.0).then_some(Event::InitApply(s.0)),
            Event::Delete(s) => self.held(&s.0).then_some(Event::Delete(s.0)),
            Event::Init => {
                self.relisting = true;
                Some(Event::Init)
            }
            Event::InitDone => Some(Event::InitDone),
        };
        let Some(event) = event else {
            self.watch.metrics.record_watch_event(KIND, false);
            return;
        };
        let pass = passes(&event, &self.store, &self.watch.wanted);
        self.writer.apply_watcher_event(&event);
        self.watch.metrics.record_watch_event(KIND, pass);
        self.record_kept();
        if pass {
            self.mark_dirty();
        }
        if matches!(event, Event::InitDone) {
            self.relist_done().await;
        }
    }

    /// A slice added or changed: kept when its Service is; when it is not but the store holds
    /// the slice (its label moved it to another Service), the store lets it go.
    fn kept_or_gone(&self, slice: EndpointSlice) -> Option<watcher::Event<EndpointSlice>> {
        if self.kept_slice(&slice) {
            return Some(watcher::Event::Apply(slice));
        }
        let held = self.store.get(&ObjectRef::from_obj(&slice))?;
        Some(watcher::Event::Delete(held.as_ref().clone()))
    }

    fn held(&self, slice: &EndpointSlice) -> bool {
        self.store.get(&ObjectRef::from_obj(slice)).is_some()
    }

    fn kept_slice(&self, slice: &EndpointSlice) -> bool {
        self.kept.lock().holds(slice)
    }

    /// A pass's request: the Services added and removed, the slices of the removed dropped,
    /// those of the added fetched.
    async fn follow(&mut self, follow: Follow) {
        {
            let mut kept = self.kept.lock();
            for (ns, name) in &follow.remove {
                kept.remove(ns, name);
            }
            for (ns, name) in &follow.add {
                kept.insert(ns, name);
            }
        }
        if !follow.remove.is_empty() {
            self.drop_unkept();
        }
        if self.relisting {
            self.added_while_relisting
                .extend(follow.add.iter().cloned());
        }
        let fetched = self.fetch(follow.add).await;
        // The pass that asked reads the store once answered; one that stopped waiting does not.
        if follow.done.send(()).is_err() && fetched > 0 {
            self.mark_dirty();
        }
    }

    /// A relist ended: its buffer, now the store, may hold slices of Services removed while it
    /// ran, and lacks what the fetches of Services added meanwhile put in the store it replaced.
    async fn relist_done(&mut self) {
        self.relisting = false;
        self.drop_unkept();
        let again = std::mem::take(&mut self.added_while_relisting);
        if self.fetch(again).await > 0 {
            self.mark_dirty();
        }
    }

    async fn retry(&mut self) {
        self.retry = None;
        let services = std::mem::take(&mut self.unfetched);
        if self.fetch(services.into_iter().collect()).await > 0 {
            self.mark_dirty();
        }
    }

    /// Drops every stored slice of a Service no longer kept.
    fn drop_unkept(&mut self) {
        let kept = self.kept.lock().clone();
        for slice in self.store.state() {
            if !kept.holds(&slice) {
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete(slice.as_ref().clone()));
            }
        }
        self.record_kept();
    }

    /// Fetches the slices of `services` (those still kept) into the store; returns how many it
    /// stored. A Service whose fetch fails is tried again after a backoff.
    async fn fetch(&mut self, services: Vec<ServiceKey>) -> usize {
        let mut stored = 0;
        let mut failed = false;
        for (namespace, name) in services {
            if !self.kept.lock().contains(&namespace, &name) {
                continue;
            }
            match (self.lister)(namespace.clone(), name.clone()).await {
                Ok(slices) => {
                    self.watch.metrics.record_slice_fetch(true);
                    stored += slices.len();
                    for slice in slices {
                        self.writer
                            .apply_watcher_event(&watcher::Event::Apply(slice));
                    }
                }
                Err(e) => {
                    self.watch.metrics.record_slice_fetch(false);
                    tracing::warn!(
                        "fetching the EndpointSlices of Service {namespace}/{name}: {e}; trying again in {:?}",
                        self.backoff
                    );
                    self.unfetched.insert((namespace, name));
                    failed = true;
                }
            }
        }
        self.record_kept();
        if failed {
            self.retry = Some(Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(RETRY_MAX);
        } else if self.unfetched.is_empty() {
            self.backoff = RETRY_MIN;
        }
        stored
    }

    fn record_kept(&self) {
        self.watch
            .metrics
            .set_slices_kept(self.store.len(), self.kept.lock().len());
    }

    fn mark_dirty(&self) {
        // Full means a pass is already due.
        let _ = self.watch.dirty.try_send(());
    }
}

/// Every slice of Service `namespace/name`, page by page, each request given `timeout`.
async fn list_service(
    client: kube::Client,
    timeout: Duration,
    namespace: &str,
    name: &str,
) -> Result<Vec<EndpointSlice>, String> {
    // A name no label value can be is on no slice (and would make the selector invalid).
    if !is_label_value(name) {
        return Ok(Vec::new());
    }
    let api: Api<LeanSlice> = Api::namespaced(client, namespace);
    let mut params = ListParams::default()
        .labels(&format!("{SERVICE_NAME_LABEL}={name}"))
        .limit(SLICE_PAGE_SIZE);
    let mut slices = Vec::new();
    loop {
        let page = tokio::time::timeout(timeout, api.list(&params))
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
            .map_err(|e| e.to_string())?;
        slices.extend(page.items.into_iter().map(|s| s.0));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(slices),
        }
    }
}

/// Whether `value` can be a label value: at most 63 characters, alphanumerics, `-`, `_` and
/// `.`, beginning and ending with an alphanumeric (or empty).
fn is_label_value(value: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    value.is_empty()
        || (value.len() <= 63
            && alnum(value.chars().next())
            && alnum(value.chars().last())
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kuport_testkit::objects::{endpoint, slice};

    use super::*;
    use crate::agent::metrics::Metrics;
    use crate::agent::relevance::Wanted;

    /// What the test's API server answers a fetch of each Service with.
    type Answers = Arc<Mutex<BTreeMap<String, Result<Vec<EndpointSlice>, String>>>>;

    struct Harness {
        task: SliceTask,
        dirty: mpsc::Receiver<()>,
        answers: Answers,
    }

    /// The task keeping the slices of `kept` (Services of namespace `games`), its fetches
    /// answered from [`Harness::answers`].
    fn harness(kept: &[&str]) -> Harness {
        let (_, writer) = reflector::store::<EndpointSlice>();
        let (dirty_tx, dirty) = mpsc::channel(1);
        let watch = Watch {
            node: "n1".into(),
            dirty: dirty_tx,
            wanted: Wanted::default(),
            metrics: Arc::new(Metrics::new()),
            jitter_seed: 0,
            api_timeout: Duration::from_secs(1),
        };
        let answers = Answers::default();
        let from = answers.clone();
        let lister: Lister = Arc::new(move |namespace, name| {
            let answer = from
                .lock()
                .expect("lock")
                .get(&format!("{namespace}/{name}"))
                .cloned()
                .unwrap_or(Ok(Vec::new()));
            Box::pin(async move { answer })
        });
        let set = Kept::default();
        for name in kept {
            set.lock().insert("games", name);
        }
        Harness {
            task: SliceTask::new(writer, set, watch, lister),
            dirty,
            answers,
        }
    }

    /// Slice `name` of Service `games/<service>` at `version`, its one endpoint on `node`.
    fn of(service: &str, name: &str, version: &str, node: &str) -> EndpointSlice {
        let mut s: EndpointSlice = serde_json::from_value(
            slice("games", name, service)
                .port("game", "UDP", 3000)
                .endpoint(endpoint("10.244.1.5", node).ready(true))
                .object(),
        )
        .expect("slice");
        s.metadata.resource_version = Some(version.to_owned());
        s
    }

    impl Harness {
        async fn event(&mut self, event: watcher::Event<EndpointSlice>) {
            self.task.on_event(event.map(LeanSlice)).await;
        }

        async fn follow(&mut self, add: &[&str], remove: &[&str]) {
            let key = |n: &&str| ("games".to_owned(), (*n).to_owned());
            let (done, answered) = oneshot::channel();
            self.task
                .follow(Follow {
                    add: add.iter().map(key).collect(),
                    remove: remove.iter().map(key).collect(),
                    done,
                })
                .await;
            answered.await.expect("answered");
        }

        fn answer(&self, service: &str, answer: Result<Vec<EndpointSlice>, String>) {
            self.answers
                .lock()
                .expect("lock")
                .insert(format!("games/{service}"), answer);
        }

        /// The store: each slice's name, version and node.
        fn stored(&self) -> Vec<(String, String, String)> {
            let mut v: Vec<_> = self
                .task
                .store
                .state()
                .iter()
                .map(|s| {
                    let node = s
                        .endpoints
                        .iter()
                        .flatten()
                        .find_map(|e| e.node_name.clone());
                    (
                        s.metadata.name.clone().unwrap_or_default(),
                        s.metadata.resource_version.clone().unwrap_or_default(),
                        node.unwrap_or_default(),
                    )
                })
                .collect();
            v.sort();
            v
        }

        fn dirty(&mut self) -> bool {
            let mut any = false;
            while self.dirty.try_recv().is_ok() {
                any = true;
            }
            any
        }
    }

    fn row(name: &str, version: &str, node: &str) -> (String, String, String) {
        (name.to_owned(), version.to_owned(), node.to_owned())
    }

    trait MapEvent {
        fn map(self, f: impl Fn(EndpointSlice) -> LeanSlice) -> watcher::Event<LeanSlice>;
    }

    impl MapEvent for watcher::Event<EndpointSlice> {
        fn map(self, f: impl Fn(EndpointSlice) -> LeanSlice) -> watcher::Event<LeanSlice> {
            use watcher::Event::*;
            match self {
                Apply(s) => Apply(f(s)),
                Delete(s) => Delete(f(s)),
                InitApply(s) => InitApply(f(s)),
                Init => Init,
                InitDone => InitDone,
            }
        }
    }

    #[test]
    fn label_values() {
        for ok in ["", "gs", "game-server.v2", "a_b", &"x".repeat(63)] {
            assert!(is_label_value(ok), "{ok:?}");
        }
        for bad in ["-gs", "gs-", "a,b", "a=b", "a b", &"x".repeat(64), "é"] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_slice_of_a_service_not_kept_is_dropped_and_one_that_moves_away_leaves() {
        use watcher::Event::*;
        let mut h = harness(&["gs"]);
        h.event(Apply(of("lobby", "lobby-0", "5", "n2"))).await;
        assert_eq!(h.stored(), []);
        assert!(!h.dirty(), "no pass for a slice not kept");
        h.event(Apply(of("gs", "gs-0", "6", "n2"))).await;
        assert_eq!(h.stored(), [row("gs-0", "6", "n2")]);
        assert!(h.dirty());
        // Relabelled to a Service not kept: the slice leaves the store, and a pass follows.
        h.event(Apply(of("lobby", "gs-0", "7", "n2"))).await;
        assert_eq!(h.stored(), []);
        assert!(h.dirty());
        // A deletion of a slice not held changes nothing.
        h.event(Delete(of("lobby", "lobby-0", "8", "n2"))).await;
        assert!(!h.dirty());
        let m = &h.task.watch.metrics;
        assert_eq!(
            (m.watch_events(KIND, false), m.watch_events(KIND, true)),
            (2, 2)
        );
    }

    #[tokio::test]
    async fn a_service_added_is_fetched_and_late_events_end_at_the_newest() {
        use watcher::Event::*;
        let mut h = harness(&[]);
        h.event(Apply(of("lobby", "lobby-0", "3", "n1"))).await;
        assert_eq!(h.stored(), []);
        // The API server holds the slice at version 5 by the time the Service is added; the
        // watch still has versions 4 and 5 to deliver.
        h.answer("lobby", Ok(vec![of("lobby", "lobby-0", "5", "n3")]));
        h.follow(&["lobby"], &[]).await;
        assert_eq!(h.stored(), [row("lobby-0", "5", "n3")]);
        assert!(!h.dirty(), "the pass that asked reads the store itself");
        h.event(Apply(of("lobby", "lobby-0", "4", "n2"))).await;
        h.event(Apply(of("lobby", "lobby-0", "5", "n3"))).await;
        assert_eq!(h.stored(), [row("lobby-0", "5", "n3")]);
        // Removed: its slices go, and the next events of them are dropped.
        h.follow(&[], &["lobby"]).await;
        assert_eq!(h.stored(), []);
        h.event(Apply(of("lobby", "lobby-0", "6", "n3"))).await;
        assert_eq!(h.stored(), []);
        assert_eq!(h.task.watch.metrics.endpoint_slice_fetches(true), 1);
    }

    #[tokio::test]
    async fn a_fetch_that_fails_is_tried_again_and_marks_the_node_dirty() {
        let mut h = harness(&[]);
        h.answer("lobby", Err("the server is busy".into()));
        h.follow(&["lobby"], &[]).await;
        assert_eq!(h.stored(), []);
        let first = h.task.retry.expect("a retry is due");
        assert!(first > Instant::now(), "after a backoff");
        h.answer("lobby", Ok(vec![of("lobby", "lobby-0", "5", "n3")]));
        h.task.retry().await;
        assert_eq!(h.stored(), [row("lobby-0", "5", "n3")]);
        assert!(h.dirty(), "nobody waited for the retry: a pass is due");
        assert_eq!(h.task.retry, None);
        let m = &h.task.watch.metrics;
        assert_eq!(
            (
                m.endpoint_slice_fetches(true),
                m.endpoint_slice_fetches(false)
            ),
            (1, 1)
        );
        // A Service removed before its retry is not fetched.
        h.answer("gone", Err("busy".into()));
        h.follow(&["gone"], &[]).await;
        h.follow(&[], &["gone"]).await;
        h.answer("gone", Ok(vec![of("gone", "gone-0", "1", "n1")]));
        h.task.retry().await;
        assert_eq!(h.stored(), [row("lobby-0", "5", "n3")]);
    }

    /// A relist fills a buffer that replaces the store at its end: a Service removed while it
    /// ran leaves nothing in it, and one added while it ran has its slices again after it.
    #[tokio::test]
    async fn services_changed_during_a_relist_are_right_after_it() {
        use watcher::Event::*;
        let mut h = harness(&["gs", "old"]);
        h.event(Apply(of("gs", "gs-0", "1", "n1"))).await;
        h.event(Apply(of("old", "old-0", "2", "n1"))).await;
        h.event(Init).await;
        h.event(InitApply(of("gs", "gs-0", "1", "n1"))).await;
        h.event(InitApply(of("old", "old-0", "2", "n1"))).await;
        // Listed before its Service is added: dropped.
        h.event(InitApply(of("lobby", "lobby-0", "3", "n2"))).await;
        h.answer("lobby", Ok(vec![of("lobby", "lobby-0", "3", "n2")]));
        h.follow(&["lobby"], &["old"]).await;
        assert_eq!(
            h.stored(),
            [row("gs-0", "1", "n1"), row("lobby-0", "3", "n2")]
        );
        h.event(InitApply(of("lobby", "lobby-1", "4", "n3"))).await;
        h.event(InitDone).await;
        assert_eq!(
            h.stored(),
            [
                row("gs-0", "1", "n1"),
                row("lobby-0", "3", "n2"),
                row("lobby-1", "4", "n3"),
            ]
        );
        assert!(!h.task.relisting);
        assert_eq!(h.task.watch.metrics.endpoint_slice_fetches(true), 2);
    }
}
