//! The model's object semantics, driven by kube-rs clients over real HTTP: CRUD, metadata the
//! server owns, status isolation, optimistic concurrency, generation, defaults, schema and CEL
//! admission with the real server's error shape, and selectors. Every test runs twice: against
//! the model and against a real kube-apiserver with the shipped CRDs (`kuport-realapi`; skipped
//! with one line when the control plane is not built), so model and reality cannot drift.

#[macro_use]
mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kuport_core::api::{PortMap, PortMapStatus};
use kuport_testkit::objects::base_portmap_spec;
use serde_json::{Value, json};

fn rv_of(o: &impl kube::ResourceExt) -> u64 {
    o.resource_version()
        .expect("resourceVersion set")
        .parse()
        .expect("numeric resourceVersion")
}

async fn crud_round_trip_with_server_owned_metadata(target: Target) {
    let Some(t) = start_on(target, "crud_round_trip_with_server_owned_metadata", &[]).await else {
        return;
    };
    t.namespace("games").await;
    let api = t.raw_portmaps("games");
    let created = api
        .create(
            &PostParams::default(),
            &portmap_doc("gameserver", base_portmap_spec()),
        )
        .await
        .expect("created");
    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("games"));
    assert_eq!(meta.generation, Some(1));
    assert_eq!(meta.uid.as_ref().map(String::len), Some(36));
    assert!(meta.creation_timestamp.is_some());
    let rv1 = rv_of(&created);

    let got = api.get("gameserver").await.expect("get");
    assert_eq!(got.metadata.uid, meta.uid);
    assert_eq!(got.data["spec"]["port"], 3000);

    // Typed access works against the same object.
    let typed: Api<PortMap> = Api::namespaced(t.client.clone(), "games");
    let pm = typed.get("gameserver").await.expect("typed get");
    assert_eq!(pm.spec.port, 3000);

    let list = api.list(&ListParams::default()).await.expect("list");
    assert_eq!(list.items.len(), 1);
    assert!(list.metadata.resource_version.is_some());

    // Changing a mutable field bumps resourceVersion and generation.
    let patched = api
        .patch(
            "gameserver",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"interfaces": ["wt0"]}})),
        )
        .await
        .expect("patched");
    assert!(rv_of(&patched) > rv1);
    assert_eq!(patched.metadata.generation, Some(2));

    let again = api
        .create(
            &PostParams::default(),
            &portmap_doc("gameserver", base_portmap_spec()),
        )
        .await;
    let status = api_error(again);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (409, "AlreadyExists")
    );
    assert_eq!(
        status.message,
        "portmaps.kuport.wlz.li \"gameserver\" already exists"
    );

    api.delete("gameserver", &DeleteParams::default())
        .await
        .expect("deleted");
    let status = api_error(api.get("gameserver").await);
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(
        status.message,
        "portmaps.kuport.wlz.li \"gameserver\" not found"
    );
    let details = status.details.expect("details");
    assert_eq!(
        (
            details.name.as_str(),
            details.group.as_str(),
            details.kind.as_str()
        ),
        ("gameserver", "kuport.wlz.li", "portmaps")
    );
}

async fn creating_in_a_missing_namespace_is_404_and_names_must_be_dns(target: Target) {
    let Some(t) = start_on(
        target,
        "creating_in_a_missing_namespace_is_404_and_names_must_be_dns",
        &[],
    )
    .await
    else {
        return;
    };
    let status = api_error(
        t.raw_portmaps("nowhere")
            .create(
                &PostParams::default(),
                &portmap_doc("x", base_portmap_spec()),
            )
            .await,
    );
    assert_eq!(status.code, 404);
    assert_eq!(status.message, "namespaces \"nowhere\" not found");

    let cms: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    let bad: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "Bad_Name"}})).expect("configmap");
    let status = api_error(cms.create(&PostParams::default(), &bad).await);
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(cause_fields(&status), ["metadata.name"]);

    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "cfg-"}})).expect("configmap");
    let made = cms
        .create(&PostParams::default(), &generated)
        .await
        .expect("generateName");
    let name = made.metadata.name.expect("name");
    assert!(name.starts_with("cfg-") && name.len() == 9, "{name}");
}

