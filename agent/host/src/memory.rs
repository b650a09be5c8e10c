//! An in-memory host for the simulator and runtime tests: it records the last applied IR and
//! every call, and serves scripted facts, counters and failures.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use kuport_core::ir::HostState;
use kuport_core::snapshot::HostFacts;

use crate::error::HostError;
use crate::host::{FactsQuery, Host, MappingCounter};
use crate::report::{ApplyReport, Refusal};

/// What the memory host holds; shared between clones, so a test keeps a handle while the agent
/// owns another.
#[derive(Debug, Default)]
pub struct MemoryState {
    /// What is "programmed" (survives an agent crash, as a real host's kernel state does).
    pub applied: HostState,
    /// Applies that changed something.
    pub applies: usize,
    /// Teardowns performed.
    pub teardowns: usize,
    /// Facts served to every query.
    pub facts: HostFacts,
    /// Counters served.
    pub counters: Vec<MappingCounter>,
    /// When set, the next apply fails with this message (then it is cleared).
    pub fail_next_apply: Option<String>,
    /// Mappings (`namespace/name`) whose rules the "kernel" refuses, with its words, until
    /// removed: every apply leaves them out and reports them, as the real host does.
    pub refuse: BTreeMap<String, String>,
    /// How the next conntrack sweeps end, one per apply (entries cleared, or the error),
    /// told to the observer as the apply returns: the memory host holds no conntrack table, so
    /// a test scripts what the real one's sweeping thread would say.
    pub conntrack_sweeps: VecDeque<Result<usize, String>>,
}

/// The in-memory host.
#[derive(Clone, Debug, Default)]
pub struct MemoryHost {
    state: Arc<Mutex<MemoryState>>,
    /// What this host handle last applied. Like `LinuxHost`, a pass that does not verify is
    /// compared against this, not against the "kernel" (`applied`), so drift made behind the
    /// agent's back stays until a verifying pass: tests see the same blind spot the real host
    /// has.
    last: Option<HostState>,
    /// Told how each scripted sweep ended.
    observer: Option<Observer>,
}

/// The sweep observer, as a field of a `Debug` host.
#[derive(Clone)]
struct Observer(crate::conntrack::SweepObserver);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

impl MemoryHost {
    /// A host with these facts and nothing programmed.
    pub fn with_facts(facts: HostFacts) -> Self {
        let host = Self::default();
        host.lock().facts = facts;
        host
    }

    /// The shared state.
    pub fn lock(&self) -> MutexGuard<'_, MemoryState> {
        // A panic while holding the lock is a test failure already; keep serving its data.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What is programmed now.
    pub fn applied(&self) -> HostState {
        self.lock().applied.clone()
    }
}

/// Counts what differs between two states the way the real host would mutate it.
fn diff(old: &HostState, new: &HostState) -> ApplyReport {
    fn missing<T: PartialEq>(from: &[T], in_: &[T]) -> usize {
        from.iter().filter(|x| !in_.contains(x)).count()
    }
    ApplyReport {
        // Either table: an IPv6 endpoint can change while the IPv4 one stays.
        nft_changed: old.nft != new.nft || old.nft6 != new.nft6,
        nft_lines: 0,
        nft_listed: false,
        links_created: missing(&new.links, &old.links),
        links_updated: 0,
        links_deleted: missing(&old.links, &new.links),
        rules_added: missing(&new.rules, &old.rules),
        rules_deleted: missing(&old.rules, &new.rules),
        routes_added: missing(&new.routes, &old.routes),
        routes_deleted: missing(&old.routes, &new.routes),
        ..ApplyReport::default()
    }
}

impl Host for MemoryHost {
    async fn apply(&mut self, desired: &HostState, verify: bool) -> Result<ApplyReport, HostError> {
        let last = self.last.take();
        let mut s = self.lock();
        if let Some(detail) = s.fail_next_apply.take() {
            // A refused transaction changes nothing, so what was last applied still stands
            // (as on the real host).
            drop(s);
            self.last = last;
            return Err(HostError::Nft {
                op: "apply transaction",
                detail,
            });
        }
        // A refused mapping's rules go from both tables, as the real host's transactions
        // (one per family) refuse them.
        let present: std::collections::BTreeSet<String> = desired
            .tables()
            .into_iter()
            .flat_map(|t| t.owners().mappings_in(t))
            .collect();
        let refused: Vec<Refusal> = s
            .refuse
            .iter()
            .filter(|(mapping, _)| present.contains(*mapping))
            .map(|(mapping, message)| Refusal::of_rules(mapping.clone(), message.clone()))
            .collect();
        let mut applied = desired.clone();
        if !refused.is_empty() {
            let cut = Refusal::mappings_of(&refused);
            for table in applied.tables_mut() {
                *table = table.without_mappings(&cut);
            }
        }
        let base = match (&last, verify) {
            (Some(last), false) => last,
            _ => &s.applied,
        };
        let mut report = diff(base, &applied);
        if report.mutations() > 0 {
            s.applies += 1;
            s.applied = applied;
        }
        let swept = s.conntrack_sweeps.pop_front().map(|sweep| match sweep {
            Ok(cleared) => crate::conntrack::Sweep {
                cleared,
                ..Default::default()
            },
            Err(error) => crate::conntrack::Sweep {
                error: Some(error),
                ..Default::default()
            },
        });
        drop(s);
        if let Some(sweep) = swept {
            report.conntrack_sweep_asked = true;
            if let Some(Observer(observer)) = &self.observer {
                observer(&sweep);
            }
        }
        // As on the real host, a refusal is not remembered: the next pass tries again.
        self.last = refused.is_empty().then(|| desired.clone());
        report.refused = refused;
        Ok(report)
    }

