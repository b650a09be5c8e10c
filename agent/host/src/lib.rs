//! kuport's host layer: the only code that touches a node's kernel. It turns the datapath IR of
//! `kuport-core` into nftables (one atomic transaction through the `nft` program), VXLAN links,
//! ip rules and routes (rtnetlink, reconciled by comparison), and reads back the host facts and
//! counters the agent needs.
//!
//! kuport owns exactly `table ip kuport`, links named `kup-*`, ip rules whose fwmark lies in
//! `0x6b70xxxx`, and routes in tables numbered in that range; nothing else is read-modified-
//! written.

pub mod conntrack;
pub mod memory;
pub mod netlink;
pub mod nft;
#[cfg(test)]
mod nft_fake;
mod nft_generation;
pub mod sockets;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::Ipv4Addr;
use std::sync::Arc;

use kuport_core::ir::{ChainId, HostState, LINK_PREFIX, MarkLayout};
use kuport_core::snapshot::{HostFacts, KernelRefusal};
use tokio::sync::mpsc;

pub use memory::MemoryHost;

/// Errors of the host layer, naming the object and the operation.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// `nft` refused or could not be run.
    #[error("nftables: {op}: {detail}")]
    Nft {
        /// What was being done.
        op: &'static str,
        /// What nft said.
        detail: String,
    },
    /// A netlink request failed.
    #[error("netlink: {op} {object}: {source}")]
    Netlink {
        /// The step of the apply it belongs to.
        stage: HostStage,
        /// What was being done.
        op: &'static str,
        /// The object.
        object: String,
        /// The error.
        source: rtnetlink::Error,
    },
    /// A VXLAN link could not be created because another device holds its VNI and port.
    #[error("link {link}: VNI {vni} with UDP port {port} is already used by device {holder}")]
    VniHeld {
        /// The link kuport wanted.
        link: String,
        /// Its VNI.
        vni: u32,
        /// Its port.
        port: u16,
        /// The device holding them.
        holder: String,
    },
    /// Something the IR depends on is not on the host.
    #[error("{what}")]
    Missing {
        /// The step of the apply it belongs to.
        stage: HostStage,
        /// What is missing.
        what: String,
    },
    /// A host fact could not be read.
    #[error("reading host facts: {detail}")]
    Facts {
        /// What failed.
        detail: String,
    },
    /// The netlink socket could not be opened.
    #[error("netlink: opening a socket: {0}")]
    Socket(std::io::Error),
}

/// The steps of an apply (and the facts read before it), as errors and metrics name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostStage {
    /// Reading the host facts.
    Facts,
    /// VXLAN links (devices, addresses, MTU, sysctls).
    Links,
    /// The nftables transaction.
    Nftables,
    /// ip rules.
    Rules,
    /// Routes.
    Routes,
}

impl HostError {
    /// The step of the apply this error belongs to.
    pub fn stage(&self) -> HostStage {
        match self {
            HostError::Nft { .. } => HostStage::Nftables,
            HostError::Netlink { stage, .. } | HostError::Missing { stage, .. } => *stage,
            HostError::VniHeld { .. } | HostError::Socket(_) => HostStage::Links,
            HostError::Facts { .. } => HostStage::Facts,
        }
    }
}

