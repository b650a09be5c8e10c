//! The sweep over the fake table (batches, checkpoints), when the host asks for one, and its
//! thread: the apply does not wait for it, one runs at a time, a newer request replaces a
//! queued one, an apply under way holds its deletes, a failed one runs again by itself.
//! `tests/conntrack_sweep.rs` measures the memory a sweep of the kernel's table holds.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kuport_core::api::Protocol;
use kuport_core::ir::{HostState, Rule};

use super::fake::FakeConntrack;
use super::tests::{CLIENT, MASK, flow, translations, udp};
use super::*;
use crate::netlink::fake::FakeNetlink;
use crate::netlink::tests::{golden, host, kernel_for};
use crate::{ApplyReport, Host, LinuxHost};

const WAIT: Duration = Duration::from_secs(10);

fn client(port: u16) -> SocketAddr {
    format!("{CLIENT}:{port}").parse().expect("addr")
}

/// A flow of the accepting node's mapping (203.0.113.9 udp 3000) from client port `port`,
/// answered from `reply` (169.254.77.1:3000 is the link it is programmed over).
fn over_link(port: u16, reply: &str) -> Flow {
    Flow {
        source: client(port),
        ..udp("203.0.113.9:3000", reply, 0x1)
    }
}

/// The accepting node's state with its mapping sent over the link ending at `to`.
fn moved_to(to: &str) -> HostState {
    let mut state = golden("accepting-remote-pod");
    for (_, rules) in &mut state.nft.chains {
        for rule in rules {
            if let Rule::Dnat(d) = rule {
                d.to = to.parse().expect("addr");
            }
        }
    }
    state
}

fn translations_of(state: &HostState) -> Arc<Translations> {
    Arc::new(Translations::of(state, MASK))
}

#[test]
fn a_sweep_deletes_exactly_the_stale_entries_and_reports_failures() {
    let t = translations("accepting-remote-pod");
    let keep = udp("203.0.113.9:3000", "169.254.77.1:3000", 0x1);
    let own = flow(Protocol::Tcp, "203.0.113.9:22", "203.0.113.9:22", 0);
    let stale = over_link(40001, "169.254.77.3:3000");
    let table = FakeConntrack::with(vec![keep.clone(), own.clone(), stale.clone()]);
    let swept = sweep(&table, &t);
    assert_eq!(
        swept,
        Sweep {
            listed: 3,
            cleared: 1,
            error: None
        }
    );
    assert_eq!(table.lock().deleted, vec![stale.clone()]);
    assert_eq!(table.lock().flows, vec![keep.clone(), own]);

    // The listing fails: nothing deleted, the error says what failed.
    table.lock().fail_next_listing = Some("Operation not permitted".into());
    let failed = sweep(&table, &t);
    assert_eq!(failed.cleared, 0);
    assert!(
        failed
            .error
            .as_deref()
            .is_some_and(|e| e.contains("listing") && e.contains("not permitted")),
        "{failed:?}"
    );
    // Deletes refused: counted in the error.
    table.lock().flows.push(stale);
    table.lock().refuse_deletes = Some("Invalid argument".into());
    let refused = sweep(&table, &t);
    assert!(
        refused
            .error
            .as_deref()
            .is_some_and(|e| e.contains("1 of 1 refused") && e.contains("Invalid argument")),
        "{refused:?}"
    );
}

#[test]
fn a_sweep_deletes_as_it_walks_holding_one_batch_at_a_time() {
    let t = translations("accepting-remote-pod");
    let stale = 1000;
    let mut flows = Vec::new();
    for port in 0..stale {
        flows.push(over_link(10_000 + port, "169.254.77.3:3000"));
        flows.push(over_link(30_000 + port, "169.254.77.1:3000"));
    }
    let table = FakeConntrack::with(flows);
    let swept = sweep(&table, &t);
    assert_eq!((swept.listed, swept.cleared), (2000, 1000), "{swept:?}");
    let batches = table.lock().batches.clone();
    assert!(
        batches.iter().all(|(size, _)| *size <= BATCH),
        "{batches:?}"
    );
    assert_eq!(batches.len(), usize::from(stale).div_ceil(BATCH));
    // The first batch went before the walk had handed out every entry: the sweep deletes as
    // it walks, and holds no more than a batch.
    assert!(batches[0].1 < 2000, "{batches:?}");
    assert_eq!(table.lock().flows.len(), 1000);
}

