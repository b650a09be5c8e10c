//! New UDP flows per second, and the established-flow packet rate, through a node holding 1,000
//! mappings against the same node holding 1, in one address family.
//!
//! Two identical topologies side by side, client — node — pod, each in its own three
//! namespaces, the node programmed by kuport's real plan and `LinuxHost` (one with 1 mapping,
//! one with 1,000). A thread in the client namespace floods the mapping; the pod's interface
//! counter says how many datagrams the node delivered. The two topologies are measured
//! alternately (A B, B A, ...) so that drift in the machine's load falls on both alike.
//!
//! In IPv4 the client, node and pod speak IPv4 only and the cluster is single-stack. In IPv6
//! they speak IPv6 only (addresses without duplicate address detection, so none is tentative
//! when the flood starts); the cluster's pods are dual-stack, so the node holds each mapping in
//! both of kuport's tables, and the client floods the node's public IPv6 address: every new
//! flow crosses the `ip6 kuport` table.
//!
//! veth delivers in the sender's softirq, so the flooding thread's CPU time is its sends plus
//! the node's forwarding. The reported ratio is of datagrams per CPU second of that thread: on a
//! shared machine the thread's share of a core varies from sample to sample, its cost per
//! datagram much less (wall-clock rates are in the note). The flood and the pod's sink are
//! pinned to different cores. The generator's own cost is in both numbers, so the ratio
//! understates the node's slowdown: the note also gives the time added per datagram.
//!
//! The new-flow generator opens a socket per datagram from a fresh (address, port) pair, so
//! every datagram is a new conntrack entry and consults the nat chains; the node's UDP
//! conntrack timeout is cut to 1 s so the table stays small.

use std::fs::File;
use std::io::{ErrorKind, Read as _, Seek as _, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use kuport_core::ir::Family;
use kuport_testkit::netns::{Netns, join};
use kuport_testkit::process::Proc;

use super::cluster::{INTERNAL_IP, PUBLIC_IF, TARGET_PORT, pod6, public_addr, target_pod};
use super::nft::{PROGRAM, mappings_text};
use super::{Measurement, PREFIX, list, median};

/// The two node sizes compared.
const SIZES: [usize; 2] = [1, 1_000];
/// Lets a new-flow sample's conntrack entries (1 s timeout) expire before the next sample.
const SETTLE: Duration = Duration::from_millis(700);
const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
const CLIENT_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 2);
/// Source addresses of the new-flow generator: 198.51.100.10 and up (2001:db8:100::10 and up).
const SOURCES: u64 = 16;
const FIRST_SOURCE: u8 = 10;
const FIRST_SOURCE6: u16 = 0x10;
/// Source ports of the new-flow generator: 1024 and up.
const SOURCE_PORTS: u64 = 64_000;
const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 200, 1);
const PAYLOAD: [u8; 64] = [0x6b; 64];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A fresh socket and source (address, port) per datagram.
    NewFlows,
    /// One connected socket.
    Established,
}

impl Mode {
    /// Samples per node size. The established ratio should be 1 and is judged against 0.95:
    /// under load a sample varies by ±10 %, so it takes many short windows (A/A runs of 10 gave
    /// 0.85–1.04); the new-flow effect is large and each of its samples needs a settle.
    fn rounds(self) -> usize {
        match self {
            Mode::NewFlows => 10,
            Mode::Established => 30,
        }
    }

    /// The row's name, what one unit of the rate is, and the target of the ratio.
    fn row(self) -> (&'static str, &'static str, f64) {
        match self {
            Mode::NewFlows => (
                "new UDP flows per second through a node holding 1,000 mappings ÷ holding 1",
                "new flow",
                0.80,
            ),
            Mode::Established => (
                "established-flow packet rate through a node holding 1,000 mappings ÷ holding 1",
                "packet",
                0.95,
            ),
        }
    }

