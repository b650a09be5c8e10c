//! The offline contract of `kuport plan`: the JSON shape other tools read (field names fixed,
//! arrays present when empty, `null` for absent values), and the short text summary.
//!
//! Built from a [`Plan`] rather than serialising it directly, so the plan's internals can change
//! without breaking the contract. Extend these types; never rename or remove a field.

use std::fmt::Write as _;

use serde::Serialize;

use crate::ir::{IpRule, Link, Route};
use crate::keys::MappingKey;
use crate::plan::{ClassDecision, GcKind, MappingDecision, NeededLink, Outcome, Plan};
use crate::render::nft_text;

/// The whole report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    pub node: String,
    pub portmaps: Vec<PortMapReport>,
    pub classes: Vec<ClassReport>,
    pub host: HostReport,
    pub writes: WritesReport,
}

/// `{status, reason, message}`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ConditionReport {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// One PortMap's decision.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapReport {
    pub namespace: String,
    pub name: String,
    pub accepted: ConditionReport,
    pub programmed: Option<ConditionReport>,
    pub endpoint: Option<EndpointReport>,
    pub serving_node: Option<String>,
    pub programming_nodes: Vec<String>,
    pub status_writer: Option<String>,
    pub published: Vec<PublishedReport>,
    pub links: Vec<MappingLinkReport>,
    /// Links kept ready ahead of need: from the next accepting nodes of a Single class to the
    /// pod's node, and from the programming nodes to the nodes of the next endpoints.
    pub standby_links: Vec<MappingLinkReport>,
}

/// `{node, address, port}` (port = the pod port).
#[derive(Clone, Debug, Serialize)]
pub struct EndpointReport {
    pub node: String,
    pub address: String,
    pub port: u16,
    /// The same pod's IPv6 address when the mapping is also served over IPv6 (added with
    /// IPv6; absent otherwise).
    #[serde(rename = "ipv6Address", skip_serializing_if = "Option::is_none")]
    pub address6: Option<String>,
}

/// `{node, interface, address}`.
#[derive(Clone, Debug, Serialize)]
pub struct PublishedReport {
    pub node: String,
    pub interface: String,
    pub address: String,
    /// The interface's IPv6 address, when the mapping is served over IPv6 there (added with
    /// IPv6; absent otherwise).
    #[serde(rename = "ipv6Address", skip_serializing_if = "String::is_empty")]
    pub address6: String,
}

/// A link a mapping needs: `{class, key, slot, landed}`.
#[derive(Clone, Debug, Serialize)]
pub struct MappingLinkReport {
    pub class: String,
    pub key: String,
    pub slot: Option<u32>,
    pub landed: bool,
}

/// One class's decision.
#[derive(Clone, Debug, Serialize)]
pub struct ClassReport {
    pub name: String,
    pub ready: ConditionReport,
    pub links: Vec<ClassLinkReport>,
}

/// A class claim: `{key, slot, landed, unusedSince}`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassLinkReport {
    pub key: String,
    pub slot: u32,
    pub landed: bool,
    pub unused_since: Option<String>,
}

/// The node's desired host state.
#[derive(Clone, Debug, Serialize)]
pub struct HostReport {
    pub nftables: String,
    /// `table ip6 kuport` as nft lists it (added with IPv6; absent when the node has none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub nftables6: String,
    pub links: Vec<LinkReport>,
    pub rules: Vec<RuleReport>,
    pub routes: Vec<RouteReport>,
}

/// `{name, vni, port, device, local, remote, address, mtu}`.
#[derive(Clone, Debug, Serialize)]
pub struct LinkReport {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub device: Option<String>,
    pub local: String,
    pub remote: String,
    pub address: String,
    pub mtu: Option<u32>,
    /// This node's inner IPv6 end, when IPv6 mappings cross the link (added with IPv6).
    #[serde(rename = "address6", skip_serializing_if = "Option::is_none")]
    pub address6: Option<String>,
}

