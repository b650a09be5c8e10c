//! The status this node owns: PortMap statuses it is the writer of, its class rows, the link
//! claims it proposes and the garbage collection it performs.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::fast_hash::FastMap;
use super::holders::{self, Holder};
use super::index::Index;
use super::quota::Quotas;
use super::state::{ClassState, Working, standby_only, yields_to};
use super::{
    CLAIM_GC_AFTER_SECONDS, ClaimProposal, ClassRowWrite, GcAction, GcKind, KernelRefusalWrite,
    PortMapWrite, Writes,
};
use super::{mapping, pod_network};
use crate::api::{
    ClassNodeStatus, CniInfo, EndpointStatus, HeldPort, LinkEndStatus, NamespacePorts,
    PortMapClass, PortMapStatus, Protocol, PublishedAddress, conditions,
};
use crate::ir::{HostState, VXLAN_OVERHEAD};
use crate::keys::{MappingKey, NodePair};
use crate::snapshot::{CniFacts, HostFacts, Snapshot};
use crate::text::cut_bytes;

/// The longest strings and lists the CRD schema takes in what this node writes (the API server
/// refuses a whole status for one string too long, so the writes are cut to fit). A test checks
/// them against the generated schema.
pub mod limits {
    /// A row's message, a warning, a refusal's message.
    pub const MESSAGE: usize = 1024;
    /// What holds a port.
    pub const HOLDER: usize = 256;
    /// The CNI's name and routing mode as read from its configuration.
    pub const CNI_WORD: usize = 63;
    /// Warnings in a row.
    pub const WARNINGS: usize = 32;
    /// Held ports in a row (present holders and kept claims together).
    pub const HELD_PORTS: usize = 256;
    /// Mappings a held port yields to.
    pub const YIELDS_TO: usize = 64;
    /// A link end's message.
    pub const LINK_MESSAGE: usize = 512;
    /// Link ends in a row: one per peer, so an accepting node linked to pods on 8,192 nodes
    /// still lists every end (a row lives in its node's own `PortMapNode`).
    pub const LINK_ENDS: usize = 8192;
    /// Checks in a row.
    pub const CHECKS: usize = 16;
    /// Host addresses in a row.
    pub const HOST_ADDRESSES: usize = 32;
    /// A check's name.
    pub const CHECK_NAME: usize = 63;
    /// A check's message.
    pub const CHECK_MESSAGE: usize = 512;
}

/// Builds a condition, keeping `lastTransitionTime` from the stored one unless the status flips.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    stored: &[Condition],
    now: Timestamp,
) -> Condition {
    let status = conditions::status(ok);
    let last = stored
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: last,
        observed_generation: generation,
    }
}

pub fn writes(
    index: &Index,
    classes: &BTreeMap<&str, ClassState>,
    work: &[Working],
    snapshot: &Snapshot,
    this_node: &str,
    facts: &HostFacts,
    now: Timestamp,
) -> Writes {
    let mut writes = Writes::default();
    // The summary depends on the published rows alone, which mappings of one group share:
    // made once per shared list (looked up by its address, never iterated).
    let mut summaries: FastMap<*const PublishedAddress, Option<String>> = FastMap::default();
    for w in work
        .iter()
        .filter(|w| w.decision.status_writer.as_deref() == Some(this_node))
    {
        let published = &w.decision.published;
        let summary = summaries
            .entry(published.as_ptr())
            .or_insert_with(|| crate::summary::published_summary(published))
            .clone();
        writes.portmaps.push(portmap_write(w, summary, now));
    }
    // One write per PortMap name: an unstable sort gives the one order, moving less.
    writes
        .portmaps
        .sort_unstable_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    for state in classes
        .values()
        .filter(|s| s.class.spec.nodes.contains_key(this_node))
    {
        writes
            .class_rows
            .push(class_row(index, state, snapshot, this_node, facts, now));
    }
    for state in classes.values() {
        for (key, slot) in &state.proposals {
            let proposes = state
                .needed
                .get(key)
                .is_some_and(|pods| pods.contains(this_node));
            if let (true, Some((net, _, _))) = (proposes, state.slot_net(*slot)) {
                let (a, b) = key.nodes();
                writes.claims.push(ClaimProposal {
                    class: state.name.to_owned(),
                    key: key.to_string(),
                    peers: [a.to_owned(), b.to_owned()],
                    slot: *slot,
                    subnet: net.to_string(),
                    replaces: state.replacing.get(key).map(ToString::to_string),
                });
            }
        }
        if state.accepting.contains(&this_node) {
            writes.gc.extend(gc(state, this_node, now));
        }
    }
    writes.refusals = kernel_refusal_writes(index, work, this_node, facts);
    writes
}

