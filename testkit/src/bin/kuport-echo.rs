//! `kuport-echo`: the responder and prober the kernel tests and the lab run inside network
//! namespaces. The responder answers every UDP datagram and TCP line with the peer address it
//! saw, which is the whole point of kuport: the pod must see the client's own address.
//!
//! ```text
//! kuport-echo serve <udp|tcp> <first-port>[-<last-port>] [--tag T] [--bind IP]
//!     answer "peer=<ip>:<port> port=<local port>" (plus " tag=T": which responder answered);
//!     IPv4 and IPv6 on one socket per port (`::` with IPV6_V6ONLY off, `0.0.0.0` where the
//!     kernel has no IPv6), or on address IP alone with `--bind`; an IPv6 peer is written
//!     `[<ip>]:<port>`, an IPv4 one (IPv4-mapped on the socket) as plain IPv4
//! kuport-echo ask <udp|tcp> <ip>:<port>|[<ipv6>]:<port> [--timeout-ms N] [--bulk N] [--size N]
//!                 [--df on|off] [--source-port N]
//!     prints "reply from=<ip:port> <answer> client=<ip:port> rtt_us=N", "refused" (exit 3),
//!     "timeout" (exit 4) or "fragneeded mtu=N" (exit 5)
//! kuport-echo forge-probes --from <peer link IP> --to <link IP> [--seqs N] [--every-ms N]
//!                          [--request-seq S]
//!     forged answers to the agent's link probes, sequence numbers 0 to N-1 (256) every N ms
//!     (100), from the peer's address (raw IPv4); with `--request-seq`, a forged request too;
//!     prints "ready" once the first round is out, then runs until killed
//! kuport-echo old-probe --from <link IP> --to <peer link IP> [--size N] [--count N]
//!                       [--interval-ms N]
//!     probes as the agent did before nonces (N probes of N bytes of IP, 1370 and 5, every N ms,
//!     200) and prints "answered=A lost=L requests=R" by the old matching
//! ```
//! `--source-port` binds the asking socket to that port (on every address) instead of an
//! ephemeral one, so a test can put a connection's replies on a port of its choosing.
//! `--size` pads a UDP datagram to that many payload bytes; `--df off` lets the kernel fragment it
//! (IP_PMTUDISC_DONT), `--df on` (the default) sets DF on every datagram (IP_PMTUDISC_DO), so a
//! router on the path answers "fragmentation needed", reported with the path MTU it named (for
//! IPv6, IPV6_MTU_DISCOVER: no router fragments, `--df off` lets the client itself fragment, and
//! "packet too big" is reported the same way).
//! A UDP probe uses a connected socket: the kernel delivers a reply only when it comes from the
//! exact address and port dialed, and reports an ICMP (or ICMPv6) port-unreachable as "refused".
//! `--source-port` (UDP) sends from that port, so successive asks are one flow to conntrack, as
//! a client sending from one socket is.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::process::ExitCode;
use std::time::Duration;

use rustix::net::SocketType;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("ask") => ask(&args[1..]),
        Some("forge-probes") => forge_probes(&args[1..]),
        Some("old-probe") => old_probe(&args[1..]),
        _ => Err("usage: kuport-echo serve <udp|tcp> <port>[-<last>] | ask <udp|tcp> <ip:port> [--timeout-ms N] [--bulk N] [--source-port N] | forge-probes --from IP --to IP | old-probe --from IP --to IP".into()),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("kuport-echo: {e}");
            ExitCode::from(2)
        }
    }
}

