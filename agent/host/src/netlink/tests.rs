//! The netlink decisions over the fake kernel: what is created, repaired, left alone and
//! refused, and at which stage a failure is reported. The root tests in `tests/kernel.rs` check
//! the same against the real kernel.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;

use kuport_core::ir::{ChainId, HostState};

use super::fake::{FakeNetlink, errno};
use super::*;
use crate::nft::Nft;
use crate::nft_fake::FakeNft;
use crate::{Host, LinuxHost};

const GOLDEN_WITH_LINKS: [&str; 4] = [
    "accepting-remote-pod",
    "pod-node-single",
    "pod-node-multi-two-links",
    "both-roles-multi",
];

pub(crate) fn golden(case: &str) -> HostState {
    let path = format!(
        "{}/../core/testdata/golden/{case}.ir.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("golden IR")
}

/// A kernel with the underlay the IR's links bind to (`wt0` holding their local address) and
/// every accepting interface the IR names.
pub(crate) fn kernel_for(state: &HostState) -> FakeNetlink {
    let net = FakeNetlink::new();
    let local = state
        .links
        .first()
        .map_or(Ipv4Addr::new(100, 64, 0, 2), |l| l.local);
    let underlay = Ipv4Net::new(local, 24).expect("net");
    net.add_device("wt0", 1400, Some(underlay));
    for iface in &state.valid_mark_interfaces {
        if net.link(iface).is_none() {
            net.add_device(iface, 1500, None);
        }
    }
    net
}

pub(crate) fn host(net: &FakeNetlink) -> (std::sync::Arc<FakeNft>, LinuxHost<FakeNetlink>) {
    let nft = std::sync::Arc::new(FakeNft::default());
    let host = LinuxHost::with_backends(net.clone(), Nft::with_runner(nft.clone()));
    (nft, host)
}

/// kuport's objects as the fake holds them, in the IR's terms, to compare with the IR.
async fn owned(net: &FakeNetlink) -> (Vec<String>, Vec<IpRule>, Vec<Route>) {
    let links: Vec<String> = net
        .kernel()
        .links
        .values()
        .filter(|l| l.name.starts_with(LINK_PREFIX))
        .map(|l| l.name.clone())
        .collect();
    let names = net
        .kernel()
        .links
        .values()
        .map(|l| (l.index, l.name.clone()))
        .collect();
    let mut rules: Vec<IpRule> = owned_rules(net, MarkLayout::default())
        .await
        .expect("rules")
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    let mut routes: Vec<Route> = owned_routes(net, &names, HostStage::Routes)
        .await
        .expect("routes")
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    rules.sort();
    routes.sort();
    (links, rules, routes)
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

fn mutating(calls: &[String]) -> Vec<&String> {
    calls.iter().filter(|c| !c.starts_with("list-")).collect()
}

#[tokio::test]
async fn golden_states_are_built_in_full_and_a_second_apply_changes_nothing() {
    for case in GOLDEN_WITH_LINKS {
        let state = golden(case);
        let net = kernel_for(&state);
        let (_, mut host) = host(&net);
        let first = host.apply(&state, true).await.expect("apply");
        assert!(first.refused.is_empty(), "{case}: {:?}", first.refused);
        assert_eq!(first.links_created, state.links.len(), "{case}");
        let (links, rules, routes) = owned(&net).await;
        let mut want_links: Vec<String> = state.links.iter().map(|l| l.name.clone()).collect();
        want_links.sort();
        assert_eq!(sorted(&links), want_links, "{case}");
        assert_eq!(rules, sorted(&state.rules), "{case}");
        assert_eq!(routes, sorted(&state.routes), "{case}");
        for want in &state.links {
            let k = net.link(&want.name).expect("link");
            assert!(k.up, "{case}: {} is up", want.name);
            assert_eq!(k.mtu, want.mtu, "{case}: {} mtu", want.name);
            assert_eq!(k.rp_filter, Some(i32::from(want.rp_filter)));
            assert_eq!(net.kernel().addresses[&k.index], [IpNet::V4(want.address)]);
            // The entry names the MAC the peer's agent gives its own end of the /31.
            let peer_end = Link {
                address: Ipv4Net::new(want.peer_address, 31).expect("net"),
                ..want.clone()
            };
            assert_eq!(
                net.kernel()
                    .neighbours
                    .get(&(k.index, IpAddr::V4(want.peer_address))),
                Some(&link_mac(&peer_end)),
                "{case}: {} holds its peer's MAC without asking ARP",
                want.name
            );
        }
        for iface in &state.valid_mark_interfaces {
            assert_eq!(net.link(iface).expect("iface").src_valid_mark, Some(1));
        }
        net.kernel().calls.clear();
        let again = host.apply(&state, true).await.expect("reapply");
        assert_eq!(again.mutations(), 0, "{case}: {again:?}");
        let calls = net.kernel().calls.clone();
        assert!(mutating(&calls).is_empty(), "{case}: {calls:?}");
    }
}

#[tokio::test]
async fn foreign_links_rules_and_routes_survive_apply_and_teardown() {
    let state = golden("both-roles-multi");
    let net = kernel_for(&state);
    let cilium = net.add_device("cilium_vxlan", 1500, None);
    net.add_device("kupper", 1500, None);
    let foreign_rules = vec![
        // Another datapath's rule at kuport's priority, under its own mask.
        KernelRule {
            family: Family::V4,
            priority: PREF_REPLY,
            fwmark: Some(0x200),
            fwmask: 0xf00,
            table: 52,
            to: None,
        },
        // A rule at another priority with a mark kuport's mask would match.
        KernelRule {
            family: Family::V4,
            priority: 105,
            fwmark: Some(2),
            fwmask: 0xff,
            table: 7120,
            to: None,
        },
    ];
    let foreign_routes = vec![KernelRoute {
        table: 254,
        to: Some("10.0.0.0/8".parse().expect("net")),
        via: None,
        oif: Some(cilium),
    }];
    {
        let mut k = net.kernel();
        k.rules.extend(foreign_rules.clone());
        k.routes.extend(foreign_routes.clone());
    }
    let (_, mut host) = host(&net);
    host.apply(&state, true).await.expect("apply");
    host.teardown().await.expect("teardown");
    let k = net.kernel();
    assert_eq!(k.rules, foreign_rules);
    assert_eq!(k.routes, foreign_routes);
    let names: Vec<&str> = k.links.values().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["wt0", "cilium_vxlan", "kupper"]);
}

#[tokio::test]
async fn drift_is_repaired_and_counted() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    let (_, mut host) = host(&net);
    host.apply(&state, true).await.expect("apply");
    let [first, second] = [&state.links[0], &state.links[1]];
    let (a, b) = (
        net.link(&first.name).expect("a").index,
        net.link(&second.name).expect("b").index,
    );
    {
        let mut k = net.kernel();
        // Someone moved the first link to another VNI and downed the second, changed its
        // MTU, its address and its rp_filter; a stale rule of the old mark layout and a second
        // copy of a rule are left behind; a route was deleted.
        if let Some(v) = k.links.get_mut(&a).and_then(|l| l.vxlan.as_mut()) {
            v.vni = Some(9999);
        }
        // A link set down loses its neighbour entries, permanent ones too.
        k.neighbours.retain(|(link, _), _| *link != b);
        let l = k.links.get_mut(&b).expect("b");
        l.up = false;
        l.mtu = Some(1200);
        l.rp_filter = Some(1);
        k.addresses
            .insert(b, vec!["10.9.9.9/24".parse().expect("net")]);
        k.rules.push(KernelRule {
            family: Family::V4,
            priority: PREF_REPLY,
            fwmark: Some(LINK_TABLE_BASE + 2),
            fwmask: u32::MAX,
            table: LINK_TABLE_BASE + 2,
            to: None,
        });
        let copy = k.rules[0].clone();
        k.rules.push(copy);
        k.routes.retain(|r| r.oif != Some(b));
    }
    let report = host.apply(&state, true).await.expect("repair");
    assert_eq!((report.links_deleted, report.links_created), (1, 1));
    // Address, MTU, rp_filter, up on the second link; address, rp_filter, up on the recreated
    // first (a new device's MTU already follows its underlay's).
    assert_eq!(report.links_updated, 4 + 3, "{report:?}");
    assert_eq!((report.rules_deleted, report.rules_added), (2, 0));
    assert_eq!(
        report.routes_added, 2,
        "both links' routes: one recreated, one restored"
    );
    let (_, rules, routes) = owned(&net).await;
    assert_eq!(rules, sorted(&state.rules));
    assert_eq!(routes, sorted(&state.routes));
    assert_eq!(
        net.kernel()
            .neighbours
            .get(&(b, IpAddr::V4(second.peer_address))),
        Some(&peer_mac(second)),
        "the downed link's neighbour entry is back"
    );
    let recreated = net.link(&first.name).expect("recreated");
    assert_eq!(recreated.vxlan.and_then(|v| v.vni), Some(first.vni));
    assert_eq!(
        host.apply(&state, true).await.expect("again").mutations(),
        0
    );
}

