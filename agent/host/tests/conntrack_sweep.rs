//! The memory a sweep of stale conntrack entries holds, against the kernel's own table: a
//! namespace filled with 20,000 entries, then 200,000 (a tenth of each fill stale, a tenth
//! kuport's and current, the rest the node's own), swept by a fresh process each time, whose
//! peak RSS growth over the sweep is read from `VmHWM` (reset just before it). The sweep must
//! hold the same few hundred KiB at both sizes and delete exactly the stale entries. The
//! negative control walks the same 200,000 entries the way the agent did before issue 45
//! (every entry kept, the stale ones copied out) and must show the growth per entry the
//! meter is there to catch. On a machine whose `nf_conntrack_max` is below 220,000 the limit is
//! raised for the test and restored. Root only; own harness (see `netns/mod.rs`).

mod netns;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::ExitCode;

use kuport_core::ir::HostState;
use kuport_host::conntrack::{ConntrackTable, Flow, KernelConntrack, Translations, sweep};
use kuport_testkit::conntrack::{Entry, RaisedMax, count, insert};
use kuport_testkit::netns::Netns;
use netns::{child, golden_ir, namespace};

const TESTS: &[netns::Test] = &[
    (
        "a_sweep_holds_the_same_memory_at_20k_and_200k_entries",
        memory_is_flat,
    ),
    (
        "control_keeping_every_entry_grows_with_the_table",
        keeping_every_entry_grows,
    ),
];

const CHILDREN: &[netns::Test] = &[
    ("sweep", child_sweep),
    ("keep_every_entry", child_keep_every_entry),
];

fn main() -> ExitCode {
    netns::harness(TESTS, CHILDREN)
}

/// The sizes the table is filled to.
const SMALL: u32 = 20_000;
const LARGE: u32 = 200_000;
/// The most a sweep's peak RSS may grow, at any size: one receive buffer and one batch are
/// about 100 KiB; the rest is the allocator's and the thread's slack.
const BOUND_KIB: u64 = 2048;
/// How much more the sweep of the large table may hold than that of the small one.
const SLACK_KIB: u64 = 512;

/// The accepting node's golden state: 203.0.113.9 udp 3000 goes over the link ending at
/// 169.254.77.1, with the local mark 0x1.
fn state() -> HostState {
    golden_ir("accepting-remote-pod")
}

/// Entry `i` of a fill: a tenth stale (the mapping's flows still going over 169.254.77.3, a
/// link that is gone), a tenth current (over .1), the rest the node's own connections (to a
/// resolver, unmarked). Clients differ by address and port, so every entry is its own tuple.
fn entry(i: u32) -> Entry {
    let client = SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from(0x0a00_0000 + i / 50_000),
        (10_000 + i % 50_000) as u16,
    ));
    let dialed: SocketAddr = "203.0.113.9:3000".parse().expect("addr");
    let (destination, reply_source, mark) = match i % 10 {
        0 => (dialed, "169.254.77.3:3000", 0x1),
        1 => (dialed, "169.254.77.1:3000", 0x1),
        _ => ("192.0.2.53:53".parse().expect("addr"), "192.0.2.53:53", 0),
    };
    Entry {
        source: client,
        destination,
        reply_source: reply_source.parse().expect("addr"),
        mark,
    }
}

/// Adds entries `from..to` to `ns`'s table.
fn fill(ns: &Netns, from: u32, to: u32) {
    let made = ns
        .run("fill", move || insert((from..to).map(entry), 600))
        .unwrap_or_else(|e| panic!("filling {}: {e:#}", ns.name()));
    assert_eq!(made, (to - from) as usize);
}

fn table_size(ns: &Netns) -> usize {
    ns.run("count", count)
        .unwrap_or_else(|e| panic!("counting {}: {e:#}", ns.name()))
}

/// What a child printed: `listed cleared growth_kib`.
fn measured(out: &str) -> (usize, usize, u64) {
    let words: Vec<u64> = out
        .split_whitespace()
        .map(|w| w.parse().unwrap_or_else(|_| panic!("child said {out:?}")))
        .collect();
    assert_eq!(words.len(), 3, "child said {out:?}");
    (words[0] as usize, words[1] as usize, words[2])
}

