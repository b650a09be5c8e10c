//! EndpointSlices decoded straight to what a pass reads.
//!
//! A slice lists up to 1,000 endpoints, each with up to 100 addresses, a hostname, a zone, hints
//! and a free-form topology map, and its metadata carries whatever labels, annotations and
//! managed fields its writer left: anyone who may write EndpointSlices in a namespace decides
//! how much. Decoded into `k8s_openapi`'s type and trimmed afterwards (`trim.rs`), all of it is
//! allocated first, a whole list page at a time. The slice watch decodes [`LeanSlice`] instead:
//! only the fields a pass reads are allocated, and the rest is skipped as the JSON is read. What
//! it keeps is exactly what `Trim for EndpointSlice` keeps; a test holds the two to that.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kuport_core::snapshot::SERVICE_NAME_LABEL;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// An EndpointSlice holding only what a pass reads (see the module): what the slice watch
/// lists, watches and fetches.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LeanSlice(pub EndpointSlice);

impl kube::Resource for LeanSlice {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        EndpointSlice::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        EndpointSlice::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        EndpointSlice::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        EndpointSlice::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl<'de> Deserialize<'de> for LeanSlice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Wire::deserialize(d).map(|w| Self(w.into_slice()))
    }
}

/// The slice as read off the wire: every field not named here is skipped unread.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    metadata: WireMeta,
    #[serde(default)]
    address_type: Option<String>,
    #[serde(default)]
    endpoints: Option<Vec<WireEndpoint>>,
    #[serde(default)]
    ports: Option<Vec<WirePort>>,
}

/// The metadata the store and the snapshot key on, and the one label the plan reads.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    /// The value of [`SERVICE_NAME_LABEL`]; the other labels are skipped.
    #[serde(default, deserialize_with = "service_label")]
    labels: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEndpoint {
    /// The first address: the only one the plan reads (Kubernetes says consumers use the first).
    #[serde(default, deserialize_with = "first_address")]
    addresses: Option<String>,
    #[serde(default)]
    conditions: Option<WireConditions>,
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    target_ref: Option<WireRef>,
}

#[derive(Deserialize)]
struct WireConditions {
    #[serde(default)]
    ready: Option<bool>,
}

/// The pod's name: the only part of the target the plan reads.
#[derive(Deserialize)]
struct WireRef {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct WirePort {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    port: Option<i32>,
}

impl Wire {
    fn into_slice(self) -> EndpointSlice {
        let m = self.metadata;
        EndpointSlice {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                generation: m.generation,
                creation_timestamp: m.creation_timestamp,
                deletion_timestamp: m.deletion_timestamp,
                labels: m
                    .labels
                    .map(|service| [(SERVICE_NAME_LABEL.to_owned(), service)].into()),
                ..ObjectMeta::default()
            },
            address_type: self.address_type.unwrap_or_default(),
            endpoints: self
                .endpoints
                .map(|e| e.into_iter().map(WireEndpoint::into_endpoint).collect()),
            ports: self.ports.map(|p| {
                p.into_iter()
                    .map(|p| EndpointPort {
                        name: p.name,
                        protocol: p.protocol,
                        port: p.port,
                        ..EndpointPort::default()
                    })
                    .collect()
            }),
        }
    }
}

