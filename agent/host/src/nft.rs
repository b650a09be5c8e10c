//! kuport's nftables table, applied by the `nft` program as one text transaction, so a refused
//! batch leaves the previous rules in place. The transaction is written from the same rule text
//! the kernel's listing is compared against (`kuport_core::render`), so there is one
//! description of every rule, not two that must agree.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use kuport_core::ir::{ChainId, Hook, NftTable, RuleOwners, TABLE};
use kuport_core::render::{LineOf, nft_text, script, transaction_lines};
use serde_json::Value;

use crate::{HostError, Refusal};

/// How many transactions one apply may send while leaving refused mappings out.
const MAX_ISOLATION_ROUNDS: usize = 4;

/// What an nftables apply did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NftApplied {
    /// Whether a transaction was sent.
    pub changed: bool,
    /// Mappings whose rules nft refused; the rest of the table was applied.
    pub refused: Vec<Refusal>,
}

/// The mappings behind the lines nft refused, one refusal per mapping with nft's words, or
/// `None` when a refused line belongs to no mapping (or nft's answer names no line).
pub fn refused_mappings(
    detail: &str,
    lines: &[(String, LineOf<'_>)],
    owners: &RuleOwners,
) -> Option<Vec<Refusal>> {
    let mut by_mapping: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for error in detail.lines().filter(|l| l.contains(": Error: ")) {
        // `/dev/stdin:12:30-38: Error: Could not process rule: No such file or directory`
        let (location, message) = error.split_once(": Error: ")?;
        let number: usize = location.split(':').nth(1)?.parse().ok()?;
        let (_, of) = lines.get(number.checked_sub(1)?)?;
        let owner = match of {
            LineOf::Counter(c) => owners.of_counter(&c.name),
            LineOf::Rule(r) => owners.of_rule(r),
            LineOf::Structure => None,
        }?;
        by_mapping
            .entry(owner.clone())
            .or_default()
            .insert(message.trim().to_owned());
    }
    if by_mapping.is_empty() {
        return None;
    }
    Some(
        by_mapping
            .into_iter()
            .map(|(mapping, messages)| Refusal {
                unit: "nftables rules".to_owned(),
                mappings: BTreeSet::from([mapping]),
                message: messages.into_iter().collect::<Vec<_>>().join("; "),
            })
            .collect(),
    )
}

/// How `nft` is reached: the program on `PATH`, or (in unprivileged tests) a fake holding a
/// ruleset in memory.
pub trait NftRunner: Send + Sync + std::fmt::Debug {
    /// Runs `nft <args>` with `stdin` piped in: stdout, or what nft printed on stderr.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String>;
}

/// The `nft` program.
#[derive(Debug)]
struct Program(String);

impl NftRunner for Program {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write as _;
        let mut child = Command::new(&self.0)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("running {}: {e}", self.0))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .map_err(|e| format!("writing to nft: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("waiting for nft: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// kuport's nftables table, through an [`NftRunner`].
#[derive(Clone, Debug)]
pub struct Nft {
    runner: std::sync::Arc<dyn NftRunner>,
}

impl Default for Nft {
    fn default() -> Self {
        Self::with_runner(std::sync::Arc::new(Program("nft".to_owned())))
    }
}

/// One counter's values as the kernel holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterReading {
    /// Counter object name.
    pub name: String,
    /// Packets counted.
    pub packets: u64,
    /// Bytes counted.
    pub bytes: u64,
}

impl Nft {
    /// An `nft` found on `PATH`.
    pub fn new() -> Self {
        Self::default()
    }

    /// nft reached through `runner`.
    pub fn with_runner(runner: std::sync::Arc<dyn NftRunner>) -> Self {
        Self { runner }
    }

    fn run(
        &self,
        op: &'static str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, HostError> {
        self.runner
            .run(args, stdin)
            .map_err(|detail| HostError::Nft { op, detail })
    }

    /// `nft list table ip kuport` with counter values zeroed; `None` when the table is absent.
    pub fn listing(&self) -> Result<Option<String>, HostError> {
        if !self.table_exists()? {
            return Ok(None);
        }
        let text = self.run("list table", &["list", "table", "ip", TABLE], None)?;
        Ok(Some(zero_counters(&text)))
    }

    fn table_exists(&self) -> Result<bool, HostError> {
        let tables = self.run("list tables", &["-j", "list", "tables", "ip"], None)?;
        let json: Value = serde_json::from_str(&tables).map_err(|e| HostError::Nft {
            op: "list tables",
            detail: format!("unreadable JSON: {e}"),
        })?;
        Ok(objects(&json, "table").any(|t| t["name"] == TABLE))
    }

    /// Brings the kernel's table to `desired` in one transaction. Nothing is sent when the
    /// kernel already lists exactly the desired table. When nft refuses lines that belong to
    /// mappings, those mappings' rules are left out and the rest is sent again (nft names every
    /// refused line of a batch at once, so one retry is the rule); a refusal of anything that
    /// belongs to no mapping fails the whole apply and the kernel keeps its previous table.
    pub fn apply(&self, desired: &NftTable) -> Result<NftApplied, HostError> {
        let current = self.listing()?;
        let wanted = nft_text(desired);
        match &current {
            Some(text) if *text == wanted => return Ok(NftApplied::default()),
            None if desired.is_empty() => return Ok(NftApplied::default()),
            _ => {}
        }
        let (existing, recreate) = match current {
            None => (Vec::new(), false),
            // The kernel cannot change a chain's type, hook or priority in place: start over.
            Some(_) if !desired.is_empty() && !self.chains_match()? => (Vec::new(), true),
            Some(_) => (self.counter_names()?.into_iter().collect(), false),
        };
        let owners = desired.owners();
        let mut table = Cow::Borrowed(desired);
        let mut refused = Vec::new();
        for round in 1..=MAX_ISOLATION_ROUNDS {
            let lines = transaction_lines(&table, &existing, recreate);
            let detail = match self.send(&script(&lines)) {
                Ok(()) => break,
                Err(HostError::Nft { detail, .. }) if round < MAX_ISOLATION_ROUNDS => detail,
                Err(e) => return Err(e),
            };
            let Some(these) = refused_mappings(&detail, &lines, &owners) else {
                return Err(HostError::Nft {
                    op: "apply transaction",
                    detail,
                });
            };
            let cut = Refusal::mappings_of(&these);
            drop(lines);
            table = Cow::Owned(table.without_mappings(&cut));
            refused.extend(these);
        }
        if !table.is_empty() {
            self.check_hooks()?;
        }
        Ok(NftApplied {
            changed: true,
            refused,
        })
    }

    fn send(&self, script: &str) -> Result<(), HostError> {
        self.run("apply transaction", &["-f", "-"], Some(script))
            .map(|_| ())
    }

    /// Removes kuport's table, if present.
    pub fn teardown(&self) -> Result<bool, HostError> {
        if !self.table_exists()? {
            return Ok(false);
        }
        self.send(&format!("delete table ip {TABLE}\n"))?;
        Ok(true)
    }

    fn chains_json(&self) -> Result<Value, HostError> {
        let text = self.run("list chains", &["-j", "list", "table", "ip", TABLE], None)?;
        serde_json::from_str(&text).map_err(|e| HostError::Nft {
            op: "list table",
            detail: format!("unreadable JSON: {e}"),
        })
    }

    /// True when every kuport chain exists with the type, hook and priority it must have.
    fn chains_match(&self) -> Result<bool, HostError> {
        let json = self.chains_json()?;
        Ok(ChainId::ALL.iter().all(|c| {
            objects(&json, "chain").any(|ch| {
                ch["name"] == c.name()
                    && ch["type"] == c.chain_type()
                    && ch["hook"] == hook_name(c.hook())
                    && ch["prio"] == c.priority()
            })
        }))
    }

    /// nft accepts a chain whose priority it cannot parse, reports success and leaves the chain
    /// without a hook (its rules then never run); check every chain really hooked.
    fn check_hooks(&self) -> Result<(), HostError> {
        if self.chains_match()? {
            return Ok(());
        }
        Err(HostError::Nft {
            op: "verify chains",
            detail: "a kuport chain lacks its hook or priority after the transaction".to_owned(),
        })
    }

    fn counter_names(&self) -> Result<BTreeSet<String>, HostError> {
        Ok(self.counters()?.into_iter().map(|c| c.name).collect())
    }

    /// Every named counter in kuport's table.
    pub fn counters(&self) -> Result<Vec<CounterReading>, HostError> {
        if !self.table_exists()? {
            return Ok(Vec::new());
        }
        let json = self.chains_json()?;
        let mut out: Vec<CounterReading> = objects(&json, "counter")
            .filter_map(|c| {
                Some(CounterReading {
                    name: c["name"].as_str()?.to_owned(),
                    packets: c["packets"].as_u64().unwrap_or(0),
                    bytes: c["bytes"].as_u64().unwrap_or(0),
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

impl Nft {
    /// What the host's other nftables tables are known to do to mapped traffic: every base
    /// chain on the forward hook whose policy is drop. A mapped request is forwarded to the pod
    /// after DNAT, so such a chain drops it unless one of its rules accepts it; kuport cannot
    /// judge those rules, so this is reported, not acted on.
    pub fn firewall_warnings(&self) -> Result<Vec<String>, HostError> {
        let text = self.run("list chains", &["-j", "list", "chains"], None)?;
        let json: Value = serde_json::from_str(&text).map_err(|e| HostError::Nft {
            op: "list chains",
            detail: format!("unreadable JSON: {e}"),
        })?;
        Ok(forward_drop_warnings(&json))
    }
}

/// The forward-hook base chains with policy drop outside kuport's table, one sentence each,
/// sorted.
pub fn forward_drop_warnings(json: &Value) -> Vec<String> {
    let mut out: Vec<String> = objects(json, "chain")
        .filter(|c| c["hook"] == "forward" && c["policy"] == "drop")
        .filter(|c| !(c["family"] == "ip" && c["table"] == TABLE))
        .map(|c| {
            format!(
                "the host firewall's chain {} {} {} (forward hook, priority {}) drops forwarded packets by default: mapped traffic is forwarded to the pod and needs a rule there that accepts it",
                c["family"].as_str().unwrap_or("?"),
                c["table"].as_str().unwrap_or("?"),
                c["name"].as_str().unwrap_or("?"),
                c["prio"]
            )
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The objects of one kind in an `nft -j list` answer.
fn objects<'a>(json: &'a Value, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    json["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(move |o| o.get(kind))
}

/// Replaces counter values by zero, so a listing compares with the rendering.
pub fn zero_counters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("packets ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "packets ".len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let tail = &after[digits..];
        if digits > 0 && tail.starts_with(" bytes ") {
            let b = &tail[" bytes ".len()..];
            let bdigits = b.bytes().take_while(u8::is_ascii_digit).count();
            if bdigits > 0 {
                out.push_str("packets 0 bytes 0");
                rest = &b[bdigits..];
                continue;
            }
        }
        out.push_str("packets ");
        rest = after;
    }
    out.push_str(rest);
    out
}

fn hook_name(hook: Hook) -> &'static str {
    match hook {
        Hook::Prerouting => "prerouting",
        Hook::Postrouting => "postrouting",
        Hook::Forward => "forward",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroes_counter_values_only() {
        let text = "counter x {\n\t\tpackets 12 bytes 3456\n\t}\n\tudp dport 3000 counter packets 1 bytes 2 dnat\n comment \"packets a\"";
        assert_eq!(
            zero_counters(text),
            "counter x {\n\t\tpackets 0 bytes 0\n\t}\n\tudp dport 3000 counter packets 0 bytes 0 dnat\n comment \"packets a\""
        );
    }

    fn table() -> NftTable {
        use kuport_core::api::Protocol;
        use kuport_core::ir::{Counter, DnatRule, PortRange, Rule};
        let dnat = |name: &str, port: u16| {
            Rule::Dnat(DnatRule {
                iif: "wt0".into(),
                mark: Some(1),
                protocol: Protocol::Udp,
                ports: PortRange::single(port),
                to: "10.244.1.5".parse().expect("ip"),
                to_port: None,
                counter: format!("pre/games/{name}"),
                comment: format!("games/{name}"),
            })
        };
        let counter = |name: &str| Counter {
            name: format!("pre/games/{name}"),
            chain: ChainId::Pre,
            namespace: "games".into(),
            mapping: name.into(),
        };
        NftTable {
            marks: Default::default(),
            counters: vec![counter("a"), counter("b")],
            chains: vec![
                (ChainId::Pre, vec![dnat("a", 3000), dnat("b", 3001)]),
                (ChainId::Fwd, vec![Rule::ClampMssOut]),
            ],
        }
    }

    fn line_of(lines: &[(String, LineOf<'_>)], wanted: impl Fn(&LineOf<'_>) -> bool) -> usize {
        lines.iter().position(|(_, of)| wanted(of)).expect("line") + 1
    }

    fn fake() -> (std::sync::Arc<crate::nft_fake::FakeNft>, Nft) {
        let fake = std::sync::Arc::new(crate::nft_fake::FakeNft::default());
        (fake.clone(), Nft::with_runner(fake))
    }

    fn only(table: &NftTable, mapping: &str) -> NftTable {
        let gone: BTreeSet<String> = [format!("games/{mapping}")].into_iter().collect();
        table.without_mappings(&gone)
    }

    #[test]
    fn a_first_apply_sends_one_transaction_and_a_second_sends_none() {
        let (fake, nft) = fake();
        let table = table();
        let applied = nft.apply(&table).expect("apply");
        assert!(applied.changed && applied.refused.is_empty());
        assert_eq!(nft.listing().expect("listing"), Some(nft_text(&table)));
        assert!(!nft.apply(&table).expect("again").changed);
        assert_eq!(fake.lock().committed, 1, "an unchanged table sends nothing");
        // Control: a changed table is sent.
        assert!(nft.apply(&only(&table, "a")).expect("changed").changed);
        assert_eq!(fake.lock().committed, 2);
    }

    #[test]
    fn a_chain_with_the_wrong_priority_is_recreated() {
        let (fake, nft) = fake();
        let table = table();
        nft.apply(&table).expect("apply");
        // An older agent's chain at another priority: the kernel cannot change it in place.
        if let Some(t) = fake.lock().table.as_mut() {
            let steer = t
                .chains
                .get_mut(ChainId::Steer.name())
                .expect("steer chain");
            steer.priority = -160;
            steer.rules.push("meta mark 0x1 accept".into());
        }
        let applied = nft.apply(&table).expect("recreated");
        assert!(applied.changed);
        assert_eq!(nft.listing().expect("listing"), Some(nft_text(&table)));
        let steer =
            fake.lock().table.as_ref().expect("table").chains[ChainId::Steer.name()].clone();
        assert_eq!(steer.priority, ChainId::Steer.priority());
    }

    #[test]
    fn vanished_mappings_lose_their_counters_and_kept_ones_keep_their_counts() {
        let (fake, nft) = fake();
        let table = table();
        nft.apply(&table).expect("apply");
        if let Some(t) = fake.lock().table.as_mut() {
            t.counters.insert("pre/games/b".into(), (5, 500));
        }
        nft.apply(&only(&table, "a")).expect("apply without a");
        let counters = nft.counters().expect("counters");
        let names: Vec<&str> = counters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["pre/games/b"]);
        assert_eq!((counters[0].packets, counters[0].bytes), (5, 500));
    }

    #[test]
    fn a_refused_mapping_is_left_out_and_the_rest_applied() {
        let (fake, nft) = fake();
        let table = table();
        fake.lock().refuse = vec![(
            "games/b".into(),
            "Could not process rule: Operation not supported".into(),
        )];
        let applied = nft.apply(&table).expect("the rest is applied");
        assert_eq!(applied.refused.len(), 1, "{:?}", applied.refused);
        assert_eq!(
            applied.refused[0].mappings,
            BTreeSet::from(["games/b".to_owned()])
        );
        assert_eq!(
            applied.refused[0].message,
            "Could not process rule: Operation not supported"
        );
        assert_eq!(
            nft.listing().expect("listing"),
            Some(nft_text(&only(&table, "b")))
        );
        let s = fake.lock();
        assert_eq!((s.committed, s.refused), (1, 1));
    }

    #[test]
    fn a_refusal_of_no_mapping_fails_the_apply_and_changes_nothing() {
        let (fake, nft) = fake();
        let table = table();
        nft.apply(&only(&table, "b")).expect("first");
        fake.lock().refuse = vec![("maxseg".into(), "Could not process rule: Bad".into())];
        let err = nft
            .apply(&table)
            .expect_err("the MSS clamp belongs to no mapping");
        assert!(
            err.to_string().contains("Could not process rule: Bad"),
            "{err}"
        );
        assert_eq!(
            nft.listing().expect("listing"),
            Some(nft_text(&only(&table, "b"))),
            "the previous table stands"
        );
    }

    #[test]
    fn an_empty_table_removes_kuports_table() {
        let (fake, nft) = fake();
        nft.apply(&table()).expect("apply");
        assert!(nft.apply(&NftTable::default()).expect("empty").changed);
        assert!(fake.lock().table.is_none());
        assert_eq!(nft.listing().expect("listing"), None);
        assert!(!nft.teardown().expect("teardown"), "nothing left to remove");
    }

    #[test]
    fn refused_lines_are_traced_to_their_mappings() {
        let table = table();
        let owners = table.owners();
        let lines = transaction_lines(&table, &[], false);
        let rule_b = line_of(
            &lines,
            |of| matches!(of, LineOf::Rule(kuport_core::ir::Rule::Dnat(d)) if d.comment == "games/b"),
        );
        let counter_b = line_of(
            &lines,
            |of| matches!(of, LineOf::Counter(c) if c.mapping == "b"),
        );
        let detail = format!(
            "/dev/stdin:{counter_b}:18-40: Error: name too long, 256 characters maximum allowed\n\
             add counter ip kuport pre/games/b\n                 ^^^^\n\
             /dev/stdin:{rule_b}:42-44: Error: Could not process rule: No such file or directory\n\
             add rule ip kuport kup-pre ...\n"
        );
        let refused = refused_mappings(&detail, &lines, &owners).expect("traced");
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].mappings, BTreeSet::from(["games/b".to_owned()]));
        assert_eq!(
            refused[0].message,
            "Could not process rule: No such file or directory; name too long, 256 characters maximum allowed"
        );

        // A refused line of no mapping (the MSS clamp, a chain) fails the whole apply.
        let clamp = line_of(&lines, |of| {
            matches!(of, LineOf::Rule(kuport_core::ir::Rule::ClampMssOut))
        });
        let detail = format!("/dev/stdin:{clamp}:1-5: Error: Could not process rule: Bad");
        assert_eq!(refused_mappings(&detail, &lines, &owners), None);
        let detail = "/dev/stdin:3:1-5: Error: Could not process rule: Bad";
        assert_eq!(refused_mappings(detail, &lines, &owners), None);
        // An answer that names no line cannot be traced either.
        assert_eq!(
            refused_mappings(
                "netlink: Error: cache initialization failed",
                &lines,
                &owners
            ),
            None
        );
        let far = format!("/dev/stdin:{}:1-5: Error: x", lines.len() + 5);
        assert_eq!(refused_mappings(&far, &lines, &owners), None);
    }

    #[test]
    fn only_foreign_forward_chains_with_drop_policy_are_reported() {
        let json: Value = serde_json::from_str(
            r#"{"nftables": [
              {"metainfo": {"version": "1.0.6"}},
              {"chain": {"family": "inet", "table": "filter", "name": "forward", "handle": 1,
                         "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}},
              {"chain": {"family": "inet", "table": "filter", "name": "input", "handle": 2,
                         "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
              {"chain": {"family": "ip", "table": "mesh", "name": "fwd", "handle": 3,
                         "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
              {"chain": {"family": "ip", "table": "kuport", "name": "kup-fwd", "handle": 4,
                         "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}},
              {"chain": {"family": "ip", "table": "filter", "name": "FORWARD", "handle": 5,
                         "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}},
              {"chain": {"family": "ip", "table": "filter", "name": "DOCKER", "handle": 6}}
            ]}"#,
        )
        .expect("json");
        let got = forward_drop_warnings(&json);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].contains("chain inet filter forward (forward hook, priority 0)"));
        assert!(got[1].contains("chain ip filter FORWARD"));
    }
}
