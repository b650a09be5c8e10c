//! The real host: an apply in the order the kernel needs it (links down, one nftables
//! transaction, links up, ip rules, routes, then asking for the conntrack sweep, which runs on
//! a thread of its own), over the netlink and nft backends.

use std::sync::Arc;

use kuport_core::ir::{ChainId, Family, HostState, MarkLayout, NftTable};
use kuport_core::snapshot::HostFacts;
use tokio::sync::mpsc;

use crate::error::HostError;
use crate::host::{FactsQuery, Host, HostEvent, MappingCounter};
use crate::report::{ApplyReport, Refusal};
use crate::{conntrack, netlink, nft, nft_events, node_checks, sockets};

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
    /// The conntrack table swept after applies, and the thread sweeping it; none unless given
    /// (`LinuxHost::new` gives the kernel's), so a host over fake backends never touches the
    /// real table.
    sweeps: Option<Sweeps>,
    /// When a sweep is due.
    sweeper: conntrack::Sweeper,
    /// Told how each sweep ended.
    observer: Option<conntrack::SweepObserver>,
    /// The netlink port of the connection this host changes the kernel through.
    own_port: Option<u32>,
}

impl LinuxHost {
    /// Opens a netlink connection (spawned on the current tokio runtime). Its socket is bound
    /// here, so its port is known: the kernel stamps the notifications of the changes this
    /// host makes with it, and [`HostEvents`] leaves them out.
    pub fn new() -> Result<Self, HostError> {
        use netlink_sys::AsyncSocket;
        let (mut conn, handle, _) = rtnetlink::new_connection().map_err(HostError::Socket)?;
        let own = conn
            .socket_mut()
            .socket_mut()
            .bind_auto()
            .map_err(HostError::Socket)?;
        tokio::spawn(conn);
        let mut host = Self::with_backends(netlink::RtNetlink::new(handle), nft::Nft::new())
            .with_conntrack(Arc::new(conntrack::KernelConntrack));
        host.own_port = Some(own.port_number());
        Ok(host)
    }
}

/// The conntrack table a host sweeps, and its sweeping thread.
struct Sweeps {
    table: Arc<dyn conntrack::ConntrackTable>,
    worker: conntrack::SweepWorker,
}

/// Opens the host's event streams for the agent (see [`HostEvents::open`]); taken from the
/// host before the agent owns it, so it knows the host's own netlink port and `nft` processes.
#[derive(Clone, Debug)]
pub struct HostEvents {
    own_port: Option<u32>,
    marks: MarkLayout,
    committers: Arc<nft_events::Committers>,
}

