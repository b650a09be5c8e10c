//! The install artifacts: every manifest parses into its Kubernetes type and keeps the invariants
//! the agent's security rests on; the chart renders the same objects for its default values; the
//! CRDs in both places equal what the Rust types generate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kuport_e2e::chart::Chart;
use kuport_e2e::manifests::{self, ManifestFile};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const NAMESPACE: &str = "kuport-system";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn manifest_files() -> Vec<ManifestFile> {
    manifests::load_dir(&repo().join("deploy/manifests")).expect("deploy/manifests loads")
}

fn manifest_objects() -> Vec<Value> {
    manifest_files()
        .into_iter()
        .flat_map(|f| f.objects)
        .collect()
}

fn typed<T: DeserializeOwned>(object: &Value) -> T {
    let text = object.to_string();
    let de = &mut serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(de).unwrap_or_else(|e| {
        panic!(
            "{} {} does not fit its type at {}: {}",
            object["kind"],
            object["metadata"]["name"],
            e.path(),
            e.inner()
        )
    })
}

fn key(object: &Value) -> String {
    format!(
        "{}/{}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn by_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn the<T: DeserializeOwned>(objects: &[Value], kind: &str, name: &str) -> T {
    let found: Vec<&Value> = by_kind(objects, kind)
        .into_iter()
        .filter(|o| o["metadata"]["name"] == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kind} {name}, found {}",
        found.len()
    );
    typed(found[0])
}

/// Every object of the manifests parses into its k8s-openapi type, with no field the type does
/// not know (a misspelt field would be dropped silently by the API server's older versions and
/// refused by newer ones).
#[test]
fn every_manifest_parses_into_its_type_without_unknown_fields() {
    let objects = manifest_objects();
    let mut kinds = BTreeMap::<String, usize>::new();
    for object in &objects {
        let kind = object["kind"].as_str().expect("kind").to_owned();
        let round_trip = match kind.as_str() {
            "Namespace" => serde_json::to_value(typed::<Namespace>(object)),
            "ServiceAccount" => serde_json::to_value(typed::<ServiceAccount>(object)),
            "ClusterRole" => serde_json::to_value(typed::<ClusterRole>(object)),
            "ClusterRoleBinding" => serde_json::to_value(typed::<ClusterRoleBinding>(object)),
            "Role" => serde_json::to_value(typed::<Role>(object)),
            "RoleBinding" => serde_json::to_value(typed::<RoleBinding>(object)),
            "DaemonSet" => serde_json::to_value(typed::<DaemonSet>(object)),
            "ValidatingAdmissionPolicy" => {
                serde_json::to_value(typed::<ValidatingAdmissionPolicy>(object))
            }
            "ValidatingAdmissionPolicyBinding" => {
                serde_json::to_value(typed::<ValidatingAdmissionPolicyBinding>(object))
            }
            other => panic!(
                "{}: unexpected kind {other} in deploy/manifests",
                key(object)
            ),
        }
        .expect("serialise");
        assert_eq!(
            normalise(&round_trip),
            normalise(object),
            "{} carries a field its type does not know",
            key(object)
        );
        *kinds.entry(kind).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = [
        ("ClusterRole", 3),
        ("ClusterRoleBinding", 1),
        ("DaemonSet", 1),
        ("Namespace", 1),
        ("Role", 2),
        ("RoleBinding", 2),
        ("ServiceAccount", 1),
        ("ValidatingAdmissionPolicy", 2),
        ("ValidatingAdmissionPolicyBinding", 2),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    assert_eq!(kinds, expected);
    let keys: BTreeSet<String> = objects.iter().map(key).collect();
    assert_eq!(keys.len(), objects.len(), "an object is listed twice");
}

/// Quantities and ints-or-strings serialise back in one canonical form; compare values loosely
/// enough that `8081` and `"8081"` in the same position are not a difference of fields.
fn normalise(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), normalise(v))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(normalise).collect()),
        Value::Number(n) => Value::String(n.to_string()),
        other => other.clone(),
    }
}

#[test]
fn the_namespace_admits_the_agent_under_pod_security() {
    let objects = manifest_objects();
    let ns: Namespace = the(&objects, "Namespace", NAMESPACE);
    let labels = ns.metadata.labels.expect("namespace labels");
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            labels
                .get(&format!("pod-security.kubernetes.io/{mode}"))
                .map(String::as_str),
            Some("privileged"),
            "namespace {NAMESPACE} lacks pod-security.kubernetes.io/{mode}: privileged"
        );
    }
    // Every namespaced object of the install, except the agent's one kube-system Role, lives
    // there.
    for object in &objects {
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            let allowed = ns == NAMESPACE
                || (ns == "kube-system"
                    && object["metadata"]["name"] == "kuport-agent-cilium-config");
            assert!(allowed, "{} is in namespace {ns}", key(object));
        }
    }
}

