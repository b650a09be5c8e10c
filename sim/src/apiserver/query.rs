//! The query parameters of a request, and the list query (selectors, paging, version) that
//! list, watch and deletecollection share.

use std::collections::BTreeMap;

use super::Inner;
use super::error::ApiError;
use super::selector::{FieldSelector, LabelSelector};
use super::store::ListQuery;

/// The decoded query parameters, by name.
pub(crate) type Query = BTreeMap<String, String>;

pub(crate) fn parse_query(raw: Option<&str>) -> Query {
    raw.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// Whether boolean parameter `key` is set (`true` or `1`).
pub(crate) fn flag(q: &Query, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("true" | "1"))
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

/// The list query of a list, watch or deletecollection request.
pub(crate) fn list_query(inner: &Inner, res: usize, q: &Query) -> Result<ListQuery, ApiError> {
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
