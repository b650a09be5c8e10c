//! The measuring phases: idle, pod moves one at a time, new PortMaps, churn, the plan's time.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kuport_core::api::{PortMap, PortMapClass, PortMapNode};
use kuport_core::plan::{Detail, plan_with};
use kuport_core::snapshot::{CniFacts, Snapshot};
use tokio::time::Instant;

use super::super::agents::{self, facts};
use super::super::driver;
use super::super::generator::{portmap_place, workload};
use super::super::report::{Churn, IdleRequests, Latency, PodMoves, WatchBytes, quantile};
use super::super::wire::Counts;
use super::Run;
use crate::scale::ScaleError;

/// The API group of kuport's own objects.
const KUPORT_GROUP: &str = "kuport.wlz.li/";

/// Watch bytes per second per agent over `seconds`, from each agent's counts in the window.
fn watch_rates(each: &[Counts], seconds: f64) -> WatchBytes {
    let agents = each.len().max(1) as f64;
    let mut by_resource: BTreeMap<String, f64> = BTreeMap::new();
    for c in each {
        for (resource, bytes) in &c.watch_bytes {
            *by_resource.entry(resource.clone()).or_default() += *bytes as f64 / seconds / agents;
        }
    }
    let mut out = WatchBytes::default();
    for (resource, rate) in &by_resource {
        if resource.starts_with(KUPORT_GROUP) {
            out.kuport += rate;
        } else if resource == "nodes" || resource == "coordination.k8s.io/leases" {
            out.kubernetes_heartbeats += rate;
        } else {
            out.other_kubernetes += rate;
        }
    }
    out.by_resource = by_resource;
    out
}

fn windows(before: &[Counts], after: &[Counts]) -> Vec<Counts> {
    after.iter().zip(before).map(|(a, b)| a.since(b)).collect()
}

/// The idle window: nothing changes but the kubelets' heartbeats.
pub(in crate::scale) async fn idle(run: &mut Run<'_>) -> Result<(), ScaleError> {
    let window = run.config.idle;
    let before = agents::each(&run.agents);
    let kubelets_before = run.kubelets.counts();
    let beats_before = beats(run);
    tokio::time::sleep(window).await;
    let each = windows(&before, &agents::each(&run.agents));
    let seconds = window.as_secs_f64();
    let rate = |accepting: bool| {
        let picked: Vec<&Counts> = run
            .agents
            .iter()
            .zip(&each)
            .filter(|(a, _)| a.accepting == accepting)
            .map(|(_, c)| c)
            .collect();
        let requests: u64 = picked.iter().map(|c| c.requests).sum();
        (requests as f64 / seconds, picked.len())
    };
    let ((accepting, a_count), (pod_only, p_count)) = (rate(true), rate(false));
    let per_pod = pod_only / p_count.max(1) as f64;
    let others = run.cluster.nodes.len() - a_count;
    run.report.idle_requests_per_second = IdleRequests {
        measured: accepting + pod_only,
        per_accepting_agent: accepting / a_count.max(1) as f64,
        per_pod_only_agent: per_pod,
        modeled_all_agents: accepting + per_pod * others as f64,
        window_seconds: seconds,
    };
    run.report.conflicts.idle = each.iter().map(|c| c.conflicts).sum();
    let mut watch = watch_rates(&each, seconds);
    let scale = |bytes: f64, by: f64| if by > 0.0 { bytes / by } else { 0.0 };
    let largest = &run.report.largest_object_bytes;
    watch.kuport_modeled_all_agents = watch.kuport
        * scale(
            run.report.idle_requests_per_second.modeled_all_agents,
            accepting + pod_only,
        )
        * scale(largest.extrapolated_bytes, largest.bytes as f64);
    run.report.idle_watch_bytes_per_second_per_agent = watch;
    let kubelet = run.kubelets.counts().since(&kubelets_before);
    let (leases, statuses) = beats(run);
    run.report.kubelet.lease_renewals_per_second = (leases - beats_before.0) as f64 / seconds;
    run.report.kubelet.node_status_updates_per_second =
        (statuses - beats_before.1) as f64 / seconds;
    eprintln!(
        "scale: idle {seconds} s: {:.3} agent requests/s, kubelets {} requests",
        accepting + pod_only,
        kubelet.requests
    );
    Ok(())
}

