//! About 100 MB of EndpointSlices for one Service (`bulk` in `ns-0`), shaped as the
//! EndpointSlice controller writes them for a large Deployment: 1,000 endpoints per slice, each
//! with its address, conditions, hostname, node, zone, topology hints and the Pod it stands for.
//! What the memory bench adds to its cluster to show what slices cost an agent: nothing when no
//! PortMap refers to the Service, their endpoints when one does.

use anyhow::{Context as _, Result};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kuport_core::snapshot::SERVICE_NAME_LABEL;
use serde_json::{Value, json};

/// The Service the slices list.
pub const SERVICE: &str = "bulk";
/// Its namespace (one the class selects, so a PortMap there is admitted).
pub const NAMESPACE: &str = "ns-0";
/// The named port the slices list, and its number on the pods.
pub const PORT_NAME: &str = "game";
pub const POD_PORT: i32 = 9000;
/// Endpoints per slice: the most the API server takes.
const ENDPOINTS: usize = 1_000;
/// The JSON the slices add up to, about.
pub const TOTAL_BYTES: usize = 100 * 1_000_000;

/// Slice `k`: endpoints on the 500 nodes in turn, at pod addresses of the class's pod network.
pub fn slice(k: usize, nodes: usize) -> Result<EndpointSlice> {
    let endpoints: Vec<Value> = (0..ENDPOINTS).map(|i| endpoint(k, i, nodes)).collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{SERVICE}-{k:04}"), "namespace": NAMESPACE,
            "labels": {SERVICE_NAME_LABEL: SERVICE,
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
        },
        "addressType": "IPv4",
        "ports": [{"name": PORT_NAME, "protocol": "UDP", "port": POD_PORT}],
        "endpoints": endpoints,
    }))
    .with_context(|| format!("building EndpointSlice {SERVICE}-{k:04}"))
}

fn endpoint(k: usize, i: usize, nodes: usize) -> Value {
    let n = k * ENDPOINTS + i;
    let pod = format!("{SERVICE}-7d9f8b6c5d-{n:06}");
    json!({
        "addresses": [format!("10.100.{}.{}", 100 + (n / 250) % 150, 1 + n % 250)],
        "conditions": {"ready": true, "serving": true, "terminating": false},
        "hostname": pod,
        "nodeName": format!("node-{:03}", n % nodes),
        "zone": format!("zone-{}", n % 3),
        "hints": {"forZones": [{"name": format!("zone-{}", n % 3)}]},
        "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": pod,
                      "uid": format!("6f1c2b4e-8a7d-4c3b-9e21-{n:012}")},
    })
}

/// How many slices make [`TOTAL_BYTES`].
pub fn count(nodes: usize) -> Result<usize> {
    let one = serde_json::to_vec(&slice(0, nodes)?).context("measuring a slice")?;
    Ok(TOTAL_BYTES.div_ceil(one.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_full_and_add_up_to_about_100_mb() {
        let s = slice(3, 500).unwrap();
        assert_eq!(s.endpoints.as_ref().map(Vec::len), Some(1_000));
        let n = count(500).unwrap();
        let bytes = n * serde_json::to_vec(&s).unwrap().len();
        assert!(
            (99_000_000..102_000_000).contains(&bytes),
            "{n} slices, {bytes} bytes"
        );
        let addresses: std::collections::BTreeSet<_> = s
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.addresses[0].clone())
            .collect();
        assert_eq!(addresses.len(), 1_000, "distinct addresses");
    }
}
