//! Label selectors (`a=b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`) and field selectors
//! (`f=v`, `f==v`, `f!=v` over the fields each kind supports).

use serde_json::Value;

use super::error::ApiError;
use super::resource::Resource;

#[derive(Clone, Debug, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty selects everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits on commas that are not inside parentheses.
fn split_terms(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_set(text: &str, term: &str) -> Result<Vec<String>, ApiError> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: {term:?}: values must be in parentheses"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter.
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for raw in split_terms(text) {
            let term = raw.trim();
            let bad = |why: &str| {
                ApiError::bad_request(format!("unable to parse requirement: {term:?}: {why}"))
            };
            let req = if let Some(key) = term.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_owned())
            } else if let Some((k, v)) = term.split_once("!=") {
                LabelReq::NotEq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = term.split_once("==") {
                LabelReq::Eq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = term.split_once('=') {
                LabelReq::Eq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = term.split_once(" notin ") {
                LabelReq::NotIn(k.trim().to_owned(), parse_set(v, term)?)
            } else if let Some((k, v)) = term.split_once(" in ") {
                LabelReq::In(k.trim().to_owned(), parse_set(v, term)?)
            } else {
                LabelReq::Exists(term.to_owned())
            };
            let key = match &req {
                LabelReq::Eq(k, _)
                | LabelReq::NotEq(k, _)
                | LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(bad("invalid label key"));
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether the object's labels satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object["metadata"]["labels"].as_object();
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector, resolved against the kind's supported field labels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(Vec<String>, String, bool)>);

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter. A label the kind does not support is refused
    /// with the real server's wording (`field label not supported: x`, or for kinds with only
    /// the default labels `"x" is not a known field selector: only ...`).
    pub fn parse(text: &str, resource: &Resource) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (label, value, negate) = if let Some((k, v)) = term.split_once("!=") {
                (k, v, true)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, v, false)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let path = resource.field_label(label.trim()).ok_or_else(|| {
                let label = label.trim();
                ApiError::bad_request(if resource.default_field_conversion {
                    format!(
                        "\"{label}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                    )
                } else {
                    format!("field label not supported: {label}")
                })
            })?;
            reqs.push((
                path.into_iter().map(str::to_owned).collect(),
                value.trim().to_owned(),
                negate,
            ));
        }
        Ok(Self(reqs))
    }

    /// Whether the object satisfies every term; a missing field compares as the empty string.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, want, negate)| {
            let got = path
                .iter()
                .try_fold(object, |v, k| v.get(k.as_str()))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            (got == *want) != *negate
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "labels": labels}})
    }

    #[test]
    fn label_selectors_cover_every_operator() {
        let o = obj(json!({"app": "game", "tier": "edge"}));
        for (sel, want) in [
            ("", true),
            ("app=game", true),
            ("app==game,tier=edge", true),
            ("app!=game", false),
            ("app in (web, game)", true),
            ("app notin (game)", false),
            ("tier", true),
            ("!tier", false),
            ("missing!=x", true),
            ("missing in (x)", false),
        ] {
            let parsed = LabelSelector::parse(sel).expect("parses");
            assert_eq!(parsed.matches(&o), want, "{sel}");
        }
    }

    #[test]
    fn bad_label_selectors_are_400() {
        for sel in ["app in game", "a b=c"] {
            let err = LabelSelector::parse(sel).expect_err(sel);
            assert_eq!(err.code, 400, "{sel}");
        }
    }
}
