//! nft transaction time and plan pass time for 1, 100, 1,000 and 5,000 mappings on one node.
//!
//! Each size runs in a fresh namespace, in a re-executed copy of this binary
//! (`__hostbench-nft N SAMPLES`): it times `plan()` for the node, then, per sample, tears the
//! table down and times `LinuxHost::apply` of the plan's host state into the empty namespace,
//! an unchanged re-apply compared against the kernel (what a resync does; it must send
//! nothing, and lists the table only when another program changed the ruleset), and the apply
//! of a plan where one endpoint moved (only the elements that differ are sent). Growth rows
//! compare 1,000 mappings with 100.

use std::hint::black_box;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use kuport_core::ir::Family;
use kuport_core::plan::plan;
use kuport_host::{Host as _, LinuxHost};
use kuport_testkit::netns::Netns;
use kuport_testkit::process::Proc;
use serde::{Deserialize, Serialize};

use super::cluster::{self, NODE};
use super::{Measurement, build_profile, list, median};

/// Hidden subcommand: time plan and apply for `N` mappings in the current namespace.
pub const CHILD: &str = "__hostbench-nft";
/// Hidden subcommand: program the plan for `N` mappings in the current namespace and exit
/// (`__hostbench-program N [IPv6]`: with `IPv6`, the dual-stack cluster).
pub const PROGRAM: &str = "__hostbench-program";

/// Sizes and apply samples per size (the 5,000 case takes about a second per sample).
const SIZES: [(usize, usize); 4] = [(1, 5), (100, 5), (1_000, 5), (5_000, 3)];
/// The targets for 5,000 mappings: a first transaction, the apply after one pod moved, and an
/// unchanged verifying pass.
const TARGET_5000_MS: f64 = 500.0;
const TARGET_CHANGE_MS: f64 = 100.0;
const TARGET_UNCHANGED_MS: f64 = 100.0;
/// Growth allowed for 10× the mappings: the plan, and the apply of one change.
const GROWTH_PLAN: f64 = 12.0;
const GROWTH_CHANGE: f64 = 2.0;

/// What the child reports, one JSON line.
#[derive(Debug, Serialize, Deserialize)]
struct ChildReport {
    mappings: usize,
    rules: String,
    plan_ms: Vec<f64>,
    first_ms: Vec<f64>,
    first_mutations: Vec<usize>,
    unchanged_ms: Vec<f64>,
    unchanged_mutations: Vec<usize>,
    change_ms: Vec<f64>,
    change_sent: Vec<bool>,
    change_lines: Vec<usize>,
    unchanged_listed: Vec<bool>,
}

/// The parent side: one namespace and one child per size.
pub fn measure() -> Result<Vec<Measurement>> {
    let exe = std::env::current_exe().context("finding the current executable")?;
    let mut out = Vec::new();
    let mut reports = Vec::new();
    for (n, samples) in SIZES {
        let ns = Netns::create(super::PREFIX, &format!("nft{n}"))?;
        let mut cmd = ns.command(&exe);
        cmd.args([CHILD, &n.to_string(), &samples.to_string()])
            .stdout(Stdio::piped());
        let text = Proc::spawn(cmd, &format!("{CHILD} {n}"))?.finish(Duration::from_secs(120))?;
        let line = text.lines().last().unwrap_or_default();
        let r: ChildReport = serde_json::from_str(line)
            .with_context(|| format!("reading the report of {CHILD} {n}: {line:?}"))?;
        drop(ns);
        out.extend(rows(&r));
        reports.push(r);
    }
    let at = |n: usize| reports.iter().find(|r| r.mappings == n);
    if let (Some(small), Some(large)) = (at(100), at(1_000)) {
        out.extend(growth(small, large));
    }
    Ok(out)
}