    /// Flooding before the counting window starts, and the window.
    fn timing(self) -> (Duration, Duration) {
        match self {
            Mode::NewFlows => (Duration::from_millis(200), Duration::from_millis(600)),
            Mode::Established => (Duration::from_millis(100), Duration::from_millis(300)),
        }
    }
}

/// One node size's client, node and pod namespaces, with the pod's sink running.
struct Topology {
    family: Family,
    mappings: usize,
    /// What the kernel holds (rules and elements), as the programming child printed it.
    rules: String,
    client: Netns,
    /// The pod's `/proc/net/dev`, opened inside its namespace (it keeps reading that one).
    pod_dev: File,
    received: Arc<AtomicU64>,
    stop_sink: Arc<AtomicBool>,
    sink: Option<JoinHandle<Result<()>>>,
    /// Where the new-flow generator continues, so no (address, port) pair repeats in a run.
    next_flow: u64,
    // Dropped last: the namespaces.
    _node: Netns,
    _pod: Netns,
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.stop_sink.store(true, Ordering::Relaxed);
        if let Some(sink) = self.sink.take() {
            let _ = sink.join();
        }
    }
}

struct Sample {
    delivered_per_s: f64,
    /// Datagrams delivered per second of the flood thread's CPU time (its sends and the
    /// forwarding the kernel runs in its context).
    delivered_per_cpu_s: f64,
    offered_per_s: f64,
    send_errors: u64,
    first_error: Option<String>,
}

/// Both rows of `family`: new flows, then established flows.
pub fn measure(family: Family) -> Result<Vec<Measurement>> {
    let mut topologies = SIZES
        .iter()
        .enumerate()
        .map(|(i, n)| Topology::build(family, i, *n))
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for mode in [Mode::NewFlows, Mode::Established] {
        let mut samples: Vec<Vec<Sample>> = SIZES.iter().map(|_| Vec::new()).collect();
        for round in 0..mode.rounds() {
            let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                samples[i].push(topologies[i].sample(mode)?);
                if mode == Mode::NewFlows {
                    std::thread::sleep(SETTLE);
                }
            }
        }
        out.push(row(family, mode, &topologies, &samples));
    }
    drop(topologies);
    Ok(out)
}

fn row(
    family: Family,
    mode: Mode,
    topologies: &[Topology],
    samples: &[Vec<Sample>],
) -> Measurement {
    let series = |f: fn(&Sample) -> f64| -> Vec<Vec<f64>> {
        samples.iter().map(|s| s.iter().map(f).collect()).collect()
    };
    let per_cpu = series(|s| s.delivered_per_cpu_s);
    let per_wall = series(|s| s.delivered_per_s);
    let offered = series(|s| s.offered_per_s);
    let cpu: Vec<f64> = per_cpu.iter().map(|r| median(r)).collect();
    let wall: Vec<f64> = per_wall.iter().map(|r| median(r)).collect();
    let ratio = cpu[1] / cpu[0];
    // Round r measured both nodes back to back: the pair saw the same load.
    let paired: Vec<f64> = per_cpu[1]
        .iter()
        .zip(&per_cpu[0])
        .map(|(many, one)| many / one)
        .collect();
    let (name, what, target) = mode.row();
    let mut note = format!(
        "ratio of the medians of datagrams delivered to the pod per CPU second of the flooding \
         thread (its sends plus the forwarding the kernel runs in its context; the ratio of \
         wall-clock rates is {:.3}, the median of the ratios within each round {:.3}); ",
        wall[1] / wall[0],
        median(&paired)
    );
    for (i, t) in topologies.iter().enumerate() {
        let errors: u64 = samples[i].iter().map(|s| s.send_errors).sum();
        let first_error = samples[i]
            .iter()
            .find_map(|s| s.first_error.as_deref())
            .map_or(String::new(), |e| format!(" ({e})"));
        note.push_str(&format!(
            "{} ({}): per CPU second {:.0} [{}], per second {:.0} [{}], \
             offered {:.0}/s, send errors {errors}{first_error}; ",
            mappings_text(t.mappings),
            t.rules,
            cpu[i],
            list(&per_cpu[i], 0),
            wall[i],
            list(&per_wall[i], 0),
            median(&offered[i]),
        ));
    }
    note.push_str(&format!(
        "time added per {what} at 1,000 mappings: {:.2} µs; the mapping used is the last rule of \
         the IR's kup-pre and kup-post (the worst case when every mapping was a kernel rule; a \
         map lookup costs the same for any element); samples alternate between the nodes",
        (1.0 / cpu[1] - 1.0 / cpu[0]) * 1e6
    ));
    if mode == Mode::NewFlows {
        note.push_str("; one socket per datagram, each from a fresh (address, port)");
    }
    if family == Family::V6 {
        note.push_str(&format!(
            "; IPv6: the client floods the node's public address {}, the pod's is {}; the \
             cluster's pods are dual-stack, so the node also holds every mapping in its ip \
             table, which IPv6 packets never cross",
            public_addr(family),
            target_pod(family)
        ));
    }
    Measurement {
        name: match family {
            Family::V4 => name.to_owned(),
            Family::V6 => format!("IPv6: {name}"),
        },
        value: ratio,
        unit: "ratio".to_owned(),
        samples: mode.rounds(),
        baseline: None,
        target: format!("≥ {target:.2}"),
        met: Some(ratio >= target),
        note,
    }
}