/// Logs a line; a reader that went away is not the responder's problem (println! would panic).
fn log(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

fn ports(spec: &str) -> Result<Vec<u16>, String> {
    let (a, b) = spec.split_once('-').unwrap_or((spec, spec));
    let first: u16 = a.parse().map_err(|_| format!("bad port {a}"))?;
    let last: u16 = b.parse().map_err(|_| format!("bad port {b}"))?;
    Ok((first..=last).collect())
}

fn serve(args: &[String]) -> Result<u8, String> {
    let (proto, spec) = match args {
        [p, s, ..] => (p.as_str(), s.as_str()),
        _ => return Err("serve needs <udp|tcp> <ports>".into()),
    };
    let tag = args
        .iter()
        .position(|a| a == "--tag")
        .and_then(|i| args.get(i + 1))
        .map(|t| format!(" tag={t}"))
        .unwrap_or_default();
    let only: Option<IpAddr> = match args.iter().position(|a| a == "--bind") {
        Some(i) => Some(
            args.get(i + 1)
                .and_then(|a| a.parse().ok())
                .ok_or("--bind needs an IP address")?,
        ),
        None => None,
    };
    let bind = |kind, port| match only {
        Some(addr) => bind_on(kind, SocketAddr::new(addr, port)),
        None => bind_any(kind, port),
    };
    let mut threads = Vec::new();
    for port in ports(spec)? {
        let tag = tag.clone();
        match proto {
            "udp" => {
                let sock: UdpSocket = bind(SocketType::DGRAM, port)
                    .map_err(|e| format!("bind udp {port}: {e}"))?
                    .into();
                threads.push(std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65536];
                    while let Ok((n, peer)) = sock.recv_from(&mut buf) {
                        let answer = format!("peer={} port={port} len={n}{tag}", unmapped(peer));
                        log(&answer);
                        let _ = sock.send_to(answer.as_bytes(), peer);
                    }
                }));
            }
            "tcp" => {
                let listener: TcpListener = bind(SocketType::STREAM, port)
                    .and_then(|fd| {
                        rustix::net::listen(&fd, 128)?;
                        Ok(fd)
                    })
                    .map_err(|e| format!("bind tcp {port}: {e}"))?
                    .into();
                threads.push(std::thread::spawn(move || {
                    for stream in listener.incoming().flatten() {
                        let tag = tag.clone();
                        std::thread::spawn(move || answer_tcp(stream, port, &tag));
                    }
                }));
            }
            other => return Err(format!("unknown protocol {other}")),
        }
    }
    println!("ready");
    for t in threads {
        let _ = t.join();
    }
    Ok(0)
}

/// A socket of `kind` bound to `port` on every address of both families: `::` with IPV6_V6ONLY
/// off, or `0.0.0.0` when the kernel has no IPv6 at all.
/// A socket of `addr`'s family bound to that address alone (a host daemon configured with one
/// listen address).
fn bind_on(kind: SocketType, addr: SocketAddr) -> std::io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, sockopt};
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let fd = rustix::net::socket(family, kind, None)?;
    if kind == SocketType::STREAM {
        sockopt::set_socket_reuseaddr(&fd, true)?;
    }
    rustix::net::bind(&fd, &addr)?;
    Ok(fd)
}

fn bind_any(kind: SocketType, port: u16) -> std::io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, sockopt};
    let fd = match rustix::net::socket(AddressFamily::INET6, kind, None) {
        Ok(fd) => {
            sockopt::set_ipv6_v6only(&fd, false)?;
            fd
        }
        Err(e) if e == rustix::io::Errno::AFNOSUPPORT => {
            let fd = rustix::net::socket(AddressFamily::INET, kind, None)?;
            if kind == SocketType::STREAM {
                sockopt::set_socket_reuseaddr(&fd, true)?;
            }
            rustix::net::bind(&fd, &SocketAddr::from(([0, 0, 0, 0], port)))?;
            return Ok(fd);
        }
        Err(e) => return Err(e.into()),
    };
    if kind == SocketType::STREAM {
        // As std's TcpListener: a port whose last connection is in TIME_WAIT can be bound.
        sockopt::set_socket_reuseaddr(&fd, true)?;
    }
    rustix::net::bind(&fd, &SocketAddr::from(([0u16; 8], port)))?;
    Ok(fd)
}

/// A peer as the pod saw it: an IPv4 client reaching the dual-stack socket arrives IPv4-mapped
/// (`::ffff:a.b.c.d`) and is written as the plain IPv4 address it is.
fn unmapped(peer: SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, v6.port())),
            None => peer,
        },
        v4 => v4,
    }
}

