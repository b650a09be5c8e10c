//! The GitHub workflows are valid YAML, use only well-known actions, and run only repository
//! commands: Justfile recipes that exist, `cargo e2e` subcommands, `.ci/run`.
//!
//! And the supply chain stays verifiable: every action pinned by commit with its tag in a
//! comment, least-privilege `permissions:`, the release gated on CI and e2e for the same commit,
//! no expression (a secret least of all) pasted into a script, the image signed by digest with
//! an SBOM, the toolchain pinned to a release. Each property has a checker function, tested on
//! small bad inputs below, so a later edit cannot quietly undo it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

fn recipes() -> BTreeSet<String> {
    read("Justfile")
        .lines()
        .filter(|l| !l.starts_with([' ', '\t', '#']) && l.contains(':') && !l.contains(":="))
        .filter_map(|l| l.split([' ', ':']).next())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

const WORKFLOWS: [&str; 3] = ["ci.yml", "e2e.yml", "release.yml"];

fn workflow_text(name: &str) -> String {
    read(&format!(".github/workflows/{name}"))
}

fn parse(name: &str, text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{name} is not valid YAML: {e}"))
}

const ACTIONS: &[&str] = &[
    "actions/checkout@",
    "actions/upload-artifact@",
    "actions/download-artifact@",
    "Swatinem/rust-cache@",
    "Azure/setup-helm@",
    "taiki-e/install-action@",
    "docker/setup-buildx-action@",
    "docker/login-action@",
    "docker/build-push-action@",
    "helm/kind-action@",
    "softprops/action-gh-release@",
    "sigstore/cosign-installer@",
    "anchore/sbom-action@",
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

/// Every step of every job, with the job's name (a job calling a reusable workflow has none).
fn steps(workflow: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for (job, body) in workflow["jobs"].as_object().into_iter().flatten() {
        for step in body["steps"].as_array().into_iter().flatten() {
            out.push((job.clone(), step));
        }
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
        "cli-archive",
        "krew-manifest",
        "chart-push",
    ] {
        assert!(
            recipes.contains(required),
            "Justfile has no {required} recipe: {recipes:?}"
        );
    }
    let mut seen = BTreeSet::new();
    for name in WORKFLOWS {
        let workflow = parse(name, &workflow_text(name));
        let jobs = workflow["jobs"].as_object().expect("jobs");
        assert!(!jobs.is_empty(), "{name} has no jobs");
        for (job, step) in steps(&workflow) {
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
                        ["run", "bundle", "chart-digest", "krew-manifest"].contains(sub)
                    }
                    ["sudo", .., ".ci/run"] => true,
                    // The toolchain of rust-toolchain.toml, a target's standard library, and
                    // the cross linker of linux arm64.
                    ["rustup", "toolchain", "install"] | ["rustup", "target", "add", _] => true,
                    [
                        "sudo",
                        "apt-get",
                        "update",
                        "&&",
                        "sudo",
                        "apt-get",
                        "install",
                        ..,
                    ] => true,
                    ["cosign", "sign" | "attest", ..] => true,
                    // Step outputs and environment for later steps.
                    ["echo", ..] | ["version=${GITHUB_REF_NAME#v}"] => true,
                    _ => false,
                };
                assert!(ok, "{name}/{job}: `{command}` is not a repository command");
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

// ---- Checkers: each returns what is wrong, empty when nothing is. ----

fn is_sha(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// Every `uses:` (of a step or of a job) is a local path or `owner/repo[/path]@<40-hex commit>`
/// followed by `# <tag>`. On the text, not the parsed YAML: the comment is the point.
fn unpinned_uses(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start().trim_start_matches("- ").trim_start();
        let Some(value) = trimmed.strip_prefix("uses:") else {
            continue;
        };
        let (reference, comment) = value
            .split_once('#')
            .map_or((value.trim(), ""), |(r, c)| (r.trim(), c.trim()));
        let reference = reference.trim_matches(['"', '\'']);
        if reference.starts_with("./") {
            continue;
        }
        let pinned = reference
            .split_once('@')
            .is_some_and(|(action, rev)| action.contains('/') && is_sha(rev));
        let tagged =
            comment.starts_with('v') && comment[1..].starts_with(|c: char| c.is_ascii_digit());
        if !pinned || !tagged {
            out.push(format!(
                "line {}: `{}` is not pinned as `owner/repo@<40-hex commit> # vX.Y.Z`",
                n + 1,
                line.trim()
            ));
        }
    }
    out
}

/// Top-level `permissions:` present, a mapping granting no write; no job grants `write-all`
/// (or `read-all`, which reads more than it needs) or any scope outside `allowed_writes`.
fn permission_problems(workflow: &Value, allowed_writes: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    match workflow.get("permissions") {
        None => out.push("no top-level permissions: block (the default token may write)".into()),
        Some(Value::Object(scopes)) => {
            for (scope, level) in scopes {
                if level != "read" && level != "none" {
                    out.push(format!(
                        "top-level permissions grant {scope}: {level}; widen per job instead"
                    ));
                }
            }
        }
        Some(other) => out.push(format!("top-level permissions: {other} is not a scope map")),
    }
    for (job, body) in workflow["jobs"].as_object().into_iter().flatten() {
        match body.get("permissions") {
            None => {}
            Some(Value::Object(scopes)) => {
                for (scope, level) in scopes {
                    if level == "write" && !allowed_writes.contains(&scope.as_str()) {
                        out.push(format!("job {job} grants {scope}: write"));
                    }
                }
            }
            Some(other) => out.push(format!("job {job}: permissions {other} is not a scope map")),
        }
    }
    out
}

/// The jobs a job waits for, `needs:` as a string or a list.
fn needs(job: &Value) -> Vec<String> {
    match &job["needs"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// The release runs ci.yml and e2e.yml as jobs for its own commit, and every job that builds
/// or publishes waits (directly or through another job) for both.
fn release_gate_problems(release: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let Some(jobs) = release["jobs"].as_object() else {
        return vec!["no jobs".into()];
    };
    let mut gates = Vec::new();
    for (file, what) in [("ci.yml", "CI"), ("e2e.yml", "the e2e run")] {
        let path = format!("./.github/workflows/{file}");
        match jobs.iter().find(|(_, j)| j["uses"] == path.as_str()) {
            Some((name, _)) => gates.push(name.clone()),
            None => out.push(format!("no job runs {path} ({what})")),
        }
    }
    for (name, job) in jobs {
        if gates.contains(name) {
            continue;
        }
        // Everything this job waits for, transitively (a cycle stops at a name seen).
        let mut waited: BTreeSet<String> = BTreeSet::new();
        let mut todo = needs(job);
        while let Some(n) = todo.pop() {
            if waited.insert(n.clone()) {
                todo.extend(needs(&jobs.get(&n).cloned().unwrap_or(Value::Null)));
            }
        }
        for gate in &gates {
            if !waited.contains(gate) {
                out.push(format!("job {name} does not wait for job {gate}"));
            }
        }
    }
    out
}

/// No `run:` script holds a `${{ ... }}` expression: a secret pasted there lands in the script
/// (and in logs of `set -x`), and any expression there is a script-injection path. Values go
/// through `env:` or the action's inputs.
fn expressions_in_run(workflow: &Value) -> Vec<String> {
    steps(workflow)
        .into_iter()
        .filter_map(|(job, step)| {
            let run = step["run"].as_str()?;
            run.contains("${{").then(|| {
                let what = if run.contains("secrets.") {
                    "a secret"
                } else {
                    "an expression"
                };
                format!("job {job}: {what} pasted into `run: {}`", run.trim())
            })
        })
        .collect()
}

/// The release installs cosign, signs the pushed image by digest after pushing it, makes an
/// SBOM of it and attaches that file to the GitHub release.
fn signing_problems(release: &Value) -> Vec<String> {
    let all = steps(release);
    let position = |pred: &dyn Fn(&Value) -> bool| all.iter().position(|(_, s)| pred(s));
    let uses = |prefix: &'static str| {
        move |s: &Value| s["uses"].as_str().is_some_and(|u| u.starts_with(prefix))
    };
    let runs = |needle: &'static str| {
        move |s: &Value| s["run"].as_str().is_some_and(|r| r.contains(needle))
    };
    let mut out = Vec::new();
    let installer = position(&uses("sigstore/cosign-installer@"));
    let push = position(&uses("docker/build-push-action@"));
    let sign = position(&runs("cosign sign "));
    match (installer, push, sign) {
        (Some(i), Some(p), Some(s)) if i < s && p < s => {
            let script = all[s].1["run"].as_str().unwrap_or_default();
            if !script.contains("@$DIGEST") && !script.contains("@${DIGEST}") {
                out.push(format!("`{script}` does not sign by digest"));
            }
        }
        _ => out.push(
            "no `cosign sign` step after both the cosign installer and the image push".into(),
        ),
    }
    let sbom = position(&uses("anchore/sbom-action@"));
    let sbom_file = sbom.and_then(|i| all[i].1["with"]["output-file"].as_str());
    let release_files = all
        .iter()
        .find(|(_, s)| uses("softprops/action-gh-release@")(s))
        .and_then(|(_, s)| s["with"]["files"].as_str())
        .unwrap_or_default();
    match sbom_file {
        None => out.push("no SBOM step (anchore/sbom-action with output-file)".into()),
        Some(file) if !release_files.lines().any(|l| l.trim() == file) => {
            out.push(format!("the SBOM {file} is not attached to the release"));
        }
        Some(_) => {}
    }
    out
}

/// `channel = "..."` of a rust-toolchain.toml, and whether its components list clippy and
/// rustfmt.
fn toolchain_problems(toml: &str) -> Vec<String> {
    let value = |key: &str| {
        toml.lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix('='))
            .map(|v| v.trim().to_owned())
            .next()
    };
    let mut out = Vec::new();
    let channel = value("channel").map(|c| c.trim_matches('"').to_owned());
    let pinned = channel.as_deref().is_some_and(|c| {
        let parts: Vec<&str> = c.split('.').collect();
        parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    });
    if !pinned {
        out.push(format!("channel {channel:?} is not a pinned release X.Y.Z"));
    }
    let components = value("components").unwrap_or_default();
    for c in ["clippy", "rustfmt"] {
        if !components.contains(&format!("\"{c}\"")) {
            out.push(format!("components do not include {c}"));
        }
    }
    out
}

fn toolchain_channel(toml: &str) -> String {
    toml.lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|v| v.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap_or_default()
}

/// A workflow installing a toolchain of its own instead of rust-toolchain.toml's.
fn own_toolchain(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains("rust-toolchain@") || l.contains("toolchain: stable"))
        .map(|l| format!("`{}` bypasses rust-toolchain.toml", l.trim()))
        .collect()
}

/// The `FROM` images of a Dockerfile not pinned by `@sha256:<64 hex>`.
fn unpinned_bases(dockerfile: &str) -> Vec<String> {
    dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| l.to_ascii_uppercase().starts_with("FROM "))
        .filter_map(|l| {
            let image = l
                .split_whitespace()
                .skip(1)
                .find(|w| !w.starts_with("--"))?;
            let pinned = image.split_once("@sha256:").is_some_and(|(_, hex)| {
                hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
            });
            // A later stage built on an earlier one (`FROM build`) has no registry image.
            let stage = !image.contains(['/', ':']);
            (!pinned && !stage).then(|| image.to_owned())
        })
        .collect()
}

