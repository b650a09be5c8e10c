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
    // Inspecting and deleting conntrack entries by hand in scenarios' controls (never used by
    // the agent, which speaks ctnetlink itself).
    ("conntrack", "conntrack"),
    // The bench's offload experiment turns GRO on and off on the forwarding devices.
    ("ethtool", "ethtool"),
];

/// The binaries the lab runs, all from the same build as the lab itself.
const BINARIES: &[&str] = &["kuport", "kuport-sim", kuport_testkit::bins::ECHO];
/// The packages they are built from.
const PACKAGES: &[&str] = &["kuport", "kuport-sim", "kuport-testkit"];
/// What they are built from, in the workspace.
const SOURCES: &[&str] = &["agent", "sim", "testkit", "Cargo.lock", "Cargo.toml"];

/// What the local cluster needs on top (`kuport-lab cluster`): a container runtime and the
/// standard CNI plugins on every node. An absolute path is checked as a file.
const CLUSTER_TOOLS: &[(&str, &str)] = &[
    ("containerd", "containerd"),
    ("containerd-shim-runc-v2", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("unshare", "util-linux"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/lib/cni/host-local", "containernetworking-plugins"),
    ("/usr/lib/cni/portmap", "containernetworking-plugins"),
];

/// What real Cilium needs on the local cluster's nodes (`kuport-lab cluster --cni cilium-*`):
/// clang and llc 19 (the agent compiles its BPF programs at run time and needs clang 18.1 or
/// newer), the iptables tools for its rules and `ipset` for native routing's masquerade
/// exception.
const CILIUM_TOOLS: &[(&str, &str)] = &[
    ("/usr/lib/llvm-19/bin/clang", "clang-19"),
    ("/usr/lib/llvm-19/bin/llc", "llvm-19"),
    ("iptables", "iptables"),
    ("ipset", "ipset"),
];

fn on_path(cmd: &str) -> bool {
    if cmd.starts_with('/') {
        return Path::new(cmd).is_file();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
        .unwrap_or(false)
}

/// Checks the tools and installs the missing ones with apt where that is possible.
pub fn ensure_tools() -> Result<()> {
    ensure(TOOLS)
}

/// The lab's tools and the local cluster's (see [`CLUSTER_TOOLS`]).
pub fn ensure_cluster_tools() -> Result<()> {
    ensure(TOOLS)?;
    ensure(CLUSTER_TOOLS)
}

/// The tools real Cilium needs (see [`CILIUM_TOOLS`]).
pub fn ensure_cilium_tools() -> Result<()> {
    ensure(CILIUM_TOOLS)
}

fn ensure(tools: &[(&str, &str)]) -> Result<()> {
    let mut packages: Vec<&str> = tools
        .iter()
        .filter(|(cmd, _)| !on_path(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    packages.sort_unstable();
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

/// The directory holding kuport's binaries: the lab's own. Missing ones (and, under `cargo
/// lab`, ones older than the sources) are built with the same cargo that built the lab, in the
/// same profile.
pub fn binaries() -> Result<PathBuf> {
    kuport_testkit::bins::ensure(BINARIES, PACKAGES, SOURCES)
}

const BEGIN: &str = "<!-- kuport-lab bench: begin -->";
const END: &str = "<!-- kuport-lab bench: end -->";

/// Replaces the text between the bench markers of a Markdown file (appending them when absent).
pub fn write_between_markers(path: &Path, body: &str) -> Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let new = replace_between_markers(&text, body);
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}

fn replace_between_markers(text: &str, body: &str) -> String {
    let block = format!("{BEGIN}\n{body}{END}");
    match (text.find(BEGIN), text.find(END)) {
        (Some(a), Some(b)) if b > a => format!("{}{block}{}", &text[..a], &text[b + END.len()..]),
        _ => format!("{text}\n{block}\n"),
    }
}

/// Writes the rows of a partial run (`bench --only`) into the table between the markers: a
/// row whose measure (first cell) was measured again is replaced where it stands, a new one is
/// appended, and every other row is kept, so a partial run never drops what it did not measure.
pub fn merge_between_markers(path: &Path, table: &str) -> Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let old = match (text.find(BEGIN), text.find(END)) {
        (Some(a), Some(b)) if b > a => &text[a + BEGIN.len()..b],
        _ => "",
    };
    let merged = merge_rows(old, table);
    std::fs::write(path, replace_between_markers(&text, &merged))
        .with_context(|| format!("writing {}", path.display()))
}

/// The measure a table row names (its first cell), or None for a header or separator line.
fn measure_of(line: &str) -> Option<&str> {
    let cell = line.strip_prefix("| ")?.split(" | ").next()?;
    (cell != "measure").then_some(cell)
}

fn merge_rows(old: &str, new: &str) -> String {
    let fresh: Vec<(&str, &str)> = new
        .lines()
        .filter_map(|l| measure_of(l).map(|m| (m, l)))
        .collect();
    let mut out: Vec<String> = new
        .lines()
        .filter(|l| l.starts_with('|') && measure_of(l).is_none())
        .map(str::to_owned)
        .collect();
    let mut used = vec![false; fresh.len()];
    for line in old.lines().filter(|l| measure_of(l).is_some()) {
        match fresh.iter().position(|(m, _)| Some(*m) == measure_of(line)) {
            Some(i) => {
                used[i] = true;
                out.push(fresh[i].1.to_owned());
            }
            None => out.push(line.to_owned()),
        }
    }
    for (i, (_, line)) in fresh.iter().enumerate() {
        if !used[i] {
            out.push((*line).to_owned());
        }
    }
    out.iter().map(|l| format!("{l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "| measure | value |\n|---|---|\n";

    #[test]
    fn a_partial_run_replaces_its_rows_in_place_and_keeps_the_others() {
        let old = format!("{HEAD}| a | 1 |\n| b | 2 |\n| c | 3 |\n");
        let new = format!("{HEAD}| b | 20 |\n| d | 40 |\n");
        assert_eq!(
            merge_rows(&old, &new),
            format!("{HEAD}| a | 1 |\n| b | 20 |\n| c | 3 |\n| d | 40 |\n")
        );
    }

    #[test]
    fn a_table_without_rows_takes_the_new_ones() {
        let new = format!("{HEAD}| b | 20 |\n");
        assert_eq!(merge_rows("", &new), new);
        let text = "intro\n";
        let written = replace_between_markers(text, &new);
        assert!(written.starts_with("intro\n\n<!-- kuport-lab bench: begin -->\n| measure"));
        assert_eq!(replace_between_markers(&written, &new), written);
    }
}