fn portmap_write(w: &Working, published_summary: Option<String>, now: Timestamp) -> PortMapWrite {
    let d = &w.decision;
    let stored =
        w.pm.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
    let mut conditions = vec![condition(
        conditions::ACCEPTED,
        d.accepted.is_true(),
        d.accepted.reason.as_str(),
        &d.accepted.message,
        d.generation,
        stored,
        now,
    )];
    if let Some(p) = &d.programmed {
        conditions.push(condition(
            conditions::PROGRAMMED,
            p.is_true(),
            p.reason.as_str(),
            &p.message,
            d.generation,
            stored,
            now,
        ));
    }
    let status = PortMapStatus {
        observed_generation: d.generation,
        endpoint: d.endpoint.as_ref().map(|e| EndpointStatus {
            node: e.node.to_string(),
            address: match e.address {
                std::net::IpAddr::V4(a) => ipv4_text(a),
                std::net::IpAddr::V6(a) => a.to_string(),
            },
            address6: e.address6.map(|a| a.to_string()),
            port: i32::from(e.port),
            pod: e.pod.clone(),
        }),
        published: d.published.clone(),
        published_summary,
        conditions,
    };
    PortMapWrite {
        namespace: d.namespace.to_string(),
        name: d.name.clone(),
        status,
        settling: w.settling,
    }
}

/// `address` in dotted decimal, as `to_string` writes it at a tenth of the cost (it went
/// through the formatting machinery four times per address, for every status this node writes).
fn ipv4_text(address: Ipv4Addr) -> String {
    let mut text = String::with_capacity(15);
    for (i, octet) in address.octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
}

/// The most namespaces a class status lists in `namespaces` (the schema's bound).
const NAMESPACES_LISTED: usize = 256;

/// Each class row write's `namespaces`: the ports every namespace holds in the class against
/// its quota. Past [`NAMESPACES_LISTED`] namespaces, those holding the most are listed (ties by
/// name), by name.
pub fn add_namespace_ports(
    writes: &mut Writes,
    classes: &BTreeMap<&str, ClassState>,
    quotas: &Quotas,
) {
    for write in &mut writes.class_rows {
        let Some(state) = classes.get(write.class.as_str()) else {
            continue;
        };
        let mut listed: Vec<NamespacePorts> = quotas
            .of_class(state.name, state.class)
            .into_iter()
            .map(|u| NamespacePorts {
                namespace: u.namespace.to_string(),
                used_ports: i64::from(u.used),
                quota_ports: i64::from(u.quota),
            })
            .collect();
        if listed.len() > NAMESPACES_LISTED {
            listed.sort_by(|a, b| (b.used_ports, &a.namespace).cmp(&(a.used_ports, &b.namespace)));
            listed.truncate(NAMESPACES_LISTED);
            listed.sort();
        }
        write.namespaces = listed;
    }
}

