//! The measurements that need the whole lab: throughput and latency through a cross-node mapping
//! against the raw mesh between the same two nodes, and the time from an endpoint change to the
//! first answer from the new endpoint. Ratios and differences are measured side by side in one
//! run, alternating, because absolute numbers on these machines are noise.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::hostbench::Measurement;
use crate::routed::{self, Via};
use crate::runner::Runner;
use crate::scenario::{self, IpFamily, Step};
use crate::sys::{self, Lab};

const SCENARIO: &str = r#"
name: bench
cni: cilium-tunnel
nodes:
  - {name: edge-a, public: true}
  - {name: worker-b}
  - {name: worker-c}
  - {name: edge-d, public: true}
objects: |
  apiVersion: v1
  kind: Namespace
  metadata: {name: games}
  ---
  apiVersion: kuport.wlz.li/v1alpha1
  kind: PortMapClass
  metadata: {name: public}
  spec:
    nodes:
      edge-a: {interfaces: [enp1s0]}
    returnPath: {mode: Vxlan}
  ---
  apiVersion: kuport.wlz.li/v1alpha1
  kind: PortMapClass
  metadata: {name: failover}
  spec:
    nodes:
      edge-a: {interfaces: [enp1s0]}
      edge-d: {interfaces: [enp1s0]}
    returnPath: {mode: Vxlan, vxlan: {vni: 6242, port: 4791, subnet: 169.254.78.0/24}}
  ---
  apiVersion: kuport.wlz.li/v1alpha1
  kind: PortMap
  metadata: {name: failover, namespace: games}
  spec: {className: failover, protocol: UDP, port: 3300, serviceRef: {name: failover, port: udp}}
  ---
  apiVersion: kuport.wlz.li/v1alpha1
  kind: PortMap
  metadata: {name: game, namespace: games}
  spec: {className: public, protocol: UDP, port: 3000, serviceRef: {name: game, port: udp}}
  ---
  apiVersion: kuport.wlz.li/v1alpha1
  kind: PortMap
  metadata: {name: game-tcp, namespace: games}
  spec: {className: public, protocol: TCP, port: 3000, serviceRef: {name: game, port: tcp}}
  ---
  apiVersion: kuport.wlz.li/v1alpha1
  kind: PortMap
  metadata: {name: pair, namespace: games}
  spec: {className: public, protocol: UDP, port: 3100, serviceRef: {name: pair, port: udp}}
  ---
  apiVersion: kuport.wlz.li/v1alpha1
  kind: PortMap
  metadata: {name: mover, namespace: games}
  spec: {className: public, protocol: UDP, port: 3200, serviceRef: {name: mover, port: udp}}
pods:
  - {namespace: games, name: game-0, node: worker-b, service: game, ipFamilies: [IPv4, IPv6],
     ports: [{name: udp, protocol: UDP, port: 3000}, {name: tcp, protocol: TCP, port: 3000}]}
  - {namespace: games, name: pair-b, node: worker-b, service: pair, ports: [{name: udp, protocol: UDP, port: 3100}]}
  - {namespace: games, name: pair-c, node: worker-c, service: pair, ports: [{name: udp, protocol: UDP, port: 3100}]}
  - {namespace: games, name: mover-0, node: worker-b, service: mover, ipFamilies: [IPv4, IPv6], ports: [{name: udp, protocol: UDP, port: 3200}]}
  - {namespace: games, name: failover-0, node: worker-c, service: failover, ipFamilies: [IPv4, IPv6], ports: [{name: udp, protocol: UDP, port: 3300}]}
steps:
  - wait: {portmap: games/game, condition: Programmed, status: "True", timeoutSeconds: 60}
  - wait: {portmap: games/game-tcp, condition: Programmed, status: "True"}
  - wait: {portmap: games/pair, condition: Programmed, status: "True"}
  - wait: {portmap: games/mover, condition: Programmed, status: "True"}
  - wait: {portmap: games/failover, condition: Programmed, status: "True"}
"#;

const BULK_BYTES: usize = 20_000_000;
const THROUGHPUT_SAMPLES: usize = 5;
const RTT_SAMPLES: usize = 40;
const CHANGE_SAMPLES: usize = 20;

/// What one `kuport-echo ask` said: the outcome word and its `key=value` fields.
struct Ask {
    outcome: String,
    fields: Vec<(String, String)>,
}

