//! Links, addresses, ip rules and routes, reconciled by comparison (netlink objects have no
//! transactions), and the host facts read the same way. The decisions live here, over the
//! [`Netlink`] trait; [`kernel::RtNetlink`] speaks to the kernel and a fake (in tests) holds the
//! same objects in memory, so the decisions are tested without root.

pub mod events;
#[cfg(test)]
pub(crate) mod fake;
pub mod kernel;
pub mod netconf;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use kuport_core::ir::{
    Family, IpRule, LINK_PREFIX, LINK_TABLE_BASE, Link, MarkLayout, PREF_LOOP_GUARD, PREF_REPLY,
    Route,
};
use kuport_core::snapshot::HostFacts;

use crate::error::{HostError, HostStage};
use crate::report::ApplyReport;

pub use kernel::RtNetlink;

fn nl(
    stage: HostStage,
    op: &'static str,
    object: impl Into<String>,
) -> impl FnOnce(rtnetlink::Error) -> HostError {
    let object = object.into();
    move |source| HostError::Netlink {
        stage,
        op,
        object,
        source,
    }
}

/// A link as the kernel reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelLink {
    pub index: u32,
    pub name: String,
    pub mtu: Option<u32>,
    pub up: bool,
    pub vxlan: Option<VxlanFacts>,
    pub rp_filter: Option<i32>,
    pub src_valid_mark: Option<i32>,
}

/// The VXLAN attributes kuport sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VxlanFacts {
    pub vni: Option<u32>,
    pub port: Option<u16>,
    pub local: Option<Ipv4Addr>,
    pub remote: Option<Ipv4Addr>,
    pub dev: Option<u32>,
    pub ttl: Option<u8>,
    pub learning: Option<bool>,
}

/// An ip rule as the kernel lists it (any rule, kuport's or not; either family).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRule {
    pub family: Family,
    pub priority: u32,
    pub fwmark: Option<u32>,
    /// `u32::MAX` when the rule carries no mask (the kernel's default).
    pub fwmask: u32,
    pub table: u32,
    pub to: Option<IpNet>,
}

/// A route as the kernel lists it (any table, either family).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRoute {
    pub table: u32,
    pub to: Option<IpNet>,
    pub via: Option<IpAddr>,
    pub oif: Option<u32>,
}

/// One per-device IPv4 setting kuport writes (through netlink: a container's `/proc/sys` is
/// read-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevConf {
    RpFilter(i32),
    SrcValidMark(i32),
}

/// The netlink requests the host layer makes, one method per request. Listing returns plain
/// types; deletion takes the handle listed with the object (the kernel's own message), so what
/// is deleted is exactly what was listed.
pub trait Netlink: Send + Sync {
    /// What deletes a listed rule.
    type RuleHandle: Send;
    /// What deletes a listed route.
    type RouteHandle: Send;

