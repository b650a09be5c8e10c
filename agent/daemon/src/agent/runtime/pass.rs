//! One pass up to the datapath: snapshot the stores, read the host's facts, plan, apply, and
//! plan again when the kernel refused something new. What it leaves to write goes back to the
//! loop, which hands it to the status task.

use std::sync::Arc;

use kuport_core::api::PortMapClass;
use kuport_core::ir::{HostState, Rule};
use kuport_core::plan::{Detail, Plan, Writes, plan_with};
use kuport_core::snapshot::{HostFacts, KernelRefusal, Snapshot};
use kuport_host::probe::ProbeTarget;
use kuport_host::{ApplyReport, Host, Refusal};
use tokio::time::Instant;

use super::Agent;
use super::facts::facts_query;
use super::inputs::Inputs;
use super::schedule::counters_due;
use crate::agent::clock::Clock;
use crate::agent::failure::PassError;
use crate::agent::relevance::Wanted;
use crate::agent::status_task::StatusJob;

/// What the datapath part of a pass came to.
pub(super) enum Applied {
    /// It failed; nothing is written (a failed apply would have status claim what the host
    /// does not have).
    Failed(PassError),
    /// The datapath is applied; the writes go to the status task.
    Ok(ToWrite),
}

/// The status an applied pass leaves to write.
pub(super) struct ToWrite {
    writes: Writes,
    /// The classes the plan read (the writes are merged into them first).
    classes: Vec<PortMapClass>,
    /// The kernel refused part of the datapath.
    pub refused: bool,
    /// When the plan changes by time alone (`Plan::changes_at`), on the loop's clock.
    pub changes_at: Option<Instant>,
}

impl ToWrite {
    /// The status task's job for pass `pass`. The watches learn first what it writes, so they
    /// can tell the events that only bring those writes back.
    pub(super) fn into_job(self, pass: u64, wanted: &Wanted) -> StatusJob {
        let writes = Arc::new(self.writes);
        wanted.set(writes.clone());
        StatusJob {
            pass,
            writes,
            classes: self.classes,
        }
    }
}

impl<H: Host> Agent<H> {
    /// One pass up to the datapath. Returns what it came to (with the status it leaves to write)
    /// and the underlay devices to watch for link events.
    pub(super) async fn pass(
        &mut self,
        inputs: &Inputs,
        verify: bool,
    ) -> (Applied, Option<Vec<String>>) {
        let node = self.config.node_name.clone();

        // Every input, cilium-config included, comes from a watch: an unreachable API server
        // leaves the stores as they were, so a link event during an outage still repairs the
        // datapath from the last known objects.
        let mut snapshot = inputs
            .snapshot(std::mem::take(&mut self.previous), self.config.api_timeout)
            .await;

        let mut query = facts_query(&snapshot, &node, self.config.marks);
        query.agent_ports = self.config.agent_ports.clone();
        let mut facts = match self.host.facts(&query).await {
            Ok(f) => f,
            Err(e) => {
                self.previous = snapshot;
                return (Applied::Failed(PassError::Facts(e)), None);
            }
        };
        facts.refusals = self.refusals.clone();
        if let Some(probes) = &self.probes {
            facts.link_probes = probes.facts();
            self.metrics.set_link_probes(&facts.link_probes);
        }
        let underlay = facts.underlay_device.clone().map(|d| vec![d]);

        let planned = self.plan_and_apply(&mut snapshot, facts, verify).await;
        // The classes go with the writes; the rest is the next pass's to reuse.
        let classes = match planned {
            Ok(_) => std::mem::take(&mut snapshot.classes),
            Err(_) => Vec::new(),
        };
        self.previous = snapshot;
        let mut plan = match planned {
            Ok(plan) => plan,
            Err(failed) => return (Applied::Failed(failed), underlay),
        };
        self.metrics.record_plan(&plan);
        let now = Instant::now();
        if counters_due(verify, self.counters_read, now) {
            self.counters_read = Some(now);
            match self.host.counters().await {
                Ok(counters) => self.metrics.set_mapping_counters(counters),
                Err(e) => tracing::warn!("reading kuport's nft counters: {e}"),
            }
        }
        let applied = Applied::Ok(ToWrite {
            writes: std::mem::take(&mut plan.writes),
            classes,
            refused: !self.refusals.is_empty(),
            changes_at: plan
                .changes_at
                .map(|at| on_loop_clock(at, &self.config.clock, now)),
        });
        (applied, underlay)
    }

