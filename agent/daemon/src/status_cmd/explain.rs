//! The step-by-step explanation of one mapping (`kuport status <namespace>/<name>`), from the
//! same dump and the same plan as the report: what every agent computes for it, what its status
//! says and whether that agrees, and its Events. Pure, like the report.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kuport_core::api::{PortMap, PortMapClass, conditions};
use kuport_core::plan::{MappingDecision, Plan};
use serde::Serialize;

use super::agents::{AgentSelector, agents};
use super::render::{
    ConditionView, MappingView, ago, check_mapping, escape_fields, global_plan, mapping_view, mode,
    ns_name, plan_complete, plan_missing, serving,
};
use super::terminal::{Escape, escape_keeping_lines};
use crate::objects::Dump;

/// One step of an explanation.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub title: String,
    /// `ok`, `failed`, or `skipped` (an earlier step failed).
    pub state: &'static str,
    pub details: Vec<String>,
}

/// An Event about a mapping, as `-o json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct EventView {
    pub time: Option<String>,
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
}

/// The explanation of one mapping: what `kuport status <ns>/<name>` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    pub ok: bool,
    pub mapping: MappingView,
    pub steps: Vec<Step>,
    pub events: Vec<EventView>,
}

escape_fields! {
    Step => title, details;
    EventView => time, type_, reason, message;
    Explanation => mapping, steps, events;
}

fn step(title: impl Into<String>, ok: bool, details: Vec<String>) -> Step {
    Step {
        title: title.into(),
        state: if ok { "ok" } else { "failed" },
        details,
    }
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

fn events_of(events: &[Event], pm: &PortMap) -> Vec<EventView> {
    let (namespace, name) = ns_name(pm);
    let mut found: Vec<(Option<Timestamp>, String, EventView)> = events
        .iter()
        .filter(|e| {
            let o = &e.involved_object;
            o.kind.as_deref() == Some("PortMap")
                && o.namespace.as_deref() == Some(namespace.as_str())
                && o.name.as_deref() == Some(name.as_str())
                && (o.uid.is_none() || pm.metadata.uid.is_none() || o.uid == pm.metadata.uid)
        })
        .map(|e| {
            let t = event_time(e);
            let view = EventView {
                time: t.map(|t| t.to_string()),
                type_: e.type_.clone().unwrap_or_default(),
                reason: e.reason.clone().unwrap_or_default(),
                message: e.message.clone().unwrap_or_default(),
                count: e
                    .series
                    .as_ref()
                    .and_then(|s| s.count)
                    .or(e.count)
                    .unwrap_or(1),
            };
            (t, e.metadata.name.clone().unwrap_or_default(), view)
        })
        .collect();
    found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    found.into_iter().map(|(_, _, v)| v).collect()
}

fn outcome_line(c: &Option<ConditionView>) -> String {
    c.as_ref().map_or_else(
        || "(not written)".to_owned(),
        |c| {
            if c.message.is_empty() {
                format!("{} {}", c.status, c.reason)
            } else {
                format!("{} {}: {}", c.status, c.reason, c.message)
            }
        },
    )
}

fn plan_line<R>(o: &kuport_core::plan::Outcome<R>, ok: bool, name: &str) -> String
where
    R: Copy + Into<&'static str>,
{
    let reason: &'static str = o.reason.into();
    let status = conditions::status(ok);
    if o.message.is_empty() {
        format!("{name} {status} {reason}")
    } else {
        format!("{name} {status} {reason}: {}", o.message)
    }
}

/// Explains one mapping step by step from the dump: the plan every agent computes for it
/// (class, acceptance, endpoint, nodes, return links, Programmed, published addresses), then
/// what its status says and whether that agrees, then its Events. `None` when the dump holds
/// no such PortMap.
pub fn explain(
    dump: &Dump,
    namespace: &str,
    name: &str,
    now: Timestamp,
    selector: &AgentSelector,
) -> Option<Explanation> {
    let snapshot = &dump.snapshot;
    let pm = snapshot.portmaps.iter().find(|pm| {
        pm.metadata.namespace.as_deref() == Some(namespace)
            && pm.metadata.name.as_deref() == Some(name)
    })?;
    let plan = global_plan(snapshot, now);
    let d: &MappingDecision = plan
        .portmaps
        .iter()
        .find(|d| d.namespace == namespace && d.name == name)?;
    let mut mapping = mapping_view(pm);
    let needed = d.endpoint.iter().map(|e| e.node.to_string()).collect();
    let agents = agents(dump, selector, &needed, now);
    check_mapping(&mut mapping, &plan, plan_complete(dump), &agents);
    let class = snapshot
        .classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(d.class.as_str()));
    if !plan_complete(dump) {
        return Some(unexplained(dump, pm, mapping));
    }
    let accepted = d.accepted.is_true();
    let programmed_ok = d.programmed.as_ref().is_some_and(|p| p.is_true());
    let mut steps = vec![
        class_step(d, class, &plan),
        step(
            "accepted",
            accepted,
            vec![plan_line(&d.accepted, accepted, conditions::ACCEPTED)],
        ),
        endpoint_step(d, pm, namespace),
        nodes_step(d, class),
        links_step(d),
        step("programmed", programmed_ok, programmed_details(d)),
    ];
    // The first failing step is the cause; the steps after it are context, not verdicts.
    if let Some(first) = steps.iter().position(|s| s.state == "failed") {
        for s in steps.iter_mut().skip(first + 1) {
            s.state = "skipped";
        }
    }
    let (written, agrees) = status_step(d, &mapping);
    steps.push(written);

    let ok = mapping.ok && programmed_ok && agrees;
    Some(Explanation {
        ok,
        mapping,
        steps,
        events: events_of(&dump.events, pm),
    })
}

