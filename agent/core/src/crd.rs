//! The CustomResourceDefinitions generated from the API types, and their YAML rendering.
//!
//! `kuport crds` prints or writes these; the committed `crds/` directory and the chart's copy are
//! checked against them by tests, so the schema users install is the one the types describe.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::api::{PortMap, PortMapClass, PortMapNode};

/// A generated CRD with the file name it is stored under.
#[derive(Clone, Debug)]
pub struct CrdFile {
    /// File name inside `crds/`: `<plural>.<group>.yaml`.
    pub file_name: String,
    /// The CRD object.
    pub crd: CustomResourceDefinition,
}

/// Errors while rendering CRDs.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The YAML serializer refused a CRD.
    #[error("rendering CRD {name} as YAML: {source}")]
    Render {
        /// Name of the CRD.
        name: String,
        /// The serializer's error.
        source: serde_saphyr::ser_error::Error,
    },
}

const HEADER: &str =
    "# Generated from the Rust types in agent/core by `kuport crds`. Do not edit.\n";

/// Every CRD, sorted by file name.
pub fn crd_files() -> Vec<CrdFile> {
    let mut files: Vec<CrdFile> = [PortMapClass::crd(), PortMap::crd(), PortMapNode::crd()]
        .into_iter()
        .map(|crd| CrdFile {
            file_name: format!("{}.yaml", crd_name(&crd)),
            crd,
        })
        .collect();
    files.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    files
}

/// Renders one CRD as a YAML document with a generated-file header.
pub fn render_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    let body = serde_saphyr::to_string(crd).map_err(|source| CrdError::Render {
        name: crd_name(crd).to_owned(),
        source,
    })?;
    Ok(format!("{HEADER}{body}"))
}

fn crd_name(crd: &CustomResourceDefinition) -> &str {
    crd.metadata.name.as_deref().unwrap_or_default()
}
