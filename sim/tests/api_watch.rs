//! Watches and fault hooks, driven by kube-rs clients: resume from a version, 410 and relist
//! through a kube-runtime watcher, bookmarks, timeouts, selector transitions, and every fault
//! hook actually firing. The tests without fault hooks or model-specific timing (bookmark
//! intervals, history eviction) also run against a real kube-apiserver.

#[macro_use]
mod common;

use std::time::Duration;

use common::*;
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kuport_sim::apiserver::{ApiServer, Failure, RequestFilter};
use serde_json::json;
use tokio::time::timeout;

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
        .expect("configmap")
}

async fn create(api: &Api<ConfigMap>, name: &str) -> ConfigMap {
    api.create(&PostParams::default(), &cm(name, json!({})))
        .await
        .expect("created")
}

fn event_name(ev: &WatchEvent<ConfigMap>) -> (String, String) {
    match ev {
        WatchEvent::Added(o) => ("ADDED".into(), o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Modified(o) => (
            "MODIFIED".into(),
            o.metadata.name.clone().unwrap_or_default(),
        ),
        WatchEvent::Deleted(o) => (
            "DELETED".into(),
            o.metadata.name.clone().unwrap_or_default(),
        ),
        WatchEvent::Bookmark(b) => ("BOOKMARK".into(), b.metadata.resource_version.clone()),
        WatchEvent::Error(e) => ("ERROR".into(), e.code.to_string()),
    }
}

/// How long a watch event may take before the test fails: a bound on liveness, not on speed. A
/// real apiserver started moments before, on a loaded two-core CI machine, once took over 5 s to
/// serve its first streaming list.
const IN_TIME: Duration = Duration::from_secs(30);

/// Takes `n` events from a watch, failing the test if they do not arrive [`IN_TIME`].
async fn take_events(
    stream: impl futures_util::Stream<Item = kube::Result<WatchEvent<ConfigMap>>>,
    n: usize,
) -> Vec<(String, String)> {
    timeout(
        IN_TIME,
        stream
            .take(n)
            .map(|e| event_name(&e.expect("event")))
            .collect(),
    )
    .await
    .expect("events arrive in time")
}

/// Takes `n` events that carry an object, skipping bookmarks. A real kube-apiserver serves a
/// watch from version "0" out of its watch cache, which may lag the last write by a moment: it
/// can send a bookmark for the older version before the newer object arrives as ADDED.
async fn take_object_events(
    stream: impl futures_util::Stream<Item = kube::Result<WatchEvent<ConfigMap>>>,
    n: usize,
) -> Vec<(String, String)> {
    take_events(
        stream.filter(|e| std::future::ready(!matches!(e, Ok(WatchEvent::Bookmark(_))))),
        n,
    )
    .await
}

async fn watch_resumes_from_a_resource_version(target: Target) {
    let Some(t) = start_on(target, "watch_resumes_from_a_resource_version", &[]).await else {
        return;
    };
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    let a = create(&api, "a").await;
    create(&api, "b").await;
    api.delete("a", &Default::default()).await.expect("deleted");
    let from = a.metadata.resource_version.expect("rv");
    let stream = api
        .watch(&WatchParams::default(), &from)
        .await
        .expect("watch");
    let later = tokio::spawn({
        let api = api.clone();
        // The watch is registered once its response started, so this write comes after it.
        async move { create(&api, "c").await }
    });
    let events = take_events(stream, 3).await;
    later.await.expect("writer");
    assert_eq!(
        events,
        [
            ("ADDED".into(), "b".into()),
            ("DELETED".into(), "a".into()),
            ("ADDED".into(), "c".into()),
        ]
    );
}

async fn watch_from_zero_starts_with_the_current_state(target: Target) {
    let Some(t) = start_on(target, "watch_from_zero_starts_with_the_current_state", &[]).await
    else {
        return;
    };
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    create(&api, "a").await;
    create(&api, "b").await;
    let stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .expect("watch");
    assert_eq!(
        take_object_events(stream, 2).await,
        [("ADDED".into(), "a".into()), ("ADDED".into(), "b".into())]
    );
}

async fn label_selected_watch_sees_objects_enter_and_leave(target: Target) {
    let Some(t) = start_on(
        target,
        "label_selected_watch_sees_objects_enter_and_leave",
        &[],
    )
    .await
    else {
        return;
    };
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    let x = create(&api, "x").await;
    let rv = x.metadata.resource_version.expect("rv");
    let stream = api
        .watch(&WatchParams::default().labels("app=game"), &rv)
        .await
        .expect("watch");
    for labels in [
        json!({"app": "game"}),
        json!({"app": "game", "b": "c"}),
        json!({"app": "web"}),
    ] {
        api.patch(
            "x",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .expect("labelled");
    }
    assert_eq!(
        take_events(stream, 3).await,
        [
            ("ADDED".into(), "x".into()),
            ("MODIFIED".into(), "x".into()),
            ("DELETED".into(), "x".into()),
        ]
    );
}

#[tokio::test]
async fn bookmarks_and_timeout_seconds() {
    let t = start_with(ApiServer::builder().bookmark_interval(Duration::from_millis(100))).await;
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    let rv = t.model().resource_version().to_string();
    let params = WatchParams::default().timeout(1);
    let started = tokio::time::Instant::now();
    let events: Vec<_> = timeout(
        Duration::from_secs(5),
        api.watch(&params, &rv)
            .await
            .expect("watch")
            .collect::<Vec<_>>(),
    )
    .await
    .expect("the stream ends by itself");
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    let bookmarks = events
        .iter()
        .filter(|e| matches!(e, Ok(WatchEvent::Bookmark(b)) if b.metadata.resource_version == rv))
        .count();
    assert!(
        bookmarks >= 3,
        "expected bookmarks every 100ms, got {events:?}"
    );
}

#[tokio::test]
async fn too_old_version_is_410_expired_in_the_stream_and_in_lists() {
    let t = start_with(ApiServer::builder().history_limit(2)).await;
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    let first = create(&api, "a").await;
    for name in ["b", "c", "d"] {
        create(&api, name).await;
    }
    let rv = first.metadata.resource_version.expect("rv");
    let stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch opens");
    let events: Vec<_> = timeout(Duration::from_secs(5), stream.collect::<Vec<_>>())
        .await
        .expect("stream ends after the error");
    match events.as_slice() {
        [Ok(WatchEvent::Error(status))] => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(
                status.message.starts_with("too old resource version"),
                "{status:?}"
            );
        }
        other => panic!("expected one 410 event, got {other:?}"),
    }
    // A continue token from before the history is expired too.
    let page = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("page");
    let token = page.metadata.continue_.expect("more pages");
    for name in ["e", "f", "g"] {
        create(&api, name).await;
    }
    let status = api_error(
        api.list(&ListParams::default().limit(1).continue_token(&token))
            .await,
    );
    assert_eq!(status.code, 410);
}

#[tokio::test]
async fn kube_runtime_watcher_relists_after_410() {
    let t = start_with(ApiServer::builder().history_limit(3)).await;
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    create(&api, "before").await;
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    // The initial list.
    loop {
        let ev = timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("initial list in time")
            .expect("no error")
            .expect("stream open");
        if matches!(ev, watcher::Event::InitDone) {
            break;
        }
    }
    // The watcher makes requests only while polled: cut its watch, then push its version out
    // of the history before it resumes.
    t.model().faults().close_watches();
    for i in 0..5 {
        create(&api, &format!("after-{i}")).await;
    }
    let mut saw_410 = false;
    let mut relisted = Vec::new();
    let mut in_relist = false;
    loop {
        let next = timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("watcher makes progress")
            .expect("stream open");
        match next {
            Err(watcher::Error::WatchError(status)) => {
                assert_eq!(status.code, 410, "{status:?}");
                saw_410 = true;
            }
            Err(other) => panic!("unexpected watcher error {other:?}"),
            Ok(watcher::Event::Init) => in_relist = true,
            Ok(watcher::Event::InitApply(o)) if in_relist => {
                relisted.push(o.metadata.name.unwrap_or_default())
            }
            Ok(watcher::Event::InitDone) if in_relist => break,
            Ok(_) => {}
        }
    }
    assert!(
        saw_410,
        "the watcher must have been told its version expired"
    );
    assert_eq!(
        relisted,
        [
            "after-0", "after-1", "after-2", "after-3", "after-4", "before"
        ]
    );
}

async fn kube_runtime_streaming_list_gets_initial_events_and_the_end_bookmark(target: Target) {
    let Some(t) = start_on(
        target,
        "kube_runtime_streaming_list_gets_initial_events_and_the_end_bookmark",
        &[],
    )
    .await
    else {
        return;
    };
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    create(&api, "a").await;
    let mut stream = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut names = Vec::new();
    loop {
        match timeout(IN_TIME, stream.try_next())
            .await
            .expect("in time")
            .expect("no error")
            .expect("open")
        {
            watcher::Event::InitApply(o) => names.push(o.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(names, ["a"]);
}

#[tokio::test]
async fn failing_the_next_requests_fires_exactly_that_often() {
    let t = start().await;
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    create(&api, "a").await;
    let faults = t.model().faults();
    faults.fail_next(
        2,
        Failure::InternalError,
        RequestFilter::any().resource("configmaps"),
    );
    for _ in 0..2 {
        let status = api_error(api.get("a").await);
        assert_eq!(
            (status.code, status.reason.as_str()),
            (500, "InternalError")
        );
    }
    api.get("a").await.expect("third request passes");

    // kube-rs retries a 429 by default (after Retry-After), so the default client succeeds
    // while the hook still fires; a client without retries sees the 429 itself.
    faults.fail_next(1, Failure::TooManyRequests, RequestFilter::any());
    api.get("a").await.expect("retried past the 429");
    assert_eq!(faults.injected(), 3);
    let mut config = kube::Config::new(t.url.parse().expect("url"));
    config.default_retry = false;
    let no_retry: Api<ConfigMap> =
        Api::namespaced(kube::Client::try_from(config).expect("client"), "default");
    faults.fail_next(1, Failure::TooManyRequests, RequestFilter::any());
    let status = api_error(no_retry.get("a").await);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (429, "TooManyRequests")
    );

    // Conflicts only on writes: reads pass untouched.
    faults.fail_next(1, Failure::Conflict, RequestFilter::writes());
    api.get("a").await.expect("reads are not writes");
    let status = api_error(
        api.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(faults.injected(), 5);
}

#[tokio::test]
async fn failing_a_fraction_is_seeded_and_clear_stops_it() {
    async fn pattern(seed: u64) -> Vec<bool> {
        let t = start_with(ApiServer::builder().seed(seed)).await;
        let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
        t.model()
            .faults()
            .fail_fraction(0.5, Failure::InternalError, RequestFilter::any());
        let mut out = Vec::new();
        for _ in 0..32 {
            out.push(api.list(&ListParams::default()).await.is_err());
        }
        t.model().faults().clear();
        for _ in 0..8 {
            api.list(&ListParams::default()).await.expect("cleared");
        }
        out
    }
    let a = pattern(11).await;
    assert_eq!(
        a,
        pattern(11).await,
        "the same seed fails the same requests"
    );
    let failed = a.iter().filter(|f| **f).count();
    assert!((4..28).contains(&failed), "{failed} of 32 failed at 0.5");
}

#[tokio::test]
async fn paused_server_holds_requests_until_resumed() {
    let t = start().await;
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    t.model().faults().pause();
    let pending = tokio::spawn({
        let api = api.clone();
        async move { create(&api, "late").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pending.is_finished(), "a paused server must not answer");
    assert!(
        t.model()
            .object("v1", "configmaps", "default", "late")
            .is_none()
    );
    t.model().faults().resume();
    let created = timeout(Duration::from_secs(5), pending)
        .await
        .expect("answered after resume")
        .expect("task");
    assert_eq!(created.metadata.name.as_deref(), Some("late"));
}

#[tokio::test]
async fn closing_watches_ends_open_streams() {
    let t = start().await;
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    let rv = t.model().resource_version().to_string();
    let stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch");
    // The stream holds its close receiver from the moment the server answered the request.
    assert_eq!(t.model().faults().open_watches(), 1);
    let collector = tokio::spawn(stream.collect::<Vec<_>>());
    t.model().faults().close_watches();
    let events = timeout(Duration::from_secs(5), collector)
        .await
        .expect("stream ended")
        .expect("task");
    assert!(events.is_empty(), "{events:?}");
}

#[tokio::test]
async fn delayed_and_reordered_watch_events() {
    let t = start_with(ApiServer::builder().seed(3)).await;
    let api: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    let from = t.model().resource_version().to_string();
    let names: Vec<String> = (0..8).map(|i| format!("cm-{i}")).collect();
    for name in &names {
        create(&api, name).await;
    }
    let faults = t.model().faults();
    faults.delay_watch_events(Duration::from_millis(300));
    faults.reorder_watch_events(true);
    let started = tokio::time::Instant::now();
    let stream = api
        .watch(&WatchParams::default(), &from)
        .await
        .expect("watch");
    let events = take_events(stream, 8).await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "the batch was delayed"
    );
    let got: Vec<String> = events.into_iter().map(|(_, n)| n).collect();
    assert_ne!(got, names, "the batch was reordered");
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(sorted, names, "nothing lost or duplicated");
}

on_both_servers!(
    watch_resumes_from_a_resource_version,
    watch_from_zero_starts_with_the_current_state,
    label_selected_watch_sees_objects_enter_and_leave,
    kube_runtime_streaming_list_gets_initial_events_and_the_end_bookmark,
);