impl Ask {
    fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

async fn ask(runner: &Runner<'_>, ns: &str, args: &[&str]) -> Result<Ask> {
    let echo = runner.topo.bin("kuport-echo");
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", ns, &echo, "ask"])
        .args(args)
        .output()
        .await
        .context("running kuport-echo ask")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    Ok(Ask {
        outcome: words.next().unwrap_or("").to_string(),
        fields: words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
}

/// Microseconds a reply took, or an error naming what came back instead.
async fn rtt(runner: &Runner<'_>, ns: &str, args: &[&str]) -> Result<f64> {
    let a = ask(runner, ns, args).await?;
    if a.outcome != "reply" {
        bail!("{ns} {}: {}", args.join(" "), a.outcome);
    }
    a.get("rtt_us")
        .and_then(|v| v.parse::<f64>().ok())
        .context("a reply without rtt_us")
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (v.len() as f64 - 1.0)).round() as usize;
    v[rank.min(v.len() - 1)]
}

/// Runs every lab measurement in one fresh lab, tearing it down afterwards.
/// Which lab measurements to take.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Part {
    All,
    /// Only the link health rows (probe cost, a broken link reported).
    Links,
    /// Only the TCP throughput rows, with the offload experiment.
    Tcp,
    /// Only the IPv6 rows (throughput, round trip, endpoint changes through IPv6 mappings).
    Ipv6,
}

pub async fn run(
    lab: &mut Lab,
    bins: &Path,
    original: &std::fs::File,
    part: Part,
) -> Result<Vec<Measurement>> {
    let scenario: scenario::Scenario =
        serde_saphyr::from_str(SCENARIO).context("the bench scenario")?;
    let result = async {
        let mut runner = Runner::start(lab, &scenario, bins).await?;
        for (i, step) in scenario.steps.iter().enumerate() {
            let r = runner.step(step, i + 1).await;
            if !r.ok {
                bail!("bench setup step {} failed: {}", r.name, r.detail);
            }
        }
        let out = measure(&mut runner, part).await;
        runner.stop_agents();
        out
    }
    .await;
    let _ = crate::runner::enter_netns_of(original);
    let left = lab.teardown();
    if !left.is_empty() {
        bail!("the bench lab left {}", left.join(", "));
    }
    result
}

async fn measure(runner: &mut Runner<'_>, part: Part) -> Result<Vec<Measurement>> {
    let mut out = Vec::new();
    if part == Part::Tcp {
        let (client, edge) = raw_mesh_responders(runner).await?;
        out.extend(throughput(runner, client, &edge).await?);
        out.push(with_gro(runner, client).await?);
        return Ok(out);
    }
    if part == Part::Ipv6 {
        return ipv6(runner).await;
    }
    if part == Part::All {
        out.extend(datapath(runner).await?);
        out.extend(ipv6(runner).await?);
    }
    out.push(probe_cost(runner).await?);
    out.push(link_broken(runner).await?);
    Ok(out)
}

/// The raw mesh's responders: on worker-b's own mesh address, asked from edge-a over wt0.
/// Returns the internet client's and edge-a's namespaces.
async fn raw_mesh_responders(runner: &mut Runner<'_>) -> Result<(&'static str, String)> {
    let worker = runner.topo.node("worker-b")?.ns.clone();
    let echo = runner.topo.bin("kuport-echo");
    runner
        .lab
        .spawn(&worker, "raw-udp", &echo, &["serve", "udp", "7000"])?;
    runner
        .lab
        .spawn(&worker, "raw-tcp", &echo, &["serve", "tcp", "7000"])?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let edge = runner.topo.node("edge-a")?.ns.clone();
    Ok((crate::topology::CLIENT_NS, edge))
}

/// Throughput, round trips and endpoint changes.
async fn datapath(runner: &mut Runner<'_>) -> Result<Vec<Measurement>> {
    let (client, edge) = raw_mesh_responders(runner).await?;
    let mut out = Vec::new();
    out.extend(throughput(runner, client, &edge).await?);
    out.push(with_gro(runner, client).await?);
    out.push(udp_rtt_in(runner, client, &edge, IpFamily::IPv4).await?);
    out.push(endpoint_unready(runner, client).await?);
    out.push(pod_moved_in(runner, client, IpFamily::IPv4).await?);
    out.push(long_lived_flow_moved_in(runner, client, IpFamily::IPv4).await?);
    out.push(node_not_ready_in(runner, client, IpFamily::IPv4).await?);
    Ok(out)
}

/// The IPv6 rows: the same mappings dialed on edge-a's public IPv6 address (their pods are
/// dual-stack), against the same baselines, which stay IPv4 (the mesh has no IPv6).
async fn ipv6(runner: &mut Runner<'_>) -> Result<Vec<Measurement>> {
    let (client, edge) = raw_mesh_responders(runner).await?;
    let mut out = ipv6_throughput(runner, client).await?;
    out.push(udp_rtt_in(runner, client, &edge, IpFamily::IPv6).await?);
    out.push(pod_moved_in(runner, client, IpFamily::IPv6).await?);
    out.push(long_lived_flow_moved_in(runner, client, IpFamily::IPv6).await?);
    out.push(node_not_ready_in(runner, client, IpFamily::IPv6).await?);
    Ok(out)
}

/// `node`'s public address in `family` with `port`, as a client dials it.
fn public(runner: &Runner<'_>, node: &str, family: IpFamily, port: u16) -> Result<String> {
    let addr = runner.topo.address_in(node, "enp1s0", family)?;
    Ok(std::net::SocketAddr::new(addr, port).to_string())
}

/// A row's name, marked for IPv6.
fn named(name: &str, family: IpFamily) -> String {
    match family {
        IpFamily::IPv4 => name.to_owned(),
        IpFamily::IPv6 => format!("IPv6: {name}"),
    }
}

/// Bulk transfers in turn through the IPv6 mapping, over the same hops routed without kuport
/// (IPv4), and through the IPv4 mapping.
async fn ipv6_throughput(runner: &mut Runner<'_>, client: &str) -> Result<Vec<Measurement>> {
    let path = routed::RoutedPath::build(runner, "edge-a", "games/game-0", Via::Mesh)?;
    let samples = ipv6_bulk_samples(runner, client, &path).await;
    let mut path = path;
    let left = path.remove(runner);
    let (v6, routed, v4) = samples?;
    if !left.is_empty() {
        bail!("removing the routed baseline left {}", left.join(", "));
    }
    let (k6, b, k4) = (
        percentile(&v6, 50.0),
        percentile(&routed, 50.0),
        percentile(&v4, 50.0),
    );
    Ok(vec![
        Measurement {
            name: "IPv6: TCP bulk throughput, internet client → cross-node IPv6 mapping → pod ÷ the same hops routed without kuport".into(),
            value: k6 / b,
            unit: "ratio".into(),
            samples: THROUGHPUT_SAMPLES,
            baseline: Some(b),
            target: "≥ 0.95".into(),
            met: Some(k6 / b >= 0.95),
            note: format!(
                "median {k6:.0} vs {b:.0} Mbit/s, alternating; the baseline is the IPv4 routed path of the IPv4 row ({}): the mesh carries no IPv6, so no IPv6 path over the same hops exists without kuport's link",
                path.target
            ),
        },
        Measurement {
            name: "IPv6: TCP bulk throughput, IPv6 mapping ÷ IPv4 mapping (same hops, same pod)".into(),
            value: k6 / k4,
            unit: "ratio".into(),
            samples: THROUGHPUT_SAMPLES,
            baseline: Some(k4),
            target: String::new(),
            met: None,
            note: format!("median {k6:.0} vs {k4:.0} Mbit/s, alternating: what IPv6 costs over IPv4 through the same link (inner IPv6 headers are 20 bytes longer)"),
        },
    ])
}

async fn ipv6_bulk_samples(
    runner: &Runner<'_>,
    client: &str,
    path: &routed::RoutedPath,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let bytes = BULK_BYTES as u64;
    let (v6_target, v4_target) = (
        public(runner, "edge-a", IpFamily::IPv6, 3000)?,
        public(runner, "edge-a", IpFamily::IPv4, 3000)?,
    );
    let (mut v6, mut routed, mut v4) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..THROUGHPUT_SAMPLES {
        v6.push(bulk(runner, client, &v6_target).await?);
        let before = path.counters()?;
        routed.push(bulk(runner, client, &path.target).await?);
        path.counters()?.check_since(&before, bytes, false)?;
        v4.push(bulk(runner, client, &v4_target).await?);
    }
    Ok((v6, routed, v4))
}

/// The probes' own traffic on one idle link: the bytes and packets worker-c's link to edge-a
/// sends in 20 s while no mapping traffic uses it (the inner frames, Ethernet header included,
/// as the link device counts them).
async fn probe_cost(runner: &Runner<'_>) -> Result<Measurement> {
    const SPAN: Duration = Duration::from_secs(20);
    let worker = runner.topo.node("worker-c")?.ns.clone();
    let read = || -> Result<(u64, u64)> {
        let out = crate::sys::sh(
            &worker,
            "for d in /sys/class/net/kup-*; do echo $(cat $d/statistics/tx_bytes) $(cat $d/statistics/tx_packets); done",
        )?;
        // The first link: every link of worker-c carries only probes meanwhile.
        let line = out.lines().next().context("worker-c has no kup- link")?;
        let mut words = line.split_whitespace().map(str::parse::<u64>);
        match (words.next(), words.next()) {
            (Some(Ok(bytes)), Some(Ok(packets))) => Ok((bytes, packets)),
            _ => bail!("unreadable link counters: {line:?}"),
        }
    };
    let (b0, p0) = read()?;
    tokio::time::sleep(SPAN).await;
    let (b1, p1) = read()?;
    let secs = SPAN.as_secs_f64();
    let bytes = (b1 - b0) as f64 / secs;
    Ok(Measurement {
        name: "probe traffic of one idle return link, each direction".into(),
        value: bytes,
        unit: "B/s".into(),
        samples: 1,
        baseline: None,
        target: "small against any mapping's traffic (design: ≈ 70 B/s of payload)".into(),
        met: None,
        note: format!(
            "{:.2} packets/s, inner frames as the link device counts them over {} s",
            (p1 - p0) as f64 / secs,
            SPAN.as_secs()
        ),
    })
}

/// The mesh drops the link port between edge-a and worker-b; the time until the mapping over
/// that link reads `Programmed=False ReturnLinkDown`, then the drop is lifted and it recovers.
async fn link_broken(runner: &mut Runner<'_>) -> Result<Measurement> {
    const SAMPLES: usize = 10;
    let mut samples = Vec::new();
    for _ in 0..SAMPLES {
        // Each sample starts from a link both ends have found up again.
        status_reads(runner, "AllNodesReady").await?;
        let t0 = Instant::now();
        host_exec(
            runner,
            "worker-b",
            "nft add table ip kl-benchfault && nft add chain ip kl-benchfault in '{ type filter hook prerouting priority -400; }' && nft add rule ip kl-benchfault in iifname wt0 ip saddr ${mesh:edge-a} udp dport 4790 drop",
        )
        .await?;
        let down = status_reads(runner, "ReturnLinkDown").await;
        samples.push(t0.elapsed().as_secs_f64() * 1000.0);
        host_exec(runner, "worker-b", "nft delete table ip kl-benchfault").await?;
        down?;
    }
    let (p50, p99) = (percentile(&samples, 50.0), percentile(&samples, 99.0));
    Ok(Measurement {
        name: "link broken (mesh drops the link port) → mapping reported not Programmed".into(),
        value: p50,
        unit: "ms p50".into(),
        samples: samples.len(),
        baseline: None,
        target: "within 3 probe intervals and a status write: ≤ 10 s".into(),
        met: Some(p99 <= 10_000.0),
        note: format!(
            "p99 {p99:.0} ms{}; from the drop rule to the PortMap's ReturnLinkDown as read from the API server (polled every 200 ms), probes every 2 s",
            slowest(&samples)
        ),
    })
}

async fn host_exec(runner: &mut Runner<'_>, node: &str, command: &str) -> Result<()> {
    let step = Step::HostExec(scenario::HostExec {
        name: None,
        node: node.into(),
        command: command.into(),
    });
    let r = runner.step(&step, 0).await;
    if !r.ok {
        bail!("hostExec on {node}: {}", r.detail);
    }
    Ok(())
}

/// Waits until the `game` mapping's `Programmed` reason is `reason`.
async fn status_reads(runner: &mut Runner<'_>, reason: &str) -> Result<()> {
    let step = Step::ExpectStatus(scenario::ExpectStatus {
        name: None,
        portmap: "games/game".into(),
        accepted: None,
        programmed: Some(reason.into()),
        endpoint_node: None,
        published: None,
        timeout_seconds: 30,
        hold_seconds: 0,
    });
    let r = runner.step(&step, 0).await;
    if !r.ok {
        bail!("the game mapping never read {reason}: {}", r.detail);
    }
    Ok(())
}

/// TCP throughput through the mapping, through the same hops routed without kuport and over
/// the raw mesh, one transfer of each in turn per sample so that load changes hit all three.
/// The routed path exists only for this measurement and is removed again whatever happens.
async fn throughput(runner: &mut Runner<'_>, client: &str, edge: &str) -> Result<Vec<Measurement>> {
    let mut path = routed::RoutedPath::build(runner, "edge-a", "games/game-0", Via::Mesh)?;
    let mut out = throughput_samples(runner, client, edge, &path).await;
    if let Ok(rows) = out.as_mut() {
        match routed_with_gro(runner, client, &path).await {
            Ok(row) => rows.push(row),
            Err(e) => out = Err(e),
        }
    }
    let left = path.remove(runner);
    let mut out = out?;
    if !left.is_empty() {
        bail!("removing the routed baseline left {}", left.join(", "));
    }
    let mut path = routed::RoutedPath::build(runner, "edge-a", "games/game-0", Via::Vxlan)?;
    let encapsulated = over_plain_vxlan(runner, client, &path).await;
    let left = path.remove(runner);
    out.push(encapsulated?);
    if !left.is_empty() {
        bail!("removing the VXLAN baseline left {}", left.join(", "));
    }
    Ok(out)
}

/// The mapping against the same hops routed over a plain VXLAN link inside the mesh, with no
/// kuport rule on the way, alternating: what kuport's rules and NAT cost beyond the
/// encapsulation its return link needs.
async fn over_plain_vxlan(
    runner: &Runner<'_>,
    client: &str,
    path: &routed::RoutedPath,
) -> Result<Measurement> {
    let (through, plain) = mapping_then_path(runner, client, path).await?;
    let (k, v) = (percentile(&through, 50.0), percentile(&plain, 50.0));
    Ok(Measurement {
        name: "TCP bulk throughput, mapping ÷ the same hops routed over a plain VXLAN link in the mesh (no kuport rule)".into(),
        value: k / v,
        unit: "ratio".into(),
        samples: THROUGHPUT_SAMPLES,
        baseline: Some(v),
        target: String::new(),
        met: None,
        note: format!(
            "median {k:.0} vs {v:.0} Mbit/s; the baseline dials {} over a VXLAN link between the edge and the pod's node inside wt0 (the encapsulation the return link uses, kernel defaults) with plain routes: what is left between the two is kuport's rules and NAT",
            path.target
        ),
    })
}

/// The devices a mapped packet is forwarded through on the edge and the pod's node: their
/// veths (toward the client's router, the pod and the mesh's underlay) and kuport's link
/// devices, by namespace; `wt0`, the userspace mesh's TUN, is left as it is.
fn forwarding_devices(runner: &Runner<'_>) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for node in ["edge-a", "worker-b"] {
        let ns = runner.topo.node(node)?.ns.clone();
        let listed = sys::exec(&ns, "ip", &["-o", "-d", "link", "show"])?;
        out.extend(
            forwarding_device_names(&listed)
                .into_iter()
                .map(|dev| (ns.clone(), dev)),
        );
    }
    Ok(out)
}

