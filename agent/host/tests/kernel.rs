//! Kernel tests of the host layer, each in throwaway network namespaces. Root only: without root
//! every test skips with one line, and with `KUPORT_REQUIRE_ROOT_TESTS=1` that is a failure.
//!
//! This file has its own harness (`harness = false`): a test that must act inside a namespace
//! re-runs this binary there with `--kuport-child <body>`, so the host layer's nft and netlink
//! calls reach that namespace without any unsafe `setns`.

mod netns;

use std::process::ExitCode;

use kuport_core::api::{Protocol, checks};
use kuport_core::ir::HostState;
use kuport_core::snapshot::HostFacts;
use kuport_host::{FactsQuery, Host, LinuxHost};
use netns::{
    GOLDEN, block_on, child, foreign_state, golden_ir, golden_nft, golden_nft6, namespace, sh,
};

const TESTS: &[netns::Test] = &[
    (
        "golden_states_apply_read_back_and_reapply_with_zero_mutations",
        golden_states,
    ),
    (
        "foreign_state_is_untouched_by_apply_reapply_and_teardown",
        foreign_untouched,
    ),
    ("an_update_changes_only_what_changed", update_only_changes),
    ("hand_made_drift_is_repaired_on_verify", drift_repaired),
    (
        "a_held_vni_takes_out_only_the_mappings_on_its_link",
        vni_held,
    ),
    ("refused_rules_take_out_only_their_mapping", nft_refusal),
    ("facts_resolve_interfaces_and_the_underlay", facts_read),
    (
        "node_checks_read_the_namespaces_sysctls_after_an_apply",
        node_checks_read,
    ),
    (
        "link_and_underlay_removal_is_reported_as_events",
        link_events,
    ),
    (
        "state_removed_by_others_is_reported_and_the_hosts_own_changes_are_not",
        removal_events,
    ),
    (
        "an_ipv6_address_of_a_link_removed_by_others_is_an_event_and_link_local_ones_are_not",
        ipv6_address_events,
    ),
    (
        "a_refused_transaction_leaves_new_links_down_and_their_port_closed",
        links_down_on_refusal,
    ),
];

const CHILDREN: &[netns::Test] = &[
    ("apply_golden", child_apply_golden),
    ("apply_twice_and_teardown", child_apply_twice_and_teardown),
    ("update", child_update),
    ("drift", child_drift),
    ("vni_held", child_vni_held),
    ("nft_refusal", child_nft_refusal),
    ("facts", child_facts),
    ("node_checks", child_node_checks),
    ("events", child_events),
    ("removal_events", child_removal_events),
    ("ipv6_address_events", child_ipv6_address_events),
    ("refused_guard", child_refused_guard),
];

fn main() -> ExitCode {
    netns::harness(TESTS, CHILDREN)
}

/// [`underlay_for`], plus a device for each accepting interface the IR sets sysctls on.
fn underlay_and_interfaces_for(state: &HostState) {
    underlay_for(state);
    for iface in &state.valid_mark_interfaces {
        sh(&format!(
            "ip link show {iface} >/dev/null 2>&1 || ip link add {iface} type veth peer name {iface}-p"
        ));
    }
}

/// Gives the namespace the underlay the IR's links bind to: a dummy `wt0` holding the links'
/// local address (the node's InternalIP), plus the interfaces the DNAT rules name.
fn underlay_for(state: &HostState) {
    sh(
        "ip link add wt0 type veth peer name wt0-peer && ip link set wt0-peer up && ip link set wt0 up",
    );
    if let Some(link) = state.links.first() {
        sh(&format!("ip addr add {}/24 dev wt0", link.local));
    }
}

fn env_case() -> String {
    std::env::var("KUPORT_CASE").expect("KUPORT_CASE")
}

// ---- golden states ----

fn golden_states() {
    for case in GOLDEN {
        let ns = namespace("golden");
        child(&ns, "apply_golden", &[("KUPORT_CASE", case)]);
    }
}