/// Lease renewals and Node status reports the kubelets sent so far.
fn beats(run: &Run<'_>) -> (u64, u64) {
    let writes = crate::sync::lock(&run.kubelets.writes_by_resource).clone();
    (
        writes
            .get("coordination.k8s.io/leases")
            .copied()
            .unwrap_or(0),
        writes.get("nodes").copied().unwrap_or(0),
    )
}

/// A PortMap and another pod node to move its pod to.
fn pick_move(run: &mut Run<'_>) -> Option<(usize, String)> {
    let homes = run.cluster.pod_nodes.clone();
    let count = run.cluster.placement.len();
    if homes.len() < 2 || count == 0 {
        return None;
    }
    let j = run.rng.below(count);
    let from = run.cluster.placement[j].clone();
    let others: Vec<&String> = homes.iter().filter(|n| **n != from).collect();
    let to = others[run.rng.below(others.len())].clone();
    Some((j, to))
}

/// Pod moves one at a time, each until the agents settled, away from the agents' resync
/// passes: the requests every agent made for it and the agents that wrote anything.
pub(in crate::scale) async fn moves(run: &mut Run<'_>) -> Result<(), ScaleError> {
    let mut out = PodMoves::default();
    let conflicts_before = agents::total(&run.agents).conflicts;
    for _ in 0..run.config.moves {
        let Some((j, to)) = pick_move(run) else { break };
        agents::clear_of_resyncs(&run.agents, Duration::from_secs(20)).await;
        let before = agents::each(&run.agents);
        driver::move_pod(&run.driver, run.cluster, j, &to).await?;
        run.settle("pod move").await?;
        let each = windows(&before, &agents::each(&run.agents));
        out.requests.push(each.iter().map(|c| c.requests).sum());
        out.writing_nodes
            .push(each.iter().filter(|c| c.writes > 0).count() as u64);
        let mut written: BTreeMap<String, u64> = BTreeMap::new();
        for c in &each {
            for (resource, n) in &c.writes_by_resource {
                *written.entry(resource.clone()).or_default() += n;
            }
        }
        out.writes_by_resource.push(written);
    }
    let (requests, writers): (u64, u64) =
        (out.requests.iter().sum(), out.writing_nodes.iter().sum());
    out.mean = requests as f64 / out.requests.len().max(1) as f64;
    let as_f64: Vec<f64> = out.requests.iter().map(|r| *r as f64).collect();
    out.median = quantile(&as_f64, 0.5);
    out.per_writing_node = requests as f64 / writers.max(1) as f64;
    eprintln!(
        "scale: pod moves: requests {:?}, writing nodes {:?}",
        out.requests, out.writing_nodes
    );
    run.report.requests_per_pod_move = out;
    run.report.conflicts.moves = agents::total(&run.agents).conflicts - conflicts_before;
    Ok(())
}

/// Whether PortMap `ns/name` has `Programmed=True` stored.
fn programmed(run: &Run<'_>, ns: &str, name: &str) -> bool {
    run.api
        .object("kuport.wlz.li/v1alpha1", "portmaps", ns, name)
        .and_then(|o| o["status"]["conditions"].as_array().cloned())
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Programmed" && c["status"] == "True")
}

