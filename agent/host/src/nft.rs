//! kuport's nftables table: built as typed JSON with the `nftables` crate and applied by the
//! `nft` program in one transaction, so a refused batch leaves the previous rules in place.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::process::Command;

use kuport_core::api::Protocol;
use kuport_core::ir::{ChainId, Hook, LOCAL_MARK, NftTable, PortRange, Rule, TABLE};
use kuport_core::render::nft_text;
use nftables::batch::Batch;
use nftables::expr::{
    Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, Prefix, RT, RTKey, TcpOption,
};
use nftables::schema::{Chain, Counter, FlushObject, NfCmd, NfListObject, Rule as NfRule, Table};
use nftables::stmt::{Counter as CounterStmt, Mangle, Match, NAT, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use serde_json::Value;

use crate::HostError;

/// The `nft` program, and how to reach it.
#[derive(Clone, Debug)]
pub struct Nft {
    program: String,
}

impl Default for Nft {
    fn default() -> Self {
        Self {
            program: "nft".to_owned(),
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

impl Nft {
    /// An `nft` found on `PATH`.
    pub fn new() -> Self {
        Self::default()
    }

    fn run(
        &self,
        op: &'static str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, HostError> {
        use std::io::Write as _;
        let mut cmd = Command::new(&self.program);
        cmd.args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        cmd.stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| HostError::Nft {
            op,
            detail: format!("running {}: {e}", self.program),
        })?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .map_err(|e| HostError::Nft {
                    op,
                    detail: format!("writing to nft: {e}"),
                })?;
        }
        let out = child.wait_with_output().map_err(|e| HostError::Nft {
            op,
            detail: format!("waiting for nft: {e}"),
        })?;
        if !out.status.success() {
            return Err(HostError::Nft {
                op,
                detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

    /// Brings the kernel's table to `desired` in one transaction. Returns whether anything was
    /// sent: nothing is when the kernel already lists exactly the desired table.
    pub fn apply(&self, desired: &NftTable) -> Result<bool, HostError> {
        let current = self.listing()?;
        let wanted = nft_text(desired);
        match &current {
            Some(text) if *text == wanted => return Ok(false),
            None if desired.is_empty() => return Ok(false),
            _ => {}
        }
        let mut batch = Batch::new();
        if desired.is_empty() {
            batch.delete(NfListObject::Table(table()));
            self.send(batch)?;
            return Ok(true);
        }
        let existing_counters = match current {
            None => BTreeSet::new(),
            Some(_) if !self.chains_match()? => {
                // The kernel cannot change a chain's type, hook or priority in place: start over.
                batch.add(NfListObject::Table(table()));
                batch.delete(NfListObject::Table(table()));
                BTreeSet::new()
            }
            Some(_) => self.counter_names()?,
        };
        build(&mut batch, desired, &existing_counters);
        self.send(batch)?;
        self.check_hooks()?;
        Ok(true)
    }

    fn send(&self, batch: Batch) -> Result<(), HostError> {
        let json = serde_json::to_string(&batch.to_nftables()).map_err(|e| HostError::Nft {
            op: "encode transaction",
            detail: e.to_string(),
        })?;
        self.run("apply transaction", &["-j", "-f", "-"], Some(&json))
            .map(|_| ())
    }

    /// Removes kuport's table, if present.
    pub fn teardown(&self) -> Result<bool, HostError> {
        if !self.table_exists()? {
            return Ok(false);
        }
        let mut batch = Batch::new();
        batch.delete(NfListObject::Table(table()));
        self.send(batch)?;
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

fn table() -> Table<'static> {
    Table {
        family: NfFamily::IP,
        name: Cow::Borrowed(TABLE),
        ..Default::default()
    }
}

fn hook_name(hook: Hook) -> &'static str {
    match hook {
        Hook::Prerouting => "prerouting",
        Hook::Postrouting => "postrouting",
        Hook::Forward => "forward",
    }
}

fn chain(c: ChainId) -> Chain<'static> {
    Chain {
        family: NfFamily::IP,
        table: Cow::Borrowed(TABLE),
        name: Cow::Borrowed(c.name()),
        _type: Some(if c.chain_type() == "nat" {
            NfChainType::NAT
        } else {
            NfChainType::Filter
        }),
        hook: Some(match c.hook() {
            Hook::Prerouting => NfHook::Prerouting,
            Hook::Postrouting => NfHook::Postrouting,
            Hook::Forward => NfHook::Forward,
        }),
        // Always an integer: see `check_hooks`.
        prio: Some(c.priority()),
        policy: Some(NfChainPolicy::Accept),
        ..Default::default()
    }
}

/// Table and chains (idempotent adds), chains flushed, vanished counters deleted, desired
/// counters added (an existing one keeps its values), then every rule.
fn build(batch: &mut Batch<'static>, desired: &NftTable, existing_counters: &BTreeSet<String>) {
    batch.add(NfListObject::Table(table()));
    for c in ChainId::ALL {
        batch.add(NfListObject::Chain(chain(c)));
        batch.add_cmd(NfCmd::Flush(FlushObject::Chain(chain(c))));
    }
    let wanted: BTreeSet<&str> = desired.counters.iter().map(|c| c.name.as_str()).collect();
    for name in existing_counters
        .iter()
        .filter(|n| !wanted.contains(n.as_str()))
    {
        batch.delete(NfListObject::Counter(counter(name.clone())));
    }
    for c in &desired.counters {
        batch.add(NfListObject::Counter(counter(c.name.clone())));
    }
    for c in ChainId::ALL {
        for rule in desired.rules(c) {
            let (expr, comment) = statements(rule);
            batch.add(NfListObject::Rule(NfRule {
                family: NfFamily::IP,
                table: Cow::Borrowed(TABLE),
                chain: Cow::Borrowed(c.name()),
                expr: Cow::Owned(expr),
                comment: comment.map(Cow::Owned),
                ..Default::default()
            }));
        }
    }
}

fn counter(name: String) -> Counter<'static> {
    Counter {
        family: NfFamily::IP,
        table: Cow::Borrowed(TABLE),
        name: Cow::Owned(name),
        ..Default::default()
    }
}

fn eq(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: Cow::Borrowed(protocol),
            field: Cow::Borrowed(field),
        },
    )))
}

