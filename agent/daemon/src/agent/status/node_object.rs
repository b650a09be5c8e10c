//! Writing this node's `PortMapNode`: its row of every class, in an object no other node
//! writes (`kuport_core::plan::node_rows`). One writer, so no merge: the object is created once
//! (owned by this node's Node object, so it goes when the Node does) and then replaced whole
//! with the `resourceVersion` it was read at; a 409 means someone else (an administrator)
//! touched it, and it is read again and replaced once more.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kuport_core::api::{PortMapNode, PortMapNodeSpec};
use kuport_core::plan::Writes;
use kuport_core::plan::node_rows::{node_settles_only, node_spec};

use super::{AGENT_VERSION, Held, StatusOutcome, StatusWriter};
use crate::agent::metrics::{WriteKind, WriteResult};

/// How many times one pass writes the object after a 409 (each after a fresh read).
const NODE_WRITE_ATTEMPTS: usize = 3;

/// The watched `PortMapNode`s and Nodes the writer reads.
#[derive(Clone)]
pub(crate) struct NodeObjects {
    /// Every node's `PortMapNode` (this node's own among them).
    pub objects: Store<PortMapNode>,
    /// The Nodes, for this node's uid (the owner of its object).
    pub nodes: Store<Node>,
}

impl StatusWriter {
    /// Every watched `PortMapNode`, sorted by name (for the class merges' rows).
    pub(super) fn node_objects_now(&self) -> Vec<PortMapNode> {
        let Some(watched) = &self.node_objects else {
            return Vec::new();
        };
        let mut objects: Vec<PortMapNode> = watched
            .objects
            .state()
            .iter()
            .map(|o| (**o).clone())
            .collect();
        objects.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        objects
    }

    /// This node's object as watched.
    fn own_object(&self) -> Option<PortMapNode> {
        let watched = self.node_objects.as_ref()?;
        let own = watched.objects.get(&ObjectRef::new(&self.node))?;
        Some((*own).clone())
    }

    /// Writes this node's rows (`writes.class_rows`) into its `PortMapNode` when they differ
    /// from what is stored, holding back (see `SETTLE`) a change that only takes link ends
    /// down.
    pub(super) async fn write_node_object(
        &self,
        writes: &Writes,
        now: Timestamp,
        outcome: &mut StatusOutcome,
    ) {
        let api: Api<PortMapNode> = Api::all(self.client.clone());
        let mut stored = self.own_object();
        for attempt in 0..NODE_WRITE_ATTEMPTS {
            let spec = node_spec(stored.as_ref().map(|o| &o.spec), writes, AGENT_VERSION, now);
            // A node with nothing to say (no row of any class) makes no object.
            if stored.is_none() && spec.classes.is_empty() {
                outcome.unchanged += 1;
                return;
            }
            if let Some(old) = &stored {
                if old.spec == spec {
                    outcome.unchanged += 1;
                    return;
                }
                if attempt == 0
                    && node_settles_only(&old.spec, &spec)
                    && let Some(due) = self.hold(Held::Node)
                {
                    outcome.held.push((Held::Node, due));
                    return;
                }
            }
            match self.send_node_object(&api, stored.as_ref(), spec).await {
                Sent::Done(result) => {
                    self.node_object_answered(result, outcome);
                    return;
                }
                Sent::Conflict => match self.read_own_object(&api, outcome).await {
                    Some(fresh) => stored = fresh,
                    None => return,
                },
            }
        }
        outcome.recompute += 1;
    }

    /// Creates the object (none stored) or replaces the stored one.
    async fn send_node_object(
        &self,
        api: &Api<PortMapNode>,
        stored: Option<&PortMapNode>,
        spec: PortMapNodeSpec,
    ) -> Sent {
        let request = match stored {
            Some(old) => {
                let object = PortMapNode {
                    metadata: ObjectMeta {
                        name: Some(self.node.clone()),
                        resource_version: old.metadata.resource_version.clone(),
                        // An object created before the Node was known gets its owner now.
                        owner_references: (old.metadata.owner_references.clone())
                            .or_else(|| self.owner().map(|o| vec![o])),
                        ..Default::default()
                    },
                    spec,
                };
                tokio::time::timeout(
                    self.api_timeout,
                    api.replace(&self.node, &PostParams::default(), &object),
                )
                .await
            }
            None => {
                let mut object = PortMapNode::new(&self.node, spec);
                object.metadata.owner_references = self.owner().map(|o| vec![o]);
                tokio::time::timeout(
                    self.api_timeout,
                    api.create(&PostParams::default(), &object),
                )
                .await
            }
        };
        match request {
            Ok(Err(kube::Error::Api(s))) if s.is_conflict() || s.code == 409 => {
                self.metrics
                    .record_write(WriteKind::Node, WriteResult::Conflict);
                Sent::Conflict
            }
            other => Sent::Done(other.map(|r| r.map(|_| ()))),
        }
    }

    /// This node's Node as the owner of its object: deleting the Node deletes it.
    fn owner(&self) -> Option<OwnerReference> {
        let nodes = &self.node_objects.as_ref()?.nodes;
        let node = nodes.get(&ObjectRef::new(&self.node))?;
        Some(OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: self.node.clone(),
            uid: node.metadata.uid.clone()?,
            ..Default::default()
        })
    }

    fn node_object_answered(
        &self,
        result: Result<Result<(), kube::Error>, tokio::time::error::Elapsed>,
        outcome: &mut StatusOutcome,
    ) {
        let what = format!("PortMapNode {}", self.node);
        match result {
            Ok(Ok(())) => {
                self.metrics
                    .record_write(WriteKind::Node, WriteResult::Written);
                outcome.written += 1;
                tracing::debug!("wrote {what}");
            }
            Ok(Err(e)) => self.write_failed(WriteKind::Node, &what, Some(e), outcome),
            Err(_) => self.write_failed(WriteKind::Node, &what, None, outcome),
        }
    }

    /// The object as stored now (`Some(None)`: there is none); `None`, accounted, when the read
    /// failed.
    async fn read_own_object(
        &self,
        api: &Api<PortMapNode>,
        outcome: &mut StatusOutcome,
    ) -> Option<Option<PortMapNode>> {
        match tokio::time::timeout(self.api_timeout, api.get_opt(&self.node)).await {
            Ok(Ok(object)) => Some(object),
            Ok(Err(e)) => {
                outcome
                    .errors
                    .push(format!("reading PortMapNode {}: {e}", self.node));
                None
            }
            Err(_) => {
                outcome.errors.push(format!(
                    "reading PortMapNode {}: no answer within {:?}",
                    self.node, self.api_timeout
                ));
                None
            }
        }
    }
}

/// How a create or replace of the object ended.
enum Sent {
    /// Answered (or timed out): accounted by `node_object_answered`.
    Done(Result<Result<(), kube::Error>, tokio::time::error::Elapsed>),
    /// Someone else wrote it meanwhile, or it exists although the watch had none.
    Conflict,
}