fn agent_container(ds: &DaemonSet) -> Container {
    let spec = ds.spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(spec.containers.len(), 1, "the agent pod has one container");
    assert!(
        spec.init_containers.as_ref().is_none_or(Vec::is_empty),
        "no init containers"
    );
    spec.containers[0].clone()
}

/// The DaemonSet settings delivery.md lists, and the security context kuport is reviewed
/// against: NET_ADMIN alone after dropping ALL, a read-only root, no privilege escalation.
fn check_daemonset(ds: &DaemonSet) {
    let spec = &ds.spec;
    let update = spec.update_strategy.as_ref().expect("updateStrategy");
    assert_eq!(update.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        update
            .rolling_update
            .as_ref()
            .and_then(|r| r.max_unavailable.clone()),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone());
    assert_eq!(
        template_labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/name"))
            .map(String::as_str),
        Some("kuport"),
        "the seed's checks select agent pods by app.kubernetes.io/name=kuport"
    );
    let selector = spec.selector.match_labels.clone().expect("selector");
    for (k, v) in &selector {
        assert_eq!(
            template_labels.as_ref().and_then(|l| l.get(k)),
            Some(v),
            "the selector's {k} is not on the pod template"
        );
    }

    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.host_network, Some(true), "hostNetwork");
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("kuport-agent"));
    assert_ne!(pod.host_pid, Some(true), "hostPID");
    assert_ne!(pod.host_ipc, Some(true), "hostIPC");
    assert!(
        pod.volumes.as_ref().is_none_or(Vec::is_empty),
        "the agent mounts nothing from the host"
    );
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "the agent tolerates every taint"
    );

    let c = agent_container(ds);
    let sc = c
        .security_context
        .as_ref()
        .expect("container securityContext");
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(
        caps.add.as_deref(),
        Some(&["NET_ADMIN".to_owned()][..]),
        "add NET_ADMIN only"
    );
    assert_eq!(
        caps.drop.as_deref(),
        Some(&["ALL".to_owned()][..]),
        "drop ALL"
    );
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "readOnlyRootFilesystem"
    );
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "allowPrivilegeEscalation"
    );
    assert_ne!(sc.privileged, Some(true), "privileged");
    // UID 0: a non-root process given NET_ADMIN in the container spec holds no effective
    // capability without ambient capabilities.
    assert_eq!(sc.run_as_user, Some(0));

    let env: BTreeMap<String, String> = c
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let from = e
                .value_from
                .and_then(|v| v.field_ref)
                .map(|f| format!("fieldRef:{}", f.field_path));
            (e.name, from.or(e.value).unwrap_or_default())
        })
        .collect();
    for (name, source) in [
        ("NODE_NAME", "fieldRef:spec.nodeName"),
        ("KUPORT_HOST_IP", "fieldRef:status.hostIP"),
        ("POD_NAME", "fieldRef:metadata.name"),
        ("POD_NAMESPACE", "fieldRef:metadata.namespace"),
    ] {
        assert_eq!(
            env.get(name).map(String::as_str),
            Some(source),
            "env {name} must come from the downward API ({source})"
        );
    }
    assert_eq!(c.args.as_deref(), Some(&["agent".to_owned()][..]));

    let ports: BTreeMap<String, i32> = c
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name.unwrap_or_default(), p.container_port))
        .collect();
    assert_eq!(
        ports.get("metrics"),
        Some(&9090),
        "metrics port named metrics"
    );
    assert_eq!(ports.get("health"), Some(&8081), "health port");
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("probe on {path}"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("health".into())
        );
    }

    let resources = c.resources.as_ref().expect("resources");
    let requests = resources.requests.clone().expect("requests");
    assert_eq!(requests.get("cpu").map(|q| q.0.as_str()), Some("10m"));
    assert_eq!(requests.get("memory").map(|q| q.0.as_str()), Some("32Mi"));
    let limits = resources.limits.clone().expect("limits");
    assert!(limits.contains_key("memory"), "a memory limit");
    assert!(!limits.contains_key("cpu"), "no CPU limit");
}

#[test]
fn the_daemonset_runs_with_net_admin_only_on_every_node() {
    let objects = manifest_objects();
    let ds: DaemonSet = the(&objects, "DaemonSet", "kuport-agent");
    check_daemonset(&ds);
}

