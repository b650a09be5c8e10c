//! Writing the status this node owns (`docs/operations.md`, "Status writes").
//!
//! PortMap statuses are replaced whole, with the `resourceVersion` of the object the plan was
//! computed from: a 409 means the plan read a stale object, so the pass is re-run on fresher
//! inputs rather than the body replayed. Class statuses are shared by every accepting node, so
//! this node merges only its own part (its row, its link proposals, its GC actions, the Ready
//! condition when it differs) into the watched object (or a fresh read) and writes what it
//! alone changed as a guarded JSON patch, new claims as a patch testing the claim list,
//! anything else with compare-and-swap, re-reading and re-merging when the server refuses. A write nobody waits for is held back up to [`SETTLE`] for the one that
//! follows. What to write is decided in `kuport_core::plan::merge` and `row_patch`, without
//! I/O, so the simulator and the property tests merge with the agent's own code; this module
//! does the requests, the retries, the holds, the metrics and the Events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kuport_core::api::PortMapClassStatus;
use kuport_core::api::{PortMap, PortMapClass, PortMapStatus, conditions};
use kuport_core::plan::merge::{
    ClassMerge, ClassPart, RowHome, class_parts, merge_class_status, portmap_status_equivalent,
};
use kuport_core::plan::node_rows::NodeRows;
use kuport_core::plan::row_patch::{claims_patch, settles_only, unshared_patch};
use kuport_core::plan::unknown_fields::keep_unknown_fields;
use kuport_core::plan::{AcceptedReason, PortMapWrite, Writes};
use tokio::time::Instant;

use super::budget::KeyedBuckets;
use super::events::{EventSink, PendingEvent};
use super::refusal::{patch_not_applied, refusal_reason};

mod node_object;
pub(crate) use node_object::NodeObjects;

/// Event reason on a PortMapClass when a node leaves its ready nodes (a Warning).
pub const NODE_LEFT_REASON: &str = "NodeNotReady";
/// Event reason on a PortMapClass when a node joins its ready nodes.
pub const NODE_JOINED_REASON: &str = "NodeReady";
/// Every Event reason the agent writes that is not a condition reason.
pub const CLASS_EVENT_REASONS: [&str; 2] = [NODE_LEFT_REASON, NODE_JOINED_REASON];
use super::metrics::{Metrics, WriteKind, WriteResult};

/// The version stamped into this node's class rows: this binary's.
const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// How many times one class write re-reads and re-merges after a 409 within one pass.
const CLASS_CAS_ATTEMPTS: usize = 5;

/// Where an agent writes its rows of the classes (`--rows-in`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RowsIn {
    /// `PortMapClass.status.nodes`, shared by every node of the class.
    #[default]
    Class,
    /// The node's own `PortMapNode`, which no other node writes.
    Node,
}

/// What the status writes of one pass came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusOutcome {
    /// Writes the API server accepted.
    pub written: usize,
    /// Writes skipped because the stored status already says the same.
    pub unchanged: usize,
    /// Writes that must be recomputed from fresher inputs (409 on a PortMap, a class that kept
    /// conflicting, a link proposal whose slot another pair took).
    pub recompute: usize,
    /// Writes that failed for another reason, each naming the object and the operation.
    pub errors: Vec<String>,
    /// A newer pass's writes arrived before these finished: the writes not yet sent were left
    /// to it (the counts above cover only what was done).
    pub superseded: bool,
    /// Writes held back (see [`SETTLE`]), each with when it is due.
    pub held: Vec<(Held, Instant)>,
}

/// How long a status write nobody waits for is held back: a mapping's `Programmed=True`
/// turning false only while another agent takes the protocol's next step (a claim proposed, an
/// end to acknowledge), and a class row change of ends taken down and claims marked unused.
/// During a pod move each of these is followed within a round trip by the write that matters
/// (`Programmed=True` again, the new link's acknowledgement), which then goes out alone or
/// carries the held change with it: one write instead of two or three, and no Event for a flip
/// that was never seen. A state that lasts is written once this is over.
pub const SETTLE: Duration = Duration::from_secs(1);

/// The object of a held write.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Held {
    /// A PortMap, by namespace and name.
    PortMap(String, String),
    /// A class status.
    Class(String),
    /// This node's `PortMapNode`.
    Node,
}

/// PortMap status writes in flight at once.
const WRITES_IN_FLIGHT: usize = 8;