/// This node's row in a class and the class's Ready condition as this node computes it.
fn class_row(
    index: &Index,
    state: &ClassState,
    snapshot: &Snapshot,
    this_node: &str,
    facts: &HostFacts,
    now: Timestamp,
) -> ClassRowWrite {
    let interfaces = state
        .class
        .spec
        .nodes
        .get(this_node)
        .map(|n| n.interfaces.as_slice())
        .unwrap_or_default();
    let (addresses, missing) = interface_addresses(interfaces, facts);
    let class_name = state.class.metadata.name.as_deref().unwrap_or_default();
    let stored_row = index.row(class_name, this_node);
    let (held_ports, unlisted_note) = held_ports(
        index,
        state.class,
        &addresses,
        this_node,
        facts,
        stored_row,
        now,
    );
    let underlay_mtu = facts.underlay_mtu.and_then(|m| i32::try_from(m).ok());
    // A node serves on the interfaces it has: ready while at least one resolves, with the
    // missing ones named (the datapath serves on what exists, so status says the same).
    let ready = missing.is_none()
        || !addresses.is_empty()
        || interfaces
            .iter()
            .any(|i| facts.interface_address6(i).is_some());
    let row = ClassNodeStatus {
        name: this_node.to_owned(),
        ready,
        message: missing.map(|m| cut_bytes(&m, limits::MESSAGE).into_owned()),
        underlay_mtu,
        link_mtu: underlay_mtu.map(|m| m - VXLAN_OVERHEAD as i32),
        addresses,
        addresses6: interfaces
            .iter()
            .filter_map(|i| Some((i.clone(), facts.interface_address6(i)?.to_string())))
            .collect(),
        held_ports,
        // Filled by `add_link_ends` where this node holds link ends.
        host_addresses: Vec::new(),
        warnings: row_warnings(facts.firewall_warnings.iter().chain(&unlisted_note)),
        cni: snapshot.cni.as_ref().map(cni_info),
        // The agent stamps these when it writes the row.
        agent_version: None,
        last_pass_time: None,
        // Filled by `add_link_ends` from what this node applies.
        links: Vec::new(),
        accepting: None,
        checks: row_checks(state, snapshot.cni.as_ref(), facts),
    };
    let ready = ready_condition(state, now);
    let mut accepting: Vec<String> = state.accepting.iter().map(|n| (*n).to_owned()).collect();
    accepting.sort_unstable();
    ClassRowWrite {
        class: state.name.to_owned(),
        row,
        ready,
        accepting,
        named: state.class.spec.nodes.len(),
        namespaces: Vec::new(),
    }
}

/// This node's ends of each class's return links, as its IR builds them (less any link its
/// kernel refused), with its probes' verdicts: added to its rows, and a row of its own (not
/// accepting) in each class that does not name it but whose links it holds (the pod's node
/// acknowledging the links that reach it).
pub fn add_link_ends(
    writes: &mut Writes,
    classes: &BTreeMap<&str, ClassState>,
    host: &HostState,
    this_node: &str,
    facts: &HostFacts,
    cni: Option<&CniFacts>,
    now: Timestamp,
) {
    let addresses = host_addresses(facts, classes);
    for state in classes.values() {
        let ends = link_ends(state, host, this_node, facts);
        // Listed only where this node holds link ends: there alone the other ends use them.
        let own_addresses = if ends.is_empty() {
            Vec::new()
        } else {
            addresses.clone()
        };
        match writes.class_rows.iter_mut().find(|r| r.class == state.name) {
            Some(write) => {
                write.row.links = ends;
                write.row.host_addresses = own_addresses;
            }
            None if !ends.is_empty() => {
                let checks = row_checks(state, cni, facts);
                let mut write = pod_end_row(state, this_node, ends, checks, now);
                write.row.host_addresses = own_addresses;
                writes.class_rows.push(write);
            }
            None => {}
        }
    }
    writes.class_rows.sort_by(|a, b| a.class.cmp(&b.class));
}

/// This node's host addresses as its rows list them (`hostAddresses`): its addresses on a
/// network segment ([`HostFacts::segment_addresses`]) but loopback, link-local and unspecified
/// ones and the classes' return-link addresses, sorted, at most half of
/// [`limits::HOST_ADDRESSES`] of each family (so neither crowds the other out).
fn host_addresses(facts: &HostFacts, classes: &BTreeMap<&str, ClassState>) -> Vec<String> {
    let on_a_link = |a: &IpAddr| {
        classes.values().any(|c| match a {
            IpAddr::V4(v4) => c.subnet.is_some_and(|n| n.contains(v4)),
            IpAddr::V6(v6) => c.subnet6.is_some_and(|n| n.contains(v6)),
        })
    };
    let mut addresses: Vec<IpAddr> = facts
        .segment_addresses
        .iter()
        .copied()
        .filter(|a| !a.is_loopback() && !a.is_unspecified() && !a.is_multicast())
        .filter(|a| match a {
            IpAddr::V4(v4) => !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_unicast_link_local(),
        })
        .filter(|a| !on_a_link(a))
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    let per_family = limits::HOST_ADDRESSES / 2;
    let v4 = addresses.iter().filter(|a| a.is_ipv4()).take(per_family);
    let v6 = addresses.iter().filter(|a| a.is_ipv6()).take(per_family);
    v4.chain(v6).map(IpAddr::to_string).collect()
}

