//! Running commands and long-lived processes, and the record of everything the lab created so
//! that `kuport-lab down` (another process, maybe after a crash) can remove exactly that.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// Where the record and the logs live: on tmpfs, root-only, gone after a reboot like the
/// namespaces it describes.
pub const RUN_DIR: &str = "/run/kuport-lab";

pub use kuport_testkit::process::run;
use kuport_testkit::process::{stdout_of, stop_child};
pub use kuport_testkit::wait::wait_until;

use crate::record::{LabState, ProcessRecord, SysctlRecord};

/// Runs a command feeding `input` on stdin.
pub fn run_with_input(program: &str, args: &[&str], input: &str) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting `{program} {}`", args.join(" ")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .with_context(|| format!("writing to `{program}`"))?;
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("waiting for `{program}`"))?;
    stdout_of(program, args, &out)
}

/// Creates `dir` (and its parents) readable by its owner only (0700), tightening it when it
/// already exists: it holds secrets such as the mesh's private keys.
pub fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private (0700)", dir.display()))
}

/// Writes a secret (a private key, a kubeconfig holding a token) readable by its owner only
/// (0600). The file is created with that mode, so no other user can open it between creation
/// and a later chmod, and an existing file is tightened before it is truncated.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    if path.exists() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} private (0600)", path.display()))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening {} to write it", path.display()))?;
    file.write_all(contents)
        .with_context(|| format!("writing {}", path.display()))
}

/// Fails when one of `paths` can be read (or, for a directory, entered) by anyone but its
/// owner: what the lab checks of its key directory and every key it wrote.
pub fn check_private(paths: &[&Path]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for path in paths {
        let mode = std::fs::metadata(path)
            .with_context(|| format!("reading the mode of {}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            bail!(
                "{} holds secrets but has mode {:o}: other users on this machine can read it",
                path.display(),
                mode & 0o777
            );
        }
    }
    Ok(())
}

/// `ip <args>`.
pub fn ip(args: &[&str]) -> Result<String> {
    run("ip", args)
}

/// `ip <words>`: one line reads like the command an operator would type.
/// No argument the lab passes contains whitespace, so splitting on it is exact.
pub fn ip_line(words: &str) -> Result<String> {
    ip(&words.split_whitespace().collect::<Vec<_>>())
}

/// `ip -n <ns> <words>`.
pub fn ip_in(ns: &str, words: &str) -> Result<String> {
    ip_line(&format!("-n {ns} {words}"))
}

/// A shell script inside a namespace.
pub fn sh(ns: &str, script: &str) -> Result<String> {
    run("ip", &["netns", "exec", ns, "sh", "-ec", script])
}

