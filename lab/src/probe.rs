//! A probe: a real client dials a node's address and checks who answered and what the pod saw.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::scenario::{Expect, PodSees, Probe, Protocol};
use crate::topology::{CLIENT_IP, CLIENT_NS, Topology};

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

/// Where a probe starts: the namespace and the client's own address.
fn source(topo: &Topology, from: &str) -> Result<(String, Ipv4Addr)> {
    if from == "internet" {
        return Ok((CLIENT_NS.to_string(), CLIENT_IP));
    }
    if from.starts_with("vpn:") {
        let m = topo.mesh_member(from)?;
        return Ok((m.ns.clone(), m.mesh));
    }
    if let Some(pod) = from.strip_prefix("pod:") {
        let p = topo
            .pods
            .get(pod)
            .with_context(|| format!("no pod {pod}"))?;
        return Ok((p.ns.clone(), p.ip));
    }
    if let Some(node) = from.strip_prefix("node:") {
        // The node's own connection: over the mesh, it leaves from the node's mesh address.
        let n = topo.node(node)?;
        return Ok((n.ns.clone(), n.mesh));
    }
    bail!("probe from {from}: use internet, vpn:<client>, pod:<namespace>/<name> or node:<name>")
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

async fn ask_once(topo: &Topology, ns: &str, p: &Probe, dialed: SocketAddr) -> Result<Answer> {
    let timeout_ms = match (p.expect, p.protocol, p.bytes) {
        // Refused means the ICMP or RST came within a second, never a silent timeout.
        (Expect::Refused, _, _) => 1000,
        (_, Protocol::Tcp, Some(_)) => 20_000,
        _ => 2000,
    };
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
    let (ns, client_ip) = source(topo, &p.from)?;
    let addr = match &p.to.pod {
        Some(pod) => {
            topo.pods
                .get(pod)
                .with_context(|| format!("probe to pod {pod}: no such pod"))?
                .ip
        }
        None => topo.address_of(&p.to.node, &p.to.interface)?,
    };
    let dialed = SocketAddr::V4(SocketAddrV4::new(addr, p.port));
    // A UDP datagram may be lost once (a first ARP, a link coming up): up to three tries.
    let tries = if p.protocol == Protocol::Udp { 3 } else { 1 };
    let mut answer = Answer::default();
    let mut attempts = 0;
    for _ in 0..tries {
        attempts += 1;
        answer = ask_once(topo, &ns, p, dialed).await?;
        if answer.outcome != "timeout" {
            break;
        }
        if matches!(p.expect, Expect::Timeout | Expect::NoAnswer) {
            // Expecting silence: one full wait per try is the proof, no need to hurry.
            continue;
        }
    }
    let ok = judge(p, &answer, dialed, addr, client_ip);
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
    if p.pod_sees == PodSees::Other {
        detail["podSees"] = json!("other");
    }
    if let Some(mtu) = answer.mtu {
        detail["mtu"] = json!(mtu);
    }
    Ok((ok, detail))
}

/// Whether `answer` is what the probe expects: a reply from the address dialed that saw the
/// client (or not) as the probe says, a refusal from the address dialed, silence, or
/// fragmentation needed at the expected MTU.
/// A refusal (ICMP error or RST) that came from the address dialed: one from the pod or the
/// link address would mean the mapping leaked an inside address.
fn refused_by(answer: &Answer, addr: Ipv4Addr) -> bool {
    answer.outcome == "refused" && answer.from.as_deref() == Some(addr.to_string().as_str())
}

fn judge(
    p: &Probe,
    answer: &Answer,
    dialed: SocketAddr,
    addr: Ipv4Addr,
    client_ip: Ipv4Addr,
) -> bool {
    let client_own = answer
        .client
        .as_deref()
        .and_then(|c| c.parse::<SocketAddr>().ok())
        .is_some_and(|c| c.ip() == std::net::IpAddr::V4(client_ip));
    match p.expect {
        Expect::Reply => {
            let from_dialed = answer.from.as_deref() == Some(dialed.to_string().as_str());
            let saw_client = answer.peer.is_some() && answer.peer == answer.client;
            let saw_client_ip = answer
                .peer
                .as_deref()
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .is_some_and(|a| a.ip() == std::net::IpAddr::V4(client_ip));
            answer.outcome == "reply"
                && from_dialed
                && p.answered_by
                    .as_ref()
                    .is_none_or(|want| answer.tag.as_ref() == Some(want))
                && client_own
                && match p.pod_sees {
                    PodSees::Client => saw_client,
                    PodSees::Other => !saw_client_ip,
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
    client_ip: Ipv4Addr,
}

/// Prepares `p` (which expects a reply) for a loop; each ask waits at most `timeout_ms`.
pub fn prepare_loop(topo: &Topology, p: &Probe, timeout_ms: u64) -> Result<Looped> {
    if p.expect != Expect::Reply {
        bail!("a probe loop counts replies: the probe must expect one");
    }
    let (ns, client_ip) = source(topo, &p.from)?;
    let addr = topo.address_of(&p.to.node, &p.to.interface)?;
    let dialed = SocketAddr::V4(SocketAddrV4::new(addr, p.port));
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
    let client_ip = std::net::IpAddr::V4(l.client_ip);
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
        let addr: Ipv4Addr = "192.0.2.1".parse().expect("ip");
        let client: Ipv4Addr = "198.51.100.7".parse().expect("ip");
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
}
