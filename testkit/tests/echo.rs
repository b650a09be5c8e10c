//! `kuport-echo` on loopback, unprivileged: the responder answers with the peer it saw, the
//! prober reports it, a closed port is refused; and [`kuport_testkit::bins::echo`] finds the
//! binary cargo built for this test.

use std::net::{TcpListener, UdpSocket};
use std::process::{Command, Stdio};

use kuport_testkit::process::Proc;

const ECHO: &str = env!("CARGO_BIN_EXE_kuport-echo");

/// A port free on loopback for `proto` just now.
fn free_port(proto: &str) -> u16 {
    match proto {
        "udp" => UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()),
        _ => TcpListener::bind("127.0.0.1:0").and_then(|s| s.local_addr()),
    }
    .expect("a free port")
    .port()
}

/// Starts `kuport-echo serve proto port` and waits for its `ready` line.
fn serve(proto: &str, port: u16) -> Proc {
    let mut cmd = Command::new(ECHO);
    cmd.args(["serve", proto, &port.to_string(), "--tag", "t1"])
        .stdout(Stdio::piped());
    let mut proc = Proc::spawn(cmd, "kuport-echo serve").expect("kuport-echo starts");
    let out = proc.take_stdout().expect("stdout");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).expect("ready");
    assert_eq!(line.trim(), "ready");
    proc
}

/// `kuport-echo ask proto 127.0.0.1:port`: (exit code, stdout).
fn ask(proto: &str, port: u16) -> (Option<i32>, String) {
    ask_at(proto, &format!("127.0.0.1:{port}"))
}

/// `kuport-echo ask proto target`: (exit code, stdout).
fn ask_at(proto: &str, target: &str) -> (Option<i32>, String) {
    let out = Command::new(ECHO)
        .args(["ask", proto, target, "--timeout-ms", "3000"])
        .output()
        .expect("kuport-echo ask runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// The `key=value` field of an answer.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_default()
}

#[test]
fn the_responder_answers_with_the_peer_it_saw() {
    for proto in ["udp", "tcp"] {
        let port = free_port(proto);
        let _responder = serve(proto, port);
        let (code, text) = ask(proto, port);
        assert_eq!(code, Some(0), "{proto}: {text}");
        assert!(text.starts_with("reply "), "{proto}: {text}");
        assert_eq!(
            field(&text, "peer"),
            field(&text, "client"),
            "{proto}: {text}"
        );
        assert_eq!(field(&text, "from"), format!("127.0.0.1:{port}"), "{text}");
        assert_eq!(field(&text, "tag"), "t1", "{text}");
    }
}

#[test]
fn a_closed_port_is_refused_and_names_who_refused() {
    let (code, text) = ask("udp", free_port("udp"));
    assert_eq!((code, text.as_str()), (Some(3), "refused from=127.0.0.1"));
    let (code, text) = ask("tcp", free_port("tcp"));
    assert_eq!((code, text.as_str()), (Some(3), "refused from=127.0.0.1"));
}

#[test]
fn the_locator_finds_the_binary_cargo_built() {
    let found = kuport_testkit::bins::echo().expect("kuport-echo located");
    assert_eq!(found, std::path::Path::new(ECHO));
}

/// Whether this host has IPv6 loopback (a kernel without IPv6 skips the IPv6 checks).
fn has_ipv6_loopback() -> bool {
    UdpSocket::bind("[::1]:0").is_ok()
}

#[test]
fn one_responder_answers_both_families_and_reports_ipv4_peers_as_ipv4() {
    if !has_ipv6_loopback() {
        eprintln!("skipped: no IPv6 loopback");
        return;
    }
    for proto in ["udp", "tcp"] {
        // A port free on both families' loopback.
        let port = free_port(proto);
        let _responder = serve(proto, port);
        let (code, text) = ask_at(proto, &format!("[::1]:{port}"));
        assert_eq!(code, Some(0), "{proto}: {text}");
        assert_eq!(field(&text, "from"), format!("[::1]:{port}"), "{text}");
        assert!(field(&text, "peer").starts_with("[::1]:"), "{text}");
        assert_eq!(field(&text, "peer"), field(&text, "client"), "{text}");
        // The same socket takes IPv4, and the IPv4-mapped peer is written as IPv4.
        let (code, text) = ask(proto, port);
        assert_eq!(code, Some(0), "{proto}: {text}");
        assert!(field(&text, "peer").starts_with("127.0.0.1:"), "{text}");
        assert_eq!(field(&text, "peer"), field(&text, "client"), "{text}");
    }
}

#[test]
fn a_closed_ipv6_port_is_refused_and_names_who_refused() {
    if !has_ipv6_loopback() {
        eprintln!("skipped: no IPv6 loopback");
        return;
    }
    for proto in ["udp", "tcp"] {
        let port = match proto {
            "udp" => UdpSocket::bind("[::1]:0").and_then(|s| s.local_addr()),
            _ => TcpListener::bind("[::1]:0").and_then(|s| s.local_addr()),
        }
        .expect("a free IPv6 port")
        .port();
        let (code, text) = ask_at(proto, &format!("[::1]:{port}"));
        assert_eq!(
            (code, text.as_str()),
            (Some(3), "refused from=::1"),
            "{proto}"
        );
    }
}
