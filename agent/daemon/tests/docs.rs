//! The documentation says what the code does: every condition and Event reason the agent can
//! write is explained in docs/troubleshooting.md (and named in docs/api.md), the generated field
//! reference in docs/api.md is what `kuport crds --markdown` prints now, and every `kuport`
//! subcommand and flag, `cargo` alias and package, `just` recipe and repository path that
//! README.md or docs/*.md names in backticks or a code block exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use kuport::agent::status::CLASS_EVENT_REASONS;
use kuport_core::api_docs;
use kuport_core::plan::{AcceptedReason, ClassReason, ProgrammedReason};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// README.md and every docs/*.md, sorted, as (repository path, text).
fn documents() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_owned()];
    let dir = repo_root().join("docs");
    let mut docs: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| {
            e.expect("docs entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names.into_iter().map(|n| (n.clone(), read(&n))).collect()
}

fn kuport(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kuport"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running kuport {args:?}: {e}"));
    assert!(
        out.status.success(),
        "kuport {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kuport prints UTF-8")
}

// ---- (1) reasons ----------------------------------------------------------------------------

/// Every (table label, reason) the code can write: condition reasons from the reason enums'
/// `ALL` lists (which the compiler keeps complete), and the Event reasons that are not
/// condition reasons.
fn written_reasons() -> Vec<(&'static str, &'static str)> {
    let mut all = Vec::new();
    all.extend(AcceptedReason::ALL.iter().map(|r| ("Accepted", r.as_str())));
    all.extend(
        ProgrammedReason::ALL
            .iter()
            .map(|r| ("Programmed", r.as_str())),
    );
    all.extend(ClassReason::ALL.iter().map(|r| ("Ready", r.as_str())));
    all.extend(CLASS_EVENT_REASONS.iter().map(|r| ("Event", *r)));
    all
}

/// The reasons `doc` has no table row for: a row starts `| <label> | `<Reason>` |`.
fn missing_reason_rows(doc: &str, reasons: &[(&str, &str)]) -> Vec<String> {
    reasons
        .iter()
        .filter(|(label, reason)| {
            let row = format!("| {label} | `{reason}` |");
            !doc.lines().any(|l| l.starts_with(&row))
        })
        .map(|(label, reason)| format!("| {label} | `{reason}` | ..."))
        .collect()
}

#[test]
fn every_reason_the_code_writes_is_explained_in_troubleshooting() {
    let reasons = written_reasons();
    assert!(
        reasons.len() >= 20,
        "the reason lists look empty: {reasons:?}"
    );
    let missing = missing_reason_rows(&read("docs/troubleshooting.md"), &reasons);
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md has no row for these reasons (add one to \"Every condition \
         reason\", with the meaning and the first check):\n{}",
        missing.join("\n")
    );
}

/// Reason rows of `doc` (`| <label> | `<Reason>` |` for a known label) naming a reason the code
/// does not write: a renamed or removed reason left behind.
fn stale_reason_rows(doc: &str, reasons: &[(&str, &str)]) -> Vec<String> {
    let labels: BTreeSet<&str> = reasons.iter().map(|(l, _)| *l).collect();
    doc.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let (label, reason) = (*cells.get(1)?, cells.get(2)?.strip_prefix('`')?);
            let reason = reason.strip_suffix('`')?;
            (labels.contains(label) && !reasons.contains(&(label, reason)))
                .then(|| format!("| {label} | `{reason}` |"))
        })
        .collect()
}

#[test]
fn troubleshooting_explains_no_reason_the_code_does_not_write() {
    let stale = stale_reason_rows(&read("docs/troubleshooting.md"), &written_reasons());
    assert!(
        stale.is_empty(),
        "docs/troubleshooting.md explains reasons the code never writes (renamed or removed?):\n{}",
        stale.join("\n")
    );
}

#[test]
fn every_reason_the_code_writes_is_named_in_the_api_reference() {
    let api = read("docs/api.md");
    let missing: Vec<&str> = written_reasons()
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| !api.contains(&format!("`{r}`")))
        .collect();
    assert!(missing.is_empty(), "docs/api.md never names {missing:?}");
}

