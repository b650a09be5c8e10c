//! The memory of a sweep of stale conntrack entries against the table's size: 10,000, 100,000
//! and 1,000,000 entries, each in a fresh namespace filled over ctnetlink
//! (`kuport_testkit::conntrack`; a tenth of the entries stale kuport flows, a tenth current
//! ones, the rest the node's own), swept by a re-executed copy of this binary
//! (`__hostbench-conntrack sweep`) running the agent's own sweep (`KernelConntrack` and
//! `conntrack::sweep`, judged by the golden accepting node's translations). The child resets
//! its peak RSS (`clear_refs`) just before the sweep and reports how far `VmHWM` rose, the
//! sweep's time and what it cleared. The negative control (`__hostbench-conntrack keep`) walks
//! the same table keeping every entry and copying out the stale ones, as the agent's sweep did
//! before issue 45. The machine's `nf_conntrack_max` (a host-wide limit every namespace's table
//! is held to) is raised for the run when it is below the largest size, and restored.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use kuport_core::ir::HostState;
use kuport_host::conntrack::{ConntrackTable as _, Flow, KernelConntrack, Translations, sweep};
use kuport_testkit::conntrack::{Entry, RaisedMax, count, insert};
use kuport_testkit::netns::Netns;
use kuport_testkit::process::Proc;

use super::{Measurement, build_profile};

/// Hidden subcommand: `__hostbench-conntrack sweep|keep` in the namespace to measure.
pub const CHILD: &str = "__hostbench-conntrack";

/// The table sizes.
const SIZES: [u32; 3] = [10_000, 100_000, 1_000_000];
/// The most the sweep's peak RSS may grow at the largest size (the target): flat, one receive
/// buffer and one batch.
const TARGET_KIB: f64 = 1024.0;

/// The accepting node's golden state: 203.0.113.9 udp 3000 over the link ending at
/// 169.254.77.1, local mark 0x1.
const GOLDEN: &str =
    include_str!("../../../agent/core/testdata/golden/accepting-remote-pod.ir.json");

/// What one child measured.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    listed: usize,
    cleared: usize,
    grown_kib: u64,
    peak_kib: u64,
    millis: u64,
}

pub fn measure() -> Result<Vec<Measurement>> {
    let exe = std::env::current_exe().context("finding the current executable")?;
    let largest = SIZES.iter().copied().max().unwrap_or_default() as u64;
    let _limit = RaisedMax::to(largest + largest / 10)?;
    let mut sweeps = Vec::new();
    let mut kept = Vec::new();
    for n in SIZES {
        let ns = Netns::create(super::PREFIX, &format!("ct{n}"))?;
        let made = ns.run("fill", move || insert((0..n).map(entry), 3600))?;
        if made != n as usize {
            bail!("filled {made} of {n} entries");
        }
        // The control first: it deletes nothing, so both see the same table.
        kept.push(child(&exe, &ns, "keep")?);
        sweeps.push(child(&exe, &ns, "sweep")?);
        let left = ns.run("count", count)?;
        let swept = sweeps[sweeps.len() - 1];
        if swept.cleared != (n / 10) as usize || left != n as usize - swept.cleared {
            bail!(
                "the sweep of {n} entries cleared {} and left {left}; expected {} cleared",
                swept.cleared,
                n / 10
            );
        }
    }
    Ok(rows(&sweeps, &kept))
}

