//! Whose rows count, and what a node writes into its own `PortMapNode`.
//!
//! A node's row of a class comes from its `PortMapNode` once it has one, and from the class's
//! `status.nodes` only while it has none: an agent of an earlier version, during an upgrade,
//! still writes its row there. A node that has its own object owns all of its rows in it, so a
//! row it left in a class status before the upgrade no longer counts (and its agent removes it).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::row_patch::row_settles_only;
use super::{ClassRowWrite, Writes};
use crate::api::{
    ClassNodeStatus, LinkEndStatus, NodeClassRow, PortMapClass, PortMapNode, PortMapNodeSpec,
};

/// How often an agent refreshes its row's `lastPassTime` when nothing else in the row changed:
/// often enough to tell a stopped agent, rarely enough that a quiet cluster costs about one
/// write per node and class a minute at most (passes happen on changes and at every resync).
pub const LAST_PASS_REFRESH_SECONDS: i64 = 60;

/// The rows the nodes' own objects hold, by (class, node), and which nodes have an object.
#[derive(Clone, Debug, Default)]
pub struct NodeRows<'a> {
    /// Nodes with a `PortMapNode`: their rows come from there alone.
    reporting: BTreeSet<&'a str>,
    /// Each reporting node's row of each class, by (class, node).
    rows: BTreeMap<(&'a str, &'a str), &'a ClassNodeStatus>,
}

impl<'a> NodeRows<'a> {
    /// The rows of `objects`. A row whose `name` is not its object's is left out: an object is
    /// its node's word about itself only.
    pub fn new(objects: impl IntoIterator<Item = &'a PortMapNode>) -> Self {
        let mut reporting = BTreeSet::new();
        let mut rows = BTreeMap::new();
        for object in objects {
            let Some(node) = object.metadata.name.as_deref() else {
                continue;
            };
            reporting.insert(node);
            for entry in object.spec.classes.iter().filter(|c| c.row.name == node) {
                rows.entry((entry.class.as_str(), node))
                    .or_insert(&entry.row);
            }
        }
        Self { reporting, rows }
    }

    /// Whether `node` has a `PortMapNode`.
    pub fn reports(&self, node: &str) -> bool {
        self.reporting.contains(node)
    }

