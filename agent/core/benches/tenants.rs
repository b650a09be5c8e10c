//! Many tenants in one class: what a pass costs when tenants write PortMaps the class must weigh
//! but that share nothing (every one with its own interface list), or that the class refuses
//! outright (namespaces it does not select), against the same number with one shared list.
//!
//! `cargo bench -p kuport-core --bench tenants` builds, per workload, 10,000 PortMaps (each
//! with its Service's EndpointSlice) in 100 namespaces of one Single class of three accepting
//! nodes, and reports for the pass of `edge-0` (`plan_with(…, Detail::Written)`):
//! - the median time over 10 runs (after 3 warm-up passes), in this process;
//! - the peak memory of one pass: a child process of this bench builds the same snapshot, then
//!   resets its peak RSS (`/proc/self/clear_refs`), runs one pass and reads `VmHWM` less the RSS
//!   before the pass.
//!
//! Ratios are against the baseline measured in the same run: `shared` for `distinct` and
//! `unselected`, `shared-wide` (the same number of bound interfaces) for `distinct-valid`. `KUPORT_BENCH_TENANTS=<n>` sets the
//! number of PortMaps.

use std::hint::black_box;
use std::time::{Duration, Instant};

use kuport_core::plan::{AcceptedReason, Detail, Plan, plan_with};
use kuport_core::snapshot::{HostFacts, Snapshot};
use kuport_testkit::cluster::{CREATED, facts, now, typed};
use kuport_testkit::objects::{self, endpoint, node_row, pm, slice};
use serde_json::{Value, json};

const NAMESPACES: usize = 100;
const RUNS: usize = 10;
const WARMUP: usize = 3;
/// The interface names the class of the `distinct-valid` workload offers: a PortMap's list is
/// a distinct subset of them.
const OFFERED: usize = 14;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    /// Every PortMap binds `[enp1s0]`.
    Shared,
    /// Every PortMap lists `[enp1s0, j<n>]`: a list of its own, naming an interface no node
    /// carries (refused `InterfaceNotInClass`).
    Distinct,
    /// The class offers 14 names; every PortMap lists the same 7 of them: the baseline of
    /// `DistinctValid`, binding as much.
    SharedWide,
    /// The class offers 14 names; every PortMap lists a distinct subset of them (accepted), 7
    /// names on average.
    DistinctValid,
    /// The `Distinct` lists, in namespaces the class does not select.
    Unselected,
}

const WORKLOADS: [Workload; 5] = [
    Workload::Shared,
    Workload::Distinct,
    Workload::Unselected,
    Workload::SharedWide,
    Workload::DistinctValid,
];

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Shared => "shared",
            Workload::Distinct => "distinct",
            Workload::SharedWide => "shared-wide",
            Workload::DistinctValid => "distinct-valid",
            Workload::Unselected => "unselected",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        WORKLOADS.into_iter().find(|w| w.name() == text)
    }

    fn interfaces(self, j: usize) -> Vec<String> {
        match self {
            Workload::Shared => vec!["enp1s0".to_owned()],
            Workload::Distinct | Workload::Unselected => {
                vec!["enp1s0".to_owned(), format!("j{j:05}")]
            }
            Workload::SharedWide => (0..OFFERED / 2).map(offered).collect(),
            // Bits of j + 1: a distinct, non-empty subset for every j below 2^14 - 1.
            Workload::DistinctValid => (0..OFFERED)
                .filter(|b| (j + 1) >> b & 1 == 1)
                .map(offered)
                .collect(),
        }
    }

    fn offered(self) -> Vec<String> {
        match self {
            Workload::SharedWide | Workload::DistinctValid => (0..OFFERED).map(offered).collect(),
            _ => vec!["enp1s0".to_owned(), "wt0".to_owned()],
        }
    }
}

fn offered(b: usize) -> String {
    format!("if{b:02}")
}

fn node_name(i: usize) -> String {
    format!("edge-{i}")
}

