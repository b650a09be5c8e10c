//! The cluster model the plan's property tests draw from (`docs/architecture.md`, `docs/performance.md`):
//! small pools of names so names, ports and slots collide often, the strategies, the model's
//! objects as the plan reads them, a shuffler of every input list, and the oracles the
//! properties compare against.
//!
//! Services are IPv4-only, IPv6-only or dual-stack (an IPv6 slice beside the IPv4 one, listing
//! the same pods or off by one fact the pairing must notice); Nodes advertise IPv6 pod CIDRs,
//! hosts have IPv6 addresses on some accepting interfaces, classes name IPv6 link prefixes
//! (valid or not). [`linked_model`] leans toward return links, which `model` builds rarely.
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
/// IPv6 link prefixes: valid ones (the default among them, and one overlapping the pods of
/// `NODES[3]`, whose IPv6 endpoints it then rules out), and invalid ones.
pub const SUBNETS6: [&str; 11] = [
    "fd6b:7570::/96",
    "fd00:77::/64",
    "fd12:3456:789a::/96",
    " fd00:78::/80 ",
    "fd00:10:244:3::/64",
    "fd00::/100",
    "10.0.0.0/8",
    "fe80::/64",
    "100::/48",
    "garbage",
    "",
];
/// How many of [`SUBNETS6`] are valid (they come first).
pub const VALID_SUBNETS6: usize = 5;

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
    /// The IPv6 pod CIDR the Node also advertises, as a dual-stack cluster's Nodes do.
    pub pod6: Option<Pod6M>,
}

/// A Node's IPv6 pod CIDR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pod6M {
    /// Its own /64 ([`pod_cidr6`]): only pods on it are there.
    Own,
    /// The whole pool, `fd00:10:244::/48`, as every Node's `10.244.0.0/16` is in the model.
    Pool,
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
    /// `returnPath.vxlan.ipv6Subnet`; none: the default.
    pub subnet6: Option<&'static str>,
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
    /// The families that pod is listed in.
    pub stack: Stack,
    /// How the IPv6 slice of a dual-stack pod lists it.
    pub twin: TwinM,
}

/// The families a Service lists its pods in: IPv4-only, IPv6-only, or dual-stack (an IPv4
/// slice and an IPv6 slice naming the same pods, as the EndpointSlice controller writes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stack {
    V4,
    V6,
    Dual,
}

/// How a dual-stack Service's IPv6 slice lists the pods of its IPv4 slice: the same way (the
/// plan pairs each pod with its IPv6 address), or off by one fact the pairing must notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinM {
    Same,
    /// Every endpoint on this node instead.
    OtherNode(&'static str),
    /// Every port one higher.
    OtherPort,
    /// Every endpoint naming another pod.
    OtherPod,
    /// Every endpoint not ready.
    NotReady,
    /// The pods listed twice, in two IPv6 slices with different addresses (as while the
    /// controller moves endpoints between slices): the smallest address counts.
    Twice,
}

/// An endpoint's address, written in the family of its slice.
#[derive(Clone, Debug)]
pub enum AddrM {
    /// `10.244.<net>.<host>`, or `fd00:10:244:<net>::<host>` in an IPv6 slice: in the pod
    /// CIDR of `NODES[net]` when that Node advertises its own ([`pod_cidr6`]), where host 1 is
    /// the CNI's gateway.
    Pod {
        net: u8,
        host: u8,
    },
    /// The same, in the other family: an address the slice's family does not hold.
    OtherFamily {
        net: u8,
        host: u8,
    },
    Garbage,
}

impl AddrM {
    /// The address as a slice of `ipv6` lists it.
    pub fn text(&self, ipv6: bool) -> String {
        match *self {
            AddrM::Pod { net, host } => pod_address(net, host, ipv6),
            AddrM::OtherFamily { net, host } => pod_address(net, host, !ipv6),
            AddrM::Garbage => "garbage".to_owned(),
        }
    }
}

pub fn pod_address(net: u8, host: u8, ipv6: bool) -> String {
    if ipv6 {
        format!("fd00:10:244:{net:x}::{host:x}")
    } else {
        format!("10.244.{net}.{host}")
    }
}

/// The IPv6 pod CIDR of `NODES[i]`.
pub fn pod_cidr6(i: usize, pod6: Pod6M) -> String {
    match pod6 {
        Pod6M::Own => format!("fd00:10:244:{i:x}::/64"),
        Pod6M::Pool => "fd00:10:244::/48".to_owned(),
    }
}

