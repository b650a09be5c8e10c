//! kuport's nftables table, applied by the `nft` program in text transactions. The table the
//! plan wants is laid out as a few lookup rules over sets and maps (`kuport_core::render::layout`);
//! an apply diffs it against what the kernel holds and sends only the difference, in one
//! atomic transaction, so a refused batch leaves the previous table in place. The transaction
//! (`kuport_core::render::Transaction`) is written by `kuport-core`: this module runs nft, reads
//! which lines it refused and asks the transaction to leave their mappings out.
//!
//! What the kernel holds is known without listing it while the ruleset generation
//! (`nft_generation.rs`) is the one kuport last saw: then nobody has committed anything
//! since. Otherwise the table is listed once and parsed.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::{Arc, Mutex};

use kuport_core::ir::{ChainId, Family, MarkLayout, NftTable, Rule, TABLE};
use kuport_core::render::layout::{Planned, chain_header, layout, parse_listing};
use kuport_core::render::{Transaction, rule_text};
use serde_json::Value;

use crate::error::HostError;
use crate::nft_events::Committers;
use crate::report::Refusal;

/// How many transactions one apply may send while leaving refused mappings out.
const MAX_ISOLATION_ROUNDS: usize = 4;

/// What an nftables apply did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NftApplied {
    /// Whether a transaction was sent.
    pub changed: bool,
    /// Mappings whose rules nft refused; the rest of the table was applied.
    pub refused: Vec<Refusal>,
    /// Lines the transaction sent (0 when nothing changed).
    pub lines: usize,
    /// True when the kernel's table was listed (the ruleset changed since kuport last saw it).
    pub listed: bool,
}

/// The lines nft refused, by number, each with what nft said of it; `None` when its answer
/// names no line (or one it cannot be read from).
fn refused_lines(detail: &str) -> Option<Vec<(usize, String)>> {
    let mut refused = Vec::new();
    for error in detail.lines().filter(|l| l.contains(": Error: ")) {
        // `/dev/stdin:12:30-38: Error: Could not process rule: No such file or directory`
        let (location, message) = error.split_once(": Error: ")?;
        let number: usize = location.split(':').nth(1)?.parse().ok()?;
        refused.push((number, message.trim().to_owned()));
    }
    (!refused.is_empty()).then_some(refused)
}

/// Leaves out of `transaction` the mappings behind the lines nft refused (its answer
/// `detail`), and returns one refusal per mapping with nft's words; `None`, leaving the
/// transaction as it was, when a refused line belongs to no mapping (or the answer names no
/// line).
fn leave_out_refused(detail: &str, transaction: &mut Transaction<'_>) -> Option<Vec<Refusal>> {
    let refused = refused_lines(detail)?;
    let numbers: Vec<usize> = refused.iter().map(|(number, _)| *number).collect();
    let owners = transaction.leave_out_owners_of(&numbers)?;
    let mut by_mapping: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (owner, (_, message)) in owners.into_iter().zip(refused) {
        by_mapping.entry(owner).or_default().insert(message);
    }
    Some(
        by_mapping
            .into_iter()
            .map(|(mapping, messages)| {
                Refusal::of_rules(mapping, messages.into_iter().collect::<Vec<_>>().join("; "))
            })
            .collect(),
    )
}

/// How `nft` is reached: the program on `PATH`, or (in unprivileged tests) a fake holding a
/// ruleset in memory.
pub trait NftRunner: Send + Sync + std::fmt::Debug {
    /// Runs `nft <args>` with `stdin` piped in: stdout, or what nft printed on stderr.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String>;

    /// The ruleset generation, when it can be read; `None` makes every verify list the table.
    fn generation(&self) -> Option<u32> {
        None
    }
}

/// The `nft` program, recording each one it starts in `committers` (so its commits are known
/// as the agent's own when announced, `nft_events.rs`).
#[derive(Debug)]
struct Program {
    path: String,
    committers: Arc<Committers>,
}

