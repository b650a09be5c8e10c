//! The krew plugin manifest of a release, as the release workflow makes it (`cargo e2e
//! krew-manifest` over the archives' `.sha256` files): valid YAML that krew accepts, one
//! platform per archive with its URL, hash and binary; a bad checksum file fails the command.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const PLATFORMS: [(&str, &str); 4] = [
    ("linux", "amd64"),
    ("linux", "arm64"),
    ("darwin", "amd64"),
    ("darwin", "arm64"),
];

/// A fresh directory with one `.sha256` file per platform (`hex` of each made distinct).
fn checksum_dir(test: &str) -> (PathBuf, Vec<PathBuf>) {
    let dir = std::env::temp_dir().join(format!("kuport-krew-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let files = PLATFORMS
        .iter()
        .enumerate()
        .map(|(i, (os, arch))| {
            let name = format!("kuport-v1.2.3-{os}-{arch}.tar.gz");
            let path = dir.join(format!("{name}.sha256"));
            std::fs::write(&path, format!("{}  {name}\n", format!("{i}").repeat(64)))
                .expect("write checksum");
            path
        })
        .collect();
    (dir, files)
}

fn krew_manifest(files: &[PathBuf]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kuport-e2e"))
        .args([
            "krew-manifest",
            "--version",
            "1.2.3",
            "--repository",
            "acme/kuport",
        ])
        .args(files)
        .output()
        .expect("running kuport-e2e krew-manifest")
}

#[test]
fn the_manifest_is_a_krew_plugin_with_every_platform() {
    let (dir, files) = checksum_dir("good");
    let output = krew_manifest(&files);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let plugin: Value = serde_saphyr::from_str(&text).expect("the manifest is YAML");
    assert_eq!(
        plugin["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(plugin["kind"], "Plugin");
    // `kubectl kuport ...`: krew links kubectl-<name> to the binary.
    assert_eq!(plugin["metadata"]["name"], "kuport");
    let spec = &plugin["spec"];
    assert_eq!(spec["version"], "v1.2.3");
    assert!(
        spec["shortDescription"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    assert_eq!(spec["homepage"], "https://github.com/acme/kuport");
    let platforms = spec["platforms"].as_array().expect("platforms");
    assert_eq!(platforms.len(), PLATFORMS.len());
    for (i, (os, arch)) in PLATFORMS.iter().enumerate() {
        let p = platforms
            .iter()
            .find(|p| p["selector"]["matchLabels"] == serde_json::json!({"os": os, "arch": arch}))
            .unwrap_or_else(|| panic!("no platform {os}/{arch}:\n{text}"));
        assert_eq!(
            p["uri"],
            format!(
                "https://github.com/acme/kuport/releases/download/v1.2.3/kuport-v1.2.3-{os}-{arch}.tar.gz"
            )
        );
        assert_eq!(p["sha256"], format!("{i}").repeat(64));
        assert_eq!(p["bin"], "kuport");
    }
}

#[test]
fn a_bad_or_missing_checksum_fails_with_the_file_named() {
    let (dir, files) = checksum_dir("bad");
    let missing = krew_manifest(&files[1..]);
    std::fs::write(&files[0], "not a checksum\n").expect("write");
    let bad = krew_manifest(&files);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no archive for linux/amd64"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("kuport-v1.2.3-linux-amd64.tar.gz.sha256")
            && stderr.contains("not a checksum"),
        "{stderr}"
    );
}
