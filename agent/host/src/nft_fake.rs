//! A fake `nft` for unprivileged tests of [`crate::nft::Nft`]: it holds kuport's table in
//! memory, applies the transactions the host layer writes (all or nothing, refusing a line the
//! way nft does, by its line number), and lists the table back in nft's format. It understands
//! exactly the commands kuport sends and lists, nothing more.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kuport_core::ir::{ChainId, TABLE};
use kuport_core::render::listing;
use serde_json::{Value, json};

use crate::nft::NftRunner;

/// One chain as the fake holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeChain {
    /// `filter` or `nat`.
    pub kind: String,
    /// The hook.
    pub hook: String,
    /// The priority.
    pub priority: i32,
    /// Rule lines, as added.
    pub rules: Vec<String>,
}

/// kuport's table as the fake holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeTable {
    /// Chains by name.
    pub chains: BTreeMap<String, FakeChain>,
    /// Named counters: (packets, bytes).
    pub counters: BTreeMap<String, (u64, u64)>,
}

/// What the fake holds and records.
#[derive(Debug, Default)]
pub struct FakeState {
    /// kuport's table, when it exists.
    pub table: Option<FakeTable>,
    /// Transactions committed.
    pub committed: usize,
    /// Transactions refused.
    pub refused: usize,
    /// A rule line containing one of these is refused, with this message.
    pub refuse: Vec<(String, String)>,
}

/// The fake `nft`.
#[derive(Debug, Default)]
pub struct FakeNft {
    /// Its state, for tests to set up and inspect.
    pub state: Mutex<FakeState>,
}

impl FakeNft {
    /// The state, whatever a panicking test left.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl NftRunner for FakeNft {
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut state = self.lock();
        match args {
            ["-j", "list", "tables", "ip"] => {
                let mut items = vec![json!({"metainfo": {}})];
                if state.table.is_some() {
                    items.push(json!({"table": {"family": "ip", "name": TABLE}}));
                }
                Ok(json!({ "nftables": items }).to_string())
            }
            ["list", "table", "ip", name] if *name == TABLE => {
                state.table.as_ref().map(list).ok_or_else(no_such_table)
            }
            ["-j", "list", "table", "ip", name] if *name == TABLE => state
                .table
                .as_ref()
                .map(|t| list_json(t).to_string())
                .ok_or_else(no_such_table),
            ["-j", "list", "chains"] => Ok(state
                .table
                .as_ref()
                .map_or_else(|| json!({"nftables": []}), list_json)
                .to_string()),
            ["-f", "-"] => {
                let script = stdin.unwrap_or_default();
                match transact(&state, script) {
                    Ok(table) => {
                        state.table = table;
                        state.committed += 1;
                        Ok(String::new())
                    }
                    Err(errors) => {
                        state.refused += 1;
                        Err(errors)
                    }
                }
            }
            _ => Err(format!(
                "the fake nft does not know `nft {}`",
                args.join(" ")
            )),
        }
    }
}

fn no_such_table() -> String {
    format!("Error: No such file or directory\nlist table ip {TABLE}")
}

/// The listing, chains in kuport's order, as nft prints it.
fn list(table: &FakeTable) -> String {
    let counters: Vec<(String, u64, u64)> = table
        .counters
        .iter()
        .map(|(name, (p, b))| (name.clone(), *p, *b))
        .collect();
    let chains: Vec<(ChainId, Vec<String>)> = ChainId::ALL
        .iter()
        .filter_map(|c| Some((*c, table.chains.get(c.name())?.rules.clone())))
        .collect();
    listing(&counters, &chains)
}

fn list_json(table: &FakeTable) -> Value {
    let mut items = vec![json!({"metainfo": {}})];
    for (name, c) in &table.chains {
        items.push(
            json!({"chain": {"family": "ip", "table": TABLE, "name": name,
            "type": c.kind, "hook": c.hook, "prio": c.priority, "policy": "accept"}}),
        );
    }
    for (name, (packets, bytes)) in &table.counters {
        items.push(
            json!({"counter": {"family": "ip", "table": TABLE, "name": name,
            "packets": packets, "bytes": bytes}}),
        );
    }
    json!({ "nftables": items })
}

