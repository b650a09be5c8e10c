//! What an API server's error answer to a status write means: a guarded patch that did not
//! apply (another writer moved what it guards: merge into a fresh read and write again), or a
//! refusal (the object or the request is not allowed: writing it again changes nothing).
//!
//! kube-apiserver answers both with 422 `Invalid`, and tells them apart only by the rest of the
//! `Status` (kube-apiserver 1.37, measured by `agent/daemon/tests/version_skew.rs`): a JSON
//! patch that does not apply (a `test` that fails, a path that is not there) gets the generic
//! message of a 422, `the server rejected our request due to an error in our request`, with
//! nothing in `details` (the patch library's words are dropped); a refusal names the object and
//! why: the CRD's validation (`<Kind>.<group> "<name>" is invalid: <field>: ...`, the fields in
//! `details.causes`), or an admission policy or webhook (`<resource>.<group> "<name>" is
//! forbidden: ValidatingAdmissionPolicy '<policy>' ... denied request: ...`, which is a 422
//! when the policy says `reason: Invalid`, else a 403).

use kube::core::Status;

/// The message kube-apiserver gives every JSON patch that does not apply.
const NOT_APPLIED: &str = "the server rejected our request due to an error in our request";

/// Whether `status` answers a JSON patch that did not apply to the object as stored: its guard
/// (a `test`) failed or a path it names is gone, because another writer changed the object.
pub(crate) fn patch_not_applied(status: &Status) -> bool {
    let names_nothing = status.details.as_ref().is_none_or(|d| {
        d.name.is_empty() && d.kind.is_empty() && d.group.is_empty() && d.causes.is_empty()
    });
    status.code == 422
        && status.reason == "Invalid"
        && status.message == NOT_APPLIED
        && names_nothing
}

/// Why the API server refused a write, as the `reason` label of
/// `kuport_status_write_refusals_total` says it; `None` when the answer is no refusal (a
/// conflict, a patch that did not apply, a missing object, a server error).
pub(crate) fn refusal_reason(status: &Status) -> Option<&'static str> {
    if !matches!(status.code, 403 | 422) || patch_not_applied(status) {
        return None;
    }
    let by_admission = ["ValidatingAdmissionPolicy", "admission webhook"]
        .iter()
        .any(|by| status.message.contains(by));
    Some(match (by_admission, status.code) {
        (true, _) => "admission",
        (false, 422) => "invalid",
        _ => "forbidden",
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn status(body: serde_json::Value) -> Status {
        serde_json::from_value(body).expect("a Status")
    }

    /// The answers kube-apiserver 1.37 gave, as `version_skew.rs` printed them.
    fn failed_test() -> Status {
        status(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "the server rejected our request due to an error in our request",
            "reason": "Invalid", "details": {}, "code": 422}),
        )
    }

    fn denied_by_policy() -> Status {
        status(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "portmapclasses.kuport.wlz.li \"public\" is forbidden: ValidatingAdmissionPolicy 'refuse-n1-rows' with binding 'refuse-n1-rows' denied request: no row of n1",
            "reason": "Invalid",
            "details": {"name": "public", "group": "kuport.wlz.li", "kind": "portmapclasses",
                        "causes": [{"message": "portmapclasses.kuport.wlz.li \"public\" is forbidden: ValidatingAdmissionPolicy 'refuse-n1-rows' with binding 'refuse-n1-rows' denied request: no row of n1"}]},
            "code": 422}),
        )
    }

    fn invalid_by_schema() -> Status {
        status(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "PortMapClass.kuport.wlz.li \"public\" is invalid: status.nodes[0].underlayMTU: Invalid value: \"string\": status.nodes[0].underlayMTU in body must be of type integer: \"string\"",
            "reason": "Invalid",
            "details": {"name": "public", "group": "kuport.wlz.li", "kind": "PortMapClass",
                        "causes": [{"reason": "FieldValueTypeInvalid",
                                    "message": "Invalid value: \"string\": status.nodes[0].underlayMTU in body must be of type integer: \"string\"",
                                    "field": "status.nodes[0].underlayMTU"}]},
            "code": 422}),
        )
    }

    #[test]
    fn a_failed_guard_is_told_from_a_refusal() {
        assert!(patch_not_applied(&failed_test()));
        assert_eq!(refusal_reason(&failed_test()), None);
        assert!(!patch_not_applied(&denied_by_policy()));
        assert_eq!(refusal_reason(&denied_by_policy()), Some("admission"));
        assert!(!patch_not_applied(&invalid_by_schema()));
        assert_eq!(refusal_reason(&invalid_by_schema()), Some("invalid"));
    }

    #[test]
    fn other_answers_are_no_refusal_and_a_403_is_one() {
        let conflict = status(
            json!({"status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled on portmapclasses.kuport.wlz.li \"public\": the object has been modified"}),
        );
        assert_eq!(refusal_reason(&conflict), None);
        assert!(!patch_not_applied(&conflict));
        let forbidden = status(
            json!({"status": "Failure", "reason": "Forbidden", "code": 403,
            "message": "portmapclasses.kuport.wlz.li \"public\" is forbidden: User \"x\" cannot patch resource"}),
        );
        assert_eq!(refusal_reason(&forbidden), Some("forbidden"));
        let mut policy = denied_by_policy();
        policy.code = 403;
        policy.reason = "Forbidden".into();
        assert_eq!(refusal_reason(&policy), Some("admission"));
        // The generic 422 message about a named object is a refusal, not a patch that moved.
        let mut named = failed_test();
        named.details = invalid_by_schema().details;
        assert!(!patch_not_applied(&named));
        assert_eq!(refusal_reason(&named), Some("invalid"));
    }
}
