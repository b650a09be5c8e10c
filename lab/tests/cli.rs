//! The `kuport-lab` binary's command line: what it refuses before it creates anything. (This
//! test also makes `cargo test --workspace` build the binary with the workspace's features,
//! which CI then runs instead of rebuilding it with `cargo run -p kuport-lab`.)

use std::path::Path;
use std::process::{Command, Output};

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kuport-lab"))
        .args(args)
        .output()
        .expect("run kuport-lab")
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Without root the lab does nothing but print the command to run it with.
fn assert_asks_for_root(out: &Output, args: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
    let err = stderr(out);
    assert!(err.contains("kuport-lab needs root"), "{err}");
    assert!(err.contains(args), "{err}");
}

#[test]
fn a_scenario_with_an_unknown_field_is_refused_naming_the_file_and_the_field() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("typo.yaml");
    std::fs::write(
        &file,
        "name: typo\ncni: kindnet\nnodes: [{name: a}]\nsteps: []\nstepz: []\n",
    )
    .expect("write the scenario");
    let path = file.display().to_string();
    let out = lab(&["run", &path]);
    if !is_root() {
        assert_asks_for_root(&out, &path);
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&path), "the error names the file: {err}");
    assert!(err.contains("stepz"), "the error names the field: {err}");
    assert_no_lab_namespace();
}

#[test]
fn a_missing_scenario_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("absent.yaml").display().to_string();
    let out = lab(&["run", &path]);
    if !is_root() {
        assert_asks_for_root(&out, &path);
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("reading {path}")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_kept_lab_on_the_real_api_server_is_refused() {
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/cilium-tunnel-cross-node.yaml")
        .display()
        .to_string();
    let out = lab(&["run", &scenario, "--apiserver", "real", "--keep"]);
    if !is_root() {
        assert_asks_for_root(&out, "--apiserver real --keep");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot be kept"), "{}", stderr(&out));
}

/// A refused run creates nothing: no namespace named as the lab names its own. (Another lab
/// may be running; this only looks for the refused scenario's own node.)
fn assert_no_lab_namespace() {
    let list = Command::new("ip").args(["netns", "list"]).output();
    if let Ok(list) = list {
        let names = String::from_utf8_lossy(&list.stdout);
        assert!(
            !names
                .lines()
                .any(|l| l.split_whitespace().next() == Some("kl-a")),
            "a refused scenario created its node's namespace: {names}"
        );
    }
}
