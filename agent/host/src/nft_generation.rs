//! The nftables ruleset generation: a number the kernel bumps on every committed nftables
//! transaction in the network namespace, whoever sends it. While it is unchanged, no rule, set,
//! element or chain changed anywhere, so kuport's table is what kuport last saw, and a
//! verifying pass need not list it (listing 5,000 mappings costs nft a few hundred
//! milliseconds). Counter increments are not transactions and do not bump it.
//!
//! The `nft` program does not print it, so it is asked for directly: one NFT_MSG_GETGEN
//! request on a netfilter netlink socket (about fifty lines here, against a binding to
//! libnftnl, which is GPL).

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETGEN`.
const GETGEN: u16 = (10 << 8) | 16;
/// `NFT_MSG_NEWGEN`, the answer.
const NEWGEN: u16 = (10 << 8) | 15;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
/// `NFTA_GEN_ID`.
const GEN_ID: u16 = 1;
const HEADER: usize = 16;
const NFGENMSG: usize = 4;

/// The current ruleset generation of this network namespace.
pub fn read() -> Result<u32, String> {
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(|e| format!("netlink socket: {e}"))?;
    socket
        .bind_auto()
        .map_err(|e| format!("binding the netlink socket: {e}"))?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(|e| format!("connecting the netlink socket: {e}"))?;
    socket
        .send(&request(), 0)
        .map_err(|e| format!("asking for the nftables generation: {e}"))?;
    let mut buf = Vec::with_capacity(4096);
    socket
        .recv(&mut buf, 0)
        .map_err(|e| format!("reading the nftables generation: {e}"))?;
    parse(&buf)
}

fn request() -> Vec<u8> {
    let len = (HEADER + NFGENMSG) as u32;
    let mut msg = Vec::with_capacity(HEADER + NFGENMSG);
    msg.extend_from_slice(&len.to_ne_bytes());
    msg.extend_from_slice(&GETGEN.to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
    // nfgenmsg: family AF_UNSPEC, version NFNETLINK_V0, resource id 0.
    msg.extend_from_slice(&[0, 0, 0, 0]);
    msg
}

/// The generation from a NEWGEN answer (or the error the kernel sent instead).
fn parse(buf: &[u8]) -> Result<u32, String> {
    let u16_at = |at: usize| {
        buf.get(at..at + 2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        buf.get(at..at + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let len = u32_at(0).ok_or("a short netlink answer")? as usize;
    match u16_at(4).ok_or("a short netlink answer")? {
        NEWGEN => {}
        NLMSG_ERROR => {
            let code = u32_at(HEADER).map_or(0, |c| c as i32);
            return Err(format!(
                "the kernel refused the generation request: {}",
                std::io::Error::from_raw_os_error(-code)
            ));
        }
        other => return Err(format!("an unexpected netlink answer of type {other}")),
    }
    let mut at = HEADER + NFGENMSG;
    while at + 4 <= len.min(buf.len()) {
        let alen = u16_at(at).ok_or("a short attribute")? as usize;
        let kind = u16_at(at + 2).ok_or("a short attribute")? & 0x7fff;
        if alen < 4 {
            break;
        }
        if kind == GEN_ID {
            let b = buf
                .get(at + 4..at + 8)
                .ok_or("a short generation attribute")?;
            return Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        }
        at += (alen + 3) & !3;
    }
    Err("the kernel's answer carries no generation".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(kind: u16, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![0u8; NFGENMSG];
        for (t, value) in attrs {
            let alen = (4 + value.len()) as u16;
            body.extend_from_slice(&alen.to_ne_bytes());
            body.extend_from_slice(&t.to_ne_bytes());
            body.extend_from_slice(value);
            while !body.len().is_multiple_of(4) {
                body.push(0);
            }
        }
        let mut msg = ((HEADER + body.len()) as u32).to_ne_bytes().to_vec();
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&body);
        msg
    }

    #[test]
    fn the_generation_is_read_from_its_attribute_in_network_order() {
        let buf = answer(
            NEWGEN,
            &[
                (2, 7u32.to_be_bytes().to_vec()),
                (GEN_ID, 0x0102_0304u32.to_be_bytes().to_vec()),
            ],
        );
        assert_eq!(parse(&buf), Ok(0x0102_0304));
        assert!(parse(&answer(NEWGEN, &[])).is_err());
        assert!(parse(&buf[..6]).is_err());
        let refused = answer(NLMSG_ERROR, &[]);
        let mut refused = refused;
        refused[HEADER..HEADER + 4].copy_from_slice(&(-1i32).to_ne_bytes());
        assert!(parse(&refused).unwrap_err().contains("refused"));
        assert_eq!(request().len(), HEADER + NFGENMSG);
    }
}
