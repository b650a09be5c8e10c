//! `kuport crds` reproduces the committed `crds/` byte for byte, and its output is valid YAML
//! holding both CRDs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kuport() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kuport"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kuport-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn committed_crds_match_the_types() {
    let out = scratch_dir("crds");
    let status = kuport()
        .args(["crds", "--out"])
        .arg(&out)
        .status()
        .expect("run kuport crds");
    assert!(status.success());
    let committed = repo_root().join("crds");
    assert_eq!(
        yaml_files(&out),
        yaml_files(&committed),
        "crds/ holds other files than kuport generates"
    );
    for name in yaml_files(&out) {
        let generated = std::fs::read_to_string(out.join(&name)).expect("generated file");
        let on_disk = std::fs::read_to_string(committed.join(&name)).expect("committed file");
        assert!(
            generated == on_disk,
            "crds/{name} differs from what the types generate; run `cargo run -p kuport -- crds --out crds` and commit"
        );
    }
    std::fs::remove_dir_all(&out).expect("remove scratch dir");
}

#[test]
fn printed_stream_holds_every_crd() {
    let output = kuport().arg("crds").output().expect("run kuport crds");
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).expect("utf-8");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("valid YAML");
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "portmapclasses.kuport.wlz.li",
            "portmapnodes.kuport.wlz.li",
            "portmaps.kuport.wlz.li"
        ]
    );
    assert!(docs.iter().all(|d| d["kind"] == "CustomResourceDefinition"));
}

#[test]
fn crds_out_reports_an_unwritable_directory() {
    let file = scratch_dir("not-a-dir");
    std::fs::write(&file, "x").expect("write file");
    let output = kuport()
        .args(["crds", "--out"])
        .arg(file.join("sub"))
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("creating CRD output directory"), "{stderr}");
    std::fs::remove_file(&file).expect("remove file");
}

#[test]
fn help_explains_the_commands() {
    let output = kuport().arg("--help").output().expect("run kuport --help");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("client's own source address"), "{text}");
    assert!(text.contains("crds"), "{text}");

    let output = kuport()
        .args(["crds", "--help"])
        .output()
        .expect("run kuport crds --help");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("--out <DIR>"), "{text}");
    assert!(text.contains("kubectl apply -f -"), "{text}");
}

#[test]
fn version_prints_the_package_version() {
    let output = kuport()
        .args(["version", "--client"])
        .output()
        .expect("run kuport version --client");
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!(
            "Client: kuport {} ({}/{})\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH
        )
    );
}
