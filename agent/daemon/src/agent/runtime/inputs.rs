//! The pass's inputs: one watch (a kube reflector) per kind a pass reads, each keeping a store
//! and marking the node dirty on a change a pass reads (`relevance.rs`); and the snapshot a pass
//! takes of the stores. EndpointSlices have a watch of their own (`slices.rs`), which keeps only
//! the slices of the Services the PortMaps refer to.

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kuport_core::api::{PortMap, PortMapClass, PortMapNode};
use kuport_core::snapshot::{CILIUM_CONFIG, CniFacts, Snapshot};
use tokio::task::JoinHandle;

use super::AgentError;
use super::config::jitter_seed_for;
use super::slices::{self, Slices};
use super::watch::{LIST_PAGE_SIZE, Watch, passes, watch_backoff};
use crate::agent::relevance::PassInput;
use crate::agent::trim::Trim;

/// The watched kinds, declared once: each becomes a store in `Inputs`, a reflector started by
/// `start_inputs`, a wait in `wait_synced` and a list in the pass's [`Snapshot`] (the field
/// named after `=>`). Adding a kind is one line here, one field in `Snapshot` and a `PassInput`
/// impl saying which of its changes a pass reads. The EndpointSlices are not one of them: their
/// watch keeps only what the PortMaps refer to (`slices.rs`).
macro_rules! watched_kinds {
    (slices follow $portmaps:ident; $($field:ident: $kind:ty => $snapshot:ident;)*) => {
        /// The watched objects.
        pub(super) struct Inputs {
            $(pub(super) $field: Store<$kind>,)*
            /// The EndpointSlices of the Services the PortMaps refer to.
            pub(super) slices: Slices,
            /// `kube-system/cilium-config`, watched by name: at most one object.
            cni: Store<ConfigMap>,
            /// The classes again, untyped: the status writer merges into them, keeping what of
            /// the status this version does not know (`raw_classes`).
            pub(super) raw_classes: Store<DynamicObject>,
            tasks: Vec<JoinHandle<()>>,
        }

        pub(super) fn start_inputs(client: &kube::Client, watch: &Watch) -> Inputs {
            let mut tasks = Vec::new();
            $(
                let ($field, task) = reflect::<$kind>(
                    Api::all(client.clone()),
                    <$kind as PassInput>::watch_config(&watch.node),
                    watch,
                    stringify!($kind),
                );
                tasks.push(task);
            )*
            let (ns, name) = CILIUM_CONFIG;
            let (cni, task) = reflect::<ConfigMap>(
                Api::namespaced(client.clone(), ns),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
                watch,
                "ConfigMap",
            );
            tasks.push(task);
            let (raw_classes, task) = raw_classes(client, watch);
            tasks.push(task);
            let (slices, task) = slices::start(client, watch, $portmaps.clone());
            tasks.push(task);
            Inputs { $($field,)* slices, cni, raw_classes, tasks }
        }

        /// Waits until every watch has listed once: the slice watch lists only once the PortMap
        /// watch has. Each store is waited on by this task alone (see `Slices::portmaps_synced`).
        pub(super) async fn wait_synced(inputs: &Inputs) -> Result<(), AgentError> {
            $(
                inputs
                    .$field
                    .wait_until_ready()
                    .await
                    .map_err(|_| AgentError::WatchEnded(stringify!($kind)))?;
            )*
            // The PortMaps are known (waited for above): the slice watch may list.
            inputs.slices.portmaps_synced();
            inputs
                .slices
                .store
                .wait_until_ready()
                .await
                .map_err(|_| AgentError::WatchEnded("EndpointSlice"))?;
            inputs
                .cni
                .wait_until_ready()
                .await
                .map_err(|_| AgentError::WatchEnded("ConfigMap"))?;
            Ok(())
        }

        impl Inputs {
            /// Every watched object of the kinds above (no slice yet), each kind sorted by
            /// namespace and name; objects `previous` (the last snapshot) holds at the version
            /// the store holds are moved from it, the others copied from the store. Returns the
            /// previous snapshot's slices beside it.
            fn snapshot_of_kinds(&self, previous: Snapshot) -> (Snapshot, Vec<EndpointSlice>) {
                let snapshot = Snapshot {
                    $($snapshot: refresh(&self.$field, previous.$snapshot),)*
                    endpoint_slices: Vec::new(),
                    cni: self.cni.state().first().map(|cm| CniFacts::from_cilium_config(cm)),
                    // The Service watch lists every Service, and the Pod watch every Pod
                    // bound to this node.
                    services_listed: true,
                    pods_listed: true,
                };
                (snapshot, previous.endpoint_slices)
            }
        }
    };
}

watched_kinds! {
    slices follow portmaps;
    classes: PortMapClass => classes;
    portmap_nodes: PortMapNode => portmap_nodes;
    portmaps: PortMap => portmaps;
    nodes: Node => nodes;
    namespaces: Namespace => namespaces;
    services: Service => services;
    pods: Pod => pods;
}

impl Inputs {
    /// Every watched object (see `snapshot_of_kinds`), and the EndpointSlices of every Service
    /// its PortMaps refer to: the slices of a Service they came to refer to are fetched first,
    /// waiting up to `wait` (`Slices::follow`).
    pub(super) async fn snapshot(&self, previous: Snapshot, wait: Duration) -> Snapshot {
        let (mut snapshot, slices) = self.snapshot_of_kinds(previous);
        self.slices.follow(&snapshot.portmaps, wait).await;
        snapshot.endpoint_slices = refresh(&self.slices.store, slices);
        snapshot
    }
}

