//! The shipped admission policy (`deploy/manifests/class-status-policy.yaml`) against the real
//! kube-apiserver: each agent, authenticated as the agents' one ServiceAccount with a token
//! bound to its own Pod (the token names the Pod's node), may change only its own node's part of
//! a class status. Every case writes as one node's agent after the status was reset by the
//! administrator; the last step removes the policy's binding and shows the API server then takes
//! the same forged write (RBAC allows it), so the refusals are the policy's.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use kuport_core::api::PortMapClass;
use kuport_core::plan::merge::{ClassPart, RowHome, merge_class_status};
use kuport_core::plan::node_rows::NodeRows;
use kuport_core::plan::{ClaimProposal, ClassRowWrite, GcAction, GcKind, KernelRefusalWrite};
use kuport_realapi::ControlPlane;
use kuport_testkit::objects::{self, AGENT_ACCOUNT, DAEMONSET_NAMESPACE, bare_agent_pod};
use serde_json::{Value, json};

const CLASS: &str = "public";
const POLICY: &str = "kuport-agent-class-status";

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("object")
}

fn classes_resource() -> ApiResource {
    ApiResource {
        group: "kuport.wlz.li".into(),
        version: "v1alpha1".into(),
        api_version: "kuport.wlz.li/v1alpha1".into(),
        kind: "PortMapClass".into(),
        plural: "portmapclasses".into(),
    }
}

fn row(node: &str, mtu: i64) -> Value {
    json!({"name": node, "ready": true, "underlayMTU": mtu, "linkMTU": mtu - 50,
           "addresses": {"wt0": "100.64.0.1"}})
}

fn claim(key: &str, slot: i64) -> Value {
    let peers: Vec<&str> = key.split('/').collect();
    json!({"key": key, "peers": peers, "subnet": format!("169.254.77.{}/31", 2 * slot), "slot": slot})
}

/// What the administrator resets the class status to before each case: rows of n1 and n2 (n3
/// is named but has no row yet, n4 is not named), a refusal reported by n2, and two claims.
fn base_status() -> Value {
    json!({
        "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Valid", "message": "ok",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
        "nodes": [row("n1", 1420), row("n2", 1420)],
        "readyNodes": ["n1", "n2"],
        "nodesSummary": "2/3 n1,n2",
        "links": [claim("n1/n2", 1), claim("n2/n3", 0)],
        "refused": [{"node": "n2", "mapping": "games/gs", "message": "nft refused"}],
    })
}

struct Env {
    cp: ControlPlane,
    admin: Api<DynamicObject>,
    /// Each node's agent, with a token bound to its Pod.
    agents: BTreeMap<&'static str, Api<DynamicObject>>,
    /// The agents' ServiceAccount with a token bound to nothing.
    unbound: Api<DynamicObject>,
}

impl Env {
    async fn start(test: &str) -> Option<Self> {
        let cp = ControlPlane::start_or_skip(test, Default::default()).await?;
        cp.install_crds(std::path::Path::new(kuport_realapi::CRD_DIR))
            .await
            .expect("the shipped CRDs install");
        let role = kuport_realapi::agent_role().expect("the agent's ClusterRole");
        cp.create_service_account(DAEMONSET_NAMESPACE, AGENT_ACCOUNT, &role)
            .await
            .expect("the agents' ServiceAccount");
        let admin = cp.admin_client().await.expect("admin client");
        let pp = PostParams::default();
        let resource = classes_resource();
        let mut agents = BTreeMap::new();
        for node in ["n1", "n2", "n3", "n4"] {
            Api::<Node>::all(admin.clone())
                .create(&pp, &from(objects::node(node, Some("10.0.0.1"), true)))
                .await
                .expect("node");
            Api::<Pod>::namespaced(admin.clone(), DAEMONSET_NAMESPACE)
                .create(&pp, &from(bare_agent_pod(node)))
                .await
                .expect("the agent's Pod");
            let token = cp
                .pod_token(
                    DAEMONSET_NAMESPACE,
                    AGENT_ACCOUNT,
                    &format!("kuport-agent-{node}"),
                )
                .await
                .expect("a pod-bound token");
            let client = cp
                .client_with_token(DAEMONSET_NAMESPACE, AGENT_ACCOUNT, &token)
                .await
                .expect("the agent's client");
            agents.insert(node, Api::all_with(client, &resource));
        }
        let token = cp
            .unbound_token(DAEMONSET_NAMESPACE, AGENT_ACCOUNT)
            .await
            .expect("an unbound token");
        let unbound = cp
            .client_with_token(DAEMONSET_NAMESPACE, AGENT_ACCOUNT, &token)
            .await
            .expect("the unbound client");
        let admin_classes: Api<DynamicObject> = Api::all_with(admin, &resource);
        let class: DynamicObject = from(json!({
            "apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMapClass",
            "metadata": {"name": CLASS},
            "spec": {"nodes": {"n1": {"interfaces": ["wt0"]}, "n2": {"interfaces": ["wt0"]},
                               "n3": {"interfaces": ["wt0"]}},
                     "returnPath": {"mode": "Vxlan"}},
        }));
        admin_classes.create(&pp, &class).await.expect("the class");
        Some(Self {
            cp,
            admin: admin_classes,
            agents,
            unbound: Api::all_with(unbound, &resource),
        })
    }

