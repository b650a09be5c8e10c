//! Sysctl writes as host events, against the running kernel: a write of a sysctl a node check
//! reads (`rp_filter` of `all`, `default` or a `kup-*` link; `forwarding` of `all` in either
//! family) wakes the agent within a fraction of a second, as the kernel announces it
//! (`RTM_NEWNETCONF`). The control: writes the kernel announces just the same (another device's
//! `rp_filter` and `forwarding`, a `proxy_arp`, IPv6 `default.forwarding`) wake nothing, though
//! the raw netconf stream shows each arriving. Root only; own harness (see `netns/mod.rs`).

mod netns;

use std::process::ExitCode;
use std::time::Duration;

use kuport_host::netlink::netconf::{self, News};
use kuport_host::{HostEvent, HostEventKind, LinuxHost};
use netns::{block_on, child, namespace, sh};
use tokio::sync::mpsc::Receiver;

const TESTS: &[netns::Test] = &[(
    "a_write_of_a_checked_sysctl_is_an_event_and_other_netconf_changes_are_not",
    sysctl_events,
)];

const CHILDREN: &[netns::Test] = &[("sysctl_events", child_sysctl_events)];

fn main() -> ExitCode {
    netns::harness(TESTS, CHILDREN)
}

/// How long an announcement may take to reach the agent: it is sent as the write commits, so a
/// second is generous on a loaded test machine.
const EVENT_BOUND: Duration = Duration::from_secs(2);

/// How long nothing must arrive after a write that is not an event.
const QUIET: Duration = Duration::from_millis(500);

fn sysctl_events() {
    let ns = namespace("netconf");
    // The latencies measured, for the record (docs/decisions.md quotes them).
    eprint!("{}", child(&ns, "sysctl_events", &[]));
}

/// Every host event arriving within `quiet`.
async fn within(events: &mut Receiver<HostEvent>, quiet: Duration) -> Vec<HostEvent> {
    let deadline = tokio::time::Instant::now() + quiet;
    let mut seen = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout_at(deadline, events.recv()).await {
        seen.push(e);
    }
    seen
}

/// The raw netconf announcements arriving within `quiet`, as (family, device index, settings).
async fn announced(raw: &mut Receiver<News>, quiet: Duration) -> Vec<netconf::Netconf> {
    let deadline = tokio::time::Instant::now() + quiet;
    let mut seen = Vec::new();
    while let Ok(Some(news)) = tokio::time::timeout_at(deadline, raw.recv()).await {
        match news {
            News::Announced(found) => seen.extend(found),
            News::Lost => panic!("netconf announcements lost"),
        }
    }
    seen
}

/// Writes with `command` and waits for its host event: one sysctl event saying `what`, within
/// [`EVENT_BOUND`].
async fn event_of(events: &mut Receiver<HostEvent>, command: &str, what: &str) {
    let started = tokio::time::Instant::now();
    sh(command);
    match tokio::time::timeout_at(started + EVENT_BOUND, events.recv()).await {
        Ok(Some(e)) => {
            assert_eq!(
                (e.kind, e.what.as_str(), e.removed),
                (HostEventKind::Sysctl, what, false),
                "`{command}`"
            );
            println!("`{command}`: sysctl event after {:?}", started.elapsed());
        }
        other => panic!("`{command}`: no event within {EVENT_BOUND:?}: {other:?}"),
    }
    // A forwarding write announces every device too: one event for all of it.
    let more = within(events, QUIET).await;
    assert!(
        more.is_empty(),
        "`{command}`: more than one event: {more:?}"
    );
}

fn child_sysctl_events() {
    // A device named as kuport's links are (the event stream knows them by name), and another.
    sh(
        "ip link add kup-nc0 type veth peer name kup-nc1 && ip link add other0 type veth peer name other1",
    );
    sh(
        "sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0",
    );
    block_on(async {
        let host = LinuxHost::new().expect("host");
        let mut events = host.events().open(vec!["wt0".into()]).expect("subscribe");
        let mut raw = netconf::watch().expect("the raw netconf stream");
        let before = within(&mut events, QUIET).await;
        assert!(before.is_empty(), "events before any write: {before:?}");

        // The control: announced, not events.
        for command in [
            "sysctl -qw net.ipv4.conf.other0.rp_filter=1",
            "sysctl -qw net.ipv4.conf.other0.forwarding=1",
            "sysctl -qw net.ipv4.conf.kup-nc0.proxy_arp=1",
            "sysctl -qw net.ipv6.conf.default.forwarding=1",
        ] {
            sh(command);
            let got = within(&mut events, QUIET).await;
            assert!(got.is_empty(), "`{command}` woke the agent: {got:?}");
            let raw_seen = announced(&mut raw, Duration::from_millis(100)).await;
            assert!(
                !raw_seen.is_empty(),
                "`{command}`: the kernel announced nothing, so this control proves nothing"
            );
        }
        // A value written again unchanged is not announced at all.
        sh("sysctl -qw net.ipv4.conf.all.rp_filter=0");
        assert!(within(&mut events, QUIET).await.is_empty());

        event_of(
            &mut events,
            "sysctl -qw net.ipv4.conf.all.rp_filter=1",
            "net.ipv4.conf.all.rp_filter is now 1",
        )
        .await;
        event_of(
            &mut events,
            "sysctl -qw net.ipv4.conf.default.rp_filter=2",
            "net.ipv4.conf.default.rp_filter is now 2",
        )
        .await;
        event_of(
            &mut events,
            "sysctl -qw net.ipv4.conf.kup-nc0.rp_filter=1",
            "net.ipv4.conf.kup-nc0.rp_filter is now 1",
        )
        .await;
        event_of(
            &mut events,
            "sysctl -qw net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.forwarding is now 1",
        )
        .await;
        event_of(
            &mut events,
            "sysctl -qw net.ipv6.conf.all.forwarding=1",
            "net.ipv6.conf.all.forwarding is now 1",
        )
        .await;
        // A kup-* link made after the stream opened is known by its own link notification.
        sh("ip link add kup-nc2 type veth peer name kup-nc3");
        let link = within(&mut events, QUIET).await;
        assert!(
            link.iter().all(|e| e.kind == HostEventKind::Link),
            "a new link announced more than itself: {link:?}"
        );
        event_of(
            &mut events,
            "sysctl -qw net.ipv4.conf.kup-nc2.rp_filter=1",
            "net.ipv4.conf.kup-nc2.rp_filter is now 1",
        )
        .await;
    });
}
