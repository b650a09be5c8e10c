//! The kernel tests' harness and helpers: throwaway network namespaces (the guards of
//! `kuport_testkit::netns`, deleted by name when dropped, even when the test fails; processes
//! started in one are killed by pid the same way), bodies run inside them, the golden states;
//! and the node, pod and client shapes the traffic suites share ([`topology`]).

#![allow(dead_code)]

pub mod topology;

use std::future::Future;
use std::process::Command;

use kuport_testkit::netns::Netns;

/// Returns false (after one line saying why) when the test must skip; panics instead when
/// `KUPORT_REQUIRE_ROOT_TESTS=1`.
pub fn root_or_skip(test: &str) -> bool {
    kuport_testkit::netns::root_or_skip(test, &["nft", "ip"])
}

/// Prefix of the test namespaces: `kt-<pid>-<tag>`.
const PREFIX: &str = "kt-";

/// A namespace `kt-<pid>-<tag>` with loopback up, for one test; its guard deletes it by name
/// (killing what still runs in it) even when the test fails.
pub fn namespace(tag: &str) -> Netns {
    Netns::create(PREFIX, tag).unwrap_or_else(|e| panic!("creating namespace {tag}: {e:#}"))
}

/// Runs `body` on a tokio runtime (inside a namespace child).
pub fn block_on<F: Future>(body: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(body)
}

/// The IR of a golden case of the plan.
pub fn golden_ir(case: &str) -> kuport_core::ir::HostState {
    let path = format!(
        "{}/../core/testdata/golden/{case}.ir.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("golden IR")
}

/// The golden IPv6 table of `case`; empty for a case without one.
pub fn golden_nft6(case: &str) -> String {
    let path = format!(
        "{}/../core/testdata/golden/{case}.nft6",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_default()
}

pub fn golden_nft(case: &str) -> String {
    let path = format!(
        "{}/../core/testdata/golden/{case}.nft",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A listing (of the kernel, or a golden file) as a layout, counters left out: `None` for no
/// table. The kernel lists hash-map elements in its own order, so listings compare parsed.
pub fn table_of(listing: &str) -> Option<kuport_core::render::Layout> {
    if listing.trim().is_empty() {
        return None;
    }
    let parsed = kuport_core::render::parse_listing(listing)
        .unwrap_or_else(|e| panic!("unreadable listing ({e}):\n{listing}"));
    Some(parsed.layout)
}

/// Every golden case.
pub const GOLDEN: [&str; 10] = [
    "empty",
    "same-node-single-port",
    "same-node-range",
    "accepting-remote-pod",
    "pod-node-single",
    "pod-node-multi-two-links",
    "both-roles-multi",
    "dual-stack-accepting-remote-pod",
    "dual-stack-pod-node",
    "dual-stack-same-node",
];

/// Normalised listings of everything on the host that is not kuport's: other nft tables (no
/// handles, no counter values), ip rules, routes of every table, links without statistics.
pub fn foreign_state(sh: impl Fn(&str) -> String) -> String {
    let nft = sh("nft -j list ruleset");
    let mut nft: serde_json::Value = serde_json::from_str(&nft).expect("nft json");
    let items = nft["nftables"].as_array_mut().expect("array");
    items.retain(|o| {
        let table = o
            .as_object()
            .and_then(|m| m.values().next())
            .and_then(|v| v.get("table").or(v.get("name")));
        o.get("metainfo").is_none() && table.and_then(|t| t.as_str()) != Some("kuport")
    });
    for o in items.iter_mut() {
        if let Some(v) = o
            .as_object_mut()
            .and_then(|m| m.values_mut().next())
            .and_then(|v| v.as_object_mut())
        {
            v.remove("handle");
        }
    }
    let rules = sh("ip -j rule");
    let mut rules: Vec<serde_json::Value> = serde_json::from_str(&rules).expect("rule json");
    // kuport's rules sit at priorities 101 and 102 (the foreign rules of these tests do not).
    rules.retain(|r| {
        r.get("priority")
            .and_then(serde_json::Value::as_u64)
            .is_none_or(|p| p != 101 && p != 102)
    });
    let routes = sh("ip -j route show table all");
    let mut routes: Vec<serde_json::Value> = serde_json::from_str(&routes).expect("route json");
    routes.retain(|r| {
        let dev_ours = r
            .get("dev")
            .and_then(|d| d.as_str())
            .is_some_and(|d| d.starts_with("kup-"));
        let table_ours = r
            .get("table")
            .and_then(|t| t.as_str())
            .and_then(|t| t.parse::<u64>().ok())
            .is_some_and(|t| t >> 16 == 0x6b70);
        !dev_ours && !table_ours
    });
    let links = sh("ip -j -d link");
    let mut links: Vec<serde_json::Value> = serde_json::from_str(&links).expect("link json");
    links.retain(|l| l["ifname"].as_str().is_some_and(|n| !n.starts_with("kup-")));
    for l in &mut links {
        if let Some(m) = l.as_object_mut() {
            m.remove("stats64");
            m.remove("stats");
        }
    }
    format!(
        "{nft}\n{}\n{}\n{}",
        serde_json::json!(rules),
        serde_json::json!(routes),
        serde_json::json!(links)
    )
}

/// A named test body.
pub type Test = (&'static str, fn());

/// The harness of a kernel test binary (`harness = false`). A body that must act inside a
/// namespace re-runs this binary there with `--kuport-child <body>` (see [`child`]), so the host
/// layer's nft and netlink calls reach that namespace without any unsafe `setns`. Prints libtest's
/// summary line, so CI counts these tests like the others.
pub fn harness(tests: &[Test], children: &[Test]) -> std::process::ExitCode {
    use std::process::ExitCode;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--kuport-child") {
        let name = args.get(i + 1).map(String::as_str).unwrap_or_default();
        let Some((_, body)) = children.iter().find(|(n, _)| *n == name) else {
            eprintln!("no child body {name}");
            return ExitCode::FAILURE;
        };
        body();
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected: Vec<&Test> = tests
        .iter()
        .filter(|(n, _)| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str())))
        .collect();
    if args.iter().any(|a| a == "--list") {
        for (n, _) in &selected {
            println!("{n}: test");
        }
        return ExitCode::SUCCESS;
    }
    if !root_or_skip("kernel tests") {
        println!(
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {} filtered out",
            selected.len()
        );
        return ExitCode::SUCCESS;
    }
    // Namespaces of an earlier run killed before its guards ran.
    kuport_testkit::netns::remove_stale(PREFIX);
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in selected {
        if std::panic::catch_unwind(test).is_ok() {
            println!("test {name} ... ok");
            passed += 1;
        } else {
            println!("test {name} ... FAILED");
            failed += 1;
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "test result: {verdict}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out"
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs child body `name` in `ns`, failing with its output when it fails; returns what it
/// printed.
pub fn child(ns: &Netns, name: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name()])
        .arg(exe)
        .args(["--kuport-child", name])
        .env("RUST_BACKTRACE", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run child");
    assert!(
        out.status.success(),
        "{name} in {}:\n{}{}",
        ns.name(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a shell command in the current namespace; panics with its error output on failure.
pub fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
