//! Kubernetes Events (events.k8s.io/v1) on condition flips, published off the pass.
//!
//! A pass only queues an Event: a slow or unreachable API server must never hold a pass back.
//! The queue ([`fair`]) shares the agent's Event budget between tenants (the namespaces of the
//! objects the Events regard) in turn, merges repeats, and keeps a Warning whose publishing
//! failed for another try; the publisher ([`series`]) counts repeats on one Event, as
//! Kubernetes' own recorders do. No tenant can use up another's turn, so one tenant's flapping
//! mappings cannot silence another's refusal.

mod fair;
mod series;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kuport_core::text::{CUT_MARK, cut_bytes, short_hash};
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::fair::{FairQueue, Next, Pushed, Waiting};
use self::series::{Recorded, SeriesRecorder};
use super::metrics::Metrics;

/// How long one publish may take before it is abandoned.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// The API server refuses an Event whose note is longer than this many bytes (and the whole
/// Event with it), so notes are cut to fit.
pub(crate) const NOTE_MAX_BYTES: usize = 1024;
/// The longest reason and reporting instance the API server takes.
pub(crate) const REASON_MAX_BYTES: usize = 128;
const INSTANCE_MAX_BYTES: usize = 128;
/// How often the Events dropped are reported in the log, per tenant.
const DROP_REPORT: Duration = Duration::from_secs(60);
/// The reporting controller of every Event.
const CONTROLLER: &str = "kuport-agent";

/// One event to publish.
#[derive(Clone, Debug)]
pub(crate) struct PendingEvent {
    pub regarding: ObjectReference,
    pub warning: bool,
    pub reason: String,
    pub note: String,
    pub action: &'static str,
}

/// What the pass side and the publisher share: the Events waiting.
#[derive(Debug)]
struct Shared {
    queue: Mutex<FairQueue>,
    metrics: Arc<Metrics>,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, FairQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The queue a pass hands events to.
#[derive(Clone, Debug)]
pub(crate) struct EventSink {
    shared: Arc<Shared>,
    /// Wakes the publisher; when every sink is gone, it stops.
    wake: mpsc::Sender<()>,
}

impl EventSink {
    /// Starts the publisher task; it ends when every sink is dropped.
    pub fn start(client: kube::Client, node: &str, metrics: Arc<Metrics>) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(FairQueue::new(Instant::now())),
            metrics,
        });
        // Capacity 1: a full channel already means "look again".
        let (wake, woken) = mpsc::channel(1);
        let recorder = SeriesRecorder::new(client, CONTROLLER, reporting_instance(node));
        tokio::spawn(publish_loop(recorder, shared.clone(), woken));
        Self { shared, wake }
    }

    /// Queues an event without waiting.
    pub fn emit(&self, event: PendingEvent) {
        let pushed = self.shared.queue().push(event, Instant::now());
        match pushed {
            Pushed::Queued => {}
            Pushed::Merged => self.shared.metrics.record_event("aggregated"),
            Pushed::Dropped { .. } => self.shared.metrics.record_event("dropped"),
        }
        let _ = self.wake.try_send(());
    }
}

/// Publishes the Events waiting, in the queue's order, as the budget allows; tries a failed
/// Warning again later; says in the log, once a minute per tenant, whose Events were dropped.
async fn publish_loop(
    mut recorder: SeriesRecorder,
    shared: Arc<Shared>,
    mut woken: mpsc::Receiver<()>,
) {
    let mut reported = Instant::now();
    loop {
        let next = shared.queue().next(Instant::now());
        match next {
            Next::Publish(waiting) => publish(&mut recorder, &shared, *waiting).await,
            Next::At(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    woke = woken.recv() => if woke.is_none() { return },
                }
            }
            Next::Idle => {
                if woken.recv().await.is_none() {
                    return;
                }
            }
        }
        if reported.elapsed() >= DROP_REPORT {
            reported = Instant::now();
            report_drops(shared.queue().take_drops());
        }
    }
}