#[tokio::test]
async fn a_held_vni_is_named_and_refuses_only_its_link() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    let held = &state.links[0];
    let wt0 = net.link("wt0").expect("wt0").index;
    let squat = Link {
        name: "squat".into(),
        ..held.clone()
    };
    net.create_vxlan(&squat, wt0).await.expect("foreign device");
    let mut report = ApplyReport::default();
    let failed = ensure_links(&net, &state.links, &mut report).await.failed;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, held.name);
    let message = failed[0].1.to_string();
    assert!(
        message.contains("already used by device squat"),
        "{message}"
    );
    assert!(
        net.link(&state.links[1].name).is_some(),
        "the other link is made"
    );
    assert_eq!(report.links_created, 1);
}

#[tokio::test]
async fn a_missing_underlay_fails_only_the_links_bound_to_it() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    let mut links = state.links.clone();
    links[0].device = Some("wg9".into());
    let mut report = ApplyReport::default();
    let failed = ensure_links(&net, &links, &mut report).await.failed;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].1.stage(), HostStage::Links);
    assert!(
        failed[0]
            .1
            .to_string()
            .contains("underlay device wg9 not present")
    );
    assert!(net.link(&links[1].name).is_some());
}

#[tokio::test]
async fn failures_are_reported_at_the_stage_that_failed() {
    let state = golden("pod-node-single");
    let net = kernel_for(&state);
    // Listing links while reading facts is a facts failure, not a links one.
    net.kernel().fail_once = Some("list-links");
    let err = facts(&net, &[], None, MarkLayout::default())
        .await
        .expect_err("facts");
    assert_eq!(err.stage(), HostStage::Facts);
    // Listing links to resolve route devices is a routes failure.
    net.kernel().fail_once = Some("list-links");
    let err = reconcile_routes(&net, &state.routes, &mut ApplyReport::default())
        .await
        .expect_err("routes");
    assert_eq!(err.stage(), HostStage::Routes);
    // A route through a device that is not there names the device, at the routes stage.
    let err = reconcile_routes(&net, &state.routes, &mut ApplyReport::default())
        .await
        .expect_err("no link yet");
    assert_eq!(err.stage(), HostStage::Routes);
    assert!(err.to_string().contains("not present"), "{err}");
    net.kernel().fail_once = Some("add-rule");
    let err = reconcile_rules(
        &net,
        &state.rules,
        MarkLayout::default(),
        &mut ApplyReport::default(),
    )
    .await
    .expect_err("rules");
    assert_eq!(err.stage(), HostStage::Rules);
    assert!(err.to_string().starts_with("netlink: add ip rule"), "{err}");
}