fn link_ends(
    state: &ClassState,
    host: &HostState,
    this_node: &str,
    facts: &HostFacts,
) -> Vec<LinkEndStatus> {
    let refused = |device: &str| {
        facts
            .refusals
            .iter()
            .any(|r| r.link.as_deref() == Some(device))
    };
    let mut ends: Vec<LinkEndStatus> = host
        .links
        .iter()
        .filter(|l| l.class == state.name && !refused(&l.name))
        .filter_map(|l| {
            let key = NodePair::new(this_node, &l.peer)?;
            let (slot, _) = state.slot_of(&key)?;
            let probe = facts.link_probe(state.name, &l.peer);
            Some(LinkEndStatus {
                peer: l.peer.clone(),
                slot: i32::try_from(slot).ok()?,
                up: probe.and_then(|p| p.up),
                since: probe.and_then(|p| p.since).map(Time),
                rtt_microseconds: probe
                    .and_then(|p| p.rtt_microseconds)
                    .and_then(|r| i32::try_from(r).ok()),
                verified_mtu: probe
                    .and_then(|p| p.verified_mtu)
                    .and_then(|m| i32::try_from(m).ok()),
                message: probe
                    .and_then(|p| p.message.as_deref())
                    .map(|m| cut_bytes(m, limits::LINK_MESSAGE).into_owned()),
            })
        })
        .collect();
    ends.sort_by(|a, b| a.peer.cmp(&b.peer));
    ends.dedup_by(|a, b| a.peer == b.peer);
    ends.truncate(limits::LINK_ENDS);
    ends
}

/// The row of a node the class does not name: only its link ends. It says nothing of the
/// class's readiness (the merge leaves the condition and the ready nodes alone).
fn pod_end_row(
    state: &ClassState,
    this_node: &str,
    links: Vec<LinkEndStatus>,
    checks: Vec<crate::api::NodeCheck>,
    now: Timestamp,
) -> ClassRowWrite {
    ClassRowWrite {
        class: state.name.to_owned(),
        row: ClassNodeStatus {
            name: this_node.to_owned(),
            ready: true,
            links,
            accepting: Some(false),
            checks,
            ..ClassNodeStatus::default()
        },
        ready: ready_condition(state, now),
        accepting: Vec::new(),
        named: state.class.spec.nodes.len(),
        namespaces: Vec::new(),
    }
}

/// The class's `Ready` condition as this node computes it.
fn ready_condition(state: &ClassState, now: Timestamp) -> Condition {
    let stored = state
        .class
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    condition(
        conditions::READY,
        state.ready.is_true(),
        state.ready.reason.as_str(),
        &state.ready.message,
        state.class.metadata.generation,
        stored,
        now,
    )
}

/// The address of each of the class's interfaces on this node, and why the row is not ready
/// when one has none (or one kuport reserves): the first such interface.
fn interface_addresses(
    interfaces: &[String],
    facts: &HostFacts,
) -> (BTreeMap<String, String>, Option<String>) {
    let mut addresses = BTreeMap::new();
    let mut missing = Vec::new();
    for iface in interfaces {
        match facts.interfaces.get(iface) {
            Some(addr) if crate::ir::in_stand_in_block(*addr) => {
                let (block, len) = crate::ir::STAND_IN_BLOCK;
                missing.push(format!(
                    "interface {iface} has address {addr}, inside {block}/{len}, which kuport reserves for its stand-in address"
                ));
            }
            Some(addr) => {
                addresses.insert(iface.clone(), addr.to_string());
            }
            // An interface with an IPv6 address alone is there: it serves IPv6 mappings.
            None if facts.interface_address6(iface).is_some() => {}
            None => missing.push(format!("interface {iface} not present")),
        }
    }
    if missing.is_empty() {
        return (addresses, None);
    }
    let mut message = missing.join("; ");
    if !addresses.is_empty() {
        let serving: Vec<&str> = addresses.keys().map(String::as_str).collect();
        message = format!("{message}; serving on {} only", serving.join(", "));
    }
    (addresses, Some(message))
}