/// The veths and kuport link devices in an `ip -o -d link show` listing.
fn forwarding_device_names(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| {
            let name = line.split(": ").nth(1)?;
            let name = name.split('@').next().unwrap_or(name);
            (line.contains(" veth ") || name.starts_with("kup-")).then(|| name.to_owned())
        })
        .collect()
}

/// Generic receive offload on or off on every device given.
fn set_gro(devices: &[(String, String)], on: bool) -> Result<()> {
    let state = if on { "on" } else { "off" };
    for (ns, dev) in devices {
        sys::exec(ns, "ethtool", &["-K", dev, "gro", state])
            .with_context(|| format!("ethtool -K {dev} gro {state} in {ns}"))?;
    }
    Ok(())
}

/// Whether generic receive offload is on for `dev` in `ns`.
fn gro_is_on(ns: &str, dev: &str) -> Result<bool> {
    let features = sys::exec(ns, "ethtool", &["-k", dev])?;
    Ok(features
        .lines()
        .any(|l| l.trim_start().starts_with("generic-receive-offload: on")))
}

/// The devices of [`forwarding_devices`] that have GRO off, turned on while `run` runs and off
/// again whatever it came to.
async fn gro_on_while<T>(
    runner: &Runner<'_>,
    run: impl std::future::Future<Output = Result<T>>,
) -> Result<(T, Vec<(String, String)>, usize)> {
    let (off, already_on) = gro_off_devices(runner)?;
    let result = match set_gro(&off, true) {
        Ok(()) => run.await,
        Err(e) => Err(e),
    };
    let restored = set_gro(&off, false);
    let value = result?;
    restored?;
    Ok((value, off, already_on))
}

