//! Quiescence: the simulator calls a cluster converged only once no agent owes a status write.
//! A pod move in a Single class makes the edges hold back a row write (ends taken down,
//! `kuport::agent::status::SETTLE`) while every host and every PortMap status already matches
//! the plan; before the fix, that moment was called converged and the held write landed after
//! it. Now nothing may be written once `unconverged` comes back empty.

use std::collections::BTreeMap;
use std::time::Duration;

use kuport_simulator::check::{differences, unconverged};
use kuport_simulator::scenario::{class, portmap};
use kuport_simulator::world::{World, WorldConfig};

fn status_writes(w: &World) -> BTreeMap<String, Vec<String>> {
    w.nodes
        .iter()
        .map(|(n, s)| {
            (
                n.clone(),
                s.requests
                    .status_writes
                    .lock()
                    .map_or_else(|_| Vec::new(), |w| w.clone()),
            )
        })
        .collect()
}

/// Steps 100 ms at a time until `done` says the world converged (within a minute); how many
/// steps that took.
fn step_until(w: &mut World, done: fn(&World) -> bool) -> usize {
    for step in 0..600 {
        if done(w) {
            return step;
        }
        w.run_for(Duration::from_millis(100))
            .expect("the simulation runs");
    }
    panic!("not converged within a minute: {:?}", unconverged(w));
}

fn converged(w: &World) -> bool {
    unconverged(w).expect("a snapshot").is_empty()
}

fn writes_after(before: &BTreeMap<String, Vec<String>>, w: &World) -> Vec<String> {
    status_writes(w)
        .into_iter()
        .flat_map(|(node, after)| {
            let seen = before.get(&node).map_or(0, Vec::len);
            after
                .into_iter()
                .skip(seen)
                .map(move |p| format!("{node}: {p}"))
        })
        .collect()
}

#[test]
fn no_status_write_lands_after_convergence_is_declared() {
    let nodes: Vec<String> = (1..=8).map(|i| format!("n{i}")).collect();
    let mut w = World::new(WorldConfig {
        seed: 11,
        nodes,
        plan_fault: None,
        wire_fault: None,
        dual_stack: false,
    })
    .expect("the world builds");
    w.run_for(Duration::from_secs(1)).expect("agents start");
    w.create(&class("public", 0, &["n1", "n2", "n3"], false))
        .expect("class");
    for (i, service) in ["a", "b"].iter().enumerate() {
        w.place_pod(service, Some(&format!("n{}", 4 + i)), true)
            .expect("pod");
        w.create(&portmap(service, "public", 3000 + i as u16, service))
            .expect("portmap");
    }
    step_until(&mut w, converged);
    let mut early = 0;
    for (round, to) in ["n6", "n7", "n8", "n4"].iter().enumerate() {
        let service = ["a", "b"][round % 2];
        w.place_pod(service, Some(to), true).expect("pod moved");
        // The hosts and the PortMap statuses match the plan before the edges' held row writes
        // land: the old criterion alone.
        let matched = step_until(&mut w, |w| differences(w).expect("a snapshot").is_empty());
        let settled = matched + step_until(&mut w, converged);
        early += usize::from(settled > matched);
        let before = status_writes(&w);
        w.run_for(Duration::from_secs(3))
            .expect("the simulation runs");
        let late = writes_after(&before, &w);
        assert!(
            late.is_empty(),
            "move {round}: status writes after convergence was declared: {late:?}"
        );
        assert!(w.violations.found.is_empty(), "{:?}", w.violations.found);
    }
    assert!(
        early > 0,
        "no move left a write owed after the hosts matched the plan: this test shows nothing"
    );
}
