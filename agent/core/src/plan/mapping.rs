//! Per-PortMap resolution: admission and conflicts, endpoint, serving and programming nodes,
//! links needed, the `Programmed` gates, published rows and the status writer.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::bindings::{Bindings, Holder, SetId};
use super::endpoint::Candidate;
use super::fast_hash::FastMap;
use super::index::{HeldRow, Index, Selection};
use super::quota::Quotas;
use super::reasons::{AcceptedReason, Outcome, ProgrammedReason, Say};
use super::state::{ClassState, Group, Working, standby_only};
use super::{Detail, MappingDecision, NeededLink, endpoint};
use crate::api::{
    MAX_PORT, MIN_PORT, PortMap, PortMapClass, Protocol, PublishedAddress, ReturnPathMode,
    ServingMode, checks,
};
use crate::ir::PortRange;
use crate::keys::{MappingKey, Name, NodePair};
use crate::snapshot::HostFacts;

/// What admission has handed out so far: the ports held per binding set, and per namespace.
struct Ledger {
    bindings: Bindings,
    quotas: Quotas,
}

/// Admission of every PortMap, walking them in conflict order. Also returns the interned
/// binding sets, which resolution reuses, and the ports each namespace holds per class.
pub fn admit_all<'a>(index: &Index<'a>) -> (Vec<Working<'a>>, Bindings, Quotas) {
    let mut ledger = Ledger {
        bindings: Bindings::new(index.classes.values().copied()),
        quotas: Quotas::default(),
    };
    let empty = Empty::default();
    let work = index
        .portmaps
        .iter()
        .enumerate()
        .map(|(position, pm)| admit(index, position, pm, &mut ledger, &empty))
        .collect();
    (work, ledger.bindings, ledger.quotas)
}

/// The empty shared lists a decision starts with, allocated once per pass: each decision holds
/// a reference to them until resolution gives it its own, instead of allocating (and then
/// freeing) three empty ones per mapping.
#[derive(Default)]
struct Empty {
    nodes: Arc<[Name]>,
    published: Arc<[PublishedAddress]>,
    bindings: Arc<BTreeMap<String, Vec<String>>>,
}

/// `position`: the mapping's place in conflict order, which names it as a holder of ports.
fn admit<'a>(
    index: &Index<'a>,
    position: Holder,
    pm: &'a PortMap,
    ledger: &mut Ledger,
    empty: &Empty,
) -> Working<'a> {
    let namespace = index.name(pm.metadata.namespace.as_deref().unwrap_or_default());
    let name = pm.metadata.name.clone().unwrap_or_default();
    let spec = &pm.spec;
    let ports = port_range(spec.port, spec.end_port);
    let found = index.class_by_name.get_key_value(spec.class_name.as_str());
    let (accepted, set) = match found {
        Some((_, (class, class_name))) => {
            let asking = Asking {
                pm,
                class: (class_name, class),
                namespace: &namespace,
                position,
            };
            check(index, &asking, ports, ledger)
        }
        None => (
            Outcome::new(
                AcceptedReason::ClassNotFound,
                format!("PortMapClass {:?} does not exist", spec.class_name),
            ),
            None,
        ),
    };
    Working {
        pm,
        decision: MappingDecision {
            namespace,
            name,
            class: match found {
                Some((_, (_, class_name))) => class_name.clone(),
                None => index.name(&spec.class_name),
            },
            protocol: spec.protocol,
            ports,
            generation: pm.metadata.generation,
            accepted,
            programmed: None,
            endpoint: None,
            rejected_endpoints: Vec::new(),
            serving_node: None,
            programming_nodes: empty.nodes.clone(),
            status_writer: None,
            published: empty.published.clone(),
            links: Vec::new(),
            standby_links: Vec::new(),
            bindings: empty.bindings.clone(),
            emits: false,
        },
        remote: false,
        set,
        group: None,
        endpoint_rejection: None,
        settling: false,
    }
}

/// The port range of a spec, when both ends are real ports and in order.
fn port_range(port: i32, end_port: Option<i32>) -> Option<PortRange> {
    let first = u16::try_from(port).ok().filter(|p| *p != 0)?;
    let last = u16::try_from(end_port.unwrap_or(port))
        .ok()
        .filter(|p| *p != 0)?;
    (last >= first).then_some(PortRange { first, last })
}

fn spec_ports_text(port: i32, end_port: Option<i32>) -> String {
    match end_port {
        Some(end) if end != port => format!("ports {port}-{end}"),
        _ => format!("port {port}"),
    }
}

/// The ports a PortMap asks of `class` when the class would weigh it at all: it names the
/// class and passes every gate on the mapping and the class alone ([`admissible`]: its
/// namespace selected, its ports in the window). Only such a mapping may make the class's
/// nodes record what holds its ports: a PortMap the class refuses outright affects nothing in
/// the class. The answer does not depend on what the nodes hold, so a mapping refused a held
/// port keeps asking for it (and the claim that refuses it stays).
pub fn asked_ports(index: &Index, pm: &PortMap, class: &PortMapClass) -> Option<PortRange> {
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    if pm.spec.class_name != class_name {
        return None;
    }
    let namespace = pm.metadata.namespace.as_deref().unwrap_or_default();
    let ports = port_range(pm.spec.port, pm.spec.end_port);
    admissible(index, pm, class, ports, namespace).ok()
}

