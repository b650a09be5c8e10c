//! Stale conntrack entries of kuport's flows. NAT is decided on a flow's first packet: the
//! kernel keeps translating a flow the way it did then for as long as the flow lives, whatever
//! the rules say now. A client that keeps sending from the same address and port (a game
//! client, every 20 ms) would keep reaching the old pod address after its mapping was deleted
//! or its endpoint moved (an address another tenant's pod may get next), and a flow that first
//! arrived while the port was not mapped yet would stay on the node itself. So after each apply
//! that changed what the node translates, the host lists the conntrack table and deletes
//! the entries whose translation is not what the node now programs; the next packet of such a
//! flow is a new flow and meets the current rules.
//!
//! The decisions live here, over the [`ConntrackTable`] trait: [`kernel::KernelConntrack`]
//! speaks ctnetlink, a fake (in tests) holds entries in memory.

#[cfg(test)]
mod fake;
pub mod kernel;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use kuport_core::api::Protocol;
use kuport_core::ir::{ChainId, DnatRule, HostState, PortRange, Rule, SteerRule};

pub use kernel::KernelConntrack;

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

/// What deleting some entries came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Entries deleted.
    pub deleted: usize,
    /// Entries already gone (expired, or replaced by a newer entry of the same tuple).
    pub gone: usize,
    /// Deletes the kernel refused, with its words.
    pub errors: Vec<String>,
}

/// The conntrack table of the current network namespace.
pub trait ConntrackTable: Send + Sync {
    /// Every TCP and UDP entry, both families.
    fn flows(&self) -> Result<Vec<Flow>, String>;
    /// Deletes these entries, each by its original tuple, zone and id.
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

/// What one sweep of the table came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// TCP and UDP entries listed.
    pub listed: usize,
    /// Stale entries deleted.
    pub cleared: usize,
    /// Why the sweep failed, in part or whole (the listing, or deletes the kernel refused).
    pub error: Option<String>,
}

/// Lists the table and deletes every stale entry (see [`Translations::is_stale`]).
pub fn sweep(table: &dyn ConntrackTable, translations: &Translations) -> Sweep {
    let flows = match table.flows() {
        Ok(flows) => flows,
        Err(e) => {
            return Sweep {
                error: Some(format!("listing the conntrack table: {e}")),
                ..Sweep::default()
            };
        }
    };
    let stale: Vec<Flow> = flows
        .iter()
        .filter(|f| translations.is_stale(f))
        .cloned()
        .collect();
    let deleted = if stale.is_empty() {
        Deleted::default()
    } else {
        table.delete(&stale)
    };
    let error = deleted.errors.first().map(|first| {
        format!(
            "deleting stale conntrack entries: {} of {} refused, the first: {first}",
            deleted.errors.len(),
            stale.len()
        )
    });
    Sweep {
        listed: flows.len(),
        cleared: deleted.deleted,
        error,
    }
}

/// When the host sweeps: after an apply whose translations differ from those of the last
/// successful sweep (the first apply of a host included), on a verifying pass of a node that
/// translates something, and after a failed sweep until one succeeds. An unchanged pass lists
/// nothing, and neither does a resync of a node kuport does not use.
#[derive(Debug, Default)]
pub struct Sweeper {
    /// The translations the last successful sweep left the table consistent with.
    swept: Option<Translations>,
    /// A sweep failed: the next apply sweeps even when nothing changed.
    owed: bool,
}

impl Sweeper {
    /// Whether a sweep is owed for translations `now` (verifying or not).
    pub fn due(&self, now: &Translations, verify: bool) -> bool {
        self.owed || self.swept.as_ref() != Some(now) || (verify && !now.is_empty())
    }

    /// True while a failed sweep is waiting to be retried.
    pub fn owed(&self) -> bool {
        self.owed
    }

    /// Records how a sweep for `now` ended.
    pub fn record(&mut self, now: Translations, sweep: &Sweep) {
        self.owed = sweep.error.is_some();
        self.swept = (!self.owed).then_some(now);
    }
}
