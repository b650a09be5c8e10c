//! What a stopping agent does with the datapath it programmed.
//!
//! A plain stop (a rolling update, a restarted pod, a drained or rebooting node) keeps it: the
//! next agent adopts the kernel state and reconciles it, so mapped ports keep answering while
//! the agent is replaced. The datapath is removed only when kuport is being removed from the
//! node: the DaemonSet that owns the agent's Pod is being deleted or is gone, its namespace is
//! being deleted, or the agent's access was revoked with the rest of the install (403). An API
//! server that cannot be asked never causes a teardown; `kuport cleanup` removes the datapath by
//! hand.
//!
//! A 401 is not a revocation: it says the agent's own credentials are no longer accepted, and
//! that happens to an agent whose Pod was force-deleted (its pod-bound token dies with the Pod)
//! while the DaemonSet's replacement for it is starting on the same node. Tearing down then
//! would remove what the new agent is adopting. So only a positive sign that kuport is going
//! removes the datapath: one read at stop, or one the agent saw while it ran, through a watch
//! of its own DaemonSet and namespace started once it knew them ([`watch_removal`]). An
//! uninstall usually deletes the ServiceAccount within moments of the DaemonSet, so by the time
//! the Pod is stopped the reads at stop are often answered 401; the watch saw the deletion
//! before that.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::task::JoinHandle;

use super::health::Health;

/// How the agent decides what to do with the datapath when it stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopPolicy {
    /// Keep it: the next agent adopts it (an agent outside a DaemonSet: the lab, a node debugged
    /// by hand; remove the datapath with `kuport cleanup`).
    Keep,
    /// Remove it at every stop.
    Teardown,
    /// Read the agent's own Pod and the DaemonSet owning it, and remove the datapath only when
    /// kuport is being removed.
    Owner {
        /// The Pod's name (`POD_NAME`).
        pod: String,
        /// The Pod's namespace (`POD_NAMESPACE`).
        namespace: String,
    },
}

/// The decision, with the reason logged beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopAction {
    /// Leave the datapath for the next agent.
    Keep(String),
    /// Remove everything kuport programmed on the node.
    Teardown(String),
}

/// The DaemonSet named by a Pod's controller owner reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// Its namespace (the Pod's).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID, as the owner reference records it.
    pub uid: String,
}

/// The answer to one read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup<T> {
    /// Not asked (nothing to ask about).
    NotAsked,
    /// The object, as far as the decision needs it.
    Found(T),
    /// 404.
    NotFound,
    /// 403: the agent's credentials are accepted, but it may not read this (any more).
    Denied,
    /// 401: the agent's credentials are not accepted (its token's Pod or ServiceAccount is
    /// gone, or the token expired): nothing is known about the object.
    Unauthorized,
    /// Any other error or no answer in time.
    Failed(String),
}

/// An object's identity and whether it is being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Present {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
}

/// What the agent found out at stop, and what it had learnt at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopFacts {
    /// The owning DaemonSet as read at start, when the Pod could be read then. Having read it
    /// also proves the agent had the access it now may have lost.
    pub owner_at_start: Option<Owner>,
    /// The Pod's owning DaemonSet as read now (`Found(None)`: the Pod has no DaemonSet owner).
    pub pod: Lookup<Option<Owner>>,
    /// The owning DaemonSet now.
    pub daemonset: Lookup<Present>,
    /// The Pod's namespace now.
    pub namespace: Lookup<Present>,
    /// A sign of removal the watches saw while the agent ran (its DaemonSet deleted or being
    /// deleted, its namespace being deleted), in words; `None` when they saw none.
    pub seen_removal: Option<String>,
}

