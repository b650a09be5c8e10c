//! Probes across this node's return links: every link is probed from its own address to its
//! peer's over the link itself, so the mesh, the link port, VXLAN and both inner addresses are
//! exercised together, and the peer's agent answers (an answer also says its agent runs).
//!
//! Each link gets one UDP socket on its own link address and [`PROBE_PORT`], bound to the link's
//! device: it answers the peer's probes and sends its own, a small one every interval and a
//! full-size one (the link's whole MTU) now and then. It takes datagrams only from the peer's
//! link address arriving on the link itself, so a pod of either node cannot reach it with a
//! forged source, and nothing can use it to reflect traffic; an answer counts only when it
//! brings back its probe's unpredictable nonce and size ([`wire`]). The verdict and its
//! hysteresis are in [`verdict`].

pub mod verdict;
pub mod wire;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kuport_core::ir::Link;
use kuport_core::snapshot::LinkProbe;
use tokio::net::UdpSocket;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use verdict::{LinkVerdict, ProbeSettings};
use wire::Sent;

/// The UDP port of the probes, on link addresses only (never on a node's own addresses).
pub const PROBE_PORT: u16 = 4794;

/// One link to probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The link's device.
    pub device: String,
    /// Its class.
    pub class: String,
    /// The node at the other end.
    pub peer: String,
    /// This node's link address.
    pub local: Ipv4Addr,
    /// The peer's link address.
    pub peer_address: Ipv4Addr,
    /// The link's MTU, when known: the size of the full-size probe.
    pub mtu: Option<u32>,
}

impl ProbeTarget {
    /// The probe target of a link of the IR.
    pub fn of(link: &Link) -> Self {
        Self {
            device: link.name.clone(),
            class: link.class.clone(),
            peer: link.peer.clone(),
            local: link.address.addr(),
            peer_address: link.peer_address,
            mtu: link.mtu,
        }
    }
}

type Verdicts = Arc<Mutex<BTreeMap<(String, String), LinkVerdict>>>;

/// The probes of every link this node holds, one task each.
pub struct LinkProber {
    settings: ProbeSettings,
    verdicts: Verdicts,
    changed: Arc<Notify>,
    tasks: BTreeMap<String, (ProbeTarget, JoinHandle<()>)>,
}

impl LinkProber {
    /// A prober with no link yet.
    pub fn new(settings: ProbeSettings) -> Self {
        Self {
            settings,
            verdicts: Arc::default(),
            changed: Arc::new(Notify::new()),
            tasks: BTreeMap::new(),
        }
    }

    /// Probes exactly `targets` from now on: new links start, gone ones stop (their verdicts
    /// go with them), a link whose addresses or MTU changed starts over. Must run inside a
    /// Tokio runtime.
    pub fn follow(&mut self, targets: &[ProbeTarget]) {
        let wanted: BTreeMap<&str, &ProbeTarget> =
            targets.iter().map(|t| (t.device.as_str(), t)).collect();
        let stale: Vec<String> = self
            .tasks
            .iter()
            .filter(|(device, (target, _))| wanted.get(device.as_str()) != Some(&target))
            .map(|(device, _)| device.clone())
            .collect();
        for device in stale {
            if let Some((target, task)) = self.tasks.remove(&device) {
                task.abort();
                self.lock().remove(&(target.class, target.peer));
            }
        }
        for (device, target) in wanted {
            if self.tasks.contains_key(device) {
                continue;
            }
            let key = (target.class.clone(), target.peer.clone());
            let verdict = LinkVerdict::new(
                &target.class,
                &target.peer,
                &target.peer_address.to_string(),
            );
            self.lock().insert(key, verdict);
            let task = tokio::spawn(probe_link(
                target.clone(),
                self.settings.clone(),
                self.verdicts.clone(),
                self.changed.clone(),
            ));
            self.tasks.insert(device.to_owned(), (target.clone(), task));
        }
    }

    /// Every link's verdict, sorted by class then peer: the host facts of the next plan.
    pub fn facts(&self) -> Vec<LinkProbe> {
        self.lock().values().map(LinkVerdict::fact).collect()
    }

    /// Notified whenever a link's verdict changes.
    pub fn changed(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), LinkVerdict>> {
        // A task that panicked while holding the lock left whole verdicts behind: use them.
        self.verdicts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for LinkProber {
    fn drop(&mut self) {
        for (_, task) in self.tasks.values() {
            task.abort();
        }
    }
}

/// A probe sent and not answered yet.
struct Outstanding {
    probe: Sent,
    sent: Instant,
    full: Option<u32>,
}

/// Probes one link until aborted: binds its socket (retrying while the link address is not
/// there yet), then each round judges the last round's probes and sends the next.
async fn probe_link(
    target: ProbeTarget,
    settings: ProbeSettings,
    verdicts: Verdicts,
    changed: Arc<Notify>,
) {
    let peer = SocketAddr::V4(SocketAddrV4::new(target.peer_address, PROBE_PORT));
    let mut socket = bind(&target, settings.interval).await;
    let mut task = ProbeTask {
        key: (target.class.clone(), target.peer.clone()),
        target,
        peer,
        settings,
        verdicts,
        changed,
        small: None,
        full: None,
    };
    let jitter = Jitter::new(&task.target.device);
    // Room for any datagram (nothing is cut short), but never zeroed: the kernel writes only
    // what arrives, so a link's buffer costs the pages its probes touch, not 64 KiB resident
    // on each of hundreds of links.
    let mut buf: Vec<u8> = Vec::with_capacity(RECEIVE_CAPACITY);
    let mut round: u64 = 0;
    let mut next = Instant::now() + jitter.start(task.settings.interval);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {
                round += 1;
                if task.round(&socket, round).await == Device::Gone {
                    rebind(&mut socket, &task.target);
                }
                next = Instant::now() + jitter.interval(task.settings.interval, round);
            }
            received = receive(&socket, &mut buf) => {
                if let Ok(from) = received && from == peer {
                    task.received(&socket, &mut buf).await;
                }
            }
        }
    }
}

