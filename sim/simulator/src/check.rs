//! The invariants: those that must hold on every step and every pass, and those that must hold
//! once the cluster has quiesced.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use kuport_core::plan::{Plan, plan};
use kuport_core::snapshot::Snapshot;

use crate::world::{World, WorldError, lock};

/// One broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Simulated time it was seen.
    pub at: Duration,
    /// Which invariant.
    pub invariant: &'static str,
    /// What was seen, naming the objects.
    pub detail: String,
}

/// Every violation of one run.
#[derive(Debug, Default)]
pub struct Violations {
    /// In the order seen.
    pub found: Vec<Violation>,
    /// Class rows per class on the previous step (to see one vanish).
    rows: BTreeMap<String, BTreeSet<String>>,
}

impl Violations {
    fn push(&mut self, at: Duration, invariant: &'static str, detail: String) {
        // One of each kind per object is enough to read; a broken run would otherwise print
        // the same line on every step.
        if self
            .found
            .iter()
            .any(|v| v.invariant == invariant && v.detail == detail)
        {
            return;
        }
        self.found.push(Violation {
            at,
            invariant,
            detail,
        });
    }
}

/// The global decisions of one mapping, as agents must agree on them.
type Decision = (String, Option<String>, Option<String>, Option<String>);

/// What the agents decided, recorded by each pass.
#[derive(Debug, Default)]
pub struct Observations {
    /// The first node's decisions for each snapshot seen (by the snapshot's fingerprint).
    by_snapshot: BTreeMap<u64, (String, Vec<Decision>)>,
    /// Passes recorded.
    pub passes: u64,
    /// Broken invariants seen in passes: (invariant, detail).
    pub found: Vec<(&'static str, String)>,
}

/// A fingerprint of the objects a snapshot holds (kind, namespace, name, resourceVersion) and
/// the CNI facts: two agents with the same fingerprint saw the same cluster.
fn fingerprint(snapshot: &Snapshot) -> u64 {
    fn meta<K: kube::Resource>(kind: &str, items: &[K], h: &mut impl Hasher) {
        for o in items {
            let m = o.meta();
            (kind, &m.namespace, &m.name, &m.resource_version).hash(h);
        }
    }
    // Fixed keys: the fingerprint is the same in every process.
    let mut h = std::hash::DefaultHasher::new();
    meta("class", &snapshot.classes, &mut h);
    meta("portmap", &snapshot.portmaps, &mut h);
    meta("slice", &snapshot.endpoint_slices, &mut h);
    meta("node", &snapshot.nodes, &mut h);
    meta("namespace", &snapshot.namespaces, &mut h);
    format!("{:?}", snapshot.cni).hash(&mut h);
    h.finish()
}

fn decisions(plan: &Plan) -> Vec<Decision> {
    plan.portmaps
        .iter()
        .map(|d| {
            (
                format!("{}/{}", d.namespace, d.name),
                d.endpoint.as_ref().map(|e| format!("{e:?}")),
                d.serving_node.clone(),
                d.status_writer.clone(),
            )
        })
        .collect()
}

impl Observations {
    /// Records one pass of `node`, checking agreement with any other node that saw the same
    /// snapshot, and that the node writes only the statuses its own plan makes it the writer of.
    pub fn record(&mut self, node: &str, snapshot: &Snapshot, plan: &Plan) {
        self.passes += 1;
        let mine = decisions(plan);
        match self.by_snapshot.get(&fingerprint(snapshot)) {
            Some((other, theirs)) if other != node && *theirs != mine => {
                let differ = mine
                    .iter()
                    .zip(theirs)
                    .find(|(a, b)| a != b)
                    .map(|(a, b)| format!("{node} decided {a:?}, {other} decided {b:?}"))
                    .unwrap_or_else(|| format!("{node} and {other} decided different mappings"));
                self.found.push(("agreement", differ));
            }
            Some(_) => {}
            None => {
                self.by_snapshot
                    .insert(fingerprint(snapshot), (node.to_owned(), mine));
            }
        }
        for write in &plan.writes.portmaps {
            let writer = plan
                .portmaps
                .iter()
                .find(|d| d.namespace == write.namespace && d.name == write.name)
                .and_then(|d| d.status_writer.as_deref());
            if writer != Some(node) {
                self.found.push((
                    "single writer",
                    format!(
                        "{node} writes the status of PortMap {}/{} whose writer is {writer:?}",
                        write.namespace, write.name
                    ),
                ));
            }
        }
    }
}

/// Checks run after every simulation step.
pub fn each_step(world: &mut World) {
    let at = world.elapsed();
    let found = std::mem::take(&mut lock(&world.observations).found);
    for (invariant, detail) in found {
        world.violations.push(at, invariant, detail);
    }
    for class in world.classes.clone() {
        let Some(status) = world
            .object("kuport.wlz.li/v1alpha1", "portmapclasses", "", &class)
            .map(|o| o["status"].clone())
        else {
            continue;
        };
        slots_unique(world, at, &class, &status);
        rows_kept(world, at, &class, &status);
    }
}

fn slots_unique(world: &mut World, at: Duration, class: &str, status: &serde_json::Value) {
    let mut seen: BTreeMap<i64, &str> = BTreeMap::new();
    for link in status["links"].as_array().into_iter().flatten() {
        let (Some(slot), key) = (link["slot"].as_i64(), link["key"].as_str().unwrap_or("?")) else {
            continue;
        };
        if let Some(first) = seen.insert(slot, key) {
            world.violations.push(
                at,
                "unique slots",
                format!("class {class}: slot {slot} is claimed by both {first} and {key}"),
            );
        }
    }
}

/// A row vanishes only when its node stops accepting (unnamed, not Ready, or deleted).
fn rows_kept(world: &mut World, at: Duration, class: &str, status: &serde_json::Value) {
    let now: BTreeSet<String> = status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str().map(str::to_owned))
        .collect();
    let before = world.violations.rows.insert(class.to_owned(), now.clone());
    for gone in before.unwrap_or_default().difference(&now) {
        if world.accepting(class, gone) {
            world.violations.push(
                at,
                "nothing lost",
                format!("class {class}: the row of accepting node {gone} vanished"),
            );
        }
    }
}

