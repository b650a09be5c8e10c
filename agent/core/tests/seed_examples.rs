//! The example objects of the integration guide users know kuport by deserialise into the API
//! types, and the defaults the guide promises apply both in Rust and in the CRD schema.

mod common;

use common::{schema_of, testdata_json};
use kube::CustomResourceExt;
use kube::core::cel::apply_defaults;
use kuport_core::api::{
    DEFAULT_VXLAN_PORT, DEFAULT_VXLAN_SUBNET, DEFAULT_VXLAN_VNI, PortMap, PortMapClass, Protocol,
    ReturnPathMode, ServingMode,
};
use serde_json::{Value, json};

#[test]
fn public_class_deserialises_with_its_own_values() {
    let class: PortMapClass =
        serde_json::from_value(testdata_json("seed/public-class.yaml")).unwrap();
    assert_eq!(class.metadata.name.as_deref(), Some("public"));
    let spec = &class.spec;
    assert_eq!(spec.nodes.len(), 1);
    assert_eq!(spec.nodes["worker-1"].interfaces, ["enp1s0", "wt0"]);
    assert_eq!((spec.ports.min, spec.ports.max), (1024, 65535));
    assert_eq!(spec.ports.reserved, [80, 443]);
    let selector = spec.namespace_selector.as_ref().expect("selector present");
    let labels = selector.match_labels.as_ref().expect("matchLabels present");
    assert_eq!(labels["kuport.wlz.li/public"], "allowed");
    assert_eq!(spec.return_path.mode, ReturnPathMode::Vxlan);
    assert_eq!(spec.return_path.vxlan.vni, 4242);
    assert_eq!(spec.return_path.vxlan.port, 4790);
    assert_eq!(spec.return_path.vxlan.subnet, "169.254.77.0/24");
    assert_eq!(
        spec.serving_mode,
        ServingMode::Single,
        "servingMode defaults to Single"
    );
}

#[test]
fn intranet_class_gets_every_default() {
    let class: PortMapClass =
        serde_json::from_value(testdata_json("seed/intranet-class.yaml")).unwrap();
    let spec = &class.spec;
    assert_eq!(
        spec.nodes.keys().collect::<Vec<_>>(),
        ["worker-1", "worker-2"]
    );
    assert_eq!(spec.return_path.mode, ReturnPathMode::None);
    assert_eq!(spec.serving_mode, ServingMode::Single);
    assert_eq!((spec.ports.min, spec.ports.max), (1, 65535));
    assert!(spec.ports.reserved.is_empty());
    assert!(
        spec.namespace_selector.is_none(),
        "no selector means every namespace"
    );
    assert_eq!(spec.return_path.vxlan.vni, DEFAULT_VXLAN_VNI);
    assert_eq!(spec.return_path.vxlan.port, DEFAULT_VXLAN_PORT);
    assert_eq!(spec.return_path.vxlan.subnet, DEFAULT_VXLAN_SUBNET);
}

#[test]
fn gameserver_portmap_deserialises() {
    let pm: PortMap =
        serde_json::from_value(testdata_json("seed/gameserver-portmap.yaml")).unwrap();
    assert_eq!(pm.metadata.namespace.as_deref(), Some("games"));
    assert_eq!(pm.spec.class_name, "public");
    assert_eq!(pm.spec.protocol, Protocol::Udp);
    assert_eq!((pm.spec.port, pm.spec.end_port), (3000, Some(3009)));
    assert!(
        pm.spec.interfaces.is_empty(),
        "interfaces default to all of the class's"
    );
    assert_eq!(pm.spec.service_ref.name, "gameserver");
    assert_eq!(pm.spec.service_ref.port, "game");
    assert!(pm.status.is_none());
}

/// The API server defaults from the CRD schema; the agent defaults through serde. Both must give
/// the same object, or an agent would compute a plan from values the cluster does not hold.
fn assert_schema_defaults_match_serde<K>(raw: Value, schema: &Value)
where
    K: serde::de::DeserializeOwned + serde::Serialize,
{
    let by_schema = apply_defaults(schema, &raw);
    let typed: K = serde_json::from_value(raw).expect("deserialises");
    let by_serde = serde_json::to_value(typed).expect("serialises");
    assert_eq!(
        by_schema["spec"], by_serde["spec"],
        "schema defaults differ from serde defaults"
    );
}

#[test]
fn schema_defaults_equal_serde_defaults_for_the_seed_objects() {
    let class_schema = schema_of(&PortMapClass::crd());
    for file in ["seed/public-class.yaml", "seed/intranet-class.yaml"] {
        assert_schema_defaults_match_serde::<PortMapClass>(testdata_json(file), &class_schema);
    }
    assert_schema_defaults_match_serde::<PortMap>(
        testdata_json("seed/gameserver-portmap.yaml"),
        &schema_of(&PortMap::crd()),
    );
}

#[test]
fn schema_defaults_fill_a_minimal_class_like_the_guide_says() {
    let minimal = json!({
        "apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMapClass",
        "metadata": {"name": "m"},
        "spec": {"nodes": {"a": {"interfaces": ["eth0"]}}, "returnPath": {"mode": "Vxlan"}}
    });
    let defaulted = apply_defaults(&schema_of(&PortMapClass::crd()), &minimal);
    assert_eq!(defaulted["spec"]["servingMode"], "Single");
    assert_eq!(
        defaulted["spec"]["ports"],
        json!({"min": 1, "max": 65535, "reserved": [],
               "systemReserved": kuport_core::api::DEFAULT_SYSTEM_RESERVED,
               "perNamespace": kuport_core::api::DEFAULT_PORTS_PER_NAMESPACE})
    );
    // The NodePort range is kept back unless the administrator opts in.
    assert!(
        defaulted["spec"]["ports"]["systemReserved"]
            .as_array()
            .is_some_and(|s| s.contains(&json!({"port": 30000, "endPort": 32767})))
    );
    assert_eq!(
        defaulted["spec"]["returnPath"]["vxlan"],
        json!({"vni": 4242, "port": 4790, "subnet": "169.254.77.0/24",
               "ipv6Subnet": "fd6b:7570::/96"})
    );
}