/// The gates on the mapping and its class alone: a valid range and interface names, a
/// selected namespace, the class's port window and reserved ports. The ports, or the refusal.
fn admissible(
    index: &Index,
    pm: &PortMap,
    class: &PortMapClass,
    ports: Option<PortRange>,
    namespace: &str,
) -> Result<PortRange, Outcome<AcceptedReason>> {
    let spec = &pm.spec;
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    if let Some(end) = spec.end_port.filter(|end| *end < spec.port) {
        return Err(Outcome::new(
            AcceptedReason::InvalidPortRange,
            format!("endPort {end} is lower than port {}", spec.port),
        ));
    }
    if let Some(bad) = first_invalid_interface(index, class_name, &spec.interfaces) {
        return Err(Outcome::new(
            AcceptedReason::InvalidInterfaceName,
            format!(
                "interface name {bad:?} (class {class_name}) is not a usable interface name: 1 to 15 of A-Z a-z 0-9 . _ @ + -, not starting with a dot"
            ),
        ));
    }
    if let Some(outcome) = check_namespace(index, class, class_name, namespace) {
        return Err(outcome);
    }
    let window = &class.spec.ports;
    let (min, max) = (window.min.max(MIN_PORT), window.max.min(MAX_PORT));
    let Some(ports) = ports.filter(|p| i32::from(p.first) >= min && i32::from(p.last) <= max)
    else {
        return Err(Outcome::new(
            AcceptedReason::PortOutOfRange,
            format!(
                "{} lie outside the window {min}-{max} of class {class_name}",
                spec_ports_text(spec.port, spec.end_port)
            ),
        ));
    };
    let mut reserved: Vec<i32> = window
        .reserved
        .iter()
        .copied()
        .filter(|r| (i32::from(ports.first)..=i32::from(ports.last)).contains(r))
        .collect();
    reserved.sort_unstable();
    if let Some(first) = reserved.first() {
        return Err(Outcome::new(
            AcceptedReason::PortReserved,
            format!("port {first} is reserved by class {class_name}"),
        ));
    }
    // The lowest system-reserved span the range touches (spans may be listed in any order).
    let (first, last) = (i32::from(ports.first), i32::from(ports.last));
    let system = window
        .system_reserved
        .iter()
        .filter(|s| s.port <= last && s.last() >= first)
        .min_by_key(|s| (s.port.max(first), s.port, s.last()));
    if let Some(span) = system {
        return Err(Outcome::new(
            AcceptedReason::PortReserved,
            format!(
                "port {} is kept back by class {class_name} for the nodes' own services (spec.ports.systemReserved {span}: the Kubernetes NodePort range and well-known node service ports by default); the administrator opts in by leaving it out of that list",
                span.port.max(first)
            ),
        ));
    }
    let service = &spec.service_ref.name;
    if !index.service_exists(namespace, service) {
        return Err(Outcome::new(
            AcceptedReason::ServiceNotFound,
            format!(
                "Service {namespace}/{service} does not exist; the mapping holds no port until it does"
            ),
        ));
    }
    Ok(ports)
}

/// Admission past the class's existence: the outcome, and the mapping's binding set once it
/// got that far. The set is interned only after every refusal that needs none (the namespace
/// first), so objects a class refuses cost no set.
fn check(
    index: &Index,
    asking: &Asking,
    ports: Option<PortRange>,
    ledger: &mut Ledger,
) -> (Outcome<AcceptedReason>, Option<SetId>) {
    let Asking {
        pm,
        class: (class_name, class),
        namespace,
        position,
    } = *asking;
    let bindings = &mut ledger.bindings;
    let spec = &pm.spec;
    let namespace: &str = namespace;
    let name = pm.metadata.name.as_deref().unwrap_or_default();
    let class_name: &str = class_name;
    let ports = match admissible(index, pm, class, ports, namespace) {
        Ok(ports) => ports,
        Err(refused) => return (refused, None),
    };
    if let Some(message) = held_by_node(index, spec.protocol, ports) {
        return (Outcome::new(AcceptedReason::PortInUse, message), None);
    }
    // Earliest wins: a mapping accepted before a host socket took its port keeps it, and says
    // so; a new or changed one is refused the port.
    let host_clash = held_on_accepting_node(index, class_name, spec, ports, (namespace, name));
    if let Some(clash) = host_clash.as_ref().filter(|c| {
        !c.yields_to
            .iter()
            .any(|m| MappingKey::names(m, namespace, name))
    }) {
        return (
            Outcome::new(AcceptedReason::PortInUse, clash.refusal(spec.protocol)),
            None,
        );
    }
    if let Some(missing) = bindings.first_unoffered(class_name, class, &spec.interfaces) {
        let message = format!("interface {missing} is not given to any node by class {class_name}");
        return (
            Outcome::new(AcceptedReason::InterfaceNotInClass, message),
            None,
        );
    }
    let set = bindings.set_of(class_name, class, &spec.interfaces);
    if let Some(refused) = conflict(index, spec, ports, bindings, set) {
        return (refused, Some(set));
    }
    if let Err(message) = ledger.quotas.take(asking.class, asking.namespace, ports) {
        let refused = Outcome::new(AcceptedReason::PortQuotaExceeded, message);
        return (refused, Some(set));
    }
    ledger.bindings.hold(spec.protocol, set, ports, position);
    (accepted(spec, host_clash), Some(set))
}

/// A PortMap being admitted: the object, its class (shared name and object), its namespace
/// and its place in conflict order (which names it as a holder of ports).
struct Asking<'p> {
    pm: &'p PortMap,
    class: (&'p Name, &'p PortMapClass),
    namespace: &'p Name,
    position: Holder,
}

