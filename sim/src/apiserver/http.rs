//! HTTP: routing Kubernetes paths to discovery and the store. A request is resolved into a
//! [`Call`] (its target, verb and body), admitted past the fault hooks, then dispatched on its
//! verb; watches stream from `watches`, query parsing is in `query`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::ApiError;
use super::faults::RequestInfo;
use super::query::{Query, flag, list_query, parse_query};
use super::response::{error_response, json_response};
use super::store::{PatchKind, WriteOpts};
use super::table::{IncludeObject, to_table};
use super::{ApiServer, Inner, discovery, watches};

/// The largest request body accepted (the real server's limit is about 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// The single entry point: every path is routed here.
pub(crate) async fn handle(State(server): State<ApiServer>, req: Request) -> Response {
    server.inner.faults.wait_unpaused().await;
    match route(&server, req).await {
        Ok(response) => response,
        Err(e) => error_response(&e),
    }
}

/// One request to a resource, resolved: what it acts on and everything its verb reads.
struct Call {
    target: Target,
    verb: &'static str,
    /// The object or collection as messages name it: `portmaps.kuport.wlz.li "gs"`.
    what: String,
    query: Query,
    headers: HeaderMap,
    bytes: Bytes,
    opts: WriteOpts,
    /// The client asked for a `Table` (`Accept: ...;as=Table`).
    table: bool,
    include: IncludeObject,
}

/// Discovery and health paths answer directly; a resource path is resolved, admitted past the
/// fault hooks, its body read, then dispatched on its verb.
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
    admit(inner, &target, verb, &what).await?;
    let bytes = read_body(body, &parts.headers, &what).await?;
    let opts = WriteOpts {
        dry_run: query.get("dryRun").is_some_and(|v| v == "All"),
        strict: query.get("fieldValidation").is_some_and(|v| v == "Strict"),
        patch: parts.method == Method::PATCH,
    };
    let call = Call {
        table: accept.contains("as=Table"),
        include: IncludeObject::parse(query.get("includeObject").map(String::as_str)),
        target,
        verb,
        what,
        query,
        headers: parts.headers,
        bytes,
        opts,
    };
    dispatch(server, &call)
}

/// The fault hooks: an injected failure answers instead of the model, an injected delay waits.
async fn admit(
    inner: &Inner,
    target: &Target,
    verb: &'static str,
    what: &str,
) -> Result<(), ApiError> {
    let info = RequestInfo {
        verb,
        resource: &inner.resource(target.res).plural,
        status: target.status,
    };
    let details = || {
        let name = target.name.as_deref().unwrap_or_default();
        inner.resource(target.res).details(name)
    };
    if let Some(e) = inner.faults.check(info, what, details) {
        return Err(e);
    }
    inner.faults.slow(info).await;
    Ok(())
}

/// The request body, refused when too large or (when there is one) not JSON-encoded.
async fn read_body(body: Body, headers: &HeaderMap, what: &str) -> Result<Bytes, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("reading the request body: {e}"),
        )
    })?;
    if !bytes.is_empty() {
        check_content_type(headers, what)?;
    }
    Ok(bytes)
}

fn dispatch(server: &ApiServer, call: &Call) -> Result<Response, ApiError> {
    let inner = &server.inner;
    let res = call.target.res;
    let ns = call.target.namespace.as_deref();
    let name = call.target.name.as_deref().unwrap_or_default();
    let what = call.what.as_str();
    match call.verb {
        "get" => get(inner, call),
        "list" => list(inner, call),
        "watch" => watches::watch(server, res, ns, &call.query),
        "create" => {
            let object = inner.create(res, ns, parse_body(&call.bytes, what)?, call.opts)?;
            Ok(json_response(201, &object))
        }
        "update" => {
            let body = parse_body(&call.bytes, what)?;
            let object = inner.update(res, ns, name, body, call.target.status, call.opts)?;
            Ok(json_response(200, &object))
        }
        "patch" => {
            let custom = inner.resource(res).custom.is_some();
            let kind = patch_kind(&call.headers, custom, what)?;
            let patch = (kind, parse_body(&call.bytes, what)?);
            let object = inner.patch(res, ns, name, patch, call.target.status, call.opts)?;
            Ok(json_response(200, &object))
        }
        "delete" => {
            let options = if call.bytes.is_empty() {
                Value::Null
            } else {
                parse_body(&call.bytes, what)?
            };
            let object = inner.delete(res, ns, name, &options, call.opts)?;
            Ok(json_response(200, &object))
        }
        "deletecollection" => delete_collection(inner, call),
        other => Err(ApiError::method_not_allowed(other, what)),
    }
}

fn get(inner: &Inner, call: &Call) -> Result<Response, ApiError> {
    let name = call.target.name.as_deref().unwrap_or_default();
    let object = inner.get(call.target.res, call.target.namespace.as_deref(), name)?;
    if call.table {
        let meta = json!({"resourceVersion": object["metadata"]["resourceVersion"]});
        let r = inner.resource(call.target.res);
        let table = to_table(r, &[object.as_ref()], meta, call.include, inner.now());
        return Ok(json_response(200, &table));
    }
    Ok(json_response(200, &object))
}

fn list(inner: &Inner, call: &Call) -> Result<Response, ApiError> {
    let res = call.target.res;
    let q = list_query(inner, res, &call.query)?;
    let (items, meta) = inner.list(res, call.target.namespace.as_deref(), &q)?;
    let r = inner.resource(res);
    if call.table {
        let refs: Vec<&Value> = items.iter().map(Arc::as_ref).collect();
        let table = to_table(r, &refs, meta, call.include, inner.now());
        return Ok(json_response(200, &table));
    }
    let body = json!({
        "kind": format!("{}List", r.kind),
        "apiVersion": r.api_version(),
        "metadata": meta,
        "items": items.iter().map(|o| o.as_ref().clone()).collect::<Vec<_>>(),
    });
    Ok(json_response(200, &body))
}

fn delete_collection(inner: &Inner, call: &Call) -> Result<Response, ApiError> {
    let res = call.target.res;
    let q = list_query(inner, res, &call.query)?;
    let (items, meta) = inner.list(res, call.target.namespace.as_deref(), &q)?;
    let mut deleted = Vec::new();
    for item in items {
        let item_ns = item["metadata"]["namespace"].as_str().map(str::to_owned);
        let item_name = item["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match inner.delete(res, item_ns.as_deref(), &item_name, &Value::Null, call.opts) {
            Ok(o) => deleted.push(o.as_ref().clone()),
            // Deleted concurrently: the collection delete still succeeds.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let r = inner.resource(res);
    let body = json!({
        "kind": format!("{}List", r.kind),
        "apiVersion": r.api_version(),
        "metadata": meta,
        "items": deleted,
    });
    Ok(json_response(200, &body))
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