impl NftRunner for Program {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write as _;
        let mut child = Command::new(&self.path)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("running {}: {e}", self.path))?;
        // Before its script: it cannot have committed anything yet.
        self.committers.record(child.id());
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

    fn generation(&self) -> Option<u32> {
        match crate::nft_generation::read() {
            Ok(g) => Some(g),
            Err(e) => {
                warn_once(&e);
                None
            }
        }
    }
}

/// The generation is an optimisation: when it cannot be read, every verify lists the table.
/// Said once, not on every pass.
fn warn_once(message: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!("reading the nftables generation: {message}; every verify lists the table");
    });
}

/// What kuport last knew of the kernel's nftables, and at which ruleset generation: per family
/// (indexed by [`slot`]), shared by the two [`Nft`]s of a host, so one's commit does not make
/// the other list its table again.
#[derive(Debug, Default)]
struct Seen {
    /// kuport's table (`None`: absent) as it stood at a generation.
    table: [Option<(u32, Option<Arc<Planned>>)>; 2],
    /// The last desired table and its layout: a pass that wants the same table (most of them)
    /// does not lay 5,000 mappings out again.
    planned: [Option<(NftTable, Arc<Planned>)>; 2],
    /// The host firewall's warnings as they stood at a generation.
    warnings: Option<(u32, Vec<String>)>,
}

