//! The host settings kuport depends on, checked every pass and reported in the node's class rows
//! (`status.nodes[].checks`): `net.ipv4.ip_forward`, the effective `rp_filter` of kuport's links,
//! `src_valid_mark` on the interfaces that capture mapped ports (read from `/proc/sys` of the
//! agent's network namespace: a handful of small files), and whether the Node's InternalIP is
//! on a device that is up (from the links the facts already list). A setting that cannot be read
//! is reported as not checked, with why, never guessed.

use std::net::Ipv4Addr;
use std::path::Path;

use kuport_core::api::{NodeCheck, checks, valid_interface_name};

/// Where the sysctls are read: this process's network namespace's (the node's, for a
/// hostNetwork Pod).
pub const PROC_SYS: &str = "/proc/sys";

/// Devices named in a message before "and N more".
const NAMED: usize = 4;

/// The sysctl checks: ip_forward (and IPv6 forwarding when `serves_ipv6`: the node programs
/// IPv6 mappings), the rp_filter of `links` (kuport's link devices) and the src_valid_mark of
/// `capturing` (the interfaces that capture mapped ports), read under `proc_sys`.
pub fn sysctl_checks(
    proc_sys: &Path,
    links: &[String],
    capturing: &[String],
    serves_ipv6: bool,
) -> Vec<NodeCheck> {
    vec![
        ip_forward(proc_sys),
        ipv6_forward(proc_sys, serves_ipv6),
        rp_filter(proc_sys, links),
        src_valid_mark(proc_sys, capturing),
    ]
}

/// `net.ipv6.conf.all.forwarding`, on a node that programs IPv6 mappings: without it no IPv6
/// request reaches a pod (IPv4 mappings are not affected).
fn ipv6_forward(proc_sys: &Path, serves_ipv6: bool) -> NodeCheck {
    let name = checks::IPV6_FORWARD;
    if !serves_ipv6 {
        return check(
            name,
            None,
            "not checked: this node programs no IPv6 mapping".to_owned(),
        );
    }
    match read_int(proc_sys, "net/ipv6/conf/all/forwarding") {
        Ok(1) => check(
            name,
            Some(true),
            "net.ipv6.conf.all.forwarding is 1".to_owned(),
        ),
        Ok(v) => check(
            name,
            Some(false),
            format!(
                "net.ipv6.conf.all.forwarding is {v}: the node forwards no IPv6 packet, so no IPv6 client reaches a pod through it; set it to 1"
            ),
        ),
        Err(e) => check(name, None, format!("not checked: {e}")),
    }
}

fn check(name: &str, ok: Option<bool>, message: String) -> NodeCheck {
    NodeCheck {
        name: name.to_owned(),
        ok,
        message,
    }
}

