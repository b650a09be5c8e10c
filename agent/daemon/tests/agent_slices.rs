//! Which EndpointSlices an agent keeps, with three agents in one process (`common`): none of a
//! Service no PortMap refers to, however many endpoints they list; a Service's slices fetched
//! as soon as a PortMap comes to refer to it, so the PortMap's first status already has its
//! endpoint; dropped again when no PortMap refers to it; and, under relists, delayed watch
//! events and slices moving between Services, the slices an agent plans with are those of the
//! API server.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kuport::agent::PassHook;
use kuport_core::api::PortMap;
use kuport_core::snapshot::SERVICE_NAME_LABEL;
use kuport_testkit::objects::{endpoint, pm, slice};
use serde_json::json;

use common::{Cluster, RunningAgent, Target, from, on_both_servers, programmed_true, settle};

/// A slice of Service `games/<service>` listing `endpoints` ready pods on n3, numbered from
/// `first`.
fn big_slice(service: &str, name: &str, first: usize, endpoints: usize) -> EndpointSlice {
    let mut s = slice("games", name, service).port("game", "UDP", 3001);
    for i in first..first + endpoints {
        let address = format!("10.244.3.{}", 10 + i % 240);
        let ep = endpoint(&address, "n3")
            .ready(true)
            .condition("serving", true)
            .pod("games", &format!("{service}-{i}"));
        s = s.endpoint(ep);
    }
    let mut object = s.object();
    // What a real controller adds to every endpoint, which no pass reads.
    for ep in object["endpoints"].as_array_mut().into_iter().flatten() {
        ep["hostname"] = json!(format!(
            "{}-host",
            ep["targetRef"]["name"].as_str().unwrap_or("")
        ));
        ep["zone"] = json!("zone-a");
    }
    from(object)
}

fn kept(a: &RunningAgent) -> u64 {
    a.metrics.endpoint_slices_kept()
}

fn fetches(a: &RunningAgent) -> u64 {
    a.metrics.endpoint_slice_fetches(true)
}

/// The Programmed reasons PortMap `games/<name>` goes through, as a watch sees them, from now on.
fn record_programmed(c: &Cluster, name: &str) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let api: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config));
        while let Some(Ok(event)) = events.next().await {
            let (watcher::Event::Apply(pm) | watcher::Event::InitApply(pm)) = event else {
                continue;
            };
            let reason = pm
                .status
                .into_iter()
                .flat_map(|s| s.conditions)
                .find(|c| c.type_ == "Programmed")
                .map(|c| c.reason);
            if let Some(reason) = reason {
                log.lock().expect("lock").push(reason);
            }
        }
    });
    seen
}

/// Slices of a Service no PortMap refers to are not kept, however large: no pass of any agent
/// plans with them; a PortMap created for that Service is programmed from its first status on
/// (its slices fetched before the pass that saw the PortMap planned); deleted, its Service's
/// slices go again. The control is the same slices referred to: every agent keeps them.
async fn only_the_slices_of_referred_services_are_kept(target: Target) {
    let Some(mut c) =
        Cluster::empty_on(target, "only_the_slices_of_referred_services_are_kept").await
    else {
        return;
    };
    c.seed().await;
    let planned = start_recording_agents(&mut c);
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    settle(&c).await;
    let seen_before: Vec<u64> = c.agents.iter().map(slice_events).collect();
    let passes_before: Vec<u64> = c.agents.iter().map(common::passes).collect();

    // Five slices of 200 endpoints each for `lobby`, which no PortMap refers to.
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "games");
    let pp = PostParams::default();
    for k in 0..5 {
        let lobby = big_slice("lobby", &format!("lobby-{k}"), k * 200, 200);
        slices.create(&pp, &lobby).await.expect("slice");
    }
    c.eventually("every agent saw the five slices", || {
        let done = c
            .agents
            .iter()
            .zip(&seen_before)
            .all(|(a, before)| slice_events(a) >= before + 5);
        std::future::ready(done)
    })
    .await;
    // A pass on every node reads what each agent holds: one more PortMap, for the game.
    c.create_portmap("game-tcp", 3002).await;
    c.eventually("every agent passed since", || {
        let all = c
            .agents
            .iter()
            .zip(&passes_before)
            .all(|(a, before)| common::passes(a) > *before);
        std::future::ready(all)
    })
    .await;
    settle(&c).await;
    for a in &c.agents {
        assert_eq!(
            slice_names(&planned, &a.name),
            ["gameserver-abc"],
            "{}: holds slices of a Service no PortMap refers to",
            a.name
        );
        assert_eq!(kept(a), 1, "{}: keeps only the game's slice", a.name);
        assert_eq!(fetches(a), 0, "{}: nothing to fetch yet", a.name);
    }

    // Control: a PortMap comes to refer to `lobby`. Its slices are fetched before the pass that
    // saw it plans, so its first Programmed condition is True (none says NoReadyEndpoint).
    // Their Pods exist on n3, as n3 delivers only to its own.
    for host in 10..250 {
        let name = format!("lobby-pod-{host}");
        common::put_pod(&c.client, "games", &name, "n3", &format!("10.244.3.{host}")).await;
    }
    let reasons = record_programmed(&c, "lobby");
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let lobby = pm("games", "lobby", "public", 3001).service("lobby", "game");
    portmaps
        .create(&pp, &from(lobby.object()))
        .await
        .expect("portmap");
    c.eventually("lobby is programmed", || async {
        reasons.lock().expect("lock").last().map(String::as_str) == Some("AllNodesReady")
    })
    .await;
    settle(&c).await;
    let went_through = reasons.lock().expect("lock").clone();
    assert!(
        !went_through.iter().any(|r| r == "NoReadyEndpoint"),
        "lobby was written without its endpoints first: {went_through:?}"
    );
    let all = [
        "gameserver-abc",
        "lobby-0",
        "lobby-1",
        "lobby-2",
        "lobby-3",
        "lobby-4",
    ];
    for a in &c.agents {
        assert_eq!(slice_names(&planned, &a.name), all, "{}", a.name);
        assert_eq!(kept(a), 6, "{}: keeps lobby's slices", a.name);
        assert_eq!(fetches(a), 1, "{}: one list of lobby's slices", a.name);
    }

    // No PortMap refers to lobby any more: its slices go again.
    portmaps
        .delete("lobby", &DeleteParams::default())
        .await
        .expect("portmap deleted");
    c.eventually("every agent dropped lobby's slices", || async {
        c.agents.iter().all(|a| kept(a) == 1)
    })
    .await;
    settle(&c).await;
    for a in &c.agents {
        assert_eq!(
            slice_names(&planned, &a.name),
            ["gameserver-abc"],
            "{}",
            a.name
        );
    }
    c.stop_all().await;
}

