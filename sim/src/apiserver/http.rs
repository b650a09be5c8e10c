//! HTTP: routing Kubernetes paths to the store, query parsing, Tables, and watch streams.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use super::error::ApiError;
use super::faults::RequestInfo;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{ChangeKind, ListQuery, PatchKind, WriteOpts, too_large};
use super::table::{IncludeObject, to_table};
use super::{ApiServer, Inner, discovery};

/// The largest request body accepted (the real server's limit is about 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// A watch without `timeoutSeconds` ends after this long, like the real server's
/// `--min-request-timeout`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

pub(crate) fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn error_response(e: &ApiError) -> Response {
    let mut response = json_response(e.code, &e.to_status());
    if e.code == 429 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

/// The single entry point: every path is routed here.
pub(crate) async fn handle(State(server): State<ApiServer>, req: Request) -> Response {
    server.inner.faults.wait_unpaused().await;
    match route(&server, req).await {
        Ok(response) => response,
        Err(e) => error_response(&e),
    }
}

type Query = BTreeMap<String, String>;

fn parse_query(raw: Option<&str>) -> Query {
    raw.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

fn flag(q: &Query, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("true" | "1"))
}

async fn route(server: &ApiServer, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let query = parse_query(parts.uri.query());
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let inner = &server.inner;
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if parts.method == Method::GET
        && let Some(response) = discovery::serve(inner, &segments, &accept)
    {
        return Ok(response);
    }
    let (group, version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => ("", "v1", rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        ["healthz" | "livez" | "readyz"] => {
            return Ok((StatusCode::OK, "ok").into_response());
        }
        _ => return Err(ApiError::no_route()),
    };
    let target = parse_target(inner, group, version, rest)?;
    let verb = verb_of(&parts.method, &target, &query)?;
    let r = inner.resource(target.res);
    let what = match &target.name {
        Some(name) => format!("{} \"{name}\"", r.qualified()),
        None => r.qualified(),
    };
    let info = RequestInfo {
        verb,
        resource: &r.plural,
        status: target.status,
    };
    if let Some(e) = inner.faults.check(info, &what) {
        return Err(e);
    }
    inner.faults.slow(info).await;
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("reading the request body: {e}"),
        )
    })?;
    if !bytes.is_empty() {
        check_content_type(&parts.headers, &what)?;
    }
    let opts = WriteOpts {
        dry_run: query.get("dryRun").is_some_and(|v| v == "All"),
        strict: query.get("fieldValidation").is_some_and(|v| v == "Strict"),
        patch: parts.method == Method::PATCH,
    };
    let table = accept.contains("as=Table");
    let include = IncludeObject::parse(query.get("includeObject").map(String::as_str));
    let ns = target.namespace.as_deref();
    let name = target.name.as_deref().unwrap_or_default();
    let res = target.res;
    match verb {
        "get" => {
            let object = inner.get(res, ns, name)?;
            if table {
                let meta = json!({"resourceVersion": object["metadata"]["resourceVersion"]});
                return Ok(json_response(
                    200,
                    &to_table(r, &[object.as_ref()], meta, include, inner.now()),
                ));
            }
            Ok(json_response(200, &object))
        }
        "list" => {
            let q = list_query(inner, res, &query)?;
            let (items, meta) = inner.list(res, ns, &q)?;
            if table {
                let refs: Vec<&Value> = items.iter().map(Arc::as_ref).collect();
                return Ok(json_response(
                    200,
                    &to_table(r, &refs, meta, include, inner.now()),
                ));
            }
            let body = json!({
                "kind": format!("{}List", r.kind),
                "apiVersion": r.api_version(),
                "metadata": meta,
                "items": items.iter().map(|o| o.as_ref().clone()).collect::<Vec<_>>(),
            });
            Ok(json_response(200, &body))
        }
        "watch" => watch(server, res, ns, &query),
        "create" => {
            let object = inner.create(res, ns, parse_body(&bytes, &what)?, opts)?;
            Ok(json_response(201, &object))
        }
        "update" => {
            let object = inner.update(
                res,
                ns,
                name,
                parse_body(&bytes, &what)?,
                target.status,
                opts,
            )?;
            Ok(json_response(200, &object))
        }
        "patch" => {
            let kind = patch_kind(&parts.headers, r.custom.is_some(), &what)?;
            let object = inner.patch(
                res,
                ns,
                name,
                (kind, parse_body(&bytes, &what)?),
                target.status,
                opts,
            )?;
            Ok(json_response(200, &object))
        }
        "delete" => {
            let options = if bytes.is_empty() {
                Value::Null
            } else {
                parse_body(&bytes, &what)?
            };
            let object = inner.delete(res, ns, name, &options, opts)?;
            Ok(json_response(200, &object))
        }
        "deletecollection" => {
            let q = list_query(inner, res, &query)?;
            let (items, meta) = inner.list(res, ns, &q)?;
            let mut deleted = Vec::new();
            for item in items {
                let item_ns = item["metadata"]["namespace"].as_str().map(str::to_owned);
                let item_name = item["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                match inner.delete(res, item_ns.as_deref(), &item_name, &Value::Null, opts) {
                    Ok(o) => deleted.push(o.as_ref().clone()),
                    // Deleted concurrently: the collection delete still succeeds.
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            let body = json!({
                "kind": format!("{}List", r.kind),
                "apiVersion": r.api_version(),
                "metadata": meta,
                "items": deleted,
            });
            Ok(json_response(200, &body))
        }
        other => Err(ApiError::method_not_allowed(other, &what)),
    }
}

fn parse_body(bytes: &Bytes, what: &str) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the request body for {what} is not valid JSON: {e}"
        ))
    })
}