impl HostEvents {
    /// One stream of the host events the agent answers with a verifying pass: any change to a
    /// `kup-*` link or to a link named in `underlay` (a restarted mesh daemon deletes every
    /// link bound to its device); a change by another program to one of kuport's ip rules, a
    /// route in kuport's tables or an address (IPv4 or IPv6) of a `kup-*` link (rtnetlink,
    /// `netlink/events.rs`); a commit by another program touching `table ip kuport` or
    /// `table ip6 kuport` (`nft_events.rs`); a write of a sysctl a node check reads
    /// (`netlink/netconf.rs`); and [`crate::HostEventKind::Lost`] when a socket overflowed. The
    /// stream closes when the rtnetlink socket fails; when the nftables or the netconf one
    /// cannot be opened, the others' events still come and what it would have announced is
    /// read at each resync only (said in the log).
    pub fn open(&self, underlay: Vec<String>) -> Result<mpsc::Receiver<HostEvent>, HostError> {
        use futures_util::StreamExt;
        use rtnetlink::MulticastGroup;

        let (conn, handle, mut messages) = rtnetlink::new_multicast_connection(&[
            MulticastGroup::Link,
            MulticastGroup::Ipv4Ifaddr,
            MulticastGroup::Ipv6Ifaddr,
            MulticastGroup::Ipv4Route,
            MulticastGroup::Ipv4Rule,
            MulticastGroup::Ipv6Route,
            MulticastGroup::Ipv6Rule,
        ])
        .map_err(HostError::Socket)?;
        tokio::spawn(conn);
        let filter = netlink::events::EventFilter {
            own_port: self.own_port,
            underlay,
            marks: self.marks,
        };
        let mut tables = match nft_events::watch(self.committers.clone()) {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(
                    "watching nftables events: {e}; a change to table ip kuport by another program is repaired at the next resync"
                );
                None
            }
        };
        let mut sysctls = match netlink::netconf::watch() {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(
                    "watching netconf events: {e}; a changed forwarding or rp_filter sysctl is seen at the next resync"
                );
                None
            }
        };
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            // Subscribed first, dumped second: a link made in between is in both, and the
            // notifications queued meanwhile are applied after the dump, in order.
            let mut links = match kup_links(&handle).await {
                Ok(links) => links,
                Err(e) => {
                    tracing::warn!(
                        "listing links: {e}; a change to an IPv6 address of a kup-* link that exists now is repaired at the next resync"
                    );
                    netlink::events::LinkNames::default()
                }
            };
            loop {
                let event = tokio::select! {
                    msg = messages.next() => match msg {
                        Some((msg, _)) => netlink::events::classify(&filter, &mut links, &msg),
                        None => return,
                    },
                    Some(event) = next_of(&mut tables) => Some(event),
                    Some(news) = next_netconf(&mut sysctls) => sysctl_event(&news, &links),
                };
                if let Some(event) = event
                    && tx.send(event).await.is_err()
                {
                    return;
                }
            }
        });
        Ok(rx)
    }
}

/// The `kup-*` links the kernel has now, by index.
async fn kup_links(
    handle: &rtnetlink::Handle,
) -> Result<netlink::events::LinkNames, rtnetlink::Error> {
    use futures_util::TryStreamExt;
    let mut links = netlink::events::LinkNames::default();
    let mut dump = handle.link().get().execute();
    while let Some(link) = dump.try_next().await? {
        links.observe(&link, false);
    }
    Ok(links)
}

/// The next news of the netconf stream, if it is open; a stream that ended is dropped (and
/// never ready).
async fn next_netconf(
    stream: &mut Option<mpsc::Receiver<netlink::netconf::News>>,
) -> Option<netlink::netconf::News> {
    let next = match stream.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    };
    if next.is_none() {
        tracing::warn!(
            "the netconf event stream ended; a changed forwarding or rp_filter sysctl is seen at the next resync"
        );
        *stream = None;
    }
    next
}

/// The one host event a datagram of netconf news makes, if any: its first announcement that
/// counts (a forwarding write announces every device at once; one pass reads them all).
fn sysctl_event(
    news: &netlink::netconf::News,
    links: &netlink::events::LinkNames,
) -> Option<HostEvent> {
    use netlink::netconf::News;
    match news {
        News::Lost => Some(HostEvent {
            kind: crate::HostEventKind::Lost,
            what: "netconf events (the socket's buffer overflowed)".to_owned(),
            removed: false,
        }),
        News::Announced(found) => found
            .iter()
            .find_map(|n| netlink::netconf::classify(n, links)),
    }
}

