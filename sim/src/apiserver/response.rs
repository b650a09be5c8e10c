//! The response bodies every part of the HTTP service sends: JSON objects, and errors as the
//! Kubernetes `Status` objects clients branch on.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::error::ApiError;

/// `body` as JSON with status `code`.
pub(crate) fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// `e` as its `Status` object; a 429 also says when to retry, as the real server does.
pub(crate) fn error_response(e: &ApiError) -> Response {
    let mut response = json_response(e.code, &e.to_status());
    if e.code == 429 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}
