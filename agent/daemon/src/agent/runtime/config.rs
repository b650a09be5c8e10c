//! The runtime's settings and their defaults.

use std::time::Duration;

use kuport_core::ir::MarkLayout;

use crate::agent::clock::Clock;
use crate::agent::lifecycle::StopPolicy;
use crate::agent::status::RowsIn;

/// Settings of the runtime.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// This node's name (its Node object).
    pub node_name: String,
    /// How often the host layer compares against the kernel instead of the last applied state.
    pub resync: Duration,
    /// How long the loop waits after a change for more changes to coalesce with it.
    pub debounce: Duration,
    /// First delay before a failed pass is retried; it doubles up to `retry_max`.
    pub retry_min: Duration,
    /// Longest delay between retries.
    pub retry_max: Duration,
    /// How long one API request of a pass may take.
    pub api_timeout: Duration,
    /// The mark bits the datapath uses.
    pub marks: MarkLayout,
    /// What a stop does with the datapath (keep it for the next agent by default).
    pub stop_policy: StopPolicy,
    /// The agent's own listening ports: mappings are refused them on the addresses they bind.
    pub agent_ports: Vec<u16>,
    /// Where wall-clock time comes from: the plan's `now` (claim ages, condition times) and
    /// status timestamps. The simulator gives each agent its own skewed, simulated clock.
    pub clock: Clock,
    /// Seeds the jitter of the watches' retry delays (so agents restarted together do not
    /// retry in step). The simulator fixes it so a run replays exactly.
    pub jitter_seed: u64,
    /// Computes the plan on a blocking thread (the default: a large plan must not hold an
    /// async worker). The simulator computes it inline, where another thread would make a run
    /// depend on the operating system's scheduler.
    pub plan_on_blocking_thread: bool,
    /// Where this node writes its rows of the classes: into the class statuses (the default
    /// while a rollout may run agents that read rows only there) or into its own `PortMapNode`.
    /// Agents read both either way.
    pub rows_in: RowsIn,
}

impl AgentConfig {
    /// The defaults `docs/operations.md` lists ("Flags") for `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            resync: Duration::from_secs(300),
            debounce: Duration::from_millis(50),
            retry_min: Duration::from_millis(200),
            retry_max: Duration::from_secs(30),
            api_timeout: Duration::from_secs(10),
            marks: MarkLayout::default(),
            stop_policy: StopPolicy::Keep,
            agent_ports: Vec::new(),
            clock: Clock::system(),
            jitter_seed: jitter_seed_for(&process_start_identity()),
            plan_on_blocking_thread: true,
            rows_in: RowsIn::Class,
        }
    }
}

/// Mixes the process id and the start time: distinct on every start of every agent.
fn process_start_identity() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}/{nanos}", std::process::id())
}

/// A 64-bit seed from a string (FNV-1a: the seed needs spreading, not secrecy).
pub(super) fn jitter_seed_for(source: &str) -> u64 {
    source.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_seeds_differ_by_source_and_repeat_for_the_same_one() {
        assert_eq!(jitter_seed_for("n1"), jitter_seed_for("n1"));
        assert_ne!(jitter_seed_for("n1"), jitter_seed_for("n2"));
        assert_eq!(
            jitter_seed_for(""),
            0xcbf2_9ce4_8422_2325,
            "FNV-1a's offset basis"
        );
    }
}