#[derive(Clone, Debug)]
pub struct EpM {
    pub address: Option<AddrM>,
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
    /// IPv6 addresses (`2001:db8::<n>`) of some of the interfaces that have an IPv4 one.
    pub interfaces6: Vec<(&'static str, u8)>,
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

pub fn node_attrs() -> impl Strategy<Value = (bool, Option<u8>, bool, Option<Pod6M>)> {
    (
        prop::bool::weighted(0.8),
        prop::option::weighted(0.85, 1u8..=250),
        prop::bool::weighted(0.15),
        prop_oneof![
            4 => Just(Some(Pod6M::Own)),
            4 => Just(Some(Pod6M::Pool)),
            2 => Just(None),
        ],
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
                .map(|(name, (ready, ip, noise, pod6))| NodeM {
                    name,
                    ready,
                    ip,
                    noise,
                    pod6,
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
            prop_oneof![
                6 => Just(None),
                2 => select(&SUBNETS6[..VALID_SUBNETS6]).prop_map(Some),
                1 => select(&SUBNETS6[..]).prop_map(Some),
            ],
        ),
    )
        .prop_map(
            |(
                (created, nodes, multi, window, selector),
                (vxlan, vni, port, subnet, rows, claims, subnet6),
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
                    subnet6,
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

pub fn stack() -> impl Strategy<Value = Stack> {
    prop_oneof![
        2 => Just(Stack::V4),
        4 => Just(Stack::Dual),
        2 => Just(Stack::V6),
    ]
}

pub fn twin() -> impl Strategy<Value = TwinM> {
    prop_oneof![
        8 => Just(TwinM::Same),
        1 => select(&NODES_AND_GHOST[..]).prop_map(TwinM::OtherNode),
        1 => Just(TwinM::OtherPort),
        1 => Just(TwinM::OtherPod),
        1 => Just(TwinM::NotReady),
        1 => Just(TwinM::Twice),
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
            stack(),
            twin(),
        ),
    )
        .prop_map(
            |(
                (namespace, name, class, tcp, port, end_port),
                (interfaces, service, port_name, created, pod, stack, twin),
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
                stack,
                twin,
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
            8 => (0u8..4, 1u8..6).prop_map(|(net, host)| Some(AddrM::Pod { net, host })),
            1 => (0u8..4, 1u8..6).prop_map(|(net, host)| Some(AddrM::OtherFamily { net, host })),
            1 => Just(Some(AddrM::Garbage)),
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

/// Which of a host's interfaces with an IPv4 address also have an IPv6 one.
#[derive(Clone, Debug)]
pub enum V6FactsM {
    All,
    None,
    Some(Vec<bool>),
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
        prop_oneof![
            3 => Just(V6FactsM::All),
            1 => Just(V6FactsM::None),
            1 => prop::collection::vec(any::<bool>(), 10).prop_map(V6FactsM::Some),
        ],
    )
        .prop_map(
            |(interfaces, device, mtu, v6): (Vec<(&'static str, u8)>, _, _, _)| {
                let interfaces6 = interfaces
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| match &v6 {
                        V6FactsM::All => true,
                        V6FactsM::None => false,
                        V6FactsM::Some(mask) => mask.get(*i).copied().unwrap_or(false),
                    })
                    .map(|(_, iface)| *iface)
                    .collect();
                FactsM {
                    interfaces,
                    interfaces6,
                    device,
                    mtu,
                }
            },
        )
}

/// A slice, and optionally a PortMap it is aimed at (with the pod port; none: the PortMap's
/// own port), so that endpoints are found often; with the families it lists the pods in.
pub type Aimed = (
    SliceM,
    Option<(prop::sample::Index, Option<i32>)>,
    Stack,
    TwinM,
);

pub fn aimed_slice() -> impl Strategy<Value = Aimed> {
    (
        slice(),
        prop::option::weighted(
            0.85,
            (
                any::<prop::sample::Index>(),
                prop::option::weighted(0.3, 3000..3003i32),
            ),
        ),
        stack(),
        twin(),
    )
}

/// Some node for an aimed slice's endpoint, chosen from the PortMap's name.
pub fn pm_node(pm: &PmM) -> &'static str {
    NODES_AND_GHOST[pm.name.len() % NODES_AND_GHOST.len()]
}

/// The position of a node name in [`NODES_AND_GHOST`]: the `net` of its pods' addresses.
pub fn node_net(node: &str) -> u8 {
    let i = NODES_AND_GHOST.iter().position(|n| *n == node).unwrap_or(0);
    u8::try_from(i).expect("few nodes")
}

/// The slices of a PortMap's own pod: an IPv4 one, an IPv6 one, or both.
pub fn pod_slices(pm: &PmM) -> Vec<SliceM> {
    let Some((node, pod_port)) = pm.pod else {
        return Vec::new();
    };
    let host = u8::try_from(pm.name.len() + 4).expect("short names");
    let mut slice = SliceM {
        namespace: pm.namespace,
        service: None,
        ipv6: false,
        ports: Vec::new(),
        endpoints: vec![EpM {
            address: Some(AddrM::Pod {
                net: node_net(node),
                host,
            }),
            node: Some(node),
            ready: Some(true),
            pod: Some(pm.name),
        }],
    };
    aim(&mut slice, pm, pod_port, pm.stack);
    stacked(slice, pm.stack, pm.twin)
}

/// The slices listing the pods of an IPv4 slice in `stack`: itself, or its IPv6 twin (as
/// `twin` lists them) beside it for a dual-stack Service.
pub fn stacked(slice: SliceM, stack: Stack, twin: TwinM) -> Vec<SliceM> {
    if stack != Stack::Dual {
        return vec![slice];
    }
    let mut six = slice.clone();
    six.ipv6 = true;
    for ep in &mut six.endpoints {
        match twin {
            TwinM::Same | TwinM::OtherPort | TwinM::Twice => {}
            TwinM::OtherNode(node) => ep.node = Some(node),
            TwinM::OtherPod => ep.pod = Some("other-0"),
            TwinM::NotReady => ep.ready = Some(false),
        }
    }
    if twin == TwinM::OtherPort {
        for port in &mut six.ports {
            port.2 = port.2.saturating_add(1);
        }
    }
    if twin != TwinM::Twice {
        return vec![slice, six];
    }
    // The slice with the larger addresses first: only sorting finds the smallest.
    let mut larger = six.clone();
    for ep in &mut larger.endpoints {
        if let Some(AddrM::Pod { host, .. }) = &mut ep.address {
            *host += 16;
        }
    }
    vec![slice, larger, six]
}

/// Points `slice` at the PortMap's Service and named port, in the family `stack` lists first
/// (IPv6 only for an IPv6-only Service).
pub fn aim(slice: &mut SliceM, pm: &PmM, pod_port: Option<i32>, stack: Stack) {
    slice.namespace = pm.namespace;
    slice.service = Some(pm.service);
    slice.ipv6 = stack == Stack::V6;
    if slice.endpoints.is_empty() {
        let node = pm_node(pm);
        slice.endpoints.push(EpM {
            address: Some(AddrM::Pod {
                net: node_net(node),
                host: 9,
            }),
            node: Some(node),
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
                    .flat_map(|(mut slice, target, stack, twin)| {
                        match (target, portmaps.is_empty()) {
                            (Some((i, pod_port)), false) => {
                                aim(&mut slice, i.get(&portmaps), pod_port, stack);
                                stacked(slice, stack, twin)
                            }
                            _ => vec![slice],
                        }
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

/// The same cluster with every Service IPv4-only: no IPv6 slice (an IPv6-only PortMap pod is
/// gone, a dual-stack one listed in IPv4 alone). The Nodes' IPv6 pod CIDRs and the hosts'
/// IPv6 addresses stay.
pub fn ipv4_services_only(m: &Model) -> Model {
    let mut m = m.clone();
    m.slices.retain(|s| !s.ipv6);
    for pm in &mut m.portmaps {
        if pm.stack == Stack::V6 {
            pm.pod = None;
        }
        pm.stack = Stack::V4;
    }
    m
}

/// [`ipv4_services_only`] in a cluster without IPv6 at all: no Node advertises an IPv6 pod
/// CIDR and no host interface has an IPv6 address.
pub fn without_ipv6(m: &Model) -> Model {
    let mut m = ipv4_services_only(m);
    for n in &mut m.nodes {
        n.pod6 = None;
    }
    for f in &mut m.facts {
        f.interfaces6.clear();
    }
    m
}

/// A cluster of [`model`] leaning toward return links: every node of [`NODES`] present (pods
/// are placed on any of them), Ready, with an InternalIP; every class a Vxlan one with a valid
/// IPv6 prefix; two rounds of status writes (claims land). What the link properties need often
/// and `model` gives rarely.
pub fn linked_model() -> impl Strategy<Value = Model> {
    (model(), select(&SUBNETS6[..VALID_SUBNETS6])).prop_map(|(mut m, subnet6)| {
        m.nodes = NODES
            .iter()
            .zip(200u8..)
            .map(|(name, ip)| {
                let mut n = m.nodes.iter().find(|n| n.name == *name).cloned();
                let n = n.get_or_insert(NodeM {
                    name,
                    ready: true,
                    ip: None,
                    noise: false,
                    pod6: Some(Pod6M::Own),
                });
                n.ready = true;
                n.ip.get_or_insert(ip);
                n.clone()
            })
            .collect();
        for c in &mut m.classes {
            c.vxlan = true;
            c.subnet6 = c.subnet6.filter(|s| SUBNETS6[..VALID_SUBNETS6].contains(s));
            c.subnet6.get_or_insert(subnet6);
        }
        m.settle = 2;
        m
    })
}

/// Half [`model`], half [`linked_model`]: for the properties of the datapath, which links add
/// to.
pub fn model_or_linked() -> impl Strategy<Value = Model> {
    prop_oneof![model(), linked_model()]
}
