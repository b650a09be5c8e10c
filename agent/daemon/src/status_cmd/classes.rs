//! The classes of `kuport status`: each class's view (its Ready condition, its nodes and their
//! rows, its link claims), the problems it adds (a class not ready, a node not accepting, a
//! failing node check, a preflight class left behind past its deadline) and its text.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use kuport_core::api::{
    NamespacePorts, PortMapClass, PreflightLife, ReturnPathMode, ServingMode, conditions,
    preflight_life,
};
use kuport_core::plan::Plan;
use kuport_core::snapshot::{Snapshot, node_is_ready};
use serde::Serialize;

use super::condition::{ConditionView, condition};

/// One node named by a class.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassNodeView {
    pub name: String,
    /// The node accepts now: a Ready Node and a ready row.
    pub accepting: bool,
    /// Whether a Node object of this name exists and is Ready.
    pub node_ready: bool,
    /// The row its agent wrote; absent when none.
    pub row_ready: Option<bool>,
    pub message: Option<String>,
    /// Interface → address, as the row says.
    pub addresses: BTreeMap<String, String>,
}

/// One return-link claim of a class.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkView {
    pub key: String,
    pub slot: i32,
    pub subnet: String,
    pub unused_since: Option<String>,
    /// The mappings whose traffic crosses this link (`namespace/name`), sorted.
    pub used_by: Vec<String>,
}

/// One class.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassView {
    pub name: String,
    pub mode: String,
    pub serving_mode: String,
    pub ready: Option<ConditionView>,
    pub nodes: Vec<ClassNodeView>,
    pub links: Vec<LinkView>,
    /// Ports each namespace's accepted PortMaps hold against its quota, as the accepting
    /// nodes wrote them (`status.namespaces`); absent when no namespace holds any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespacePorts>,
    pub ok: bool,
    /// Why a preflight class no longer counts (its deadline passed, by this command's clock);
    /// absent for every other class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expired: Option<String>,
}

pub(super) fn mode(c: &PortMapClass) -> &'static str {
    match c.spec.return_path.mode {
        ReturnPathMode::Vxlan => "Vxlan",
        ReturnPathMode::None => "None",
    }
}

pub(super) fn serving(c: &PortMapClass) -> &'static str {
    match c.spec.serving_mode {
        ServingMode::Single => "Single",
        ServingMode::Multi => "Multi",
    }
}

pub(super) fn class_view(
    c: &PortMapClass,
    snapshot: &Snapshot,
    plan: &Plan,
    now: Timestamp,
) -> ClassView {
    let name = c.metadata.name.clone().unwrap_or_default();
    let status = c.status.clone().unwrap_or_default();
    let nodes = c
        .spec
        .nodes
        .keys()
        .map(|node| {
            let node_ready = snapshot
                .nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(node))
                .is_some_and(node_is_ready);
            let row = status.nodes.iter().find(|r| &r.name == node);
            ClassNodeView {
                name: node.clone(),
                accepting: node_ready && row.is_some_and(|r| r.ready),
                node_ready,
                row_ready: row.map(|r| r.ready),
                message: row.and_then(|r| r.message.clone()),
                addresses: row.map(|r| r.addresses.clone()).unwrap_or_default(),
            }
        })
        .collect();
    let mut used: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for d in &plan.portmaps {
        for l in d.links.iter().filter(|l| l.class == name) {
            used.entry(l.key.as_str())
                .or_default()
                .insert(format!("{}/{}", d.namespace, d.name));
        }
    }
    let links = status
        .links
        .iter()
        .map(|l| LinkView {
            key: l.key.clone(),
            slot: l.slot,
            subnet: l.subnet.clone(),
            unused_since: l.unused_since.as_ref().map(|t| t.0.to_string()),
            used_by: used
                .get(l.key.as_str())
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default(),
        })
        .collect();
    let ready = condition(&status.conditions, conditions::READY).map(ConditionView::of);
    let ok = ready.as_ref().is_some_and(ConditionView::is_true);
    let expired = match preflight_life(c, now) {
        Some(PreflightLife::Expired { message }) => Some(message),
        _ => None,
    };
    ClassView {
        name,
        mode: mode(c).to_owned(),
        serving_mode: serving(c).to_owned(),
        ready,
        nodes,
        links,
        namespaces: status.namespaces.clone(),
        ok: ok && expired.is_none(),
        expired,
    }
}

