//! Throwaway network namespaces for kernel tests and the lab's benches. Each is deleted by its
//! name when its guard drops, even when the test fails or the bench errs, after every process
//! still inside it is killed by pid.
//!
//! Names are `<prefix><pid>-<role>` ([`owned_name`]): the pid of the process that made them, so
//! [`remove_stale`] can tell a leftover of a killed run (which could not run its guards) from one
//! a running process owns.

use std::fs::File;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use rustix::process::{Pid, Signal};

use crate::process::{Proc, pid_exists, run};

/// How long a dropped namespace waits for the processes it killed to go.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// True when this process runs as UID 0.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Whether a root test can run: true as root with every one of `tools` on the PATH. Otherwise
/// it prints one line saying why the test skips and returns false, or, with
/// `KUPORT_REQUIRE_ROOT_TESTS=1` (CI), fails the test.
///
/// # Panics
/// When the test cannot run and `KUPORT_REQUIRE_ROOT_TESTS=1`.
pub fn root_or_skip(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| Command::new(t).arg("-V").output().is_err())
        .collect();
    if is_root() && missing.is_empty() {
        return true;
    }
    let why = if is_root() {
        format!("{} missing", missing.join(" and "))
    } else {
        "not root".to_owned()
    };
    assert!(
        std::env::var("KUPORT_REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
        "{test}: KUPORT_REQUIRE_ROOT_TESTS=1 but {why}"
    );
    eprintln!("skipping {test}: {why}");
    false
}

/// `<prefix><pid>-<role>`: the name of a namespace or temporary directory this process owns.
pub fn owned_name(prefix: &str, role: &str) -> String {
    format!("{prefix}{}-{role}", std::process::id())
}

/// A network namespace, deleted (with every process still in it killed) when dropped.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `<prefix><pid>-<role>` with its loopback up. A leftover of that name can only be
    /// from an earlier process with this pid, long gone: it is replaced.
    pub fn create(prefix: &str, role: &str) -> Result<Self> {
        let name = owned_name(prefix, role);
        if Path::new("/run/netns").join(&name).exists() {
            drop(Self { name: name.clone() });
        }
        run("ip", &["netns", "add", &name])
            .with_context(|| format!("creating namespace {name}"))?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <ns> args`, returning its stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Runs a program inside the namespace and waits for it (`sysctl`, ...), returning its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// A command running `program` inside the namespace. `ip netns exec` execs the program
    /// without forking, so the child's pid is the program's.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.name.as_str()])
            .arg(program)
            .stdin(Stdio::null());
        cmd
    }

    /// Starts `program args` inside the namespace with stdout and stderr piped; the guard stops
    /// it by pid.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Result<Proc> {
        let mut cmd = self.command(program);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        Proc::spawn(
            cmd,
            &format!("{program} {} in {}", args.join(" "), self.name),
        )
    }

    /// Runs a shell script in the namespace, whatever its exit.
    ///
    /// # Panics
    /// When `ip` cannot be started: for tests, where that is the failure to see.
    pub fn try_sh(&self, script: &str) -> Output {
        self.command("sh")
            .args(["-c", script])
            .output()
            .unwrap_or_else(|e| panic!("running ip netns exec {} sh: {e}", self.name))
    }

    /// Runs a shell script in the namespace and returns its stdout.
    ///
    /// # Panics
    /// When the script fails, with its output: for tests, where that is the failure to see.
    pub fn sh(&self, script: &str) -> String {
        let out = self.try_sh(script);
        assert!(
            out.status.success(),
            "in {}: {script}\nstdout: {}\nstderr: {}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `f` on a new thread moved into the namespace: sockets it opens, and processes it
    /// starts, live there.
    pub fn thread<T: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<JoinHandle<Result<T>>> {
        let path = format!("/run/netns/{}", self.name);
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        let ns = self.name.clone();
        std::thread::Builder::new()
            .name(format!("netns-{what}"))
            .spawn(move || {
                rustix::thread::move_into_link_name_space(
                    file.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .with_context(|| format!("moving a thread into namespace {ns}"))?;
                drop(file);
                f()
            })
            .with_context(|| format!("starting the {what} thread"))
    }

    /// [`Netns::thread`], waiting for its result.
    pub fn run<T: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        join(self.thread(what, f)?, what)
    }

    /// Pids of the processes in the namespace.
    fn pids(&self) -> Vec<Pid> {
        let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
        else {
            return Vec::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter_map(Pid::from_raw)
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Only its owner starts processes here; a leftover one is a child whose guard did not
        // run (or a grandchild such as nft): kill it by its pid before the namespace goes.
        for pid in self.pids() {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        let deadline = Instant::now() + KILL_WAIT;
        while !self.pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Err(e) = run("ip", &["netns", "del", &self.name]) {
            eprintln!("kuport-testkit: deleting namespace {}: {e:#}", self.name);
        }
    }
}

/// Deletes the `<prefix><pid>-*` namespaces (killing what still runs in them) and temporary
/// directories whose process is gone: a run killed by SIGKILL cannot run its guards.
pub fn remove_stale(prefix: &str) {
    for (dir, is_namespace) in [
        (PathBuf::from("/run/netns"), true),
        (std::env::temp_dir(), false),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !owner_gone(prefix, &name) {
                continue;
            }
            if is_namespace {
                drop(Netns { name });
            } else {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// True for a `<prefix><pid>-*` name whose process no longer runs.
fn owner_gone(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.split('-').next())
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|pid| pid != std::process::id() && !pid_exists(pid))
}

/// Waits for a thread and unwraps its result.
pub fn join<T>(handle: JoinHandle<Result<T>>, what: &str) -> Result<T> {
    handle
        .join()
        .map_err(|_| anyhow!("the {what} thread panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_gone_processes_with_the_prefix_are_stale() {
        let mine = owned_name("kt-", "x");
        assert!(!owner_gone("kt-", &mine));
        // Pids above the kernel's maximum (2^22) never run.
        assert!(owner_gone("kt-", "kt-99999999-x"));
        assert!(!owner_gone("kt-", "klb-hb99999999-x"));
        assert!(!owner_gone("kt-", "kt-notapid-x"));
    }
}