    /// The rows of `class` that count, in node-name order (the first of a node's rows).
    pub fn rows_of(&self, class: &'a PortMapClass) -> Vec<&'a ClassNodeStatus> {
        let name = class.metadata.name.as_deref().unwrap_or_default();
        let legacy = class
            .status
            .iter()
            .flat_map(|s| s.nodes.iter())
            .filter(|r| !self.reports(&r.name));
        let own = self
            .rows
            .range((name, "")..)
            .take_while(|((c, _), _)| *c == name)
            .map(|(_, row)| *row);
        let mut rows: Vec<&ClassNodeStatus> = legacy.chain(own).collect();
        // Stable: of a node's legacy rows, the first stays first.
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows.dedup_by(|later, first| later.name == first.name);
        rows
    }
}

/// `classes` with each status's rows replaced by the rows that count: for readers that take the
/// classes whole (`kuport status`, preflight's verdict).
pub fn with_node_rows(classes: &mut [PortMapClass], objects: &[PortMapNode]) {
    if objects.is_empty() {
        return;
    }
    let node_rows = NodeRows::new(objects);
    let effective: Vec<Vec<ClassNodeStatus>> = classes
        .iter()
        .map(|c| node_rows.rows_of(c).into_iter().cloned().collect())
        .collect();
    for (class, rows) in classes.iter_mut().zip(effective) {
        if rows.is_empty() && class.status.is_none() {
            continue;
        }
        class.status.get_or_insert_with(Default::default).nodes = rows;
    }
}

/// What `node`'s agent writes into its `PortMapNode` for `writes`: its row of each class, sorted
/// by class and stamped with `agent_version`. A row's pass time is `now` unless the stored row
/// has one less than [`LAST_PASS_REFRESH_SECONDS`] old from the same version, which then stands
/// with its links' round trips (they change on every probe), so a converged pass writes nothing.
pub fn node_spec(
    stored: Option<&PortMapNodeSpec>,
    writes: &Writes,
    agent_version: &str,
    now: Timestamp,
) -> PortMapNodeSpec {
    let mut classes: Vec<NodeClassRow> = writes
        .class_rows
        .iter()
        .map(|write| NodeClassRow {
            class: write.class.clone(),
            row: stamped_row(stored, write, agent_version, now),
        })
        .collect();
    classes.sort_by(|a, b| a.class.cmp(&b.class));
    classes.dedup_by(|later, first| later.class == first.class);
    PortMapNodeSpec {
        agent_version: Some(agent_version.to_owned()),
        classes,
    }
}

fn stamped_row(
    stored: Option<&PortMapNodeSpec>,
    write: &ClassRowWrite,
    agent_version: &str,
    now: Timestamp,
) -> ClassNodeStatus {
    let mut row = write.row.clone();
    row.agent_version = Some(agent_version.to_owned());
    let old = stored
        .into_iter()
        .flat_map(|s| s.classes.iter())
        .find(|c| c.class == write.class)
        .map(|c| &c.row);
    let kept = old.and_then(|old| {
        let recent = old.last_pass_time.as_ref().filter(|t| {
            (0..LAST_PASS_REFRESH_SECONDS).contains(&(now.as_second() - t.0.as_second()))
        });
        recent.filter(|_| old.agent_version == row.agent_version)
    });
    if let (Some(_), Some(old)) = (kept, old) {
        keep_round_trips(&old.links, &mut row.links);
    }
    row.last_pass_time = Some(kept.cloned().unwrap_or(Time(now)));
    row
}

/// Round trips change on every probe: between refreshes of the pass time the stored ones stand.
pub(super) fn keep_round_trips(stored: &[LinkEndStatus], links: &mut [LinkEndStatus]) {
    for link in links.iter_mut() {
        if let Some(old) = stored.iter().find(|o| o.peer == link.peer) {
            link.rtt_microseconds = old.rtt_microseconds;
        }
    }
}

/// Whether going from `stored` to `desired` only takes link ends down or drops rows: a change
/// nobody waits for, which may wait for the node's next write (see `row_patch::settles_only`).
/// False when nothing changed.
pub fn node_settles_only(stored: &PortMapNodeSpec, desired: &PortMapNodeSpec) -> bool {
    let classes: BTreeSet<&str> = (stored.classes.iter())
        .chain(&desired.classes)
        .map(|c| c.class.as_str())
        .collect();
    let row = |spec: &'_ PortMapNodeSpec, class: &str| -> Option<ClassNodeStatus> {
        spec.classes
            .iter()
            .find(|c| c.class == class)
            .map(|c| c.row.clone())
    };
    stored != desired
        && stored.agent_version == desired.agent_version
        && classes
            .into_iter()
            .all(|c| row_settles_only(row(stored, c).as_ref(), row(desired, c).as_ref()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kuport_testkit::cluster::{ready_condition, timestamp};

    use super::*;
    use crate::api::{PortMapClassSpec, PortMapClassStatus};
    use crate::plan::merge::tests::row;

    fn object(node: &str, rows: &[(&str, ClassNodeStatus)]) -> PortMapNode {
        PortMapNode {
            metadata: ObjectMeta {
                name: Some(node.into()),
                ..Default::default()
            },
            spec: PortMapNodeSpec {
                agent_version: None,
                classes: rows
                    .iter()
                    .map(|(class, row)| NodeClassRow {
                        class: (*class).into(),
                        row: row.clone(),
                    })
                    .collect(),
            },
        }
    }

    fn class(name: &str, rows: Vec<ClassNodeStatus>) -> PortMapClass {
        let spec: PortMapClassSpec = serde_json::from_value(serde_json::json!({
            "nodes": {"a": {"interfaces": ["eth0"]}},
            "returnPath": {"mode": "None"},
        }))
        .expect("spec");
        let mut class = PortMapClass::new(name, spec);
        class.status = Some(PortMapClassStatus {
            nodes: rows,
            ..Default::default()
        });
        class
    }

    fn names(rows: &[&ClassNodeStatus]) -> Vec<String> {
        rows.iter()
            .map(|r| format!("{}:{}", r.name, r.message.as_deref().unwrap_or("")))
            .collect()
    }

    fn said(node: &str, message: &str) -> ClassNodeStatus {
        ClassNodeStatus {
            message: Some(message.into()),
            ..row(node)
        }
    }

    #[test]
    fn a_nodes_own_object_outranks_its_row_in_the_class() {
        let public = class(
            "public",
            vec![
                said("a", "legacy"),
                said("b", "legacy"),
                said("c", "legacy"),
            ],
        );
        let objects = [
            object("b", &[("public", said("b", "own"))]),
            // c has an object without a row of this class: its legacy row no longer counts.
            object("c", &[("other", said("c", "own"))]),
            object("d", &[("public", said("d", "own"))]),
        ];
        let rows = NodeRows::new(&objects);
        assert_eq!(
            names(&rows.rows_of(&public)),
            ["a:legacy", "b:own", "d:own"]
        );
        // Without objects every legacy row counts.
        assert_eq!(
            names(&NodeRows::default().rows_of(&public)),
            ["a:legacy", "b:legacy", "c:legacy"]
        );
    }

    #[test]
    fn a_row_under_another_nodes_name_is_left_out() {
        let public = class("public", vec![said("a", "legacy")]);
        // b's object carries a row named a: it speaks only for b.
        let objects = [object("b", &[("public", said("a", "forged"))])];
        let rows = NodeRows::new(&objects);
        assert_eq!(names(&rows.rows_of(&public)), ["a:legacy"]);
    }

    #[test]
    fn rows_come_out_the_same_whatever_the_objects_order() {
        let public = class("public", vec![said("a", "legacy")]);
        let mut objects: Vec<PortMapNode> = (0..20)
            .map(|i| object(&format!("n{i:02}"), &[("public", row(&format!("n{i:02}")))]))
            .collect();
        let want = names(&NodeRows::new(&objects).rows_of(&public));
        objects.reverse();
        objects.swap(3, 11);
        assert_eq!(names(&NodeRows::new(&objects).rows_of(&public)), want);
        assert_eq!(want.len(), 21);
    }

    #[test]
    fn classes_read_whole_get_the_rows_that_count() {
        let mut classes = vec![class(
            "public",
            vec![said("a", "legacy"), said("b", "legacy")],
        )];
        with_node_rows(
            &mut classes,
            &[object("b", &[("public", said("b", "own"))])],
        );
        let status = classes[0].status.as_ref().expect("status");
        let rows: Vec<&ClassNodeStatus> = status.nodes.iter().collect();
        assert_eq!(names(&rows), ["a:legacy", "b:own"]);
    }

    fn writes(rows: &[(&str, ClassNodeStatus)]) -> Writes {
        Writes {
            class_rows: rows
                .iter()
                .map(|(class, row)| ClassRowWrite {
                    class: (*class).into(),
                    row: row.clone(),
                    ready: ready_condition("True", "Valid", "2026-01-01T00:00:00Z"),
                    accepting: Vec::new(),
                    named: 1,
                    namespaces: Vec::new(),
                })
                .collect(),
            ..Default::default()
        }
    }

    /// `seconds` after 2026-01-01T00:00:00Z.
    fn ts(seconds: i64) -> Timestamp {
        timestamp("2026-01-01T00:00:00Z") + k8s_openapi::jiff::SignedDuration::from_secs(seconds)
    }

    #[test]
    fn the_pass_time_stands_while_recent_and_is_refreshed_after() {
        let w = writes(&[("public", row("a")), ("mail", row("a"))]);
        let first = node_spec(None, &w, "1.0", ts(1_000));
        assert_eq!(
            first
                .classes
                .iter()
                .map(|c| c.class.as_str())
                .collect::<Vec<_>>(),
            ["mail", "public"]
        );
        let pass = |s: &PortMapNodeSpec| s.classes[0].row.last_pass_time.clone();
        assert_eq!(pass(&first), Some(Time(ts(1_000))));
        // Within the refresh interval the same pass writes the same object.
        let again = node_spec(Some(&first), &w, "1.0", ts(1_030));
        assert_eq!(again, first);
        // After it, the time is refreshed; a new version stamps at once.
        let later = node_spec(
            Some(&first),
            &w,
            "1.0",
            ts(1_000 + LAST_PASS_REFRESH_SECONDS),
        );
        assert_eq!(
            pass(&later),
            Some(Time(ts(1_000 + LAST_PASS_REFRESH_SECONDS)))
        );
        let upgraded = node_spec(Some(&first), &w, "1.1", ts(1_010));
        assert_eq!(pass(&upgraded), Some(Time(ts(1_010))));
    }

    #[test]
    fn only_ends_taken_down_settle() {
        let end = |peer: &str| LinkEndStatus {
            peer: peer.into(),
            slot: 0,
            ..Default::default()
        };
        let linked = ClassNodeStatus {
            links: vec![end("p"), end("q")],
            ..row("a")
        };
        let stored = node_spec(None, &writes(&[("public", linked.clone())]), "1", ts(0));
        let fewer = ClassNodeStatus {
            links: vec![end("p")],
            ..row("a")
        };
        let down = node_spec(Some(&stored), &writes(&[("public", fewer)]), "1", ts(1));
        assert!(node_settles_only(&stored, &down));
        let gone = node_spec(Some(&stored), &writes(&[]), "1", ts(1));
        assert!(node_settles_only(&stored, &gone));
        let more = ClassNodeStatus {
            links: vec![end("p"), end("q"), end("r")],
            ..row("a")
        };
        let up = node_spec(Some(&stored), &writes(&[("public", more)]), "1", ts(1));
        assert!(!node_settles_only(&stored, &up));
        assert!(!node_settles_only(&stored, &stored));
    }
}