#[test]
fn the_reason_check_notices_a_missing_row() {
    let doc = "| Accepted | `Valid` | True | ok |\n| Ready | `Valid` | x |\n";
    let reasons = [
        ("Accepted", "Valid"),
        ("Accepted", "PortInUse"),
        ("Ready", "Valid"),
    ];
    assert_eq!(
        missing_reason_rows(doc, &reasons),
        vec!["| Accepted | `PortInUse` | ...".to_owned()]
    );
    assert_eq!(
        stale_reason_rows(
            "| Accepted | `Gone` | False | x |\n| Other | `Gone` |\n",
            &reasons
        ),
        vec!["| Accepted | `Gone` |".to_owned()]
    );
    // A reason named only in prose, or under another condition, does not count.
    let prose = "PortInUse is explained here.\n| Programmed | `PortInUse` | x |\n";
    assert_eq!(
        missing_reason_rows(prose, &[("Accepted", "PortInUse")]).len(),
        1
    );
}

// ---- (2) the generated API reference --------------------------------------------------------

#[test]
fn api_md_field_reference_is_what_the_types_generate() {
    let generated = kuport(&["crds", "--markdown"]);
    assert!(generated.contains("### PortMapClass"), "{generated}");
    let text = read("docs/api.md");
    let committed =
        api_docs::generated_section(&text, "docs/api.md").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        committed == generated,
        "docs/api.md's generated section differs from the types; run `cargo run -q -p kuport -- \
         crds --markdown --update docs/api.md` and commit"
    );
}

#[test]
fn crds_markdown_update_rewrites_only_the_section() {
    let dir = std::env::temp_dir().join(format!("kuport-api-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let file = dir.join("api.md");
    let before = format!(
        "# Hand\n\nkept\n\n{}\nstale\n{}\n\nkept too\n",
        api_docs::BEGIN_MARKER,
        api_docs::END_MARKER
    );
    std::fs::write(&file, &before).expect("write scratch api.md");
    let path = file.to_str().expect("UTF-8 temp path");
    kuport(&["crds", "--markdown", "--update", path]);
    let after = std::fs::read_to_string(&file).expect("read back");
    assert!(after.starts_with("# Hand\n\nkept\n\n"), "{after}");
    assert!(after.ends_with(&format!("{}\n\nkept too\n", api_docs::END_MARKER)));
    assert!(!after.contains("stale") && after.contains("| `spec.className` |"));
    std::fs::remove_dir_all(&dir).expect("remove scratch dir");
}

// ---- (3) commands and paths the docs name ---------------------------------------------------

/// A piece of code in a document: an inline code span or a line of a fenced block.
struct Code {
    doc: String,
    line: usize,
    text: String,
}

fn code_spans(doc: &str, text: &str) -> Vec<Code> {
    let mut spans = Vec::new();
    let mut fenced = false;
    // Inline spans may wrap across lines: they are read per paragraph (or table row).
    let mut paragraph: Option<(usize, String)> = None;
    let flush = |paragraph: &mut Option<(usize, String)>, spans: &mut Vec<Code>| {
        if let Some((line, text)) = paragraph.take() {
            let mut parts = text.split('`');
            parts.next();
            while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
                spans.push(Code {
                    doc: doc.to_owned(),
                    line,
                    text: inside.to_owned(),
                });
            }
        }
    };
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            flush(&mut paragraph, &mut spans);
            fenced = !fenced;
            continue;
        }
        if fenced {
            spans.push(Code {
                doc: doc.to_owned(),
                line: i + 1,
                text: line.to_owned(),
            });
            continue;
        }
        if line.trim().is_empty() || line.starts_with('|') || line.starts_with('#') {
            flush(&mut paragraph, &mut spans);
        }
        if line.trim().is_empty() {
            continue;
        }
        match &mut paragraph {
            Some((_, text)) => {
                text.push(' ');
                text.push_str(line);
            }
            None => paragraph = Some((i + 1, line.to_owned())),
        }
        if line.starts_with('|') || line.starts_with('#') {
            flush(&mut paragraph, &mut spans);
        }
    }
    flush(&mut paragraph, &mut spans);
    spans
}

