//! Class decisions: return-path settings, overlaps between classes, link slots and `Ready`.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::jiff::Timestamp;

use super::fast_hash::FastSet;
use super::index::Index;
use super::reasons::{ClassReason, Outcome};
use super::state::{Claim, ClassState, Working, valid_claims};
use super::{ClaimView, ClassDecision, GcKind, Writes};
use crate::api::{
    MAX_VNI, PortMapClass, PreflightLife, ReturnPathMode, is_preflight, preflight_life,
};
use crate::keys::{Name, NodePair};

/// Link ids are the VNI's low 16 bits.
const LINK_ID_SPACE: u64 = 1 << 16;

/// Per-class facts that do not depend on mappings: accepting nodes, settings and whether they
/// are valid (a preflight class past its deadline at `now` is not).
pub fn evaluate_static<'a>(index: &Index<'a>, now: Timestamp) -> BTreeMap<&'a str, ClassState<'a>> {
    let mut states: BTreeMap<&str, ClassState> = BTreeMap::new();
    for (name, class) in &index.classes {
        let accepting = index.accepting_nodes(class);
        let mut state = ClassState {
            name,
            class,
            rank: accepting.iter().enumerate().map(|(i, n)| (*n, i)).collect(),
            accepting_names: accepting.iter().map(|n| index.name(n)).collect(),
            accepting,
            mode: class.spec.return_path.mode,
            subnet: None,
            subnet6: None,
            vni: 0,
            port: 0,
            usable_slots: 0,
            invalid: None,
            claims: BTreeMap::new(),
            proposals: BTreeMap::new(),
            exhausted: BTreeSet::new(),
            standby_exhausted: BTreeSet::new(),
            needed: BTreeMap::new(),
            serving: BTreeSet::new(),
            replacing: BTreeMap::new(),
            evicted: BTreeSet::new(),
            ready: Outcome::new(ClassReason::Valid, ""),
        };
        if state.mode == ReturnPathMode::Vxlan {
            match parse_settings(class) {
                Ok(((subnet, subnet6), vni, port, usable)) => {
                    state.subnet = Some(subnet);
                    state.subnet6 = Some(subnet6);
                    state.vni = vni;
                    state.port = port;
                    state.usable_slots = usable;
                }
                Err(message) => {
                    state.invalid = Some(Outcome::new(ClassReason::InvalidSubnet, message))
                }
            }
        }
        // An expired preflight class holds nothing: it builds no link and no later class
        // overlaps it.
        if let Some(PreflightLife::Expired { message }) = preflight_life(class, now) {
            state.invalid = Some(Outcome::new(ClassReason::PreflightExpired, message));
        }
        states.insert(name, state);
    }
    find_overlaps(&mut states);
    if let Some(cni) = index.cni {
        for state in states
            .values_mut()
            .filter(|s| s.mode == ReturnPathMode::Vxlan && s.invalid.is_none())
        {
            if state.port == cni.vxlan_port {
                state.invalid = Some(Outcome::new(
                    ClassReason::VxlanPortConflict,
                    format!(
                        "link port {} of class {} is the VXLAN port of the CNI ({}); choose another returnPath.vxlan.port",
                        state.port, state.name, cni.name
                    ),
                ));
            }
        }
    }
    for state in states.values_mut() {
        if let Some(invalid) = &state.invalid {
            state.ready = invalid.clone();
        }
    }
    states
}

/// When the first live preflight class expires: the plan changes then by time alone.
pub fn changes_at(classes: &BTreeMap<&str, ClassState>, now: Timestamp) -> Option<Timestamp> {
    classes
        .values()
        .filter_map(|s| match preflight_life(s.class, now)? {
            PreflightLife::Live { until } => until,
            PreflightLife::Expired { .. } => None,
        })
        .min()
}