/// The checks of this node's row in `state`'s class, sorted by name, each cut to the schema's
/// lengths, at most [`limits::CHECKS`] of them.
fn row_checks(
    state: &ClassState,
    cni: Option<&CniFacts>,
    facts: &HostFacts,
) -> Vec<crate::api::NodeCheck> {
    let mut out: Vec<crate::api::NodeCheck> = super::checks::row_checks(state, cni, facts)
        .into_iter()
        .map(|c| crate::api::NodeCheck {
            name: cut_bytes(&c.name, limits::CHECK_NAME).into_owned(),
            ok: c.ok,
            message: cut_bytes(&c.message, limits::CHECK_MESSAGE).into_owned(),
        })
        .collect();
    out.sort();
    out.dedup_by(|a, b| a.name == b.name);
    out.truncate(limits::CHECKS);
    out
}

/// The CNI facts as a row reports them, cut to the schema's lengths.
fn cni_info(c: &CniFacts) -> CniInfo {
    CniInfo {
        name: cut_bytes(&c.name, limits::CNI_WORD).into_owned(),
        routing_mode: c
            .routing_mode
            .as_deref()
            .map(|m| cut_bytes(m, limits::CNI_WORD).into_owned()),
        vxlan_port: Some(i32::from(c.vxlan_port)),
    }
}

/// The refusals of this node's last apply, each under the class of its mapping (a refusal of a
/// mapping that no longer exists is dropped, and so is a refused link the mapping only keeps as a
/// standby: its traffic does not use it), sorted.
fn kernel_refusal_writes(
    index: &Index,
    work: &[Working],
    this_node: &str,
    facts: &HostFacts,
) -> Vec<KernelRefusalWrite> {
    let mut out: Vec<KernelRefusalWrite> = facts
        .refusals
        .iter()
        .filter_map(|r| {
            let w = work
                .iter()
                .find(|w| MappingKey::names(&r.mapping, &w.decision.namespace, &w.decision.name))?;
            if standby_only(&w.decision, this_node, r) {
                return None;
            }
            Some(KernelRefusalWrite {
                class: w.pm.spec.class_name.clone(),
                mapping: r.mapping.clone(),
                message: cut_bytes(&r.message, limits::MESSAGE).into_owned(),
            })
        })
        .collect();
    // This node translates these mappings to an address of its own, or of no Pod bound to it:
    // it leaves them out and says so, as it would a kernel refusal.
    out.extend(work.iter().filter(|w| w.decision.emits).filter_map(|w| {
        let message =
            pod_network::refused_endpoint(&w.decision, this_node, facts, &index.pod_addresses)?;
        Some(KernelRefusalWrite {
            class: w.pm.spec.class_name.clone(),
            mapping: MappingKey::new(&w.decision.namespace, &w.decision.name).into_string(),
            message,
        })
    }));
    out.sort();
    out.dedup();
    out
}

/// The most claims a row keeps for holders that are gone. Claims are made only for ports some
/// PortMap asked for while a holder was present, so this is rarely reached; past it the claims
/// gone the longest are dropped first, to keep the row bounded.
pub const MAX_ABSENT_CLAIMS: usize = 64;

