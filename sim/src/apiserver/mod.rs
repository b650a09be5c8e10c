//! A model of the Kubernetes API server subset kuport uses, served over HTTP.
//!
//! The model keeps objects as JSON in one store with a global, monotonically increasing
//! `resourceVersion` and a bounded history of changes (what watches resume from), and answers
//! the requests kube-rs and kubectl make: discovery, OpenAPI v3, get/list/watch, create,
//! replace, merge and JSON patch, delete, status subresources, Table printing. The kuport kinds
//! are admitted with the schemas, defaults and CEL rules of the CRDs `kuport-core` generates.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use kuport_sim::apiserver::ApiServer;
//! let server = ApiServer::builder().seed(7).history_limit(100).build()?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let url = format!("http://{}", listener.local_addr()?);
//! tokio::spawn(server.clone().serve(listener));
//! server.faults().fail_next(1, kuport_sim::apiserver::Failure::InternalError,
//!     kuport_sim::apiserver::RequestFilter::any());
//! # let _ = url; Ok(()) }
//! ```
//!
//! [`ApiServer::router`] gives the axum `Router`, so any listener (turmoil's simulated sockets
//! included) can drive the same service; [`ApiServer::serve`] runs it on anything implementing
//! axum's `Listener`.

mod catalog;
mod convert;
mod discovery;
mod error;
mod faults;
mod http;
mod jsonpath;
mod query;
mod resource;
mod response;
mod schema;
mod selector;
mod store;
mod table;
mod watches;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use tokio::sync::watch;

pub use error::{ApiError, BuildError, Cause};
pub use faults::{Failure, Faults, RequestFilter, SplitMix64};
pub use jsonpath::JsonPath;
pub use resource::Resource;
pub use table::human_duration;

use store::Store;

/// A source of "now" for `creationTimestamp`, deletion timestamps and Table ages, so a
/// simulation can run on its own clock.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// Settings of a model; see [`ApiServer::builder`].
pub struct ApiServerBuilder {
    seed: u64,
    history_limit: usize,
    bookmark_interval: Duration,
    clock: Option<Clock>,
}

impl std::fmt::Debug for ApiServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServerBuilder")
            .field("seed", &self.seed)
            .field("history_limit", &self.history_limit)
            .field("bookmark_interval", &self.bookmark_interval)
            .finish_non_exhaustive()
    }
}

impl ApiServerBuilder {
    /// Seed of every random choice (uids, generated names, fault placement). Default 0.
    pub fn seed(&mut self, seed: u64) -> &mut Self {
        self.seed = seed;
        self
    }

    /// How many changes the watch history keeps (default 1000). A watch or a paginated list
    /// from a version older than the history answers `410 Expired`, so clients relist.
    pub fn history_limit(&mut self, limit: usize) -> &mut Self {
        self.history_limit = limit;
        self
    }

    /// How often a watch with `allowWatchBookmarks=true` gets a bookmark (default 10 s).
    pub fn bookmark_interval(&mut self, interval: Duration) -> &mut Self {
        self.bookmark_interval = interval;
        self
    }

    /// The clock for timestamps and ages (default: the system clock).
    pub fn clock(&mut self, clock: Clock) -> &mut Self {
        self.clock = Some(clock);
        self
    }

    /// Builds the model with the `default`, `kube-system`, `kube-public` and `kube-node-lease`
    /// namespaces, as a fresh cluster has.
    pub fn build(&self) -> Result<ApiServer, BuildError> {
        if self.history_limit == 0 {
            return Err(BuildError::Setting {
                setting: "history_limit",
                what: "must be at least 1: a watch needs at least the latest change".to_owned(),
            });
        }
        if self.bookmark_interval.is_zero() {
            return Err(BuildError::Setting {
                setting: "bookmark_interval",
                what: "must be positive".to_owned(),
            });
        }
        let resources = catalog::all_resources()?;
        let clock = self
            .clock
            .clone()
            .unwrap_or_else(|| Arc::new(Timestamp::now));
        let inner = Inner {
            resources,
            store: Mutex::new(Store::new(self.seed, self.history_limit)),
            changes: watch::channel(0).0,
            // A different stream than the store's, so adding a fault never shifts the uids.
            faults: Faults::new(self.seed ^ 0xFA17_5EED_0000_0001),
            clock,
            bookmark_interval: self.bookmark_interval,
        };
        let server = ApiServer {
            inner: Arc::new(inner),
        };
        server.inner.create_default_namespaces()?;
        Ok(server)
    }
}