/// Tokens of a piece of code, split at white space and `=`, shell quotes removed.
fn tokens(code: &str) -> Vec<String> {
    code.split(|c: char| c.is_whitespace() || c == '=')
        .map(|t| t.trim_matches(['\'', '"', '(', ')', '[', ']', ',']))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// True when a command may start after this token.
fn command_position(prev: Option<&str>) -> bool {
    matches!(
        prev,
        None | Some("$" | "sudo" | "--" | "|" | "&&" | "||" | ";" | "exec" | "time")
    )
}

fn is_word(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && t.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// A `kuport` invocation: the subcommand and the flags after it.
fn kuport_invocations(toks: &[String]) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if t != "kuport" {
            continue;
        }
        let prev = i.checked_sub(1).map(|p| toks[p].as_str());
        let sub_at = if matches!(prev, Some("-p" | "--package")) {
            // `cargo run -p kuport -- <sub>`
            toks[i + 1..]
                .iter()
                .position(|t| t == "--")
                .map(|p| i + 1 + p + 1)
        } else if command_position(prev) {
            Some(i + 1)
        } else {
            None
        };
        let Some(sub) = sub_at.and_then(|s| toks.get(s).map(|t| (s, t))) else {
            continue;
        };
        if !is_word(sub.1) {
            continue;
        }
        let flags = toks[sub.0 + 1..]
            .iter()
            .take_while(|t| !matches!(t.as_str(), "|" | "&&" | "||" | ";" | ">" | ">>"))
            .filter(|t| t.starts_with('-') && t.as_str() != "--" && !t.contains('<'))
            .map(|t| t.trim_end_matches(['.', ':']).to_owned())
            .collect();
        found.push((sub.1.clone(), flags));
    }
    found
}

/// `cargo <sub>` and the `-p` packages of a cargo invocation.
fn cargo_invocations(toks: &[String]) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        let prev = i.checked_sub(1).map(|p| toks[p].as_str());
        if t != "cargo" || !command_position(prev) {
            continue;
        }
        let Some(sub) = toks.get(i + 1).filter(|s| is_word(s)) else {
            continue;
        };
        let rest = &toks[i + 2..];
        let end = rest.iter().position(|t| t == "--").unwrap_or(rest.len());
        let packages = rest[..end]
            .windows(2)
            .filter(|w| w[0] == "-p" || w[0] == "--package")
            .map(|w| w[1].clone())
            .collect();
        found.push((sub.clone(), packages));
    }
    found
}

fn just_recipes_named(toks: &[String]) -> Vec<String> {
    toks.iter()
        .enumerate()
        .filter(|(i, t)| {
            *t == "just" && command_position(i.checked_sub(1).map(|p| toks[p].as_str()))
        })
        .filter_map(|(i, _)| toks.get(i + 1).filter(|s| is_word(s)).cloned())
        .collect()
}

/// Repository paths among the tokens: relative, starting with a top-level entry of the
/// repository and holding a `/`, no placeholder.
fn repo_paths(toks: &[String], top: &BTreeSet<String>) -> Vec<String> {
    toks.iter()
        .map(|t| t.trim_end_matches(['.', ':', ';']))
        .filter(|t| t.contains('/') && !t.contains("://"))
        .filter(|t| !t.contains(['<', '>', '*', '{', '}', '$', '…']) && !t.contains("..."))
        .filter(|t| t.split('/').next().is_some_and(|first| top.contains(first)))
        .map(str::to_owned)
        .collect()
}

struct Cli {
    subcommands: BTreeSet<String>,
    help: BTreeMap<String, String>,
}

impl Cli {
    fn read() -> Self {
        let top = kuport(&["--help"]);
        let subcommands = top
            .lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|s| *s != "help")
            .map(str::to_owned)
            .collect::<BTreeSet<_>>();
        assert!(
            subcommands.contains("agent") && subcommands.contains("status"),
            "could not read the subcommands from kuport --help:\n{top}"
        );
        let help = subcommands
            .iter()
            .map(|s| (s.clone(), kuport(&[s, "--help"])))
            .collect();
        Self { subcommands, help }
    }

    fn has_flag(&self, sub: &str, flag: &str) -> bool {
        let help = &self.help[sub];
        help.match_indices(flag).any(|(at, _)| {
            let before = help[..at].chars().next_back();
            let after = help[at + flag.len()..].chars().next();
            before.is_none_or(|c| c == ' ' || c == '[')
                && after.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '-')
        })
    }
}

fn cargo_aliases() -> BTreeSet<String> {
    let config = read(".cargo/config.toml");
    config
        .lines()
        .skip_while(|l| l.trim() != "[alias]")
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_owned()))
        .filter(|k| !k.starts_with('#') && !k.is_empty())
        .collect()
}

fn workspace_packages() -> BTreeSet<String> {
    let root = read("Cargo.toml");
    let members = root
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("workspace members line");
    members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|dir| {
            let manifest = read(&format!("{dir}/Cargo.toml"));
            manifest
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|l| l.strip_suffix('"'))
                .unwrap_or_else(|| panic!("{dir}/Cargo.toml has no package name"))
                .to_owned()
        })
        .collect()
}

fn just_recipes() -> BTreeSet<String> {
    read("Justfile")
        .lines()
        .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .filter_map(|l| l.split([' ', ':']).next())
        .filter(|name| is_word(name))
        .map(str::to_owned)
        .collect()
}