/// The class's IPv6 link prefix: at most a /96 (the IPv4 link address fills the low 32
/// bits), a unicast prefix that is neither link-local nor kuport's stand-in block.
fn parse_subnet6(text: &str) -> Result<Ipv6Net, String> {
    let subnet: Ipv6Net = text
        .trim()
        .parse()
        .map_err(|_| format!("returnPath.vxlan.ipv6Subnet {text:?} is not an IPv6 CIDR"))?;
    if subnet.prefix_len() > 96 {
        return Err(format!(
            "returnPath.vxlan.ipv6Subnet {subnet} is longer than /96: the IPv4 link address fills its low 32 bits"
        ));
    }
    let (block, len) = crate::ir::STAND_IN6_BLOCK;
    let reserved = Ipv6Net::new(block, len).map_err(|e| e.to_string())?;
    let first = subnet.network();
    if first.is_multicast()
        || first.is_loopback()
        || first.is_unspecified()
        || first.is_unicast_link_local()
    {
        return Err(format!(
            "returnPath.vxlan.ipv6Subnet {subnet} is not a unicast prefix links can route"
        ));
    }
    if subnet.contains(&reserved.network()) || reserved.contains(&first) {
        return Err(format!(
            "returnPath.vxlan.ipv6Subnet {subnet} overlaps {reserved}, which kuport reserves for its IPv6 stand-in address"
        ));
    }
    Ok(subnet.trunc())
}

type Settings = ((Ipv4Net, Ipv6Net), u32, u16, u32);

fn parse_settings(class: &PortMapClass) -> Result<Settings, String> {
    let vxlan = &class.spec.return_path.vxlan;
    let subnet: Ipv4Net = vxlan.subnet.trim().parse().map_err(|_| {
        format!(
            "returnPath.vxlan.subnet {:?} is not an IPv4 CIDR",
            vxlan.subnet
        )
    })?;
    let (block, len) = crate::ir::STAND_IN_BLOCK;
    let reserved = Ipv4Net::new(block, len).map_err(|e| e.to_string())?;
    if subnet.contains(&reserved.network()) || reserved.contains(&subnet.network()) {
        return Err(format!(
            "returnPath.vxlan.subnet {subnet} overlaps {reserved}, which kuport reserves for its stand-in address"
        ));
    }
    if subnet.prefix_len() > 31 {
        return Err(format!(
            "returnPath.vxlan.subnet {subnet} is too small to hold a /31"
        ));
    }
    let vni = u32::try_from(vxlan.vni)
        .ok()
        .filter(|v| (1..=MAX_VNI as u32).contains(v))
        .ok_or_else(|| format!("returnPath.vxlan.vni {} is outside 1..{MAX_VNI}", vxlan.vni))?;
    let port = u16::try_from(vxlan.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("returnPath.vxlan.port {} is outside 1..65535", vxlan.port))?;
    let subnet6 = parse_subnet6(&vxlan.subnet6)?;
    let subnet_slots = 1u64 << (31 - u32::from(subnet.prefix_len()));
    let vni_room = u64::from(MAX_VNI as u32 - vni) + 1;
    let usable = subnet_slots.min(vni_room).min(u64::from(u32::MAX)) as u32;
    Ok(((subnet.trunc(), subnet6), vni, port, usable))
}

/// `ReturnPathOverlap`: a class whose link ids include kuport's local mark, or whose link ids or
/// subnet intersect an earlier Vxlan class's (creation time, then name). Links of both could meet
/// on one node, where the kernel refuses the second.
fn find_overlaps(states: &mut BTreeMap<&str, ClassState>) {
    let mut order: Vec<(Option<Timestamp>, &str)> = states
        .values()
        .filter(|s| s.mode == ReturnPathMode::Vxlan && s.subnet.is_some() && s.invalid.is_none())
        .map(|s| {
            (
                s.class.metadata.creation_timestamp.as_ref().map(|t| t.0),
                s.name,
            )
        })
        .collect();
    order.sort();
    let mut invalid = Vec::new();
    for (i, (_, later)) in order.iter().enumerate() {
        let b = &states[later];
        if contains_local_mark(b.vni, b.usable_slots) {
            invalid.push((
                *later,
                format!(
                    "VNIs {}..{} of class {} include a multiple of 65536, whose link id would equal kuport's local mark",
                    b.vni,
                    u64::from(b.vni) + u64::from(b.usable_slots),
                    b.name
                ),
            ));
            continue;
        }
        for (_, earlier) in &order[..i] {
            let a = &states[earlier];
            let (sa, sb) = (a.subnet.unwrap_or_default(), b.subnet.unwrap_or_default());
            let subnets = sa.contains(&sb.network()) || sb.contains(&sa.network());
            if subnets || link_ids_overlap(a.vni, a.usable_slots, b.vni, b.usable_slots) {
                let what = if subnets {
                    format!("subnet {sb} overlaps subnet {sa}")
                } else {
                    format!(
                        "VNIs from {} overlap VNIs from {} (modulo 65536)",
                        b.vni, a.vni
                    )
                };
                invalid.push((*later, format!("{what} of class {}", a.name)));
                break;
            }
        }
    }
    for (name, message) in invalid {
        if let Some(state) = states.get_mut(name) {
            state.invalid = Some(Outcome::new(ClassReason::ReturnPathOverlap, message));
        }
    }
}

