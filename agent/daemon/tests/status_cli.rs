//! `kuport status`, run as a binary on recorded cluster dumps (testdata/status/*.yaml): golden
//! text and JSON for the overview and for one mapping's explanation, and the exit statuses a
//! script gates on. Regenerate the goldens with
//! `KUPORT_BLESS=1 cargo test -p kuport --test status_cli`.

use std::path::{Path, PathBuf};
use std::process::Output;

const NOW: &str = "2026-01-01T00:10:00Z";
/// The time the lab dump was recorded at (its objects are stamped by the lab's clock).
const LAB_NOW: &str = "2026-12-03T17:41:45Z";

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/status")
        .join(rel)
}

fn status(dump: &str, extra: &[&str]) -> Output {
    let path = testdata(&format!("{dump}.yaml"));
    let now = if dump.starts_with("lab-") {
        LAB_NOW
    } else {
        NOW
    };
    std::process::Command::new(env!("CARGO_BIN_EXE_kuport"))
        .args(["status", "--now", now, "--objects"])
        .arg(&path)
        .args(extra)
        .output()
        .expect("running kuport")
}

/// Compares stdout with the golden file (or writes it under KUPORT_BLESS) and checks the exit
/// status.
fn golden(dump: &str, extra: &[&str], file: &str, exit: i32) {
    let out = status(dump, extra);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(exit),
        "kuport status {dump} {extra:?}: stderr:\n{stderr}\nstdout:\n{stdout}"
    );
    let path = testdata(&format!("golden/{file}"));
    if std::env::var_os("KUPORT_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("golden dir");
        std::fs::write(&path, &stdout).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with KUPORT_BLESS=1)", path.display()));
    assert!(
        expected == stdout,
        "{file} differs:\n--- expected\n{expected}\n--- actual\n{stdout}"
    );
}

#[test]
fn everything_programmed_exits_0() {
    golden("multi-programmed", &[], "multi-programmed.txt", 0);
    golden(
        "multi-programmed",
        &["-o", "json"],
        "multi-programmed.json",
        0,
    );
    golden(
        "multi-programmed",
        &["games/gameserver"],
        "multi-programmed.games-gameserver.txt",
        0,
    );
}

/// The same programmed cluster read later: an agent whose last pass is older than three default
/// resyncs has stopped, whatever its written conditions still say (edge-a last passed at
/// 00:09:40, edge-b at 00:09:10).
#[test]
fn an_agent_that_stopped_passing_is_a_problem() {
    let run = |now: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kuport"))
            .args(["status", "--now", now, "--objects"])
            .arg(testdata("multi-programmed.yaml"))
            .output()
            .expect("running kuport")
    };
    let fresh = run("2026-01-01T00:24:00Z");
    assert_eq!(fresh.status.code(), Some(0), "14m50s is not stale yet");
    let stale = run("2026-01-01T00:24:20Z");
    let text = String::from_utf8_lossy(&stale.stdout);
    assert_eq!(stale.status.code(), Some(1), "{text}");
    assert!(
        text.contains("the agent on node edge-b last completed a pass 15m ago"),
        "{text}"
    );
    assert!(
        !text.contains("the agent on node edge-a"),
        "edge-a passed at 00:09:40, under 15 minutes before: {text}"
    );
}

#[test]
fn refusals_and_unready_nodes_exit_1_and_name_the_reason() {
    golden("refused", &[], "refused.txt", 1);
    golden("refused", &["-o", "json"], "refused.json", 1);
    golden("refused", &["games/clash"], "refused.games-clash.txt", 1);
    golden("refused", &["games/idle"], "refused.games-idle.txt", 1);
    golden(
        "refused",
        &["web/fresh", "-o", "json"],
        "refused.web-fresh.json",
        1,
    );
    let text = String::from_utf8_lossy(&status("refused", &[]).stdout).into_owned();
    for expected in [
        "PortMap games/clash is not accepted: PortConflict",
        "PortMap games/idle is not programmed: NoReadyEndpoint",
        "PortMap web/fresh has no status yet",
        "node edge-b does not accept for PortMapClass public: interface wt0 not present",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}

/// A dump recorded from the lab's Multi scenario (the real agents' writes and Events) after a
/// clashing mapping was refused.
#[test]
fn a_recorded_lab_cluster() {
    golden("lab-multi-clash", &[], "lab-multi-clash.txt", 1);
    golden(
        "lab-multi-clash",
        &["games/clash"],
        "lab-multi-clash.games-clash.txt",
        1,
    );
    golden(
        "lab-multi-clash",
        &["games/gameserver"],
        "lab-multi-clash.games-gameserver.txt",
        0,
    );
}

/// Endpoints that are not pod addresses are named, and a port whose holder is gone stays
/// refused with the claim's words.
#[test]
fn rejected_endpoints_and_held_claims_are_explained() {
    golden("hardened", &[], "hardened.txt", 1);
    golden("hardened", &["team-b/evil"], "hardened.team-b-evil.txt", 1);
    golden(
        "hardened",
        &["team-b/mixed"],
        "hardened.team-b-mixed.txt",
        0,
    );
    let text = String::from_utf8_lossy(&status("hardened", &[]).stdout).into_owned();
    for expected in [
        "PortMap team-b/evil is not programmed: EndpointNotAllowed",
        "100.64.0.1 on node edge-a is an address of node edge-a",
        "PortMap team-b/steal is not accepted: PortInUse",
        "keeps its claim while it is gone",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}

#[test]
fn an_empty_cluster_is_fine() {
    golden("empty", &[], "empty.txt", 0);
}

#[test]
fn a_missing_mapping_exits_3_and_bad_input_exits_2() {
    let out = status("refused", &["games/nothing"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PortMap games/nothing not found"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kuport"))
        .args(["status", "--objects", "/nonexistent/dump.yaml"])
        .output()
        .expect("running kuport");
    assert_eq!(out.status.code(), Some(2));
    let out = status("refused", &["not-a-ref"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a malformed mapping name is bad input"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("NAMESPACE/NAME"));
}

/// A monitor running `kuport status` must tell "not programmed" (1) from "could not ask" (4):
/// a cluster that cannot be reached is neither healthy nor known to be broken.
#[test]
fn a_cluster_that_cannot_be_read_exits_4_not_1() {
    let dir = tempfile::tempdir().expect("temporary directory");
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        kuport_sim::apiserver::kubeconfig("http://127.0.0.1:1"),
    )
    .expect("write the kubeconfig");
    for extra in [&[][..], &["games/gs"][..]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kuport"))
            .arg("status")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(extra)
            .output()
            .expect("running kuport");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{stderr}");
        assert!(stderr.contains("cannot read the cluster"), "{stderr}");
        assert!(
            stderr.contains("listing PortMapClasses"),
            "names what failed: {stderr}"
        );
    }
    let missing = dir.path().join("absent");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kuport"))
        .arg("status")
        .arg("--kubeconfig")
        .arg(&missing)
        .output()
        .expect("running kuport");
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
