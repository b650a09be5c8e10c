//! What the harness does to the cluster, through the model's own HTTP service: creating the
//! generated objects, moving pods, flapping nodes, and the kubelets' Node and Lease updates.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    PostParams, TypeMeta,
};
use kuport::agent::Clock;
use kuport_sim::apiserver::SplitMix64;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::ScaleError;
use super::generator::{Cluster, pod_object, portmap_place, slice_object};
use super::kubelet::{LEASE_RENEW, NODE_STATUS_REPORT, node_status_patch};
use crate::sync::lock;

/// Creates any object given as JSON (its apiVersion and kind decide the API).
pub async fn create(client: &kube::Client, object: &Value) -> Result<(), ScaleError> {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let kind = object["kind"].as_str().unwrap_or_default();
    let gvk = GroupVersionKind::try_from(&TypeMeta {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
    })?;
    let ar = ApiResource::from_gvk(&gvk);
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let obj: DynamicObject = serde_json::from_value(object.clone())?;
    api.create(&PostParams::default(), &obj)
        .await
        .map_err(|e| format!("creating {kind} {}: {e}", object["metadata"]["name"]))?;
    Ok(())
}

/// Moves PortMap `j`'s pod to `to` as the scheduler and the EndpointSlice controller would:
/// the Pod deleted and created on its new node, then the slice listing it there.
pub async fn move_pod(
    client: &kube::Client,
    cluster: &mut Cluster,
    j: usize,
    to: &str,
) -> Result<(), ScaleError> {
    let (_, _, ns, _) = portmap_place(j);
    let service = format!("svc-{j:06}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete(&format!("{service}-0"), &DeleteParams::default())
        .await?;
    let ip = cluster.next_pod_ip(to);
    create(client, &pod_object(&ns, &service, to, ip)).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    let slice: EndpointSlice = serde_json::from_value(slice_object(&ns, &service, to, ip))?;
    slices
        .replace(&format!("{service}-x"), &PostParams::default(), &slice)
        .await?;
    if let Some(p) = cluster.placement.get_mut(j) {
        *p = to.to_owned();
    }
    Ok(())
}

/// Sets Node `node`'s Ready condition as its kubelet reports it (every heartbeat moved to now).
pub async fn report_node(
    client: &kube::Client,
    clock: &Clock,
    node: &str,
    ready: bool,
) -> Result<(), ScaleError> {
    let beat = clock.now().to_string();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(node_status_patch(&beat, ready)),
        )
        .await?;
    Ok(())
}

async fn renew_lease(client: &kube::Client, clock: &Clock, node: &str) -> Result<(), ScaleError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew = clock.now().to_string();
    leases
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"renewTime": renew}})),
        )
        .await?;
    Ok(())
}

/// What a kubelet does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Beat {
    Lease,
    Status,
}

/// Runs every node's kubelet heartbeats until dropped: each Lease renewed every
/// [`LEASE_RENEW`], each Node's status reported every [`NODE_STATUS_REPORT`], from seeded
/// offsets; a node in `down` reports itself not Ready. A failed update is skipped, as a kubelet
/// retries at its next beat.
pub async fn kubelets(
    client: kube::Client,
    clock: Clock,
    nodes: Vec<String>,
    down: Arc<Mutex<BTreeSet<String>>>,
    seed: u64,
) {
    let mut rng = SplitMix64::new(seed ^ 0xB0B0_CAFE);
    let start = Instant::now();
    let mut due: BinaryHeap<Reverse<(Duration, Beat, usize)>> = BinaryHeap::new();
    for i in 0..nodes.len() {
        let lease = Duration::from_millis(rng.below(LEASE_RENEW.as_millis() as usize) as u64);
        let status =
            Duration::from_millis(rng.below(NODE_STATUS_REPORT.as_millis() as usize) as u64);
        due.push(Reverse((lease, Beat::Lease, i)));
        due.push(Reverse((status, Beat::Status, i)));
    }
    while let Some(Reverse((at, beat, i))) = due.pop() {
        tokio::time::sleep_until(start + at).await;
        let node = &nodes[i];
        let (result, every) = match beat {
            Beat::Lease => (renew_lease(&client, &clock, node).await, LEASE_RENEW),
            Beat::Status => {
                let ready = !lock(&down).contains(node);
                let result = report_node(&client, &clock, node, ready).await;
                (result, NODE_STATUS_REPORT)
            }
        };
        if let Err(e) = result {
            eprintln!("scale: kubelet of {node}: {e}");
        }
        due.push(Reverse((at + every, beat, i)));
    }
}
