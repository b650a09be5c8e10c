//! Shared test setup: a model on a real TCP port and a kube-rs client for it.

#![allow(dead_code)]

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::Status;
use kuport_core::api::{PortMap, PortMapClass};
use kuport_sim::apiserver::{ApiServer, ApiServerBuilder};
use kuport_testkit::objects::{class, kuport_object, vxlan_spec};
use serde_json::{Value, json};

/// Which API server a shared test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The model in `kuport_sim::apiserver`, in process.
    Model,
    /// A real etcd and kube-apiserver with the shipped CRDs installed (`kuport-realapi`).
    Real,
}

/// A running API server with an admin client pointed at it. The model's task ends with the
/// test's runtime; a real control plane is stopped when this is dropped.
pub struct TestServer {
    model: Option<ApiServer>,
    pub client: kube::Client,
    pub url: String,
    kubeconfig: Option<tempfile::NamedTempFile>,
    real: Option<kuport_realapi::ControlPlane>,
}

pub async fn start_with(builder: &ApiServerBuilder) -> TestServer {
    let server = builder.build().expect("model builds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a free port");
    let url = format!("http://{}", listener.local_addr().expect("local addr"));
    tokio::spawn(server.clone().serve(listener));
    let config = kube::Config::new(url.parse().expect("url parses"));
    let client = kube::Client::try_from(config).expect("client builds");
    TestServer {
        model: Some(server),
        client,
        url,
        kubeconfig: None,
        real: None,
    }
}

pub async fn start() -> TestServer {
    start_with(&ApiServer::builder()).await
}

/// Starts `target` for the shared test `test`, or `None` (after one line) when the real
/// control plane is not built and not required. `controllers` are the kube-controller-manager
/// controllers the test needs on a real server (the model does their work itself).
pub async fn start_on(target: Target, test: &str, controllers: &[&str]) -> Option<TestServer> {
    match target {
        Target::Model => Some(start().await),
        Target::Real => {
            let options = kuport_realapi::Options {
                controllers: controllers.iter().map(|c| (*c).to_owned()).collect(),
                ..Default::default()
            };
            let cp = kuport_realapi::ControlPlane::start_or_skip(test, options).await?;
            cp.install_crds(std::path::Path::new(kuport_realapi::CRD_DIR))
                .await
                .expect("the shipped CRDs install and become Established");
            let client = cp.admin_client().await.expect("admin client");
            Some(TestServer {
                model: None,
                client,
                url: cp.url().to_owned(),
                kubeconfig: None,
                real: Some(cp),
            })
        }
    }
}

/// Declares `model` and `real` tests in a module named after each shared test function, which
/// takes the [`Target`]. Test files declare `#[macro_use] mod common;`.
#[allow(unused_macros)]
macro_rules! on_both_servers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn model() {
                super::$name(crate::common::Target::Model).await;
            }
            #[tokio::test]
            async fn real() {
                super::$name(crate::common::Target::Real).await;
            }
        }
    )*};
}

impl TestServer {
    /// The model behind this server; panics on a real server (model-only tests use `start`).
    pub fn model(&self) -> &ApiServer {
        self.model
            .as_ref()
            .expect("a model-only check ran against the real server")
    }

    /// Whether this is the real control plane.
    pub fn is_real(&self) -> bool {
        self.real.is_some()
    }

    /// A kubeconfig file for kubectl: the real control plane's admin one, or one written for
    /// the model's URL.
    pub fn kubeconfig(&mut self) -> std::path::PathBuf {
        if let Some(cp) = &self.real {
            return cp.kubeconfig().to_path_buf();
        }
        let file = self.kubeconfig.get_or_insert_with(|| {
            let file = tempfile::NamedTempFile::new().expect("kubeconfig file");
            std::fs::write(file.path(), kuport_sim::apiserver::kubeconfig(&self.url))
                .expect("kubeconfig written");
            file
        });
        file.path().to_path_buf()
    }

    /// An untyped API for PortMaps in a namespace: lets tests send what the Rust type cannot
    /// (out-of-range ports, missing fields, unknown enum values).
    pub fn raw_portmaps(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &ApiResource::erase::<PortMap>(&()))
    }

    pub fn raw_classes(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &ApiResource::erase::<PortMapClass>(&()),
        )
    }

    pub async fn namespace(&self, name: &str) {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let ns = serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
        api.create(&PostParams::default(), &ns)
            .await
            .expect("namespace created");
    }
}

/// A DynamicObject from a JSON document.
pub fn dynamic(doc: Value) -> DynamicObject {
    serde_json::from_value(doc).expect("a Kubernetes object")
}

pub fn portmap_doc(name: &str, spec: Value) -> DynamicObject {
    dynamic(kuport_object("PortMap", json!({"name": name}), spec))
}

pub fn class_doc(name: &str, spec: Value) -> DynamicObject {
    dynamic(class(name, spec).object())
}

pub fn class_spec() -> Value {
    vxlan_spec(&[("worker-1", &["eth0"])])
}

/// The `Status` of a failed request; panics with the result when it did not fail that way.
pub fn api_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The fields the causes of an Invalid error name.
pub fn cause_fields(status: &Status) -> Vec<String> {
    status
        .details
        .as_ref()
        .map(|d| d.causes.iter().map(|c| c.field.clone()).collect())
        .unwrap_or_default()
}
