//! Stale conntrack entries of kuport's flows. NAT is decided on a flow's first packet: the
//! kernel keeps translating a flow the way it did then for as long as the flow lives, whatever
//! the rules say now. A client that keeps sending from the same address and port (a game
//! client, every 20 ms) would keep reaching the old pod address after its mapping was deleted
//! or its endpoint moved (an address another tenant's pod may get next), and a flow that first
//! arrived while the port was not mapped yet would stay on the node itself. So after each apply
//! that changed what the node translates, the host walks the conntrack table and deletes the
//! entries whose translation is not what the node now programs; the next packet of such a
//! flow is a new flow and meets the current rules.
//!
//! The table can hold a million entries (kube-proxy sizes it so), and an internet client can
//! fill it through a mapped range, so a sweep never holds the table: it judges each entry as
//! the dump brings it and keeps only the stale ones of one batch ([`sweep`]), and it runs on a
//! thread of its own, off the agent's pass ([`worker`]).
//!
//! The decisions live here, over the [`ConntrackTable`] trait: [`kernel::KernelConntrack`]
//! speaks ctnetlink, a fake (in tests) holds entries in memory.

#[cfg(test)]
mod fake;
pub mod kernel;
mod sweep;
#[cfg(test)]
mod sweep_tests;
#[cfg(test)]
mod tests;
pub mod worker;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;

use kuport_core::api::Protocol;
use kuport_core::ir::{ChainId, DnatRule, HostState, PortRange, Rule, SteerRule};

pub use kernel::KernelConntrack;
pub use sweep::{BATCH, Checkpoint, Sweep, sweep, sweep_with};
pub use worker::{Hold, SweepObserver, SweepWorker, Sweeper};

/// One TCP or UDP conntrack entry (IPv4 or IPv6), as far as kuport judges it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flow {
    /// The protocol.
    pub protocol: Protocol,
    /// Original direction, source: the client.
    pub source: SocketAddr,
    /// Original direction, destination: what the client dialed (on the pod's node, the link
    /// end the accepting node sent it to).
    pub destination: SocketAddr,
    /// Reply direction, source: where the flow really goes (the DNAT target; the destination
    /// itself when the flow is not translated).
    pub reply_source: SocketAddr,
    /// The conntrack mark (every bit; kuport judges only its own).
    pub mark: u32,
    /// The conntrack zone (0 is the default zone).
    pub zone: u16,
    /// The kernel's id of the entry: a delete naming it cannot take a newer entry of the same
    /// tuple, created by the flow's next packet under the current rules.
    pub id: Option<u32>,
}

/// What deleting some entries came to. Counts only, and the first refusal's words: a sweep
/// deleting a million entries keeps no list of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Entries deleted.
    pub deleted: usize,
    /// Entries already gone (expired, or replaced by a newer entry of the same tuple).
    pub gone: usize,
    /// Deletes the kernel refused (or whose answer was lost).
    pub refused: usize,
    /// The first refusal, with the kernel's words.
    pub first_error: Option<String>,
}

impl Deleted {
    /// `count` deletes refused for one reason (the socket could not be opened, the batch not
    /// sent).
    pub fn all_refused(count: usize, why: String) -> Self {
        Self {
            refused: count,
            first_error: Some(why),
            ..Self::default()
        }
    }

    /// Adds another batch's outcome to this one.
    pub fn add(&mut self, other: Deleted) {
        self.deleted += other.deleted;
        self.gone += other.gone;
        self.refused += other.refused;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// The conntrack table of the current network namespace.
pub trait ConntrackTable: Send + Sync {
    /// Hands every TCP and UDP entry (both families) to `each`, one at a time as the table is
    /// read, holding no more of it than one receive buffer; stops early when `each` breaks.
    /// `each` may delete entries meanwhile (a delete is sent on a socket of its own).
    fn walk(&self, each: &mut dyn FnMut(Flow) -> ControlFlow<()>) -> Result<(), String>;
    /// Deletes these entries, each by its original tuple, zone and id, in as few round trips
    /// as the kernel allows.
    fn delete(&self, flows: &[Flow]) -> Deleted;
}

/// Where the node now sends a flow addressed to one steered destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    /// The mark (under kuport's mask) the flow carries: the local mark on an accepting node,
    /// the arrival link's on the pod's node.
    mark: u32,
    /// The DNAT target address.
    to: IpAddr,
    /// The DNAT target port; `None` keeps the dialed port.
    to_port: Option<u16>,
}

/// What the node translates: every destination kuport steers (an accepting interface's own
/// address, or a link end, with protocol and port) and where its flows go, read from the
/// applied state's steering and DNAT rules as the kernel matches them. Two equal values mean
/// no flow can have become stale between them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Translations {
    /// kuport's mark bits.
    mask: u32,
    /// Single ports: (destination address, protocol, port) → targets (more than one only when
    /// two interfaces share an address).
    ports: BTreeMap<(IpAddr, Protocol, u16), Vec<Target>>,
    /// Port ranges, few, sorted.
    ranges: Vec<(IpAddr, Protocol, PortRange, Target)>,
}

