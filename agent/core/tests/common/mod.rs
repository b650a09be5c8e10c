//! Helpers shared by the API tests, and the cluster model the plan's property tests
//! (`plan_prop_*.rs`) draw from.

#![allow(dead_code)]

pub mod inputs;
pub mod model;
pub mod oracles;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// The openAPIV3Schema of a CRD's only version, as JSON.
pub fn schema_of(crd: &CustomResourceDefinition) -> Value {
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("CRD has an openAPIV3Schema");
    serde_json::to_value(schema).expect("schema serialises")
}

/// Reads a YAML file from the crate's testdata as JSON.
pub fn testdata_json(rel: &str) -> Value {
    let path = format!("{}/testdata/{rel}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}