/// The index of a family's entries in [`Seen`].
fn slot(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

/// kuport's nftables table of one family, through an [`NftRunner`].
#[derive(Clone, Debug)]
pub struct Nft {
    family: Family,
    runner: Arc<dyn NftRunner>,
    seen: Arc<Mutex<Seen>>,
    committers: Arc<Committers>,
}

impl Default for Nft {
    fn default() -> Self {
        let committers = Arc::new(Committers::default());
        let program = Program {
            path: "nft".to_owned(),
            committers: committers.clone(),
        };
        Self {
            committers,
            ..Self::with_runner(Arc::new(program))
        }
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

/// True for nft's answer about an object that does not exist.
fn absent(detail: &str) -> bool {
    detail.contains("No such file or directory")
}

impl Nft {
    /// An `nft` found on `PATH`.
    pub fn new() -> Self {
        Self::default()
    }

    /// nft reached through `runner`.
    pub fn with_runner(runner: Arc<dyn NftRunner>) -> Self {
        Self {
            family: Family::V4,
            runner,
            seen: Arc::default(),
            committers: Arc::default(),
        }
    }

    /// The same nft for the table of `family`: it shares what this one knows of the ruleset,
    /// so a commit of either is known to both.
    pub fn sibling(&self, family: Family) -> Self {
        Self {
            family,
            ..self.clone()
        }
    }

    /// The `nft` processes this host ran lately, whose commits are its own.
    pub fn committers(&self) -> Arc<Committers> {
        self.committers.clone()
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

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// kuport's table as the kernel lists it, parsed; `None` when the table is absent.
    pub fn read(&self) -> Result<Option<kuport_core::render::Listing>, HostError> {
        self.read_with(&["list", "table", self.family.nft(), TABLE])
    }

    fn read_with(&self, args: &[&str]) -> Result<Option<kuport_core::render::Listing>, HostError> {
        let text = match self.runner.run(args, None) {
            Ok(text) => text,
            Err(detail) if absent(&detail) => return Ok(None),
            Err(detail) => {
                return Err(HostError::Nft {
                    op: "list table",
                    detail,
                });
            }
        };
        parse_listing(&text)
            .map(Some)
            .map_err(|detail| HostError::Nft {
                op: "read the table listing",
                detail,
            })
    }

    /// The kernel's table: remembered when the generation is the one it was seen at, else
    /// listed. The second value says whether it was listed.
    fn current(&self, generation: Option<u32>) -> Result<(Option<Arc<Planned>>, bool), HostError> {
        if let Some(g) = generation
            && let Some((seen_at, table)) = &self.seen().table[slot(self.family)]
            && *seen_at == g
        {
            return Ok((table.clone(), false));
        }
        let listed = self.read()?.map(|l| {
            Arc::new(Planned {
                layout: l.layout,
                owners: Default::default(),
            })
        });
        Ok((listed, true))
    }

    fn remember(&self, generation: Option<u32>, table: Option<Arc<Planned>>) {
        self.seen().table[slot(self.family)] = generation.map(|g| (g, table));
    }

    /// Our own commit moved the generation from `before` to `after`: the other family's table,
    /// seen at `before`, is unchanged at `after`.
    fn carry_sibling(&self, before: u32, after: u32) {
        let other = slot(match self.family {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        });
        if let Some((seen_at, _)) = &mut self.seen().table[other]
            && *seen_at == before
        {
            *seen_at = after;
        }
    }

    /// Brings the kernel's table to `desired`, sending only what differs. Nothing is sent
    /// when the kernel already holds exactly the desired table. When nft refuses lines that
    /// belong to mappings, those mappings are left out and the rest is sent again (nft names
    /// every refused line of a batch at once, so one retry is the rule); a refusal of anything
    /// that belongs to no mapping fails the whole apply and the kernel keeps its previous table.
    pub fn apply(&self, desired: &NftTable) -> Result<NftApplied, HostError> {
        if desired.family != self.family {
            return Err(HostError::Nft {
                op: "apply transaction",
                detail: format!(
                    "an {} table handed to the {} table's writer",
                    desired.family, self.family
                ),
            });
        }
        let before = self.runner.generation();
        let (current, listed) = self.current(before)?;
        let held = current.as_deref().map(|c| &c.layout);
        let Some(mut transaction) = Transaction::between(held, desired, self.planned(desired))
        else {
            self.remember(before, current.clone());
            return Ok(NftApplied {
                listed,
                ..NftApplied::default()
            });
        };
        let refused = self.send(&mut transaction)?;
        if transaction.creates_chains() {
            self.check_hooks().map_err(|e| self.forget(e))?;
        }
        let after = self.runner.generation();
        // Our one commit bumps the generation by one (by none when the kernel found nothing to
        // change); more means someone else committed too, and only a listing can tell what.
        let ours =
            matches!((before, after), (Some(b), Some(a)) if a == b || a == b.wrapping_add(1));
        let lines = transaction.line_count();
        if ours && let (Some(b), Some(a)) = (before, after) {
            self.carry_sibling(b, a);
        }
        self.remember(
            if ours { after } else { None },
            transaction.into_committed(),
        );
        Ok(NftApplied {
            changed: true,
            refused,
            lines,
            listed,
        })
    }

    /// Sends `transaction`. While nft refuses only lines of mappings, those mappings are left
    /// out and the rest is sent again, at most [`MAX_ISOLATION_ROUNDS`] times in all; returns
    /// what was left out. On an error the kernel keeps its previous table.
    fn send(&self, transaction: &mut Transaction<'_>) -> Result<Vec<Refusal>, HostError> {
        let mut refused = Vec::new();
        let mut round = 1;
        loop {
            let detail = match self.run(
                "apply transaction",
                &["-f", "-"],
                Some(transaction.script()),
            ) {
                Ok(_) => return Ok(refused),
                Err(HostError::Nft { detail, .. }) if round < MAX_ISOLATION_ROUNDS => detail,
                Err(e) => return Err(self.forget(e)),
            };
            let Some(these) = leave_out_refused(&detail, transaction) else {
                return Err(self.forget(HostError::Nft {
                    op: "apply transaction",
                    detail,
                }));
            };
            refused.extend(these);
            round += 1;
        }
    }

    /// The layout of `desired`, reused when it is the table the last apply wanted.
    fn planned(&self, desired: &NftTable) -> Arc<Planned> {
        if let Some((table, planned)) = &self.seen().planned[slot(self.family)]
            && table == desired
        {
            return planned.clone();
        }
        let planned = Arc::new(layout(desired));
        self.seen().planned[slot(self.family)] = Some((desired.clone(), planned.clone()));
        planned
    }

    fn forget(&self, error: HostError) -> HostError {
        self.remember(None, None);
        error
    }

    /// Removes kuport's table, if present.
    pub fn teardown(&self) -> Result<bool, HostError> {
        self.remember(None, None);
        match self.runner.run(
            &["-f", "-"],
            Some(&format!("delete table {} {TABLE}\n", self.family.nft())),
        ) {
            Ok(_) => Ok(true),
            Err(detail) if absent(&detail) => Ok(false),
            Err(detail) => Err(HostError::Nft {
                op: "delete table",
                detail,
            }),
        }
    }

    /// nft accepts a chain whose priority it cannot parse, reports success and leaves the chain
    /// without a hook (its rules then never run); check every chain really hooked. The terse
    /// listing leaves the elements out.
    fn check_hooks(&self) -> Result<(), HostError> {
        let listing = self.read_with(&["-t", "list", "table", self.family.nft(), TABLE])?;
        let hooked = listing.is_some_and(|l| {
            ChainId::ALL.iter().all(|c| {
                l.layout
                    .chains
                    .get(c.name())
                    .is_some_and(|ch| ch.header == chain_header(*c))
            })
        });
        if hooked {
            return Ok(());
        }
        Err(HostError::Nft {
            op: "verify chains",
            detail: "a kuport chain lacks its hook or priority after the transaction".to_owned(),
        })
    }

    /// The link ports the kernel's table guards: its `kup-guard` chain is hooked where kuport
    /// puts it and holds, for each port, the drop rule kuport writes. Read after a failed
    /// transaction, when what the kernel kept is not known, to tell which links may stay up.
    pub fn guarded_ports(&self) -> Result<BTreeSet<u16>, HostError> {
        let Some(listing) = self.read_with(&["-t", "list", "table", "ip", TABLE])? else {
            return Ok(BTreeSet::new());
        };
        let guard = ChainId::Guard;
        let Some(chain) = listing
            .layout
            .chains
            .get(guard.name())
            .filter(|c| c.header == chain_header(guard))
        else {
            return Ok(BTreeSet::new());
        };
        // The guard's rules name no mark: any layout renders them alike.
        let drops =
            |port: u16| rule_text(&Rule::guard_drop(port), MarkLayout::default(), Family::V4);
        Ok(chain
            .rules
            .iter()
            .filter_map(|rule| {
                let port: u16 = rule
                    .strip_prefix("udp dport ")?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()?;
                (*rule == drops(port)).then_some(port)
            })
            .collect())
    }

    /// Every named counter in kuport's table, sorted by name: one `nft list counters`.
    pub fn counters(&self) -> Result<Vec<CounterReading>, HostError> {
        let Some(listing) =
            self.read_with(&["list", "counters", "table", self.family.nft(), TABLE])?
        else {
            return Ok(Vec::new());
        };
        Ok(listing
            .counters
            .into_iter()
            .map(|(name, (packets, bytes))| CounterReading {
                name,
                packets,
                bytes,
            })
            .collect())
    }
}

impl Nft {
    /// What the host's other nftables tables are known to do to mapped traffic: every base
    /// chain on the forward hook whose policy is drop. A mapped request is forwarded to the pod
    /// after DNAT, so such a chain drops it unless one of its rules accepts it; kuport cannot
    /// judge those rules, so this is reported, not acted on. Read again only when the ruleset
    /// generation moved.
    pub fn firewall_warnings(&self) -> Result<Vec<String>, HostError> {
        let generation = self.runner.generation();
        if let Some(g) = generation
            && let Some((seen_at, warnings)) = &self.seen().warnings
            && *seen_at == g
        {
            return Ok(warnings.clone());
        }
        let text = self.run("list chains", &["-j", "list", "chains"], None)?;
        let json: Value = serde_json::from_str(&text).map_err(|e| HostError::Nft {
            op: "list chains",
            detail: format!("unreadable JSON: {e}"),
        })?;
        let warnings = forward_drop_warnings(&json);
        self.seen().warnings = generation.map(|g| (g, warnings.clone()));
        Ok(warnings)
    }
}

/// The forward-hook base chains with policy drop outside kuport's table, one sentence each,
/// sorted.
pub fn forward_drop_warnings(json: &Value) -> Vec<String> {
    let mut out: Vec<String> = objects(json, "chain")
        .filter(|c| c["hook"] == "forward" && c["policy"] == "drop")
        .filter(|c| !((c["family"] == "ip" || c["family"] == "ip6") && c["table"] == TABLE))
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

#[cfg(test)]
mod tests {
    use super::*;
    use kuport_core::api::Protocol;
    use kuport_core::ir::{Counter, DnatRule, PortRange, Rule, SnatRule};
    use kuport_core::render::Layout;

    fn dnat(name: &str, ports: PortRange, to: &str) -> Rule {
        Rule::Dnat(DnatRule {
            iif: "wt0".into(),
            mark: Some(1),
            protocol: Protocol::Udp,
            ports,
            to: to.parse().expect("ip"),
            to_port: None,
            counter: format!("pre/games/{name}").into(),
            comment: format!("games/{name}").into(),
        })
    }

    fn snat(name: &str, ports: PortRange, to: &str) -> Rule {
        Rule::IdentitySnat(SnatRule {
            daddr: to.parse().expect("ip"),
            protocol: Protocol::Udp,
            ports,
            counter: format!("post/games/{name}").into(),
            comment: format!("games/{name}").into(),
        })
    }

    fn counter(chain: ChainId, name: &str) -> Counter {
        Counter {
            name: format!("{}/games/{name}", chain.label()).into(),
            chain,
            namespace: "games".into(),
            mapping: name.into(),
        }
    }

    /// Mappings `a`..: single ports from 3000, and `r`, a range, each to its own pod.
    fn table_of(names: &[&str]) -> NftTable {
        let mut pre = Vec::new();
        let mut post = Vec::new();
        let mut counters = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ports = if *name == "r" {
                PortRange {
                    first: 4000,
                    last: 4010,
                }
            } else {
                PortRange::single(3000 + i as u16)
            };
            let pod = format!("10.244.1.{}", i + 5);
            pre.push(dnat(name, ports, &pod));
            post.push(snat(name, ports, &pod));
            counters.push(counter(ChainId::Pre, name));
            counters.push(counter(ChainId::Post, name));
        }
        let mut state = kuport_core::ir::HostState {
            nft: NftTable {
                family: Family::V4,
                marks: Default::default(),
                counters,
                chains: vec![
                    (ChainId::Pre, pre),
                    (ChainId::Post, post),
                    (ChainId::Fwd, vec![Rule::ClampMssOut]),
                ],
                hairpin_sources: Vec::new(),
                hairpin_external: Vec::new(),
            },
            ..Default::default()
        };
        state.normalise();
        state.nft
    }

    fn table() -> NftTable {
        table_of(&["a", "b"])
    }

    fn fake() -> (Arc<crate::nft_fake::FakeNft>, Nft) {
        let fake = Arc::new(crate::nft_fake::FakeNft::default());
        (fake.clone(), Nft::with_runner(fake))
    }

    fn only(table: &NftTable, mapping: &str) -> NftTable {
        let gone: BTreeSet<String> = [format!("games/{mapping}")].into_iter().collect();
        table.without_mappings(&gone)
    }

    /// Another program's commit: changes kuport's table in the fake and moves the generation.
    fn tamper(
        fake: &crate::nft_fake::FakeNft,
        change: impl FnOnce(&mut crate::nft_fake::FakeTable),
    ) {
        let mut s = fake.lock();
        s.generation += 1;
        change(s.table.as_mut().expect("table"));
    }

    /// The kernel's table as kuport reads it.
    fn held(nft: &Nft) -> Option<Layout> {
        nft.read().expect("listing").map(|l| l.layout)
    }

    #[test]
    fn a_first_apply_sends_one_transaction_and_an_unchanged_one_neither_sends_nor_lists() {
        let (fake, nft) = fake();
        let table = table();
        let applied = nft.apply(&table).expect("apply");
        assert!(applied.changed && applied.refused.is_empty());
        assert_eq!(held(&nft), Some(layout(&table).layout));
        let listed = fake.lock().listed;
        let again = nft.apply(&table).expect("again");
        assert!(!again.changed && !again.listed, "{again:?}");
        let s = fake.lock();
        assert_eq!(s.committed, 1, "an unchanged table sends nothing");
        assert_eq!(s.listed, listed, "an unchanged generation needs no listing");
    }

    #[test]
    fn one_mapping_changed_sends_only_its_elements() {
        let (fake, nft) = fake();
        let names: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let table = table_of(&names);
        nft.apply(&table).expect("apply");
        // m7's pod moves: its DNAT target and its SNAT key change.
        let mut moved = table.clone();
        for (_, rules) in &mut moved.chains {
            for rule in rules.iter_mut() {
                match rule {
                    Rule::Dnat(d) if d.comment == "games/m7" => {
                        d.to = "10.244.9.9".parse().expect("ip")
                    }
                    Rule::IdentitySnat(s) if s.comment == "games/m7" => {
                        s.daddr = "10.244.9.9".parse().expect("ip")
                    }
                    _ => {}
                }
            }
        }
        let applied = nft.apply(&moved).expect("moved");
        // delete + add in the DNAT target map, delete + add in the SNAT counter map, the table.
        assert_eq!(applied.lines, 5, "{applied:?}");
        assert!(!applied.listed);
        assert_eq!(held(&nft), Some(layout(&moved).layout));
        assert_eq!(fake.lock().committed, 2);
    }

    /// The IPv4 and IPv6 writers share what they know of the ruleset: one's commit is not
    /// taken for another program's by the other, which would list its table again.
    #[test]
    fn a_commit_of_the_other_familys_table_is_not_a_foreign_change() {
        let (fake, nft) = fake();
        let nft6 = nft.sibling(Family::V6);
        let v4 = table();
        let mut v6 = table();
        v6.family = Family::V6;
        for (_, rules) in &mut v6.chains {
            for rule in rules.iter_mut() {
                match rule {
                    Rule::Dnat(d) => d.to = "fd00::5".parse().expect("ipv6"),
                    Rule::IdentitySnat(s) => s.daddr = "fd00::5".parse().expect("ipv6"),
                    _ => {}
                }
            }
        }
        nft.apply(&v4).expect("v4");
        nft6.apply(&v6).expect("v6");
        assert!(fake.lock().table6.is_some(), "the IPv6 table is written");
        let listed = fake.lock().listed;
        let again = nft.apply(&v4).expect("v4 again");
        let again6 = nft6.apply(&v6).expect("v6 again");
        assert!(!again.listed && !again6.listed && !again.changed && !again6.changed);
        assert_eq!(fake.lock().listed, listed, "neither table listed again");
        // Control: another program's commit makes both list.
        fake.lock().generation += 1;
        assert!(nft.apply(&v4).expect("v4 after").listed);
        assert!(nft6.apply(&v6).expect("v6 after").listed);
    }

    #[test]
    fn a_change_by_another_program_is_listed_and_repaired() {
        let (fake, nft) = fake();
        let table = table();
        nft.apply(&table).expect("apply");
        tamper(&fake, |t| {
            let store = t.stores.get_mut("post-port-count").expect("store");
            let first = store.elements.keys().next().cloned().expect("an element");
            store.elements.remove(&first);
        });
        let applied = nft.apply(&table).expect("repair");
        assert!(applied.changed && applied.listed, "{applied:?}");
        assert_eq!(
            applied.lines, 2,
            "the table and the one element: {applied:?}"
        );
        assert_eq!(held(&nft), Some(layout(&table).layout));
        // Control: without a generation, every apply lists, and an intact table sends nothing.
        fake.lock().no_generation = true;
        let applied = nft.apply(&table).expect("again");
        assert!(!applied.changed && applied.listed, "{applied:?}");
    }

    #[test]
    fn a_chain_with_the_wrong_priority_is_recreated() {
        let (fake, nft) = fake();
        let table = table();
        nft.apply(&table).expect("apply");
        tamper(&fake, |t| {
            let steer = t
                .chains
                .get_mut(ChainId::Steer.name())
                .expect("steer chain");
            steer.priority = -160;
            steer.rules.push("meta mark 0x1 accept".into());
        });
        let applied = nft.apply(&table).expect("recreated");
        assert!(applied.changed);
        assert_eq!(held(&nft), Some(layout(&table).layout));
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
        assert_eq!(names, ["post/games/b", "pre/games/b"]);
        assert_eq!((counters[1].packets, counters[1].bytes), (5, 500));
    }

    #[test]
    fn ranges_go_to_interval_maps_and_single_ports_to_hash_maps() {
        let (_, nft) = fake();
        let table = table_of(&["a", "r"]);
        nft.apply(&table).expect("apply");
        let held = held(&nft).expect("table");
        assert_eq!(
            held.stores["pre-mark-0x00000001-range-to"].flags,
            "interval"
        );
        assert_eq!(
            held.stores["pre-mark-0x00000001-range-to"].elements["\"wt0\" . udp . 4000-4010"],
            "10.244.1.6"
        );
        assert_eq!(held.stores["pre-mark-0x00000001-port-to"].flags, "");
        assert_eq!(
            held.stores["pre-mark-0x00000001-port-to"].elements["\"wt0\" . udp . 3000"],
            "10.244.1.5 . 3000"
        );
        // A range mapping gone: its stores and their lookup rule go with it.
        nft.apply(&only(&table, "r")).expect("without r");
        let held = nft.read().expect("listing").expect("table").layout;
        assert!(!held.stores.contains_key("pre-mark-0x00000001-range-to"));
        assert_eq!(held, layout(&only(&table, "r")).layout);
    }

    #[test]
    fn a_refused_mapping_is_left_out_and_the_rest_applied() {
        let (fake, nft) = fake();
        let table = table();
        fake.lock().refuse = vec![(
            "10.244.1.6".into(),
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
        assert_eq!(held(&nft), Some(layout(&only(&table, "b")).layout));
        let s = fake.lock();
        assert_eq!((s.committed, s.refused), (1, 1));
    }

    #[test]
    fn a_refusal_of_no_mapping_fails_the_apply_and_changes_nothing() {
        let (fake, nft) = fake();
        let table = table();
        nft.apply(&only(&table, "b")).expect("first");
        fake.lock().refuse = vec![("maxseg".into(), "Could not process rule: Bad".into())];
        // Another program's commit changed the clamp: the rule must be written again.
        tamper(&fake, |t| {
            t.chains
                .get_mut(ChainId::Fwd.name())
                .expect("fwd")
                .rules
                .clear();
        });
        let err = nft
            .apply(&table)
            .expect_err("the MSS clamp belongs to no mapping");
        assert!(
            err.to_string().contains("Could not process rule: Bad"),
            "{err}"
        );
        let held = held(&nft).expect("table");
        assert!(
            held.chains[ChainId::Fwd.name()].rules.is_empty(),
            "the previous table stands"
        );
        assert!(!held.counters.contains("pre/games/b"));
    }

    #[test]
    fn an_empty_table_removes_kuports_table() {
        let (fake, nft) = fake();
        nft.apply(&table()).expect("apply");
        assert!(nft.apply(&NftTable::default()).expect("empty").changed);
        assert!(fake.lock().table.is_none());
        assert_eq!(held(&nft), None);
        assert!(
            !nft.apply(&NftTable::default())
                .expect("still empty")
                .changed
        );
        assert!(!nft.teardown().expect("teardown"), "nothing left to remove");
    }

    #[test]
    fn refused_lines_are_traced_to_their_mappings() {
        let table = table();
        let fresh = || Transaction::between(None, &table, Arc::new(layout(&table))).expect("sent");
        let script = fresh().script().to_owned();
        let line_of =
            |wanted: &dyn Fn(&str) -> bool| script.lines().position(wanted).expect("line") + 1;
        let element_b = line_of(&|l| l.contains("10.244.1.6"));
        let counter_b = line_of(&|l| l == "add counter ip kuport pre/games/b");
        let detail = format!(
            "/dev/stdin:{counter_b}:18-40: Error: name too long, 256 characters maximum allowed\n\
             add counter ip kuport pre/games/b\n                 ^^^^\n\
             /dev/stdin:{element_b}:42-44: Error: Could not process rule: No such file or directory\n\
             add element ...\n"
        );
        let mut transaction = fresh();
        let refused = leave_out_refused(&detail, &mut transaction).expect("traced");
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].mappings, BTreeSet::from(["games/b".to_owned()]));
        assert_eq!(
            refused[0].message,
            "Could not process rule: No such file or directory; name too long, 256 characters maximum allowed"
        );
        // What is sent again is the table without the refused mapping.
        let rest = only(&table, "b");
        let again = Transaction::between(None, &rest, Arc::new(layout(&rest))).expect("sent");
        assert_eq!(transaction.script(), again.script());

        // A refused line of no mapping (the MSS clamp, a chain) fails the whole apply.
        let untraced = |detail: &str| {
            let mut transaction = fresh();
            let refused = leave_out_refused(detail, &mut transaction);
            assert_eq!(transaction.script(), script, "nothing left out");
            refused
        };
        let clamp = line_of(&|l| l.contains("maxseg"));
        let detail = format!("/dev/stdin:{clamp}:1-5: Error: Could not process rule: Bad");
        assert_eq!(untraced(&detail), None);
        assert_eq!(
            untraced("/dev/stdin:3:1-5: Error: Could not process rule: Bad"),
            None
        );
        // An answer that names no line cannot be traced either.
        assert_eq!(
            untraced("netlink: Error: cache initialization failed"),
            None
        );
        let far = format!("/dev/stdin:{}:1-5: Error: x", script.lines().count() + 5);
        assert_eq!(untraced(&far), None);
    }

    #[test]
    fn firewall_warnings_are_read_again_only_when_the_ruleset_changed() {
        let (fake, nft) = fake();
        nft.apply(&table()).expect("apply");
        assert_eq!(
            nft.firewall_warnings().expect("warnings"),
            Vec::<String>::new()
        );
        assert_eq!(
            nft.firewall_warnings().expect("cached"),
            Vec::<String>::new()
        );
        assert_eq!(
            fake.lock().chains_listed,
            1,
            "an unchanged ruleset is not listed again"
        );
        fake.lock().generation += 1;
        nft.firewall_warnings().expect("read again");
        assert_eq!(fake.lock().chains_listed, 2);
        fake.lock().no_generation = true;
        nft.firewall_warnings().expect("no generation");
        nft.firewall_warnings().expect("no generation");
        assert_eq!(
            fake.lock().chains_listed,
            4,
            "without a generation, every call lists"
        );
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
