//! Events are one store served in two groups, as on the real API server: what a recorder writes
//! as `events.k8s.io/v1` is read, listed, field-selected and watched as core `v1` (what
//! `kubectl get events` and `kubectl describe` read), and the other way round.

mod common;

use common::start;
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event as EventsV1;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;

fn regarding(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("kuport.wlz.li/v1alpha1".into()),
        kind: Some("PortMap".into()),
        name: Some(name.into()),
        namespace: Some("games".into()),
        uid: Some(format!("uid-{name}")),
        ..Default::default()
    }
}

#[tokio::test]
async fn an_event_recorded_as_events_v1_is_a_core_event() {
    let t = start().await;
    t.namespace("games").await;
    let recorder = Recorder::new(
        t.client.clone(),
        Reporter {
            controller: "kuport-agent".into(),
            instance: Some("kuport-agent-edge-a".into()),
        },
    );
    recorder
        .publish(
            &Event {
                type_: EventType::Warning,
                reason: "PortConflict".into(),
                note: Some("Accepted is False: ports 3000 are held by games/lobby".into()),
                action: "UpdateStatus".into(),
                secondary: None,
            },
            &regarding("gs"),
        )
        .await
        .expect("published");

    let core: Api<CoreEvent> = Api::namespaced(t.client.clone(), "games");
    let listed = core.list(&ListParams::default()).await.expect("core list");
    assert_eq!(listed.items.len(), 1, "{listed:?}");
    let e = &listed.items[0];
    assert_eq!(e.involved_object.name.as_deref(), Some("gs"));
    assert_eq!(e.involved_object.kind.as_deref(), Some("PortMap"));
    assert_eq!(e.reason.as_deref(), Some("PortConflict"));
    assert_eq!(
        e.message.as_deref(),
        Some("Accepted is False: ports 3000 are held by games/lobby")
    );
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reporting_component.as_deref(), Some("kuport-agent"));

    // The selector kubectl describe sends finds it; one for another object does not.
    let describe = ListParams::default().fields(
        "involvedObject.name=gs,involvedObject.namespace=games,involvedObject.kind=PortMap,involvedObject.uid=uid-gs",
    );
    assert_eq!(core.list(&describe).await.expect("list").items.len(), 1);
    let other = ListParams::default().fields("involvedObject.name=lobby");
    assert!(core.list(&other).await.expect("list").items.is_empty());

    // The same object by name through both groups, one resourceVersion.
    let name = e.metadata.name.clone().expect("name");
    let v1: Api<EventsV1> = Api::namespaced(t.client.clone(), "games");
    let through_v1 = v1.get(&name).await.expect("events.k8s.io get");
    assert_eq!(
        through_v1.metadata.resource_version,
        e.metadata.resource_version
    );
    assert_eq!(
        through_v1
            .regarding
            .as_ref()
            .and_then(|r| r.name.as_deref()),
        Some("gs")
    );
    let raw = t
        .model()
        .object("events.k8s.io/v1", "events", "games", &name)
        .expect("stored");
    assert!(raw.get("involvedObject").is_none(), "{raw}");
}

#[tokio::test]
async fn a_core_event_reads_as_events_v1_and_deletes_from_both() {
    let t = start().await;
    t.namespace("games").await;
    let core: Api<CoreEvent> = Api::namespaced(t.client.clone(), "games");
    let event: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "gs.1"},
        "involvedObject": {"kind": "PortMap", "name": "gs", "namespace": "games"},
        "reason": "NoReadyEndpoint", "message": "no ready endpoint", "type": "Warning",
        "source": {"component": "kuport"}, "count": 3,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z",
    }))
    .expect("event");
    core.create(&PostParams::default(), &event)
        .await
        .expect("created");

    let v1: Api<EventsV1> = Api::namespaced(t.client.clone(), "games");
    let e = v1.get("gs.1").await.expect("get through events.k8s.io");
    assert_eq!(e.note.as_deref(), Some("no ready endpoint"));
    assert_eq!(e.deprecated_count, Some(3));
    assert_eq!(
        e.deprecated_source
            .as_ref()
            .and_then(|s| s.component.as_deref()),
        Some("kuport")
    );
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("PortMap")
    );
    let by_regarding = ListParams::default().fields("regarding.name=gs");
    assert_eq!(v1.list(&by_regarding).await.expect("list").items.len(), 1);
    // An events.k8s.io selector refuses the core field names, as the real server does.
    let wrong = ListParams::default().fields("involvedObject.name=gs");
    assert!(v1.list(&wrong).await.is_err());

    v1.delete("gs.1", &DeleteParams::default())
        .await
        .expect("deleted through events.k8s.io");
    assert!(core.get_opt("gs.1").await.expect("get").is_none());
}

#[tokio::test]
async fn a_core_watch_sees_events_written_through_events_v1() {
    let t = start().await;
    t.namespace("games").await;
    let core: Api<CoreEvent> = Api::namespaced(t.client.clone(), "games");
    let stream = core
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch");
    let v1: Api<EventsV1> = Api::namespaced(t.client.clone(), "games");
    let event: EventsV1 = serde_json::from_value(json!({
        "metadata": {"name": "gs.2"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": {"kind": "PortMap", "name": "gs", "namespace": "games"},
        "reason": "AllNodesReady", "note": "Programmed is True", "type": "Normal",
        "action": "UpdateStatus", "reportingController": "kuport-agent",
        "reportingInstance": "kuport-agent-edge-a",
    }))
    .expect("event");
    v1.create(&PostParams::default(), &event)
        .await
        .expect("created");
    let first = stream
        .boxed()
        .try_next()
        .await
        .expect("watch stream")
        .expect("one event");
    match first {
        WatchEvent::Added(e) => {
            assert_eq!(e.message.as_deref(), Some("Programmed is True"));
            assert_eq!(e.involved_object.name.as_deref(), Some("gs"));
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
}
