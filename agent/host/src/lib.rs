//! kuport's host layer: the only code that touches a node's kernel. It turns the datapath IR of
//! `kuport-core` into nftables (one atomic transaction through the `nft` program), VXLAN links,
//! ip rules and routes (rtnetlink, reconciled by comparison), and reads back the host facts and
//! counters the agent needs.
//!
//! kuport owns exactly `table ip kuport`, links named `kup-*`, ip rules whose fwmark lies in
//! `0x6b70xxxx`, and routes in tables numbered in that range; nothing else is read-modified-
//! written.
//!
//! Where things are: the [`Host`] trait the agent calls and its vocabulary (`host.rs`); what an
//! apply reports, refusals included (`report.rs`); the errors (`error.rs`); the real host,
//! which orders an apply across the backends (`linux.rs`); the backends themselves: nftables
//! ([`nft`]), links, rules and routes ([`netlink`]), conntrack ([`conntrack`]), listening
//! sockets ([`sockets`]); the host's events, changes to kuport's state the agent did not make
//! ([`HostEvents`], over `netlink/events.rs` and [`nft_events`]); the probes across return
//! links ([`probe`]); the host settings kuport depends on, checked every pass ([`node_checks`]);
//! and [`MemoryHost`], the
//! in-memory host of the simulator and tests.

pub mod conntrack;
mod error;
mod host;
mod linux;
pub mod memory;
pub mod netlink;
pub mod nft;
pub mod nft_events;
#[cfg(test)]
mod nft_fake;
mod nft_generation;
pub mod node_checks;
pub mod probe;
mod report;
pub mod sockets;

pub use error::{HostError, HostStage};
pub use host::{FactsQuery, Host, HostEvent, HostEventKind, MappingCounter};
pub use linux::{HostEvents, LinuxHost, label_counters};
pub use memory::MemoryHost;
pub use report::{ApplyReport, Refusal};