/// A store's objects sorted by namespace and name (a store lists in hash order, which must not
/// reach the plan, nor make a simulated run differ), taking each from `previous` (sorted the
/// same way) when it holds the object at the same `resourceVersion` (the API server gives every
/// change a new one), and copying it from the store otherwise. A pass after one event then
/// copies one object instead of every object of every store.
fn refresh<K>(store: &Store<K>, previous: Vec<K>) -> Vec<K>
where
    K: Clone + kube::Resource<DynamicType = ()> + 'static,
{
    fn key<K: kube::Resource>(o: &K) -> (Option<&str>, Option<&str>) {
        (o.meta().namespace.as_deref(), o.meta().name.as_deref())
    }
    let mut current = store.state();
    current.sort_by(|a, b| key(a.as_ref()).cmp(&key(b.as_ref())));
    let mut previous = previous.into_iter().peekable();
    current
        .iter()
        .map(|o| {
            let o = o.as_ref();
            while previous.next_if(|p| key(p) < key(o)).is_some() {}
            let version = o.meta().resource_version.as_deref();
            previous
                .next_if(|p| {
                    key(p) == key(o)
                        && version.is_some()
                        && p.meta().resource_version.as_deref() == version
                })
                .unwrap_or_else(|| o.clone())
        })
        .collect()
}

impl Drop for Inputs {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A reflector for one kind: a store kept up to date by a watch that retries with backoff
/// (an API outage leaves the store as it was), marking the node dirty on every change that can
/// change a pass (`relevance`).
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    watch: &Watch,
    kind: &'static str,
) -> (Store<K>, JoinHandle<()>)
where
    K: PassInput + Trim + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (reader, mut writer) = reflector::store();
    let stream = watcher(api, config.page_size(LIST_PAGE_SIZE))
        .backoff(watch_backoff(watch.jitter_seed ^ jitter_seed_for(kind)))
        // Only what a pass reads is kept (`trim.rs`): annotations, managed fields and the
        // rest would otherwise stay in memory for as long as the agent runs.
        .modify(K::trim);
    let store = reader.clone();
    let Watch {
        dirty,
        wanted,
        metrics,
        ..
    } = watch.clone();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!("watching {kind}: {e}");
                    continue;
                }
            };
            let passes = passes(&event, &store, &wanted);
            writer.apply_watcher_event(&event);
            metrics.record_watch_event(kind, passes);
            if passes {
                // Full means a pass is already due.
                let _ = dirty.try_send(());
            }
        }
    });
    (reader, task)
}

/// The classes as the API server holds them, status fields this version does not know
/// included: a class status write merges this node's part into the stored object, and a
/// typed copy would drop what a newer agent wrote (`decisions.md`, version skew). Watched
/// rather than read before each write, so a write is one request, not a read and a write.
/// It never marks the node dirty: the typed watch of the same objects does. Only managed
/// fields are dropped (a status write sends the object back, and classes are few).
fn raw_classes(client: &kube::Client, watch: &Watch) -> (Store<DynamicObject>, JoinHandle<()>) {
    let resource = ApiResource::erase::<PortMapClass>(&());
    let mut writer = reflector::store::Writer::new(resource.clone());
    let reader = writer.as_reader();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let stream = watcher(api, watcher::Config::default().page_size(LIST_PAGE_SIZE))
        .backoff(watch_backoff(
            watch.jitter_seed ^ jitter_seed_for("PortMapClass/raw"),
        ))
        .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => writer.apply_watcher_event(&event),
                Err(e) => tracing::warn!("watching PortMapClass (untyped): {e}"),
            }
        }
    });
    (reader, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_map(namespace: &str, name: &str, version: &str, marker: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some(namespace.to_owned());
        cm.metadata.name = Some(name.to_owned());
        cm.metadata.resource_version = Some(version.to_owned());
        cm.data = Some([("from".to_owned(), marker.to_owned())].into());
        cm
    }

    fn marker(cm: &ConfigMap) -> (&str, &str, &str) {
        (
            cm.metadata.name.as_deref().unwrap_or_default(),
            cm.metadata.resource_version.as_deref().unwrap_or_default(),
            cm.data
                .as_ref()
                .and_then(|d| d.get("from"))
                .map_or("", String::as_str),
        )
    }

    #[test]
    fn unchanged_objects_are_taken_from_the_previous_snapshot_and_the_rest_copied() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        for cm in [
            config_map("a", "same", "1", "store"),
            config_map("a", "changed", "5", "store"),
            config_map("a", "new", "7", "store"),
            config_map("b", "same", "2", "store"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(cm));
        }
        // The marker tells where each object came from: at one version the API server's
        // objects are the same, so only the test can tell them apart.
        let previous = vec![
            config_map("a", "changed", "4", "previous"),
            config_map("a", "gone", "3", "previous"),
            config_map("a", "same", "1", "previous"),
            config_map("b", "same", "2", "previous"),
        ];
        let refreshed = refresh(&store, previous);
        let got: Vec<_> = refreshed.iter().map(marker).collect();
        assert_eq!(
            got,
            [
                ("changed", "5", "store"),
                ("new", "7", "store"),
                ("same", "1", "previous"),
                ("same", "2", "previous"),
            ]
        );
        assert_eq!(
            refreshed[3].metadata.namespace.as_deref(),
            Some("b"),
            "sorted by namespace, then name"
        );
    }

    #[test]
    fn an_object_without_a_version_is_always_copied() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let mut cm = config_map("a", "x", "1", "store");
        cm.metadata.resource_version = None;
        writer.apply_watcher_event(&watcher::Event::Apply(cm.clone()));
        let mut old = cm;
        old.data = Some([("from".to_owned(), "previous".to_owned())].into());
        let refreshed = refresh(&store, vec![old]);
        assert_eq!(marker(&refreshed[0]).2, "store");
    }
}
