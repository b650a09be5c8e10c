//! What the command-line tests against a live API server share: creating objects from JSON,
//! printing a run's output, and binding the RBAC examples of `docs/operations.md` (read from
//! the page itself, so the documented roles are the ones tested) to a ServiceAccount.

// Each test file is its own crate and uses only part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};
use kuport_testkit::cluster::typed;
use serde_json::{Value, json};

/// A run's exit code and output, for assertion messages.
pub fn said(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Creates `object` (JSON of a `kind`) through `api`; panics naming the kind on failure.
pub async fn create<K>(api: &Api<K>, object: Value, kind: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = typed(object, kind);
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {kind}: {e}"));
}

/// The YAML documents of the RBAC example in docs/operations.md after `<!-- marker -->`.
pub fn documented_rbac(marker: &str) -> Vec<Value> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md"),
    )
    .expect("docs/operations.md");
    let after = doc
        .split_once(&format!("<!-- {marker} -->\n```yaml\n"))
        .expect("the marked RBAC example")
        .1;
    let yaml = after.split_once("```").expect("the block ends").0;
    serde_saphyr::from_multiple::<Value>(yaml)
        .expect("the example is YAML")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// Creates each role of `docs` and binds it to the ServiceAccount `namespace/name`.
pub async fn bind(admin: &kube::Client, docs: Vec<Value>, namespace: &str, name: &str) {
    let subject = json!([{"kind": "ServiceAccount", "namespace": namespace, "name": name}]);
    for doc in docs {
        let role = doc["metadata"]["name"].clone();
        let role_ref =
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": doc["kind"], "name": role});
        let binding = json!({"metadata": {"name": role}, "roleRef": role_ref, "subjects": subject});
        match doc["kind"].as_str() {
            Some("ClusterRole") => {
                create(&Api::<ClusterRole>::all(admin.clone()), doc, "ClusterRole").await;
                let bindings = Api::<ClusterRoleBinding>::all(admin.clone());
                create(&bindings, binding, "ClusterRoleBinding").await;
            }
            Some("Role") => {
                let ns = doc["metadata"]["namespace"]
                    .as_str()
                    .expect("a namespace")
                    .to_owned();
                create(&Api::<Role>::namespaced(admin.clone(), &ns), doc, "Role").await;
                let bindings = Api::<RoleBinding>::namespaced(admin.clone(), &ns);
                create(&bindings, binding, "RoleBinding").await;
            }
            other => panic!("unexpected kind {other:?} in the documented RBAC"),
        }
    }
}

/// Starts the API server model on a loopback port, writes a kubeconfig for it into `dir`, and
/// returns that file and a client of the model.
pub async fn serve_model(dir: &Path) -> (PathBuf, kube::Client) {
    let server = kuport_sim::apiserver::ApiServer::builder()
        .build()
        .expect("model builds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(server.serve(listener));
    let path = dir.join("kubeconfig");
    std::fs::write(&path, kuport_sim::apiserver::kubeconfig(&url)).expect("kubeconfig");
    let client =
        kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
    (path, client)
}