/// The controls that make the DaemonSet check worth something: each broken copy fails it.
#[test]
fn the_daemonset_check_refuses_broken_copies() {
    let objects = manifest_objects();
    let ds = by_kind(&objects, "DaemonSet")[0].clone();
    let c = "/spec/template/spec/containers/0";
    type Breakage = Box<dyn Fn(&mut Value)>;
    let breakages: Vec<(&str, Breakage)> = vec![
        (
            "privileged",
            Box::new(move |v: &mut Value| {
                v.pointer_mut(&format!("{c}/securityContext")).expect("sc")["privileged"] =
                    json!(true);
            }),
        ),
        (
            "SYS_ADMIN",
            Box::new(move |v: &mut Value| {
                v.pointer_mut(&format!("{c}/securityContext/capabilities/add"))
                    .expect("add")
                    .as_array_mut()
                    .expect("list")
                    .push(json!("SYS_ADMIN"));
            }),
        ),
        (
            "no drop",
            Box::new(move |v: &mut Value| {
                v.pointer_mut(&format!("{c}/securityContext/capabilities"))
                    .expect("caps")
                    .as_object_mut()
                    .expect("map")
                    .remove("drop");
            }),
        ),
        (
            "writable root",
            Box::new(move |v: &mut Value| {
                v.pointer_mut(&format!("{c}/securityContext")).expect("sc")["readOnlyRootFilesystem"] =
                    json!(false);
            }),
        ),
        (
            "no hostNetwork",
            Box::new(|v: &mut Value| {
                v.pointer_mut("/spec/template/spec").expect("spec")["hostNetwork"] = json!(false);
            }),
        ),
        (
            "NODE_NAME by hand",
            Box::new(move |v: &mut Value| {
                v.pointer_mut(&format!("{c}/env/0"))
                    .expect("env")
                    .as_object_mut()
                    .expect("map")
                    .remove("valueFrom");
                v.pointer_mut(&format!("{c}/env/0")).expect("env")["value"] = json!("worker-1");
            }),
        ),
        (
            "cpu limit",
            Box::new(move |v: &mut Value| {
                v.pointer_mut(&format!("{c}/resources/limits"))
                    .expect("limits")["cpu"] = json!("1");
            }),
        ),
    ];
    for (what, breaks) in breakages {
        let mut broken = ds.clone();
        breaks(&mut broken);
        let typed: DaemonSet = typed(&broken);
        let caught = std::panic::catch_unwind(|| check_daemonset(&typed)).is_err();
        assert!(caught, "the DaemonSet check accepted a copy with {what}");
    }
}

