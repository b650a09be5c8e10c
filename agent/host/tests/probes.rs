//! The probes across return links over a real VXLAN link between two node namespaces: both
//! ends find the link up; the link port dropped on the mesh takes it down at both ends and
//! lifting the drop brings it back; full-size packets dropped while small ones pass are
//! reported as the MTU. The negative control is the first window: an untouched link stays up.
//! Root only; own harness (see `netns/mod.rs`).

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
use netns::topology::{Cni, apply, child_apply_file, cross_states, cross_topology};

const TESTS: &[netns::Test] = &[(
    "probes_find_a_link_up_down_with_its_port_dropped_and_short_of_its_mtu",
    probes_follow_the_path,
)];

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
}