/// Status writes one PortMap may have in a burst ...
pub const PORTMAP_WRITE_BURST: f64 = 5.0;
/// ... and then one per this: a tenant toggling its mappings' interfaces, or a pod flapping,
/// costs the API server (and every watcher of PortMaps) at most this many writes, and the
/// state it settles on is written when the budget allows (see [`write_budgets`]).
pub const PORTMAP_WRITE_EVERY: Duration = Duration::from_secs(2);

impl StatusOutcome {
    fn add(&mut self, other: StatusOutcome) {
        self.written += other.written;
        self.unchanged += other.unchanged;
        self.recompute += other.recompute;
        self.errors.extend(other.errors);
        self.superseded |= other.superseded;
        self.held.extend(other.held);
    }

    /// When the first held write is due.
    pub fn held_until(&self) -> Option<Instant> {
        self.held.iter().map(|(_, due)| *due).min()
    }
}

/// The status writer of one agent. It owns what it needs, so it can write on a task of its own
/// while the pass loop goes on (`status_task`).
pub(crate) struct StatusWriter {
    client: kube::Client,
    node: String,
    metrics: Arc<Metrics>,
    events: EventSink,
    api_timeout: Duration,
    /// PortMap statuses this writer wrote whose echo the watch has not delivered yet, by
    /// namespace and name (see [`Echo`]).
    echoes: Mutex<BTreeMap<(String, String), Echo>>,
    /// The watched classes, untyped (every status field kept): a class write merges into the
    /// watched object first and reads a fresh one only after a 409. Without it, every class
    /// write reads first.
    raw_classes: Option<Store<DynamicObject>>,
    /// Writes held back, each with when it was first held (see [`SETTLE`]).
    holds: Mutex<BTreeMap<Held, Instant>>,
    /// Each PortMap's write budget (see [`write_budgets`]).
    budgets: Mutex<KeyedBuckets<(String, String)>>,
    /// The watched `PortMapNode`s: this node's rows are written into its own, and the class
    /// merges read every node's. Without them nothing is known of other nodes' rows but what
    /// the class statuses hold.
    node_objects: Option<NodeObjects>,
    /// Where this node's rows go (`--rows-in`).
    rows_in: RowsIn,
}

/// A PortMap status write that the API server accepted: the `resourceVersion` it replaced and
/// the status it wrote. While the watched object still carries that version, the write is known
/// to have landed although the store does not show it yet (a newer pass's writes may start
/// before the watch delivers it): a write of the same status is not sent again, and a write of
/// another one waits for the watch, since on the old version either would only meet a 409.
#[derive(Debug)]
struct Echo {
    replaced: String,
    status: PortMapStatus,
}

/// How a patch of what this node alone changed ended.
enum RowPatch {
    /// Written: the class as the server answered.
    Written(Box<DynamicObject>),
    /// Not written, and accounted (the class is gone, or the write failed).
    Accounted,
    /// The row was not where the patch said: merge into a fresh read.
    Moved,
}

/// What this writer last wrote over the watched version of a PortMap.
enum Echoed {
    /// The status about to be written: it is there already.
    Same,
    /// Another status.
    Other,
}

impl StatusWriter {
    /// The writer of `node`'s status; each request may take `api_timeout`.
    pub fn new(
        client: kube::Client,
        node: String,
        metrics: Arc<Metrics>,
        events: EventSink,
        api_timeout: Duration,
    ) -> Self {
        Self {
            client,
            node,
            metrics,
            events,
            api_timeout,
            echoes: Mutex::new(BTreeMap::new()),
            raw_classes: None,
            holds: Mutex::new(BTreeMap::new()),
            budgets: Mutex::new(write_budgets()),
            node_objects: None,
            rows_in: RowsIn::Class,
        }
    }

    /// Reads every node's rows from the `PortMapNode`s `objects` watches, and writes this
    /// node's where `rows_in` says (into its own object as watched there, or the classes).
    pub fn with_node_objects(mut self, objects: NodeObjects, rows_in: RowsIn) -> Self {
        self.node_objects = Some(objects);
        self.rows_in = rows_in;
        self
    }