fn rows(sweeps: &[Run], kept: &[Run]) -> Vec<Measurement> {
    let (Some(small), Some(large)) = (sweeps.first(), sweeps.last()) else {
        return Vec::new();
    };
    let sizes = |runs: &[Run], f: &dyn Fn(&Run) -> String| {
        SIZES
            .iter()
            .zip(runs)
            .map(|(n, r)| format!("{} at {}", f(r), thousands(*n as usize)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let kib = |v: u64| format!("{v} KiB");
    let per_entry = kept.last().map_or(0.0, |k| {
        k.grown_kib as f64 * 1024.0 / k.listed.max(1) as f64
    });
    let sweep_note = format!(
        "the sweeping process ({}) runs the agent's own KernelConntrack and sweep; its peak RSS growth from just before the sweep: {}; its VmHWM: {}; stale entries cleared: {}, in {}. Negative control, every entry kept and the stale ones copied out as the sweep did before issue 45: {}, {per_entry:.0} B per entry",
        build_profile(),
        sizes(sweeps, &|r| kib(r.grown_kib)),
        sizes(sweeps, &|r| kib(r.peak_kib)),
        sizes(sweeps, &|r| thousands(r.cleared)),
        sizes(sweeps, &|r| format!("{} ms", r.millis)),
        sizes(kept, &|r| kib(r.grown_kib)),
    );
    let grown = large.grown_kib as f64;
    vec![
        Measurement {
            name: format!(
                "conntrack sweep: peak RSS growth of the sweeping process, {}-entry table",
                thousands(large.listed)
            ),
            value: grown,
            unit: "KiB".to_owned(),
            samples: 1,
            baseline: Some(small.grown_kib as f64),
            target: format!("flat in the table's size, ≤ {TARGET_KIB} KiB"),
            met: Some(grown <= TARGET_KIB && large.grown_kib <= small.grown_kib + 512),
            note: sweep_note,
        },
        Measurement {
            name: format!(
                "conntrack sweep: time to walk a {}-entry table and delete its {} stale entries",
                thousands(large.listed),
                thousands(large.cleared)
            ),
            value: large.millis as f64,
            unit: "ms".to_owned(),
            samples: 1,
            baseline: None,
            target: String::new(),
            met: None,
            note: format!(
                "off the pass, on the host's sweeping thread ({}); {}",
                build_profile(),
                sizes(sweeps, &|r| format!("{} ms", r.millis))
            ),
        },
    ]
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Entry `i`: a tenth stale (the mapping's flows still going over 169.254.77.3, a link that is
/// gone), a tenth current (over .1), the rest the node's own connections to a resolver.
fn entry(i: u32) -> Entry {
    let source = SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from(0x0a00_0000 + i / 50_000),
        (10_000 + i % 50_000) as u16,
    ));
    let dialed = SocketAddr::from(([203, 0, 113, 9], 3000));
    let resolver = SocketAddr::from(([192, 0, 2, 53], 53));
    let (destination, reply_source, mark) = match i % 10 {
        0 => (dialed, SocketAddr::from(([169, 254, 77, 3], 3000)), 0x1),
        1 => (dialed, SocketAddr::from(([169, 254, 77, 1], 3000)), 0x1),
        _ => (resolver, resolver, 0),
    };
    Entry {
        source,
        destination,
        reply_source,
        mark,
    }
}

/// Runs `CHILD what` in `ns` and reads its report.
fn child(exe: &std::path::Path, ns: &Netns, what: &str) -> Result<Run> {
    let mut cmd = ns.command(exe);
    cmd.args([CHILD, what]).stdout(Stdio::piped());
    let text = Proc::spawn(cmd, &format!("{CHILD} {what}"))?.finish(Duration::from_secs(300))?;
    let line = text.lines().last().unwrap_or_default();
    let words: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading the report of {CHILD} {what}: {line:?}"))?;
    let [listed, cleared, grown_kib, peak_kib, millis] = words[..] else {
        bail!("{CHILD} {what} reported {line:?}");
    };
    Ok(Run {
        listed: listed as usize,
        cleared: cleared as usize,
        grown_kib,
        peak_kib,
        millis,
    })
}

/// The child: sweeps (`sweep`) or keeps every entry (`keep`) and prints `listed cleared
/// grown_kib peak_kib millis`.
pub fn run_child(args: &[String]) -> Result<()> {
    let state: HostState = serde_json::from_str(GOLDEN).context("reading the golden state")?;
    let translations = Translations::of(&state, 0xff);
    std::fs::write("/proc/self/clear_refs", "5").context("resetting VmHWM")?;
    let base = status_kib("VmHWM")?;
    let start = Instant::now();
    let (listed, cleared) = match args.first().map(String::as_str) {
        Some("sweep") => {
            let swept = sweep(&KernelConntrack, &translations);
            if let Some(e) = swept.error {
                bail!("the sweep failed: {e}");
            }
            (swept.listed, swept.cleared)
        }
        Some("keep") => {
            let mut every: Vec<Flow> = Vec::new();
            KernelConntrack
                .walk(&mut |f| {
                    every.push(f);
                    std::ops::ControlFlow::Continue(())
                })
                .map_err(anyhow::Error::msg)?;
            let stale: Vec<Flow> = every
                .iter()
                .filter(|f| translations.is_stale(f))
                .cloned()
                .collect();
            (every.len(), std::hint::black_box(stale).len())
        }
        other => bail!("{CHILD}: {other:?} is neither sweep nor keep"),
    };
    let millis = start.elapsed().as_millis();
    let peak = status_kib("VmHWM")?;
    println!(
        "{listed} {cleared} {} {peak} {millis}",
        peak.saturating_sub(base)
    );
    Ok(())
}

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status").context("reading status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/self/status"))
}
