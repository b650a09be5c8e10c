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

#[test]
fn check_loads_scenarios_without_root_and_refuses_a_bad_ip_family() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "name: good\ncni: kindnet\nnodes: [{name: a, public: true}]\npods: [{namespace: n, name: p, node: a, service: s, ipFamilies: [IPv6, IPv4]}]\nsteps:\n  - probe: {from: internet, to: {node: a, interface: enp1s0, family: IPv6}, protocol: UDP, port: 1, expect: reply}\n",
    )
    .expect("write the scenario");
    let out = lab(&["check", &good.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(good)"));
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: bad\ncni: kindnet\nnodes: [{name: a}]\npods: [{namespace: n, name: p, node: a, ipFamilies: [IPv6, IPv6]}]\nsteps: []\n",
    )
    .expect("write the scenario");
    let path = bad.display().to_string();
    let out = lab(&["check", &path]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(&path), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ipFamilies takes"),
        "{}",
        stderr(&out)
    );
}

/// The IPv6 topology of every CNI emulation, as root: the internet client reaches a public
/// node's `enp1s0` over IPv6, and each node a pod on the other node (the lab also checks every
/// such pair itself before a scenario's agents start). Skips with one line when not root, and
/// fails then when `KUPORT_REQUIRE_ROOT_TESTS=1`. Waits for any other lab run holding
/// `/tmp/kuport-lab.lock`.
#[test]
fn ipv6_reaches_public_interfaces_and_pods_across_nodes_in_every_cni() {
    if !is_root() {
        assert_ne!(
            std::env::var("KUPORT_REQUIRE_ROOT_TESTS").as_deref(),
            Ok("1"),
            "KUPORT_REQUIRE_ROOT_TESTS=1 but this test is not root"
        );
        eprintln!("skipped (needs root): IPv6 topology of every CNI emulation");
        return;
    }
    let lock = std::fs::File::create("/tmp/kuport-lab.lock").expect("the lab lock file");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).expect("the lab lock");
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut files = Vec::new();
    for cni in ["cilium-tunnel", "cilium-native", "kindnet"] {
        let file = dir.path().join(format!("{cni}.yaml"));
        std::fs::write(&file, ipv6_scenario(cni)).expect("write the scenario");
        files.push(file.display().to_string());
    }
    let mut args = vec!["run"];
    args.extend(files.iter().map(String::as_str));
    let out = lab(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", stderr(&out));
    assert!(stdout.contains("3 passed, 0 failed"), "{stdout}");
}

/// Two nodes (one public), a pod on each (`kl-pod-1` is p-a), and pings over IPv6 from the
/// internet client, across the nodes and from pod to pod.
fn ipv6_scenario(cni: &str) -> String {
    format!(
        "name: ipv6-{cni}\ncni: {cni}\nnodes: [{{name: edge-a, public: true}}, {{name: worker-b}}]\n\
         pods:\n  - {{namespace: n, name: p-a, node: edge-a}}\n  - {{namespace: n, name: p-b, node: worker-b}}\n\
         steps:\n\
         \x20 - hostExec: {{name: internet-to-enp1s0, node: internet, command: \"ping -6 -c1 -W2 ${{public6:edge-a}}\"}}\n\
         \x20 - hostExec: {{name: edge-to-remote-pod, node: edge-a, command: \"ping -6 -c1 -W2 ${{pod6:n/p-b}}\"}}\n\
         \x20 - hostExec: {{name: worker-to-remote-pod, node: worker-b, command: \"ping -6 -c1 -W2 ${{pod6:n/p-a}}\"}}\n\
         \x20 - hostExec: {{name: pod-to-remote-pod, node: edge-a, command: \"ip netns exec kl-pod-1 ping -6 -c1 -W2 ${{pod6:n/p-b}}\"}}\n"
    )
}