/// Whether the device a probe socket is bound to is still there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Device {
    Present,
    /// A send failed with ENODEV: the kernel no longer has the device the socket was bound to
    /// (by its index).
    Gone,
}

/// Binds a new socket to the link's device when one of its name exists again: a link deleted
/// and made again (a restarted mesh daemon takes every link bound to its device, the agent
/// rebuilds them) is a new device with a new index, which the old socket never hears from.
/// Until it exists the old socket stays, its probes going unanswered, as the link's are.
fn rebind(socket: &mut UdpSocket, target: &ProbeTarget) {
    let local = SocketAddr::V4(SocketAddrV4::new(target.local, PROBE_PORT));
    match open(&target.device, local) {
        Ok(new) => {
            tracing::debug!(device = %target.device, "link probe socket bound to the link made again");
            *socket = new;
        }
        Err(e) => {
            tracing::debug!(device = %target.device, "binding the link probe to {local} on {} again: {e}", target.device);
        }
    }
}

/// The largest datagram a probe socket takes whole.
const RECEIVE_CAPACITY: usize = 65536;

/// Receives one datagram into `buf` (its contents replaced), from whom.
async fn receive(socket: &UdpSocket, buf: &mut Vec<u8>) -> std::io::Result<SocketAddr> {
    buf.clear();
    socket.recv_buf_from(buf).await.map(|(_, from)| from)
}

/// The link's probe socket, retrying every `retry` while the link or its address is not there
/// yet.
async fn bind(target: &ProbeTarget, retry: Duration) -> UdpSocket {
    let local = SocketAddr::V4(SocketAddrV4::new(target.local, PROBE_PORT));
    loop {
        match open(&target.device, local) {
            Ok(socket) => return socket,
            Err(e) => {
                tracing::debug!(
                    device = %target.device,
                    "binding the link probe to {local} on {}: {e}",
                    target.device
                );
                tokio::time::sleep(retry).await;
            }
        }
    }
}

/// A UDP socket on `local` bound to `device` before its address (SO_BINDTODEVICE), so not one
/// datagram arriving by another device is ever queued on it: the link address is a local
/// address, which the kernel would otherwise deliver from any interface, a pod's included.
fn open(device: &str, local: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    if let Err(e) = socket.bind_device(Some(device.as_bytes())) {
        if !without_device(&e) {
            return Err(e);
        }
        if !UNBOUND_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                "binding link probe sockets to their links: {e} (kernels before 5.7 allow it only with CAP_NET_RAW); probing without: answers still need the probe's nonce, but a probe forged from a pod is answered toward the peer"
            );
        }
    }
    socket.bind(&local.into())?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket.into())
}

/// One link's probing: its probes in flight and where its verdict goes.
struct ProbeTask {
    target: ProbeTarget,
    key: (String, String),
    peer: SocketAddr,
    settings: ProbeSettings,
    verdicts: Verdicts,
    changed: Arc<Notify>,
    small: Option<Outstanding>,
    full: Option<Outstanding>,
}

impl ProbeTask {
    /// Judges the last round's probes not answered by now as lost (a lost full-size probe
    /// counts only if its small one was answered: the verdict checks that), then sends this
    /// round's; says whether the socket's device is gone.
    async fn round(&mut self, socket: &UdpSocket, round: u64) -> Device {
        let now = Timestamp::now();
        let s = self.settings.clone();
        if self.small.take().is_some() {
            self.judge(|v| v.small(None, now, &s));
        }
        if let Some(probe) = self.full.take() {
            let size = probe.full.unwrap_or_default();
            self.judge(|v| v.full(false, size, now, &s));
        }
        let device;
        (self.small, device) = send(socket, self.peer, round * 2, None).await;
        if device == Device::Gone {
            return device;
        }
        let wants_full = self
            .lock()
            .get(&self.key)
            .is_some_and(|v| v.wants_full(round, &s));
        if let (true, Some(mtu)) = (wants_full, self.target.mtu) {
            let device;
            (self.full, device) = send(socket, self.peer, round * 2 + 1, Some(mtu)).await;
            return device;
        }
        Device::Present
    }