#[test]
fn newer_translations_at_a_checkpoint_spare_what_they_translate_as_it_is() {
    // Judged by the mapping over 169.254.77.1, the flows over .3 are stale; the translations
    // handed over at the first checkpoint send the mapping over .3 again.
    let over_1 = translations_of(&moved_to("169.254.77.1"));
    let over_3 = translations_of(&moved_to("169.254.77.3"));
    let flows: Vec<Flow> = (0..300)
        .map(|p| over_link(10_000 + p, "169.254.77.3:3000"))
        .collect();
    let table = FakeConntrack::with(flows.clone());
    let never = AtomicBool::new(false);
    let mut asked = 0;
    let mut handed = Some(over_3.clone());
    let swept = sweep_with(
        &table,
        over_1.clone(),
        &mut || {
            asked += 1;
            handed.take().map_or(Checkpoint::Same, Checkpoint::Newer)
        },
        &never,
    );
    assert_eq!(
        (swept.listed, swept.cleared, asked),
        (300, 0, 2),
        "{swept:?}"
    );
    assert!(table.lock().deleted.is_empty());

    // Control: with the older translations throughout, every one of them is deleted.
    let swept = sweep_with(&table, over_1, &mut || Checkpoint::Same, &never);
    assert_eq!(swept.cleared, 300);

    // A stop deletes nothing more and ends the walk.
    let table = FakeConntrack::with(flows);
    let swept = sweep_with(
        &table,
        over_3.clone(),
        &mut || Checkpoint::Stop,
        &AtomicBool::new(false),
    );
    assert_eq!(swept.cleared, 0);
    let stopped = AtomicBool::new(true);
    let swept = sweep_with(&table, over_3, &mut || Checkpoint::Same, &stopped);
    assert_eq!(swept.listed, 0);
    assert!(swept.error.is_some_and(|e| e.contains("stopped")));
}

#[test]
fn a_sweep_is_asked_for_on_change_or_verify_only() {
    let mut s = Sweeper::default();
    let some = translations("accepting-remote-pod");
    let other = translations("pod-node-single");
    let none = Translations::of(&HostState::default(), MASK);
    assert!(
        s.due(&none, false),
        "a new host sweeps once, even translating nothing"
    );
    s.asked(none.clone());
    assert!(!s.due(&none, false));
    assert!(
        !s.due(&none, true),
        "a resync of a node kuport does not use asks for nothing"
    );
    assert!(s.due(&some, false), "the translations changed");
    s.asked(some.clone());
    assert!(!s.due(&some, false), "an unchanged pass asks for nothing");
    assert!(s.due(&some, true), "a verifying pass sweeps");
    assert!(s.due(&other, false));
}

/// A host over the fake kernel (with the devices `state` binds) and the fake nft.
fn host_over_fakes(state: &HostState) -> LinuxHost<FakeNetlink> {
    host(&kernel_for(state)).1
}

/// The same, sweeping `table`, telling `seen` how each sweep ended.
fn host_with(
    state: &HostState,
    table: &FakeConntrack,
    seen: &Arc<Mutex<Vec<Sweep>>>,
) -> LinuxHost<FakeNetlink> {
    let mut host = host_over_fakes(state).with_conntrack(Arc::new(table.clone()));
    let seen = seen.clone();
    host.observe_sweeps(Arc::new(move |s: &Sweep| {
        seen.lock().expect("seen").push(s.clone());
    }));
    host
}

#[tokio::test]
async fn the_host_clears_stale_flows_after_an_apply_that_moved_them_and_only_then() {
    let before = golden("accepting-remote-pod");
    let table = FakeConntrack::default();
    let seen = Arc::default();
    let mut host = host_with(&before, &table, &seen);
    let first = host.apply(&before, true).await.expect("apply");
    assert!(first.conntrack_sweep_asked);
    assert!(host.wait_for_sweeps(WAIT).await);
    table.lock().flows = vec![
        over_link(40000, "169.254.77.1:3000"),
        flow(Protocol::Tcp, "203.0.113.9:22", "203.0.113.9:22", 0),
    ];

    // Unchanged passes list nothing.
    let again = host.apply(&before, false).await.expect("apply");
    assert_eq!(again, ApplyReport::default());
    assert!(host.wait_for_sweeps(WAIT).await);
    assert_eq!(table.lock().listings, 1);

    // The endpoint moves: the edge now sends the mapping over another link.
    let after = moved_to("169.254.77.9");
    let moved = host.apply(&after, false).await.expect("apply");
    assert!(moved.conntrack_sweep_asked);
    assert!(host.wait_for_sweeps(WAIT).await);
    assert_eq!(
        table.lock().deleted,
        vec![over_link(40000, "169.254.77.1:3000")]
    );
    assert_eq!(
        table.lock().flows.len(),
        1,
        "the node's own connection stays"
    );
    let cleared: Vec<usize> = seen
        .lock()
        .expect("seen")
        .iter()
        .map(|s| s.cleared)
        .collect();
    assert_eq!(cleared, vec![0, 1], "the observer is told of each sweep");

    // Teardown: no mapping is translated any more, so every kuport flow goes.
    table
        .lock()
        .flows
        .push(over_link(40003, "169.254.77.9:3000"));
    host.teardown().await.expect("teardown");
    let left: Vec<u32> = table.lock().flows.iter().map(|f| f.mark).collect();
    assert_eq!(left, vec![0], "only the node's own connection is left");

    // A host applied again after its teardown sweeps again.
    let walks = table.lock().listings;
    let back = host.apply(&before, false).await.expect("apply");
    assert!(back.conntrack_sweep_asked);
    assert!(host.wait_for_sweeps(WAIT).await);
    assert_eq!(table.lock().listings, walks + 1);
}

