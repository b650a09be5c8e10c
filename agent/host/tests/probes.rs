//! The probes across return links over a real VXLAN link between two node namespaces: both
//! ends find the link up; the link port dropped on the mesh takes it down at both ends and
//! lifting the drop brings it back; full-size packets dropped while small ones pass are
//! reported as the MTU; a link deleted and made again is found up again. The negative control
//! is the first window: an untouched link stays up. And a forger in a pod of the prober's node, answering every probe it can guess from the
//! peer's link address, neither verifies a short MTU nor keeps a dead link up, nor gets a forged
//! request answered; the control: the prober as it matched answers before (no device, no nonce,
//! no size) takes the forgeries. Root only; own harness (see `netns/mod.rs`).

mod netns;

use std::io::{BufRead, BufReader};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kuport_core::ir::HostState;
use kuport_core::snapshot::LinkProbe;
use kuport_host::probe::{LinkProber, ProbeSettings, ProbeTarget};
use kuport_testkit::netns::Netns;
use kuport_testkit::process::Proc;
use netns::block_on;
use netns::topology::{Cni, apply, child_apply_file, cross_states, cross_topology, echo, pod};

const TESTS: &[netns::Test] = &[
    (
        "probes_find_a_link_up_down_with_its_port_dropped_and_short_of_its_mtu",
        probes_follow_the_path,
    ),
    (
        "forged_answers_from_a_pod_neither_verify_the_mtu_nor_keep_a_dead_link_up",
        forged_answers_are_not_believed,
    ),
];

const CHILDREN: &[netns::Test] = &[
    ("apply_file", child_apply_file),
    ("probe_links", child_probe_links),
];

fn main() -> ExitCode {
    netns::harness(TESTS, CHILDREN)
}

/// The probe interval of these tests: ten times the agent's default pace, the same counts.
const INTERVAL: Duration = Duration::from_millis(200);