async fn status_subresource_isolation_both_ways(target: Target) {
    let Some(t) = start_on(target, "status_subresource_isolation_both_ways", &[]).await else {
        return;
    };
    t.namespace("games").await;
    let api = t.raw_portmaps("games");
    // Status sent on create is dropped.
    let mut doc = portmap_doc("gs", base_portmap_spec());
    doc.data["status"] = json!({"observedGeneration": 9});
    let created = api
        .create(&PostParams::default(), &doc)
        .await
        .expect("created");
    assert!(created.data.get("status").is_none(), "{:?}", created.data);

    // A status write cannot change spec (or labels).
    let status_write = json!({
        "metadata": {"labels": {"sneaky": "yes"}},
        "spec": {"interfaces": ["sneaky0"]},
        "status": {"observedGeneration": 1, "endpoint": {"node": "n1", "address": "10.0.0.5", "port": 3000}},
    });
    let after_status = api
        .patch_status("gs", &PatchParams::default(), &Patch::Merge(status_write))
        .await
        .expect("status patched");
    assert_eq!(
        after_status.data["status"]["endpoint"]["address"],
        "10.0.0.5"
    );
    assert!(after_status.data["spec"].get("interfaces").is_none());
    assert!(after_status.metadata.labels.is_none());
    assert_eq!(
        after_status.metadata.generation,
        Some(1),
        "status writes never bump generation"
    );
    assert!(rv_of(&after_status) > rv_of(&created));

    // A spec write cannot change status.
    let spec_write = json!({"spec": {"interfaces": ["wt0"]}, "status": {"observedGeneration": 42}});
    let after_spec = api
        .patch("gs", &PatchParams::default(), &Patch::Merge(spec_write))
        .await
        .expect("spec patched");
    assert_eq!(after_spec.data["status"]["observedGeneration"], 1);
    assert_eq!(after_spec.data["spec"]["interfaces"], json!(["wt0"]));
    assert_eq!(after_spec.metadata.generation, Some(2));

    // Replacing through the main resource keeps the stored status too.
    let mut replaced = after_spec.clone();
    replaced.data["status"] = json!({"observedGeneration": 77});
    let after_put = api
        .replace("gs", &PostParams::default(), &replaced)
        .await
        .expect("replaced");
    assert_eq!(after_put.data["status"]["observedGeneration"], 1);

    // The typed status API kuport's agent uses works the same.
    let typed: Api<PortMap> = Api::namespaced(t.client.clone(), "games");
    let mut pm = typed.get_status("gs").await.expect("get status");
    pm.status = Some(PortMapStatus {
        observed_generation: Some(2),
        ..PortMapStatus::default()
    });
    let written = typed
        .replace_status("gs", &PostParams::default(), &pm)
        .await
        .expect("status replaced");
    assert_eq!(written.status.and_then(|s| s.observed_generation), Some(2));
}

async fn stale_resource_version_is_a_409_conflict(target: Target) {
    let Some(t) = start_on(target, "stale_resource_version_is_a_409_conflict", &[]).await else {
        return;
    };
    t.namespace("games").await;
    let api = t.raw_portmaps("games");
    let created = api
        .create(
            &PostParams::default(),
            &portmap_doc("gs", base_portmap_spec()),
        )
        .await
        .expect("created");
    let mut first = created.clone();
    first.data["spec"]["interfaces"] = json!(["a"]);
    api.replace("gs", &PostParams::default(), &first)
        .await
        .expect("first writer wins");
    let mut second = created.clone();
    second.data["spec"]["interfaces"] = json!(["b"]);
    let status = api_error(api.replace("gs", &PostParams::default(), &second).await);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        "Operation cannot be fulfilled on portmaps.kuport.wlz.li \"gs\": the object has been modified; please apply your changes to the latest version and try again"
    );

    // Status writes take the same precondition.
    let mut stale_status = created.clone();
    stale_status.data["status"] = json!({"observedGeneration": 1});
    let status = api_error(
        api.replace_status("gs", &PostParams::default(), &stale_status)
            .await,
    );
    assert_eq!(status.code, 409);

    // A merge patch that names an old version is refused too.
    let patch = json!({"metadata": {"resourceVersion": created.metadata.resource_version},
                       "spec": {"interfaces": ["c"]}});
    let status = api_error(
        api.patch("gs", &PatchParams::default(), &Patch::Merge(patch))
            .await,
    );
    assert_eq!(status.code, 409);

    // Custom resources refuse an update without a version.
    let mut unconditional = api.get("gs").await.expect("get");
    unconditional.metadata.resource_version = None;
    let status = api_error(
        api.replace("gs", &PostParams::default(), &unconditional)
            .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(cause_fields(&status), ["metadata.resourceVersion"]);
}