    /// A datagram from the peer's probe socket across the link: its probe, answered with the
    /// same bytes, or the answer to one of ours (which must bring back all of it).
    async fn received(&mut self, socket: &UdpSocket, packet: &mut [u8]) {
        if wire::answer_in_place(packet) {
            if let Err(e) = socket.send_to(packet, self.peer).await {
                tracing::debug!(device = %self.target.device, "answering a link probe: {e}");
            }
            return;
        }
        let s = self.settings.clone();
        let now = Timestamp::now();
        if let Some(probe) = self.small.take_if(|p| p.probe.answered_by(packet)) {
            let rtt = probe.sent.elapsed();
            self.judge(|v| v.small(Some(rtt), now, &s));
        } else if let Some(probe) = self.full.take_if(|p| p.probe.answered_by(packet)) {
            let size = probe.full.unwrap_or_default();
            self.judge(|v| v.full(true, size, now, &s));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), LinkVerdict>> {
        self.verdicts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies an outcome to the verdict; a changed verdict is logged and wakes the agent.
    fn judge(&self, outcome: impl FnOnce(&mut LinkVerdict) -> bool) {
        let fact = {
            let mut verdicts = self.lock();
            let Some(verdict) = verdicts.get_mut(&self.key) else {
                return;
            };
            if !outcome(verdict) {
                return;
            }
            verdict.fact()
        };
        tracing::info!(
            class = %fact.class,
            peer = %fact.peer,
            "return link {}: {}",
            if fact.up == Some(true) { "up" } else { "down" },
            fact.message.as_deref().unwrap_or("probes answered")
        );
        self.changed.notify_one();
    }
}

/// Sends one probe with a fresh nonce: small, or of `mtu` bytes of IP packet. A probe the
/// socket could not send still counts as lost at the next round, like one without an answer;
/// `None` (no probe at all, the verdict left as it stands) only when the OS gave no random
/// bytes for its nonce. Also says whether the send found the socket's device gone.
async fn send(
    socket: &UdpSocket,
    peer: SocketAddr,
    seq: u64,
    mtu: Option<u32>,
) -> (Option<Outstanding>, Device) {
    let probe = match Sent::new(seq, mtu) {
        Ok(probe) => probe,
        Err(e) => {
            tracing::warn!("no random bytes for the nonce of a link probe to {peer}: {e}");
            return (None, Device::Present);
        }
    };
    let sent = Instant::now();
    let mut device = Device::Present;
    if let Err(e) = socket.send_to(&probe.request(), peer).await {
        tracing::debug!("sending a link probe to {peer}: {e}");
        if e.raw_os_error() == Some(ENODEV) {
            device = Device::Gone;
        }
    }
    let outstanding = Outstanding {
        probe,
        sent,
        full: mtu,
    };
    (Some(outstanding), device)
}

/// `ENODEV`: what a send from a socket bound to a device the kernel no longer has fails with.
const ENODEV: i32 = 19;
/// `EPERM`.
const EPERM: i32 = 1;

/// Whether a socket refused its device is bound without one: only when the kernel refused the
/// agent the right (before Linux 5.7, binding to a device needed `CAP_NET_RAW`, which the agent
/// does not hold); a device not there yet is retried instead.
fn without_device(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(EPERM)
}

/// Whether the warning that probe sockets go without their device was logged (once per agent).
static UNBOUND_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Spreads the links' probes over the interval, so a node with many links does not send them
/// all at once: a start offset and a per-round jitter of up to a tenth of the interval, both
/// from the device name (stable across runs, different across links).
struct Jitter(u64);

impl Jitter {
    fn new(device: &str) -> Self {
        // FNV-1a: any stable spread will do.
        let hash = device.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        Self(hash)
    }

    fn start(&self, interval: Duration) -> Duration {
        let ms = interval.as_millis().max(1) as u64;
        Duration::from_millis(self.0 % ms)
    }

    fn interval(&self, interval: Duration, round: u64) -> Duration {
        let tenth = (interval.as_millis() / 10).max(1) as u64;
        let spread = self.0.rotate_left((round % 64) as u32) % (2 * tenth);
        interval + Duration::from_millis(spread) - Duration::from_millis(tenth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_is_bound_without_its_device_only_when_the_kernel_refuses_the_right() {
        let refused = std::io::Error::from_raw_os_error(EPERM);
        assert!(without_device(&refused));
        // A link not made yet: retried, never probed without its device.
        let absent = open("kup-absent", "127.0.0.1:0".parse().expect("an address"));
        let e = absent.expect_err("no such device");
        assert_eq!(e.raw_os_error(), Some(ENODEV), "{e}");
        assert!(!without_device(&e));
    }

    #[test]
    fn jitter_stays_within_a_tenth_of_the_interval() {
        let interval = Duration::from_secs(2);
        for device in ["kup-00000000", "kup-deadbeef", "kup-12345678"] {
            let j = Jitter::new(device);
            assert!(j.start(interval) < interval);
            for round in 0..200 {
                let d = j.interval(interval, round);
                assert!(d >= Duration::from_millis(1800) && d <= Duration::from_millis(2200));
            }
        }
    }
}