fn child_apply_golden() {
    let case = env_case();
    let state = golden_ir(&case);
    underlay_and_interfaces_for(&state);
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        let first = host.apply(&state, false).await.expect("apply");
        // The accepting interfaces' reverse-path check must honour the steering mark.
        for iface in &state.valid_mark_interfaces {
            assert_eq!(
                sh(&format!(
                    "cat /proc/sys/net/ipv4/conf/{iface}/src_valid_mark"
                ))
                .trim(),
                "1",
                "{case}: src_valid_mark on {iface}"
            );
        }
        if case == "empty" {
            assert_eq!(first.mutations(), 0, "{case}: an empty plan owns nothing");
        } else {
            assert!(first.nft_changed, "{case}");
        }
        let listing = sh("nft list table ip kuport 2>/dev/null || true");
        assert_eq!(
            netns::table_of(&listing),
            netns::table_of(&golden_nft(&case)),
            "{case}: nft listing"
        );
        let listing6 = sh("nft list table ip6 kuport 2>/dev/null || true");
        assert_eq!(
            netns::table_of(&listing6),
            netns::table_of(&golden_nft6(&case)),
            "{case}: nft listing of the IPv6 table"
        );
        check_links(&state);
        check_rules_and_routes(&state);
        let counters = host.counters().await.expect("counters");
        // A mapping served over both families counts in both tables, read as one.
        let per_mapping = state
            .nft
            .counters
            .iter()
            .chain(&state.nft6.counters)
            .filter(|c| c.chain != kuport_core::ir::ChainId::Guard)
            .map(|c| (c.chain, &c.namespace, &c.mapping))
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        assert_eq!(
            counters.len(),
            per_mapping,
            "{case}: one reading per mapping and chain (the link guard's is no mapping's)"
        );
        assert!(
            counters
                .iter()
                .all(|c| c.packets == 0 && !c.namespace.is_empty()),
            "{case}: {counters:?}"
        );
        let again = host.apply(&state, true).await.expect("re-apply");
        assert_eq!(
            again.mutations(),
            0,
            "{case}: re-apply against the kernel mutated: {again:?}"
        );
        let cached = host.apply(&state, false).await.expect("re-apply");
        assert_eq!(cached.mutations(), 0, "{case}");
        host.teardown().await.expect("teardown");
    });
    assert_nothing_owned();
}

