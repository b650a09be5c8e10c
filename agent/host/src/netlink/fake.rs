//! A fake of the kernel's netlink objects for unprivileged tests of the decisions in
//! [`super`]: links (VXLAN or plain), their IPv4 addresses and per-device settings, ip rules
//! and routes, with the refusals kuport meets in the field (a name or a VNI and port already
//! taken, a device that is gone, a route through a link that is down or off-subnet, a
//! duplicate rule or route). A deleted link takes its addresses and routes with it, as in the
//! kernel. Every request is recorded, and one request can be made to fail once.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::num::NonZeroI32;
use std::sync::{Mutex, MutexGuard};

use ipnet::{IpNet, Ipv4Net};
use kuport_core::ir::{IpRule, Link, Route};
use rtnetlink::packet_core::ErrorMessage;

use super::{DevConf, KernelLink, KernelRoute, KernelRule, Netlink, VxlanFacts};

const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const ENETDOWN: i32 = 100;
const ENETUNREACH: i32 = 101;
const ENOENT: i32 = 2;
const EPERM: i32 = 1;

/// The kernel's answer to a refused request.
pub fn errno(code: i32) -> rtnetlink::Error {
    let mut msg = ErrorMessage::default();
    msg.code = NonZeroI32::new(-code);
    rtnetlink::Error::NetlinkError(msg)
}

/// What the fake holds.
#[derive(Debug, Default)]
pub struct FakeKernel {
    pub links: BTreeMap<u32, KernelLink>,
    pub addresses: BTreeMap<u32, Vec<IpNet>>,
    pub rules: Vec<KernelRule>,
    pub routes: Vec<KernelRoute>,
    /// Permanent neighbour entries: (link index, address) → MAC.
    pub neighbours: BTreeMap<(u32, IpAddr), [u8; 6]>,
    /// Every request, in order, as `"<request> <object>"`.
    pub calls: Vec<String>,
    /// The request (its name as in `calls`, without the object) that fails once with EPERM.
    pub fail_once: Option<&'static str>,
    /// What `net.ipv4.conf.default.rp_filter` gives a new link.
    pub default_rp_filter: i32,
    next_index: u32,
}

/// A fake netlink backend; clones share one kernel.
#[derive(Clone, Debug, Default)]
pub struct FakeNetlink {
    kernel: std::sync::Arc<Mutex<FakeKernel>>,
}

impl FakeNetlink {
    /// An empty kernel.
    pub fn new() -> Self {
        Self::default()
    }

    /// The kernel's state, to arrange and inspect.
    pub fn kernel(&self) -> MutexGuard<'_, FakeKernel> {
        // A panic while holding the lock is a test failure already; keep serving its data.
        self.kernel.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a plain device (an underlay, a foreign link), up, with one address.
    pub fn add_device(&self, name: &str, mtu: u32, address: Option<Ipv4Net>) -> u32 {
        let mut k = self.kernel();
        let index = k.allocate_index();
        k.links.insert(
            index,
            KernelLink {
                index,
                name: name.into(),
                mtu: Some(mtu),
                up: true,
                rp_filter: Some(0),
                src_valid_mark: Some(0),
                ..KernelLink::default()
            },
        );
        if let Some(a) = address {
            k.addresses.insert(index, vec![IpNet::V4(a)]);
        }
        index
    }

    /// The link named `name`.
    pub fn link(&self, name: &str) -> Option<KernelLink> {
        self.kernel()
            .links
            .values()
            .find(|l| l.name == name)
            .cloned()
    }

    fn request(
        &self,
        call: &'static str,
        object: impl std::fmt::Display,
    ) -> Result<MutexGuard<'_, FakeKernel>, rtnetlink::Error> {
        let mut k = self.kernel();
        k.calls.push(format!("{call} {object}"));
        if k.fail_once == Some(call) {
            k.fail_once = None;
            return Err(errno(EPERM));
        }
        Ok(k)
    }
}

impl FakeKernel {
    fn allocate_index(&mut self) -> u32 {
        // Index 1 is lo in a real namespace; start past it, never reuse one.
        self.next_index = self.next_index.max(1) + 1;
        self.next_index
    }

    fn existing(&mut self, index: u32) -> Result<&mut KernelLink, rtnetlink::Error> {
        self.links.get_mut(&index).ok_or_else(|| errno(ENODEV))
    }
}

impl Netlink for FakeNetlink {
    type RuleHandle = KernelRule;
    type RouteHandle = KernelRoute;

    async fn links(&self) -> Result<Vec<KernelLink>, rtnetlink::Error> {
        let k = self.request("list-links", "")?;
        Ok(k.links.values().cloned().collect())
    }

    async fn addresses(
        &self,
    ) -> Result<std::collections::BTreeMap<u32, Vec<IpNet>>, rtnetlink::Error> {
        let k = self.request("list-addresses", "")?;
        Ok(k.addresses.clone())
    }

