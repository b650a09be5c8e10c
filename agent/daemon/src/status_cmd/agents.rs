//! The agents in `kuport status`: the kuport DaemonSets with their counts, and for every node
//! of the cluster whether an agent runs there, its image and version, restarts and last pass;
//! then what is wrong with them. Pure, like the report: from a [`Dump`] and the time.
//!
//! The class rows alone cannot say this: only accepting nodes write them, so a pod-only node
//! without an agent never appears there, and a dead agent's row keeps saying what it last
//! said. The DaemonSet and its Pods are read beside them, and every Node gets a line.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kuport_core::api::PortMapClass;
use kuport_core::snapshot::node_is_ready;
use serde::Serialize;

use crate::objects::Dump;

/// The label every kuport DaemonSet and agent Pod carries, in the manifests and the chart.
pub const DEFAULT_AGENT_SELECTOR: &str = "app.kubernetes.io/name=kuport";

/// How old an agent's last pass may be before `kuport status` calls it stopped: three resyncs
/// at the default interval (5 minutes). A quiet agent refreshes its rows' `lastPassTime` at
/// every resync, so an older one means it has not passed through two of them.
pub const STALE_PASS_SECONDS: i64 = 15 * 60;

/// Where the agents are looked for: a label selector of `key=value` terms, and a namespace
/// (every namespace when `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentSelector {
    pub labels: BTreeMap<String, String>,
    pub namespace: Option<String>,
}

impl Default for AgentSelector {
    fn default() -> Self {
        Self::parse(DEFAULT_AGENT_SELECTOR, None).unwrap_or_else(|_| Self {
            labels: BTreeMap::new(),
            namespace: None,
        })
    }
}

impl AgentSelector {
    /// `key=value[,key=value...]` (`==` is accepted for `=`): the equality terms a recorded
    /// dump can be matched against as the API server matches them.
    pub fn parse(text: &str, namespace: Option<String>) -> Result<Self, String> {
        let mut labels = BTreeMap::new();
        for term in text.split(',').map(str::trim) {
            let (key, value) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .filter(|(k, _)| !k.trim().is_empty() && !k.contains('!'))
                .ok_or_else(|| {
                    format!("{text:?}: give key=value terms separated by commas, for example {DEFAULT_AGENT_SELECTOR}")
                })?;
            labels.insert(key.trim().to_owned(), value.trim().to_owned());
        }
        Ok(Self { labels, namespace })
    }

    /// The selector as the API server's `labelSelector` parameter.
    pub fn label_selector(&self) -> String {
        self.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Where the agents were looked for, for sentences.
    pub fn describe(&self) -> String {
        let place = self.namespace.as_deref().map_or_else(
            || "any namespace".to_owned(),
            |ns| format!("namespace {ns}"),
        );
        format!("label {} in {place}", self.label_selector())
    }

    /// A DaemonSet of kuport's agents: labelled so itself, or making Pods labelled so (a
    /// DaemonSet installed by other means may label only its Pods).
    fn matches_daemon_set(&self, ds: &DaemonSet) -> bool {
        self.matches(&ds.metadata)
            || ds.spec.template.metadata.as_ref().is_some_and(|m| {
                self.matches(&ObjectMeta {
                    namespace: ds.metadata.namespace.clone(),
                    labels: m.labels.clone(),
                    ..ObjectMeta::default()
                })
            })
    }

    fn matches(&self, meta: &ObjectMeta) -> bool {
        let in_namespace = self
            .namespace
            .as_ref()
            .is_none_or(|ns| meta.namespace.as_ref() == Some(ns));
        let labels = meta.labels.as_ref();
        in_namespace
            && self
                .labels
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }
}

/// One kuport DaemonSet and its counts, as its status says.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetView {
    pub namespace: String,
    pub name: String,
    /// Nodes that should run an agent.
    pub desired: i32,
    /// Nodes whose agent is ready.
    pub ready: i32,
    /// Nodes running an agent of the current template.
    pub updated: i32,
    /// Nodes whose agent has been ready for `minReadySeconds`.
    pub available: i32,
    /// The agent container's image in the template.
    pub image: Option<String>,
}

/// Whether an agent runs on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AgentState {
    /// Its agent Pod is ready.
    Ready,
    /// Its agent Pod exists but is not ready (starting, crash-looping, its node gone).
    NotReady,
    /// No agent Pod on the node.
    Missing,
    /// No agent Pod, and the DaemonSets' nodeSelector leaves the node out on purpose.
    NotScheduled,
    /// The Pods could not be read: only the class rows speak for it.
    Unknown,
    /// A class row names the node, but no Node of that name exists (nor an agent Pod).
    NoNode,
}