async fn generation_moves_on_spec_changes_only_and_no_ops_keep_the_version(target: Target) {
    let Some(t) = start_on(
        target,
        "generation_moves_on_spec_changes_only_and_no_ops_keep_the_version",
        &[],
    )
    .await
    else {
        return;
    };
    t.namespace("games").await;
    let api = t.raw_portmaps("games");
    let created = api
        .create(
            &PostParams::default(),
            &portmap_doc("gs", base_portmap_spec()),
        )
        .await
        .expect("created");
    let labelled = api
        .patch(
            "gs",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("labelled");
    assert_eq!(
        labelled.metadata.generation,
        Some(1),
        "metadata is not spec"
    );
    assert!(rv_of(&labelled) > rv_of(&created));

    let same = api
        .patch(
            "gs",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 3000}})),
        )
        .await
        .expect("no-op patch");
    assert_eq!(
        rv_of(&same),
        rv_of(&labelled),
        "a no-op write stores nothing"
    );
    assert_eq!(same.metadata.generation, Some(1));

    let json_patched = api
        .patch(
            "gs",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "add", "path": "/spec/interfaces", "value": ["wt0"]}
                ]))
                .expect("json patch"),
            ),
        )
        .await
        .expect("json patched");
    assert_eq!(json_patched.metadata.generation, Some(2));
    assert_eq!(json_patched.data["spec"]["interfaces"], json!(["wt0"]));

    let status = api_error(
        api.patch(
            "gs",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "remove", "path": "/spec/nothing"}]))
                    .expect("json patch"),
            ),
        )
        .await,
    );
    assert_not_applied(&status);
    // A `test` that fails is answered the same: the server drops which operation failed.
    let status = api_error(
        api.patch(
            "gs",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "test", "path": "/spec/port", "value": 3001},
                    {"op": "replace", "path": "/spec/port", "value": 3002},
                ]))
                .expect("json patch"),
            ),
        )
        .await,
    );
    assert_not_applied(&status);
}

/// The real server's answer to a JSON patch that does not apply: 422 Invalid with the generic
/// message and nothing in `details` (no object named, no cause).
fn assert_not_applied(status: &kube::core::Status) {
    assert_eq!(
        (status.code, status.reason.as_str(), status.message.as_str()),
        (
            422,
            "Invalid",
            "the server rejected our request due to an error in our request"
        ),
        "{status:?}"
    );
    let names_nothing = status
        .details
        .as_ref()
        .is_none_or(|d| d.name.is_empty() && d.kind.is_empty() && d.causes.is_empty());
    assert!(names_nothing, "{status:?}");
}

async fn defaults_from_the_crd_are_applied_on_create(target: Target) {
    let Some(t) = start_on(target, "defaults_from_the_crd_are_applied_on_create", &[]).await else {
        return;
    };
    let created = t
        .raw_classes()
        .create(&PostParams::default(), &class_doc("c", class_spec()))
        .await
        .expect("created");
    let spec = &created.data["spec"];
    assert_eq!(spec["servingMode"], "Single");
    assert_eq!(
        spec["ports"],
        json!({"min": 1, "max": 65535, "reserved": [], "systemReserved": [
            {"port": 22}, {"port": 179}, {"port": 2379, "endPort": 2380}, {"port": 4240},
            {"port": 4244}, {"port": 5473}, {"port": 6443}, {"port": 10249, "endPort": 10259},
            {"port": 30000, "endPort": 32767}, {"port": 50000, "endPort": 50001}
        ], "perNamespace": 1024})
    );
    assert_eq!(
        spec["returnPath"]["vxlan"],
        json!({"vni": 4242, "port": 4790, "subnet": "169.254.77.0/24", "ipv6Subnet": "fd6b:7570::/96"})
    );
    // A partial window gets the missing bound from the field default.
    let mut partial = class_spec();
    partial["ports"] = json!({"min": 1024});
    let created = t
        .raw_classes()
        .create(&PostParams::default(), &class_doc("d", partial))
        .await
        .expect("created");
    assert_eq!(created.data["spec"]["ports"]["max"], 65535);
}

