//! Scenarios over many seeds: each seed builds a world, runs the scenario's script (cluster
//! changes and faults), stops the faults, lets the cluster quiesce and checks the invariants.
//! One summary line per scenario; a failing seed is printed and replays with
//! `KUPORT_SIM_SEED=<seed>`.

use std::time::Duration;

use kuport::agent::PassHook;
use kuport_core::ir::Family;
use kuport_testkit::objects::{self, endpoint, nodes_json, vxlan_return_path};
use serde_json::{Value, json};

use crate::check::quiesce;
use crate::net::Tamper;
use crate::record::Violation;
use crate::world::{Stack, World, WorldConfig, WorldError, pod_address};

/// A scenario's script: changes the cluster (through `World`), with faults, over simulated
/// time. It calls [`World::changed`] after each input change.
pub type Script = fn(&mut World) -> Result<(), WorldError>;

/// A scenario.
pub struct Scenario {
    /// Its name, in the summary line.
    pub name: &'static str,
    /// Node names (each runs an agent).
    pub nodes: &'static [&'static str],
    /// What happens.
    pub script: Script,
    /// A dual-stack cluster ([`WorldConfig::dual_stack`]).
    pub dual_stack: bool,
}

/// A deliberately broken agent, to prove an invariant catches it.
#[derive(Clone, Default)]
pub struct Variant {
    /// Changes every plan.
    pub plan_fault: Option<PassHook>,
    /// Changes every request on the wire.
    pub wire_fault: Option<Tamper>,
}

/// One seed's run.
#[derive(Debug)]
pub struct SeedRun {
    /// The seed.
    pub seed: u64,
    /// What broke.
    pub violations: Vec<Violation>,
    /// From each change to convergence on it.
    pub convergence: Vec<Duration>,
    /// Agent API requests per input change.
    pub requests_per_change: f64,
    /// What a replay of the seed must reproduce ([`World::digest`]).
    pub digest: u64,
}

/// Runs one seed of `scenario`.
pub fn run_seed(scenario: &Scenario, seed: u64, variant: &Variant) -> Result<SeedRun, WorldError> {
    let mut world = World::new(WorldConfig {
        seed,
        nodes: scenario.nodes.iter().map(|n| (*n).to_owned()).collect(),
        plan_fault: variant.plan_fault.clone(),
        wire_fault: variant.wire_fault.clone(),
        dual_stack: scenario.dual_stack,
    })?;
    // Agents start, list and settle on the empty cluster.
    world.run_for(Duration::from_secs(1))?;
    (scenario.script)(&mut world)?;
    world.api.faults().clear();
    world.pause_api(false);
    for node in world.nodes.keys().cloned().collect::<Vec<_>>() {
        world.partition(&node, false);
        world.restart(&node);
    }
    world.changed();
    quiesce(&mut world, Duration::from_secs(60))?;
    let changes = world.changes.max(1);
    Ok(SeedRun {
        seed,
        violations: world.violations.found.clone(),
        convergence: world.convergence.clone(),
        requests_per_change: world.agent_requests() as f64 / changes as f64,
        digest: world.digest(),
    })
}