impl AgentState {
    fn text(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::NotReady => "NOT READY",
            Self::Missing => "MISSING",
            Self::NotScheduled => "not scheduled",
            Self::Unknown => "unknown",
            Self::NoNode => "no Node",
        }
    }

    /// Whether the agent is known not to run (what it wrote may no longer be kept).
    pub fn down(self) -> bool {
        matches!(self, Self::NotReady | Self::Missing | Self::NotScheduled)
    }
}

/// One node: its agent, from its Pod and from the class rows it wrote.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentView {
    pub node: String,
    /// The version the agent stamps on its rows (`agentVersion`), from its latest row.
    pub version: Option<String>,
    /// The latest `lastPassTime` among its rows.
    pub last_pass_time: Option<String>,
    /// The classes it wrote a row in, sorted.
    pub classes: Vec<String>,
    pub state: AgentState,
    /// Whether its Node is Ready; `None` when the Nodes could not be read.
    pub node_ready: Option<bool>,
    /// Its agent Pod, `namespace/name`.
    pub pod: Option<String>,
    /// The container restarts of that Pod.
    pub restarts: Option<i32>,
    /// The image of that Pod's agent container.
    pub image: Option<String>,
    /// Why a container of that Pod waits or last stopped (`CrashLoopBackOff`, `Error`...).
    pub waiting: Option<String>,
    /// The last pass is older than three default resyncs: the agent has probably stopped.
    pub stale: bool,
}

/// The agents part of the report.
#[derive(Clone, Debug)]
pub struct Agents {
    /// `None` when the DaemonSets could not be read.
    pub daemon_sets: Option<Vec<DaemonSetView>>,
    pub nodes: Vec<AgentView>,
    pub problems: Vec<String>,
}

impl Agents {
    /// The line of `node`, when it has one.
    pub fn of(&self, node: &str) -> Option<&AgentView> {
        self.nodes.iter().find(|a| a.node == node)
    }
}

/// What the class rows say of each node's agent: its version, last pass and classes.
fn from_rows(classes: &[PortMapClass]) -> BTreeMap<String, AgentView> {
    let mut by_node: BTreeMap<String, AgentView> = BTreeMap::new();
    let mut classes: Vec<&PortMapClass> = classes.iter().collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for c in classes {
        let class = c.metadata.name.clone().unwrap_or_default();
        for row in c.status.iter().flat_map(|s| &s.nodes) {
            let a = by_node
                .entry(row.name.clone())
                .or_insert_with(|| blank(&row.name));
            a.classes.push(class.clone());
            if let Some(t) = &row.last_pass_time {
                let t = t.0.to_string();
                if a.last_pass_time.as_ref().is_none_or(|old| *old < t) {
                    a.last_pass_time = Some(t);
                    a.version = row.agent_version.clone();
                }
            } else if a.version.is_none() {
                a.version = row.agent_version.clone();
            }
        }
    }
    by_node
}

fn blank(node: &str) -> AgentView {
    AgentView {
        node: node.to_owned(),
        version: None,
        last_pass_time: None,
        classes: Vec::new(),
        state: AgentState::Unknown,
        node_ready: None,
        pod: None,
        restarts: None,
        image: None,
        waiting: None,
        stale: false,
    }
}

/// The agent container of a Pod or template: the one named `agent`, else the first.
fn agent_image(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Option<String> {
    let containers = &spec?.containers;
    containers
        .iter()
        .find(|c| c.name == "agent")
        .or_else(|| containers.first())
        .and_then(|c| c.image.clone())
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed"))
}

/// The agent Pod that speaks for a node among several (an old one terminating beside its
/// replacement): a ready one first, then one not going away, then the newest, then by name.
fn best_pod<'a>(pods: &[&'a Pod]) -> Option<&'a Pod> {
    pods.iter().copied().max_by(|a, b| {
        let key = |p: &'a Pod| {
            (
                pod_ready(p),
                !pod_finished(p),
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                std::cmp::Reverse(p.metadata.name.clone()),
            )
        };
        key(a).cmp(&key(b))
    })
}

/// Why a container of the Pod waits or last stopped, with the container's name.
fn waiting_reason(pod: &Pod) -> Option<String> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|s| {
        let state = s.state.as_ref()?;
        let reason = state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.clone())
            .or_else(|| state.terminated.as_ref().and_then(|t| t.reason.clone()))?;
        Some(reason)
    })
}

