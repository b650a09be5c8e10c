//! The plan: one pure, deterministic function from the cluster's objects (and this node's host
//! facts) to every decision kuport makes.
//!
//! The global part of the result (every mapping and class decision, except the addresses inside
//! `published`) depends neither on which node computes it, nor on host facts, nor on the order of
//! any input list: that is what lets agents agree without a leader.
//!
//! The stages of a pass share their working state through [`state`] and depend on nothing of
//! each other (`state`'s documentation gives their order).
//!
//! # Kernel refusals, stage by stage
//!
//! When this node's kernel refuses part of what the plan asked for, the refusal travels through
//! four types, each named for the stage it is at:
//!
//! 1. `kuport_host::Refusal`: what the kernel refused in an apply (a link, or a batch of rules),
//!    with the mappings it takes out.
//! 2. [`crate::snapshot::KernelRefusal`]: one refused mapping, fed back into the next plan as a
//!    host fact.
//! 3. [`KernelRefusalWrite`]: the same mapping under its class, as this node writes it.
//! 4. [`crate::api::RefusedMapping`]: the entry stored in the class's `status.refused`, with the
//!    node that wrote it, which every node reads (and which makes the mapping's `Programmed`
//!    say `HostRefused`).

mod bindings;
mod checks;
mod classes;
mod emit;
mod endpoint;
mod fast_hash;
mod holders;
mod index;
mod mapping;
pub use mapping::STANDBY_LINKS;
pub mod merge;
pub mod node_rows;
mod pod_network;
mod quota;
pub mod reasons;
pub mod row_patch;
pub mod selector;
mod state;
mod status;
pub mod unknown_fields;
pub use status::limits;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::api::{ClassNodeStatus, PortMapStatus, Protocol, PublishedAddress};
use crate::ir::{HostState, PortRange};
use crate::keys::{Name, NodePair};
use crate::snapshot::{HostFacts, Snapshot};

pub use emit::fit_nft_text;
pub use pod_network::{local_endpoint_message, not_a_pod_message};
pub use reasons::{AcceptedReason, ClassReason, Outcome, ProgrammedReason};
pub use state::link_name;
pub use status::MAX_ABSENT_CLAIMS;

/// How long an unused link claim is kept before it is dropped.
pub const CLAIM_GC_AFTER_SECONDS: i64 = 24 * 60 * 60;

/// The plan of one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The node the plan was computed for.
    pub node: String,
    /// Per PortMap decisions, sorted by namespace then name.
    pub portmaps: Vec<MappingDecision>,
    /// Per class decisions, sorted by name.
    pub classes: Vec<ClassDecision>,
    /// The host state this node must program (serialised as `host`).
    #[serde(rename = "host")]
    pub host_state: HostState,
    /// The status this node owns and should write.
    pub writes: Writes,
    /// The earliest time after `now` at which this plan changes though no object does (a
    /// preflight class's deadline): the agent passes again then.
    #[serde(skip)]
    pub changes_at: Option<Timestamp>,
}

/// The global decision for one PortMap.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MappingDecision {
    /// Namespace of the PortMap.
    pub namespace: Name,
    /// Name of the PortMap.
    pub name: String,
    /// The class asked for.
    pub class: Name,
    /// The protocol.
    pub protocol: Protocol,
    /// The ports clients dial; `None` when the spec's ports are not a valid range.
    pub ports: Option<PortRange>,
    /// `metadata.generation`, copied into `observedGeneration`.
    pub generation: Option<i64>,
    /// The `Accepted` condition.
    pub accepted: Outcome<AcceptedReason>,
    /// The `Programmed` condition; `None` unless accepted.
    pub programmed: Option<Outcome<ProgrammedReason>>,
    /// The chosen endpoint.
    pub endpoint: Option<ChosenEndpoint>,
    /// Ready endpoints left out because their address is not a pod address of the cluster (a
    /// node's, loopback, link-local, kuport's, or outside every pod network): the first few,
    /// sorted by address.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejected_endpoints: Vec<RejectedEndpoint>,
    /// The serving node (only when an endpoint was chosen and a node accepts).
    pub serving_node: Option<Name>,
    /// The nodes that program the mapping (Single: the serving node; Multi: every accepting
    /// node), sorted. Shared by every mapping with the same nodes: a Multi class's mappings all
    /// have the same list.
    pub programming_nodes: Arc<[Name]>,
    /// The one node that writes this mapping's status.
    pub status_writer: Option<Name>,
    /// Where the port answers, sorted by node then interface. Shared by every mapping with the
    /// same bindings.
    pub published: Arc<[PublishedAddress]>,
    /// The return links the mapping needs, sorted by key: those of its programming nodes.
    pub links: Vec<NeededLink>,
    /// Standby return links, sorted by key: for a Single mapping whose pod's node does not
    /// accept, the links from every other accepting node that binds one of its interfaces
    /// (each could become the serving node). They are claimed and built ahead of need, so moving
    /// the serving node never waits for a claim to land; `Programmed` does not wait for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub standby_links: Vec<NeededLink>,
    /// Interfaces each programming node binds (the class's, narrowed by the mapping's). Shared
    /// by every mapping with the same binding set and programming nodes.
    pub bindings: Arc<BTreeMap<String, Vec<String>>>,
    /// True when the outcome allows DNAT rules at all (accepted, endpoint, accepting node, no
    /// range translation, not refused for lack of a return path).
    pub emits: bool,
}

