//! Every agent's client to the in-process API server model, counting what crosses it: requests
//! (watches opened apart), writes, conflicts, the bytes of every watch stream by resource, and
//! the largest object any write sent back. Nothing here knows kuport's kinds: a resource is
//! what its path names (`group/plural`), so the harness measures whatever objects the agents
//! of the day write.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body as AxumBody;
use http_body_util::BodyExt;
use kube::client::Body;
use tower::ServiceExt;

use crate::sync::lock;

/// Where a request went: the resource's group and plural, the object's namespace and name
/// (empty for a collection), and whether it is a watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource's plural (`nodes`, `portmaps`).
    pub plural: String,
    /// The object's namespace, if namespaced.
    pub namespace: String,
    /// The object's name; empty for a collection.
    pub name: String,
    /// The subresource (`status`), if any.
    pub subresource: String,
    /// A watch (`?watch=true`).
    pub watch: bool,
}

impl Target {
    /// `group/plural`, or `plural` for the core group.
    pub fn resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}/{}", self.group, self.plural)
        }
    }
}

/// Reads a request's path and query.
pub fn target(path: &str, query: Option<&str>) -> Target {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let rest: &[&str] = match parts.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[],
    };
    let group = match parts.as_slice() {
        ["apis", group, ..] => (*group).to_owned(),
        _ => String::new(),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => ((*ns).to_owned(), tail),
        _ => (String::new(), rest),
    };
    let get = |i: usize| rest.get(i).map_or_else(String::new, |s| (*s).to_owned());
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    Target {
        group,
        plural: get(0),
        namespace,
        name: get(1),
        subresource: get(2),
        watch,
    }
}

/// The largest object a write sent back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Largest {
    /// Its JSON's size as the server sent it.
    pub bytes: u64,
    /// `group/plural`.
    pub resource: String,
    /// `namespace/name`, or `name`.
    pub name: String,
}

/// What one agent's client saw.
#[derive(Debug, Default)]
pub struct WireCount {
    /// Requests other than opening a watch.
    pub requests: AtomicU64,
    /// Watches opened.
    pub watches: AtomicU64,
    /// Writes (anything but GET).
    pub writes: AtomicU64,
    /// Requests answered 409 Conflict.
    pub conflicts: AtomicU64,
    /// Writes answered 422 (a guarded patch whose test failed, or an invalid object).
    pub refused: AtomicU64,
    /// Requests sent and not answered yet (watches excluded).
    pub in_flight: AtomicU64,
    /// Writes, by resource.
    pub writes_by_resource: Mutex<BTreeMap<String, u64>>,
    /// Bytes of watch streams, by resource.
    pub watch_bytes: Mutex<BTreeMap<String, u64>>,
    /// Bytes of list and get answers, by resource.
    pub read_bytes: Mutex<BTreeMap<String, u64>>,
    /// The largest object a write of this agent got back.
    pub largest_write: Mutex<Largest>,
}

/// A frozen copy of the counters, to subtract two.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    /// See [`WireCount::requests`].
    pub requests: u64,
    /// See [`WireCount::writes`].
    pub writes: u64,
    /// See [`WireCount::conflicts`].
    pub conflicts: u64,
    /// See [`WireCount::refused`].
    pub refused: u64,
    /// See [`WireCount::watch_bytes`].
    pub watch_bytes: BTreeMap<String, u64>,
    /// See [`WireCount::writes_by_resource`].
    pub writes_by_resource: BTreeMap<String, u64>,
}

impl Counts {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let minus = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0)))
                .filter(|(_, v)| *v > 0)
                .collect()
        };
        Counts {
            requests: self.requests - earlier.requests,
            writes: self.writes - earlier.writes,
            conflicts: self.conflicts - earlier.conflicts,
            refused: self.refused - earlier.refused,
            watch_bytes: minus(&self.watch_bytes, &earlier.watch_bytes),
            writes_by_resource: minus(&self.writes_by_resource, &earlier.writes_by_resource),
        }
    }

    /// Adds `other` in.
    pub fn add(&mut self, other: &Counts) {
        self.requests += other.requests;
        self.writes += other.writes;
        self.conflicts += other.conflicts;
        self.refused += other.refused;
        for (k, v) in &other.watch_bytes {
            *self.watch_bytes.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.writes_by_resource {
            *self.writes_by_resource.entry(k.clone()).or_default() += v;
        }
    }
}

