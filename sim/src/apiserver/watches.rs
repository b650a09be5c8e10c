//! Watch streams: the changes after a version as event lines, with bookmarks, the initial
//! events a client asks for, and the `410 Expired` of a version that left the history.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use super::ApiServer;
use super::error::ApiError;
use super::query::{Query, flag, list_query};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{ChangeKind, too_large};

/// A watch without `timeoutSeconds` ends after this long, like the real server's
/// `--min-request-timeout`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

struct WatchStream {
    server: ApiServer,
    res: usize,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    cursor: u64,
    pending: VecDeque<Bytes>,
    done: bool,
    deadline: Instant,
    bookmarks: bool,
    next_bookmark: Instant,
    changes: watch::Receiver<u64>,
    close: watch::Receiver<u64>,
}

fn line(event_type: &str, object: &Value) -> Bytes {
    let mut text = json!({"type": event_type, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

impl WatchStream {
    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    fn bookmark(&self, initial_end: bool) -> Bytes {
        let r = self.server.inner.resource(self.res);
        let mut metadata = json!({"resourceVersion": self.cursor.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            "BOOKMARK",
            &json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": metadata}),
        )
    }

    /// Reads the changes after the cursor into event lines; a cursor that left the history
    /// ends the stream with a 410 `Expired` error event, as the real server does.
    fn collect(&mut self) -> Vec<Bytes> {
        let store = self.server.inner.lock();
        if self.cursor < store.compacted() {
            self.done = true;
            return vec![line(
                "ERROR",
                &ApiError::expired(self.cursor, store.compacted() + 1).to_status(),
            )];
        }
        let inner = &self.server.inner;
        let mut out = Vec::new();
        for change in store.changes_after(self.cursor) {
            if change.resource != inner.storage(self.res)
                || self
                    .namespace
                    .as_deref()
                    .is_some_and(|ns| ns != change.namespace)
            {
                continue;
            }
            let object = inner.view(self.res, change.object.clone());
            let previous = change.previous.clone().map(|p| inner.view(self.res, p));
            let now = self.matches(&object);
            let before = previous.as_deref().is_some_and(|p| self.matches(p));
            let event_type = match (change.kind, before, now) {
                (ChangeKind::Added, _, true) => "ADDED",
                (ChangeKind::Deleted, _, true) => "DELETED",
                (ChangeKind::Modified, true, true) => "MODIFIED",
                (ChangeKind::Modified, false, true) => "ADDED",
                (ChangeKind::Modified, true, false) => "DELETED",
                _ => continue,
            };
            out.push(line(event_type, &object));
        }
        self.cursor = store.resource_version();
        out
    }

    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                return Some(bytes);
            }
            if self.done {
                return None;
            }
            self.changes.borrow_and_update();
            let mut batch = self.collect();
            if !batch.is_empty() {
                let faults = self.server.inner.faults.clone();
                let delay = faults.distort_batch(&mut batch);
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                faults.wait_unpaused().await;
                self.pending.extend(batch);
                continue;
            }
            // Biased: a simulated run must replay exactly, and tokio's random branch order
            // is seeded per process.
            tokio::select! {
                biased;
                changed = self.changes.changed() => {
                    if changed.is_err() {
                        self.done = true;
                    }
                }
                _ = tokio::time::sleep_until(self.deadline) => self.done = true,
                _ = self.close.changed() => self.done = true,
                _ = tokio::time::sleep_until(self.next_bookmark), if self.bookmarks => {
                    self.pending.push_back(self.bookmark(false));
                    self.next_bookmark = Instant::now() + self.server.inner.bookmark_interval;
                }
            }
        }
    }
}

/// Starts a watch of `res` (in `namespace`, or all) as the query asks.
pub(crate) fn watch(
    server: &ApiServer,
    res: usize,
    namespace: Option<&str>,
    q: &Query,
) -> Result<Response, ApiError> {
    let inner = &server.inner;
    let list = list_query(inner, res, q)?;
    let timeout = match q.get("timeoutSeconds") {
        None => DEFAULT_WATCH_TIMEOUT,
        Some(t) => Duration::from_secs(t.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "invalid timeoutSeconds {t:?}: not a non-negative integer"
            ))
        })?),
    };
    let bookmarks = flag(q, "allowWatchBookmarks");
    let send_initial = match q.get("sendInitialEvents").map(String::as_str) {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => None,
    };
    let mut stream = WatchStream {
        server: server.clone(),
        res,
        namespace: namespace.map(str::to_owned),
        labels: list.labels,
        fields: list.fields,
        cursor: 0,
        pending: VecDeque::new(),
        done: false,
        deadline: Instant::now() + timeout,
        bookmarks,
        next_bookmark: Instant::now() + inner.bookmark_interval,
        changes: inner.changes.subscribe(),
        close: inner.faults.close_receiver(),
    };
    {
        let store = inner.lock();
        let current = store.resource_version();
        match (list.resource_version, send_initial) {
            (Some(rv), _) if rv > current => return Err(too_large(rv, current)),
            // No version (or "0"), or an explicit request for initial events: start with the
            // current state as ADDED events; with `sendInitialEvents` end them with a bookmark.
            (None, None | Some(true)) | (Some(_), Some(true)) => {
                for (_, object) in store.scan(inner.storage(res), namespace) {
                    let object = inner.view(res, object.clone());
                    if stream.matches(&object) {
                        stream.pending.push_back(line("ADDED", &object));
                    }
                }
                stream.cursor = current;
                if send_initial == Some(true) {
                    stream.pending.push_back(stream.bookmark(true));
                }
            }
            (None, Some(false)) => stream.cursor = current,
            // An expired version is reported in the stream by `collect`, as the real server
            // does (HTTP 200, then an ERROR event with code 410).
            (Some(rv), _) => stream.cursor = rv,
        }
    }
    let body = futures_util::stream::unfold(stream, |mut s| async move {
        s.next().await.map(|b| (Ok::<_, Infallible>(b), s))
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response())
}