/// The forwarding devices ([`forwarding_devices`]) with GRO off, and how many have it on.
fn gro_off_devices(runner: &Runner<'_>) -> Result<(Vec<(String, String)>, usize)> {
    let devices = forwarding_devices(runner)?;
    let mut off = Vec::new();
    for (ns, dev) in &devices {
        if !gro_is_on(ns, dev)? {
            off.push((ns.clone(), dev.clone()));
        }
    }
    let already_on = devices.len() - off.len();
    Ok((off, already_on))
}

/// The mapping against the same hops routed (at the link's MTU: [`throughput_samples`] left
/// the path locked to it), both with GRO on every forwarding device, alternating: whether the
/// gap to the routed path closes when the emulated NICs and the pods' veths merge segments as
/// a real node's NIC does.
async fn routed_with_gro(
    runner: &Runner<'_>,
    client: &str,
    path: &routed::RoutedPath,
) -> Result<Measurement> {
    let samples = mapping_then_path(runner, client, path);
    let ((through, routed), on, already_on) = gro_on_while(runner, samples).await?;
    let (k, r) = (percentile(&through, 50.0), percentile(&routed, 50.0));
    let names: Vec<&str> = on.iter().map(|(_, dev)| dev.as_str()).collect();
    Ok(Measurement {
        name: "TCP bulk throughput, mapping ÷ the same hops routed at the return link's MTU, both with GRO on every forwarding veth and link".into(),
        value: k / r,
        unit: "ratio".into(),
        samples: THROUGHPUT_SAMPLES,
        baseline: Some(r),
        target: String::new(),
        met: None,
        note: format!(
            "median {k:.0} vs {r:.0} Mbit/s, alternating; GRO turned on for {} ({already_on} more devices on the path had it on already), then off again",
            names.join(", ")
        ),
    })
}