fn ct(key: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::CT(nftables::expr::CT {
        key: Cow::Borrowed(key),
        family: None,
        dir: None,
    }))
}

fn string(s: impl Into<String>) -> Expression<'static> {
    Expression::String(Cow::Owned(s.into()))
}

fn proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

fn ports(p: PortRange) -> Expression<'static> {
    if p.is_range() {
        Expression::Range(Box::new(nftables::expr::Range {
            range: [
                Expression::Number(u32::from(p.first)),
                Expression::Number(u32::from(p.last)),
            ],
        }))
    } else {
        Expression::Number(u32::from(p.first))
    }
}

/// `ct mark and 0xffff0000 == 0x6b700000`, in the prefix form nft lists it as.
fn mark_range() -> Statement<'static> {
    eq(
        ct("mark"),
        Expression::Named(NamedExpression::Prefix(Prefix {
            addr: Box::new(Expression::Number(LOCAL_MARK)),
            len: 16,
        })),
    )
}

fn set_ct_mark(mark: u32) -> Statement<'static> {
    Statement::Mangle(Mangle {
        key: ct("mark"),
        value: Expression::Number(mark),
    })
}

fn clamp(dir: MetaKey) -> Vec<Statement<'static>> {
    vec![
        eq(meta(dir), string("kup-*")),
        Statement::Match(Match {
            left: payload("tcp", "flags"),
            right: string("syn"),
            op: Operator::IN,
        }),
        Statement::Mangle(Mangle {
            key: Expression::Named(NamedExpression::TcpOption(TcpOption {
                name: Cow::Borrowed("maxseg"),
                field: Some(Cow::Borrowed("size")),
            })),
            value: Expression::Named(NamedExpression::RT(RT {
                key: RTKey::MTU,
                family: None,
            })),
        }),
    ]
}

/// The statements of one rule, in the order nft lists them, and its comment.
fn statements(rule: &Rule) -> (Vec<Statement<'static>>, Option<String>) {
    let anon = || Statement::Counter(CounterStmt::Anonymous(None));
    match rule {
        Rule::RestoreReplyMark => (
            vec![
                eq(ct("direction"), string("reply")),
                mark_range(),
                anon(),
                Statement::Mangle(Mangle {
                    key: meta(MetaKey::Mark),
                    value: ct("mark"),
                }),
            ],
            None,
        ),
        Rule::SaveArrivalLink { iface, mark } => (
            vec![
                eq(meta(MetaKey::Iifname), string(iface.clone())),
                eq(ct("direction"), string("original")),
                anon(),
                set_ct_mark(*mark),
            ],
            None,
        ),
        Rule::ClampMssOut => (clamp(MetaKey::Oifname), None),
        Rule::ClampMssIn => (clamp(MetaKey::Iifname), None),
        Rule::Dnat(r) => {
            let mut s = vec![eq(meta(MetaKey::Iifname), string(r.iif.clone()))];
            if let Some(daddr) = r.daddr {
                s.push(eq(payload("ip", "daddr"), string(daddr.to_string())));
            }
            s.push(eq(payload(proto(r.protocol), "dport"), ports(r.ports)));
            s.push(Statement::Counter(CounterStmt::Named(Cow::Owned(
                r.counter.clone(),
            ))));
            if let Some(mark) = r.set_ct_mark {
                s.push(set_ct_mark(mark));
            }
            s.push(Statement::DNAT(Some(NAT {
                addr: Some(string(r.to.to_string())),
                family: None,
                port: r.to_port.map(|p| Expression::Number(u32::from(p))),
                flags: None,
            })));
            (s, Some(r.comment.clone()))
        }
        Rule::IdentitySnat(r) => (
            vec![
                mark_range(),
                eq(payload("ip", "daddr"), string(r.daddr.to_string())),
                eq(payload(proto(r.protocol), "dport"), ports(r.ports)),
                Statement::Counter(CounterStmt::Named(Cow::Owned(r.counter.clone()))),
                Statement::SNAT(Some(NAT {
                    addr: Some(payload("ip", "saddr")),
                    family: None,
                    port: None,
                    flags: None,
                })),
            ],
            Some(r.comment.clone()),
        ),
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
}
