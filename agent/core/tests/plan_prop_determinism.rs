//! Property tests: the plan is a function of the cluster alone. It never panics, gives the identical plan
//! whatever the order of its input lists, and its global part is the same on every node.
//!
//! The cluster model is in `common/model.rs`, its objects in `common/inputs.rs`, the
//! oracles in `common/oracles.rs`; cases per property:
//! `KUPORT_PROPTEST_CASES` (default 1000).

mod common;

use proptest::prelude::*;

use common::inputs::*;
use common::model::*;
use common::oracles::*;

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
}
