//! The host's sockets that take traffic from outside: TCP listeners and unconnected UDP
//! sockets, read from `/proc/net/{tcp,udp,tcp6,udp6}` of the agent's network namespace. A
//! mapping on one of their ports would take their traffic, so the plan refuses such ports.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use kuport_core::api::Protocol;
use kuport_core::snapshot::HostSocket;

use crate::error::HostError;

/// `st` of a listening TCP socket in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

/// Every TCP listener and unconnected UDP socket: bound to every address (`0.0.0.0`, or `::`,
/// which `/proc` does not say is IPv6-only, so it is taken as both families), to an IPv4 address
/// (an IPv4-mapped IPv6 one included), or to an IPv6 address. Sorted, without duplicates. A missing table (IPv6 disabled) is not an error.
pub fn read(proc_net: &Path) -> Result<Vec<HostSocket>, HostError> {
    let mut sockets = Vec::new();
    for (file, protocol) in [
        ("tcp", Protocol::Tcp),
        ("tcp6", Protocol::Tcp),
        ("udp", Protocol::Udp),
        ("udp6", Protocol::Udp),
    ] {
        let path = proc_net.join(file);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(HostError::Facts {
                    detail: format!("reading {}: {e}", path.display()),
                });
            }
        };
        sockets.extend(parse(&text, protocol));
    }
    sockets.sort();
    sockets.dedup();
    Ok(sockets)
}

/// Names the agent's own TCP listeners (health, metrics) as the agent's.
pub fn name_agent_sockets(sockets: &mut [HostSocket], agent_ports: &[u16]) {
    for s in sockets
        .iter_mut()
        .filter(|s| s.protocol == Protocol::Tcp && agent_ports.contains(&s.port))
    {
        s.holder = Some(format!(
            "the kuport agent's health and metrics listener {}:{}",
            s.address, s.port
        ));
    }
}

/// The sockets of one `/proc/net` table that take traffic from outside; lines that do not
/// parse are skipped (the header, or a format this reader does not know).
pub fn parse(text: &str, protocol: Protocol) -> Vec<HostSocket> {
    text.lines()
        .skip(1)
        .filter_map(|line| parse_line(line, protocol))
        .collect()
}

fn parse_line(line: &str, protocol: Protocol) -> Option<HostSocket> {
    let mut fields = line.split_whitespace();
    let _slot = fields.next()?;
    let (local, local_port) = endpoint(fields.next()?)?;
    let (_, remote_port) = endpoint(fields.next()?)?;
    let state = fields.next()?;
    let open = match protocol {
        Protocol::Tcp => state == TCP_LISTEN,
        // A connected UDP socket takes datagrams from its peer only.
        Protocol::Udp => remote_port == 0,
    };
    let address = local;
    (open && local_port != 0).then_some(HostSocket {
        protocol,
        address,
        port: local_port,
        holder: None,
    })
}