/// The endpoint chosen for a mapping.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChosenEndpoint {
    /// The pod's node.
    pub node: Name,
    /// The pod's address: IPv4 when the Service lists IPv4 endpoints, else IPv6.
    pub address: IpAddr,
    /// The same pod's IPv6 address, when the Service is dual-stack and lists one for it: the
    /// mapping is then served over IPv6 too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address6: Option<Ipv6Addr>,
    /// The pod's port for the named Service port.
    pub port: u16,
    /// The pod's name (`targetRef.name`), when the slice says.
    pub pod: Option<String>,
}

impl ChosenEndpoint {
    /// The pod's IPv4 address, when the mapping serves IPv4.
    pub fn v4(&self) -> Option<Ipv4Addr> {
        match self.address {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }

    /// The pod's IPv6 address, when the mapping serves IPv6.
    pub fn v6(&self) -> Option<Ipv6Addr> {
        match self.address {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => self.address6,
        }
    }

    /// The pod's address in `family`, when the mapping serves it.
    pub fn address_in(&self, family: crate::ir::Family) -> Option<IpAddr> {
        match family {
            crate::ir::Family::V4 => self.v4().map(IpAddr::V4),
            crate::ir::Family::V6 => self.v6().map(IpAddr::V6),
        }
    }

    /// Every address of the pod the mapping serves, IPv4 first.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> {
        std::iter::once(self.address).chain(self.address6.map(IpAddr::V6))
    }
}

/// A ready endpoint the mapping does not use: its address is not a pod address of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct RejectedEndpoint {
    /// Its address.
    pub address: IpAddr,
    /// The node the slice names.
    pub node: String,
    /// The pod the slice names, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Why, completing "the address is ...": "an address of node edge-a", "a loopback address",
    /// "outside the cluster's pod networks (10.244.0.0/16)".
    pub reason: String,
}

/// A return link a mapping needs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct NeededLink {
    /// The class the link belongs to.
    pub class: Name,
    /// The node pair (sorted and joined by `/` when printed).
    pub key: NodePair,
    /// The slot, when claimed (landed or proposed in this plan).
    pub slot: Option<u32>,
    /// True when the claim is recorded in the class status as read from the API.
    pub landed: bool,
}

impl NeededLink {
    /// The link's other end as seen from `node`, when `node` is one of its ends (the device on
    /// `node` is then [`link_name`]`(class, peer)`).
    pub fn peer_of(&self, node: &str) -> Option<&str> {
        self.key.other(node)
    }
}

/// The global decision for one class.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassDecision {
    /// The class name.
    pub name: String,
    /// The `Ready` condition.
    pub ready: Outcome<ClassReason>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The class's claims after this node's proposals and GC, sorted by key. (This list is the
    /// one part of a class decision that depends on the computing node.)
    pub links: Vec<ClaimView>,
}

/// A link claim as this node sees it after its own proposals and GC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClaimView {
    /// The node pair.
    pub key: String,
    /// The slot.
    pub slot: u32,
    /// True when read from the API; false for this node's own proposal.
    pub landed: bool,
    /// When the claim was last found unused.
    pub unused_since: Option<Timestamp>,
}

/// The status this node owns.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Writes {
    /// PortMap statuses this node writes, sorted by namespace then name.
    pub portmaps: Vec<PortMapWrite>,
    /// Class rows (and the class Ready condition) this node writes, sorted by class.
    pub class_rows: Vec<ClassRowWrite>,
    /// New link claims this node proposes, sorted by class then key.
    pub claims: Vec<ClaimProposal>,
    /// Garbage-collection actions on claims, sorted by class then key.
    pub gc: Vec<GcAction>,
    /// What this node's kernel refused, by class and mapping, sorted: it replaces this node's
    /// entries in each class's `status.refused` (none left clears them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<KernelRefusalWrite>,
}