/// New PortMaps one at a time, each for a Service whose pod and slice are already there: from
/// the PortMap's creation to `Programmed=True` stored, polled every 10 ms.
pub(in crate::scale) async fn new_portmaps(run: &mut Run<'_>) -> Result<(), ScaleError> {
    let limit = Duration::from_secs(60);
    let (mut samples, mut missed) = (Vec::new(), 0);
    for _ in 0..run.config.new_portmaps {
        let j = run.cluster.placement.len();
        let homes = run.cluster.pod_nodes.clone();
        let Some(home) = homes.get(run.rng.below(homes.len().max(1))).cloned() else {
            break;
        };
        let ip = run.cluster.next_pod_ip(&home);
        let mut objects = workload(j, &home, ip, &run.cluster.classes);
        let portmap = objects.pop().ok_or("a workload without its PortMap")?;
        for o in &objects {
            driver::create(&run.driver, o).await?;
        }
        run.cluster.placement.push(home);
        run.settle("new workload").await?;
        agents::clear_of_resyncs(&run.agents, Duration::from_secs(20)).await;
        driver::create(&run.driver, &portmap).await?;
        let (_, _, ns, name) = portmap_place(j);
        let start = Instant::now();
        while !programmed(run, &ns, &name) && start.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if programmed(run, &ns, &name) {
            samples.push(start.elapsed().as_secs_f64() * 1000.0);
        } else {
            missed += 1;
        }
        run.settle("new PortMap").await?;
    }
    let latency = Latency {
        samples: samples.len(),
        p50_ms: quantile(&samples, 0.5),
        p99_ms: quantile(&samples, 0.99),
        max_ms: quantile(&samples, 1.0),
        not_programmed: missed,
    };
    eprintln!("scale: new PortMap to Programmed: {latency:?}");
    run.report.portmap_to_programmed_p99_ms = latency.p99_ms;
    run.report.portmap_to_programmed = latency;
    Ok(())
}

/// How long a flapped node stays not Ready.
const FLAP_DOWN: Duration = Duration::from_secs(20);

/// Flaps a node no class accepts on: not Ready now, Ready again after [`FLAP_DOWN`].
async fn flap(
    run: &mut Run<'_>,
    recoveries: &mut VecDeque<(Instant, String)>,
) -> Result<(), ScaleError> {
    let candidates: Vec<String> = run
        .cluster
        .nodes
        .iter()
        .filter(|n| !run.cluster.accepting.contains(n))
        .filter(|n| !crate::sync::lock(&run.down).contains(*n))
        .cloned()
        .collect();
    let Some(node) = candidates
        .get(run.rng.below(candidates.len().max(1)))
        .cloned()
    else {
        return Ok(());
    };
    crate::sync::lock(&run.down).insert(node.clone());
    driver::report_node(&run.driver, &run.time.clock(), &node, false).await?;
    recoveries.push_back((Instant::now() + FLAP_DOWN, node));
    Ok(())
}

async fn recover(run: &mut Run<'_>, node: &str) -> Result<(), ScaleError> {
    crate::sync::lock(&run.down).remove(node);
    driver::report_node(&run.driver, &run.time.clock(), node, true).await
}