/// What one apply changed. A second apply of the same IR reports zero mutations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Whether an nftables transaction was sent.
    pub nft_changed: bool,
    /// Lines of the nftables transaction (only what differed is sent).
    pub nft_lines: usize,
    /// Whether kuport's table was listed: only a verifying pass after someone else changed
    /// the ruleset needs to.
    pub nft_listed: bool,
    /// Links created.
    pub links_created: usize,
    /// Links changed in place (address, MTU, rp_filter, up).
    pub links_updated: usize,
    /// Links deleted.
    pub links_deleted: usize,
    /// ip rules added.
    pub rules_added: usize,
    /// ip rules deleted.
    pub rules_deleted: usize,
    /// Routes added.
    pub routes_added: usize,
    /// Routes deleted.
    pub routes_deleted: usize,
    /// What the kernel refused. Everything else was applied: a refusal takes out only the
    /// mappings that depend on the refused part.
    pub refused: Vec<Refusal>,
    /// Whether the conntrack table was listed for stale entries of kuport's flows: only after
    /// an apply that changed what the node translates, on a verifying pass, or to retry.
    pub conntrack_swept: bool,
    /// Conntrack entries deleted because their flow is no longer translated as the node now
    /// programs (not a datapath mutation: the next packet of each starts a new flow).
    pub conntrack_cleared: usize,
    /// Why the sweep failed; the apply stands and the next apply tries again.
    pub conntrack_error: Option<String>,
}

/// A part of the desired state the kernel refused, and the mappings it takes out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What was refused: `return link kup-…` or `nftables rules`.
    pub unit: String,
    /// The refused return link's device name, when the unit is a link.
    pub link: Option<String>,
    /// The mappings (`namespace/name`) that lost rules with it, sorted.
    pub mappings: BTreeSet<String>,
    /// What the kernel (or nft) said.
    pub message: String,
}

impl Refusal {
    /// The kernel refused return link `name`; `mappings` lost their rules with it.
    pub fn of_link(name: &str, mappings: BTreeSet<String>, message: String) -> Self {
        Self {
            unit: format!("return link {name}"),
            link: Some(name.to_owned()),
            mappings,
            message,
        }
    }

    /// nft refused the rules of `mapping`.
    pub fn of_rules(mapping: String, message: String) -> Self {
        Self {
            unit: "nftables rules".to_owned(),
            link: None,
            mappings: BTreeSet::from([mapping]),
            message,
        }
    }

    /// Every mapping the refusals take out.
    pub fn mappings_of(refusals: &[Refusal]) -> BTreeSet<String> {
        refusals
            .iter()
            .flat_map(|r| r.mappings.iter().cloned())
            .collect()
    }

    /// The refusal as each mapping it takes out reports it (in its node's class row).
    pub fn by_mapping(refusals: &[Refusal]) -> Vec<KernelRefusal> {
        let mut out: Vec<KernelRefusal> = refusals
            .iter()
            .flat_map(|r| {
                r.mappings.iter().map(|m| KernelRefusal {
                    mapping: m.clone(),
                    message: format!("the kernel refused its {}: {}", r.unit, r.message),
                    link: r.link.clone(),
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

impl ApplyReport {
    /// The number of kernel mutations performed.
    pub fn mutations(&self) -> usize {
        usize::from(self.nft_changed)
            + self.links_created
            + self.links_updated
            + self.links_deleted
            + self.rules_added
            + self.rules_deleted
            + self.routes_added
            + self.routes_deleted
    }
}

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

/// The host as the agent sees it. The real implementation is [`LinuxHost`]; [`MemoryHost`]
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

/// The real host: nft and rtnetlink on the current network namespace. Both backends can be
/// swapped (`with_backends`), so the whole apply runs unprivileged over fakes in tests.
pub struct LinuxHost<N: netlink::Netlink = netlink::RtNetlink> {
    netlink: N,
    nft: nft::Nft,
    /// What the kernel holds of kuport's since the last apply: the desired state without the
    /// parts it refused. Counters are labelled and captured ports reported from it.
    applied: Option<HostState>,
    /// True when `applied` is the whole desired state (nothing refused): a pass that does not
    /// verify and wants the same skips the kernel. A flag rather than a second copy of the
    /// state, which at thousands of mappings is most of what the agent holds between passes.
    applied_in_full: bool,
    /// The mark layout whose ip rules this host owns (teardown needs it with no IR at hand).
    marks: MarkLayout,
    /// The conntrack table swept after applies; none unless given (`LinuxHost::new` gives the
    /// kernel's), so a host over fake backends never touches the real table.
    conntrack: Option<Arc<dyn conntrack::ConntrackTable>>,
    /// When a sweep is due.
    sweeper: conntrack::Sweeper,
}

impl LinuxHost {
    /// Opens a netlink connection (spawned on the current tokio runtime).
    pub fn new() -> Result<Self, HostError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(HostError::Socket)?;
        tokio::spawn(conn);
        Ok(
            Self::with_backends(netlink::RtNetlink::new(handle), nft::Nft::new())
                .with_conntrack(Arc::new(conntrack::KernelConntrack)),
        )
    }

    /// A stream of link events: any `kup-*` link, and any link named in `watch` (the underlay
    /// device), created, changed or deleted. A restarted mesh daemon deletes every link bound
    /// to its device; the agent runs a pass on these events to rebuild them at once.
    pub fn link_events(watch: Vec<String>) -> Result<mpsc::Receiver<LinkEvent>, HostError> {
        use futures_util::StreamExt;
        use netlink_packet_route::RouteNetlinkMessage;
        use netlink_packet_route::link::LinkAttribute;
        use rtnetlink::packet_core::NetlinkPayload;

        let (conn, _handle, mut messages) =
            rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Link])
                .map_err(HostError::Socket)?;
        tokio::spawn(conn);
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            while let Some((msg, _)) = messages.next().await {
                let (link, removed) = match msg.payload {
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => (l, false),
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => (l, true),
                    _ => continue,
                };
                let Some(name) = link.attributes.iter().find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                }) else {
                    continue;
                };
                if (name.starts_with(LINK_PREFIX) || watch.contains(&name))
                    && tx.send(LinkEvent { name, removed }).await.is_err()
                {
                    break;
                }
            }
        });
        Ok(rx)
    }
}

