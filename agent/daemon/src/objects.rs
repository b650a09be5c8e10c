//! Reading Kubernetes objects from files into a [`Snapshot`]: what `kubectl get ... -o yaml`
//! prints (multi-document YAML streams, `List` objects, JSON), and directories of such files.
//!
//! Every failure is an [`InputError`] naming the file and the problem; nothing here panics.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::Resource as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kuport_core::api::{GROUP, PortMap, PortMapClass, PortMapNode, VERSION};
use kuport_core::plan::node_rows::with_node_rows;
use kuport_core::snapshot::{CILIUM_CONFIG, CniFacts, HostFacts, Snapshot};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Input kuport cannot read: a missing or unreadable file, text that is not YAML or JSON, or an
/// object that does not fit its type. The command exits with status 2 on these.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A path named on the command line does not exist.
    #[error("{}: no such file or directory", path.display())]
    NotFound { path: PathBuf },
    /// A file or directory could not be read.
    #[error("{}: cannot read: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The text is not valid YAML or JSON.
    #[error("{}: not valid {format}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        format: Format,
        message: String,
    },
    /// One document (or one item of a `List`) is not a Kubernetes object kuport can read.
    #[error("{}: {at}: {problem}", path.display())]
    Document {
        path: PathBuf,
        at: Box<DocumentAt>,
        problem: String,
    },
    /// The `--facts` file parses but does not describe host facts.
    #[error("{}: invalid host facts: {problem}", path.display())]
    Facts { path: PathBuf, problem: String },
}

/// The syntax a file was read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// JSON for `*.json`, YAML (a superset of JSON) for everything else.
    pub fn of(path: &Path) -> Self {
        let json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        if json { Format::Json } else { Format::Yaml }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Yaml => "YAML",
            Format::Json => "JSON",
        })
    }
}

/// Where in a file an object sits: its document (1-based, empty documents not counted), the
/// item path through nested `List`s (1-based), and its kind and name once known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentAt {
    pub document: usize,
    pub items: Vec<usize>,
    pub kind: Option<String>,
    pub name: Option<String>,
}

impl fmt::Display for DocumentAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        for item in &self.items {
            write!(f, ", item {item}")?;
        }
        match (&self.kind, &self.name) {
            (Some(kind), Some(name)) => write!(f, " ({kind} {name})"),
            (Some(kind), None) => write!(f, " ({kind})"),
            (None, _) => Ok(()),
        }
    }
}

/// Reads every object in `paths` (files, or directories searched recursively for `*.yaml`,
/// `*.yml` and `*.json`) into a snapshot. Kinds the plan does not read are skipped.
pub fn load_objects(paths: &[PathBuf]) -> Result<Snapshot, InputError> {
    load_dump(paths).map(|d| d.snapshot)
}

/// What a recorded (or just read) cluster holds for kuport: the plan's inputs, the core `v1`
/// Events, and what `kuport status` reads of the agents themselves.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    /// The objects the plan reads.
    pub snapshot: Snapshot,
    /// Events (core `v1`, as `kubectl get events -o yaml` prints them).
    pub events: Vec<Event>,
    /// DaemonSets (`apps/v1`); `None` when they were not read: a recording without any, or a
    /// reader the API server refused. `Some(empty)` is a cluster without one.
    pub daemon_sets: Option<Vec<DaemonSet>>,
    /// The Pods the agents are looked for among; `None` when they were not read (a recording
    /// holds them in `snapshot.pods` too, where the plan reads their hostPorts).
    pub pods: Option<Vec<Pod>>,
    /// What could not be read, and why: `kuport status` says so instead of guessing.
    pub unread: Vec<Unread>,
}

impl Dump {
    /// Puts in each class status the rows that count (`node_rows`): every node's own from its
    /// `PortMapNode`, a row in the class only for a node without one. What reads rows from the
    /// classes (`kuport status`, preflight, `kuport version`) then reads both forms alike.
    pub fn settle_rows(&mut self) {
        let snapshot = &mut self.snapshot;
        snapshot
            .portmap_nodes
            .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        with_node_rows(&mut snapshot.classes, &snapshot.portmap_nodes);
    }
}