/// The next event of an optional stream; a stream that ended is dropped (and never ready).
async fn next_of(stream: &mut Option<mpsc::Receiver<HostEvent>>) -> Option<HostEvent> {
    let next = match stream.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    };
    if next.is_none() {
        tracing::warn!(
            "the nftables event stream ended; a change to table ip kuport by another program is repaired at the next resync"
        );
        *stream = None;
    }
    next
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
            sweeps: None,
            sweeper: conntrack::Sweeper::default(),
            observer: None,
            own_port: None,
        }
    }

    /// What opens this host's event streams (see [`HostEvents::open`]).
    pub fn events(&self) -> HostEvents {
        HostEvents {
            own_port: self.own_port,
            marks: self.marks,
            committers: self.nft.committers(),
        }
    }

    /// Sweeps `table` for stale entries of kuport's flows after applies (see
    /// [`conntrack`]), on a thread of its own.
    pub fn with_conntrack(mut self, table: Arc<dyn conntrack::ConntrackTable>) -> Self {
        let worker = conntrack::SweepWorker::new(table.clone());
        if let Some(observer) = &self.observer {
            worker.observe(observer.clone());
        }
        self.sweeps = Some(Sweeps { table, worker });
        self
    }

    /// Uses `marks` instead of the default mark layout.
    pub fn with_marks(mut self, marks: MarkLayout) -> Self {
        self.marks = marks;
        self
    }

    /// Waits (off the async workers) until no sweep runs, none is asked for and no failed one
    /// waits to run again, or `timeout` passed; true when idle, and for a host that sweeps
    /// nothing. A process that applies and exits (a test, a bench) waits for its sweep.
    pub async fn wait_for_sweeps(&self, timeout: std::time::Duration) -> bool {
        let Some(sweeps) = &self.sweeps else {
            return true;
        };
        let idle = sweeps.worker.idle();
        tokio::task::spawn_blocking(move || idle.wait(timeout))
            .await
            .unwrap_or(false)
    }

    /// Asks the sweeping thread to delete the conntrack entries of flows `applied` no longer
    /// translates that way, when a sweep is due; returns at once. A thread that cannot be
    /// started is said in the log, and asked again at the next apply.
    fn ask_for_sweep(&mut self, applied: &HostState, verify: bool, report: &mut ApplyReport) {
        let Some(sweeps) = &mut self.sweeps else {
            return;
        };
        let now = conntrack::Translations::of(applied, self.marks.mask);
        if !self.sweeper.due(&now, verify) {
            return;
        }
        match sweeps.worker.request(Arc::new(now.clone())) {
            Ok(()) => {
                self.sweeper.asked(now);
                report.conntrack_sweep_asked = true;
            }
            Err(e) => tracing::warn!("{e}; the next apply tries again"),
        }
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
            // Nothing to send (a failed sweep is the sweeping thread's to retry).
            return Ok(ApplyReport::default());
        }
        // No entry is deleted while the datapath changes: the sweep waits for this apply's
        // translations before its next batch (dropped on every return).
        let _hold = self.sweeps.as_ref().map(|s| s.worker.hold());
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
        for family in Family::ALL {
            let table = applied.table(family).clone();
            let nft = match self
                .blocking(move |nft| nft.sibling(family).apply(&table))
                .await
            {
                Ok(nft) => nft,
                Err(e) => {
                    // The new links stay down; links the kernel's remaining table no longer
                    // guards (someone removed it) go down until a transaction succeeds.
                    self.close_unguarded_links().await;
                    return Err(e);
                }
            };
            report.nft_changed |= nft.changed;
            report.nft_lines += nft.lines;
            report.nft_listed |= nft.listed;
            let cut = Refusal::mappings_of(&nft.refused);
            if !cut.is_empty() {
                let table = applied.table_mut(family);
                *table = table.without_mappings(&cut);
            }
            report.refused.extend(nft.refused);
        }
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
        self.ask_for_sweep(&applied, verify, &mut report);
        self.applied = Some(applied);
        Ok(report)
    }

    async fn teardown(&mut self) -> Result<(), HostError> {
        let mut report = ApplyReport::default();
        // Links before the table: no link outlives its guard.
        netlink::remove_unwanted_links(&self.netlink, &[], &mut report).await?;
        for family in Family::ALL {
            self.blocking(move |nft| nft.sibling(family).teardown())
                .await?;
        }
        netlink::reconcile_rules(&self.netlink, &[], self.marks, &mut report).await?;
        netlink::reconcile_routes(&self.netlink, &[], &mut report).await?;
        self.applied = None;
        self.applied_in_full = false;
        // With nothing translated any more, every flow still carrying kuport's mark is stale.
        // Swept here, to its end, before the process goes: the thread's sweep (stopped, its
        // worker replaced by an idle one for a later apply) judged by rules that are gone.
        self.sweeper = conntrack::Sweeper::default();
        if let Some(sweeps) = &mut self.sweeps {
            let table = sweeps.table.clone();
            let fresh = conntrack::SweepWorker::new(table.clone());
            if let Some(observer) = &self.observer {
                fresh.observe(observer.clone());
            }
            drop(std::mem::replace(&mut sweeps.worker, fresh));
            let none = conntrack::Translations::of(&HostState::default(), self.marks.mask);
            let swept = tokio::task::spawn_blocking(move || conntrack::sweep(&*table, &none))
                .await
                .map_err(|e| format!("the conntrack sweep failed: {e}"))
                .and_then(|s| s.error.map_or(Ok(()), Err));
            if let Err(error) = swept {
                tracing::warn!("after removing kuport's datapath: {error}");
            }
        }
        Ok(())
    }

    fn observe_sweeps(&mut self, observer: conntrack::SweepObserver) {
        if let Some(sweeps) = &self.sweeps {
            sweeps.worker.observe(observer.clone());
        }
        self.observer = Some(observer);
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
        // The links and capturing interfaces of the last apply: what kuport set and expects to
        // stay set.
        let (links, capturing): (Vec<String>, Vec<String>) =
            self.applied.as_ref().map_or_else(Default::default, |a| {
                (
                    a.links.iter().map(|l| l.name.clone()).collect(),
                    a.valid_mark_interfaces.clone(),
                )
            });
        let serves_ipv6 = self.applied.as_ref().is_some_and(|a| !a.nft6.is_empty());
        facts.node_checks.extend(node_checks::sysctl_checks(
            std::path::Path::new(node_checks::PROC_SYS),
            &links,
            &capturing,
            serves_ipv6,
        ));
        facts.node_checks.sort();
        Ok(facts)
    }

    async fn counters(&self) -> Result<Vec<MappingCounter>, HostError> {
        let mut out = Vec::new();
        for family in Family::ALL {
            let wanted = self
                .applied
                .as_ref()
                .is_some_and(|a| !a.table(family).counters.is_empty());
            if !wanted {
                continue;
            }
            let readings = self
                .blocking(move |nft| nft.sibling(family).counters())
                .await?;
            out.extend(label_counters(
                self.applied.as_ref().map(|a| a.table(family)),
                &readings,
            ));
        }
        Ok(sum_families(out))
    }
}

