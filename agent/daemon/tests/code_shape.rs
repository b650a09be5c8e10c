//! The shape of the code, checked so that it stays easy to change:
//! - no import cycle between the modules of a crate (edges from `crate::`, `super::` and
//!   `self::` paths in production code; a module and its own ancestors or descendants do not
//!   count, since a parent declaring its children and a child reading its parent is the normal
//!   tree);
//! - no production function longer than [`MAX_FN_LINES`] lines unless the comment and attribute
//!   lines directly above its `fn` line carry a `// Long:` line saying why.
//!
//! Production code is every crate's `src/` outside `#[cfg(test)]` items. `cargo test -p kuport
//! --test code_shape -- --nocapture` prints the measures (cycles, long functions, largest
//! files).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a function may be without a stated reason.
const MAX_FN_LINES: usize = 80;

/// Every crate of the workspace, by directory.
const CRATES: &[&str] = &[
    "agent/core",
    "agent/host",
    "agent/daemon",
    "sim",
    "sim/simulator",
    "lab",
    "e2e",
    "e2e/realapi",
    "testkit",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One source file of a crate: its module path (`plan::classes`; the crate root is empty) and
/// its production text with comments, strings and test items blanked.
struct Module {
    file: PathBuf,
    path: Vec<String>,
    original: String,
    code: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `lib.rs` the root; `main.rs` a root of its
/// own, named `main` so its edges stay apart from the library's.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// Blanks comments, string and character literals (keeping line breaks and lengths), so braces
/// and paths inside them are not read as code.
fn blank_literals(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in out.iter_mut().take(to).skip(from) {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if b[i] == b'r'
            && (i == 0 || !is_ident(b[i - 1]))
            && matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
        {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let start = i + 2 + hashes;
            let end = find(b, start, &close).map_or(b.len(), |p| p + close.len());
            blank(&mut out, i + 1, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j.min(b.len()));
            i = j + 1;
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\u{7b}'), not a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i + 1, end);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| from + p)
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The index just past the brace matching the one at `open`.
fn matching_brace(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// Blanks every `#[cfg(test)]` item; returns the names of test modules declared as files
/// (`#[cfg(test)] mod tests;`).
fn strip_test_items(code: &mut String) -> Vec<String> {
    let mut bytes = std::mem::take(code).into_bytes();
    let mut file_modules = Vec::new();
    let mut from = 0;
    while let Some(at) = find(&bytes, from, b"#[cfg(test)]") {
        let next = bytes[at..]
            .iter()
            .position(|&c| c == b'{' || c == b';')
            .map_or(bytes.len(), |p| at + p);
        let end = if bytes.get(next) == Some(&b'{') {
            matching_brace(&bytes, next)
        } else {
            let decl = String::from_utf8_lossy(&bytes[at + 12..next]).into_owned();
            if let Some(name) = decl.split_whitespace().skip_while(|w| *w != "mod").nth(1) {
                file_modules.push(name.to_owned());
            }
            (next + 1).min(bytes.len())
        };
        for c in bytes.iter_mut().take(end).skip(at) {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end;
    }
    *code = String::from_utf8_lossy(&bytes).into_owned();
    file_modules
}

fn load_crate(dir: &str) -> Vec<Module> {
    let src = workspace().join(dir).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = Vec::new();
    let mut test_files = BTreeSet::new();
    for file in files {
        let original = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let mut code = blank_literals(&original);
        let parent = file.parent().map(Path::to_path_buf).unwrap_or_default();
        let own_dir = if matches!(
            file.file_name().and_then(|n| n.to_str()),
            Some("mod.rs" | "lib.rs" | "main.rs")
        ) {
            parent.clone()
        } else {
            file.with_extension("")
        };
        for name in strip_test_items(&mut code) {
            test_files.insert(own_dir.join(format!("{name}.rs")));
            test_files.insert(own_dir.join(&name).join("mod.rs"));
        }
        let mut path = module_path(&src, &file);
        if file.file_name().is_some_and(|n| n == "main.rs") && file.parent() == Some(&src) {
            path = vec!["main".to_owned()];
        }
        modules.push(Module {
            file,
            path,
            original,
            code,
        });
    }
    // A test module's own submodules are test code too.
    modules.retain(|m| {
        !test_files
            .iter()
            .any(|t| m.file.starts_with(t.with_extension("")) || &m.file == t)
    });
    modules
}

/// Parses the use tree (or plain path) after `crate::`/`super::`/`self::` at `at`, appending
/// every full path it names to `out`.
fn parse_paths(code: &[u8], mut at: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        while code.get(at).is_some_and(|c| c.is_ascii_whitespace()) {
            at += 1;
        }
        if code.get(at) == Some(&b'{') {
            at += 1;
            loop {
                while code
                    .get(at)
                    .is_some_and(|c| c.is_ascii_whitespace() || *c == b',')
                {
                    at += 1;
                }
                match code.get(at) {
                    None => return at,
                    Some(b'}') => return at + 1,
                    _ => {
                        let before = at;
                        at = parse_paths(code, at, &path, out);
                        if at == before {
                            at += 1;
                        }
                    }
                }
            }
        }
        let start = at;
        while code.get(at).is_some_and(|&c| is_ident(c)) {
            at += 1;
        }
        if at == start {
            out.push(path);
            return at;
        }
        path.push(String::from_utf8_lossy(&code[start..at]).into_owned());
        if code[at..].starts_with(b"::") {
            at += 2;
        } else {
            out.push(path);
            return at;
        }
    }
}

/// The module each production path of `m` names, resolved against the crate's modules to the
/// deepest one it starts with.
fn references(m: &Module, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let code = m.code.as_bytes();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if i > 0 && (is_ident(code[i - 1]) || code[i - 1] == b':') {
            i += 1;
            continue;
        }
        let (base, len) = if code[i..].starts_with(b"crate::") {
            (Some(Vec::new()), 7)
        } else if code[i..].starts_with(b"self::") {
            (Some(m.path.clone()), 6)
        } else if code[i..].starts_with(b"super::") {
            let mut base = m.path.clone();
            let mut j = i;
            while code[j..].starts_with(b"super::") {
                base.pop();
                j += 7;
            }
            (Some(base), j - i)
        } else {
            (None, 1)
        };
        if let Some(base) = base {
            let base = if m.path.first().is_some_and(|p| p == "main") && len == 7 {
                vec!["main".to_owned()]
            } else {
                base
            };
            i = parse_paths(code, i + len, &base, &mut paths);
        } else {
            i += len;
        }
    }
    paths
        .into_iter()
        .filter_map(|p| {
            (0..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|prefix| known.contains(prefix))
        })
        .collect()
}

fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The import cycles of one crate: its strongly connected modules, each sorted.
fn cycles(modules: &[Module]) -> Vec<Vec<String>> {
    let known: BTreeSet<Vec<String>> = modules.iter().map(|m| m.path.clone()).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for m in modules {
        let to: BTreeSet<_> = references(m, &known)
            .into_iter()
            .filter(|t| !related(t, &m.path))
            .collect();
        edges.entry(m.path.clone()).or_default().extend(to);
    }
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for t in edges.get(&n).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<_, _> = known.iter().map(|k| (k.clone(), reach(k))).collect();
    let mut found: BTreeSet<Vec<String>> = BTreeSet::new();
    for (k, r) in &reachable {
        let scc: Vec<String> = r
            .iter()
            .filter(|o| reachable.get(*o).is_some_and(|back| back.contains(k)))
            .map(|o| o.join("::"))
            .collect();
        if scc.len() > 1 {
            found.insert(scc);
        }
    }
    found.into_iter().collect()
}

/// A production function: where it is, its name and its length in lines.
struct LongFn {
    at: String,
    lines: usize,
    reason: bool,
}

fn fn_name(line: &str) -> Option<&str> {
    let mut words = line.trim_start();
    for prefix in ["pub(crate) ", "pub(super) ", "pub "] {
        if let Some(rest) = words.strip_prefix(prefix) {
            words = rest.trim_start();
        }
    }
    if words.starts_with("pub(in ") {
        words = words.split_once(") ").map_or(words, |(_, r)| r);
    }
    for q in ["const ", "async ", "unsafe ", "extern \"C\" "] {
        if let Some(rest) = words.strip_prefix(q) {
            words = rest;
        }
    }
    let rest = words.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !c.is_alphanumeric() && c != '_')?;
    Some(&rest[..end])
}

/// Whether the comment and attribute lines right above line `at` carry a `// Long:` reason.
fn has_reason(lines: &[&str], at: usize) -> bool {
    lines[..at]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("//") || l.starts_with('#') || l.starts_with(")]"))
        .any(|l| l.starts_with("// Long:"))
}

fn long_functions(m: &Module) -> Vec<LongFn> {
    let code = m.code.as_bytes();
    let code_lines: Vec<&str> = m.code.lines().collect();
    let original: Vec<&str> = m.original.lines().collect();
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(m.code.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let mut out = Vec::new();
    for (n, line) in code_lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let start = line_starts[n];
        let Some(open) = code[start..].iter().position(|&c| c == b'{' || c == b';') else {
            continue;
        };
        if code[start + open] == b';' {
            continue;
        }
        let end = matching_brace(code, start + open);
        let last_line = m.code[..end].matches('\n').count();
        let lines = last_line - n + 1;
        if lines > MAX_FN_LINES {
            let rel = m.file.strip_prefix(workspace()).unwrap_or(&m.file);
            out.push(LongFn {
                at: format!("{}:{} {name}", rel.display(), n + 1),
                lines,
                reason: has_reason(&original, n),
            });
        }
    }
    out
}

struct Shape {
    cycles: Vec<(String, Vec<String>)>,
    long: Vec<LongFn>,
    files: Vec<(usize, String)>,
}

fn measure() -> Shape {
    let mut shape = Shape {
        cycles: Vec::new(),
        long: Vec::new(),
        files: Vec::new(),
    };
    for dir in CRATES {
        let modules = load_crate(dir);
        for c in cycles(&modules) {
            shape.cycles.push(((*dir).to_owned(), c));
        }
        for m in &modules {
            shape.long.extend(long_functions(m));
            let rel = m.file.strip_prefix(workspace()).unwrap_or(&m.file);
            shape
                .files
                .push((m.original.lines().count(), rel.display().to_string()));
        }
    }
    shape.files.sort_by(|a, b| b.cmp(a));
    shape
        .long
        .sort_by(|a, b| b.lines.cmp(&a.lines).then(a.at.cmp(&b.at)));
    shape
}

fn report(shape: &Shape) {
    eprintln!("import cycles: {}", shape.cycles.len());
    for (krate, c) in &shape.cycles {
        eprintln!("  {krate}: {}", c.join(" <-> "));
    }
    let unexplained = shape.long.iter().filter(|f| !f.reason).count();
    eprintln!(
        "functions over {MAX_FN_LINES} lines: {} ({unexplained} without a reason)",
        shape.long.len()
    );
    for f in &shape.long {
        let mark = if f.reason {
            "  (Long: reason given)"
        } else {
            ""
        };
        eprintln!("  {:4} {}{mark}", f.lines, f.at);
    }
    eprintln!("largest production files:");
    for (lines, file) in shape.files.iter().take(10) {
        eprintln!("  {lines:5} {file}");
    }
}

#[test]
fn no_import_cycle_between_modules() {
    let shape = measure();
    report(&shape);
    assert!(
        shape.cycles.is_empty(),
        "modules that import each other (move what they share into a module both use): {:?}",
        shape.cycles
    );
}

#[test]
fn no_long_function_without_a_reason() {
    let shape = measure();
    let unexplained: Vec<String> = shape
        .long
        .iter()
        .filter(|f| !f.reason)
        .map(|f| format!("{} ({} lines)", f.at, f.lines))
        .collect();
    assert!(
        unexplained.is_empty(),
        "production functions over {MAX_FN_LINES} lines: split them, or say why in a `// Long:` comment above: {unexplained:#?}"
    );
}

/// The checks themselves, on small sources: each would pass vacuously if the parsing broke.
mod checker {
    use super::*;

    fn module(path: &str, text: &str) -> Module {
        let mut code = blank_literals(text);
        strip_test_items(&mut code);
        Module {
            file: PathBuf::from(format!("src/{}.rs", path.replace("::", "/"))),
            path: path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            original: text.to_owned(),
            code,
        }
    }

    #[test]
    fn siblings_importing_each_other_are_a_cycle_and_a_parent_is_not() {
        let modules = [
            module("", "mod plan;"),
            module("plan", "mod a; mod b; pub use a::X;"),
            module("plan::a", "use super::b::Y; use crate::plan::Z;"),
            module("plan::b", "use crate::plan::{a::{X, W}, c};"),
        ];
        assert_eq!(
            cycles(&modules),
            vec![vec!["plan::a".to_owned(), "plan::b".to_owned()]]
        );
        let without = [
            module("", "mod plan;"),
            module("plan", "mod a; mod b;"),
            module("plan::a", "use super::b::Y;"),
            module(
                "plan::b",
                "use super::X; // crate::plan::a::X\nconst S: &str = \"crate::plan::a\";",
            ),
        ];
        assert!(cycles(&without).is_empty());
    }

    #[test]
    fn test_modules_do_not_count() {
        let modules = [
            module("a", "use crate::b::Y;"),
            module(
                "b",
                "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::a::X;\n}\n",
            ),
        ];
        assert!(cycles(&modules).is_empty());
    }

    #[test]
    fn a_long_function_needs_a_reason_and_braces_in_strings_do_not_end_it() {
        let body: String = (0..MAX_FN_LINES)
            .map(|i| format!("    let _x{i} = \"}}\";\n"))
            .collect();
        let text = format!("fn short() {{}}\npub(crate) fn long() {{\n{body}}}\n");
        let m = module("a", &text);
        let found = long_functions(&m);
        assert_eq!(found.len(), 1);
        assert!(found[0].at.ends_with(" long"), "{}", found[0].at);
        assert_eq!(found[0].lines, MAX_FN_LINES + 2);
        assert!(!found[0].reason);
        let explained = format!("// Long: a table.\n#[inline]\nfn long() {{\n{body}}}\n");
        assert!(long_functions(&module("a", &explained))[0].reason);
    }
}
