//! A condition as `kuport status` shows it, for mappings and classes alike.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kuport_core::api::conditions;
use serde::Serialize;

/// `{status, reason, message}` of a condition.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ConditionView {
    pub status: String,
    pub reason: String,
    pub message: String,
}

impl ConditionView {
    pub(super) fn of(c: &Condition) -> Self {
        Self {
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        }
    }

    pub(super) fn is_true(&self) -> bool {
        self.status == conditions::TRUE
    }
}

/// The condition of type `type_`, if there is one.
pub(super) fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}
