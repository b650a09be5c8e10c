//! Nodes and Leases as kubelets keep them, at the kubelet's default rates: the Lease in
//! `kube-node-lease` renewed every 10 s (`nodeLeaseDurationSeconds` 40 × 0.25), and the Node's
//! status (its conditions' heartbeats) reported every 5 minutes while nothing changes
//! (`nodeStatusReportFrequency`; `nodeStatusUpdateFrequency` 10 s only decides how often the
//! kubelet computes it). Each node starts at a seeded offset, so the updates spread over the
//! period as a real cluster's do.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// The address `n` after `first`.
pub(super) fn nth(first: Ipv4Addr, n: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(first).wrapping_add(u32::try_from(n).unwrap_or(u32::MAX)))
}

/// Node `index`'s InternalIP (172.16.0.0/12, from .1).
pub fn internal_ip(index: usize) -> Ipv4Addr {
    nth(Ipv4Addr::new(172, 16, 0, 1), index)
}

/// Node `index`'s pod CIDR: a /22 of 10.64.0.0/10.
pub fn pod_cidr(index: usize) -> String {
    format!("{}/22", nth(Ipv4Addr::new(10, 64, 0, 0), index * 1024))
}

/// How often a kubelet renews its node's Lease.
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
/// How often a kubelet reports an unchanged node status.
pub const NODE_STATUS_REPORT: Duration = Duration::from_secs(300);

/// The images a node of a busy cluster lists (the kubelet reports up to 50).
const IMAGES: usize = 20;

/// A timestamp `at` seconds after the harness's epoch, as the API server writes them.
pub fn stamp(epoch: Timestamp, at: i64) -> String {
    Timestamp::from_second(epoch.as_second() + at)
        .unwrap_or(epoch)
        .to_string()
}

fn conditions(beat: &str) -> Value {
    let pressure = |kind: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": "False", "reason": reason, "message": message,
               "lastHeartbeatTime": beat, "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    json!([
        pressure("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        pressure("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        pressure("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "message": "kubelet is posting ready status",
         "lastHeartbeatTime": beat, "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ])
}

/// Node `name` (number `index`) as a kubelet registers and reports it, with its conditions'
/// heartbeat at `beat`: labels, annotations, addresses, capacity, node info and a list of
/// images, about 5 KiB of JSON, as nodes of real clusters are.
pub fn node_object_at(name: &str, index: usize, beat: &str) -> Value {
    let images: Vec<Value> = (0..IMAGES)
        .map(|i| {
            json!({"names": [
                format!("registry.example/team-{i}/service@sha256:{:064x}", i * 7919 + 13),
                format!("registry.example/team-{i}/service:v1.{i}.0"),
            ], "sizeBytes": 20_000_000 + i * 1_000_003})
        })
        .collect();
    let cidr = pod_cidr(index);
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m6.large",
            "topology.kubernetes.io/region": "eu-1", "topology.kubernetes.io/zone": format!("eu-1{}", ["a", "b", "c"][index % 3]),
        }, "annotations": {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
        }},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": internal_ip(index).to_string()},
                          {"type": "Hostname", "address": name}],
            "conditions": conditions(beat),
            "capacity": {"cpu": "4", "memory": "16318412Ki", "pods": "110",
                         "ephemeral-storage": "101430960Ki", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "4", "memory": "16216012Ki", "pods": "110",
                            "ephemeral-storage": "93478772582", "hugepages-2Mi": "0"},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": "amd64", "bootID": format!("{index:08x}-boot"),
                         "containerRuntimeVersion": "containerd://1.7.20",
                         "kernelVersion": "6.8.0-45-generic", "kubeProxyVersion": "",
                         "kubeletVersion": "v1.37.2", "machineID": format!("{index:032x}"),
                         "operatingSystem": "linux", "osImage": "Ubuntu 24.04.1 LTS",
                         "systemUUID": format!("{index:08x}-0000-0000-0000-000000000000")},
            "images": images,
        },
    })
}

/// The status patch a kubelet sends when it reports: every condition's heartbeat moved to
/// `beat`, Ready as `ready` says.
pub fn node_status_patch(beat: &str, ready: bool) -> Value {
    let mut conditions = conditions(beat);
    if let Some(list) = conditions.as_array_mut()
        && let Some(last) = list.last_mut()
    {
        last["status"] = json!(if ready { "True" } else { "False" });
        if !ready {
            last["reason"] = json!("KubeletNotReady");
            last["message"] = json!("container runtime network not ready");
        }
    }
    json!({"status": {"conditions": conditions}})
}

/// Node `name`'s Lease, renewed at `renew`.
pub fn lease_object_at(name: &str, renew: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": renew},
    })
}
