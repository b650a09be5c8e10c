//! Kubernetes Events (events.k8s.io/v1) on condition flips, published off the pass.
//!
//! A pass only queues an event (`try_send`): a slow or unreachable API server must never hold a
//! pass back, so a full queue drops the event. A token bucket bounds how many events one agent
//! publishes, so a flapping mapping cannot flood the API server.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::metrics::Metrics;

/// How many events may be queued before new ones are dropped.
const QUEUE: usize = 64;
/// Burst size of the rate limit: an agent starting on a node with dozens of mappings reports
/// each one's first conditions and their first flips (a burst of 10 dropped a clash reported
/// seconds after start in the lab).
const BURST: f64 = 50.0;
/// Sustained events per second.
const PER_SECOND: f64 = 5.0;
/// How long one publish may take before it is abandoned.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// One event to publish.
#[derive(Clone, Debug)]
pub(crate) struct PendingEvent {
    pub regarding: ObjectReference,
    pub warning: bool,
    pub reason: String,
    pub note: String,
    pub action: &'static str,
}

/// The queue a pass hands events to.
#[derive(Clone, Debug)]
pub(crate) struct EventSink {
    tx: mpsc::Sender<PendingEvent>,
    metrics: Arc<Metrics>,
}

impl EventSink {
    /// Starts the publisher task; it ends when every sink is dropped.
    pub fn start(client: kube::Client, node: &str, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let reporter = Reporter {
            controller: "kuport-agent".to_owned(),
            instance: Some(format!("kuport-agent-{node}")),
        };
        tokio::spawn(publish_loop(
            Recorder::new(client, reporter),
            rx,
            metrics.clone(),
        ));
        Self { tx, metrics }
    }

    /// Queues an event without waiting.
    pub fn emit(&self, event: PendingEvent) {
        if self.tx.try_send(event).is_err() {
            self.metrics.record_event("dropped");
            tracing::debug!("event queue full: an event was dropped");
        }
    }
}

async fn publish_loop(
    recorder: Recorder,
    mut rx: mpsc::Receiver<PendingEvent>,
    metrics: Arc<Metrics>,
) {
    let mut tokens = BURST;
    let mut refilled = Instant::now();
    while let Some(ev) = rx.recv().await {
        let now = Instant::now();
        tokens = (tokens + now.duration_since(refilled).as_secs_f64() * PER_SECOND).min(BURST);
        refilled = now;
        if tokens < 1.0 {
            metrics.record_event("dropped");
            tracing::debug!(reason = %ev.reason, "event rate limit reached: event dropped");
            continue;
        }
        tokens -= 1.0;
        let object = describe(&ev.regarding);
        let event = Event {
            type_: if ev.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: ev.reason,
            note: Some(ev.note),
            action: ev.action.to_owned(),
            secondary: None,
        };
        match tokio::time::timeout(PUBLISH_TIMEOUT, recorder.publish(&event, &ev.regarding)).await {
            Ok(Ok(())) => metrics.record_event("published"),
            Ok(Err(e)) => {
                metrics.record_event("failed");
                tracing::warn!("publishing event {} on {object}: {e}", event.reason);
            }
            Err(_) => {
                metrics.record_event("failed");
                tracing::warn!(
                    "publishing event {} on {object}: no answer within {PUBLISH_TIMEOUT:?}",
                    event.reason
                );
            }
        }
    }
}

fn describe(r: &ObjectReference) -> String {
    let kind = r.kind.as_deref().unwrap_or("object");
    let name = r.name.as_deref().unwrap_or("?");
    match r.namespace.as_deref() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}