fn contains_local_mark(vni: u32, slots: u32) -> bool {
    let start = u64::from(vni) % LINK_ID_SPACE;
    slots > 0 && (start == 0 || start + u64::from(slots) > LINK_ID_SPACE)
}

fn link_ids_overlap(a: u32, a_len: u32, b: u32, b_len: u32) -> bool {
    if a_len == 0 || b_len == 0 {
        return false;
    }
    let (a, b) = (u64::from(a) % LINK_ID_SPACE, u64::from(b) % LINK_ID_SPACE);
    let (a_len, b_len) = (u64::from(a_len), u64::from(b_len));
    (b + LINK_ID_SPACE - a) % LINK_ID_SPACE < a_len
        || (a + LINK_ID_SPACE - b) % LINK_ID_SPACE < b_len
}

/// The node of pair `key` that proposes its claim: the pod's side. For a link to the endpoint's
/// node (serving, or a standby edge's) that is the endpoint's node; for a standby link to the
/// node of another endpoint, that node (the pair's end that programs nothing). A claim is
/// always proposed by one of its two nodes: the admission policy refuses a node's write of a
/// claim between two others (`docs/datapath.md`, "Who may write what").
pub(super) fn pod_side<'a>(
    pair: &'a NodePair,
    endpoint_node: &'a str,
    programming: &[Name],
) -> &'a str {
    let (a, b) = pair.nodes();
    if a == endpoint_node || b == endpoint_node {
        return endpoint_node;
    }
    [a, b]
        .into_iter()
        .find(|n| !programming.iter().any(|p| p == n))
        .unwrap_or(endpoint_node)
}

/// Reads landed claims, collects needed pairs and assigns free slots to unclaimed ones. Every
/// node computes the same assignment; only a pair's pod-side node proposes it (`pod_side`).
///
/// Serving pairs come first: they take free slots before standby pairs do, and a serving pair
/// left without one takes over the slot of a landed standby-only claim (lowest key first), so
/// standby claims made ahead of need never starve a pair that carries traffic.
pub fn assign_slots(classes: &mut BTreeMap<&str, ClassState>, work: &[Working]) {
    collect_needed(classes, work);
    for state in classes
        .values_mut()
        .filter(|s| s.mode == ReturnPathMode::Vxlan && s.subnet.is_some())
    {
        state.claims = landed_claims(state);
    }
    for state in classes.values_mut().filter(|s| s.builds_links()) {
        let starved = propose_free_slots(state);
        take_over_standby_slots(state, starved);
        say_what_is_exhausted(state);
    }
}

