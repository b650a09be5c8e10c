//! Errors: the Kubernetes `Status` objects the model answers with, and the errors of building it.

use serde_json::{Value, json};

use super::resource::Resource;

/// A failed API request, rendered as a `meta/v1` `Status` object with the same `reason`, `code`
/// and message wording as kube-apiserver, because clients (kube-rs, kubectl) branch on them.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status code, repeated in the body's `code`.
    pub code: u16,
    /// The `reason` field: `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `Expired`, ...
    pub reason: &'static str,
    /// The human-readable message kubectl prints.
    pub message: String,
    /// The `details` object (name, group, kind, causes), when the real server sends one.
    pub details: Option<Value>,
}

/// One field-level cause of an `Invalid` error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, ...
    pub reason: &'static str,
    /// The message after the field, e.g. `Invalid value: 70000: spec.port in body should be ...`.
    pub message: String,
    /// The field path, e.g. `spec.port`.
    pub field: String,
}

impl Cause {
    /// A cause with the given reason, field and message.
    pub fn new(reason: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            field: field.into(),
        }
    }

    fn render(&self) -> String {
        if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        }
    }
}

impl ApiError {
    /// An error with no details.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 404 for a path that names no resource.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 405 for a verb the resource does not serve.
    pub fn method_not_allowed(method: &str, what: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource: {method} {what}"
            ),
        )
    }

    /// 404 NotFound for a named object, worded like the real server:
    /// `portmaps.kuport.wlz.li "x" not found`.
    pub fn not_found(resource: &Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", resource.qualified()),
        )
        .with_details(resource.details(name))
    }

    /// A custom resource with fields its schema does not know, under `fieldValidation=Strict`,
    /// worded as the real server words it (checked against kube-apiserver 1.37): a sent object
    /// is 400 `<Kind> in version "<v>" cannot be handled as a <Kind>: strict decoding error: ...`;
    /// a patched one is 422 Invalid on the field `patch`, quoting the patched object.
    pub fn strict_decoding(
        resource: &Resource,
        object: &Value,
        unknown: &str,
        patch: bool,
    ) -> Self {
        let kind = &resource.kind;
        if !patch {
            return Self::bad_request(format!(
                "{kind} in version \"{}\" cannot be handled as a {kind}: strict decoding error: {unknown}",
                resource.version
            ));
        }
        let quoted = serde_json::to_string(&Value::String(object.to_string())).unwrap_or_default();
        let message = format!("Invalid value: {quoted}: strict decoding error: {unknown}");
        Self::new(422, "Invalid", format!(" \"\" is invalid: patch: {message}")).with_details(
            json!({"name": "", "group": "", "kind": "",
                   "causes": [{"reason": "FieldValueInvalid", "message": message, "field": "patch"}]}),
        )
    }

    /// 409 AlreadyExists on create.
    pub fn already_exists(resource: &Resource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", resource.qualified()),
        )
        .with_details(resource.details(name))
    }

    /// 409 Conflict on a stale `resourceVersion` (or another failed precondition).
    pub fn conflict(resource: &Resource, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                resource.qualified()
            ),
        )
        .with_details(resource.details(name))
    }

    /// 422 Invalid with field causes. The message lists every cause the way the real server
    /// does: one inline, several in brackets.
    pub fn invalid(resource: &Resource, name: &str, causes: Vec<Cause>) -> Self {
        let rendered: Vec<String> = causes.iter().map(Cause::render).collect();
        let list = match rendered.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut details = resource.details(name);
        details["kind"] = json!(resource.kind);
        details["causes"] = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        let kind = if resource.group.is_empty() {
            resource.kind.clone()
        } else {
            format!("{}.{}", resource.kind, resource.group)
        };
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {list}"),
        )
        .with_details(details)
    }

    /// 422 Invalid from admission, worded as kube-apiserver 1.37 words a ValidatingAdmissionPolicy
    /// denial whose validation says `reason: Invalid`: `<what> is forbidden: ValidatingAdmissionPolicy
    /// '<policy>' with binding '<policy>' denied request: <message>`, the object in `details`
    /// (`resource.details`) and the same message as its one cause.
    pub fn denied(what: &str, policy: &str, message: &str, mut details: Value) -> Self {
        let message = format!(
            "{what} is forbidden: ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: {message}"
        );
        if details.is_object() {
            details["causes"] = json!([{"message": message}]);
        }
        Self::new(422, "Invalid", message).with_details(details)
    }

    /// 422 Invalid for a JSON patch that does not apply (a `test` that fails, a path that is not
    /// there), worded as kube-apiserver 1.37 answers it: the generic message of a 422, with
    /// neither the object nor the patch's error in `details`.
    pub fn patch_not_applied() -> Self {
        Self::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        )
        .with_details(json!({}))
    }

    /// 410 Expired: the requested `resourceVersion` left the bounded history.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object sent as the body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// Errors while building the model (never while serving: requests answer with [`ApiError`]).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A generated CRD lacks something the model reads from it.
    #[error("CRD {crd}: {what}")]
    Crd {
        /// The CRD's name.
        crd: String,
        /// What is wrong with it.
        what: String,
    },
    /// A printer column's JSONPath is outside the subset the model evaluates.
    #[error("CRD {crd}: printer column {column}: {what}")]
    Column {
        /// The CRD's name.
        crd: String,
        /// The column's name.
        column: String,
        /// Why the JSONPath was refused.
        what: String,
    },
    /// A builder setting is out of range.
    #[error("API server model setting {setting}: {what}")]
    Setting {
        /// Which setting.
        setting: &'static str,
        /// Why it was refused.
        what: String,
    },
}