fn check_links(state: &HostState) {
    for l in &state.links {
        let json: serde_json::Value =
            serde_json::from_str(&sh(&format!("ip -j -d link show dev {}", l.name)))
                .expect("link json");
        let info = &json[0]["linkinfo"]["info_data"];
        assert_eq!(info["id"], l.vni, "{}", l.name);
        assert_eq!(info["port"], l.port, "{}", l.name);
        assert_eq!(info["local"], l.local.to_string(), "{}", l.name);
        assert_eq!(info["remote"], l.remote.to_string(), "{}", l.name);
        assert_eq!(
            info["link"], "wt0",
            "{}: bound to its underlay device",
            l.name
        );
        assert_eq!(info["learning"], false, "{}", l.name);
        assert_eq!(info["ttl"], 64, "{}", l.name);
        if let Some(mtu) = l.mtu {
            assert_eq!(json[0]["mtu"], mtu, "{}", l.name);
        }
        assert!(
            json[0]["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "UP")),
            "{} up",
            l.name
        );
        let addrs = sh(&format!("ip -4 -o addr show dev {}", l.name));
        assert!(
            addrs.contains(&l.address.to_string()),
            "{}: {addrs}",
            l.name
        );
        let rp = sh(&format!("cat /proc/sys/net/ipv4/conf/{}/rp_filter", l.name));
        assert_eq!(rp.trim(), "2", "{}: loose reverse-path filtering", l.name);
        // The peer's end is reachable without ARP: a permanent entry with the MAC its agent
        // gives it (02:6b:70 and the last three octets of its address).
        let o = l.peer_address.octets();
        let mac = format!("02:6b:70:{:02x}:{:02x}:{:02x}", o[1], o[2], o[3]);
        let neigh = sh(&format!("ip -4 neigh show dev {}", l.name));
        assert!(
            neigh.contains(&format!("{} lladdr {mac} PERMANENT", l.peer_address)),
            "{}: {neigh:?}",
            l.name
        );
        check_link6(l, &mac);
    }
}

/// A link IPv6 mappings cross: its inner IPv6 end (usable at once: no duplicate address
/// detection) and the peer's as a permanent neighbour with the same MAC as its IPv4 end.
fn check_link6(l: &kuport_core::ir::Link, mac: &str) {
    let addrs = sh(&format!("ip -6 -o addr show dev {} scope global", l.name));
    let (Some(own), Some(peer)) = (l.address6, l.peer_address6) else {
        assert!(
            addrs.trim().is_empty(),
            "{}: no IPv6 wanted: {addrs}",
            l.name
        );
        return;
    };
    assert!(addrs.contains(&own.to_string()), "{}: {addrs}", l.name);
    assert!(!addrs.contains("tentative"), "{}: {addrs}", l.name);
    let neigh = sh(&format!("ip -6 neigh show dev {}", l.name));
    assert!(
        neigh.contains(&format!("{peer} lladdr {mac} PERMANENT")),
        "{}: {neigh:?}",
        l.name
    );
}

fn check_rules_and_routes(state: &HostState) {
    let rules = sh("ip rule list");
    let rules6 = sh("ip -6 rule list");
    for r in &state.rules {
        let listed = match r.family {
            kuport_core::ir::Family::V4 => &rules,
            kuport_core::ir::Family::V6 => &rules6,
        };
        let to =
            r.to.map(|t| {
                format!(
                    "to {} ",
                    // `ip rule` prints a host route's address alone.
                    if t.prefix_len() == t.max_prefix_len() {
                        t.addr().to_string()
                    } else {
                        t.to_string()
                    }
                )
            })
            .unwrap_or_default();
        let table = if r.table == 254 {
            "main".to_owned()
        } else {
            r.table.to_string()
        };
        let line = format!(
            "{}:\tfrom all {to}fwmark {:#x}/{:#x} lookup {table}",
            r.priority, r.fwmark, r.fwmask
        );
        assert!(
            listed.lines().any(|l| l.trim_end() == line),
            "missing `{line}` in\n{listed}"
        );
    }
    let ours = rules
        .lines()
        .chain(rules6.lines())
        .filter(|l| l.starts_with("101:") || l.starts_with("102:"))
        .count();
    assert_eq!(ours, state.rules.len(), "{rules}{rules6}");
    for r in &state.routes {
        let six = if r.via.is_ipv6() { "-6 " } else { "" };
        let routes = sh(&format!("ip {six}route show table {}", r.table));
        assert!(
            routes.lines().any(|l| {
                // ip lists an IPv6 route with its metric.
                let l = l.trim().trim_end_matches(" metric 1024 pref medium");
                l == format!("default via {} dev {} proto static", r.via, r.dev)
            }),
            "table {}: {routes}",
            r.table
        );
    }
}

fn assert_nothing_owned() {
    assert!(
        !sh("nft list tables").contains("kuport"),
        "table left behind"
    );
    assert!(!sh("ip -o link").contains("kup-"), "link left behind");
    assert!(
        !sh("ip rule list")
            .lines()
            .any(|l| l.starts_with("101:") || l.starts_with("102:")),
        "rule left behind"
    );
    assert!(
        sh("ip route show table all")
            .lines()
            .all(|l| !l.contains("kup-")),
        "route left behind"
    );
}

// ---- foreign state ----

fn foreign_untouched() {
    let ns = namespace("foreign");
    child(
        &ns,
        "apply_twice_and_teardown",
        &[("KUPORT_CASE", "both-roles-multi")],
    );
}

fn child_apply_twice_and_teardown() {
    let state = golden_ir(&env_case());
    underlay_for(&state);
    // Shapes kuport must never touch: another table, netbird's rules, a VXLAN device, routes
    // in another table.
    sh(
        "nft add table ip other && nft add chain ip other post '{ type nat hook postrouting priority 100; }' \
        && nft add rule ip other post ip saddr 10.244.0.0/16 counter masquerade",
    );
    sh(
        "ip rule add pref 105 lookup main suppress_prefixlength 0 && ip rule add pref 110 not fwmark 0x1bd00 lookup 7120",
    );
    sh("ip link add vx-mesh type vxlan id 4242 dstport 8472 dev wt0 && ip link set vx-mesh up");
    sh("ip route add 100.64.0.0/16 dev wt0 table 7120 && ip route add default dev wt0 table 7120");
    let before = foreign_state(sh);
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        host.apply(&state, false).await.expect("apply");
        assert_eq!(foreign_state(sh), before, "after apply");
        host.apply(&state, true).await.expect("re-apply");
        assert_eq!(foreign_state(sh), before, "after re-apply");
        host.teardown().await.expect("teardown");
    });
    assert_eq!(foreign_state(sh), before, "after teardown");
    assert_nothing_owned();
}

// ---- update ----

fn update_only_changes() {
    let ns = namespace("update");
    child(&ns, "update", &[]);
}

fn child_update() {
    let full = golden_ir("pod-node-multi-two-links");
    underlay_for(&full);
    // The same node with one of its two links (and what hangs off it) gone.
    let mut less = full.clone();
    let gone = less.links.remove(1);
    less.rules.retain(|r| r.fwmark != gone.mark);
    less.routes.retain(|r| r.dev != gone.name);
    for (_, rules) in &mut less.nft.chains {
        rules.retain(|r| match r {
            kuport_core::ir::Rule::Dnat(d) => d.iif != gone.name,
            kuport_core::ir::Rule::SaveArrivalLink { iface, .. } => *iface != gone.name,
            _ => true,
        });
    }
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        host.apply(&full, false).await.expect("apply");
        let kept = &full.links[0].name;
        let index_before = sh(&format!("cat /sys/class/net/{kept}/ifindex"));
        let report = host.apply(&less, false).await.expect("update");
        assert_eq!(
            (
                report.links_created,
                report.links_deleted,
                report.rules_added,
                report.rules_deleted,
                report.routes_deleted
            ),
            // The link goes first (before the transaction that may remove its guard) and
            // takes its route with it.
            (0, 1, 0, 2, 0),
            "{report:?}"
        );
        assert_eq!(
            sh(&format!("cat /sys/class/net/{kept}/ifindex")),
            index_before,
            "the kept link was not recreated"
        );
        assert!(!sh("ip -o link").contains(&gone.name));
        check_rules_and_routes(&less);
        host.teardown().await.expect("teardown");
    });
}