/// Every pair some mapping needs, with the node that proposes it, and which are serving.
fn collect_needed(classes: &mut BTreeMap<&str, ClassState>, work: &[Working]) {
    // Thousands of mappings need the same few pairs with the same proposer: each such need is
    // recorded once (recording it again changes nothing), and a hash tells a repeat.
    let mut seen = FastSet::default();
    for w in work {
        let Some(ep) = &w.decision.endpoint else {
            continue;
        };
        let links = w.decision.links.iter().map(|l| (l, true));
        let standby = w.decision.standby_links.iter().map(|l| (l, false));
        for (link, serving) in links.chain(standby) {
            let proposer = pod_side(&link.key, &ep.node, &w.decision.programming_nodes);
            if !seen.insert((link.class.as_str(), &link.key, proposer, serving)) {
                continue;
            }
            if let Some(state) = classes.get_mut(link.class.as_str()) {
                // Copy a key or a name only the first time it is seen.
                let proposers = match state.needed.get_mut(&link.key) {
                    Some(proposers) => proposers,
                    None => state.needed.entry(link.key.clone()).or_default(),
                };
                if !proposers.contains(proposer) {
                    proposers.insert(proposer.to_owned());
                }
                if serving && !state.serving.contains(&link.key) {
                    state.serving.insert(link.key.clone());
                }
            }
        }
    }
    for state in classes
        .values_mut()
        .filter(|s| is_preflight(s.class) && s.builds_links())
    {
        add_preflight_pairs(state);
    }
}

/// A preflight class needs every pair of its accepting nodes as a serving pair, without any
/// PortMap: the later node of each sorted pair proposes its claim (any one fixed end would do;
/// every node computes the same one).
fn add_preflight_pairs(state: &mut ClassState) {
    let nodes = state.accepting.clone();
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            let Some(pair) = NodePair::new(a, b) else {
                continue;
            };
            let (_, second) = pair.nodes();
            state
                .needed
                .entry(pair.clone())
                .or_default()
                .insert(second.to_owned());
            state.serving.insert(pair);
        }
    }
}

/// Gives each unclaimed needed pair, serving ones first, the lowest free slot. Returns the
/// serving pairs left without one; standby pairs left without one are recorded as such.
fn propose_free_slots(state: &mut ClassState) -> Vec<NodePair> {
    let taken: BTreeSet<u32> = state.claims.values().map(|c| c.slot).collect();
    let mut next = 0u32;
    let unclaimed = |serving: bool| -> Vec<NodePair> {
        state
            .needed
            .keys()
            .filter(|k| !state.claims.contains_key(*k))
            .filter(|k| state.serving.contains(*k) == serving)
            .cloned()
            .collect()
    };
    let (serving, standby) = (unclaimed(true), unclaimed(false));
    let mut starved = Vec::new();
    for (key, is_serving) in serving
        .into_iter()
        .map(|k| (k, true))
        .chain(standby.into_iter().map(|k| (k, false)))
    {
        while next < state.usable_slots && taken.contains(&next) {
            next += 1;
        }
        if next < state.usable_slots {
            state.proposals.insert(key, next);
            next += 1;
        } else if is_serving {
            starved.push(key);
        } else {
            state.standby_exhausted.insert(key);
        }
    }
    starved
}

/// Lands each starved serving pair on the slot of a landed standby-only claim (lowest key
/// first); the pairs left over are exhausted.
fn take_over_standby_slots(state: &mut ClassState, starved: Vec<NodePair>) {
    // Landed claims needed only as standby, which a starved serving pair may take over.
    let mut victims = state
        .claims
        .iter()
        .filter(|(k, _)| state.needed.contains_key(*k) && !state.serving.contains(*k))
        .map(|(k, c)| (k.clone(), c.slot));
    for key in starved {
        match victims.next() {
            Some((victim, slot)) => {
                state.proposals.insert(key.clone(), slot);
                state.replacing.insert(key, victim.clone());
                state.evicted.insert(victim);
            }
            None => {
                state.exhausted.insert(key);
            }
        }
    }
}

/// `SubnetExhausted` when a serving pair has no slot; a note in a Valid Ready when only standby
/// pairs lack one.
fn say_what_is_exhausted(state: &mut ClassState) {
    if let Some(first) = state.exhausted.first() {
        state.ready = Outcome::new(
            ClassReason::SubnetExhausted,
            format!(
                "no /31 is free in {} for node pair {first}{}",
                state.subnet.map(|s| s.to_string()).unwrap_or_default(),
                and_more(state.exhausted.len())
            ),
        );
    } else if let (true, Some(first)) = (state.ready.is_true(), state.standby_exhausted.first()) {
        // Every pair that carries traffic has its link; say that failover to some nodes
        // will wait for a slot, without calling the class broken.
        state.ready = Outcome::new(
            ClassReason::Valid,
            format!(
                "no /31 is free in {} for standby link {first}{}: a failover over that pair waits for a slot",
                state.subnet.map(|s| s.to_string()).unwrap_or_default(),
                and_more(state.standby_exhausted.len())
            ),
        );
    }
}