/// Base images whose digest could not be read where this was written (the machines reach no
/// container registry); docs/development.md says so. The list may only shrink.
const BASES_NOT_YET_PINNED: &[&str] = &[
    "docker.io/library/rust:${RUST_VERSION}-${DEBIAN_SUITE}",
    "docker.io/library/debian:${DEBIAN_SUITE}-slim",
];

// ---- The repository's files pass every checker. ----

#[test]
fn every_action_is_pinned_by_commit_with_its_tag() {
    for name in WORKFLOWS {
        let problems = unpinned_uses(&workflow_text(name));
        assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
    }
}

#[test]
fn every_workflow_has_least_privilege_permissions() {
    for (name, writes) in [
        ("ci.yml", &[][..]),
        ("e2e.yml", &[][..]),
        ("release.yml", &["contents", "packages", "id-token"][..]),
    ] {
        let text = workflow_text(name);
        assert!(!text.contains("write-all"), "{name} grants write-all");
        let problems = permission_problems(&parse(name, &text), writes);
        assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
    }
    let release = parse("release.yml", &workflow_text("release.yml"));
    let granted = &release["jobs"]["release"]["permissions"];
    for scope in ["contents", "packages", "id-token"] {
        assert_eq!(
            granted[scope], "write",
            "the release job needs {scope}: write"
        );
    }
}

