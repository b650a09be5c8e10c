//! Throwaway network namespaces, processes started in them, and threads moved into them. Every
//! guard undoes what it made when dropped, so an error or a panic leaves nothing behind.

use std::fs::File;
use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use rustix::process::{Pid, Signal};

/// Prefix of every namespace this module creates; the process id follows, so a stale namespace
/// can be told from one a running bench owns.
const PREFIX: &str = "klb-hb";

/// `klb-hb<pid>-<role>`: the name of a namespace or temporary directory this process owns.
pub fn owned_name(role: &str) -> String {
    format!("{PREFIX}{}-{role}", std::process::id())
}

/// Runs `ip` with `args`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A network namespace, deleted (with every process still in it killed) when dropped.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `klb-hb<pid>-<role>` with its loopback up.
    pub fn create(role: &str) -> Result<Self> {
        let name = owned_name(role);
        ip(&["netns", "add", &name]).with_context(|| format!("creating namespace {name}"))?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <ns> args`.
    pub fn ip(&self, args: &[&str]) -> Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Runs a program inside the namespace and waits for it (`sysctl`, ...).
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<()> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        ip(&all)
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
            .name(format!("hostbench-{what}"))
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
        // Only this bench starts processes here; a leftover one is a child whose guard did not
        // run (or a grandchild such as nft): kill it by its pid before the namespace goes.
        for pid in self.pids() {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("hostbench: deleting namespace {}: {e:#}", self.name);
        }
    }
}

/// Deletes the `klb-hb<pid>-*` namespaces (killing what still runs in them) and temporary
/// directories whose bench process is gone: a run killed by SIGKILL cannot run its guards.
pub fn remove_stale() {
    for (dir, is_namespace) in [
        (PathBuf::from("/run/netns"), true),
        (std::env::temp_dir(), false),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !owner_gone(&name) {
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

/// True for a `klb-hb<pid>-*` name whose process no longer runs.
fn owner_gone(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .and_then(|rest| rest.split('-').next())
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|pid| {
            pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
        })
}

/// Waits for a thread and unwraps its result.
pub fn join<T>(handle: JoinHandle<Result<T>>, what: &str) -> Result<T> {
    handle
        .join()
        .map_err(|_| anyhow!("the {what} thread panicked"))?
}

/// A started process, terminated and reaped when dropped.
pub struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    /// Starts `cmd`.
    pub fn spawn(mut cmd: Command, what: &str) -> Result<Self> {
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Ok(Self {
            child,
            what: what.to_owned(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self
            .child
            .try_wait()
            .with_context(|| format!("checking on {}", self.what))?
        {
            None => Ok(()),
            Some(status) => bail!("{} exited early ({status})", self.what),
        }
    }

    /// SIGTERM, then SIGKILL after `grace` (at once when `grace` is zero); reaps the process
    /// either way.
    pub fn stop(&mut self, grace: Duration) {
        if !grace.is_zero()
            && let Ok(None) = self.child.try_wait()
        {
            let _ = rustix::process::kill_process(Pid::from_child(&self.child), Signal::TERM);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for the process to exit and returns its stdout (it must have been
    /// started with stdout piped and must print little: the pipe is read after the exit).
    pub fn finish(mut self, limit: Duration) -> Result<String> {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self
                .child
                .try_wait()
                .with_context(|| format!("waiting for {}", self.what))?
            {
                break status;
            }
            if Instant::now() > deadline {
                bail!("{} did not finish within {limit:?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut text = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_string(&mut text)
                .with_context(|| format!("reading the output of {}", self.what))?;
        }
        if !status.success() {
            bail!("{} failed ({status})", self.what);
        }
        Ok(text)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}