impl<N: netlink::Netlink> LinuxHost<N> {
    /// A host over the given backends, sweeping no conntrack table.
    pub fn with_backends(netlink: N, nft: nft::Nft) -> Self {
        Self {
            netlink,
            nft,
            applied: None,
            applied_in_full: false,
            marks: MarkLayout::default(),
            conntrack: None,
            sweeper: conntrack::Sweeper::default(),
        }
    }

    /// Sweeps `table` for stale entries of kuport's flows after applies (see
    /// [`conntrack`]).
    pub fn with_conntrack(mut self, table: Arc<dyn conntrack::ConntrackTable>) -> Self {
        self.conntrack = Some(table);
        self
    }

    /// Uses `marks` instead of the default mark layout.
    pub fn with_marks(mut self, marks: MarkLayout) -> Self {
        self.marks = marks;
        self
    }

    /// Deletes the conntrack entries of flows `applied` no longer translates that way, when a
    /// sweep is due. A failure is reported, never fatal: the sweep is owed to the next apply.
    async fn clear_stale_flows(
        &mut self,
        applied: &HostState,
        verify: bool,
        report: &mut ApplyReport,
    ) {
        let Some(table) = self.conntrack.clone() else {
            return;
        };
        let now = conntrack::Translations::of(applied, self.marks.mask);
        if !self.sweeper.due(&now, verify) {
            return;
        }
        let judged = now.clone();
        let sweep = tokio::task::spawn_blocking(move || conntrack::sweep(&*table, &judged))
            .await
            .unwrap_or_else(|e| conntrack::Sweep {
                error: Some(format!("the conntrack sweep failed: {e}")),
                ..conntrack::Sweep::default()
            });
        self.sweeper.record(now, &sweep);
        report.conntrack_swept = true;
        report.conntrack_cleared = sweep.cleared;
        report.conntrack_error = sweep.error;
    }

