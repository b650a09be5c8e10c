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

/// What kind of host state a [`HostEvent`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostEventKind {
    /// A `kup-*` link or the underlay device, created, changed or deleted (by anyone: the
    /// kernel does not say who changed a link reliably).
    Link,
    /// One of kuport's ip rules, changed or deleted by another program.
    Rule,
    /// A route in one of kuport's routing tables, changed or deleted by another program.
    Route,
    /// An address of a `kup-*` link, changed or deleted by another program.
    Address,
    /// kuport's nftables table (the table, a chain, rule, set, element or counter), changed
    /// or deleted by another program.
    Nftables,
    /// A sysctl a node check reads (`forwarding` of `all` in either family, `rp_filter` of
    /// `all`, `default` or a `kup-*` link), written by anyone: the checks are read again.
    Sysctl,
    /// The stream may have missed events (its socket's buffer overflowed, or it ended):
    /// anything may have changed.
    Lost,
}

impl HostEventKind {
    /// Every kind, in the order `/metrics` lists them.
    pub const ALL: [HostEventKind; 7] = [
        HostEventKind::Link,
        HostEventKind::Rule,
        HostEventKind::Route,
        HostEventKind::Address,
        HostEventKind::Nftables,
        HostEventKind::Sysctl,
        HostEventKind::Lost,
    ];

    /// The name in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            HostEventKind::Link => "link",
            HostEventKind::Rule => "rule",
            HostEventKind::Route => "route",
            HostEventKind::Address => "address",
            HostEventKind::Nftables => "nftables",
            HostEventKind::Sysctl => "sysctl",
            HostEventKind::Lost => "lost",
        }
    }
}

/// A change on the host that may have undone part of kuport's datapath: the agent answers it
/// with a pass that compares against the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostEvent {
    /// What kind of state changed.
    pub kind: HostEventKind,
    /// What changed, for the log: a link's name, a rule, a route, an address, an nft object.
    pub what: String,
    /// True when it was deleted (rather than created or changed).
    pub removed: bool,
}

impl HostEvent {
    /// A change to the link named `name`.
    pub fn link(name: impl Into<String>, removed: bool) -> Self {
        Self {
            kind: HostEventKind::Link,
            what: name.into(),
            removed,
        }
    }
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
    /// Tells `observer` how each sweep of stale conntrack entries ends (they run off the
    /// apply, see [`crate::conntrack::worker`]); a host that sweeps nothing never calls it.
    fn observe_sweeps(&mut self, observer: crate::conntrack::SweepObserver) {
        let _ = observer;
    }
    /// Reads the facts the plan needs.
    fn facts(
        &self,
        query: &FactsQuery,
    ) -> impl Future<Output = Result<HostFacts, HostError>> + Send;
    /// Per-mapping counters from kuport's own rules.
    fn counters(&self) -> impl Future<Output = Result<Vec<MappingCounter>, HostError>> + Send;
}