fn answer_tcp(stream: TcpStream, port: u16, tag: &str) {
    let Ok(peer) = stream.peer_addr().map(unmapped) else {
        return;
    };
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut stream = stream;
    let answer = format!("peer={peer} port={port}{tag}");
    log(&answer);
    let _ = writeln!(stream, "{answer}");
    if let Some(n) = line
        .trim()
        .strip_prefix("bulk=")
        .and_then(|n| n.parse::<usize>().ok())
    {
        // Read n bytes from the client, then send n bytes back: a transfer both ways.
        let mut got = 0;
        let mut buf = vec![0u8; 65536];
        while got < n {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(k) => got += k,
            }
        }
        let chunk = vec![b'x'; 65536];
        let mut sent = 0;
        while sent < n {
            let k = chunk.len().min(n - sent);
            if stream.write_all(&chunk[..k]).is_err() {
                return;
            }
            sent += k;
        }
    }
}

fn flag(args: &[String], name: &str) -> Option<u64> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

/// The IPv4 address after `name`.
fn ipv4_flag(args: &[String], name: &str) -> Result<std::net::Ipv4Addr, String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{name} needs an IPv4 address"))
}

fn forge_probes(args: &[String]) -> Result<u8, String> {
    use kuport_testkit::link_probes::{Forgery, forge};
    let f = Forgery {
        from: ipv4_flag(args, "--from")?,
        to: ipv4_flag(args, "--to")?,
        seqs: 0..flag(args, "--seqs").unwrap_or(256),
        every: Duration::from_millis(flag(args, "--every-ms").unwrap_or(100)),
        request_seq: flag(args, "--request-seq"),
    };
    forge(&f, || log("ready")).map_err(|e| format!("forging probe answers to {}: {e}", f.to))?;
    Ok(0)
}

fn old_probe(args: &[String]) -> Result<u8, String> {
    let (from, to) = (ipv4_flag(args, "--from")?, ipv4_flag(args, "--to")?);
    let size = flag(args, "--size").unwrap_or(1370) as usize;
    let count = u32::try_from(flag(args, "--count").unwrap_or(5))
        .map_err(|_| "--count: too many probes".to_owned())?;
    let interval = Duration::from_millis(flag(args, "--interval-ms").unwrap_or(200));
    let o = kuport_testkit::link_probes::old_probe(from, to, size, count, interval)
        .map_err(|e| format!("probing {to} from {from} as before nonces: {e}"))?;
    println!(
        "answered={} lost={} requests={}",
        o.answered, o.lost, o.requests
    );
    Ok(0)
}

fn ask(args: &[String]) -> Result<u8, String> {
    let (proto, target) = match args {
        [p, t, ..] => (p.as_str(), t.as_str()),
        _ => return Err("ask needs <udp|tcp> <ip:port>".into()),
    };
    let target: SocketAddr = target
        .parse()
        .map_err(|_| format!("bad address {target}"))?;
    let timeout = Duration::from_millis(flag(args, "--timeout-ms").unwrap_or(2000));
    let bulk = flag(args, "--bulk").map(|n| n as usize);
    let size = flag(args, "--size").map(|n| n as usize);
    let df = match args
        .iter()
        .position(|a| a == "--df")
        .and_then(|i| args.get(i + 1))
    {
        None => true,
        Some(v) if v == "on" => true,
        Some(v) if v == "off" => false,
        Some(v) => return Err(format!("--df takes on or off, not {v}")),
    };
    let source_port = match flag(args, "--source-port") {
        None => 0,
        Some(p) => u16::try_from(p).map_err(|_| format!("--source-port {p}: not a port"))?,
    };
    let started = std::time::Instant::now();
    let outcome = match proto {
        "udp" => ask_udp(target, timeout, size, df, source_port),
        "tcp" => ask_tcp(target, timeout, bulk, source_port),
        other => return Err(format!("unknown protocol {other}")),
    };
    match outcome {
        Ok(answer) => {
            println!("reply {answer} rtt_us={}", started.elapsed().as_micros());
            Ok(0)
        }
        Err(Outcome::FragNeeded(mtu)) => {
            println!("fragneeded mtu={mtu}");
            Ok(5)
        }
        Err(Outcome::Refused(Some(source))) => {
            println!("refused from={source}");
            Ok(3)
        }
        Err(Outcome::Refused(None)) => {
            println!("refused");
            Ok(3)
        }
        Err(Outcome::Io(e)) => io_outcome(proto, target, e),
    }
}