#[tokio::test]
async fn a_refused_link_takes_its_rules_and_routes_out_and_comes_back_when_free() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    let held = state.links[0].clone();
    let wt0 = net.link("wt0").expect("wt0").index;
    let squat = Link {
        name: "squat".into(),
        ..held.clone()
    };
    net.create_vxlan(&squat, wt0).await.expect("foreign device");
    let (_, mut host) = host(&net);
    let report = host.apply(&state, false).await.expect("apply");
    assert_eq!(report.refused.len(), 1);
    assert_eq!(report.refused[0].unit, format!("return link {}", held.name));
    let (links, rules, routes) = owned(&net).await;
    assert_eq!(links, [state.links[1].name.clone()]);
    assert!(rules.iter().all(|r| r.fwmark != held.mark), "{rules:?}");
    assert!(routes.iter().all(|r| r.dev != held.name), "{routes:?}");
    // The foreign device goes: the next pass (even one that does not verify) builds it all.
    let squat_index = net.link("squat").expect("squat").index;
    net.delete_link(squat_index).await.expect("delete");
    let report = host.apply(&state, false).await.expect("retry");
    assert!(report.refused.is_empty(), "{:?}", report.refused);
    let (_, rules, routes) = owned(&net).await;
    assert_eq!(rules, sorted(&state.rules));
    assert_eq!(routes, sorted(&state.routes));
}

