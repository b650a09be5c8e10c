//! The host-level measurements of `kuport-lab bench`: the ones that need network namespaces,
//! nftables and kuport's own binaries, but not the WireGuard lab.
//!
//! - nft transaction time and plan pass time for 1, 100, 1,000 and 5,000 same-node mappings;
//! - new UDP flows per second and established-flow packet rate through a node holding 1,000
//!   mappings, against the same node holding 1, side by side in one run; in IPv4, then in IPv6
//!   (the `IPv6:` rows, which `--only ipv6` and `--only host-ipv6` run alone);
//! - the agent's peak RSS with 1,000 PortMaps and 500 Nodes in the API server model;
//! - the memory and time of a sweep of stale conntrack entries over tables of 10,000 to
//!   1,000,000 entries (`conntrack`; `--only conntrack` runs it alone).
//!
//! Everything runs in throwaway namespaces named `klb-hb<pid>-*`; the guards of
//! [`kuport_testkit::netns`] kill what was started there and delete them, on error too. Work that must run inside a namespace
//! with a fresh process (LinuxHost, which forks `nft`) re-executes the current binary through
//! [`hidden_main`]; socket work runs on threads moved into the namespace.

mod bulk_slices;
mod cluster;
mod conntrack;
mod flows;
mod memory;
mod nft;

use std::path::Path;
use std::process::ExitCode;

use kuport_core::ir::Family;

/// Prefix of every namespace and temporary directory the benches create; the process id
/// follows, so a stale one can be told from one a running bench owns.
const PREFIX: &str = "klb-hb";

/// One reported number.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// What was measured, as `docs/performance.md` names it.
    pub name: String,
    /// The number (a ratio when `unit` is `ratio`).
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// How many samples the number summarises.
    pub samples: usize,
    /// The baseline measured in the same run, when the value is compared against one.
    pub baseline: Option<f64>,
    /// The target, as `docs/performance.md` states it (empty when there is none).
    pub target: String,
    /// Whether the target is met; `None` when there is no target.
    pub met: Option<bool>,
    /// How it was measured and the numbers behind it.
    pub note: String,
}

/// Runs every host-level measurement. `bins` holds `kuport`, `kuport-sim`, `kuport-echo` and
/// `kuport-lab`.
pub fn run(bins: &Path) -> anyhow::Result<Vec<Measurement>> {
    run_parts(bins, &PARTS)
}

/// Runs the agent memory measurements only.
pub fn run_memory(bins: &Path) -> anyhow::Result<Vec<Measurement>> {
    run_parts(bins, &MEMORY_PARTS)
}

/// Runs the host-level measurements in IPv6 only: the `IPv6:` flow rows.
pub fn run_ipv6(bins: &Path) -> anyhow::Result<Vec<Measurement>> {
    run_parts(bins, &[FLOWS6])
}

/// Runs the conntrack sweep's measurement alone.
pub fn run_conntrack() -> anyhow::Result<Vec<Measurement>> {
    run_parts(Path::new(""), &[CONNTRACK])
}

/// The parts, by the name `__hostbench-part` takes.
const PARTS: [&str; 7] = [
    "nft",
    "flows",
    FLOWS6,
    "memory",
    "memory-annotated",
    "memory-slices",
    CONNTRACK,
];
/// The part of the conntrack sweep.
const CONNTRACK: &str = "conntrack";
/// The parts of the memory rows (`bench --only memory`).
const MEMORY_PARTS: [&str; 3] = ["memory", "memory-annotated", "memory-slices"];
/// The part of the IPv6 flow rows.
const FLOWS6: &str = "flows6";

fn run_parts(bins: &Path, parts: &[&str]) -> anyhow::Result<Vec<Measurement>> {
    use anyhow::Context as _;
    kuport_testkit::netns::remove_stale(PREFIX);
    let mut out = Vec::new();
    for part in parts {
        let (what, found) = match *part {
            "nft" => ("nft transactions and plan passes", nft::measure()),
            "flows" => ("UDP flows through a node", flows::measure(Family::V4)),
            FLOWS6 => ("UDP flows through a node, IPv6", flows::measure(Family::V6)),
            "memory" => ("agent memory", memory::measure(bins)),
            "memory-annotated" => (
                "agent memory with annotated PortMaps",
                memory::measure_annotated(bins),
            ),
            "memory-slices" => (
                "agent memory with EndpointSlices no PortMap refers to",
                memory::measure_slices(bins),
            ),
            CONNTRACK => ("a conntrack sweep", conntrack::measure()),
            other => anyhow::bail!("no hostbench part {other:?} (parts: {})", PARTS.join(", ")),
        };
        let found = found.with_context(|| format!("measuring {what}"))?;
        for m in &found {
            // Printed as they come, so a later failure does not lose what was measured.
            eprintln!("hostbench: {}", one_line(m));
        }
        out.extend(found);
    }
    Ok(out)
}

/// The hidden subcommands: the children this module re-executes the binary as, and
/// `__hostbench-part PART [BINS]` to run one part by hand (`nft`, `flows`, `flows6`, `memory`,
/// `memory-annotated`, `memory-slices` or `conntrack`; BINS
/// defaults to the binary's directory). `None` for any other command line.
pub fn hidden_main(args: &[String]) -> Option<ExitCode> {
    let rest = args.get(2..).unwrap_or_default();
    let result = match args.get(1).map(String::as_str) {
        Some(nft::CHILD) => nft::child(rest),
        Some(nft::PROGRAM) => nft::program(rest),
        Some(conntrack::CHILD) => conntrack::run_child(rest),
        Some(PART) => one_part(rest),
        _ => return None,
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "kuport-lab {}: {e:#}",
                args.get(1).map_or("", String::as_str)
            );
            ExitCode::FAILURE
        }
    })
}

const PART: &str = "__hostbench-part";

fn one_part(args: &[String]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let part = args
        .first()
        .with_context(|| format!("usage: {PART} {{{}}} [BINS]", PARTS.join("|")))?;
    let bins = match args.get(1) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::env::current_exe()
            .context("finding the current executable")?
            .parent()
            .context("the executable has no directory")?
            .to_path_buf(),
    };
    run_parts(&bins, &[part.as_str()]).map(drop)
}

fn one_line(m: &Measurement) -> String {
    let met = match m.met {
        Some(true) => " [met]",
        Some(false) => " [NOT met]",
        None => "",
    };
    format!(
        "{}: {:.3} {} (n={}){} {}{}",
        m.name,
        m.value,
        m.unit,
        m.samples,
        if m.target.is_empty() {
            String::new()
        } else {
            format!(" target {}", m.target)
        },
        met,
        m.note
    )
}

/// The median of `values` (the mean of the middle two for an even count); NaN when empty.
fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `values` as a short list for notes.
fn list(values: &[f64], decimals: usize) -> String {
    values
        .iter()
        .map(|v| format!("{v:.decimals$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Timings in a debug build are not the agent's: say so next to them.
fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
