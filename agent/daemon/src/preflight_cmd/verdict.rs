//! What the preflight class's rows say: each node's checks and each pair's link verdict from
//! both ends, judged and rendered. Pure: from the class as read, the nodes tested and the time
//! a down verdict has held.

use std::collections::BTreeMap;
use std::time::Duration;

use kuport_core::api::{ClassNodeStatus, LinkEndStatus, NodeCheck, PortMapClass, conditions};
use serde::Serialize;

use crate::status_cmd::terminal::escape;

/// How long the command must see a pair down before it takes the verdict as final: a link whose
/// far end came up a little later can start down and comes back within 4 s of answers.
pub const DOWN_SETTLE: Duration = Duration::from_secs(15);

/// One node as its row in the preflight class says.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub node: String,
    /// Whether its agent wrote a row in the class.
    pub reported: bool,
    /// Its checks, as its row gives them.
    pub checks: Vec<NodeCheck>,
    /// The agent version that wrote the row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
}

impl NodeReport {
    fn failing(&self) -> impl Iterator<Item = &NodeCheck> {
        self.checks.iter().filter(|c| c.ok == Some(false))
    }
}

/// One end of a pair's link, as that end's row says.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndReport {
    pub node: String,
    /// Whether the row lists its end of the link (it built the link).
    pub built: bool,
    /// Its probes' verdict: absent until the first one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(rename = "verifiedMTU", skip_serializing_if = "Option::is_none")]
    pub verified_mtu: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtt_microseconds: Option<i32>,
}

/// Where a pair stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PairState {
    /// Both ends' probes pass, full size included.
    Up,
    /// An end's probes fail.
    Down,
    /// Not every end has given a verdict (with its verified MTU) yet.
    Pending,
}

/// One pair of nodes: the link port reachable both ways and the link's MTU verified.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PairReport {
    /// `a/b`, sorted.
    pub key: String,
    pub state: PairState,
    /// The link's MTU: the smaller underlay MTU of the two rows, less VXLAN's 50 bytes.
    #[serde(rename = "linkMTU", skip_serializing_if = "Option::is_none")]
    pub link_mtu: Option<i32>,
    /// The largest probe both ends saw cross (the smaller of the two).
    #[serde(rename = "verifiedMTU", skip_serializing_if = "Option::is_none")]
    pub verified_mtu: Option<i32>,
    pub ends: [EndReport; 2],
}

/// Every node's and every pair's report, from the class as read.
pub fn evaluate(
    class: Option<&PortMapClass>,
    nodes: &[String],
) -> (Vec<NodeReport>, Vec<PairReport>) {
    let rows: BTreeMap<&str, &ClassNodeStatus> = class
        .and_then(|c| c.status.as_ref())
        .map(|s| s.nodes.iter().map(|r| (r.name.as_str(), r)).collect())
        .unwrap_or_default();
    let reports = nodes
        .iter()
        .map(|n| {
            let row = rows.get(n.as_str());
            NodeReport {
                node: n.clone(),
                reported: row.is_some(),
                checks: row.map(|r| r.checks.clone()).unwrap_or_default(),
                agent_version: row.and_then(|r| r.agent_version.clone()),
            }
        })
        .collect();
    let mut pairs = Vec::new();
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            let (a, b) = if a <= b { (a, b) } else { (b, a) };
            pairs.push(pair(a, b, rows.get(a.as_str()), rows.get(b.as_str())));
        }
    }
    pairs.sort_by(|x, y| x.key.cmp(&y.key));
    (reports, pairs)
}

fn end(node: &str, peer: &str, row: Option<&&ClassNodeStatus>) -> EndReport {
    let link: Option<&LinkEndStatus> = row.and_then(|r| r.links.iter().find(|l| l.peer == peer));
    EndReport {
        node: node.to_owned(),
        built: link.is_some(),
        up: link.and_then(|l| l.up),
        message: link.and_then(|l| l.message.clone()),
        verified_mtu: link.and_then(|l| l.verified_mtu),
        rtt_microseconds: link.and_then(|l| l.rtt_microseconds),
    }
}

