//! `PortMapNode`: what one node's agent reports about itself, one object per node.
//!
//! Each row a node used to write into `PortMapClass.status.nodes` (its addresses, checks, held
//! ports and ends of return links) lives here instead, in an object only that node's agent
//! writes and named after its Node, as a Lease or a CSINode is: many writers of one shared
//! object contend for it, grow it with the cluster and send all of it to every watcher on every
//! change (`docs/decisions.md`, "One object per node").

// kube's printcolumn(...) repeats keys such as `type_` per column, which clippy mistakes for
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::class::ClassNodeStatus;

/// The most classes one node reports on: far more than a cluster has (each class is an
/// administrator's), and it bounds the object's size.
pub const MAX_NODE_CLASSES: usize = 64;

/// One node's report on every class it has something to say about, written only by that node's
/// agent (an admission policy binds the object's name to the node the writer's token names).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kuport.wlz.li",
    version = "v1alpha1",
    kind = "PortMapNode",
    plural = "portmapnodes",
    shortname = "pmn",
    category = "kuport",
    derive = "PartialEq",
    doc = "PortMapNode is written by the kuport agent of the Node it is named after: that node's \
           row of each class it accepts for or holds return-link ends of (its addresses, \
           checks, held ports and links). Nobody else writes it; it goes with its Node.",
    printcolumn(
        name = "Classes",
        type_ = "string",
        json_path = ".spec.classes[*].class",
        description = "The classes this node reports on."
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.agentVersion",
        description = "The kuport version of the agent that wrote it."
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PortMapNodeSpec {
    /// The kuport version of the agent that wrote this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub agent_version: Option<String>,

    /// This node's row of each class, sorted by class name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["class".into()]))]
    pub classes: Vec<NodeClassRow>,
}

/// This node's row of one class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeClassRow {
    /// The class, by name.
    #[schemars(length(max = 253))]
    pub class: String,

    /// The row, as the class's status once held it (its `name` is this node's).
    pub row: ClassNodeStatus,
}

impl PortMapNode {
    /// This node's row of `class`, when it reports one under its own name.
    pub fn row_of(&self, class: &str) -> Option<&ClassNodeStatus> {
        let node = self.metadata.name.as_deref()?;
        self.spec
            .classes
            .iter()
            .find(|c| c.class == class && c.row.name == node)
            .map(|c| &c.row)
    }
}
