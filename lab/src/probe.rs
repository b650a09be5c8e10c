//! A probe: a real client dials a node's address and checks who answered and what the pod saw.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::scenario::{Expect, IpFamily, PodSees, Probe, Protocol};
use crate::topology::{CLIENT_IP, CLIENT_IP6, CLIENT_NS, Topology};

/// What one `kuport-echo ask` said.
#[derive(Debug, Default)]
struct Answer {
    outcome: String,
    from: Option<String>,
    peer: Option<String>,
    client: Option<String>,
    rtt_us: Option<u64>,
    mtu: Option<u32>,
    tag: Option<String>,
}

fn parse(line: &str) -> Answer {
    let mut words = line.split_whitespace();
    let mut a = Answer {
        outcome: words.next().unwrap_or("").to_string(),
        ..Answer::default()
    };
    for w in words {
        match w.split_once('=') {
            Some(("from", v)) => a.from = Some(v.to_string()),
            Some(("peer", v)) => a.peer = Some(v.to_string()),
            Some(("client", v)) => a.client = Some(v.to_string()),
            Some(("rtt_us", v)) => a.rtt_us = v.parse().ok(),
            Some(("mtu", v)) => a.mtu = v.parse().ok(),
            Some(("tag", v)) => a.tag = Some(v.to_string()),
            _ => {}
        }
    }
    a
}

/// Where a probe dialing `dialed` starts: the namespace and the client's own address in its
/// family.
fn source(topo: &Topology, from: &str, dialed: IpAddr) -> Result<(String, IpAddr)> {
    let v6 = dialed.is_ipv6();
    if from == "internet" {
        let ip = if v6 {
            IpAddr::V6(CLIENT_IP6)
        } else {
            IpAddr::V4(CLIENT_IP)
        };
        return Ok((CLIENT_NS.to_string(), ip));
    }
    if from.starts_with("vpn:") {
        let m = topo.mesh_member(from)?;
        let ip = match (v6, m.mesh6) {
            (false, _) => IpAddr::V4(m.mesh),
            (true, Some(mesh6)) => IpAddr::V6(mesh6),
            (true, None) => {
                bail!("probe from {from}: the mesh is IPv4 only, a VPN client has no IPv6 address")
            }
        };
        return Ok((m.ns.clone(), ip));
    }
    if let Some(pod) = from.strip_prefix("pod:") {
        let p = topo
            .pods
            .get(pod)
            .with_context(|| format!("no pod {pod}"))?;
        let ip = if v6 {
            IpAddr::V6(p.ip6)
        } else {
            IpAddr::V4(p.ip)
        };
        return Ok((p.ns.clone(), ip));
    }
    if let Some(node) = from.strip_prefix("node:") {
        // The node's own connection: over the mesh, it leaves from the node's mesh address
        // (IPv6 too, to a mesh IPv6 address under `mesh: {ipv6: true}`); over IPv6 elsewhere,
        // from its public address, or a worker's pod gateway (the kernel picks: give such a
        // probe `podSees: any`).
        let n = topo.node(node)?;
        let to_mesh6 = |d: IpAddr| topo.mesh.iter().any(|m| m.mesh6.map(IpAddr::V6) == Some(d));
        let ip = match (v6, n.mesh6, n.public6) {
            (false, _, _) => IpAddr::V4(n.mesh),
            (true, Some(mesh6), _) if to_mesh6(dialed) => IpAddr::V6(mesh6),
            (true, _, Some(public6)) => IpAddr::V6(public6),
            (true, _, None) => IpAddr::V6(n.pod_gateway6),
        };
        return Ok((n.ns.clone(), ip));
    }
    bail!("probe from {from}: use internet, vpn:<client>, pod:<namespace>/<name> or node:<name>")
}

/// The address a probe dials: a pod's own (`to.pod`) or a node interface's, in `to.family`.
fn target(topo: &Topology, p: &Probe) -> Result<IpAddr> {
    match &p.to.pod {
        Some(pod) => {
            let info = topo
                .pods
                .get(pod)
                .with_context(|| format!("probe to pod {pod}: no such pod"))?;
            Ok(match p.to.family {
                IpFamily::IPv4 => IpAddr::V4(info.ip),
                IpFamily::IPv6 => IpAddr::V6(info.ip6),
            })
        }
        None => topo.address_in(&p.to.node, &p.to.interface, p.to.family),
    }
}

