//! Publishing an Event as `events.k8s.io/v1` does it: the first occurrence is created, and a
//! repeat within [`SERIES_WINDOW`] updates that Event's `series` (`count`,
//! `lastObservedTime`) and note instead of creating another (the core `v1` view shows them as
//! `count` and `lastTimestamp`). Repeats merged while waiting ([`super::fair`]) are counted
//! too. One request per Event either way.

use std::collections::BTreeMap;

use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kuport_core::text::cut_bytes;
use serde_json::json;

use super::fair::{EventKey, Waiting};
use super::{NOTE_MAX_BYTES, REASON_MAX_BYTES};

/// How long after its last occurrence an Event still takes repeats: Kubernetes' own
/// `events.k8s.io` recorders use six minutes.
pub(crate) const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// Series remembered at most (the oldest are forgotten first: a repeat then starts a new one).
const SERIES_KEPT: usize = 4096;

/// An Event published, to count its repeats on.
#[derive(Clone, Debug)]
struct Published {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

/// How a publish went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// A new Event.
    Created,
    /// A repeat: the Event's series now counts this many.
    Counted(i32),
}

/// The publisher of one agent's Events.
pub(crate) struct SeriesRecorder {
    client: kube::Client,
    controller: String,
    instance: String,
    published: BTreeMap<EventKey, Published>,
}

impl SeriesRecorder {
    pub fn new(client: kube::Client, controller: &str, instance: String) -> Self {
        Self {
            client,
            controller: controller.to_owned(),
            instance,
            published: BTreeMap::new(),
        }
    }

    /// Publishes `waiting` at `now`: a repeat of an Event published within the window counts
    /// on it, anything else is a new Event. A repeat whose Event is gone (deleted, expired) is
    /// created again.
    pub async fn publish(
        &mut self,
        waiting: &Waiting,
        now: Timestamp,
    ) -> Result<Recorded, kube::Error> {
        self.forget_old(now);
        let occurred = i32::try_from(waiting.count).unwrap_or(i32::MAX);
        if let Some(p) = self.published.get(&waiting.key).cloned() {
            let count = p.count.saturating_add(occurred);
            let api: Api<Event> = Api::namespaced(self.client.clone(), &p.namespace);
            let patch = json!({
                "series": series(count, now),
                "note": note_of(waiting),
            });
            match api
                .patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.published.insert(
                        waiting.key.clone(),
                        Published {
                            count,
                            last: now,
                            ..p
                        },
                    );
                    return Ok(Recorded::Counted(count));
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {
                    self.published.remove(&waiting.key);
                }
                Err(e) => return Err(e),
            }
        }
        let event = event_of(waiting, &self.controller, &self.instance, now);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let name = event.metadata.name.clone().unwrap_or_default();
        Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await?;
        self.published.insert(
            waiting.key.clone(),
            Published {
                namespace,
                name,
                count: occurred.max(1),
                last: now,
            },
        );
        Ok(Recorded::Created)
    }

    /// Forgets the series past their window, and the oldest past [`SERIES_KEPT`].
    fn forget_old(&mut self, now: Timestamp) {
        self.published.retain(|_, p| p.last + SERIES_WINDOW > now);
        while self.published.len() >= SERIES_KEPT {
            let oldest = self
                .published
                .iter()
                .min_by_key(|(_, p)| p.last)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.published.remove(&k),
                None => break,
            };
        }
    }
}

fn series(count: i32, now: Timestamp) -> EventSeries {
    EventSeries {
        count,
        last_observed_time: MicroTime(now),
    }
}

/// Longest name of an object (a DNS subdomain).
const NAME_MAX_BYTES: usize = 253;

/// `<object>.<nanoseconds in hex>`, the head cut so the whole is a name the API server takes
/// (an object's own name may already be the longest allowed) and ending in a letter or digit.
fn event_name(object: Option<&str>, controller: &str, now: Timestamp) -> String {
    let tail = format!(".{:x}", now.as_nanosecond());
    let head = object.unwrap_or(controller);
    let head = head.get(..NAME_MAX_BYTES - tail.len()).unwrap_or(head);
    let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    let head = if head.is_empty() { controller } else { head };
    format!("{head}{tail}")
}