/// Every address counts as the host's (no endpoint may be one), but only those on a segment are
/// what a client on the host dials from: kube-proxy's IPVS ClusterIPs are /32s on kube-ipvs0.
#[tokio::test]
async fn segment_addresses_leave_out_host_length_prefixes() {
    let net = FakeNetlink::new();
    net.add_device("wt0", 1400, Some("100.64.0.2/16".parse().expect("net")));
    net.add_device(
        "enp1s0",
        1500,
        Some("192.168.1.12/24".parse().expect("net")),
    );
    net.add_device(
        "kube-ipvs0",
        1500,
        Some("10.96.0.10/32".parse().expect("net")),
    );
    let f = facts(&net, &[], None, MarkLayout::default())
        .await
        .expect("facts");
    let addresses = |list: &[std::net::IpAddr]| -> Vec<String> {
        list.iter().map(ToString::to_string).collect()
    };
    assert_eq!(
        addresses(&f.local_addresses),
        ["10.96.0.10", "100.64.0.2", "192.168.1.12"]
    );
    assert_eq!(
        addresses(&f.segment_addresses),
        ["100.64.0.2", "192.168.1.12"]
    );
}

#[tokio::test]
async fn facts_name_interfaces_the_underlay_and_the_ids_links_carry() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    net.add_device("eth0", 1500, Some("192.0.2.10/24".parse().expect("net")));
    let (_, mut host) = host(&net);
    host.apply(&state, true).await.expect("apply");
    let local = state.links[0].local;
    let marks = MarkLayout::default();
    let f = facts(&net, &["eth0".into(), "absent".into()], Some(local), marks)
        .await
        .expect("facts");
    assert_eq!(
        f.interfaces.clone().into_iter().collect::<Vec<_>>(),
        [("eth0".to_string(), Ipv4Addr::new(192, 0, 2, 10))]
    );
    assert_eq!(f.underlay_device.as_deref(), Some("wt0"));
    assert_eq!(f.underlay_mtu, Some(1400));
    for link in &state.links {
        assert_eq!(
            f.link_ids.get(&link.name),
            marks.link_id_of_table(marks.table(link.mark)).as_ref()
        );
    }
    assert_eq!(f.link_ids.len(), state.links.len());
    let check = |f: &HostFacts| {
        f.node_checks
            .iter()
            .find(|c| c.name == kuport_core::api::checks::INTERNAL_IP)
            .cloned()
            .expect("the internalIP check")
    };
    assert_eq!(check(&f).ok, Some(true), "{:?}", check(&f));
    // The InternalIP's device taken down: reported, naming it.
    if let Some(wt0) = net.kernel().links.values_mut().find(|l| l.name == "wt0") {
        wt0.up = false;
    }
    let f = facts(&net, &[], Some(local), marks).await.expect("facts");
    assert_eq!(check(&f).ok, Some(false));
    assert!(
        check(&f).message.contains("wt0, which is down"),
        "{:?}",
        check(&f)
    );
}

// ---- a link port is open only while its guard is in the kernel ----

/// nft refusing the guard's drop rule: a line of no mapping, so the whole transaction fails.
fn refuse_the_guard(nft: &FakeNft) {
    nft.lock().refuse = vec![(
        "fib daddr type {".into(),
        "Could not process rule: No such file or directory".into(),
    )];
}

fn up_links(net: &FakeNetlink, state: &HostState) -> Vec<bool> {
    state
        .links
        .iter()
        .map(|l| net.link(&l.name).expect("link").up)
        .collect()
}

#[tokio::test]
async fn a_refused_guard_leaves_the_new_links_down_and_nothing_routed_through_them() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    let (nft, mut host) = host(&net);
    refuse_the_guard(&nft);
    let err = host
        .apply(&state, true)
        .await
        .expect_err("the guard belongs to no mapping");
    assert!(
        err.to_string().contains("No such file or directory"),
        "{err}"
    );
    // Built, but down: a down VXLAN device opens no socket, so nothing reaches the port.
    assert_eq!(up_links(&net, &state), [false, false]);
    let (links, rules, routes) = owned(&net).await;
    assert_eq!(links.len(), 2);
    assert!(
        rules.is_empty() && routes.is_empty(),
        "{rules:?} {routes:?}"
    );
    assert!(net.kernel().neighbours.is_empty());
    // The refusal lifted, the next pass brings them up behind their guard.
    nft.lock().refuse.clear();
    let report = host.apply(&state, true).await.expect("apply");
    assert_eq!(report.links_created, 0, "the links built before are kept");
    assert_eq!(up_links(&net, &state), [true, true]);
    let (_, _, routes) = owned(&net).await;
    assert_eq!(routes, sorted(&state.routes));
    for want in &state.links {
        let index = net.link(&want.name).expect("link").index;
        assert_eq!(
            net.kernel()
                .neighbours
                .get(&(index, IpAddr::V4(want.peer_address))),
            Some(&peer_mac(want)),
            "{} came up with its peer's entry",
            want.name
        );
    }
}

