//! `deploy/manifests/`: reading it as kustomize would (the resources its kustomization lists, in
//! order) and producing the release artifacts from it.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The agent image the committed manifests name; release bundles replace it.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "ghcr.io/walzen-group/kuport-agent";

/// Why the manifests could not be read or bundled.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not YAML, or not the shape expected.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// An argument is refused.
    #[error("{0}")]
    Argument(String),
}

/// One manifest file: its path and the objects in it, in order.
#[derive(Debug, Clone)]
pub struct ManifestFile {
    /// The file's name inside the directory.
    pub name: String,
    /// Its text.
    pub text: String,
    /// Its YAML documents, as JSON; empty documents are left out.
    pub objects: Vec<Value>,
}

/// The files `dir/kustomization.yaml` lists under `resources`, in its order.
pub fn load_dir(dir: &Path) -> Result<Vec<ManifestFile>, ManifestError> {
    let kustomization_path = dir.join("kustomization.yaml");
    let kustomization = read(&kustomization_path)?;
    let parsed = parse_documents(&kustomization_path, &kustomization)?;
    let resources = parsed
        .first()
        .and_then(|k| k.get("resources"))
        .and_then(Value::as_array)
        .ok_or_else(|| ManifestError::Invalid {
            path: kustomization_path.clone(),
            message: "no resources list".to_owned(),
        })?;
    let mut files = Vec::new();
    for resource in resources {
        let name = resource.as_str().ok_or_else(|| ManifestError::Invalid {
            path: kustomization_path.clone(),
            message: format!("resource {resource} is not a file name"),
        })?;
        let path = dir.join(name);
        let text = read(&path)?;
        let objects = parse_documents(&path, &text)?;
        files.push(ManifestFile {
            name: name.to_owned(),
            text,
            objects,
        });
    }
    Ok(files)
}

/// Every YAML document of `text`, empty ones left out.
pub fn parse_documents(path: &Path, text: &str) -> Result<Vec<Value>, ManifestError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple::<Value>(text).map_err(|e| ManifestError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn read(path: &Path) -> Result<String, ManifestError> {
    std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The release's `kuport-<version>.yaml`: every resource of the kustomization in order, as one
/// multi-document stream, with the agent's image replaced by `image` (a reference pinned to a
/// digest: `<repository>@sha256:<hex>`, optionally with a tag before the `@`).
pub fn bundle(dir: &Path, image: &str) -> Result<String, ManifestError> {
    check_pinned(image)?;
    with_image(dir, image)
}

/// Every resource of the kustomization in order, as one multi-document stream, with the
/// agent's image replaced by `image` (any reference; the end-to-end run uses a local tag).
pub fn with_image(dir: &Path, image: &str) -> Result<String, ManifestError> {
    let mut out = String::new();
    let mut replaced = 0;
    for file in load_dir(dir)? {
        let mut text = String::new();
        for line in file.text.lines() {
            let trimmed = line.trim_start();
            if let Some(current) = trimmed.strip_prefix("image: ")
                && current
                    .trim_matches('"')
                    .starts_with(DEFAULT_IMAGE_REPOSITORY)
            {
                let indent = &line[..line.len() - trimmed.len()];
                text.push_str(&format!("{indent}image: {image}\n"));
                replaced += 1;
            } else {
                text.push_str(line);
                text.push('\n');
            }
        }
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(&format!("# Source: deploy/manifests/{}\n", file.name));
        out.push_str(&text);
    }
    if replaced != 1 {
        return Err(ManifestError::Invalid {
            path: dir.to_owned(),
            message: format!(
                "expected exactly one `image: {DEFAULT_IMAGE_REPOSITORY}...` line, found {replaced}"
            ),
        });
    }
    Ok(out)
}

/// `values.yaml` of the chart with `image.digest` set (the packaged chart of a release).
pub fn set_chart_digest(values_yaml: &str, digest: &str) -> Result<String, ManifestError> {
    check_digest(digest)?;
    let mut out = String::new();
    let mut in_image = false;
    let mut replaced = 0;
    for line in values_yaml.lines() {
        if !line.starts_with(' ') && !line.starts_with('#') && !line.is_empty() {
            in_image = line.starts_with("image:");
        }
        if in_image && line.trim_start().starts_with("digest:") {
            let indent = &line[..line.len() - line.trim_start().len()];
            out.push_str(&format!("{indent}digest: \"{digest}\"\n"));
            replaced += 1;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if replaced != 1 {
        return Err(ManifestError::Argument(format!(
            "values.yaml: expected one image.digest line, found {replaced}"
        )));
    }
    Ok(out)
}

fn check_digest(digest: &str) -> Result<(), ManifestError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) =>
        {
            Ok(())
        }
        _ => Err(ManifestError::Argument(format!(
            "{digest:?} is not a digest: expected sha256: and 64 lower-case hex digits"
        ))),
    }
}

fn check_pinned(image: &str) -> Result<(), ManifestError> {
    let (_, digest) = image.split_once('@').ok_or_else(|| {
        ManifestError::Argument(format!(
            "{image:?} is not pinned to a digest: expected <repository>@sha256:<hex>"
        ))
    })?;
    check_digest(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_chart_digest_lands_under_image_only() {
        let values =
            "image:\n  repository: r\n  tag: \"\"\n  digest: \"\"\nother:\n  digest: keep\n";
        let out = set_chart_digest(values, DIGEST).expect("set");
        assert_eq!(
            out,
            format!(
                "image:\n  repository: r\n  tag: \"\"\n  digest: \"{DIGEST}\"\nother:\n  digest: keep\n"
            )
        );
        assert!(set_chart_digest("image:\n  tag: x\n", DIGEST).is_err());
        assert!(set_chart_digest(values, "sha256:short").is_err());
        assert!(set_chart_digest(values, &DIGEST.to_uppercase()).is_err());
    }

    #[test]
    fn a_bundle_needs_a_pinned_image() {
        for image in [
            "ghcr.io/o/kuport-agent:v1.0.0",
            "ghcr.io/o/kuport-agent@sha256:abc",
        ] {
            assert!(check_pinned(image).is_err(), "{image}");
        }
        assert!(check_pinned(&format!("ghcr.io/o/kuport-agent:v1.0.0@{DIGEST}")).is_ok());
    }
}
