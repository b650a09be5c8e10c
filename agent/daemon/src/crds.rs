//! `kuport crds`: render the generated CRDs to standard output or to a directory.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kuport_core::{api_docs, crd};

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

/// Prints the generated field reference, or splices it into `update`'s generated section.
pub fn markdown(update: Option<&Path>) -> anyhow::Result<()> {
    let generated = api_docs::markdown()?;
    let Some(file) = update else {
        print!("{generated}");
        return Ok(());
    };
    let shown = file.display().to_string();
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {shown} to update"))?;
    let new = api_docs::splice(&text, &generated, &shown)?;
    if new == text {
        eprintln!("{shown} is up to date");
    } else {
        std::fs::write(file, new).with_context(|| format!("writing {shown}"))?;
        eprintln!("updated {shown}");
    }
    Ok(())
}