    async fn reset(&self) {
        let mut class = self.admin.get(CLASS).await.expect("read the class");
        class.data["status"] = base_status();
        self.admin
            .replace_status(CLASS, &PostParams::default(), &class)
            .await
            .expect("the administrator resets the status");
    }

    /// Resets the status, then writes it as `api` after `change`: `Ok` when the API server took
    /// the write, the refusal's message when it answered 403.
    async fn write(
        &self,
        api: &Api<DynamicObject>,
        change: impl FnOnce(&mut Value),
    ) -> Result<(), String> {
        self.write_over(|_| {}, api, change).await
    }

    /// [`Env::write`] over the base status with `base` applied by the administrator first.
    async fn write_over(
        &self,
        base: impl FnOnce(&mut Value),
        api: &Api<DynamicObject>,
        change: impl FnOnce(&mut Value),
    ) -> Result<(), String> {
        self.reset().await;
        let mut class = self.admin.get(CLASS).await.expect("read the class");
        base(&mut class.data["status"]);
        self.admin
            .replace_status(CLASS, &PostParams::default(), &class)
            .await
            .expect("the administrator writes the base status");
        let mut class = self.admin.get(CLASS).await.expect("read the class");
        change(&mut class.data["status"]);
        match api
            .replace_status(CLASS, &PostParams::default(), &class)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 403 => Err(s.message),
            Err(e) => panic!("writing the class status: {e}"),
        }
    }

    fn agent(&self, node: &str) -> &Api<DynamicObject> {
        &self.agents[node]
    }
}

fn set(status: &mut Value, pointer: &str, value: Value) {
    *status
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{pointer}")) = value;
}

fn push(status: &mut Value, list: &str, value: Value) {
    status[list].as_array_mut().expect("a list").push(value);
}

