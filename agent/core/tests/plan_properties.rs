//! Property tests of the plan over arbitrary small clusters (`spec/plan.md`, `spec/targets.md`):
//! no panic, determinism under shuffled inputs, one global decision whatever the computing node,
//! a reason for every PortMap, one status writer per PortMap, unique link slots, no return link
//! before its claim has landed, proposals that land once written, and port conflicts as the spec
//! defines them.
//!
//! Clusters hold API-valid objects (one object per name, one class row per node, one claim per
//! key) with invalid contents; before planning, up to two rounds of every node's status writes
//! are applied as the agents write them (PortMap statuses replaced by their writer; each node's
//! row, proposals, GC and refusals merged into the class status by the agent's own merge,
//! `kuport_core::plan::merge`, nodes in a shuffled order), so that claims land and links get
//! built.
//!
//! Cases per property: `KUPORT_PROPTEST_CASES` (default 1000).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use kuport_core::api::{LinkClaim, PortMapClass};
use kuport_core::plan::merge::{class_parts, merge_class_status, portmap_status_equivalent};
use kuport_core::plan::{AcceptedReason, Plan, plan};
use kuport_core::snapshot::{CniFacts, HostFacts, Snapshot};
use kuport_testkit::objects;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Pools. Small on purpose, so that names, ports and slots collide often.

const NODES: [&str; 6] = ["edge-a", "edge-b", "worker-a", "worker-b", "Zeta", "n1"];
/// A node name with no Node object: planned for, named by classes, endpoints and claims.
const GHOST: &str = "ghost";
const NODES_AND_GHOST: [&str; 7] = [
    "edge-a", "edge-b", "worker-a", "worker-b", "Zeta", "n1", GHOST,
];
const CLASS_IFACES: [&str; 3] = ["enp1s0", "wt0", "eth1"];
const PM_IFACES: [&str; 4] = ["enp1s0", "wt0", "eth1", "bogus"];
/// Names the kernel or nft would refuse or misread: too long, with nft syntax, a quote, a
/// wildcard, whitespace, empty, a dot name.
const HOSTILE_IFACES: [&str; 7] = [
    "a-name-over-15-bytes",
    "wt0;drop",
    "x\"y",
    "wg*",
    "eth 0",
    "",
    "..",
];
const NAMESPACES: [&str; 3] = ["games", "web", "ops"];
const CLASSES: [&str; 4] = ["public", "lan", "private", "zz"];
const MISSING_CLASS: &str = "missing";
const PM_NAMES: [&str; 6] = [
    "gs",
    "lobby",
    "web",
    "dns",
    "x",
    "a-rather-long-portmap-name-that-is-meant-to-push-the-counter-and-comment-texts-past-the-128-byte-limit-of-nft-comments",
];
const SERVICES: [&str; 3] = ["gs", "lobby", "web"];
const PORT_NAMES: [&str; 3] = ["game", "web", "x"];
const PODS: [&str; 4] = ["gs-0", "gs-1", "lobby-0", "web-0"];
const TIMES: [&str; 5] = [
    "2026-01-01T00:00:00Z",
    "2026-03-01T00:00:00Z",
    "2026-05-31T11:00:00Z", // an hour before NOW
    "2026-05-30T11:00:00Z", // 25 hours before NOW
    "2026-06-01T13:00:00Z", // after NOW (skewed clock)
];
const NOW: &str = "2026-06-01T12:00:00Z";
const SUBNETS: [&str; 15] = [
    "169.254.77.0/24",
    "169.254.77.0/24",
    "169.254.77.0/31",
    "169.254.77.4/30",
    "169.254.78.0/24",
    "169.254.77.128/25",
    "10.9.0.0/16",
    "169.254.77.5/30",
    " 169.254.79.0/24 ",
    "169.254.77.0/32",
    "garbage",
    "300.1.1.1/24",
    "10.0.0.0/33",
    "fd00::/64",
    "",
];

fn now() -> Timestamp {
    NOW.parse().expect("NOW parses")
}