/// The note, cut to what the API server takes (a note over the limit would lose the Event).
pub(crate) fn note_of(waiting: &Waiting) -> String {
    cut_bytes(&waiting.event.note, NOTE_MAX_BYTES).into_owned()
}

/// The Event of `waiting`, first observed `now` (cluster-scoped objects' Events go to
/// `default`, as the API server expects), with a series when repeats were merged.
pub(crate) fn event_of(
    waiting: &Waiting,
    controller: &str,
    instance: &str,
    now: Timestamp,
) -> Event {
    let ev = &waiting.event;
    let namespace = ev
        .regarding
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let count = i32::try_from(waiting.count).unwrap_or(i32::MAX);
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(ev.regarding.name.as_deref(), controller, now)),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        series: (count >= 2).then(|| series(count, now)),
        reason: Some(cut_bytes(&ev.reason, REASON_MAX_BYTES).into_owned()),
        note: Some(note_of(waiting)),
        type_: Some(if ev.warning { "Warning" } else { "Normal" }.to_owned()),
        action: Some(ev.action.to_owned()),
        regarding: Some(ev.regarding.clone()),
        reporting_controller: Some(controller.to_owned()),
        reporting_instance: Some(instance.to_owned()),
        ..Event::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kuport_core::text::CUT_MARK;
    use tokio::time::Instant;

    use super::super::PendingEvent;
    use super::*;

    fn waiting(name: &str, reason: &str, note: &str, count: u32) -> Waiting {
        let event = PendingEvent {
            regarding: ObjectReference {
                name: Some(name.to_owned()),
                namespace: Some("games".to_owned()),
                ..ObjectReference::default()
            },
            warning: true,
            reason: reason.to_owned(),
            note: note.to_owned(),
            action: "UpdateStatus",
        };
        Waiting {
            key: EventKey::of(&event),
            event,
            count,
            raised: Instant::now(),
            attempts: 0,
            not_before: Instant::now(),
        }
    }

    #[test]
    fn notes_reasons_and_names_are_cut_to_what_the_api_server_takes() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().expect("a time");
        // A kernel's words repeated, with multi-byte characters straddling the limit.
        let long = "nft: Error: «could not process rule» ".repeat(100);
        assert!(long.len() > NOTE_MAX_BYTES);
        let name = format!("{}-x", "a".repeat(250));
        let event = event_of(&waiting(&name, &"R".repeat(300), &long, 1), "c", "i", now);
        let note = event.note.expect("a note");
        assert!(note.len() <= NOTE_MAX_BYTES, "{} bytes", note.len());
        assert!(note.len() > NOTE_MAX_BYTES - 4, "the cut wastes room");
        assert!(note.ends_with(CUT_MARK) && long.starts_with(note.trim_end_matches(CUT_MARK)));
        assert!(event.reason.expect("a reason").len() <= REASON_MAX_BYTES);
        let event_name = event.metadata.name.expect("a name");
        assert!(event_name.len() <= NAME_MAX_BYTES, "{event_name}");
        assert!(event_name.starts_with("aaaa"), "{event_name}");
        assert!(event.series.is_none(), "one occurrence is no series");
        // What fits is published as it is; repeats merged while waiting are a series.
        let event = event_of(
            &waiting("gs", "PortInUse", "port 22 is held by sshd", 3),
            "c",
            "i",
            now,
        );
        assert_eq!(event.note.as_deref(), Some("port 22 is held by sshd"));
        assert_eq!(event.reason.as_deref(), Some("PortInUse"));
        assert_eq!(event.series.map(|s| s.count), Some(3));
        assert!(event.metadata.name.expect("a name").starts_with("gs."));
    }
}