/// `PortConflict` when an earlier mapping holds one of the ports on a shared (node,
/// interface).
fn conflict(
    index: &Index,
    spec: &crate::api::PortMapSpec,
    ports: PortRange,
    bindings: &mut Bindings,
    set: SetId,
) -> Option<Outcome<AcceptedReason>> {
    let c = bindings.conflict(spec.protocol, set, ports)?;
    {
        let what = if c.shared_ports.is_range() {
            format!("ports {} are", c.shared_ports)
        } else {
            format!("port {} is", c.shared_ports)
        };
        Some(Outcome::new(
            AcceptedReason::PortConflict,
            format!(
                "{what} held by {} ({} on {}/{})",
                holder_name(index, c.holder),
                spec.protocol.as_str(),
                c.node,
                c.iface
            ),
        ))
    }
}

/// The outcome of a mapping that holds its ports: accepted, noting a host holder that came
/// after it.
fn accepted(
    spec: &crate::api::PortMapSpec,
    host_clash: Option<HostClash>,
) -> Outcome<AcceptedReason> {
    match host_clash {
        Some(clash) => Outcome::new(
            AcceptedReason::PortAlsoHeldByHost,
            format!(
                "{} on node {} now also holds {} port {}; this mapping was accepted first and keeps the port, so traffic for it on the mapped addresses reaches the pod, not that holder",
                clash.holder,
                clash.node,
                spec.protocol.as_str(),
                clash.port
            ),
        ),
        None => Outcome::new(AcceptedReason::Valid, ""),
    }
}

/// `namespace/name` of the mapping at `position` in conflict order.
fn holder_name(index: &Index, position: Holder) -> String {
    let Some(pm) = index.portmaps.get(position) else {
        return String::new();
    };
    MappingKey::new(
        pm.metadata.namespace.as_deref().unwrap_or_default(),
        pm.metadata.name.as_deref().unwrap_or_default(),
    )
    .into_string()
}

/// Something on an accepting node (a host socket, a NodePort, a hostPort) that holds or held
/// one of the mapping's ports, on an address the mapping would bind there, as that node
/// reported it in its class row.
struct HostClash {
    node: String,
    port: i32,
    holder: String,
    yields_to: Vec<String>,
    /// Set when the holder is gone and only its claim remains.
    absent_since: Option<String>,
}

impl HostClash {
    /// The refusal's message.
    fn refusal(&self, protocol: Protocol) -> String {
        let (proto, port) = (protocol.as_str(), self.port);
        match &self.absent_since {
            None => format!(
                "{} on node {} holds {proto} port {port}; a mapping there would take its traffic",
                self.holder, self.node
            ),
            Some(since) => format!(
                "{} on node {} held {proto} port {port} and keeps its claim while it is gone (since {since}): a mapping there would take its traffic when it returns. The administrator releases the claim with the class annotation {}",
                self.holder,
                self.node,
                crate::api::RELEASE_HELD_PORTS_ANNOTATION
            ),
        }
    }
}

/// The clash that decides admission: the first (in the class's node order, then port) whose
/// holder does not yield to the mapping (`namespace`, `name`), else the first present one that does. A mapping keeps a port only
/// where every node reporting a holder of it was already forwarding it when the holder came.
fn held_on_accepting_node(
    index: &Index,
    class_name: &str,
    spec: &crate::api::PortMapSpec,
    ports: PortRange,
    (namespace, name): (&str, &str),
) -> Option<HostClash> {
    let in_range = |p: i32| (i32::from(ports.first)..=i32::from(ports.last)).contains(&p);
    let held_rows = index.held_rows.get(class_name)?;
    let mut yielding = None;
    for HeldRow {
        node,
        class_node,
        row,
    } in held_rows
    {
        let bound = || {
            class_node
                .interfaces
                .iter()
                .filter(|i| spec.interfaces.is_empty() || spec.interfaces.contains(i))
        };
        if bound().next().is_none() {
            continue;
        }
        let clashes = row.held_ports.iter().filter(|h| {
            h.protocol == spec.protocol
                && in_range(h.port)
                && (h.address == "0.0.0.0"
                    || bound().any(|i| {
                        row.addresses.get(i) == Some(&h.address)
                            || row.addresses6.get(i) == Some(&h.address)
                    }))
        });
        for h in clashes {
            let clash = HostClash {
                node: (*node).to_owned(),
                port: h.port,
                holder: h.holder.clone(),
                yields_to: h.yields_to.clone(),
                absent_since: h.absent_since.as_ref().map(|t| t.0.to_string()),
            };
            if !clash
                .yields_to
                .iter()
                .any(|m| MappingKey::names(m, namespace, name))
            {
                return Some(clash);
            }
            // A claim yielding to the mapping whose holder is gone takes nothing from it.
            if clash.absent_since.is_none() {
                yielding.get_or_insert(clash);
            }
        }
    }
    yielding
}

/// The first name the mapping would bind that kuport refuses: among its own `interfaces`, or
/// the class's when it names none.
fn first_invalid_interface(
    index: &Index,
    class_name: &str,
    requested: &[String],
) -> Option<String> {
    if requested.is_empty() {
        return index
            .invalid_class_interface
            .get(class_name)
            .map(|n| (*n).to_owned());
    }
    requested
        .iter()
        .filter(|n| !crate::api::valid_interface_name(n))
        .min()
        .cloned()
}

/// Ports every node depends on, which no mapping may capture: each Vxlan class's link port (the
/// kernel's VXLAN socket listens on every address) and the CNI's overlay port. The message
/// names the holder.
fn held_by_node(index: &Index, protocol: Protocol, ports: PortRange) -> Option<String> {
    if protocol != Protocol::Udp {
        return None;
    }
    let (port, holder) = index
        .node_udp_ports
        .iter()
        .find(|(p, _)| ports.first <= *p && *p <= ports.last)?;
    Some(format!(
        "UDP port {port} is used by {holder} on every node; a mapping there would capture its traffic"
    ))
}