/// The decision for a stop, from what was found out (see the module documentation).
pub fn decide(facts: &StopFacts) -> StopAction {
    let owner = match &facts.pod {
        Lookup::Found(Some(owner)) => Some(owner),
        Lookup::Found(None) => {
            return StopAction::Keep("the agent's Pod has no DaemonSet owner".to_owned());
        }
        _ => facts.owner_at_start.as_ref(),
    };
    let Some(owner) = owner else {
        return StopAction::Keep(match &facts.pod {
            Lookup::Failed(e) => format!("could not read the agent's own Pod: {e}"),
            Lookup::Denied => "may not read the agent's own Pod (grant get on pods and \
                               daemonsets in its namespace to let an uninstall clean the node)"
                .to_owned(),
            _ => "the agent's own Pod and its DaemonSet are unknown".to_owned(),
        });
    };
    let ds = format!("DaemonSet {}/{}", owner.namespace, owner.name);
    // Access that worked at start and is refused now was revoked: the install's RBAC is being
    // deleted with the rest of it.
    let had_access = facts.owner_at_start.is_some();
    match &facts.namespace {
        Lookup::Found(ns) if ns.deleting => {
            return StopAction::Teardown(format!("namespace {} is being deleted", owner.namespace));
        }
        Lookup::NotFound => {
            return StopAction::Teardown(format!("namespace {} is gone", owner.namespace));
        }
        _ => {}
    }
    match &facts.daemonset {
        Lookup::NotFound => StopAction::Teardown(format!("{ds} is gone")),
        Lookup::Found(present) if present.uid != owner.uid => StopAction::Keep(format!(
            "{ds} was replaced by a new one (uid {}), whose agent adopts the datapath",
            present.uid
        )),
        Lookup::Found(present) if present.deleting => {
            StopAction::Teardown(format!("{ds} is being deleted"))
        }
        Lookup::Found(_) => StopAction::Keep(format!(
            "{ds} is still there: the next agent adopts the datapath"
        )),
        Lookup::Denied if had_access => StopAction::Teardown(format!(
            "the agent may no longer read {ds}: its access is being removed with kuport"
        )),
        // Nothing read now says anything: what the watches saw decides.
        _ if facts.seen_removal.is_some() => {
            StopAction::Teardown(facts.seen_removal.clone().unwrap_or_default())
        }
        Lookup::Denied => StopAction::Keep(format!("may not read {ds}")),
        Lookup::Unauthorized => StopAction::Keep(format!(
            "the API server no longer accepts the agent's credentials (401), so whether {ds} \
             is still there cannot be read: its Pod may have been force-deleted while its \
             replacement starts; if kuport is being removed, run `kuport cleanup` on the node"
        )),
        Lookup::Failed(e) => StopAction::Keep(format!(
            "could not read {ds} ({e}); if kuport is being removed, run `kuport cleanup` on the node"
        )),
        Lookup::NotAsked => StopAction::Keep(format!("{ds} was not read")),
    }
}

fn present(meta: &ObjectMeta) -> Present {
    Present {
        uid: meta.uid.clone().unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
    }
}

/// The controller owner reference of kind DaemonSet (apps/v1) of `pod`.
pub fn daemonset_owner(pod: &Pod) -> Option<Owner> {
    let namespace = pod.metadata.namespace.clone()?;
    pod.metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.kind == "DaemonSet" && r.api_version == "apps/v1" && r.controller == Some(true))
        .map(|r| Owner {
            namespace,
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
}

async fn lookup<K, T>(
    api: Api<K>,
    name: &str,
    timeout: Duration,
    f: impl FnOnce(K) -> T,
) -> Lookup<T>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match tokio::time::timeout(timeout, api.get(name)).await {
        Ok(Ok(object)) => Lookup::Found(f(object)),
        Ok(Err(kube::Error::Api(s))) if s.is_not_found() => Lookup::NotFound,
        Ok(Err(kube::Error::Api(s))) if s.code == 401 => Lookup::Unauthorized,
        Ok(Err(kube::Error::Api(s))) if s.code == 403 => Lookup::Denied,
        Ok(Err(e)) => Lookup::Failed(e.to_string()),
        Err(_) => Lookup::Failed(format!("no answer within {timeout:?}")),
    }
}