/// 10× the mappings: how much more a plan pass and a one-change apply cost.
fn growth(small: &ChildReport, large: &ChildReport) -> Vec<Measurement> {
    let row = |what: &str, a: &[f64], b: &[f64], limit: f64| {
        let ratio = median(b) / median(a);
        Measurement {
            name: format!("growth: {what}, 1,000 mappings ÷ 100"),
            value: ratio,
            unit: "ratio".to_owned(),
            samples: b.len(),
            baseline: Some(median(a)),
            target: format!("≤ {limit}×"),
            met: Some(ratio <= limit),
            note: format!("medians {:.2} ms vs {:.2} ms", median(b), median(a)),
        }
    };
    vec![
        row("plan pass", &small.plan_ms, &large.plan_ms, GROWTH_PLAN),
        row(
            "apply after one pod moved",
            &small.change_ms,
            &large.change_ms,
            GROWTH_CHANGE,
        ),
    ]
}

/// The report's four rows for one size: plan, first apply, change, unchanged re-apply.
// Long: one literal Measurement per report row, each read against the others; splitting them
// into four functions scatters the table.
fn rows(r: &ChildReport) -> Vec<Measurement> {
    let n_mappings = mappings_text(r.mappings);
    let first = median(&r.first_ms);
    let is_target_size = r.mappings == 5_000;
    let unchanged_ok = r.unchanged_mutations.iter().all(|m| *m == 0);
    vec![
        Measurement {
            name: format!("plan pass, {n_mappings} on one node"),
            value: median(&r.plan_ms),
            unit: "ms".to_owned(),
            samples: r.plan_ms.len(),
            baseline: None,
            target: String::new(),
            met: None,
            note: format!(
                "median of {} passes of plan() for the node (one class, every pod on that node), \
                 {}; {}",
                r.plan_ms.len(),
                build_profile(),
                r.rules
            ),
        },
        Measurement {
            name: format!("nft transaction, {n_mappings} on one node (first apply)"),
            value: first,
            unit: "ms".to_owned(),
            samples: r.first_ms.len(),
            baseline: None,
            target: if is_target_size {
                format!("≤ {TARGET_5000_MS} ms")
            } else {
                String::new()
            },
            met: is_target_size.then_some(first <= TARGET_5000_MS),
            note: format!(
                "LinuxHost::apply into an empty namespace (one transaction, a terse listing to \
                 check the hooks); samples {} ms",
                list(&r.first_ms, 1)
            ),
        },
        Measurement {
            name: format!("nft transaction, one endpoint moved, {n_mappings}"),
            value: median(&r.change_ms),
            unit: "ms".to_owned(),
            samples: r.change_ms.len(),
            baseline: None,
            target: if is_target_size {
                format!("≤ {TARGET_CHANGE_MS} ms")
            } else {
                String::new()
            },
            met: is_target_size.then(|| median(&r.change_ms) <= TARGET_CHANGE_MS),
            note: format!(
                "LinuxHost::apply of the plan after one pod moved (only the elements that \
                 differ are sent); transaction sent: {:?}, lines {:?}; samples {} ms",
                r.change_sent,
                r.change_lines,
                list(&r.change_ms, 1)
            ),
        },
        Measurement {
            name: format!("unchanged re-apply, {n_mappings} (compared against the kernel)"),
            value: median(&r.unchanged_ms),
            unit: "ms".to_owned(),
            samples: r.unchanged_ms.len(),
            baseline: None,
            target: if is_target_size {
                format!("applies nothing, ≤ {TARGET_UNCHANGED_MS} ms")
            } else {
                "applies nothing".to_owned()
            },
            met: Some(
                unchanged_ok && (!is_target_size || median(&r.unchanged_ms) <= TARGET_UNCHANGED_MS),
            ),
            note: format!(
                "LinuxHost::apply(verify) of the state just applied; kernel mutations per sample \
                 {:?} (first apply: {:?}, the transaction and one ip rule); table listed: {:?}; \
                 samples {} ms",
                r.unchanged_mutations,
                r.first_mutations,
                r.unchanged_listed,
                list(&r.unchanged_ms, 1)
            ),
        },
    ]
}

/// `1 mapping`, `5,000 mappings`.
pub fn mappings_text(n: usize) -> String {
    if n == 1 {
        "1 mapping".to_owned()
    } else {
        format!("{} mappings", thousands(n))
    }
}