/// The ports this node reports as held in its row of a class: every holder (host socket,
/// NodePort, hostPort) of a port some PortMap of the class asks for, on an address the class
/// binds on this node (or on every address), and every claim the stored row already records,
/// whether its holder is still there or not. A claim outlives its holder (a daemon restarting,
/// a Pod or Service recreated), so no mapping gets a port by waiting for that moment; only the
/// administrator's release annotation drops it.
fn held_ports(
    index: &Index,
    class: &PortMapClass,
    addresses: &BTreeMap<String, String>,
    this_node: &str,
    facts: &HostFacts,
    stored_row: Option<&ClassNodeStatus>,
    now: Timestamp,
) -> (Vec<HeldPort>, Option<String>) {
    let asked = AskedPorts::of_class(index, class);
    let holders = holders::on_node(&index.node_ports, &index.host_ports, this_node, facts);
    // The interfaces' IPv6 addresses count too: a socket bound to one holds the port there.
    let addresses6: Vec<String> = addresses
        .keys()
        .filter_map(|i| facts.interface_address6(i))
        .map(|a| a.to_string())
        .collect();
    let bound = |h: &Holder| {
        let text = h.address.to_string();
        h.address.is_unspecified() || addresses.values().chain(&addresses6).any(|a| *a == text)
    };
    let asked_now = |h: &Holder| asked.contains(h.protocol, h.port);
    // One entry per (protocol, port, address): the first holder in sorted order names it.
    let mut present: BTreeMap<(Protocol, i32, String), &Holder> = BTreeMap::new();
    for h in holders.iter().filter(|h| bound(h)) {
        present
            .entry((h.protocol, i32::from(h.port), h.address.to_string()))
            .or_insert(h);
    }
    let stored: &[HeldPort] = stored_row
        .map(|r| r.held_ports.as_slice())
        .unwrap_or_default();
    let existing = |m: &String| {
        index.portmaps.iter().any(|pm| {
            let meta = &pm.metadata;
            (meta.namespace.as_deref().zip(meta.name.as_deref()))
                .is_some_and(|(ns, name)| MappingKey::names(m, ns, name))
        })
    };
    let mut held: Vec<HeldPort> = Vec::new();
    for (key, h) in &present {
        let recorded = stored
            .iter()
            .any(|s| (s.protocol, s.port, s.address.as_str()) == (key.0, key.1, key.2.as_str()));
        if !recorded && !asked_now(h) {
            continue;
        }
        let mut yields = yields_to(h.protocol, h.port, &key.2, facts, stored_row);
        yields.retain(|m| existing(m));
        yields.truncate(limits::YIELDS_TO);
        held.push(HeldPort {
            protocol: h.protocol,
            port: key.1,
            address: key.2.clone(),
            // A Service's or Pod's name may be longer than the schema takes in a holder.
            holder: cut_bytes(&h.holder, limits::HOLDER).into_owned(),
            yields_to: yields,
            absent_since: None,
        });
    }
    let absent = absent_claims(class, stored, &present, existing, now);
    held.sort();
    // Bounded whatever the PortMaps ask: the present holders with the lowest keys, then every
    // kept claim (at most [`MAX_ABSENT_CLAIMS`]). A holder left out is not a claim any mapping
    // is refused for; this node still leaves its port out of its own datapath, and the row
    // says how many were left out.
    let room = limits::HELD_PORTS - absent.len().min(limits::HELD_PORTS);
    let unlisted = held.len().saturating_sub(room);
    held.truncate(room);
    held.extend(absent);
    held.sort();
    held.dedup_by(|a, b| (a.protocol, a.port, &a.address) == (b.protocol, b.port, &b.address));
    let note = (unlisted > 0).then(|| {
        format!(
            "{unlisted} more ports held on this node by host sockets, NodePorts or hostPorts that PortMaps of this class ask for are not listed in heldPorts (at most {}); mappings are not refused for them, but this node leaves them out of its datapath",
            limits::HELD_PORTS
        )
    });
    (held, note)
}

/// The stored claims whose holder is gone: kept (stamped with when it went) until the release
/// annotation names a later time, at most [`MAX_ABSENT_CLAIMS`] of them, those gone the shortest
/// time first. Their `yieldsTo` keeps only mappings that still exist.
fn absent_claims(
    class: &PortMapClass,
    stored: &[HeldPort],
    present: &BTreeMap<(Protocol, i32, String), &Holder>,
    existing: impl Fn(&String) -> bool,
    now: Timestamp,
) -> Vec<HeldPort> {
    let released = release_time(class);
    let mut absent: Vec<HeldPort> = stored
        .iter()
        .filter(|s| !present.contains_key(&(s.protocol, s.port, s.address.clone())))
        .map(|s| {
            let mut claim = s.clone();
            claim.absent_since = Some(claim.absent_since.unwrap_or(Time(now)));
            claim.yields_to.retain(|m| existing(m));
            claim
        })
        .filter(|c| {
            let since = c.absent_since.as_ref().map(|t| t.0);
            !matches!((since, released), (Some(since), Some(at)) if since <= at)
        })
        .collect();
    // Keep the claims gone the shortest time; a tie goes by key.
    absent.sort_by(|a, b| {
        (b.absent_since.as_ref(), &a.protocol, a.port, &a.address).cmp(&(
            a.absent_since.as_ref(),
            &b.protocol,
            b.port,
            &b.address,
        ))
    });
    absent.truncate(MAX_ABSENT_CLAIMS);
    absent
}

/// The port ranges the PortMaps of a class ask for, per protocol, answering "is this port
/// asked for" in O(log n): a class may have thousands of mappings and a cluster thousands of
/// NodePorts.
struct AskedPorts {
    /// Per protocol: range starts, sorted, and the highest range end up to each start.
    by_protocol: BTreeMap<Protocol, (Vec<u16>, Vec<u16>)>,
}