/// Reads the Pod's owning DaemonSet (at start).
pub async fn read_owner(
    client: &kube::Client,
    pod: &str,
    namespace: &str,
    timeout: Duration,
) -> Lookup<Option<Owner>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    lookup(pods, pod, timeout, |p| daemonset_owner(&p)).await
}

/// Finds out what [`decide`] needs, each read bounded by `timeout`; `seen_removal` is what the
/// watches saw ([`RemovalWatch::seen`]).
pub async fn gather(
    client: &kube::Client,
    pod: &str,
    namespace: &str,
    owner_at_start: Option<Owner>,
    seen_removal: Option<String>,
    timeout: Duration,
) -> StopFacts {
    let pod = read_owner(client, pod, namespace, timeout).await;
    let owner = match &pod {
        Lookup::Found(Some(o)) => Some(o.clone()),
        Lookup::Found(None) => None,
        _ => owner_at_start.clone(),
    };
    let (daemonset, namespace) = match owner {
        Some(owner) => {
            let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &owner.namespace);
            let namespaces: Api<Namespace> = Api::all(client.clone());
            (
                lookup(daemonsets, &owner.name, timeout, |d| present(&d.metadata)).await,
                lookup(namespaces, &owner.namespace, timeout, |n| {
                    present(&n.metadata)
                })
                .await,
            )
        }
        None => (Lookup::NotAsked, Lookup::NotAsked),
    };
    StopFacts {
        owner_at_start,
        pod,
        daemonset,
        namespace,
        seen_removal,
    }
}

/// Watches the agent's own DaemonSet and namespace while it runs, remembering the first sign of
/// removal: the DaemonSet (of the uid the Pod names) deleted or being deleted, or the namespace
/// being deleted or gone. Stops watching when dropped.
#[derive(Debug)]
pub struct RemovalWatch {
    seen: Arc<Mutex<Option<String>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RemovalWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl RemovalWatch {
    /// The first sign of removal seen, in words.
    pub fn seen(&self) -> Option<String> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Starts the watches of [`RemovalWatch`] for `owner`. Each watches one object by name (a
/// `metadata.name` field selector), which the agent's Role allows for its DaemonSet.
pub fn watch_removal(client: &kube::Client, owner: &Owner, health: &Health) -> RemovalWatch {
    let seen = Arc::new(Mutex::new(None));
    // Both watches must have listed once before a removal is sure to be seen.
    let listing = Arc::new(AtomicUsize::new(2));
    let progress = WatchProgress {
        seen: seen.clone(),
        listing,
        health: health.clone(),
    };
    let ds = format!("DaemonSet {}/{}", owner.namespace, owner.name);
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &owner.namespace);
    let uid = owner.uid.clone();
    let ds_task = spawn_watch(daemonsets, &owner.name, progress.clone(), move |event| {
        let (meta, deleted) = match event {
            watcher::Event::Apply(d) | watcher::Event::InitApply(d) => (&d.metadata, false),
            watcher::Event::Delete(d) => (&d.metadata, true),
            _ => return None,
        };
        if meta.uid.as_deref() != Some(uid.as_str()) {
            // Another DaemonSet of the same name (a reinstall) adopts the datapath.
            return None;
        }
        if deleted {
            Some(format!("{ds} was deleted"))
        } else {
            meta.deletion_timestamp
                .is_some()
                .then(|| format!("{ds} is being deleted"))
        }
    });
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = owner.namespace.clone();
    let ns_task = spawn_watch(
        namespaces,
        &owner.namespace,
        progress,
        move |event| match event {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n)
                if n.metadata.deletion_timestamp.is_some() =>
            {
                Some(format!("namespace {ns} is being deleted"))
            }
            watcher::Event::Delete(_) => Some(format!("namespace {ns} was deleted")),
            _ => None,
        },
    );
    RemovalWatch {
        seen,
        tasks: vec![ds_task, ns_task],
    }
}

/// Watches the object `name` of `api`, recording the first sign `judge` reads in an event.
/// Errors are retried with kube's default backoff (a 401 keeps failing: the sign seen so far
/// stays).
fn spawn_watch<K>(
    api: Api<K>,
    name: &str,
    progress: WatchProgress,
    judge: impl Fn(&watcher::Event<K>) -> Option<String> + Send + 'static,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api, config).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut listed = false;
        while let Some(event) = stream.next().await {
            let Ok(event) = event else { continue };
            if let Some(sign) = judge(&event) {
                progress.saw(sign);
            }
            if matches!(event, watcher::Event::InitDone) && !listed {
                listed = true;
                progress.listed();
            }
        }
    })
}