fn check_namespace(
    index: &Index,
    class: &PortMapClass,
    class_name: &str,
    namespace: &str,
) -> Option<Outcome<AcceptedReason>> {
    let refuse =
        |message: String| Some(Outcome::new(AcceptedReason::NamespaceNotSelected, message));
    match index.namespace_selection(class, class_name, namespace) {
        Selection::Selected => None,
        Selection::NotFound => refuse(format!(
            "namespace {namespace} was not found, so the selector of class {class_name} cannot match it"
        )),
        Selection::NotSelected => refuse(format!(
            "namespace {namespace} does not match the namespace selector of class {class_name}"
        )),
        Selection::Unparsable => refuse(format!(
            "the namespace selector of class {class_name} cannot be parsed, so it selects no namespace"
        )),
    }
}

/// The classes by name, for the one lookup each mapping makes per stage (hashing a name once
/// costs less than comparing it at each level of the sorted map).
fn by_name<'m, 'k, 'a>(
    classes: &'m BTreeMap<&'k str, ClassState<'a>>,
) -> FastMap<&'k str, &'m ClassState<'a>> {
    classes.iter().map(|(name, class)| (*name, class)).collect()
}

/// [`ClassState::slot_of`] of every pair a class has a slot for, by (class, pair): thousands of
/// links look their slot up, and a hash finds it without comparing pair names at each level of
/// the claims and proposals.
fn slot_table<'m, 'a: 'm>(
    classes: impl Iterator<Item = &'m ClassState<'a>>,
) -> FastMap<(&'a str, &'m NodePair), (u32, bool)> {
    let mut slots = FastMap::default();
    for class in classes {
        for pair in class.claims.keys().chain(class.proposals.keys()) {
            if let Some(slot) = class.slot_of(pair) {
                slots.entry((class.name, pair)).or_insert(slot);
            }
        }
    }
    slots
}

/// Endpoint, serving and programming nodes, bindings and needed links of accepted mappings.
pub fn resolve_all<'a>(
    index: &Index,
    classes: &BTreeMap<&str, ClassState<'a>>,
    bindings: &Bindings,
    work: &mut [Working<'a>],
) {
    // Thousands of mappings share a few groups: their node lists and binding maps are built
    // once per group and shared, not copied into each decision.
    type Shared = (Arc<[Name]>, Arc<BTreeMap<String, Vec<String>>>);
    let mut shared: FastMap<Group<'a>, Shared> = FastMap::default();
    let mut pairs = PairCache::default();
    let classes = by_name(classes);
    for w in work.iter_mut().filter(|w| w.decision.accepted.is_true()) {
        let Some(class) = classes.get(w.decision.class.as_str()).copied() else {
            continue;
        };
        let choice = endpoint::choose(index, w.pm, class);
        w.endpoint_rejection = endpoint::rejection_message(
            &w.decision.namespace,
            &w.pm.spec.service_ref.name,
            &choice,
        );
        let d = &mut w.decision;
        d.endpoint = choice.endpoint;
        d.rejected_endpoints = choice.rejected;
        let ranked = choice.ranked;
        let Some(ep) = &d.endpoint else { continue };
        let rank = class.rank.get(ep.node.as_str()).copied().unwrap_or(0);
        let (Some(serving), Some(serving_name)) =
            (class.accepting.get(rank), class.accepting_names.get(rank))
        else {
            continue;
        };
        let serving = *serving;
        d.serving_node = Some(serving_name.clone());
        let single = class.class.spec.serving_mode == ServingMode::Single;
        let Some(set) = w.set else {
            d.programming_nodes = programming_nodes(index, class, serving);
            continue;
        };
        let group = (class.name, set, single.then_some(serving));
        w.group = Some(group);
        let (nodes, bound) = shared
            .entry(group)
            .or_insert_with(|| {
                let nodes = programming_nodes(index, class, serving);
                let all = &bindings.set(set).by_node;
                let bound = nodes
                    .iter()
                    .map(|n| {
                        (
                            n.to_string(),
                            all.get(n.as_str()).cloned().unwrap_or_default(),
                        )
                    })
                    .collect();
                (nodes, Arc::new(bound))
            })
            .clone();
        d.programming_nodes = nodes;
        d.bindings = bound;
        w.remote = d.programming_nodes.iter().any(|n| *n != ep.node);
        let all = &bindings.set(set).by_node;
        needed_links(class, w, serving, all, &ranked, &mut pairs);
    }
}

/// Whether the mapping emits rules at all, and the serving and standby links it needs.
/// `ranked`: the mapping's endpoints, best first.
fn needed_links(
    class: &ClassState,
    w: &mut Working,
    serving: &str,
    all: &BTreeMap<String, Vec<String>>,
    ranked: &[Candidate],
    pairs: &mut PairCache,
) {
    let d = &mut w.decision;
    let Some(ep) = &d.endpoint else { return };
    let range_translation = d.ports.is_some_and(|p| p.is_range() && p.first != ep.port);
    let refused = w.remote && class.mode == ReturnPathMode::None;
    d.emits = !range_translation && !refused;
    if d.emits && w.remote && class.builds_links() {
        d.links = d
            .programming_nodes
            .iter()
            // A node binding nothing emits nothing, so it needs no link.
            .filter(|p| **p != ep.node && d.bindings.get(p.as_str()).is_some_and(|i| !i.is_empty()))
            .filter_map(|p| pairs.get(p, &ep.node))
            .map(|key| NeededLink {
                class: d.class.clone(),
                key,
                slot: None,
                landed: false,
            })
            .collect();
        d.links.sort();
        d.links.dedup();
        let single = class.class.spec.serving_mode == ServingMode::Single;
        if single && serving != ep.node {
            d.standby_links = standby_links(d, &class.accepting, all, &ep.node, pairs);
        }
    }
    if d.emits && class.builds_links() {
        let alternates = endpoint_standby_links(ranked, d, pairs);
        d.standby_links.extend(alternates);
        d.standby_links.sort();
        d.standby_links.dedup();
    }
}