fn rule_grants(rules: &[PolicyRule]) -> BTreeSet<String> {
    let mut grants = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.clone().unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    let names = rule
                        .resource_names
                        .clone()
                        .map(|n| format!("[{}]", n.join(",")))
                        .unwrap_or_default();
                    grants.insert(format!("{group}/{resource}{names}:{verb}"));
                }
            }
        }
        assert!(
            rule.non_resource_urls.as_ref().is_none_or(Vec::is_empty),
            "no non-resource URLs"
        );
    }
    grants
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The agent's grants are exactly what api.md's "RBAC the API implies" lists, plus the shutdown
/// lookup of its own Pod and DaemonSet (operations.md): nothing broader, no wildcard, and no
/// verb the agent never calls (a PortMap's status is replaced, never patched; only classes are
/// patched and read with `get`). The lab's real-API runs and the local cluster prove nothing it calls is missing.
#[test]
fn the_agent_roles_grant_no_verb_beyond_the_api() {
    let objects = manifest_objects();
    let cluster: ClusterRole = the(&objects, "ClusterRole", "kuport-agent");
    let allowed_cluster = set(&[
        "kuport.wlz.li/portmapclasses:get",
        "kuport.wlz.li/portmapclasses:list",
        "kuport.wlz.li/portmapclasses:watch",
        "kuport.wlz.li/portmaps:list",
        "kuport.wlz.li/portmaps:watch",
        "kuport.wlz.li/portmapnodes:get",
        "kuport.wlz.li/portmapnodes:list",
        "kuport.wlz.li/portmapnodes:watch",
        "kuport.wlz.li/portmapnodes:create",
        "kuport.wlz.li/portmapnodes:update",
        "kuport.wlz.li/portmapclasses/status:update",
        "kuport.wlz.li/portmapclasses/status:patch",
        "kuport.wlz.li/portmaps/status:update",
        "discovery.k8s.io/endpointslices:list",
        "discovery.k8s.io/endpointslices:watch",
        "/nodes:list",
        "/nodes:watch",
        "/namespaces:list",
        "/namespaces:watch",
        "/services:list",
        "/services:watch",
        "/pods:list",
        "/pods:watch",
        "events.k8s.io/events:create",
        "events.k8s.io/events:patch",
    ]);
    assert_eq!(
        rule_grants(cluster.rules.as_deref().unwrap_or_default()),
        allowed_cluster
    );
    assert!(cluster.aggregation_rule.is_none());

    let cilium: Role = the(&objects, "Role", "kuport-agent-cilium-config");
    assert_eq!(cilium.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(
        rule_grants(cilium.rules.as_deref().unwrap_or_default()),
        // list and watch by name only: the agent watches it with a metadata.name selector.
        set(&[
            "/configmaps[cilium-config]:list",
            "/configmaps[cilium-config]:watch",
        ])
    );
    let lifecycle: Role = the(&objects, "Role", "kuport-agent-lifecycle");
    assert_eq!(lifecycle.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(
        rule_grants(lifecycle.rules.as_deref().unwrap_or_default()),
        set(&[
            "/pods:get",
            "apps/daemonsets:get",
            "apps/daemonsets[kuport-agent]:list",
            "apps/daemonsets[kuport-agent]:watch",
        ])
    );

    // Each binding gives its role to the agent's ServiceAccount and nobody else.
    let subject = |subjects: Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        let subjects = subjects.unwrap_or_default();
        assert_eq!(subjects.len(), 1);
        (
            subjects[0].kind.clone(),
            subjects[0].name.clone(),
            subjects[0].namespace.clone(),
        )
    };
    let agent = (
        "ServiceAccount".to_owned(),
        "kuport-agent".to_owned(),
        Some(NAMESPACE.to_owned()),
    );
    let crb: ClusterRoleBinding = the(&objects, "ClusterRoleBinding", "kuport-agent");
    assert_eq!(
        (crb.role_ref.kind.as_str(), crb.role_ref.name.as_str()),
        ("ClusterRole", "kuport-agent")
    );
    assert_eq!(subject(crb.subjects), agent);
    for name in ["kuport-agent-cilium-config", "kuport-agent-lifecycle"] {
        let rb: RoleBinding = the(&objects, "RoleBinding", name);
        assert_eq!(
            (rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()),
            ("Role", name)
        );
        assert_eq!(
            rb.metadata.namespace,
            by_kind(&objects, "Role")
                .iter()
                .find(|r| r["metadata"]["name"] == name)
                .and_then(|r| r["metadata"]["namespace"].as_str().map(str::to_owned))
        );
        assert_eq!(subject(rb.subjects), agent);
    }
    let sa: ServiceAccount = the(&objects, "ServiceAccount", "kuport-agent");
    assert_eq!(sa.metadata.namespace.as_deref(), Some(NAMESPACE));
}

/// The class status policy matches exactly the agents' ServiceAccount writing class status,
/// denies (and fails closed), and says something about every field of the status: a field added
/// to the status later must be added to the policy too, or any node could write it.
#[test]
fn the_class_status_policy_covers_the_agents_writes_of_every_status_field() {
    let objects = manifest_objects();
    let policy: ValidatingAdmissionPolicy = the(
        &objects,
        "ValidatingAdmissionPolicy",
        "kuport-agent-class-status",
    );
    let spec = policy.spec.expect("a spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let rules = spec
        .match_constraints
        .and_then(|m| m.resource_rules)
        .expect("resource rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["kuport.wlz.li".to_owned()][..])
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["portmapclasses/status".to_owned()][..])
    );
    assert_eq!(
        rules[0].operations.as_deref(),
        Some(&["UPDATE".to_owned()][..])
    );
    let sa: ServiceAccount = the(&objects, "ServiceAccount", "kuport-agent");
    let user = format!(
        "'system:serviceaccount:{}:{}'",
        sa.metadata.namespace.as_deref().unwrap_or_default(),
        sa.metadata.name.as_deref().unwrap_or_default()
    );
    let conditions = spec.match_conditions.unwrap_or_default();
    assert_eq!(conditions.len(), 1);
    assert_eq!(
        conditions[0].expression,
        format!("request.userInfo.username == {user}")
    );
    let binding: ValidatingAdmissionPolicyBinding = the(
        &objects,
        "ValidatingAdmissionPolicyBinding",
        "kuport-agent-class-status",
    );
    let binding = binding.spec;
    assert_eq!(binding.policy_name, "kuport-agent-class-status");
    assert_eq!(binding.validation_actions, ["Deny"]);
    assert!(binding.param_ref.is_none() && binding.match_resources.is_none());

    let text: String = spec
        .validations
        .unwrap_or_default()
        .iter()
        .map(|v| v.expression.as_str())
        .chain(
            spec.variables
                .iter()
                .flatten()
                .map(|v| v.expression.as_str()),
        )
        .collect::<Vec<_>>()
        .join("\n");
    let path = repo().join("crds/portmapclasses.kuport.wlz.li.yaml");
    let text_of_crd = std::fs::read_to_string(&path).expect("the class CRD");
    let crd = manifests::parse_documents(&path, &text_of_crd).expect("the class CRD parses");
    let fields = crd[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        ["properties"]
        .as_object()
        .expect("status properties");
    for field in fields.keys() {
        assert!(
            text.contains(&format!("status.?{field}")),
            "the policy says nothing about status.{field}"
        );
    }
}

/// The aggregated roles: labelled into the built-in roles, PortMaps only, never PortMapClasses.
#[test]
fn the_aggregated_roles_carry_portmaps_and_never_classes() {
    let objects = manifest_objects();
    let expected = [
        (
            "kuport-portmap-view",
            &["view", "edit", "admin", "cluster-reader"][..],
            set(&[
                "kuport.wlz.li/portmaps:get",
                "kuport.wlz.li/portmaps:list",
                "kuport.wlz.li/portmaps:watch",
                "kuport.wlz.li/portmaps/status:get",
                "kuport.wlz.li/portmaps/status:list",
                "kuport.wlz.li/portmaps/status:watch",
            ]),
        ),
        (
            "kuport-portmap-edit",
            &["edit", "admin"][..],
            set(&[
                "kuport.wlz.li/portmaps:create",
                "kuport.wlz.li/portmaps:update",
                "kuport.wlz.li/portmaps:patch",
                "kuport.wlz.li/portmaps:delete",
                "kuport.wlz.li/portmaps:deletecollection",
            ]),
        ),
    ];
    for (name, into, grants) in expected {
        let role: ClusterRole = the(&objects, "ClusterRole", name);
        let labels = role.metadata.labels.clone().unwrap_or_default();
        for target in into {
            assert_eq!(
                labels
                    .get(&format!("rbac.authorization.k8s.io/aggregate-to-{target}"))
                    .map(String::as_str),
                Some("true"),
                "{name} does not aggregate into {target}"
            );
        }
        let rules = role.rules.clone().unwrap_or_default();
        assert_eq!(rule_grants(&rules), grants, "{name}");
    }
    // Any role that aggregates anywhere must not mention portmapclasses or wildcards.
    for role in by_kind(&objects, "ClusterRole") {
        let role: ClusterRole = typed(role);
        let aggregates = role
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .keys()
            .any(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-"));
        if !aggregates {
            continue;
        }
        for grant in rule_grants(role.rules.as_deref().unwrap_or_default()) {
            assert!(
                !grant.contains("portmapclasses") && !grant.contains('*'),
                "aggregated role {:?} grants {grant}",
                role.metadata.name
            );
        }
    }
}

fn crd_texts(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).expect("read crd"),
            )
        })
        .collect()
}

