//! Canonical nft text of kuport's table: what `nft list table ip kuport` prints for the IR, with
//! every counter at zero. Golden files and the `kuport plan --output nft` view use it; the host
//! layer compares the kernel's listing (counters zeroed) against it.

use std::fmt::Write as _;

use crate::api::Protocol;
use crate::ir::{ChainId, Hook, LOCAL_MARK, NftTable, Rule, TABLE};

/// The table as nft text; empty when the node needs no table.
pub fn nft_text(table: &NftTable) -> String {
    if table.is_empty() {
        return String::new();
    }
    let mut blocks = Vec::new();
    for counter in &table.counters {
        blocks.push(format!(
            "\tcounter {} {{\n\t\tpackets 0 bytes 0\n\t}}\n",
            counter.name
        ));
    }
    for chain in ChainId::ALL {
        let mut block = format!(
            "\tchain {} {{\n\t\ttype {} hook {} priority {}; policy accept;\n",
            chain.name(),
            chain.chain_type(),
            hook_name(chain.hook()),
            symbolic_priority(chain)
        );
        for rule in table.rules(chain) {
            let _ = writeln!(block, "\t\t{}", rule_text(rule));
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
        ChainId::Pre => "dstnat - 10",
        ChainId::Post => "srcnat - 10",
        ChainId::Mangle => "mangle + 10",
        ChainId::Fwd => "mangle",
    }
}

fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "'"))
}

fn proto(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

/// nft lists `ct mark and 0xffff0000 == 0x6b700000` as a prefix match.
fn mark_range() -> String {
    format!("ct mark {LOCAL_MARK:#010x}/16")
}

/// One rule as nft lists it.
pub fn rule_text(rule: &Rule) -> String {
    match rule {
        Rule::RestoreReplyMark => {
            format!(
                "ct direction reply {} counter packets 0 bytes 0 meta mark set ct mark",
                mark_range()
            )
        }
        Rule::SaveArrivalLink { iface, mark } => {
            format!(
                "iifname {} ct direction original counter packets 0 bytes 0 ct mark set {mark:#010x}",
                quote(iface)
            )
        }
        Rule::ClampMssOut => {
            "oifname \"kup-*\" tcp flags syn tcp option maxseg size set rt mtu".to_owned()
        }
        Rule::ClampMssIn => {
            "iifname \"kup-*\" tcp flags syn tcp option maxseg size set rt mtu".to_owned()
        }
        Rule::Dnat(r) => {
            let mut text = format!("iifname {} ", quote(&r.iif));
            if let Some(daddr) = r.daddr {
                let _ = write!(text, "ip daddr {daddr} ");
            }
            let _ = write!(
                text,
                "{} dport {} counter name {} ",
                proto(r.protocol),
                r.ports,
                quote(&r.counter)
            );
            if let Some(mark) = r.set_ct_mark {
                let _ = write!(text, "ct mark set {mark:#010x} ");
            }
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
            mark_range(),
            r.daddr,
            proto(r.protocol),
            r.ports,
            quote(&r.counter),
            quote(&r.comment)
        ),
    }
}