/// A kind of object (or part of one) a reading did not get, and why.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Unread {
    /// What was not read, as `kuport status` names it (`PortMapClasses`, `DaemonSets`, ...).
    pub what: String,
    /// Why: the API server's refusal, or that a recording does not hold it.
    pub why: String,
}

/// Reads `paths` as [`load_objects`] does, keeping Events, DaemonSets and Pods too. A recording
/// without DaemonSets or Pods says so in `unread`: an older dump, or one recorded without them,
/// cannot tell whether the agents run.
pub fn load_dump(paths: &[PathBuf]) -> Result<Dump, InputError> {
    let mut dump = Dump::default();
    for file in input_files(paths)? {
        let text = read_text(&file)?;
        for (index, doc) in parse_documents(&file, &text)?.into_iter().enumerate() {
            let at = DocumentAt {
                document: index + 1,
                items: Vec::new(),
                kind: None,
                name: None,
            };
            add_object(&mut dump, &file, at, doc, None)?;
        }
    }
    // Every cluster has the Service default/kubernetes: a recording holding any Service holds
    // them all, and one holding none left them out (the plan then judges no Service missing).
    dump.snapshot.services_listed = !dump.snapshot.services.is_empty();
    // A recording holding Pods holds those of every node (`kubectl get pods -A`): each node
    // then delivers only to its own. One holding none says nothing of them.
    dump.snapshot.pods_listed = !dump.snapshot.pods.is_empty();
    dump.settle_rows();
    if !dump.snapshot.pods.is_empty() {
        dump.pods = Some(dump.snapshot.pods.clone());
    }
    for (what, read) in [
        ("DaemonSets", dump.daemon_sets.is_some()),
        ("Pods", dump.pods.is_some()),
    ] {
        if !read {
            dump.unread.push(Unread {
                what: what.to_owned(),
                why: "not in the recorded objects".to_owned(),
            });
        }
    }
    Ok(dump)
}

/// Reads the `--facts` file: YAML or JSON `{interfaces, underlayDevice, underlayMTU}`, all
/// optional. An empty file means no facts. Unknown keys are rejected (a misspelt key would
/// otherwise be silently ignored).
pub fn load_facts(path: &Path) -> Result<HostFacts, InputError> {
    let text = read_text(path)?;
    let mut docs = parse_documents(path, &text)?;
    if docs.len() > 1 {
        return Err(InputError::Facts {
            path: path.to_owned(),
            problem: format!("expected one document, found {}", docs.len()),
        });
    }
    let value = docs.pop().unwrap_or(Value::Null);
    let facts_error = |problem: String| InputError::Facts {
        path: path.to_owned(),
        problem,
    };
    let map = match value {
        Value::Null => return Ok(HostFacts::default()),
        Value::Object(map) => map,
        other => {
            return Err(facts_error(format!(
                "expected a mapping, found {}",
                describe(&other)
            )));
        }
    };
    // HostFacts denies unknown keys, so a misspelt key is refused; the path names the field.
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| facts_error(located(&e)))
}

/// `spec.port: invalid type ...`: the error with the path of the field it concerns.
fn located(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    if path == "." {
        e.inner().to_string()
    } else {
        format!("{path}: {}", e.inner())
    }
}

/// The files named by `paths`, directories expanded, in command-line order and, within a
/// directory, sorted by path. A file named twice is read once.
fn input_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
        if meta.is_dir() {
            let mut found = Vec::new();
            walk_dir(path, &mut found)?;
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    let mut seen = BTreeSet::new();
    files.retain(|f| seen.insert(std::fs::canonicalize(f).unwrap_or_else(|_| f.clone())));
    Ok(files)
}

/// Collects the `*.yaml`, `*.yml` and `*.json` files under `dir`. Entries whose names start
/// with `.` are skipped (editor backups, and the timestamped copies a mounted ConfigMap keeps
/// beside its files); symbolic links to files are followed, to directories not (no cycles).
fn walk_dir(dir: &Path, found: &mut Vec<PathBuf>) -> Result<(), InputError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let file_type = entry.file_type().map_err(|e| io_error(&path, e))?;
        if file_type.is_dir() {
            walk_dir(&path, found)?;
            continue;
        }
        let is_file = if file_type.is_symlink() {
            std::fs::metadata(&path).is_ok_and(|m| m.is_file())
        } else {
            file_type.is_file()
        };
        let wanted = path.extension().is_some_and(|e| {
            let e = e.to_string_lossy().to_ascii_lowercase();
            e == "yaml" || e == "yml" || e == "json"
        });
        if is_file && wanted {
            found.push(path);
        }
    }
    Ok(())
}