/// A program inside a namespace.
pub fn exec(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// The lab's record and its live children.
pub struct Lab {
    path: PathBuf,
    pub state: LabState,
    children: BTreeMap<i32, Child>,
    pub log_dir: PathBuf,
}

impl Lab {
    /// Opens the record, refusing when an earlier lab is still up.
    pub fn open() -> Result<Self> {
        let dir = Path::new(RUN_DIR);
        std::fs::create_dir_all(dir).with_context(|| format!("creating {RUN_DIR}"))?;
        let path = dir.join("state.json");
        let state = load_state(&path)?;
        if !state.is_empty() {
            bail!(
                "a lab is still up ({} namespaces, {} processes recorded in {}): run `kuport-lab down` first",
                state.namespaces.len(),
                state.processes.len(),
                path.display()
            );
        }
        let log_dir = dir.join("logs");
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let pid = i32::try_from(std::process::id()).context("this process's pid")?;
        let lab = Self {
            path,
            state: LabState {
                owner: Some(ProcessRecord {
                    pid,
                    comm: comm_of(pid).unwrap_or_default(),
                    what: "kuport-lab".to_owned(),
                }),
                ..state
            },
            children: BTreeMap::new(),
            log_dir,
        };
        lab.save()?;
        Ok(lab)
    }

    fn save(&self) -> Result<()> {
        let text = serde_json::to_string_pretty(&self.state).context("encoding the lab record")?;
        replace_file(&self.path, &text)
    }

    /// Creates a namespace with loopback up and IPv6 off, recording it first so a failure
    /// half-way still gets it removed.
    pub fn add_namespace(&mut self, ns: &str) -> Result<()> {
        self.state.namespaces.push(ns.to_string());
        self.save()?;
        ip(&["netns", "add", ns])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        exec(
            ns,
            "sysctl",
            &[
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        )?;
        Ok(())
    }

    pub fn note_run_wireguard(&mut self) -> Result<()> {
        self.state.created_run_wireguard = true;
        self.save()
    }

    /// Starts `program args` inside `ns` (through `ip netns exec`, which execs the program, so
    /// the pid is the program's own), output to `<log_dir>/<what>.log`.
    pub fn spawn(&mut self, ns: &str, what: &str, program: &str, args: &[&str]) -> Result<i32> {
        let comm: String = Path::new(program)
            .file_name()
            .map(|n| n.to_string_lossy().chars().take(15).collect())
            .unwrap_or_default();
        self.spawn_as(ns, what, &comm, program, args)
    }

    /// Like `spawn`, for a program that execs another (`sh -c "...; exec prog"`): `comm` names
    /// the program that ends up running under the pid.
    pub fn spawn_as(
        &mut self,
        ns: &str,
        what: &str,
        comm: &str,
        program: &str,
        args: &[&str],
    ) -> Result<i32> {
        let (log, err) = self.new_log(what)?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns, program])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {what}: {program} {}", args.join(" ")))?;
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        let comm = comm.to_string();
        self.children.insert(pid, child);
        self.state.processes.push(ProcessRecord {
            pid,
            comm,
            what: what.to_string(),
        });
        self.save()?;
        Ok(pid)
    }

    /// Starts `program args` as given (no `ip netns exec`: the command enters its namespaces
    /// itself, for example with `nsenter`), recorded as `comm`, output to `<log_dir>/<what>.log`.
    pub fn spawn_direct(
        &mut self,
        what: &str,
        comm: &str,
        program: &str,
        args: &[&str],
    ) -> Result<i32> {
        let (log, err) = self.new_log(what)?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {what}: {program} {}", args.join(" ")))?;
        let pid = i32::try_from(child.id()).context("pid out of range")?;
        self.children.insert(pid, child);
        self.state.processes.push(ProcessRecord {
            pid,
            comm: comm.to_string(),
            what: what.to_string(),
        });
        self.save()?;
        Ok(pid)
    }

    /// Records a cgroup name before it is created (so a failure half-way still removes it).
    pub fn note_cgroup(&mut self, name: &str) -> Result<()> {
        if !self.state.cgroups.iter().any(|c| c == name) {
            self.state.cgroups.push(name.to_string());
        }
        self.save()
    }

    /// Records a sysctl's current value once (the first record wins: it is the original).
    pub fn note_sysctl(&mut self, path: &str) -> Result<()> {
        if self.state.sysctls.iter().any(|s| s.path == path) {
            return Ok(());
        }
        let value = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        self.state.sysctls.push(SysctlRecord {
            path: path.to_string(),
            value: value.trim().to_string(),
        });
        self.save()
    }

    /// Creates `dir` and its missing parents, recording each one created.
    pub fn create_host_dir(&mut self, dir: &Path) -> Result<()> {
        let mut missing = Vec::new();
        let mut at = Some(dir);
        while let Some(d) = at {
            if d.exists() {
                break;
            }
            missing.push(d.display().to_string());
            at = d.parent();
        }
        for d in missing.into_iter().rev() {
            self.state.host_dirs.push(d.clone());
            self.save()?;
            std::fs::create_dir(&d).with_context(|| format!("creating {d}"))?;
        }
        Ok(())
    }

    /// Records a data directory (removed whole by teardown) and creates it.
    pub fn add_data_dir(&mut self, dir: &Path) -> Result<()> {
        self.state.data_dirs.push(dir.display().to_string());
        self.save()?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
    }

    /// Logs of the processes started from now on go to `logs/<scenario>/`, emptied first so
    /// every log there is this run's.
    pub fn set_scenario(&mut self, name: &str) -> Result<()> {
        let dir = Path::new(RUN_DIR).join("logs").join(sanitize(name));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        self.log_dir = dir;
        Ok(())
    }

    pub fn log_path(&self, what: &str) -> PathBuf {
        self.log_dir.join(format!("{}.log", sanitize(what)))
    }

    /// A fresh log for a process about to start, as its stdout and stderr. The log of an
    /// earlier process of the same name (an agent stopped and started again) is kept as
    /// `<what>.<n>.log`, n counting from 1, rather than overwritten: it holds what happened
    /// before the restart. Fresh, not appended: a caller waiting for a line ("ready") must not
    /// find the earlier process's.
    fn new_log(&self, what: &str) -> Result<(File, File)> {
        let path = self.log_path(what);
        if path.exists() {
            let kept = (1..)
                .map(|n| self.log_dir.join(format!("{}.{n}.log", sanitize(what))))
                .find(|p| !p.exists())
                .context("numbering an earlier log")?;
            std::fs::rename(&path, &kept)
                .with_context(|| format!("keeping {} as {}", path.display(), kept.display()))?;
        }
        let log = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let err = log
            .try_clone()
            .with_context(|| format!("opening {}", path.display()))?;
        Ok((log, err))
    }

    /// Signals a recorded process and waits for it (escalating to SIGKILL after `grace`).
    pub fn stop(&mut self, pid: i32, signal: Signal, grace: Duration) -> Result<()> {
        match self.children.get_mut(&pid) {
            Some(child) => stop_child(child, signal, grace),
            None => {
                if let Some(p) = Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(p, signal);
                }
            }
        }
        self.children.remove(&pid);
        self.state.processes.retain(|p| p.pid != pid);
        self.save()
    }

    /// Stops every process and deletes every namespace, in reverse order of creation. Returns
    /// what could not be removed (an empty list is a clean host).
    pub fn teardown(&mut self) -> Vec<String> {
        let pids: Vec<i32> = self.state.processes.iter().rev().map(|p| p.pid).collect();
        for pid in pids {
            let _ = self.stop(pid, Signal::TERM, Duration::from_secs(3));
        }
        let mut left = crate::hostres::release(&self.state);
        self.state.cgroups.clear();
        self.state.sysctls.clear();
        self.state.host_dirs.clear();
        self.state.data_dirs.clear();
        for ns in std::mem::take(&mut self.state.namespaces).into_iter().rev() {
            if namespace_exists(&ns) && ip(&["netns", "del", &ns]).is_err() {
                left.push(format!("namespace {ns}"));
            }
        }
        if self.state.created_run_wireguard {
            let _ = std::fs::remove_dir("/run/wireguard");
            self.state.created_run_wireguard = false;
        }
        self.state.owner = None;
        let _ = self.save();
        left
    }
}

