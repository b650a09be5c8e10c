//! The agent's Prometheus metrics (OpenMetrics text on `/metrics`).
//!
//! Label values are fixed strings chosen by the agent (stages, kinds, results, condition
//! reasons) or object names; error text never becomes a label, so the series stay bounded.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use kuport_core::api::conditions;
use kuport_core::plan::Plan;
use kuport_host::{HostEventKind, MappingCounter};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Where a pass failed; also the `stage` label of `kuport_pass_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Reading the host facts.
    Facts,
    /// Computing the plan.
    Plan,
    /// The nftables transaction.
    Nftables,
    /// VXLAN links.
    Links,
    /// ip rules.
    Rules,
    /// Routes.
    Routes,
    /// Status writes.
    Status,
}

impl Stage {
    /// Every stage, in pass order (what `/metrics` lists even before a failure).
    pub const ALL: [Stage; 7] = [
        Stage::Facts,
        Stage::Plan,
        Stage::Nftables,
        Stage::Links,
        Stage::Rules,
        Stage::Routes,
        Stage::Status,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Facts => "facts",
            Stage::Plan => "plan",
            Stage::Nftables => "nftables",
            Stage::Links => "links",
            Stage::Rules => "rules",
            Stage::Routes => "routes",
            Stage::Status => "status",
        }
    }
}

/// Which kind of object a status write was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// A PortMap's status.
    PortMap,
    /// A PortMapClass's status (claims, GC, Ready, summary).
    Class,
    /// This node's PortMapNode (its rows).
    Node,
}

impl WriteKind {
    fn as_str(self) -> &'static str {
        match self {
            WriteKind::PortMap => "portmap",
            WriteKind::Class => "portmapclass",
            WriteKind::Node => "portmapnode",
        }
    }
}

/// How one status write attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteResult {
    /// The API server accepted it.
    Written,
    /// 409: the object changed since it was read.
    Conflict,
    /// Any other error.
    Failed,
    /// Not sent: the object had spent its write budget; held for a pass when it is there.
    Deferred,
}

impl WriteResult {
    fn as_str(self) -> &'static str {
        match self {
            WriteResult::Written => "written",
            WriteResult::Conflict => "conflict",
            WriteResult::Failed => "failed",
            WriteResult::Deferred => "deferred",
        }
    }
}

type Labels = Vec<(&'static str, String)>;

/// Every series the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pass_duration: Histogram,
    passes: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    mappings: Family<Labels, Gauge>,
    links: Gauge,
    refusals: Gauge,
    status_writes: Family<Labels, Counter>,
    refusals_of_writes: Family<Labels, Counter>,
    conflicts: Family<Labels, Counter>,
    last_success: Gauge<f64, AtomicU64>,
    events: Family<Labels, Counter>,
    watch_events: Family<Labels, Counter>,
    slices_kept: Gauge,
    services_followed: Gauge,
    slice_fetches: Family<Labels, Counter>,
    host_events: Family<Labels, Counter>,
    conntrack_sweeps: Family<Labels, Counter>,
    conntrack_cleared: Counter,
    link_up: Family<Labels, Gauge>,
    link_rtt: Family<Labels, Gauge<f64, AtomicU64>>,
    mapping_counters: Arc<MappingCounters>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every series registered, each with its help text, in the order
    /// `/metrics` shows them.
    // Long: the list of series, one registration each; split, the order `/metrics` shows and
    // the help texts side by side would scatter.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kuport");
        // 1 ms .. ~16 s: a pass is a plan plus a few API calls.
        let pass_duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register_with_unit(
            "pass_duration",
            "Duration of one pass (snapshot, facts, plan, apply, status writes)",
            prometheus_client::registry::Unit::Seconds,
            pass_duration.clone(),
        );
        let passes = Family::<Labels, Counter>::default();
        registry.register(
            "passes",
            "Passes run, by result (ok, failed, or superseded: a newer pass took over its status writes)",
            passes.clone(),
        );
        let failures = Family::<Labels, Counter>::default();
        registry.register(
            "pass_failures",
            "Failed passes, by the stage that failed",
            failures.clone(),
        );
        let mappings = Family::<Labels, Gauge>::default();
        registry.register(
            "mappings",
            "PortMaps by condition (Accepted, Programmed) and reason, as this node's plan decides",
            mappings.clone(),
        );
        let links = Gauge::default();
        registry.register(
            "links_programmed",
            "Return links in this node's applied state",
            links.clone(),
        );
        let refusals = Gauge::default();
        registry.register(
            "host_refusals",
            "Parts of the datapath this node's kernel refused in the last apply (each takes out only the mappings that use it; status names them)",
            refusals.clone(),
        );
        let status_writes = Family::<Labels, Counter>::default();
        registry.register(
            "status_writes",
            "Status write attempts, by kind (portmap, portmapclass) and result (written, conflict, failed, deferred: held, its object over its write budget)",
            status_writes.clone(),
        );
        let refusals_of_writes = Family::<Labels, Counter>::default();
        registry.register(
            "status_write_refusals",
            "Status writes the API server refused (each also counted as failed), by kind and reason (invalid: the CRD's validation; admission: a policy or webhook; forbidden: RBAC or a 403)",
            refusals_of_writes.clone(),
        );
        let conflicts = Family::<Labels, Counter>::default();
        registry.register(
            "status_conflict_retries",
            "Status writes retried after a 409 Conflict, by kind",
            conflicts.clone(),
        );
        let last_success = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "last_successful_pass_timestamp",
            "Unix time of the last pass that completed without failure",
            prometheus_client::registry::Unit::Seconds,
            last_success.clone(),
        );
        let events = Family::<Labels, Counter>::default();
        registry.register(
            "events",
            "Kubernetes Events, by result (published: a new Event; aggregated: a repeat counted on one; dropped: not published, its tenant over its share; failed: the API server refused it or did not answer)",
            events.clone(),
        );
        let watch_events = Family::<Labels, Counter>::default();
        registry.register(
            "watch_events",
            "Watch events, by kind and result (pass: it can change a pass and marks the node dirty; ignored: it changes nothing a pass reads)",
            watch_events.clone(),
        );
        let slices_kept = Gauge::default();
        registry.register(
            "endpoint_slices_kept",
            "EndpointSlices the agent keeps: those of the Services some PortMap refers to (it keeps nothing of any other)",
            slices_kept.clone(),
        );
        let services_followed = Gauge::default();
        registry.register(
            "services_followed",
            "Services some PortMap refers to, whose EndpointSlices the agent keeps",
            services_followed.clone(),
        );
        let slice_fetches = Family::<Labels, Counter>::default();
        registry.register(
            "endpoint_slice_fetches",
            "Lists of one Service's EndpointSlices, made when a PortMap comes to refer to the Service, by result (ok, failed)",
            slice_fetches.clone(),
        );
        let host_events = Family::<Labels, Counter>::default();
        registry.register(
            "host_events",
            "Changes on the host the agent did not make to state it owns, by kind (link: a kup- link or the underlay device, by anyone; rule, route, address, nftables: by another program; lost: events may have been missed); each is answered by a pass that compares with the kernel",
            host_events.clone(),
        );
        let conntrack_sweeps = Family::<Labels, Counter>::default();
        registry.register(
            "conntrack_sweeps",
            "Sweeps of the conntrack table for stale entries of kuport's flows (after an apply that changed what the node translates, on a verifying pass, or to retry), by result (ok, failed)",
            conntrack_sweeps.clone(),
        );
        let conntrack_cleared = Counter::default();
        registry.register(
            "conntrack_entries_cleared",
            "Conntrack entries deleted because their flow was no longer translated as the node programs it (mapping deleted, endpoint moved, link gone, or a flow that arrived before its mapping)",
            conntrack_cleared.clone(),
        );
        let link_up = Family::<Labels, Gauge>::default();
        registry.register(
            "link_up",
            "Return links of this node by class and peer: 1 while its probes across the link are answered, 0 once they found it down (absent before the first verdict)",
            link_up.clone(),
        );
        let link_rtt = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "link_rtt",
            "Median round trip of the last probes across each return link, by class and peer",
            prometheus_client::registry::Unit::Seconds,
            link_rtt.clone(),
        );
        let mapping_counters = Arc::new(MappingCounters::default());
        registry.register_collector(Box::new(mapping_counters.clone()));
        let metrics = Self {
            registry,
            pass_duration,
            passes,
            failures,
            mappings,
            links,
            refusals,
            status_writes,
            refusals_of_writes,
            conflicts,
            last_success,
            events,
            watch_events,
            slices_kept,
            services_followed,
            slice_fetches,
            host_events,
            conntrack_sweeps,
            conntrack_cleared,
            link_up,
            link_rtt,
            mapping_counters,
        };
        metrics.create_labelled_series();
        metrics
    }

    /// The verdicts of the probes across this node's links, replacing the last ones (a link
    /// gone takes its series with it).
    pub fn set_link_probes(&self, probes: &[kuport_core::snapshot::LinkProbe]) {
        self.link_up.clear();
        self.link_rtt.clear();
        for p in probes {
            let labels = vec![("class", p.class.clone()), ("peer", p.peer.clone())];
            if let Some(up) = p.up {
                self.link_up.get_or_create(&labels).set(i64::from(up));
            }
            if let Some(rtt) = p.rtt_microseconds {
                self.link_rtt
                    .get_or_create(&labels)
                    .set(f64::from(rtt) / 1_000_000.0);
            }
        }
    }

    /// Creates the labelled series up front, so a scrape shows zeros rather than nothing.
    fn create_labelled_series(&self) {
        for stage in Stage::ALL {
            let _ = self.failures.get_or_create(&stage_labels(stage));
        }
        for result in ["ok", "failed", "superseded"] {
            let _ = self.passes.get_or_create(&result_labels(result));
        }
        for result in ["ok", "failed"] {
            let _ = self.conntrack_sweeps.get_or_create(&result_labels(result));
            let _ = self.slice_fetches.get_or_create(&result_labels(result));
        }
        for kind in HostEventKind::ALL {
            let _ = self.host_events.get_or_create(&host_event_labels(kind));
        }
        for kind in [WriteKind::PortMap, WriteKind::Class, WriteKind::Node] {
            for result in [
                WriteResult::Written,
                WriteResult::Conflict,
                WriteResult::Failed,
                WriteResult::Deferred,
            ] {
                let _ = self
                    .status_writes
                    .get_or_create(&write_labels(kind, result));
            }
            let _ = self.conflicts.get_or_create(&kind_labels(kind));
        }
    }

    /// The OpenMetrics text of every series.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    pub(crate) fn observe_pass(&self, seconds: f64, failed: Option<Stage>, now_unix: f64) {
        self.pass_duration.observe(seconds);
        match failed {
            None => {
                self.passes.get_or_create(&result_labels("ok")).inc();
                self.last_success.set(now_unix);
            }
            Some(stage) => {
                self.passes.get_or_create(&result_labels("failed")).inc();
                self.failures.get_or_create(&stage_labels(stage)).inc();
            }
        }
    }

    /// A pass whose status writes a newer pass took over before they finished, none failing:
    /// it neither failed nor completed, so the last successful pass stays as it was.
    pub(crate) fn observe_superseded(&self, seconds: f64) {
        self.pass_duration.observe(seconds);
        self.passes
            .get_or_create(&result_labels("superseded"))
            .inc();
    }

    pub(crate) fn record_plan(&self, plan: &Plan) {
        // Rebuilt from scratch: a reason no mapping has any more must disappear, not stay at
        // its last count.
        self.mappings.clear();
        for d in &plan.portmaps {
            self.mappings
                .get_or_create(&vec![
                    ("condition", conditions::ACCEPTED.to_owned()),
                    ("reason", d.accepted.reason.as_str().to_owned()),
                ])
                .inc();
            if let Some(p) = &d.programmed {
                self.mappings
                    .get_or_create(&vec![
                        ("condition", conditions::PROGRAMMED.to_owned()),
                        ("reason", p.reason.as_str().to_owned()),
                    ])
                    .inc();
            }
        }
        self.links
            .set(i64::try_from(plan.host_state.links.len()).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_refusals(&self, count: usize) {
        self.refusals.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub(crate) fn record_write(&self, kind: WriteKind, result: WriteResult) {
        self.status_writes
            .get_or_create(&write_labels(kind, result))
            .inc();
        if result == WriteResult::Conflict {
            self.conflicts.get_or_create(&kind_labels(kind)).inc();
        }
    }

    /// A status write of `kind` the API server refused, for `reason` (a fixed word:
    /// `refusal::refusal_reason`).
    pub(crate) fn record_refusal(&self, kind: WriteKind, reason: &'static str) {
        self.refusals_of_writes
            .get_or_create(&refusal_labels(kind, reason))
            .inc();
    }

    /// Status writes of `kind` refused for `reason`.
    pub fn status_write_refusals(&self, kind: WriteKind, reason: &'static str) -> u64 {
        self.refusals_of_writes
            .get_or_create(&refusal_labels(kind, reason))
            .get()
    }

    pub(crate) fn record_event(&self, result: &'static str) {
        self.events
            .get_or_create(&vec![("result", result.to_owned())])
            .inc();
    }

    pub(crate) fn record_watch_event(&self, kind: &str, passes: bool) {
        self.watch_events
            .get_or_create(&watch_labels(kind, passes))
            .inc();
    }

    /// The EndpointSlices kept, and the Services they are kept for.
    pub(crate) fn set_slices_kept(&self, slices: usize, services: usize) {
        self.slices_kept
            .set(i64::try_from(slices).unwrap_or(i64::MAX));
        self.services_followed
            .set(i64::try_from(services).unwrap_or(i64::MAX));
    }

    /// One Service's EndpointSlices listed, or not.
    pub(crate) fn record_slice_fetch(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.slice_fetches
            .get_or_create(&result_labels(result))
            .inc();
    }

    /// The EndpointSlices the agent keeps.
    pub fn endpoint_slices_kept(&self) -> u64 {
        u64::try_from(self.slices_kept.get()).unwrap_or(0)
    }

    /// Lists of one Service's EndpointSlices that ended `ok` or not.
    pub fn endpoint_slice_fetches(&self, ok: bool) -> u64 {
        let result = if ok { "ok" } else { "failed" };
        self.slice_fetches
            .get_or_create(&result_labels(result))
            .get()
    }

    /// A host event of `kind` reached the agent.
    pub(crate) fn record_host_event(&self, kind: HostEventKind) {
        self.host_events
            .get_or_create(&host_event_labels(kind))
            .inc();
    }

    /// A sweep of the conntrack table that deleted `cleared` entries, failing or not.
    pub(crate) fn record_conntrack_sweep(&self, cleared: usize, failed: bool) {
        let result = if failed { "failed" } else { "ok" };
        self.conntrack_sweeps
            .get_or_create(&result_labels(result))
            .inc();
        self.conntrack_cleared
            .inc_by(u64::try_from(cleared).unwrap_or(u64::MAX));
    }

    /// Conntrack entries of stale kuport flows deleted so far.
    pub fn conntrack_entries_cleared(&self) -> u64 {
        self.conntrack_cleared.get()
    }

    pub(crate) fn set_mapping_counters(&self, counters: Vec<MappingCounter>) {
        self.mapping_counters.set(counters);
    }

    /// Status writes the API server accepted, of every kind.
    pub fn status_writes_written(&self) -> u64 {
        [WriteKind::PortMap, WriteKind::Class, WriteKind::Node]
            .into_iter()
            .map(|k| self.status_writes_of(k, WriteResult::Written))
            .sum()
    }

    /// Status write attempts of one kind that ended one way.
    pub fn status_writes_of(&self, kind: WriteKind, result: WriteResult) -> u64 {
        self.status_writes
            .get_or_create(&write_labels(kind, result))
            .get()
    }

    /// Passes that completed without failure.
    pub fn passes_ok(&self) -> u64 {
        self.passes.get_or_create(&result_labels("ok")).get()
    }

    /// Passes that failed.
    pub fn passes_failed(&self) -> u64 {
        self.passes.get_or_create(&result_labels("failed")).get()
    }

    /// Passes whose status writes a newer pass took over.
    pub fn passes_superseded(&self) -> u64 {
        self.passes
            .get_or_create(&result_labels("superseded"))
            .get()
    }

    /// Watch events of `kind` (`PortMap`, `Node`, ...) that marked the node dirty (`passes`)
    /// or changed nothing a pass reads.
    pub fn watch_events(&self, kind: &str, passes: bool) -> u64 {
        self.watch_events
            .get_or_create(&watch_labels(kind, passes))
            .get()
    }

    /// Host events of `kind` that reached the agent.
    pub fn host_events(&self, kind: HostEventKind) -> u64 {
        self.host_events
            .get_or_create(&host_event_labels(kind))
            .get()
    }

    /// Events handed to the API server.
    pub fn events_published(&self) -> u64 {
        self.events
            .get_or_create(&vec![("result", "published".to_owned())])
            .get()
    }
}

fn stage_labels(stage: Stage) -> Labels {
    vec![("stage", stage.as_str().to_owned())]
}

fn result_labels(result: &str) -> Labels {
    vec![("result", result.to_owned())]
}

fn watch_labels(kind: &str, passes: bool) -> Labels {
    vec![
        ("kind", kind.to_owned()),
        ("result", if passes { "pass" } else { "ignored" }.to_owned()),
    ]
}

fn host_event_labels(kind: HostEventKind) -> Labels {
    vec![("kind", kind.as_str().to_owned())]
}

fn kind_labels(kind: WriteKind) -> Labels {
    vec![("kind", kind.as_str().to_owned())]
}

fn refusal_labels(kind: WriteKind, reason: &'static str) -> Labels {
    vec![
        ("kind", kind.as_str().to_owned()),
        ("reason", reason.to_owned()),
    ]
}

fn write_labels(kind: WriteKind, result: WriteResult) -> Labels {
    vec![
        ("kind", kind.as_str().to_owned()),
        ("result", result.as_str().to_owned()),
    ]
}

/// Per-mapping packets and bytes, read from kuport's own nft counters each pass. They are the
/// kernel's counters, so they are exported as counters with the kernel's values rather than
/// incremented here; a mapping that is gone disappears from the next scrape.
#[derive(Debug, Default)]
struct MappingCounters {
    latest: Mutex<Vec<MappingCounter>>,
}

impl MappingCounters {
    fn set(&self, mut counters: Vec<MappingCounter>) {
        // Sorted, so a scrape lists the series in a stable order.
        counters.sort_by(|a, b| {
            (&a.namespace, &a.name, a.chain).cmp(&(&b.namespace, &b.name, b.chain))
        });
        *self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = counters;
    }
}

impl Collector for MappingCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let latest = self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        type Pick = fn(&MappingCounter) -> u64;
        let series: [(&str, &str, Pick); 2] = [
            (
                "mapping_packets",
                "Packets matched by a mapping's rules in one chain (kuport's nft counters)",
                |c| c.packets,
            ),
            (
                "mapping_bytes",
                "Bytes matched by a mapping's rules in one chain (kuport's nft counters)",
                |c| c.bytes,
            ),
        ];
        for (name, help, pick) in series {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for c in &latest {
                let labels = [
                    ("namespace", c.namespace.as_str()),
                    ("name", c.name.as_str()),
                    ("chain", c.chain.label()),
                ];
                ConstCounter::new(pick(c)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use kuport_core::snapshot::LinkProbe;

    use super::*;

    #[test]
    fn link_verdicts_replace_the_last_ones_and_a_link_without_one_has_no_series() {
        let metrics = Metrics::new();
        let probe = |peer: &str, up: Option<bool>| LinkProbe {
            class: "public".into(),
            peer: peer.into(),
            up,
            rtt_microseconds: Some(1500),
            ..LinkProbe::default()
        };
        metrics.set_link_probes(&[
            probe("n2", Some(true)),
            probe("n3", Some(false)),
            probe("n4", None),
        ]);
        let text = metrics.encode().expect("encode");
        assert!(
            text.contains(r#"kuport_link_up{class="public",peer="n2"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kuport_link_up{class="public",peer="n3"} 0"#),
            "{text}"
        );
        assert!(
            !text.contains(r#"kuport_link_up{class="public",peer="n4"}"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kuport_link_rtt_seconds{class="public",peer="n2"} 0.0015"#),
            "{text}"
        );
        metrics.set_link_probes(&[probe("n3", Some(true))]);
        let text = metrics.encode().expect("encode");
        assert!(
            !text.contains(r#"peer="n2""#),
            "a link gone takes its series: {text}"
        );
        assert!(
            text.contains(r#"kuport_link_up{class="public",peer="n3"} 1"#),
            "{text}"
        );
    }
}
