//! Agents of two versions side by side, as every rollout runs them (docs/integration.md,
//! "Versions side by side"), on the real API server: the CRDs of the newer version are applied
//! first, so the server keeps the fields only the newer agents write, and an agent of this
//! version rewriting the shared class status must not drop them from another node's row.

mod common;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kuport::agent::{WriteKind, WriteResult};
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

/// The 422s a class status patch can meet on the real server, and what the agent makes of
/// them (`agent/daemon/src/agent/refusal.rs`). Printed, as measured: a guard (`test`) that
/// fails; the CRD's validation refusing a value; a ValidatingAdmissionPolicy whose validation
/// says `reason: Invalid` refusing the result. Then n1's own row change meets that policy: the
/// agent counts a refusal (`admission`), fails the pass and does not write it again within the
/// pass (no conflict counted, at most one refused write a failed pass); with the policy's
/// binding gone, the row lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_patch_a_policy_refuses_is_reported_and_not_taken_for_a_moved_row() {
    let role = kuport_realapi::agent_role().expect("the agent's ClusterRole");
    let Some(mut c) = Cluster::empty_on(
        Target::Real(Box::new(role)),
        "a_row_patch_a_policy_refuses_is_reported_and_not_taken_for_a_moved_row",
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
    common::settle(&c).await;
    let at = raw_status(&c).await["nodes"]
        .as_array()
        .and_then(|rows| rows.iter().position(|r| r["name"] == "n1"))
        .expect("n1's row");
    let guard = |value: &str| json!({"op": "test", "path": format!("/status/nodes/{at}/name"), "value": value});
    let patch = |ops: Value| patch_class(c.client.clone(), ops);
    let failed_test = patch(json!([guard("not-n1"),
        {"op": "replace", "path": format!("/status/nodes/{at}/message"), "value": "x"}]))
    .await
    .expect("a failed guard is refused");
    eprintln!(
        "a failed test: {}",
        serde_json::to_string(&failed_test).unwrap_or_default()
    );
    let schema = patch(json!([guard("n1"),
        {"op": "replace", "path": format!("/status/nodes/{at}/underlayMTU"), "value": "string"}]))
    .await
    .expect("a value the CRD does not allow is refused");
    eprintln!(
        "the CRD's validation: {}",
        serde_json::to_string(&schema).unwrap_or_default()
    );

    install_refusing_policy(&c.client).await;
    let to_1400 = json!([guard("n1"),
        {"op": "replace", "path": format!("/status/nodes/{at}/underlayMTU"), "value": 1400}]);
    // The API server enforces a new policy a moment later.
    let mut denied = None;
    for _ in 0..150 {
        denied = patch(to_1400.clone()).await;
        if denied.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let denied = denied.expect("refused");
    eprintln!(
        "the policy: {}",
        serde_json::to_string(&denied).unwrap_or_default()
    );
    assert_eq!(
        (failed_test.code, schema.code, denied.code),
        (422, 422, 422)
    );

    // n1's own row change meets the policy.
    let n1 = c.agent("n1").metrics.clone();
    let refused = || n1.status_write_refusals(WriteKind::Class, "admission");
    let conflicts = || n1.status_writes_of(WriteKind::Class, WriteResult::Conflict);
    let (failed_before, conflicts_before) = (n1.passes_failed(), conflicts());
    c.agent("n1").host.lock().facts.underlay_mtu = Some(1400);
    common::poke_every_agent(&c, "poke-1").await;
    c.eventually("n1's refused patches are counted", || {
        std::future::ready(refused() >= 3)
    })
    .await;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(c.client.clone());
    bindings
        .delete(REFUSING_POLICY, &Default::default())
        .await
        .expect("the binding deleted");
    let failed = n1.passes_failed() - failed_before;
    assert!(
        refused() <= failed + 1,
        "{} refused patches over {failed} failed passes: a refusal was written again in its pass",
        refused()
    );
    assert_eq!(
        conflicts(),
        conflicts_before,
        "a refusal was taken for a row that moved"
    );
    c.eventually("n1's row lands once the policy is unbound", || async {
        common::row_mtu(&c, "n1").await == Some(1400)
    })
    .await;
    c.stop_all().await;
}

const REFUSING_POLICY: &str = "refuse-n1-mtu-1400";

/// The API server's answer to the JSON patch `ops` of class `public`'s status: `None` when it
/// applied.
async fn patch_class(client: kube::Client, ops: Value) -> Option<kube::core::Status> {
    let ops: json_patch::Patch = serde_json::from_value(ops).expect("a JSON patch");
    let answer = classes(&client)
        .patch_status(
            "public",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Json::<()>(ops),
        )
        .await;
    match answer {
        Err(kube::Error::Api(s)) => Some(*s),
        Ok(_) => None,
        Err(e) => panic!("patching class public: {e}"),
    }
}

/// A ValidatingAdmissionPolicy refusing, with `reason: Invalid` (a 422), a class status naming
/// MTU 1400 in n1's row, bound to every class.
async fn install_refusing_policy(client: &kube::Client) {
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": REFUSING_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["kuport.wlz.li"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["portmapclasses/status"]}]},
            "validations": [{
                "expression": "!has(object.status) || !has(object.status.nodes) || !object.status.nodes.exists(r, r.name == 'n1' && has(r.underlayMTU) && r.underlayMTU == 1400)",
                "message": "no row of n1 with MTU 1400",
                "reason": "Invalid"}],
        },
    }))
    .expect("a policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": REFUSING_POLICY},
        "spec": {"policyName": REFUSING_POLICY, "validationActions": ["Deny"]},
    }))
    .expect("a binding");
    let pp = PostParams::default();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&pp, &policy)
        .await
        .expect("the policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&pp, &binding)
        .await
        .expect("the binding");
}
