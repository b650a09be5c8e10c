//! Host resources of the local cluster beyond namespaces and recorded processes: the nodes'
//! cgroups (with whatever still runs in them: containers whose shim was killed), host-wide
//! sysctls a kubelet changed, the mount points made for the nodes' private bind mounts, and the
//! nodes' data. [`release`] removes what a record names, in the only order that works: the
//! processes first, then their cgroups, then the files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kuport_testkit::wait::wait_until;

use crate::record::LabState;

/// Where every cgroup hierarchy is mounted (v1 hybrid: one directory per controller, plus the
/// cgroup2 tree under `unified`).
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The hierarchies mounted under [`CGROUP_ROOT`], sorted.
pub fn hierarchies() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(CGROUP_ROOT)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Every directory under `dir` (itself included), deepest first.
fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut children: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        children.sort();
        for child in children {
            out.extend(subtree(&child));
        }
    }
    if dir.is_dir() {
        out.push(dir.to_path_buf());
    }
    out
}

/// The pids in cgroup `name` and below, in any hierarchy.
pub fn pids_in(name: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for h in hierarchies() {
        for dir in subtree(&h.join(name)) {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Kills everything in cgroup `name` and removes it (and what a kubelet or runc made below it)
/// from every hierarchy. Returns what could not be removed.
pub fn remove_cgroup(name: &str) -> Vec<String> {
    // Frozen tasks do not die: thaw first (a killed kubelet can leave a pod frozen).
    for dir in subtree(&Path::new(CGROUP_ROOT).join("freezer").join(name)) {
        let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    }
    let gone = wait_until(Duration::from_secs(10), || {
        let pids = pids_in(name);
        for pid in &pids {
            if let Some(p) = rustix::process::Pid::from_raw(*pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
        pids.is_empty()
    });
    let mut left = Vec::new();
    if !gone {
        left.push(format!("processes {:?} in cgroup {name}", pids_in(name)));
    }
    for h in hierarchies() {
        for dir in subtree(&h.join(name)) {
            // A cgroup whose last task just died can refuse removal for a moment.
            let removed = wait_until(Duration::from_secs(5), || {
                std::fs::remove_dir(&dir).is_ok() || !dir.exists()
            });
            if !removed {
                left.push(format!("cgroup {}", dir.display()));
            }
        }
    }
    left
}

/// Mount points at or under `dir` in this mount namespace.
fn mounts_under(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.display().to_string();
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| *m == prefix || m.starts_with(&format!("{prefix}/")))
        .map(str::to_owned)
        .collect()
}

/// Removes every resource `state` names except namespaces and processes (the caller's part).
/// Returns what could not be removed; an empty list is a clean host.
pub fn release(state: &LabState) -> Vec<String> {
    let mut left = Vec::new();
    for name in state.cgroups.iter().rev() {
        left.extend(remove_cgroup(name));
    }
    for s in &state.sysctls {
        let now = std::fs::read_to_string(&s.path).unwrap_or_default();
        if now.trim() != s.value && std::fs::write(&s.path, &s.value).is_err() {
            left.push(format!(
                "sysctl {} (still {}, was {})",
                s.path,
                now.trim(),
                s.value
            ));
        }
    }
    for dir in state.data_dirs.iter().rev() {
        let path = Path::new(dir);
        // Every node mount lived in a private mount namespace that died with its processes;
        // one seen here would make the removal reach into someone else's files.
        let mounted = mounts_under(path);
        if !mounted.is_empty() {
            left.push(format!(
                "data {dir} (mounts still under it: {})",
                mounted.join(", ")
            ));
            continue;
        }
        if path.exists() && std::fs::remove_dir_all(path).is_err() {
            left.push(format!("data {dir}"));
        }
    }
    for dir in state.host_dirs.iter().rev() {
        let path = Path::new(dir);
        if path.exists() && std::fs::remove_dir(path).is_err() {
            left.push(format!("directory {dir}"));
        }
    }
    left
}