/// The mapping with GRO turned on for every veth and link device it is forwarded through,
/// alternating with the kernel's defaults (GRO off on the veths, on on the VXLAN links): the
/// forwarded segments would cross the DNATs, the routing and the encapsulation as fewer, larger
/// packets (segmented again only before the mesh's TUN, which takes no offload).
async fn with_gro(runner: &Runner<'_>, client: &str) -> Result<Measurement> {
    let (off, already_on) = gro_off_devices(runner)?;
    let (mut default, mut gro) = (Vec::new(), Vec::new());
    let result = async {
        for _ in 0..THROUGHPUT_SAMPLES {
            default.push(bulk(runner, client, "203.0.113.1:3000").await?);
            set_gro(&off, true)?;
            let sample = bulk(runner, client, "203.0.113.1:3000").await;
            set_gro(&off, false)?;
            gro.push(sample?);
        }
        anyhow::Ok(())
    }
    .await;
    // Back to the defaults whatever happened (the calls above may have stopped in between).
    let restored = set_gro(&off, false);
    result?;
    restored?;
    let (d, g) = (percentile(&default, 50.0), percentile(&gro, 50.0));
    let names: Vec<&str> = off.iter().map(|(_, dev)| dev.as_str()).collect();
    Ok(Measurement {
        name: "TCP bulk throughput, mapping with GRO on every forwarding veth and link ÷ the same mapping with the kernel's defaults".into(),
        value: g / d,
        unit: "ratio".into(),
        samples: THROUGHPUT_SAMPLES,
        baseline: Some(d),
        target: String::new(),
        met: None,
        note: format!(
            "median {g:.0} vs {d:.0} Mbit/s, alternating; GRO turned on for {} (off by default; the other {already_on} devices on the path had it on already), then off again",
            names.join(", ")
        ),
    })
}

/// `THROUGHPUT_SAMPLES` bulk transfers through the mapping and over `path`, in turn (Mbit/s
/// each); every transfer over the path is checked by its counters to have crossed it and no
/// kuport link.
async fn mapping_then_path(
    runner: &Runner<'_>,
    client: &str,
    path: &routed::RoutedPath,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let bytes = BULK_BYTES as u64;
    let (mut through, mut other) = (Vec::new(), Vec::new());
    for _ in 0..THROUGHPUT_SAMPLES {
        through.push(bulk(runner, client, "203.0.113.1:3000").await?);
        let before = path.counters()?;
        other.push(bulk(runner, client, &path.target).await?);
        path.counters()?.check_since(&before, bytes, false)?;
    }
    Ok((through, other))
}

/// One bulk transfer each way from `ns` to `target`, in Mbit/s.
async fn bulk(runner: &Runner<'_>, ns: &str, target: &str) -> Result<f64> {
    let bulk = BULK_BYTES.to_string();
    let t = rtt(
        runner,
        ns,
        &["tcp", target, "--bulk", &bulk, "--timeout-ms", "60000"],
    )
    .await?;
    Ok(2.0 * BULK_BYTES as f64 * 8.0 / t)
}

