//! The pure part of `kuport status`: from a dump of the cluster (the objects and Events, read
//! live or from files) to the report, its text and JSON forms, and the step-by-step explanation
//! of one mapping. Nothing here performs I/O or reads the clock, so recorded dumps give golden
//! outputs.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use kuport_core::api::{PortMap, PortMapClass, conditions};
use kuport_core::plan::Plan;
use kuport_core::snapshot::{HostFacts, Snapshot};
use serde::Serialize;

pub(super) use super::agents::ago;
use super::agents::{
    AgentSelector, AgentState, AgentView, Agents, DaemonSetView, agent_state_text, agents,
    image_version,
};
pub use super::classes::{ClassNodeView, ClassView, LinkView};
use super::classes::{check_problems, class_problems, class_text, class_view};
pub(super) use super::classes::{mode, serving};
pub use super::condition::ConditionView;
use super::condition::condition;
use super::terminal::{Escape, escape_keeping_lines};
use crate::objects::{Dump, Unread};

/// The node name the offline plan is computed for: no Node can be named so (a name is a DNS
/// subdomain), so every node is seen through its class rows alike, and the global decisions
/// (acceptance, endpoint, serving and programming nodes, Programmed) do not depend on it.
const NO_NODE: &str = "(kuport status)";

/// The endpoint a mapping delivers to, as its status says.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointView {
    pub pod: Option<String>,
    pub node: String,
    pub address: String,
    pub port: i32,
    /// The pod's IPv6 address when the mapping is served over IPv6 too.
    #[serde(rename = "ipv6Address", skip_serializing_if = "Option::is_none")]
    pub address6: Option<String>,
}

/// One mapping, as its status says.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MappingView {
    pub namespace: String,
    pub name: String,
    pub class: String,
    pub protocol: String,
    /// `3000` or `3000-3009`.
    pub ports: String,
    /// Every published address (empty ones shown as `?`), in status order.
    pub published: Vec<String>,
    pub endpoint: Option<EndpointView>,
    pub accepted: Option<ConditionView>,
    pub programmed: Option<ConditionView>,
    /// True when the status was computed from the current spec (`observedGeneration` equals
    /// `metadata.generation`).
    pub current: bool,
    /// The node that writes this status, as the agents compute it from the current objects.
    pub status_writer: Option<String>,
    /// What the agents compute for it from the current objects; `null` when `kuport status`
    /// could not read every input of that computation.
    pub computed: Option<ComputedView>,
    /// Whether the written status says what is computed (Accepted, Programmed, the endpoint);
    /// `null` when not compared (not computed, or written from an older spec).
    pub agrees: Option<bool>,
    /// Whether the status writer's agent runs; `null` when not known.
    pub writer_running: Option<bool>,
    /// The other nodes that program a part of it (accepting nodes, the pod's node) whose agent
    /// is known not to run, sorted: their part may be missing or no longer kept.
    pub nodes_without_agent: Vec<String>,
    /// True when the port answers: Programmed is True on a current status, which says what the
    /// agents compute now, written by a node whose agent runs.
    pub ok: bool,
}

/// What the agents compute for a mapping from the current objects.
#[derive(Clone, Debug, Serialize)]
pub struct ComputedView {
    /// `True` or `False`; `null` when the mapping is not accepted.
    pub programmed: Option<String>,
    pub endpoint: Option<EndpointView>,
}

/// The whole report: what `-o json` prints.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// False when anything is listed under `problems`.
    pub ok: bool,
    pub mappings: Vec<MappingView>,
    pub classes: Vec<ClassView>,
    /// One line per node: every Node of the cluster, and every node a class row or an agent
    /// Pod names.
    pub agents: Vec<AgentView>,
    /// One sentence per thing that is not working, naming it.
    pub problems: Vec<String>,
    /// The namespace the mappings were limited to (`-n`); `null` for every namespace.
    pub namespace: Option<String>,
    /// The kuport DaemonSets; `null` when they could not be read.
    pub daemon_sets: Option<Vec<DaemonSetView>>,
    /// What could not be read (the report says nothing about it), and why.
    pub unread: Vec<Unread>,
}