    /// Where this node's rows go, for the class merges.
    fn row_home(&self) -> RowHome<'static> {
        match self.rows_in {
            RowsIn::Class => RowHome::Class {
                agent_version: AGENT_VERSION,
            },
            RowsIn::Node => RowHome::Node,
        }
    }

    /// Merges class writes into the objects `store` watches before reading any afresh.
    pub fn with_watched_classes(mut self, store: Store<DynamicObject>) -> Self {
        self.raw_classes = Some(store);
        self
    }

    /// The class `class` as the untyped watch holds it, typed and raw.
    fn watched_class(&self, class: &str) -> Option<(PortMapClass, DynamicObject)> {
        let raw = self.raw_classes.as_ref()?.get(&ObjectRef::new_with(
            class,
            ApiResource::erase::<PortMapClass>(&()),
        ))?;
        let raw = (*raw).clone();
        let typed = raw.clone().try_parse::<PortMapClass>().ok()?;
        Some((typed, raw))
    }

    /// Writes everything in `writes`; one failed write never stops the others. Before it sends
    /// each request it asks `superseded`: once a newer pass's writes wait, it sends nothing more,
    /// lets the requests already sent finish (their answers are counted, and a newer write of
    /// the same object never overtakes one in flight) and returns with `superseded` set.
    pub async fn write_all(
        &self,
        writes: &Writes,
        portmaps: &Store<PortMap>,
        classes: &[PortMapClass],
        now: Timestamp,
        superseded: &(dyn Fn() -> bool + Send + Sync),
    ) -> StatusOutcome {
        use futures_util::StreamExt as _;
        let mut outcome = StatusOutcome::default();
        self.forget_caught_up_echoes(portmaps);
        // A few writes in flight at once: a first pass on a large cluster has a status for every
        // mapping, and one at a time holds the writes for the sum of their round trips. Each
        // request body exists only while its write is in flight, and results are taken in the
        // order of the writes (an ordered queue), so the outcome does not depend on which
        // answer came first.
        // A hand-fed queue rather than `stream::iter(..).map(..).buffered(..)`: a closure
        // borrowing `self` there makes the writer's future fail the `Send` bound of a spawn.
        let mut todo = writes.portmaps.iter();
        let mut in_flight = futures_util::stream::FuturesOrdered::new();
        loop {
            while in_flight.len() < WRITES_IN_FLIGHT && !outcome.superseded {
                if superseded() {
                    outcome.superseded = true;
                    break;
                }
                let Some(w) = todo.next() else { break };
                in_flight.push_back(self.write_portmap(w, portmaps));
            }
            let Some(one) = in_flight.next().await else {
                break;
            };
            outcome.add(one);
        }
        if outcome.superseded {
            return outcome;
        }
        // The rows first: a class's readiness is computed from them, this node's included.
        if self.rows_in == RowsIn::Node {
            self.write_node_object(writes, now, &mut outcome).await;
        }
        self.write_classes(writes, classes, now, &mut outcome, superseded)
            .await;
        if !outcome.superseded {
            // A hold not renewed by these writes is over: written, or no longer wanted.
            self.holds
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|key, _| outcome.held.iter().any(|(held, _)| held == key));
        }
        outcome
    }

    /// Merges this node's part into each class it has something to say about (see
    /// `class_parts`), reading every node's rows from their objects.
    async fn write_classes(
        &self,
        writes: &Writes,
        classes: &[PortMapClass],
        now: Timestamp,
        outcome: &mut StatusOutcome,
        superseded: &(dyn Fn() -> bool + Send + Sync),
    ) {
        let objects = self.node_objects_now();
        let node_rows = NodeRows::new(&objects);
        for (class, part) in class_parts(writes, &self.node, classes) {
            // When merging into the watched copy changes nothing, the fresh object is not read:
            // a converged pass costs no request. Anything to change is merged into a fresh read.
            let watched = classes
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(class.as_str()));
            if let Some(watched) = watched {
                let merged = merge_class_status(
                    watched,
                    &node_rows,
                    &self.node,
                    self.row_home(),
                    &part,
                    now,
                );
                let stored = watched.status.clone().unwrap_or_default();
                if merged.status == stored && merged.dropped.is_empty() {
                    outcome.unchanged += 1;
                    continue;
                }
                if settles_only(&stored, &merged.status, &self.node)
                    && let Some(due) = self.hold(Held::Class(class.clone()))
                {
                    outcome.held.push((Held::Class(class.clone()), due));
                    continue;
                }
            }
            self.write_class(&class, &part, &node_rows, now, outcome, superseded)
                .await;
            if outcome.superseded {
                break;
            }
        }
    }

    /// Spends a token of the write budget of PortMap `namespace/name`, or says when one is
    /// there (see [`write_budgets`]).
    fn spend_write(&self, namespace: &str, name: &str) -> Result<(), Instant> {
        let now = Instant::now();
        self.budgets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take((namespace.to_owned(), name.to_owned()), now)
    }

    /// Whether the write of PortMap `key` is past its budget: then it is held (not lost: a pass
    /// when a token is there writes the state the object has then) and counted.
    fn over_budget(&self, key: Held, outcome: &mut StatusOutcome) -> bool {
        let Held::PortMap(namespace, name) = &key else {
            return false;
        };
        let Err(due) = self.spend_write(namespace, name) else {
            return false;
        };
        self.metrics
            .record_write(WriteKind::PortMap, WriteResult::Deferred);
        tracing::debug!(
            "writing the status of PortMap {namespace}/{name}: its write budget is spent, held"
        );
        outcome.held.push((key, due));
        true
    }

    /// Gives back the token of a write of PortMap `namespace/name` that did not land.
    fn refund_write(&self, namespace: &str, name: &str) {
        self.budgets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .refund(&(namespace.to_owned(), name.to_owned()));
    }

    /// Holds back the write of `key` (see [`SETTLE`]): when it is due, if it is not yet.
    fn hold(&self, key: Held) -> Option<Instant> {
        let now = Instant::now();
        let mut holds = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
        let due = *holds.entry(key).or_insert(now) + SETTLE;
        (now < due).then_some(due)
    }

    /// Drops the echoes the watch has caught up with (the stored object moved past the version
    /// the write replaced, or is gone): from then on the store itself says what was written.
    fn forget_caught_up_echoes(&self, portmaps: &Store<PortMap>) {
        let mut echoes = self.echoes.lock().unwrap_or_else(PoisonError::into_inner);
        echoes.retain(|(namespace, name), echo| {
            portmaps
                .get(&ObjectRef::new(name).within(namespace))
                .is_some_and(|o| o.metadata.resource_version.as_deref() == Some(&echo.replaced))
        });
    }

    /// Whether this writer already wrote a status over the version of the object the store
    /// still holds, and whether it was the same as `w`'s.
    fn echo(&self, w: &PortMapWrite, current: &PortMap) -> Option<Echoed> {
        let echoes = self.echoes.lock().unwrap_or_else(PoisonError::into_inner);
        let echo = echoes.get(&(w.namespace.clone(), w.name.clone()))?;
        (current.metadata.resource_version.as_deref() == Some(&echo.replaced)).then(|| {
            if portmap_status_equivalent(&echo.status, &w.status) {
                Echoed::Same
            } else {
                Echoed::Other
            }
        })
    }

    async fn write_portmap(&self, w: &PortMapWrite, store: &Store<PortMap>) -> StatusOutcome {
        let mut outcome = StatusOutcome::default();
        let what = format!("PortMap {}/{}", w.namespace, w.name);
        let Some(current) = store.get(&ObjectRef::new(&w.name).within(&w.namespace)) else {
            // Deleted since the snapshot: nothing to write.
            outcome.unchanged += 1;
            return outcome;
        };
        let stored = current.status.clone().unwrap_or_default();
        if portmap_status_equivalent(&stored, &w.status) {
            outcome.unchanged += 1;
            return outcome;
        }
        let key = Held::PortMap(w.namespace.clone(), w.name.clone());
        if w.settling
            && programmed_true(&stored)
            && let Some(due) = self.hold(key.clone())
        {
            outcome.held.push((key, due));
            return outcome;
        }
        match self.echo(w, &current) {
            Some(Echoed::Same) => {
                outcome.unchanged += 1;
                return outcome;
            }
            Some(Echoed::Other) => {
                // The object has moved past the stored version (this writer moved it), so a
                // write on that version could only meet a 409: wait for the watch instead.
                tracing::debug!(
                    "writing the status of {what}: the watch has not delivered this agent's last write yet, recomputing"
                );
                outcome.recompute += 1;
                return outcome;
            }
            None => {}
        }
        if self.over_budget(key, &mut outcome) {
            return outcome;
        }
        let mut body = (*current).clone();
        body.metadata.managed_fields = None;
        body.status = Some(w.status.clone());
        let api: Api<PortMap> = Api::namespaced(self.client.clone(), &w.namespace);
        let result = tokio::time::timeout(
            self.api_timeout,
            api.replace_status(&w.name, &PostParams::default(), &body),
        )
        .await;
        match result {
            Ok(Ok(_)) => {
                self.metrics
                    .record_write(WriteKind::PortMap, WriteResult::Written);
                outcome.written += 1;
                tracing::debug!("wrote the status of {what}");
                self.portmap_written(w, &current, &stored);
            }
            Ok(Err(kube::Error::Api(s))) if s.is_conflict() => {
                // Nothing landed: a 409 storm is paced by the retry's backoff, not the budget.
                self.refund_write(&w.namespace, &w.name);
                self.metrics
                    .record_write(WriteKind::PortMap, WriteResult::Conflict);
                outcome.recompute += 1;
                tracing::debug!("writing the status of {what}: 409, recomputing");
            }
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() => {
                outcome.unchanged += 1;
            }
            Ok(Err(e)) => {
                self.write_failed(WriteKind::PortMap, &what, Some(e), &mut outcome);
            }
            Err(_) => {
                self.write_failed(WriteKind::PortMap, &what, None, &mut outcome);
            }
        }
        outcome
    }

    /// After `w` replaced the status `stored` of `current`: remembers the write, to know its
    /// echo when the watch brings it back, and announces the conditions that flipped.
    fn portmap_written(&self, w: &PortMapWrite, current: &PortMap, stored: &PortMapStatus) {
        if let Some(replaced) = current.metadata.resource_version.clone() {
            self.echoes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(
                    (w.namespace.clone(), w.name.clone()),
                    Echo {
                        replaced,
                        status: w.status.clone(),
                    },
                );
        }
        for type_ in [conditions::ACCEPTED, conditions::PROGRAMMED] {
            if let Some(c) = to_report(&stored.conditions, &w.status.conditions, type_) {
                self.events.emit(PendingEvent {
                    regarding: current.object_ref(&()),
                    warning: is_warning(c),
                    reason: c.reason.clone(),
                    note: note(type_, c),
                    action: "UpdateStatus",
                });
            }
        }
    }

    /// Merges this node's part into the watched class (or, with none watched, a fresh read),
    /// writes with compare-and-swap, and on a 409 reads the class fresh and re-merges (up to 5
    /// attempts, and only while no newer pass's writes wait). A write that meets no conflict is
    /// one request.
    async fn write_class(
        &self,
        class: &str,
        part: &ClassPart<'_>,
        node_rows: &NodeRows<'_>,
        now: Timestamp,
        outcome: &mut StatusOutcome,
        superseded: &(dyn Fn() -> bool + Send + Sync),
    ) {
        let what = format!("PortMapClass {class}");
        // Raw, not typed: what this version does not know of the status must be written back.
        let api: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &ApiResource::erase::<PortMapClass>(&()),
        );
        for attempt in 0..CLASS_CAS_ATTEMPTS {
            if superseded() {
                outcome.superseded = true;
                return;
            }
            let Some((fresh, raw, from_watch)) =
                self.class_copy(&api, class, attempt, outcome).await
            else {
                return;
            };
            let stored = fresh.status.clone().unwrap_or_default();
            let merged =
                merge_class_status(&fresh, node_rows, &self.node, self.row_home(), part, now);
            if !merged.dropped.is_empty() {
                tracing::debug!(
                    "{what}: link proposal(s) {} dropped: the slot was taken meanwhile",
                    merged.dropped.join(", ")
                );
                outcome.recompute += 1;
            }
            if merged.status == stored {
                if from_watch {
                    // The pass saw something to change: the watch may lag, so ask the server.
                    continue;
                }
                outcome.unchanged += 1;
                return;
            }
            let (patch, body) = match class_write_form(raw, &stored, &merged.status, &self.node) {
                Ok(form) => form,
                Err(e) => {
                    outcome
                        .errors
                        .push(format!("writing the status of {what}: {e}"));
                    return;
                }
            };
            if let Some(ops) = patch {
                match self.patch_unshared(&api, class, ops, outcome).await {
                    RowPatch::Written(answer) => {
                        let answer = Ok(Ok(*answer));
                        self.class_write_answered(answer, &what, &fresh, merged, outcome);
                        return;
                    }
                    RowPatch::Accounted => return,
                    RowPatch::Moved => continue,
                }
            }
            let result = tokio::time::timeout(
                self.api_timeout,
                api.replace_status(class, &PostParams::default(), &body),
            )
            .await;
            if !self.class_write_answered(result, &what, &fresh, merged, outcome) {
                return;
            }
        }
        // Still conflicting after several fresh reads: let the next pass try again.
        outcome.recompute += 1;
    }

    /// The copy of `class` to merge into, and whether it is the watched one (which may lag):
    /// on the first attempt the watched one, else a fresh read.
    async fn class_copy(
        &self,
        api: &Api<DynamicObject>,
        class: &str,
        attempt: usize,
        outcome: &mut StatusOutcome,
    ) -> Option<(PortMapClass, DynamicObject, bool)> {
        if let Some((typed, raw)) = (attempt == 0).then(|| self.watched_class(class)).flatten() {
            return Some((typed, raw, true));
        }
        let (typed, raw) = self.read_class(api, class, outcome).await?;
        Some((typed, raw, false))
    }

    /// Writes what this node alone changed in the status of `class` (`ops`, from
    /// `unshared_patch`) as a JSON patch, each operation guarded by a test of the key at its
    /// index: no compare-and-swap, so other nodes' writes of their own elements never make it
    /// conflict (each would otherwise cost a 409, a read and another write). `Moved` when an
    /// element is no longer where the patch says (the patch does not apply: a 422 that names
    /// nothing, `refusal.rs`), to merge into a fresh read instead. Any other 422 is a refusal:
    /// reported, and not written again before the pass's retry.
    async fn patch_unshared(
        &self,
        api: &Api<DynamicObject>,
        class: &str,
        ops: Vec<serde_json::Value>,
        outcome: &mut StatusOutcome,
    ) -> RowPatch {
        let what = format!("PortMapClass {class}");
        let patch: json_patch::Patch = match serde_json::from_value(serde_json::Value::Array(ops)) {
            Ok(patch) => patch,
            Err(e) => {
                outcome
                    .errors
                    .push(format!("writing this node's part of {what}: {e}"));
                return RowPatch::Accounted;
            }
        };
        let result = tokio::time::timeout(
            self.api_timeout,
            api.patch_status(class, &PatchParams::default(), &Patch::Json::<()>(patch)),
        )
        .await;
        match result {
            Ok(Err(kube::Error::Api(s))) if patch_not_applied(&s) || s.is_conflict() => {
                self.metrics
                    .record_write(WriteKind::Class, WriteResult::Conflict);
                tracing::debug!(
                    "{what}: an element this node patches moved meanwhile, merging afresh"
                );
                RowPatch::Moved
            }
            Ok(Ok(answer)) => RowPatch::Written(Box::new(answer)),
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() => {
                outcome.unchanged += 1;
                RowPatch::Accounted
            }
            Ok(Err(e)) => {
                self.write_failed(WriteKind::Class, &what, Some(e), outcome);
                RowPatch::Accounted
            }
            Err(_) => {
                self.write_failed(WriteKind::Class, &what, None, outcome);
                RowPatch::Accounted
            }
        }
    }

    /// Accounts the answer to a class status write; true when it was a conflict, to re-read
    /// and re-merge.
    fn class_write_answered(
        &self,
        result: Result<Result<DynamicObject, kube::Error>, tokio::time::error::Elapsed>,
        what: &str,
        fresh: &PortMapClass,
        merged: ClassMerge,
        outcome: &mut StatusOutcome,
    ) -> bool {
        match result {
            Ok(Ok(_)) => {
                self.metrics
                    .record_write(WriteKind::Class, WriteResult::Written);
                outcome.written += 1;
                tracing::debug!("wrote this node's part of the status of {what}");
                self.announce_class_flips(
                    fresh,
                    merged.ready_flipped,
                    &merged.nodes_left,
                    &merged.nodes_joined,
                );
                false
            }
            Ok(Err(kube::Error::Api(s))) if s.is_conflict() => {
                // Someone else wrote meanwhile: re-read and re-merge, never replay.
                self.metrics
                    .record_write(WriteKind::Class, WriteResult::Conflict);
                true
            }
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() => {
                outcome.unchanged += 1;
                false
            }
            Ok(Err(e)) => {
                self.write_failed(WriteKind::Class, what, Some(e), outcome);
                false
            }
            Err(_) => {
                self.write_failed(WriteKind::Class, what, None, outcome);
                false
            }
        }
    }

    /// A status write of `what` that failed (`error`, or no answer in time), counted and
    /// reported.
    fn write_failed(
        &self,
        kind: WriteKind,
        what: &str,
        error: Option<kube::Error>,
        outcome: &mut StatusOutcome,
    ) {
        self.metrics.record_write(kind, WriteResult::Failed);
        if let Some(kube::Error::Api(s)) = &error
            && let Some(reason) = refusal_reason(s)
        {
            // Writing it again would be refused again: the pass fails and is retried with
            // backoff, never at once.
            self.metrics.record_refusal(kind, reason);
            tracing::warn!(
                reason,
                "the API server refused the status write of {what} ({} {}): {}",
                s.code,
                s.reason,
                s.message
            );
        }
        let why = match error {
            Some(e) => e.to_string(),
            None => format!("no answer within {:?}", self.api_timeout),
        };
        outcome
            .errors
            .push(format!("writing the status of {what}: {why}"));
    }

    /// The class as stored now; `None`, with the outcome accounted, when it is gone or the read
    /// failed.
    async fn read_class(
        &self,
        api: &Api<DynamicObject>,
        class: &str,
        outcome: &mut StatusOutcome,
    ) -> Option<(PortMapClass, DynamicObject)> {
        let what = format!("PortMapClass {class}");
        match tokio::time::timeout(self.api_timeout, api.get_opt(class)).await {
            Ok(Ok(Some(raw))) => match raw.clone().try_parse::<PortMapClass>() {
                Ok(fresh) => Some((fresh, raw)),
                Err(e) => {
                    outcome.errors.push(format!("reading {what}: {e}"));
                    None
                }
            },
            Ok(Ok(None)) => {
                outcome.unchanged += 1;
                None
            }
            Ok(Err(e)) => {
                outcome.errors.push(format!("reading {what}: {e}"));
                None
            }
            Err(_) => {
                outcome.errors.push(format!(
                    "reading {what}: no answer within {:?}",
                    self.api_timeout
                ));
                None
            }
        }
    }

    /// Events on the class for what this node's write changed: its Ready condition flipped,
    /// nodes that left or joined its ready nodes.
    fn announce_class_flips(
        &self,
        class: &PortMapClass,
        ready_flipped: Option<Condition>,
        nodes_left: &[(String, String)],
        nodes_joined: &[String],
    ) {
        if let Some(c) = ready_flipped {
            self.events.emit(PendingEvent {
                regarding: class.object_ref(&()),
                warning: c.status != conditions::TRUE,
                reason: c.reason.clone(),
                note: note(conditions::READY, &c),
                action: "UpdateStatus",
            });
        }
        for (node, why) in nodes_left {
            self.events.emit(PendingEvent {
                regarding: class.object_ref(&()),
                warning: true,
                reason: NODE_LEFT_REASON.to_owned(),
                note: format!("node {node} no longer accepts for the class: {why}"),
                action: "UpdateStatus",
            });
        }
        for node in nodes_joined {
            self.events.emit(PendingEvent {
                regarding: class.object_ref(&()),
                warning: false,
                reason: NODE_JOINED_REASON.to_owned(),
                note: format!("node {node} accepts for the class"),
                action: "UpdateStatus",
            });
        }
    }
}