// ---- drift ----

fn drift_repaired() {
    let ns = namespace("drift");
    child(&ns, "drift", &[]);
}

fn child_drift() {
    let state = golden_ir("pod-node-single");
    underlay_for(&state);
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        host.apply(&state, false).await.expect("apply");
        sh("nft flush chain ip kuport kup-pre");
        let rule = &state.rules[0];
        sh(&format!(
            "ip rule del pref {} fwmark {:#x}/{:#x}",
            rule.priority, rule.fwmark, rule.fwmask
        ));
        let cached = host.apply(&state, false).await.expect("apply");
        assert_eq!(
            cached.mutations(),
            0,
            "between resyncs an unchanged state applies nothing"
        );
        let verified = host.apply(&state, true).await.expect("verify");
        assert!(
            verified.nft_changed && verified.rules_added == 1,
            "{verified:?}"
        );
        assert_eq!(
            netns::table_of(&sh("nft list table ip kuport")),
            netns::table_of(&golden_nft("pod-node-single"))
        );
        check_rules_and_routes(&state);
        // A chain with the wrong priority (or none) is replaced, not patched.
        sh("nft delete chain ip kuport kup-fwd && nft add chain ip kuport kup-fwd");
        let fixed = host.apply(&state, true).await.expect("repair");
        assert!(fixed.nft_changed);
        assert_eq!(
            netns::table_of(&sh("nft list table ip kuport")),
            netns::table_of(&golden_nft("pod-node-single"))
        );
        host.teardown().await.expect("teardown");
    });
}

// ---- errors ----

fn vni_held() {
    let ns = namespace("vni");
    child(&ns, "vni_held", &[]);
}

fn child_vni_held() {
    let state = golden_ir("pod-node-single");
    underlay_for(&state);
    let link = &state.links[0];
    sh(&format!(
        "ip link add squatter type vxlan id {} dstport {} dev wt0",
        link.vni, link.port
    ));
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        let refusal = only_refusal(&mut host, &state, "everything but the held link").await;
        assert_eq!(refusal.unit, format!("return link {}", link.name));
        assert_eq!(refusal.link.as_deref(), Some(link.name.as_str()));
        assert!(
            refusal.message.contains("already used by device squatter"),
            "{refusal:?}"
        );
        assert_eq!(
            refusal.mappings.iter().collect::<Vec<_>>(),
            ["games/gs"],
            "the mapping using the link is named"
        );
        let table = sh("nft list ruleset");
        assert!(
            !table.contains("dnat") && !table.contains(&link.name),
            "no DNAT toward a link that failed, nothing on it:\n{table}"
        );
        // Not remembered as applied: the next pass tries the link again, and succeeds once
        // the squatter is gone.
        sh("ip link del squatter");
        let again = host.apply(&state, false).await.expect("apply");
        assert!(again.refused.is_empty(), "{:?}", again.refused);
        assert!(sh("nft list ruleset").contains("dnat"));
    });
}

/// Applies `state`, which must succeed but for exactly one refused part; returns that refusal.
async fn only_refusal(
    host: &mut LinuxHost,
    state: &HostState,
    applied: &str,
) -> kuport_host::Refusal {
    let report = host
        .apply(state, false)
        .await
        .unwrap_or_else(|e| panic!("{applied} is applied: {e}"));
    assert_eq!(report.refused.len(), 1, "{:?}", report.refused);
    report.refused[0].clone()
}

fn nft_refusal() {
    let ns = namespace("nftref");
    child(&ns, "nft_refusal", &[]);
}

/// A copy of the golden mapping `games/gs` as `games/bad`, one port up, whose counter names
/// nft refuses (longer than the kernel's 256 bytes).
fn with_refused_mapping(state: &HostState) -> HostState {
    use kuport_core::ir::{Counter, PortRange, Rule};
    let long = |chain: &str| format!("{chain}/games/{}", "b".repeat(300));
    let up = |p: PortRange| PortRange {
        first: p.first + 1,
        last: p.last + 1,
    };
    let mut out = state.clone();
    for c in &state.nft.counters {
        if c.namespace == "games" && c.mapping == "gs" {
            out.nft.counters.push(Counter {
                name: long(c.chain.label()).into(),
                mapping: "bad".into(),
                ..c.clone()
            });
        }
    }
    for (chain, rules) in &mut out.nft.chains {
        let copies: Vec<Rule> = rules
            .iter()
            .filter_map(|r| match r.clone() {
                Rule::Dnat(mut d) if d.comment == "games/gs" => {
                    d.comment = "games/bad".into();
                    d.counter = long(chain.label()).into();
                    d.ports = up(d.ports);
                    Some(Rule::Dnat(d))
                }
                Rule::IdentitySnat(mut n) if n.comment == "games/gs" => {
                    n.comment = "games/bad".into();
                    n.counter = long(chain.label()).into();
                    n.ports = up(n.ports);
                    Some(Rule::IdentitySnat(n))
                }
                Rule::Steer(mut st) if st.comment == "games/gs" => {
                    st.comment = "games/bad".into();
                    st.ports = up(st.ports);
                    Some(Rule::Steer(st))
                }
                Rule::MarkRequest(mut st) if st.comment == "games/gs" => {
                    st.comment = "games/bad".into();
                    st.ports = up(st.ports);
                    Some(Rule::MarkRequest(st))
                }
                _ => None,
            })
            .collect();
        rules.extend(copies);
    }
    out.normalise();
    out
}