/// The host's limit, raised when a small machine's default is below the large fill.
fn room_for(entries: u32) -> RaisedMax {
    RaisedMax::to(u64::from(entries) + u64::from(entries) / 10)
        .unwrap_or_else(|e| panic!("making room for {entries} entries: {e:#}"))
}

fn memory_is_flat() {
    let _room = room_for(LARGE);
    let ns = namespace("ct-sweep");
    let stale_per_fill = |n: u32| (n / 10) as usize;

    fill(&ns, 0, SMALL);
    let (listed, cleared, small_kib) = measured(&child(&ns, "sweep", &[]));
    assert_eq!((listed, cleared), (SMALL as usize, stale_per_fill(SMALL)));
    assert_eq!(table_size(&ns), (SMALL as usize) - cleared);

    fill(&ns, SMALL, LARGE);
    let before = table_size(&ns);
    let (listed, cleared, large_kib) = measured(&child(&ns, "sweep", &[]));
    assert_eq!(listed, before);
    assert_eq!(
        cleared,
        stale_per_fill(LARGE - SMALL),
        "the new stale entries"
    );
    assert_eq!(table_size(&ns), before - cleared, "and nothing else");
    // Swept again: nothing is stale any more.
    let (_, cleared, _) = measured(&child(&ns, "sweep", &[]));
    assert_eq!(cleared, 0);

    eprintln!(
        "sweep peak RSS growth: {small_kib} KiB at {SMALL} entries, {large_kib} KiB at {before}"
    );
    assert!(
        small_kib <= BOUND_KIB && large_kib <= BOUND_KIB,
        "a sweep grew {small_kib} KiB at {SMALL} entries and {large_kib} KiB at {before}: more than {BOUND_KIB} KiB"
    );
    assert!(
        large_kib <= small_kib + SLACK_KIB,
        "the sweep of {before} entries held {large_kib} KiB, of {SMALL} {small_kib} KiB: it grows with the table"
    );
}

fn keeping_every_entry_grows() {
    let _room = room_for(LARGE);
    let ns = namespace("ct-keep");
    fill(&ns, 0, LARGE);
    let (listed, kept_stale, grown_kib) = measured(&child(&ns, "keep_every_entry", &[]));
    assert_eq!(
        (listed, kept_stale),
        (LARGE as usize, (LARGE / 10) as usize)
    );
    // At least the entries themselves: the meter sees what a listing keeps.
    let floor = (listed * std::mem::size_of::<Flow>() / 1024) as u64;
    eprintln!("keeping every entry: {grown_kib} KiB for {listed} entries (floor {floor} KiB)");
    assert!(
        grown_kib >= floor,
        "keeping {listed} entries grew only {grown_kib} KiB, below {floor} KiB"
    );
}

/// `VmHWM` and `VmRSS` of this process, in KiB.
fn rss_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Resets the peak RSS to the current RSS (`clear_refs` 5) and returns it.
fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting VmHWM");
    rss_kib("VmHWM")
}

/// Sweeps this namespace's table by the golden state's translations; prints what it judged,
/// cleared, and how far the peak RSS rose over the sweep.
fn child_sweep() {
    let translations = Translations::of(&state(), 0xff);
    let base = reset_peak();
    let swept = sweep(&KernelConntrack, &translations);
    let grown = rss_kib("VmHWM").saturating_sub(base);
    assert_eq!(swept.error, None);
    println!("{} {} {grown}", swept.listed, swept.cleared);
}

/// The control: every entry kept, the stale ones copied out, as the agent's sweep did before
/// it streamed; deletes nothing. Prints what it kept and how far the peak RSS rose.
fn child_keep_every_entry() {
    let translations = Translations::of(&state(), 0xff);
    let base = reset_peak();
    let mut every = Vec::new();
    KernelConntrack
        .walk(&mut |f| {
            every.push(f);
            std::ops::ControlFlow::Continue(())
        })
        .expect("listing");
    let stale: Vec<Flow> = every
        .iter()
        .filter(|f| translations.is_stale(f))
        .cloned()
        .collect();
    let grown = rss_kib("VmHWM").saturating_sub(base);
    println!("{} {} {grown}", every.len(), stale.len());
}