fn cluster(workload: Workload, portmaps: usize) -> Snapshot {
    let mut snap = Snapshot::default();
    for i in 0..3 {
        let node = objects::node(&node_name(i), Some(&format!("100.64.0.{}", i + 1)), true);
        snap.nodes.push(typed(node, "node"));
    }
    let tier = if workload == Workload::Unselected {
        "private"
    } else {
        "public"
    };
    for n in 0..NAMESPACES {
        let ns = objects::namespace(&format!("ns-{n:02}"), json!({"tier": tier}));
        snap.namespaces.push(typed(ns, "namespace"));
    }
    let ifaces = workload.offered();
    let nodes: serde_json::Map<String, Value> = (0..3)
        .map(|i| (node_name(i), json!({"interfaces": ifaces})))
        .collect();
    let rows: Vec<Value> = (0..3)
        .map(|i| {
            let addresses: serde_json::Map<String, Value> = ifaces
                .iter()
                .enumerate()
                .map(|(k, name)| (name.clone(), json!(format!("203.0.{k}.{}", i + 1))))
                .collect();
            node_row(&node_name(i), Value::Object(addresses), 1450)
        })
        .collect();
    let spec = json!({"nodes": nodes, "ports": {"min": 1024, "max": 65535, "systemReserved": []},
        "namespaceSelector": {"matchLabels": {"tier": "public"}},
        "returnPath": {"mode": "None"}});
    let class = objects::class("public", spec)
        .created(CREATED)
        .generation(1)
        .status(json!({"nodes": rows}));
    snap.classes.push(typed(class.object(), "class"));
    for j in 0..portmaps {
        let namespace = format!("ns-{:02}", j % NAMESPACES);
        let name = format!("pm-{j:05}");
        let port = i32::try_from(2000 + j).expect("a port");
        let ifaces = workload.interfaces(j);
        let ifaces: Vec<&str> = ifaces.iter().map(String::as_str).collect();
        let p = pm(&namespace, &name, "public", port)
            .generation(1)
            .created(CREATED)
            .ifaces(&ifaces);
        snap.portmaps.push(typed(p.object(), "portmap"));
        let address = format!("10.244.{}.{}", (j / 250) % 250, 1 + j % 250);
        let pod = endpoint(&address, &node_name(j % 3))
            .ready(true)
            .pod(&namespace, &format!("{name}-0"));
        let s = slice(&namespace, &format!("{name}-abcde"), &name)
            .port("game", "UDP", port)
            .endpoint(pod);
        snap.endpoint_slices.push(typed(s.object(), "slice"));
    }
    snap
}

fn edge_facts() -> HostFacts {
    facts(
        &[("enp1s0", "203.0.0.1"), ("wt0", "100.64.0.1")],
        "wt0",
        1500,
    )
}

fn pass(snap: &Snapshot) -> Plan {
    plan_with(snap, &node_name(0), &edge_facts(), now(), Detail::Written)
}

fn median_ms(snap: &Snapshot) -> f64 {
    for _ in 0..WARMUP {
        black_box(pass(black_box(snap)));
    }
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            black_box(pass(black_box(snap)));
            start.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2].as_secs_f64() * 1000.0
}

/// A field of `/proc/self/status` in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// In the child: one pass's peak RSS above the RSS before it, in KiB.
fn pass_peak_kib(workload: Workload, portmaps: usize) -> u64 {
    let snap = cluster(workload, portmaps);
    let before = status_kib("VmRSS:");
    // "5" resets the peak RSS (VmHWM) to the current RSS.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
    let plan = black_box(pass(&snap));
    let peak = status_kib("VmHWM:");
    drop(plan);
    peak.saturating_sub(before)
}

/// Runs this bench again as a child measuring `workload`'s pass peak.
fn measure_in_child(workload: Workload, portmaps: usize) -> u64 {
    let me = std::env::current_exe().expect("the bench binary");
    let out = std::process::Command::new(me)
        .env("KUPORT_BENCH_TENANTS_CHILD", workload.name())
        .env("KUPORT_BENCH_TENANTS", portmaps.to_string())
        .output()
        .expect("run the bench's child");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("peak-kib ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("the child printed no peak: {text}"))
}

fn counts(plan: &Plan) -> String {
    let mut by_reason: std::collections::BTreeMap<AcceptedReason, usize> = Default::default();
    for d in &plan.portmaps {
        *by_reason.entry(d.accepted.reason).or_default() += 1;
    }
    by_reason
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    let portmaps = std::env::var("KUPORT_BENCH_TENANTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    if let Some(child) = std::env::var("KUPORT_BENCH_TENANTS_CHILD")
        .ok()
        .and_then(|w| Workload::parse(&w))
    {
        println!("peak-kib {}", pass_peak_kib(child, portmaps));
        return;
    }
    let mut bases: std::collections::BTreeMap<&str, (f64, u64)> = Default::default();
    println!(
        "| workload | PortMaps | accepted as | pass median | pass peak memory | time ratio | memory ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for workload in WORKLOADS {
        let snap = cluster(workload, portmaps);
        let reasons = counts(&pass(&snap));
        let ms = median_ms(&snap);
        drop(snap);
        let kib = measure_in_child(workload, portmaps);
        let baseline = match workload {
            Workload::SharedWide | Workload::DistinctValid => "shared-wide",
            _ => "shared",
        };
        let (base_ms, base_kib) = *bases.entry(baseline).or_insert((ms, kib));
        println!(
            "| {} | {portmaps} | {reasons} | {ms:.1} ms | {:.1} MiB | {:.2} | {:.2} |",
            workload.name(),
            kib as f64 / 1024.0,
            ms / base_ms,
            kib as f64 / base_kib.max(1) as f64,
        );
    }
}