/// Waits (simulating) until every agent converged to the plan over the final state, up to
/// `limit`, then checks the quiescence invariants. (Convergence times are measured as the
/// world runs: [`World::convergence`].)
pub fn quiesce(world: &mut World, limit: Duration) -> Result<(), WorldError> {
    let start = world.elapsed();
    let step = Duration::from_millis(100);
    let mut last = Vec::new();
    while world.elapsed() < start + limit {
        world.run_for(step)?;
        last = differences(world)?;
        if last.is_empty() {
            break;
        }
    }
    let at = world.elapsed();
    if !last.is_empty() {
        for detail in last {
            world.violations.push(at, "convergence", detail);
        }
        return Ok(());
    }
    // Converged: a quiet spell must write nothing (no ping-pong between writers).
    let writes_before = status_writes(world);
    world.run_for(Duration::from_secs(5))?;
    let writes_after = status_writes(world);
    for ((node, before), (_, after)) in writes_before.iter().zip(&writes_after) {
        if after.len() > before.len() {
            let extra = &after[before.len()..];
            world.violations.push(
                world.elapsed(),
                "single writer",
                format!(
                    "{node} kept writing after convergence: {}",
                    extra.join(", ")
                ),
            );
        }
    }
    Ok(())
}

fn status_writes(world: &World) -> Vec<(String, Vec<String>)> {
    world
        .nodes
        .iter()
        .map(|(n, s)| (n.clone(), lock(&s.requests.status_writes).clone()))
        .collect()
}

/// Everything that still differs from the converged state, each named.
pub fn differences(world: &World) -> Result<Vec<String>, WorldError> {
    let snapshot = world.snapshot()?;
    let mut out = Vec::new();
    let mut reference: Option<Plan> = None;
    for (name, slot) in &world.nodes {
        if !slot.running || slot.partitioned {
            continue;
        }
        let facts = world.host_facts(name).unwrap_or_else(|| slot.facts.clone());
        let want = plan(&snapshot, name, &facts, world.node_now(name));
        let have = slot.host.applied();
        if have != want.host_state {
            out.push(format!("node {name}: the host differs from the plan"));
        }
        reference.get_or_insert(want);
    }
    let Some(reference) = reference else {
        return Ok(out);
    };
    out.extend(portmap_statuses(&snapshot, &reference));
    out.extend(class_rows(world, &snapshot));
    Ok(out)
}

/// Each PortMap's stored conditions carry the reasons the plan decides.
fn portmap_statuses(snapshot: &Snapshot, plan: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    for d in &plan.portmaps {
        let Some(pm) = snapshot.portmaps.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(&d.namespace)
                && p.metadata.name.as_deref() == Some(&d.name)
        }) else {
            continue;
        };
        let stored = |t: &str| {
            pm.status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
                .map(|c| c.reason.clone())
        };
        let want_accepted = Some(d.accepted.reason.as_str().to_owned());
        let want_programmed = d.programmed.as_ref().map(|p| p.reason.as_str().to_owned());
        if stored("Accepted") != want_accepted
            || (want_programmed.is_some() && stored("Programmed") != want_programmed)
        {
            out.push(format!(
                "PortMap {}/{}: stored Accepted={:?} Programmed={:?}, plan says {want_accepted:?} {want_programmed:?}",
                d.namespace,
                d.name,
                stored("Accepted"),
                stored("Programmed")
            ));
        }
    }
    out
}

/// Every accepting node whose agent runs has its row.
fn class_rows(world: &World, snapshot: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    for class in &snapshot.classes {
        let name = class.metadata.name.clone().unwrap_or_default();
        let rows: BTreeSet<&str> = class
            .status
            .iter()
            .flat_map(|s| &s.nodes)
            .map(|r| r.name.as_str())
            .collect();
        for node in class.spec.nodes.keys() {
            let live = world
                .nodes
                .get(node)
                .is_some_and(|s| s.running && !s.partitioned);
            if live && world.accepting(&name, node) && !rows.contains(node.as_str()) {
                out.push(format!("class {name}: no row for accepting node {node}"));
            }
        }
    }
    out
}
