//! Kubernetes Events (events.k8s.io/v1) on condition flips, published off the pass.
//!
//! A pass only queues an event (`try_send`): a slow or unreachable API server must never hold a
//! pass back, so a full queue drops the event. A token bucket bounds how many events one agent
//! publishes, so a flapping mapping cannot flood the API server.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kuport_core::text::{CUT_MARK, cut_bytes, short_hash};
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
/// The API server refuses an Event whose note is longer than this many bytes (and the whole
/// Event with it), so notes are cut to fit.
pub(crate) const NOTE_MAX_BYTES: usize = 1024;
/// The longest reason and reporting instance the API server takes.
pub(crate) const REASON_MAX_BYTES: usize = 128;
const INSTANCE_MAX_BYTES: usize = 128;

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
            instance: Some(reporting_instance(node)),
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
        let event = event_of(&ev);
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

/// The Event to publish, its strings cut to what the API server takes: a condition message
/// can carry a kernel's words or a long list of nodes, and a note over the limit would lose the
/// whole Event.
fn event_of(ev: &PendingEvent) -> Event {
    Event {
        type_: if ev.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: cut_bytes(&ev.reason, REASON_MAX_BYTES).into_owned(),
        note: Some(cut_bytes(&ev.note, NOTE_MAX_BYTES).into_owned()),
        action: ev.action.to_owned(),
        secondary: None,
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
    use super::*;

    fn pending(reason: &str, note: &str) -> PendingEvent {
        PendingEvent {
            regarding: ObjectReference::default(),
            warning: true,
            reason: reason.to_owned(),
            note: note.to_owned(),
            action: "Program",
        }
    }

    #[test]
    fn notes_and_reasons_are_cut_to_what_the_api_server_takes() {
        // A kernel's words repeated, with multi-byte characters straddling the limit.
        let long = "nft: Error: «could not process rule» ".repeat(100);
        assert!(long.len() > NOTE_MAX_BYTES);
        let event = event_of(&pending(&"R".repeat(300), &long));
        let note = event.note.expect("a note");
        assert!(note.len() <= NOTE_MAX_BYTES, "{} bytes", note.len());
        assert!(note.len() > NOTE_MAX_BYTES - 4, "the cut wastes room");
        assert!(note.ends_with(CUT_MARK) && long.starts_with(note.trim_end_matches(CUT_MARK)));
        assert!(event.reason.len() <= REASON_MAX_BYTES);
        // What fits is published as it is.
        let event = event_of(&pending("PortInUse", "port 22 is held by sshd"));
        assert_eq!(event.note.as_deref(), Some("port 22 is held by sshd"));
        assert_eq!(event.reason, "PortInUse");
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
}