/// The model speaks JSON only. Protobuf (which kubectl sends for built-in kinds) and CBOR bodies
/// get 415, on which client-go switches to JSON and retries, as it does against a server without
/// those encodings.
fn check_content_type(headers: &HeaderMap, what: &str) -> Result<(), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim();
    if media.contains("protobuf") || media.contains("cbor") || media.contains("yaml") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request for {what} was in an unknown format ({media:?}) - accepted media types include: application/json, application/json-patch+json, application/merge-patch+json"
            ),
        ));
    }
    Ok(())
}

fn patch_kind(headers: &HeaderMap, custom: bool, what: &str) -> Result<PatchKind, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim();
    match media {
        "application/merge-patch+json" => Ok(PatchKind::Merge),
        "application/json-patch+json" => Ok(PatchKind::Json),
        "application/strategic-merge-patch+json" if !custom => Ok(PatchKind::StrategicAsMerge),
        _ => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request for {what} was in an unknown format ({media:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json{}",
                if custom {
                    ""
                } else {
                    ", application/strategic-merge-patch+json"
                }
            ),
        )),
    }
}

/// A resolved resource path.
struct Target {
    res: usize,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_target(
    inner: &Inner,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Target, ApiError> {
    // `/namespaces/<ns>/<plural>/...` when <plural> is a namespaced resource of this group
    // version; otherwise `namespaces` is the resource itself (`/api/v1/namespaces/<name>`).
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if inner
                .find(group, version, plural)
                .is_some_and(|i| inner.resource(i).namespaced) =>
        {
            (Some((*ns).to_owned()), {
                let mut v = vec![*plural];
                v.extend_from_slice(tail);
                v
            })
        }
        _ => (None, rest.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        _ => return Err(ApiError::no_route()),
    };
    let res = inner
        .find(group, version, plural)
        .ok_or_else(ApiError::no_route)?;
    let r = inner.resource(res);
    let status = match sub {
        None => false,
        Some("status") if r.status_subresource => true,
        Some(_) => return Err(ApiError::no_route()),
    };
    if r.namespaced && name.is_some() && namespace.is_none() {
        return Err(ApiError::no_route());
    }
    Ok(Target {
        res,
        namespace,
        name: name.map(str::to_owned),
        status,
    })
}

fn verb_of(method: &Method, target: &Target, q: &Query) -> Result<&'static str, ApiError> {
    let collection = target.name.is_none();
    let verb = match (method.as_str(), collection) {
        ("GET", true) if flag(q, "watch") => "watch",
        ("GET", true) => "list",
        ("GET", false) => "get",
        ("POST", true) if !target.status => "create",
        ("PUT", false) => "update",
        ("PATCH", false) => "patch",
        ("DELETE", false) if !target.status => "delete",
        ("DELETE", true) => "deletecollection",
        (m, _) => {
            return Err(ApiError::method_not_allowed(m, "this path"));
        }
    };
    Ok(verb)
}

fn parse_rv(q: &Query) -> Result<Option<u64>, ApiError> {
    match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "invalid resourceVersion {v:?}: not a version this server issued"
            ))
        }),
    }
}

fn list_query(inner: &Inner, res: usize, q: &Query) -> Result<ListQuery, ApiError> {
    let limit = match q.get("limit") {
        None => None,
        Some(l) => Some(l.parse::<usize>().map_err(|_| {
            ApiError::bad_request(format!("invalid limit {l:?}: not a non-negative integer"))
        })?),
    };
    Ok(ListQuery {
        labels: LabelSelector::parse(
            q.get("labelSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )?,
        fields: FieldSelector::parse(
            q.get("fieldSelector")
                .map(String::as_str)
                .unwrap_or_default(),
            inner.resource(res),
        )?,
        limit,
        continue_token: q.get("continue").filter(|c| !c.is_empty()).cloned(),
        resource_version: parse_rv(q)?,
        exact: q.get("resourceVersionMatch").is_some_and(|m| m == "Exact"),
    })
}

// ---------------------------------------------------------------------------------- watch

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

fn watch(
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
