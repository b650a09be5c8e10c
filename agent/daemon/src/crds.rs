//! `kuport crds`: render the generated CRDs to standard output or to a directory.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kuport_core::crd;

/// Both CRDs as one multi-document YAML stream.
pub fn render_stream() -> anyhow::Result<String> {
    let mut docs = Vec::new();
    for file in crd::crd_files() {
        docs.push(crd::render_yaml(&file.crd)?);
    }
    Ok(docs.join("---\n"))
}

/// Writes one file per CRD into `dir`, creating it when missing; returns the paths written.
pub fn write_dir(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating CRD output directory {}", dir.display()))?;
    let mut written = Vec::new();
    for file in crd::crd_files() {
        let path = dir.join(&file.file_name);
        let yaml = crd::render_yaml(&file.crd)?;
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
