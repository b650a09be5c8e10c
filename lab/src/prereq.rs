//! What the lab needs before it starts: its tools (installed with apt on Debian and Ubuntu,
//! saying what it installs) and kuport's binaries beside its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// (command, Debian package providing it).
const TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("bridge", "iproute2"),
    ("nft", "nftables"),
    ("wireguard-go", "wireguard-go"),
    ("wg", "wireguard-tools"),
    ("nsenter", "util-linux"),
    ("ping", "iputils-ping"),
];

/// The binaries the lab runs, all from the same build as the lab itself.
const BINARIES: &[&str] = &["kuport", "kuport-sim", "kuport-echo"];

fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
        .unwrap_or(false)
}

/// Checks the tools and installs the missing ones with apt where that is possible.
pub fn ensure_tools() -> Result<()> {
    let mut packages: Vec<&str> = TOOLS
        .iter()
        .filter(|(cmd, _)| !on_path(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    packages.dedup();
    if packages.is_empty() {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!(
            "missing tools; install the packages {} (Debian names) and run again",
            packages.join(" ")
        );
    }
    eprintln!(
        "kuport-lab: installing missing packages with apt-get: {}",
        packages.join(" ")
    );
    let update = Command::new("apt-get")
        .args(["update", "-qq"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get update")?;
    if !update.success() {
        bail!("apt-get update failed ({update})");
    }
    let install = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get install")?;
    if !install.success() {
        bail!("apt-get install {} failed ({install})", packages.join(" "));
    }
    Ok(())
}

/// The directory holding kuport's binaries: the lab's own. Missing ones are built with the
/// same cargo that built the lab (`$CARGO`), in the same profile.
pub fn binaries() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the kuport-lab binary")?;
    let dir = exe
        .parent()
        .context("the kuport-lab binary has no directory")?
        .to_path_buf();
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    // Under `cargo run` (`cargo lab`) a binary older than any source would prove nothing about
    // the code at hand: build then. Binaries newer than every source (as `cargo test
    // --workspace` leaves them in CI) are used as they are, which saves rebuilding the
    // dependencies with this build's feature set.
    let under_cargo = std::env::var_os("CARGO").is_some();
    let stale = under_cargo && older_than_sources(&dir);
    if missing.is_empty() && !stale {
        return Ok(dir);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let release = dir.file_name().is_some_and(|n| n == "release");
    eprintln!("kuport-lab: building {} with {cargo}", BINARIES.join(", "));
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "kuport",
        "-p",
        "kuport-sim",
        "-p",
        "kuport-host",
        "--bins",
    ]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .status()
        .with_context(|| format!("running {cargo} build"))?;
    if !status.success() {
        bail!("building {} failed ({status})", missing.join(", "));
    }
    for b in BINARIES {
        if !dir.join(b).is_file() {
            bail!(
                "{b} is still missing from {} after the build",
                dir.display()
            );
        }
    }
    Ok(dir)
}

/// Whether any of the binaries is older than the newest source file of the workspace.
fn older_than_sources(dir: &Path) -> bool {
    let oldest_binary = BINARIES.iter().filter_map(|b| modified(&dir.join(b))).min();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut newest_source = None;
    for top in ["agent", "sim", "Cargo.lock", "Cargo.toml"] {
        newest(&root.join(top), &mut newest_source);
    }
    match (oldest_binary, newest_source) {
        (Some(bin), Some(src)) => bin < src,
        _ => true,
    }
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The newest modification time of the `.rs` and `.toml` files (and Cargo.lock) below `path`.
fn newest(path: &Path, acc: &mut Option<std::time::SystemTime>) {
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

const BEGIN: &str = "<!-- kuport-lab bench: begin -->";
const END: &str = "<!-- kuport-lab bench: end -->";

/// Replaces the text between the bench markers of a Markdown file (appending them when absent).
pub fn write_between_markers(path: &Path, body: &str) -> Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let block = format!("{BEGIN}\n{body}{END}");
    let new = match (text.find(BEGIN), text.find(END)) {
        (Some(a), Some(b)) if b > a => format!("{}{block}{}", &text[..a], &text[b + END.len()..]),
        _ => format!("{text}\n{block}\n"),
    };
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}
