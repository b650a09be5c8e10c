//! The kernel's side of [`super::Netlink`]: rtnetlink requests on the current network namespace,
//! and the parsing of what the kernel lists back into kuport's plain types.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures_util::TryStreamExt;
use ipnet::IpNet;
use kuport_core::ir::{Family, IpRule, Link, Route};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    AfSpecInet, AfSpecUnspec, InetDevConf, InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags,
    LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::{Handle, IpVersion, LinkUnspec, LinkVxlan, RouteMessageBuilder};

use super::{DevConf, KernelLink, KernelRoute, KernelRule, Netlink, VxlanFacts, link_mac};

/// rtnetlink on the namespace the connection was opened in.
#[derive(Clone, Debug)]
pub struct RtNetlink {
    handle: Handle,
}

impl RtNetlink {
    /// Wraps a handle whose connection task is already spawned.
    pub fn new(handle: Handle) -> Self {
        Self { handle }
    }
}

fn parse_vxlan(data: &[InfoVxlan]) -> VxlanFacts {
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
    v
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
                        link.vxlan = Some(parse_vxlan(data));
                    }
                }
            }
            LinkAttribute::AfSpecUnspec(specs) => {
                let confs = specs.iter().filter_map(|s| match s {
                    AfSpecUnspec::Inet(inet) => Some(inet),
                    _ => None,
                });
                for conf in confs.flatten() {
                    if let AfSpecInet::DevConf(conf) = conf {
                        link.rp_filter = Some(conf.rp_filter);
                        link.src_valid_mark = Some(conf.src_vmark);
                    }
                }
            }
            _ => {}
        }
    }
    link
}

/// The address (with prefix) of an address message, either family. A point-to-point IPv4
/// address lists the peer as Address: Local is this end's (an IPv6 one lists only Address).
fn address_of(msg: &AddressMessage) -> Option<IpNet> {
    if msg.header.family != AddressFamily::Inet && msg.header.family != AddressFamily::Inet6 {
        return None;
    }
    let find = |want_local: bool| {
        msg.attributes.iter().find_map(|a| match (a, want_local) {
            (AddressAttribute::Local(v), true) | (AddressAttribute::Address(v), false) => Some(*v),
            _ => None,
        })
    };
    let addr = find(true).or_else(|| find(false))?;
    IpNet::new(addr, msg.header.prefix_len).ok()
}

pub(super) fn parse_rule(msg: &RuleMessage) -> KernelRule {
    let mut rule = KernelRule {
        family: if msg.header.family == AddressFamily::Inet6 {
            Family::V6
        } else {
            Family::V4
        },
        priority: 0,
        fwmark: None,
        fwmask: u32::MAX,
        table: u32::from(msg.header.table),
        to: None,
    };
    let mut dst = None;
    for a in &msg.attributes {
        match a {
            RuleAttribute::FwMark(m) => rule.fwmark = Some(*m),
            RuleAttribute::FwMask(m) => rule.fwmask = *m,
            RuleAttribute::Priority(p) => rule.priority = *p,
            RuleAttribute::Table(t) => rule.table = *t,
            RuleAttribute::Destination(d) => dst = Some(*d),
            _ => {}
        }
    }
    rule.to = dst.and_then(|d| IpNet::new(d, msg.header.dst_len).ok());
    rule
}

pub(super) fn parse_route(msg: &RouteMessage) -> KernelRoute {
    let mut route = KernelRoute {
        table: u32::from(msg.header.table),
        to: None,
        via: None,
        oif: None,
    };
    let mut dst = None;
    for a in &msg.attributes {
        match a {
            RouteAttribute::Table(t) => route.table = *t,
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => route.via = Some(IpAddr::V4(*g)),
            RouteAttribute::Gateway(RouteAddress::Inet6(g)) => route.via = Some(IpAddr::V6(*g)),
            RouteAttribute::Oif(i) => route.oif = Some(*i),
            RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = Some(IpAddr::V4(*d)),
            RouteAttribute::Destination(RouteAddress::Inet6(d)) => dst = Some(IpAddr::V6(*d)),
            _ => {}
        }
    }
    route.to = match (dst, msg.header.destination_prefix_length) {
        (Some(d), len) if len > 0 => IpNet::new(d, len).ok(),
        _ => None,
    };
    route
}

impl Netlink for RtNetlink {
    type RuleHandle = RuleMessage;
    type RouteHandle = RouteMessage;

    async fn links(&self) -> Result<Vec<KernelLink>, rtnetlink::Error> {
        let mut stream = self.handle.link().get().execute();
        let mut out = Vec::new();
        while let Some(msg) = stream.try_next().await? {
            out.push(parse_link(&msg));
        }
        Ok(out)
    }

    async fn addresses(&self) -> Result<BTreeMap<u32, Vec<IpNet>>, rtnetlink::Error> {
        let mut stream = self.handle.address().get().execute();
        let mut out: BTreeMap<u32, Vec<IpNet>> = BTreeMap::new();
        while let Some(msg) = stream.try_next().await? {
            if let Some(net) = address_of(&msg) {
                out.entry(msg.header.index).or_default().push(net);
            }
        }
        Ok(out)
    }

    async fn create_vxlan(&self, want: &Link, dev_index: u32) -> Result<(), rtnetlink::Error> {
        let msg = LinkVxlan::new(&want.name, want.vni)
            .dev(dev_index)
            .local(want.local)
            .remote(want.remote)
            .port(want.port)
            .ttl(want.ttl)
            .learning(false)
            .address(link_mac(want).to_vec())
            .build();
        self.handle.link().add(msg).execute().await
    }