/// The links a mapping keeps ready for the pods it would move to: from each programming node
/// that binds one of its interfaces to the nodes of the next [`STANDBY_LINKS`] other ready
/// endpoints, in the order the endpoint is chosen, that no programming node runs (those are
/// served without a link). With them claimed and built, a pod going unready or away moves the
/// mapping without waiting for a claim to land; only the DNAT and the new pod's arrival half
/// follow.
fn endpoint_standby_links(
    ranked: &[Candidate],
    d: &MappingDecision,
    pairs: &mut PairCache,
) -> Vec<NeededLink> {
    let Some(ep) = &d.endpoint else {
        return Vec::new();
    };
    // The endpoint is the first ranked: with no other, there is nowhere to move to.
    if ranked.len() < 2 {
        return Vec::new();
    }
    let mut exclude: Vec<&str> = d.programming_nodes.iter().map(Name::as_str).collect();
    exclude.push(ep.node.as_str());
    let next = endpoint::next_nodes(ranked, &exclude, STANDBY_LINKS);
    let serving: Vec<&str> = d
        .programming_nodes
        .iter()
        .map(Name::as_str)
        .filter(|p| d.bindings.get(*p).is_some_and(|i| !i.is_empty()))
        .collect();
    next.iter()
        .flat_map(|node| serving.iter().map(move |p| (*p, *node)))
        .filter_map(|(p, node)| pairs.get(p, node))
        .filter(|key| !d.links.iter().any(|l| l.key == *key))
        .map(|key| NeededLink {
            class: d.class.clone(),
            key,
            slot: None,
            landed: false,
        })
        .collect()
}

/// The node pairs of one pass, each made once: thousands of mappings need links between the
/// same few nodes, and making a pair allocates its text (a clone shares it). Only looked up.
#[derive(Default)]
struct PairCache {
    pairs: FastMap<Name, FastMap<Name, Option<NodePair>>>,
}

impl PairCache {
    /// [`NodePair::new`]`(a, b)`.
    fn get(&mut self, a: &str, b: &str) -> Option<NodePair> {
        // A pair is the same from either end: one entry serves both orders.
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        if let Some(pair) = self.pairs.get(a).and_then(|by_b| by_b.get(b)) {
            return pair.clone();
        }
        let pair = NodePair::new(a, b);
        self.pairs
            .entry(Name::from(a))
            .or_default()
            .insert(Name::from(b), pair.clone());
        pair
    }
}

/// Single: the serving node; Multi: every accepting node.
fn programming_nodes(index: &Index, class: &ClassState, serving: &str) -> Arc<[Name]> {
    match class.class.spec.serving_mode {
        ServingMode::Single => Arc::from([index.name(serving)]),
        ServingMode::Multi => class.accepting.iter().map(|n| index.name(n)).collect(),
    }
}

/// How many accepting nodes after the serving one keep a standby link to a Single mapping's pod
/// node. Every accepting node could serve, but a Single class may accept on dozens of nodes:
/// a link to each from every pod node would take a /31 and a link mark per pair (254 marks per
/// node, a /20 holds 2,048 pairs) for failovers that move one place down the order at a time.
/// Also how many next endpoints' nodes keep standby links from the programming nodes.
pub const STANDBY_LINKS: usize = 2;

/// The links a Single mapping keeps ready for the accepting nodes that would take over serving
/// it: the next [`STANDBY_LINKS`] accepting nodes after the serving one, in the order the class
/// picks its serving node, that bind one of its interfaces, each to the pod's node. The serving
/// node is the first accepting node, so the next one becomes it when it leaves; with the link
/// claimed and built, only its DNAT has to follow.
///
/// Only when the pod's node does not accept: a node that accepts serves its own pods while it is
/// Ready, and when it is not, its pods (and so the endpoint) usually move with it, so links from
/// every other accepting node to it would hold a slot per accepting node for a failover that
/// rarely keeps the same pod.
fn standby_links(
    d: &MappingDecision,
    accepting: &[&str],
    bound: &BTreeMap<String, Vec<String>>,
    pod_node: &str,
    pairs: &mut PairCache,
) -> Vec<NeededLink> {
    let mut links: Vec<NeededLink> = accepting
        .iter()
        .filter(|n| **n != pod_node && !d.programming_nodes.iter().any(|p| p == *n))
        .filter(|n| bound.get(**n).is_some_and(|i| !i.is_empty()))
        .take(STANDBY_LINKS)
        .filter_map(|n| pairs.get(n, pod_node))
        .map(|key| NeededLink {
            class: d.class.clone(),
            key,
            slot: None,
            landed: false,
        })
        .collect();
    links.sort();
    links.dedup();
    links
}