/// What the report covers: the mappings of one namespace or all, and where the agents are.
#[derive(Clone, Debug, Default)]
pub struct ReportOptions {
    pub namespace: Option<String>,
    pub agents: AgentSelector,
}

/// `impl Escape` for a view: every listed field escaped (the rest are numbers and flags).
macro_rules! escape_fields {
    ($($ty:ty => $($field:ident),+;)*) => {$(
        impl Escape for $ty {
            fn escape_all(&mut self) {
                $(self.$field.escape_all();)+
            }
        }
    )*};
}

escape_fields! {
    ConditionView => status, reason, message;
    EndpointView => pod, node, address;
    MappingView => namespace, name, class, protocol, ports, published, endpoint, accepted,
        programmed, status_writer, computed, nodes_without_agent;
    ClassNodeView => name, message, addresses;
    LinkView => key, subnet, unused_since, used_by;
    ClassView => name, mode, serving_mode, ready, nodes, links, expired;
    AgentView => node, version, last_pass_time, classes, pod, image, waiting;
    DaemonSetView => namespace, name, image;
    Unread => what, why;
    ComputedView => programmed, endpoint;
    StatusReport => mappings, classes, agents, problems, namespace, daemon_sets, unread;
}

pub(super) use escape_fields;

fn ports(pm: &PortMap) -> String {
    match pm.spec.end_port {
        Some(end) if end != pm.spec.port => format!("{}-{end}", pm.spec.port),
        _ => pm.spec.port.to_string(),
    }
}

pub(super) fn ns_name(pm: &PortMap) -> (String, String) {
    (
        pm.metadata.namespace.clone().unwrap_or_default(),
        pm.metadata.name.clone().unwrap_or_default(),
    )
}

pub(super) fn mapping_view(pm: &PortMap) -> MappingView {
    let (namespace, name) = ns_name(pm);
    let status = pm.status.clone().unwrap_or_default();
    let current = status.observed_generation.is_some()
        && status.observed_generation == pm.metadata.generation.or(status.observed_generation);
    let programmed = condition(&status.conditions, conditions::PROGRAMMED).map(ConditionView::of);
    let ok = current && programmed.as_ref().is_some_and(ConditionView::is_true);
    MappingView {
        namespace,
        name,
        class: pm.spec.class_name.clone(),
        protocol: pm.spec.protocol.as_str().to_owned(),
        ports: ports(pm),
        published: status
            .published
            .iter()
            .flat_map(|p| {
                let addresses: Vec<String> = [&p.address, &p.address6]
                    .into_iter()
                    .filter(|a| !a.is_empty())
                    .cloned()
                    .collect();
                if addresses.is_empty() {
                    vec![kuport_core::summary::UNRESOLVED.to_owned()]
                } else {
                    addresses
                }
            })
            .collect(),
        endpoint: status.endpoint.map(|e| EndpointView {
            pod: e.pod,
            node: e.node,
            address: e.address,
            port: e.port,
            address6: e.address6,
        }),
        accepted: condition(&status.conditions, conditions::ACCEPTED).map(ConditionView::of),
        programmed,
        current,
        status_writer: None,
        computed: None,
        agrees: None,
        writer_running: None,
        nodes_without_agent: Vec::new(),
        ok,
    }
}

/// A problem with what the written status says (whether it can be trusted is
/// [`trust_problem`]'s).
fn mapping_problem(m: &MappingView) -> Option<String> {
    let who = format!("PortMap {}/{}", m.namespace, m.name);
    if m.current && m.programmed.as_ref().is_some_and(ConditionView::is_true) {
        return None;
    }
    Some(match (&m.accepted, &m.programmed) {
        (None, _) => format!(
            "{who} has no status yet: no agent has written it (is kuport running on the nodes of class {}?)",
            m.class
        ),
        _ if !m.current => format!(
            "{who}: its status was computed from an older spec (the status writer has not caught up)"
        ),
        (Some(a), _) if !a.is_true() => {
            format!("{who} is not accepted: {} ({})", a.reason, a.message)
        }
        (Some(_), Some(p)) => format!("{who} is not programmed: {} ({})", p.reason, p.message),
        (Some(_), None) => format!("{who} is accepted but has no Programmed condition yet"),
    })
}