fn child_nft_refusal() {
    let good = golden_ir("same-node-single-port");
    let state = with_refused_mapping(&good);
    let pre = |s: &HostState| s.nft.rules(kuport_core::ir::ChainId::Pre).len();
    assert!(pre(&state) > pre(&good), "the copy adds rules");
    underlay_and_interfaces_for(&state);
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        let refusal = only_refusal(&mut host, &state, "everything but games/bad").await;
        assert_eq!(refusal.unit, "nftables rules");
        assert_eq!(refusal.link, None);
        assert_eq!(refusal.mappings.iter().collect::<Vec<_>>(), ["games/bad"]);
        assert!(refusal.message.contains("name too long"), "{refusal:?}");
        // The other mapping is programmed exactly as it would be alone.
        let listing = sh("nft list table ip kuport");
        assert_eq!(
            netns::table_of(&listing),
            netns::table_of(&golden_nft("same-node-single-port"))
        );
        let counters = host.counters().await.expect("counters");
        assert!(
            !counters.is_empty() && counters.iter().all(|c| c.name != "bad"),
            "{counters:?}"
        );
        // Tried again on the next pass (the refusal is not remembered as applied).
        let again = host.apply(&state, false).await.expect("apply");
        assert_eq!(again.refused.len(), 1);
    });
}

// ---- facts ----

fn facts_read() {
    let ns = namespace("facts");
    child(&ns, "facts", &[]);
}

fn child_facts() {
    sh(
        "ip link add wt0 type veth peer name wt0-peer && ip link set wt0 mtu 1380 up && ip addr add 100.64.0.7/16 dev wt0",
    );
    sh(
        "ip link add enp1s0 type veth peer name enp1s0-peer && ip link set enp1s0 up && ip addr add 203.0.113.9/24 dev enp1s0",
    );
    // A kernel tunnel socket (VXLAN on UDP 4799), a host listener and a forward chain whose
    // policy is drop: what the facts must report besides addresses.
    sh(
        "ip link add vx-facts type vxlan id 42 dstport 4799 local 100.64.0.7 && ip link set vx-facts up",
    );
    sh(
        "nft add table inet facts-fw && nft add chain inet facts-fw forward '{ type filter hook forward priority 0; policy drop; }'",
    );
    let _listener = std::net::TcpListener::bind("0.0.0.0:2222").expect("listen on 2222");
    block_on(async {
        let host = LinuxHost::new().expect("host");
        let query = FactsQuery {
            interfaces: vec!["enp1s0".into(), "wt0".into(), "eth9".into()],
            internal_ip: Some("100.64.0.7".parse().expect("ip")),
            agent_ports: vec![2222],
            ..FactsQuery::default()
        };
        let facts = host.facts(&query).await.expect("facts");
        assert_eq!(
            facts
                .interfaces
                .get("enp1s0")
                .map(ToString::to_string)
                .as_deref(),
            Some("203.0.113.9")
        );
        assert_eq!(
            facts
                .interfaces
                .get("wt0")
                .map(ToString::to_string)
                .as_deref(),
            Some("100.64.0.7")
        );
        assert!(
            !facts.interfaces.contains_key("eth9"),
            "a missing interface does not resolve"
        );
        assert_eq!(facts.underlay_device.as_deref(), Some("wt0"));
        assert_eq!(facts.underlay_mtu, Some(1380));
        let found = |protocol: Protocol, port: u16| {
            facts
                .sockets
                .iter()
                .find(|s| s.protocol == protocol && s.port == port && s.address.is_unspecified())
        };
        assert!(
            found(Protocol::Udp, 4799).is_some(),
            "the kernel's VXLAN socket is a host socket: {:?}",
            facts.sockets
        );
        assert!(
            found(Protocol::Tcp, 2222)
                .and_then(|s| s.holder.as_deref())
                .is_some_and(|h| h.contains("kuport agent")),
            "{:?}",
            facts.sockets
        );
        assert_eq!(
            facts.firewall_warnings.len(),
            1,
            "{:?}",
            facts.firewall_warnings
        );
        assert!(facts.firewall_warnings[0].contains("chain inet facts-fw forward"));
    });
}