fn pair(
    a: &str,
    b: &str,
    row_a: Option<&&ClassNodeStatus>,
    row_b: Option<&&ClassNodeStatus>,
) -> PairReport {
    let ends = [end(a, b, row_a), end(b, a, row_b)];
    let link_mtu = [row_a, row_b]
        .into_iter()
        .map(|r| r.and_then(|r| r.link_mtu))
        .collect::<Option<Vec<i32>>>()
        .and_then(|m| m.into_iter().min());
    let verified_mtu = ends
        .iter()
        .map(|e| e.verified_mtu)
        .collect::<Option<Vec<i32>>>()
        .and_then(|m| m.into_iter().min());
    let up = ends.iter().all(|e| e.up == Some(true));
    let mtu_ok = match (verified_mtu, link_mtu) {
        (Some(v), Some(l)) => v >= l,
        (Some(_), None) => true,
        (None, _) => false,
    };
    let state = if ends.iter().any(|e| e.up == Some(false)) {
        PairState::Down
    } else if up && mtu_ok {
        PairState::Up
    } else {
        PairState::Pending
    };
    PairReport {
        key: format!("{a}/{b}"),
        state,
        link_mtu,
        verified_mtu,
        ends,
    }
}

/// Why the class itself stops the preflight: its `Ready` is False (an overlap with another
/// class, the CNI's port, no slot for a pair), which no wait cures.
pub fn class_not_ready(class: Option<&PortMapClass>) -> Option<String> {
    let ready = class?
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::READY)?;
    (ready.status == conditions::FALSE).then(|| format!("{}: {}", ready.reason, ready.message))
}

/// Whether nothing more is worth waiting for: every node reported, and every pair is up or has
/// been seen down for [`DOWN_SETTLE`] (`down_for` gives how long, by key).
pub fn settled(
    nodes: &[NodeReport],
    pairs: &[PairReport],
    down_for: &BTreeMap<String, Duration>,
) -> bool {
    nodes.iter().all(|n| n.reported)
        && pairs.iter().all(|p| match p.state {
            PairState::Up => true,
            PairState::Down => down_for.get(&p.key).is_some_and(|d| *d >= DOWN_SETTLE),
            PairState::Pending => false,
        })
}

/// What failed, one sentence each: the class, nodes that never reported or whose checks fail,
/// pairs down or without a verdict. `waited` is how long the command waited.
pub fn problems(
    class: &str,
    not_ready: Option<&str>,
    nodes: &[NodeReport],
    pairs: &[PairReport],
    port: u16,
    waited: Duration,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(why) = not_ready {
        out.push(format!("the preflight class {class} is not Ready ({why})"));
    }
    for n in nodes {
        if !n.reported {
            out.push(format!(
                "node {} never reported: its agent wrote no row in PortMapClass {class} within {}s (is its agent running, and of a version with preflight?)",
                n.node,
                waited.as_secs()
            ));
        }
        for c in n.failing() {
            out.push(format!("node {}: {} failed: {}", n.node, c.name, c.message));
        }
    }
    for p in pairs {
        if let Some(why) = pair_problem(p, port) {
            out.push(format!("pair {}: {why}", p.key));
        }
    }
    out
}

fn pair_problem(p: &PairReport, port: u16) -> Option<String> {
    match p.state {
        PairState::Up => None,
        PairState::Down => {
            let said: Vec<String> = p
                .ends
                .iter()
                .filter(|e| e.up == Some(false))
                .map(|e| format!("{}: {}", e.node, e.message.as_deref().unwrap_or("down")))
                .collect();
            Some(format!(
                "the link across UDP port {port} does not pass ({})",
                said.join("; ")
            ))
        }
        PairState::Pending => {
            let missing: Vec<String> = p
                .ends
                .iter()
                .filter_map(|e| match (e.built, e.up) {
                    (false, _) => Some(format!("{} has not built its end", e.node)),
                    (true, None) => Some(format!("{} has no verdict yet", e.node)),
                    (true, Some(_)) if e.verified_mtu.is_none() => Some(format!(
                        "{} has not verified the MTU (no full-size probe answered)",
                        e.node
                    )),
                    _ => None,
                })
                .collect();
            let what = if missing.is_empty() {
                format!(
                    "the verified MTU {} is below the link MTU {}",
                    p.verified_mtu.unwrap_or_default(),
                    p.link_mtu.unwrap_or_default()
                )
            } else {
                missing.join("; ")
            };
            Some(format!("no passing verdict within the timeout: {what}"))
        }
    }
}