/// The explanation when the inputs of the agents' computation could not all be read (a user
/// whose RBAC covers only their namespace): computed from part of them, the steps would blame
/// what was not read (a class "that does not exist"), so only the written status is shown.
fn unexplained(dump: &Dump, pm: &PortMap, mapping: MappingView) -> Explanation {
    let missing = plan_missing(dump);
    let steps = vec![
        Step {
            title: "computed by the agents".to_owned(),
            state: "skipped",
            details: vec![format!(
                "not computed: {} could not be read",
                missing.join(", ")
            )],
        },
        step(
            "status as written",
            mapping.ok,
            vec![
                format!("Accepted {}", outcome_line(&mapping.accepted)),
                format!("Programmed {}", outcome_line(&mapping.programmed)),
            ],
        ),
    ];
    Explanation {
        ok: mapping.ok,
        mapping,
        steps,
        events: events_of(&dump.events, pm),
    }
}

/// Step 1: the mapping's class, its return path, serving mode, nodes and readiness.
fn class_step(d: &MappingDecision, class: Option<&PortMapClass>, plan: &Plan) -> Step {
    let Some(c) = class else {
        return step(
            format!("class {}", d.class),
            false,
            vec![format!("no PortMapClass named {} exists", d.class)],
        );
    };
    let ready = plan.classes.iter().find(|x| x.name == d.class);
    let mut details = vec![format!(
        "return path {}, serving {}, nodes {}",
        mode(c),
        serving(c),
        c.spec.nodes.keys().cloned().collect::<Vec<_>>().join(", ")
    )];
    if let Some(r) = ready {
        details.push(plan_line(&r.ready, r.ready.is_true(), conditions::READY));
    }
    step(format!("class {}", d.class), true, details)
}