/// The `Programmed` gates, slots of needed links, published rows and the status writer.
pub fn gate_all(
    index: &Index,
    classes: &BTreeMap<&str, ClassState>,
    work: &mut [Working],
    this_node: &str,
    facts: &HostFacts,
    detail: Detail,
) {
    // Published rows depend on the group alone (its nodes and interfaces, and their addresses):
    // built once per group.
    // By binding set, and the families the mapping is served in (its rows name each
    // interface's address in those alone: an IPv6-only mapping's rows no IPv4 address).
    let mut shared: FastMap<(Group, bool, bool), Arc<[PublishedAddress]>> = FastMap::default();
    let slots = slot_table(classes.values());
    let classes = by_name(classes);
    for w in work.iter_mut() {
        let class = classes.get(w.decision.class.as_str()).copied();
        if let Some(class) = class {
            let d = &mut w.decision;
            for link in d.links.iter_mut().chain(d.standby_links.iter_mut()) {
                if let Some((slot, landed)) = slots.get(&(class.name, &link.key)).copied() {
                    link.slot = Some(slot);
                    link.landed = landed;
                }
            }
        }
        w.decision.status_writer = status_writer(index, class, &w.decision);
        let writes_here = w.decision.status_writer.as_deref() == Some(this_node);
        let say = Say(detail == Detail::Full || writes_here);
        if let (true, Some(class)) = (w.decision.accepted.is_true(), class) {
            let mut outcome = programmed(index, class, w, say);
            // A node whose kernel refused its part never acknowledges it (nor finds the link
            // up): the refusal, in the kernel's words, says more than the missing ack.
            let explained_by_refusal = outcome.is_true()
                || matches!(
                    outcome.reason,
                    ProgrammedReason::NotAcknowledged | ProgrammedReason::ReturnLinkDown
                );
            if explained_by_refusal
                && let Some(message) = kernel_refusal(index, class, &w.decision, this_node, facts)
            {
                outcome = Outcome::new(ProgrammedReason::HostRefused, message);
            }
            w.settling = settling(class, &w.decision, &outcome);
            w.decision.programmed = Some(outcome);
            // Published rows are read by the status alone (and `kuport plan`).
            if w.decision.emits && say.says() {
                let d = &w.decision;
                let (v4, v6) = published_families(d);
                let rows = match w.group {
                    Some(group) => shared
                        .entry((group, v4, v6))
                        .or_insert_with(|| published(index, class, d, this_node, facts))
                        .clone(),
                    None => published(index, class, d, this_node, facts),
                };
                w.decision.published = rows;
            }
        }
    }
}

/// Whether `outcome` only waits for another agent's next step, one round trip away: the
/// claim of a needed link proposed (its pod-side node writes it next) but not landed, or an end
/// of a landed link not acknowledged yet (that end's agent builds it and says so next).
fn settling(class: &ClassState, d: &MappingDecision, outcome: &Outcome<ProgrammedReason>) -> bool {
    match outcome.reason {
        ProgrammedReason::NotAcknowledged => true,
        // The first link not landed decides the reason; a full subnet is no step in progress.
        ProgrammedReason::ReturnPathUnavailable => d
            .links
            .iter()
            .find(|l| !l.landed)
            .is_some_and(|l| !class.exhausted.contains(&l.key)),
        _ => false,
    }
}

fn programmed(
    index: &Index,
    class: &ClassState,
    w: &Working,
    say: Say,
) -> Outcome<ProgrammedReason> {
    use ProgrammedReason as R;
    let d = &w.decision;
    if let (None, Some(rejection)) = (&d.endpoint, &w.endpoint_rejection) {
        return Outcome::new(R::EndpointNotAllowed, say.message(|| rejection.clone()));
    }
    let Some(ep) = &d.endpoint else {
        return Outcome::new(
            R::NoReadyEndpoint,
            say.message(|| {
                format!(
                    "service {}/{} has no ready endpoint for its {} port {:?}",
                    d.namespace,
                    w.pm.spec.service_ref.name,
                    d.protocol.as_str(),
                    w.pm.spec.service_ref.port
                )
            }),
        );
    };
    if class.accepting.is_empty() {
        return Outcome::new(
            R::NodeNotReady,
            say.message(|| format!("class {} selects no ready accepting node", class.name)),
        );
    }
    if let Some(ports) = d.ports.filter(|p| p.is_range() && p.first != ep.port) {
        return Outcome::new(
            R::RangeTranslation,
            say.message(|| format!(
                "ports {ports} are delivered port for port, but service port {:?} targets pod port {}",
                w.pm.spec.service_ref.port, ep.port
            )),
        );
    }
    let serving = d.serving_node.as_deref().unwrap_or_default();
    if w.remote && class.mode == ReturnPathMode::None {
        return Outcome::new(
            R::ReturnPathUnavailable,
            say.message(|| format!(
                "the pod runs on {} but serving node {serving} has no return path to it: class {} has returnPath None",
                ep.node, class.name
            )),
        );
    }
    if let (true, Some(invalid)) = (w.remote, &class.invalid) {
        return Outcome::new(
            R::ReturnPathUnavailable,
            say.message(|| {
                format!(
                    "class {} builds no return links ({}): {}",
                    class.name, invalid.reason, invalid.message
                )
            }),
        );
    }
    if let Some(failed) = node_gates(index, class, w, serving, say) {
        return failed;
    }
    if let Some(failed) = link_gates(index, class, w, say) {
        return failed;
    }
    if let Some(failed) = link_end_gates(index, class, w, say) {
        return failed;
    }
    Outcome::new(R::AllNodesReady, firewall_note(index, class.name, d, say))
}