    /// After a refused transaction the kernel holds whatever table it held before, or none:
    /// every link that is up while that table holds no guard for its port is taken down. When
    /// the table cannot be read (nft cannot run at all), nothing is known to be wrong with it
    /// and the links are left as they are. Said in the log; the apply's error stands.
    async fn close_unguarded_links(&self) {
        let guarded = match self.blocking(|nft| nft.guarded_ports()).await {
            Ok(ports) => ports,
            Err(e) => {
                tracing::warn!("reading the link guard after a refused transaction: {e}");
                return;
            }
        };
        let mut report = ApplyReport::default();
        match netlink::take_down_unguarded(&self.netlink, |p| guarded.contains(&p), &mut report)
            .await
        {
            Ok(down) if down.is_empty() => {}
            Ok(down) => tracing::warn!(
                links = ?down,
                "links taken down: the nftables transaction failed and no guard covers their port"
            ),
            Err(e) => tracing::warn!("taking unguarded links down: {e}"),
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(nft::Nft) -> Result<T, HostError> + Send + 'static,
    ) -> Result<T, HostError> {
        let nft = self.nft.clone();
        tokio::task::spawn_blocking(move || f(nft))
            .await
            .map_err(|e| HostError::Nft {
                op: "run",
                detail: format!("nft task failed: {e}"),
            })?
    }
}

impl<N: netlink::Netlink> Host for LinuxHost<N> {
    async fn apply(&mut self, desired: &HostState, verify: bool) -> Result<ApplyReport, HostError> {
        if !verify && self.applied_in_full && self.applied.as_ref() == Some(desired) {
            // Nothing to send; only a sweep that failed before is owed.
            let mut report = ApplyReport::default();
            if self.sweeper.owed() {
                self.clear_stale_flows(desired, false, &mut report).await;
            }
            return Ok(report);
        }
        let mut report = ApplyReport::default();
        // A link port is open only while the kernel holds its guard. A link no longer wanted
        // goes before the transaction that may remove its port's guard.
        netlink::remove_unwanted_links(&self.netlink, &desired.links, &mut report).await?;
        // Links next, created down (a down VXLAN device holds no socket): a link failure must
        // not leave a DNAT toward a dead link, so links are known before the transaction; a
        // link the kernel refuses takes only its own rules out of this apply.
        let ensured = netlink::ensure_links(&self.netlink, &desired.links, &mut report).await;
        let mut applied = desired.clone();
        for (name, error) in ensured.failed {
            let cut = applied.without_links(std::slice::from_ref(&name));
            report.refused.push(Refusal::of_link(
                &name,
                applied.mappings_cut_by(&cut),
                error.to_string(),
            ));
            applied = cut;
        }
        let table = applied.nft.clone();
        let nft = match self.blocking(move |nft| nft.apply(&table)).await {
            Ok(nft) => nft,
            Err(e) => {
                // The new links stay down; links the kernel's remaining table no longer
                // guards (someone removed it) go down until a transaction succeeds.
                self.close_unguarded_links().await;
                return Err(e);
            }
        };
        report.nft_changed = nft.changed;
        report.nft_lines = nft.lines;
        report.nft_listed = nft.listed;
        let cut = Refusal::mappings_of(&nft.refused);
        if !cut.is_empty() {
            applied.nft = applied.nft.without_mappings(&cut);
        }
        report.refused.extend(nft.refused);
        // Guarded now: the links come up (and get their routes after).
        netlink::bring_up(
            &self.netlink,
            &applied.links,
            &ensured.readdressed,
            &mut report,
        )
        .await?;
        netlink::reconcile_rules(&self.netlink, &applied.rules, self.marks, &mut report).await?;
        netlink::reconcile_routes(&self.netlink, &applied.routes, &mut report).await?;
        // What is left of a link the kernel refused halfway.
        netlink::remove_unwanted_links(&self.netlink, &applied.links, &mut report).await?;
        netlink::ensure_valid_mark(&self.netlink, &applied.valid_mark_interfaces, &mut report)
            .await?;
        // A refusal is not remembered as applied: the next pass tries the refused parts again.
        self.applied_in_full = report.refused.is_empty();
        // Last: a flow's next packet must meet the whole new datapath.
        self.clear_stale_flows(&applied, verify, &mut report).await;
        self.applied = Some(applied);
        Ok(report)
    }