#[test]
fn chart_crds_and_crds_equal_what_the_types_generate() {
    let generated: BTreeMap<String, String> = kuport_core::crd::crd_files()
        .into_iter()
        .map(|f| {
            let text = kuport_core::crd::render_yaml(&f.crd).expect("render crd");
            (f.file_name, text)
        })
        .collect();
    assert_eq!(generated.len(), 3);
    for dir in ["crds", "deploy/chart/crds"] {
        let on_disk = crd_texts(&repo().join(dir));
        assert_eq!(
            on_disk.keys().collect::<Vec<_>>(),
            generated.keys().collect::<Vec<_>>(),
            "{dir}/ holds other files than the types generate"
        );
        for (name, text) in &generated {
            assert!(
                on_disk.get(name) == Some(text),
                "{dir}/{name} differs from what the types generate; run `just crds` and commit"
            );
        }
    }
}

fn chart() -> Chart {
    Chart::load(&repo().join("deploy/chart")).expect("chart loads")
}

fn render(overrides: Value) -> Vec<Value> {
    let rendered = chart()
        .render("kuport", NAMESPACE, &overrides)
        .expect("chart renders");
    rendered
        .iter()
        .flat_map(|r| {
            manifests::parse_documents(Path::new(&r.template), &r.text)
                .unwrap_or_else(|e| panic!("templates/{}: {e}\n{}", r.template, r.text))
        })
        .collect()
}

/// The labels only a Helm release carries: which release, chart and version made the object.
const RELEASE_LABELS: [&str; 4] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];