/// A PortMap's status write budget: [`PORTMAP_WRITE_BURST`] writes, then one per
/// [`PORTMAP_WRITE_EVERY`]. Per object, so a tenant spends only its own objects' budgets: its
/// flapping mappings never delay another tenant's status (nor its own other mappings'). A write
/// past the budget is held (like a settling one) and a pass writes the object's state then;
/// nothing is dropped. Class statuses have none: every accepting node writes its own row, and
/// the links of every tenant's mappings wait on them.
fn write_budgets() -> KeyedBuckets<(String, String)> {
    KeyedBuckets::new(PORTMAP_WRITE_BURST, 1.0 / PORTMAP_WRITE_EVERY.as_secs_f64())
}

/// An Event's note for a condition: `Programmed is False: <message>`, or without the colon
/// when the condition has no message (success reasons).
/// Whether a stored status says the mapping works.
fn programmed_true(status: &PortMapStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::PROGRAMMED && c.status == "True")
}

fn note(type_: &str, c: &Condition) -> String {
    if c.message.is_empty() {
        format!("{type_} is {} ({})", c.status, c.reason)
    } else {
        format!("{type_} is {}: {}", c.status, c.message)
    }
}

/// Events for false conditions are warnings, and so is the one true reason that reports a
/// clash.
fn is_warning(c: &Condition) -> bool {
    c.status != conditions::TRUE || c.reason == AcceptedReason::PortAlsoHeldByHost.as_str()
}