/// The preflight's whole answer.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// True when every precondition passed.
    pub ok: bool,
    /// The class the links were tested in.
    pub class: String,
    /// The link port tested (UDP).
    pub port: u16,
    /// The cluster's preconditions.
    pub cluster: Vec<NodeCheck>,
    pub nodes: Vec<NodeReport>,
    pub pairs: Vec<PairReport>,
    /// What failed, one sentence each.
    pub problems: Vec<String>,
    /// Why the nodes and pairs were not tested (no preflight class was created), when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_tested: Option<String>,
}

fn mark(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "ok",
        Some(false) => "FAIL",
        None => "-",
    }
}

/// The report for people: the cluster's checks, one line per node, one per pair, then what
/// failed.
pub fn text(r: &Report) -> String {
    let mut out = String::from("Cluster:\n");
    for c in &r.cluster {
        out.push_str(&format!(
            "  {:<5} {:<14} {}\n",
            mark(c.ok),
            c.name,
            escape(&c.message)
        ));
    }
    if let Some(why) = &r.not_tested {
        out.push_str(&format!("Nodes and pairs: not tested: {}\n", escape(why)));
    } else {
        nodes_and_pairs(r, &mut out);
    }
    if r.ok {
        out.push_str("Every precondition passed.\n");
    } else {
        out.push_str(&format!("Failed ({}):\n", r.problems.len()));
        for p in &r.problems {
            out.push_str(&format!("- {}\n", escape(p)));
        }
    }
    out
}

fn nodes_and_pairs(r: &Report, out: &mut String) {
    out.push_str(&format!("Nodes (checks reported in class {}):\n", r.class));
    for n in &r.nodes {
        out.push_str(&format!("  {:<20} {}\n", escape(&n.node), node_line(n)));
    }
    out.push_str(&format!(
        "Pairs (link port {}/udp, probes across the link):\n",
        r.port
    ));
    if r.pairs.is_empty() {
        out.push_str("  none: a single node\n");
    }
    for p in &r.pairs {
        out.push_str(&format!("  {:<30} {}\n", escape(&p.key), pair_line(p)));
    }
}

fn node_line(n: &NodeReport) -> String {
    if !n.reported {
        return "FAIL  never reported".to_owned();
    }
    if n.checks.is_empty() {
        return "-     no checks reported (an agent older than this command)".to_owned();
    }
    let failing: Vec<&str> = n.failing().map(|c| c.name.as_str()).collect();
    let unchecked: Vec<&str> = n
        .checks
        .iter()
        .filter(|c| c.ok.is_none())
        .map(|c| c.name.as_str())
        .collect();
    let passed = n.checks.iter().filter(|c| c.ok == Some(true)).count();
    let mut line = if failing.is_empty() {
        format!("ok    {passed} passed")
    } else {
        format!("FAIL  {} failed, {passed} passed", failing.join(", "))
    };
    if !unchecked.is_empty() {
        line.push_str(&format!("; not checked: {}", unchecked.join(", ")));
    }
    line
}