/// Publishes one Event; a Warning that failed for a reason that may pass goes back in line.
async fn publish(recorder: &mut SeriesRecorder, shared: &Shared, waiting: Waiting) {
    let what = describe(&waiting.event.regarding);
    let reason = waiting.event.reason.clone();
    let result = tokio::time::timeout(
        PUBLISH_TIMEOUT,
        recorder.publish(&waiting, Timestamp::now()),
    )
    .await;
    let error = match result {
        Ok(Ok(Recorded::Created)) => {
            shared.metrics.record_event("published");
            return;
        }
        Ok(Ok(Recorded::Counted(_))) => {
            shared.metrics.record_event("aggregated");
            return;
        }
        Ok(Err(e)) => {
            let lasting = matches!(&e, kube::Error::Api(s) if s.code == 400 || s.code == 422);
            (e.to_string(), !lasting)
        }
        Err(_) => (format!("no answer within {PUBLISH_TIMEOUT:?}"), true),
    };
    shared.metrics.record_event("failed");
    let (why, passing) = error;
    let retried = waiting.event.warning && passing && shared.queue().retry(waiting, Instant::now());
    let then = if retried {
        "; it is tried again later"
    } else {
        ""
    };
    tracing::warn!("publishing event {reason} on {what}: {why}{then}");
}

/// One warning per tenant whose Events were dropped since the last report.
fn report_drops(drops: BTreeMap<String, u64>) {
    const WHY: &str = "it raised Events faster than its share of this agent's budget, or they kept failing (its statuses say the same)";
    for (tenant, n) in drops {
        if tenant.is_empty() {
            tracing::warn!(
                tenant = %tenant,
                dropped = n,
                "events of cluster-scoped objects (the classes): {n} dropped: {WHY}"
            );
        } else {
            tracing::warn!(
                tenant = %tenant,
                dropped = n,
                "events of namespace {tenant}: {n} dropped: {WHY}"
            );
        }
    }
}

/// `kuport-agent-<node>`, cut to the API server's limit (a node name may be 253 bytes long)
/// with a short hash of the whole, so two long node names sharing a head stay apart.
fn reporting_instance(node: &str) -> String {
    let full = format!("kuport-agent-{node}");
    if full.len() <= INSTANCE_MAX_BYTES {
        return full;
    }
    // Node names are ASCII (DNS subdomains), so any byte is a boundary; `cut_bytes` keeps it so.
    let hash = short_hash(&full);
    let head = cut_bytes(&full, INSTANCE_MAX_BYTES - hash.len() - 1);
    let head = head.trim_end_matches(CUT_MARK);
    format!("{head}-{hash}")
}