    fn links(&self) -> impl Future<Output = Result<Vec<KernelLink>, rtnetlink::Error>> + Send;
    /// Addresses of both families (with prefix) by link index, in the kernel's order.
    fn addresses(
        &self,
    ) -> impl Future<Output = Result<BTreeMap<u32, Vec<IpNet>>, rtnetlink::Error>> + Send;
    /// Creates `want` as a VXLAN device bound to `dev_index`, down, with [`link_mac`].
    fn create_vxlan(
        &self,
        want: &Link,
        dev_index: u32,
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    fn delete_link(&self, index: u32) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    /// Deletes one address of a link.
    fn delete_address(
        &self,
        index: u32,
        address: IpNet,
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    /// Adds an address to a link (an IPv6 one without duplicate address detection).
    fn add_address(
        &self,
        index: u32,
        address: IpNet,
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    fn set_mtu(
        &self,
        index: u32,
        mtu: u32,
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    fn set_up(&self, index: u32) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    fn set_down(&self, index: u32) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    /// Adds (or replaces) a permanent neighbour entry: `address` is at `mac` on link `index`.
    fn set_neighbour(
        &self,
        index: u32,
        address: IpAddr,
        mac: [u8; 6],
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    fn set_devconf(
        &self,
        index: u32,
        setting: DevConf,
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    #[allow(clippy::type_complexity)]
    fn rules(
        &self,
    ) -> impl Future<Output = Result<Vec<(KernelRule, Self::RuleHandle)>, rtnetlink::Error>> + Send;
    fn delete_rule(
        &self,
        rule: Self::RuleHandle,
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    fn add_rule(&self, rule: &IpRule) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    #[allow(clippy::type_complexity)]
    fn routes(
        &self,
    ) -> impl Future<Output = Result<Vec<(KernelRoute, Self::RouteHandle)>, rtnetlink::Error>> + Send;
    fn delete_route(
        &self,
        route: Self::RouteHandle,
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
    fn add_route(
        &self,
        route: &Route,
        oif: u32,
    ) -> impl Future<Output = Result<(), rtnetlink::Error>> + Send;
}

/// Every link on the host.
pub async fn links(net: &impl Netlink) -> Result<Vec<KernelLink>, HostError> {
    net.links()
        .await
        .map_err(nl(HostStage::Links, "list", "links"))
}

async fn addresses(
    net: &impl Netlink,
    stage: HostStage,
) -> Result<BTreeMap<u32, Vec<IpNet>>, HostError> {
    net.addresses()
        .await
        .map_err(nl(stage, "list", "addresses"))
}

/// Reads the facts the plan needs: each named interface's first IPv4 address, the device (and
/// its MTU) holding `internal_ip`, and the id each kuport link already carries (its routing
/// table's number).
pub async fn facts(
    net: &impl Netlink,
    interfaces: &[String],
    internal_ip: Option<Ipv4Addr>,
    marks: MarkLayout,
) -> Result<HostFacts, HostError> {
    let stage = HostStage::Facts;
    let links = net.links().await.map_err(nl(stage, "list", "links"))?;
    let addrs = addresses(net, stage).await?;
    let mut facts = HostFacts {
        marks,
        ..HostFacts::default()
    };
    let names: BTreeMap<u32, String> = links.iter().map(|l| (l.index, l.name.clone())).collect();
    for (route, _) in owned_routes(net, &names, stage).await? {
        if let Some(id) = marks.link_id_of_table(route.table)
            && route.dev.starts_with(LINK_PREFIX)
        {
            facts.link_ids.insert(route.dev, id);
        }
    }
    for name in interfaces {
        let Some(found) = links
            .iter()
            .find(|l| &l.name == name)
            .and_then(|l| addrs.get(&l.index))
        else {
            continue;
        };
        if let Some(v4) = found.iter().find_map(|n| match n.addr() {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }) {
            facts.interfaces.insert(name.clone(), v4);
        }
        if let Some(v6) = found.iter().find_map(|n| published_v6(n.addr())) {
            facts.interfaces6.insert(name.clone(), v6);
        }
    }
    let mut local: Vec<IpAddr> = addrs.values().flatten().map(|n| n.addr()).collect();
    local.sort();
    local.dedup();
    facts.local_addresses = local;
    // Host-length prefixes are a service's or a VIP's (kube-ipvs0 holds every ClusterIP so),
    // not an address the host sends from on a segment.
    let mut segment: Vec<IpAddr> = addrs
        .values()
        .flatten()
        .filter(|n| n.prefix_len() < n.max_prefix_len())
        .map(|n| n.addr())
        .collect();
    segment.sort();
    segment.dedup();
    facts.segment_addresses = segment;
    if let Some(ip) = internal_ip {
        let holder = addrs
            .iter()
            .find(|(_, nets)| nets.iter().any(|n| n.addr() == IpAddr::V4(ip)))
            .map(|(i, _)| *i);
        if let Some(link) = holder.and_then(|i| links.iter().find(|l| l.index == i)) {
            facts.underlay_device = Some(link.name.clone());
            facts.underlay_mtu = link.mtu;
        }
    }
    let underlay = facts
        .underlay_device
        .as_deref()
        .and_then(|name| links.iter().find(|l| l.name == name))
        .map(|l| (l.name.as_str(), l.up));
    facts
        .node_checks
        .push(crate::node_checks::internal_ip(internal_ip, underlay));
    Ok(facts)
}

/// An interface's IPv6 address a mapping may publish: one a client can reach (not link-local,
/// loopback, multicast or unspecified, nor kuport's stand-in block), the first the kernel
/// lists.
fn published_v6(addr: IpAddr) -> Option<Ipv6Addr> {
    let IpAddr::V6(a) = addr else { return None };
    let usable = !(a.is_unicast_link_local()
        || a.is_loopback()
        || a.is_multicast()
        || a.is_unspecified()
        || kuport_core::ir::in_any_stand_in_block(addr));
    usable.then_some(a)
}

fn link_matches(k: &KernelLink, want: &Link, dev_index: u32) -> bool {
    let Some(v) = &k.vxlan else { return false };
    v.vni == Some(want.vni)
        && v.port == Some(want.port)
        && v.local == Some(want.local)
        && v.remote == Some(want.remote)
        && v.dev == Some(dev_index)
        && v.ttl.is_none_or(|t| t == want.ttl)
        && v.learning != Some(true)
}

/// What [`ensure_links`] did, and what is left for [`bring_up`] once the guard is in place.
#[derive(Debug, Default)]
pub struct Ensured {
    /// Links the kernel refused, each with its error.
    pub failed: Vec<(String, HostError)>,
    /// Links whose address was (re)written: their peer's neighbour entry is written again.
    pub readdressed: BTreeSet<String>,
}

/// Creates or repairs every desired link (device, address, MTU, rp_filter), but never brings
/// one up: a VXLAN device opens its UDP socket only when it comes up, and it must not before
/// the nftables transaction that guards its port has been committed ([`bring_up`] does that
/// after it). Unwanted links are removed separately by [`remove_unwanted_links`]. A link the
/// kernel refuses (its underlay device missing, its VNI held by a foreign device) is skipped
/// and returned with its error, so one bad link does not stall the others.
pub async fn ensure_links(
    net: &impl Netlink,
    desired: &[Link],
    report: &mut ApplyReport,
) -> Ensured {
    let mut out = Ensured::default();
    if desired.is_empty() {
        return out;
    }
    let mut current = match links(net).await {
        Ok(current) => current,
        Err(e) => {
            // Nothing can be checked: every link counts as refused, the error said once.
            let mut first = Some(e);
            for want in desired {
                let err = first.take().unwrap_or_else(|| HostError::Missing {
                    stage: HostStage::Links,
                    what: format!("link {}: listing links failed", want.name),
                });
                out.failed.push((want.name.clone(), err));
            }
            return out;
        }
    };
    for want in desired {
        match ensure_link(net, want, &mut current, report).await {
            Ok(true) => {
                out.readdressed.insert(want.name.clone());
            }
            Ok(false) => {}
            Err(e) => out.failed.push((want.name.clone(), e)),
        }
    }
    out
}

/// Brings every link of `desired` up (its port is guarded now) and writes the peer's neighbour
/// entry on each link that came up (coming up flushes a device's neighbours) or was
/// readdressed.
pub async fn bring_up(
    net: &impl Netlink,
    desired: &[Link],
    readdressed: &BTreeSet<String>,
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    if desired.is_empty() {
        return Ok(());
    }
    let stage = HostStage::Links;
    let current = links(net).await?;
    for want in desired {
        let Some(k) = current.iter().find(|l| l.name == want.name) else {
            continue;
        };
        if !k.up {
            net.set_up(k.index)
                .await
                .map_err(nl(stage, "set up", &want.name))?;
            report.links_updated += 1;
        }
        if !k.up || readdressed.contains(&want.name) {
            // The peer's MAC is known (`link_mac` at its end), so no packet waits on ARP. Both
            // ends build a link at about the same time; when one end's first ARP request left
            // before the other end's device existed, the kernel asked again only after its 1 s
            // retransmit time, and the first answers through a new serving edge took 1.1 s.
            let peers = std::iter::once(IpAddr::V4(want.peer_address))
                .chain(want.peer_address6.map(IpAddr::V6));
            for peer in peers {
                net.set_neighbour(k.index, peer, peer_mac(want))
                    .await
                    .map_err(nl(stage, "set the peer's neighbour entry on", &want.name))?;
            }
        }
    }
    Ok(())
}

/// Takes down every `kup-*` link that is up while `guarded` says the kernel holds no guard
/// for its port: what is left when a transaction failed after someone removed kuport's table.
/// Down, a VXLAN device holds no socket, so nothing reaches its port; the next pass whose
/// transaction succeeds brings it up again. Returns the links taken down.
pub async fn take_down_unguarded(
    net: &impl Netlink,
    guarded: impl Fn(u16) -> bool,
    report: &mut ApplyReport,
) -> Result<Vec<String>, HostError> {
    let mut down = Vec::new();
    for k in links(net).await? {
        let port = k.vxlan.as_ref().and_then(|v| v.port).unwrap_or(4789);
        if !k.name.starts_with(LINK_PREFIX) || !k.up || guarded(port) {
            continue;
        }
        net.set_down(k.index)
            .await
            .map_err(nl(HostStage::Links, "set down", &k.name))?;
        report.links_updated += 1;
        down.push(k.name);
    }
    Ok(down)
}

/// Creates or repairs one link; true when its address was (re)written.
async fn ensure_link(
    net: &impl Netlink,
    want: &Link,
    current: &mut Vec<KernelLink>,
    report: &mut ApplyReport,
) -> Result<bool, HostError> {
    let device = want.device.as_deref().ok_or_else(|| HostError::Missing {
        stage: HostStage::Links,
        what: format!(
            "link {}: the underlay device holding {} is unknown",
            want.name, want.local
        ),
    })?;
    let dev_index = current
        .iter()
        .find(|l| l.name == device)
        .map(|l| l.index)
        .ok_or_else(|| HostError::Missing {
            stage: HostStage::Links,
            what: format!("link {}: underlay device {device} not present", want.name),
        })?;
    let existing = current.iter().find(|l| l.name == want.name).cloned();
    let needs_create = match &existing {
        Some(k) if link_matches(k, want, dev_index) => false,
        Some(k) => {
            net.delete_link(k.index)
                .await
                .map_err(nl(HostStage::Links, "delete", &want.name))?;
            report.links_deleted += 1;
            true
        }
        None => true,
    };
    if needs_create {
        create_vxlan(net, want, dev_index, current).await?;
        report.links_created += 1;
        *current = links(net).await?;
    }
    let Some(k) = current.iter().find(|l| l.name == want.name).cloned() else {
        return Err(HostError::Missing {
            stage: HostStage::Links,
            what: format!("link {} vanished after creation", want.name),
        });
    };
    configure_link(net, want, &k, report).await
}

/// The MAC address of a link, fixed by its local address (a locally administered unicast
/// address: 02:6b:70 and the address's last three octets). A link that is recreated (its mesh
/// device restarted, or someone deleted it) comes back with the same MAC, so the peer's ARP
/// entry for it stays right; a random MAC left the path dead until the peer's entry went stale
/// (measured in the lab: about 30 s without replies).
pub fn link_mac(link: &Link) -> [u8; 6] {
    mac_of(link.address.addr())
}

/// The MAC address of the link's other end, which its node gave it by [`link_mac`] from its own
/// end of the /31.
pub fn peer_mac(link: &Link) -> [u8; 6] {
    mac_of(link.peer_address)
}

fn mac_of(address: Ipv4Addr) -> [u8; 6] {
    let o = address.octets();
    [0x02, 0x6b, 0x70, o[1], o[2], o[3]]
}

async fn create_vxlan(
    net: &impl Netlink,
    want: &Link,
    dev_index: u32,
    current: &[KernelLink],
) -> Result<(), HostError> {
    let Err(e) = net.create_vxlan(want, dev_index).await else {
        return Ok(());
    };
    // The kernel keys a VXLAN device by VNI and port: name the device that holds them.
    let holder = current.iter().find(|l| {
        l.name != want.name
            && l.vxlan
                .as_ref()
                .is_some_and(|v| v.vni == Some(want.vni) && v.port.unwrap_or(4789) == want.port)
    });
    Err(match holder {
        Some(h) => HostError::VniHeld {
            link: want.name.clone(),
            vni: want.vni,
            port: want.port,
            holder: h.name.clone(),
        },
        None => nl(HostStage::Links, "create", &want.name)(e),
    })
}

/// Address, MTU and rp_filter of one link (not its up flag: [`bring_up`]); true when the
/// address was (re)written.
async fn configure_link(
    net: &impl Netlink,
    want: &Link,
    k: &KernelLink,
    report: &mut ApplyReport,
) -> Result<bool, HostError> {
    let stage = HostStage::Links;
    let addrs = addresses(net, stage).await?;
    // The kernel's own IPv6 link-local address of the device is not kuport's to touch.
    let have: Vec<IpNet> = addrs
        .get(&k.index)
        .into_iter()
        .flatten()
        .filter(|n| !matches!(n.addr(), IpAddr::V6(a) if a.is_unicast_link_local()))
        .copied()
        .collect();
    let want_addrs: Vec<IpNet> = std::iter::once(IpNet::V4(want.address))
        .chain(want.address6.map(IpNet::V6))
        .collect();
    let readdress = have.len() != want_addrs.len() || have.iter().any(|a| !want_addrs.contains(a));
    if readdress {
        for gone in have.iter().filter(|a| !want_addrs.contains(a)) {
            net.delete_address(k.index, *gone).await.map_err(nl(
                stage,
                "delete an address of",
                &want.name,
            ))?;
        }
        for new in want_addrs.iter().filter(|a| !have.contains(a)) {
            net.add_address(k.index, *new).await.map_err(nl(
                stage,
                "add an address to",
                &want.name,
            ))?;
        }
        report.links_updated += 1;
    }
    if let Some(mtu) = want.mtu.filter(|m| k.mtu != Some(*m)) {
        net.set_mtu(k.index, mtu)
            .await
            .map_err(nl(stage, "set mtu of", &want.name))?;
        report.links_updated += 1;
    }
    let rp_filter = i32::from(want.rp_filter);
    if k.rp_filter != Some(rp_filter) {
        net.set_devconf(k.index, DevConf::RpFilter(rp_filter))
            .await
            .map_err(nl(stage, "set rp_filter of", &want.name))?;
        report.links_updated += 1;
    }
    Ok(readdress)
}

/// Deletes every `kup-*` link not in `desired`.
pub async fn remove_unwanted_links(
    net: &impl Netlink,
    desired: &[Link],
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    let wanted: BTreeSet<&str> = desired.iter().map(|l| l.name.as_str()).collect();
    for k in links(net).await? {
        if k.name.starts_with(LINK_PREFIX) && !wanted.contains(k.name.as_str()) {
            net.delete_link(k.index)
                .await
                .map_err(nl(HostStage::Links, "delete", &k.name))?;
            report.links_deleted += 1;
        }
    }
    Ok(())
}

/// Routing tables kuport owns: `0x6b70xxxx`.
fn in_table_space(table: u32) -> bool {
    table & 0xffff_0000 == LINK_TABLE_BASE
}

/// An ip rule is kuport's when it sits at one of kuport's priorities and matches a mark under
/// kuport's mask, or carries a mark of the layout before marks were masked (`0x6b70xxxx` under
/// the full mask), which an upgrade must clean away.
fn owned_rule(priority: u32, fwmark: u32, fwmask: u32, marks: MarkLayout) -> bool {
    let ours = priority == PREF_LOOP_GUARD || priority == PREF_REPLY;
    let legacy = fwmask == u32::MAX && fwmark & 0xffff_0000 == LINK_TABLE_BASE;
    ours && (legacy || (fwmask == marks.mask && fwmark & !marks.mask == 0 && fwmark != 0))
}

/// kuport's ip rules as the kernel holds them, each with its handle (for deletion).
async fn owned_rules<N: Netlink>(
    net: &N,
    marks: MarkLayout,
) -> Result<Vec<(IpRule, N::RuleHandle)>, HostError> {
    let all = net
        .rules()
        .await
        .map_err(nl(HostStage::Rules, "list", "ip rules"))?;
    let owned = all.into_iter().filter_map(|(k, handle)| {
        let fwmark = k
            .fwmark
            .filter(|m| owned_rule(k.priority, *m, k.fwmask, marks))?;
        let rule = IpRule {
            family: k.family,
            priority: k.priority,
            fwmark,
            fwmask: k.fwmask,
            to: k.to,
            table: k.table,
        };
        Some((rule, handle))
    });
    Ok(owned.collect())
}

/// What brings the objects kuport owns (`current`, each with its kernel message) to `desired`:
/// those to delete (not desired, or a second copy of one), and the desired ones missing.
pub fn set_diff<T: Ord, M>(current: Vec<(T, M)>, desired: &[T]) -> (Vec<(T, M)>, Vec<&T>) {
    let want: BTreeSet<&T> = desired.iter().collect();
    let mut have: BTreeSet<T> = BTreeSet::new();
    let mut extra = Vec::new();
    for (object, msg) in current {
        if want.contains(&object) && !have.contains(&object) {
            have.insert(object);
        } else {
            extra.push((object, msg));
        }
    }
    let missing = desired.iter().filter(|d| !have.contains(*d)).collect();
    (extra, missing)
}

/// Brings kuport's ip rules to `desired`: deletes extras, adds what is missing.
pub async fn reconcile_rules(
    net: &impl Netlink,
    desired: &[IpRule],
    marks: MarkLayout,
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    let current = owned_rules(net, marks).await?;
    let (extra, missing) = set_diff(current, desired);
    for (rule, handle) in extra {
        net.delete_rule(handle).await.map_err(nl(
            HostStage::Rules,
            "delete",
            format!("ip rule {rule:?}"),
        ))?;
        report.rules_deleted += 1;
    }
    for rule in missing {
        net.add_rule(rule).await.map_err(nl(
            HostStage::Rules,
            "add",
            format!("ip rule {rule:?}"),
        ))?;
        report.rules_added += 1;
    }
    Ok(())
}

/// Every IPv4 route in kuport's tables, with its handle (for deletion).
async fn owned_routes<N: Netlink>(
    net: &N,
    names: &BTreeMap<u32, String>,
    stage: HostStage,
) -> Result<Vec<(Route, N::RouteHandle)>, HostError> {
    let all = net.routes().await.map_err(nl(stage, "list", "routes"))?;
    let owned = all
        .into_iter()
        .filter(|(k, _)| in_table_space(k.table))
        .map(|(k, handle)| {
            let route = Route {
                table: k.table,
                to: k.to,
                via: k.via.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                dev: k
                    .oif
                    .and_then(|i| names.get(&i).cloned())
                    .unwrap_or_default(),
            };
            (route, handle)
        });
    Ok(owned.collect())
}

/// Brings the routes of kuport's tables to `desired`.
pub async fn reconcile_routes(
    net: &impl Netlink,
    desired: &[Route],
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    let stage = HostStage::Routes;
    let kernel_links = net.links().await.map_err(nl(stage, "list", "links"))?;
    let names: BTreeMap<u32, String> = kernel_links
        .iter()
        .map(|l| (l.index, l.name.clone()))
        .collect();
    let current = owned_routes(net, &names, stage).await?;
    let (extra, missing) = set_diff(current, desired);
    for (route, handle) in extra {
        net.delete_route(handle)
            .await
            .map_err(nl(stage, "delete", format!("route {route:?}")))?;
        report.routes_deleted += 1;
    }
    for route in missing {
        let index = kernel_links
            .iter()
            .find(|l| l.name == route.dev)
            .map(|l| l.index)
            .ok_or_else(|| HostError::Missing {
                stage,
                what: format!(
                    "route in table {}: device {} not present",
                    route.table, route.dev
                ),
            })?;
        net.add_route(route, index)
            .await
            .map_err(nl(stage, "add", format!("route {route:?}")))?;
        report.routes_added += 1;
    }
    Ok(())
}

/// Sets `src_valid_mark` on each accepting interface, so the reverse-path check of a request
/// follows the packet mark the steering stage wrote (and kuport's fwmark rule to the main
/// table) when the node's own policy routing would send the client's reverse route elsewhere.
/// The flag changes nothing for packets without a mark; it is left set when kuport stops.
pub async fn ensure_valid_mark(
    net: &impl Netlink,
    interfaces: &[String],
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    if interfaces.is_empty() {
        return Ok(());
    }
    let current = links(net).await?;
    for name in interfaces {
        let Some(k) = current.iter().find(|l| &l.name == name) else {
            continue;
        };
        if k.src_valid_mark == Some(1) {
            continue;
        }
        net.set_devconf(k.index, DevConf::SrcValidMark(1))
            .await
            .map_err(nl(HostStage::Links, "set src_valid_mark of", name))?;
        report.links_updated += 1;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