/// Asserts the real server's Invalid shape: 422, reason Invalid, causes naming `field`, and
/// `expected` both in the cause and in the message.
fn assert_invalid(status: &kube::core::Status, field: &str, expected: &str) {
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{status:?}"
    );
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Failure)
    );
    let details = status.details.as_ref().expect("details");
    let cause = details
        .causes
        .iter()
        .find(|c| c.field == field)
        .unwrap_or_else(|| panic!("no cause for {field}: {details:?}"));
    assert!(cause.message.contains(expected), "{cause:?}");
    assert!(status.message.contains(expected), "{}", status.message);
    assert!(
        status.message.contains(&format!("{field}:")),
        "{}",
        status.message
    );
}

async fn cel_rules_refuse_changing_each_immutable_field(target: Target) {
    let Some(t) = start_on(
        target,
        "cel_rules_refuse_changing_each_immutable_field",
        &[],
    )
    .await
    else {
        return;
    };
    t.namespace("games").await;
    let api = t.raw_portmaps("games");
    let ranged = api
        .create(
            &PostParams::default(),
            &portmap_doc("ranged", base_portmap_spec()),
        )
        .await
        .expect("created");
    let mut single_spec = base_portmap_spec();
    single_spec
        .as_object_mut()
        .expect("object")
        .remove("endPort");
    api.create(&PostParams::default(), &portmap_doc("single", single_spec))
        .await
        .expect("created");
    let cases: [(&str, &str, Value, &str, &str); 6] = [
        (
            "ranged",
            "className",
            json!("intranet"),
            "spec.className",
            "className is immutable",
        ),
        (
            "ranged",
            "protocol",
            json!("TCP"),
            "spec.protocol",
            "protocol is immutable",
        ),
        (
            "ranged",
            "port",
            json!(3001),
            "spec.port",
            "port is immutable",
        ),
        (
            "ranged",
            "endPort",
            json!(3010),
            "spec",
            "endPort is immutable",
        ),
        (
            "ranged",
            "endPort",
            Value::Null,
            "spec",
            "endPort is immutable",
        ),
        (
            "single",
            "endPort",
            json!(3005),
            "spec",
            "endPort is immutable",
        ),
    ];
    for (name, field, value, path, message) in cases {
        let status = api_error(
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {field: value}})),
            )
            .await,
        );
        assert_invalid(&status, path, message);
        // A rule on a scalar quotes the new value; one on an object (spec) quotes nothing.
        let shown = if path == "spec" {
            String::new()
        } else {
            format!("{value}: ")
        };
        assert!(
            status.message.contains(&format!(
                "{path}: Invalid value: {shown}{message}: delete the PortMap and create another"
            )),
            "{}",
            status.message
        );
        assert!(
            status
                .message
                .starts_with(&format!("PortMap.kuport.wlz.li \"{name}\" is invalid: ")),
            "{}",
            status.message
        );
    }
    // Nothing was stored by the refused writes.
    let after = api.get("ranged").await.expect("get");
    assert_eq!(
        after.metadata.resource_version,
        ranged.metadata.resource_version
    );
}

async fn cel_rules_refuse_end_port_below_port_and_min_above_max(target: Target) {
    let Some(t) = start_on(
        target,
        "cel_rules_refuse_end_port_below_port_and_min_above_max",
        &[],
    )
    .await
    else {
        return;
    };
    t.namespace("games").await;
    let mut spec = base_portmap_spec();
    spec["endPort"] = json!(2999);
    let status = api_error(
        t.raw_portmaps("games")
            .create(&PostParams::default(), &portmap_doc("gs", spec))
            .await,
    );
    assert_invalid(&status, "spec", "endPort must not be lower than port");

    let mut spec = class_spec();
    spec["ports"] = json!({"min": 2000, "max": 1000});
    let status = api_error(
        t.raw_classes()
            .create(&PostParams::default(), &class_doc("c", spec))
            .await,
    );
    assert_invalid(&status, "spec.ports", "ports.min must not exceed ports.max");
}