fn read_text(path: &Path) -> Result<String, InputError> {
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    String::from_utf8(bytes).map_err(|e| InputError::Syntax {
        path: path.to_owned(),
        format: Format::of(path),
        message: format!("not UTF-8 text ({e})"),
    })
}

fn io_error(path: &Path, source: std::io::Error) -> InputError {
    if source.kind() == std::io::ErrorKind::NotFound {
        InputError::NotFound {
            path: path.to_owned(),
        }
    } else {
        InputError::Read {
            path: path.to_owned(),
            error: source,
        }
    }
}

/// The non-empty documents of a file: a YAML stream, or one or more concatenated JSON values.
fn parse_documents(path: &Path, text: &str) -> Result<Vec<Value>, InputError> {
    let format = Format::of(path);
    let syntax = |message: String| InputError::Syntax {
        path: path.to_owned(),
        format,
        message,
    };
    let docs = match format {
        Format::Json => serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| syntax(e.to_string()))?,
        Format::Yaml => serde_saphyr::from_multiple_with_options::<Value>(text, yaml_options(text))
            .map_err(|e| {
                // The snippet under the message names the file instead of `<input>`.
                let name = path.display().to_string();
                let options = serde_saphyr::render_options! { source_name: Some(name.as_str()) };
                let rendered = e.render_with_options(options);
                let rendered = rendered.strip_prefix("error: ").unwrap_or(&rendered);
                syntax(rendered.trim_end().to_owned())
            })?,
    };
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The parser's limits, raised in proportion to the input: the defaults (250,000 nodes, 1,024
/// documents) are smaller than a large cluster's `kubectl get nodes -o yaml`. A node or a
/// document takes at least a byte or two of text, so these still stop what only amplification
/// (aliases, which keep their default caps) could produce.
fn yaml_options(text: &str) -> serde_saphyr::Options {
    let defaults = serde_saphyr::Budget::default();
    let size = text.len();
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: defaults.max_events.max(size.saturating_mul(2)),
            max_nodes: defaults.max_nodes.max(size),
            max_documents: defaults.max_documents.max(size / 3),
        },
    }
}

/// What a JSON value is, for messages.
fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Adds one object (a document, or an item of a `List`) to the snapshot. `list_type` is the
/// `(apiVersion, kind)` an item of a typed list (`PortMapList`, ...) inherits when it carries
/// none, as the API server prints them.
fn add_object(
    dump: &mut Dump,
    path: &Path,
    mut at: DocumentAt,
    doc: Value,
    list_type: Option<(&str, &str)>,
) -> Result<(), InputError> {
    let Value::Object(mut object) = doc else {
        return Err(document_error(
            path,
            &at,
            format!("expected a Kubernetes object, found {}", describe(&doc)),
        ));
    };
    if let Some((api_version, kind)) = list_type {
        object
            .entry("apiVersion")
            .or_insert_with(|| Value::String(api_version.to_owned()));
        object
            .entry("kind")
            .or_insert_with(|| Value::String(kind.to_owned()));
    }
    let field = |name: &str| object.get(name).and_then(Value::as_str).map(str::to_owned);
    let (Some(api_version), Some(kind)) = (field("apiVersion"), field("kind")) else {
        return Err(document_error(
            path,
            &at,
            "not a Kubernetes object: `apiVersion` and `kind` must both be strings".to_owned(),
        ));
    };
    let (namespace, name) = (
        metadata_field(&object, "namespace"),
        metadata_field(&object, "name"),
    );
    at.kind = Some(kind.clone());
    at.name = name.as_ref().map(|n| match &namespace {
        Some(ns) => format!("{ns}/{n}"),
        None => n.clone(),
    });

    // `List`, or a typed list such as `PortMapList`: its items, each checked on its own.
    if let Some(item_kind) = kind.strip_suffix("List")
        && let Some(items) = object.get_mut("items")
    {
        let inherit = (!item_kind.is_empty()).then_some((api_version.as_str(), item_kind));
        return add_items(dump, path, &at, items.take(), inherit);
    }
    add_kind(
        dump,
        path,
        &at,
        Value::Object(object),
        (&api_version, &kind),
    )
}