/// Step 3: the endpoint chosen among the Service's, and those skipped.
fn endpoint_step(d: &MappingDecision, pm: &PortMap, namespace: &str) -> Step {
    let accepted = d.accepted.is_true();
    let service = format!(
        "Service {}/{} port {:?}",
        namespace, pm.spec.service_ref.name, pm.spec.service_ref.port
    );
    let mut details = match &d.endpoint {
        None if !accepted => vec![format!(
            "{service}: not chosen, the mapping is not accepted"
        )],
        Some(e) => vec![format!(
            "{service}: pod {} on {}, {}:{}{}",
            e.pod.as_deref().unwrap_or("(unnamed)"),
            e.node,
            e.address,
            e.port,
            e.address6
                .map(|a| format!(" and [{a}]:{}", e.port))
                .unwrap_or_default()
        )],
        None if !d.rejected_endpoints.is_empty() => {
            let mut lines = vec![format!(
                "{service} has ready endpoints, but none is a pod address of the cluster:"
            )];
            lines.extend(rejected_lines(d));
            lines
        }
        None => vec![format!("{service} has no ready endpoint")],
    };
    if d.endpoint.is_some() && !d.rejected_endpoints.is_empty() {
        details.push("skipped, not pod addresses of the cluster:".to_owned());
        details.extend(rejected_lines(d));
    }
    step("endpoint", d.endpoint.is_some(), details)
}

/// Step 4: the nodes that program the mapping, what each binds and its row, the status writer.
fn nodes_step(d: &MappingDecision, class: Option<&PortMapClass>) -> Step {
    let mut details = Vec::new();
    if let Some(s) = &d.serving_node {
        details.push(format!("serving node {s}"));
    }
    if !d.programming_nodes.is_empty() {
        details.push(format!("programmed on {}", d.programming_nodes.join(", ")));
    }
    for (node, ifaces) in d.bindings.iter() {
        let row = class
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.nodes.iter().find(|r| &r.name == node));
        let row_text = match row {
            None => "no row from its agent".to_owned(),
            Some(r) if r.ready => "row ready".to_owned(),
            Some(r) => format!(
                "row not ready: {}",
                r.message.as_deref().unwrap_or("no message")
            ),
        };
        details.push(format!("{node}: binds {} ({row_text})", ifaces.join(", ")));
    }
    if let Some(w) = &d.status_writer {
        details.push(format!("status writer {w}"));
    }
    step("nodes", !d.programming_nodes.is_empty(), details)
}

/// Step 5: the return links the mapping needs, and its standby links.
fn links_step(d: &MappingDecision) -> Step {
    let links_ok = d.links.iter().all(|l| l.landed);
    let link_line = |l: &kuport_core::plan::NeededLink, role: &str| match (l.slot, l.landed) {
        (Some(s), true) => format!("{}{role}: slot {s}, claimed", l.key),
        (Some(s), false) => format!("{}{role}: slot {s} proposed, not claimed yet", l.key),
        (None, _) => format!("{}{role}: no free slot", l.key),
    };
    let mut details: Vec<String> = if d.endpoint.is_none() {
        vec!["none: no endpoint is chosen".to_owned()]
    } else if d.links.is_empty() {
        vec!["none needed: the pod runs on every node that programs the mapping".to_owned()]
    } else {
        d.links.iter().map(|l| link_line(l, "")).collect()
    };
    // Standby links only make a failover fast; the mapping works without them, so they are
    // listed but take no part in this step's verdict.
    details.extend(d.standby_links.iter().map(|l| link_line(l, " (standby)")));
    step("return links", links_ok, details)
}

/// Step 6's details: the Programmed condition the plan computes and the published addresses.
fn programmed_details(d: &MappingDecision) -> Vec<String> {
    let programmed = d.programmed.as_ref().map_or_else(
        || "no Programmed condition: the mapping is not accepted".to_owned(),
        |p| plan_line(p, p.is_true(), conditions::PROGRAMMED),
    );
    let mut published: Vec<String> = d
        .published
        .iter()
        .map(|p| {
            let a = match (p.address.as_str(), p.address6.as_str()) {
                ("", "") => "(address not reported yet)".to_owned(),
                (v4, "") => v4.to_owned(),
                ("", v6) => v6.to_owned(),
                (v4, v6) => format!("{v4} and {v6}"),
            };
            format!("published {a} on {} {}", p.node, p.interface)
        })
        .collect();
    published.insert(0, programmed);
    published
}