/// The acceptance side of every CEL rule, with the cases of `agent/core/tests/crd_schema.rs`
/// (which evaluates the rules with the model's CEL implementation): what the rules must let
/// through, on both servers.
async fn cel_rules_accept_what_they_should(target: Target) {
    let Some(t) = start_on(target, "cel_rules_accept_what_they_should", &[]).await else {
        return;
    };
    t.namespace("games").await;
    let api = t.raw_portmaps("games");
    let pp = PostParams::default();
    let mut single = base_portmap_spec();
    single.as_object_mut().expect("object").remove("endPort");
    let mut equal = base_portmap_spec();
    equal["endPort"] = json!(3000);
    for (name, spec) in [
        ("ranged", base_portmap_spec()),
        ("single", single),
        ("equal", equal),
    ] {
        api.create(&pp, &portmap_doc(name, spec))
            .await
            .unwrap_or_else(|e| panic!("{name} is a valid PortMap: {e}"));
    }
    // interfaces and serviceRef are mutable.
    api.patch(
        "ranged",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"interfaces": ["wt0"],
                                      "serviceRef": {"name": "other", "port": "game"}}})),
    )
    .await
    .expect("interfaces and serviceRef change");
    // Writing the immutable fields unchanged is no change.
    api.patch(
        "ranged",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"className": "public", "protocol": "UDP", "port": 3000,
                                      "endPort": 3009}}),
        ),
    )
    .await
    .expect("unchanged immutable fields");

    let classes = t.raw_classes();
    for (name, ports) in [
        ("equal", json!({"min": 1000, "max": 1000})),
        ("partial", json!({"min": 1000})),
        ("empty", json!({})),
    ] {
        let mut spec = class_spec();
        spec["ports"] = ports;
        classes
            .create(&pp, &class_doc(name, spec))
            .await
            .unwrap_or_else(|e| panic!("class {name} is valid: {e}"));
    }
    // The default min (1) applies before the rule: max 0 is below it. The schema's minimum
    // refuses max 0 too, and the rule runs all the same: both causes, the schema's first.
    let mut spec = class_spec();
    spec["ports"] = json!({"max": 0});
    let status = api_error(classes.create(&pp, &class_doc("zero", spec)).await);
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        "PortMapClass.kuport.wlz.li \"zero\" is invalid: [spec.ports.max: Invalid value: 0: spec.ports.max in body should be greater than or equal to 1, spec.ports: Invalid value: ports.min must not exceed ports.max]"
    );
}

async fn schema_rejections_match_the_real_server(target: Target) {
    let Some(t) = start_on(target, "schema_rejections_match_the_real_server", &[]).await else {
        return;
    };
    t.namespace("games").await;
    let api = t.raw_portmaps("games");
    let create = |spec: Value| {
        let api = api.clone();
        async move {
            api_error(
                api.create(&PostParams::default(), &portmap_doc("gs", spec))
                    .await,
            )
        }
    };
    let mut spec = base_portmap_spec();
    spec["port"] = json!(70000);
    spec["endPort"] = json!(70001);
    let status = create(spec).await;
    assert_invalid(
        &status,
        "spec.port",
        "Invalid value: 70000: spec.port in body should be less than or equal to 65535",
    );

    let mut spec = base_portmap_spec();
    spec.as_object_mut().expect("object").remove("className");
    assert_invalid(&create(spec).await, "spec.className", "Required value");

    let mut spec = base_portmap_spec();
    spec["protocol"] = json!("SCTP");
    let status = create(spec).await;
    assert_invalid(&status, "spec.protocol", "Unsupported value: \"SCTP\"");
    assert_eq!(
        status.details.expect("details").causes[0].reason,
        "FieldValueNotSupported"
    );

    let mut spec = base_portmap_spec();
    spec["port"] = json!("3000");
    assert_invalid(&create(spec).await, "spec.port", "must be of type integer");

    let mut spec = base_portmap_spec();
    spec["className"] = json!("");
    assert_invalid(
        &create(spec).await,
        "spec.className",
        "should be at least 1 chars long",
    );

    let mut class = class_spec();
    class["nodes"] = json!({});
    let status = api_error(
        t.raw_classes()
            .create(&PostParams::default(), &class_doc("c", class))
            .await,
    );
    assert_invalid(&status, "spec.nodes", "should have at least 1 properties");

    // Unknown fields are pruned by default and refused under fieldValidation=Strict.
    let mut spec = base_portmap_spec();
    spec["bogus"] = json!(1);
    let stored = api
        .create(&PostParams::default(), &portmap_doc("pruned", spec.clone()))
        .await
        .expect("pruned create");
    assert!(stored.data["spec"].get("bogus").is_none());
    // kube-rs sets fieldValidation on patches; kubectl apply sends it on creates too.
    let strict = PatchParams {
        field_validation: Some(kube::api::ValidationDirective::Strict),
        ..PatchParams::default()
    };
    let status = api_error(
        api.patch(
            "pruned",
            &strict,
            &Patch::Merge(json!({"spec": {"bogus": 2}})),
        )
        .await,
    );
    // A patched object is judged as a whole: 422 on the field `patch`.
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{status:?}"
    );
    assert_eq!(cause_fields(&status), ["patch"]);
    assert!(
        status
            .message
            .ends_with("strict decoding error: unknown field \"spec.bogus\""),
        "{}",
        status.message
    );
    // A sent object is 400 BadRequest (kube-rs has no fieldValidation on creates; kubectl sends it).
    let body = serde_json::to_vec(&portmap_doc("strict", spec)).expect("body");
    let mut request =
        kube::core::Request::new("/apis/kuport.wlz.li/v1alpha1/namespaces/games/portmaps")
            .create(&PostParams::default(), body)
            .expect("request");
    *request.uri_mut() = format!("{}?fieldValidation=Strict", request.uri().path())
        .parse()
        .expect("uri");
    let status = api_error(t.client.request::<DynamicObject>(request).await);
    assert_eq!(
        (status.code, status.message.as_str()),
        (
            400,
            "PortMap in version \"v1alpha1\" cannot be handled as a PortMap: strict decoding error: unknown field \"spec.bogus\""
        ),
        "{status:?}"
    );
}

