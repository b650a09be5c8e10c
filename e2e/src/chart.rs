//! A renderer for the thin subset of Helm templates `deploy/chart/templates/` is written in, so
//! the chart can be checked against `deploy/manifests/` without a Helm binary.
//!
//! Supported: text; `{{ pipeline }}` with `{{-` / `-}}` trimming; `{{/* comments */}}`;
//! `if` / `else if` / `else` / `end`; `range $key, $value := pipeline` over a map (keys sorted, as
//! Helm does) or a list (`$key` is the index); operands `.Values.a.b`, `.Release.X`, `.Chart.X`,
//! `$.Release.X` (the root inside a `range`), `$var`, `$var.a`, string and integer literals; functions `toYaml`, `nindent`, `indent`,
//! `quote` and `default`, called directly or through `|`. Anything else is an error naming the
//! template and the construct, so a template that grows past this subset fails the tests instead
//! of being rendered wrongly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Why a chart could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// A file of the chart could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A YAML file of the chart (Chart.yaml, values.yaml) does not parse.
    #[error("parsing {path}: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A template uses something outside the supported subset, or fails to evaluate.
    #[error("template {template}: {message}")]
    Template {
        /// The template's file name.
        template: String,
        /// What went wrong.
        message: String,
    },
}

/// A chart on disk: its metadata, default values and templates.
#[derive(Debug)]
pub struct Chart {
    /// `Chart.yaml`, as JSON.
    pub meta: Value,
    /// `values.yaml`, as JSON.
    pub values: Value,
    /// Template file name → text, sorted by name (`*.yaml` in `templates/`; helpers and
    /// NOTES.txt are not objects and are left out).
    pub templates: BTreeMap<String, String>,
}

/// One rendered template.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The template's file name.
    pub template: String,
    /// The rendered text (zero or more YAML documents).
    pub text: String,
}

impl Chart {
    /// Reads the chart in `dir`.
    pub fn load(dir: &Path) -> Result<Self, ChartError> {
        let meta = read_yaml(&dir.join("Chart.yaml"))?;
        let values = read_yaml(&dir.join("values.yaml"))?;
        let templates_dir = dir.join("templates");
        let entries = std::fs::read_dir(&templates_dir).map_err(|source| ChartError::Read {
            path: templates_dir.clone(),
            source,
        })?;
        let mut templates = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(|source| ChartError::Read {
                path: templates_dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".yaml") {
                continue;
            }
            let path = entry.path();
            let text = std::fs::read_to_string(&path)
                .map_err(|source| ChartError::Read { path, source })?;
            templates.insert(name, text);
        }
        Ok(Self {
            meta,
            values,
            templates,
        })
    }

    /// Renders every template with the chart's values merged with `overrides` (maps merge key
    /// by key, anything else replaces), as `helm template --namespace <namespace> <release>`.
    pub fn render(
        &self,
        release: &str,
        namespace: &str,
        overrides: &Value,
    ) -> Result<Vec<Rendered>, ChartError> {
        let mut values = self.values.clone();
        merge(&mut values, overrides);
        let field = |key: &str| self.meta.get(key).cloned().unwrap_or(Value::Null);
        let context = serde_json::json!({
            "Values": values,
            "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
            "Chart": {
                "Name": field("name"),
                "Version": field("version"),
                "AppVersion": field("appVersion"),
            },
        });
        self.templates
            .iter()
            .map(|(name, text)| {
                let text =
                    render_template(text, &context).map_err(|message| ChartError::Template {
                        template: name.clone(),
                        message,
                    })?;
                Ok(Rendered {
                    template: name.clone(),
                    text,
                })
            })
            .collect()
    }
}