/// `ADDR:PORT` in the kernel's hex: the address as the kernel's 32-bit words printed in host
/// byte order, the port big-endian. `::` reads as `0.0.0.0` and an IPv4-mapped address as its
/// IPv4 address.
fn endpoint(field: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<[u8; 4]> = addr
        .as_bytes()
        .chunks(8)
        .map(|w| {
            let w = std::str::from_utf8(w).ok()?;
            u32::from_str_radix(w, 16).ok().map(u32::to_ne_bytes)
        })
        .collect::<Option<_>>()?;
    let addr = match words.as_slice() {
        [v4] => IpAddr::V4(Ipv4Addr::from(*v4)),
        [a, b, c, d] => {
            let mut octets = [0u8; 16];
            for (i, w) in [a, b, c, d].into_iter().enumerate() {
                octets[i * 4..i * 4 + 4].copy_from_slice(w);
            }
            let v6 = Ipv6Addr::from(octets);
            match v6.to_ipv4_mapped() {
                _ if v6.is_unspecified() => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            }
        }
        _ => return None,
    };
    Some((addr, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes an address the way the kernel prints it on this machine.
    fn v4(addr: [u8; 4], port: u16) -> String {
        format!("{:08X}:{port:04X}", u32::from_ne_bytes(addr))
    }

    fn v6(addr: std::net::Ipv6Addr, port: u16) -> String {
        let words: String = addr
            .octets()
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        format!("{words}:{port:04X}")
    }

    fn table(rows: &[(String, String, &str)]) -> String {
        let mut text = "  sl  local_address rem_address   st tx_queue rx_queue\n".to_owned();
        for (i, (local, remote, st)) in rows.iter().enumerate() {
            text.push_str(&format!(
                "{i:4}: {local} {remote} {st} 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000000000000000 100 0 0 10 0\n"
            ));
        }
        text
    }

    #[test]
    fn tcp_listeners_only_and_addresses_decoded() {
        let text = table(&[
            (v4([0, 0, 0, 0], 22), v4([0, 0, 0, 0], 0), "0A"),
            (v4([203, 0, 113, 1], 8080), v4([0, 0, 0, 0], 0), "0A"),
            (v4([127, 0, 0, 1], 8081), v4([0, 0, 0, 0], 0), "0A"),
            // An established connection is not a listener.
            (v4([203, 0, 113, 1], 22), v4([198, 51, 100, 9], 50000), "01"),
        ]);
        let got = parse(&text, Protocol::Tcp);
        let seen: Vec<(IpAddr, u16)> = got.iter().map(|s| (s.address, s.port)).collect();
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        assert_eq!(
            seen,
            [
                (any, 22),
                (IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)), 8080),
                (IpAddr::V4(Ipv4Addr::LOCALHOST), 8081),
            ]
        );
    }

    #[test]
    fn udp_unconnected_only() {
        let text = table(&[
            (v4([0, 0, 0, 0], 51820), v4([0, 0, 0, 0], 0), "07"),
            (v4([10, 0, 0, 5], 40000), v4([10, 0, 0, 1], 53), "01"),
        ]);
        let got = parse(&text, Protocol::Udp);
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].address, got[0].port),
            (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 51820)
        );
    }

    #[test]
    fn ipv6_any_and_mapped_read_as_ipv4_and_other_ipv6_addresses_are_kept() {
        let text = table(&[
            (
                v6(Ipv6Addr::UNSPECIFIED, 10250),
                v6(Ipv6Addr::UNSPECIFIED, 0),
                "0A",
            ),
            (
                v6(Ipv4Addr::new(203, 0, 113, 1).to_ipv6_mapped(), 443),
                v6(Ipv6Addr::UNSPECIFIED, 0),
                "0A",
            ),
            (
                v6("2001:db8:203::1".parse().expect("v6"), 9000),
                v6(Ipv6Addr::UNSPECIFIED, 0),
                "0A",
            ),
        ]);
        let got = parse(&text, Protocol::Tcp);
        let seen: Vec<(IpAddr, u16)> = got.iter().map(|s| (s.address, s.port)).collect();
        assert_eq!(
            seen,
            [
                (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 10250),
                (IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)), 443),
                ("2001:db8:203::1".parse().expect("v6"), 9000),
            ]
        );
    }

    #[test]
    fn the_agents_own_tcp_listeners_are_named_as_the_agents() {
        let sock = |protocol, port| HostSocket {
            protocol,
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port,
            holder: None,
        };
        let mut sockets = vec![
            sock(Protocol::Tcp, 9090),
            sock(Protocol::Udp, 9090),
            sock(Protocol::Tcp, 22),
        ];
        name_agent_sockets(&mut sockets, &[8081, 9090]);
        assert_eq!(
            sockets[0].holder.as_deref(),
            Some("the kuport agent's health and metrics listener 0.0.0.0:9090")
        );
        assert_eq!(sockets[1].holder, None, "a UDP socket is not the agent's");
        assert_eq!(sockets[2].holder, None);
    }

    #[test]
    fn garbage_lines_are_skipped_not_fatal() {
        let text = "header\nnot a socket line\n  0: zz:zz 00000000:0000 0A\n";
        assert!(parse(text, Protocol::Tcp).is_empty());
    }

    #[test]
    fn this_process_listener_is_found_in_its_own_namespace() {
        // An unprivileged check against the real kernel format: a listener this test opens is
        // in the table, with its port.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let got = read(Path::new("/proc/self/net")).expect("read /proc/self/net");
        assert!(
            got.iter().any(|s| s.protocol == Protocol::Tcp
                && s.address == Ipv4Addr::LOCALHOST
                && s.port == port),
            "listener 127.0.0.1:{port} not in {got:?}"
        );
    }
}