const CARGO_BUILTINS: &[&str] = &[
    "bench", "build", "check", "clippy", "doc", "fmt", "install", "metadata", "run", "test",
    "tree", "update",
];

fn top_level() -> BTreeSet<String> {
    std::fs::read_dir(repo_root())
        .expect("reading the repository root")
        .map(|e| {
            e.expect("root entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n != ".git" && n != "target")
        .collect()
}

#[test]
fn commands_and_paths_named_in_the_docs_exist() {
    let cli = Cli::read();
    let aliases = cargo_aliases();
    let packages = workspace_packages();
    let recipes = just_recipes();
    let top = top_level();
    let mut problems = BTreeSet::new();
    let mut checked = 0usize;
    let module_map_lines = section_lines(&read("docs/architecture.md"), "## Where the code is");
    for (doc, text) in documents() {
        for code in code_spans(&doc, &text) {
            let at = format!("{}:{}", code.doc, code.line);
            let toks = tokens(&code.text);
            for (sub, flags) in kuport_invocations(&toks) {
                checked += 1;
                if !cli.subcommands.contains(&sub) {
                    problems.insert(format!("{at}: `kuport {sub}` is not a subcommand"));
                    continue;
                }
                for flag in flags {
                    if !cli.has_flag(&sub, &flag) {
                        problems.insert(format!("{at}: `kuport {sub}` has no flag {flag}"));
                    }
                }
            }
            for (sub, pkgs) in cargo_invocations(&toks) {
                checked += 1;
                if !CARGO_BUILTINS.contains(&sub.as_str()) && !aliases.contains(&sub) {
                    problems.insert(format!(
                        "{at}: `cargo {sub}` is no alias in .cargo/config.toml"
                    ));
                }
                for p in pkgs {
                    if !packages.contains(&p) {
                        problems.insert(format!("{at}: no workspace package {p}"));
                    }
                }
            }
            for recipe in just_recipes_named(&toks) {
                checked += 1;
                if !recipes.contains(&recipe) {
                    problems.insert(format!("{at}: `just {recipe}` is no Justfile recipe"));
                }
            }
            // The module map's paths are under each crate's `src/` (`agent/cmd.rs` of the
            // `kuport` crate is not the repository's `agent/`): its own test checks them.
            let in_module_map =
                doc == "docs/architecture.md" && module_map_lines.contains(&code.line);
            for path in repo_paths(&toks, &top)
                .into_iter()
                .filter(|_| !in_module_map)
            {
                checked += 1;
                if !repo_root().join(&path).exists() {
                    problems.insert(format!("{at}: {path} does not exist"));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} names checked: is the parsing broken?"
    );
    assert!(
        problems.is_empty(),
        "the docs name things that do not exist:\n{}",
        problems.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_name_checks_see_what_they_should() {
    let t = tokens("cargo run -q -p kuport -- crds --markdown --update=docs/api.md");
    assert_eq!(
        kuport_invocations(&t),
        vec![(
            "crds".to_owned(),
            vec!["--markdown".to_owned(), "--update".to_owned()]
        )]
    );
    assert_eq!(
        cargo_invocations(&t),
        vec![("run".to_owned(), vec!["kuport".to_owned()])]
    );
    let top: BTreeSet<String> = ["docs".to_owned(), "lab".to_owned()].into();
    assert_eq!(repo_paths(&t, &top), vec!["docs/api.md".to_owned()]);
    let t = tokens("$ sudo kuport status -o json | jq '.problems'");
    assert_eq!(
        kuport_invocations(&t),
        vec![("status".to_owned(), vec!["-o".to_owned()])]
    );
    // Not a command: `nft list table ip kuport`, a placeholder path, a path outside the repo.
    let t = tokens("nft list table ip kuport lab/scenarios/<file>.yaml /run/kuport-lab/x");
    assert!(kuport_invocations(&t).is_empty());
    assert!(repo_paths(&t, &top).is_empty());
    let text = "a `x` b `y\nz`\n```sh\nkuport plan\n```\n`w`\n| `t` |\n";
    let spans = code_spans("d.md", text);
    let texts: Vec<&str> = spans.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(texts, vec!["x", "y z", "kuport plan", "w", "t"]);
    assert_eq!(spans[2].line, 4);
    assert_eq!(spans[4].line, 7);
}

/// The row of `docs/architecture.md`'s plan table whose step is `step`.
fn plan_step_row(step: &str) -> String {
    let doc = read("docs/architecture.md");
    let prefix = format!("| {step} |");
    doc.lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("docs/architecture.md has no plan step row {step:?}"))
        .to_owned()
}

/// The names of `reasons` that `text` mentions as whole words, in the order of their first
/// mention.
fn named_in_order<'a>(text: &str, reasons: &[&'a str]) -> Vec<&'a str> {
    let words: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let mut named: Vec<(usize, &str)> = reasons
        .iter()
        .filter_map(|r| words.iter().position(|w| w == r).map(|at| (at, *r)))
        .collect();
    named.sort();
    named.into_iter().map(|(_, r)| r).collect()
}

#[test]
fn the_plan_table_names_the_admission_reasons_in_the_order_they_are_checked() {
    // The enum declares the refusals in the order `plan/mapping.rs` checks them, then the one
    // accepted-with-a-warning outcome.
    let all: Vec<&str> = AcceptedReason::ALL
        .iter()
        .filter(|r| **r != AcceptedReason::Valid)
        .map(|r| r.as_str())
        .collect();
    assert_eq!(named_in_order(&plan_step_row("admission"), &all), all);
}

#[test]
fn the_plan_table_names_every_programmed_and_class_reason() {
    let programmed: Vec<&str> = ProgrammedReason::ALL
        .iter()
        .filter(|r| **r != ProgrammedReason::AllNodesReady)
        .map(|r| r.as_str())
        .collect();
    let gates = named_in_order(&plan_step_row("gates"), &programmed);
    let missing: Vec<_> = programmed.iter().filter(|r| !gates.contains(r)).collect();
    assert!(missing.is_empty(), "the gates row omits {missing:?}");
    assert_eq!(
        gates.last(),
        Some(&"HostRefused"),
        "HostRefused is decided last"
    );
    let class: Vec<&str> = ClassReason::ALL
        .iter()
        .filter(|r| **r != ClassReason::Valid)
        .map(|r| r.as_str())
        .collect();
    let rows = plan_step_row("class settings") + &plan_step_row("slots");
    let named = named_in_order(&rows, &class);
    let missing: Vec<_> = class.iter().filter(|r| !named.contains(r)).collect();
    assert!(
        missing.is_empty(),
        "the class settings and slots rows omit {missing:?}"
    );
}

#[test]
fn the_order_check_sees_a_reason_out_of_place() {
    let all = ["ClassNotFound", "InvalidPortRange", "PortConflict"];
    assert_eq!(
        named_in_order("PortConflict, then ClassNotFound; InvalidPortRange", &all),
        ["PortConflict", "ClassNotFound", "InvalidPortRange"]
    );
    assert_eq!(
        named_in_order("ClassNotFoundX InvalidPortRange", &all),
        ["InvalidPortRange"]
    );
}

/// The words the plan, status messages and these docs lean on: each is defined once in
/// `docs/architecture.md`'s glossary, so a reader of a status message can look it up.
const GLOSSARY: &[&str] = &[
    "IR, datapath",
    "accepting node",
    "serving node",
    "programming node",
    "status writer",
    "link",
    "standby link",
    "pair",
    "slot",
    "claim",
    "landed",
    "node row",
    "refusal",
    "facts",
    "stand-in",
];

/// The terms of the glossary table under "Words used here".
fn glossary_terms(doc: &str) -> Vec<String> {
    doc.lines()
        .skip_while(|l| !l.starts_with("## Words used here"))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" |").next())
        .filter(|t| *t != "Word" && !t.starts_with("---"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_glossary_defines_every_word_the_plan_and_status_lean_on() {
    let terms = glossary_terms(&read("docs/architecture.md"));
    let missing: Vec<_> = GLOSSARY
        .iter()
        .filter(|w| !terms.iter().any(|t| t == *w))
        .collect();
    assert!(
        missing.is_empty(),
        "the glossary lacks {missing:?} (has {terms:?})"
    );
    let sample = "## Words used here\n\n| Word | Means |\n| --- | --- |\n| slot | a number |\n\n## Next\n| pair | not here |\n";
    assert_eq!(glossary_terms(sample), ["slot"]);
}

/// The code spans of `docs/architecture.md`'s "Where the code is" table, by crate.
fn module_map(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in doc
        .lines()
        .skip_while(|l| !l.starts_with("## Where the code is"))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, krate, modules, ..] = cells.as_slice() else {
            continue;
        };
        let krate = krate.trim_matches('`').to_owned();
        let spans = modules.split('`').skip(1).step_by(2).map(str::to_owned);
        map.entry(krate).or_default().extend(spans);
    }
    map
}

/// The production modules of a crate's `src/`, as paths under it (`plan/merge.rs`; a
/// directory's `mod.rs` also answers to `plan/`), without the crate roots and test modules.
fn crate_modules(src: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, src: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, src, out);
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .expect("under src")
                .display()
                .to_string();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if matches!(name, "lib.rs" | "main.rs" | "tests.rs") || !name.ends_with(".rs") {
                continue;
            }
            let alias = rel
                .strip_suffix("mod.rs")
                .map_or_else(|| rel.clone(), str::to_owned);
            out.push((rel, alias));
        }
    }
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out
}