/// Every programming node has reported a ready row and binds one of the mapping's interfaces.
fn node_gates(
    index: &Index,
    class: &ClassState,
    w: &Working,
    serving: &str,
    say: Say,
) -> Option<Outcome<ProgrammedReason>> {
    use ProgrammedReason as R;
    let d = &w.decision;
    let role = |node: &str| {
        if node == serving {
            "serving node"
        } else {
            "accepting node"
        }
    };
    for node in d.programming_nodes.iter() {
        match index.row(class.name, node) {
            None => {
                return Some(Outcome::new(
                    R::NodeNotReady,
                    say.message(|| {
                        format!(
                            "{} {node} has not reported its row in class {} yet",
                            role(node),
                            class.name
                        )
                    }),
                ));
            }
            Some(row) if !row.ready => {
                let why = row.message.as_deref().unwrap_or("no reason given");
                return Some(Outcome::new(
                    R::NodeNotReady,
                    say.message(|| format!("{} {node} is not ready: {why}", role(node))),
                ));
            }
            Some(_) => {}
        }
    }
    d.programming_nodes
        .iter()
        .find(|node| d.bindings.get(node.as_str()).is_none_or(Vec::is_empty))
        .map(|node| {
            Outcome::new(
                R::NoInterfaceOnNode,
                say.message(|| {
                    format!(
                        "{} {node} binds none of the requested interfaces {}",
                        role(node),
                        w.pm.spec.interfaces.join(", ")
                    )
                }),
            )
        })
}

/// For a remote pod, every link the mapping needs has landed and both its ends have an
/// InternalIP.
fn link_gates(
    index: &Index,
    class: &ClassState,
    w: &Working,
    say: Say,
) -> Option<Outcome<ProgrammedReason>> {
    use ProgrammedReason as R;
    if !w.remote {
        return None;
    }
    for link in &w.decision.links {
        if !link.landed {
            let message = if class.exhausted.contains(&link.key) {
                say.message(|| {
                    format!(
                        "return link for {} is not claimed yet: no /31 is free in {} of class {}",
                        link.key,
                        class.subnet.map(|s| s.to_string()).unwrap_or_default(),
                        class.name
                    )
                })
            } else {
                // Only the pair's pod-side node proposes the claim: name it, since a claim that
                // never comes means that node's agent is not running.
                let endpoint = w.decision.endpoint.as_ref().map_or("", |e| e.node.as_str());
                let proposer =
                    super::classes::pod_side(&link.key, endpoint, &w.decision.programming_nodes);
                say.message(|| format!(
                    "return link for {} is not claimed yet: node {proposer} proposes it (if this stays, its agent is not running or cannot write the class status)",
                    link.key
                ))
            };
            return Some(Outcome::new(R::ReturnPathUnavailable, message));
        }
        let (a, b) = link.key.nodes();
        if let Some(node) = [a, b].into_iter().find(|n| index.internal_ip(n).is_none()) {
            return Some(Outcome::new(
                R::ReturnPathUnavailable,
                say.message(|| {
                    format!(
                        "return link for {} cannot be built: node {node} has no IPv4 InternalIP",
                        link.key
                    )
                }),
            ));
        }
    }
    None
}

/// For a remote pod, both ends of every link the mapping needs have acknowledged it at its
/// current slot in their rows, and neither end's probes found it down. Read from the rows
/// alone, this node's included (not from its own fresher facts): every node must reach the
/// same decision, and this node's verdict reaches its row in the same writes.
fn link_end_gates(
    index: &Index,
    class: &ClassState,
    w: &Working,
    say: Say,
) -> Option<Outcome<ProgrammedReason>> {
    use ProgrammedReason as R;
    if !w.remote {
        return None;
    }
    let mut down = None;
    for link in &w.decision.links {
        let (a, b) = link.key.nodes();
        let slot = link.slot.and_then(|s| i32::try_from(s).ok());
        for (end, peer) in [(a, b), (b, a)] {
            let entry = index
                .row(class.name, end)
                .and_then(|row| row.links.iter().find(|l| l.peer == peer));
            let entry = match entry {
                None => return Some(unacknowledged(class, &link.key, end, None, say)),
                Some(e) if Some(e.slot) != slot => {
                    return Some(unacknowledged(class, &link.key, end, Some(e.slot), say));
                }
                Some(e) => e,
            };
            if down.is_none() && entry.up == Some(false) {
                let why = entry
                    .message
                    .as_deref()
                    .unwrap_or("its probes get no answer");
                down = Some(Outcome::new(
                    R::ReturnLinkDown,
                    say.message(|| {
                        format!(
                            "return link {} is down as node {end} sees it: {why}",
                            link.key
                        )
                    }),
                ));
            }
        }
    }
    down
}

fn unacknowledged(
    class: &ClassState,
    key: &NodePair,
    node: &str,
    slot: Option<i32>,
    say: Say,
) -> Outcome<ProgrammedReason> {
    let message = match slot {
        None => say.message(|| format!(
            "node {node} has not reported its end of return link {key} in class {}: is its kuport agent running? (kuport status lists the agents)",
            class.name
        )),
        Some(old) => say.message(|| format!(
            "node {node} reports its end of return link {key} at slot {old}, not the link's current slot: its agent has not applied the current claim yet"
        )),
    };
    Outcome::new(ProgrammedReason::NotAcknowledged, message)
}

/// What a node that programs the mapping (an accepting node, or the pod's node at the far end
/// of a return link) reported its kernel refused of it: this node from its own last apply,
/// the others from their entries in the class status. Only asked once every other gate
/// passed would let the mapping be programmed.
fn kernel_refusal(
    index: &Index,
    class: &ClassState,
    d: &MappingDecision,
    this_node: &str,
    facts: &HostFacts,
) -> Option<String> {
    let ep = d.endpoint.as_ref()?;
    let stored = class
        .class
        .status
        .as_ref()
        .map(|s| s.refused.as_slice())
        .unwrap_or_default();
    let local = super::pod_network::refused_endpoint(d, this_node, facts, &index.pod_addresses);
    // Nearly every pass of a healthy cluster has nothing refused: ask nothing more then.
    if stored.is_empty() && facts.refusals.is_empty() && local.is_none() {
        return None;
    }
    let mapping = MappingKey::new(&d.namespace, &d.name);
    let mut nodes: Vec<&str> = d.programming_nodes.iter().map(Name::as_str).collect();
    nodes.push(ep.node.as_str());
    nodes.sort_unstable();
    nodes.dedup();
    let found: Vec<String> = nodes
        .into_iter()
        .filter_map(|node| {
            let message = if node == this_node {
                local.as_ref().or_else(|| {
                    facts
                        .refusals
                        .iter()
                        .find(|r| mapping == r.mapping && !standby_only(d, this_node, r))
                        .map(|r| &r.message)
                })
            } else {
                stored
                    .iter()
                    .find(|r| r.node == node && mapping == r.mapping)
                    .map(|r| &r.message)
            }?;
            Some(format!("on node {node}, {message}"))
        })
        .collect();
    (!found.is_empty()).then(|| found.join("; "))
}