fn cases() -> u32 {
    std::env::var("KUPORT_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // Keep the work tree clean: a failure prints its minimal input instead.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The model: a compact, readable description of a cluster (this is what a failure prints).

#[derive(Clone, Debug)]
struct NodeM {
    name: &'static str,
    ready: bool,
    /// Last octet of the InternalIP; none: no InternalIP.
    ip: Option<u8>,
    /// An IPv6 InternalIP and an ExternalIP listed before the IPv4 InternalIP.
    noise: bool,
}

#[derive(Clone, Debug)]
struct NsM {
    name: &'static str,
    tier: Option<&'static str>,
}

#[derive(Clone, Debug)]
enum SelM {
    Empty,
    Labels(&'static str),
    In(Vec<&'static str>),
    NotIn(Vec<&'static str>),
    Exists,
    DoesNotExist,
    /// An unknown operator: the selector cannot be parsed.
    Unknown,
    /// `Exists` with values: cannot be parsed either.
    ExistsWithValues,
}

#[derive(Clone, Debug)]
struct RowM {
    node: &'static str,
    ready: bool,
    mtu: Option<i32>,
    addresses: Vec<(&'static str, u8)>,
}

#[derive(Clone, Debug)]
struct ClaimM {
    key: String,
    slot: i32,
    unused_since: Option<&'static str>,
}

#[derive(Clone, Debug)]
struct ClassM {
    name: &'static str,
    created: Option<&'static str>,
    nodes: BTreeMap<&'static str, Vec<&'static str>>,
    multi: bool,
    /// (min, max, reserved); none: the defaults.
    window: Option<(i32, i32, Vec<i32>)>,
    selector: Option<SelM>,
    vxlan: bool,
    vni: Option<i32>,
    port: Option<i32>,
    subnet: Option<String>,
    rows: Vec<RowM>,
    claims: Vec<ClaimM>,
}

#[derive(Clone, Debug)]
struct PmM {
    namespace: &'static str,
    name: &'static str,
    class: &'static str,
    tcp: bool,
    port: i32,
    end_port: Option<i32>,
    interfaces: Vec<&'static str>,
    service: &'static str,
    port_name: &'static str,
    created: Option<&'static str>,
    /// A ready pod behind the PortMap's Service (its node, and its port when it differs from
    /// `port`), listed in a slice of its own.
    pod: Option<(&'static str, Option<i32>)>,
}

#[derive(Clone, Debug)]
struct EpM {
    address: Option<String>,
    node: Option<&'static str>,
    ready: Option<bool>,
    pod: Option<&'static str>,
}

#[derive(Clone, Debug)]
struct SliceM {
    namespace: &'static str,
    /// The `kubernetes.io/service-name` label; none: unlabelled.
    service: Option<&'static str>,
    ipv6: bool,
    /// (name, protocol, port); names are unique within a slice, as the API requires.
    ports: Vec<(Option<&'static str>, Option<&'static str>, i32)>,
    endpoints: Vec<EpM>,
}

#[derive(Clone, Debug)]
struct FactsM {
    interfaces: Vec<(&'static str, u8)>,
    device: Option<&'static str>,
    mtu: Option<u32>,
}

#[derive(Clone, Debug)]
struct Model {
    nodes: Vec<NodeM>,
    namespaces: Vec<NsM>,
    classes: Vec<ClassM>,
    portmaps: Vec<PmM>,
    slices: Vec<SliceM>,
    cni: Option<u16>,
    /// Host facts of each name in `NODES_AND_GHOST`, by position.
    facts: Vec<FactsM>,
    /// Rounds in which every node's proposals, GC and class row are applied to the class
    /// statuses before planning (as the agents would write them), so that claims land.
    settle: u8,
    /// Seed of the order in which the nodes' writes of each round reach the API server.
    write_order: u64,
}

// ---------------------------------------------------------------------------------------------
// Strategies.

fn time() -> impl Strategy<Value = &'static str> {
    select(&TIMES[..])
}

fn node_attrs() -> impl Strategy<Value = (bool, Option<u8>, bool)> {
    (
        prop::bool::weighted(0.8),
        prop::option::weighted(0.85, 1u8..=250),
        prop::bool::weighted(0.15),
    )
}

fn nodes() -> impl Strategy<Value = Vec<NodeM>> {
    (
        prop::sample::subsequence(NODES.to_vec(), 1..=NODES.len()),
        prop::collection::vec(node_attrs(), NODES.len()),
    )
        .prop_map(|(names, attrs)| {
            names
                .into_iter()
                .zip(attrs)
                .map(|(name, (ready, ip, noise))| NodeM {
                    name,
                    ready,
                    ip,
                    noise,
                })
                .collect()
        })
}

fn namespaces() -> impl Strategy<Value = Vec<NsM>> {
    (
        prop::sample::subsequence(NAMESPACES.to_vec(), 0..=NAMESPACES.len()),
        prop::collection::vec(
            prop::option::of(select(&["public", "private"][..])),
            NAMESPACES.len(),
        ),
    )
        .prop_map(|(names, tiers)| {
            names
                .into_iter()
                .zip(tiers)
                .map(|(name, tier)| NsM { name, tier })
                .collect()
        })
}

fn tier_values() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(select(&["public", "private", "other"][..]), 0..=2)
}

fn selector() -> impl Strategy<Value = SelM> {
    prop_oneof![
        Just(SelM::Empty),
        select(&["public", "private"][..]).prop_map(SelM::Labels),
        tier_values().prop_map(SelM::In),
        tier_values().prop_map(SelM::NotIn),
        Just(SelM::Exists),
        Just(SelM::DoesNotExist),
        Just(SelM::Unknown),
        Just(SelM::ExistsWithValues),
    ]
}

fn window_port() -> impl Strategy<Value = i32> {
    prop_oneof![
        select(&[0, 1, 1024, 3000, 3001, 3003, 65535, 70000, -1][..]),
        0..70000i32,
    ]
}

fn window() -> impl Strategy<Value = (i32, i32, Vec<i32>)> {
    let reserved = || {
        prop_oneof![
            2 => Just(Vec::new()),
            1 => prop::collection::vec(
                prop_oneof![3000..3006i32, select(&[0, 1, 65535, 70000][..])],
                1..=2,
            ),
        ]
    };
    prop_oneof![
        2 => (
            select(&[1, 1024, 3000][..]),
            select(&[3003, 3010, 65535][..]),
            reserved()
        ),
        1 => (window_port(), window_port(), reserved()),
    ]
}

fn vni() -> impl Strategy<Value = i32> {
    prop_oneof![
        select(
            &[
                4242, 4242, 1, 65535, 65536, 65530, 65408, 131_072, 196_600, 16_777_215,
                16_777_214, 16_777_000, 0, -5, 16_777_216,
            ][..]
        ),
        1..16_777_216i32,
    ]
}

fn vxlan_port() -> impl Strategy<Value = i32> {
    prop_oneof![select(&[4790, 4790, 8472, 0, 70000, -1][..]), 1..65536i32]
}

fn claim_key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (select(&NODES_AND_GHOST[..]), select(&NODES_AND_GHOST[..])).prop_map(|(a, b)| {
            if a <= b { format!("{a}/{b}") } else { format!("{b}/{a}") }
        }),
        1 => (select(&NODES_AND_GHOST[..]), select(&NODES_AND_GHOST[..]))
            .prop_map(|(a, b)| format!("{b}/{a}")),
        1 => select(&["edge-a", "edge-a/edge-b/n1", "", "/edge-a", "edge-a/", "edge-a//n1"][..])
            .prop_map(str::to_owned),
    ]
}

fn claim() -> impl Strategy<Value = ClaimM> {
    (
        claim_key(),
        prop_oneof![
            4 => 0..4i32,
            1 => select(&[-1, 127, 128, 255, 1 << 20, i32::MAX][..]),
        ],
        prop::option::of(time()),
    )
        .prop_map(|(key, slot, unused_since)| ClaimM {
            key,
            slot,
            unused_since,
        })
}

fn row() -> impl Strategy<Value = RowM> {
    (
        select(&NODES_AND_GHOST[..]),
        prop::bool::weighted(0.8),
        prop::option::of(select(&[1500, 1400, 9000, 30, -1][..])),
        prop::collection::vec((select(&CLASS_IFACES[..]), 1u8..=250), 0..=3),
    )
        .prop_map(|(node, ready, mtu, addresses)| RowM {
            node,
            ready,
            mtu,
            addresses,
        })
}

/// A class without its name, and whether its subnet and VNI are to be made distinct.
fn class_attrs() -> impl Strategy<Value = (ClassM, bool)> {
    (
        (
            prop::option::of(time()),
            prop::collection::btree_map(
                select(&NODES_AND_GHOST[..]),
                prop_oneof![
                    12 => prop::collection::vec(select(&CLASS_IFACES[..]), 1..=2),
                    2 => Just(Vec::new()),
                    1 => prop::collection::vec(select(&HOSTILE_IFACES[..]), 1..=1),
                ],
                1..=4,
            ),
            any::<bool>(),
            prop::option::weighted(0.5, window()),
            prop::option::weighted(0.25, selector()),
        ),
        (
            prop::bool::weighted(0.75),
            prop::option::weighted(0.5, vni()),
            prop::option::weighted(0.4, vxlan_port()),
            prop_oneof![
                // Settings distinct per class (filled in by `classes`), so that classes do not
                // all refuse each other for overlapping.
                3 => Just(None),
                1 => prop::option::weighted(0.6, select(&SUBNETS[..]).prop_map(|s| Some(s.to_owned()))),
            ],
            prop::collection::vec(row(), 0..=5),
            prop::collection::vec(claim(), 0..=5),
        ),
    )
        .prop_map(
            |(
                (created, nodes, multi, window, selector),
                (vxlan, vni, port, subnet, rows, claims),
            )| {
                // The API keeps one row per node and one claim per key (list-type map).
                let mut seen = BTreeSet::new();
                let rows = rows.into_iter().filter(|r| seen.insert(r.node)).collect();
                let mut seen = BTreeSet::new();
                let claims = claims
                    .into_iter()
                    .filter(|c| seen.insert(c.key.clone()))
                    .collect();
                let distinct = subnet.is_none();
                let class = ClassM {
                    name: "",
                    created,
                    nodes,
                    multi,
                    window,
                    selector,
                    vxlan,
                    vni,
                    port,
                    subnet: subnet.flatten(),
                    rows,
                    claims,
                };
                (class, distinct)
            },
        )
}

fn classes() -> impl Strategy<Value = Vec<ClassM>> {
    (
        prop::sample::subsequence(CLASSES.to_vec(), 1..=CLASSES.len()),
        prop::collection::vec(class_attrs(), CLASSES.len()),
    )
        .prop_map(|(names, attrs)| {
            names
                .into_iter()
                .zip(attrs)
                .enumerate()
                .map(|(i, (name, (attrs, distinct)))| {
                    let mut class = ClassM { name, ..attrs };
                    if distinct {
                        let i = i32::try_from(i).expect("few classes");
                        class.subnet = Some(format!("169.254.{}.0/24", 80 + i));
                        class.vni = Some(10_000 + 1000 * i);
                    }
                    class
                })
                .collect()
        })
}

fn pm_port() -> impl Strategy<Value = i32> {
    prop_oneof![
        6 => 3000..3006i32,
        1 => select(&[0, 1, 65535, 65536, -1, 70000][..]),
        2 => 0..70000i32,
    ]
}

fn portmap() -> impl Strategy<Value = PmM> {
    (
        (
            select(&NAMESPACES[..]),
            select(&PM_NAMES[..]),
            prop_oneof![4 => select(&CLASSES[..]), 1 => Just(MISSING_CLASS)],
            any::<bool>(),
            pm_port(),
            // endPort: none, the port plus 0..3, or any port (often lower than `port`).
            prop_oneof![
                6 => Just(None),
                2 => (0..3i32).prop_map(|k| Some(Ok(k))),
                1 => pm_port().prop_map(|p| Some(Err(p))),
            ],
        ),
        (
            prop_oneof![
                6 => Just(Vec::new()),
                2 => prop::collection::vec(select(&PM_IFACES[..]), 1..=2),
                1 => prop::collection::vec(select(&HOSTILE_IFACES[..]), 1..=1),
            ],
            select(&SERVICES[..]),
            select(&PORT_NAMES[..]),
            prop::option::weighted(0.9, time()),
            prop::option::weighted(
                0.6,
                (
                    select(&NODES_AND_GHOST[..]),
                    prop::option::weighted(0.25, 3000..3003i32),
                ),
            ),
        ),
    )
        .prop_map(
            |(
                (namespace, name, class, tcp, port, end_port),
                (interfaces, service, port_name, created, pod),
            )| PmM {
                namespace,
                name,
                class,
                tcp,
                port,
                end_port: end_port.map(|e: Result<i32, i32>| {
                    e.map_or_else(|abs| abs, |k| port.saturating_add(k))
                }),
                interfaces,
                service,
                port_name,
                created,
                pod,
            },
        )
}

fn portmaps() -> impl Strategy<Value = Vec<PmM>> {
    prop::collection::vec(portmap(), 0..=12).prop_map(|pms| {
        // The API holds one object per namespace/name.
        let mut seen = BTreeSet::new();
        pms.into_iter()
            .filter(|p| seen.insert((p.namespace, p.name)))
            .collect()
    })
}

fn endpoint() -> impl Strategy<Value = EpM> {
    (
        prop_oneof![
            8 => (0u8..3, 1u8..6).prop_map(|(a, b)| Some(format!("10.244.{a}.{b}"))),
            1 => Just(Some("garbage".to_owned())),
            1 => Just(None),
        ],
        prop::option::weighted(0.9, select(&NODES_AND_GHOST[..])),
        prop::option::of(prop::bool::weighted(0.8)),
        prop::option::weighted(0.9, select(&PODS[..])),
    )
        .prop_map(|(address, node, ready, pod)| EpM {
            address,
            node,
            ready,
            pod,
        })
}

fn slice() -> impl Strategy<Value = SliceM> {
    (
        select(&NAMESPACES[..]),
        prop::option::weighted(0.9, select(&SERVICES[..])),
        prop::bool::weighted(0.1),
        prop::collection::vec(
            (
                prop::option::weighted(0.9, select(&PORT_NAMES[..])),
                prop::option::weighted(0.9, select(&["TCP", "UDP", "SCTP"][..])),
                prop_oneof![
                    4 => 3000..3003i32,
                    1 => select(&[8080, 0, 70000][..]),
                ],
            ),
            0..=3,
        ),
        prop::collection::vec(endpoint(), 0..=4),
    )
        .prop_map(|(namespace, service, ipv6, ports, endpoints)| {
            let mut seen = BTreeSet::new();
            let ports = ports.into_iter().filter(|p| seen.insert(p.0)).collect();
            SliceM {
                namespace,
                service,
                ipv6,
                ports,
                endpoints,
            }
        })
}

fn facts() -> impl Strategy<Value = FactsM> {
    (
        prop_oneof![
            3 => (1u8..=250).prop_map(|a| CLASS_IFACES.iter().map(|i| (*i, a)).collect()),
            1 => prop::collection::vec((select(&CLASS_IFACES[..]), 1u8..=250), 0..=3),
            // A host whose hostile-named devices have addresses (as if the kernel took them).
            1 => (1u8..=250).prop_map(|a| {
                CLASS_IFACES.iter().chain(HOSTILE_IFACES.iter()).map(|i| (*i, a)).collect()
            }),
        ],
        prop::option::weighted(0.8, select(&["eth0", "wt0"][..])),
        prop::option::weighted(0.8, select(&[1500u32, 1450, 9000, 40][..])),
    )
        .prop_map(|(interfaces, device, mtu)| FactsM {
            interfaces,
            device,
            mtu,
        })
}

/// A slice, and optionally a PortMap it is aimed at (with the pod port; none: the PortMap's
/// own port), so that endpoints are found often.
fn aimed_slice() -> impl Strategy<Value = (SliceM, Option<(prop::sample::Index, Option<i32>)>)> {
    (
        slice(),
        prop::option::weighted(
            0.85,
            (
                any::<prop::sample::Index>(),
                prop::option::weighted(0.3, 3000..3003i32),
            ),
        ),
    )
}

/// Some node for an aimed slice's endpoint, chosen from the PortMap's name.
fn pm_node(pm: &PmM) -> &'static str {
    NODES_AND_GHOST[pm.name.len() % NODES_AND_GHOST.len()]
}

/// The slice of a PortMap's own pod.
fn pod_slice(pm: &PmM) -> Option<SliceM> {
    let (node, pod_port) = pm.pod?;
    let mut slice = SliceM {
        namespace: pm.namespace,
        service: None,
        ipv6: false,
        ports: Vec::new(),
        endpoints: vec![EpM {
            address: Some(format!("10.244.7.{}", pm.name.len())),
            node: Some(node),
            ready: Some(true),
            pod: Some(pm.name),
        }],
    };
    aim(&mut slice, pm, pod_port);
    Some(slice)
}

fn aim(slice: &mut SliceM, pm: &PmM, pod_port: Option<i32>) {
    slice.namespace = pm.namespace;
    slice.service = Some(pm.service);
    slice.ipv6 = false;
    if slice.endpoints.is_empty() {
        slice.endpoints.push(EpM {
            address: Some("10.244.9.9".to_owned()),
            node: Some(pm_node(pm)),
            ready: None,
            pod: Some("aimed-0"),
        });
    }
    slice.ports.retain(|p| p.0 != Some(pm.port_name));
    let protocol = if pm.tcp { "TCP" } else { "UDP" };
    slice.ports.push((
        Some(pm.port_name),
        Some(protocol),
        pod_port.unwrap_or(pm.port),
    ));
}

fn model() -> impl Strategy<Value = Model> {
    (
        (nodes(), namespaces(), classes(), portmaps()),
        (
            prop::collection::vec(aimed_slice(), 0..=6),
            prop::option::weighted(0.4, prop_oneof![Just(8472u16), Just(4790u16), 1..=65535u16]),
            prop::collection::vec(facts(), NODES_AND_GHOST.len()),
            select(&[0u8, 1, 2, 2][..]),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (nodes, namespaces, classes, mut portmaps),
                (aimed, cni, facts, settle, write_order),
            )| {
                // A class name the cluster lacks becomes one it has: only MISSING_CLASS is
                // missing on purpose.
                for pm in &mut portmaps {
                    if pm.class != MISSING_CLASS && classes.iter().all(|c| c.name != pm.class) {
                        let i = CLASSES.iter().position(|c| *c == pm.class).unwrap_or(0);
                        pm.class = classes[i % classes.len()].name;
                    }
                }
                let slices = aimed
                    .into_iter()
                    .map(|(mut slice, target)| {
                        if let (Some((i, pod_port)), false) = (target, portmaps.is_empty()) {
                            aim(&mut slice, i.get(&portmaps), pod_port);
                        }
                        slice
                    })
                    .collect();
                Model {
                    nodes,
                    namespaces,
                    classes,
                    portmaps,
                    slices,
                    cni,
                    facts,
                    settle,
                    write_order,
                }
            },
        )
}

// ---------------------------------------------------------------------------------------------
// From the model to the plan's inputs.

fn node_json(n: &NodeM) -> Value {
    let ip = n.ip.map(|ip| format!("100.64.0.{ip}"));
    let mut node = objects::node(n.name, ip.as_deref(), n.ready);
    let status = &mut node["status"];
    if n.noise
        && let Some(addresses) = status["addresses"].as_array_mut()
    {
        addresses.splice(
            0..0,
            [
                json!({"type": "InternalIP", "address": "fd00::1"}),
                json!({"type": "ExternalIP", "address": "198.51.100.1"}),
            ],
        );
    }
    if let Some(conditions) = status["conditions"].as_array_mut() {
        conditions.insert(0, json!({"type": "MemoryPressure", "status": "False"}));
    }
    node
}

fn selector_json(s: &SelM) -> Value {
    let expr = |op: &str, values: Option<&[&str]>| {
        let mut e = json!({"key": "tier", "operator": op});
        if let Some(values) = values {
            e["values"] = json!(values);
        }
        json!({"matchExpressions": [e]})
    };
    match s {
        SelM::Empty => json!({}),
        SelM::Labels(tier) => json!({"matchLabels": {"tier": tier}}),
        SelM::In(values) => expr("In", Some(values)),
        SelM::NotIn(values) => expr("NotIn", Some(values)),
        SelM::Exists => expr("Exists", None),
        SelM::DoesNotExist => expr("DoesNotExist", None),
        SelM::Unknown => expr("Maybe", Some(&["public"])),
        SelM::ExistsWithValues => expr("Exists", Some(&["public"])),
    }
}

fn class_json(c: &ClassM) -> Value {
    let nodes: serde_json::Map<String, Value> = c
        .nodes
        .iter()
        .map(|(n, ifaces)| ((*n).to_owned(), json!({"interfaces": ifaces})))
        .collect();
    let mut vxlan = json!({});
    if let Some(vni) = c.vni {
        vxlan["vni"] = json!(vni);
    }
    if let Some(port) = c.port {
        vxlan["port"] = json!(port);
    }
    if let Some(subnet) = &c.subnet {
        vxlan["subnet"] = json!(subnet);
    }
    let mut spec = json!({
        "nodes": nodes,
        "servingMode": if c.multi { "Multi" } else { "Single" },
        "returnPath": {"mode": if c.vxlan { "Vxlan" } else { "None" }, "vxlan": vxlan},
    });
    if let Some((min, max, reserved)) = &c.window {
        spec["ports"] = json!({"min": min, "max": max, "reserved": reserved});
    }
    if let Some(sel) = &c.selector {
        spec["namespaceSelector"] = selector_json(sel);
    }
    let mut class = objects::class(c.name, spec).generation(3);
    if let Some(t) = c.created {
        class = class.created(t);
    }
    if !c.rows.is_empty() || !c.claims.is_empty() {
        let rows: Vec<Value> = c
            .rows
            .iter()
            .map(|r| {
                let addresses: serde_json::Map<String, Value> = r
                    .addresses
                    .iter()
                    .map(|(i, a)| ((*i).to_owned(), json!(format!("203.0.113.{a}"))))
                    .collect();
                let mut row = json!({"name": r.node, "ready": r.ready, "addresses": addresses});
                if !r.ready {
                    row["message"] = json!("interface wt0 not present");
                }
                if let Some(mtu) = r.mtu {
                    row["underlayMTU"] = json!(mtu);
                }
                row
            })
            .collect();
        let claims: Vec<Value> = c
            .claims
            .iter()
            .map(|l| {
                let mut claim = objects::link_claim(&l.key, l.slot, "");
                if let Some(t) = l.unused_since {
                    claim["unusedSince"] = json!(t);
                }
                claim
            })
            .collect();
        class = class.status(json!({
            "conditions": [{"type": "Ready", "status": "True", "reason": "Valid", "message": "",
                            "lastTransitionTime": TIMES[0]}],
            "nodes": rows, "links": claims}));
    }
    class.object()
}

fn portmap_json(p: &PmM) -> Value {
    let mut pm = objects::pm(p.namespace, p.name, p.class, p.port)
        .protocol(if p.tcp { "TCP" } else { "UDP" })
        .service(p.service, p.port_name)
        .ifaces(&p.interfaces)
        .generation(2);
    if let Some(end) = p.end_port {
        pm = pm.end(end);
    }
    if let Some(t) = p.created {
        pm = pm.created(t);
    }
    pm.object()
}

fn slice_json(s: &SliceM, i: usize) -> Value {
    let mut metadata = json!({"name": format!("slice-{i}"), "namespace": s.namespace});
    if let Some(svc) = s.service {
        metadata["labels"] = json!({"kubernetes.io/service-name": svc});
    }
    let ports: Vec<Value> = s
        .ports
        .iter()
        .map(|(name, protocol, port)| {
            let mut p = json!({"port": port});
            if let Some(name) = name {
                p["name"] = json!(name);
            }
            if let Some(protocol) = protocol {
                p["protocol"] = json!(protocol);
            }
            p
        })
        .collect();
    let endpoints: Vec<Value> = s
        .endpoints
        .iter()
        .map(|e| {
            let mut ep = json!({"addresses": e.address.iter().collect::<Vec<_>>()});
            if let Some(node) = e.node {
                ep["nodeName"] = json!(node);
            }
            let mut conditions = json!({});
            if let Some(ready) = e.ready {
                conditions["ready"] = json!(ready);
            }
            ep["conditions"] = conditions;
            if let Some(pod) = e.pod {
                ep["targetRef"] = json!({"kind": "Pod", "name": pod, "namespace": s.namespace});
            }
            ep
        })
        .collect();
    json!({"metadata": metadata, "addressType": if s.ipv6 { "IPv6" } else { "IPv4" },
        "ports": ports, "endpoints": endpoints})
}

/// The version the model's agents stamp into their rows.
const AGENT_VERSION: &str = "0.0.0-properties";

/// The plan's input: the model's objects after `settle` rounds of status writes. In a round every
/// agent plans from the same objects, then their writes reach the API server one node after the
/// other, in an order drawn from `write_order`.
fn snapshot(m: &Model) -> Snapshot {
    let mut snap = base_snapshot(m);
    let mut rng = Rng(m.write_order);
    for _ in 0..m.settle {
        let mut plans: Vec<Plan> = m.nodes.iter().map(|n| plan_of(m, &snap, n.name)).collect();
        rng.shuffle(&mut plans);
        for p in &plans {
            write_status(&mut snap, p);
        }
    }
    snap
}

/// Writes one node's status as its agent does (`agent/daemon/src/agent/status.rs`): each PortMap
/// status it owns replaced whole unless the stored one says the same, and its part of each class
/// merged into the class status as stored now, which is what the agent's compare-and-swap loop
/// converges to: the merge re-run on the freshest object.
fn write_status(snap: &mut Snapshot, p: &Plan) {
    for w in &p.writes.portmaps {
        let stored = snap.portmaps.iter_mut().find(|pm| {
            pm.metadata.namespace.as_deref() == Some(w.namespace.as_str())
                && pm.metadata.name.as_deref() == Some(w.name.as_str())
        });
        if let Some(pm) = stored {
            let same = pm
                .status
                .as_ref()
                .is_some_and(|s| portmap_status_equivalent(s, &w.status));
            if !same {
                pm.status = Some(w.status.clone());
            }
        }
    }
    for (name, part) in class_parts(&p.writes, &p.node, &snap.classes) {
        let stored = snap
            .classes
            .iter_mut()
            .find(|c| c.metadata.name.as_deref() == Some(name.as_str()));
        if let Some(class) = stored {
            let before = class.status.clone().unwrap_or_default();
            let merged = merge_class_status(class, &p.node, AGENT_VERSION, &part, now());
            if merged.status != before {
                class.status = Some(merged.status);
            }
        }
    }
}

fn base_snapshot(m: &Model) -> Snapshot {
    Snapshot {
        classes: m
            .classes
            .iter()
            .map(|c| serde_json::from_value(class_json(c)).expect("class deserialises"))
            .collect(),
        portmaps: m
            .portmaps
            .iter()
            .map(|p| serde_json::from_value(portmap_json(p)).expect("portmap deserialises"))
            .collect(),
        endpoint_slices: m
            .slices
            .iter()
            .cloned()
            .chain(m.portmaps.iter().filter_map(pod_slice))
            .enumerate()
            .map(|(i, s)| serde_json::from_value(slice_json(&s, i)).expect("slice deserialises"))
            .collect(),
        nodes: m
            .nodes
            .iter()
            .map(|n| serde_json::from_value(node_json(n)).expect("node deserialises"))
            .collect(),
        namespaces: m
            .namespaces
            .iter()
            .map(|ns| {
                let labels = ns.tier.map_or_else(|| json!({}), |t| json!({"tier": t}));
                serde_json::from_value(json!({"metadata": {"name": ns.name, "labels": labels}}))
                    .expect("namespace deserialises")
            })
            .collect(),
        cni: m.cni.map(|port| CniFacts {
            name: "cilium".to_owned(),
            routing_mode: Some("tunnel".to_owned()),
            vxlan_port: port,
            pod_cidrs: Vec::new(),
        }),
        services: Vec::new(),
        pods: Vec::new(),
    }
}

fn host_facts(m: &Model, node: &str) -> HostFacts {
    let Some(f) = NODES_AND_GHOST
        .iter()
        .position(|n| *n == node)
        .and_then(|i| m.facts.get(i))
    else {
        return HostFacts::default();
    };
    HostFacts {
        interfaces: f
            .interfaces
            .iter()
            .map(|(i, a)| {
                (
                    (*i).to_owned(),
                    format!("192.0.2.{a}").parse().expect("ipv4"),
                )
            })
            .collect(),
        underlay_device: f.device.map(str::to_owned),
        underlay_mtu: f.mtu,
        ..HostFacts::default()
    }
}

/// Every node of the cluster plus one that has no Node object.
fn plan_nodes(m: &Model) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = m.nodes.iter().map(|n| n.name).collect();
    names.push(GHOST);
    names
}

fn plan_of(m: &Model, snap: &Snapshot, node: &str) -> Plan {
    plan(snap, node, &host_facts(m, node), now())
}

// ---------------------------------------------------------------------------------------------
// Shuffling every input list.

/// splitmix64: a tiny deterministic generator for permutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Shuffles every list of the snapshot whose order carries no meaning: the object lists, the
/// class status lists (rows, claims, conditions), the Node conditions, the slices' endpoints and
/// ports, and the set-like spec lists that no message quotes (reserved ports, selector
/// requirements and their values). With `interfaces`, also the interface lists of class nodes and
/// PortMaps, which some messages quote as written. Lists whose order the API defines (a Node's
/// addresses, an endpoint's addresses: the first one counts) are left alone.
fn shuffled(snap: &Snapshot, seed: u64, interfaces: bool) -> Snapshot {
    let mut rng = Rng(seed);
    let mut s = snap.clone();
    rng.shuffle(&mut s.classes);
    rng.shuffle(&mut s.portmaps);
    rng.shuffle(&mut s.endpoint_slices);
    rng.shuffle(&mut s.nodes);
    rng.shuffle(&mut s.namespaces);
    for c in &mut s.classes {
        shuffle_class(c, &mut rng, interfaces);
    }
    if interfaces {
        for p in &mut s.portmaps {
            rng.shuffle(&mut p.spec.interfaces);
        }
    }
    for slice in &mut s.endpoint_slices {
        if let Some(ports) = &mut slice.ports {
            rng.shuffle(ports);
        }
        if let Some(endpoints) = &mut slice.endpoints {
            rng.shuffle(endpoints);
        }
    }
    for node in &mut s.nodes {
        if let Some(conds) = node.status.as_mut().and_then(|st| st.conditions.as_mut()) {
            rng.shuffle(conds);
        }
    }
    s
}

fn shuffle_class(c: &mut PortMapClass, rng: &mut Rng, interfaces: bool) {
    rng.shuffle(&mut c.spec.ports.reserved);
    if interfaces {
        for node in c.spec.nodes.values_mut() {
            rng.shuffle(&mut node.interfaces);
        }
    }
    if let Some(exprs) = c
        .spec
        .namespace_selector
        .as_mut()
        .and_then(|s| s.match_expressions.as_mut())
    {
        rng.shuffle(exprs);
        for e in exprs {
            if let Some(values) = &mut e.values {
                rng.shuffle(values);
            }
        }
    }
    if let Some(status) = &mut c.status {
        rng.shuffle(&mut status.nodes);
        rng.shuffle(&mut status.links);
        rng.shuffle(&mut status.conditions);
    }
}

/// The plan with every human-readable message blanked (condition messages and row messages).
fn without_messages(mut p: Plan) -> Plan {
    for d in &mut p.portmaps {
        d.accepted.message.clear();
        if let Some(pr) = &mut d.programmed {
            pr.message.clear();
        }
    }
    for c in &mut p.classes {
        c.ready.message.clear();
    }
    for w in &mut p.writes.portmaps {
        for cond in &mut w.status.conditions {
            cond.message.clear();
        }
    }
    for w in &mut p.writes.class_rows {
        w.row.message = None;
        w.ready.message.clear();
    }
    p
}

// ---------------------------------------------------------------------------------------------
// Oracles.

/// Mirrors the plan's notion of a well-formed claim key: two distinct, non-empty node names in
/// bytewise order joined by one `/`.
fn well_formed_key(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && a < b && !b.contains('/'))
}

fn class_of<'a>(snap: &'a Snapshot, name: &str) -> &'a PortMapClass {
    snap.classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .expect("class exists")
}

