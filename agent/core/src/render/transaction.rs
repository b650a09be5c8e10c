//! The nft transaction (`nft -f -`) that brings kuport's table from what the kernel holds to
//! what the plan wants, sending only what differs: new and vanished elements, counters and
//! stores, and a chain's rules only when they changed. One transaction is atomic, so a refused
//! line leaves the previous table in place.
//!
//! [`Transaction`] is the value the host sends: its script, and what ties nft's answer (a
//! refused line, by number) back to the mapping that line belongs to, so the host can leave that
//! mapping out and send the rest again without knowing how the script was written.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::ir::{ChainId, Family, NftTable, TABLE};

use super::layout::{Layout, Planned, element_text, layout, layout_with_owners};

/// What one line of a transaction belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineOf<'a> {
    /// The table, a chain, a store, a rule, a flush or a deletion: nothing of one mapping.
    Structure,
    /// An element or a counter of this mapping (`namespace/name`).
    Mapping(&'a str),
}

/// One transaction from the table the kernel holds to the one the plan wants, which can leave
/// out the mappings whose lines nft refused and be sent again.
#[derive(Debug)]
pub struct Transaction<'a> {
    /// What the kernel holds (`None`: no table).
    held: Option<&'a Layout>,
    /// The table still wanted: the desired one without the mappings left out so far.
    table: Cow<'a, NftTable>,
    /// The layout of `table`.
    planned: Arc<Planned>,
    /// Whether the first script made kuport's table or one of its chains (anew): nft may take
    /// a chain without its hook, so such a commit is worth checking.
    creates: bool,
    /// The script (`nft -f -` text) of what is still wanted.
    script: String,
    /// Its number of lines.
    lines: usize,
}

impl<'a> Transaction<'a> {
    /// The transaction from `held` (`None`: no table) to `desired`, whose layout is `planned`
    /// (a caller that wants the same table pass after pass keeps its layout); `None` when the
    /// kernel already holds exactly that table.
    pub fn between(
        held: Option<&'a Layout>,
        desired: &'a NftTable,
        planned: Arc<Planned>,
    ) -> Option<Self> {
        let wanted = (!planned.layout.is_empty()).then_some(&planned.layout);
        if held == wanted {
            return None;
        }
        let creates = held.is_none_or(|c| {
            needs_recreate(c, &planned.layout)
                || ChainId::ALL
                    .iter()
                    .any(|ch| !c.chains.contains_key(ch.name()))
        });
        let mut transaction = Self {
            held,
            table: Cow::Borrowed(desired),
            planned,
            creates,
            script: String::new(),
            lines: 0,
        };
        transaction.write();
        Some(transaction)
    }

    /// The `nft -f -` text to send.
    pub fn script(&self) -> &str {
        &self.script
    }

    /// The number of lines of [`Self::script`].
    pub fn line_count(&self) -> usize {
        self.lines
    }

    /// True when committing the script makes kuport's table or a chain of it (anew) and leaves a
    /// table: nft accepts a chain whose priority it cannot parse and leaves it without a hook,
    /// so the caller checks the chains after.
    pub fn creates_chains(&self) -> bool {
        self.creates && !self.planned.layout.is_empty()
    }

    /// Leaves out the mappings owning the script's lines `numbers` (counted from 1, as nft
    /// names a refused line) and writes the script of the rest. Returns each line's mapping
    /// (`namespace/name`), in the order asked; `None`, leaving the transaction as it was, when
    /// no line is named or a line is not in the script or belongs to no mapping (the table, a
    /// chain, a rule): such a refusal cannot be confined to mappings.
    pub fn leave_out_owners_of(&mut self, numbers: &[usize]) -> Option<Vec<String>> {
        if numbers.is_empty() {
            return None;
        }
        // The same lines again, each with the mapping it belongs to: owners are recorded only
        // here, since the first attempt (nearly always the only one) does not need them.
        let traced = layout_with_owners(&self.table);
        let traced = transaction_lines(self.held, &traced);
        let owners = numbers
            .iter()
            .map(|n| match traced.get(n.checked_sub(1)?)? {
                (_, LineOf::Mapping(owner)) => Some((*owner).to_owned()),
                (_, LineOf::Structure) => None,
            })
            .collect::<Option<Vec<String>>>()?;
        let cut: BTreeSet<String> = owners.iter().cloned().collect();
        self.table = Cow::Owned(self.table.without_mappings(&cut));
        self.planned = Arc::new(layout(&self.table));
        self.write();
        Some(owners)
    }