/// The seeds to run: `KUPORT_SIM_SEED` alone when set (a replay), else `count` seeds from
/// `first` (`KUPORT_SIM_SEEDS` overrides the count, for the long sweep).
pub fn seeds(first: u64, count: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("KUPORT_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let count = std::env::var("KUPORT_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(count);
    (first..first + count).collect()
}

/// What a scenario's seeds came to.
#[derive(Debug)]
pub struct Summary {
    /// Seeds run.
    pub seeds: usize,
    /// The failing seeds with what broke.
    pub failures: Vec<(u64, Vec<Violation>)>,
    /// The summary line.
    pub line: String,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `scenario` over `seeds` with `variant`, printing the summary line and each failing
/// seed's first violations.
pub fn run(scenario: &Scenario, seeds: &[u64], variant: &Variant) -> Summary {
    let mut failures = Vec::new();
    let mut convergence = Vec::new();
    let mut requests = Vec::new();
    for &seed in seeds {
        match run_seed(scenario, seed, variant) {
            Ok(run) => {
                convergence.extend(run.convergence);
                requests.push(run.requests_per_change);
                if !run.violations.is_empty() {
                    failures.push((seed, run.violations));
                }
            }
            Err(e) => failures.push((
                seed,
                vec![Violation {
                    at: Duration::ZERO,
                    invariant: "harness",
                    detail: e.to_string(),
                }],
            )),
        }
    }
    convergence.sort();
    let mean_requests = requests.iter().sum::<f64>() / requests.len().max(1) as f64;
    let violations: usize = failures.iter().map(|(_, v)| v.len()).sum();
    let line = format!(
        "sim {}: {} seeds, {} violations, convergence p50/p99 {}/{} ms simulated, {:.0} API requests per change",
        scenario.name,
        seeds.len(),
        violations,
        percentile(&convergence, 0.5).as_millis(),
        percentile(&convergence, 0.99).as_millis(),
        mean_requests,
    );
    println!("{line}");
    for (seed, found) in &failures {
        println!("  seed {seed} (replay: KUPORT_SIM_SEED={seed}):");
        for v in found.iter().take(5) {
            println!("    at {:?}: {}: {}", v.at, v.invariant, v.detail);
        }
    }
    Summary {
        seeds: seeds.len(),
        failures,
        line,
    }
}

// ---- the objects scenarios create ----

/// A class accepting on `nodes` (interface `eth0`), Single or Multi; `index` keeps classes'
/// return-link settings (VNI, port, subnet) apart.
pub fn class(name: &str, index: u8, nodes: &[&str], multi: bool) -> Value {
    let nodes: Vec<(&str, &[&str])> = nodes.iter().map(|n| (*n, &["eth0"][..])).collect();
    let spec = json!({
        "nodes": nodes_json(&nodes),
        "servingMode": if multi { "Multi" } else { "Single" },
        "returnPath": vxlan_return_path(
            5000 + 1000 * u32::from(index),
            4790 + u16::from(index),
            &format!("169.254.{}.0/24", 77 + index),
        ),
    });
    objects::class(name, spec).object()
}

/// A UDP PortMap `games/<name>` of `class` on `port`, aimed at Service `<service>` port `game`.
pub fn portmap(name: &str, class: &str, port: u16, service: &str) -> Value {
    objects::pm("games", name, class, i32::from(port))
        .service(service, "game")
        .object()
}

/// The IPv4 EndpointSlice of Service `<service>` with its one pod on `node` (none when
/// `None`), ready or not.
pub fn slice(service: &str, node: Option<&str>, ready: bool) -> Value {
    slice_in(Family::V4, service, node, ready)
}

/// The name of Service `<service>`'s EndpointSlice of `family`.
fn slice_name(family: Family, service: &str) -> String {
    match family {
        Family::V4 => format!("{service}-x"),
        Family::V6 => format!("{service}-x6"),
    }
}

/// The EndpointSlice of `family` of Service `<service>` with its one pod on `node` (none when
/// `None`), ready or not: the same pod in either family.
pub fn slice_in(family: Family, service: &str, node: Option<&str>, ready: bool) -> Value {
    let mut slice =
        objects::slice("games", &slice_name(family, service), service).port("game", "UDP", 3000);
    if family == Family::V6 {
        slice = slice.ipv6();
    }
    if let Some(n) = node {
        // The pod's address is in the node's pod CIDR (`World::create_node` numbers it).
        let pod = endpoint(&pod_address(n, family).to_string(), n)
            .ready(ready)
            .pod("games", &format!("{service}-0"));
        slice = slice.endpoint(pod);
    }
    slice.object()
}

const SLICES: (&str, &str) = ("discovery.k8s.io/v1", "EndpointSlice");
const PODS: (&str, &str) = ("v1", "Pod");

impl World {
    /// Lists Service `<service>`'s pod in the families of `stack` from its next
    /// [`World::place_pod`] on (IPv4 alone until this is called).
    pub fn set_stack(&mut self, service: &str, stack: Stack) {
        self.pods.entry(service.to_owned()).or_default().stack = stack;
    }

    /// Puts Service `<service>`'s pod on `node` (or nowhere), ready or not, in every family of
    /// its stack: creates each slice or replaces its endpoints, and deletes the slice of a
    /// family the stack no longer has. A dual-stack Service's two slices change one after the
    /// other, in an order the seed picks, as the EndpointSlice controller writes them.
    pub fn place_pod(
        &mut self,
        service: &str,
        node: Option<&str>,
        ready: bool,
    ) -> Result<(), WorldError> {
        let mut placement = self.pods.get(service).cloned().unwrap_or_default();
        for family in placement.listed.clone() {
            if !placement.stack.families().contains(&family) {
                self.delete(SLICES, Some("games"), &slice_name(family, service))?;
                placement.listed.retain(|f| *f != family);
            }
        }
        self.place_pod_object(service, placement.node.as_deref(), node)?;
        let mut families = placement.stack.families().to_vec();
        if families.len() > 1 && self.rng.below(2) == 0 {
            families.reverse();
        }
        for family in families {
            self.write_slice(family, service, node, ready)?;
            if !placement.listed.contains(&family) {
                placement.listed.push(family);
            }
        }
        placement.node = node.map(str::to_owned);
        placement.ready = ready;
        self.pods.insert(service.to_owned(), placement);
        self.changed();
        Ok(())
    }

    /// Service `<service>`'s Pod object `games/<service>-0`, bound to `node` and running at its
    /// address of either family there, as the scheduler and the kubelet would have it (an agent
    /// delivers only to its own node's Pods), written before the slices list it. A move
    /// recreates it (a Pod's node cannot change); nowhere deletes it.
    fn place_pod_object(
        &mut self,
        service: &str,
        was: Option<&str>,
        node: Option<&str>,
    ) -> Result<(), WorldError> {
        if was == node {
            return Ok(());
        }
        let name = format!("{service}-0");
        if was.is_some() {
            self.delete(PODS, Some("games"), &name)?;
        }
        let Some(node) = node else {
            return Ok(());
        };
        let ips: Vec<String> = [Family::V4, Family::V6]
            .iter()
            .map(|f| pod_address(node, *f).to_string())
            .collect();
        let mut pod = objects::bound_pod(
            &name,
            service,
            node,
            json!({"name": "game", "image": "game"}),
        );
        pod["metadata"]["namespace"] = json!("games");
        pod["status"] = json!({"phase": "Running", "podIP": ips[0],
            "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()});
        self.create(&pod)
    }

    /// Creates the slice of `family` of Service `<service>` or replaces its endpoints.
    fn write_slice(
        &mut self,
        family: Family,
        service: &str,
        node: Option<&str>,
        ready: bool,
    ) -> Result<(), WorldError> {
        let name = slice_name(family, service);
        let want = slice_in(family, service, node, ready);
        let exists = self
            .object("discovery.k8s.io/v1", "endpointslices", "games", &name)
            .is_some();
        if exists {
            let endpoints = want["endpoints"].clone();
            self.edit(SLICES, Some("games"), &name, move |o| {
                o["endpoints"] = endpoints.clone()
            })?;
        } else {
            self.create(&want)?;
        }
        Ok(())
    }

    /// Picks one of `items` with the scenario's generator.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.rng.below(items.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The objects as the scenarios wrote them by hand before they came from testkit: a
    // scenario's results and digests depend on every byte the model stores.

    #[test]
    fn a_class_is_the_object_the_scenarios_always_created() {
        for (index, multi) in [(0, false), (1, true)] {
            let expected = json!({
                "apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMapClass",
                "metadata": {"name": "public"},
                "spec": {"nodes": {"n1": {"interfaces": ["eth0"]}, "n2": {"interfaces": ["eth0"]}},
                         "servingMode": if multi { "Multi" } else { "Single" },
                         "returnPath": {"mode": "Vxlan", "vxlan": {
                             "vni": 5000 + 1000 * i32::from(index),
                             "port": 4790 + i32::from(index),
                             "subnet": format!("169.254.{}.0/24", 77 + index)}}},
            });
            assert_eq!(class("public", index, &["n1", "n2"], multi), expected);
        }
    }

    #[test]
    fn a_portmap_is_the_object_the_scenarios_always_created() {
        let expected = json!({
            "apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMap",
            "metadata": {"name": "alpha-vip", "namespace": "games"},
            "spec": {"className": "vip", "protocol": "UDP", "port": 4000,
                     "serviceRef": {"name": "alpha", "port": "game"}},
        });
        assert_eq!(portmap("alpha-vip", "vip", 4000, "alpha"), expected);
    }

    #[test]
    fn a_slice_is_the_object_the_scenarios_always_created() {
        let with_pod = |endpoints: Value| {
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "alpha-x", "namespace": "games",
                             "labels": {"kubernetes.io/service-name": "alpha"}},
                "addressType": "IPv4",
                "ports": [{"name": "game", "protocol": "UDP", "port": 3000}],
                "endpoints": endpoints,
            })
        };
        let on_n2 = json!([{"addresses": ["10.244.2.5"], "conditions": {"ready": false},
            "nodeName": "n2",
            "targetRef": {"kind": "Pod", "name": "alpha-0", "namespace": "games"}}]);
        assert_eq!(slice("alpha", Some("n2"), false), with_pod(on_n2));
        assert_eq!(slice("alpha", None, true), with_pod(json!([])));
    }

    #[test]
    fn an_ipv6_slice_lists_the_same_pod_in_the_nodes_ipv6_pod_cidr() {
        let six = slice_in(Family::V6, "alpha", Some("n2"), true);
        assert_eq!(six["metadata"]["name"], "alpha-x6");
        assert_eq!(six["addressType"], "IPv6");
        assert_eq!(
            six["endpoints"][0]["addresses"],
            json!(["fd00:10:244:2::5"])
        );
        assert_eq!(six["endpoints"][0]["targetRef"]["name"], "alpha-0");
        assert_eq!(six["endpoints"][0]["nodeName"], "n2");
        assert_eq!(six["ports"], slice("alpha", Some("n2"), true)["ports"]);
    }
}