pub(super) fn class_problems(c: &ClassView, out: &mut Vec<String>) {
    if let Some(expired) = &c.expired {
        // Its Ready condition says the same once an agent wrote it, or still says Valid: this
        // line replaces it either way.
        out.push(format!("PortMapClass {}: {expired}", c.name));
        return;
    }
    match &c.ready {
        None => out.push(format!(
            "PortMapClass {} has no Ready condition yet: no agent of its nodes has written it",
            c.name
        )),
        Some(r) if !r.is_true() => out.push(format!(
            "PortMapClass {} is not ready: {} ({})",
            c.name, r.reason, r.message
        )),
        Some(_) => {}
    }
    for n in c.nodes.iter().filter(|n| !n.accepting) {
        let why = if !n.node_ready {
            "its Node is not Ready or does not exist".to_owned()
        } else {
            match (n.row_ready, &n.message) {
                (None, _) => "no agent has written its row (is kuport running there?)".to_owned(),
                (Some(false), Some(m)) => m.clone(),
                _ => "its row is not ready".to_owned(),
            }
        };
        out.push(format!(
            "node {} does not accept for PortMapClass {}: {why}",
            n.name, c.name
        ));
    }
}

/// The node checks the agents report failing in their rows (`status.nodes[].checks`), once per
/// node and check however many classes' rows carry it, in class then node order.
pub(super) fn check_problems<'a>(
    classes: impl Iterator<Item = &'a PortMapClass>,
    out: &mut Vec<String>,
) {
    let mut classes: Vec<&PortMapClass> = classes.collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut seen = BTreeSet::new();
    for row in classes
        .iter()
        .flat_map(|c| c.status.iter().flat_map(|s| &s.nodes))
    {
        for check in row.checks.iter().filter(|c| c.ok == Some(false)) {
            let problem = format!(
                "node {}: check {} failed: {}",
                row.name, check.name, check.message
            );
            if seen.insert(problem.clone()) {
                out.push(problem);
            }
        }
    }
}

/// One class: its mode and readiness, then a line per node and per link.
pub(super) fn class_text(out: &mut String, c: &ClassView) {
    let state = c.ready.as_ref().map_or_else(
        || "Ready unknown (no status yet)".to_owned(),
        |r| format!("Ready={} {}", r.status, r.reason),
    );
    let accepting = c.nodes.iter().filter(|n| n.accepting).count();
    let _ = writeln!(
        out,
        "{}: {} {}, {state}, {accepting}/{} nodes accepting",
        c.name,
        c.mode,
        c.serving_mode,
        c.nodes.len()
    );
    for n in &c.nodes {
        let what = if n.accepting {
            let addrs: Vec<String> = n
                .addresses
                .iter()
                .map(|(i, a)| format!("{i}={a}"))
                .collect();
            format!("accepting ({})", addrs.join(", "))
        } else if !n.node_ready {
            "not accepting: its Node is not Ready or does not exist".to_owned()
        } else {
            match (n.row_ready, &n.message) {
                (None, _) => "not accepting: no row from its agent".to_owned(),
                (Some(false), Some(m)) => format!("not accepting: {m}"),
                _ => "not accepting: its row is not ready".to_owned(),
            }
        };
        let _ = writeln!(out, "  node {}: {what}", n.name);
    }
    if !c.namespaces.is_empty() {
        let shares: Vec<String> = c
            .namespaces
            .iter()
            .map(|n| format!("{} {}/{}", n.namespace, n.used_ports, n.quota_ports))
            .collect();
        let _ = writeln!(
            out,
            "  ports per namespace (used/quota): {}",
            shares.join(", ")
        );
    }
    for l in &c.links {
        let use_ = if l.used_by.is_empty() {
            match &l.unused_since {
                Some(t) => format!("unused since {t}"),
                None => "not needed by any mapping".to_owned(),
            }
        } else {
            format!("used by {}", l.used_by.join(", "))
        };
        let _ = writeln!(
            out,
            "  link {}: slot {} {}, {use_}",
            l.key, l.slot, l.subnet
        );
    }
}