/// The claims of a class as the plan read them from its status.
fn claims_of<'a>(snap: &'a Snapshot, class: &str) -> &'a [LinkClaim] {
    class_of(snap, class)
        .status
        .as_ref()
        .map_or(&[], |s| s.links.as_slice())
}

fn pair_key(a: &str, b: &str) -> String {
    if a <= b {
        format!("{a}/{b}")
    } else {
        format!("{b}/{a}")
    }
}

/// The global part of a plan: mappings with published addresses blanked, and each class's
/// name, Ready and generation.
type GlobalPart = (
    Vec<kuport_core::plan::MappingDecision>,
    Vec<(String, String, String, Option<i64>)>,
);

fn global_part(p: &Plan) -> GlobalPart {
    let mut portmaps = p.portmaps.clone();
    for d in &mut portmaps {
        let mut rows = d.published.to_vec();
        for row in &mut rows {
            row.address.clear();
        }
        d.published = rows.into();
    }
    let classes = p
        .classes
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.ready.reason.as_str().to_owned(),
                c.ready.message.clone(),
                c.generation,
            )
        })
        .collect();
    (portmaps, classes)
}

fn spec_is_invalid(m: &Model, p: &PmM) -> Option<&'static str> {
    let port_ok = |n: i32| (1..=65535).contains(&n);
    if !m.classes.iter().any(|c| c.name == p.class) {
        return Some("class missing");
    }
    if p.end_port.is_some_and(|e| e < p.port) {
        return Some("endPort < port");
    }
    if !port_ok(p.port) || p.end_port.is_some_and(|e| !port_ok(e)) {
        return Some("port outside 1..65535");
    }
    if binds_hostile(m, p) {
        return Some("a hostile interface name");
    }
    None
}

