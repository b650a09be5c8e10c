//! Canonical nft text of kuport's table: what `nft list table ip kuport` prints for the IR, with
//! every counter at zero. Golden files and the `kuport plan --output nft` view use it; the host
//! layer compares the kernel's listing (counters zeroed) against it.

use std::fmt::Write as _;

use crate::ir::{
    ChainId, Counter, Hook, LINK_PREFIX, MarkLayout, NftTable, Rule, STAND_IN, SteerRule, TABLE,
};

/// The table as nft text; empty when the node needs no table.
pub fn nft_text(table: &NftTable) -> String {
    if table.is_empty() {
        return String::new();
    }
    let counters: Vec<(String, u64, u64)> = table
        .counters
        .iter()
        .map(|c| (c.name.clone(), 0, 0))
        .collect();
    let chains: Vec<(ChainId, Vec<String>)> = ChainId::ALL
        .iter()
        .map(|&chain| {
            let rules = table.rules(chain).iter().map(|r| rule_text(r, table.marks));
            (chain, rules.collect())
        })
        .collect();
    listing(&counters, &chains)
}

/// `nft list table ip kuport` as nft prints it: the named counters (name, packets, bytes),
/// then each chain with its header and rule lines.
pub fn listing(counters: &[(String, u64, u64)], chains: &[(ChainId, Vec<String>)]) -> String {
    let mut blocks = Vec::new();
    for (name, packets, bytes) in counters {
        blocks.push(format!(
            "\tcounter {name} {{\n\t\tpackets {packets} bytes {bytes}\n\t}}\n"
        ));
    }
    for (chain, rules) in chains {
        let mut block = format!(
            "\tchain {} {{\n\t\ttype {} hook {} priority {}; policy accept;\n",
            chain.name(),
            chain.chain_type(),
            hook_name(chain.hook()),
            symbolic_priority(*chain)
        );
        for rule in rules {
            let _ = writeln!(block, "\t\t{rule}");
        }
        block.push_str("\t}\n");
        blocks.push(block);
    }
    format!("table ip {TABLE} {{\n{}}}\n", blocks.join("\n"))
}

fn hook_name(hook: Hook) -> &'static str {
    match hook {
        Hook::Prerouting => "prerouting",
        Hook::Postrouting => "postrouting",
        Hook::Forward => "forward",
    }
}

/// nft lists standard priorities by name, relative to the family's well-known values.
fn symbolic_priority(chain: ChainId) -> &'static str {
    match chain {
        ChainId::Guard => "raw",
        // nft names a priority only within 10 of a standard one.
        ChainId::Steer => "-130",
        ChainId::Pre => "dstnat - 10",
        ChainId::Post => "srcnat - 10",
        ChainId::Mangle => "mangle + 10",
        ChainId::Fwd => "mangle",
    }
}

fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "'"))
}

/// `<key> & <mask> <op> <value>`, as nft lists it: a mask of leading ones (a prefix) is shown
/// as `<key> [!= ]<value>/<len>`, any other mask as a bitwise AND.
fn masked_cmp(key: &str, mask: u32, negate: bool, value: u32) -> String {
    let len = mask.leading_ones();
    if mask != 0 && mask.checked_shl(len).unwrap_or(0) == 0 {
        let op = if negate { "!= " } else { "" };
        format!("{key} {op}{value:#010x}/{len}")
    } else {
        let op = if negate { "!=" } else { "==" };
        format!("{key} & {mask:#010x} {op} {value:#010x}")
    }
}

fn masked_eq(key: &str, marks: MarkLayout, value: u32) -> String {
    masked_cmp(key, marks.mask, false, value)
}

/// `<key> set <key> & ~mask | value`: writes kuport's bits and keeps the others. nft lists the
/// AND operand with the value's bits folded in.
fn masked_set(key: &str, marks: MarkLayout, value: u32) -> String {
    format!(
        "{key} set {key} & {:#010x} | {value:#010x}",
        !marks.mask | value
    )
}

/// The match part of a steering rule, with a trailing space.
fn steer_match(r: &SteerRule) -> String {
    format!(
        "iifname {} ip daddr {} {} dport {} ",
        quote(&r.iif),
        r.daddr,
        r.protocol.lower(),
        r.ports
    )
}