/// `ip` arguments running one `kuport-echo ask` from namespace `ns`.
fn ask_args(
    topo: &Topology,
    ns: &str,
    protocol: Protocol,
    dialed: SocketAddr,
    timeout_ms: u64,
) -> Vec<String> {
    vec![
        "netns".into(),
        "exec".into(),
        ns.into(),
        topo.bin("kuport-echo"),
        "ask".into(),
        protocol.lower().into(),
        dialed.to_string(),
        "--timeout-ms".into(),
        timeout_ms.to_string(),
    ]
}

/// How long one ask of a probe waits: refused means the ICMP or RST came within a second,
/// never a silent timeout; a bulk TCP transfer gets 20 s.
fn ask_timeout_ms(p: &Probe) -> u64 {
    match (p.expect, p.protocol, p.bytes) {
        (Expect::Refused, _, _) => 1000,
        (_, Protocol::Tcp, Some(_)) => 20_000,
        _ => 2000,
    }
}

/// How long each ask of a `withinSeconds` probe waits: short, so the time an answer came back
/// is known to a quarter of a second.
const WITHIN_ASK_MS: u64 = 250;

async fn ask_once(
    topo: &Topology,
    ns: &str,
    p: &Probe,
    dialed: SocketAddr,
    timeout_ms: u64,
) -> Result<Answer> {
    let mut args = ask_args(topo, ns, p.protocol, dialed, timeout_ms);
    if let Some(size) = p.size {
        args.extend(["--size".into(), size.to_string()]);
    }
    if !p.dont_fragment {
        args.extend(["--df".into(), "off".into()]);
    }
    if let Some(bytes) = p.bytes {
        args.extend(["--bulk".into(), bytes.to_string()]);
    }
    if let Some(port) = p.source_port {
        args.extend(["--source-port".into(), port.to_string()]);
    }
    let out = tokio::process::Command::new("ip")
        .args(&args)
        .output()
        .await
        .context("running kuport-echo ask")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("").to_string();
    if line.is_empty() {
        bail!(
            "kuport-echo ask printed nothing: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(parse(&line))
}

/// Runs a probe and judges it; the detail is the report contract's probe detail.
pub async fn run(topo: &Topology, p: &Probe) -> (bool, Value) {
    match run_inner(topo, p).await {
        Ok(r) => r,
        Err(e) => (false, json!({"error": format!("{e:#}")})),
    }
}

async fn run_inner(topo: &Topology, p: &Probe) -> Result<(bool, Value)> {
    let addr = target(topo, p)?;
    let (ns, client_ip) = source(topo, &p.from, addr)?;
    let dialed = SocketAddr::new(addr, p.port);
    let target = Dialed {
        ns: &ns,
        dialed,
        addr,
        client_ip,
    };
    if let Some(seconds) = p.within_seconds {
        return within(topo, p, &target, Duration::from_secs_f64(seconds)).await;
    }
    if let Some(seconds) = p.hold_seconds {
        return hold(topo, p, &target, Duration::from_secs_f64(seconds)).await;
    }
    // A UDP datagram may be lost once (a first ARP, a link coming up): up to three tries.
    let tries = if p.protocol == Protocol::Udp { 3 } else { 1 };
    let mut answer = Answer::default();
    let mut attempts = 0;
    for _ in 0..tries {
        attempts += 1;
        answer = ask_once(topo, &ns, p, dialed, ask_timeout_ms(p)).await?;
        if answer.outcome != "timeout" {
            break;
        }
        if matches!(p.expect, Expect::Timeout | Expect::NoAnswer) {
            // Expecting silence: one full wait per try is the proof, no need to hurry.
            continue;
        }
    }
    let ok = judge(p, &answer, dialed, addr, client_ip);
    Ok((ok, detail_of(p, &answer, dialed, attempts)))
}

/// Where a probe goes and from which client address.
struct Dialed<'a> {
    ns: &'a str,
    dialed: SocketAddr,
    addr: IpAddr,
    client_ip: IpAddr,
}

/// `withinSeconds`: short asks until one matches; the detail gives `afterMillis`, when the
/// matching answer came back, counted from the step's start.
async fn within(
    topo: &Topology,
    p: &Probe,
    t: &Dialed<'_>,
    bound: Duration,
) -> Result<(bool, Value)> {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let answer = ask_once(topo, t.ns, p, t.dialed, WITHIN_ASK_MS).await?;
        let ok = judge(p, &answer, t.dialed, t.addr, t.client_ip);
        let elapsed = started.elapsed();
        if ok || elapsed >= bound {
            let mut detail = detail_of(p, &answer, t.dialed, attempts);
            detail["withinMillis"] = json!(bound.as_millis() as u64);
            if ok {
                detail["afterMillis"] = json!(elapsed.as_millis() as u64);
            }
            return Ok((ok && elapsed <= bound, detail));
        }
        if answer.outcome != "timeout" {
            // A fast refusal: do not spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `holdSeconds`: asks, each waiting its usual time, until the period is over; every one must
/// match. The detail gives `heldMillis`, and `brokeAfterMillis` when one did not.
async fn hold(
    topo: &Topology,
    p: &Probe,
    t: &Dialed<'_>,
    period: Duration,
) -> Result<(bool, Value)> {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let answer = ask_once(topo, t.ns, p, t.dialed, ask_timeout_ms(p)).await?;
        let ok = judge(p, &answer, t.dialed, t.addr, t.client_ip);
        let elapsed = started.elapsed().as_millis() as u64;
        if !ok || started.elapsed() >= period {
            let mut detail = detail_of(p, &answer, t.dialed, attempts);
            detail["holdMillis"] = json!(period.as_millis() as u64);
            detail[if ok { "heldMillis" } else { "brokeAfterMillis" }] = json!(elapsed);
            return Ok((ok, detail));
        }
        if answer.outcome != "timeout" {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The report contract's probe detail of one answer.
fn detail_of(p: &Probe, answer: &Answer, dialed: SocketAddr, attempts: u32) -> Value {
    let mut detail = json!({
        "dialed": dialed.to_string(),
        "replyFrom": answer.from,
        "clientAddr": answer.client,
        "podSaw": answer.peer,
        "rttMicros": answer.rtt_us,
        "outcome": answer.outcome,
        "expected": format!("{:?}", p.expect).to_lowercase(),
        "attempts": attempts,
        "answeredBy": answer.tag,
    });
    match p.pod_sees {
        PodSees::Other => detail["podSees"] = json!("other"),
        PodSees::Any => {
            detail["podSees"] = json!("any");
            // Whether the pod saw the client's own address and port, for the record.
            detail["podSawClient"] = json!(answer.peer.is_some() && answer.peer == answer.client);
        }
        PodSees::Client => {}
    }
    if let Some(mtu) = answer.mtu {
        detail["mtu"] = json!(mtu);
    }
    detail
}

/// Whether `answer` is what the probe expects: a reply from the address dialed that saw the
/// client (or not) as the probe says, a refusal from the address dialed, silence, or
/// fragmentation needed at the expected MTU.
/// A refusal (ICMP error or RST) that came from the address dialed: one from the pod or the
/// link address would mean the mapping leaked an inside address.
fn refused_by(answer: &Answer, addr: IpAddr) -> bool {
    answer.outcome == "refused" && answer.from.as_deref() == Some(addr.to_string().as_str())
}

fn judge(p: &Probe, answer: &Answer, dialed: SocketAddr, addr: IpAddr, client_ip: IpAddr) -> bool {
    let client_own = answer
        .client
        .as_deref()
        .and_then(|c| c.parse::<SocketAddr>().ok())
        .is_some_and(|c| c.ip() == client_ip);
    match p.expect {
        Expect::Reply => {
            let from_dialed = answer.from.as_deref() == Some(dialed.to_string().as_str());
            let saw_client = answer.peer.is_some() && answer.peer == answer.client;
            let saw_client_ip = answer
                .peer
                .as_deref()
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .is_some_and(|a| a.ip() == client_ip);
            answer.outcome == "reply"
                && from_dialed
                && p.answered_by
                    .as_ref()
                    .is_none_or(|want| answer.tag.as_ref() == Some(want))
                && match p.pod_sees {
                    PodSees::Client => client_own && saw_client,
                    PodSees::Other => client_own && !saw_client_ip,
                    // The kernel picks a node client's source (its address toward the one
                    // dialed), so neither it nor what the pod saw is judged, only recorded.
                    PodSees::Any => answer.peer.is_some(),
                }
        }
        Expect::Refused => refused_by(answer, addr),
        Expect::Timeout => answer.outcome == "timeout",
        Expect::NoAnswer => answer.outcome == "timeout" || refused_by(answer, addr),
        Expect::FragmentationNeeded => {
            answer.outcome == "fragneeded" && p.mtu.is_none_or(|m| answer.mtu == Some(m))
        }
    }
}

/// Waits a little between retries elsewhere; kept here so probes and waits agree on pacing.
pub const POLL: Duration = Duration::from_millis(200);

/// A probe reduced to the command a loop repeats and what a good answer carries, so a loop
/// needs no access to the topology while the agents are being restarted.
#[derive(Clone, Debug)]
pub struct Looped {
    /// `ip` arguments running one `kuport-echo ask`.
    args: Vec<String>,
    /// The address dialed, which must be the one answering.
    pub dialed: SocketAddr,
    /// The client's own address, which the pod must see.
    client_ip: IpAddr,
}

/// Prepares `p` (which expects a reply) for a loop; each ask waits at most `timeout_ms`.
pub fn prepare_loop(topo: &Topology, p: &Probe, timeout_ms: u64) -> Result<Looped> {
    if p.expect != Expect::Reply {
        bail!("a probe loop counts replies: the probe must expect one");
    }
    let addr = target(topo, p)?;
    let (ns, client_ip) = source(topo, &p.from, addr)?;
    let dialed = SocketAddr::new(addr, p.port);
    let mut args = ask_args(topo, &ns, p.protocol, dialed, timeout_ms);
    if let Some(port) = p.source_port {
        args.extend(["--source-port".into(), port.to_string()]);
    }
    Ok(Looped {
        args,
        dialed,
        client_ip,
    })
}

/// One ask of a loop: true when the dialed address answered and the pod saw the client's own
/// address (no retry: a lost datagram counts as lost).
pub async fn ask_looped(l: &Looped) -> bool {
    let Ok(out) = tokio::process::Command::new("ip")
        .args(&l.args)
        .output()
        .await
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let answer = parse(text.lines().next().unwrap_or(""));
    judge_looped(&answer, l)
}

fn judge_looped(answer: &Answer, l: &Looped) -> bool {
    let client_ip = l.client_ip;
    let addr_ip = |s: &Option<String>| {
        s.as_deref()
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map(|a| a.ip())
    };
    answer.outcome == "reply"
        && answer.from.as_deref() == Some(l.dialed.to_string().as_str())
        && answer.peer.is_some()
        && answer.peer == answer.client
        && addr_ip(&answer.peer) == Some(client_ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_answer_accepts_silence_or_a_refusal_from_the_address_dialed_only() {
        let yaml = "from: internet\nto: {node: a, interface: eth0}\nprotocol: UDP\nport: 3000\nexpect: noAnswer\n";
        let p: Probe = serde_saphyr::from_str(yaml).expect("a probe expecting no answer");
        assert_eq!(p.expect, Expect::NoAnswer);
        let dialed: SocketAddr = "192.0.2.1:3000".parse().expect("addr");
        let addr: IpAddr = "192.0.2.1".parse().expect("ip");
        let client: IpAddr = "198.51.100.7".parse().expect("ip");
        let judged = |line: &str| judge(&p, &parse(line), dialed, addr, client);
        assert!(judged("timeout"));
        assert!(judged("refused from=192.0.2.1"));
        for bad in [
            "reply from=192.0.2.1:3000 peer=198.51.100.7:40000 client=198.51.100.7:40000",
            "refused from=10.244.1.5",
            "fragneeded mtu=1400",
        ] {
            assert!(!judged(bad), "{bad}");
        }
    }

    #[test]
    fn pod_sees_any_requires_the_dialed_address_and_records_the_source() {
        let yaml = "from: \"node:a\"\nto: {node: a, interface: eth0}\nprotocol: UDP\nport: 3000\nexpect: reply\npodSees: any\n";
        let p: Probe = serde_saphyr::from_str(yaml).expect("a probe recording the source");
        assert_eq!(p.pod_sees, PodSees::Any);
        let dialed: SocketAddr = "192.0.2.1:3000".parse().expect("addr");
        let addr: IpAddr = "192.0.2.1".parse().expect("ip");
        let mesh: IpAddr = "100.64.0.1".parse().expect("ip");
        let judged = |line: &str| judge(&p, &parse(line), dialed, addr, mesh);
        // The node dialed its own public address: the kernel chose that address as source,
        // and the pod saw a translated one; both recorded, neither judged.
        let translated = "reply from=192.0.2.1:3000 peer=169.254.77.0:40000 client=192.0.2.1:40000";
        assert!(judged(translated));
        let detail = detail_of(&p, &parse(translated), dialed, 1);
        assert_eq!(detail["podSaw"], "169.254.77.0:40000");
        assert_eq!(detail["podSawClient"], false);
        for bad in [
            "timeout",
            "refused from=192.0.2.1",
            // The reply must come from the address and port dialed.
            "reply from=10.244.1.5:3000 peer=192.0.2.1:40000 client=192.0.2.1:40000",
            "reply from=192.0.2.1:3001 peer=192.0.2.1:40000 client=192.0.2.1:40000",
        ] {
            assert!(!judged(bad), "{bad}");
        }
    }

    #[test]
    fn a_looped_answer_counts_only_with_the_clients_own_address() {
        let l = Looped {
            args: Vec::new(),
            dialed: "192.0.2.1:3000".parse().expect("addr"),
            client_ip: "198.51.100.7".parse().expect("ip"),
        };
        let good =
            parse("reply from=192.0.2.1:3000 peer=198.51.100.7:40000 client=198.51.100.7:40000");
        assert!(judge_looped(&good, &l));
        for bad in [
            "timeout",
            "refused from=192.0.2.1:3000",
            "reply from=10.0.0.9:3000 peer=198.51.100.7:40000 client=198.51.100.7:40000",
            "reply from=192.0.2.1:3000 peer=10.244.0.1:40000 client=198.51.100.7:40000",
        ] {
            assert!(!judge_looped(&parse(bad), &l), "{bad}");
        }
    }

    #[test]
    fn an_ipv6_probe_is_judged_against_the_clients_ipv6_address() {
        let yaml = "from: internet\nto: {node: a, interface: enp1s0, family: IPv6}\nprotocol: TCP\nport: 3000\nexpect: reply\n";
        let p: Probe = serde_saphyr::from_str(yaml).expect("an IPv6 probe");
        assert_eq!(p.to.family, IpFamily::IPv6);
        let dialed: SocketAddr = "[2001:db8:203::1]:3000".parse().expect("addr");
        let judged = |line: &str| judge(&p, &parse(line), dialed, dialed.ip(), CLIENT_IP6.into());
        assert!(judged(
            "reply from=[2001:db8:203::1]:3000 peer=[2001:db8:198::10]:40000 port=3000 client=[2001:db8:198::10]:40000"
        ));
        for bad in [
            // The pod saw the node's pod gateway (masqueraded), not the client.
            "reply from=[2001:db8:203::1]:3000 peer=[fd00:10:244:1::1]:40000 client=[2001:db8:198::10]:40000",
            // An IPv4 client's address is not the IPv6 client's.
            "reply from=[2001:db8:203::1]:3000 peer=198.51.100.10:40000 client=198.51.100.10:40000",
            "reply from=[fd00:10:244:1::10]:3000 peer=[2001:db8:198::10]:40000 client=[2001:db8:198::10]:40000",
            "refused from=2001:db8:203::1",
        ] {
            assert!(!judged(bad), "{bad}");
        }
        let refused: Probe =
            serde_saphyr::from_str(&yaml.replace("reply", "refused")).expect("a refusal");
        assert!(judge(
            &refused,
            &parse("refused from=2001:db8:203::1"),
            dialed,
            dialed.ip(),
            CLIENT_IP6.into()
        ));
        assert!(!judge(
            &refused,
            &parse("refused from=fd00:10:244:1::10"),
            dialed,
            dialed.ip(),
            CLIENT_IP6.into()
        ));
    }
}