fn pair_line(p: &PairReport) -> String {
    let mtu = match (p.verified_mtu, p.link_mtu) {
        (Some(v), Some(l)) => format!("MTU {v} verified (link MTU {l})"),
        (Some(v), None) => format!("MTU {v} verified"),
        (None, Some(l)) => format!("MTU not verified (link MTU {l})"),
        (None, None) => "MTU not verified".to_owned(),
    };
    let rtt = p
        .ends
        .iter()
        .filter_map(|e| e.rtt_microseconds)
        .max()
        .map(|us| format!(", rtt {:.1} ms", f64::from(us) / 1000.0))
        .unwrap_or_default();
    match p.state {
        PairState::Up => format!("up    {mtu}{rtt}"),
        PairState::Down => format!("DOWN  {mtu}"),
        PairState::Pending => format!("FAIL  no verdict; {mtu}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(rows: serde_json::Value) -> PortMapClass {
        serde_json::from_value(json!({
            "apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMapClass",
            "metadata": {"name": "kuport-preflight"},
            "spec": {"nodes": {"a": {"interfaces": ["lo"]}}, "returnPath": {"mode": "Vxlan"}},
            "status": {"nodes": rows},
        }))
        .expect("class")
    }

    fn row(node: &str, peer: &str, up: Option<bool>, mtu: Option<i32>) -> serde_json::Value {
        let mut link = json!({"peer": peer, "slot": 0});
        if let Some(up) = up {
            link["up"] = json!(up);
        }
        if let Some(m) = mtu {
            link["verifiedMTU"] = json!(m);
        }
        json!({"name": node, "ready": true, "underlayMTU": 1420, "linkMTU": 1370,
               "links": [link],
               "checks": [{"name": "ipForward", "ok": true, "message": "net.ipv4.ip_forward is 1"}]})
    }

    fn names() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    #[test]
    fn a_pair_is_up_only_with_both_ends_up_and_the_mtu_verified() {
        let c = class(json!([
            row("a", "b", Some(true), Some(1370)),
            row("b", "a", Some(true), Some(1370))
        ]));
        let (nodes, pairs) = evaluate(Some(&c), &names());
        assert_eq!(pairs[0].state, PairState::Up);
        assert!(settled(&nodes, &pairs, &BTreeMap::new()));
        assert!(problems("p", None, &nodes, &pairs, 4790, Duration::ZERO).is_empty());

        let c = class(json!([
            row("a", "b", Some(true), Some(1370)),
            row("b", "a", Some(true), None)
        ]));
        let (nodes, pairs) = evaluate(Some(&c), &names());
        assert_eq!(pairs[0].state, PairState::Pending);
        assert!(!settled(&nodes, &pairs, &BTreeMap::new()));
        let said = problems("p", None, &nodes, &pairs, 4790, Duration::ZERO);
        assert!(said[0].contains("b has not verified the MTU"), "{said:?}");
    }

    #[test]
    fn a_down_pair_settles_only_after_it_held() {
        let c = class(json!([
            row("a", "b", Some(false), None),
            row("b", "a", Some(true), None)
        ]));
        let (nodes, pairs) = evaluate(Some(&c), &names());
        assert_eq!(pairs[0].state, PairState::Down);
        let mut held = BTreeMap::new();
        held.insert("a/b".to_owned(), Duration::from_secs(3));
        assert!(!settled(&nodes, &pairs, &held));
        held.insert("a/b".to_owned(), DOWN_SETTLE);
        assert!(settled(&nodes, &pairs, &held));
    }

    #[test]
    fn a_node_without_a_row_is_named() {
        let c = class(json!([row("a", "b", None, None)]));
        let (nodes, pairs) = evaluate(Some(&c), &names());
        let said = problems("p", None, &nodes, &pairs, 4790, Duration::from_secs(60));
        assert!(
            said.iter().any(|p| p.starts_with("node b never reported")),
            "{said:?}"
        );
        assert!(
            said.iter().any(|p| p.contains("b has not built its end")),
            "{said:?}"
        );
        assert!(
            text(&Report {
                ok: false,
                class: "p".into(),
                port: 4790,
                cluster: Vec::new(),
                nodes,
                pairs,
                problems: said,
                not_tested: None,
            })
            .contains("b                    FAIL  never reported")
        );
    }
}