/// Step 7: the written status against the plan; with whether they agree.
fn status_step(d: &MappingDecision, mapping: &MappingView) -> (Step, bool) {
    let mut details = vec![
        format!("Accepted {}", outcome_line(&mapping.accepted)),
        format!("Programmed {}", outcome_line(&mapping.programmed)),
    ];
    let planned_reason = d.programmed.as_ref().map(|p| p.reason.as_str());
    let written_reason = mapping.programmed.as_ref().map(|p| p.reason.as_str());
    let writer = d.status_writer.as_deref().unwrap_or("the status writer");
    let agrees = mapping.current
        && mapping.accepted.as_ref().map(|a| a.reason.as_str()) == Some(d.accepted.reason.as_str())
        && written_reason == planned_reason
        && mapping.agrees != Some(false);
    if !mapping.current {
        details.push(
            "the status was not computed from the current spec: the status writer has not caught up"
                .to_owned(),
        );
    } else if !agrees {
        details.push(format!(
            "the status differs from what the agents compute now: {writer} has not written it yet (is its agent running?)",
        ));
    }
    let writer_down = mapping.writer_running == Some(false);
    if writer_down {
        details.push(format!(
            "it is written by node {writer}, whose agent is not running: it may be stale"
        ));
    }
    if !mapping.nodes_without_agent.is_empty() {
        details.push(format!(
            "it needs node {}, whose agent is not running: its part there may be missing or no longer kept",
            mapping.nodes_without_agent.join(", ")
        ));
    }
    let trusted = agrees && !writer_down && mapping.nodes_without_agent.is_empty();
    (step("status as written", trusted, details), trusted)
}

/// An explanation as text.
pub fn explain_text(e: &Explanation, now: Timestamp) -> String {
    let mut e = e.clone();
    e.escape_all();
    let out = explanation_text(&e, now);
    escape_keeping_lines(&out).into_owned()
}

fn explanation_text(e: &Explanation, now: Timestamp) -> String {
    let m = &e.mapping;
    let mut out = format!(
        "PortMap {}/{}: {}/{} in class {}\n",
        m.namespace, m.name, m.protocol, m.ports, m.class
    );
    for (i, s) in e.steps.iter().enumerate() {
        let mark = match s.state {
            "ok" => "ok",
            "failed" => "FAILED",
            _ => "--",
        };
        let _ = writeln!(out, "{}. [{mark}] {}", i + 1, s.title);
        for d in &s.details {
            let _ = writeln!(out, "     {d}");
        }
    }
    if e.events.is_empty() {
        out.push_str("Events: none\n");
    } else {
        out.push_str("Events:\n");
        for ev in &e.events {
            let when = ev
                .time
                .as_deref()
                .map_or_else(|| "-".to_owned(), |t| ago(t, now));
            let count = if ev.count > 1 {
                format!(" (x{})", ev.count)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  {when}  {} {}{count}: {}",
                ev.type_, ev.reason, ev.message
            );
        }
    }
    out.push_str(if e.ok {
        "The mapping is programmed.\n"
    } else {
        "The mapping is not programmed.\n"
    });
    out
}

/// One line per endpoint the plan left out, saying why.
fn rejected_lines(d: &MappingDecision) -> Vec<String> {
    d.rejected_endpoints
        .iter()
        .map(|r| {
            let pod = r
                .pod
                .as_deref()
                .map_or(String::new(), |p| format!(" (pod {p})"));
            format!("  {} on {}{pod}: {}", r.address, r.node, r.reason)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standby_links_are_listed_without_deciding_the_links_step() {
        let c = kuport_testkit::cluster::two_edges_and_worker("169.254.77.0/24").claim(
            "public",
            "edge-a/worker-b",
            0,
        );
        let dump = Dump {
            snapshot: c.snapshot,
            ..Dump::default()
        };
        let now = kuport_testkit::cluster::now();
        let e = explain(&dump, "games", "gs", now, &AgentSelector::default())
            .expect("the mapping is explained");
        let links = e
            .steps
            .iter()
            .find(|s| s.title == "return links")
            .expect("a return links step");
        assert_eq!(
            links.details,
            [
                "edge-a/worker-b: slot 0, claimed",
                "edge-c/worker-b (standby): slot 1 proposed, not claimed yet"
            ],
            "{e:#?}"
        );
        assert_eq!(links.state, "ok", "an unclaimed standby link fails nothing");
    }
}
