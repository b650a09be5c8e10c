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