/// The object without [`RELEASE_LABELS`] (on it and on a DaemonSet's Pod template), after
/// checking it carries each of them.
fn without_release_labels(mut object: Value) -> Value {
    let what = key(&object);
    for pointer in ["/metadata/labels", "/spec/template/metadata/labels"] {
        let Some(labels) = object.pointer_mut(pointer).and_then(Value::as_object_mut) else {
            continue;
        };
        let template = pointer.starts_with("/spec");
        for label in RELEASE_LABELS {
            // A Pod template names its release and version only (chart and manager are the
            // DaemonSet's business).
            let wanted = !template
                || label.starts_with("app.kubernetes.io/")
                    && label != "app.kubernetes.io/managed-by";
            assert_eq!(
                labels.remove(label).is_some(),
                wanted,
                "{what}: {pointer} {label}"
            );
        }
    }
    object
}

/// For default values, the chart renders exactly the manifests' objects, less the Namespace
/// (the chart's README has the operator create and label it), plus the release labels.
#[test]
fn the_chart_renders_the_manifests_for_default_values() {
    let chart_objects: BTreeMap<String, Value> = render(json!({}))
        .into_iter()
        .map(|o| (key(&o), without_release_labels(o)))
        .collect();
    let manifest: BTreeMap<String, Value> = manifest_objects()
        .into_iter()
        .filter(|o| o["kind"] != "Namespace")
        .map(|o| (key(&o), o))
        .collect();
    assert_eq!(
        chart_objects.keys().collect::<Vec<_>>(),
        manifest.keys().collect::<Vec<_>>()
    );
    for (k, m) in &manifest {
        assert_eq!(&chart_objects[k], m, "chart and manifests differ for {k}");
    }
    // The file layout mirrors the manifests, so a change to one is easy to carry to the other.
    let templates: BTreeSet<String> = chart().templates.keys().cloned().collect();
    for file in manifest_files() {
        if file.name != "namespace.yaml" && file.name != "kustomization.yaml" {
            assert!(templates.contains(&file.name), "no templates/{}", file.name);
        }
    }
}

fn daemonset_of(objects: &[Value]) -> DaemonSet {
    the(objects, "DaemonSet", "kuport-agent")
}

