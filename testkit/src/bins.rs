//! kuport's binaries for the tests and the lab, taken from the build that is running: a test
//! or the lab must exercise the code at hand, not a binary left from an older build.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{Context as _, Result, bail};

/// The responder and prober ([`echo`]).
pub const ECHO: &str = "kuport-echo";

/// The workspace root (this crate's parent).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directory cargo puts the running build's binaries in: the executable's own, or for a
/// test or bench (which cargo builds into `deps/`) its parent.
pub fn target_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running executable")?;
    let dir = exe
        .parent()
        .context("the running executable has no directory")?;
    Ok(match dir.file_name() {
        Some(name) if name == "deps" => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    })
}

/// The directory holding `bins` (of the workspace `packages`), beside the running executable.
/// Missing ones are built with the cargo that built this one (`$CARGO`), in the same profile;
/// under cargo, so are binaries older than a file below `sources` (paths in the workspace).
pub fn ensure(bins: &[&str], packages: &[&str], sources: &[&str]) -> Result<PathBuf> {
    let dir = target_dir()?;
    let missing: Vec<&str> = bins
        .iter()
        .copied()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    // Under `cargo run` or `cargo test` a binary older than any source would prove nothing
    // about the code at hand: build then. Binaries newer than every source (as `cargo test
    // --workspace` leaves them in CI) are used as they are, which saves rebuilding the
    // dependencies with the feature set of a build of these packages alone.
    let under_cargo = std::env::var_os("CARGO").is_some();
    let stale = under_cargo && older_than_sources(&dir, bins, sources);
    if missing.is_empty() && !stale {
        return Ok(dir);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("kuport-testkit: building {} with {cargo}", bins.join(", "));
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--quiet"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    cmd.arg("--bins");
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd
        .current_dir(workspace())
        .status()
        .with_context(|| format!("running {cargo} build"))?;
    if !status.success() {
        bail!("building {} failed ({status})", bins.join(", "));
    }
    for b in bins {
        if !dir.join(b).is_file() {
            bail!(
                "{b} is still missing from {} after the build",
                dir.display()
            );
        }
    }
    Ok(dir)
}

/// `kuport-echo` of this build (built first when missing or stale, see [`ensure`]).
pub fn echo() -> Result<PathBuf> {
    Ok(ensure(&[ECHO], &["kuport-testkit"], &["testkit", "Cargo.lock"])?.join(ECHO))
}

/// Whether any of `bins` is older than the newest source file below `sources`.
fn older_than_sources(dir: &Path, bins: &[&str], sources: &[&str]) -> bool {
    let oldest_binary = bins.iter().filter_map(|b| modified(&dir.join(b))).min();
    let root = workspace();
    let mut newest_source = None;
    for top in sources {
        newest(&root.join(top), &mut newest_source);
    }
    match (oldest_binary, newest_source) {
        (Some(bin), Some(src)) => bin < src,
        _ => true,
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The newest modification time of the `.rs` and `.toml` files (and Cargo.lock) below `path`.
fn newest(path: &Path, acc: &mut Option<SystemTime>) {
    if path.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        for entry in entries.flatten() {
            newest(&entry.path(), acc);
        }
    } else if path
        .extension()
        .is_some_and(|e| e == "rs" || e == "toml" || e == "lock")
        && let Some(t) = modified(path)
    {
        *acc = Some(acc.map_or(t, |a| a.max(t)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_test_finds_the_profile_directory_above_deps() {
        let dir = target_dir().expect("target dir");
        assert_ne!(dir.file_name().and_then(|n| n.to_str()), Some("deps"));
        assert!(dir.join("deps").is_dir(), "{}", dir.display());
    }
}