fn describe(r: &ObjectReference) -> String {
    let kind = r.kind.as_deref().unwrap_or("object");
    let name = r.name.as_deref().unwrap_or("?");
    match r.namespace.as_deref() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{Api, ListParams, PostParams};
    use kuport_sim::apiserver::{ApiServer, Failure, RequestFilter};

    use super::*;

    /// The API server model on a loopback port, with the namespaces `namespaces`.
    async fn model(namespaces: &[&str]) -> kube::Client {
        model_and_server(namespaces).await.1
    }

    async fn model_and_server(namespaces: &[&str]) -> (ApiServer, kube::Client) {
        let server = ApiServer::builder().build().expect("model builds");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(server.clone().serve(listener));
        let client =
            kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
        let api: Api<Namespace> = Api::all(client.clone());
        for ns in namespaces {
            let object = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
                .expect("a namespace");
            api.create(&PostParams::default(), &object)
                .await
                .expect("namespace created");
        }
        (server, client)
    }

    fn on(namespace: &str, name: &str, reason: &str, warning: bool) -> PendingEvent {
        PendingEvent {
            regarding: ObjectReference {
                api_version: Some("kuport.wlz.li/v1alpha1".into()),
                kind: Some("PortMap".into()),
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{namespace}-{name}")),
                ..ObjectReference::default()
            },
            warning,
            reason: reason.into(),
            note: format!("{reason} on {namespace}/{name}"),
            action: "UpdateStatus",
        }
    }

    async fn events_in(client: &kube::Client, namespace: &str) -> Vec<Event> {
        Api::<Event>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .expect("Events listed")
            .items
    }

    /// Namespace `flood` toggles 300 mappings (an Event each) and then `quiet`'s mapping is
    /// refused a port: its Warning is published at once, while `flood` waits its turns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_tenants_flood_does_not_silence_anothers_warning() {
        let client = model(&["flood", "quiet"]).await;
        let sink = EventSink::start(client.clone(), "edge-a", Arc::new(Metrics::new()));
        for i in 0..300 {
            sink.emit(on("flood", &format!("pm{i}"), "NoInterfaceOnNode", true));
        }
        sink.emit(on("quiet", "gs", "PortConflict", true));
        kuport_testkit::wait::eventually(
            "quiet's Warning is published",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async { !events_in(&client, "quiet").await.is_empty() },
        )
        .await;
        let quiet = events_in(&client, "quiet").await;
        assert_eq!(quiet.len(), 1);
        assert_eq!(quiet[0].reason.as_deref(), Some("PortConflict"));
        assert_eq!(quiet[0].type_.as_deref(), Some("Warning"));
        // flood got the rest of the burst, no more.
        let flood = events_in(&client, "flood").await.len();
        assert!(flood < 60, "{flood} of flood's Events published at once");
    }

    /// Repeats are one Event with a series: those merged while waiting, and those raised after
    /// it was published, with the newest note.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn repeats_are_counted_on_one_event() {
        let client = model(&["games"]).await;
        let sink = EventSink::start(client.clone(), "edge-a", Arc::new(Metrics::new()));
        sink.emit(on("games", "gs", "ReturnLinkDown", true));
        kuport_testkit::wait::eventually(
            "the first is published",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async { events_in(&client, "games").await.len() == 1 },
        )
        .await;
        for i in 0..4 {
            let mut e = on("games", "gs", "ReturnLinkDown", true);
            e.note = format!("probe {i} lost");
            sink.emit(e);
        }
        kuport_testkit::wait::eventually(
            "the repeats are counted",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async {
                let events = events_in(&client, "games").await;
                events.len() == 1
                    && events[0].series.as_ref().is_some_and(|s| s.count == 5)
                    && events[0].note.as_deref() == Some("probe 3 lost")
            },
        )
        .await;
        // Another reason is another Event.
        sink.emit(on("games", "gs", "AllNodesReady", false));
        kuport_testkit::wait::eventually(
            "another reason is another Event",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async { events_in(&client, "games").await.len() == 2 },
        )
        .await;
    }

    #[test]
    fn the_reporting_instance_fits_for_any_node_name() {
        assert_eq!(reporting_instance("edge-a"), "kuport-agent-edge-a");
        let long = |c: &str| format!("{}.example.com", c.repeat(200));
        let (a, b) = (
            reporting_instance(&long("a")),
            reporting_instance(&long("b")),
        );
        assert!(a.len() <= INSTANCE_MAX_BYTES && b.len() <= INSTANCE_MAX_BYTES);
        let shared_head = format!("{}{}", "a".repeat(100), "b");
        let (c, d) = (
            reporting_instance(&format!("{shared_head}.one")),
            reporting_instance(&format!("{shared_head}.two")),
        );
        assert_ne!(c, d, "two long names with one head stay apart");
        assert!(c.starts_with("kuport-agent-aaaa"), "{c}");
    }

    /// The API server fails the next three Event writes: a Normal Event's (not tried again,
    /// as before) and a Warning's twice; the Warning is published on its third try.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_warning_that_failed_is_published_later() {
        let (server, client) = model_and_server(&["games"]).await;
        let metrics = Arc::new(Metrics::new());
        let sink = EventSink::start(client.clone(), "edge-a", metrics.clone());
        server.faults().fail_next(
            3,
            Failure::InternalError,
            RequestFilter::writes().resource("events"),
        );
        sink.emit(on("games", "lobby", "AllNodesReady", false));
        sink.emit(on("games", "gs", "PortConflict", true));
        kuport_testkit::wait::eventually(
            "the Warning is published after its retries",
            Duration::from_secs(20),
            Duration::from_millis(50),
            || async { !events_in(&client, "games").await.is_empty() },
        )
        .await;
        let events = events_in(&client, "games").await;
        let reasons: Vec<_> = events.iter().map(|e| e.reason.as_deref()).collect();
        assert_eq!(
            reasons,
            [Some("PortConflict")],
            "the Normal one is not tried again"
        );
        assert_eq!(server.faults().injected(), 3);
    }
}