/// One rule as nft lists it (and as a transaction adds it: nft reads its own listing back).
/// Long because it is one arm per rule kind: the whole grammar kuport writes, in one place.
pub fn rule_text(rule: &Rule, marks: MarkLayout) -> String {
    match rule {
        Rule::GuardAllow {
            device,
            port,
            peers,
        } => {
            let peers: Vec<String> = peers.iter().map(ToString::to_string).collect();
            let set = if peers.len() == 1 {
                peers[0].clone()
            } else {
                format!("{{ {} }}", peers.join(", "))
            };
            format!(
                "iifname {} ip saddr {set} udp dport {port} notrack accept",
                quote(device)
            )
        }
        Rule::GuardDrop { port, counter } => format!(
            "udp dport {port} fib daddr type local counter name {} drop",
            quote(counter)
        ),
        Rule::MarkRequest(r) => format!(
            "{}{} {}",
            steer_match(r),
            masked_cmp("meta mark", !marks.mask, false, 0),
            masked_set("meta mark", marks, r.mark.unwrap_or(marks.local()))
        ),
        Rule::Steer(r) => {
            let mut text = steer_match(r);
            if let Some(mark) = r.mark {
                let _ = write!(text, "{} ", masked_set("ct mark", marks, mark));
            }
            let _ = write!(
                text,
                "ip daddr set {STAND_IN} comment {}",
                quote(&r.comment)
            );
            text
        }
        Rule::RestoreReplyMark { mark } => format!(
            "ct direction reply {} counter packets 0 bytes 0 {}",
            masked_eq("ct mark", marks, *mark),
            masked_set("meta mark", marks, *mark)
        ),
        Rule::SaveArrivalLink { iface, mark } => format!(
            "iifname {} ct direction original counter packets 0 bytes 0 {}",
            quote(iface),
            masked_set("ct mark", marks, *mark)
        ),
        Rule::ClampMssOut => {
            format!("oifname \"{LINK_PREFIX}*\" tcp flags syn tcp option maxseg size set rt mtu")
        }
        Rule::ClampMssIn => {
            format!("iifname \"{LINK_PREFIX}*\" tcp flags syn tcp option maxseg size set rt mtu")
        }
        Rule::Dnat(r) => {
            let mut text = format!("iifname {} ip daddr {STAND_IN} ", quote(&r.iif));
            if let Some(mark) = r.mark {
                let _ = write!(text, "{} ", masked_eq("ct mark", marks, mark));
            }
            let _ = write!(
                text,
                "{} dport {} counter name {} ",
                r.protocol.lower(),
                r.ports,
                quote(&r.counter)
            );
            match r.to_port {
                Some(port) => {
                    let _ = write!(text, "dnat to {}:{port}", r.to);
                }
                None => {
                    let _ = write!(text, "dnat to {}", r.to);
                }
            }
            let _ = write!(text, " comment {}", quote(&r.comment));
            text
        }
        Rule::IdentitySnat(r) => format!(
            "{} ip daddr {} {} dport {} counter name {} snat to ip saddr comment {}",
            masked_cmp("ct mark", marks.mask, true, 0),
            r.daddr,
            r.protocol.lower(),
            r.ports,
            quote(&r.counter),
            quote(&r.comment)
        ),
    }
}

/// The nft script (`nft -f -`) that brings kuport's table to `table` in one transaction:
/// table and chains added (idempotent), the chains flushed, counters of vanished mappings
/// deleted, every desired counter added (an existing one keeps its values), then every rule.
/// With `recreate`, the table is deleted first (a chain's type, hook or priority cannot change
/// in place). Rules are written in the very text nft lists them in, so the listing that the
/// host compares against and the transaction it sends come from one description.
pub fn transaction(table: &NftTable, existing_counters: &[String], recreate: bool) -> String {
    script(&transaction_lines(table, existing_counters, recreate))
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

/// What one line of a transaction adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineOf<'a> {
    /// The table, a chain, a flush or a deletion: nothing of one mapping.
    Structure,
    /// A named counter.
    Counter(&'a Counter),
    /// A rule.
    Rule(&'a Rule),
}

/// The lines of [`transaction`], each with what it adds: nft reports a refused command by its
/// line, so a refusal can be traced to the mapping that caused it.
pub fn transaction_lines<'a>(
    table: &'a NftTable,
    existing_counters: &[String],
    recreate: bool,
) -> Vec<(String, LineOf<'a>)> {
    let mut out = Vec::new();
    if table.is_empty() {
        out.push((format!("delete table ip {TABLE}"), LineOf::Structure));
        return out;
    }
    if recreate {
        out.push((format!("add table ip {TABLE}"), LineOf::Structure));
        out.push((format!("delete table ip {TABLE}"), LineOf::Structure));
    }
    out.push((format!("add table ip {TABLE}"), LineOf::Structure));
    for chain in ChainId::ALL {
        out.push((
            format!(
                "add chain ip {TABLE} {} {{ type {} hook {} priority {}; policy accept; }}",
                chain.name(),
                chain.chain_type(),
                hook_name(chain.hook()),
                chain.priority(),
            ),
            LineOf::Structure,
        ));
        out.push((
            format!("flush chain ip {TABLE} {}", chain.name()),
            LineOf::Structure,
        ));
    }
    if !recreate {
        for name in existing_counters {
            if !table.counters.iter().any(|c| &c.name == name) {
                out.push((
                    format!("delete counter ip {TABLE} {name}"),
                    LineOf::Structure,
                ));
            }
        }
    }
    // An object name is written bare (nft's grammar takes no quoted string there); kuport's
    // counter names are Kubernetes names joined by `/`, cut with `_` and a hash.
    for counter in &table.counters {
        out.push((
            format!("add counter ip {TABLE} {}", counter.name),
            LineOf::Counter(counter),
        ));
    }
    for chain in ChainId::ALL {
        for rule in table.rules(chain) {
            out.push((
                format!(
                    "add rule ip {TABLE} {} {}",
                    chain.name(),
                    rule_text(rule, table.marks)
                ),
                LineOf::Rule(rule),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_compares_take_the_form_nft_lists() {
        assert_eq!(
            masked_cmp("meta mark", 0xffff_ff00, false, 0),
            "meta mark 0x00000000/24"
        );
        assert_eq!(
            masked_cmp("ct mark", 0xff00_0000, true, 0),
            "ct mark != 0x00000000/8"
        );
        assert_eq!(
            masked_cmp("ct mark", 0xff, false, 1),
            "ct mark & 0x000000ff == 0x00000001"
        );
        assert_eq!(
            masked_cmp("ct mark", 0xff, true, 0),
            "ct mark & 0x000000ff != 0x00000000"
        );
        assert_eq!(
            masked_cmp("meta mark", 0xffff_00ff, false, 0),
            "meta mark & 0xffff00ff == 0x00000000"
        );
    }

    #[test]
    fn a_masked_write_keeps_the_other_bits_as_nft_lists_it() {
        let marks = MarkLayout::default();
        assert_eq!(
            masked_set("ct mark", marks, 3),
            "ct mark set ct mark & 0xffffff03 | 0x00000003"
        );
    }
}
