//! Resources that are views of another resource's storage.
//!
//! The real API server stores Events once, as core `v1` Events, and serves `events.k8s.io/v1`
//! as a conversion of the same objects: an Event written through one group is read, listed and
//! watched through the other (what `kubectl get events` and `kubectl describe` read is the core
//! view, while kube-rs and client-go recorders write the `events.k8s.io` one). The model does
//! the same: a view resource stores under its storage resource's index, and every body crossing
//! the boundary is converted field by field as the upstream conversion does
//! (`k8s.io/kubernetes/pkg/apis/events/v1`).

use serde_json::{Map, Value};

use super::resource::{Conversion, Resource};

/// (`events.k8s.io/v1` field, core `v1` field): the fields whose names differ. Every other
/// field (`metadata`, `eventTime`, `series`, `reason`, `type`, `action`, `related`,
/// `reportingInstance`) has the same name and meaning in both.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename(object: &Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) -> Value {
    let Some(map) = object.as_object() else {
        return object.clone();
    };
    let mut out: Map<String, Value> = map.clone();
    for (from, to) in pairs {
        if let Some(v) = out.remove(from) {
            // A field the other side also sets by its own name keeps that value.
            out.entry(to.to_owned()).or_insert(v);
        }
    }
    Value::Object(out)
}

fn set_type(object: &mut Value, r: &Resource) {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".to_owned(), Value::String(r.api_version()));
        map.insert("kind".to_owned(), Value::String(r.kind.clone()));
    }
}

/// A stored object as `view` serves it.
pub fn to_view(view: &Resource, stored: &Value) -> Value {
    match view.conversion {
        None => stored.clone(),
        Some(Conversion::EventsV1) => {
            let mut out = rename(stored, EVENT_FIELDS.iter().map(|(v, s)| (*s, *v)));
            set_type(&mut out, view);
            out
        }
    }
}

/// A body sent to `view`, as its storage resource (`storage`) keeps it.
pub fn to_storage(view: &Resource, storage: &Resource, body: Value) -> Value {
    match view.conversion {
        None => body,
        Some(Conversion::EventsV1) => {
            let mut out = rename(&body, EVENT_FIELDS.iter().copied());
            set_type(&mut out, storage);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::catalog::all_resources;

    fn find<'a>(all: &'a [Resource], group: &str) -> &'a Resource {
        all.iter()
            .find(|r| r.group == group && r.plural == "events")
            .expect("events are served")
    }

    #[test]
    fn an_events_v1_event_round_trips_through_core_storage() {
        let all = all_resources().expect("resources");
        let (core, view) = (find(&all, ""), find(&all, "events.k8s.io"));
        let sent = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "gs.1", "namespace": "games"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "regarding": {"kind": "PortMap", "name": "gs", "namespace": "games"},
            "note": "Programmed is False", "reason": "PortConflict", "type": "Warning",
            "action": "UpdateStatus", "reportingController": "kuport-agent",
            "reportingInstance": "kuport-agent-edge-a",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z"},
            "deprecatedCount": 2,
        });
        let stored = to_storage(view, core, sent.clone());
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "gs");
        assert_eq!(stored["message"], "Programmed is False");
        assert_eq!(stored["reportingComponent"], "kuport-agent");
        assert_eq!(stored["count"], 2);
        assert!(stored.get("regarding").is_none() && stored.get("note").is_none());
        assert_eq!(to_view(view, &stored), sent);
        // The core view is the stored object itself.
        assert_eq!(to_view(core, &stored), stored);
    }
}