/// The mapping would bind a hostile name: one of its own interfaces, or, when it names none,
/// one its class gives any node.
fn binds_hostile(m: &Model, p: &PmM) -> bool {
    let hostile = |i: &&str| HOSTILE_IFACES.contains(i);
    if !p.interfaces.is_empty() {
        return p.interfaces.iter().any(hostile);
    }
    m.classes
        .iter()
        .filter(|c| c.name == p.class)
        .flat_map(|c| c.nodes.values().flatten())
        .any(hostile)
}

// ---------------------------------------------------------------------------------------------
// Properties.

proptest! {
    #![proptest_config(config())]

    /// (a) The plan never panics, for every node of the cluster and for a node it does not know.
    #[test]
    fn plan_never_panics(m in model()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            prop_assert_eq!(p.node.as_str(), node);
        }
    }

    /// (b) Shuffling every input list yields the identical plan, for every node.
    #[test]
    fn plan_is_deterministic_under_shuffles(m in model(), seed in any::<u64>()) {
        let snap = snapshot(&m);
        let shuffled = shuffled(&snap, seed, false);
        for node in plan_nodes(&m) {
            let a = plan_of(&m, &snap, node);
            let b = plan_of(&m, &shuffled, node);
            prop_assert_eq!(a, b, "node {}", node);
        }
    }

    /// (b') Shuffling the interface lists of class nodes and PortMaps too changes nothing but
    /// messages that quote those lists as written (a node's row names the first missing interface
    /// in spec order; `NoInterfaceOnNode` quotes the PortMap's list).
    #[test]
    fn plan_is_deterministic_under_interface_shuffles(m in model(), seed in any::<u64>()) {
        let snap = snapshot(&m);
        let shuffled = shuffled(&snap, seed, true);
        for node in plan_nodes(&m) {
            let a = without_messages(plan_of(&m, &snap, node));
            let b = without_messages(plan_of(&m, &shuffled, node));
            prop_assert_eq!(a, b, "node {}", node);
        }
    }

    /// (c) The global part does not depend on the computing node (nor on its host facts).
    #[test]
    fn global_part_is_the_same_on_every_node(m in model()) {
        let snap = snapshot(&m);
        let nodes = plan_nodes(&m);
        let first = global_part(&plan_of(&m, &snap, nodes[0]));
        for node in &nodes[1..] {
            let other = global_part(&plan_of(&m, &snap, node));
            prop_assert_eq!(&first.0, &other.0, "portmaps: {} vs {}", nodes[0], node);
            prop_assert_eq!(&first.1, &other.1, "classes: {} vs {}", nodes[0], node);
        }
    }

    /// (d) Every PortMap gets an Accepted reason; invalid specs are never accepted; Programmed is
    /// present exactly when Accepted is Valid.
    #[test]
    fn every_portmap_gets_a_reason(m in model()) {
        let snap = snapshot(&m);
        let wanted: BTreeSet<(String, String)> = m
            .portmaps
            .iter()
            .map(|p| (p.namespace.to_owned(), p.name.to_owned()))
            .collect();
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            let got: BTreeSet<(String, String)> = p
                .portmaps
                .iter()
                .map(|d| (d.namespace.clone(), d.name.clone()))
                .collect();
            prop_assert_eq!(p.portmaps.len(), m.portmaps.len());
            prop_assert_eq!(&got, &wanted);
            for d in &p.portmaps {
                let spec = m
                    .portmaps
                    .iter()
                    .find(|s| s.namespace == d.namespace && s.name == d.name)
                    .expect("decision of a known PortMap");
                if let Some(why) = spec_is_invalid(&m, spec) {
                    prop_assert_ne!(
                        d.accepted.reason, AcceptedReason::Valid,
                        "{}/{} accepted although {}", d.namespace, d.name, why
                    );
                }
                if !d.accepted.is_true() {
                    prop_assert!(!d.accepted.message.is_empty(), "{}/{}: empty message", d.namespace, d.name);
                }
                prop_assert_eq!(
                    d.programmed.is_some(), d.accepted.is_true(),
                    "{}/{}: programmed {:?} with accepted {:?}",
                    d.namespace, d.name, d.programmed, d.accepted
                );
            }
        }
    }

    /// (d') No hostile interface name reaches any node's datapath: not the nft text, not a
    /// link, not a sysctl; the mappings that would bind one are refused with a reason.
    #[test]
    fn hostile_interface_names_never_reach_the_host(m in model()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            let text = kuport_core::render::nft_text(&p.host_state.nft);
            for name in HOSTILE_IFACES.iter().filter(|n| !n.is_empty()) {
                prop_assert!(
                    !text.contains(&format!("\"{name}\"")),
                    "node {}: {:?} in the table:\n{}", node, name, text
                );
            }
            for iface in p.host_state.valid_mark_interfaces.iter().chain(p.host_state.links.iter().filter_map(|l| l.device.as_ref())) {
                prop_assert!(!HOSTILE_IFACES.contains(&iface.as_str()), "node {}: {:?}", node, iface);
            }
        }
    }

    /// (e) At most one node writes each PortMap's status, and it is the decision's status writer.
    #[test]
    fn one_status_writer_per_portmap(m in model()) {
        let snap = snapshot(&m);
        let mut writers: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
        let mut decided: BTreeMap<(String, String), Option<String>> = BTreeMap::new();
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            for w in &p.writes.portmaps {
                writers.entry((w.namespace.clone(), w.name.clone())).or_default().push(node);
            }
            for d in &p.portmaps {
                decided.insert((d.namespace.clone(), d.name.clone()), d.status_writer.clone());
            }
        }
        for (key, nodes) in &writers {
            prop_assert_eq!(nodes.len(), 1, "{:?} written by {:?}", key, nodes);
            let writer = decided.get(key).cloned().flatten();
            prop_assert_eq!(writer.as_deref(), Some(nodes[0]), "{:?}", key);
        }
    }

    /// (f) Slots are unique per class: within each node's view of a class, and across the
    /// proposals of every node together with the landed claims.
    #[test]
    fn slots_are_unique_per_class(m in model()) {
        let snap = snapshot(&m);
        // (class, slot) -> keys proposed for it, by any node.
        let mut proposed: BTreeMap<(String, u32), BTreeSet<String>> = BTreeMap::new();
        // (class, slot) -> the standby claims a serving pair's proposal takes the slot over from.
        let mut replaced: BTreeMap<(String, u32), BTreeSet<String>> = BTreeMap::new();
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            for class in &p.classes {
                let mut slots = BTreeSet::new();
                for link in &class.links {
                    prop_assert!(
                        slots.insert(link.slot),
                        "node {}: class {} shows slot {} twice: {:?}", node, class.name, link.slot, class.links
                    );
                }
            }
            for claim in &p.writes.claims {
                proposed
                    .entry((claim.class.clone(), claim.slot))
                    .or_default()
                    .insert(claim.key.clone());
                if let Some(victim) = &claim.replaces {
                    replaced
                        .entry((claim.class.clone(), claim.slot))
                        .or_default()
                        .insert(victim.clone());
                }
            }
        }
        for ((class, slot), keys) in &proposed {
            prop_assert_eq!(keys.len(), 1, "class {} slot {} proposed for {:?}", class, slot, keys);
            let key = keys.first().expect("one key");
            let victims = replaced.get(&(class.clone(), *slot));
            prop_assert!(victims.is_none_or(|v| v.len() == 1), "class {} slot {} replaces {:?}", class, slot, victims);
            for landed in claims_of(&snap, class).iter().filter(|c| well_formed_key(&c.key)) {
                let taken_over = victims.is_some_and(|v| v.contains(&landed.key));
                prop_assert!(
                    !(i64::from(landed.slot) == i64::from(*slot) && landed.key != *key && !taken_over),
                    "class {} slot {} proposed for {} but held by landed {}",
                    class, slot, key, landed.key
                );
            }
        }
    }

    /// (g) No return link before its claim has landed: every link a node builds is a landed claim
    /// of its class for the pair (this node, peer), at the link's slot.
    #[test]
    fn links_only_for_landed_claims(m in model()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            for link in &p.host_state.links {
                let class = class_of(&snap, &link.class);
                let claims = claims_of(&snap, &link.class);
                let key = pair_key(node, &link.peer);
                let slot = i64::from(link.vni) - i64::from(class.spec.return_path.vxlan.vni);
                prop_assert!(
                    claims.iter().any(|c| c.key == key && i64::from(c.slot) == slot),
                    "node {} builds {:?} without a landed claim {} at slot {} (claims {:?})",
                    node, link, key, slot, claims
                );
            }
        }
    }
    /// (i) Proposals land: when every node writes what it planned from one snapshot, each pair
    /// proposed holds a landed claim afterwards, as the plan reads the class again. The plan hands
    /// each free slot to one pair and no write of the round takes a slot the plan saw free, so
    /// nothing may keep a proposal out: one that never lands leaves its pair without a link for
    /// good. The claim need not sit at the proposed slot: a GC drop in the same round can make
    /// the pair's own entry, ignored while it shared its slot with an earlier key, count again,
    /// and then that entry's slot is the one that counts.
    #[test]
    fn proposals_land_when_written(m in model(), seed in any::<u64>()) {
        let mut snap = snapshot(&m);
        let mut plans: Vec<Plan> = m.nodes.iter().map(|n| plan_of(&m, &snap, n.name)).collect();
        Rng(seed).shuffle(&mut plans);
        for p in &plans {
            write_status(&mut snap, p);
        }
        for p in plans.iter().filter(|p| !p.writes.claims.is_empty()) {
            let again = plan_of(&m, &snap, &p.node);
            for claim in &p.writes.claims {
                let landed = again
                    .classes
                    .iter()
                    .filter(|c| c.name == claim.class)
                    .flat_map(|c| &c.links)
                    .any(|l| l.key == claim.key && l.landed);
                prop_assert!(
                    landed,
                    "node {} proposed {} at slot {} in class {}, which did not land: {:?}",
                    p.node, claim.key, claim.slot, claim.class, claims_of(&snap, &claim.class)
                );
            }
        }
    }

    /// (h) Conflicts follow the spec: accepted mappings never share a port of one protocol on a
    /// (node, interface) both could bind, and each `PortConflict` names an earlier accepted
    /// mapping that does.
    #[test]
    fn conflicts_follow_the_spec(m in model()) {
        let snap = snapshot(&m);
        let p = plan_of(&m, &snap, GHOST);
        let spec = |d: &kuport_core::plan::MappingDecision| {
            m.portmaps
                .iter()
                .find(|s| s.namespace == d.namespace && s.name == d.name)
                .expect("decision of a known PortMap")
        };
        let order = |s: &PmM| {
            (
                s.created.map(|t| t.parse::<Timestamp>().expect("time")),
                s.namespace,
                s.name,
            )
        };
        let bind = |s: &PmM| -> BTreeSet<(String, String)> {
            let class = class_of(&snap, s.class);
            class
                .spec
                .nodes
                .iter()
                .flat_map(|(n, c)| c.interfaces.iter().map(move |i| (n.clone(), i.clone())))
                .filter(|(_, i)| s.interfaces.is_empty() || s.interfaces.contains(&i.as_str()))
                .collect()
        };
        let clash = |a: &kuport_core::plan::MappingDecision, b: &kuport_core::plan::MappingDecision| {
            let (Some(pa), Some(pb)) = (a.ports, b.ports) else {
                return false;
            };
            a.protocol == b.protocol
                && pa.overlaps(&pb)
                && !bind(spec(a)).is_disjoint(&bind(spec(b)))
        };
        let accepted: Vec<_> = p.portmaps.iter().filter(|d| d.accepted.is_true()).collect();
        for (i, a) in accepted.iter().enumerate() {
            for b in &accepted[i + 1..] {
                prop_assert!(
                    !clash(a, b),
                    "{}/{} and {}/{} are both accepted but clash", a.namespace, a.name, b.namespace, b.name
                );
            }
        }
        for d in p.portmaps.iter().filter(|d| d.accepted.reason == AcceptedReason::PortConflict) {
            prop_assert!(
                accepted.iter().any(|a| order(spec(a)) < order(spec(d)) && clash(a, d)),
                "{}/{} refused with {:?} but no earlier accepted mapping clashes",
                d.namespace, d.name, d.accepted.message
            );
        }
    }
}