/// The offline plan over the dump: the global decisions every agent computes alike.
pub(super) fn global_plan(snapshot: &Snapshot, now: Timestamp) -> Plan {
    kuport_core::plan::plan(snapshot, NO_NODE, &HostFacts::default(), now)
}

/// The kinds the offline plan reads: without every one of them, what `kuport status`
/// computes is not what the agents compute, and it compares nothing with the written status.
const PLAN_INPUTS: [&str; 5] = [
    "PortMapClasses",
    "Nodes",
    "Namespaces",
    "EndpointSlices",
    "PortMaps in other namespaces",
];

/// The inputs of the plan the dump lacks.
pub(super) fn plan_missing(dump: &Dump) -> Vec<&str> {
    dump.unread
        .iter()
        .map(|u| u.what.as_str())
        .filter(|w| PLAN_INPUTS.contains(w))
        .collect()
}

/// Whether the dump holds every input of the plan.
pub(super) fn plan_complete(dump: &Dump) -> bool {
    plan_missing(dump).is_empty()
}

/// The nodes an agent must run on whatever the DaemonSets' nodeSelector says: those the
/// classes name, and the nodes of the mappings' pods (written and computed).
fn needed_nodes(snapshot: &Snapshot, plan: &Plan) -> BTreeSet<String> {
    let named = snapshot
        .classes
        .iter()
        .flat_map(|c| c.spec.nodes.keys().cloned());
    let written = snapshot
        .portmaps
        .iter()
        .filter_map(|pm| Some(pm.status.as_ref()?.endpoint.as_ref()?.node.clone()));
    let computed = plan
        .portmaps
        .iter()
        .filter_map(|d| Some(d.endpoint.as_ref()?.node.to_string()));
    named.chain(written).chain(computed).collect()
}

/// The report over a dump.
pub fn report(dump: &Dump, now: Timestamp, options: &ReportOptions) -> StatusReport {
    let snapshot = &dump.snapshot;
    let plan = global_plan(snapshot, now);
    let agents = agents(dump, &options.agents, &needed_nodes(snapshot, &plan), now);
    let complete = plan_complete(dump);
    let mut portmaps: Vec<&PortMap> = snapshot
        .portmaps
        .iter()
        .filter(|pm| {
            options
                .namespace
                .as_ref()
                .is_none_or(|ns| pm.metadata.namespace.as_ref() == Some(ns))
        })
        .collect();
    portmaps.sort_by_key(|pm| ns_name(pm));
    let mappings: Vec<MappingView> = portmaps
        .into_iter()
        .map(|pm| {
            let mut m = mapping_view(pm);
            check_mapping(&mut m, &plan, complete, &agents);
            m
        })
        .collect();
    let mut classes: Vec<&PortMapClass> = snapshot.classes.iter().collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    // With a namespace, only the classes its mappings use can make its report fail.
    let used: BTreeSet<&str> = mappings.iter().map(|m| m.class.as_str()).collect();
    let classes: Vec<ClassView> = classes
        .into_iter()
        .map(|c| class_view(c, snapshot, &plan, now))
        .collect();
    let mut problems = agents.problems.clone();
    for m in &mappings {
        problems.extend(mapping_problem(m));
        problems.extend(trust_problem(m));
        problems.extend(agentless_problem(m));
    }
    for c in classes
        .iter()
        .filter(|c| options.namespace.is_none() || used.contains(c.name.as_str()))
    {
        class_problems(c, &mut problems);
    }
    check_problems(
        snapshot.classes.iter().filter(|c| {
            options.namespace.is_none()
                || used.contains(c.metadata.name.as_deref().unwrap_or_default())
        }),
        &mut problems,
    );
    let mut unread = dump.unread.clone();
    unread.sort();
    unread.dedup();
    StatusReport {
        ok: problems.is_empty(),
        mappings,
        classes,
        agents: agents.nodes,
        problems,
        namespace: options.namespace.clone(),
        daemon_sets: agents.daemon_sets,
        unread,
    }
}