impl Topology {
    fn build(family: Family, index: usize, mappings: usize) -> Result<Self> {
        let tag = match family {
            Family::V4 => format!("f{index}"),
            Family::V6 => format!("f6-{index}"),
        };
        let client = Netns::create(PREFIX, &format!("{tag}-client"))?;
        let node = Netns::create(PREFIX, &format!("{tag}-node"))?;
        let pod = Netns::create(PREFIX, &format!("{tag}-pod"))?;
        wire(family, &client, &node, &pod)?;
        let rules = load_table(&node, family, mappings)?;

        let pod_dev = pod.run("pod counters", || {
            File::open("/proc/thread-self/net/dev").context("opening the pod's /proc/net/dev")
        })?;
        let received = Arc::new(AtomicU64::new(0));
        let stop_sink = Arc::new(AtomicBool::new(false));
        let sink = {
            let received = received.clone();
            let stop = stop_sink.clone();
            pod.thread("sink", move || sink(family, &received, &stop))?
        };
        let mut topology = Self {
            family,
            mappings,
            rules,
            client,
            pod_dev,
            received,
            stop_sink,
            sink: Some(sink),
            next_flow: 0,
            _node: node,
            _pod: pod,
        };
        topology.check_delivery()?;
        Ok(topology)
    }

    /// Fails unless datagrams to the mapping reach the pod's socket.
    fn check_delivery(&mut self) -> Result<()> {
        let before = self.received.load(Ordering::Relaxed);
        let (client, target) = (client_addr(self.family), target(self.family));
        let sent = self.client.run("probe", move || {
            let socket =
                UdpSocket::bind(SocketAddr::new(client, 0)).context("binding the probe socket")?;
            for _ in 0..20 {
                socket
                    .send_to(&PAYLOAD, target)
                    .context("sending a probe")?;
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(())
        });
        sent?;
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.received.load(Ordering::Relaxed) == before {
            if Instant::now() > deadline {
                bail!(
                    "no datagram sent to {target} reached the pod through the node holding {} \
                     mappings",
                    self.mappings
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Fails when the pod's sink has stopped: the interface would go on counting datagrams
    /// that the pod's kernel drops (and answers with port unreachable) at a cost of its own.
    fn check_sink(&mut self) -> Result<()> {
        if !self.sink.as_ref().is_some_and(JoinHandle::is_finished) {
            return Ok(());
        }
        let what = format!(
            "the pod's sink behind the node holding {} stopped",
            mappings_text(self.mappings)
        );
        match self.sink.take().map(|s| join(s, "sink")) {
            Some(Err(e)) => Err(e.context(what)),
            _ => bail!("{what}"),
        }
    }

    fn sample(&mut self, mode: Mode) -> Result<Sample> {
        let stop = Arc::new(AtomicBool::new(false));
        let tid = Arc::new(AtomicI32::new(0));
        let first_flow = self.next_flow;
        let family = self.family;
        let flood = {
            let (stop, tid) = (stop.clone(), tid.clone());
            self.client.thread("flood", move || {
                pin(Cpu::First)?;
                tid.store(
                    rustix::thread::gettid().as_raw_nonzero().get(),
                    Ordering::Relaxed,
                );
                flood(family, mode, first_flow, &stop)
            })?
        };
        let (warm_up, window) = mode.timing();
        let counted = (|| {
            std::thread::sleep(warm_up);
            let tid = tid.load(Ordering::Relaxed);
            let (c0, t0, cpu0) = (rx_packets(&mut self.pod_dev)?, Instant::now(), cpu_ns(tid)?);
            std::thread::sleep(window);
            let (c1, t1, cpu1) = (rx_packets(&mut self.pod_dev)?, Instant::now(), cpu_ns(tid)?);
            Ok::<_, anyhow::Error>((
                c1.saturating_sub(c0) as f64,
                (t1 - t0).as_secs_f64(),
                cpu1.saturating_sub(cpu0) as f64 / 1e9,
            ))
        })();
        stop.store(true, Ordering::Relaxed);
        let flooded = join(flood, "flood")?;
        let (delivered, seconds, cpu_seconds) = counted?;
        self.check_sink()?;
        self.next_flow = flooded.next_flow;
        Ok(Sample {
            delivered_per_s: delivered / seconds,
            delivered_per_cpu_s: delivered / cpu_seconds,
            offered_per_s: flooded.sent as f64 / flooded.seconds,
            send_errors: flooded.errors,
            first_error: flooded.first_error,
        })
    }
}

/// The client's port to the node's public interface and the node's to the pod, with their
/// addresses (of `family` only, and the node's IPv4 InternalIP on `lo`) and routes; the node
/// forwards and forgets UDP flows after a second.
fn wire(family: Family, client: &Netns, node: &Netns, pod: &Netns) -> Result<()> {
    if family == Family::V6 {
        for ns in [client, node, pod] {
            ns.exec(
                "sysctl",
                &[
                    "-qw",
                    "net.ipv6.conf.all.accept_dad=0",
                    "net.ipv6.conf.default.accept_dad=0",
                ],
            )?;
        }
    }
    let veth = |ns: &Netns, name: &str, peer: &str, peer_ns: &Netns| {
        ns.ip(&[
            "link",
            "add",
            name,
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            peer_ns.name(),
        ])
    };
    veth(client, "eth0", PUBLIC_IF, node)?;
    veth(node, "pod0", "eth0", pod)?;
    let link = prefix(family);
    add_address(client, client_addr(family), link, "eth0")?;
    for i in 0..SOURCES {
        add_address(client, source(family, i), link, "eth0")?;
    }
    client.ip(&["link", "set", "eth0", "up"])?;
    add_address(node, public_addr(family), link, PUBLIC_IF)?;
    add_address(node, pod_gateway(family), link, "pod0")?;
    node.ip(&["addr", "add", &format!("{INTERNAL_IP}/32"), "dev", "lo"])?;
    node.ip(&["link", "set", PUBLIC_IF, "up"])?;
    node.ip(&["link", "set", "pod0", "up"])?;
    add_address(pod, target_pod(family), link, "eth0")?;
    pod.ip(&["link", "set", "eth0", "up"])?;
    let gateway = pod_gateway(family).to_string();
    pod.ip(&[
        family_flag(family),
        "route",
        "add",
        "default",
        "via",
        &gateway,
    ])?;
    let forwarding = match family {
        Family::V4 => "net.ipv4.ip_forward=1",
        Family::V6 => "net.ipv6.conf.all.forwarding=1",
    };
    node.exec("sysctl", &["-qw", forwarding])?;
    node.exec(
        "sysctl",
        &["-qw", "net.netfilter.nf_conntrack_udp_timeout=1"],
    )?;
    Ok(())
}

/// `address/prefix` on `dev`; an IPv6 one usable at once (`nodad`).
fn add_address(ns: &Netns, address: IpAddr, prefix: u8, dev: &str) -> Result<()> {
    let cidr = format!("{address}/{prefix}");
    let mut args = vec![
        family_flag(Family::of(address)),
        "addr",
        "add",
        &cidr,
        "dev",
        dev,
    ];
    if address.is_ipv6() {
        args.push("nodad");
    }
    ns.ip(&args).map(drop)
}

fn family_flag(family: Family) -> &'static str {
    match family {
        Family::V4 => "-4",
        Family::V6 => "-6",
    }
}

/// The prefix length of the client's link and of the pod's.
fn prefix(family: Family) -> u8 {
    match family {
        Family::V4 => 24,
        Family::V6 => 64,
    }
}

/// The client's own address (the probe's and the established flood's source).
fn client_addr(family: Family) -> IpAddr {
    match family {
        Family::V4 => CLIENT_ADDR.into(),
        Family::V6 => CLIENT_ADDR6.into(),
    }
}

/// The node's address on the pod's link: the pod's default gateway.
fn pod_gateway(family: Family) -> IpAddr {
    match family {
        Family::V4 => POD_GATEWAY.into(),
        Family::V6 => pod6(POD_GATEWAY).into(),
    }
}

/// The mapping every datagram is sent to.
fn target(family: Family) -> SocketAddr {
    SocketAddr::new(public_addr(family), TARGET_PORT)
}

/// Loads the table for `mappings` mappings of the cluster of `family` in the node's namespace
/// (a child process of this program, which plans and applies it); returns the table size it
/// prints.
fn load_table(node: &Netns, family: Family, mappings: usize) -> Result<String> {
    let exe = std::env::current_exe().context("finding the current executable")?;
    let mut cmd = node.command(&exe);
    cmd.args([PROGRAM, &mappings.to_string(), family.name()])
        .stdout(Stdio::piped());
    let text = Proc::spawn(cmd, &format!("{PROGRAM} {mappings} {family}"))?
        .finish(Duration::from_secs(60))?;
    let rules = text.trim().to_owned();
    if rules.is_empty() {
        anyhow::bail!("{PROGRAM} {mappings} {family} printed no table size");
    }
    Ok(rules)
}

/// Source address `i` (of [`SOURCES`]) of the new-flow generator.
fn source(family: Family, i: u64) -> IpAddr {
    let i = i % SOURCES;
    match family {
        Family::V4 => Ipv4Addr::new(198, 51, 100, FIRST_SOURCE + i as u8).into(),
        Family::V6 => {
            Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, FIRST_SOURCE6 + i as u16).into()
        }
    }
}

/// The pod's listener: keeps the socket drained, so the pod never answers with ICMP. Without
/// it the pod's kernel drops what arrives (a cheaper path than delivery, which would flatter
/// that node) and answers with port unreachable, so a sample fails when it has stopped.
fn sink(family: Family, received: &AtomicU64, stop: &AtomicBool) -> Result<()> {
    pin(Cpu::Last)?;
    let any: IpAddr = match family {
        Family::V4 => Ipv4Addr::UNSPECIFIED.into(),
        Family::V6 => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket =
        UdpSocket::bind(SocketAddr::new(any, TARGET_PORT)).context("binding the pod's socket")?;
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .context("setting the pod socket's timeout")?;
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        match socket.recv(&mut buf) {
            Ok(_) => {
                received.fetch_add(1, Ordering::Relaxed);
            }
            // A receive with a timeout is not restarted after an interruption: it returned
            // EINTR in about one run in four on 2026-12-06 (what interrupted it was not found).
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e).context("receiving in the pod"),
        }
    }
    Ok(())
}

struct Flooded {
    sent: u64,
    errors: u64,
    first_error: Option<String>,
    seconds: f64,
    next_flow: u64,
}

fn flood(family: Family, mode: Mode, first_flow: u64, stop: &AtomicBool) -> Result<Flooded> {
    let target = target(family);
    let (mut sent, mut errors) = (0u64, 0u64);
    let mut first_error = None;
    let mut failed = |e: std::io::Error| {
        errors += 1;
        first_error.get_or_insert_with(|| e.to_string());
    };
    let start = Instant::now();
    let mut k = first_flow;
    match mode {
        Mode::NewFlows => {
            while !stop.load(Ordering::Relaxed) {
                let addr = source(family, k);
                let port = 1024 + ((k / SOURCES) % SOURCE_PORTS) as u16;
                k += 1;
                match UdpSocket::bind(SocketAddr::new(addr, port))
                    .and_then(|s| s.send_to(&PAYLOAD, target))
                {
                    Ok(_) => sent += 1,
                    Err(e) => failed(e),
                }
            }
        }
        Mode::Established => {
            let socket = UdpSocket::bind(SocketAddr::new(client_addr(family), 0))
                .context("binding the flood socket")?;
            socket
                .connect(target)
                .context("connecting the flood socket")?;
            while !stop.load(Ordering::Relaxed) {
                match socket.send(&PAYLOAD) {
                    Ok(_) => sent += 1,
                    Err(e) => failed(e),
                }
            }
        }
    }
    Ok(Flooded {
        sent,
        errors,
        first_error,
        seconds: start.elapsed().as_secs_f64(),
        next_flow: k,
    })
}

#[derive(Clone, Copy)]
enum Cpu {
    First,
    Last,
}

/// Pins the calling thread to the first or last CPU it may run on: the flood and the sink on
/// different cores, each sample alike.
fn pin(which: Cpu) -> Result<()> {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    let allowed = sched_getaffinity(None).context("reading the CPU affinity")?;
    let mut cpus = (0..CpuSet::MAX_CPU).filter(|c| allowed.is_set(*c));
    let cpu = match which {
        Cpu::First => cpus.next(),
        Cpu::Last => cpus.next_back(),
    }
    .context("no CPU allowed")?;
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set).with_context(|| format!("pinning a thread to CPU {cpu}"))
}

/// Nanoseconds thread `tid` of this process has run, softirq work done in its context included
/// (this kernel does not account irq time separately).
fn cpu_ns(tid: i32) -> Result<u64> {
    if tid == 0 {
        bail!("the flood thread did not start");
    }
    let path = format!("/proc/self/task/{tid}/schedstat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no run time in {path}: {text:?}"))
}

/// Packets received by the pod's `eth0`, from its `/proc/net/dev`.
fn rx_packets(dev: &mut File) -> Result<u64> {
    let mut text = String::new();
    dev.seek(SeekFrom::Start(0))
        .context("rewinding the pod's /proc/net/dev")?;
    dev.read_to_string(&mut text)
        .context("reading the pod's /proc/net/dev")?;
    parse_rx_packets(&text, "eth0")
}

fn parse_rx_packets(text: &str, device: &str) -> Result<u64> {
    text.lines()
        .filter_map(|l| l.trim_start().split_once(':'))
        .find(|(name, _)| *name == device)
        .and_then(|(_, fields)| fields.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("no rx packet count for {device} in /proc/net/dev"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rx_packets_of_one_device() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets\n    \
             lo:       0       0    0    0    0     0          0         0        0       0\n  \
             eth0: 1234567   89012    0    0    0     0          0         0      180       2\n";
        assert_eq!(parse_rx_packets(text, "eth0").unwrap(), 89_012);
        assert_eq!(parse_rx_packets(text, "lo").unwrap(), 0);
        assert!(parse_rx_packets(text, "pod0").is_err());
    }
}
