//! The GitHub workflows are valid YAML, use only well-known actions, and run only repository
//! commands: Justfile recipes that exist, `cargo e2e` subcommands, `.ci/run`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn recipes() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("Justfile")).expect("Justfile");
    text.lines()
        .filter(|l| !l.starts_with([' ', '\t', '#']) && l.contains(':') && !l.contains(":="))
        .filter_map(|l| l.split([' ', ':']).next())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

const ACTIONS: &[&str] = &[
    "actions/checkout@",
    "dtolnay/rust-toolchain@",
    "Swatinem/rust-cache@",
    "azure/setup-helm@",
    "taiki-e/install-action@",
    "docker/setup-buildx-action@",
    "docker/login-action@",
    "docker/build-push-action@",
    "helm/kind-action@",
    "softprops/action-gh-release@",
];

/// The first word of each command line of a `run:` block (continuation lines skipped).
fn commands(run: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut continued = false;
    for line in run
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if !continued {
            out.push(line.to_owned());
        }
        continued = line.ends_with('\\');
    }
    out
}

#[test]
fn workflows_use_known_actions_and_repository_commands() {
    let recipes = recipes();
    for required in [
        "chart-lint",
        "image-multiarch",
        "release-artifacts",
        "e2e",
        "crds",
    ] {
        assert!(
            recipes.contains(required),
            "Justfile has no {required} recipe: {recipes:?}"
        );
    }
    let mut seen = BTreeSet::new();
    for name in ["ci.yml", "e2e.yml", "release.yml"] {
        let path = repo().join(".github/workflows").join(name);
        let text = std::fs::read_to_string(&path).expect("workflow");
        let workflow: Value = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("{name} is not valid YAML: {e}"));
        let jobs = workflow["jobs"].as_object().expect("jobs");
        assert!(!jobs.is_empty(), "{name} has no jobs");
        for (job, body) in jobs {
            for step in body["steps"].as_array().expect("steps") {
                if let Some(uses) = step["uses"].as_str() {
                    assert!(
                        ACTIONS.iter().any(|a| uses.starts_with(a)),
                        "{name}/{job}: {uses} is not a well-known action"
                    );
                }
                let Some(run) = step["run"].as_str() else {
                    continue;
                };
                for command in commands(run) {
                    seen.insert(command.clone());
                    let words: Vec<&str> = command.split_whitespace().collect();
                    let ok = match words.as_slice() {
                        ["just", recipe, ..] => {
                            assert!(recipes.contains(*recipe), "{name}: no recipe {recipe}");
                            true
                        }
                        ["cargo", "e2e", sub, ..] => {
                            ["run", "bundle", "chart-digest"].contains(sub)
                        }
                        ["sudo", .., ".ci/run"] => true,
                        // Step outputs (tag names) and the chart push, which needs the
                        // registry login of the same step.
                        ["echo", ..] | ["version=${GITHUB_REF_NAME#v}"] => true,
                        ["helm", "push", ..] => true,
                        _ => false,
                    };
                    assert!(ok, "{name}/{job}: `{command}` is not a repository command");
                }
            }
        }
    }
    assert!(
        seen.iter().any(|c| c.contains(".ci/run")),
        "ci.yml runs .ci/run"
    );
    assert!(
        seen.contains("cargo e2e run"),
        "e2e.yml runs the kind driver"
    );
}