fn remove(status: &mut Value, list: &str, pred: impl Fn(&Value) -> bool) {
    status[list]
        .as_array_mut()
        .expect("a list")
        .retain(|v| !pred(v));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agent_changes_only_its_own_part_of_a_class_status() {
    let test = "each_agent_changes_only_its_own_part_of_a_class_status";
    let Some(env) = Env::start(test).await else {
        return;
    };
    // Before the policy: the API server takes a node's forged write of another node's row.
    let forge_n2_row = |s: &mut Value| set(s, "/nodes/1/underlayMTU", json!(9000));
    env.write(env.agent("n1"), forge_n2_row)
        .await
        .expect("RBAC alone lets any agent write any row");

    env.cp
        .install_admission_policies(std::path::Path::new(
            kuport_realapi::CLASS_STATUS_POLICY_FILE,
        ))
        .await
        .expect("the shipped policy installs");
    // The API server enforces a new policy once its admission plugin has seen it.
    kuport_testkit::wait::eventually(
        "the policy refuses a token that names no node",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { env.write(&env.unbound, |_| {}).await.is_err() },
    )
    .await;

    let allowed = |what: &str, r: Result<(), String>| {
        assert_eq!(r, Ok(()), "{what} must be allowed");
    };
    let refused = |what: &str, r: Result<(), String>, says: &str| match r {
        Ok(()) => panic!("{what} must be refused"),
        Err(m) => assert!(
            m.contains(POLICY) && m.contains(says),
            "{what}: the refusal should name the policy and say {says:?}: {m}"
        ),
    };

    // Rows.
    allowed(
        "n1 changing its own row",
        env.write(env.agent("n1"), |s| {
            set(s, "/nodes/0/underlayMTU", json!(1400))
        })
        .await,
    );
    allowed(
        "n3 adding its own row",
        env.write(env.agent("n3"), |s| push(s, "nodes", row("n3", 1420)))
            .await,
    );
    refused(
        "n1 changing n2's row",
        env.write(env.agent("n1"), forge_n2_row).await,
        "node n1 may change only its own row",
    );
    refused(
        "n1 forging a yieldsTo in n2's row",
        env.write(env.agent("n1"), |s| {
            s["nodes"][1]["heldPorts"] = json!([{"protocol": "TCP", "port": 22,
                "address": "0.0.0.0", "holder": "sshd", "yieldsTo": ["games/gs"]}]);
        })
        .await,
        "node n1 may change only its own row",
    );
    refused(
        "n1 removing n2's row",
        env.write(env.agent("n1"), |s| {
            remove(s, "nodes", |r| r["name"] == "n2")
        })
        .await,
        "node n1 may change only its own row",
    );
    refused(
        "n4, which the class does not name, adding a row",
        env.write(env.agent("n4"), |s| push(s, "nodes", row("n4", 1420)))
            .await,
        "node n4 is not named by the class",
    );
    let pod_end = json!({"name": "n4", "ready": true, "accepting": false,
        "links": [{"peer": "n1", "slot": 0, "up": true}]});
    refused(
        "n4 adding a pod's node row that also claims addresses",
        env.write(env.agent("n4"), |s| {
            let mut row = pod_end.clone();
            row["addresses"] = json!({"eth0": "203.0.113.9"});
            push(s, "nodes", row)
        })
        .await,
        "node n4 is not named by the class",
    );
    allowed(
        "n4 adding its row of link ends as a pod's node",
        env.write(env.agent("n4"), |s| push(s, "nodes", pod_end.clone()))
            .await,
    );
    refused(
        "a token that names no node",
        env.write(&env.unbound, |s| {
            set(s, "/nodes/0/underlayMTU", json!(1400))
        })
        .await,
        "token bound to its",
    );

    // The summary every accepting node writes.
    allowed(
        "n1 flipping Ready",
        env.write(env.agent("n1"), |s| {
            set(s, "/conditions/0/status", json!("False"))
        })
        .await,
    );
    refused(
        "n4 flipping Ready",
        env.write(env.agent("n4"), |s| {
            set(s, "/conditions/0/status", json!("False"))
        })
        .await,
        "may not change its conditions",
    );

    // Refusals.
    let refusal = |node: &str| json!({"node": node, "mapping": "games/x", "message": "m"});
    allowed(
        "n1 reporting its own refusal",
        env.write(env.agent("n1"), |s| push(s, "refused", refusal("n1")))
            .await,
    );
    allowed(
        "n4 reporting its own refusal (a pod node has no row)",
        env.write(env.agent("n4"), |s| push(s, "refused", refusal("n4")))
            .await,
    );
    refused(
        "n1 reporting a refusal in n2's name",
        env.write(env.agent("n1"), |s| push(s, "refused", refusal("n2")))
            .await,
        "own entries of status.refused",
    );
    refused(
        "n1 removing n2's refusal",
        env.write(env.agent("n1"), |s| {
            remove(s, "refused", |r| r["node"] == "n2")
        })
        .await,
        "own entries of status.refused",
    );

    // Link claims.
    allowed(
        "n1 claiming a link to n3, which the class names",
        env.write(env.agent("n1"), |s| push(s, "links", claim("n1/n3", 2)))
            .await,
    );
    allowed(
        "n4 (a pod's node) claiming a link to n1",
        env.write(env.agent("n4"), |s| push(s, "links", claim("n1/n4", 2)))
            .await,
    );
    refused(
        "n1 claiming a link to n9, which the class does not name",
        env.write(env.agent("n1"), |s| push(s, "links", claim("n1/n9", 2)))
            .await,
        "only between itself and a node the class names",
    );
    refused(
        "n1 claiming a link between n2 and n4",
        env.write(env.agent("n1"), |s| push(s, "links", claim("n2/n4", 2)))
            .await,
        "may not add or change a link claim between two other nodes",
    );
    refused(
        "n1 moving the n2/n3 claim to another slot",
        env.write(env.agent("n1"), |s| set(s, "/links/1/slot", json!(5)))
            .await,
        "may not add or change a link claim between two other nodes",
    );
    allowed(
        "n1 (accepting) marking the n2/n3 claim unused",
        env.write(env.agent("n1"), |s| {
            s["links"][1]["unusedSince"] = json!("2026-01-01T00:00:00Z");
        })
        .await,
    );
    refused(
        "n4 (not accepting) marking the n2/n3 claim unused",
        env.write(env.agent("n4"), |s| {
            s["links"][1]["unusedSince"] = json!("2026-01-01T00:00:00Z");
        })
        .await,
        "may not add or change a link claim between two other nodes",
    );
    refused(
        "n1 dropping the n2/n3 claim while it is in use",
        env.write(env.agent("n1"), |s| {
            remove(s, "links", |l| l["key"] == "n2/n3")
        })
        .await,
        "may not remove a link claim between two other nodes",
    );
    let marked = |s: &mut Value| s["links"][1]["unusedSince"] = json!("2026-01-01T00:00:00Z");
    allowed(
        "n1 (accepting) dropping the n2/n3 claim once it was marked unused",
        env.write_over(marked, env.agent("n1"), |s| {
            remove(s, "links", |l| l["key"] == "n2/n3")
        })
        .await,
    );
    refused(
        "n4 (not accepting) dropping the marked n2/n3 claim",
        env.write_over(marked, env.agent("n4"), |s| {
            remove(s, "links", |l| l["key"] == "n2/n3")
        })
        .await,
        "may not remove a link claim between two other nodes",
    );
    allowed(
        "n1 taking over the n2/n3 claim's slot for its own pair",
        env.write(env.agent("n1"), |s| {
            remove(s, "links", |l| l["key"] == "n2/n3");
            push(s, "links", claim("n1/n3", 0));
        })
        .await,
    );

    // What an agent actually writes: n1's part merged by the agent's own code.
    env.reset().await;
    let fresh = env.admin.get(CLASS).await.expect("read the class");
    let class: PortMapClass = from(serde_json::to_value(&fresh).expect("json"));
    let status = class.status.clone().expect("a status");
    let mut own_row = status.nodes[0].clone();
    own_row.underlay_mtu = Some(1380);
    let write = ClassRowWrite {
        class: CLASS.into(),
        row: own_row,
        ready: status.conditions[0].clone(),
        accepting: vec!["n1".into(), "n2".into()],
        named: 3,
        namespaces: Vec::new(),
    };
    let proposal = ClaimProposal {
        class: CLASS.into(),
        key: "n1/n3".into(),
        peers: ["n1".into(), "n3".into()],
        slot: 2,
        subnet: "169.254.77.4/31".into(),
        replaces: None,
    };
    let gc = GcAction {
        class: CLASS.into(),
        key: "n2/n3".into(),
        action: GcKind::MarkUnused,
    };
    let refusal = KernelRefusalWrite {
        class: CLASS.into(),
        mapping: "games/y".into(),
        message: "refused on n1".into(),
    };
    let part = ClassPart {
        row: Some(&write),
        claims: vec![&proposal],
        gc: vec![&gc],
        refused: vec![&refusal],
    };
    let merged = merge_class_status(
        &class,
        &NodeRows::default(),
        "n1",
        RowHome::Class {
            agent_version: "0.0.0-test",
        },
        &part,
        k8s_openapi::jiff::Timestamp::now(),
    );
    let mut body: DynamicObject = from(serde_json::to_value(&class).expect("json"));
    body.data["status"] = serde_json::to_value(&merged.status).expect("status json");
    env.agent("n1")
        .replace_status(CLASS, &PostParams::default(), &body)
        .await
        .expect("the agent's own merge of its part is allowed");

    // The control: without the binding the API server takes the forged write again.
    Api::<ValidatingAdmissionPolicyBinding>::all(env.cp.admin_client().await.expect("admin"))
        .delete(POLICY, &DeleteParams::default())
        .await
        .expect("delete the binding");
    kuport_testkit::wait::eventually(
        "without the binding, n1's forged write of n2's row is taken",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { env.write(env.agent("n1"), forge_n2_row).await.is_ok() },
    )
    .await;
}