/// The churn window: pod moves at `--churn` per second and node flaps at `--flaps` per minute
/// for `--duration`, then every flapped node Ready again and the agents settled.
pub(in crate::scale) async fn churn(run: &mut Run<'_>) -> Result<(), ScaleError> {
    let config = run.config;
    let every = |rate: f64| (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
    let (move_every, flap_every) = (every(config.churn), every(config.flaps_per_minute / 60.0));
    let start = Instant::now();
    let end = start + config.duration;
    // The first flap 5 s in, so that a short window has one.
    let (mut next_move, mut next_flap) = (start, start + Duration::from_secs(5));
    let mut recoveries: VecDeque<(Instant, String)> = VecDeque::new();
    let before = agents::each(&run.agents);
    let mut churn = Churn::default();
    loop {
        let recovery = recoveries.front().map(|(at, _)| *at);
        let next = [
            Some(next_move).filter(|_| move_every.is_some()),
            Some(next_flap).filter(|_| flap_every.is_some()),
            recovery,
        ]
        .into_iter()
        .flatten()
        .filter(|at| *at < end || Some(*at) == recovery)
        .min();
        let Some(at) = next else { break };
        tokio::time::sleep_until(at).await;
        if Some(at) == recovery {
            if let Some((_, node)) = recoveries.pop_front() {
                recover(run, &node).await?;
            }
        } else if at == next_move
            && let Some(step) = move_every
        {
            if let Some((j, to)) = pick_move(run) {
                driver::move_pod(&run.driver, run.cluster, j, &to).await?;
                churn.pod_moves += 1;
            }
            next_move += step;
        } else if let Some(step) = flap_every {
            flap(run, &mut recoveries).await?;
            churn.node_flaps += 1;
            next_flap += step;
        }
    }
    let each = windows(&before, &agents::each(&run.agents));
    let seconds = config
        .duration
        .as_secs_f64()
        .max(start.elapsed().as_secs_f64());
    let total: u64 = each.iter().map(|c| c.requests).sum();
    let watch: u64 = each.iter().flat_map(|c| c.watch_bytes.values()).sum();
    churn.seconds = seconds;
    churn.requests_per_second = total as f64 / seconds;
    churn.watch_bytes_per_second_per_agent = watch as f64 / seconds / each.len().max(1) as f64;
    run.report.conflicts.churn = each.iter().map(|c| c.conflicts).sum();
    eprintln!("scale: churn: {churn:?}");
    run.report.churn = churn;
    run.settle("after churn").await
}

/// Lists every object the plan reads, the Pods of `node` alone (as its agent watches them).
async fn snapshot(client: &kube::Client, node: &str) -> Result<Snapshot, ScaleError> {
    async fn all<K>(client: &kube::Client, params: &ListParams) -> Result<Vec<K>, ScaleError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        Ok(Api::<K>::all(client.clone()).list(params).await?.items)
    }
    let every = ListParams::default();
    let own = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let cni = Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get_opt("cilium-config")
        .await?;
    Ok(Snapshot {
        classes: all::<PortMapClass>(client, &every).await?,
        portmap_nodes: all::<PortMapNode>(client, &every).await?,
        portmaps: all::<PortMap>(client, &every).await?,
        endpoint_slices: all::<EndpointSlice>(client, &every).await?,
        nodes: all::<Node>(client, &every).await?,
        namespaces: all::<Namespace>(client, &every).await?,
        services: all::<Service>(client, &every).await?,
        services_listed: true,
        pods: all::<Pod>(client, &own).await?,
        pods_listed: true,
        cni: cni.as_ref().map(CniFacts::from_cilium_config),
    })
}

/// The median wall time of 5 plan passes of `node` over the objects now.
async fn time_plan(run: &Run<'_>, node: &str) -> Result<f64, ScaleError> {
    let snapshot = snapshot(&run.driver, node).await?;
    let facts = facts(run.cluster.index(node), run.cluster.classes.len());
    let now = run.time.now();
    let mut times = Vec::new();
    for _ in 0..5 {
        let wall = std::time::Instant::now();
        let plan = plan_with(&snapshot, node, &facts, now, Detail::Written);
        times.push(wall.elapsed().as_secs_f64() * 1000.0);
        drop(plan);
    }
    Ok(quantile(&times, 0.5))
}

/// The plan's time on the first accepting node and the first pod-only node.
pub(in crate::scale) async fn plan_pass(run: &mut Run<'_>) -> Result<(), ScaleError> {
    if let Some(node) = run.cluster.accepting.first().cloned() {
        run.report.plan_pass_ms.accepting = time_plan(run, &node).await?;
    }
    if let Some(node) = run.cluster.pod_nodes.first().cloned() {
        run.report.plan_pass_ms.pod_only = time_plan(run, &node).await?;
    }
    eprintln!("scale: plan pass: {:?}", run.report.plan_pass_ms);
    Ok(())
}
