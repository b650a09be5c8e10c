//! Reading the cluster for `kuport status`: the lists below into a [`Dump`], nothing else.
//!
//! A user whose RBAC covers less than the whole cluster still gets a report: a list the API
//! server refuses (403) is left out and named in `Dump::unread`, and the renderer says nothing
//! about it. Only the PortMaps are needed: without them there is nothing to report, and
//! `kuport status` exits 4 as for a cluster it cannot reach.

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kuport_core::api::{GROUP, PortMap, PortMapClass, PortMapNode, VERSION};
use kuport_core::snapshot::{CILIUM_CONFIG, CniFacts};
use serde::de::DeserializeOwned;

use super::StatusArgs;
use super::agents::AgentSelector;
use crate::objects::{Dump, Unread};

/// A list the API server may refuse: `Ok(None)` (and a note in `unread`) on 403, the error on
/// anything else (unreachable, unauthenticated, a missing CRD), which ends the reading.
async fn list_or_note<K>(
    api: Api<K>,
    what: &str,
    params: &ListParams,
    unread: &mut Vec<Unread>,
) -> anyhow::Result<Option<Vec<K>>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.list(params).await {
        Ok(list) => Ok(Some(list.items)),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            unread.push(forbidden(what, &e.message));
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("listing {what}")),
    }
}

fn forbidden(what: &str, message: &str) -> Unread {
    Unread {
        what: what.to_owned(),
        why: format!("forbidden: {message}"),
    }
}

/// The namespace the reading is limited to: the one of the mapping asked for, or `-n`.
fn scope(args: &StatusArgs, target: Option<&(String, String)>) -> Option<String> {
    target.map(|(ns, _)| ns.clone()).or(args.namespace.clone())
}

/// Every PortMap (a mapping's acceptance depends on the others: conflicts are cluster-wide);
/// only the scope's when the user may read no more, which the plan then cannot be trusted on.
async fn portmaps(
    client: &kube::Client,
    scope: Option<&str>,
    unread: &mut Vec<Unread>,
) -> anyhow::Result<Vec<PortMap>> {
    let all = ListParams::default();
    match (Api::<PortMap>::all(client.clone()).list(&all).await, scope) {
        (Ok(list), _) => Ok(list.items),
        (Err(kube::Error::Api(e)), Some(ns)) if e.code == 403 => {
            unread.push(forbidden("PortMaps in other namespaces", &e.message));
            let list = Api::<PortMap>::namespaced(client.clone(), ns)
                .list(&all)
                .await
                .with_context(|| format!("listing PortMaps in namespace {ns}"))?;
            Ok(list.items)
        }
        (Err(e @ kube::Error::Api(_)), None) if is_forbidden(&e) => Err(e).context(
            "listing PortMaps (a user who may read them only in some namespaces: give -n NAMESPACE)",
        ),
        (Err(e), _) => Err(e).context("listing PortMaps"),
    }
}

fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// Namespaced kinds: across the cluster, or in `scope` when the cluster-wide list is refused.
async fn namespaced_or_scope<K>(
    client: &kube::Client,
    what: &str,
    scope: Option<&str>,
    params: &ListParams,
    unread: &mut Vec<Unread>,
) -> anyhow::Result<Option<Vec<K>>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let mut refused = Vec::new();
    let all = list_or_note(Api::<K>::all(client.clone()), what, params, &mut refused).await?;
    match (all, scope) {
        (Some(items), _) => Ok(Some(items)),
        (None, Some(ns)) => {
            let what_here = format!("{what} in namespace {ns}");
            let mut refused_here = Vec::new();
            let here = list_or_note(
                Api::<K>::namespaced(client.clone(), ns),
                &what_here,
                params,
                &mut refused_here,
            )
            .await?;
            // Read in the scope: only the other namespaces are missing. Refused there too: the
            // kind is missing altogether, under its plain name (which the renderer checks).
            let other = |u: Unread| Unread {
                what: format!("{} in other namespaces", u.what),
                why: u.why,
            };
            match here {
                Some(_) => unread.extend(refused.into_iter().map(other)),
                None => unread.extend(refused),
            }
            Ok(here)
        }
        (None, None) => {
            unread.extend(refused);
            Ok(None)
        }
    }
}

/// The DaemonSets and Pods the agents are found among, by `selector`.
async fn agent_objects(
    client: &kube::Client,
    selector: &AgentSelector,
    dump: &mut Dump,
) -> anyhow::Result<()> {
    let params = ListParams::default().labels(&selector.label_selector());
    let where_ = selector
        .namespace
        .as_deref()
        .map_or_else(String::new, |ns| format!(" in namespace {ns}"));
    // Every DaemonSet (a cluster has few): the renderer also knows kuport's by the labels of
    // the Pods it makes, which the API server cannot select on.
    dump.daemon_sets = match &selector.namespace {
        None => Api::<DaemonSet>::all(client.clone()),
        Some(ns) => Api::namespaced(client.clone(), ns),
    }
    .list(&ListParams::default())
    .await
    .map(|l| Some(l.items))
    .or_else(|e| refused(e, "DaemonSets", &where_, &mut dump.unread))?;
    dump.pods = match &selector.namespace {
        None => Api::<Pod>::all(client.clone()),
        Some(ns) => Api::namespaced(client.clone(), ns),
    }
    .list(&params)
    .await
    .map(|l| Some(l.items))
    .or_else(|e| refused(e, "Pods", &where_, &mut dump.unread))?;
    Ok(())
}