#[tokio::test]
async fn a_host_without_a_table_sweeps_nothing() {
    let state = golden("accepting-remote-pod");
    let mut host = host_over_fakes(&state);
    let report = host.apply(&state, true).await.expect("apply");
    assert!(!report.conntrack_sweep_asked);
    assert!(host.wait_for_sweeps(WAIT).await);
}

#[tokio::test]
async fn the_apply_returns_while_its_sweep_runs_and_sweeps_run_one_at_a_time() {
    let before = golden("accepting-remote-pod");
    let table = FakeConntrack::with(vec![over_link(40000, "169.254.77.1:3000")]);
    let seen = Arc::default();
    let mut host = host_with(&before, &table, &seen);
    table.hold();
    // The walk is held: an apply that waited for its sweep would never return.
    let applied = tokio::time::timeout(WAIT, host.apply(&before, true)).await;
    assert!(applied.is_ok_and(|r| r.is_ok_and(|r| r.conntrack_sweep_asked)));
    assert!(table.wait_until(|t| t.listings == 1), "the sweep started");

    // Two more changes while it runs: the second replaces the first, and neither starts a
    // walk beside the running one.
    for to in ["169.254.77.3", "169.254.77.9"] {
        let report = tokio::time::timeout(WAIT, host.apply(&moved_to(to), false)).await;
        assert!(report.is_ok_and(|r| r.is_ok_and(|r| r.conntrack_sweep_asked)));
    }
    assert!(!host.wait_for_sweeps(Duration::from_millis(50)).await);
    assert_eq!(table.lock().listings, 1, "one sweep at a time");
    table.release();
    assert!(host.wait_for_sweeps(WAIT).await);
    assert_eq!(table.lock().listings, 2, "the queued request ran once");
    // The flow went over .1: stale by the newest translations (over .9), deleted.
    assert_eq!(
        table.lock().deleted,
        vec![over_link(40000, "169.254.77.1:3000")]
    );
}

#[test]
fn an_apply_under_way_holds_the_deletes_and_hands_over_its_translations() {
    // The sweep judges by the mapping over .1, and finds the flows over .3 stale; the apply
    // under way sends the mapping over .3 again. Held, nothing is deleted, and the flows are
    // judged by the apply's translations before anything is.
    let flows: Vec<Flow> = (0..10)
        .map(|p| over_link(10_000 + p, "169.254.77.3:3000"))
        .collect();
    let table = FakeConntrack::with(flows.clone());
    let mut worker = SweepWorker::new(Arc::new(table.clone()));
    let held = worker.hold();
    worker
        .request(translations_of(&moved_to("169.254.77.1")))
        .expect("request");
    // Not started while an apply is under way; started once it ends without new translations
    // (a failed apply), then held at its first delete by the next apply.
    assert!(!worker.idle().wait(Duration::from_millis(50)));
    assert_eq!(table.lock().listings, 0);
    drop(held);
    assert!(worker.idle().wait(WAIT));
    assert_eq!(table.lock().deleted.len(), 10, "control: no hold, deleted");

    let table = FakeConntrack::with(flows);
    let mut worker = SweepWorker::new(Arc::new(table.clone()));
    table.hold();
    worker
        .request(translations_of(&moved_to("169.254.77.1")))
        .expect("request");
    assert!(table.wait_until(|t| t.listings == 1));
    let held = worker.hold();
    table.release();
    assert!(table.wait_until(|t| t.walked == 1), "the walk ended");
    assert!(!worker.idle().wait(Duration::from_millis(50)));
    assert!(
        table.lock().batches.is_empty(),
        "nothing deleted while held"
    );
    worker
        .request(translations_of(&moved_to("169.254.77.3")))
        .expect("request");
    drop(held);
    assert!(worker.idle().wait(WAIT));
    let t = table.lock();
    assert!(t.deleted.is_empty(), "{:?}", t.deleted);
    assert_eq!(t.listings, 2, "the newer request ran in full after");
}

#[test]
fn a_failed_sweep_runs_again_by_itself() {
    let table = FakeConntrack::with(vec![over_link(40000, "169.254.77.3:3000")]);
    table.lock().fail_next_listing = Some("Operation not permitted".into());
    let mut worker = SweepWorker::new(Arc::new(table.clone()));
    let seen: Arc<Mutex<Vec<Sweep>>> = Arc::default();
    let told = seen.clone();
    worker.observe(Arc::new(move |s: &Sweep| {
        told.lock().expect("seen").push(s.clone())
    }));
    worker
        .request(translations_of(&moved_to("169.254.77.1")))
        .expect("request");
    assert!(worker.idle().wait(WAIT));
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("not permitted"))
    );
    assert_eq!((seen[1].cleared, seen[1].error.as_deref()), (1, None));
    assert_eq!(table.lock().listings, 2);
}
