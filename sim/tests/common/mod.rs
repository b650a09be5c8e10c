//! Shared test setup: a model on a real TCP port and a kube-rs client for it.

#![allow(dead_code)]

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::Status;
use kuport_core::api::{PortMap, PortMapClass};
use kuport_sim::apiserver::{ApiServer, ApiServerBuilder};
use serde_json::{Value, json};

/// A running model with a client pointed at it. The server task ends with the test's runtime.
pub struct TestServer {
    pub server: ApiServer,
    pub client: kube::Client,
    pub url: String,
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
        server,
        client,
        url,
    }
}

pub async fn start() -> TestServer {
    start_with(&ApiServer::builder()).await
}

impl TestServer {
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
    dynamic(
        json!({"apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMap",
                   "metadata": {"name": name}, "spec": spec}),
    )
}

pub fn base_spec() -> Value {
    json!({"className": "public", "protocol": "UDP", "port": 3000, "endPort": 3009,
           "serviceRef": {"name": "gameserver", "port": "game"}})
}

pub fn class_doc(name: &str, spec: Value) -> DynamicObject {
    dynamic(
        json!({"apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMapClass",
                   "metadata": {"name": name}, "spec": spec}),
    )
}

pub fn class_spec() -> Value {
    json!({"nodes": {"worker-1": {"interfaces": ["eth0"]}}, "returnPath": {"mode": "Vxlan"}})
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
