//! Preflight classes and their lifetime. A preflight class (`kuport preflight` creates one)
//! makes every agent build and probe a link to every other accepting node; one left behind by a
//! run that could not clean up (SIGKILL, a lost connection) would do so forever. So each carries
//! a deadline, and every agent, `kuport status` and the next `kuport preflight` read the same
//! verdict from it: [`preflight_life`].

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::PortMapClass;

/// The class annotation that makes a class a preflight class when its value is `true`: every pair
/// of its accepting nodes needs a return link, without any PortMap, so the agents build, probe
/// and report a link between every pair (`kuport preflight` creates such a class).
pub const PREFLIGHT_ANNOTATION: &str = "kuport.wlz.li/preflight";

/// The preflight class annotation that ends its life: an RFC 3339 time after which (plus
/// [`PREFLIGHT_CLOCK_SKEW_SECONDS`]) the agents take its links down, `kuport status` reports it
/// and the next `kuport preflight` replaces it.
pub const PREFLIGHT_DEADLINE_ANNOTATION: &str = "kuport.wlz.li/preflight-deadline";

/// How long after its deadline a preflight class still counts as live: every reader compares
/// the deadline to its own clock, and the clock of the `kuport preflight` that wrote it may be
/// behind theirs. The agents' own clocks may still differ from each other; during that spell one
/// end of a link is down before the other, which only a preflight class's links (that carry no
/// traffic) ever see.
pub const PREFLIGHT_CLOCK_SKEW_SECONDS: i64 = 60;

/// The life of a preflight class without a deadline (one an older `kuport preflight` created),
/// counted from its `creationTimestamp`: the API server's time, the same for every reader.
pub const PREFLIGHT_UNDATED_LIFETIME_SECONDS: i64 = 60 * 60;

/// True when `class` carries [`PREFLIGHT_ANNOTATION`] set to `true`.
pub fn is_preflight(class: &PortMapClass) -> bool {
    class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PREFLIGHT_ANNOTATION))
        .is_some_and(|v| v.trim() == "true")
}

/// Where a preflight class stands at a given time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreflightLife {
    /// Its links are built; they are taken down from `until` (`None`: a class with neither a
    /// deadline nor a creation time, which never expires).
    Live { until: Option<Timestamp> },
    /// Its deadline passed: it needs no link. `message` says when and what to do, the same on
    /// every reader.
    Expired { message: String },
}

/// The life of `class` at `now`; `None` when it is not a preflight class. The deadline is
/// [`PREFLIGHT_DEADLINE_ANNOTATION`], or without it the creation time plus
/// [`PREFLIGHT_UNDATED_LIFETIME_SECONDS`]; it counts [`PREFLIGHT_CLOCK_SKEW_SECONDS`] late. A
/// deadline that is not an RFC 3339 time has passed: a class nobody can date builds nothing.
pub fn preflight_life(class: &PortMapClass, now: Timestamp) -> Option<PreflightLife> {
    if !is_preflight(class) {
        return None;
    }
    let name = class.metadata.name.as_deref().unwrap_or_default();
    let remedy = format!(
        "an interrupted kuport preflight left it: delete it (kubectl delete portmapclass {name}) or run kuport preflight again, which replaces it"
    );
    let annotated = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PREFLIGHT_DEADLINE_ANNOTATION));
    let (deadline, what) = match annotated {
        Some(text) => match text.trim().parse::<Timestamp>() {
            Ok(t) => (
                t,
                format!("its deadline {t} ({PREFLIGHT_DEADLINE_ANNOTATION}) has passed"),
            ),
            Err(_) => {
                return Some(PreflightLife::Expired {
                    message: format!(
                        "preflight class {name}: {PREFLIGHT_DEADLINE_ANNOTATION} {text:?} is not an RFC 3339 time, so it builds no link; {remedy}"
                    ),
                });
            }
        },
        None => match &class.metadata.creation_timestamp {
            Some(created) => (
                created.0 + SignedDuration::from_secs(PREFLIGHT_UNDATED_LIFETIME_SECONDS),
                format!(
                    "it has no {PREFLIGHT_DEADLINE_ANNOTATION}, and the {} minutes from its creation at {} have passed",
                    PREFLIGHT_UNDATED_LIFETIME_SECONDS / 60,
                    created.0
                ),
            ),
            None => return Some(PreflightLife::Live { until: None }),
        },
    };
    let until = deadline + SignedDuration::from_secs(PREFLIGHT_CLOCK_SKEW_SECONDS);
    if now < until {
        return Some(PreflightLife::Live { until: Some(until) });
    }
    Some(PreflightLife::Expired {
        message: format!(
            "preflight class {name} expired: {what} (counted {PREFLIGHT_CLOCK_SKEW_SECONDS} s late for clock skew), so its links are taken down; {remedy}"
        ),
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::*;

    fn class(annotations: serde_json::Value) -> PortMapClass {
        serde_json::from_value(json!({
            "apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMapClass",
            "metadata": {"name": "kuport-preflight", "annotations": annotations},
            "spec": {"nodes": {}, "returnPath": {"mode": "Vxlan", "vxlan": {"port": 4790, "subnet": "169.254.112.0/20", "vni": 60000}}},
        }))
        .expect("a class")
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a time")
    }

    #[test]
    fn a_deadline_counts_a_minute_late() {
        let c = class(json!({PREFLIGHT_ANNOTATION: "true",
            PREFLIGHT_DEADLINE_ANNOTATION: "2026-06-01T12:00:00Z"}));
        let until = at("2026-06-01T12:01:00Z");
        assert_eq!(
            preflight_life(&c, at("2026-06-01T12:00:59Z")),
            Some(PreflightLife::Live { until: Some(until) })
        );
        let Some(PreflightLife::Expired { message }) = preflight_life(&c, until) else {
            panic!("expired at its deadline plus the skew");
        };
        assert!(message.contains("2026-06-01T12:00:00Z"), "{message}");
        assert!(
            message.contains("kubectl delete portmapclass kuport-preflight"),
            "{message}"
        );
    }

    #[test]
    fn without_a_deadline_the_creation_time_dates_it_and_without_either_it_lives() {
        let mut c = class(json!({PREFLIGHT_ANNOTATION: "true"}));
        assert_eq!(
            preflight_life(&c, at("2030-01-01T00:00:00Z")),
            Some(PreflightLife::Live { until: None })
        );
        c.metadata.creation_timestamp = Some(Time(at("2026-06-01T12:00:00Z")));
        assert!(matches!(
            preflight_life(&c, at("2026-06-01T12:59:00Z")),
            Some(PreflightLife::Live { .. })
        ));
        assert!(matches!(
            preflight_life(&c, at("2026-06-01T13:01:00Z")),
            Some(PreflightLife::Expired { .. })
        ));
    }

    #[test]
    fn an_unreadable_deadline_has_passed_and_other_classes_have_no_life() {
        let c = class(json!({PREFLIGHT_ANNOTATION: "true",
            PREFLIGHT_DEADLINE_ANNOTATION: "tomorrow"}));
        let Some(PreflightLife::Expired { message }) =
            preflight_life(&c, at("2026-06-01T12:00:00Z"))
        else {
            panic!("an unreadable deadline expires the class");
        };
        assert!(
            message.contains("\"tomorrow\" is not an RFC 3339"),
            "{message}"
        );
        let plain = class(json!({PREFLIGHT_DEADLINE_ANNOTATION: "2020-01-01T00:00:00Z"}));
        assert_eq!(preflight_life(&plain, at("2026-06-01T12:00:00Z")), None);
    }
}