/// EndpointSlice events the agent took, whatever it made of them.
fn slice_events(a: &RunningAgent) -> u64 {
    a.metrics.watch_events("EndpointSlice", false) + a.metrics.watch_events("EndpointSlice", true)
}

on_both_servers!(only_the_slices_of_referred_services_are_kept);

/// The names of the slices `agent` planned with last.
fn slice_names(planned: &Planned, agent: &str) -> Vec<String> {
    let planned = planned.lock().expect("lock");
    let mut names: Vec<String> = planned
        .get(agent)
        .into_iter()
        .flatten()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    names.sort();
    names
}

/// The slices each agent planned with last, by agent.
type Planned = Arc<Mutex<BTreeMap<String, Vec<EndpointSlice>>>>;

/// Agents n1..n3, each recording the slices of every pass's snapshot.
fn start_recording_agents(c: &mut Cluster) -> Planned {
    let planned = Planned::default();
    let record = planned.clone();
    c.pass_hooks = Some(Arc::new(move |name: &str| -> PassHook {
        let record = record.clone();
        let name = name.to_owned();
        Arc::new(move |snapshot, _plan| {
            record
                .lock()
                .expect("lock")
                .insert(name.clone(), snapshot.endpoint_slices.clone());
        })
    }));
    for i in 1..=3 {
        c.start_agent(i, Duration::from_secs(3600));
    }
    planned
}

/// What the agents must plan with: the API server's slices of the Services its PortMaps refer
/// to, as the agent keeps them (what a pass reads of them), sorted.
async fn expected_slices(c: &Cluster) -> Vec<(String, Option<String>, String)> {
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let services: Vec<String> = portmaps
        .list(&Default::default())
        .await
        .expect("portmaps")
        .items
        .into_iter()
        .map(|p| p.spec.service_ref.name)
        .collect();
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "games");
    let mut out: Vec<_> = slices
        .list(&Default::default())
        .await
        .expect("slices")
        .items
        .iter()
        .filter(|s| {
            let service = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL));
            service.is_some_and(|n| services.contains(n))
        })
        .map(summary)
        .collect();
    out.sort();
    out
}

/// A slice as compared: its name, version and endpoints (address, readiness, pod).
fn summary(s: &EndpointSlice) -> (String, Option<String>, String) {
    let endpoints: Vec<String> = s
        .endpoints
        .iter()
        .flatten()
        .map(|e| {
            format!(
                "{} {:?} {:?}",
                e.addresses.first().cloned().unwrap_or_default(),
                e.conditions.as_ref().and_then(|c| c.ready),
                e.target_ref.as_ref().and_then(|t| t.name.clone())
            )
        })
        .collect();
    (
        s.metadata.name.clone().unwrap_or_default(),
        s.metadata.resource_version.clone(),
        endpoints.join(","),
    )
}