pub(crate) struct Inner {
    resources: Vec<Resource>,
    store: Mutex<Store>,
    /// Carries the latest `resourceVersion`; watches wait on it.
    changes: watch::Sender<u64>,
    faults: Faults,
    clock: Clock,
    bookmark_interval: Duration,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Store> {
        // Store updates are applied only after every check passed, in one step per object, so a
        // panic elsewhere cannot leave a half-written store behind a poisoned lock.
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// The current time as the API server writes timestamps: RFC 3339, whole seconds, UTC.
    fn now_string(&self) -> String {
        let now = self.now();
        Timestamp::from_second(now.as_second())
            .unwrap_or(now)
            .to_string()
    }

    /// The index the objects of `res` are stored under (another resource's for a view).
    fn storage(&self, res: usize) -> usize {
        self.resources[res].stored_as.unwrap_or(res)
    }

    /// A stored object as `res` serves it.
    fn view(&self, res: usize, stored: Arc<Value>) -> Arc<Value> {
        let r = &self.resources[res];
        if r.conversion.is_none() {
            return stored;
        }
        Arc::new(convert::to_view(r, &stored))
    }

    /// A body sent to `res`, as its storage resource keeps it.
    fn to_storage(&self, res: usize, body: Value) -> Value {
        let r = &self.resources[res];
        convert::to_storage(r, &self.resources[self.storage(res)], body)
    }

    fn find(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.group == group && r.version == version && r.plural == plural)
    }
}

/// The API server model. Cheap to clone: clones share the store and the fault handle.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("resource_version", &self.resource_version())
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// A builder with the defaults: seed 0, history of 1000 changes, bookmarks every 10 s,
    /// system clock.
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder {
            seed: 0,
            history_limit: 1000,
            bookmark_interval: Duration::from_secs(10),
            clock: None,
        }
    }

    /// The HTTP service as an axum `Router`, for any listener or a test harness.
    pub fn router(&self) -> axum::Router {
        axum::Router::new()
            .fallback(http::handle)
            .with_state(self.clone())
    }

    /// Serves HTTP/1.1 on `listener` until the task is dropped or the listener fails.
    pub async fn serve<L>(self, listener: L) -> std::io::Result<()>
    where
        L: axum::serve::Listener,
        L::Addr: std::fmt::Debug,
    {
        axum::serve(listener, self.router()).await
    }

    /// The fault hooks.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// The latest `resourceVersion`.
    pub fn resource_version(&self) -> u64 {
        self.inner.lock().resource_version()
    }

    /// Every served resource.
    pub fn resources(&self) -> &[Resource] {
        &self.inner.resources
    }

    /// A stored object, by `apiVersion`, plural, namespace (empty for cluster-scoped) and name:
    /// what a test inspects without going through HTTP.
    pub fn object(
        &self,
        api_version: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Value> {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let res = self.inner.find(group, version, plural)?;
        let ns = (!namespace.is_empty()).then_some(namespace);
        self.inner.get(res, ns, name).ok().map(|o| (*o).clone())
    }
}

/// A kubeconfig (JSON, which every kubeconfig reader accepts as YAML) for plain HTTP without
/// authentication, with one cluster, user and context named `kuport-sim`.
pub fn kubeconfig(server_url: &str) -> String {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kuport-sim", "cluster": {"server": server_url}}],
        "users": [{"name": "kuport-sim", "user": {}}],
        "contexts": [{"name": "kuport-sim", "context": {"cluster": "kuport-sim", "user": "kuport-sim"}}],
        "current-context": "kuport-sim",
        "preferences": {},
    });
    // Serialising a `Value` built from literals cannot fail; fall back to an empty document.
    serde_json::to_string_pretty(&config).unwrap_or_default()
}