/// Probes the links of the state in `KUPORT_STATE_FILE` for `KUPORT_PROBE_SECONDS`, printing
/// the verdicts as one JSON line every 100 ms.
fn child_probe_links() {
    let path = std::env::var("KUPORT_STATE_FILE").expect("state file");
    let seconds: u64 = std::env::var("KUPORT_PROBE_SECONDS")
        .expect("seconds")
        .parse()
        .expect("a number");
    let state: HostState =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("state");
    block_on(async {
        let mut prober = LinkProber::new(ProbeSettings {
            interval: INTERVAL,
            ..ProbeSettings::default()
        });
        let targets: Vec<ProbeTarget> = state.links.iter().map(ProbeTarget::of).collect();
        prober.follow(&targets);
        let until = tokio::time::Instant::now() + Duration::from_secs(seconds);
        while tokio::time::Instant::now() < until {
            println!("{}", serde_json::to_string(&prober.facts()).expect("json"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// One node's prober, running in its namespace; its latest verdicts arrive on `lines`.
struct Prober {
    _proc: Proc,
    lines: mpsc::Receiver<Vec<LinkProbe>>,
    latest: Vec<LinkProbe>,
}

impl Prober {
    fn start(ns: &Netns, state: &HostState) -> Self {
        let path = std::env::temp_dir().join(format!("{}-probe-state.json", ns.name()));
        std::fs::write(&path, serde_json::to_string(state).expect("json")).expect("write");
        let exe = std::env::current_exe().expect("test binary");
        let mut cmd = ns.command(&exe);
        cmd.args(["--kuport-child", "probe_links"])
            .env("KUPORT_STATE_FILE", &path)
            .env("KUPORT_PROBE_SECONDS", "60")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut proc = Proc::spawn(cmd, &format!("prober in {}", ns.name())).expect("spawn");
        let stdout = proc.take_stdout().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(facts) = serde_json::from_str(&line)
                    && tx.send(facts).is_err()
                {
                    break;
                }
            }
        });
        Self {
            _proc: proc,
            lines,
            latest: Vec::new(),
        }
    }

    /// The one link's verdict once `want` holds of it, within `limit`; panics naming `what`.
    fn until(
        &mut self,
        what: &str,
        limit: Duration,
        want: impl Fn(&LinkProbe) -> bool,
    ) -> LinkProbe {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(p) = self.latest.first().filter(|p| want(p)) {
                return p.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(facts) => self.latest = facts,
                Err(_) => panic!(
                    "{what}: not within {limit:?}; last verdicts {:?}",
                    self.latest
                ),
            }
        }
    }

    /// Every verdict seen during `span` satisfies `holds`.
    fn holds_for(&mut self, what: &str, span: Duration, holds: impl Fn(&LinkProbe) -> bool) {
        let deadline = Instant::now() + span;
        while let Ok(facts) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.latest = facts;
            if let Some(p) = self.latest.first() {
                assert!(holds(p), "{what}: {p:?}");
            }
        }
    }
}

fn up(p: &LinkProbe) -> bool {
    p.up == Some(true)
}

fn down(p: &LinkProbe) -> bool {
    p.up == Some(false)
}

fn probes_follow_the_path() {
    let x = cross_topology(Cni::CiliumLike);
    let (edge_state, worker_state) = cross_states(true);
    apply(&x.edge, &edge_state);
    apply(&x.worker, &worker_state);
    let port = worker_state.links[0].port;
    // The edge's link MTU (each end sizes its full-size probes by its own link's MTU).
    let mtu = edge_state.links[0].mtu.expect("a link MTU");
    let mut edge = Prober::start(&x.edge, &edge_state);
    let mut worker = Prober::start(&x.worker, &worker_state);
    let limit = Duration::from_secs(5);
    let first = edge.until("the edge finds the link up", limit, up);
    worker.until("the worker finds the link up", limit, up);
    assert_eq!(first.peer, "worker-b");
    // The negative control: an untouched link stays up, and its MTU gets verified.
    edge.holds_for("an untouched link", Duration::from_secs(2), up);
    edge.until("the link's MTU is verified", limit, |p| {
        p.verified_mtu == Some(mtu)
    });

    // The mesh drops the link port (the worker's firewall, before kuport's guard).
    let block = format!(
        "nft add table ip kt-block && nft add chain ip kt-block in '{{ type filter hook prerouting priority -400; }}' && nft add rule ip kt-block in udp dport {port}"
    );
    x.worker.sh(&format!("{block} drop"));
    let seen = edge.until("the edge finds the link down", limit, down);
    let message = seen.message.expect("a message");
    assert!(message.starts_with("no answer from worker-b"), "{message}");
    worker.until("the worker finds the link down", limit, down);
    x.worker.sh("nft delete table ip kt-block");
    edge.until("the edge finds it up again", limit, up);
    worker.until("the worker finds it up again", limit, up);

    // Only full-size frames dropped: small probes pass, the MTU check fails.
    x.worker
        .sh(&format!("{block} meta length gt {} drop", mtu / 2));
    let seen = edge.until("the edge reports the MTU", Duration::from_secs(10), down);
    let message = seen.message.expect("a message");
    assert!(message.starts_with("full-size probes"), "{message}");
    assert_eq!(seen.verified_mtu, None);
    x.worker.sh("nft delete table ip kt-block");
    edge.until("the edge finds it up again", limit, |p| {
        up(p) && p.verified_mtu == Some(mtu)
    });

    // The link deleted and made again, as after a restarted mesh daemon took every link bound
    // to its device: a new device under the old name, which the probe socket (bound to a
    // device) must follow.
    let device = &edge_state.links[0].name;
    x.edge.sh(&format!("ip link del {device}"));
    edge.until("the edge finds the link down while it is gone", limit, down);
    apply(&x.edge, &edge_state);
    edge.until("the edge finds the rebuilt link up", limit, |p| {
        up(p) && p.verified_mtu == Some(mtu)
    });
    worker.until("the worker finds it up too", limit, up);
}

/// The sequence number of the forger's request: its answer, if any, is counted by it.
const FORGED_REQUEST: u64 = 0x4b55_5054_0000_0001;

/// `kuport-echo old-probe` in `ns`: (answered, lost) of `count` probes of `size` bytes.
fn old_probe(ns: &Netns, from: &str, to: &str, size: u32) -> (u32, u32) {
    let out = ns.sh(&format!(
        "{} old-probe --from {from} --to {to} --size {size} --count 5 --interval-ms 200",
        echo()
    ));
    let field = |key: &str| -> u32 {
        out.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("old-probe printed {out:?}"))
    };
    (field("answered"), field("lost"))
}

/// The packets of the edge's counter `name` in `table ip kt-watch`.
fn watched(ns: &Netns, name: &str) -> u64 {
    let out = ns.sh(&format!("nft list counter ip kt-watch {name}"));
    out.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("counter {name}: {out}"))
}