/// `{priority, fwmark, fwmask, to, table}`.
#[derive(Clone, Debug, Serialize)]
pub struct RuleReport {
    pub priority: u32,
    pub fwmark: String,
    /// The mark bits compared (kuport's mask); added after v1, so readers of the contract that
    /// predate it may ignore it.
    pub fwmask: String,
    pub to: Option<String>,
    pub table: u32,
    /// `IPv6` for an `ip -6 rule` (added with IPv6; absent for IPv4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<&'static str>,
}

/// `{table, to, via, dev}`.
#[derive(Clone, Debug, Serialize)]
pub struct RouteReport {
    pub table: u32,
    pub to: String,
    pub via: String,
    pub dev: String,
}

/// What this node writes.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WritesReport {
    pub portmaps: Vec<String>,
    pub class_rows: Vec<String>,
    pub claims: Vec<ClaimReport>,
    pub gc: Vec<GcReport>,
}

/// `{class, key, slot}`, and `replaces` when a serving pair takes over a standby claim's slot.
#[derive(Clone, Debug, Serialize)]
pub struct ClaimReport {
    pub class: String,
    pub key: String,
    pub slot: u32,
    pub replaces: Option<String>,
}

/// `{class, key, action}`.
#[derive(Clone, Debug, Serialize)]
pub struct GcReport {
    pub class: String,
    pub key: String,
    pub action: GcKind,
}

fn condition<R: Copy + Into<&'static str>>(outcome: &Outcome<R>, ok: bool) -> ConditionReport {
    ConditionReport {
        status: crate::api::conditions::status(ok),
        reason: outcome.reason.into(),
        message: outcome.message.clone(),
    }
}

impl From<crate::plan::AcceptedReason> for &'static str {
    fn from(r: crate::plan::AcceptedReason) -> Self {
        r.as_str()
    }
}
impl From<crate::plan::ProgrammedReason> for &'static str {
    fn from(r: crate::plan::ProgrammedReason) -> Self {
        r.as_str()
    }
}
impl From<crate::plan::ClassReason> for &'static str {
    fn from(r: crate::plan::ClassReason) -> Self {
        r.as_str()
    }
}

impl PlanReport {
    /// The report of a plan.
    pub fn new(plan: &Plan) -> Self {
        PlanReport {
            node: plan.node.clone(),
            portmaps: plan.portmaps.iter().map(portmap).collect(),
            classes: plan.classes.iter().map(class).collect(),
            host: HostReport {
                nftables: nft_text(&plan.host_state.nft),
                nftables6: nft_text(&plan.host_state.nft6),
                links: plan.host_state.links.iter().map(link).collect(),
                rules: plan.host_state.rules.iter().map(rule).collect(),
                routes: plan.host_state.routes.iter().map(route).collect(),
            },
            writes: WritesReport {
                portmaps: plan
                    .writes
                    .portmaps
                    .iter()
                    .map(|w| MappingKey::new(&w.namespace, &w.name).into_string())
                    .collect(),
                class_rows: plan
                    .writes
                    .class_rows
                    .iter()
                    .map(|w| w.class.clone())
                    .collect(),
                claims: plan
                    .writes
                    .claims
                    .iter()
                    .map(|c| ClaimReport {
                        class: c.class.clone(),
                        key: c.key.clone(),
                        slot: c.slot,
                        replaces: c.replaces.clone(),
                    })
                    .collect(),
                gc: plan
                    .writes
                    .gc
                    .iter()
                    .map(|g| GcReport {
                        class: g.class.clone(),
                        key: g.key.clone(),
                        action: g.action,
                    })
                    .collect(),
            },
        }
    }
}

fn portmap(d: &MappingDecision) -> PortMapReport {
    PortMapReport {
        namespace: d.namespace.to_string(),
        name: d.name.clone(),
        accepted: condition(&d.accepted, d.accepted.is_true()),
        programmed: d.programmed.as_ref().map(|p| condition(p, p.is_true())),
        endpoint: d.endpoint.as_ref().map(|e| EndpointReport {
            node: e.node.to_string(),
            address: e.address.to_string(),
            port: e.port,
            address6: e.address6.map(|a| a.to_string()),
        }),
        serving_node: d.serving_node.as_deref().map(str::to_owned),
        programming_nodes: d.programming_nodes.iter().map(|n| n.to_string()).collect(),
        status_writer: d.status_writer.as_deref().map(str::to_owned),
        published: d
            .published
            .iter()
            .map(|p| PublishedReport {
                node: p.node.clone(),
                interface: p.interface.clone(),
                address: p.address.clone(),
                address6: p.address6.clone(),
            })
            .collect(),
        links: d.links.iter().map(mapping_link).collect(),
        standby_links: d.standby_links.iter().map(mapping_link).collect(),
    }
}