    async fn create_vxlan(&self, want: &Link, dev_index: u32) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("create-vxlan", &want.name)?;
        let dev = k.links.get(&dev_index).ok_or_else(|| errno(ENODEV))?;
        let dev_mtu = dev.mtu.unwrap_or(1500);
        let taken = k.links.values().any(|l| {
            l.name == want.name
                || l.vxlan
                    .as_ref()
                    .is_some_and(|v| v.vni == Some(want.vni) && v.port.unwrap_or(4789) == want.port)
        });
        if taken {
            return Err(errno(EEXIST));
        }
        let index = k.allocate_index();
        let rp_filter = k.default_rp_filter;
        k.links.insert(
            index,
            KernelLink {
                index,
                name: want.name.clone(),
                // The kernel leaves room for the VXLAN header below the underlay's MTU.
                mtu: Some(dev_mtu.saturating_sub(50)),
                up: false,
                vxlan: Some(VxlanFacts {
                    vni: Some(want.vni),
                    port: Some(want.port),
                    local: Some(want.local),
                    remote: Some(want.remote),
                    dev: Some(dev_index),
                    ttl: Some(want.ttl),
                    learning: Some(false),
                }),
                rp_filter: Some(rp_filter),
                src_valid_mark: Some(0),
            },
        );
        Ok(())
    }

    async fn delete_link(&self, index: u32) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("delete-link", index)?;
        k.links.remove(&index).ok_or_else(|| errno(ENODEV))?;
        k.addresses.remove(&index);
        k.neighbours.retain(|(link, _), _| *link != index);
        k.routes.retain(|r| r.oif != Some(index));
        Ok(())
    }

    async fn delete_address(&self, index: u32, address: IpNet) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("delete-address", format!("{index} {address}"))?;
        k.existing(index)?;
        let list = k.addresses.entry(index).or_default();
        let at = list
            .iter()
            .position(|a| *a == address)
            .ok_or_else(|| errno(ENOENT))?;
        list.remove(at);
        // Routes through an address's subnet go with it; kuport's routes name a gateway on it.
        k.routes
            .retain(|r| r.oif != Some(index) || r.via.is_none_or(|gw| !address.contains(&gw)));
        Ok(())
    }

    async fn add_address(&self, index: u32, address: IpNet) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("add-address", format!("{index} {address}"))?;
        k.existing(index)?;
        let list = k.addresses.entry(index).or_default();
        if list.contains(&address) {
            return Err(errno(EEXIST));
        }
        list.push(address);
        Ok(())
    }

    async fn set_mtu(&self, index: u32, mtu: u32) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("set-mtu", format!("{index} {mtu}"))?;
        k.existing(index)?.mtu = Some(mtu);
        Ok(())
    }

    async fn set_up(&self, index: u32) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("set-up", index)?;
        k.existing(index)?.up = true;
        Ok(())
    }

    async fn set_down(&self, index: u32) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("set-down", index)?;
        k.existing(index)?.up = false;
        // Going down flushes a device's neighbours, as in the kernel.
        k.neighbours.retain(|(link, _), _| *link != index);
        Ok(())
    }

    async fn set_neighbour(
        &self,
        index: u32,
        address: IpAddr,
        mac: [u8; 6],
    ) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("set-neighbour", format!("{index} {address}"))?;
        k.existing(index)?;
        k.neighbours.insert((index, address), mac);
        Ok(())
    }

    async fn set_devconf(&self, index: u32, setting: DevConf) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("set-devconf", format!("{index} {setting:?}"))?;
        let link = k.existing(index)?;
        match setting {
            DevConf::RpFilter(v) => link.rp_filter = Some(v),
            DevConf::SrcValidMark(v) => link.src_valid_mark = Some(v),
        }
        Ok(())
    }

    async fn rules(&self) -> Result<Vec<(KernelRule, KernelRule)>, rtnetlink::Error> {
        let k = self.request("list-rules", "")?;
        Ok(k.rules.iter().map(|r| (r.clone(), r.clone())).collect())
    }

    async fn delete_rule(&self, rule: KernelRule) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("delete-rule", format!("{rule:?}"))?;
        let at = k
            .rules
            .iter()
            .position(|r| *r == rule)
            .ok_or_else(|| errno(ENOENT))?;
        k.rules.remove(at);
        Ok(())
    }

    async fn add_rule(&self, rule: &IpRule) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("add-rule", format!("{rule:?}"))?;
        let kernel = KernelRule {
            family: rule.family,
            priority: rule.priority,
            fwmark: Some(rule.fwmark),
            fwmask: rule.fwmask,
            table: rule.table,
            to: rule.to,
        };
        if k.rules.contains(&kernel) {
            return Err(errno(EEXIST));
        }
        k.rules.push(kernel);
        Ok(())
    }

    async fn routes(&self) -> Result<Vec<(KernelRoute, KernelRoute)>, rtnetlink::Error> {
        let k = self.request("list-routes", "")?;
        Ok(k.routes.iter().map(|r| (r.clone(), r.clone())).collect())
    }

    async fn delete_route(&self, route: KernelRoute) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("delete-route", format!("{route:?}"))?;
        let at = k
            .routes
            .iter()
            .position(|r| *r == route)
            .ok_or_else(|| errno(ENOENT))?;
        k.routes.remove(at);
        Ok(())
    }

    async fn add_route(&self, route: &Route, oif: u32) -> Result<(), rtnetlink::Error> {
        let mut k = self.request("add-route", format!("{route:?}"))?;
        let link = k.links.get(&oif).ok_or_else(|| errno(ENODEV))?;
        if !link.up {
            return Err(errno(ENETDOWN));
        }
        let via = (!route.via.is_unspecified()).then_some(route.via);
        if let Some(gw) = via {
            let on_link = k
                .addresses
                .get(&oif)
                .is_some_and(|nets| nets.iter().any(|n| n.contains(&gw)));
            if !on_link {
                return Err(errno(ENETUNREACH));
            }
        }
        let kernel = KernelRoute {
            table: route.table,
            to: route.to,
            via,
            oif: Some(oif),
        };
        // The kernel keys a route by table and destination (kuport sets no metric or tos).
        if k.routes
            .iter()
            .any(|r| r.table == kernel.table && r.to == kernel.to)
        {
            return Err(errno(EEXIST));
        }
        k.routes.push(kernel);
        Ok(())
    }
}