/// One integer sysctl under `proc_sys`, `path` relative to it (`net/ipv4/ip_forward`); the
/// error says which file and why.
fn read_int(proc_sys: &Path, path: &str) -> Result<i64, String> {
    let file = proc_sys.join(path);
    let text =
        std::fs::read_to_string(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{} holds {:?}, not a number", file.display(), text.trim()))
}

/// A device's setting under `net/ipv4/conf/<device>/<key>`: only for a name kuport accepts as
/// an interface name (no `/`, no `..`), so the path never leaves the device's directory.
fn read_conf(proc_sys: &Path, device: &str, key: &str) -> Result<i64, String> {
    if !valid_interface_name(device) {
        return Err(format!("{device:?} is not an interface name"));
    }
    read_int(proc_sys, &format!("net/ipv4/conf/{device}/{key}"))
}

fn ip_forward(proc_sys: &Path) -> NodeCheck {
    match read_int(proc_sys, "net/ipv4/ip_forward") {
        Ok(1) => check(
            checks::IP_FORWARD,
            Some(true),
            "net.ipv4.ip_forward is 1".to_owned(),
        ),
        Ok(v) => check(
            checks::IP_FORWARD,
            Some(false),
            format!(
                "net.ipv4.ip_forward is {v}: the node forwards nothing, so no mapped request reaches a pod; set it to 1"
            ),
        ),
        Err(e) => check(checks::IP_FORWARD, None, format!("not checked: {e}")),
    }
}

/// "a, b, c, d and 2 more".
fn named(devices: &[String]) -> String {
    let mut text = devices
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if devices.len() > NAMED {
        text.push_str(&format!(" and {} more", devices.len() - NAMED));
    }
    text
}

/// The effective rp_filter of a device is the larger of `all`'s and its own (0 off, 1 strict,
/// 2 loose): strict drops a link's arrivals whose source is routed elsewhere (every client's).
fn rp_filter(proc_sys: &Path, links: &[String]) -> NodeCheck {
    let name = checks::RP_FILTER;
    if links.is_empty() {
        return check(
            name,
            None,
            "not checked: this node holds no kuport link yet".to_owned(),
        );
    }
    let all = match read_conf(proc_sys, "all", "rp_filter") {
        Ok(v) => v,
        Err(e) => return check(name, None, format!("not checked: {e}")),
    };
    let mut strict = Vec::new();
    let mut unread = Vec::new();
    for link in links {
        match read_conf(proc_sys, link, "rp_filter") {
            Ok(own) if all.max(own) == 1 => strict.push(link.clone()),
            Ok(_) => {}
            Err(e) => unread.push(e),
        }
    }
    if !strict.is_empty() {
        return check(
            name,
            Some(false),
            format!(
                "rp_filter is strict on {} (the larger of net.ipv4.conf.all.rp_filter={all} and the link's own): the link drops the clients' requests; something reset what kuport set (2, loose)",
                named(&strict)
            ),
        );
    }
    match unread.first() {
        Some(e) if unread.len() == links.len() => check(name, None, format!("not checked: {e}")),
        _ => check(
            name,
            Some(true),
            format!(
                "rp_filter is loose or off on kuport's {} link(s) (net.ipv4.conf.all.rp_filter={all})",
                links.len() - unread.len()
            ),
        ),
    }
}

/// src_valid_mark holds when `all`'s or the interface's own is 1 (the kernel ORs them): without
/// it, the reverse-path check of a captured request ignores kuport's mark.
fn src_valid_mark(proc_sys: &Path, capturing: &[String]) -> NodeCheck {
    let name = checks::SRC_VALID_MARK;
    if capturing.is_empty() {
        return check(
            name,
            None,
            "not checked: no interface of this node captures a mapped port yet".to_owned(),
        );
    }
    let all = read_conf(proc_sys, "all", "src_valid_mark").unwrap_or(0);
    let mut off = Vec::new();
    let mut unread = Vec::new();
    for iface in capturing {
        match read_conf(proc_sys, iface, "src_valid_mark") {
            Ok(own) if all == 1 || own == 1 => {}
            Ok(_) => off.push(iface.clone()),
            Err(e) => unread.push(e),
        }
    }
    if !off.is_empty() {
        return check(
            name,
            Some(false),
            format!(
                "src_valid_mark is 0 on {} (and in net.ipv4.conf.all): the reverse-path check of a captured request ignores kuport's mark; something reset what kuport set (1)",
                named(&off)
            ),
        );
    }
    match unread.first() {
        Some(e) if unread.len() == capturing.len() => {
            check(name, None, format!("not checked: {e}"))
        }
        _ => check(
            name,
            Some(true),
            format!(
                "src_valid_mark is 1 on the {} capturing interface(s)",
                capturing.len() - unread.len()
            ),
        ),
    }
}

/// Whether the Node's InternalIP (`None`: the Node has none) is an address of a device of this
/// host (`holder`: its name and whether it is up): return links are built between InternalIPs.
pub fn internal_ip(ip: Option<Ipv4Addr>, holder: Option<(&str, bool)>) -> NodeCheck {
    let name = checks::INTERNAL_IP;
    match (ip, holder) {
        (None, _) => check(
            name,
            Some(false),
            "the Node has no IPv4 InternalIP: no return link can reach this node".to_owned(),
        ),
        (Some(ip), None) => check(
            name,
            Some(false),
            format!(
                "no device of this host has the InternalIP {ip}: the other nodes send this node's link traffic where it does not arrive (set the kubelet's --node-ip to an address of this host)"
            ),
        ),
        (Some(ip), Some((device, false))) => check(
            name,
            Some(false),
            format!("the InternalIP {ip} is on {device}, which is down"),
        ),
        (Some(ip), Some((device, true))) => check(
            name,
            Some(true),
            format!("the InternalIP {ip} is on {device}, which is up"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/proc/sys` holding `files` (path relative to it, contents).
    fn proc_sys(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temporary directory");
        for (path, text) in files {
            let file = dir.path().join(path);
            std::fs::create_dir_all(file.parent().expect("a parent")).expect("directories");
            std::fs::write(file, format!("{text}\n")).expect("write");
        }
        dir
    }

    fn find<'a>(checks: &'a [NodeCheck], name: &str) -> &'a NodeCheck {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name} in {checks:?}"))
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_healthy_host_passes_every_check() {
        let dir = proc_sys(&[
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv4/conf/all/rp_filter", "1"),
            ("net/ipv4/conf/all/src_valid_mark", "0"),
            ("net/ipv4/conf/kup-1/rp_filter", "2"),
            ("net/ipv4/conf/wt0/src_valid_mark", "1"),
            ("net/ipv6/conf/all/forwarding", "1"),
        ]);
        let got = sysctl_checks(dir.path(), &names(&["kup-1"]), &names(&["wt0"]), true);
        assert_eq!(got.len(), 4);
        for c in &got {
            assert_eq!(c.ok, Some(true), "{c:?}");
        }
    }

    #[test]
    fn ipv6_forwarding_is_checked_only_where_ipv6_is_served() {
        let off = proc_sys(&[("net/ipv6/conf/all/forwarding", "0")]);
        let c = ipv6_forward(off.path(), true);
        assert_eq!(c.ok, Some(false));
        assert!(c.message.contains("forwarding is 0"), "{}", c.message);
        let c = ipv6_forward(off.path(), false);
        assert_eq!(c.ok, None, "no IPv6 mapping here: {}", c.message);
        let on = proc_sys(&[("net/ipv6/conf/all/forwarding", "1")]);
        assert_eq!(ipv6_forward(on.path(), true).ok, Some(true));
    }

    #[test]
    fn forwarding_off_fails() {
        let dir = proc_sys(&[("net/ipv4/ip_forward", "0")]);
        let got = sysctl_checks(dir.path(), &[], &[], false);
        let c = find(&got, checks::IP_FORWARD);
        assert_eq!(c.ok, Some(false));
        assert!(c.message.contains("ip_forward is 0"), "{}", c.message);
    }

    #[test]
    fn strict_rp_filter_is_the_larger_of_all_and_the_device() {
        // all=1 with the device at 0: strict. all=0 with the device at 1: strict. all=1, device 2:
        // loose.
        for (all, own, ok) in [
            ("1", "0", false),
            ("0", "1", false),
            ("1", "2", true),
            ("0", "0", true),
        ] {
            let dir = proc_sys(&[
                ("net/ipv4/conf/all/rp_filter", all),
                ("net/ipv4/conf/kup-1/rp_filter", own),
            ]);
            let c = rp_filter(dir.path(), &names(&["kup-1"]));
            assert_eq!(c.ok, Some(ok), "all={all} own={own}: {c:?}");
            if !ok {
                assert!(c.message.contains("kup-1"), "{}", c.message);
            }
        }
    }

    #[test]
    fn src_valid_mark_off_on_a_capturing_interface_fails_and_names_it() {
        let dir = proc_sys(&[
            ("net/ipv4/conf/all/src_valid_mark", "0"),
            ("net/ipv4/conf/enp1s0/src_valid_mark", "0"),
            ("net/ipv4/conf/wt0/src_valid_mark", "1"),
        ]);
        let c = src_valid_mark(dir.path(), &names(&["enp1s0", "wt0"]));
        assert_eq!(c.ok, Some(false));
        assert!(
            c.message.contains("enp1s0") && !c.message.contains("wt0"),
            "{}",
            c.message
        );
        // all=1 covers every interface.
        let dir = proc_sys(&[
            ("net/ipv4/conf/all/src_valid_mark", "1"),
            ("net/ipv4/conf/enp1s0/src_valid_mark", "0"),
        ]);
        assert_eq!(
            src_valid_mark(dir.path(), &names(&["enp1s0"])).ok,
            Some(true)
        );
    }

    #[test]
    fn what_cannot_be_read_is_not_checked_and_says_why() {
        let dir = proc_sys(&[("net/ipv4/ip_forward", "yes")]);
        let got = sysctl_checks(dir.path(), &names(&["kup-1"]), &[], false);
        for c in &got {
            assert_eq!(c.ok, None, "{c:?}");
            assert!(c.message.starts_with("not checked: "), "{}", c.message);
        }
        assert!(
            find(&got, checks::IP_FORWARD)
                .message
                .contains("not a number")
        );
        assert!(
            find(&got, checks::RP_FILTER)
                .message
                .contains("all/rp_filter")
        );
        // A name that would leave the device's directory is never read.
        let c = rp_filter(dir.path(), &names(&["../x"]));
        assert_eq!(c.ok, None);
    }

    #[test]
    fn the_internal_ip_must_be_on_a_device_that_is_up() {
        let ip = Some(Ipv4Addr::new(100, 64, 0, 1));
        assert_eq!(internal_ip(ip, Some(("wt0", true))).ok, Some(true));
        let down = internal_ip(ip, Some(("wt0", false)));
        assert_eq!(down.ok, Some(false));
        assert!(
            down.message.contains("wt0, which is down"),
            "{}",
            down.message
        );
        assert_eq!(internal_ip(ip, None).ok, Some(false));
        assert_eq!(internal_ip(None, None).ok, Some(false));
    }
}
