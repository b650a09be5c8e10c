//! Links, addresses, ip rules and routes, reconciled by comparison through rtnetlink (netlink
//! objects have no transactions), and the host facts read the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use futures_util::TryStreamExt;
use ipnet::Ipv4Net;
use kuport_core::ir::{
    IpRule, LINK_PREFIX, LINK_TABLE_BASE, Link, MarkLayout, PREF_LOOP_GUARD, PREF_REPLY, Route,
};
use kuport_core::snapshot::HostFacts;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{
    AfSpecInet, AfSpecUnspec, InetDevConf, InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags,
    LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::{Handle, IpVersion, LinkUnspec, LinkVxlan, RouteMessageBuilder};

use crate::{ApplyReport, HostError, HostStage};

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
#[derive(Clone, Debug, Default)]
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

fn parse_link(msg: &LinkMessage) -> KernelLink {
    let mut link = KernelLink {
        index: msg.header.index,
        up: msg.header.flags.contains(LinkFlags::Up),
        ..Default::default()
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            LinkAttribute::LinkInfo(infos) => {
                let is_vxlan = infos
                    .iter()
                    .any(|i| matches!(i, LinkInfo::Kind(InfoKind::Vxlan)));
                for info in infos {
                    if let (true, LinkInfo::Data(InfoData::Vxlan(data))) = (is_vxlan, info) {
                        let mut v = VxlanFacts::default();
                        for d in data {
                            match d {
                                InfoVxlan::Id(id) => v.vni = Some(*id),
                                InfoVxlan::Port(p) => v.port = Some(*p),
                                InfoVxlan::Local(a) => v.local = Some(*a),
                                InfoVxlan::Group(a) => v.remote = Some(*a),
                                InfoVxlan::Link(i) => v.dev = Some(*i),
                                InfoVxlan::Ttl(t) => v.ttl = Some(*t),
                                InfoVxlan::Learning(l) => v.learning = Some(*l),
                                _ => {}
                            }
                        }
                        link.vxlan = Some(v);
                    }
                }
            }
            LinkAttribute::AfSpecUnspec(specs) => {
                for spec in specs {
                    if let AfSpecUnspec::Inet(inet) = spec {
                        for i in inet {
                            if let AfSpecInet::DevConf(conf) = i {
                                link.rp_filter = Some(conf.rp_filter);
                                link.src_valid_mark = Some(conf.src_vmark);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    link
}

/// Every link on the host.
pub async fn links(handle: &Handle) -> Result<Vec<KernelLink>, HostError> {
    let mut stream = handle.link().get().execute();
    let mut out = Vec::new();
    while let Some(msg) = stream
        .try_next()
        .await
        .map_err(nl(HostStage::Links, "list", "links"))?
    {
        out.push(parse_link(&msg));
    }
    Ok(out)
}

/// IPv4 addresses (with prefix) by link index.
pub async fn addresses(handle: &Handle) -> Result<BTreeMap<u32, Vec<Ipv4Net>>, HostError> {
    let mut stream = handle.address().get().execute();
    let mut out: BTreeMap<u32, Vec<Ipv4Net>> = BTreeMap::new();
    while let Some(msg) =
        stream
            .try_next()
            .await
            .map_err(nl(HostStage::Links, "list", "addresses"))?
    {
        if msg.header.family != AddressFamily::Inet {
            continue;
        }
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(IpAddr::V4(v)) => Some(*v),
            _ => None,
        });
        let addr = local.or_else(|| {
            msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V4(v)) => Some(*v),
                _ => None,
            })
        });
        if let Some(net) = addr.and_then(|a| Ipv4Net::new(a, msg.header.prefix_len).ok()) {
            out.entry(msg.header.index).or_default().push(net);
        }
    }
    Ok(out)
}

/// Reads the facts the plan needs: each named interface's first IPv4 address, the device (and
/// its MTU) holding `internal_ip`, and the id each kuport link already carries (its routing
/// table's number).
pub async fn facts(
    handle: &Handle,
    interfaces: &[String],
    internal_ip: Option<Ipv4Addr>,
    marks: MarkLayout,
) -> Result<HostFacts, HostError> {
    let links = links(handle).await?;
    let addrs = addresses(handle).await?;
    let mut facts = HostFacts {
        marks,
        ..HostFacts::default()
    };
    let names: BTreeMap<u32, String> = links.iter().map(|l| (l.index, l.name.clone())).collect();
    for (route, _) in owned_routes(handle, &names).await? {
        if let Some(id) = marks.link_id_of_table(route.table)
            && route.dev.starts_with(LINK_PREFIX)
        {
            facts.link_ids.insert(route.dev, id);
        }
    }
    for name in interfaces {
        let found = links
            .iter()
            .find(|l| &l.name == name)
            .and_then(|l| addrs.get(&l.index))
            .and_then(|a| a.first());
        if let Some(net) = found {
            facts.interfaces.insert(name.clone(), net.addr());
        }
    }
    if let Some(ip) = internal_ip {
        let holder = addrs
            .iter()
            .find(|(_, nets)| nets.iter().any(|n| n.addr() == ip))
            .map(|(i, _)| *i);
        if let Some(link) = holder.and_then(|i| links.iter().find(|l| l.index == i)) {
            facts.underlay_device = Some(link.name.clone());
            facts.underlay_mtu = link.mtu;
        }
    }
    Ok(facts)
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

/// Creates or repairs every desired link (device, address, MTU, up, rp_filter). Unwanted links
/// are removed separately, last, by [`remove_unwanted_links`]. A link the kernel refuses (its
/// underlay device missing, its VNI held by a foreign device) is skipped and returned with its
/// error, so one bad link does not stall the others.
pub async fn ensure_links(
    handle: &Handle,
    desired: &[Link],
    report: &mut ApplyReport,
) -> Vec<(String, HostError)> {
    let mut failed = Vec::new();
    if desired.is_empty() {
        return failed;
    }
    let mut current = match links(handle).await {
        Ok(current) => current,
        Err(e) => {
            // Nothing can be checked: every link counts as refused, the error said once.
            let mut all: Vec<(String, HostError)> = Vec::new();
            let mut first = Some(e);
            for want in desired {
                let err = first.take().unwrap_or_else(|| HostError::Missing {
                    stage: HostStage::Links,
                    what: format!("link {}: listing links failed", want.name),
                });
                all.push((want.name.clone(), err));
            }
            return all;
        }
    };
    for want in desired {
        if let Err(e) = ensure_link(handle, want, &mut current, report).await {
            failed.push((want.name.clone(), e));
        }
    }
    failed
}

async fn ensure_link(
    handle: &Handle,
    want: &Link,
    current: &mut Vec<KernelLink>,
    report: &mut ApplyReport,
) -> Result<(), HostError> {
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
            handle.link().del(k.index).execute().await.map_err(nl(
                HostStage::Links,
                "delete",
                &want.name,
            ))?;
            report.links_deleted += 1;
            true
        }
        None => true,
    };
    if needs_create {
        create_vxlan(handle, want, dev_index, current).await?;
        report.links_created += 1;
        *current = links(handle).await?;
    }
    let Some(k) = current.iter().find(|l| l.name == want.name).cloned() else {
        return Err(HostError::Missing {
            stage: HostStage::Links,
            what: format!("link {} vanished after creation", want.name),
        });
    };
    configure_link(handle, want, &k, report).await
}

/// The MAC address of a link, fixed by its local address (a locally administered unicast
/// address: 02:6b:70 and the address's last three octets). A link that is recreated (its mesh
/// device restarted, or someone deleted it) comes back with the same MAC, so the peer's ARP
/// entry for it stays right; a random MAC left the path dead until the peer's entry went stale
/// (measured in the lab: about 30 s without replies).
pub fn link_mac(link: &Link) -> [u8; 6] {
    let o = link.address.addr().octets();
    [0x02, 0x6b, 0x70, o[1], o[2], o[3]]
}

async fn create_vxlan(
    handle: &Handle,
    want: &Link,
    dev_index: u32,
    current: &[KernelLink],
) -> Result<(), HostError> {
    let msg = LinkVxlan::new(&want.name, want.vni)
        .dev(dev_index)
        .local(want.local)
        .remote(want.remote)
        .port(want.port)
        .ttl(want.ttl)
        .learning(false)
        .address(link_mac(want).to_vec())
        .build();
    match handle.link().add(msg).execute().await {
        Ok(()) => Ok(()),
        Err(e) => {
            // The kernel keys a VXLAN device by VNI and port: name the device that holds them.
            let holder = current.iter().find(|l| {
                l.name != want.name
                    && l.vxlan.as_ref().is_some_and(|v| {
                        v.vni == Some(want.vni) && v.port.unwrap_or(4789) == want.port
                    })
            });
            match holder {
                Some(h) => Err(HostError::VniHeld {
                    link: want.name.clone(),
                    vni: want.vni,
                    port: want.port,
                    holder: h.name.clone(),
                }),
                None => Err(HostError::Netlink {
                    stage: HostStage::Links,
                    op: "create",
                    object: want.name.clone(),
                    source: e,
                }),
            }
        }
    }
}

async fn configure_link(
    handle: &Handle,
    want: &Link,
    k: &KernelLink,
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    let addrs = addresses(handle).await?;
    let have: Vec<Ipv4Net> = addrs.get(&k.index).cloned().unwrap_or_default();
    if have != [want.address] {
        let mut stream = handle
            .address()
            .get()
            .set_link_index_filter(k.index)
            .execute();
        while let Some(msg) = stream.try_next().await.map_err(nl(
            HostStage::Links,
            "list addresses of",
            &want.name,
        ))? {
            if msg.header.family == AddressFamily::Inet {
                handle.address().del(msg).execute().await.map_err(nl(
                    HostStage::Links,
                    "delete address of",
                    &want.name,
                ))?;
            }
        }
        handle
            .address()
            .add(
                k.index,
                IpAddr::V4(want.address.addr()),
                want.address.prefix_len(),
            )
            .execute()
            .await
            .map_err(nl(HostStage::Links, "add address to", &want.name))?;
        report.links_updated += 1;
    }
    if let Some(mtu) = want.mtu.filter(|m| k.mtu != Some(*m)) {
        let msg = LinkUnspec::new_with_index(k.index).mtu(mtu).build();
        handle.link().set(msg).execute().await.map_err(nl(
            HostStage::Links,
            "set mtu of",
            &want.name,
        ))?;
        report.links_updated += 1;
    }
    if k.rp_filter != Some(i32::from(want.rp_filter)) {
        // Only non-zero fields are emitted in a request, so this sets rp_filter alone.
        let mut conf = InetDevConf::default();
        conf.rp_filter = i32::from(want.rp_filter);
        set_devconf(handle, k.index, conf, "set rp_filter of", &want.name).await?;
        report.links_updated += 1;
    }
    if !k.up {
        let msg = LinkUnspec::new_with_index(k.index).up().build();
        handle.link().set(msg).execute().await.map_err(nl(
            HostStage::Links,
            "set up",
            &want.name,
        ))?;
        report.links_updated += 1;
    }
    Ok(())
}

/// Deletes every `kup-*` link not in `desired`.
pub async fn remove_unwanted_links(
    handle: &Handle,
    desired: &[Link],
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    let wanted: BTreeSet<&str> = desired.iter().map(|l| l.name.as_str()).collect();
    for k in links(handle).await? {
        if k.name.starts_with(LINK_PREFIX) && !wanted.contains(k.name.as_str()) {
            handle.link().del(k.index).execute().await.map_err(nl(
                HostStage::Links,
                "delete",
                &k.name,
            ))?;
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

/// kuport's ip rules as the kernel holds them, each with its message (for deletion).
async fn owned_rules(
    handle: &Handle,
    marks: MarkLayout,
) -> Result<Vec<(IpRule, RuleMessage)>, HostError> {
    let mut stream = handle.rule().get(IpVersion::V4).execute();
    let mut out = Vec::new();
    while let Some(msg) =
        stream
            .try_next()
            .await
            .map_err(nl(HostStage::Rules, "list", "ip rules"))?
    {
        let mut fwmark = None;
        let mut fwmask = u32::MAX;
        let mut priority = 0;
        let mut table = u32::from(msg.header.table);
        let mut dst = None;
        for a in &msg.attributes {
            match a {
                RuleAttribute::FwMark(m) => fwmark = Some(*m),
                RuleAttribute::FwMask(m) => fwmask = *m,
                RuleAttribute::Priority(p) => priority = *p,
                RuleAttribute::Table(t) => table = *t,
                RuleAttribute::Destination(IpAddr::V4(d)) => dst = Some(*d),
                _ => {}
            }
        }
        let Some(fwmark) = fwmark.filter(|m| owned_rule(priority, *m, fwmask, marks)) else {
            continue;
        };
        let to = dst.and_then(|d| Ipv4Net::new(d, msg.header.dst_len).ok());
        out.push((
            IpRule {
                priority,
                fwmark,
                fwmask,
                to,
                table,
            },
            msg,
        ));
    }
    Ok(out)
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
    handle: &Handle,
    desired: &[IpRule],
    marks: MarkLayout,
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    let current = owned_rules(handle, marks).await?;
    let (extra, missing) = set_diff(current, desired);
    for (rule, msg) in extra {
        handle.rule().del(msg).execute().await.map_err(nl(
            HostStage::Rules,
            "delete",
            format!("ip rule {rule:?}"),
        ))?;
        report.rules_deleted += 1;
    }
    for rule in missing {
        let mut req = handle
            .rule()
            .add()
            .v4()
            .priority(rule.priority)
            .fw_mark(rule.fwmark)
            .table_id(rule.table)
            // rtnetlink leaves the action unspecified otherwise, which the kernel lists as
            // `lookup N none` and which routes nothing.
            .action(RuleAction::ToTable);
        if let Some(to) = rule.to {
            req = req.destination_prefix(to.addr(), to.prefix_len());
        }
        req.message_mut()
            .attributes
            .push(RuleAttribute::FwMask(rule.fwmask));
        req.execute()
            .await
            .map_err(nl(HostStage::Rules, "add", format!("ip rule {rule:?}")))?;
        report.rules_added += 1;
    }
    Ok(())
}

/// Every IPv4 route in kuport's tables, with its message (for deletion).
async fn owned_routes(
    handle: &Handle,
    names: &BTreeMap<u32, String>,
) -> Result<Vec<(Route, RouteMessage)>, HostError> {
    let mut query = RouteMessage::default();
    query.header.address_family = AddressFamily::Inet;
    let mut stream = handle.route().get(query).execute();
    let mut out = Vec::new();
    while let Some(msg) =
        stream
            .try_next()
            .await
            .map_err(nl(HostStage::Routes, "list", "routes"))?
    {
        let mut table = u32::from(msg.header.table);
        let mut via = None;
        let mut dev = None;
        let mut dst = None;
        for a in &msg.attributes {
            match a {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => via = Some(*g),
                RouteAttribute::Oif(i) => dev = names.get(i).cloned(),
                RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = Some(*d),
                _ => {}
            }
        }
        if !in_table_space(table) {
            continue;
        }
        let to = match (dst, msg.header.destination_prefix_length) {
            (_, 0) => None,
            (Some(d), len) => Ipv4Net::new(d, len).ok(),
            (None, _) => None,
        };
        let route = Route {
            table,
            to,
            via: via.unwrap_or(Ipv4Addr::UNSPECIFIED),
            dev: dev.unwrap_or_default(),
        };
        out.push((route, msg));
    }
    Ok(out)
}

/// Brings the routes of kuport's tables to `desired`.
pub async fn reconcile_routes(
    handle: &Handle,
    desired: &[Route],
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    let kernel_links = links(handle).await?;
    let names: BTreeMap<u32, String> = kernel_links
        .iter()
        .map(|l| (l.index, l.name.clone()))
        .collect();
    let current = owned_routes(handle, &names).await?;
    let (extra, missing) = set_diff(current, desired);
    for (route, msg) in extra {
        handle.route().del(msg).execute().await.map_err(nl(
            HostStage::Routes,
            "delete",
            format!("route {route:?}"),
        ))?;
        report.routes_deleted += 1;
    }
    for route in missing {
        let index = kernel_links
            .iter()
            .find(|l| l.name == route.dev)
            .map(|l| l.index)
            .ok_or_else(|| HostError::Missing {
                stage: HostStage::Routes,
                what: format!(
                    "route in table {}: device {} not present",
                    route.table, route.dev
                ),
            })?;
        let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
            .table_id(route.table)
            .output_interface(index)
            .gateway(route.via);
        if let Some(to) = route.to {
            builder = builder.destination_prefix(to.addr(), to.prefix_len());
        }
        handle
            .route()
            .add(builder.build())
            .execute()
            .await
            .map_err(nl(HostStage::Routes, "add", format!("route {route:?}")))?;
        report.routes_added += 1;
    }
    Ok(())
}

/// Sets `src_valid_mark` on each accepting interface, so the reverse-path check of a request
/// follows the packet mark the steering stage wrote (and kuport's fwmark rule to the main
/// table) when the node's own policy routing would send the client's reverse route elsewhere.
/// The flag changes nothing for packets without a mark; it is left set when kuport stops.
pub async fn ensure_valid_mark(
    handle: &Handle,
    interfaces: &[String],
    report: &mut ApplyReport,
) -> Result<(), HostError> {
    if interfaces.is_empty() {
        return Ok(());
    }
    let current = links(handle).await?;
    for name in interfaces {
        let Some(k) = current.iter().find(|l| &l.name == name) else {
            continue;
        };
        if k.src_valid_mark == Some(1) {
            continue;
        }
        let mut conf = InetDevConf::default();
        conf.src_vmark = 1;
        set_devconf(handle, k.index, conf, "set src_valid_mark of", name).await?;
        report.links_updated += 1;
    }
    Ok(())
}

/// Writes per-device IPv4 settings through netlink (a container's `/proc/sys` is read-only);
/// only the non-zero fields of `conf` are sent.
async fn set_devconf(
    handle: &Handle,
    index: u32,
    conf: InetDevConf,
    op: &'static str,
    name: &str,
) -> Result<(), HostError> {
    let msg = LinkUnspec::new_with_index(index)
        .append_extra_attribute(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
            AfSpecInet::DevConfRequest(conf),
        ])]))
        .build();
    handle
        .link()
        .set(msg)
        .execute()
        .await
        .map_err(nl(HostStage::Links, op, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(priority: u32, fwmark: u32) -> IpRule {
        IpRule {
            priority,
            fwmark,
            fwmask: 0xff,
            to: None,
            table: 254,
        }
    }

    #[test]
    fn the_diff_deletes_extras_and_duplicates_and_adds_what_is_missing() {
        let desired = vec![rule(101, 2), rule(102, 1), rule(102, 2)];
        let current = vec![
            (rule(102, 1), "a"),
            (rule(102, 1), "duplicate"),
            (rule(102, 9), "stale"),
            (rule(101, 2), "b"),
        ];
        let (extra, missing) = set_diff(current, &desired);
        let gone: Vec<&str> = extra.iter().map(|(_, m)| *m).collect();
        assert_eq!(gone, ["duplicate", "stale"]);
        assert_eq!(missing, [&rule(102, 2)]);
        // Already converged: nothing either way.
        let current: Vec<(IpRule, ())> = desired.iter().map(|r| (r.clone(), ())).collect();
        let (extra, missing) = set_diff(current, &desired);
        assert!(extra.is_empty() && missing.is_empty());
    }

    #[test]
    fn only_kuports_rules_are_owned() {
        let marks = MarkLayout::default();
        assert!(owned_rule(PREF_REPLY, 0x1, marks.mask, marks));
        assert!(owned_rule(PREF_LOOP_GUARD, 0x2, marks.mask, marks));
        // Another priority, another datapath's bits, no mark at all, another mask: not ours.
        assert!(!owned_rule(9, 0x1, marks.mask, marks));
        assert!(!owned_rule(PREF_REPLY, 0x4000, 0xffff, marks));
        assert!(!owned_rule(PREF_REPLY, 0, marks.mask, marks));
        assert!(!owned_rule(PREF_REPLY, 0x1, 0xf0, marks));
        // The layout before marks were masked: cleaned away on upgrade.
        assert!(owned_rule(PREF_REPLY, LINK_TABLE_BASE + 5, u32::MAX, marks));
        assert!(in_table_space(LINK_TABLE_BASE + 7) && !in_table_space(254));
    }
}
