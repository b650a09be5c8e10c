//! The agents the harness runs: the real `kuport::agent::Agent`, each a task on the harness's
//! runtime with an in-memory host, reaching the model through a counting client
//! ([`super::wire`]); and the wait for every one of them to settle.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kuport::agent::{Agent, AgentConfig, CancellationToken, Clock, Health};
use kuport_core::snapshot::HostFacts;
use kuport_host::MemoryHost;
use kuport_sim::apiserver::ApiServer;
use tokio::time::Instant;

use super::generator::interface_ip;
use super::wire::{self, Counts, WireCount};

/// One running agent.
pub struct Running {
    /// Its node.
    pub node: String,
    /// Whether a class accepts on its node.
    pub accepting: bool,
    /// What its client saw.
    pub wire: Arc<WireCount>,
    /// Its health (settled or not).
    pub health: Health,
    /// When it started.
    pub started: Instant,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The facts node `index`'s in-memory host reports: `eth<k>` for each of `classes` classes and
/// a mesh underlay.
pub fn facts(index: usize, classes: usize) -> HostFacts {
    let mut facts = HostFacts::default();
    for k in 0..classes {
        facts
            .interfaces
            .insert(format!("eth{k}"), interface_ip(k, index));
    }
    facts.underlay_device = Some("wg0".to_owned());
    facts.underlay_mtu = Some(1420);
    facts
}

/// What every agent of a run shares.
#[derive(Clone)]
pub struct Setup {
    /// The model.
    pub api: ApiServer,
    /// The harness's clock (simulated time).
    pub clock: Clock,
    /// Seeds each agent's watch jitter.
    pub seed: u64,
    /// The classes' count (each node's host has an interface per class).
    pub classes: usize,
}

/// Starts node `node`'s agent (number `index` in the sorted node list), with the defaults of
/// `kuport agent` but the clock and an inline plan.
pub fn start(setup: &Setup, node: &str, index: usize, accepting: bool) -> Running {
    let wire = Arc::new(WireCount::default());
    let client = wire::client(setup.api.router(), wire.clone());
    let host = MemoryHost::with_facts(facts(index, setup.classes));
    let mut config = AgentConfig::new(node);
    config.clock = setup.clock.clone();
    config.jitter_seed = setup.seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9);
    // Another thread would let simulated time run on while the plan computes.
    config.plan_on_blocking_thread = false;
    let agent = Agent::new(client, host, config);
    let health = agent.health();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let name = node.to_owned();
    tokio::spawn(async move {
        if let Err(e) = agent.run(token).await {
            eprintln!("scale: agent {name} stopped: {e}");
        }
    });
    Running {
        node: node.to_owned(),
        accepting,
        wire,
        health,
        started: Instant::now(),
        stop,
    }
}

/// The resync every agent runs (`AgentConfig::new`'s): a verifying pass, which may write.
pub fn resync() -> Duration {
    AgentConfig::new("any").resync
}

/// Waits until no agent's resync pass is within `margin` (ahead) or 5 s (behind) of now, so
/// that a change made then is not counted with the resyncs' writes; at most one resync period.
pub async fn clear_of_resyncs(agents: &[Running], margin: Duration) {
    let period = resync().as_millis().max(1);
    for _ in 0..period / 1000 {
        let now = Instant::now();
        let near = agents.iter().any(|a| {
            let phase = (now - a.started).as_millis() % period;
            phase < 5_000 || phase + margin.as_millis() > period
        });
        if !near {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every agent's counters, summed.
pub fn total(agents: &[Running]) -> Counts {
    let mut sum = Counts::default();
    for a in agents {
        sum.add(&a.wire.counts());
    }
    sum
}

/// Each agent's counters.
pub fn each(agents: &[Running]) -> Vec<Counts> {
    agents.iter().map(|a| a.wire.counts()).collect()
}

/// Prints which agents keep the run from settling (a long settle is worth reading).
fn progress(agents: &[Running], after: Duration) {
    let unsettled: Vec<&str> = agents
        .iter()
        .filter(|a| !a.health.is_settled())
        .map(|a| a.node.as_str())
        .collect();
    let c = total(agents);
    eprintln!(
        "scale: still settling after {} s simulated: {} requests, {} writes, {} conflicts so far; unsettled now: {unsettled:?}",
        after.as_secs(),
        c.requests,
        c.writes,
        c.conflicts
    );
}

/// How long the agents are quiet before they count as settled: no request sent, none in
/// flight, every one settled ([`Health::is_settled`]: no pass coming, no status write out or
/// held back, no retry due).
pub const QUIET: Duration = Duration::from_secs(1);

/// Waits until every agent has settled and stayed so for [`QUIET`], up to `limit`: how long
/// the agents took (from the call to the first moment of the quiet spell), or `None`.
pub async fn settle(agents: &[Running], limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    let mut last = total(agents).requests;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let requests = total(agents).requests;
        let quiet = requests == last
            && agents
                .iter()
                .all(|a| a.health.is_settled() && a.wire.in_flight.load(Ordering::Relaxed) == 0);
        last = requests;
        let now = Instant::now();
        match (quiet, quiet_since) {
            (false, _) => quiet_since = None,
            (true, None) => quiet_since = Some(now),
            (true, Some(since)) if now - since >= QUIET => return Some(since - start),
            (true, Some(_)) => {}
        }
        if now - start > limit {
            return None;
        }
        if (now - start).as_millis() % 60_000 < 50 && now - start >= Duration::from_secs(60) {
            progress(agents, now - start);
        }
    }
}