/// The new condition of `type_` when it is worth an Event: it is new, its status flipped, or
/// it stays False for another reason (a different problem for the user to act on). A steady
/// condition, or a True one whose reason or message changed, is not.
fn to_report<'a>(stored: &[Condition], new: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    let new = new.iter().find(|c| c.type_ == type_)?;
    let old = stored.iter().find(|c| c.type_ == type_);
    // A changed reason is news even when the status holds: a refusal with another cause, or an
    // accepted mapping whose port a host socket now also wants.
    old.is_none_or(|o| o.status != new.status || o.reason != new.reason)
        .then_some(new)
}

/// How a class status write goes: the patch, when one says it (what this node alone changed,
/// or that and new claims: `kuport_core::plan::row_patch`), and the body a compare-and-swap
/// would replace the status with otherwise.
fn class_write_form(
    raw: DynamicObject,
    stored: &PortMapClassStatus,
    merged: &PortMapClassStatus,
    node: &str,
) -> Result<(Option<Vec<serde_json::Value>>, DynamicObject), serde_json::Error> {
    // The claim list as the server holds it, unknown fields and all: what a claims patch tests.
    let stored_links = raw.data["status"]["links"].clone();
    let body = class_status_body(raw, stored, merged, node)?;
    let patch = unshared_patch(stored, merged, node).or_else(|| {
        claims_patch(
            stored,
            merged,
            node,
            &stored_links,
            &body.data["status"]["links"],
        )
    });
    Ok((patch, body))
}