/// The source of the ICMP or ICMPv6 error queued on a socket (IP_RECVERR's or IPV6_RECVERR's
/// offender address).
fn icmp_source(sock: &UdpSocket) -> Option<IpAddr> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg};
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 2048];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!(nix::libc::sock_extended_err, nix::libc::sockaddr_in6);
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_ERRQUEUE,
    )
    .ok()?;
    msg.cmsgs().ok()?.find_map(|c| match c {
        ControlMessageOwned::Ipv4RecvErr(_, Some(addr)) => Some(IpAddr::from(
            std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
        )),
        ControlMessageOwned::Ipv6RecvErr(_, Some(addr)) => Some(IpAddr::from(
            std::net::Ipv6Addr::from(addr.sin6_addr.s6_addr),
        )),
        _ => None,
    })
}

/// Why a probe got no answer.
enum Outcome {
    /// An ICMP port-unreachable (naming its sender) or, for TCP, a reset.
    Refused(Option<IpAddr>),
    /// A router on the path said "fragmentation needed" and named this MTU.
    FragNeeded(u32),
    Io(std::io::Error),
}

impl From<std::io::Error> for Outcome {
    fn from(e: std::io::Error) -> Self {
        Outcome::Io(e)
    }
}

fn io_outcome(proto: &str, target: SocketAddr, e: std::io::Error) -> Result<u8, String> {
    match e {
        e if e.kind() == ErrorKind::ConnectionRefused => {
            println!("refused");
            Ok(3)
        }
        e if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            println!("timeout");
            Ok(4)
        }
        e => Err(format!("{proto} {target}: {e}")),
    }
}

fn ask_udp(
    target: SocketAddr,
    timeout: Duration,
    size: Option<usize>,
    df: bool,
    source_port: u16,
) -> Result<String, Outcome> {
    let sock = udp_socket(target, df, source_port)?;
    sock.connect(target)?;
    sock.set_read_timeout(Some(timeout))?;
    let mut payload = b"hello\n".to_vec();
    if let Some(n) = size {
        payload.resize(n.max(1), b'p');
    }
    let frag_needed =
        |e: &std::io::Error| e.raw_os_error() == Some(rustix::io::Errno::MSGSIZE.raw_os_error());
    let path_mtu = |sock: &UdpSocket| {
        match target {
            SocketAddr::V4(_) => rustix::net::sockopt::ip_mtu(sock),
            SocketAddr::V6(_) => rustix::net::sockopt::ipv6_mtu(sock),
        }
        .unwrap_or(0)
    };
    if let Err(e) = sock.send(&payload) {
        return Err(match frag_needed(&e) {
            true => Outcome::FragNeeded(path_mtu(&sock)),
            false => e.into(),
        });
    }
    let mut buf = vec![0u8; 65536];
    // A connected socket only receives from the dialed address; recv_from names it anyway so the
    // report shows where the reply came from rather than assuming it.
    let (n, from) = match sock.recv_from(&mut buf) {
        Ok(got) => got,
        Err(e) if frag_needed(&e) => return Err(Outcome::FragNeeded(path_mtu(&sock))),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            return Err(Outcome::Refused(icmp_source(&sock)));
        }
        Err(e) => return Err(e.into()),
    };
    let local = sock.local_addr()?;
    Ok(format!(
        "from={from} {} client={local}",
        String::from_utf8_lossy(&buf[..n]).trim()
    ))
}