    /// The table the kernel holds once the script is committed; `None` when it holds none.
    pub fn into_committed(self) -> Option<Arc<Planned>> {
        (!self.planned.layout.is_empty()).then_some(self.planned)
    }

    fn write(&mut self) {
        let lines = transaction_lines(self.held, &self.planned);
        self.lines = lines.len();
        self.script = script(&lines);
    }
}

/// The `nft -f -` text of transaction lines.
pub fn script(lines: &[(String, LineOf<'_>)]) -> String {
    let mut out = String::new();
    for (line, _) in lines {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The script of [`transaction_lines`].
pub fn transaction(current: Option<&Layout>, planned: &Planned) -> String {
    script(&transaction_lines(current, planned))
}

/// True when `current` cannot be brought to `desired` in place: a base chain's type, hook or
/// priority differs (the kernel cannot change them), a chain or a table-level setting kuport
/// never writes is there, or a store has another type (its name says its shape, so only a
/// hand edit gives that).
pub fn needs_recreate(current: &Layout, desired: &Layout) -> bool {
    current.extra != desired.extra
        || current.chains.iter().any(|(name, chain)| {
            desired
                .chains
                .get(name)
                .is_none_or(|d| d.header != chain.header)
        })
        || current.stores.iter().any(|(name, store)| {
            desired.stores.get(name).is_some_and(|d| {
                d.map != store.map
                    || d.type_text != store.type_text
                    || d.flags != store.flags
                    || d.extra != store.extra
            })
        })
}

/// The lines that bring the kernel from `current` (`None`: no table) to `planned`, each with
/// what it belongs to (nft reports a refused line by its number). The order matters: stores
/// and counters exist before elements name them, elements are deleted before their keys are
/// added again with a new value, and a store or counter is deleted only after the rules and
/// elements that name it are gone.
pub fn transaction_lines<'a>(
    current: Option<&Layout>,
    planned: &'a Planned,
) -> Vec<(String, LineOf<'a>)> {
    let desired = &planned.layout;
    // The family is the planned table's: an empty layout keeps it too.
    let t = table_ref(desired.family);
    let mut out = Lines {
        lines: Vec::new(),
        table: t.clone(),
    };
    if desired.is_empty() {
        if current.is_some() {
            out.structure(format!("delete table {t}"));
        }
        return out.lines;
    }
    let empty = Layout {
        family: desired.family,
        ..Layout::default()
    };
    let current = match current {
        Some(c) if needs_recreate(c, desired) => {
            out.structure(format!("add table {t}"));
            out.structure(format!("delete table {t}"));
            &empty
        }
        Some(c) => c,
        None => &empty,
    };
    out.structure(format!("add table {t}"));
    out.add_chains_and_stores(current, desired);
    out.add_counters(current, planned);
    out.delete_changed_elements(current, desired);
    out.add_elements(current, planned);
    out.rewrite_changed_chains(current, desired);
    out.delete_vanished(current, desired);
    out.lines
}

/// `ip kuport` or `ip6 kuport`: how every line names the table.
pub fn table_ref(family: Family) -> String {
    format!("{} {TABLE}", family.nft())
}

/// Transaction lines as they are written, each with what it belongs to.
struct Lines<'a> {
    lines: Vec<(String, LineOf<'a>)>,
    /// The table every line names ([`table_ref`]).
    table: String,
}

impl<'a> Lines<'a> {
    fn structure(&mut self, line: String) {
        self.lines.push((line, LineOf::Structure));
    }

    /// The chains and stores `current` lacks, before anything names them.
    fn add_chains_and_stores(&mut self, current: &Layout, desired: &Layout) {
        for chain in ChainId::ALL {
            if !current.chains.contains_key(chain.name()) {
                let line = add_chain(&self.table, chain);
                self.structure(line);
            }
        }
        for (name, store) in &desired.stores {
            if !current.stores.contains_key(name) {
                let kind = if store.map { "map" } else { "set" };
                let flags = if store.flags.is_empty() {
                    String::new()
                } else {
                    format!(" flags {};", store.flags)
                };
                let line = format!(
                    "add {kind} {} {name} {{ type {};{flags} }}",
                    self.table, store.type_text
                );
                self.structure(line);
            }
        }
    }

    /// The counters `current` lacks, each its mapping's line. An object name is written bare
    /// (nft's grammar takes no quoted string there); kuport's counter names are Kubernetes
    /// names joined by `/`, cut with `_` and a hash.
    fn add_counters(&mut self, current: &Layout, planned: &'a Planned) {
        for name in planned.layout.counters.difference(&current.counters) {
            let of = planned
                .owners
                .counters
                .get(name)
                .map_or(LineOf::Structure, |m| LineOf::Mapping(m));
            let line = format!("add counter {} {name}", self.table);
            self.lines.push((line, of));
        }
    }

    /// Deletes the elements of kept stores that are gone or hold another value, before a new
    /// value is added under the same key.
    fn delete_changed_elements(&mut self, current: &Layout, desired: &Layout) {
        for (name, store) in &current.stores {
            let Some(want) = desired.stores.get(name) else {
                continue;
            };
            for (key, value) in &store.elements {
                if want.elements.get(key) != Some(value) {
                    let line = format!("delete element {} {name} {{ {key} }}", self.table);
                    self.structure(line);
                }
            }
        }
    }

    /// The elements `current` does not hold as wanted, each its mapping's line.
    fn add_elements(&mut self, current: &Layout, planned: &'a Planned) {
        for (name, store) in &planned.layout.stores {
            let have = current.stores.get(name);
            for (key, value) in &store.elements {
                if have.and_then(|h| h.elements.get(key)) == Some(value) {
                    continue;
                }
                let of = planned
                    .owners
                    .elements
                    .get(&(name.clone(), key.clone()))
                    .map_or(LineOf::Structure, |m| LineOf::Mapping(m));
                let line = format!(
                    "add element {} {name} {{ {} }}",
                    self.table,
                    element_text(key, value)
                );
                self.lines.push((line, of));
            }
        }
    }

    /// A chain whose rules differ is flushed and written whole (its rules are a few lookups).
    fn rewrite_changed_chains(&mut self, current: &Layout, desired: &Layout) {
        for chain in ChainId::ALL {
            let want = desired.chains.get(chain.name());
            let have = current.chains.get(chain.name());
            let want_rules = want.map(|c| c.rules.as_slice()).unwrap_or_default();
            if have.map(|c| c.rules.as_slice()) == Some(want_rules) {
                continue;
            }
            if have.is_some_and(|c| !c.rules.is_empty()) {
                let line = format!("flush chain {} {}", self.table, chain.name());
                self.structure(line);
            }
            for rule in want_rules {
                let line = format!("add rule {} {} {rule}", self.table, chain.name());
                self.structure(line);
            }
        }
    }

    /// Stores and counters no longer wanted, once no rule or element names them.
    fn delete_vanished(&mut self, current: &Layout, desired: &Layout) {
        let gone: BTreeSet<&String> = current
            .stores
            .keys()
            .filter(|n| !desired.stores.contains_key(*n))
            .collect();
        for name in gone {
            let kind = if current.stores[name].map {
                "map"
            } else {
                "set"
            };
            let line = format!("delete {kind} {} {name}", self.table);
            self.structure(line);
        }
        for name in current.counters.difference(&desired.counters) {
            let line = format!("delete counter {} {name}", self.table);
            self.structure(line);
        }
    }
}

/// `add chain` for a base chain: the priority always as a number (nft accepts a string
/// priority in JSON, reports success and creates a chain with no hook).
fn add_chain(table: &str, chain: ChainId) -> String {
    format!(
        "add chain {table} {} {{ type {} hook {} priority {}; policy accept; }}",
        chain.name(),
        chain.chain_type(),
        chain.hook().name(),
        chain.priority(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Protocol;
    use crate::ir::{Counter, DnatRule, PortRange, Rule};

    /// Mappings `games/<name>`, each a DNAT of one UDP port (from 3000) to its own pod.
    fn table_of(names: &[&str]) -> NftTable {
        let mut rules = Vec::new();
        let mut counters = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let port = 3000 + u16::try_from(i).expect("few mappings");
            rules.push(Rule::Dnat(DnatRule {
                iif: "wt0".into(),
                mark: Some(1),
                protocol: Protocol::Udp,
                ports: PortRange::single(port),
                to: format!("10.244.1.{}", i + 5).parse().expect("ip"),
                to_port: None,
                counter: format!("pre/games/{name}").into(),
                comment: format!("games/{name}").into(),
            }));
            counters.push(Counter {
                name: format!("pre/games/{name}").into(),
                chain: ChainId::Pre,
                namespace: "games".into(),
                mapping: (*name).into(),
            });
        }
        NftTable {
            family: Default::default(),
            marks: Default::default(),
            counters,
            chains: vec![
                (ChainId::Pre, rules),
                (ChainId::Fwd, vec![Rule::ClampMssOut]),
            ],
            hairpin_sources: Vec::new(),
            hairpin_external: Vec::new(),
        }
    }

    fn number_of(script: &str, wanted: impl Fn(&str) -> bool) -> usize {
        script.lines().position(wanted).expect("line") + 1
    }

    #[test]
    fn owners_are_recorded_beside_the_layout_so_the_lines_are_the_same() {
        let table = table_of(&["a", "b"]);
        let traced = layout_with_owners(&table);
        let plain = layout(&table);
        assert_eq!(plain.layout, traced.layout);
        let lines = transaction_lines(None, &traced);
        assert_eq!(script(&lines), transaction(None, &plain));
        let owner_of = |text: &str| {
            lines
                .iter()
                .find(|(line, _)| line.contains(text))
                .map(|(_, of)| *of)
        };
        assert_eq!(owner_of("10.244.1.6"), Some(LineOf::Mapping("games/b")));
        assert_eq!(
            owner_of("counter ip kuport pre/games/a"),
            Some(LineOf::Mapping("games/a"))
        );
        assert_eq!(owner_of("maxseg"), Some(LineOf::Structure));
    }

    #[test]
    fn a_transaction_leaves_out_the_owners_of_refused_lines_and_writes_the_rest() {
        let table = table_of(&["a", "b", "c"]);
        assert!(
            Transaction::between(
                Some(&layout(&table).layout),
                &table,
                Arc::new(layout(&table))
            )
            .is_none(),
            "the kernel holds the table already"
        );
        let mut sent =
            Transaction::between(None, &table, Arc::new(layout(&table))).expect("a transaction");
        assert!(sent.creates_chains());
        let first = sent.script().to_owned();
        assert_eq!(sent.line_count(), first.lines().count());
        let element_b = number_of(&first, |l| l.contains("10.244.1.6"));
        let counter_c = number_of(&first, |l| l.ends_with("pre/games/c"));
        // A line of no mapping, or none at all, leaves the transaction as it was.
        let clamp = number_of(&first, |l| l.contains("maxseg"));
        for numbers in [
            vec![],
            vec![element_b, clamp],
            vec![0],
            vec![sent.line_count() + 1],
        ] {
            assert_eq!(sent.leave_out_owners_of(&numbers), None, "{numbers:?}");
            assert_eq!(sent.script(), first);
        }
        assert_eq!(
            sent.leave_out_owners_of(&[counter_c, element_b]),
            Some(vec!["games/c".to_owned(), "games/b".to_owned()])
        );
        // `a` is laid out as it was beside `b` and `c`.
        let rest = table_of(&["a"]);
        assert_eq!(sent.script(), transaction(None, &layout(&rest)));
        assert_eq!(sent.line_count(), sent.script().lines().count());
        let committed = sent.into_committed().expect("a table");
        assert_eq!(committed.layout, layout(&rest).layout);
        // A transaction to no table deletes it and leaves none.
        let none = NftTable::default();
        let gone = Transaction::between(Some(&committed.layout), &none, Arc::new(layout(&none)))
            .expect("a deletion");
        assert_eq!(gone.script(), "delete table ip kuport\n");
        assert!(!gone.creates_chains());
        assert_eq!(gone.into_committed(), None);
    }
}
