//! The invariants: those that must hold on every step and every pass, and those that must hold
//! once the cluster has quiesced; and the stepping of the world ([`World::run_for`]), which runs
//! the per-step checks and measures convergence.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kuport_core::api::PublishedAddress;
use kuport_core::plan::{ChosenEndpoint, MappingDecision, Plan, plan};
use kuport_core::snapshot::Snapshot;

use crate::sync::lock;
use crate::world::{World, WorldError};

impl World {
    /// Runs the simulation for `span` of simulated time, checking the per-step invariants.
    pub fn run_for(&mut self, span: Duration) -> Result<(), WorldError> {
        let until = self.sim.elapsed() + span;
        while self.sim.elapsed() < until {
            self.sim.step()?;
            self.now_ms
                .store(self.sim.elapsed().as_millis() as u64, Ordering::Relaxed);
            each_step(self);
            self.measure_convergence()?;
        }
        Ok(())
    }

    /// Every 100 ms of simulated time while a change is pending: has every agent converged?
    fn measure_convergence(&mut self) -> Result<(), WorldError> {
        let now = self.elapsed();
        let Some(since) = self.pending_change.filter(|_| !self.api_paused) else {
            return Ok(());
        };
        if now < self.last_check + Duration::from_millis(100) {
            return Ok(());
        }
        self.last_check = now;
        if unconverged(self)?.is_empty() {
            self.convergence.push(now - since);
            self.pending_change = None;
        }
        Ok(())
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
        last = unconverged(world)?;
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
    // Converged: the endpoints and addresses the plan converged on are where the scenario put
    // the pods and what the hosts have.
    for detail in pod_addresses(world)? {
        world.violations.push(at, "pod addresses", detail);
    }
    // Converged means no agent owes a write (none in flight, none held back for the one that
    // usually follows: `kuport::agent::status::SETTLE`), so a quiet spell must write nothing
    // (no ping-pong between writers, no write landing after convergence was declared).
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

/// What keeps the cluster from having converged, each named: what [`differences`] finds, and
/// every running agent that still owes a write ([`World::unsettled`]). A cluster whose hosts
/// and statuses match the plan while a status write is in flight or held back has not
/// converged: that write changes the objects every plan reads.
pub fn unconverged(world: &World) -> Result<Vec<String>, WorldError> {
    let mut out = differences(world)?;
    out.extend(
        world
            .unsettled()
            .into_iter()
            .map(|n| format!("node {n}: the agent still owes a status write or a pass")),
    );
    Ok(out)
}

/// Everything that still differs from the converged state, each named.
pub fn differences(world: &World) -> Result<Vec<String>, WorldError> {
    let snapshot = world.snapshot()?;
    let mut out = Vec::new();
    let mut plans: Vec<(&str, Plan)> = Vec::new();
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
        plans.push((name, want));
    }
    let Some((_, reference)) = plans.first() else {
        return Ok(out);
    };
    out.extend(agreement(&plans));
    out.extend(portmap_statuses(&snapshot, reference));
    out.extend(class_rows(world, &snapshot));
    Ok(out)
}

/// The running agents' plans over the final objects, the first's with every other's: the same
/// endpoint for every mapping (its IPv6 address too) and the same published addresses (IPv6
/// ones too), whichever node computes them.
fn agreement(plans: &[(&str, Plan)]) -> Vec<String> {
    let Some(((first, reference), rest)) = plans.split_first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (node, p) in rest {
        for (a, b) in reference.portmaps.iter().zip(&p.portmaps) {
            if a.endpoint != b.endpoint || a.published != b.published {
                out.push(format!(
                    "PortMap {}/{}: {first} plans endpoint {} published {}, {node} plans {} published {}",
                    a.namespace,
                    a.name,
                    endpoint_text(a.endpoint.as_ref()),
                    published_text(&a.published),
                    endpoint_text(b.endpoint.as_ref()),
                    published_text(&b.published),
                ));
            }
        }
    }
    out
}

/// An endpoint as the messages name it: `pod on node at address (and IPv6 address)`.
fn endpoint_text(ep: Option<&ChosenEndpoint>) -> String {
    let Some(ep) = ep else {
        return "none".to_owned();
    };
    let pod = ep.pod.as_deref().unwrap_or("?");
    match ep.address6 {
        Some(a6) => format!("{pod} on {} at {} and {a6}", ep.node, ep.address),
        None => format!("{pod} on {} at {}", ep.node, ep.address),
    }
}

/// Published addresses as the messages name them: `node/interface address IPv6-address`.
fn published_text(rows: &[PublishedAddress]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}/{} {:?} {:?}",
                r.node, r.interface, r.address, r.address6
            )
        })
        .collect();
    format!("[{}]", rows.join(", "))
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
        if let Some(detail) = stored_addresses(pm.status.as_ref(), d) {
            out.push(detail);
        }
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