#[test]
fn the_chart_values_do_what_delivery_md_says() {
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let image = |objects: &[Value]| {
        agent_container(&daemonset_of(objects))
            .image
            .expect("image")
    };

    let chart_meta = chart().meta;
    let app = chart_meta["appVersion"].as_str().expect("appVersion");
    assert_eq!(
        app,
        env!("CARGO_PKG_VERSION"),
        "Chart.yaml appVersion follows the crates' version"
    );
    assert_eq!(
        image(&render(json!({}))),
        format!("ghcr.io/walzen-group/kuport-agent:v{app}")
    );
    assert_eq!(
        image(&render(json!({"image": {"tag": "dev"}}))),
        "ghcr.io/walzen-group/kuport-agent:dev"
    );
    assert_eq!(
        image(&render(
            json!({"image": {"tag": "dev", "digest": digest, "repository": "r/k"}})
        )),
        format!("r/k@{digest}"),
        "the digest wins over the tag"
    );

    let names = |objects: &[Value], kind: &str| -> BTreeSet<String> {
        by_kind(objects, kind)
            .iter()
            .map(|o| o["metadata"]["name"].as_str().expect("name").to_owned())
            .collect()
    };
    let no_aggregate = render(json!({"rbac": {"aggregate": false}}));
    assert_eq!(names(&no_aggregate, "ClusterRole"), set(&["kuport-agent"]));
    let no_rbac = render(json!({"rbac": {"create": false, "aggregate": false}}));
    for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert!(
            names(&no_rbac, kind).is_empty(),
            "rbac.create=false still makes a {kind}"
        );
    }
    assert_eq!(names(&no_rbac, "ServiceAccount"), set(&["kuport-agent"]));

    // The class status policy names the release's namespace, and can be left out.
    let elsewhere = chart()
        .render("kuport", "edge-system", &json!({}))
        .expect("chart renders");
    let policy = elsewhere
        .iter()
        .find(|r| r.template == "class-status-policy.yaml")
        .expect("the policy template");
    assert!(
        policy
            .text
            .contains("'system:serviceaccount:edge-system:kuport-agent'"),
        "{}",
        policy.text
    );
    let without = render(json!({"admissionPolicy": {"enabled": false}}));
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(by_kind(&without, kind).is_empty(), "{kind} still rendered");
    }

    // Classes are created with the release and are valid PortMapClasses.
    let with_classes = render(json!({"classes": {
        "public": {"nodes": {"worker-1": {"interfaces": ["enp1s0", "wt0"]}},
                   "ports": {"min": 1024, "max": 65535, "reserved": [80, 443]},
                   "returnPath": {"mode": "Vxlan"}},
        "intranet": {"nodes": {"worker-1": {"interfaces": ["wt0"]}, "worker-2": {"interfaces": ["wt0"]}},
                     "returnPath": {"mode": "None"}},
    }}));
    let classes = by_kind(&with_classes, "PortMapClass");
    assert_eq!(classes.len(), 2);
    let public: kuport_core::api::PortMapClass = the(&with_classes, "PortMapClass", "public");
    assert_eq!(public.spec.ports.reserved, vec![80, 443]);
    assert_eq!(
        public.spec.nodes["worker-1"].interfaces,
        vec!["enp1s0", "wt0"]
    );
    let intranet: kuport_core::api::PortMapClass = the(&with_classes, "PortMapClass", "intranet");
    assert_eq!(intranet.spec.nodes.len(), 2);
    assert!(by_kind(&render(json!({})), "PortMapClass").is_empty());

    // Settings pass through, and the security context holds whatever the values say.
    let tuned = render(json!({
        "logLevel": "debug",
        "logFormat": "json",
        "ports": {"health": 18081, "metrics": 19090},
        "priorityClassName": "",
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kuport", "operator": "NotIn", "values": ["off"]}]}]}}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "edge", "operator": "Exists", "effect": "NoSchedule"}],
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "marks": {"base": "0x10000000", "mask": "0xf0000000"},
    }));
    let ds = daemonset_of(&tuned);
    let pod = ds.spec.template.spec.clone().expect("pod");
    assert_eq!(
        pod.node_selector
            .expect("nodeSelector")
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
    );
    assert_eq!(
        pod.tolerations.expect("tolerations")[0].key.as_deref(),
        Some("edge")
    );
    let c = agent_container(&ds);
    let env: BTreeMap<String, Option<String>> = c
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    assert_eq!(env["KUPORT_LOG_LEVEL"].as_deref(), Some("debug"));
    assert_eq!(env["KUPORT_LOG_FORMAT"].as_deref(), Some("json"));
    assert_eq!(env["KUPORT_HEALTH_ADDR"].as_deref(), Some(":18081"));
    assert_eq!(env["KUPORT_METRICS_ADDR"].as_deref(), Some(":19090"));
    let ports: Vec<(Option<String>, i32)> = c
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name, p.container_port))
        .collect();
    assert_eq!(
        ports,
        [
            (Some("health".into()), 18081),
            (Some("metrics".into()), 19090)
        ]
    );
    assert_eq!(pod.priority_class_name, None, "an empty value sets none");
    assert!(pod.affinity.is_some(), "affinity passes through");
    let strategy = ds.spec.update_strategy.clone().expect("updateStrategy");
    assert_eq!(
        strategy.rolling_update.and_then(|r| r.max_unavailable),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("25%".into()))
    );
    assert_eq!(env["KUPORT_MARK_BASE"].as_deref(), Some("0x10000000"));
    assert_eq!(env["KUPORT_MARK_MASK"].as_deref(), Some("0xf0000000"));
    let limits = c.resources.and_then(|r| r.limits).expect("limits");
    assert_eq!(limits["memory"].0, "256Mi");
    let default_env = agent_container(&daemonset_of(&render(json!({}))))
        .env
        .unwrap_or_default();
    assert!(
        default_env
            .iter()
            .all(|e| !e.name.starts_with("KUPORT_MARK_")),
        "the mark layout is left to the agent's default unless set"
    );

    // The optional ServiceMonitor and the headless Service it selects.
    assert!(by_kind(&render(json!({})), "ServiceMonitor").is_empty());
    let monitored = render(
        json!({"metrics": {"serviceMonitor": {"enabled": true, "labels": {"release": "prom"}}}}),
    );
    let sm = by_kind(&monitored, "ServiceMonitor");
    assert_eq!(sm.len(), 1);
    assert_eq!(sm[0]["metadata"]["labels"]["release"], "prom");
    assert_eq!(sm[0]["spec"]["endpoints"][0]["port"], "metrics");
    let svc: k8s_openapi::api::core::v1::Service =
        the(&monitored, "Service", "kuport-agent-metrics");
    let svc_labels = svc.metadata.labels.clone().unwrap_or_default();
    for (k, v) in sm[0]["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector")
    {
        assert_eq!(
            svc_labels.get(k).map(String::as_str),
            v.as_str(),
            "ServiceMonitor selects the Service"
        );
    }
    let svc_selector = svc
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .expect("selector");
    let pod_labels = ds
        .spec
        .template
        .metadata
        .clone()
        .and_then(|m| m.labels)
        .expect("labels");
    for (k, v) in &svc_selector {
        assert_eq!(
            pod_labels.get(k),
            Some(v),
            "the Service selects the agent pods"
        );
    }
    check_daemonset(&daemonset_of(&monitored));
}