impl Translations {
    /// The translations `state` programs, judged under `mask`, the mark bits the host owns.
    pub fn of(state: &HostState, mask: u32) -> Self {
        let mut out = Self {
            mask,
            ..Self::default()
        };
        // Each family's steering is completed by its own table's DNAT: an IPv6 steering rule
        // shares its interface, protocol, ports and mark with the IPv4 one of a dual-stack
        // mapping, and judged by the IPv4 DNAT every IPv6 flow would read as stale.
        for table in state.tables() {
            let dnats: Vec<&DnatRule> = table.dnat_rules().collect();
            for rule in table.rules(ChainId::Steer) {
                let Rule::Steer(steer) = rule else { continue };
                let Some(target) = target_of(state, steer, &dnats, mask) else {
                    continue;
                };
                if steer.ports.is_range() {
                    out.ranges
                        .push((steer.daddr, steer.protocol, steer.ports, target));
                } else {
                    let key = (steer.daddr, steer.protocol, steer.ports.first);
                    out.ports.entry(key).or_default().push(target);
                }
            }
        }
        for targets in out.ports.values_mut() {
            targets.sort();
            targets.dedup();
        }
        out.ranges.sort();
        out.ranges.dedup();
        out
    }

    /// True when the node translates nothing.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.ranges.is_empty()
    }

    /// True when `flow` is kuport's and not translated as the node now programs: it carries
    /// kuport's mark or is addressed to a destination kuport steers, and its mark or its
    /// reply source differ from what the node's steering and DNAT would give it now (for a
    /// destination kuport no longer steers: any kuport mark). Everything else (the node's own
    /// connections, other tables' flows) is never stale.
    pub fn is_stale(&self, flow: &Flow) -> bool {
        let ours = flow.mark & self.mask;
        let dport = flow.destination.port();
        let mut targets = self
            .targets(flow.destination.ip(), flow.protocol, dport)
            .peekable();
        if targets.peek().is_none() {
            return ours != 0;
        }
        !targets.any(|t| {
            ours == t.mark && flow.reply_source == SocketAddr::new(t.to, t.to_port.unwrap_or(dport))
        })
    }

    fn targets(
        &self,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> impl Iterator<Item = &Target> {
        let single = self
            .ports
            .get(&(addr, protocol, port))
            .into_iter()
            .flatten();
        let ranged = self
            .ranges
            .iter()
            .filter(move |(a, p, r, _)| {
                *a == addr && *p == protocol && (r.first..=r.last).contains(&port)
            })
            .map(|(_, _, _, t)| t);
        single.chain(ranged)
    }
}

/// The mark and DNAT target of a steering rule: its DNAT is the one on the same interface,
/// protocol and ports that requires the same flow mark (none on the pod's node, where the
/// arrival link's mark is in the flow). `None` when nothing completes it (the applied state
/// never leaves a steering rule without its DNAT).
fn target_of(
    state: &HostState,
    steer: &SteerRule,
    dnats: &[&DnatRule],
    mask: u32,
) -> Option<Target> {
    let mark = match steer.mark {
        Some(mark) => mark,
        None => state.links.iter().find(|l| l.name == steer.iif)?.mark,
    };
    let dnat = dnats.iter().find(|d| {
        d.iif == steer.iif
            && d.protocol == steer.protocol
            && d.ports == steer.ports
            && d.mark == steer.mark
    })?;
    Some(Target {
        mark: mark & mask,
        to: dnat.to,
        to_port: dnat.to_port,
    })
}