/// Bulk transfers in turn, `THROUGHPUT_SAMPLES` of each: through the mapping, over the routed
/// path, and over the raw mesh; each in Mbit/s.
async fn alternating_bulk(
    runner: &Runner<'_>,
    client: &str,
    edge: &str,
    path: &routed::RoutedPath,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let bytes = BULK_BYTES as u64;
    let (mut through, mut routed, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..THROUGHPUT_SAMPLES {
        // Counters around each transfer prove where it went: the mapping over kuport's link,
        // the routed path over wt0 with no kuport rule or link touched.
        let before = path.counters()?;
        through.push(bulk(runner, client, "203.0.113.1:3000").await?);
        let mid = path.counters()?;
        mid.check_since(&before, bytes, true)?;
        routed.push(bulk(runner, client, &path.target).await?);
        path.counters()?.check_since(&mid, bytes, false)?;
        raw.push(bulk(runner, edge, "100.64.0.2:7000").await?);
    }
    Ok((through, routed, raw))
}

async fn throughput_samples(
    runner: &Runner<'_>,
    client: &str,
    edge: &str,
    path: &routed::RoutedPath,
) -> Result<Vec<Measurement>> {
    let (through, routed, raw) = alternating_bulk(runner, client, edge, path).await?;
    // Then the same hops at the link's MTU, alternating with the mapping again: what is left
    // between the two is not the link's smaller packets. Last, because the ends remember the
    // lower path MTU.
    let link_mtu = routed::edge_link_mtu(path)?;
    path.lock_mtu(link_mtu)?;
    let (through_again, routed_small) = mapping_then_path(runner, client, path).await?;
    let (k, b, r) = (
        percentile(&through, 50.0),
        percentile(&routed, 50.0),
        percentile(&raw, 50.0),
    );
    let (k2, s) = (
        percentile(&through_again, 50.0),
        percentile(&routed_small, 50.0),
    );
    let mb = BULK_BYTES / 1_000_000;
    let (to_routed, to_raw) = (k / b, k / r);
    Ok(vec![
        Measurement {
            name: "TCP bulk throughput, internet client → cross-node mapping → pod ÷ the same hops routed without kuport".into(),
            value: to_routed,
            unit: "ratio".into(),
            samples: THROUGHPUT_SAMPLES,
            baseline: Some(b),
            target: "≥ 0.95".into(),
            met: Some(to_routed >= 0.95),
            note: format!(
                "median {k:.0} vs {b:.0} Mbit/s ({mb} MB each way per sample, alternating); the baseline dials {} over plain routes client → router → edge → wt0 → worker → pod, checked with ip route get and by its bytes on the worker's wt0 with none on kuport's links or rules",
                path.target
            ),
        },
        Measurement {
            name: "TCP bulk throughput, mapping ÷ the same hops routed at the return link's MTU".into(),
            value: k2 / s,
            unit: "ratio".into(),
            samples: THROUGHPUT_SAMPLES,
            baseline: Some(s),
            target: String::new(),
            met: None,
            note: format!(
                "median {k2:.0} vs {s:.0} Mbit/s; the routed path's mesh routes locked to MTU {link_mtu} (the return link's), so both carry packets of the same size: the part of the row above this does not explain is the link's smaller packets"
            ),
        },
        Measurement {
            name: "TCP bulk throughput, internet client → cross-node mapping → pod ÷ raw mesh".into(),
            value: to_raw,
            unit: "ratio".into(),
            samples: THROUGHPUT_SAMPLES,
            baseline: Some(r),
            target: "≥ 0.90".into(),
            met: Some(to_raw >= 0.90),
            note: format!(
                "median {k:.0} vs {r:.0} Mbit/s ({mb} MB each way per sample, alternating; the raw mesh is the edge's own socket to the worker's over wt0)"
            ),
        },
    ])
}

async fn udp_rtt_in(
    runner: &Runner<'_>,
    client: &str,
    edge: &str,
    family: IpFamily,
) -> Result<Measurement> {
    let target = public(runner, "edge-a", family, 3000)?;
    let (mut through, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..RTT_SAMPLES {
        through.push(rtt(runner, client, &["udp", &target]).await?);
        raw.push(rtt(runner, edge, &["udp", "100.64.0.2:7000"]).await?);
    }
    let (k, r) = (percentile(&through, 50.0), percentile(&raw, 50.0));
    let added = k - r;
    Ok(Measurement {
        name: named(
            "UDP request/response p50 RTT through a cross-node mapping − raw mesh",
            family,
        ),
        value: added,
        unit: "µs".into(),
        samples: RTT_SAMPLES,
        baseline: Some(r),
        target: "≤ 200 µs added".into(),
        met: Some(added <= 200.0),
        note: format!(
            "p50 {k:.0} µs through the mapping (client → router → edge → link → pod), {r:.0} µs edge → worker over wt0; p99 {:.0} vs {:.0} µs",
            percentile(&through, 99.0),
            percentile(&raw, 99.0)
        ),
    })
}

/// How a change sample asks: new flows (each ask from a fresh client port, 50 ms for an
/// answer, then 10 ms) or the long-lived flow (every ask from [`LONG_FLOW_PORT`], one datagram
/// every 20 ms).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asking {
    NewFlows,
    LongLivedFlow,
}

/// Asks `target` as `asking` says until the mapping answers from `want`; returns the
/// milliseconds since `since`.
async fn first_answer_from(
    runner: &Runner<'_>,
    client: &str,
    target: &str,
    want: &str,
    since: Instant,
    asking: Asking,
) -> Result<f64> {
    let deadline = since + Duration::from_secs(10);
    let args: &[&str] = match asking {
        Asking::NewFlows => &["udp", target, "--timeout-ms", "50"],
        Asking::LongLivedFlow => &[
            "udp",
            target,
            "--source-port",
            LONG_FLOW_PORT,
            "--timeout-ms",
            "20",
        ],
    };
    loop {
        let sent = Instant::now();
        let a = ask(runner, client, args).await?;
        if a.outcome == "reply" && a.get("tag") == Some(want) {
            return Ok(since.elapsed().as_secs_f64() * 1000.0);
        }
        if Instant::now() >= deadline {
            bail!("no answer from {want} on {target} within 10 s ({args:?})");
        }
        let pause = match asking {
            Asking::NewFlows => Duration::from_millis(10),
            Asking::LongLivedFlow => Duration::from_millis(20).saturating_sub(sent.elapsed()),
        };
        tokio::time::sleep(pause).await;
    }
}

/// Which sample was the slowest, for telling one late change from a slow path: ", slowest
/// 1150 ms (sample 7 of 20)".
fn slowest(samples: &[f64]) -> String {
    samples
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, ms)| {
            format!(
                ", slowest {ms:.0} ms (sample {} of {})",
                i + 1,
                samples.len()
            )
        })
        .unwrap_or_default()
}