/// " and N more" for a list of `len` named by its first entry.
fn and_more(len: usize) -> String {
    match len.saturating_sub(1) {
        0 => String::new(),
        more => format!(" and {more} more"),
    }
}

/// Claims from the class status that are well formed and inside the usable slots.
fn landed_claims(state: &ClassState) -> BTreeMap<NodePair, Claim> {
    let links = state
        .class
        .status
        .as_ref()
        .map(|s| s.links.as_slice())
        .unwrap_or_default();
    valid_claims(links, state.usable_slots)
}

/// How many slots a class's links may use: none unless it is a Vxlan class with usable
/// settings.
pub(super) fn usable_slots(class: &PortMapClass) -> u32 {
    if class.spec.return_path.mode != ReturnPathMode::Vxlan {
        return 0;
    }
    parse_settings(class).map_or(0, |(_, _, _, usable)| usable)
}

/// The class decisions, with each class's claims after this node's proposals and GC.
pub fn decisions(
    classes: &BTreeMap<&str, ClassState>,
    writes: &Writes,
    now: Timestamp,
) -> Vec<ClassDecision> {
    classes
        .values()
        .map(|state| {
            let mut links: BTreeMap<String, ClaimView> = state
                .claims
                .iter()
                .map(|(pair, c)| {
                    (
                        pair.to_string(),
                        ClaimView {
                            key: pair.to_string(),
                            slot: c.slot,
                            landed: true,
                            unused_since: c.unused_since,
                        },
                    )
                })
                .collect();
            for gc in writes.gc.iter().filter(|g| g.class == state.name) {
                match gc.action {
                    GcKind::Drop => {
                        links.remove(&gc.key);
                    }
                    GcKind::MarkUnused => {
                        if let Some(v) = links.get_mut(&gc.key) {
                            v.unused_since = Some(now);
                        }
                    }
                    GcKind::ClearUnused => {
                        if let Some(v) = links.get_mut(&gc.key) {
                            v.unused_since = None;
                        }
                    }
                }
            }
            for claim in writes.claims.iter().filter(|c| c.class == state.name) {
                if let Some(victim) = &claim.replaces {
                    links.remove(victim);
                }
                links.insert(
                    claim.key.clone(),
                    ClaimView {
                        key: claim.key.clone(),
                        slot: claim.slot,
                        landed: false,
                        unused_since: None,
                    },
                );
            }
            ClassDecision {
                name: state.name.to_owned(),
                ready: state.ready.clone(),
                generation: state.class.metadata.generation,
                links: links.into_values().collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_names_the_other_end_only_to_its_own_ends() {
        let link = crate::plan::NeededLink {
            class: "games".into(),
            key: NodePair::new("worker-b", "edge-a").expect("pair"),
            slot: None,
            landed: false,
        };
        assert_eq!(link.peer_of("edge-a"), Some("worker-b"));
        assert_eq!(link.peer_of("worker-b"), Some("edge-a"));
        assert_eq!(link.peer_of("worker-c"), None);
    }

    #[test]
    fn link_id_ranges_wrap_modulo_65536() {
        assert!(link_ids_overlap(4242, 128, 4300, 10));
        assert!(!link_ids_overlap(4242, 128, 4370, 10));
        assert!(link_ids_overlap(65530, 4, 65536 + 65532, 1));
        assert!(
            link_ids_overlap(1, 10, 65536 + 5, 1),
            "equal low 16 bits collide"
        );
        assert!(
            !link_ids_overlap(1, 0, 1, 5),
            "a class with no slots uses no id"
        );
    }

    #[test]
    fn local_mark_is_never_a_link_id() {
        assert!(contains_local_mark(65536, 1));
        assert!(contains_local_mark(65530, 7));
        assert!(!contains_local_mark(65530, 6));
        assert!(!contains_local_mark(4242, 128));
    }
}