fn fill_from_pod(a: &mut AgentView, pod: &Pod) -> AgentState {
    a.pod = Some(format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    ));
    a.restarts = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum());
    a.image = agent_image(pod.spec.as_ref());
    a.waiting = waiting_reason(pod);
    if pod_ready(pod) && !pod_finished(pod) {
        AgentState::Ready
    } else {
        AgentState::NotReady
    }
}

fn daemon_set_view(ds: &DaemonSet) -> DaemonSetView {
    let status = ds.status.clone().unwrap_or_default();
    DaemonSetView {
        namespace: ds.metadata.namespace.clone().unwrap_or_default(),
        name: ds.metadata.name.clone().unwrap_or_default(),
        desired: status.desired_number_scheduled,
        ready: status.number_ready,
        updated: status.updated_number_scheduled.unwrap_or(0),
        available: status.number_available.unwrap_or(0),
        image: agent_image(ds.spec.template.spec.as_ref()),
    }
}

/// Whether every one of `daemon_sets` leaves `node` out by its template's nodeSelector (and
/// there is one): such a node runs no agent by the administrator's choice.
fn left_out(daemon_sets: &[&DaemonSet], node: Option<&Node>) -> bool {
    let labels = node.and_then(|n| n.metadata.labels.as_ref());
    !daemon_sets.is_empty()
        && daemon_sets.iter().all(|ds| {
            let selector = ds
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.node_selector.as_ref());
            selector.is_some_and(|sel| {
                sel.iter()
                    .any(|(k, v)| labels.and_then(|l| l.get(k)) != Some(v))
            })
        })
}

/// The state of a node's agent from its Pods (filling in what the best one says). `node` is
/// `None` when the Nodes could not be read, `Some(None)` when no Node has that name.
fn pod_state(
    a: &mut AgentView,
    pods: &[&Pod],
    node: Option<Option<&Node>>,
    daemon_sets: Option<&[&DaemonSet]>,
) -> AgentState {
    if let Some(pod) = best_pod(pods) {
        return fill_from_pod(a, pod);
    }
    match node {
        Some(None) => AgentState::NoNode,
        node if daemon_sets.is_some_and(|ds| left_out(ds, node.flatten())) => {
            AgentState::NotScheduled
        }
        _ => AgentState::Missing,
    }
}

/// The agents of the cluster in `dump`. `needed` are the nodes an agent must run on whatever
/// the DaemonSets' nodeSelector says: the nodes the classes name and the mappings' pods' nodes.
pub fn agents(
    dump: &Dump,
    selector: &AgentSelector,
    needed: &BTreeSet<String>,
    now: Timestamp,
) -> Agents {
    let snapshot = &dump.snapshot;
    let nodes_read = !dump.unread.iter().any(|u| u.what == "Nodes");
    let mut by_node = from_rows(&snapshot.classes);
    let nodes: BTreeMap<&str, &Node> = snapshot
        .nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect();
    for name in nodes.keys() {
        by_node
            .entry((*name).to_owned())
            .or_insert_with(|| blank(name));
    }
    let daemon_sets: Option<Vec<&DaemonSet>> = dump.daemon_sets.as_ref().map(|all| {
        let mut found: Vec<&DaemonSet> = all
            .iter()
            .filter(|ds| selector.matches_daemon_set(ds))
            .collect();
        found.sort_by_key(|ds| (&ds.metadata.namespace, &ds.metadata.name));
        found
    });
    let mut pods_by_node: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for pod in dump.pods.iter().flatten() {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if let Some(node) = node.filter(|n| !n.is_empty())
            && selector.matches(&pod.metadata)
        {
            pods_by_node.entry(node).or_default().push(pod);
            by_node
                .entry(node.to_owned())
                .or_insert_with(|| blank(node));
        }
    }
    for (name, a) in &mut by_node {
        a.node_ready =
            nodes_read.then(|| nodes.get(name.as_str()).is_some_and(|n| node_is_ready(n)));
        a.stale = a
            .last_pass_time
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .is_some_and(|t| now.as_second() - t.as_second() > STALE_PASS_SECONDS);
        if dump.pods.is_some() {
            let pods = pods_by_node
                .get(name.as_str())
                .map_or(&[][..], Vec::as_slice);
            let node = nodes_read.then(|| nodes.get(name.as_str()).copied());
            a.state = pod_state(a, pods, node, daemon_sets.as_deref());
        }
    }
    let nodes: Vec<AgentView> = by_node.into_values().collect();
    let mut problems = Vec::new();
    if let Some(ds) = &daemon_sets {
        daemon_set_problems(ds, selector, &mut problems);
    }
    for a in &nodes {
        node_problems(a, needed, now, &mut problems);
    }
    skew_problems(&nodes, &mut problems);
    Agents {
        daemon_sets: daemon_sets.map(|ds| ds.into_iter().map(daemon_set_view).collect()),
        nodes,
        problems,
    }
}