impl AskedPorts {
    /// The ranges the PortMaps `class` weighs ask for ([`mapping::asked_ports`]): a PortMap of
    /// a namespace the class does not select, or outside its window, asks for nothing here.
    fn of_class(index: &Index, class: &PortMapClass) -> Self {
        Self::new(index.portmaps.iter().filter_map(|pm| {
            let ports = mapping::asked_ports(index, pm, class)?;
            Some((pm.spec.protocol, ports.first, ports.last))
        }))
    }

    fn new(ranges: impl Iterator<Item = (Protocol, u16, u16)>) -> Self {
        let mut sorted: BTreeMap<Protocol, Vec<(u16, u16)>> = BTreeMap::new();
        for (protocol, first, last) in ranges {
            sorted.entry(protocol).or_default().push((first, last));
        }
        let by_protocol = sorted
            .into_iter()
            .map(|(protocol, mut ranges)| {
                ranges.sort_unstable();
                let firsts = ranges.iter().map(|r| r.0).collect();
                let reach = ranges
                    .iter()
                    .scan(0u16, |max, r| {
                        *max = (*max).max(r.1);
                        Some(*max)
                    })
                    .collect();
                (protocol, (firsts, reach))
            })
            .collect();
        Self { by_protocol }
    }

    fn contains(&self, protocol: Protocol, port: u16) -> bool {
        let Some((firsts, reach)) = self.by_protocol.get(&protocol) else {
            return false;
        };
        // Ranges starting at or below the port; the furthest of them must reach it.
        let n = firsts.partition_point(|f| *f <= port);
        n > 0 && reach[n - 1] >= port
    }
}

/// The time the class's release annotation names: claims whose holder has been gone since then
/// or earlier are dropped. A value that is not an RFC 3339 time releases nothing.
fn release_time(class: &PortMapClass) -> Option<Timestamp> {
    class
        .metadata
        .annotations
        .as_ref()?
        .get(crate::api::RELEASE_HELD_PORTS_ANNOTATION)?
        .trim()
        .parse()
        .ok()
}

/// The firewall warnings of a row, sorted, each cut to the schema's length and at most
/// [`limits::WARNINGS`] of them, the last saying how many more there were.
fn row_warnings<'w>(found: impl Iterator<Item = &'w String>) -> Vec<String> {
    let mut warnings: Vec<String> = found
        .map(|w| cut_bytes(w, limits::MESSAGE).into_owned())
        .collect();
    warnings.sort();
    warnings.dedup();
    if warnings.len() > limits::WARNINGS {
        let more = warnings.len() - (limits::WARNINGS - 1);
        warnings.truncate(limits::WARNINGS - 1);
        warnings.push(format!("and {more} more warnings"));
    }
    warnings
}

/// The collection of the claims `this_node` looks after (see [`collector`]).
fn gc(state: &ClassState, this_node: &str, now: Timestamp) -> Vec<GcAction> {
    let mut actions = Vec::new();
    for (key, claim) in &state.claims {
        if collector(state, key) != Some(this_node) {
            continue;
        }
        // Standby pairs count as needed: their claims are what lets the serving node move
        // without waiting, so they are never aged out while their nodes could serve.
        let needed = state.builds_links() && state.needed.contains_key(key);
        let action = match (needed, claim.unused_since) {
            (true, Some(_)) => Some(GcKind::ClearUnused),
            (true, None) => None,
            (false, None) => Some(GcKind::MarkUnused),
            (false, Some(since)) => (now.as_second() - since.as_second() > CLAIM_GC_AFTER_SECONDS)
                .then_some(GcKind::Drop),
        };
        if let Some(action) = action {
            actions.push(GcAction {
                class: state.name.to_owned(),
                key: key.to_string(),
                action,
            });
        }
    }
    actions
}