/// Runs a script on a copy of the table: the new table, or nft's errors for every refused line
/// (`/dev/stdin:<line>:1-1: Error: …`), in which case nothing changes.
fn transact(state: &FakeState, script: &str) -> Result<Option<FakeTable>, String> {
    let mut table = state.table.clone();
    let mut errors = Vec::new();
    for (i, line) in script.lines().enumerate() {
        if let Err(e) = command(&mut table, &state.refuse, line) {
            errors.push(format!("/dev/stdin:{}:1-1: Error: {e}\n{line}", i + 1));
        }
    }
    if errors.is_empty() {
        Ok(table)
    } else {
        Err(errors.join("\n"))
    }
}

const ENOENT: &str = "Could not process rule: No such file or directory";

fn command(
    table: &mut Option<FakeTable>,
    refuse: &[(String, String)],
    line: &str,
) -> Result<(), String> {
    let prefix = format!("ip {TABLE}");
    let rest = |verb: &str| line.strip_prefix(&format!("{verb} {prefix}"));
    if line == format!("add table {prefix}") {
        table.get_or_insert_with(FakeTable::default);
        return Ok(());
    }
    if line == format!("delete table {prefix}") {
        return table.take().map(|_| ()).ok_or_else(|| ENOENT.to_owned());
    }
    let t = table.as_mut().ok_or_else(|| ENOENT.to_owned())?;
    if let Some(spec) = rest("add chain") {
        return add_chain(t, spec.trim());
    }
    if let Some(name) = rest("flush chain") {
        let chain = t
            .chains
            .get_mut(name.trim())
            .ok_or_else(|| ENOENT.to_owned())?;
        chain.rules.clear();
        return Ok(());
    }
    if let Some(name) = rest("delete counter") {
        return t
            .counters
            .remove(name.trim())
            .map(|_| ())
            .ok_or_else(|| ENOENT.to_owned());
    }
    if let Some(name) = rest("add counter") {
        t.counters.entry(name.trim().to_owned()).or_insert((0, 0));
        return Ok(());
    }
    if let Some(rule) = rest("add rule") {
        let (chain, text) = rule.trim().split_once(' ').ok_or("a rule without chain")?;
        if let Some((_, message)) = refuse.iter().find(|(needle, _)| text.contains(needle)) {
            return Err(message.clone());
        }
        let named = text
            .split("counter name \"")
            .nth(1)
            .and_then(|r| r.split('"').next());
        if named.is_some_and(|n| !t.counters.contains_key(n)) {
            return Err(ENOENT.to_owned());
        }
        let chain = t.chains.get_mut(chain).ok_or_else(|| ENOENT.to_owned())?;
        chain.rules.push(text.to_owned());
        return Ok(());
    }
    Err(format!("syntax error, the fake does not know {line:?}"))
}

/// `NAME { type T hook H priority P; policy accept; }`: created, or kept when it is the same;
/// the kernel cannot change an existing chain's type, hook or priority.
fn add_chain(t: &mut FakeTable, spec: &str) -> Result<(), String> {
    let (name, body) = spec.split_once(' ').ok_or("a chain without body")?;
    let word = |key: &str| {
        body.split(&format!("{key} "))
            .nth(1)
            .and_then(|r| r.split([' ', ';']).next())
            .map(str::to_owned)
            .ok_or_else(|| format!("a chain without {key}"))
    };
    let chain = FakeChain {
        kind: word("type")?,
        hook: word("hook")?,
        priority: word("priority")?
            .parse()
            .map_err(|e| format!("priority: {e}"))?,
        rules: Vec::new(),
    };
    match t.chains.get(name) {
        Some(c) if (&c.kind, &c.hook, c.priority) != (&chain.kind, &chain.hook, chain.priority) => {
            Err("Could not process rule: Device or resource busy".to_owned())
        }
        Some(_) => Ok(()),
        None => {
            t.chains.insert(name.to_owned(), chain);
            Ok(())
        }
    }
}