fn daemon_set_problems(
    daemon_sets: &[&DaemonSet],
    selector: &AgentSelector,
    out: &mut Vec<String>,
) {
    match daemon_sets {
        [] => out.push(format!(
            "no kuport DaemonSet found ({}): no agent programs any node or keeps any status",
            selector.describe()
        )),
        [_] => {}
        more => out.push(format!(
            "{} kuport DaemonSets ({}): two agents on one node fight over its datapath",
            more.len(),
            more.iter()
                .map(|ds| name_of(&ds.metadata))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    for ds in daemon_sets {
        let v = daemon_set_view(ds);
        if v.desired > 0 && v.ready == 0 {
            out.push(format!(
                "DaemonSet {}/{} has no ready agent (0 of {} ready)",
                v.namespace, v.name, v.desired
            ));
        }
    }
}

fn name_of(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

fn node_problems(a: &AgentView, needed: &BTreeSet<String>, now: Timestamp, out: &mut Vec<String>) {
    let why = match a.state {
        AgentState::NotReady => {
            let mut why = format!(
                "its agent Pod {} is not ready",
                a.pod.as_deref().unwrap_or("?")
            );
            if let Some(w) = &a.waiting {
                why.push_str(&format!(" ({w})"));
            }
            if let Some(r) = a.restarts.filter(|r| *r > 0) {
                why.push_str(&format!(", {r} restarts"));
            }
            Some(why)
        }
        AgentState::Missing => Some("no kuport agent Pod runs there".to_owned()),
        AgentState::NotScheduled if needed.contains(&a.node) => Some(
            "the DaemonSets' nodeSelector leaves it out, yet a class names it or a mapping's pod runs there"
                .to_owned(),
        ),
        _ => None,
    };
    if let Some(why) = why {
        out.push(format!(
            "node {} has no running agent: {why}; what it should program and the statuses it writes are not kept",
            a.node
        ));
        return;
    }
    if a.stale && a.state != AgentState::NoNode {
        let last = a.last_pass_time.as_deref().unwrap_or_default();
        out.push(format!(
            "the agent on node {} last completed a pass {} ({last}), more than {}m (three resyncs at the default 5 minutes): it has probably stopped, and what it wrote may no longer be true",
            a.node,
            ago(last, now),
            STALE_PASS_SECONDS / 60
        ));
    }
}

/// More than one version among the agents (from their rows) or images (from their Pods): a
/// rollout that has not finished, or one stuck halfway.
fn skew_problems(nodes: &[AgentView], out: &mut Vec<String>) {
    let running = |a: &&AgentView| !a.state.down() && a.state != AgentState::NoNode && !a.stale;
    let versions = group(
        nodes
            .iter()
            .filter(running)
            .filter_map(|a| Some((a.version.as_deref()?, a))),
    );
    let images = group(
        nodes
            .iter()
            .filter(running)
            .filter_map(|a| Some((a.image.as_deref()?, a))),
    );
    for (what, groups) in [("versions", versions), ("images", images)] {
        if groups.len() > 1 {
            let parts: Vec<String> = groups
                .iter()
                .map(|(v, nodes)| format!("{v} on {}", nodes.join(", ")))
                .collect();
            out.push(format!(
                "agent version skew: the agents run different {what}: {}",
                parts.join("; ")
            ));
        }
    }
}

fn group<'a>(
    items: impl Iterator<Item = (&'a str, &'a AgentView)>,
) -> BTreeMap<&'a str, Vec<&'a str>> {
    let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (key, a) in items {
        out.entry(key).or_default().push(a.node.as_str());
    }
    out
}

/// How long ago `then` was, in the short form kubectl uses (`45s`, `3m`, `2h`, `4d`).
pub fn ago(then: &str, now: Timestamp) -> String {
    let Ok(t) = then.parse::<Timestamp>() else {
        return then.to_owned();
    };
    let s = now.as_second() - t.as_second();
    if s < 0 {
        return "in the future".to_owned();
    }
    let short = match s {
        0..120 => format!("{s}s"),
        120..7_200 => format!("{}m", s / 60),
        7_200..172_800 => format!("{}h", s / 3_600),
        _ => format!("{}d", s / 86_400),
    };
    format!("{short} ago")
}

/// The tag of an image reference (`ghcr.io/x/kuport-agent:v0.1.0` gives `v0.1.0`), or its
/// digest's first twelve hex digits; `-` when it names neither.
pub fn image_version(image: &str) -> String {
    if let Some((_, digest)) = image.split_once('@') {
        let hex = digest.split_once(':').map_or(digest, |(_, h)| h);
        return hex.chars().take(12).collect();
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split_once(':')
        .map_or_else(|| "latest".to_owned(), |(_, tag)| tag.to_owned())
}

/// The AGENT cell of a node's line.
pub fn agent_state_text(a: &AgentView) -> String {
    let mut text = a.state.text().to_owned();
    if let Some(w) = &a.waiting
        && a.state == AgentState::NotReady
    {
        text.push_str(&format!(" ({w})"));
    }
    if a.stale {
        text.push_str(" (stale pass)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::explain::{explain, explain_text};
    use super::super::render::{ReportOptions, StatusReport, report, text};
    use super::*;

    /// Ten minutes after the recording started: every agent passed less than a minute ago.
    const NOW: &str = "2026-01-01T00:10:00Z";

    fn now() -> Timestamp {
        NOW.parse().expect("time")
    }

    /// The programmed Multi cluster: agents ready on edge-a, edge-b and worker-c (the pod's
    /// node, which writes no class row).
    fn programmed() -> Dump {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/status/multi-programmed.yaml");
        crate::objects::load_dump(&[path]).expect("the recorded cluster loads")
    }

    fn run(dump: &Dump, at: Timestamp) -> (StatusReport, String) {
        let r = report(dump, at, &ReportOptions::default());
        let t = text(&r, at);
        (r, t)
    }

    fn pods(dump: &mut Dump) -> &mut Vec<Pod> {
        dump.pods.as_mut().expect("the dump holds Pods")
    }

    fn without_pod_on(dump: &mut Dump, node: &str) {
        pods(dump).retain(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node));
    }

    fn line<'a>(text: &'a str, start: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting {start:?} in:\n{text}"))
    }

    #[test]
    fn the_report_leads_with_every_nodes_agent() {
        let (r, t) = run(&programmed(), now());
        assert!(r.ok, "{:?}", r.problems);
        assert!(
            t.starts_with(
                "Agents: DaemonSet kuport-system/kuport-agent: 3 desired, 3 ready, 3 updated, 3 available\n"
            ),
            "{t}"
        );
        // The pod-only node has a line although it wrote no class row.
        let worker = line(&t, "worker-c ");
        assert!(
            worker.contains("ready") && worker.contains("v0.1.0"),
            "{worker}"
        );
        let edge_b = line(&t, "edge-b ");
        assert!(edge_b.contains("   1   "), "its restart is shown: {edge_b}");
        assert_eq!(r.agents.len(), 3);
        assert!(t.ends_with("Everything is programmed.\n"), "{t}");
    }

    #[test]
    fn a_failing_node_check_in_a_row_is_a_problem_named_once() {
        use kuport_core::api::NodeCheck;
        let mut dump = programmed();
        let check = |name: &str, ok: Option<bool>| NodeCheck {
            name: name.to_owned(),
            ok,
            message: format!("{name} says so"),
        };
        let rows = &mut dump.snapshot.classes[0]
            .status
            .as_mut()
            .expect("a status")
            .nodes;
        for row in rows.iter_mut() {
            row.checks = vec![
                check("ipForward", Some(true)),
                check("cniHostRouting", None),
            ];
        }
        let (r, _) = run(&dump, now());
        assert!(
            r.ok,
            "passed and unchecked checks are no problem: {:?}",
            r.problems
        );
        // The same failing check in two rows of one node (another class) is said once.
        let rows = &mut dump.snapshot.classes[0]
            .status
            .as_mut()
            .expect("a status")
            .nodes;
        let edge_a = rows
            .iter_mut()
            .find(|r| r.name == "edge-a")
            .expect("edge-a's row");
        edge_a.checks.push(check("rpFilter", Some(false)));
        let mut other = dump.snapshot.classes[0].clone();
        other.metadata.name = Some("zz-other".to_owned());
        dump.snapshot.classes.push(other);
        let (r, t) = run(&dump, now());
        assert!(!r.ok);
        let said: Vec<&String> = r
            .problems
            .iter()
            .filter(|p| p.starts_with("node edge-a: check rpFilter failed"))
            .collect();
        assert_eq!(
            said,
            ["node edge-a: check rpFilter failed: rpFilter says so"]
        );
        assert!(t.contains("node edge-a: check rpFilter failed"), "{t}");
    }

    #[test]
    fn a_pod_only_node_without_an_agent_is_a_problem() {
        let mut dump = programmed();
        without_pod_on(&mut dump, "worker-c");
        let (r, t) = run(&dump, now());
        assert!(!r.ok);
        assert!(line(&t, "worker-c ").contains("MISSING"), "{t}");
        let e = explain(
            &dump,
            "games",
            "gameserver",
            now(),
            &AgentSelector::default(),
        )
        .expect("explained");
        assert!(!e.ok);
        assert!(
            explain_text(&e, now()).contains("it needs node worker-c, whose agent is not running"),
            "{}",
            explain_text(&e, now())
        );
        // The mapping whose pod runs there cannot be trusted to answer either.
        assert_eq!(r.mappings[0].nodes_without_agent, ["worker-c"]);
        assert!(!r.mappings[0].ok);
        assert!(
            t.contains("True AllNodesReady (an agent it needs is down)"),
            "{t}"
        );
        assert!(
            r.problems.iter().any(|p| p
                == "PortMap games/gameserver needs node worker-c, whose agent is not running: its part there may be missing or no longer kept"),
            "{:?}",
            r.problems
        );
        assert!(
            r.problems
                .iter()
                .any(|p| p.starts_with("node worker-c has no running agent: no kuport agent Pod")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn a_crash_looping_agent_is_named_with_its_reason() {
        let mut dump = programmed();
        for p in pods(&mut dump)
            .iter_mut()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("worker-c"))
        {
            let status: k8s_openapi::api::core::v1::PodStatus =
                serde_json::from_value(serde_json::json!({"phase": "Running",
                    "conditions": [{"type": "Ready", "status": "False"}],
                    "containerStatuses": [{"name": "agent", "ready": false, "restartCount": 7,
                        "image": "x", "imageID": "",
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}))
                .expect("a PodStatus");
            p.status = Some(status);
        }
        let (r, t) = run(&dump, now());
        assert!(
            line(&t, "worker-c ").contains("NOT READY (CrashLoopBackOff)"),
            "{t}"
        );
        assert!(
            r.problems.iter().any(|p| p.contains(
                "node worker-c has no running agent: its agent Pod kuport-system/kuport-agent-r2m8d is not ready (CrashLoopBackOff), 7 restarts"
            )),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn a_stale_pass_is_a_problem_and_marked() {
        // edge-b last passed at 00:09:10: stale after 00:24:10.
        let later: Timestamp = "2026-01-01T00:24:20Z".parse().expect("time");
        let (r, t) = run(&programmed(), later);
        assert!(!r.ok);
        assert!(line(&t, "edge-b ").contains("(stale pass)"), "{t}");
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains("the agent on node edge-b last completed a pass 15m ago")),
            "{:?}",
            r.problems
        );
        let (r, _) = run(&programmed(), "2026-01-01T00:24:00Z".parse().expect("time"));
        assert!(r.ok, "14m50s is not stale yet: {:?}", r.problems);
    }

    #[test]
    fn version_skew_is_a_problem() {
        let mut dump = programmed();
        for p in pods(&mut dump)
            .iter_mut()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("edge-b"))
        {
            if let Some(spec) = p.spec.as_mut() {
                spec.containers[0].image = Some("ghcr.io/walzen-group/kuport-agent:v0.2.0".into());
            }
        }
        let (r, _) = run(&dump, now());
        assert!(
            r.problems.iter().any(|p| p
                == "agent version skew: the agents run different images: ghcr.io/walzen-group/kuport-agent:v0.1.0 on edge-a, worker-c; ghcr.io/walzen-group/kuport-agent:v0.2.0 on edge-b"),
            "{:?}",
            r.problems
        );
        let mut dump = programmed();
        for c in &mut dump.snapshot.classes {
            for row in c.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
                if row.name == "edge-a" {
                    row.agent_version = Some("0.2.0".into());
                }
            }
        }
        let (r, _) = run(&dump, now());
        assert!(
            r.problems.iter().any(|p| p
                == "agent version skew: the agents run different versions: 0.1.0 on edge-b, worker-c; 0.2.0 on edge-a"),
            "{:?}",
            r.problems
        );
    }

    /// The uninstalled cluster of the issue: the PortMaps and their `Programmed=True` stay,
    /// the DaemonSet and its Pods are gone.
    #[test]
    fn no_agents_at_all_is_never_everything_programmed() {
        let mut dump = programmed();
        dump.daemon_sets = Some(Vec::new());
        pods(&mut dump).clear();
        let (r, t) = run(&dump, now());
        assert!(!r.ok);
        assert!(!t.contains("Everything is programmed"), "{t}");
        assert!(t.starts_with("Agents: no kuport DaemonSet\n"), "{t}");
        for expected in [
            "no kuport DaemonSet found (label app.kubernetes.io/name=kuport in any namespace)",
            "node edge-a has no running agent",
            "node worker-c has no running agent",
            "PortMap games/gameserver: status written by node edge-a, whose agent is not running: it may be stale",
        ] {
            assert!(
                r.problems.iter().any(|p| p.starts_with(expected)),
                "{expected:?} missing from {:?}",
                r.problems
            );
        }
        assert!(!r.mappings[0].ok, "the written True is not trusted");
        // A DaemonSet that runs no ready agent is the same failure, named by its counts.
        let mut dump = programmed();
        pods(&mut dump).clear();
        if let Some(status) = dump.daemon_sets.as_mut().and_then(|d| d[0].status.as_mut()) {
            status.number_ready = 0;
        }
        let (r, _) = run(&dump, now());
        assert!(
            r.problems
                .iter()
                .any(|p| p
                    == "DaemonSet kuport-system/kuport-agent has no ready agent (0 of 3 ready)"),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn a_status_writer_without_an_agent_makes_its_status_untrusted() {
        let mut dump = programmed();
        without_pod_on(&mut dump, "edge-a");
        let (r, t) = run(&dump, now());
        let m = &r.mappings[0];
        assert_eq!(m.status_writer.as_deref(), Some("edge-a"));
        assert_eq!(m.writer_running, Some(false));
        assert!(!m.ok);
        assert!(
            t.contains("True AllNodesReady (its writer's agent is down)"),
            "{t}"
        );
        assert!(t.contains("PortMaps: 0/1 programmed"), "{t}");
        assert!(
            r.problems.iter().any(|p| p
                == "PortMap games/gameserver: status written by node edge-a, whose agent is not running: it may be stale"),
            "{:?}",
            r.problems
        );
        let e = explain(
            &dump,
            "games",
            "gameserver",
            now(),
            &AgentSelector::default(),
        )
        .expect("explained");
        assert!(!e.ok);
        let e = explain_text(&e, now());
        assert!(
            e.contains("it is written by node edge-a, whose agent is not running: it may be stale"),
            "{e}"
        );
        // The control: with edge-b's agent gone instead, the writer still keeps the status;
        // edge-b's own part is what is in doubt.
        let mut dump = programmed();
        without_pod_on(&mut dump, "edge-b");
        let (r, _) = run(&dump, now());
        let m = &r.mappings[0];
        assert_eq!(m.writer_running, Some(true));
        assert_eq!(m.nodes_without_agent, ["edge-b"]);
        assert!(
            !r.problems.iter().any(|p| p.contains("status written by")),
            "{:?}",
            r.problems
        );
    }

    /// The frozen status of the issue: the pod moved, its writer never wrote it; the report
    /// works out the new endpoint and says the written one is not to be trusted.
    #[test]
    fn a_written_status_that_differs_from_the_computed_one_is_a_problem() {
        let mut dump = programmed();
        let endpoints = dump.snapshot.endpoint_slices[0]
            .endpoints
            .as_mut()
            .expect("the slice's endpoints");
        // The pod was recreated on its node with a new address.
        endpoints[0].addresses = vec!["10.244.2.9".into()];
        let (r, t) = run(&dump, now());
        let m = &r.mappings[0];
        assert_eq!(m.agrees, Some(false));
        assert!(!m.ok);
        assert!(t.contains("(not what is computed now)"), "{t}");
        assert!(
            r.problems.iter().any(|p| p
                == "PortMap games/gameserver: its written status (Programmed=True, endpoint 10.244.2.5:4000 on worker-c) differs from what the agents compute from the current objects (Programmed=True, endpoint 10.244.2.9:4000 on worker-c): it is written by node edge-a, which has not caught up (is its agent running?)"),
            "{:?}",
            r.problems
        );
        assert_eq!(r.problems.len(), 1, "one sentence for it: {:?}", r.problems);
        assert!(!t.contains("Everything is programmed"), "{t}");
    }

    #[test]
    fn a_dump_without_the_agents_says_so_instead_of_inventing_health() {
        let mut dump = programmed();
        dump.daemon_sets = None;
        dump.pods = None;
        dump.snapshot.pods.clear();
        for what in ["DaemonSets", "Pods"] {
            dump.unread.push(crate::objects::Unread {
                what: what.into(),
                why: "not in the recorded objects".into(),
            });
        }
        let (r, t) = run(&dump, now());
        assert!(r.ok, "nothing read is wrong: {:?}", r.problems);
        assert!(
            t.starts_with("Agents: the DaemonSets could not be read\n"),
            "{t}"
        );
        assert!(line(&t, "worker-c ").contains("unknown"), "{t}");
        assert!(
            t.contains("- DaemonSets: not in the recorded objects"),
            "{t}"
        );
        assert!(!t.contains("Everything is programmed"), "{t}");
        assert!(
            t.ends_with(
                "No problem in what could be read; what could not be read is listed above.\n"
            ),
            "{t}"
        );
    }

    /// A tenant's reading: the classes, Nodes and Namespaces refused. The explanation shows
    /// the written status and says what it could not compute, rather than blaming the class.
    #[test]
    fn an_explanation_without_the_plans_inputs_shows_only_the_written_status() {
        let mut dump = programmed();
        dump.snapshot.classes.clear();
        dump.snapshot.nodes.clear();
        for what in ["PortMapClasses", "Nodes"] {
            dump.unread.push(crate::objects::Unread {
                what: what.into(),
                why: "forbidden".into(),
            });
        }
        let e = explain(
            &dump,
            "games",
            "gameserver",
            now(),
            &AgentSelector::default(),
        )
        .expect("explained");
        let t = explain_text(&e, now());
        assert!(e.ok, "{t}");
        assert!(!t.contains("no PortMapClass named"), "{t}");
        assert!(
            t.contains("[--] computed by the agents")
                && t.contains("not computed: PortMapClasses, Nodes could not be read")
                && t.contains("[ok] status as written"),
            "{t}"
        );
    }

    #[test]
    fn a_namespace_limits_the_mappings_not_the_agents() {
        let mut dump = programmed();
        without_pod_on(&mut dump, "worker-c");
        let options = ReportOptions {
            namespace: Some("web".into()),
            ..ReportOptions::default()
        };
        let r = report(&dump, now(), &options);
        assert!(r.mappings.is_empty());
        assert_eq!(r.agents.len(), 3);
        assert!(
            r.problems
                .iter()
                .any(|p| p.starts_with("node worker-c has no running agent")),
            "{:?}",
            r.problems
        );
        let t = text(&r, now());
        assert!(
            t.contains("PortMaps in namespace web: 0/0 programmed"),
            "{t}"
        );
    }

    #[test]
    fn a_node_the_daemonset_leaves_out_is_fine_unless_needed() {
        let mut dump = programmed();
        without_pod_on(&mut dump, "worker-c");
        if let Some(spec) = dump
            .daemon_sets
            .as_mut()
            .and_then(|d| d[0].spec.template.spec.as_mut())
        {
            spec.node_selector = Some([("kuport".to_owned(), "yes".to_owned())].into());
        }
        for n in &mut dump.snapshot.nodes {
            if n.metadata.name.as_deref() != Some("worker-c") {
                n.metadata.labels = Some([("kuport".to_owned(), "yes".to_owned())].into());
            }
        }
        // worker-c runs the mapping's pod: it needs an agent whatever the selector says.
        let (r, t) = run(&dump, now());
        assert!(line(&t, "worker-c ").contains("not scheduled"), "{t}");
        assert!(
            r.problems.iter().any(|p| p.contains(
                "node worker-c has no running agent: the DaemonSets' nodeSelector leaves it out"
            )),
            "{:?}",
            r.problems
        );
        // Without the mapping, nothing needs it there.
        dump.snapshot.portmaps.clear();
        let (r, _) = run(&dump, now());
        assert!(r.ok, "{:?}", r.problems);
    }

    #[test]
    fn image_versions_read_from_tag_or_digest() {
        assert_eq!(
            image_version("ghcr.io/walzen-group/kuport-agent:v0.1.0"),
            "v0.1.0"
        );
        assert_eq!(image_version("localhost:5000/kuport"), "latest");
        assert_eq!(image_version("localhost:5000/kuport:dev"), "dev");
        assert_eq!(
            image_version("ghcr.io/k@sha256:0123456789abcdef0123"),
            "0123456789ab"
        );
    }

    #[test]
    fn selectors_are_equality_terms() {
        let s = AgentSelector::parse("app.kubernetes.io/name=kuport, tier==agent", None)
            .expect("parses");
        assert_eq!(
            s.label_selector(),
            "app.kubernetes.io/name=kuport,tier=agent"
        );
        for bad in ["", "app", "app!=x", "=x"] {
            assert!(AgentSelector::parse(bad, None).is_err(), "{bad}");
        }
        assert_eq!(
            AgentSelector::default().label_selector(),
            DEFAULT_AGENT_SELECTOR
        );
    }
}