fn read_yaml(path: &Path) -> Result<Value, ChartError> {
    let text = std::fs::read_to_string(path).map_err(|source| ChartError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_saphyr::from_str::<Value>(&text).map_err(|e| ChartError::Yaml {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Deep-merges `overrides` into `base`: maps key by key, anything else replaced.
pub fn merge(base: &mut Value, overrides: &Value) {
    match (base, overrides) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// Renders one template against `context` (`{Values, Release, Chart}`).
pub fn render_template(text: &str, context: &Value) -> Result<String, String> {
    let tokens = tokenize(text)?;
    let mut pos = 0;
    let (nodes, stop) = parse_block(&tokens, &mut pos)?;
    if let Some(stop) = stop {
        return Err(format!("unexpected {{{{ {stop} }}}} at top level"));
    }
    let mut out = String::new();
    let mut vars = BTreeMap::new();
    render_nodes(&nodes, context, &mut vars, &mut out)?;
    Ok(out)
}

#[derive(Debug)]
enum Token {
    Text(String),
    Action(String),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = text;
    let mut trim_next = false;
    while let Some(start) = rest.find("{{") {
        let mut before = &rest[..start];
        if trim_next {
            before = before.trim_start();
        }
        let after_open = &rest[start + 2..];
        let trim_left = after_open.starts_with("- ") || after_open.starts_with("-\n");
        if trim_left {
            before = before.trim_end();
        }
        tokens.push(Token::Text(before.to_owned()));
        let end = after_open
            .find("}}")
            .ok_or_else(|| "an action is not closed with }}".to_owned())?;
        let mut body = &after_open[..end];
        if trim_left {
            body = &body[1..];
        }
        trim_next = body.ends_with(" -") || body.ends_with("\n-");
        if trim_next {
            body = &body[..body.len() - 1];
        }
        let body = body.trim();
        if !(body.starts_with("/*") && body.ends_with("*/")) {
            tokens.push(Token::Action(body.to_owned()));
        }
        rest = &after_open[end + 2..];
    }
    let last = if trim_next { rest.trim_start() } else { rest };
    tokens.push(Token::Text(last.to_owned()));
    Ok(tokens)
}

#[derive(Debug)]
enum Node {
    Text(String),
    Expr(String),
    If {
        branches: Vec<(String, Vec<Node>)>,
        otherwise: Vec<Node>,
    },
    Range {
        key: String,
        value: String,
        over: String,
        body: Vec<Node>,
    },
}

/// Parses nodes until an `else`, `else if` or `end` (returned) or the end of input.
fn parse_block(tokens: &[Token], pos: &mut usize) -> Result<(Vec<Node>, Option<String>), String> {
    let mut nodes = Vec::new();
    while let Some(token) = tokens.get(*pos) {
        *pos += 1;
        match token {
            Token::Text(t) => nodes.push(Node::Text(t.clone())),
            Token::Action(a) if a == "end" || a == "else" || a.starts_with("else if ") => {
                return Ok((nodes, Some(a.clone())));
            }
            Token::Action(a) => {
                if let Some(cond) = a.strip_prefix("if ") {
                    nodes.push(parse_if(cond.trim(), tokens, pos)?);
                } else if let Some(spec) = a.strip_prefix("range ") {
                    let (vars, over) = spec
                        .split_once(":=")
                        .ok_or_else(|| format!("range without `$k, $v :=`: {a}"))?;
                    let (key, value) = vars
                        .split_once(',')
                        .ok_or_else(|| format!("range needs two variables: {a}"))?;
                    let (body, stop) = parse_block(tokens, pos)?;
                    if stop.as_deref() != Some("end") {
                        return Err(format!("range not closed by end: {a}"));
                    }
                    nodes.push(Node::Range {
                        key: var_name(key)?,
                        value: var_name(value)?,
                        over: over.trim().to_owned(),
                        body,
                    });
                } else if ["with ", "define ", "template ", "block "]
                    .iter()
                    .any(|k| a.starts_with(k))
                {
                    return Err(format!("unsupported action: {{{{ {a} }}}}"));
                } else {
                    nodes.push(Node::Expr(a.clone()));
                }
            }
        }
    }
    Ok((nodes, None))
}

fn parse_if(cond: &str, tokens: &[Token], pos: &mut usize) -> Result<Node, String> {
    let mut branches = Vec::new();
    let mut cond = cond.to_owned();
    loop {
        let (body, stop) = parse_block(tokens, pos)?;
        branches.push((cond.clone(), body));
        match stop.as_deref() {
            Some("end") => {
                return Ok(Node::If {
                    branches,
                    otherwise: Vec::new(),
                });
            }
            Some("else") => {
                let (otherwise, stop) = parse_block(tokens, pos)?;
                if stop.as_deref() != Some("end") {
                    return Err(format!("if {} not closed by end", branches[0].0));
                }
                return Ok(Node::If {
                    branches,
                    otherwise,
                });
            }
            Some(s) if s.starts_with("else if ") => cond = s["else if ".len()..].trim().to_owned(),
            _ => return Err(format!("if {} not closed by end", branches[0].0)),
        }
    }
}

fn var_name(text: &str) -> Result<String, String> {
    let t = text.trim();
    match t.strip_prefix('$') {
        Some(name) if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_') => {
            Ok(name.to_owned())
        }
        _ => Err(format!("{t:?} is not a variable")),
    }
}

fn render_nodes(
    nodes: &[Node],
    context: &Value,
    vars: &mut BTreeMap<String, Value>,
    out: &mut String,
) -> Result<(), String> {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Expr(e) => out.push_str(&scalar_text(&eval_pipeline(e, context, vars)?, e)?),
            Node::If {
                branches,
                otherwise,
            } => {
                let mut taken = false;
                for (cond, body) in branches {
                    if truthy(&eval_pipeline(cond, context, vars)?) {
                        render_nodes(body, context, vars, out)?;
                        taken = true;
                        break;
                    }
                }
                if !taken {
                    render_nodes(otherwise, context, vars, out)?;
                }
            }
            Node::Range {
                key,
                value,
                over,
                body,
            } => {
                let items: Vec<(Value, Value)> = match eval_pipeline(over, context, vars)? {
                    Value::Null => Vec::new(),
                    Value::Object(map) => {
                        let sorted: BTreeMap<String, Value> = map.into_iter().collect();
                        sorted
                            .into_iter()
                            .map(|(k, v)| (Value::String(k), v))
                            .collect()
                    }
                    Value::Array(list) => list
                        .into_iter()
                        .enumerate()
                        .map(|(i, v)| (Value::from(i), v))
                        .collect(),
                    other => {
                        return Err(format!("range over {over}: {other} is not a map or list"));
                    }
                };
                for (k, v) in items {
                    vars.insert(key.clone(), k);
                    vars.insert(value.clone(), v);
                    render_nodes(body, context, vars, out)?;
                }
                vars.remove(key);
                vars.remove(value);
            }
        }
    }
    Ok(())
}

/// Go template truthiness: false, 0, "", null and empty collections are false.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn scalar_text(v: &Value, expr: &str) -> Result<String, String> {
    match v {
        Value::Null => Ok(String::new()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(_) | Value::Object(_) => Err(format!(
            "{{{{ {expr} }}}} renders a list or map: use toYaml"
        )),
    }
}

/// Splits `text` on `sep` outside double quotes.
fn split_outside_quotes(text: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in text.chars() {
        if quoted {
            current.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                quoted = false;
            }
        } else if c == '"' {
            quoted = true;
            current.push(c);
        } else if c == sep {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    parts.push(current);
    parts
}

fn eval_pipeline(
    text: &str,
    context: &Value,
    vars: &BTreeMap<String, Value>,
) -> Result<Value, String> {
    let mut acc: Option<Value> = None;
    for command in split_outside_quotes(text, '|') {
        let words: Vec<String> = split_outside_quotes(command.trim(), ' ')
            .into_iter()
            .filter(|w| !w.is_empty())
            .collect();
        let Some((first, rest)) = words.split_first() else {
            return Err(format!("empty command in {{{{ {text} }}}}"));
        };
        let is_function = first
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic());
        if !is_function {
            if !rest.is_empty() || acc.is_some() {
                return Err(format!("{{{{ {text} }}}}: {first} is not a function"));
            }
            acc = Some(operand(first, context, vars)?);
            continue;
        }
        let mut args = rest
            .iter()
            .map(|w| operand(w, context, vars))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(piped) = acc.take() {
            args.push(piped);
        }
        acc = Some(call(first, args).map_err(|e| format!("{{{{ {text} }}}}: {e}"))?);
    }
    acc.ok_or_else(|| format!("{{{{ {text} }}}} has no value"))
}

fn operand(word: &str, context: &Value, vars: &BTreeMap<String, Value>) -> Result<Value, String> {
    if let Some(quoted) = word.strip_prefix('"') {
        return serde_json::from_str::<String>(&format!("\"{quoted}"))
            .map(Value::String)
            .map_err(|e| format!("string literal {word}: {e}"));
    }
    if let Ok(n) = word.parse::<i64>() {
        return Ok(Value::from(n));
    }
    let (root, path) = if let Some(path) = word.strip_prefix("$.") {
        // `$` is the root context, also inside `range` (where `.` is the element).
        (context, path)
    } else if let Some(rest) = word.strip_prefix('$') {
        let (name, path) = rest.split_once('.').unwrap_or((rest, ""));
        let root = vars
            .get(name)
            .ok_or_else(|| format!("undefined variable ${name}"))?;
        (root, path)
    } else if let Some(path) = word.strip_prefix('.') {
        (context, path)
    } else {
        return Err(format!("unsupported operand {word}"));
    };
    let mut current = root;
    for key in path.split('.').filter(|k| !k.is_empty()) {
        match current {
            Value::Object(map) => match map.get(key) {
                Some(v) => current = v,
                None => return Ok(Value::Null),
            },
            Value::Null => return Ok(Value::Null),
            other => return Err(format!("{word}: cannot read {key} of {other}")),
        }
    }
    Ok(current.clone())
}

fn call(name: &str, args: Vec<Value>) -> Result<Value, String> {
    let arity = |n: usize| {
        if args.len() == n {
            Ok(())
        } else {
            Err(format!("{name} takes {n} arguments, got {}", args.len()))
        }
    };
    match name {
        "toYaml" => {
            arity(1)?;
            to_yaml(&args[0]).map(Value::String)
        }
        "quote" => {
            arity(1)?;
            let text = scalar_text(&args[0], "quote")?;
            serde_json::to_string(&text)
                .map(Value::String)
                .map_err(|e| e.to_string())
        }
        "nindent" | "indent" => {
            arity(2)?;
            let width = args[0]
                .as_u64()
                .ok_or_else(|| format!("{name}: the width must be a number"))?;
            let pad = " ".repeat(usize::try_from(width).map_err(|e| e.to_string())?);
            let text = scalar_text(&args[1], name)?;
            let indented: Vec<String> = text.lines().map(|l| format!("{pad}{l}")).collect();
            let body = indented.join("\n");
            Ok(Value::String(if name == "nindent" {
                format!("\n{body}")
            } else {
                body
            }))
        }
        "default" => {
            arity(2)?;
            let mut args = args;
            let given = args.pop().unwrap_or(Value::Null);
            let fallback = args.pop().unwrap_or(Value::Null);
            Ok(if truthy(&given) { given } else { fallback })
        }
        other => Err(format!("unsupported function {other}")),
    }
}

/// YAML for `toYaml`: block style, no trailing newline (Helm trims it).
fn to_yaml(value: &Value) -> Result<String, String> {
    match value {
        Value::Null => Ok("null".to_owned()),
        Value::Object(map) if map.is_empty() => Ok("{}".to_owned()),
        Value::Array(list) if list.is_empty() => Ok("[]".to_owned()),
        _ => {
            let sorted = sort_keys(value);
            serde_saphyr::to_string(&sorted)
                .map(|s| s.trim_end().to_owned())
                .map_err(|e| format!("toYaml: {e}"))
        }
    }
}

/// Helm's toYaml sorts map keys.
fn sort_keys(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, Value> =
                map.iter().map(|(k, v)| (k, sort_keys(v))).collect();
            let mut out = Map::new();
            for (k, v) in sorted {
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        Value::Array(list) => Value::Array(list.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx(values: Value) -> Value {
        json!({"Values": values, "Release": {"Namespace": "ns"}, "Chart": {"AppVersion": "1.2.3"}})
    }

    #[test]
    fn substitutes_and_trims_like_helm() {
        let t = "a: {{ .Values.x }}\n{{- if .Values.on }}\nb: {{ .Release.Namespace }}\n{{- end }}\nc: 1\n";
        assert_eq!(
            render_template(t, &ctx(json!({"x": 5, "on": true}))).expect("render"),
            "a: 5\nb: ns\nc: 1\n"
        );
        assert_eq!(
            render_template(t, &ctx(json!({"x": "s", "on": false}))).expect("render"),
            "a: s\nc: 1\n"
        );
    }

    #[test]
    fn else_if_chains_pick_the_first_true_branch() {
        let t = "{{ if .Values.d }}@{{ .Values.d }}{{ else if .Values.t }}:{{ .Values.t }}{{ else }}:v{{ .Chart.AppVersion }}{{ end }}";
        assert_eq!(
            render_template(t, &ctx(json!({"d": "sha256:1", "t": "x"}))).expect("render"),
            "@sha256:1"
        );
        assert_eq!(
            render_template(t, &ctx(json!({"d": "", "t": "x"}))).expect("render"),
            ":x"
        );
        assert_eq!(
            render_template(t, &ctx(json!({"d": "", "t": ""}))).expect("render"),
            ":v1.2.3"
        );
    }

    #[test]
    fn to_yaml_nindent_and_range_over_sorted_keys() {
        let t = "{{- range $n, $s := .Values.m }}\n- {{ $n }}:\n  {{- toYaml $s | nindent 4 }}\n{{- end }}\n";
        let out = render_template(
            t,
            &ctx(json!({"m": {"b": {"z": 1, "a": [1, 2]}, "a": {"k": "v"}}})),
        )
        .expect("render");
        let parsed: Value = serde_saphyr::from_str(&out).expect("yaml");
        assert_eq!(
            parsed,
            json!([{"a": {"k": "v"}}, {"b": {"a": [1, 2], "z": 1}}])
        );
        assert!(out.find("- a:").expect("a") < out.find("- b:").expect("b"));
    }

    #[test]
    fn dollar_is_the_root_inside_a_range() {
        let t = "{{- range $n, $s := .Values.m }}\n{{ $n }}: {{ $.Release.Namespace }}/{{ $s }}\n{{- end }}\n";
        let out = render_template(t, &ctx(json!({"m": {"a": 1}}))).expect("render");
        assert_eq!(out, "\na: ns/1\n");
    }

    #[test]
    fn quote_and_default() {
        let t =
            "{{ .Values.s | quote }} {{ .Values.missing | default \"d\" }} {{ quote .Values.n }}";
        assert_eq!(
            render_template(t, &ctx(json!({"s": "a\"b", "n": 7}))).expect("render"),
            "\"a\\\"b\" d \"7\""
        );
    }

    #[test]
    fn refuses_what_it_does_not_support() {
        for t in [
            "{{ include \"x\" . }}",
            "{{ with .Values.x }}{{ end }}",
            "{{ .Values.m }}",
            "{{ if .Values.x }}",
            "{{ end }}",
            "{{ .Values.x",
            "{{ $nope }}",
        ] {
            assert!(
                render_template(t, &ctx(json!({"m": {"a": 1}, "x": true}))).is_err(),
                "{t} rendered"
            );
        }
    }

    #[test]
    fn merge_replaces_scalars_and_lists_and_merges_maps() {
        let mut base = json!({"a": {"b": 1, "c": [1]}, "d": 1});
        merge(&mut base, &json!({"a": {"c": [2], "e": 3}}));
        assert_eq!(base, json!({"a": {"b": 1, "c": [2], "e": 3}, "d": 1}));
    }
}