// ---- node checks ----

fn node_checks_read() {
    let ns = namespace("checks");
    child(&ns, "node_checks", &[]);
}

/// The checks a pass reports, from this namespace's own `/proc/sys`: a fresh namespace forwards
/// nothing; after an apply kuport's links are loose and the capturing interface honours marks;
/// a link set back to strict by hand is named.
fn child_node_checks() {
    let state = golden_ir("both-roles-multi");
    underlay_and_interfaces_for(&state);
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        let query = FactsQuery {
            interfaces: state.valid_mark_interfaces.clone(),
            internal_ip: state.links.first().map(|l| l.local),
            ..FactsQuery::default()
        };
        let check = |facts: &HostFacts, name: &str| {
            facts
                .node_checks
                .iter()
                .find(|c| c.name == name)
                .cloned()
                .unwrap_or_else(|| panic!("no {name} in {:?}", facts.node_checks))
        };
        sh("sysctl -qw net.ipv4.ip_forward=0");
        let before = host.facts(&query).await.expect("facts");
        assert_eq!(check(&before, checks::IP_FORWARD).ok, Some(false));
        assert_eq!(check(&before, checks::RP_FILTER).ok, None, "no link yet");
        assert_eq!(check(&before, checks::INTERNAL_IP).ok, Some(true));

        sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=1");
        host.apply(&state, false).await.expect("apply");
        let after = host.facts(&query).await.expect("facts");
        for name in [
            checks::IP_FORWARD,
            checks::RP_FILTER,
            checks::SRC_VALID_MARK,
        ] {
            assert_eq!(
                check(&after, name).ok,
                Some(true),
                "{:?}",
                check(&after, name)
            );
        }

        let link = &state.links[0].name;
        sh(&format!("sysctl -qw net.ipv4.conf.{link}.rp_filter=0"));
        let strict = host.facts(&query).await.expect("facts");
        let rp = check(&strict, checks::RP_FILTER);
        assert_eq!(
            rp.ok,
            Some(false),
            "all=1 and the link at 0 is strict: {rp:?}"
        );
        assert!(rp.message.contains(link.as_str()), "{}", rp.message);
    });
}

// ---- events ----

fn link_events() {
    let ns = namespace("events");
    child(&ns, "events", &[]);
}

fn child_events() {
    let state = golden_ir("pod-node-single");
    underlay_for(&state);
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        host.apply(&state, false).await.expect("apply");
        let mut events = host.events().open(vec!["wt0".into()]).expect("subscribe");
        let link = state.links[0].name.clone();
        sh(&format!("ip link del {link}"));
        sh("ip link del wt0");
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !(seen.contains(&(link.clone(), true)) && seen.contains(&("wt0".to_owned(), true))) {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(e)) => seen.push((e.what, e.removed)),
                _ => panic!("events seen before the deadline: {seen:?}"),
            }
        }
        // The pass that follows rebuilds the link once the underlay is back.
        underlay_for(&state);
        let report = host.apply(&state, true).await.expect("rebuild");
        assert_eq!(report.links_created, 1, "{report:?}");
        host.teardown().await.expect("teardown");
    });
}

fn removal_events() {
    let ns = namespace("removed");
    // The latencies measured, for the record (docs/decisions.md quotes them).
    eprint!("{}", child(&ns, "removal_events", &[]));
}

/// How long the kernel's announcement of a removal may take to reach the agent: it is sent
/// when the change commits, so a second is generous on a loaded test machine.
const EVENT_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// Every event that arrives within `quiet`, but link events (the host's own link changes are
/// announced without its port and come back by design).
async fn drift_within(
    events: &mut tokio::sync::mpsc::Receiver<kuport_host::HostEvent>,
    quiet: std::time::Duration,
) -> Vec<kuport_host::HostEvent> {
    let deadline = tokio::time::Instant::now() + quiet;
    let mut seen = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout_at(deadline, events.recv()).await {
        if e.kind != kuport_host::HostEventKind::Link {
            seen.push(e);
        }
    }
    seen
}

/// Runs `command` and waits for the first event of `kind`: it must be a removal and arrive
/// within [`EVENT_BOUND`].
async fn removal_seen(
    events: &mut tokio::sync::mpsc::Receiver<kuport_host::HostEvent>,
    command: &str,
    kind: kuport_host::HostEventKind,
) {
    let started = tokio::time::Instant::now();
    sh(command);
    loop {
        match tokio::time::timeout_at(started + EVENT_BOUND, events.recv()).await {
            Ok(Some(e)) if e.kind == kind => {
                assert!(e.removed, "`{command}`: {e:?}");
                println!(
                    "`{command}`: {} event after {:?} ({})",
                    kind.as_str(),
                    started.elapsed(),
                    e.what
                );
                return;
            }
            Ok(Some(_)) => {}
            other => panic!(
                "`{command}`: no {} event within {EVENT_BOUND:?}: {other:?}",
                kind.as_str()
            ),
        }
    }
}