/// Fills in what the agents compute for the mapping, whether its written status says the
/// same, and whether its status writer's agent runs; a mapping whose status cannot be trusted
/// is not `ok`, whatever it says.
pub(super) fn check_mapping(m: &mut MappingView, plan: &Plan, complete: bool, agents: &Agents) {
    let Some(d) = plan
        .portmaps
        .iter()
        .find(|d| d.namespace == m.namespace && d.name == m.name)
    else {
        return;
    };
    let running = |node: &str| {
        agents.of(node).and_then(|a| match a.state {
            _ if a.stale => Some(false),
            s if s.down() => Some(false),
            AgentState::Ready => Some(true),
            _ => None,
        })
    };
    m.status_writer = d.status_writer.as_deref().map(str::to_owned);
    m.writer_running = d.status_writer.as_deref().and_then(running);
    // The other nodes that program a part of it: the accepting nodes, and the pod's node (its
    // half of the return link), when the pod is elsewhere.
    let others: BTreeSet<&str> = d
        .programming_nodes
        .iter()
        .map(|n| n.as_str())
        .chain(d.endpoint.as_ref().map(|e| e.node.as_str()))
        .filter(|n| Some(*n) != d.status_writer.as_deref())
        .collect();
    m.nodes_without_agent = others
        .into_iter()
        .filter(|n| running(n) == Some(false))
        .map(str::to_owned)
        .collect();
    if complete {
        let computed = ComputedView {
            programmed: d
                .programmed
                .as_ref()
                .map(|p| conditions::status(p.is_true()).to_owned()),
            endpoint: d.endpoint.as_ref().map(|e| EndpointView {
                pod: e.pod.clone(),
                node: e.node.to_string(),
                address: e.address.to_string(),
                port: i32::from(e.port),
                address6: e.address6.map(|a| a.to_string()),
            }),
        };
        if m.current && m.accepted.is_some() {
            let written_accepted = m.accepted.as_ref().is_some_and(ConditionView::is_true);
            let same_endpoint = match (&m.endpoint, &computed.endpoint) {
                (None, None) => true,
                (Some(w), Some(c)) => {
                    (&w.node, &w.address, w.port) == (&c.node, &c.address, c.port)
                }
                _ => false,
            };
            m.agrees = Some(
                written_accepted == d.accepted.is_true()
                    && m.programmed.as_ref().map(|p| p.status.as_str())
                        == computed.programmed.as_deref()
                    && same_endpoint,
            );
        }
        m.computed = Some(computed);
    }
    if m.agrees == Some(false)
        || m.writer_running == Some(false)
        || !m.nodes_without_agent.is_empty()
    {
        m.ok = false;
    }
}

/// `Programmed=True, endpoint 10.244.2.5:4000 on worker-c`.
fn said(programmed: Option<&str>, endpoint: Option<&EndpointView>) -> String {
    let endpoint = endpoint.map_or_else(
        || "no endpoint".to_owned(),
        |e| format!("endpoint {}:{} on {}", e.address, e.port, e.node),
    );
    format!("Programmed={}, {endpoint}", programmed.unwrap_or("(none)"))
}

/// A problem when a node that programs a part of the mapping, other than its status writer,
/// has no running agent.
fn agentless_problem(m: &MappingView) -> Option<String> {
    (!m.nodes_without_agent.is_empty() && m.accepted.is_some()).then(|| {
        format!(
            "PortMap {}/{} needs node {}, whose agent is not running: its part there may be missing or no longer kept",
            m.namespace,
            m.name,
            m.nodes_without_agent.join(", ")
        )
    })
}

