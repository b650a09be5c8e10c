//! Agents of two versions side by side, as every rollout runs them (docs/integration.md,
//! "Versions side by side"), on the real API server: the CRDs of the newer version are applied
//! first, so the server keeps the fields only the newer agents write, and an agent of this
//! version rewriting the shared class status must not drop them from another node's row.

mod common;

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kuport_core::api::PortMapClass;
use serde_json::{Value, json};

use common::{Cluster, Target, programmed_true};

const CLASS_CRD: &str = "portmapclasses.kuport.wlz.li";

fn crd_resource() -> ApiResource {
    ApiResource {
        group: "apiextensions.k8s.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "apiextensions.k8s.io/v1".to_owned(),
        kind: "CustomResourceDefinition".to_owned(),
        plural: "customresourcedefinitions".to_owned(),
    }
}

/// Installs "the next version's" class CRD: this one, with a field more in the status and in
/// each node row, as a newer kuport that grew its status would ship.
async fn apply_next_versions_class_crd(client: &kube::Client) {
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &crd_resource());
    let mut crd = crds.get(CLASS_CRD).await.expect("the class CRD");
    let versions = crd.data["spec"]["versions"]
        .as_array_mut()
        .expect("the CRD's versions");
    for version in versions {
        let status = &mut version["schema"]["openAPIV3Schema"]["properties"]["status"];
        status["properties"]["futureSummary"] = json!({"type": "string"});
        status["properties"]["nodes"]["items"]["properties"]["futureField"] =
            json!({"type": "string"});
    }
    crds.replace(CLASS_CRD, &PostParams::default(), &crd)
        .await
        .expect("the extended class CRD replaces the shipped one");
}

fn classes(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<PortMapClass>(&()))
}

async fn raw_status(c: &Cluster) -> Value {
    let class = classes(&c.client).get("public").await.expect("class");
    class.data["status"].clone()
}

fn row<'a>(status: &'a Value, node: &str) -> Option<&'a Value> {
    status["nodes"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == node)
}

/// Writes what the newer agent on `node` would: its row with the new field, and the status's.
async fn write_as_newer_agent(c: &Cluster, node: &str) -> bool {
    let api = classes(&c.client);
    let mut class = api.get("public").await.expect("class");
    let status = &mut class.data["status"];
    let Some(rows) = status["nodes"].as_array_mut() else {
        return false;
    };
    let Some(row) = rows.iter_mut().find(|r| r["name"] == node) else {
        return false;
    };
    row["futureField"] = json!("written by the next version");
    status["futureSummary"] = json!("kept by every version");
    class.metadata.managed_fields = None;
    api.replace_status("public", &PostParams::default(), &class)
        .await
        .is_ok()
}

/// Gives n1 the interfaces `interfaces` in the class (one it does not have among them), and
/// waits until n1's agent wrote its row saying so.
async fn n1_writes_a_changed_row(c: &Cluster, interfaces: &[&str]) {
    let typed: Api<PortMapClass> = Api::all(c.client.clone());
    let mut class = c.class().await;
    class.spec.nodes.insert(
        "n1".to_owned(),
        kuport_core::api::ClassNode {
            interfaces: interfaces.iter().map(|i| (*i).to_owned()).collect(),
        },
    );
    typed
        .replace("public", &PostParams::default(), &class)
        .await
        .expect("class replaced");
    c.eventually("n1 wrote its changed row", || async {
        row(&raw_status(c).await, "n1")
            .and_then(|r| r["message"].as_str())
            .is_some_and(|m| m.contains("missing0"))
    })
    .await;
}