#[cfg(test)]
mod tests {
    use kuport_core::api::{NamespacePorts, PREFLIGHT_ANNOTATION, PREFLIGHT_DEADLINE_ANNOTATION};

    use super::super::agents::AgentSelector;
    use super::super::render::{ReportOptions, report};
    use super::{class_text, class_view};
    use crate::objects::Dump;

    /// The standard cluster with a preflight class whose deadline is `deadline`, reported at
    /// the testkit's NOW (12:00:00): the problems about that class.
    fn preflight_problems(deadline: &str) -> Vec<String> {
        let mut c = kuport_testkit::cluster::two_edges_and_worker("169.254.77.0/24");
        let mut class = c.class_mut("public").clone();
        class.metadata.name = Some("kuport-preflight".into());
        class.status = None;
        class.metadata.annotations = Some(
            [
                (PREFLIGHT_ANNOTATION.to_owned(), "true".to_owned()),
                (
                    PREFLIGHT_DEADLINE_ANNOTATION.to_owned(),
                    deadline.to_owned(),
                ),
            ]
            .into(),
        );
        c.snapshot.classes.push(class);
        let dump = Dump {
            snapshot: c.snapshot,
            ..Dump::default()
        };
        let options = ReportOptions {
            namespace: None,
            agents: AgentSelector::default(),
        };
        let r = report(&dump, kuport_testkit::cluster::now(), &options);
        r.problems
            .into_iter()
            .filter(|p| p.contains("PortMapClass kuport-preflight"))
            .collect()
    }

    #[test]
    fn a_preflight_class_past_its_deadline_is_named_as_left_behind() {
        let expired = preflight_problems("2026-06-01T11:58:00Z");
        assert_eq!(expired.len(), 1, "{expired:?}");
        assert!(
            expired[0].starts_with(
                "PortMapClass kuport-preflight: preflight class kuport-preflight expired: its deadline 2026-06-01T11:58:00Z"
            ),
            "{expired:?}"
        );
        assert!(
            expired[0].contains("kubectl delete portmapclass kuport-preflight"),
            "{expired:?}"
        );
        // Control: a live one is only what its (missing) Ready condition says.
        let live = preflight_problems("2026-06-01T12:05:00Z");
        assert!(live.iter().all(|p| !p.contains("expired")), "{live:?}");
        assert!(
            live.iter()
                .any(|p| p.contains("has no Ready condition yet")),
            "{live:?}"
        );
    }

    #[test]
    fn each_namespaces_ports_are_shown_against_its_quota() {
        let mut c = kuport_testkit::cluster::two_edges_and_worker("169.254.77.0/24");
        let plan = c.plan("edge-a");
        let mut class = c.class_mut("public").clone();
        let view = class_view(&class, &c.snapshot, &plan, kuport_testkit::cluster::now());
        let mut text = String::new();
        class_text(&mut text, &view);
        assert!(!text.contains("ports per namespace"), "{text}");
        let status = class.status.get_or_insert_with(Default::default);
        status.namespaces = vec![
            NamespacePorts {
                namespace: "games".into(),
                used_ports: 101,
                quota_ports: 200,
            },
            NamespacePorts {
                namespace: "mail".into(),
                used_ports: 2,
                quota_ports: 1024,
            },
        ];
        let view = class_view(&class, &c.snapshot, &plan, kuport_testkit::cluster::now());
        let mut text = String::new();
        class_text(&mut text, &view);
        assert!(
            text.contains("  ports per namespace (used/quota): games 101/200, mail 2/1024\n"),
            "{text}"
        );
        let json = serde_json::to_value(&view).expect("a class view is JSON");
        assert_eq!(json["namespaces"][0]["usedPorts"], 101, "{json}");
    }
}
