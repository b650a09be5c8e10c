//! What an agent shows outside its status, with three agents in one process (`common`):
//! `/healthz`, `/readyz` (ready after its first pass), `/metrics`, the Events on a PortMap's
//! flips, and the summary fields the printer columns show.

mod common;

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kuport::agent::{health_router, metrics_router};
use kuport_core::api::PortMap;
use kuport_host::MappingCounter;
use kuport_sim::apiserver::ApiServer;

use common::{Cluster, eventually, programmed_true};

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_readiness_metrics_and_events() {
    let mut c = Cluster::on_model(ApiServer::builder().build().expect("model")).await;
    // Hold the API server so the first pass cannot happen before readiness is checked.
    c.model().faults().pause();
    c.start_agent(1, Duration::from_secs(3600));
    let n1 = c.agent("n1");
    n1.host.lock().counters = vec![MappingCounter {
        namespace: "games".into(),
        name: "game".into(),
        chain: kuport_core::ir::ChainId::Pre,
        packets: 42,
        bytes: 4200,
    }];
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = http.local_addr().expect("addr");
    let router = health_router(n1.health.clone()).merge(metrics_router(n1.metrics.clone()));
    tokio::spawn(async move { axum::serve(http, router).await });

    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(http_get(addr, "/readyz").await.0, 503, "no pass yet");
    c.model().faults().resume();
    c.seed().await;
    c.start_agent(2, Duration::from_secs(3600));
    c.start_agent(3, Duration::from_secs(3600));
    c.eventually("ready after the first pass", || async {
        http_get(addr, "/readyz").await.0 == 200
    })
    .await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;

    let (code, text) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    for series in [
        "kuport_pass_duration_seconds_bucket",
        "kuport_passes_total{result=\"ok\"}",
        "kuport_pass_failures_total{stage=\"status\"}",
        "kuport_mappings{condition=\"Programmed\",reason=\"AllNodesReady\"} 1",
        "kuport_links_programmed 1",
        "kuport_status_writes_total{kind=\"portmap\",result=\"written\"}",
        "kuport_status_conflict_retries_total{kind=\"portmapclass\"}",
        "kuport_last_successful_pass_timestamp_seconds",
        "kuport_mapping_packets_total{namespace=\"games\",name=\"game\",chain=\"pre\"} 42",
        "kuport_mapping_bytes_total{namespace=\"games\",name=\"game\",chain=\"pre\"} 4200",
    ] {
        assert!(text.contains(series), "/metrics lacks {series}:\n{text}");
    }

    // The Accepted and Programmed flips were announced on the PortMap.
    let events: Api<Event> = Api::namespaced(c.client.clone(), "games");
    c.eventually("events on the PortMap's flips", || async {
        let list = events.list(&ListParams::default()).await.expect("events");
        let reasons: Vec<String> = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("game"))
            .filter_map(|e| e.reason.clone())
            .collect();
        reasons.contains(&"Valid".to_owned()) && reasons.contains(&"AllNodesReady".to_owned())
    })
    .await;

    // The summaries the printer columns show, written with the fields they summarise.
    eventually(
        "the class's summary and the row's version and pass time",
        || async {
            c.class().await.status.is_some_and(|s| {
                s.ready_nodes == ["n1"]
                    && s.nodes_summary.as_deref() == Some("1/1 n1")
                    && s.nodes.iter().all(|n| {
                        n.agent_version.as_deref() == Some(env!("CARGO_PKG_VERSION"))
                            && n.last_pass_time.is_some()
                    })
            })
        },
    )
    .await;
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let status = portmaps
        .get("game")
        .await
        .expect("get the PortMap")
        .status
        .expect("status");
    let addresses: Vec<&str> = status
        .published
        .iter()
        .map(|p| p.address.as_str())
        .collect();
    assert!(!addresses.is_empty(), "{status:?}");
    assert_eq!(status.published_summary, Some(addresses.join(",")));
    assert_eq!(
        status.endpoint.and_then(|e| e.pod).as_deref(),
        Some("gameserver-0")
    );
    c.stop_all().await;
}