#[test]
fn the_module_map_names_every_module_of_the_agent_crates_and_nothing_else() {
    let map = module_map(&read("docs/architecture.md"));
    for (krate, dir) in [
        ("kuport-core", "agent/core/src"),
        ("kuport-host", "agent/host/src"),
        ("kuport", "agent/daemon/src"),
    ] {
        let named = map.get(krate).cloned().unwrap_or_default();
        let src = repo_root().join(dir);
        let modules = crate_modules(&src);
        let missing: Vec<&String> = modules
            .iter()
            .filter(|(rel, alias)| !named.contains(rel) && !named.contains(alias))
            .map(|(rel, _)| rel)
            .collect();
        assert!(
            missing.is_empty(),
            "docs/architecture.md, \"Where the code is\", does not place these modules of {krate}: {missing:?}"
        );
        let stale: Vec<&String> = named.iter().filter(|n| !src.join(n).exists()).collect();
        assert!(
            stale.is_empty(),
            "docs/architecture.md, \"Where the code is\", names modules {krate} does not have: {stale:?}"
        );
    }
}

/// The line numbers (1-based, as the code spans count them) of the section headed `heading`.
fn section_lines(text: &str, heading: &str) -> std::ops::Range<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(start) = lines.iter().position(|l| l.starts_with(heading)) else {
        return 0..0;
    };
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |p| start + 1 + p);
    start + 1..end + 1
}