fn forged_answers_are_not_believed() {
    let x = cross_topology(Cni::CiliumLike);
    let (edge_state, worker_state) = cross_states(true);
    apply(&x.edge, &edge_state);
    apply(&x.worker, &worker_state);
    let link = &edge_state.links[0];
    let (local, peer) = (
        link.address.addr().to_string(),
        link.peer_address.to_string(),
    );
    let mtu = link.mtu.expect("a link MTU");
    let port = worker_state.links[0].port;
    // A pod on the edge. Its node checks the reverse path loosely, as Cilium leaves its own
    // devices (rp_filter 0) and many distributions the rest (2): the peer's link address is
    // routable, over the link, so a datagram claiming it passes from the pod's interface.
    let forger_pod = pod("x-fpod", &x.edge, "10.244.0.7", "10.244.0.1");
    x.edge
        .sh("sysctl -qw net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.cilium_host.rp_filter=2");
    // What reaches the edge's probe port from the pod's side, and the edge's answers to the
    // forged request.
    x.edge.sh(&format!(
        r#"nft -f - <<'END'
table ip kt-watch {{
 counter forged {{ }}
 counter reflected {{ }}
 chain in {{ type filter hook input priority 0; iifname "cilium_host" ip saddr {peer} udp dport 4794 counter name "forged"; }}
 chain out {{ type filter hook output priority 0; udp sport 4794 @th,128,8 2 @th,136,32 0x4b555054 counter name "reflected"; }}
}}
END"#
    ));
    // The worker's agent answers probes (the edge's own prober starts later: the old-style
    // prober of the control needs its port first).
    let mut worker = Prober::start(&x.worker, &worker_state);
    worker.until("the worker's prober runs", Duration::from_secs(5), |p| {
        p.up.is_some()
    });
    // The mesh carries small frames on the link port, not full-size ones.
    x.worker.sh(&format!(
        "nft add table ip kt-block && nft add chain ip kt-block in '{{ type filter hook prerouting priority -400; }}' && nft add rule ip kt-block in udp dport {port} meta length gt {} drop",
        mtu / 2
    ));

    // The control, before the forger: the old matching answers small probes and loses
    // full-size ones, as the path does.
    assert_eq!(
        old_probe(&x.edge, &local, &peer, 64),
        (5, 0),
        "small probes"
    );
    assert_eq!(
        old_probe(&x.edge, &local, &peer, mtu),
        (0, 5),
        "full-size probes"
    );
    let mut forger = forger_pod
        .spawn(
            echo(),
            &[
                "forge-probes",
                "--from",
                &peer,
                "--to",
                &local,
                "--request-seq",
                &FORGED_REQUEST.to_string(),
            ],
        )
        .expect("the forger starts");
    let mut line = String::new();
    BufReader::new(forger.take_stdout().expect("stdout"))
        .read_line(&mut line)
        .expect("ready line");
    assert_eq!(line.trim(), "ready", "the forger");
    // The control: the old matching takes the forgeries for the peer's answers (the MTU
    // "verified") and answers the forged request toward the peer.
    assert_eq!(
        old_probe(&x.edge, &local, &peer, mtu),
        (5, 0),
        "the old matching, with the forger"
    );
    assert!(
        watched(&x.edge, "reflected") > 0,
        "the old socket answered the forged request"
    );

    // The prober as it is: the forgeries arrive, and count for nothing.
    x.edge.sh("nft reset counters table ip kt-watch >/dev/null");
    let mut edge = Prober::start(&x.edge, &edge_state);
    let seen = edge.until(
        "the edge reports the MTU despite the forger",
        Duration::from_secs(10),
        down,
    );
    let message = seen.message.expect("a message");
    assert!(message.starts_with("full-size probes"), "{message}");
    edge.holds_for("the MTU stays unverified", Duration::from_secs(2), |p| {
        down(p) && p.verified_mtu.is_none()
    });
    // The whole link port dropped: small probes go unanswered but for the forgeries.
    x.worker.sh(&format!(
        "nft flush chain ip kt-block in && nft add rule ip kt-block in udp dport {port} drop"
    ));
    let seen = edge.until(
        "the edge finds the link down despite the forger",
        Duration::from_secs(5),
        |p| {
            down(p)
                && p.message
                    .as_deref()
                    .is_some_and(|m| m.starts_with("no answer"))
        },
    );
    assert_eq!(seen.verified_mtu, None);
    assert!(
        watched(&x.edge, "forged") > 100,
        "the forgeries kept arriving at the edge"
    );
    assert_eq!(
        watched(&x.edge, "reflected"),
        0,
        "the probe socket, bound to the link, never saw the forged request"
    );
    forger.stop(Duration::from_secs(1));
}
