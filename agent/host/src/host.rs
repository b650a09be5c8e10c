//! The host as the agent sees it: the [`Host`] trait, and what its calls take and give besides
//! the apply report.

use std::future::Future;
use std::net::Ipv4Addr;

use kuport_core::ir::{ChainId, HostState, MarkLayout};
use kuport_core::snapshot::HostFacts;

use crate::error::HostError;
use crate::report::ApplyReport;

/// What the agent asks of the host's facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FactsQuery {
    /// Interfaces the classes give this node.
    pub interfaces: Vec<String>,
    /// This node's InternalIP: the device holding it is the underlay.
    pub internal_ip: Option<Ipv4Addr>,
    /// The mark layout the agent runs with (reported back in the facts).
    pub marks: MarkLayout,
    /// The agent's own listening ports (health, metrics): named as the agent's in the facts.
    pub agent_ports: Vec<u16>,
}

/// One mapping's counter in one chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappingCounter {
    /// The mapping's namespace.
    pub namespace: String,
    /// The mapping's name.
    pub name: String,
    /// The chain (`pre` or `post`).
    pub chain: ChainId,
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// A change to a link the agent cares about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkEvent {
    /// The link's name.
    pub name: String,
    /// True when the link was deleted.
    pub removed: bool,
}

/// The host as the agent sees it. The real implementation is [`crate::LinuxHost`]; [`crate::MemoryHost`]
/// records what it is asked and serves scripted facts.
pub trait Host: Send {
    /// Brings the host to `desired`. With `verify` false, an IR equal to the last applied one
    /// sends nothing; with `verify` true (start and resync) the kernel is compared instead, so
    /// hand-made drift is repaired.
    fn apply(
        &mut self,
        desired: &HostState,
        verify: bool,
    ) -> impl Future<Output = Result<ApplyReport, HostError>> + Send;
    /// Removes everything kuport owns.
    fn teardown(&mut self) -> impl Future<Output = Result<(), HostError>> + Send;
    /// Reads the facts the plan needs.
    fn facts(
        &self,
        query: &FactsQuery,
    ) -> impl Future<Output = Result<HostFacts, HostError>> + Send;
    /// Per-mapping counters from kuport's own rules.
    fn counters(&self) -> impl Future<Output = Result<Vec<MappingCounter>, HostError>> + Send;
}