fn change_measurement(name: &str, samples: &[f64], how: &str) -> Measurement {
    let (p50, p99) = (percentile(samples, 50.0), percentile(samples, 99.0));
    Measurement {
        name: name.into(),
        value: p50,
        unit: "ms p50".into(),
        samples: samples.len(),
        baseline: None,
        target: "p50 ≤ 300 ms, p99 ≤ 1 s".into(),
        met: Some(p50 <= 300.0 && p99 <= 1000.0),
        note: format!("p99 {p99:.0} ms{}; {how}", slowest(samples)),
    }
}

/// Two ready pods behind one mapping; the serving one turns unready.
async fn endpoint_unready(runner: &mut Runner<'_>, client: &str) -> Result<Measurement> {
    let mut samples = Vec::new();
    let pods = ["games/pair-b", "games/pair-c"];
    for _ in 0..CHANGE_SAMPLES {
        let now = Instant::now();
        let a = loop {
            let a = ask(
                runner,
                client,
                &["udp", "203.0.113.1:3100", "--timeout-ms", "200"],
            )
            .await?;
            if a.outcome == "reply" {
                break a;
            }
            if now.elapsed() > Duration::from_secs(10) {
                bail!("the pair mapping does not answer");
            }
        };
        let serving = a.get("tag").context("an answer without tag")?.to_string();
        let other = pods
            .iter()
            .find(|p| **p != serving)
            .context("an answer from neither pod")?;
        set_ready(runner, &serving, false).await?;
        let t0 = Instant::now();
        samples.push(
            first_answer_from(
                runner,
                client,
                "203.0.113.1:3100",
                other,
                t0,
                Asking::NewFlows,
            )
            .await?,
        );
        set_ready(runner, &serving, true).await?;
        tokio::time::sleep(SETTLE).await;
    }
    Ok(change_measurement(
        "endpoint change (serving pod unready) → first answer from the new endpoint",
        &samples,
        "from the EndpointSlice write to the first UDP answer from the other pod, probing every 10 ms",
    ))
}

async fn set_ready(runner: &mut Runner<'_>, pod: &str, ready: bool) -> Result<()> {
    let step = Step::SetReady(scenario::SetReady {
        pod: pod.to_string(),
        ready,
    });
    let r = runner.step(&step, 0).await;
    if !r.ok {
        bail!("setReady {pod}: {}", r.detail);
    }
    Ok(())
}

/// Moves `games/mover-0` for sample `i` (to worker-c on even samples, worker-b on odd ones);
/// returns when the move's EndpointSlice write was done.
async fn move_mover(runner: &mut Runner<'_>, i: usize) -> Result<Instant> {
    let to = if i.is_multiple_of(2) {
        "worker-c"
    } else {
        "worker-b"
    };
    let step = Step::MovePod(scenario::MovePod {
        pod: "games/mover-0".into(),
        to: to.into(),
    });
    let r = runner.step(&step, 0).await;
    let t0 = Instant::now();
    if !r.ok {
        bail!("movePod: {}", r.detail);
    }
    Ok(t0)
}

/// One pod moving between two workers.
async fn pod_moved_in(
    runner: &mut Runner<'_>,
    client: &str,
    family: IpFamily,
) -> Result<Measurement> {
    let target = public(runner, "edge-a", family, 3200)?;
    let mut samples = Vec::new();
    for i in 0..CHANGE_SAMPLES {
        tokio::time::sleep(SETTLE).await;
        // The move's last act is the EndpointSlice write; the old pod is already gone, so any
        // answer comes from the new one.
        let t0 = move_mover(runner, i).await?;
        samples.push(
            first_answer_from(
                runner,
                client,
                &target,
                "games/mover-0",
                t0,
                Asking::NewFlows,
            )
            .await?,
        );
    }
    Ok(change_measurement(
        &named(
            "endpoint change (pod moved to another node) → first answer from the new endpoint",
            family,
        ),
        &samples,
        "from the EndpointSlice write to the first UDP answer from the pod on its new node, probing every 10 ms",
    ))
}