    async fn teardown(&mut self) -> Result<(), HostError> {
        let mut report = ApplyReport::default();
        // Links before the table: no link outlives its guard.
        netlink::remove_unwanted_links(&self.netlink, &[], &mut report).await?;
        self.blocking(|nft| nft.teardown()).await?;
        netlink::reconcile_rules(&self.netlink, &[], self.marks, &mut report).await?;
        netlink::reconcile_routes(&self.netlink, &[], &mut report).await?;
        self.applied = None;
        self.applied_in_full = false;
        // With nothing translated any more, every flow still carrying kuport's mark is stale.
        self.clear_stale_flows(&HostState::default(), true, &mut report)
            .await;
        if let Some(error) = report.conntrack_error {
            tracing::warn!("after removing kuport's datapath: {error}");
        }
        Ok(())
    }

    async fn facts(&self, query: &FactsQuery) -> Result<HostFacts, HostError> {
        let mut facts = netlink::facts(
            &self.netlink,
            &query.interfaces,
            query.internal_ip,
            query.marks,
        )
        .await?;
        // /proc/self/net: the tables of this process's network namespace (the node's, for a
        // hostNetwork pod), whatever /proc/net points at.
        facts.sockets = sockets::read(std::path::Path::new("/proc/self/net"))?;
        sockets::name_agent_sockets(&mut facts.sockets, &query.agent_ports);
        facts.firewall_warnings = self.blocking(|nft| nft.firewall_warnings()).await?;
        facts.programmed_ports = self
            .applied
            .as_ref()
            .map(HostState::accepting_ports)
            .unwrap_or_default();
        Ok(facts)
    }

    async fn counters(&self) -> Result<Vec<MappingCounter>, HostError> {
        let readings = self.blocking(|nft| nft.counters()).await?;
        Ok(label_counters(self.applied.as_ref(), &readings))
    }
}

/// Names counter readings after the mappings of the last applied IR (a long name is cut with a
/// hash, so the name alone cannot be split back).
pub fn label_counters(
    state: Option<&HostState>,
    readings: &[nft::CounterReading],
) -> Vec<MappingCounter> {
    let Some(state) = state else {
        return Vec::new();
    };
    state
        .nft
        .counters
        .iter()
        // The link guard's counter belongs to no mapping.
        .filter(|c| c.chain != ChainId::Guard)
        .filter_map(|c| {
            let r = readings.iter().find(|r| r.name == c.name)?;
            Some(MappingCounter {
                namespace: c.namespace.clone(),
                name: c.mapping.clone(),
                chain: c.chain,
                packets: r.packets,
                bytes: r.bytes,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_their_stage_by_what_failed_not_by_their_text() {
        let missing = |stage| HostError::Missing {
            stage,
            what: "link kup-x: device wt0 not present".into(),
        };
        // A missing device while writing routes is a routes failure, whatever the text says.
        assert_eq!(missing(HostStage::Routes).stage(), HostStage::Routes);
        assert_eq!(missing(HostStage::Links).stage(), HostStage::Links);
        let nft = HostError::Nft {
            op: "apply transaction",
            detail: "ip rule".into(),
        };
        assert_eq!(nft.stage(), HostStage::Nftables);
        let held = HostError::VniHeld {
            link: "kup-x".into(),
            vni: 4242,
            port: 4790,
            holder: "squat".into(),
        };
        assert_eq!(held.stage(), HostStage::Links);
        let facts = HostError::Facts {
            detail: "reading /proc/self/net/tcp".into(),
        };
        assert_eq!(facts.stage(), HostStage::Facts);
    }
}