/// Adds the items of a list at `at`, each with `inherit` as its type when it carries none.
fn add_items(
    dump: &mut Dump,
    path: &Path,
    at: &DocumentAt,
    items: Value,
    inherit: Option<(&str, &str)>,
) -> Result<(), InputError> {
    let items = match items {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        other => {
            return Err(document_error(
                path,
                at,
                format!("`items` must be a list, found {}", describe(&other)),
            ));
        }
    };
    for (index, item) in items.into_iter().enumerate() {
        let mut item_at = at.clone();
        item_at.items.push(index + 1);
        item_at.kind = None;
        item_at.name = None;
        add_object(dump, path, item_at, item, inherit)?;
    }
    Ok(())
}

/// Adds one object of type `(apiVersion, kind)` to where its kind goes; a kind `kuport plan`
/// does not read is skipped, and kuport's own kinds of another version with a warning. The
/// one place that says which kinds it reads: one arm per kind.
fn add_kind(
    dump: &mut Dump,
    path: &Path,
    at: &DocumentAt,
    doc: Value,
    (api_version, kind): (&str, &str),
) -> Result<(), InputError> {
    let ours = format!("{GROUP}/{VERSION}");
    let snapshot = &mut dump.snapshot;
    match (api_version, kind) {
        (v, "PortMapClass") if v == ours => {
            snapshot.classes.push(typed::<PortMapClass>(doc, at, path)?);
        }
        (v, "PortMap") if v == ours => {
            snapshot.portmaps.push(typed::<PortMap>(doc, at, path)?);
        }
        (v, "PortMapNode") if v == ours => {
            snapshot
                .portmap_nodes
                .push(typed::<PortMapNode>(doc, at, path)?);
        }
        (v, k) if v == EndpointSlice::API_VERSION && k == EndpointSlice::KIND => {
            snapshot
                .endpoint_slices
                .push(typed::<EndpointSlice>(doc, at, path)?);
        }
        (v, k) if v == Node::API_VERSION && k == Node::KIND => {
            snapshot.nodes.push(typed::<Node>(doc, at, path)?);
        }
        (v, k) if v == Namespace::API_VERSION && k == Namespace::KIND => {
            snapshot.namespaces.push(typed::<Namespace>(doc, at, path)?);
        }
        (v, k) if v == Service::API_VERSION && k == Service::KIND => {
            snapshot.services.push(typed::<Service>(doc, at, path)?);
        }
        (v, k) if v == Pod::API_VERSION && k == Pod::KIND => {
            snapshot.pods.push(typed::<Pod>(doc, at, path)?);
        }
        (v, k) if v == DaemonSet::API_VERSION && k == DaemonSet::KIND => {
            let daemon_set = typed::<DaemonSet>(doc, at, path)?;
            dump.daemon_sets
                .get_or_insert_with(Vec::new)
                .push(daemon_set);
        }
        (v, k) if v == ConfigMap::API_VERSION && k == ConfigMap::KIND => {
            // Only cilium-config is read; another ConfigMap is not even parsed.
            let (cm_namespace, cm_name) = CILIUM_CONFIG;
            let object = doc.as_object();
            let field = |name| object.and_then(|o| metadata_field(o, name));
            if field("namespace").as_deref() == Some(cm_namespace)
                && field("name").as_deref() == Some(cm_name)
            {
                let config = typed::<ConfigMap>(doc, at, path)?;
                snapshot.cni = Some(CniFacts::from_cilium_config(&config));
            }
        }
        (v, k) if v == Event::API_VERSION && k == Event::KIND => {
            dump.events.push(typed::<Event>(doc, at, path)?);
        }
        (v, "PortMapClass" | "PortMap" | "PortMapNode") if v.starts_with(&format!("{GROUP}/")) => {
            eprintln!(
                "warning: {}: {at}: {v} is not an API version this kuport reads ({ours}); skipped",
                path.display()
            );
        }
        _ => {}
    }
    Ok(())
}