/// One reading per mapping and chain: a mapping served over both families counts in both
/// tables, and its metrics are the sum.
fn sum_families(readings: Vec<MappingCounter>) -> Vec<MappingCounter> {
    let mut summed: std::collections::BTreeMap<(String, String, ChainId), MappingCounter> =
        std::collections::BTreeMap::new();
    for r in readings {
        let key = (r.namespace.clone(), r.name.clone(), r.chain);
        match summed.get_mut(&key) {
            Some(s) => {
                s.packets += r.packets;
                s.bytes += r.bytes;
            }
            None => {
                summed.insert(key, r);
            }
        }
    }
    summed.into_values().collect()
}

/// Names counter readings after the mappings of the last applied IR (a long name is cut with a
/// hash, so the name alone cannot be split back).
pub fn label_counters(
    table: Option<&NftTable>,
    readings: &[nft::CounterReading],
) -> Vec<MappingCounter> {
    let Some(table) = table else {
        return Vec::new();
    };
    table
        .counters
        .iter()
        // The link guard's counter belongs to no mapping.
        .filter(|c| c.chain != ChainId::Guard)
        .filter_map(|c| {
            let r = readings.iter().find(|r| r.name == c.name)?;
            Some(MappingCounter {
                namespace: c.namespace.to_string(),
                name: c.mapping.to_string(),
                chain: c.chain,
                packets: r.packets,
                bytes: r.bytes,
            })
        })
        .collect()
}