#[tokio::test]
async fn links_go_down_when_their_guard_is_gone_and_the_repair_is_refused() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    let (nft, mut host) = host(&net);
    host.apply(&state, true).await.expect("apply");
    assert_eq!(up_links(&net, &state), [true, true]);
    // Control: a refused repair while the kernel still holds the guard leaves the links up.
    {
        let mut s = nft.lock();
        s.generation += 1;
        if let Some(t) = s.table.as_mut()
            && let Some(fwd) = t.chains.get_mut(ChainId::Fwd.name())
        {
            fwd.rules.clear();
        }
        s.refuse = vec![("maxseg".into(), "Could not process rule: Bad".into())];
    }
    host.apply(&state, true)
        .await
        .expect_err("the MSS clamp belongs to no mapping");
    assert_eq!(up_links(&net, &state), [true, true], "still guarded");
    // Another program removed kuport's table (a firewall reload's `flush ruleset`), and the
    // repair is refused: nothing guards the port any more, so the links go down.
    {
        let mut s = nft.lock();
        s.generation += 1;
        s.table = None;
    }
    refuse_the_guard(&nft);
    host.apply(&state, true).await.expect_err("refused");
    assert_eq!(up_links(&net, &state), [false, false]);
    nft.lock().refuse.clear();
    host.apply(&state, true).await.expect("repaired");
    assert_eq!(up_links(&net, &state), [true, true]);
}

#[tokio::test]
async fn links_stay_as_they_are_when_nft_cannot_be_run_at_all() {
    // Nothing is known to be wrong with the kernel's table then: a failed fork must not take
    // every link down.
    let state = golden("pod-node-single");
    let net = kernel_for(&state);
    let (nft, mut host) = host(&net);
    host.apply(&state, true).await.expect("apply");
    {
        let mut s = nft.lock();
        s.unavailable = Some("running nft: Resource temporarily unavailable".into());
        // Another program's commit: the table must be listed, and nft cannot list it.
        s.generation += 1;
    }
    host.apply(&state, true).await.expect_err("no nft");
    assert_eq!(up_links(&net, &state), [true]);
}

#[tokio::test]
async fn a_link_no_longer_wanted_is_deleted_before_the_transaction_that_removes_its_guard() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    let (nft, mut host) = host(&net);
    host.apply(&state, true).await.expect("apply");
    let (gone, kept) = (&state.links[0], &state.links[1]);
    let fewer = state.without_links(std::slice::from_ref(&gone.name));
    // Its arrival-link save goes with it, so kup-mangle is written again; refusing that
    // transaction shows what came first.
    nft.lock().refuse = vec![("ct direction".into(), "Could not process rule: Bad".into())];
    host.apply(&fewer, true).await.expect_err("refused");
    assert!(
        net.link(&gone.name).is_none(),
        "deleted before the transaction"
    );
    assert!(net.link(&kept.name).expect("kept").up);
}

#[tokio::test]
async fn teardown_removes_the_links_before_their_guard() {
    let state = golden("pod-node-single");
    let net = kernel_for(&state);
    let (nft, mut host) = host(&net);
    host.apply(&state, true).await.expect("apply");
    nft.lock().unavailable = Some("running nft: Permission denied".into());
    host.teardown()
        .await
        .expect_err("the table cannot be removed");
    let (links, _, _) = owned(&net).await;
    assert!(links.is_empty(), "{links:?}");
}

#[test]
fn the_fake_refuses_what_the_kernel_refuses() {
    // Guards the fake itself: a test passing against a permissive fake would prove nothing.
    let net = FakeNetlink::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dev = net.add_device("wt0", 1400, Some("100.64.0.2/24".parse().expect("net")));
        let state = golden("pod-node-single");
        let link = &state.links[0];
        net.create_vxlan(link, dev).await.expect("create");
        let again = net.create_vxlan(link, dev).await.expect_err("same name");
        assert_eq!(again.to_string(), errno(17).to_string());
        let idx = net.link(&link.name).expect("link").index;
        let down = net.add_route(&state.routes[0], idx).await;
        assert!(down.is_err(), "a route through a down link is refused");
        net.set_up(idx).await.expect("up");
        let off_subnet = net.add_route(&state.routes[0], idx).await;
        assert!(
            off_subnet.is_err(),
            "a gateway off the link's subnet is refused"
        );
        net.add_address(idx, IpNet::V4(link.address))
            .await
            .expect("address");
        net.add_route(&state.routes[0], idx).await.expect("route");
        net.delete_link(idx).await.expect("delete");
        assert!(net.kernel().routes.is_empty(), "a link's routes go with it");
    });
}