/// A mapping this node's kernel refused, under the class it belongs to: what this node writes
/// into the class's `status.refused` (see "Kernel refusals, stage by stage" above).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct KernelRefusalWrite {
    /// The mapping's class.
    pub class: String,
    /// The mapping, `namespace/name`.
    pub mapping: String,
    /// What was refused and what the kernel said.
    pub message: String,
}

/// The desired status of one PortMap.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PortMapWrite {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The full desired status; conditions keep their `lastTransitionTime` unless they flipped.
    pub status: PortMapStatus,
    /// `Programmed` is false only while another agent takes the protocol's next step (a claim
    /// proposed but not landed, a link end not acknowledged yet): a state that usually lasts
    /// one round trip, which the agent does not write over a `Programmed=True` unless it lasts
    /// (`docs/operations.md`, "Status writes"). Not part of the plan's JSON.
    #[serde(skip)]
    pub settling: bool,
}

/// This node's row in one class, and the class's Ready condition as this node computes it (a
/// row whose `accepting` is `Some(false)`, a pod's node's, leaves the condition alone).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassRowWrite {
    /// The class.
    pub class: String,
    /// This node's row.
    pub row: ClassNodeStatus,
    /// The `Ready` condition (with `lastTransitionTime` kept unless it flipped), written only
    /// when it differs from the stored one.
    pub ready: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
    /// The class's accepting nodes in this snapshot (named by the class, with a Ready Node),
    /// sorted: with the rows, what `readyNodes` and `nodesSummary` are derived from.
    pub accepting: Vec<String>,
    /// How many nodes the class names.
    pub named: usize,
    /// The ports each namespace holds in the class and its quota (`status.namespaces`), as
    /// every agent computes it from the same PortMaps.
    pub namespaces: Vec<crate::api::NamespacePorts>,
}

/// A new link claim.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ClaimProposal {
    /// The class.
    pub class: String,
    /// The node pair.
    pub key: String,
    /// The two nodes, sorted.
    pub peers: [String; 2],
    /// The slot.
    pub slot: u32,
    /// The /31, as text.
    pub subnet: String,
    /// The standby claim whose slot this serving pair takes over, when no slot is free: a
    /// serving pair always wins over a standby one. The merge lands the proposal on that slot
    /// only while that key (or nobody) holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
}

/// What garbage collection does to one claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum GcKind {
    /// Set `unusedSince` to now.
    MarkUnused,
    /// Clear `unusedSince`: the pair is needed again.
    ClearUnused,
    /// Drop the claim: unused for more than 24 hours.
    Drop,
}

/// One garbage-collection action.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct GcAction {
    /// The class.
    pub class: String,
    /// The claim's key.
    pub key: String,
    /// The action.
    pub action: GcKind,
}

/// Computes the plan of `this_node`.
pub fn plan(snapshot: &Snapshot, this_node: &str, facts: &HostFacts, now: Timestamp) -> Plan {
    plan_with(snapshot, this_node, facts, now, Detail::Full)
}

/// How much of what only people read a plan spells out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// Every mapping's condition messages and published rows: `kuport plan` (its JSON), `kuport
    /// status`, the tests.
    Full,
    /// Condition messages and published rows only of the mappings whose status this node
    /// writes: the agent's pass. Every other mapping's are written by its own status writer,
    /// and spelling them out cost a formatted sentence per unprogrammed mapping of the
    /// cluster. Everything else (reasons, endpoints, links, rules, writes) is the same as
    /// [`Detail::Full`]'s.
    Written,
}

/// [`plan`] with the given [`Detail`].
pub fn plan_with(
    snapshot: &Snapshot,
    this_node: &str,
    facts: &HostFacts,
    now: Timestamp,
    detail: Detail,
) -> Plan {
    let index = index::Index::build(snapshot);
    let mut classes = classes::evaluate_static(&index, now);
    let (mut decisions, bindings, quotas) = mapping::admit_all(&index);
    mapping::resolve_all(&index, &classes, &bindings, &mut decisions);
    classes::assign_slots(&mut classes, &decisions);
    mapping::gate_all(&index, &classes, &mut decisions, this_node, facts, detail);

    let host_state = emit::emit(&index, &classes, &decisions, this_node, facts);
    let mut writes = status::writes(
        &index, &classes, &decisions, snapshot, this_node, facts, now,
    );
    status::add_namespace_ports(&mut writes, &classes, &quotas);
    status::add_link_ends(
        &mut writes,
        &classes,
        &host_state,
        this_node,
        facts,
        snapshot.cni.as_ref(),
        now,
    );
    let class_decisions = classes::decisions(&classes, &writes, now);
    let changes_at = classes::changes_at(&classes, now);

    let portmaps = by_name(decisions.into_iter().map(|d| d.decision).collect());
    Plan {
        node: this_node.to_owned(),
        portmaps,
        classes: class_decisions,
        host_state,
        writes,
        changes_at,
    }
}