impl WireCount {
    /// The counters now.
    pub fn counts(&self) -> Counts {
        Counts {
            requests: self.requests.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            conflicts: self.conflicts.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            watch_bytes: lock(&self.watch_bytes).clone(),
            writes_by_resource: lock(&self.writes_by_resource).clone(),
        }
    }

    fn answered(&self, t: &Target, write: bool, status: u16) {
        if !t.watch {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        if status == 409 {
            self.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        if write && status == 422 {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn add(map: &Mutex<BTreeMap<String, u64>>, key: &str, n: u64) {
    *lock(map).entry(key.to_owned()).or_default() += n;
}

/// A kube client over `router` (the model's, in-process) that counts into `count`.
pub fn client(router: axum::Router, count: Arc<WireCount>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<Body>| {
        let router = router.clone();
        let count = count.clone();
        async move {
            let t = target(req.uri().path(), req.uri().query());
            let write = req.method() != http::Method::GET;
            if t.watch {
                count.watches.fetch_add(1, Ordering::Relaxed);
            } else {
                count.requests.fetch_add(1, Ordering::Relaxed);
                count.in_flight.fetch_add(1, Ordering::Relaxed);
            }
            if write {
                count.writes.fetch_add(1, Ordering::Relaxed);
                add(&count.writes_by_resource, &t.resource(), 1);
            }
            let (parts, body) = req.into_parts();
            let req = http::Request::from_parts(parts, AxumBody::new(body));
            let response = router.oneshot(req).await;
            let Ok(response) = response;
            count.answered(&t, write, response.status().as_u16());
            Ok::<_, std::convert::Infallible>(counted(response, t, write, count))
        }
    });
    kube::Client::new(service, "default")
}

/// The answer, its bytes counted as they pass: a watch's by resource, a read's by resource, a
/// write's object measured whole.
fn counted(
    response: http::Response<AxumBody>,
    t: Target,
    write: bool,
    count: Arc<WireCount>,
) -> http::Response<AxumBody> {
    let ok = response.status().is_success();
    let (parts, body) = response.into_parts();
    let resource = t.resource();
    let mut seen = 0u64;
    let body = body.map_frame(move |frame| {
        if let Some(data) = frame.data_ref() {
            let n = data.len() as u64;
            seen += n;
            if t.watch {
                add(&count.watch_bytes, &resource, n);
            } else if !write {
                add(&count.read_bytes, &resource, n);
            } else if ok {
                let mut largest = lock(&count.largest_write);
                if seen > largest.bytes {
                    let name = if t.namespace.is_empty() {
                        t.name.clone()
                    } else {
                        format!("{}/{}", t.namespace, t.name)
                    };
                    *largest = Largest {
                        bytes: seen,
                        resource: resource.clone(),
                        name,
                    };
                }
            }
        }
        frame
    });
    http::Response::from_parts(parts, AxumBody::new(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_its_resource_namespace_name_and_subresource() {
        let t = target(
            "/apis/kuport.wlz.li/v1alpha1/portmapclasses/public/status",
            None,
        );
        assert_eq!(t.resource(), "kuport.wlz.li/portmapclasses");
        assert_eq!(
            (t.name.as_str(), t.subresource.as_str()),
            ("public", "status")
        );
        let t = target(
            "/apis/discovery.k8s.io/v1/namespaces/t-0/endpointslices",
            Some("watch=true&resourceVersion=5"),
        );
        assert_eq!(t.resource(), "discovery.k8s.io/endpointslices");
        assert_eq!((t.namespace.as_str(), t.name.as_str()), ("t-0", ""));
        assert!(t.watch);
        let t = target("/api/v1/namespaces/t-0", None);
        assert_eq!(
            (t.resource().as_str(), t.name.as_str()),
            ("namespaces", "t-0")
        );
        let t = target("/api/v1/nodes", Some("watch=1"));
        assert_eq!(t.resource(), "nodes");
        assert!(t.watch);
        assert!(!target("/api/v1/pods", Some("fieldSelector=spec.nodeName%3Dn")).watch);
    }
}
