//! Each node's `PortMapNode` against the real kube-apiserver: the shipped admission policy
//! (`kuport-agent-node-object` in `deploy/manifests/class-status-policy.yaml`) lets an agent,
//! with a token bound to its own Pod, write only the object named after its node, with rows
//! only under its own name; the control removes the policy's binding and shows the API server
//! then takes the forged writes (RBAC allows them). And a row too large for a class status (an
//! accepting node linked to pods on more than 512 nodes) fits in the node's own object.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kuport_core::api::{
    ClassNodeStatus, LinkEndStatus, NodeClassRow, PortMapNode, PortMapNodeSpec,
};
use kuport_realapi::ControlPlane;
use kuport_testkit::objects::{self, AGENT_ACCOUNT, DAEMONSET_NAMESPACE, bare_agent_pod};

const POLICY: &str = "kuport-agent-node-object";

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("object")
}

/// `node`'s object holding a row named `row_name` of class `public` with `ends` link ends.
fn object(node: &str, row_name: &str, ends: usize) -> PortMapNode {
    let links = (0..ends)
        .map(|i| LinkEndStatus {
            peer: format!("pod-node-{i:04}"),
            slot: i32::try_from(i).expect("slot"),
            up: Some(true),
            verified_mtu: Some(1370),
            ..Default::default()
        })
        .collect();
    PortMapNode::new(
        node,
        PortMapNodeSpec {
            agent_version: Some("0.0.0-test".into()),
            classes: vec![NodeClassRow {
                class: "public".into(),
                row: ClassNodeStatus {
                    name: row_name.into(),
                    ready: true,
                    links,
                    ..Default::default()
                },
            }],
        },
    )
}

struct Env {
    cp: ControlPlane,
    admin: Api<PortMapNode>,
    n1: Api<PortMapNode>,
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
        for node in ["n1", "n2"] {
            Api::<Node>::all(admin.clone())
                .create(&pp, &from(objects::node(node, Some("10.0.0.1"), true)))
                .await
                .expect("node");
        }
        Api::<Pod>::namespaced(admin.clone(), DAEMONSET_NAMESPACE)
            .create(&pp, &from(bare_agent_pod("n1")))
            .await
            .expect("the agent's Pod");
        let token = cp
            .pod_token(DAEMONSET_NAMESPACE, AGENT_ACCOUNT, "kuport-agent-n1")
            .await
            .expect("a pod-bound token");
        let client = cp
            .client_with_token(DAEMONSET_NAMESPACE, AGENT_ACCOUNT, &token)
            .await
            .expect("the agent's client");
        Some(Self {
            admin: Api::all(admin),
            n1: Api::all(client),
            cp,
        })
    }

    /// Writes `object` as n1's agent (created, or replaced over what is stored): `Ok` when the
    /// API server took it, the refusal's message when it answered 403.
    async fn write_as_n1(&self, mut object: PortMapNode) -> Result<(), String> {
        let name = object.metadata.name.clone().expect("name");
        let stored = self.admin.get_opt(&name).await.expect("read the object");
        let pp = PostParams::default();
        let result = match stored {
            Some(old) => {
                object.metadata.resource_version = old.metadata.resource_version;
                self.n1.replace(&name, &pp, &object).await
            }
            None => self.n1.create(&pp, &object).await,
        };
        match result {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 403 => Err(s.message),
            Err(e) => panic!("writing PortMapNode {name}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agent_writes_only_its_own_nodes_object() {
    let test = "each_agent_writes_only_its_own_nodes_object";
    let Some(env) = Env::start(test).await else {
        return;
    };
    env.cp
        .install_admission_policies(std::path::Path::new(
            kuport_realapi::CLASS_STATUS_POLICY_FILE,
        ))
        .await
        .expect("the shipped policies install");
    kuport_testkit::wait::eventually(
        "the policy refuses n1 writing n2's object",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { env.write_as_n1(object("n2", "n2", 1)).await.is_err() },
    )
    .await;
    let refused = |what: &str, r: Result<(), String>, says: &str| match r {
        Ok(()) => panic!("{what} must be refused"),
        Err(m) => assert!(
            m.contains(POLICY) && m.contains(says),
            "{what}: the refusal should name the policy and say {says:?}: {m}"
        ),
    };
    refused(
        "n1 writing n2's object",
        env.write_as_n1(object("n2", "n2", 1)).await,
        "node n1 may write only the PortMapNode named n1",
    );
    refused(
        "n1 putting a row of n2 in its own object",
        env.write_as_n1(object("n1", "n2", 1)).await,
        "node n1 may write only rows under its own name",
    );
    assert_eq!(
        env.write_as_n1(object("n1", "n1", 1)).await,
        Ok(()),
        "n1 creating its own object"
    );
    assert_eq!(
        env.write_as_n1(object("n1", "n1", 2)).await,
        Ok(()),
        "n1 replacing its own object"
    );

    // The control: without the binding the API server takes the forged write.
    Api::<ValidatingAdmissionPolicyBinding>::all(env.cp.admin_client().await.expect("admin"))
        .delete(POLICY, &DeleteParams::default())
        .await
        .expect("delete the binding");
    kuport_testkit::wait::eventually(
        "without the binding, n1's write of n2's object is taken",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { env.write_as_n1(object("n2", "n2", 1)).await.is_ok() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepting_node_linked_to_pods_on_5000_nodes_writes_its_row() {
    let test = "an_accepting_node_linked_to_pods_on_5000_nodes_writes_its_row";
    let Some(env) = Env::start(test).await else {
        return;
    };
    // A class status row stops at 512 link ends (`status.nodes[].links`: "must have at most
    // 512 items"); a node's own object takes every end, under the shipped policy too.
    env.cp
        .install_admission_policies(std::path::Path::new(
            kuport_realapi::CLASS_STATUS_POLICY_FILE,
        ))
        .await
        .expect("the shipped policies install");
    let big = object("n1", "n1", 5_000);
    let bytes = serde_json::to_vec(&big).expect("json").len();
    assert_eq!(
        env.write_as_n1(big).await,
        Ok(()),
        "5,000 ends ({bytes} bytes)"
    );
    let stored = env.admin.get("n1").await.expect("read back");
    assert_eq!(stored.spec.classes[0].row.links.len(), 5_000);
    // Past the schema's bound the write is refused whole, naming the bound.
    let mut beyond = object("n1", "n1", 8_193);
    beyond.metadata.resource_version = stored.metadata.resource_version;
    match env.n1.replace("n1", &PostParams::default(), &beyond).await {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422 && s.message.contains("must have at most 8192 items"),
            "the schema's refusal: {} {}",
            s.code,
            s.message
        ),
        other => panic!("8,193 ends must be refused by the schema: {other:?}"),
    }
}