#[test]
fn the_release_waits_for_ci_and_e2e_of_its_commit() {
    let problems = release_gate_problems(&parse("release.yml", &workflow_text("release.yml")));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The called files accept the call.
    for name in ["ci.yml", "e2e.yml"] {
        let workflow = parse(name, &workflow_text(name));
        assert!(
            workflow["on"].get("workflow_call").is_some(),
            "{name} cannot be called by the release: no workflow_call trigger"
        );
    }
}

#[test]
fn no_script_has_a_secret_or_expression_pasted_in() {
    for name in WORKFLOWS {
        let problems = expressions_in_run(&parse(name, &workflow_text(name)));
        assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
    }
}

#[test]
fn the_release_signs_the_image_by_digest_and_attaches_its_sbom() {
    let problems = signing_problems(&parse("release.yml", &workflow_text("release.yml")));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_toolchain_is_pinned_and_used_everywhere() {
    let toml = read("rust-toolchain.toml");
    let problems = toolchain_problems(&toml);
    assert!(
        problems.is_empty(),
        "rust-toolchain.toml: {}",
        problems.join("\n")
    );
    for name in WORKFLOWS {
        let problems = own_toolchain(&workflow_text(name));
        assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
    }
    let channel = toolchain_channel(&toml);
    assert!(
        read("Dockerfile").contains(&format!("ARG RUST_VERSION={channel}\n")),
        "the Dockerfile's RUST_VERSION is not rust-toolchain.toml's {channel}"
    );
    let cargo = read("Cargo.toml");
    let rust_version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"'))
        .expect("rust-version in Cargo.toml");
    assert!(
        channel.starts_with(&format!("{rust_version}.")) || channel == rust_version,
        "Cargo.toml's rust-version {rust_version} is not the pinned toolchain {channel}"
    );
}

#[test]
fn base_images_are_pinned_by_digest_or_known_to_be_not_yet() {
    for image in unpinned_bases(&read("Dockerfile")) {
        assert!(
            BASES_NOT_YET_PINNED.contains(&image.as_str()),
            "Dockerfile: {image} is not pinned by @sha256:<digest>"
        );
    }
}

// ---- Each checker fails on a bad input. ----

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

#[test]
fn unpinned_uses_are_found() {
    let good = format!(
        "steps:\n  - uses: actions/checkout@{SHA} # v4.4.0\n  - uses: ./.github/workflows/ci.yml\njobs:\n  ci:\n    uses: ./.github/workflows/ci.yml\n"
    );
    assert_eq!(unpinned_uses(&good), Vec::<String>::new());
    for bad in [
        "  - uses: actions/checkout@v4".to_owned(),
        format!("  - uses: actions/checkout@{SHA}"),
        format!("  - uses: actions/checkout@{} # v4", &SHA[..39]),
        format!("  - uses: actions/checkout@{} # v4", SHA.to_uppercase()),
        format!("  - uses: checkout@{SHA} # v4"),
        "    uses: octo/reusable/.github/workflows/x.yml@main # v1".to_owned(),
        format!("  - uses: actions/checkout@{SHA} # main"),
    ] {
        assert_eq!(unpinned_uses(&bad).len(), 1, "{bad}");
    }
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("test YAML")
}

#[test]
fn over_broad_permissions_are_found() {
    let good = yaml(
        "permissions:\n  contents: read\njobs:\n  r:\n    permissions:\n      contents: write\n",
    );
    assert!(permission_problems(&good, &["contents"]).is_empty());
    for bad in [
        "jobs:\n  a: {}\n",
        "permissions: write-all\njobs:\n  a: {}\n",
        "permissions:\n  contents: write\njobs:\n  a: {}\n",
        "permissions:\n  contents: read\njobs:\n  a:\n    permissions: write-all\n",
        "permissions:\n  contents: read\njobs:\n  a:\n    permissions:\n      packages: write\n",
    ] {
        assert!(
            !permission_problems(&yaml(bad), &["contents"]).is_empty(),
            "{bad}"
        );
    }
}

#[test]
fn a_release_not_waiting_for_ci_and_e2e_is_found() {
    let good = yaml(
        "jobs:\n  ci:\n    uses: ./.github/workflows/ci.yml\n  e2e:\n    uses: ./.github/workflows/e2e.yml\n  build:\n    needs: [ci, e2e]\n  publish:\n    needs: build\n",
    );
    assert_eq!(release_gate_problems(&good), Vec::<String>::new());
    for bad in [
        // No e2e at all.
        "jobs:\n  ci:\n    uses: ./.github/workflows/ci.yml\n  publish:\n    needs: ci\n",
        // The publishing job does not wait.
        "jobs:\n  ci:\n    uses: ./.github/workflows/ci.yml\n  e2e:\n    uses: ./.github/workflows/e2e.yml\n  publish:\n    needs: ci\n",
        // A cycle waits for nothing real.
        "jobs:\n  ci:\n    uses: ./.github/workflows/ci.yml\n  e2e:\n    uses: ./.github/workflows/e2e.yml\n  a:\n    needs: b\n  b:\n    needs: a\n",
    ] {
        assert!(!release_gate_problems(&yaml(bad)).is_empty(), "{bad}");
    }
}

#[test]
fn a_secret_in_a_script_is_found() {
    let good = yaml(
        "jobs:\n  a:\n    steps:\n      - run: echo \"$TOKEN\" | helm registry login x --password-stdin\n        env:\n          TOKEN: ${{ secrets.GITHUB_TOKEN }}\n",
    );
    assert!(expressions_in_run(&good).is_empty());
    let bad = yaml(
        "jobs:\n  a:\n    steps:\n      - run: |\n          echo \"${{ secrets.GITHUB_TOKEN }}\" | helm registry login x --password-stdin\n",
    );
    let problems = expressions_in_run(&bad);
    assert!(
        problems.len() == 1 && problems[0].contains("a secret"),
        "{problems:?}"
    );
    let injected = yaml("jobs:\n  a:\n    steps:\n      - run: echo ${{ github.head_ref }}\n");
    assert_eq!(expressions_in_run(&injected).len(), 1);
}

#[test]
fn unsigned_or_sbom_less_releases_are_found() {
    let good = "jobs:\n  r:\n    steps:\n      - uses: docker/build-push-action@x\n      - uses: sigstore/cosign-installer@x\n      - run: cosign sign --yes \"$IMAGE@$DIGEST\"\n      - uses: anchore/sbom-action@x\n        with:\n          output-file: dist/sbom.json\n      - uses: softprops/action-gh-release@x\n        with:\n          files: |\n            dist/sbom.json\n";
    assert_eq!(signing_problems(&yaml(good)), Vec::<String>::new());
    for (from, to) in [
        // Signed by tag.
        ("\"$IMAGE@$DIGEST\"", "\"$IMAGE:v1\""),
        // No installer.
        ("sigstore/cosign-installer@x", "actions/checkout@x"),
        // No SBOM.
        ("anchore/sbom-action@x", "actions/checkout@x"),
        // The SBOM not attached.
        (
            "            dist/sbom.json\n",
            "            dist/other.yaml\n",
        ),
    ] {
        let bad = good.replace(from, to);
        assert_ne!(bad, good);
        assert!(!signing_problems(&yaml(&bad)).is_empty(), "{bad}");
    }
    // Signing before the push signs nothing that exists.
    let early = good.replace(
        "      - uses: docker/build-push-action@x\n      - uses: sigstore/cosign-installer@x\n      - run: cosign sign --yes \"$IMAGE@$DIGEST\"\n",
        "      - uses: sigstore/cosign-installer@x\n      - run: cosign sign --yes \"$IMAGE@$DIGEST\"\n      - uses: docker/build-push-action@x\n",
    );
    assert_ne!(early, good);
    assert!(!signing_problems(&yaml(&early)).is_empty());
}

#[test]
fn a_moving_or_incomplete_toolchain_is_found() {
    let good = "[toolchain]\nchannel = \"1.95.0\"\ncomponents = [\"rustfmt\", \"clippy\"]\n";
    assert_eq!(toolchain_problems(good), Vec::<String>::new());
    assert_eq!(toolchain_channel(good), "1.95.0");
    for bad in [
        good.replace("1.95.0", "stable"),
        good.replace("1.95.0", "1.95"),
        good.replace("1.95.0", "nightly-2026-01-01"),
        good.replace(", \"clippy\"", ""),
        "[toolchain]\n".to_owned(),
    ] {
        assert!(!toolchain_problems(&bad).is_empty(), "{bad}");
    }
    assert_eq!(
        own_toolchain("      - uses: dtolnay/rust-toolchain@stable\n").len(),
        1
    );
    assert!(own_toolchain("      - run: rustup toolchain install\n").is_empty());
}

#[test]
fn unpinned_base_images_are_found() {
    let digest = "a".repeat(64);
    let good = format!(
        "FROM --platform=$BUILDPLATFORM docker.io/library/rust:1.95.0-bookworm@sha256:{digest} AS build\nFROM build\nfrom debian:bookworm-slim@sha256:{digest}\n"
    );
    assert_eq!(unpinned_bases(&good), Vec::<String>::new());
    assert_eq!(
        unpinned_bases("FROM debian:bookworm-slim\nFROM --platform=x rust:1.95 AS b\n"),
        ["debian:bookworm-slim", "rust:1.95"]
    );
    assert_eq!(
        unpinned_bases(&format!("FROM debian@sha256:{}\n", &digest[1..])).len(),
        1
    );
}
