//! The nft transaction (`nft -f -`) that brings kuport's table from what the kernel holds to
//! what the plan wants, sending only what differs: new and vanished elements, counters and
//! stores, and a chain's rules only when they changed. One transaction is atomic, so a refused
//! line leaves the previous table in place.

use std::collections::BTreeSet;

use crate::ir::{ChainId, TABLE};

use super::layout::{Layout, Planned, element_text};

/// What one line of a transaction belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineOf<'a> {
    /// The table, a chain, a store, a rule, a flush or a deletion: nothing of one mapping.
    Structure,
    /// An element or a counter of this mapping (`namespace/name`).
    Mapping(&'a str),
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
    let mut out = Vec::new();
    let structure = |out: &mut Vec<(String, LineOf<'a>)>, line: String| {
        out.push((line, LineOf::Structure));
    };
    if desired.is_empty() {
        if current.is_some() {
            structure(&mut out, format!("delete table ip {TABLE}"));
        }
        return out;
    }
    let empty = Layout::default();
    let current = match current {
        Some(c) if needs_recreate(c, desired) => {
            structure(&mut out, format!("add table ip {TABLE}"));
            structure(&mut out, format!("delete table ip {TABLE}"));
            &empty
        }
        Some(c) => c,
        None => &empty,
    };
    structure(&mut out, format!("add table ip {TABLE}"));
    for chain in ChainId::ALL {
        if !current.chains.contains_key(chain.name()) {
            structure(&mut out, add_chain(chain));
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
            structure(
                &mut out,
                format!(
                    "add {kind} ip {TABLE} {name} {{ type {};{flags} }}",
                    store.type_text
                ),
            );
        }
    }
    // An object name is written bare (nft's grammar takes no quoted string there); kuport's
    // counter names are Kubernetes names joined by `/`, cut with `_` and a hash.
    for name in desired.counters.difference(&current.counters) {
        let of = planned
            .owners
            .counters
            .get(name)
            .map_or(LineOf::Structure, |m| LineOf::Mapping(m));
        out.push((format!("add counter ip {TABLE} {name}"), of));
    }
    for (name, store) in &current.stores {
        let Some(want) = desired.stores.get(name) else {
            continue;
        };
        for (key, value) in &store.elements {
            if want.elements.get(key) != Some(value) {
                structure(
                    &mut out,
                    format!("delete element ip {TABLE} {name} {{ {key} }}"),
                );
            }
        }
    }
    for (name, store) in &desired.stores {
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
            out.push((
                format!(
                    "add element ip {TABLE} {name} {{ {} }}",
                    element_text(key, value)
                ),
                of,
            ));
        }
    }
    for chain in ChainId::ALL {
        let want = desired.chains.get(chain.name());
        let have = current.chains.get(chain.name());
        let want_rules = want.map(|c| c.rules.as_slice()).unwrap_or_default();
        if have.map(|c| c.rules.as_slice()) == Some(want_rules) {
            continue;
        }
        if have.is_some_and(|c| !c.rules.is_empty()) {
            structure(&mut out, format!("flush chain ip {TABLE} {}", chain.name()));
        }
        for rule in want_rules {
            structure(
                &mut out,
                format!("add rule ip {TABLE} {} {rule}", chain.name()),
            );
        }
    }
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
        structure(&mut out, format!("delete {kind} ip {TABLE} {name}"));
    }
    for name in current.counters.difference(&desired.counters) {
        structure(&mut out, format!("delete counter ip {TABLE} {name}"));
    }
    out
}

/// `add chain` for a base chain: the priority always as a number (nft accepts a string
/// priority in JSON, reports success and creates a chain with no hook).
fn add_chain(chain: ChainId) -> String {
    format!(
        "add chain ip {TABLE} {} {{ type {} hook {} priority {}; policy accept; }}",
        chain.name(),
        chain.chain_type(),
        chain.hook().name(),
        chain.priority(),
    )
}
