//! `kuport plan`: compute offline, from objects on disk, the plan the agent on one node would
//! compute, and print it as the JSON report, as nft text, or as a short summary.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::ValueEnum;
use k8s_openapi::jiff::Timestamp;
use kuport_core::report::{PlanReport, text_summary};
use kuport_core::snapshot::HostFacts;

use crate::objects::{load_facts, load_objects};

/// What `kuport plan` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// The JSON plan report (the public, stable format).
    #[default]
    Json,
    /// The node's nftables table, as `nft list table ip kuport` would print it.
    Nft,
    /// A short human summary: one line per PortMap and per class.
    Text,
}

/// Parses `--now`: an RFC 3339 timestamp with an offset (`2026-01-01T00:00:00Z`).
pub fn parse_now(value: &str) -> Result<Timestamp, String> {
    value.parse::<Timestamp>().map_err(|e| {
        format!("not an RFC 3339 timestamp with offset, like 2026-01-01T00:00:00Z: {e}")
    })
}

/// The command's arguments, already parsed.
pub struct PlanArgs<'a> {
    pub objects: &'a [PathBuf],
    pub node: &'a str,
    pub facts: Option<&'a Path>,
    pub now: Option<Timestamp>,
    pub output: Output,
}

/// Runs `kuport plan`. Unreadable input comes back as an [`crate::objects::InputError`]
/// (exit status 2); anything else is a runtime error.
pub fn run(args: &PlanArgs<'_>) -> anyhow::Result<()> {
    let snapshot = load_objects(args.objects)?;
    let facts = match args.facts {
        Some(path) => load_facts(path)?,
        None => HostFacts::default(),
    };
    let now = args.now.unwrap_or_else(Timestamp::now);
    let has_node = snapshot
        .nodes
        .iter()
        .any(|n| n.metadata.name.as_deref() == Some(args.node));
    if !has_node {
        eprintln!(
            "warning: node {} has no Node object; it programs nothing",
            args.node
        );
    }

    if args.facts.is_none()
        && let Some(warning) = no_facts_warning(&snapshot, args.node)
    {
        eprintln!("{warning}");
    }

    let plan = kuport_core::plan::plan(&snapshot, args.node, &facts, now);
    let text = match args.output {
        Output::Json => {
            let report = PlanReport::new(&plan);
            let mut json = serde_json::to_string_pretty(&report)
                .with_context(|| format!("serialising the plan report of node {}", args.node))?;
            json.push('\n');
            json
        }
        Output::Nft => kuport_core::render::nft_text(&plan.host_state.nft),
        Output::Text => text_summary(&plan),
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing the plan to standard output")?;
    Ok(())
}

/// Without `--facts` no interface of the node has an address, so no steering rule of a class
/// naming it is rendered, while its mappings may still read programmed from the status rows in
/// the dump: say so when the node accepts for some class.
fn no_facts_warning(snapshot: &kuport_core::snapshot::Snapshot, node: &str) -> Option<String> {
    let mut classes = Vec::new();
    let mut interfaces = std::collections::BTreeSet::new();
    for class in &snapshot.classes {
        if let Some(member) = class.spec.nodes.get(node) {
            classes.push(class.metadata.name.clone().unwrap_or_default());
            interfaces.extend(member.interfaces.iter().cloned());
        }
    }
    if classes.is_empty() {
        return None;
    }
    classes.sort();
    Some(format!(
        "warning: no --facts: the addresses of node {node}'s interfaces ({}) are unknown, so the rules shown capture nothing there (classes {}), though its mappings may read programmed; give --facts with the node's interface addresses",
        interfaces.into_iter().collect::<Vec<_>>().join(", "),
        classes.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_takes_rfc3339_with_an_offset() {
        assert!(parse_now("2026-01-01T00:00:00Z").is_ok());
        assert!(parse_now("2026-01-01T02:00:00+02:00").is_ok());
        assert!(parse_now("2026-01-01T00:00:00").is_err());
        assert!(parse_now("yesterday").is_err());
    }
}