    async fn delete_link(&self, index: u32) -> Result<(), rtnetlink::Error> {
        self.handle.link().del(index).execute().await
    }

    async fn delete_address(&self, index: u32, address: IpNet) -> Result<(), rtnetlink::Error> {
        let mut stream = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        while let Some(msg) = stream.try_next().await? {
            if address_of(&msg) == Some(address) {
                self.handle.address().del(msg).execute().await?;
            }
        }
        Ok(())
    }

    async fn add_address(&self, index: u32, address: IpNet) -> Result<(), rtnetlink::Error> {
        let mut req = self
            .handle
            .address()
            .add(index, address.addr(), address.prefix_len());
        if address.addr().is_ipv6() {
            // Both ends are fixed and unique within the class subnet: duplicate address
            // detection would only hold the address tentative (unusable) for a second or more.
            req.message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        req.execute().await
    }

    async fn set_mtu(&self, index: u32, mtu: u32) -> Result<(), rtnetlink::Error> {
        let msg = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.handle.link().set(msg).execute().await
    }

    async fn set_up(&self, index: u32) -> Result<(), rtnetlink::Error> {
        let msg = LinkUnspec::new_with_index(index).up().build();
        self.handle.link().set(msg).execute().await
    }

    async fn set_down(&self, index: u32) -> Result<(), rtnetlink::Error> {
        let msg = LinkUnspec::new_with_index(index).down().build();
        self.handle.link().set(msg).execute().await
    }

    async fn set_neighbour(
        &self,
        index: u32,
        address: IpAddr,
        mac: [u8; 6],
    ) -> Result<(), rtnetlink::Error> {
        self.handle
            .neighbours()
            .add(index, address)
            .link_layer_address(&mac)
            .replace()
            .execute()
            .await
    }

    async fn set_devconf(&self, index: u32, setting: DevConf) -> Result<(), rtnetlink::Error> {
        // Only non-zero fields are emitted in a request, so this sets the one field alone.
        let mut conf = InetDevConf::default();
        match setting {
            DevConf::RpFilter(v) => conf.rp_filter = v,
            DevConf::SrcValidMark(v) => conf.src_vmark = v,
        }
        let msg = LinkUnspec::new_with_index(index)
            .append_extra_attribute(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
                AfSpecInet::DevConfRequest(conf),
            ])]))
            .build();
        self.handle.link().set(msg).execute().await
    }

    async fn rules(&self) -> Result<Vec<(KernelRule, RuleMessage)>, rtnetlink::Error> {
        let mut out = Vec::new();
        for version in [IpVersion::V4, IpVersion::V6] {
            let mut stream = self.handle.rule().get(version).execute();
            while let Some(msg) = stream.try_next().await? {
                out.push((parse_rule(&msg), msg));
            }
        }
        Ok(out)
    }

    async fn delete_rule(&self, rule: RuleMessage) -> Result<(), rtnetlink::Error> {
        self.handle.rule().del(rule).execute().await
    }

    async fn add_rule(&self, rule: &IpRule) -> Result<(), rtnetlink::Error> {
        let req = self
            .handle
            .rule()
            .add()
            .priority(rule.priority)
            .fw_mark(rule.fwmark)
            .table_id(rule.table)
            // rtnetlink leaves the action unspecified otherwise, which the kernel lists as
            // `lookup N none` and which routes nothing.
            .action(RuleAction::ToTable);
        let fwmask = RuleAttribute::FwMask(rule.fwmask);
        match rule.family {
            Family::V4 => {
                let mut req = req.v4();
                if let Some(IpNet::V4(to)) = rule.to {
                    req = req.destination_prefix(to.addr(), to.prefix_len());
                }
                req.message_mut().attributes.push(fwmask);
                req.execute().await
            }
            Family::V6 => {
                let mut req = req.v6();
                if let Some(IpNet::V6(to)) = rule.to {
                    req = req.destination_prefix(to.addr(), to.prefix_len());
                }
                req.message_mut().attributes.push(fwmask);
                req.execute().await
            }
        }
    }

    async fn routes(&self) -> Result<Vec<(KernelRoute, RouteMessage)>, rtnetlink::Error> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut query = RouteMessage::default();
            query.header.address_family = family;
            let mut stream = self.handle.route().get(query).execute();
            while let Some(msg) = stream.try_next().await? {
                out.push((parse_route(&msg), msg));
            }
        }
        Ok(out)
    }

    async fn delete_route(&self, route: RouteMessage) -> Result<(), rtnetlink::Error> {
        self.handle.route().del(route).execute().await
    }

    async fn add_route(&self, route: &Route, oif: u32) -> Result<(), rtnetlink::Error> {
        let message = match (route.via, route.to) {
            (IpAddr::V4(via), to) => {
                let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
                    .table_id(route.table)
                    .output_interface(oif)
                    .gateway(via);
                if let Some(IpNet::V4(to)) = to {
                    b = b.destination_prefix(to.addr(), to.prefix_len());
                }
                b.build()
            }
            (IpAddr::V6(via), to) => {
                let mut b = RouteMessageBuilder::<Ipv6Addr>::new()
                    .table_id(route.table)
                    .output_interface(oif)
                    .gateway(via);
                if let Some(IpNet::V6(to)) = to {
                    b = b.destination_prefix(to.addr(), to.prefix_len());
                }
                b.build()
            }
        };
        self.handle.route().add(message).execute().await
    }
}