/// The body of a class status write: the class as read (`raw`, whose status this version read
/// as `stored`) with `merged` as its status, and every field of the stored status this version
/// does not know put back, except in `node`'s own row (`kuport_core::plan::unknown_fields`).
fn class_status_body(
    mut raw: DynamicObject,
    stored: &PortMapClassStatus,
    merged: &PortMapClassStatus,
    node: &str,
) -> Result<DynamicObject, serde_json::Error> {
    raw.metadata.managed_fields = None;
    let as_stored = raw
        .data
        .get("status")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let understood = serde_json::to_value(stored)?;
    let mut status = serde_json::to_value(merged)?;
    keep_unknown_fields(&as_stored, &understood, &mut status, node);
    // A class read back always has a body; the status subresource reads nothing else of it.
    if let Some(data) = raw.data.as_object_mut() {
        data.insert("status".to_owned(), status);
    } else {
        raw.data = serde_json::json!({ "status": status });
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use kuport_testkit::cluster::ready_condition as cond;

    use super::*;

    const NOW: &str = "2026-01-02T00:00:00Z";

    #[test]
    fn events_report_flips_and_new_refusals_but_not_steady_conditions() {
        let c = |status: &str, reason: &str| Condition {
            type_: "Programmed".into(),
            ..cond(status, reason, NOW)
        };
        let report = |old: &[Condition], new: &Condition| {
            to_report(old, std::slice::from_ref(new), "Programmed").is_some()
        };
        assert!(report(&[], &c("True", "AllNodesReady")), "new");
        assert!(report(
            &[c("True", "AllNodesReady")],
            &c("False", "NoReadyEndpoint")
        ));
        assert!(report(
            &[c("False", "NoReadyEndpoint")],
            &c("True", "AllNodesReady")
        ));
        assert!(
            report(
                &[c("False", "NodeNotReady")],
                &c("False", "NoReadyEndpoint")
            ),
            "another problem to act on"
        );
        assert!(!report(
            &[c("False", "NoReadyEndpoint")],
            &c("False", "NoReadyEndpoint")
        ));
        assert!(!report(
            &[c("True", "AllNodesReady")],
            &c("True", "AllNodesReady")
        ));
        let accepted = |reason: &str| Condition {
            type_: "Accepted".into(),
            ..cond("True", reason, NOW)
        };
        assert!(
            to_report(
                &[accepted("Valid")],
                &[accepted("PortAlsoHeldByHost")],
                "Accepted"
            )
            .is_some_and(is_warning),
            "a host socket now clashes with an accepted mapping: a warning Event"
        );
        assert!(!is_warning(&accepted("Valid")));
    }
}