fn rule(priority: u32, fwmark: u32) -> IpRule {
    IpRule {
        family: Family::V4,
        priority,
        fwmark,
        fwmask: 0xff,
        to: None,
        table: 254,
    }
}

#[test]
fn the_diff_deletes_extras_and_duplicates_and_adds_what_is_missing() {
    let desired = vec![rule(101, 2), rule(102, 1), rule(102, 2)];
    let current = vec![
        (rule(102, 1), "a"),
        (rule(102, 1), "duplicate"),
        (rule(102, 9), "stale"),
        (rule(101, 2), "b"),
    ];
    let (extra, missing) = set_diff(current, &desired);
    let gone: Vec<&str> = extra.iter().map(|(_, m)| *m).collect();
    assert_eq!(gone, ["duplicate", "stale"]);
    assert_eq!(missing, [&rule(102, 2)]);
    // Already converged: nothing either way.
    let current: Vec<(IpRule, ())> = desired.iter().map(|r| (r.clone(), ())).collect();
    let (extra, missing) = set_diff(current, &desired);
    assert!(extra.is_empty() && missing.is_empty());
}

#[test]
fn only_kuports_rules_are_owned() {
    let marks = MarkLayout::default();
    assert!(owned_rule(PREF_REPLY, 0x1, marks.mask, marks));
    assert!(owned_rule(PREF_LOOP_GUARD, 0x2, marks.mask, marks));
    // Another priority, another datapath's bits, no mark at all, another mask: not ours.
    assert!(!owned_rule(9, 0x1, marks.mask, marks));
    assert!(!owned_rule(PREF_REPLY, 0x4000, 0xffff, marks));
    assert!(!owned_rule(PREF_REPLY, 0, marks.mask, marks));
    assert!(!owned_rule(PREF_REPLY, 0x1, 0xf0, marks));
    // The layout before marks were masked: cleaned away on upgrade.
    assert!(owned_rule(PREF_REPLY, LINK_TABLE_BASE + 5, u32::MAX, marks));
    assert!(in_table_space(LINK_TABLE_BASE + 7) && !in_table_space(254));
}

#[tokio::test]
async fn facts_publish_an_interfaces_first_reachable_ipv6_address() {
    let state = golden("pod-node-multi-two-links");
    let net = kernel_for(&state);
    let eth0 = net.add_device("eth0", 1500, Some("192.0.2.10/24".parse().expect("net")));
    let v6only = net.add_device("eth1", 1500, None);
    let linklocal_only = net.add_device("eth2", 1500, None);
    {
        let mut k = net.kernel();
        let nets = |list: &[&str]| -> Vec<IpNet> {
            list.iter().map(|a| a.parse().expect("net")).collect()
        };
        // The kernel lists link-local and the discard-only stand-in block first here: neither
        // is an address a client dials.
        k.addresses.get_mut(&eth0).expect("eth0").extend(nets(&[
            "fe80::1/64",
            "100::6b70:1/64",
            "2001:db8:203::9/64",
            "2001:db8:203::a/64",
        ]));
        k.addresses.insert(v6only, nets(&["2001:db8:5::1/64"]));
        k.addresses.insert(linklocal_only, nets(&["fe80::2/64"]));
    }
    let (_, mut host) = host(&net);
    host.apply(&state, true).await.expect("apply");
    let names = ["eth0".into(), "eth1".into(), "eth2".into()];
    let f = facts(
        &net,
        &names,
        Some(state.links[0].local),
        MarkLayout::default(),
    )
    .await
    .expect("facts");
    let v6: Vec<(String, String)> = f
        .interfaces6
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    assert_eq!(
        v6,
        [
            ("eth0".to_owned(), "2001:db8:203::9".to_owned()),
            ("eth1".to_owned(), "2001:db8:5::1".to_owned()),
        ]
    );
    // An interface with IPv6 alone publishes no IPv4 address.
    assert_eq!(f.interfaces.keys().collect::<Vec<_>>(), ["eth0"]);
}