impl WireEndpoint {
    fn into_endpoint(self) -> Endpoint {
        Endpoint {
            addresses: self.addresses.into_iter().collect(),
            conditions: self.conditions.map(|c| EndpointConditions {
                ready: c.ready,
                ..EndpointConditions::default()
            }),
            node_name: self.node_name,
            target_ref: self.target_ref.map(|t| ObjectReference {
                name: t.name,
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }
}

/// The value of [`SERVICE_NAME_LABEL`] in a label map (or `null`), skipping every other label.
fn service_label<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Labels;
    impl<'de> Visitor<'de> for Labels {
        type Value = Option<String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of labels")
        }

        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<String>()? {
                if key == SERVICE_NAME_LABEL {
                    found = map.next_value::<Option<String>>()?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    d.deserialize_option(Labels)
}

/// The first string of a list (or `null`), skipping the rest.
fn first_address<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct First;
    impl<'de> Visitor<'de> for First {
        type Value = Option<String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of addresses")
        }

        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first = seq.next_element::<String>()?;
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
    }
    d.deserialize_option(First)
}

#[cfg(test)]
mod tests {
    use kube::core::ObjectList;
    use serde_json::{Value, json};

    use super::*;
    use crate::agent::trim::Trim;

    /// A slice carrying everything a real one can besides what the plan reads: many
    /// addresses, hostnames, zones, hints, topology, every condition, a target's kind,
    /// namespace and uid, an app protocol, labels, annotations, managed fields, owners.
    fn heavy() -> Value {
        let endpoint = |i: usize| {
            json!({
                "addresses": (0..100).map(|k| format!("10.1.{i}.{k}")).collect::<Vec<_>>(),
                "conditions": {"ready": !i.is_multiple_of(3), "serving": true, "terminating": i.is_multiple_of(5)},
                "hostname": format!("host-{i}"),
                "nodeName": format!("node-{}", i % 4),
                "zone": "zone-a",
                "hints": {"forZones": [{"name": "zone-a"}]},
                "deprecatedTopology": {"topology.kubernetes.io/zone": "zone-a", "x": "y".repeat(500)},
                "targetRef": {"kind": "Pod", "namespace": "games", "name": format!("gs-{i}"),
                              "uid": "b1f0a9c2", "resourceVersion": "77"},
            })
        };
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "gs-abc", "namespace": "games", "uid": "0a1b", "resourceVersion": "12",
                "generation": 3, "creationTimestamp": "2026-05-01T00:00:00Z",
                "generateName": "gs-",
                "labels": {"app": "gs", SERVICE_NAME_LABEL: "gs",
                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "x".repeat(10_000)},
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:endpoints": {}}}],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "gs",
                                     "uid": "5c6d", "controller": true}],
            },
            "addressType": "IPv4",
            "endpoints": (0..20).map(endpoint).collect::<Vec<_>>(),
            "ports": [{"name": "game", "protocol": "UDP", "port": 7777, "appProtocol": "kuport.example/game"},
                      {"name": "admin", "port": 8080}],
        })
    }

    fn decoded(v: &Value) -> EndpointSlice {
        serde_json::from_value::<LeanSlice>(v.clone())
            .expect("decodes")
            .0
    }

    fn trimmed(v: &Value) -> EndpointSlice {
        let mut slice: EndpointSlice = serde_json::from_value(v.clone()).expect("a slice");
        slice.trim();
        slice
    }

    #[test]
    fn decoding_keeps_exactly_what_trimming_keeps() {
        let v = heavy();
        let lean = decoded(&v);
        assert_eq!(lean, trimmed(&v));
        assert_eq!(lean.endpoints.as_ref().map(Vec::len), Some(20));
        let first = &lean.endpoints.as_ref().expect("endpoints")[1];
        assert_eq!(first.addresses, ["10.1.1.0"]);
        assert_eq!(first.node_name.as_deref(), Some("node-1"));
        assert_eq!(
            first.target_ref.as_ref().and_then(|t| t.name.as_deref()),
            Some("gs-1")
        );
        let size = |s: &EndpointSlice| serde_json::to_string(s).expect("json").len();
        let full: EndpointSlice = serde_json::from_value(v).expect("a slice");
        assert!(
            size(&lean) * 20 < size(&full),
            "{} bytes kept of {}",
            size(&lean),
            size(&full)
        );
    }

    #[test]
    fn absent_and_null_fields_decode_as_trimming_leaves_them() {
        for v in [
            json!({"metadata": {"name": "a", "namespace": "games"}, "addressType": "IPv6"}),
            json!({"metadata": {"name": "a", "namespace": "games", "labels": null},
                   "addressType": "IPv4", "endpoints": null, "ports": null}),
            json!({"metadata": {"name": "a", "namespace": "games"}, "addressType": "IPv4",
                   "endpoints": [{"addresses": []}, {"addresses": ["10.0.0.1"],
                                  "conditions": {}, "targetRef": {"kind": "Pod"}}],
                   "ports": [{}]}),
        ] {
            assert_eq!(decoded(&v), trimmed(&v), "{v}");
        }
    }

    #[test]
    fn a_list_page_and_a_watch_event_decode() {
        let list: ObjectList<LeanSlice> = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
            "metadata": {"resourceVersion": "40", "continue": "abc"},
            "items": [heavy(), heavy()],
        }))
        .expect("a list");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[0].0, trimmed(&heavy()));
        let event: kube::core::WatchEvent<LeanSlice> =
            serde_json::from_value(json!({"type": "MODIFIED", "object": heavy()}))
                .expect("an event");
        let kube::core::WatchEvent::Modified(slice) = event else {
            panic!("a modification");
        };
        assert_eq!(slice.0, trimmed(&heavy()));
    }

    #[test]
    fn a_malformed_slice_is_an_error_not_a_panic() {
        for v in [
            json!({"metadata": {"labels": ["x"]}}),
            json!({"endpoints": [{"addresses": "10.0.0.1"}]}),
            json!({"endpoints": [{"addresses": [1]}]}),
        ] {
            assert!(
                serde_json::from_value::<LeanSlice>(v.clone()).is_err(),
                "{v}"
            );
        }
    }
}