/// A problem when the written status cannot be trusted: it says something else than what the
/// agents compute now, or the node that keeps it has no running agent.
fn trust_problem(m: &MappingView) -> Option<String> {
    let who = format!("PortMap {}/{}", m.namespace, m.name);
    let writer = m.status_writer.as_deref().unwrap_or("(none)");
    let down = m.writer_running == Some(false);
    let running = if down {
        "whose agent is not running"
    } else {
        "which has not caught up (is its agent running?)"
    };
    match (m.agrees, &m.computed) {
        (Some(false), Some(c)) => Some(format!(
            "{who}: its written status ({}) differs from what the agents compute from the current objects ({}): it is written by node {writer}, {running}",
            said(
                m.programmed.as_ref().map(|p| p.status.as_str()),
                m.endpoint.as_ref()
            ),
            said(c.programmed.as_deref(), c.endpoint.as_ref()),
        )),
        _ if down && m.accepted.is_some() => Some(format!(
            "{who}: status written by node {writer}, whose agent is not running: it may be stale"
        )),
        _ => None,
    }
}

/// Left-aligned columns separated by three spaces, like kubectl's tables.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.into_iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 3;
                out.push_str(&" ".repeat(pad));
            }
        }
        let mut out = out.trim_end().to_owned();
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn endpoint_text(e: Option<&EndpointView>) -> String {
    e.map_or_else(
        || "-".to_owned(),
        |e| {
            let pod = e.pod.as_deref().unwrap_or("(unnamed pod)");
            match &e.address6 {
                Some(v6) => format!(
                    "{pod} on {} ({}:{}, [{v6}]:{})",
                    e.node, e.address, e.port, e.port
                ),
                None => format!("{pod} on {} ({}:{})", e.node, e.address, e.port),
            }
        },
    )
}

fn state_text(m: &MappingView) -> String {
    match (&m.accepted, &m.programmed) {
        (None, _) => "no status".to_owned(),
        (Some(a), _) if !a.is_true() => format!("NotAccepted {}", a.reason),
        (Some(_), Some(p)) => {
            let doubt = if !m.current {
                " (stale)"
            } else if m.agrees == Some(false) {
                " (not what is computed now)"
            } else if m.writer_running == Some(false) {
                " (its writer's agent is down)"
            } else if !m.nodes_without_agent.is_empty() {
                " (an agent it needs is down)"
            } else {
                ""
            };
            format!("{} {}{doubt}", p.status, p.reason)
        }
        (Some(_), None) => conditions::ACCEPTED.to_owned(),
    }
}

/// The report as text: mappings, classes, agents, then the problems (or that there are none).
pub fn text(r: &StatusReport, now: Timestamp) -> String {
    // Everything shown comes from the cluster: escaped before it reaches a terminal.
    let mut r = r.clone();
    r.escape_all();
    let out = report_text(&r, now);
    escape_keeping_lines(&out).into_owned()
}

fn report_text(r: &StatusReport, now: Timestamp) -> String {
    let mut out = String::new();
    agents_text(&mut out, r, now);
    out.push('\n');
    mappings_text(&mut out, &r.mappings, r.namespace.as_deref());
    if r.unread.iter().any(|u| u.what == "PortMapClasses") {
        out.push_str("\nPortMapClasses: could not be read\n");
    } else {
        let ready = r.classes.iter().filter(|c| c.ok).count();
        let _ = writeln!(out, "\nPortMapClasses: {ready}/{} ready", r.classes.len());
    }
    for c in &r.classes {
        class_text(&mut out, c);
    }
    if !r.unread.is_empty() {
        out.push_str("\nNot read (nothing is said about them):\n");
        for u in &r.unread {
            let _ = writeln!(out, "- {}: {}", u.what, u.why);
        }
    }
    if !r.problems.is_empty() {
        let _ = writeln!(out, "\nProblems: {}", r.problems.len());
        for p in &r.problems {
            let _ = writeln!(out, "- {p}");
        }
    } else if r.unread.is_empty() {
        out.push_str("\nEverything is programmed.\n");
    } else {
        // Never "Everything is programmed." on a partial reading: what was not read (the
        // agents, most of all) may be what is broken.
        out.push_str(
            "\nNo problem in what could be read; what could not be read is listed above.\n",
        );
    }
    out
}