/// `Ok(None)` with a note under the plain `kind` (the renderer looks the agents' kinds up by
/// it) for a 403; the error otherwise. `where_` says where it was listed.
fn refused<T>(
    e: kube::Error,
    kind: &str,
    where_: &str,
    unread: &mut Vec<Unread>,
) -> anyhow::Result<Option<T>> {
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            unread.push(Unread {
                what: kind.to_owned(),
                why: format!("forbidden{where_}: {}", s.message),
            });
            Ok(None)
        }
        e => Err(e).with_context(|| format!("listing {kind}{where_}")),
    }
}

/// Every node's `PortMapNode` (the rows of the classes): none when the kind is not installed
/// (agents and CRDs of a version before it), noted when the list is refused.
async fn node_objects(
    client: &kube::Client,
    unread: &mut Vec<Unread>,
) -> anyhow::Result<Vec<PortMapNode>> {
    match Api::<PortMapNode>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            unread.push(forbidden("PortMapNodes", &e.message));
            Ok(Vec::new())
        }
        Err(e) => Err(e).context("listing PortMapNodes"),
    }
}

/// Reads what the renderer needs: the plan's inputs, the agents' DaemonSets and Pods, and the
/// Events about kuport's objects (only the one mapping's when one is asked for).
pub(super) async fn fetch(
    args: &StatusArgs,
    target: Option<&(String, String)>,
    selector: &AgentSelector,
) -> anyhow::Result<Dump> {
    let client = super::client(args).await?;
    let all = ListParams::default();
    let scope = scope(args, target);
    let scope = scope.as_deref();
    let mut dump = Dump::default();
    let unread = &mut dump.unread;
    let s = &mut dump.snapshot;
    s.classes = list_or_note(
        Api::<PortMapClass>::all(client.clone()),
        "PortMapClasses",
        &all,
        unread,
    )
    .await?
    .unwrap_or_default();
    // The nodes' rows say something only about the classes: a reader refused those has no use
    // for them (and no note about them).
    if !unread.iter().any(|u| u.what == "PortMapClasses") {
        s.portmap_nodes = node_objects(&client, unread).await?;
    }
    s.portmaps = portmaps(&client, scope, unread).await?;
    s.endpoint_slices =
        namespaced_or_scope::<EndpointSlice>(&client, "EndpointSlices", scope, &all, unread)
            .await?
            .unwrap_or_default();
    s.nodes = list_or_note(Api::<Node>::all(client.clone()), "Nodes", &all, unread)
        .await?
        .unwrap_or_default();
    s.namespaces = list_or_note(
        Api::<Namespace>::all(client.clone()),
        "Namespaces",
        &all,
        unread,
    )
    .await?
    .unwrap_or_default();
    let (cm_ns, cm_name) = CILIUM_CONFIG;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), cm_ns);
    s.cni = match configmaps.get_opt(cm_name).await {
        Ok(cm) => cm.as_ref().map(CniFacts::from_cilium_config),
        // Only VxlanPortConflict cannot be re-checked without it, and the class's own Ready
        // condition still says it.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            unread.push(forbidden(
                &format!("ConfigMap {cm_ns}/{cm_name}"),
                &e.message,
            ));
            None
        }
        Err(e) => return Err(e).with_context(|| format!("reading ConfigMap {cm_ns}/{cm_name}")),
    };
    dump.events = events(&client, target, scope, &mut dump.unread).await?;
    agent_objects(&client, selector, &mut dump).await?;
    dump.settle_rows();
    Ok(dump)
}

/// The Events about kuport's objects: the one mapping's, or every one (in the scope, if any).
async fn events(
    client: &kube::Client,
    target: Option<&(String, String)>,
    scope: Option<&str>,
    unread: &mut Vec<Unread>,
) -> anyhow::Result<Vec<Event>> {
    let api_version = format!("{GROUP}/{VERSION}");
    let (api, what, params) = match (target, scope) {
        (Some((ns, name)), _) => (
            Api::<Event>::namespaced(client.clone(), ns),
            format!("Events in namespace {ns}"),
            ListParams::default().fields(&format!(
                "involvedObject.apiVersion={api_version},involvedObject.kind=PortMap,involvedObject.name={name}"
            )),
        ),
        (None, scope) => (
            scope.map_or_else(
                || Api::<Event>::all(client.clone()),
                |ns| Api::namespaced(client.clone(), ns),
            ),
            "Events".to_owned(),
            ListParams::default().fields(&format!("involvedObject.apiVersion={api_version}")),
        ),
    };
    Ok(list_or_note(api, &what, &params, unread)
        .await?
        .unwrap_or_default())
}

/// What `kuport version` reads of the agents: their DaemonSets and Pods (image and node), the
/// class rows (the version each agent stamps) and the Nodes; a refused list is noted, not
/// fatal.
pub(super) async fn fetch_agents(
    client: &kube::Client,
    selector: &AgentSelector,
) -> anyhow::Result<Dump> {
    let all = ListParams::default();
    let mut dump = Dump::default();
    // A cluster without kuport's CRDs has no rows to read, and still Pods to look at.
    dump.snapshot.classes = match Api::<PortMapClass>::all(client.clone()).list(&all).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => {
            let why = if e.code == 404 {
                "not installed"
            } else {
                "forbidden"
            };
            dump.unread.push(Unread {
                what: "PortMapClasses".to_owned(),
                why: format!("{why}: {}", e.message),
            });
            Vec::new()
        }
        Err(e) => return Err(e).context("listing PortMapClasses"),
    };
    dump.snapshot.nodes = list_or_note(
        Api::<Node>::all(client.clone()),
        "Nodes",
        &all,
        &mut dump.unread,
    )
    .await?
    .unwrap_or_default();
    dump.snapshot.portmap_nodes = node_objects(client, &mut dump.unread).await?;
    agent_objects(client, selector, &mut dump).await?;
    dump.settle_rows();
    Ok(dump)
}