/// The client port of the long-lived flow: one address and port throughout, as a game
/// client's socket is, so conntrack sees one flow.
const LONG_FLOW_PORT: &str = "40200";

/// A long-lived UDP flow whose pod moves to another node: the flow is answered where the pod
/// is, the pod moves, and the same flow (same client port, a datagram every 20 ms) must reach
/// it on its new node. Without the agents clearing the flow's conntrack entries it would keep
/// its old translation until it idles out (`decisions.md`, "Stale conntrack entries").
async fn long_lived_flow_moved_in(
    runner: &mut Runner<'_>,
    client: &str,
    family: IpFamily,
) -> Result<Measurement> {
    let target = &public(runner, "edge-a", family, 3200)?;
    let mut samples = Vec::new();
    for i in 0..CHANGE_SAMPLES {
        tokio::time::sleep(SETTLE).await;
        // The flow is up before the move: its conntrack entries point at the pod's old place.
        first_answer_from(
            runner,
            client,
            target,
            "games/mover-0",
            Instant::now(),
            Asking::LongLivedFlow,
        )
        .await?;
        let t0 = move_mover(runner, i).await?;
        samples.push(
            first_answer_from(
                runner,
                client,
                target,
                "games/mover-0",
                t0,
                Asking::LongLivedFlow,
            )
            .await?,
        );
    }
    let (p50, p99) = (percentile(&samples, 50.0), percentile(&samples, 99.0));
    Ok(Measurement {
        name: named(
            "long-lived UDP flow (one client port, a datagram every 20 ms), its pod moved to another node → first answer there",
            family,
        ),
        value: p99,
        unit: "ms p99".into(),
        samples: samples.len(),
        baseline: None,
        target: "p99 ≤ 1 s".into(),
        met: Some(p99 <= 1000.0),
        note: format!(
            "p50 {p50:.0} ms{}; from the EndpointSlice write to the first answer to the same flow from the pod on its new node",
            slowest(&samples)
        ),
    })
}

/// How long a change sample waits for the last change to settle on every node.
const SETTLE: Duration = Duration::from_millis(500);

/// Single serving with two accepting edges; the serving edge's Node is marked not ready and the
/// mapping must answer on the other edge's address. Edge-a serves while it is ready (the first
/// accepting node), so the samples alternate: edge-a not ready, then ready again.
async fn node_not_ready_in(
    runner: &mut Runner<'_>,
    client: &str,
    family: IpFamily,
) -> Result<Measurement> {
    let (edge_a, edge_d) = (
        public(runner, "edge-a", family, 3300)?,
        public(runner, "edge-d", family, 3300)?,
    );
    let mut samples = Vec::new();
    for i in 0..CHANGE_SAMPLES {
        // Let the last change settle on every node first: the next sample then measures one
        // whole change, not the end of the last one (answering at once because the old
        // serving edge had not yet let go).
        tokio::time::sleep(SETTLE).await;
        let ready = i % 2 == 1;
        let step = Step::SetNodeReady(scenario::SetNodeReady {
            node: "edge-a".into(),
            ready,
        });
        let r = runner.step(&step, 0).await;
        let t0 = Instant::now();
        if !r.ok {
            bail!("setNodeReady: {}", r.detail);
        }
        let target = if ready { &edge_a } else { &edge_d };
        samples.push(
            first_answer_from(
                runner,
                client,
                target,
                "games/failover-0",
                t0,
                Asking::NewFlows,
            )
            .await?,
        );
    }
    Ok(change_measurement(
        &named(
            "endpoint change (serving node marked not ready) → first answer on the other edge",
            family,
        ),
        &samples,
        "from the Node status write to the first UDP answer on the newly serving edge's address (and back), probing every 10 ms",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_devices_are_the_veths_and_links() {
        let listing = "\
1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00 promiscuity 0 minmtu 0 maxmtu 0 addrgenmode eui64
2: eth0@if12: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 4e:1a:00:00:00:01 brd ff:ff:ff:ff:ff:ff link-netns kl-ul promiscuity 0 minmtu 68 maxmtu 65535 \\    veth addrgenmode eui64
3: wt0: <POINTOPOINT,MULTICAST,NOARP,UP,LOWER_UP> mtu 1420 qdisc fq_codel state UNKNOWN mode DEFAULT group default qlen 500\\    link/none  promiscuity 0 minmtu 0 maxmtu 65535 \\    tun type tun pi off vnet_hdr off multi_queue off addrgenmode random
4: kup-3f2a9c1d: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1370 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/ether 02:6b:00:00:00:02 brd ff:ff:ff:ff:ff:ff promiscuity 0 minmtu 68 maxmtu 65535 \\    vxlan id 6242 remote 100.64.0.2 local 100.64.0.1 srcport 0 0 dstport 4791 nolearning ttl auto ageing 300 udpcsum noudp6zerocsumtx noudp6zerocsumrx addrgenmode eui64
";
        assert_eq!(forwarding_device_names(listing), ["eth0", "kup-3f2a9c1d"]);
    }
}