/// A string field of an object's metadata.
fn metadata_field(object: &serde_json::Map<String, Value>, name: &str) -> Option<String> {
    object
        .get("metadata")
        .and_then(|m| m.get(name))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The error of the document at `at` in `path`.
fn document_error(path: &Path, at: &DocumentAt, problem: String) -> InputError {
    InputError::Document {
        path: path.to_owned(),
        at: Box::new(at.clone()),
        problem,
    }
}

fn typed<T: DeserializeOwned>(doc: Value, at: &DocumentAt, path: &Path) -> Result<T, InputError> {
    serde_path_to_error::deserialize(doc).map_err(|e| InputError::Document {
        path: path.to_owned(),
        at: Box::new(at.clone()),
        problem: located(&e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(document: usize, items: Vec<usize>, kind: Option<&str>, name: Option<&str>) -> String {
        DocumentAt {
            document,
            items,
            kind: kind.map(str::to_owned),
            name: name.map(str::to_owned),
        }
        .to_string()
    }

    #[test]
    fn document_positions_read_naturally() {
        assert_eq!(at(2, vec![], None, None), "document 2");
        assert_eq!(
            at(1, vec![3], Some("PortMap"), Some("games/gs")),
            "document 1, item 3 (PortMap games/gs)"
        );
        assert_eq!(at(4, vec![], Some("Node"), None), "document 4 (Node)");
    }

    #[test]
    fn json_by_extension_yaml_otherwise() {
        assert_eq!(Format::of(Path::new("a/b.JSON")), Format::Json);
        assert_eq!(Format::of(Path::new("a/b.yml")), Format::Yaml);
        assert_eq!(Format::of(Path::new("objects")), Format::Yaml);
    }

    #[test]
    fn typed_lists_lend_their_kind_to_items() {
        let mut snapshot = Dump::default();
        let doc = serde_json::json!({
            "apiVersion": "v1", "kind": "NamespaceList",
            "items": [{"metadata": {"name": "games"}}]
        });
        let start = DocumentAt {
            document: 1,
            items: vec![],
            kind: None,
            name: None,
        };
        let added = add_object(&mut snapshot, Path::new("x.yaml"), start, doc, None);
        assert!(added.is_ok(), "{added:?}");
        assert_eq!(snapshot.snapshot.namespaces.len(), 1);
    }

    #[test]
    fn a_nodes_own_object_outranks_its_row_in_the_class() {
        let dir = std::env::temp_dir().join(format!("kuport-objects-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let file = dir.join("dump.yaml");
        let text = r#"
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata: {name: public}
spec: {nodes: {a: {interfaces: [eth0]}}, returnPath: {mode: None}}
status:
  nodes:
    - {name: a, ready: true, message: in the class}
    - {name: b, ready: true, message: in the class}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapNode
metadata: {name: b}
spec:
  classes:
    - class: public
      row: {name: b, ready: false, message: in its object}
"#;
        std::fs::write(&file, text).expect("write the dump");
        let dump = load_dump(&[file]).expect("the dump loads");
        std::fs::remove_dir_all(&dir).expect("remove scratch dir");
        assert_eq!(dump.snapshot.portmap_nodes.len(), 1);
        let rows: Vec<(String, Option<String>)> = dump.snapshot.classes[0]
            .status
            .iter()
            .flat_map(|s| s.nodes.iter())
            .map(|r| (r.name.clone(), r.message.clone()))
            .collect();
        assert_eq!(
            rows,
            [
                ("a".to_owned(), Some("in the class".to_owned())),
                ("b".to_owned(), Some("in its object".to_owned())),
            ]
        );
    }

    #[test]
    fn a_scalar_document_is_not_an_object() {
        let mut snapshot = Dump::default();
        let start = DocumentAt {
            document: 2,
            items: vec![],
            kind: None,
            name: None,
        };
        let err = add_object(
            &mut snapshot,
            Path::new("x.yaml"),
            start,
            Value::String("hello".into()),
            None,
        );
        let message = err.map(|_| ()).unwrap_err().to_string();
        assert_eq!(
            message,
            "x.yaml: document 2: expected a Kubernetes object, found a string"
        );
    }
}