/// A name made safe for a file name.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn load_state(path: &Path) -> Result<LabState> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .with_context(|| format!("reading the lab record {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LabState::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

pub fn namespace_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// `kuport-lab down`: removes what the record names, killing a pid only while its comm still
/// matches. Returns a line saying what was removed; nothing when there was nothing to remove.
pub fn down() -> Result<String> {
    down_at(Path::new(RUN_DIR))
}

/// The `kuport-lab` process still running the lab the record describes, other than this one.
fn run_in_progress(state: &LabState, this_pid: i32) -> Option<i32> {
    let owner = state.owner.as_ref()?;
    (owner.pid != this_pid && comm_of(owner.pid).as_deref() == Some(owner.comm.as_str()))
        .then_some(owner.pid)
}

fn down_at(dir: &Path) -> Result<String> {
    let path = dir.join("state.json");
    let state = load_state(&path)?;
    let this_pid = i32::try_from(std::process::id()).context("this process's pid")?;
    if let Some(pid) = run_in_progress(&state, this_pid) {
        bail!(
            "a lab run is in progress (kuport-lab pid {pid}): it removes its own lab when it ends, or on SIGTERM (kill {pid}); `kuport-lab down` removes only a lab whose run has ended"
        );
    }
    if state.is_empty() {
        return Ok(String::new());
    }
    let mut killed = 0;
    for p in state.processes.iter().rev() {
        if comm_of(p.pid).as_deref() == Some(p.comm.as_str())
            && let Some(pid) = Pid::from_raw(p.pid)
        {
            let _ = rustix::process::kill_process(pid, Signal::TERM);
            killed += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    for p in &state.processes {
        while comm_of(p.pid).as_deref() == Some(p.comm.as_str()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if comm_of(p.pid).as_deref() == Some(p.comm.as_str())
            && let Some(pid) = Pid::from_raw(p.pid)
        {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
    let left = crate::hostres::release(&state);
    if !left.is_empty() {
        eprintln!("down: could not remove {}", left.join(", "));
    }
    let mut deleted = 0;
    for ns in state.namespaces.iter().rev() {
        if namespace_exists(ns) {
            ip(&["netns", "del", ns])?;
            deleted += 1;
        }
    }
    if state.created_run_wireguard {
        let _ = std::fs::remove_dir("/run/wireguard");
    }
    let cleared = serde_json::to_string(&LabState::default()).context("encoding the lab record")?;
    replace_file(&path, &cleared)?;
    Ok(format!(
        "down: stopped {killed} recorded processes, deleted {deleted} namespaces"
    ))
}

/// The record is rewritten on every namespace and process; an interrupted lab must still leave
/// it whole (old or new, never truncated) or `down` cannot find what to remove.
fn replace_file(path: &Path, contents: &str) -> Result<()> {
    kuport_testkit::fs::write_atomically(path, contents)
        .with_context(|| format!("writing {}", path.display()))
}

fn comm_of(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Moves this thread into a named network namespace. The lab's API client runs on this
/// thread, so its sockets live in the underlay namespace where the API server listens.
pub fn enter_netns(path: &Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    enter_netns_of(&file)
        .with_context(|| format!("entering the network namespace {}", path.display()))
}

/// Moves this thread into the network namespace an open handle refers to.
pub fn enter_netns_of(file: &File) -> Result<()> {
    move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))
        .context("switching network namespace")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn this_process() -> ProcessRecord {
        let pid = i32::try_from(std::process::id()).unwrap();
        ProcessRecord {
            pid,
            comm: comm_of(pid).unwrap(),
            what: "kuport-lab".to_owned(),
        }
    }

    #[test]
    fn a_restarted_process_gets_a_fresh_log_and_the_earlier_one_is_kept() {
        let dir = std::env::temp_dir().join(format!("kuport-lab-logs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lab = Lab {
            path: dir.join("state.json"),
            state: LabState::default(),
            children: BTreeMap::new(),
            log_dir: dir.clone(),
        };
        for run in ["first", "second", "third"] {
            let (mut log, _) = lab.new_log("agent-edge-a").unwrap();
            std::io::Write::write_all(&mut log, run.as_bytes()).unwrap();
        }
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        assert_eq!(read("agent-edge-a.log"), "third");
        assert_eq!(read("agent-edge-a.1.log"), "first");
        assert_eq!(read("agent-edge-a.2.log"), "second");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn down_refuses_while_the_run_that_owns_the_lab_is_alive() {
        let owned = LabState {
            namespaces: vec!["kl-x".to_owned()],
            owner: Some(this_process()),
            ..LabState::default()
        };
        // Another process (pid 1 stands in for it) asking while this one runs the lab.
        assert_eq!(run_in_progress(&owned, 1), Some(this_process().pid));
        // The owner itself may tear down; a recorded owner whose pid now names another program
        // (or nothing) has ended.
        assert_eq!(run_in_progress(&owned, this_process().pid), None);
        let ended = LabState {
            owner: Some(ProcessRecord {
                comm: "not-kuport-lab".to_owned(),
                ..this_process()
            }),
            ..owned.clone()
        };
        assert_eq!(run_in_progress(&ended, 1), None);
        let dir = std::env::temp_dir().join(format!("kuport-lab-down-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("state.json"),
            serde_json::to_string(&LabState {
                owner: Some(ProcessRecord {
                    pid: 1,
                    ..this_process()
                }),
                ..LabState::default()
            })
            .unwrap(),
        )
        .unwrap();
        // pid 1 does not carry this test's comm: the record's owner has ended, nothing to remove.
        let quiet = down_at(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(quiet.unwrap(), "");
    }

    #[test]
    fn down_with_no_record_succeeds_quietly_and_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("kuport-lab-none-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(down_at(&dir).unwrap(), "");
        assert!(!dir.exists(), "down created {}", dir.display());
    }

    #[test]
    fn the_record_is_replaced_whole_without_a_temporary_file_left() {
        let dir = std::env::temp_dir().join(format!("kuport-lab-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        std::fs::write(&path, "old").unwrap();
        replace_file(&path, "{}").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text, "{}");
        assert_eq!(names, vec!["state.json"]);
    }

    #[test]
    fn secrets_are_written_for_their_owner_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let root = std::env::temp_dir().join(format!("kuport-lab-private-{}", std::process::id()));
        let dir = root.join("keys");
        // An existing, world-readable directory and key (as the lab used to leave them).
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let old = dir.join("old.key");
        std::fs::write(&old, "old secret").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        private_dir(&dir).unwrap();
        write_private(&old, b"new secret").unwrap();
        let new = dir.join("new.key");
        write_private(&new, b"fresh").unwrap();
        let fresh_dir = root.join("fresh/nested");
        private_dir(&fresh_dir).unwrap();
        let got = (
            mode(&dir),
            mode(&old),
            std::fs::read_to_string(&old).unwrap(),
            mode(&new),
            mode(&fresh_dir),
        );
        let checked = check_private(&[&dir, &old, &new]).map_err(|e| e.to_string());
        // What the lab wrote before: a key with the default mode fails the check.
        std::fs::write(dir.join("default.key"), "secret").unwrap();
        std::fs::set_permissions(
            dir.join("default.key"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let refused = check_private(&[&dir, &dir.join("default.key")]).map_err(|e| e.to_string());
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(got, (0o700, 0o600, "new secret".to_owned(), 0o600, 0o700));
        assert_eq!(checked, Ok(()));
        let refused = refused.expect_err("a key readable by others is refused");
        assert!(
            refused.contains("default.key") && refused.contains("644"),
            "{refused}"
        );
    }

    #[test]
    fn a_cleared_or_older_record_still_reads() {
        for text in ["{}", r#"{"namespaces": ["kl-ul"]}"#] {
            let state: LabState = serde_json::from_str(text).expect(text);
            assert!(state.processes.is_empty() && !state.created_run_wireguard);
        }
    }
}