/// The one accepting node that marks, clears and drops the claim of `key`: the first of its
/// two nodes that accepts for the class, else the class's first accepting node. Every node
/// finds the same one from the same snapshot, so a pod move's marks are written once, not by
/// every accepting node at the same moment (each of those writes but the first would find its
/// elements changed and read the class again).
fn collector<'a>(state: &ClassState<'a>, key: &NodePair) -> Option<&'a str> {
    // The pair's names are sorted, and so is the accepting list.
    let (a, b) = key.nodes();
    let accepting = |n: &str| {
        let at = state.accepting.binary_search(&n).ok()?;
        state.accepting.get(at).copied()
    };
    accepting(a)
        .or_else(|| accepting(b))
        .or_else(|| state.accepting.first().copied())
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt as _;

    use super::*;
    use crate::api::PortMapClass;

    /// The schema's bound at `path` (JSON pointer into the status schema) for `key`.
    fn bound(path: &str, key: &str) -> usize {
        let crd = serde_json::to_value(PortMapClass::crd()).expect("json");
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"];
        let node = status
            .pointer(path)
            .unwrap_or_else(|| panic!("no {path} in the status schema"));
        node[key]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or_else(|| panic!("{path} has no {key}"))
    }

    #[test]
    fn ipv4_text_is_to_string() {
        let samples = [
            0u32,
            1,
            9,
            10,
            99,
            100,
            255,
            0x0a00_0001,
            0xc0a8_6465,
            u32::MAX,
        ];
        for bits in samples
            .into_iter()
            .chain((0..4096u32).map(|i| i.wrapping_mul(2_654_435_761)))
        {
            let address = Ipv4Addr::from(bits);
            assert_eq!(ipv4_text(address), address.to_string());
        }
    }

    #[test]
    fn the_limits_are_the_schemas() {
        let row = "/nodes/items/properties";
        assert_eq!(
            bound(&format!("{row}/message"), "maxLength"),
            limits::MESSAGE
        );
        assert_eq!(
            bound(&format!("{row}/warnings"), "maxItems"),
            limits::WARNINGS
        );
        assert_eq!(
            bound(&format!("{row}/warnings/items"), "maxLength"),
            limits::MESSAGE
        );
        assert_eq!(
            bound(&format!("{row}/heldPorts"), "maxItems"),
            limits::HELD_PORTS
        );
        let held = format!("{row}/heldPorts/items/properties");
        assert_eq!(
            bound(&format!("{held}/holder"), "maxLength"),
            limits::HOLDER
        );
        assert_eq!(
            bound(&format!("{held}/yieldsTo"), "maxItems"),
            limits::YIELDS_TO
        );
        let cni = format!("{row}/cni/properties");
        assert_eq!(bound(&format!("{cni}/name"), "maxLength"), limits::CNI_WORD);
        assert_eq!(
            bound(&format!("{cni}/routingMode"), "maxLength"),
            limits::CNI_WORD
        );
        assert_eq!(
            bound("/refused/items/properties/message", "maxLength"),
            limits::MESSAGE
        );
        assert_eq!(
            bound(&format!("{row}/links"), "maxItems"),
            limits::LINK_ENDS
        );
        assert_eq!(
            bound(
                &format!("{row}/links/items/properties/message"),
                "maxLength"
            ),
            limits::LINK_MESSAGE
        );
        assert_eq!(bound(&format!("{row}/checks"), "maxItems"), limits::CHECKS);
        assert_eq!(
            bound(&format!("{row}/hostAddresses"), "maxItems"),
            limits::HOST_ADDRESSES
        );
        assert_eq!(
            bound(&format!("{row}/hostAddresses/items"), "maxLength"),
            45
        );
        let check = format!("{row}/checks/items/properties");
        assert_eq!(
            bound(&format!("{check}/name"), "maxLength"),
            limits::CHECK_NAME
        );
        assert_eq!(
            bound(&format!("{check}/message"), "maxLength"),
            limits::CHECK_MESSAGE
        );
    }

    #[test]
    fn warnings_are_cut_and_counted() {
        let found: Vec<String> = (0..40)
            .map(|i| format!("{i:02} {}", "w".repeat(2000)))
            .collect();
        let warnings = row_warnings(found.iter());
        assert_eq!(warnings.len(), limits::WARNINGS);
        assert!(warnings.iter().all(|w| w.len() <= limits::MESSAGE));
        assert_eq!(
            warnings.last().map(String::as_str),
            Some("and 9 more warnings")
        );
        let few = row_warnings(["b".to_owned(), "a".to_owned(), "a".to_owned()].iter());
        assert_eq!(few, ["a", "b"]);
    }
}