fn child_removal_events() {
    use kuport_host::HostEventKind as Kind;
    let state = golden_ir("pod-node-single");
    underlay_for(&state);
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        let mut events = host.events().open(vec!["wt0".into()]).expect("subscribe");
        // The host's own apply (a table, a link, its address, rules, a route) wakes nothing but
        // its link's announcements.
        host.apply(&state, false).await.expect("apply");
        let quiet = std::time::Duration::from_millis(500);
        let own = drift_within(&mut events, quiet).await;
        assert!(own.is_empty(), "the host's own changes came back: {own:?}");

        let rule = state.rules.iter().find(|r| r.to.is_none()).expect("a rule");
        let route = &state.routes[0];
        let link = &state.links[0];
        let cases = [
            (
                format!(
                    "ip rule del priority {} fwmark {:#x}/{:#x} table {}",
                    rule.priority, rule.fwmark, rule.fwmask, rule.table
                ),
                Kind::Rule,
            ),
            (
                format!("ip route del default table {}", route.table),
                Kind::Route,
            ),
            (
                format!("ip addr del {} dev {}", link.address, link.name),
                Kind::Address,
            ),
            ("nft delete table ip kuport".to_owned(), Kind::Nftables),
        ];
        for (command, kind) in &cases {
            removal_seen(&mut events, command, *kind).await;
            // The pass the agent runs on it compares with the kernel and repairs it, and that
            // repair wakes nothing again.
            let repair = tokio::time::Instant::now();
            let report = host.apply(&state, true).await.expect("repair");
            assert!(report.mutations() > 0, "`{command}`: nothing repaired");
            println!(
                "`{command}`: repaired by a verifying apply of {:?}",
                repair.elapsed()
            );
            let echo = drift_within(&mut events, quiet).await;
            assert!(
                echo.is_empty(),
                "`{command}`: the repair came back: {echo:?}"
            );
        }
        check_rules_and_routes(&state);
        assert!(
            sh("nft list table ip kuport >/dev/null 2>&1 && echo present").contains("present"),
            "the table is back"
        );
        // A flushed chain is a change to the table too (a firewall reload's `flush ruleset`
        // announces each object it deletes).
        removal_seen(&mut events, "nft flush ruleset", Kind::Nftables).await;
        host.teardown().await.expect("teardown");
    });
}

fn ipv6_address_events() {
    let ns = namespace("addr6");
    eprint!("{}", child(&ns, "ipv6_address_events", &[]));
}

/// `events` are at most the announcement of the host's own adding of `address` to `link`.
fn assert_own_address_echo(events: &[kuport_host::HostEvent], address: &str, link: &str) {
    let wanted = format!("address {address} on {link}");
    assert!(
        events.len() <= 1
            && events.iter().all(|e| {
                e.kind == kuport_host::HostEventKind::Address && !e.removed && e.what == wanted
            }),
        "more than the host's own address came back: {events:?}"
    );
}

/// An IPv6 address notification names its device by index only: the event stream knows a link
/// made before it opened (from its link dump) and one made after (from the link's own
/// notification), and ignores the kernel's link-local addresses of either.
fn child_ipv6_address_events() {
    use kuport_host::HostEventKind as Kind;
    let state = golden_ir("dual-stack-pod-node");
    let link = state.links[0].clone();
    let address6 = link
        .address6
        .expect("the dual-stack link has an IPv6 address");
    underlay_and_interfaces_for(&state);
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        host.apply(&state, false).await.expect("apply");
        // Opened after the link exists: only the link dump can name it.
        let mut events = host.events().open(vec!["wt0".into()]).expect("subscribe");
        // Long enough for the kernel's duplicate address detection of the link-local address
        // (a second by default) to have announced its end.
        let quiet = std::time::Duration::from_millis(2500);
        let settled = drift_within(&mut events, quiet).await;
        assert!(settled.is_empty(), "events before any change: {settled:?}");
        let delete = format!("ip -6 addr del {address6} dev {}", link.name);
        removal_seen(&mut events, &delete, Kind::Address).await;
        let report = host.apply(&state, true).await.expect("repair");
        assert!(report.mutations() > 0, "`{delete}`: nothing repaired");
        // The kernel announces IPv6 address changes without the requester's port, so the
        // repair comes back once, as a link's own changes do; the pass it wakes finds the
        // kernel as wanted, and that ends it.
        let echo = drift_within(&mut events, quiet).await;
        assert_own_address_echo(&echo, &address6.to_string(), &link.name);
        let again = host.apply(&state, true).await.expect("verify");
        assert_eq!(again.mutations(), 0, "{again:?}");
        let echo = drift_within(&mut events, quiet).await;
        assert!(
            echo.is_empty(),
            "a pass that changed nothing woke: {echo:?}"
        );

        // A link made after the stream opened: its own notification names it, and its
        // link-local address (with its detection) wakes nothing.
        sh(&format!("ip link del {}", link.name));
        // What went with the link (its addresses, its table's route) is announced first.
        let gone = drift_within(&mut events, std::time::Duration::from_millis(500)).await;
        assert!(gone.iter().all(|e| e.removed), "{gone:?}");
        host.apply(&state, true).await.expect("rebuild");
        let rebuilt = drift_within(&mut events, quiet).await;
        assert_own_address_echo(&rebuilt, &address6.to_string(), &link.name);
        removal_seen(&mut events, &delete, Kind::Address).await;
        host.teardown().await.expect("teardown");
    });
}