/// The asking UDP socket, of `target`'s family, bound to `source_port` (0: an ephemeral one):
/// DF set or not (path MTU discovery on or off), and ICMP errors queued with the address of the
/// host that sent them, so "refused" can say who refused: through a mapping it must be the
/// address the client dialed.
fn udp_socket(target: SocketAddr, df: bool, source_port: u16) -> std::io::Result<UdpSocket> {
    use nix::sys::socket::{setsockopt, sockopt};
    use rustix::net::sockopt::{Ipv4PathMtuDiscovery, Ipv6PathMtuDiscovery};
    match target {
        SocketAddr::V4(_) => {
            let sock = UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], source_port)))?;
            let pmtu = match df {
                true => Ipv4PathMtuDiscovery::DO,
                false => Ipv4PathMtuDiscovery::DONT,
            };
            rustix::net::sockopt::set_ip_mtu_discover(&sock, pmtu)?;
            setsockopt(&sock, sockopt::Ipv4RecvErr, &true).map_err(std::io::Error::from)?;
            Ok(sock)
        }
        SocketAddr::V6(_) => {
            let sock = UdpSocket::bind(SocketAddr::from(([0u16; 8], source_port)))?;
            let pmtu = match df {
                true => Ipv6PathMtuDiscovery::DO,
                false => Ipv6PathMtuDiscovery::DONT,
            };
            rustix::net::sockopt::set_ipv6_mtu_discover(&sock, pmtu)?;
            setsockopt(&sock, sockopt::Ipv6RecvErr, &true).map_err(std::io::Error::from)?;
            Ok(sock)
        }
    }
}

/// A TCP connection to `target` from `source_port` (0: an ephemeral port), given up after
/// `timeout`.
fn connect_tcp(
    target: SocketAddr,
    timeout: Duration,
    source_port: u16,
) -> std::io::Result<TcpStream> {
    use rustix::net::{AddressFamily, sockopt};
    if source_port == 0 {
        return TcpStream::connect_timeout(&target, timeout);
    }
    let (family, any) = match target {
        SocketAddr::V4(_) => (
            AddressFamily::INET,
            SocketAddr::from(([0, 0, 0, 0], source_port)),
        ),
        SocketAddr::V6(_) => (
            AddressFamily::INET6,
            SocketAddr::from(([0u16; 8], source_port)),
        ),
    };
    let fd = rustix::net::socket(family, SocketType::STREAM, None)?;
    // A port the last run left in TIME_WAIT can still be bound.
    sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &any)?;
    // A blocking connect gives up after the send timeout, with EINPROGRESS.
    sockopt::set_socket_timeout(&fd, sockopt::Timeout::Send, Some(timeout))?;
    match rustix::net::connect(&fd, &target) {
        Ok(()) => Ok(TcpStream::from(fd)),
        Err(e) if e == rustix::io::Errno::INPROGRESS => Err(ErrorKind::TimedOut.into()),
        Err(e) => Err(e.into()),
    }
}

fn ask_tcp(
    target: SocketAddr,
    timeout: Duration,
    bulk: Option<usize>,
    source_port: u16,
) -> Result<String, Outcome> {
    // A reset is matched to the socket by the whole connection, so it came from the target.
    let mut stream = match connect_tcp(target, timeout, source_port) {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            return Err(Outcome::Refused(Some(target.ip())));
        }
        other => other?,
    };
    stream.set_read_timeout(Some(timeout))?;
    let local = stream.local_addr()?;
    let from = stream.peer_addr()?;
    match bulk {
        Some(n) => writeln!(stream, "bulk={n}")?,
        None => writeln!(stream, "hello")?,
    }
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if let Some(n) = bulk {
        let chunk = vec![b'y'; 65536];
        let mut sent = 0;
        while sent < n {
            let k = chunk.len().min(n - sent);
            stream.write_all(&chunk[..k])?;
            sent += k;
        }
        let mut got = 0;
        let mut buf = vec![0u8; 65536];
        while got < n {
            match reader.read(&mut buf)? {
                0 => {
                    return Err(Outcome::Io(std::io::Error::new(
                        ErrorKind::UnexpectedEof,
                        format!("bulk: got {got} of {n} bytes"),
                    )));
                }
                k => got += k,
            }
        }
    }
    Ok(format!("from={from} {} client={local}", line.trim()))
}
