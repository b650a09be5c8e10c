//! kuport's nftables table, applied by the `nft` program as one text transaction, so a refused
//! batch leaves the previous rules in place. The transaction is written from the same rule text
//! the kernel's listing is compared against (`kuport_core::render`), so there is one
//! description of every rule, not two that must agree.

use std::collections::BTreeSet;
use std::process::Command;

use kuport_core::ir::{ChainId, Hook, NftTable, TABLE};
use kuport_core::render::{nft_text, transaction};
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
        let (existing, recreate) = match current {
            None => (Vec::new(), false),
            // The kernel cannot change a chain's type, hook or priority in place: start over.
            Some(_) if !desired.is_empty() && !self.chains_match()? => (Vec::new(), true),
            Some(_) => (self.counter_names()?.into_iter().collect(), false),
        };
        self.send(&transaction(desired, &existing, recreate))?;
        if !desired.is_empty() {
            self.check_hooks()?;
        }
        Ok(true)
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
}