/// Programmed, but a programming node reported that its own firewall is known to drop mapped
/// traffic: say so, since kuport cannot see past that firewall's rules.
fn firewall_note(index: &Index, class: &str, d: &MappingDecision, say: Say) -> String {
    if !say.says() {
        return String::new();
    }
    let v6 = d.endpoint.as_ref().is_some_and(|e| e.v6().is_some());
    let mut notes: Vec<String> = d
        .programming_nodes
        .iter()
        .filter_map(|node| index.row(class, node).map(|row| (node, row)))
        .flat_map(|(node, row)| {
            // A ready row with a message: some of the node's interfaces are missing.
            let missing = row.message.as_ref().filter(|_| row.ready);
            // A mapping served over IPv6 on a node that forwards no IPv6: its IPv4 half works.
            let no_ipv6 = row
                .checks
                .iter()
                .filter(|c| v6 && c.name == checks::IPV6_FORWARD && c.ok == Some(false))
                .map(|c| &c.message);
            missing
                .into_iter()
                .chain(&row.warnings)
                .chain(no_ipv6)
                .map(move |w| format!("on node {node}, {w}"))
        })
        .collect();
    notes.extend(ipv6_address_notes(index, class, d));
    if notes.is_empty() {
        return String::new();
    }
    format!("programmed, but {}", notes.join("; "))
}

/// Where a mapping served over IPv6 has no IPv6 address to be reached at, from the rows of its
/// bound nodes: each interface without one for an IPv6-only mapping (it publishes nothing
/// there), and a node none of whose bound interfaces has one for a dual-stack mapping (IPv6
/// clients cannot reach it there; its IPv4 half is served). A row that is not ready says why
/// itself.
fn ipv6_address_notes(index: &Index, class: &str, d: &MappingDecision) -> Vec<String> {
    let (v4, v6) = published_families(d);
    if !v6 {
        return Vec::new();
    }
    let mut notes = Vec::new();
    for (node, ifaces) in d.bindings.iter() {
        let Some(row) = index.row(class, node).filter(|r| r.ready) else {
            continue;
        };
        // An interface with no IPv4 address either is missing: the row's message says so.
        let present: Vec<&str> = ifaces
            .iter()
            .map(String::as_str)
            .filter(|i| row.addresses.contains_key(*i))
            .collect();
        let without: Vec<&str> = present
            .iter()
            .copied()
            .filter(|i| !row.addresses6.contains_key(*i))
            .collect();
        if !v4 {
            notes.extend(without.iter().map(|i| {
                format!("on node {node}, interface {i} has no IPv6 address: this IPv6-only mapping is not served there")
            }));
        } else if !without.is_empty() && without.len() == present.len() {
            notes.push(format!(
                "on node {node}, no bound interface ({}) has an IPv6 address: this mapping is served there over IPv4 only",
                without.join(", ")
            ));
        }
    }
    notes
}

/// The families a mapping's rows are published in: IPv4 unless its endpoint has none (an
/// IPv6-only Service), IPv6 when its endpoint is served over IPv6.
fn published_families(d: &MappingDecision) -> (bool, bool) {
    let ep = d.endpoint.as_ref();
    (
        ep.is_none_or(|e| e.v4().is_some()),
        ep.is_some_and(|e| e.v6().is_some()),
    )
}

fn published(
    index: &Index,
    class: &ClassState,
    d: &MappingDecision,
    this_node: &str,
    facts: &HostFacts,
) -> Arc<[PublishedAddress]> {
    let mut rows = Vec::new();
    let (v4, v6) = published_families(d);
    for (node, ifaces) in d.bindings.iter() {
        let row = (node != this_node)
            .then(|| index.row(class.name, node))
            .flatten();
        for iface in ifaces {
            let (address, address6) = if node == this_node {
                (
                    facts.interface_address(iface).map(|a| a.to_string()),
                    facts.interface_address6(iface).map(|a| a.to_string()),
                )
            } else {
                (
                    row.and_then(|r| r.addresses.get(iface).cloned()),
                    row.and_then(|r| r.addresses6.get(iface).cloned()),
                )
            };
            rows.push(PublishedAddress {
                node: node.clone(),
                interface: iface.clone(),
                address: address.filter(|_| v4).unwrap_or_default(),
                address6: address6.filter(|_| v6).unwrap_or_default(),
            });
        }
    }
    rows.sort();
    rows.into()
}

/// The serving node; else the endpoint's node; else the class's first accepting node; else the
/// cluster's first Node by name.
fn status_writer(index: &Index, class: Option<&ClassState>, d: &MappingDecision) -> Option<Name> {
    d.serving_node
        .clone()
        .or_else(|| d.endpoint.as_ref().map(|e| e.node.clone()))
        .or_else(|| {
            class
                .and_then(|c| c.accepting.first())
                .map(|n| index.name(n))
        })
        .or_else(|| index.first_node().map(|n| index.name(n)))
}