    /// Plans, applies, and when the kernel refused something new, plans again so the status
    /// says what it refused (the datapath asked for is the same; only this node's part of the
    /// class status changes). Returns the plan whose status is to be written.
    async fn plan_and_apply(
        &mut self,
        snapshot: &mut Snapshot,
        facts: HostFacts,
        verify: bool,
    ) -> Result<Plan, PassError> {
        let (mut plan, mut facts) = self.plan(snapshot, facts).await?;
        self.run_hook(snapshot, &mut plan);
        let report = self
            .host
            .apply(&plan.host_state, verify)
            .await
            .map_err(PassError::Apply)?;
        log_apply(&report, &plan.host_state, verify);
        let refused = Refusal::by_mapping(&report.refused);
        self.follow_links(&plan.host_state, &refused);
        self.metrics.set_refusals(refused.len());
        if refused == self.refusals {
            return Ok(plan);
        }
        self.refusals = refused;
        facts.refusals = self.refusals.clone();
        let (mut plan, _) = self.plan(snapshot, facts).await?;
        self.run_hook(snapshot, &mut plan);
        Ok(plan)
    }

    /// Computes the plan over `snapshot`, lent to the plan's thread and put back (the next pass
    /// reuses its objects); hands the facts back for a second plan. When the plan panicked the
    /// snapshot is lost, and the next pass copies every object from the stores again.
    async fn plan(
        &self,
        snapshot: &mut Snapshot,
        facts: HostFacts,
    ) -> Result<(Plan, HostFacts), PassError> {
        let lent = std::mem::take(snapshot);
        let (plan, lent, facts) = compute_plan(
            lent,
            self.config.node_name.clone(),
            facts,
            &self.config.clock,
            self.config.plan_on_blocking_thread,
        )
        .await?;
        *snapshot = lent;
        Ok((plan, facts))
    }

    /// Probes the links this apply built: every link of the IR but those the kernel refused.
    fn follow_links(&mut self, state: &HostState, refused: &[KernelRefusal]) {
        let Some(probes) = &mut self.probes else {
            return;
        };
        let targets: Vec<ProbeTarget> = state
            .links
            .iter()
            .filter(|l| {
                !refused
                    .iter()
                    .any(|r| r.link.as_deref() == Some(l.name.as_str()))
            })
            .map(ProbeTarget::of)
            .collect();
        probes.follow(&targets);
    }

    fn run_hook(&self, snapshot: &Snapshot, plan: &mut Plan) {
        if let Some(hook) = &self.pass_hook {
            hook(snapshot, plan);
        }
    }
}

/// The loop's instant of the wall-clock time `at`: `now` plus how far `clock` is from it (now
/// when it has passed).
fn on_loop_clock(at: k8s_openapi::jiff::Timestamp, clock: &Clock, now: Instant) -> Instant {
    let ahead = at.duration_since(clock.now());
    now + std::time::Duration::try_from(ahead).unwrap_or_default()
}

/// The plan, off the async workers unless configured inline; a panic in it fails the pass
/// instead of the agent. The snapshot and the facts are moved to the plan's thread and handed
/// back with the plan rather than copied for it (a snapshot holds every watched object).
async fn compute_plan(
    snapshot: Snapshot,
    node: String,
    facts: HostFacts,
    clock: &Clock,
    blocking: bool,
) -> Result<(Plan, Snapshot, HostFacts), PassError> {
    let now = clock.now();
    if blocking {
        return tokio::task::spawn_blocking(move || {
            let plan = plan_with(&snapshot, &node, &facts, now, Detail::Written);
            (plan, snapshot, facts)
        })
        .await
        .map_err(|e| PassError::Plan(e.to_string()));
    }
    std::panic::catch_unwind(|| plan_with(&snapshot, &node, &facts, now, Detail::Written))
        .map(|plan| (plan, snapshot, facts))
        .map_err(|_| PassError::Plan("the plan panicked".to_owned()))
}

/// One info line per applied change; debug for a pass that changed nothing.
fn log_apply(report: &ApplyReport, state: &HostState, verify: bool) {
    for refusal in &report.refused {
        let mappings: Vec<&str> = refusal.mappings.iter().map(String::as_str).collect();
        tracing::warn!(
            unit = refusal.unit,
            mappings = mappings.join(","),
            "the kernel refused {}; the mappings using it are left out: {}",
            refusal.unit,
            refusal.message
        );
    }
    if report.mutations() == 0 {
        tracing::debug!(verify, "pass: datapath unchanged");
        return;
    }
    let dnat = state
        .nft
        .chains
        .iter()
        .flat_map(|(_, rules)| rules)
        .filter(|r| matches!(r, Rule::Dnat(_)))
        .count();
    tracing::info!(
        verify,
        nft_changed = report.nft_changed,
        nft_lines = report.nft_lines,
        links_created = report.links_created,
        links_updated = report.links_updated,
        links_deleted = report.links_deleted,
        rules_added = report.rules_added,
        rules_deleted = report.rules_deleted,
        routes_added = report.routes_added,
        routes_deleted = report.routes_deleted,
        "applied: {dnat} dnat, {} link, {} rules, {} routes",
        state.links.len(),
        state.rules.len(),
        state.routes.len()
    );
}