/// `5000` as `5,000`.
pub fn thousands(n: usize) -> String {
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn count_arg(args: &[String], i: usize, what: &str) -> Result<usize> {
    args.get(i)
        .with_context(|| format!("missing argument {what}"))?
        .parse()
        .with_context(|| format!("argument {what} is not a count"))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `__hostbench-nft N SAMPLES`, inside a throwaway namespace.
pub fn child(args: &[String]) -> Result<()> {
    let n = count_arg(args, 0, "N")?;
    let samples = count_arg(args, 1, "SAMPLES")?;
    let snap = cluster::snapshot(n, false)?;
    let facts = cluster::facts();
    let now = cluster::now()?;
    let runs = if n >= 5_000 { 11 } else { 21 };
    for _ in 0..3 {
        black_box(plan(black_box(&snap), NODE, &facts, now));
    }
    let plan_ms = (0..runs)
        .map(|_| {
            let start = Instant::now();
            black_box(plan(black_box(&snap), NODE, &facts, now));
            ms(start.elapsed())
        })
        .collect();
    let state = cluster::host_state(&snap, true)?;
    let moved = cluster::host_state(&cluster::snapshot(n, true)?, false)?;
    if moved == state {
        bail!("moving a pod did not change the host state");
    }
    let mut report = ChildReport {
        mappings: n,
        rules: cluster::kernel_size(&state),
        plan_ms,
        first_ms: Vec::new(),
        first_mutations: Vec::new(),
        unchanged_ms: Vec::new(),
        unchanged_mutations: Vec::new(),
        change_ms: Vec::new(),
        change_sent: Vec::new(),
        change_lines: Vec::new(),
        unchanged_listed: Vec::new(),
    };
    runtime()?.block_on(async {
        let mut host = LinuxHost::new().context("opening netlink")?;
        for _ in 0..samples {
            host.teardown().await.context("tearing the table down")?;
            let start = Instant::now();
            let first = host.apply(&state, true).await.context("first apply")?;
            report.first_ms.push(ms(start.elapsed()));
            report.first_mutations.push(first.mutations());
            let start = Instant::now();
            let again = host.apply(&state, true).await.context("unchanged apply")?;
            report.unchanged_ms.push(ms(start.elapsed()));
            report.unchanged_mutations.push(again.mutations());
            report.unchanged_listed.push(again.nft_listed);
            let start = Instant::now();
            let change = host.apply(&moved, false).await.context("changed apply")?;
            report.change_ms.push(ms(start.elapsed()));
            report.change_sent.push(change.nft_changed);
            report.change_lines.push(change.nft_lines);
        }
        host.teardown().await.context("final teardown")
    })?;
    println!(
        "{}",
        serde_json::to_string(&report).context("encoding the report")?
    );
    Ok(())
}

/// `__hostbench-program N [IPv6]`: programs the node of the flow measurements and leaves the
/// table; prints the size of the table the flows of that family cross.
pub fn program(args: &[String]) -> Result<()> {
    let n = count_arg(args, 0, "N")?;
    let family = match args.get(1).map(String::as_str) {
        None | Some("IPv4") => Family::V4,
        Some("IPv6") => Family::V6,
        Some(other) => bail!("{PROGRAM}: family {other:?} is neither IPv4 nor IPv6"),
    };
    let state = cluster::host_state_in(&cluster::snapshot_in(n, false, family)?, family, true)?;
    let report = runtime()?.block_on(async {
        let mut host = LinuxHost::new().context("opening netlink")?;
        host.apply(&state, true).await.context("applying")
    })?;
    if !report.nft_changed {
        bail!("applying {n} mappings sent no nft transaction");
    }
    println!("{}", cluster::kernel_size_in(&state, family));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(1), "1");
        assert_eq!(thousands(100), "100");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(12_345_678), "12,345,678");
        assert_eq!(mappings_text(1), "1 mapping");
        assert_eq!(mappings_text(5_000), "5,000 mappings");
    }
}