/// How a PortMap's stored status differs from the plan's decision in the addresses it names:
/// the endpoint (node, address, IPv6 address) and the published addresses (IPv4 and IPv6).
fn stored_addresses(
    status: Option<&kuport_core::api::PortMapStatus>,
    d: &MappingDecision,
) -> Option<String> {
    let stored = status.and_then(|s| s.endpoint.as_ref()).map(|e| {
        let address6 = e.address6.as_deref().unwrap_or_default();
        (
            e.node.as_str().to_owned(),
            e.address.clone(),
            address6.to_owned(),
        )
    });
    let planned = d.endpoint.as_ref().map(|e| {
        let address6 = e.address6.map(|a| a.to_string()).unwrap_or_default();
        (e.node.to_string(), e.address.to_string(), address6)
    });
    let stored_rows = status.map(|s| &s.published[..]).unwrap_or_default();
    if stored == planned && stored_rows == &d.published[..] {
        return None;
    }
    Some(format!(
        "PortMap {}/{}: stored endpoint {stored:?} published {}, plan says {planned:?} published {}",
        d.namespace,
        d.name,
        published_text(stored_rows),
        published_text(&d.published),
    ))
}

/// Where the final plan's endpoints and published addresses differ from what the scenario
/// set up: each mapping's endpoint is its Service's pod as placed ([`World::expected_endpoint`]:
/// node, address, IPv6 address), and each published row names its node's interface address
/// in each family the endpoint has (none in a family it lacks), a mapping served over IPv6 and
/// programmed having at least one IPv6 address published.
pub fn pod_addresses(world: &World) -> Result<Vec<String>, WorldError> {
    let snapshot = world.snapshot()?;
    let Some((name, slot)) = world
        .nodes
        .iter()
        .find(|(_, s)| s.running && !s.partitioned)
    else {
        return Ok(Vec::new());
    };
    let facts = world.host_facts(name).unwrap_or_else(|| slot.facts.clone());
    let reference = plan(&snapshot, name, &facts, world.node_now(name));
    let mut out = Vec::new();
    for d in reference.portmaps.iter().filter(|d| d.accepted.is_true()) {
        let service = snapshot
            .portmaps
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(&d.namespace)
                    && p.metadata.name.as_deref() == Some(&d.name)
            })
            .map(|p| p.spec.service_ref.name.as_str());
        let Some(placement) = service.and_then(|s| world.pods.get(s)) else {
            continue;
        };
        let want = world.expected_endpoint(placement);
        let got = d.endpoint.as_ref().map(|e| crate::world::PodEndpoint {
            node: e.node.to_string(),
            address: e.address,
            address6: e.address6.map(std::net::IpAddr::V6),
        });
        if got != want {
            out.push(format!(
                "PortMap {}/{}: endpoint {got:?}, but its pod is placed at {want:?}",
                d.namespace, d.name
            ));
        }
        out.extend(published_faults(world, d));
    }
    Ok(out)
}

/// The published rows of `d` that do not name their node's interface address in each family
/// the endpoint has (and only those).
fn published_faults(world: &World, d: &MappingDecision) -> Vec<String> {
    let Some(ep) = &d.endpoint else {
        return Vec::new();
    };
    let (v4, v6) = (ep.v4().is_some(), ep.v6().is_some());
    let mut out = Vec::new();
    for row in d.published.iter() {
        let facts = world.nodes.get(&row.node).map(|s| &s.facts);
        let address = facts
            .and_then(|f| f.interfaces.get(&row.interface))
            .filter(|_| v4)
            .map(ToString::to_string);
        let address6 = facts
            .and_then(|f| f.interfaces6.get(&row.interface))
            .filter(|_| v6)
            .map(ToString::to_string);
        if row.address != address.unwrap_or_default()
            || row.address6 != address6.unwrap_or_default()
        {
            out.push(format!(
                "PortMap {}/{}: published {}/{} at {:?} {:?}, the interface's addresses in the endpoint's families are otherwise",
                d.namespace, d.name, row.node, row.interface, row.address, row.address6
            ));
        }
    }
    let programmed = d.programmed.as_ref().is_some_and(|p| p.is_true());
    if v6 && programmed && d.published.iter().all(|r| r.address6.is_empty()) {
        out.push(format!(
            "PortMap {}/{}: programmed over IPv6 but no IPv6 address is published",
            d.namespace, d.name
        ));
    }
    out
}