/// What the removal watches share: the first sign seen, how many have yet to list once, and the
/// agent's health, which reports both.
#[derive(Clone)]
struct WatchProgress {
    seen: Arc<Mutex<Option<String>>>,
    listing: Arc<AtomicUsize>,
    health: Health,
}

impl WatchProgress {
    fn saw(&self, sign: String) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.is_none() {
            tracing::info!("{sign}: this agent will remove the datapath when it stops");
            *seen = Some(sign);
            self.health.set_removal_seen();
        }
    }

    fn listed(&self) {
        if self.listing.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.health.set_watching_removal();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(uid: &str) -> Owner {
        Owner {
            namespace: "kuport-system".into(),
            name: "kuport-agent".into(),
            uid: uid.into(),
        }
    }

    fn live(uid: &str) -> Lookup<Present> {
        Lookup::Found(Present {
            uid: uid.into(),
            deleting: false,
        })
    }

    fn deleting(uid: &str) -> Lookup<Present> {
        Lookup::Found(Present {
            uid: uid.into(),
            deleting: true,
        })
    }

    /// A rolling update: Pod, DaemonSet and namespace all there.
    fn update() -> StopFacts {
        StopFacts {
            owner_at_start: Some(owner("u1")),
            pod: Lookup::Found(Some(owner("u1"))),
            daemonset: live("u1"),
            namespace: live("ns"),
            seen_removal: None,
        }
    }

    fn keeps(facts: &StopFacts) -> bool {
        matches!(decide(facts), StopAction::Keep(_))
    }

    #[test]
    fn an_update_or_restart_keeps_the_datapath() {
        assert!(keeps(&update()));
        // The Pod itself being deleted is what every stop looks like; it decides nothing.
        let replaced = StopFacts {
            daemonset: live("u2"),
            ..update()
        };
        assert!(
            keeps(&replaced),
            "a DaemonSet recreated under the same name"
        );
    }

    #[test]
    fn a_deleted_or_deleting_daemonset_tears_down() {
        let gone = StopFacts {
            daemonset: Lookup::NotFound,
            ..update()
        };
        assert_eq!(
            decide(&gone),
            StopAction::Teardown("DaemonSet kuport-system/kuport-agent is gone".into())
        );
        let foreground = StopFacts {
            daemonset: deleting("u1"),
            ..update()
        };
        assert!(!keeps(&foreground));
        // Deleting the namespace deletes the DaemonSet with it.
        let namespace = StopFacts {
            namespace: deleting("ns"),
            ..update()
        };
        assert!(!keeps(&namespace));
        let namespace_gone = StopFacts {
            namespace: Lookup::NotFound,
            daemonset: Lookup::Denied,
            ..update()
        };
        assert!(!keeps(&namespace_gone));
    }

    #[test]
    fn access_revoked_after_start_means_the_install_is_going() {
        // `kubectl delete -f kuport.yaml` removes the Roles and the ServiceAccount around the
        // same time as the DaemonSet: the Pod read is refused now, but was allowed at start.
        let revoked = StopFacts {
            pod: Lookup::Denied,
            daemonset: Lookup::Denied,
            namespace: Lookup::Denied,
            ..update()
        };
        assert!(!keeps(&revoked));
        // Never allowed: nothing is known about the owner, so nothing is removed.
        let never = StopFacts {
            owner_at_start: None,
            ..revoked.clone()
        };
        assert!(keeps(&never));
    }

    #[test]
    fn an_api_server_that_cannot_be_asked_never_tears_down() {
        fn failed<T>(s: &str) -> Lookup<T> {
            Lookup::Failed(s.to_owned())
        }
        for facts in [
            StopFacts {
                pod: failed("connection refused"),
                daemonset: failed("connection refused"),
                namespace: failed("connection refused"),
                ..update()
            },
            StopFacts {
                owner_at_start: None,
                pod: failed("timeout"),
                daemonset: Lookup::NotAsked,
                namespace: Lookup::NotAsked,
                seen_removal: None,
            },
            StopFacts {
                daemonset: failed("503"),
                ..update()
            },
        ] {
            assert!(keeps(&facts), "{facts:?}");
        }
        let StopAction::Keep(reason) = decide(&StopFacts {
            daemonset: Lookup::Failed("503".into()),
            ..update()
        }) else {
            panic!("kept")
        };
        assert!(reason.contains("kuport cleanup"), "{reason}");
    }

    #[test]
    fn credentials_refused_at_stop_keep_the_datapath() {
        // A force-deleted agent Pod: its pod-bound token dies with it, every read at stop is
        // answered 401, and the DaemonSet's next Pod is already starting on this node.
        let force_deleted = StopFacts {
            pod: Lookup::Unauthorized,
            daemonset: Lookup::Unauthorized,
            namespace: Lookup::Unauthorized,
            ..update()
        };
        let StopAction::Keep(reason) = decide(&force_deleted) else {
            panic!("a 401 tore the datapath down")
        };
        assert!(
            reason.contains("401") && reason.contains("kuport cleanup"),
            "{reason}"
        );
        // Some reads answered, the DaemonSet's refused: the same.
        let partly = StopFacts {
            daemonset: Lookup::Unauthorized,
            ..update()
        };
        assert!(keeps(&partly));
    }

    #[test]
    fn a_removal_the_watches_saw_decides_when_the_reads_at_stop_cannot() {
        // An uninstall deleted the DaemonSet, then the ServiceAccount: the reads at stop are
        // answered 401, but the watch saw the DaemonSet go.
        let uninstalled = StopFacts {
            pod: Lookup::Unauthorized,
            daemonset: Lookup::Unauthorized,
            namespace: Lookup::Unauthorized,
            seen_removal: Some("DaemonSet kuport-system/kuport-agent was deleted".into()),
            ..update()
        };
        assert_eq!(
            decide(&uninstalled),
            StopAction::Teardown("DaemonSet kuport-system/kuport-agent was deleted".into())
        );
        let unreachable = StopFacts {
            daemonset: Lookup::Failed("connection refused".into()),
            ..uninstalled.clone()
        };
        assert!(!keeps(&unreachable));
        // A read at stop that answers wins over what was seen: a DaemonSet recreated under the
        // same name (a reinstall) adopts the datapath.
        let reinstalled = StopFacts {
            pod: Lookup::Found(Some(owner("u1"))),
            daemonset: live("u2"),
            namespace: live("ns"),
            ..uninstalled
        };
        assert!(keeps(&reinstalled));
    }

    #[test]
    fn a_pod_without_a_daemonset_owner_keeps() {
        let bare = StopFacts {
            owner_at_start: None,
            pod: Lookup::Found(None),
            daemonset: Lookup::NotAsked,
            namespace: Lookup::NotAsked,
            seen_removal: None,
        };
        assert!(keeps(&bare));
    }

    #[test]
    fn the_owner_is_the_controlling_apps_v1_daemonset() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kuport-agent-x", "namespace": "kuport-system", "ownerReferences": [
                {"apiVersion": "v1", "kind": "DaemonSet", "name": "wrong-group", "uid": "a", "controller": true},
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "not-controller", "uid": "b"},
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kuport-agent", "uid": "u1", "controller": true},
            ]},
        }))
        .expect("pod");
        assert_eq!(daemonset_owner(&pod), Some(owner("u1")));
        let orphan: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "kuport-system"}
        }))
        .expect("pod");
        assert_eq!(daemonset_owner(&orphan), None);
    }
}