/// The decisions sorted by namespace and name. The index holds one PortMap per name, so the
/// keys are unique and an unstable sort gives the one order; sorting the keys alone and then
/// moving each decision once avoids shuffling the large decisions through the sort.
fn by_name(decisions: Vec<MappingDecision>) -> Vec<MappingDecision> {
    // Each key carries the first 8 bytes of both names as one integer: sorted by it alone, a
    // comparison is one integer compare. Heads that differ order as the names do, so only
    // runs with equal heads are sorted again by the whole names: a run of one namespace head
    // whose namespaces differ past it, and a run of equal name heads within one namespace.
    let mut order: Vec<(u128, usize)> = decisions
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let heads = (u128::from(head(&d.namespace)) << 64) | u128::from(head(&d.name));
            (heads, i)
        })
        .collect();
    order.sort_unstable_by_key(|(heads, _)| *heads);
    let names = |i: usize| (decisions[i].namespace.as_str(), decisions[i].name.as_str());
    let by_names = |a: &(u128, usize), b: &(u128, usize)| names(a.1).cmp(&names(b.1));
    for namespace_run in order.chunk_by_mut(|a, b| a.0 >> 64 == b.0 >> 64) {
        let first = names(namespace_run[0].1).0;
        if namespace_run.iter().any(|(_, i)| names(*i).0 != first) {
            namespace_run.sort_unstable_by(by_names);
            continue;
        }
        for name_run in namespace_run.chunk_by_mut(|a, b| a.0 == b.0) {
            if name_run.len() > 1 {
                name_run.sort_unstable_by(by_names);
            }
        }
    }
    let order: Vec<usize> = order.into_iter().map(|(_, i)| i).collect();
    let mut slots: Vec<Option<MappingDecision>> = decisions.into_iter().map(Some).collect();
    // Sized up front: collected from a filter, the list would grow by doubling, copying every
    // decision made so far at each step.
    let mut sorted = Vec::with_capacity(slots.len());
    sorted.extend(order.into_iter().filter_map(|i| slots[i].take()));
    sorted
}

/// The first 8 bytes of `text`, big-endian, zero-padded. When the heads of two strings differ
/// they order as the strings do: the first differing byte lies within the head, or the string
/// that ends first is a prefix of the other, and its padding zero sorts below the other's
/// nonzero byte there.
fn head(text: &str) -> u64 {
    let mut bytes = [0u8; 8];
    let n = text.len().min(8);
    bytes[..n].copy_from_slice(&text.as_bytes()[..n]);
    u64::from_be_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::api::Protocol;

    fn decision(namespace: &str, name: &str) -> MappingDecision {
        MappingDecision {
            namespace: Name::from(namespace),
            name: name.to_owned(),
            class: Name::from("c"),
            protocol: Protocol::Udp,
            ports: None,
            generation: None,
            accepted: Outcome::new(AcceptedReason::Valid, ""),
            programmed: None,
            endpoint: None,
            rejected_endpoints: Vec::new(),
            serving_node: None,
            programming_nodes: Arc::from([]),
            status_writer: None,
            published: Arc::from([]),
            links: Vec::new(),
            standby_links: Vec::new(),
            bindings: Arc::default(),
            emits: false,
        }
    }

    /// Names that share their first 8 bytes, are prefixes of each other, or are shorter than 8:
    /// every case where the integer heads alone do not decide.
    fn a_name() -> impl Strategy<Value = String> {
        ("(namespac|names|ab|a|)", "[a-c/-]{0,10}").prop_map(|(head, tail)| head + &tail)
    }

    proptest! {
        #[test]
        fn decisions_come_out_in_name_order_whatever_the_input_order(
            (pairs, input) in proptest::collection::btree_set((a_name(), a_name()), 0..60)
                .prop_flat_map(|pairs| {
                    // The plan's input order is arbitrary: any permutation of the names.
                    let input: Vec<(String, String)> = pairs.iter().cloned().collect();
                    (Just(pairs), Just(input).prop_shuffle())
                }),
        ) {
            let decisions = input.iter().map(|(ns, n)| decision(ns, n)).collect();
            let got: Vec<(String, String)> = by_name(decisions)
                .into_iter()
                .map(|d| (d.namespace.to_string(), d.name))
                .collect();
            let want: Vec<(String, String)> = pairs.into_iter().collect();
            prop_assert_eq!(got, want);
        }
    }
}