/// n2's agent is replaced by a newer one, which writes fields this version does not know; n1
/// (this version) then writes a change of its own row (`interfaces`): the newer fields stay.
/// Returns the cluster, still running, for what the caller checks more.
async fn newer_fields_survive_a_write_of_n1(test: &str, interfaces: &[&str]) -> Option<Cluster> {
    let role = kuport_realapi::agent_role().expect("the agent's ClusterRole");
    let mut c = Cluster::empty_on(Target::Real(Box::new(role)), test).await?;
    apply_next_versions_class_crd(&c.client).await;
    c.seed().await;
    for i in 1..=3 {
        c.start_agent(i, Duration::from_secs(3600));
    }
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    c.eventually("the pod's node writes its row of link ends", || async {
        row(&raw_status(&c).await, "n2").is_some()
    })
    .await;
    c.stop("n2").await;
    c.eventually("the newer agent's write lands", || {
        write_as_newer_agent(&c, "n2")
    })
    .await;
    n1_writes_a_changed_row(&c, interfaces).await;
    let status = raw_status(&c).await;
    assert_eq!(
        row(&status, "n2").map(|r| r["futureField"].clone()),
        Some(json!("written by the next version")),
        "n1's write dropped the newer agent's field from n2's row: {status:#}"
    );
    assert_eq!(status["futureSummary"], json!("kept by every version"));
    assert_eq!(
        row(&status, "n1").map(|r| r["futureField"].clone()),
        Some(Value::Null)
    );
    Some(c)
}

/// A change of n1's row alone is written as a patch of that row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_agent_keeps_the_fields_of_a_newer_agents_row() {
    let test = "an_older_agent_keeps_the_fields_of_a_newer_agents_row";
    let Some(mut c) = newer_fields_survive_a_write_of_n1(test, &["eth0", "missing0"]).await else {
        return;
    };
    assert!(programmed_true(&c).await, "the mapping stays programmed");
    c.stop_all().await;
}

/// n1 left with no interface of the class leaves the ready nodes: a shared change, written by
/// compare-and-swap of the whole status, with the fields this version does not know grafted
/// back (`plan/unknown_fields.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_agents_shared_write_keeps_the_fields_of_a_newer_agents_row() {
    let test = "an_older_agents_shared_write_keeps_the_fields_of_a_newer_agents_row";
    let Some(mut c) = newer_fields_survive_a_write_of_n1(test, &["missing0"]).await else {
        return;
    };
    let ready = raw_status(&c).await["readyNodes"].clone();
    assert!(
        !ready.to_string().contains("\"n1\""),
        "n1 left the ready nodes, so the write was a shared one: {ready}"
    );
    c.stop_all().await;
}

/// A class write of what one node alone changed is a JSON patch guarded by the key at each
/// index it touches (`kuport_core::plan::row_patch`). The agent relies on the API server
/// refusing a patch whose guard fails with a 422, changing nothing, and then merges into a
/// fresh read: a row another writer inserted before this node's meanwhile is kept, and this
/// node's change still lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_patch_whose_row_moved_is_refused_and_written_afresh() {
    let role = kuport_realapi::agent_role().expect("the agent's ClusterRole");
    let Some(mut c) = Cluster::empty_on(
        Target::Real(Box::new(role)),
        "a_row_patch_whose_row_moved_is_refused_and_written_afresh",
    )
    .await
    else {
        return;
    };
    c.seed().await;
    for i in 1..=3 {
        c.start_agent(i, Duration::from_secs(3600));
    }
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    let api = classes(&c.client);
    let before = raw_status(&c).await;
    let at = before["nodes"]
        .as_array()
        .and_then(|rows| rows.iter().position(|r| r["name"] == "n1"))
        .expect("n1's row");
    // Another writer puts a row first: n1's row is one further now.
    let mut class = api.get("public").await.expect("class");
    if let Some(rows) = class.data["status"]["nodes"].as_array_mut() {
        rows.insert(0, json!({"name": "a-first", "ready": false}));
    }
    class.metadata.managed_fields = None;
    api.replace_status("public", &PostParams::default(), &class)
        .await
        .expect("a row inserted first");
    // A patch computed before that insertion is refused with a 422 and changes nothing.
    let stale: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": format!("/status/nodes/{at}/name"), "value": "n1"},
        {"op": "replace", "path": format!("/status/nodes/{at}/message"), "value": "stale"},
    ]))
    .expect("a JSON patch");
    let refused = api
        .patch_status(
            "public",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Json::<()>(stale),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "a failed guard must be a 422: {refused:?}"
    );
    assert!(!raw_status(&c).await.to_string().contains("stale"));
    // n1 changes its row: written whichever way the writer finds the row, and the inserted
    // row is left as it was.
    n1_writes_a_changed_row(&c, &["eth0", "missing0"]).await;
    let status = raw_status(&c).await;
    assert_eq!(
        row(&status, "a-first"),
        Some(&json!({"name": "a-first", "ready": false}))
    );
    c.stop_all().await;
}