// ---- a link port is open only while its guard is in the kernel ----

/// An `nft` that refuses every transaction writing the link guard's drop rule while the flag
/// file exists, as nft refuses a line the kernel cannot process (a missing `nft_fib` module,
/// say); everything else goes to the real nft.
fn nft_shim(dir: &std::path::Path, flag: &std::path::Path) {
    let real = sh("command -v nft");
    let real = real.trim();
    let script = format!(
        "#!/bin/sh\n\
         if [ \"$1\" = -f ] && [ -e {flag} ]; then\n\
           script=$(cat)\n\
           case \"$script\" in *'fib daddr type {{'*)\n\
             echo '/dev/stdin:1:1-1: Error: Could not process rule: Operation not supported' >&2; exit 1;;\n\
           esac\n\
           printf '%s\\n' \"$script\" | exec {real} \"$@\"\n\
         fi\n\
         exec {real} \"$@\"\n",
        flag = flag.display()
    );
    std::fs::create_dir_all(dir).expect("shim dir");
    let path = dir.join("nft");
    std::fs::write(&path, script).expect("shim");
    sh(&format!("chmod 755 {}", path.display()));
}

fn links_down_on_refusal() {
    let ns = namespace("refused");
    let dir = std::env::temp_dir().join(format!("{}-bin", ns.name()));
    let flag = dir.join("refuse");
    nft_shim(&dir, &flag);
    std::fs::write(&flag, "").expect("flag");
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let flag_env = flag.display().to_string();
    // The shim's directory goes even when the child fails.
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(dir);
    child(
        &ns,
        "refused_guard",
        &[("PATH", &path), ("KUPORT_REFUSE_FLAG", &flag_env)],
    );
}

fn link_is_up(name: &str) -> bool {
    let flags = sh(&format!("cat /sys/class/net/{name}/flags"));
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).expect("flags");
    flags & 1 == 1
}

/// UDP sockets listening on `port`, as `ss` lists them (none: empty).
fn udp_listeners(port: u16) -> String {
    sh(&format!("ss -Hnlu 'sport = :{port}'")).trim().to_owned()
}

fn child_refused_guard() {
    let state = golden_ir("pod-node-single");
    underlay_and_interfaces_for(&state);
    let link = state.links[0].clone();
    block_on(async {
        let mut host = LinuxHost::new().expect("host");
        let err = host
            .apply(&state, false)
            .await
            .expect_err("the guard's line belongs to no mapping");
        assert!(err.to_string().contains("Operation not supported"), "{err}");
        assert!(!link_is_up(&link.name), "{} is built but down", link.name);
        assert_eq!(
            udp_listeners(link.port),
            "",
            "nothing listens on the link port"
        );
        assert!(
            sh(&format!(
                "ip route show table {} 2>/dev/null || true",
                state.routes[0].table
            ))
            .trim()
            .is_empty(),
            "no route through it"
        );
        // Control: the same device up opens the kernel's socket on every address.
        sh(&format!("ip link set {} up", link.name));
        assert!(!udp_listeners(link.port).is_empty(), "an up link listens");
        sh(&format!("ip link set {} down", link.name));
        // The refusal lifted, the next pass brings it up behind its guard.
        let flag = std::env::var("KUPORT_REFUSE_FLAG").expect("flag");
        std::fs::remove_file(flag).expect("lift the refusal");
        host.apply(&state, false).await.expect("apply");
        assert!(link_is_up(&link.name));
        let guard = sh("nft list chain ip kuport kup-guard");
        assert!(guard.contains("fib daddr type { local, broadcast, anycast, multicast }"));
        check_links(&state);
        check_rules_and_routes(&state);
        host.teardown().await.expect("teardown");
    });
    assert_nothing_owned();
}