async fn label_and_field_selectors_filter_lists(target: Target) {
    let Some(t) = start_on(target, "label_and_field_selectors_filter_lists", &[]).await else {
        return;
    };
    t.namespace("games").await;
    t.namespace("web").await;
    let cms = |ns: &str| -> Api<ConfigMap> { Api::namespaced(t.client.clone(), ns) };
    for (ns, name, labels) in [
        ("games", "a", json!({"app": "game", "tier": "edge"})),
        ("games", "b", json!({"app": "game"})),
        ("web", "c", json!({"app": "web"})),
    ] {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("configmap");
        cms(ns)
            .create(&PostParams::default(), &cm)
            .await
            .expect("created");
    }
    let all: Api<ConfigMap> = Api::all(t.client.clone());
    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect()
    };
    let lp = |labels: &str, fields: &str| {
        let mut p = ListParams::default();
        if !labels.is_empty() {
            p = p.labels(labels);
        }
        if !fields.is_empty() {
            p = p.fields(fields);
        }
        p
    };
    assert_eq!(
        names(all.list(&lp("app=game", "")).await.expect("list")),
        ["a", "b"]
    );
    assert_eq!(
        names(all.list(&lp("app in (web),!tier", "")).await.expect("list")),
        ["c"]
    );
    assert_eq!(names(all.list(&lp("tier", "")).await.expect("list")), ["a"]);
    assert_eq!(
        names(
            all.list(&lp("", "metadata.namespace=web"))
                .await
                .expect("list")
        ),
        ["c"]
    );
    assert_eq!(
        names(
            all.list(&lp("app=game", "metadata.name!=a"))
                .await
                .expect("list")
        ),
        ["b"]
    );
    let status = api_error(all.list(&lp("", "data.x=y")).await);
    assert_eq!(status.code, 400);
    assert_eq!(
        status.message,
        "\"data.x\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    );
    // Kinds with field labels of their own word the refusal differently.
    let status = api_error(
        t.raw_portmaps("games")
            .list(&lp("", "spec.port=3000"))
            .await,
    );
    assert_eq!(
        (status.code, status.message.as_str()),
        (400, "field label not supported: spec.port")
    );
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::all(t.client.clone());
    services
        .list(&lp("", "spec.type=ClusterIP,spec.clusterIP!=None"))
        .await
        .expect("Services select on spec.type and spec.clusterIP");
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::all(t.client.clone());
    let status = api_error(slices.list(&lp("", "addressType=IPv4")).await);
    assert_eq!(
        status.code, 400,
        "EndpointSlices have no addressType field label"
    );

    // Pagination hands out every item exactly once.
    let mut seen = Vec::new();
    // Only this test's objects: a real server keeps configmaps of its own in kube-system.
    let mut params = ListParams::default().labels("app").limit(1);
    loop {
        let page = all.list(&params).await.expect("page");
        let token = page.metadata.continue_.clone();
        seen.extend(names(page));
        match token {
            Some(t) if !t.is_empty() => params = params.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c"]);
}

async fn event_field_selectors_serve_kubectl_describe(target: Target) {
    let Some(t) = start_on(target, "event_field_selectors_serve_kubectl_describe", &[]).await
    else {
        return;
    };
    t.namespace("games").await;
    let events: Api<Event> = Api::namespaced(t.client.clone(), "games");
    for (name, kind, obj) in [
        ("e1", "PortMap", "gs"),
        ("e2", "Pod", "gs"),
        ("e3", "PortMap", "other"),
    ] {
        let ev: Event = serde_json::from_value(json!({
            "metadata": {"name": name},
            "involvedObject": {"kind": kind, "name": obj, "namespace": "games", "uid": "u-1"},
            "reason": "Mapped", "type": "Normal", "message": "m", "source": {"component": "kuport"},
        }))
        .expect("event");
        events
            .create(&PostParams::default(), &ev)
            .await
            .expect("event created");
    }
    let selected = events
        .list(&ListParams::default().fields(
            "involvedObject.kind=PortMap,involvedObject.name=gs,involvedObject.namespace=games,involvedObject.uid=u-1",
        ))
        .await
        .expect("list");
    let names: Vec<_> = selected
        .items
        .iter()
        .filter_map(|e| e.metadata.name.clone())
        .collect();
    assert_eq!(names, ["e1"]);
    let by_source = events
        .list(&ListParams::default().fields("source=kuport,type=Normal"))
        .await
        .expect("list");
    assert_eq!(by_source.items.len(), 3);
}

async fn finalizers_hold_deletion_until_removed_and_namespaces_cascade(target: Target) {
    let Some(t) = start_on(
        target,
        "finalizers_hold_deletion_until_removed_and_namespaces_cascade",
        &["namespace-controller"],
    )
    .await
    else {
        return;
    };
    let nodes: Api<Node> = Api::all(t.client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "worker-1", "finalizers": ["kuport.wlz.li/test"]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .expect("node");
    let created = nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("created");
    // Nodes keep the status they register with.
    assert!(created.status.is_some());
    nodes
        .delete("worker-1", &DeleteParams::default())
        .await
        .expect("delete accepted");
    let held = nodes.get("worker-1").await.expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    nodes
        .patch(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("finalizer removed");
    assert_eq!(api_error(nodes.get("worker-1").await).code, 404);

    t.namespace("games").await;
    t.raw_portmaps("games")
        .create(
            &PostParams::default(),
            &portmap_doc("gs", base_portmap_spec()),
        )
        .await
        .expect("created");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(t.client.clone());
    namespaces
        .delete("games", &DeleteParams::default())
        .await
        .expect("namespace deleted");
    // The real server's namespace controller empties the namespace, then removes it.
    let portmaps = t.raw_portmaps("games");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match portmaps.get("gs").await {
            Err(kube::Error::Api(s)) if s.code == 404 => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "games/gs still there 60s after its namespace was deleted: {other:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // A uid precondition that does not match is a conflict.
    let cms: Api<ConfigMap> = Api::namespaced(t.client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("created");
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("not-the-uid".to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(api_error(cms.delete("c", &dp).await).code, 409);
}

on_both_servers!(
    crud_round_trip_with_server_owned_metadata,
    creating_in_a_missing_namespace_is_404_and_names_must_be_dns,
    status_subresource_isolation_both_ways,
    stale_resource_version_is_a_409_conflict,
    generation_moves_on_spec_changes_only_and_no_ops_keep_the_version,
    defaults_from_the_crd_are_applied_on_create,
    cel_rules_refuse_changing_each_immutable_field,
    cel_rules_refuse_end_port_below_port_and_min_above_max,
    cel_rules_accept_what_they_should,
    schema_rejections_match_the_real_server,
    label_and_field_selectors_filter_lists,
    event_field_selectors_serve_kubectl_describe,
    finalizers_hold_deletion_until_removed_and_namespaces_cascade,
);