/// The PortMaps section: a count, then a table of them.
fn mappings_text(out: &mut String, mappings: &[MappingView], namespace: Option<&str>) {
    let programmed = mappings.iter().filter(|m| m.ok).count();
    let place = namespace.map_or_else(String::new, |ns| format!(" in namespace {ns}"));
    let _ = writeln!(
        out,
        "PortMaps{place}: {programmed}/{} programmed",
        mappings.len()
    );
    if mappings.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = mappings
        .iter()
        .map(|m| {
            vec![
                format!("{}/{}", m.namespace, m.name),
                m.class.clone(),
                format!("{}/{}", m.protocol, m.ports),
                if m.published.is_empty() {
                    "-".to_owned()
                } else {
                    m.published.join(",")
                },
                endpoint_text(m.endpoint.as_ref()),
                state_text(m),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "NAMESPACE/NAME",
            "CLASS",
            "PORTS",
            "PUBLISHED",
            "ENDPOINT",
            "PROGRAMMED",
        ],
        &rows,
    ));
}

/// The Agents section: the DaemonSets and their counts, then a line per node.
fn agents_text(out: &mut String, r: &StatusReport, now: Timestamp) {
    match &r.daemon_sets {
        None => out.push_str("Agents: the DaemonSets could not be read\n"),
        Some(ds) if ds.is_empty() => out.push_str("Agents: no kuport DaemonSet\n"),
        Some(ds) => {
            for d in ds {
                let _ = writeln!(
                    out,
                    "Agents: DaemonSet {}/{}: {} desired, {} ready, {} updated, {} available",
                    d.namespace, d.name, d.desired, d.ready, d.updated, d.available
                );
            }
        }
    }
    if r.agents.is_empty() {
        return;
    }
    let pods_read = !r.unread.iter().any(|u| u.what == "Pods");
    let rows: Vec<Vec<String>> = r
        .agents
        .iter()
        .map(|a| {
            let agent = if pods_read {
                agent_state_text(a)
            } else {
                "unknown".to_owned()
            };
            vec![
                a.node.clone(),
                agent,
                a.image
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), image_version),
                a.version.clone().unwrap_or_else(|| "-".to_owned()),
                a.restarts.map_or_else(|| "-".to_owned(), |r| r.to_string()),
                a.last_pass_time
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), |t| format!("{t} ({})", ago(t, now))),
                a.classes.join(","),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "NODE",
            "AGENT",
            "IMAGE",
            "VERSION",
            "RESTARTS",
            "LAST PASS",
            "CLASSES",
        ],
        &rows,
    ));
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Event;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use super::super::explain::{explain, explain_text};
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let now: Timestamp = "2026-01-01T01:00:00Z".parse().expect("time");
        assert_eq!(ago("2026-01-01T00:59:15Z", now), "45s ago");
        assert_eq!(ago("2026-01-01T00:30:00Z", now), "30m ago");
        assert_eq!(ago("2025-12-31T01:00:00Z", now), "24h ago");
        assert_eq!(ago("2025-12-20T01:00:00Z", now), "12d ago");
        assert_eq!(ago("2026-01-01T02:00:00Z", now), "in the future");
    }

    /// What a hostile writer puts in every free-text field it controls: a colour, a screen
    /// clear through the C1 CSI, a forged line, a window title, a bidirectional override.
    const POISON: &str =
        "\u{1b}[31mRED\r\nFAKE: everything is fine\u{9b}2J\u{1b}]0;t\u{7}\u{7f}\u{202e}";

    /// The standby-links cluster, its statuses and Events written with `text` in every string a
    /// writer other than the Kubernetes name rules controls.
    fn dump_saying(text: &str) -> Dump {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use kuport_core::api::{
            ClassNodeStatus, PortMapClassStatus, PortMapStatus, RefusedMapping,
        };
        let mut c = kuport_testkit::cluster::two_edges_and_worker("169.254.77.0/24");
        let now = kuport_testkit::cluster::now();
        let cond = |type_: &str, status: &str| Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: format!("Reason{text}"),
            message: format!("message {text}"),
            last_transition_time: Time(now),
            observed_generation: Some(1),
        };
        let class = c.class_mut("public");
        class.status = Some(PortMapClassStatus {
            conditions: vec![cond("Ready", "False")],
            nodes: vec![ClassNodeStatus {
                name: "edge-a".into(),
                ready: false,
                message: Some(format!("row {text}")),
                addresses: [(format!("wt{text}"), format!("1.2.3.4{text}"))].into(),
                agent_version: Some(format!("v{text}")),
                last_pass_time: Some(Time(now)),
                ..Default::default()
            }],
            refused: vec![RefusedMapping {
                node: "edge-a".into(),
                mapping: "games/gs".into(),
                message: format!("kernel says {text}"),
            }],
            ..Default::default()
        });
        for pm in &mut c.snapshot.portmaps {
            pm.metadata.generation = Some(1);
            pm.status = Some(PortMapStatus {
                observed_generation: Some(1),
                conditions: vec![cond("Accepted", "True"), cond("Programmed", "False")],
                ..Default::default()
            });
        }
        let event: Event = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gs.1", "namespace": "games"},
            "involvedObject": {"apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMap",
                               "namespace": "games", "name": "gs"},
            "type": format!("Warning{text}"),
            "reason": format!("Evil{text}"),
            "message": format!("event {text}"),
            "lastTimestamp": "2026-01-01T00:00:00Z",
            "count": 2,
        }))
        .expect("an Event");
        Dump {
            snapshot: c.snapshot,
            events: vec![event],
            ..Dump::default()
        }
    }

    #[test]
    fn nothing_the_cluster_says_reaches_the_terminal_raw() {
        let now = kuport_testkit::cluster::now();
        let (clean, poisoned) = (dump_saying(""), dump_saying(POISON));
        let outputs = |d: &Dump| {
            let explained =
                explain(d, "games", "gs", now, &AgentSelector::default()).expect("explained");
            [
                text(&report(d, now, &ReportOptions::default()), now),
                explain_text(&explained, now),
            ]
        };
        for (clean, poisoned) in outputs(&clean).into_iter().zip(outputs(&poisoned)) {
            let raw: Vec<char> = poisoned
                .chars()
                .filter(|c| *c != '\n' && super::super::terminal::is_unsafe(*c))
                .collect();
            assert!(raw.is_empty(), "raw {raw:?} in:\n{poisoned}");
            assert_eq!(
                poisoned.lines().count(),
                clean.lines().count(),
                "a cluster string added lines:\n{poisoned}"
            );
            assert!(!poisoned.contains("\nFAKE"), "{poisoned}");
            assert!(
                poisoned.contains("\\x1b[31mRED\\x0d\\x0aFAKE"),
                "{poisoned}"
            );
        }
        let [_, explained] = outputs(&poisoned);
        assert!(
            explained.contains("Evil\\x1b[31mRED"),
            "the Event is shown, escaped:\n{explained}"
        );
    }

    #[test]
    fn tables_align_on_the_widest_cell() {
        let t = table(
            &["A", "BB"],
            &[
                vec!["long-cell".into(), "x".into()],
                vec!["s".into(), "".into()],
            ],
        );
        assert_eq!(t, "A           BB\nlong-cell   x\ns\n");
    }
}