fn mapping_link(l: &NeededLink) -> MappingLinkReport {
    MappingLinkReport {
        class: l.class.to_string(),
        key: l.key.to_string(),
        slot: l.slot,
        landed: l.landed,
    }
}

fn class(c: &ClassDecision) -> ClassReport {
    ClassReport {
        name: c.name.clone(),
        ready: condition(&c.ready, c.ready.is_true()),
        links: c
            .links
            .iter()
            .map(|l| ClassLinkReport {
                key: l.key.clone(),
                slot: l.slot,
                landed: l.landed,
                unused_since: l.unused_since.map(|t| t.to_string()),
            })
            .collect(),
    }
}

fn link(l: &Link) -> LinkReport {
    LinkReport {
        name: l.name.clone(),
        vni: l.vni,
        port: l.port,
        device: l.device.clone(),
        local: l.local.to_string(),
        remote: l.remote.to_string(),
        address: l.address.to_string(),
        mtu: l.mtu,
        address6: l.address6.map(|a| a.to_string()),
    }
}

fn rule(r: &IpRule) -> RuleReport {
    RuleReport {
        priority: r.priority,
        fwmark: format!("{:#010x}", r.fwmark),
        fwmask: format!("{:#010x}", r.fwmask),
        to: r.to.map(|t| t.to_string()),
        table: r.table,
        family: (r.family == crate::ir::Family::V6).then_some("IPv6"),
    }
}

fn route(r: &Route) -> RouteReport {
    RouteReport {
        table: r.table,
        to: r.to.map_or_else(|| "default".to_owned(), |t| t.to_string()),
        via: r.via.to_string(),
        dev: r.dev.clone(),
    }
}

/// A short human summary: one line per mapping, then one per class.
pub fn text_summary(plan: &Plan) -> String {
    let mut out = format!("plan for node {}\n", plan.node);
    for d in &plan.portmaps {
        let proto = d.protocol.lower();
        let ports = d.ports.map_or_else(|| "?".to_owned(), |p| p.to_string());
        let state = match &d.programmed {
            None => format!(
                "not accepted: {} ({})",
                d.accepted.reason, d.accepted.message
            ),
            Some(p) if p.is_true() => "programmed".to_owned(),
            Some(p) => format!("not programmed: {} ({})", p.reason, p.message),
        };
        let endpoint = d.endpoint.as_ref().map_or_else(
            || "no endpoint".to_owned(),
            |e| format!("→ {}:{} on {}", e.address, e.port, e.node),
        );
        let on = if d.programming_nodes.is_empty() {
            String::new()
        } else {
            format!(" via {}", d.programming_nodes.join(","))
        };
        let _ = writeln!(
            out,
            "  {}/{} {proto}/{ports} {endpoint}{on}: {state}",
            d.namespace, d.name
        );
    }
    for c in &plan.classes {
        let ready = if c.ready.is_true() {
            "ready".to_owned()
        } else {
            format!("{} ({})", c.ready.reason, c.ready.message)
        };
        let _ = writeln!(
            out,
            "  class {}: {ready}, {} link claim(s)",
            c.name,
            c.links.len()
        );
    }
    let _ = writeln!(
        out,
        "  host: {} nft rule(s), {} link(s), {} ip rule(s), {} route(s)",
        plan.host_state
            .nft
            .chains
            .iter()
            .map(|(_, r)| r.len())
            .sum::<usize>(),
        plan.host_state.links.len(),
        plan.host_state.rules.len(),
        plan.host_state.routes.len()
    );
    out
}
