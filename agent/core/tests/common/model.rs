//! The cluster model the plan's property tests draw from (`spec/plan.md`, `spec/targets.md`):
//! small pools of names so names, ports and slots collide often, the strategies, the model's
//! objects as the plan reads them, a shuffler of every input list, and the oracles the
//! properties compare against.
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
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::Config as ProptestConfig;

// ---------------------------------------------------------------------------------------------
// Pools. Small on purpose, so that names, ports and slots collide often.

pub const NODES: [&str; 6] = ["edge-a", "edge-b", "worker-a", "worker-b", "Zeta", "n1"];
/// A node name with no Node object: planned for, named by classes, endpoints and claims.
pub const GHOST: &str = "ghost";
pub const NODES_AND_GHOST: [&str; 7] = [
    "edge-a", "edge-b", "worker-a", "worker-b", "Zeta", "n1", GHOST,
];
pub const CLASS_IFACES: [&str; 3] = ["enp1s0", "wt0", "eth1"];
pub const PM_IFACES: [&str; 4] = ["enp1s0", "wt0", "eth1", "bogus"];
/// Names the kernel or nft would refuse or misread: too long, with nft syntax, a quote, a
/// wildcard, whitespace, empty, a dot name.
pub const HOSTILE_IFACES: [&str; 7] = [
    "a-name-over-15-bytes",
    "wt0;drop",
    "x\"y",
    "wg*",
    "eth 0",
    "",
    "..",
];
pub const NAMESPACES: [&str; 3] = ["games", "web", "ops"];
pub const CLASSES: [&str; 4] = ["public", "lan", "private", "zz"];
pub const MISSING_CLASS: &str = "missing";
pub const PM_NAMES: [&str; 6] = [
    "gs",
    "lobby",
    "web",
    "dns",
    "x",
    "a-rather-long-portmap-name-that-is-meant-to-push-the-counter-and-comment-texts-past-the-128-byte-limit-of-nft-comments",
];
pub const SERVICES: [&str; 3] = ["gs", "lobby", "web"];
pub const PORT_NAMES: [&str; 3] = ["game", "web", "x"];
pub const PODS: [&str; 4] = ["gs-0", "gs-1", "lobby-0", "web-0"];
pub const TIMES: [&str; 5] = [
    "2026-01-01T00:00:00Z",
    "2026-03-01T00:00:00Z",
    "2026-05-31T11:00:00Z", // an hour before NOW
    "2026-05-30T11:00:00Z", // 25 hours before NOW
    "2026-06-01T13:00:00Z", // after NOW (skewed clock)
];
pub const NOW: &str = "2026-06-01T12:00:00Z";
pub const SUBNETS: [&str; 15] = [
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

pub fn now() -> Timestamp {
    NOW.parse().expect("NOW parses")
}

pub fn cases() -> u32 {
    std::env::var("KUPORT_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

pub fn config() -> ProptestConfig {
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
pub struct NodeM {
    pub name: &'static str,
    pub ready: bool,
    /// Last octet of the InternalIP; none: no InternalIP.
    pub ip: Option<u8>,
    /// An IPv6 InternalIP and an ExternalIP listed before the IPv4 InternalIP.
    pub noise: bool,
}

#[derive(Clone, Debug)]
pub struct NsM {
    pub name: &'static str,
    pub tier: Option<&'static str>,
}

#[derive(Clone, Debug)]
pub enum SelM {
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
pub struct RowM {
    pub node: &'static str,
    pub ready: bool,
    pub mtu: Option<i32>,
    pub addresses: Vec<(&'static str, u8)>,
}

#[derive(Clone, Debug)]
pub struct ClaimM {
    pub key: String,
    pub slot: i32,
    pub unused_since: Option<&'static str>,
}

#[derive(Clone, Debug)]
pub struct ClassM {
    pub name: &'static str,
    pub created: Option<&'static str>,
    pub nodes: BTreeMap<&'static str, Vec<&'static str>>,
    pub multi: bool,
    /// (min, max, reserved); none: the defaults.
    pub window: Option<(i32, i32, Vec<i32>)>,
    pub selector: Option<SelM>,
    pub vxlan: bool,
    pub vni: Option<i32>,
    pub port: Option<i32>,
    pub subnet: Option<String>,
    pub rows: Vec<RowM>,
    pub claims: Vec<ClaimM>,
}

#[derive(Clone, Debug)]
pub struct PmM {
    pub namespace: &'static str,
    pub name: &'static str,
    pub class: &'static str,
    pub tcp: bool,
    pub port: i32,
    pub end_port: Option<i32>,
    pub interfaces: Vec<&'static str>,
    pub service: &'static str,
    pub port_name: &'static str,
    pub created: Option<&'static str>,
    /// A ready pod behind the PortMap's Service (its node, and its port when it differs from
    /// `port`), listed in a slice of its own.
    pub pod: Option<(&'static str, Option<i32>)>,
}

#[derive(Clone, Debug)]
pub struct EpM {
    pub address: Option<String>,
    pub node: Option<&'static str>,
    pub ready: Option<bool>,
    pub pod: Option<&'static str>,
}

#[derive(Clone, Debug)]
pub struct SliceM {
    pub namespace: &'static str,
    /// The `kubernetes.io/service-name` label; none: unlabelled.
    pub service: Option<&'static str>,
    pub ipv6: bool,
    /// (name, protocol, port); names are unique within a slice, as the API requires.
    pub ports: Vec<(Option<&'static str>, Option<&'static str>, i32)>,
    pub endpoints: Vec<EpM>,
}

#[derive(Clone, Debug)]
pub struct FactsM {
    pub interfaces: Vec<(&'static str, u8)>,
    pub device: Option<&'static str>,
    pub mtu: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub nodes: Vec<NodeM>,
    pub namespaces: Vec<NsM>,
    pub classes: Vec<ClassM>,
    pub portmaps: Vec<PmM>,
    pub slices: Vec<SliceM>,
    pub cni: Option<u16>,
    /// Host facts of each name in `NODES_AND_GHOST`, by position.
    pub facts: Vec<FactsM>,
    /// Rounds in which every node's proposals, GC and class row are applied to the class
    /// statuses before planning (as the agents would write them), so that claims land.
    pub settle: u8,
    /// Seed of the order in which the nodes' writes of each round reach the API server.
    pub write_order: u64,
}

// ---------------------------------------------------------------------------------------------
// Strategies.

pub fn time() -> impl Strategy<Value = &'static str> {
    select(&TIMES[..])
}

pub fn node_attrs() -> impl Strategy<Value = (bool, Option<u8>, bool)> {
    (
        prop::bool::weighted(0.8),
        prop::option::weighted(0.85, 1u8..=250),
        prop::bool::weighted(0.15),
    )
}

pub fn nodes() -> impl Strategy<Value = Vec<NodeM>> {
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

pub fn namespaces() -> impl Strategy<Value = Vec<NsM>> {
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

pub fn tier_values() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(select(&["public", "private", "other"][..]), 0..=2)
}

pub fn selector() -> impl Strategy<Value = SelM> {
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

pub fn window_port() -> impl Strategy<Value = i32> {
    prop_oneof![
        select(&[0, 1, 1024, 3000, 3001, 3003, 65535, 70000, -1][..]),
        0..70000i32,
    ]
}

pub fn window() -> impl Strategy<Value = (i32, i32, Vec<i32>)> {
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

pub fn vni() -> impl Strategy<Value = i32> {
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

pub fn vxlan_port() -> impl Strategy<Value = i32> {
    prop_oneof![select(&[4790, 4790, 8472, 0, 70000, -1][..]), 1..65536i32]
}

pub fn claim_key() -> impl Strategy<Value = String> {
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

pub fn claim() -> impl Strategy<Value = ClaimM> {
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

pub fn row() -> impl Strategy<Value = RowM> {
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
pub fn class_attrs() -> impl Strategy<Value = (ClassM, bool)> {
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

pub fn classes() -> impl Strategy<Value = Vec<ClassM>> {
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

pub fn pm_port() -> impl Strategy<Value = i32> {
    prop_oneof![
        6 => 3000..3006i32,
        1 => select(&[0, 1, 65535, 65536, -1, 70000][..]),
        2 => 0..70000i32,
    ]
}

pub fn portmap() -> impl Strategy<Value = PmM> {
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

pub fn portmaps() -> impl Strategy<Value = Vec<PmM>> {
    prop::collection::vec(portmap(), 0..=12).prop_map(|pms| {
        // The API holds one object per namespace/name.
        let mut seen = BTreeSet::new();
        pms.into_iter()
            .filter(|p| seen.insert((p.namespace, p.name)))
            .collect()
    })
}

pub fn endpoint() -> impl Strategy<Value = EpM> {
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

pub fn slice() -> impl Strategy<Value = SliceM> {
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

pub fn facts() -> impl Strategy<Value = FactsM> {
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
pub fn aimed_slice() -> impl Strategy<Value = (SliceM, Option<(prop::sample::Index, Option<i32>)>)>
{
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
pub fn pm_node(pm: &PmM) -> &'static str {
    NODES_AND_GHOST[pm.name.len() % NODES_AND_GHOST.len()]
}

/// The slice of a PortMap's own pod.
pub fn pod_slice(pm: &PmM) -> Option<SliceM> {
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

pub fn aim(slice: &mut SliceM, pm: &PmM, pod_port: Option<i32>) {
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

pub fn model() -> impl Strategy<Value = Model> {
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