/// The cargo aliases whose definition already ends in `--`: `cargo lab -- run x` would hand
/// kuport-lab the word `run` as a file name.
fn aliases_ending_in_double_dash() -> BTreeSet<String> {
    read(".cargo/config.toml")
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(_, v)| v.trim().trim_matches('"').trim_end().ends_with("--"))
        .map(|(k, _)| k.trim().to_owned())
        .collect()
}

/// `cargo <alias> -- ...` invocations of an alias that already ends in `--`.
fn doubled_dashes(toks: &[String], aliases: &BTreeSet<String>) -> Vec<String> {
    toks.windows(3)
        .filter(|w| w[0] == "cargo" && aliases.contains(&w[1]) && w[2] == "--")
        .map(|w| format!("cargo {} --", w[1]))
        .collect()
}

#[test]
fn no_doc_passes_a_second_double_dash_to_an_alias_that_has_one() {
    let aliases = aliases_ending_in_double_dash();
    assert!(aliases.contains("lab"), "{aliases:?}");
    assert_eq!(
        doubled_dashes(&tokens("sudo cargo lab -- run x.yaml"), &aliases),
        ["cargo lab --"]
    );
    assert!(doubled_dashes(&tokens("cargo lab run x.yaml"), &aliases).is_empty());
    let mut problems = Vec::new();
    for (doc, text) in documents() {
        for code in code_spans(&doc, &text) {
            for bad in doubled_dashes(&tokens(&code.text), &aliases) {
                problems.push(format!("{}:{}: `{bad}`", code.doc, code.line));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every file in the repository (by `git ls-files`), as (path, text), text files only.
fn tracked_files() -> Vec<(String, String)> {
    let out = Command::new("git")
        .args(["ls-files"])
        .current_dir(repo_root())
        .output()
        .expect("running git ls-files");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|p| {
            let text = std::fs::read_to_string(repo_root().join(p)).ok()?;
            Some((p.to_owned(), text))
        })
        .collect()
}

/// The paths of the original design that lives outside the repository, built from their
/// parts so that this file does not cite them itself.
fn outside_design_paths() -> Vec<String> {
    let root = ["sha", "red"].concat();
    let mut paths: Vec<String> = ["spec", "seed", "reference"]
        .iter()
        .map(|dir| format!("{root}/{dir}/"))
        .collect();
    paths.push(format!("../{root}/"));
    paths
}

#[test]
fn no_file_cites_the_original_design_outside_the_repository() {
    let cited = outside_design_paths();
    assert!(cited.iter().all(|c| !c.is_empty()), "{cited:?}");
    let mut problems = Vec::new();
    let files = tracked_files();
    assert!(files.len() > 100, "only {} files read", files.len());
    for (path, text) in files {
        for (n, line) in text.lines().enumerate() {
            if cited.iter().any(|c| line.contains(c.as_str())) {
                problems.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The rows of the Markdown table in section `heading` whose header starts with the cell
/// `first` (`\|` read as `|`).
fn table_rows(text: &str, heading: &str, first: &str) -> Vec<Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let range = section_lines(text, heading);
    let section =
        &lines[range.start.min(lines.len())..range.end.saturating_sub(1).min(lines.len())];
    let cells = |l: &str| -> Vec<String> {
        l.replace("\\|", "\u{0}")
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().replace('\u{0}', "|"))
            .collect()
    };
    let Some(header) = section
        .iter()
        .position(|l| l.starts_with("| ") && cells(l).first().map(String::as_str) == Some(first))
    else {
        return Vec::new();
    };
    section[header + 1..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .filter(|l| !l.starts_with("| ---"))
        .map(|l| cells(l))
        .collect()
}

/// The metric names in a cell (`kuport_...`, up to the first character not in a name).
fn metric_names(cell: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = cell;
    while let Some(at) = rest.find("kuport_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.push(name);
    }
    out
}

/// The series the agent exports: every family of its registry, a counter under its `_total`
/// sample name, a histogram under its family name.
fn exported_series() -> BTreeSet<String> {
    let text = kuport::agent::Metrics::new()
        .encode()
        .expect("metrics encode");
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (name, kind) = l.split_once(' ')?;
            Some(match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_owned(),
            })
        })
        .collect()
}

#[test]
fn the_metrics_table_is_what_the_agent_exports_and_the_alerts_use_only_those() {
    let ops = read("docs/operations.md");
    let documented: BTreeSet<String> = table_rows(&ops, "## Metrics", "Series")
        .iter()
        .filter_map(|row| row.first())
        .flat_map(|cell| metric_names(cell))
        .collect();
    // A family without series is not encoded, so a fresh registry shows only some: each of
    // those must be documented, and each documented one must be registered in the source
    // under its base name (without the prefix and the `_total`/`_seconds` suffixes).
    let exported = exported_series();
    assert!(exported.len() > 10, "{exported:?}");
    let undocumented: Vec<&String> = exported.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in docs/operations.md \"Metrics\": {undocumented:?}"
    );
    let source = read("agent/daemon/src/agent/metrics.rs");
    let unregistered: Vec<&String> = documented
        .iter()
        .filter(|name| {
            let base = name.trim_start_matches("kuport_");
            let base = base.strip_suffix("_total").unwrap_or(base);
            let base = base.strip_suffix("_seconds").unwrap_or(base);
            !source.contains(&format!("\"{base}\""))
        })
        .collect();
    assert!(
        unregistered.is_empty(),
        "documented in docs/operations.md but registered nowhere: {unregistered:?}"
    );
    // And the other way: every name the source registers is documented.
    let bases: BTreeSet<String> = documented
        .iter()
        .map(|name| {
            let base = name.trim_start_matches("kuport_");
            let base = base.strip_suffix("_total").unwrap_or(base);
            base.strip_suffix("_seconds").unwrap_or(base).to_owned()
        })
        .collect();
    let registered = registered_names(&source);
    assert!(registered.len() > 10, "{registered:?}");
    let missing: Vec<&String> = registered.difference(&bases).collect();
    assert!(
        missing.is_empty(),
        "registered in metrics.rs but not in docs/operations.md \"Metrics\": {missing:?}"
    );
    let alerts = table_rows(&ops, "## Metrics", "Alert");
    let mut used = 0;
    for row in &alerts {
        for name in row.get(1).map(|e| metric_names(e)).unwrap_or_default() {
            used += 1;
            assert!(documented.contains(&name), "alert {:?} uses {name}", row[0]);
        }
    }
    assert!(
        used > 5,
        "only {used} metric names in the alerts: {alerts:?}"
    );
}

/// The first string literal after each `register(` or `register_with_unit(` in the source.
fn registered_names(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for call in ["register(", "register_with_unit("] {
        for (at, _) in source.match_indices(call) {
            let rest = &source[at + call.len()..];
            let Some(open) = rest.find('"') else { continue };
            // Only a literal that is the call's first argument.
            if !rest[..open].trim().is_empty() {
                continue;
            }
            if let Some(name) = rest[open + 1..].split('"').next() {
                out.insert(name.to_owned());
            }
        }
    }
    out
}

/// The literal runs of a documented log message: the words between placeholders (`<error>`,
/// numbers, `N`, object names like `ns/name`), each run that is long enough to mean something.
fn literal_runs(message: &str) -> Vec<String> {
    let placeholder = |w: &str| {
        let bare = w.trim_matches(|c: char| c.is_ascii_punctuation());
        w.contains('<')
            || w.contains('>')
            || w.contains('/')
            || w.contains('…')
            || w.contains("...")
            || bare.is_empty()
            || bare.chars().all(|c| c.is_ascii_digit())
            || ["N", "M", "K", "name"].contains(&bare)
    };
    // A kind before a placeholder is part of the name the code formats (`PortMap {what}`);
    // a colon ends a run too (the code often formats the part before it).
    const KINDS: &[&str] = &["PortMap", "PortMapClass", "DaemonSet", "Pod", "ConfigMap"];
    let mut runs = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut end_run = |current: &mut Vec<&str>| {
        let run = current.join(" ").trim_end_matches(':').to_owned();
        if run.len() >= 8 {
            runs.push(run);
        }
        current.clear();
    };
    for word in message.split_whitespace().chain([" <end>"]) {
        if placeholder(word) {
            while current.last().is_some_and(|w| KINDS.contains(w)) {
                current.pop();
            }
            end_run(&mut current);
        } else {
            current.push(word);
            if word.ends_with(':') {
                end_run(&mut current);
            }
        }
    }
    runs
}

/// The agent's sources (the `kuport` and `kuport-host` crates), whitespace collapsed.
fn agent_sources() -> String {
    let mut text = String::new();
    for (path, body) in tracked_files() {
        if (path.starts_with("agent/daemon/src/") || path.starts_with("agent/host/src/"))
            && path.ends_with(".rs")
        {
            text.push_str(&body.split_whitespace().collect::<Vec<_>>().join(" "));
            text.push('\n');
        }
    }
    text
}

#[test]
fn every_documented_log_line_is_in_the_code() {
    assert_eq!(
        literal_runs("cleared N conntrack entries of flows (their next packet starts a new flow)"),
        ["conntrack entries of flows (their next packet starts a new flow)",]
    );
    assert_eq!(
        literal_runs("writing the status of PortMap ns/name: 409, recomputing"),
        ["writing the status of", "recomputing"]
    );
    let sources = agent_sources();
    let rows = table_rows(&read("docs/operations.md"), "## Log lines", "Level");
    assert!(rows.len() > 20, "only {} log rows", rows.len());
    let mut checked = 0;
    let mut problems = Vec::new();
    for row in &rows {
        let Some(message) = row.get(1) else { continue };
        for span in message.split('`').skip(1).step_by(2) {
            for run in literal_runs(span) {
                checked += 1;
                if !sources.contains(&run) {
                    problems.push(format!("{run:?} (of `{span}`)"));
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} runs checked");
    assert!(
        problems.is_empty(),
        "docs/operations.md \"Log lines\" quotes words the agent does not log:\n{}",
        problems.join("\n")
    );
}

/// The number the words `one` to `twelve` name.
fn number_word(word: &str) -> Option<usize> {
    [
        "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
        "twelve",
    ]
    .iter()
    .position(|w| *w == word)
    .map(|i| i + 1)
}

#[test]
fn the_watch_count_in_the_docs_is_the_code_s() {
    let inputs = read("agent/daemon/src/agent/runtime/inputs.rs");
    let block = inputs
        .split("watched_kinds! {")
        .nth(1)
        .expect("the watched_kinds! invocation");
    let kinds = block
        .lines()
        .take_while(|l| l.trim() != "}")
        .filter(|l| l.contains("=>"))
        .count();
    // The kinds, plus the watches of kube-system/cilium-config and of the EndpointSlices
    // (`slices.rs`), which the first pass waits for too.
    assert!(
        inputs.contains("cni: Store<ConfigMap>"),
        "the cilium-config watch moved"
    );
    assert!(
        inputs.contains("slices: Slices"),
        "the EndpointSlice watch moved"
    );
    let watches = kinds + 2;
    let ops = read("docs/operations.md");
    let mut named = 0;
    for (phrase, after) in [("all ", " have synced"), ("the ", " watches listed")] {
        for (at, _) in ops.match_indices(after) {
            let word = ops[..at].rsplit(phrase).next().unwrap_or_default();
            named += 1;
            assert_eq!(
                number_word(word),
                Some(watches),
                "docs/operations.md says {phrase}{word}{after}; the agent has {watches} watches"
            );
        }
    }
    assert_eq!(named, 2, "the two places that count the watches moved");
}
