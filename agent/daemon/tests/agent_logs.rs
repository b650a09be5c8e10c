//! The agent's log lines as `kubectl logs` shows them: with standard error not a terminal (a
//! container's, a pipe), no ANSI colour codes, so the lines are the documented format and grep
//! finds `node=n1`. The agent runs in a throwaway network namespace (it opens netlink there)
//! against an API server that refuses connections, so it logs its start and its failing watches
//! and programs nothing.

use std::io::Read as _;
use std::time::{Duration, Instant};

use kuport_testkit::netns::Netns;

#[test]
fn logs_written_to_a_pipe_carry_no_colour_codes() {
    if !kuport_testkit::netns::root_or_skip("logs_written_to_a_pipe_carry_no_colour_codes", &["ip"])
    {
        return;
    }
    let ns = Netns::create("kt-", "logs").expect("namespace");
    let dir = tempfile::tempdir().expect("temporary directory");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"http://127.0.0.1:9\"}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .expect("kubeconfig");
    let kubeconfig = kubeconfig.display().to_string();
    let mut agent = ns
        .spawn(
            env!("CARGO_BIN_EXE_kuport"),
            &[
                "agent",
                "--node-name",
                "n1",
                "--kubeconfig",
                &kubeconfig,
                "--health-addr",
                "127.0.0.1:18081",
                "--metrics-addr",
                "127.0.0.1:18081",
            ],
        )
        .expect("the agent starts");
    let mut stderr = agent.take_stderr().expect("stderr piped");
    // Read until the start line has come (it follows the warnings of a missing --host-ip).
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 4096];
    while !text.contains("starting") && Instant::now() < deadline {
        match stderr.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    agent.stop(Duration::from_secs(5));
    assert!(
        text.contains("kuport agent") && text.contains("starting"),
        "no start line: {text}"
    );
    assert!(text.contains("node=n1"), "the field as documented: {text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a pipe: {text:?}");
}