/// A small deterministic generator (xorshift64), so the run replays its choices.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Changes drawn at random while every watch event is delayed and watches are cut (a short
/// history makes some of the cuts relists): PortMaps for four Services created and deleted,
/// their slices' endpoints changed, slices moved to another Service, deleted and created again.
/// Once it all settles, each agent plans with exactly the slices of the Services a PortMap
/// refers to, at the API server's versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kept_slices_follow_the_api_server_through_relists_and_late_events() {
    let server = kuport_sim::apiserver::ApiServer::builder()
        .history_limit(5)
        .build()
        .expect("model builds");
    let mut c = Cluster::on_model(server).await;
    c.seed().await;
    let planned = start_recording_agents(&mut c);
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    let faults = c.model().faults().clone();
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "games");
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let pp = PostParams::default();
    let services = ["s0", "s1", "s2", "s3"];
    for (k, service) in services.iter().enumerate() {
        for j in 0..2 {
            let name = format!("{service}-{j}");
            slices
                .create(&pp, &big_slice(service, &name, k * 10 + j, 3))
                .await
                .expect("slice");
        }
    }
    faults.delay_watch_events(Duration::from_millis(40));
    let seed = std::env::var("KUPORT_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_1234_9876_ABCDu64);
    let mut draw = Draw(seed);
    let mut relists = 0;
    for step in 0..80 {
        let service = services[draw.below(services.len())];
        let name = format!("{service}-{}", draw.below(2));
        match draw.below(6) {
            0 => {
                let portmap = pm("games", service, "public", 3100 + draw.below(4) as i32)
                    .service(service, "game");
                let _ = portmaps.create(&pp, &from(portmap.object())).await;
            }
            1 => {
                let _ = portmaps.delete(service, &DeleteParams::default()).await;
            }
            2 => {
                // Another service's label: the slice moves.
                let other = services[draw.below(services.len())];
                if let Ok(mut s) = slices.get(&name).await {
                    let labels = s.metadata.labels.get_or_insert_default();
                    labels.insert(SERVICE_NAME_LABEL.to_owned(), other.to_owned());
                    let _ = slices.replace(&name, &pp, &s).await;
                }
            }
            3 => {
                let _ = slices.delete(&name, &DeleteParams::default()).await;
                let fresh = big_slice(service, &name, step, 1 + draw.below(3));
                let _ = slices.create(&pp, &fresh).await;
            }
            4 => {
                faults.close_watches();
                relists += 1;
            }
            _ => {
                if let Ok(mut s) = slices.get(&name).await {
                    for e in s.endpoints.iter_mut().flatten() {
                        let ready = e.conditions.as_ref().and_then(|c| c.ready);
                        e.conditions.get_or_insert_default().ready = Some(ready != Some(true));
                    }
                    let _ = slices.replace(&name, &pp, &s).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5 * draw.below(4) as u64)).await;
    }
    faults.clear();
    // Only s0 stays referred to (by one more PortMap, so every agent passes after the last
    // change has reached it): whatever the agents kept of the other Services must go.
    for service in &services[1..] {
        let _ = portmaps.delete(service, &DeleteParams::default()).await;
    }
    // And every slice of s0 but the first moves to a Service nobody refers to.
    for mut moved in slices
        .list(&Default::default())
        .await
        .expect("slices")
        .items
    {
        let labels = moved.metadata.labels.get_or_insert_default();
        let name = moved.metadata.name.clone().unwrap_or_default();
        if labels.get(SERVICE_NAME_LABEL).map(String::as_str) == Some("s0") && name != "s0-0" {
            labels.insert(SERVICE_NAME_LABEL.to_owned(), "nobody".to_owned());
            slices.replace(&name, &pp, &moved).await.expect("moved");
        }
    }
    let last = pm("games", "last", "public", 3200).service("s0", "game");
    portmaps
        .create(&pp, &from(last.object()))
        .await
        .expect("portmap");
    let expected = expected_slices(&c).await;
    c.eventually("every agent plans with the API server's slices", || async {
        let planned = planned.lock().expect("lock");
        c.agents.iter().all(|a| {
            let mut got: Vec<_> = planned
                .get(&a.name)
                .into_iter()
                .flatten()
                .map(summary)
                .collect();
            got.sort();
            got == expected
        })
    })
    .await;
    settle(&c).await;
    let planned = planned.lock().expect("lock").clone();
    for a in &c.agents {
        let mut got: Vec<_> = planned[&a.name].iter().map(summary).collect();
        got.sort();
        assert_eq!(got, expected, "{} after settling", a.name);
        assert_eq!(kept(a), expected.len() as u64, "{}", a.name);
    }
    eprintln!(
        "{relists} watch cuts; {} slices kept; fetches per agent: {:?}",
        expected.len(),
        c.agents.iter().map(fetches).collect::<Vec<_>>()
    );
    c.stop_all().await;
}
