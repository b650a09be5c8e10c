//! The object store and the write semantics: metadata the server owns (`uid`,
//! `resourceVersion`, `generation`, `creationTimestamp`), preconditions, status isolation,
//! admission of custom resources, finalizers, and the change history watches read.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::error::{ApiError, Cause};
use super::faults::SplitMix64;
use super::resource::Resource;
use super::schema;
use super::selector::{FieldSelector, LabelSelector};
use super::{BuildError, Inner};

/// (resource index, namespace or "", name): sorted, so lists come out by namespace then name.
pub(crate) type Key = (usize, String, String);

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change; the history holds these in `resourceVersion` order.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub resource: usize,
    pub namespace: String,
    pub kind: ChangeKind,
    /// The object after the change (for a deletion: as deleted, with the deletion's version).
    pub object: Arc<Value>,
    /// The object before a modification, so a filtered watch can turn it into ADDED/DELETED.
    pub previous: Option<Arc<Value>>,
}

pub(crate) struct Store {
    rv: u64,
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Change>,
    /// Highest version dropped from the history: a watch must start at or after it.
    compacted: u64,
    history_limit: usize,
    rng: SplitMix64,
}

impl Store {
    pub fn new(seed: u64, history_limit: usize) -> Self {
        Self {
            rv: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            history_limit,
            rng: SplitMix64::new(seed),
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    pub fn get(&self, res: usize, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.objects
            .get(&(res, namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Objects of a resource, in one namespace or all, sorted by namespace and name.
    pub fn scan<'a>(
        &'a self,
        res: usize,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> + 'a {
        self.objects
            .range((res, String::new(), String::new())..)
            .take_while(move |(k, _)| k.0 == res)
            .filter(move |(k, _)| namespace.is_none_or(|ns| k.1 == ns))
    }

    /// Changes after `rv`, in order.
    pub fn changes_after(&self, rv: u64) -> impl Iterator<Item = &Change> {
        let start = self.history.partition_point(|c| c.rv <= rv);
        self.history.range(start..)
    }

    /// A random RFC 4122 version-4-shaped uid from the seeded generator.
    fn uid(&mut self) -> String {
        let a = self.rng.next_u64();
        let b = self.rng.next_u64();
        let b = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
        let a = (a & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xFFFF,
            a & 0xFFFF,
            b >> 48,
            b & 0xFFFF_FFFF_FFFF
        )
    }

    /// Five characters for `generateName`, from the alphabet the real server uses.
    fn name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[self.rng.below(ALPHABET.len())] as char)
            .collect()
    }

    /// Stores `object` under `key` with the next version, recording the change.
    fn commit(&mut self, key: Key, mut object: Value, kind: ChangeKind) -> Arc<Value> {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let object = Arc::new(object);
        let previous = match kind {
            ChangeKind::Deleted => self.objects.remove(&key),
            _ => self.objects.insert(key.clone(), object.clone()),
        };
        self.history.push_back(Change {
            rv: self.rv,
            resource: key.0,
            namespace: key.1,
            kind,
            object: object.clone(),
            previous: if kind == ChangeKind::Modified {
                previous
            } else {
                None
            },
        });
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.rv;
            }
        }
        object
    }
}

/// Options every write carries.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WriteOpts {
    /// `dryRun=All`: run every check, store nothing.
    pub dry_run: bool,
    /// `fieldValidation=Strict`: unknown fields are an error instead of being pruned.
    pub strict: bool,
    /// The write is a PATCH: the real server reports strict-decoding errors of a patched object
    /// differently from those of a sent one.
    pub patch: bool,
}

/// A parsed list request.
#[derive(Debug, Default)]
pub(crate) struct ListQuery {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<u64>,
    pub exact: bool,
}

/// How a patch body is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Merge,
    Json,
    /// Treated as a merge patch after dropping `$`-directives; only built-in kinds accept it.
    StrategicAsMerge,
}

fn meta(object: &Value) -> &Value {
    &object["metadata"]
}

fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object["metadata"][field].as_str().unwrap_or_default()
}

/// Removes strategic-merge-patch directives (`$patch`, `$setElementOrder/...`, `$retainKeys`,
/// `$deleteFromPrimitiveList/...`), leaving a merge patch.
fn strip_directives(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with('$'));
            map.values_mut().for_each(strip_directives);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