    fn observe_sweeps(&mut self, observer: crate::conntrack::SweepObserver) {
        self.observer = Some(Observer(observer));
    }

    async fn teardown(&mut self) -> Result<(), HostError> {
        self.last = None;
        let mut s = self.lock();
        s.applied = HostState::default();
        s.teardowns += 1;
        Ok(())
    }

    async fn facts(&self, query: &FactsQuery) -> Result<HostFacts, HostError> {
        let s = self.lock();
        let mut facts = s.facts.clone();
        facts
            .interfaces
            .retain(|name, _| query.interfaces.contains(name));
        facts
            .interfaces6
            .retain(|name, _| query.interfaces.contains(name));
        // As the real host does: the marks asked for, and each applied link's id read back
        // from its routing table.
        facts.marks = query.marks;
        crate::sockets::name_agent_sockets(&mut facts.sockets, &query.agent_ports);
        facts.programmed_ports = s.applied.accepting_ports();
        for route in &s.applied.routes {
            if let Some(id) = query.marks.link_id_of_table(route.table) {
                facts.link_ids.insert(route.dev.clone(), id);
            }
        }
        Ok(facts)
    }

    async fn counters(&self) -> Result<Vec<MappingCounter>, HostError> {
        Ok(self.lock().counters.clone())
    }
}

#[cfg(test)]
mod tests {
    use kuport_core::ir::{IpRule, MAIN_TABLE};

    use super::*;

    fn state(rules: &[u32]) -> HostState {
        HostState {
            rules: rules
                .iter()
                .map(|p| IpRule {
                    family: kuport_core::ir::Family::V4,
                    priority: *p,
                    fwmark: 0x01,
                    fwmask: 0xff,
                    to: None,
                    table: MAIN_TABLE,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn records_applies_and_counts_only_changes() {
        let mut host = MemoryHost::default();
        let watcher = host.clone();
        let first = host.apply(&state(&[102]), false).await.expect("apply");
        assert_eq!(first.rules_added, 1);
        let again = host.apply(&state(&[102]), false).await.expect("apply");
        assert_eq!(again.mutations(), 0);
        let changed = host.apply(&state(&[101]), false).await.expect("apply");
        assert_eq!((changed.rules_added, changed.rules_deleted), (1, 1));
        assert_eq!(watcher.lock().applies, 2);
        assert_eq!(watcher.applied(), state(&[101]));
        host.teardown().await.expect("teardown");
        assert_eq!(watcher.applied(), HostState::default());
        assert_eq!(watcher.lock().teardowns, 1);
    }

    #[tokio::test]
    async fn scripted_failure_keeps_the_previous_state() {
        let mut host = MemoryHost::default();
        host.apply(&state(&[102]), false).await.expect("apply");
        host.lock().fail_next_apply = Some("boom".into());
        let err = host
            .apply(&state(&[101]), false)
            .await
            .expect_err("scripted failure");
        assert!(err.to_string().contains("boom"));
        assert_eq!(host.applied(), state(&[102]));
        assert!(
            host.apply(&state(&[101]), false).await.is_ok(),
            "the failure is used once"
        );
    }

    #[tokio::test]
    async fn facts_answer_only_what_was_asked() {
        let facts = HostFacts {
            interfaces: [
                ("wt0".to_owned(), "100.64.0.1".parse().expect("ip")),
                ("eth0".to_owned(), "10.0.0.1".parse().expect("ip")),
            ]
            .into_iter()
            .collect(),
            interfaces6: [
                ("wt0".to_owned(), "fd00:64::1".parse().expect("ipv6")),
                ("eth0".to_owned(), "2001:db8::1".parse().expect("ipv6")),
            ]
            .into_iter()
            .collect(),
            underlay_device: Some("wt0".into()),
            underlay_mtu: Some(1400),
            ..HostFacts::default()
        };
        let host = MemoryHost::with_facts(facts);
        let got = host
            .facts(&FactsQuery {
                interfaces: vec!["wt0".into()],
                internal_ip: None,
                ..FactsQuery::default()
            })
            .await
            .expect("facts");
        assert_eq!(got.interfaces.len(), 1);
        assert_eq!(got.interfaces6.keys().collect::<Vec<_>>(), ["wt0"]);
        assert_eq!(got.underlay_mtu, Some(1400));
    }

    #[tokio::test]
    async fn a_change_of_the_ip6_table_alone_is_applied() {
        use kuport_core::ir::{ChainId, Family, Rule};
        let mut host = MemoryHost::default();
        let before = state(&[102]);
        host.apply(&before, false).await.expect("apply");
        let mut after = before.clone();
        after.nft6.chains = vec![(ChainId::Fwd, vec![Rule::ClampMssOut])];
        assert_eq!(after.nft6.family, Family::V6);
        let report = host.apply(&after, false).await.expect("apply");
        assert!(report.nft_changed);
        assert_eq!(host.applied(), after);
    }
}