#[test]
fn a_release_bundle_is_the_manifests_pinned_to_a_digest() {
    let image = "ghcr.io/example/kuport-agent:v9.9.9@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let text = manifests::bundle(&repo().join("deploy/manifests"), image).expect("bundle");
    let objects = manifests::parse_documents(Path::new("bundle"), &text).expect("parse bundle");
    let original = manifest_objects();
    assert_eq!(objects.len(), original.len());
    for (bundled, orig) in objects.iter().zip(&original) {
        if bundled["kind"] == "DaemonSet" {
            let ds: DaemonSet = typed(bundled);
            assert_eq!(agent_container(&ds).image.as_deref(), Some(image));
            check_daemonset(&ds);
        } else {
            assert_eq!(bundled, orig);
        }
    }
    assert!(manifests::bundle(&repo().join("deploy/manifests"), "ghcr.io/x/y:v1").is_err());
}

/// kubectl's kustomize builds the directory into the same objects the test reads.
#[test]
fn kubectl_kustomize_builds_the_same_objects() {
    let Ok(out) = std::process::Command::new("kubectl")
        .args(["kustomize"])
        .arg(repo().join("deploy/manifests"))
        .output()
    else {
        if std::env::var_os("KUPORT_REQUIRE_KUBECTL").is_some() {
            panic!("kubectl is required (KUPORT_REQUIRE_KUBECTL is set) but cannot be run");
        }
        eprintln!("skipping: kubectl is not installed");
        return;
    };
    assert!(
        out.status.success(),
        "kubectl kustomize failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = manifests::parse_documents(
        Path::new("kustomize"),
        &String::from_utf8_lossy(&out.stdout),
    )
    .expect("kustomize output parses");
    let mut built: Vec<(String, Value)> = built.into_iter().map(|o| (key(&o), o)).collect();
    let mut ours: Vec<(String, Value)> = manifest_objects()
        .into_iter()
        .map(|o| (key(&o), o))
        .collect();
    built.sort_by(|a, b| a.0.cmp(&b.0));
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(built, ours);
}

/// The suggested alerts of docs/operations.md ("Metrics"), as (name, expression, for), from
/// the rows whose expression cell is one code span.
fn documented_alerts() -> Vec<(String, String, String)> {
    let ops = std::fs::read_to_string(repo().join("docs/operations.md")).expect("operations.md");
    let start = ops
        .find("| Alert | Expression | For | Means |")
        .expect("the alerts table");
    ops[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<String> = l
                .replace("\\|", "\u{0}")
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace('\u{0}', "|"))
                .collect();
            let expr = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            (!expr.contains('`')).then(|| {
                let name: String = cells[0]
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .filter(|w| !w.is_empty())
                    .map(|w| w[..1].to_uppercase() + &w[1..])
                    .collect();
                (format!("Kuport{name}"), expr.to_owned(), cells[2].clone())
            })
        })
        .collect()
}

#[test]
fn the_prometheus_rule_carries_the_documented_alerts() {
    assert!(by_kind(&render(json!({})), "PrometheusRule").is_empty());
    let rendered = render(json!({"metrics": {"prometheusRule": {
        "enabled": true, "labels": {"prometheus": "main"}}}}));
    let rules = by_kind(&rendered, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["metadata"]["labels"]["prometheus"], "main");
    let alerts: Vec<(String, String, String)> = rules[0]["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or_default().to_owned(),
                r["expr"].as_str().unwrap_or_default().to_owned(),
                r["for"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let documented = documented_alerts();
    assert!(documented.len() >= 10, "{documented:?}");
    assert_eq!(alerts, documented);
}

/// Every key of values.yaml is described by values.schema.json (which refuses unknown keys, so
/// a value added without its schema would make every install fail).
#[test]
fn the_values_schema_describes_every_value() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/chart/values.schema.json"))
            .expect("values.schema.json"),
    )
    .expect("the schema is JSON");
    fn walk(values: &Value, schema: &Value, at: &str, missing: &mut Vec<String>) {
        let Some(map) = values.as_object() else {
            return;
        };
        let Some(props) = schema["properties"].as_object() else {
            return;
        };
        for (k, v) in map {
            match props.get(k) {
                Some(s) => walk(v, s, &format!("{at}.{k}"), missing),
                None => missing.push(format!("{at}.{k}")),
            }
        }
    }
    let mut missing = Vec::new();
    walk(&chart().values, &schema, "", &mut missing);
    assert!(
        missing.is_empty(),
        "values.yaml keys without a schema: {missing:?}"
    );
    assert_eq!(schema["additionalProperties"], false);
}
