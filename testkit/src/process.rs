//! Commands run to completion, and long-lived processes stopped by their pid when their guard
//! drops, so a failing test or an error in the lab leaves no process behind.

use std::io::Read as _;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use rustix::process::Pid;
/// The signals [`stop_child`] and [`signal_child`] send (re-exported so a test needs no rustix).
pub use rustix::process::Signal;

/// How long a dropped [`Proc`] has to exit on SIGTERM before SIGKILL.
const DROP_GRACE: Duration = Duration::from_secs(2);
/// How long a killed process may take to be reaped before we give up on it: one stuck in the
/// kernel must not hang the test or the lab that is cleaning up.
const REAP_LIMIT: Duration = Duration::from_secs(10);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// Runs `program args` to completion with no stdin and returns its stdout; the error names the
/// command line and quotes its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{program} {}`", args.join(" ")))?;
    stdout_of(program, args, &out)
}

/// The command's stdout when it succeeded, else an error naming it and quoting its stderr.
pub fn stdout_of(program: &str, args: &[&str], out: &std::process::Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sends `signal` to `child` unless it has exited (a test's stand-in for a CI timeout, a closed
/// terminal or Ctrl-C); the child's own pid cannot have been reused while it is not reaped.
pub fn signal_child(child: &mut Child, signal: Signal) {
    if matches!(child.try_wait(), Ok(None)) {
        let _ = rustix::process::kill_process(Pid::from_child(child), signal);
    }
}

/// Sends `signal` to `child` unless it has exited, waits up to `grace` for it to exit, then
/// kills it (at once when `grace` is zero) and reaps it. Signals go to the child's own pid,
/// which cannot have been reused while the child is not reaped.
pub fn stop_child(child: &mut Child, signal: Signal, grace: Duration) {
    if !grace.is_zero() && matches!(child.try_wait(), Ok(None)) {
        let _ = rustix::process::kill_process(Pid::from_child(child), signal);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(POLL);
        }
    }
    let _ = child.kill();
    let deadline = Instant::now() + REAP_LIMIT;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() >= deadline {
            eprintln!(
                "kuport-testkit: pid {} did not exit within {REAP_LIMIT:?} of SIGKILL",
                child.id()
            );
            return;
        }
        std::thread::sleep(POLL);
    }
}

/// A started process, terminated by its pid and reaped when dropped.
pub struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    /// Starts `cmd`; `what` names it in errors.
    pub fn spawn(mut cmd: Command, what: &str) -> Result<Self> {
        let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        Ok(Self::adopt(child, what))
    }

    /// Guards a process started elsewhere (by a caller with errors of its own).
    pub fn adopt(child: Child, what: &str) -> Self {
        Self {
            child,
            what: what.to_owned(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process is, as given to [`Proc::spawn`].
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Its stdout, once (when it was started with stdout piped).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Its stderr, once (when it was started with stderr piped).
    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// How it exited, or `None` while it runs.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .with_context(|| format!("checking on {}", self.what))
    }

    /// Fails when the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.exited()? {
            None => Ok(()),
            Some(status) => bail!("{} exited early ({status})", self.what),
        }
    }

    /// SIGTERM, then SIGKILL after `grace` (at once when `grace` is zero); reaps the process
    /// either way.
    pub fn stop(&mut self, grace: Duration) {
        stop_child(&mut self.child, Signal::TERM, grace);
    }

    /// Waits up to `limit` for the process to exit and returns its stdout (it must have been
    /// started with stdout piped and must print little: the pipe is read after the exit).
    pub fn finish(mut self, limit: Duration) -> Result<String> {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.exited()? {
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
        self.stop(DROP_GRACE);
    }
}

/// `/proc/<pid>` exists: the process (or a thread of that id) runs.
pub fn pid_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_guard_stops_its_process() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let proc = Proc::spawn(cmd, "sleep").expect("sleep starts");
        let pid = proc.pid();
        assert!(pid_exists(pid));
        drop(proc);
        assert!(!pid_exists(pid), "pid {pid} still runs after the drop");
    }

    #[test]
    fn finish_returns_stdout_and_fails_on_an_error_exit() {
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo hi"]).stdout(Stdio::piped());
        let out = Proc::spawn(ok, "echo").expect("sh starts");
        assert_eq!(out.finish(Duration::from_secs(10)).expect("ok"), "hi\n");
        let mut bad = Command::new("sh");
        bad.args(["-c", "exit 3"]).stdout(Stdio::piped());
        let bad = Proc::spawn(bad, "exit 3").expect("sh starts");
        assert!(bad.finish(Duration::from_secs(10)).is_err());
    }

    #[test]
    fn run_quotes_the_failing_command_and_its_stderr() {
        assert_eq!(run("sh", &["-c", "echo out"]).expect("ok"), "out\n");
        let e = run("sh", &["-c", "echo why >&2; exit 1"]).expect_err("fails");
        let text = format!("{e:#}");
        assert!(
            text.contains("`sh -c echo why >&2; exit 1`") && text.contains("why"),
            "{text}"
        );
    }
}
