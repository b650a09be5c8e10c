//! A fake `nft` for unprivileged tests of [`crate::nft::Nft`]: it holds kuport's table in
//! memory, applies the transactions the host layer writes (all or nothing, refusing a line the
//! way nft does, by its line number), and lists the table back in nft's format. It understands
//! exactly the commands kuport sends and lists, nothing more.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kuport_core::ir::{ChainId, Family, TABLE};
use kuport_core::render::layout::chain_header;
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

/// A set or map as the fake holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeStore {
    /// `set` or `map`.
    pub map: bool,
    /// The type text.
    pub type_text: String,
    /// `interval` or empty.
    pub flags: String,
    /// key → value (empty in a set).
    pub elements: BTreeMap<String, String>,
}

/// kuport's table as the fake holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeTable {
    /// Chains by name.
    pub chains: BTreeMap<String, FakeChain>,
    /// Named counters: (packets, bytes).
    pub counters: BTreeMap<String, (u64, u64)>,
    /// Sets and maps by name.
    pub stores: BTreeMap<String, FakeStore>,
}

/// What the fake holds and records.
#[derive(Debug, Default)]
pub struct FakeState {
    /// kuport's IPv4 table, when it exists.
    pub table: Option<FakeTable>,
    /// kuport's IPv6 table, when it exists.
    pub table6: Option<FakeTable>,
    /// Transactions committed.
    pub committed: usize,
    /// Transactions refused.
    pub refused: usize,
    /// Times the table was listed in full (elements included).
    pub listed: usize,
    /// Times the other tables' chains were listed (`-j list chains`).
    pub chains_listed: usize,
    /// The ruleset generation: bumped by every commit that changed something, and by tests
    /// standing in for another program's commit.
    pub generation: u32,
    /// When false, the fake cannot tell its generation (every verify must list).
    pub no_generation: bool,
    /// A rule or element line containing one of these is refused, with this message.
    pub refuse: Vec<(String, String)>,
    /// When set, every command fails with this message (nft cannot be run at all).
    pub unavailable: Option<String>,
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
        if let Some(message) = &state.unavailable {
            return Err(message.clone());
        }
        let family = |f: &str| Family::ALL.into_iter().find(|x| x.nft() == f);
        match args {
            ["list", "table", f, name] if *name == TABLE => {
                let f = family(f).ok_or_else(|| no_such_table(Family::V4))?;
                state.listed += 1;
                state
                    .of(f)
                    .as_ref()
                    .map(|t| list(f, t, true))
                    .ok_or_else(|| no_such_table(f))
            }
            ["-t", "list", "table", f, name] if *name == TABLE => {
                let f = family(f).ok_or_else(|| no_such_table(Family::V4))?;
                state
                    .of(f)
                    .as_ref()
                    .map(|t| list(f, t, false))
                    .ok_or_else(|| no_such_table(f))
            }
            ["list", "counters", "table", f, name] if *name == TABLE => {
                let f = family(f).ok_or_else(|| no_such_table(Family::V4))?;
                state
                    .of(f)
                    .as_ref()
                    .map(|t| list_counters(f, t))
                    .ok_or_else(|| no_such_table(f))
            }
            ["-j", "list", "chains"] => {
                state.chains_listed += 1;
                let mut items = vec![json!({"metainfo": {}})];
                for f in Family::ALL {
                    if let Some(t) = state.of(f) {
                        items.extend(list_json(f, t));
                    }
                }
                Ok(json!({ "nftables": items }).to_string())
            }
            ["-f", "-"] => {
                let script = stdin.unwrap_or_default();
                match transact(&state, script) {
                    Ok((table, table6)) => {
                        if table != state.table || table6 != state.table6 {
                            state.generation += 1;
                        }
                        state.table = table;
                        state.table6 = table6;
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

    fn generation(&self) -> Option<u32> {
        let state = self.lock();
        (!state.no_generation).then_some(state.generation)
    }
}

impl FakeState {
    /// The table of `family`.
    pub fn of(&self, family: Family) -> &Option<FakeTable> {
        match family {
            Family::V4 => &self.table,
            Family::V6 => &self.table6,
        }
    }
}

fn no_such_table(family: Family) -> String {
    format!(
        "Error: No such file or directory\nlist table {} {TABLE}",
        family.nft()
    )
}

/// The listing as nft prints it. Elements come in reverse order, several to a line, as the
/// kernel's own order and nft's line filling would give: a reader must not depend on either.
fn list(family: Family, table: &FakeTable, elements: bool) -> String {
    let mut text = format!("table {} {TABLE} {{\n", family.nft());
    for (name, (p, b)) in &table.counters {
        text.push_str(&format!(
            "\tcounter {name} {{\n\t\tpackets {p} bytes {b}\n\t}}\n\n"
        ));
    }
    for (name, store) in &table.stores {
        let kind = if store.map { "map" } else { "set" };
        text.push_str(&format!(
            "\t{kind} {name} {{\n\t\ttype {}\n",
            store.type_text
        ));
        if !store.flags.is_empty() {
            text.push_str(&format!("\t\tflags {}\n", store.flags));
        }
        if elements && !store.elements.is_empty() {
            let items: Vec<String> = store
                .elements
                .iter()
                .rev()
                .map(|(k, v)| kuport_core::render::layout::element_text(k, v))
                .collect();
            let lines: Vec<String> = items.chunks(2).map(|c| c.join(", ")).collect();
            text.push_str(&format!(
                "\t\telements = {{ {} }}\n",
                lines.join(",\n\t\t\t     ")
            ));
        }
        text.push_str("\t}\n\n");
    }
    for (name, c) in &table.chains {
        let header = ChainId::ALL
            .iter()
            .find(|id| {
                id.name() == name && id.priority() == c.priority && id.hook().name() == c.hook
            })
            .map_or_else(
                || {
                    format!(
                        "type {} hook {} priority {}; policy accept;",
                        c.kind, c.hook, c.priority
                    )
                },
                |id| chain_header(*id),
            );
        text.push_str(&format!("\tchain {name} {{\n\t\t{header}\n"));
        for rule in &c.rules {
            text.push_str(&format!("\t\t{rule}\n"));
        }
        text.push_str("\t}\n\n");
    }
    text.push_str("}\n");
    text
}

fn list_counters(family: Family, table: &FakeTable) -> String {
    let mut text = format!("table {} {TABLE} {{\n", family.nft());
    for (name, (p, b)) in &table.counters {
        text.push_str(&format!(
            "\tcounter {name} {{\n\t\tpackets {p} bytes {b}\n\t}}\n"
        ));
    }
    text.push_str("}\n");
    text
}

fn list_json(family: Family, table: &FakeTable) -> Vec<Value> {
    let f = family.nft();
    let mut items = Vec::new();
    for (name, c) in &table.chains {
        items.push(json!({"chain": {"family": f, "table": TABLE, "name": name,
            "type": c.kind, "hook": c.hook, "prio": c.priority, "policy": "accept"}}));
    }
    for (name, (packets, bytes)) in &table.counters {
        items.push(
            json!({"counter": {"family": f, "table": TABLE, "name": name,
            "packets": packets, "bytes": bytes}}),
        );
    }
    items
}

/// Both tables, as a transaction leaves them.
type Tables = (Option<FakeTable>, Option<FakeTable>);

/// Runs a script on a copy of the table: the new table, or nft's errors for every refused line
/// (`/dev/stdin:<line>:1-1: Error: …`), in which case nothing changes.
fn transact(state: &FakeState, script: &str) -> Result<Tables, String> {
    let (mut table, mut table6) = (state.table.clone(), state.table6.clone());
    let mut errors = Vec::new();
    for (i, line) in script.lines().enumerate() {
        // The table a line names: `<verb> [<kind>] ip6 kuport …` or `… ip kuport …`.
        let v6 = line.contains(&format!(" ip6 {TABLE}"));
        let (target, family) = if v6 {
            (&mut table6, Family::V6)
        } else {
            (&mut table, Family::V4)
        };
        if let Err(e) = command(target, family, &state.refuse, line) {
            errors.push(format!("/dev/stdin:{}:1-1: Error: {e}\n{line}", i + 1));
        }
    }
    if errors.is_empty() {
        Ok((table, table6))
    } else {
        Err(errors.join("\n"))
    }
}

const ENOENT: &str = "Could not process rule: No such file or directory";
const EEXIST: &str = "Could not process rule: File exists";
const EBUSY: &str = "Could not process rule: Device or resource busy";

/// The `@store` names a rule looks up.
fn stores_named(rule: &str) -> impl Iterator<Item = &str> {
    rule.split('@')
        .skip(1)
        .filter_map(|r| r.split([' ', ';']).next())
}

/// Applies one transaction line to `table`, or says why nft would refuse it.
fn command(
    table: &mut Option<FakeTable>,
    family: Family,
    refuse: &[(String, String)],
    line: &str,
) -> Result<(), String> {
    let prefix = format!("{} {TABLE}", family.nft());
    let rest = |verb: &str| line.strip_prefix(&format!("{verb} {prefix} "));
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
        return delete_counter(t, name.trim());
    }
    if let Some(name) = rest("add counter") {
        t.counters.entry(name.trim().to_owned()).or_insert((0, 0));
        return Ok(());
    }
    for (verb, map) in [("add set", false), ("add map", true)] {
        if let Some(spec) = rest(verb) {
            return add_store(t, spec, map);
        }
    }
    for verb in ["delete set", "delete map"] {
        if let Some(name) = rest(verb) {
            return delete_store(t, name.trim());
        }
    }
    if let Some(spec) = rest("add element") {
        if let Some((_, message)) = refuse.iter().find(|(needle, _)| spec.contains(needle)) {
            return Err(message.clone());
        }
        return add_element(t, spec);
    }
    if let Some(spec) = rest("delete element") {
        return delete_element(t, spec);
    }
    if let Some(rule) = rest("add rule") {
        return add_rule(t, refuse, rule);
    }
    Err(format!("syntax error, the fake does not know {line:?}"))
}

/// A counter a map element still names is busy, as in the kernel.
fn delete_counter(t: &mut FakeTable, name: &str) -> Result<(), String> {
    let quoted = format!("\"{name}\"");
    if t.stores
        .values()
        .any(|s| s.elements.values().any(|v| *v == quoted))
    {
        return Err(EBUSY.to_owned());
    }
    t.counters
        .remove(name)
        .map(|_| ())
        .ok_or_else(|| ENOENT.to_owned())
}

/// A store a rule still looks up is busy, as in the kernel.
fn delete_store(t: &mut FakeTable, name: &str) -> Result<(), String> {
    if t.chains
        .values()
        .any(|c| c.rules.iter().any(|r| stores_named(r).any(|s| s == name)))
    {
        return Err(EBUSY.to_owned());
    }
    t.stores
        .remove(name)
        .map(|_| ())
        .ok_or_else(|| ENOENT.to_owned())
}

/// `NAME { KEY }`.
fn delete_element(t: &mut FakeTable, spec: &str) -> Result<(), String> {
    let (name, key) = element_spec(spec)?;
    let store = t.stores.get_mut(name).ok_or_else(|| ENOENT.to_owned())?;
    store
        .elements
        .remove(key.trim())
        .map(|_| ())
        .ok_or_else(|| ENOENT.to_owned())
}

/// `CHAIN RULE`: refused when it names a counter or store the table lacks, or by `refuse`.
fn add_rule(t: &mut FakeTable, refuse: &[(String, String)], rule: &str) -> Result<(), String> {
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
    if stores_named(text).any(|s| !t.stores.contains_key(s)) {
        return Err(ENOENT.to_owned());
    }
    let chain = t.chains.get_mut(chain).ok_or_else(|| ENOENT.to_owned())?;
    chain.rules.push(text.to_owned());
    Ok(())
}

/// `NAME { type T; [flags interval;] }`.
fn add_store(t: &mut FakeTable, spec: &str, map: bool) -> Result<(), String> {
    let (name, body) = spec.trim().split_once(' ').ok_or("a store without body")?;
    let body = body.trim().trim_start_matches('{').trim_end_matches('}');
    let mut store = FakeStore {
        map,
        ..FakeStore::default()
    };
    for part in body.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some(t) = part.strip_prefix("type ") {
            store.type_text = t.to_owned();
        } else if let Some(f) = part.strip_prefix("flags ") {
            store.flags = f.to_owned();
        } else {
            return Err(format!("syntax error in a store: {part:?}"));
        }
    }
    match t.stores.get(name) {
        Some(s) if (s.map, &s.type_text, &s.flags) != (map, &store.type_text, &store.flags) => {
            Err(EEXIST.to_owned())
        }
        Some(_) => Ok(()),
        None => {
            t.stores.insert(name.to_owned(), store);
            Ok(())
        }
    }
}

/// `NAME { ELEMENT }` → (name, element).
fn element_spec(spec: &str) -> Result<(&str, &str), String> {
    let (name, body) = spec
        .trim()
        .split_once(' ')
        .ok_or("an element without body")?;
    let body = body
        .trim()
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .ok_or("an element outside braces")?;
    Ok((name, body.trim()))
}

/// The port range closing an interval key (`… . 3000-3010`) and the key before it.
fn key_range(key: &str) -> Option<(&str, u16, u16)> {
    let (prefix, ports) = key.rsplit_once(" . ")?;
    let (first, last) = ports.split_once('-').unwrap_or((ports, ports));
    Some((prefix, first.parse().ok()?, last.parse().ok()?))
}

/// Adds one element as the kernel would: into an existing store, a map's counter existing, the
/// same key with another value refused, and an interval overlapping another refused.
fn add_element(t: &mut FakeTable, spec: &str) -> Result<(), String> {
    let (name, element) = element_spec(spec)?;
    let counters = t.counters.clone();
    let store = t.stores.get_mut(name).ok_or_else(|| ENOENT.to_owned())?;
    let (key, value) = if store.map {
        element
            .split_once(" : ")
            .ok_or("a map element without a value")?
    } else {
        (element, "")
    };
    if store.type_text.ends_with(": counter") {
        let counter = value.trim_matches('"');
        if !counters.contains_key(counter) {
            return Err(ENOENT.to_owned());
        }
    }
    match store.elements.get(key) {
        Some(v) if v == value => return Ok(()),
        Some(_) => return Err(EEXIST.to_owned()),
        None => {}
    }
    if store.flags == "interval"
        && let Some((prefix, first, last)) = key_range(key)
        && store
            .elements
            .keys()
            .filter_map(|k| key_range(k))
            .any(|(p, f, l)| p == prefix && first <= l && f <= last)
    {
        return Err(EEXIST.to_owned());
    }
    store.elements.insert(key.to_owned(), value.to_owned());
    Ok(())
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