/// Everything of an object except `metadata` and `status`: what `generation` tracks.
fn spec_part(object: &Value) -> Map<String, Value> {
    object
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// An update's precondition: the `resourceVersion` it names must be the stored one. Custom
/// resources refuse an update naming none (an unconditional update), as the real server does.
fn check_precondition(r: &Resource, name: &str, body: &Value, old: &Value) -> Result<(), ApiError> {
    let given_rv = meta_str(body, "resourceVersion");
    if given_rv.is_empty() {
        if r.custom.is_some() {
            return Err(ApiError::invalid(
                r,
                name,
                vec![Cause::new(
                    "FieldValueInvalid",
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update",
                )],
            ));
        }
    } else if given_rv != meta_str(old, "resourceVersion") {
        return Err(ApiError::conflict(
            r,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    Ok(())
}

/// The object an update of `old` with `body` stores, before admission: a status write takes
/// only the status; any other write takes everything but the fields the server owns (and, with
/// a status subresource, the status).
fn replaced(r: &Resource, name: &str, old: &Value, body: Value, status: bool) -> Value {
    if status {
        // A status write changes status only; everything else stays as stored.
        let mut new = old.clone();
        set_or_remove(&mut new, "status", body.get("status"));
        new
    } else {
        let mut new = body;
        new["metadata"]["name"] = json!(name);
        for owned in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            set_or_remove(&mut new["metadata"], owned, old["metadata"].get(owned));
        }
        if let Some(m) = new["metadata"].as_object_mut() {
            m.remove("managedFields");
        }
        if r.status_subresource {
            // Spec writes cannot change status.
            set_or_remove(&mut new, "status", old.get("status"));
        }
        new
    }
}

/// Sets `object[key]` to `value`, or removes the key when there is none: the stored object's
/// field as it was, absent included.
fn set_or_remove(object: &mut Value, key: &str, value: Option<&Value>) {
    match value {
        Some(v) => object[key] = v.clone(),
        None => {
            if let Some(m) = object.as_object_mut() {
                m.remove(key);
            }
        }
    }
}

impl Inner {
    pub(crate) fn resource(&self, res: usize) -> &Resource {
        &self.resources[res]
    }

    fn notify(&self, rv: u64) {
        self.changes.send_replace(rv);
    }

    pub(crate) fn create_default_namespaces(&self) -> Result<(), BuildError> {
        let res = self
            .find("", "v1", "namespaces")
            .ok_or_else(|| BuildError::Setting {
                setting: "resources",
                what: "namespaces are not served".to_owned(),
            })?;
        for name in ["default", "kube-node-lease", "kube-public", "kube-system"] {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            self.create(res, None, body, WriteOpts::default())
                .map_err(|e| BuildError::Setting {
                    setting: "default namespaces",
                    what: e.to_string(),
                })?;
        }
        Ok(())
    }

    pub(crate) fn get(
        &self,
        res: usize,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let stored = self
            .lock()
            .get(self.storage(res), namespace.unwrap_or_default(), name)
            .ok_or_else(|| ApiError::not_found(self.resource(res), name))?;
        Ok(self.view(res, stored))
    }

    /// Lists matching objects with the list metadata (`resourceVersion`, `continue`,
    /// `remainingItemCount`).
    pub(crate) fn list(
        &self,
        res: usize,
        namespace: Option<&str>,
        q: &ListQuery,
    ) -> Result<(Vec<Arc<Value>>, Value), ApiError> {
        let store = self.lock();
        let current = store.resource_version();
        if let Some(rv) = q.resource_version {
            if rv > current {
                return Err(too_large(rv, current));
            }
            // Only the latest state is kept, so an exact read of an older version is as gone
            // as a compacted one on the real server.
            if q.exact && rv != current {
                return Err(ApiError::expired(rv, current));
            }
        }
        let after: Option<(String, String)> = match &q.continue_token {
            None => None,
            Some(token) => {
                let mut parts = token.splitn(3, '/');
                let (Some(rv), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next())
                else {
                    return Err(ApiError::bad_request(format!(
                        "invalid continue token {token:?}"
                    )));
                };
                let rv: u64 = rv.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid continue token {token:?}"))
                })?;
                if rv < store.compacted() {
                    return Err(ApiError::new(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                Some((ns.to_owned(), name.to_owned()))
            }
        };
        let matching: Vec<Arc<Value>> = store
            .scan(self.storage(res), namespace)
            .filter(|(k, _)| {
                after
                    .as_ref()
                    .is_none_or(|(ns, name)| (&k.1, &k.2) > (ns, name))
            })
            .map(|(_, o)| self.view(res, o.clone()))
            .filter(|o| q.labels.matches(o) && q.fields.matches(o))
            .collect();
        let mut list_meta = json!({"resourceVersion": current.to_string()});
        let take = q.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let page: Vec<Arc<Value>> = matching.iter().take(take).cloned().collect();
        if matching.len() > page.len()
            && let Some(last) = page.last()
        {
            list_meta["continue"] = json!(format!(
                "{current}/{}/{}",
                meta_str(last, "namespace"),
                meta_str(last, "name")
            ));
            list_meta["remainingItemCount"] = json!(matching.len() - page.len());
        }
        Ok((page, list_meta))
    }

    /// Checks a body's `apiVersion`/`kind` against the resource, filling them when absent.
    fn check_type(&self, res: usize, body: &mut Value) -> Result<(), ApiError> {
        let r = self.resource(res);
        let Some(map) = body.as_object_mut() else {
            return Err(ApiError::bad_request(format!(
                "the body of a {} request must be a JSON object",
                r.kind
            )));
        };
        let api_version = r.api_version();
        match map.get("apiVersion").and_then(Value::as_str) {
            Some(v) if v != api_version => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({v}) does not match the expected API version ({api_version})"
                )));
            }
            _ => {
                map.insert("apiVersion".to_owned(), json!(api_version));
            }
        }
        match map.get("kind").and_then(Value::as_str) {
            Some(k) if k != r.kind => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    r.kind
                )));
            }
            _ => {
                map.insert("kind".to_owned(), json!(r.kind));
            }
        }
        match map.get("metadata") {
            Some(Value::Object(_)) => {}
            None | Some(Value::Null) => {
                map.insert("metadata".to_owned(), json!({}));
            }
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the metadata of a {} must be an object, not {other}",
                    r.kind
                )));
            }
        }
        Ok(())
    }

    /// Prunes, defaults and validates a custom resource; built-ins pass unchanged.
    fn admit(
        &self,
        res: usize,
        object: &mut Value,
        old: Option<&Value>,
        opts: WriteOpts,
    ) -> Result<(), ApiError> {
        let r = self.resource(res);
        let Some(custom) = &r.custom else {
            return Ok(());
        };
        let name = meta_str(object, "name").to_owned();
        let Some(map) = object.as_object_mut() else {
            return Err(ApiError::bad_request("object is not a JSON object"));
        };
        // apiVersion, kind and metadata are not in a CRD's schema; keep them out of pruning.
        let kept: Vec<(String, Value)> = ["apiVersion", "kind", "metadata"]
            .iter()
            .filter_map(|k| map.remove(*k).map(|v| ((*k).to_owned(), v)))
            .collect();
        let mut unknown = Vec::new();
        schema::prune(&custom.schema, object, "", &mut unknown);
        if let Some(map) = object.as_object_mut() {
            map.extend(kept);
        }
        if opts.strict && !unknown.is_empty() {
            let list: Vec<String> = unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect();
            return Err(ApiError::strict_decoding(
                r,
                object,
                &list.join(", "),
                opts.patch,
            ));
        }
        *object = kube::core::cel::apply_defaults(&custom.schema, object);
        let mut causes = Vec::new();
        schema::check(&custom.schema, object, "", &mut causes);
        // The real server evaluates the CEL rules whether or not the schema checks passed, and
        // lists the schema's causes first.
        causes.extend(schema::check_cel(&custom.schema, object, old));
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(r, &name, causes))
        }
    }

    /// Validates a name and the namespace of a namespaced object.
    fn check_name(&self, res: usize, object: &Value) -> Result<(), ApiError> {
        let r = self.resource(res);
        let name = meta_str(object, "name");
        if name.is_empty() {
            return Err(ApiError::invalid(
                r,
                name,
                vec![Cause::new(
                    "FieldValueRequired",
                    "metadata.name",
                    "Required value: name or generateName is required",
                )],
            ));
        }
        let is_label = r.plural == "namespaces" && r.group.is_empty();
        if let Some(problem) = schema::name_problem(name, is_label) {
            return Err(ApiError::invalid(
                r,
                name,
                vec![Cause::new(
                    "FieldValueInvalid",
                    "metadata.name",
                    format!("Invalid value: \"{name}\": {problem}"),
                )],
            ));
        }
        Ok(())
    }

    /// Sets the namespace from the path, refusing a body that names another one.
    fn place(
        &self,
        res: usize,
        namespace: Option<&str>,
        body: &mut Value,
    ) -> Result<String, ApiError> {
        let r = self.resource(res);
        if !r.namespaced {
            if let Some(m) = body["metadata"].as_object_mut() {
                m.remove("namespace");
            }
            return Ok(String::new());
        }
        let Some(ns) = namespace else {
            return Err(ApiError::bad_request(format!(
                "{} is namespaced: the request must name a namespace",
                r.qualified()
            )));
        };
        match meta(body).get("namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != ns => Err(ApiError::bad_request(format!(
                "the namespace of the provided object ({given}) does not match the namespace sent on the request ({ns})"
            ))),
            _ => {
                body["metadata"]["namespace"] = json!(ns);
                Ok(ns.to_owned())
            }
        }
    }

    pub(crate) fn create(
        &self,
        res: usize,
        namespace: Option<&str>,
        mut body: Value,
        opts: WriteOpts,
    ) -> Result<Arc<Value>, ApiError> {
        self.check_type(res, &mut body)?;
        let ns = self.place(res, namespace, &mut body)?;
        let r = self.resource(res);
        if !meta_str(&body, "resourceVersion").is_empty() {
            return Err(ApiError::bad_request(format!(
                "{} {:?}: resourceVersion should not be set on objects to be created",
                r.qualified(),
                meta_str(&body, "name")
            )));
        }
        let mut store = self.lock();
        if meta_str(&body, "name").is_empty() {
            let prefix = meta_str(&body, "generateName").to_owned();
            if !prefix.is_empty() {
                body["metadata"]["name"] = json!(format!("{prefix}{}", store.name_suffix()));
            }
        }
        self.check_name(res, &body)?;
        let mut body = self.to_storage(res, body);
        let name = meta_str(&body, "name").to_owned();
        if r.namespaced
            && let Some(ns_res) = self.find("", "v1", "namespaces")
            && store.get(ns_res, "", &ns).is_none()
        {
            return Err(ApiError::not_found(self.resource(ns_res), &ns));
        }
        let key = (self.storage(res), ns, name.clone());
        if store.objects.contains_key(&key) {
            return Err(ApiError::already_exists(r, &name));
        }
        if let Some(m) = body["metadata"].as_object_mut() {
            for owned in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "managedFields",
                "selfLink",
            ] {
                m.remove(owned);
            }
        }
        if r.status_subresource
            && !r.keep_status_on_create
            && let Some(m) = body.as_object_mut()
        {
            m.remove("status");
        }
        if r.group.is_empty() && r.plural == "namespaces" {
            if body["spec"]["finalizers"].is_null() {
                body["spec"] = json!({"finalizers": ["kubernetes"]});
            }
            body["status"] = json!({"phase": "Active"});
        }
        self.admit(res, &mut body, None, opts)?;
        body["metadata"]["uid"] = json!(store.uid());
        body["metadata"]["creationTimestamp"] = json!(self.now_string());
        if r.custom.is_some() {
            body["metadata"]["generation"] = json!(1);
        }
        if opts.dry_run {
            body["metadata"]["resourceVersion"] = json!("");
            return Ok(self.view(res, Arc::new(body)));
        }
        let object = store.commit(key, body, ChangeKind::Added);
        let rv = store.resource_version();
        drop(store);
        self.notify(rv);
        Ok(self.view(res, object))
    }

    /// Replace (PUT) or, with `status`, a status write. `patched` marks a body that came from
    /// applying a patch to the stored object.
    pub(crate) fn update(
        &self,
        res: usize,
        namespace: Option<&str>,
        name: &str,
        mut body: Value,
        status: bool,
        opts: WriteOpts,
    ) -> Result<Arc<Value>, ApiError> {
        self.check_type(res, &mut body)?;
        let ns = self.place(res, namespace, &mut body)?;
        let r = self.resource(res);
        let body_name = meta_str(&body, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body = self.to_storage(res, body);
        let mut store = self.lock();
        let key = (self.storage(res), ns, name.to_owned());
        let old = store
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(r, name))?;
        check_precondition(r, name, &body, &old)?;
        let mut new = replaced(r, name, &old, body, status);
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        self.admit(res, &mut new, Some(&old), opts)?;
        if r.custom.is_some() && !status && spec_part(&new) != spec_part(&old) {
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        if new == *old {
            // A no-op write stores nothing and keeps the version, so clients see "unchanged".
            return Ok(self.view(res, old));
        }
        if opts.dry_run {
            return Ok(self.view(res, Arc::new(new)));
        }
        let finalized = !meta(&new)["deletionTimestamp"].is_null()
            && meta(&new)["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty());
        let kind = if finalized {
            ChangeKind::Deleted
        } else {
            ChangeKind::Modified
        };
        let object = store.commit(key, new, kind);
        let rv = store.resource_version();
        drop(store);
        self.notify(rv);
        Ok(self.view(res, object))
    }

    pub(crate) fn patch(
        &self,
        res: usize,
        namespace: Option<&str>,
        name: &str,
        (kind, patch): (PatchKind, Value),
        status: bool,
        opts: WriteOpts,
    ) -> Result<Arc<Value>, ApiError> {
        let r = self.resource(res);
        let old = self.get(res, namespace, name)?;
        let mut doc = (*old).clone();
        match kind {
            PatchKind::Merge | PatchKind::StrategicAsMerge => {
                let mut patch = patch;
                if kind == PatchKind::StrategicAsMerge {
                    strip_directives(&mut patch);
                }
                json_patch::merge(&mut doc, &patch);
            }
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch).map_err(|e| {
                    ApiError::bad_request(format!(
                        "{} \"{name}\": invalid JSON patch: {e}",
                        r.qualified()
                    ))
                })?;
                // The real server drops the patch library's words (which operation failed):
                // a client cannot tell a failed `test` from a missing path, and needs not.
                json_patch::patch(&mut doc, &ops).map_err(|_| ApiError::patch_not_applied())?;
            }
        }
        // A patch that does not name a version is applied to the version it was read at.
        if meta_str(&doc, "resourceVersion").is_empty() && doc["metadata"].is_object() {
            doc["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        }
        self.update(res, namespace, name, doc, status, opts)
    }

    /// Deletes an object, honouring `preconditions` and finalizers (an object with finalizers
    /// gets a `deletionTimestamp` and stays until they are removed). Deleting a namespace deletes
    /// everything in it at once (the real server drains it while it is Terminating).
    pub(crate) fn delete(
        &self,
        res: usize,
        namespace: Option<&str>,
        name: &str,
        options: &Value,
        opts: WriteOpts,
    ) -> Result<Arc<Value>, ApiError> {
        let r = self.resource(res);
        let mut store = self.lock();
        let key = (
            self.storage(res),
            namespace.unwrap_or_default().to_owned(),
            name.to_owned(),
        );
        let old = store
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(r, name))?;
        let pre = &options["preconditions"];
        if let Some(uid) = pre["uid"].as_str()
            && uid != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                r,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid")
                ),
            ));
        }
        if let Some(rv) = pre["resourceVersion"].as_str()
            && rv != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                r,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&old, "resourceVersion")
                ),
            ));
        }
        if opts.dry_run {
            return Ok(self.view(res, old));
        }
        let has_finalizers = meta(&old)["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let object = if has_finalizers {
            if !meta(&old)["deletionTimestamp"].is_null() {
                return Ok(self.view(res, old));
            }
            let mut marked = (*old).clone();
            marked["metadata"]["deletionTimestamp"] = json!(self.now_string());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            store.commit(key, marked, ChangeKind::Modified)
        } else {
            if r.group.is_empty() && r.plural == "namespaces" {
                let contents: Vec<(Key, Value)> = store
                    .objects
                    .iter()
                    .filter(|(k, _)| k.1 == name && self.resource(k.0).namespaced)
                    .map(|(k, v)| (k.clone(), (**v).clone()))
                    .collect();
                for (k, v) in contents {
                    store.commit(k, v, ChangeKind::Deleted);
                }
            }
            store.commit(key, (*old).clone(), ChangeKind::Deleted)
        };
        let rv = store.resource_version();
        drop(store);
        self.notify(rv);
        Ok(self.view(res, object))
    }
}

/// The real server waits a little for a version it has not reached, then answers 504.
pub(crate) fn too_large(requested: u64, current: u64) -> ApiError {
    let mut e = ApiError::new(
        504,
        "Timeout",
        format!("Too large resource version: {requested}, current: {current}"),
    );
    e.details = Some(json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }));
    e
}
