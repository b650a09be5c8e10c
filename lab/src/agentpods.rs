//! The kubelet of the agents' Pods. The lab runs each node's agent as a process, not in a Pod,
//! yet `kuport status` judges the agents by the kuport DaemonSet and its Pods: a node without a
//! ready agent Pod, or a DaemonSet with no ready agent, is a problem. So the lab records the
//! DaemonSet and one Pod per node (`Cluster::install_daemon_set`), and this module writes what
//! a kubelet and the DaemonSet controller would, in step with the processes:
//!
//! - a Pod is ready while its agent process runs and its `/readyz` answers 200;
//! - its `restartCount` counts the agent's starts after the first;
//! - a stopped agent's container is terminated: `Completed` (exit 0) after the lab's SIGTERM,
//!   `Error` (137) after its SIGKILL, `Error` with its own exit code when it died by itself;
//! - the DaemonSet's desired, current, updated, ready and available counts follow the Pods.
//!
//! It runs on its own thread with its own API client (in the underlay namespace), so it keeps
//! going while the runner's thread blocks in a synchronous step (a rolling restart, a host
//! command). It looks every [`POLL`]; a start or stop the runner records wakes it at once, and
//! [`AgentPods::wait_written`] lets a `stopAgent` step return only once the Pod says so.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::jiff::Timestamp;
use kuport_testkit::objects;
use serde_json::{Value, json};

use crate::cluster::{Cluster, DAEMON_SET_NAMESPACE};
use crate::scenario::SignalName;

/// Where the lab's agents serve `/healthz`, `/readyz` and `/metrics`, inside their node's
/// namespace.
pub const AGENT_HTTP: &str = "127.0.0.1:8081";

/// How often the Pods are brought in step with the processes.
const POLL: Duration = Duration::from_millis(200);

/// How long one `/readyz` may take before the agent counts as not ready (a kubelet's readiness
/// probe has a 1 s timeout by default; the lab's agents answer in microseconds).
const READYZ_TIMEOUT: Duration = Duration::from_millis(500);

/// The agent Pod's name on `node`, as the lab records it.
pub fn pod_name(node: &str) -> String {
    format!("{}-{node}", objects::AGENT_DAEMONSET)
}

/// What the lab knows of one node's agent process.
#[derive(Debug)]
struct Agent {
    ns: String,
    host_ip: Ipv4Addr,
    /// The running process, if any.
    pid: Option<i32>,
    /// How many times it was started.
    starts: u32,
    /// How the lab stopped it last, while it is stopped.
    stopped_by: Option<SignalName>,
    /// Bumped by every start and stop.
    generation: u64,
    /// The generation whose Pod status has been written.
    written: u64,
}

#[derive(Debug, Default)]
struct State {
    agents: BTreeMap<String, Agent>,
    quit: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The running kubelet of the agents' Pods; dropping it stops its thread.
pub struct AgentPods {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for AgentPods {
    fn drop(&mut self) {
        self.shared.lock().quit = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl AgentPods {
    /// Starts keeping the Pods of `nodes` (name, namespace, host address) in step, writing
    /// through the API server `kubeconfig` names; what it could not write goes to `log`.
    pub fn start(
        kubeconfig: &Path,
        api_netns: &Path,
        nodes: &[(String, String, Ipv4Addr)],
        log: PathBuf,
    ) -> Result<Self> {
        // A fresh log per run, as the processes' logs are.
        match std::fs::remove_file(&log) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing the old {}", log.display()));
            }
            _ => {}
        }
        let mut state = State::default();
        for (name, ns, host_ip) in nodes {
            state.agents.insert(
                name.clone(),
                Agent {
                    ns: ns.clone(),
                    host_ip: *host_ip,
                    pid: None,
                    starts: 0,
                    stopped_by: None,
                    generation: 0,
                    written: 0,
                },
            );
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            changed: Condvar::new(),
        });
        let kubeconfig = kubeconfig.to_path_buf();
        let api_netns = api_netns.to_path_buf();
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("agent-pods".into())
            .spawn(move || {
                if let Err(e) = run(&for_thread, &kubeconfig, &api_netns, &log) {
                    note(&log, &format!("stopped keeping the agent Pods: {e:#}"));
                }
            })
            .context("starting the agent Pods' thread")?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The agent on `node` was started as `pid`.
    pub fn started(&self, node: &str, pid: i32) {
        self.update(node, |a| {
            a.pid = Some(pid);
            a.starts += 1;
            a.stopped_by = None;
        });
    }

    /// The lab stopped the agent on `node` with `signal`.
    pub fn stopped(&self, node: &str, signal: SignalName) {
        self.update(node, |a| {
            a.pid = None;
            a.stopped_by = Some(signal);
        });
    }

    fn update(&self, node: &str, change: impl FnOnce(&mut Agent)) {
        let mut state = self.shared.lock();
        if let Some(a) = state.agents.get_mut(node) {
            change(a);
            a.generation += 1;
        }
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Waits until the Pod of `node` shows its last start or stop, at most `timeout`; false
    /// when it did not (the API server unreachable, say).
    pub fn wait_written(&self, node: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            match state.agents.get(node) {
                Some(a) if a.written >= a.generation => return true,
                None => return false,
                Some(_) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || state.quit {
                return false;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The state of a Pod's one container, as the lab writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Container {
    /// The agent was never started.
    Creating,
    /// The process runs; `ready` when its `/readyz` answers 200.
    Running { ready: bool },
    /// The process ended, with this reason and exit code.
    Terminated {
        reason: &'static str,
        exit_code: i32,
    },
}

/// What one agent Pod says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub container: Container,
    pub restarts: u32,
}

impl PodView {
    pub fn ready(&self) -> bool {
        self.container == Container::Running { ready: true }
    }
}

/// What the loop copies of an [`Agent`] to look at it without holding the lock.
struct Observed {
    ns: String,
    host_ip: Ipv4Addr,
    pid: Option<i32>,
    starts: u32,
    stopped_by: Option<SignalName>,
}

impl Observed {
    fn of(a: &Agent) -> Self {
        Self {
            ns: a.ns.clone(),
            host_ip: a.host_ip,
            pid: a.pid,
            starts: a.starts,
            stopped_by: a.stopped_by,
        }
    }
}

/// What is written of a Pod, with the times that go with it (they are not compared).
struct Written {
    view: PodView,
    /// When its Ready condition last changed.
    transition: String,
    /// When the container last started.
    started: String,
}

/// The loop: enter the API server's namespace, connect, then bring the Pods in step every
/// [`POLL`] (or at once when the runner records a start or stop) until dropped.
fn run(shared: &Shared, kubeconfig: &Path, api_netns: &Path, log: &Path) -> Result<()> {
    crate::sys::enter_netns(api_netns)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the agent Pods' runtime")?;
    let cluster = rt.block_on(Cluster::connect(kubeconfig, false))?;
    let mut written: BTreeMap<String, Written> = BTreeMap::new();
    // Consecutive failed `/readyz` answers of each ready agent.
    let mut failures: BTreeMap<String, u32> = BTreeMap::new();
    let mut daemon_set: Option<(usize, usize)> = None;
    let mut last_error = String::new();
    loop {
        let snapshot: Vec<(String, u64, Observed)> = {
            let state = shared.lock();
            if state.quit {
                return Ok(());
            }
            state
                .agents
                .iter()
                .map(|(n, a)| (n.clone(), a.generation, Observed::of(a)))
                .collect()
        };
        let mut done = Vec::new();
        let mut errors = Vec::new();
        for (node, generation, o) in snapshot {
            let seen = observe(&o.ns, o.pid, o.starts, o.stopped_by);
            let view = debounce(
                written.get(&node).map(|w| &w.view),
                seen,
                failures.entry(node.clone()).or_default(),
            );
            let what = format!("the Pod of node {node} ({view:?})");
            let write = write_pod(&cluster, &node, o.host_ip, view, &mut written);
            match rt.block_on(bounded(write)).with_context(|| what) {
                Ok(()) => done.push((node, generation)),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        let desired = written.len();
        let ready = written.values().filter(|w| w.view.ready()).count();
        if daemon_set != Some((desired, ready)) {
            let write = bounded(write_daemon_set(&cluster, desired, ready));
            match rt
                .block_on(write)
                .with_context(|| format!("the DaemonSet ({ready} of {desired} ready)"))
            {
                Ok(()) => daemon_set = Some((desired, ready)),
                Err(e) => {
                    errors.push(format!("{e:#}"));
                    done.clear();
                }
            }
        }
        let error = errors.join("; ");
        if !error.is_empty() && error != last_error {
            note(log, &error);
        }
        last_error = error;
        record_and_wait(shared, done, !last_error.is_empty());
    }
}

/// Records which agents' Pods now say what their generation asked, then waits for the next
/// change or poll (and a poll more after a failed write, so an unreachable API server is asked
/// again at the poll's pace, not in a spin).
fn record_and_wait(shared: &Shared, done: Vec<(String, u64)>, failed: bool) {
    let mut state = shared.lock();
    for (node, generation) in done {
        if let Some(a) = state.agents.get_mut(&node) {
            a.written = a.written.max(generation);
        }
    }
    shared.changed.notify_all();
    let pending = state.agents.values().any(|a| a.written < a.generation);
    if !pending && !state.quit {
        state = shared
            .changed
            .wait_timeout(state, POLL)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    drop(state);
    if failed {
        std::thread::sleep(POLL);
    }
}

/// How many `/readyz` failures in a row turn a running agent's Pod not ready: the shipped
/// readiness probe's `failureThreshold` (a kubelet ignores one slow answer; the lab's polls are
/// 200 ms apart instead of its 5 s, so this is 0.6 s). A process that ended turns it at once.
const FAILURE_THRESHOLD: u32 = 3;

/// How long one write may take: the API client retries a refused connection for as long as
/// the API server is unreachable, which would stall the loop (and a stop step's wait) for the
/// whole outage; a write cut short is tried again at the next poll.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

async fn bounded(write: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {WRITE_TIMEOUT:?}")))
}

/// What a kubelet's readiness probe makes of `seen` after the Pod said `written`: a ready
/// agent's Pod turns not ready only after [`FAILURE_THRESHOLD`] failed answers in a row
/// (`failures` counts them), anything else is taken as seen.
fn debounce(written: Option<&PodView>, seen: PodView, failures: &mut u32) -> PodView {
    let was_ready = written.is_some_and(|w| w.ready() && w.restarts == seen.restarts);
    if seen.container == (Container::Running { ready: false }) && was_ready {
        *failures += 1;
        if *failures < FAILURE_THRESHOLD {
            return PodView {
                container: Container::Running { ready: true },
                ..seen
            };
        }
    } else {
        *failures = 0;
    }
    seen
}

/// Appends a line to the log of the agent Pods' kubelet.
fn note(log: &Path, text: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(f, "{} {text}", Timestamp::now());
    }
}

/// What the Pod of an agent should say now.
fn observe(ns: &str, pid: Option<i32>, starts: u32, stopped_by: Option<SignalName>) -> PodView {
    let restarts = starts.saturating_sub(1);
    let container = match (pid, stopped_by) {
        (Some(pid), _) => match exit_code_of(pid) {
            // Ended by itself: a zombie until the lab reaps it.
            Some(code) => Container::Terminated {
                reason: if code == 0 { "Completed" } else { "Error" },
                exit_code: code,
            },
            None if !Path::new(&format!("/proc/{pid}")).exists() => Container::Terminated {
                reason: "Error",
                exit_code: 1,
            },
            None => Container::Running {
                ready: http_get(ns, AGENT_HTTP, "/readyz", READYZ_TIMEOUT)
                    .is_ok_and(|(code, _)| code == 200),
            },
        },
        (None, Some(SignalName::Term)) => Container::Terminated {
            reason: "Completed",
            exit_code: 0,
        },
        (None, Some(SignalName::Kill)) => Container::Terminated {
            reason: "Error",
            exit_code: 137,
        },
        (None, None) => Container::Creating,
    };
    PodView {
        container,
        restarts,
    }
}

/// The exit code of a process that has ended but not been reaped (a zombie), as a kubelet
/// reports it (128 + the signal for one killed by a signal); `None` while it runs.
fn exit_code_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    zombie_exit_code(&stat)
}

/// The exit code in a `/proc/<pid>/stat` line when its state is `Z`: its last field holds the
/// wait status (since Linux 3.5).
fn zombie_exit_code(stat: &str) -> Option<i32> {
    // The command name is in parentheses and may hold spaces: the fields start after the last.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() != Some(&"Z") {
        return None;
    }
    let status: i32 = fields.last()?.parse().ok()?;
    let signal = status & 0x7f;
    Some(if signal != 0 {
        128 + signal
    } else {
        (status >> 8) & 0xff
    })
}

/// A plain HTTP GET of `path` from `addr` inside the namespace `ns`: the status code and the
/// whole response. The request runs on its own thread, which enters the namespace and ends
/// with it.
pub fn http_get(ns: &str, addr: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let netns = File::open(Path::new("/run/netns").join(ns))
        .with_context(|| format!("opening the namespace {ns}"))?;
    let addr: SocketAddr = addr
        .parse()
        .with_context(|| format!("the address {addr}"))?;
    let text = std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<String> {
                crate::sys::enter_netns_of(&netns)?;
                let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
                stream.set_read_timeout(Some(timeout))?;
                stream
                    .write_all(format!("GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").as_bytes())?;
                let mut text = String::new();
                stream.read_to_string(&mut text)?;
                Ok(text)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the HTTP reader thread panicked"))?
    })
    .with_context(|| format!("GET {path} from {addr} in {ns}"))?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("GET {path} from {addr} in {ns}: no HTTP status line"))?;
    Ok((code, text))
}

/// Writes the Pod of `node` when what it should say changed; a Pod that is gone (deleted by
/// the scenario) is left so.
async fn write_pod(
    cluster: &Cluster,
    node: &str,
    host_ip: Ipv4Addr,
    view: PodView,
    written: &mut BTreeMap<String, Written>,
) -> Result<()> {
    let now = Timestamp::now().to_string();
    let (transition, started) = match written.get(node) {
        Some(w) if w.view == view => return Ok(()),
        Some(w) => {
            let running = |v: &PodView| matches!(v.container, Container::Running { .. });
            let restarted =
                w.view.restarts != view.restarts || (!running(&w.view) && running(&view));
            (
                if w.view.ready() == view.ready() {
                    w.transition.clone()
                } else {
                    now.clone()
                },
                if restarted {
                    now.clone()
                } else {
                    w.started.clone()
                },
            )
        }
        None => (now.clone(), now.clone()),
    };
    let status = pod_status(&view, Some(host_ip), &transition, &started, &now);
    let name = pod_name(node);
    match cluster
        .merge_status("Pod", Some(DAEMON_SET_NAMESPACE), &name, &status)
        .await
    {
        Ok(()) => {}
        Err(e) if is_not_found(&e) => {}
        Err(e) => {
            return Err(e.context(format!(
                "writing the status of Pod {DAEMON_SET_NAMESPACE}/{name}"
            )));
        }
    }
    written.insert(
        node.to_owned(),
        Written {
            view,
            transition,
            started,
        },
    );
    Ok(())
}

/// Writes the DaemonSet's counts: every node should run an agent and runs the current
/// template; `ready` of them are ready (and so available: the lab sets no minReadySeconds).
async fn write_daemon_set(cluster: &Cluster, desired: usize, ready: usize) -> Result<()> {
    let status = daemon_set_status(desired, ready);
    match cluster
        .merge_status(
            "DaemonSet",
            Some(DAEMON_SET_NAMESPACE),
            objects::AGENT_DAEMONSET,
            &status,
        )
        .await
    {
        Err(e) if !is_not_found(&e) => Err(e.context(format!(
            "writing the status of DaemonSet {DAEMON_SET_NAMESPACE}/{}",
            objects::AGENT_DAEMONSET
        ))),
        _ => Ok(()),
    }
}

fn is_not_found(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 404)
}

/// The status a kubelet would write for an agent Pod saying `view` (a status subresource merge
/// patch: the lists are replaced whole).
pub fn pod_status(
    view: &PodView,
    host_ip: Option<Ipv4Addr>,
    transition: &str,
    started: &str,
    finished: &str,
) -> Value {
    let ready = if view.ready() { "True" } else { "False" };
    let (phase, state) = match &view.container {
        Container::Creating => (
            "Pending",
            json!({"waiting": {"reason": "ContainerCreating"}}),
        ),
        Container::Running { .. } => ("Running", json!({"running": {"startedAt": started}})),
        Container::Terminated { reason, exit_code } => (
            // The DaemonSet's Pods restart always: the Pod stays Running, its container not.
            "Running",
            json!({"terminated": {"reason": reason, "exitCode": exit_code,
                                  "startedAt": started, "finishedAt": finished}}),
        ),
    };
    let ip = host_ip.map(|ip| ip.to_string());
    json!({"status": {
        "phase": phase,
        "hostIP": ip,
        "podIP": ip,
        "conditions": [
            {"type": "Ready", "status": ready, "lastTransitionTime": transition},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": transition},
        ],
        "containerStatuses": [{
            "name": "agent", "image": "kuport", "imageID": "",
            "ready": view.ready(),
            "started": matches!(view.container, Container::Running { .. }),
            "restartCount": view.restarts,
            "state": state,
        }],
    }})
}

/// The status the DaemonSet controller would write for `desired` nodes, `ready` of them ready.
pub fn daemon_set_status(desired: usize, ready: usize) -> Value {
    json!({"status": {
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": desired,
        "updatedNumberScheduled": desired,
        "numberMisscheduled": 0,
        "numberReady": ready,
        "numberAvailable": ready,
        "numberUnavailable": desired.saturating_sub(ready),
    }})
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    /// The Pod with `status` applied, as `kuport status` reads it.
    fn pod_with(view: &PodView) -> Pod {
        let mut pod = objects::agent_pod("worker-b", "uid-1");
        pod["status"] = pod_status(
            view,
            Some(Ipv4Addr::new(100, 64, 0, 2)),
            "2026-01-01T00:00:01Z",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:02Z",
        )["status"]
            .clone();
        serde_json::from_value(pod).expect("a Pod kuport status can read")
    }

    /// What `kuport status` looks at (`status_cmd::agents`): the Ready condition, the phase,
    /// the container's restarts and why it is not running.
    fn ready_restarts_reason(pod: &Pod) -> (bool, i32, Option<String>) {
        let status = pod.status.as_ref().expect("a status");
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        assert!(!matches!(
            status.phase.as_deref(),
            Some("Succeeded" | "Failed")
        ));
        let c = &status.container_statuses.as_ref().expect("containers")[0];
        let state = c.state.as_ref().expect("a state");
        let reason = state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.clone())
            .or_else(|| state.terminated.as_ref().and_then(|t| t.reason.clone()));
        (ready, c.restart_count, reason)
    }

    #[test]
    fn a_pod_is_ready_only_while_its_agent_runs_and_answers() {
        let running = |ready| PodView {
            container: Container::Running { ready },
            restarts: 2,
        };
        assert_eq!(
            ready_restarts_reason(&pod_with(&running(true))),
            (true, 2, None)
        );
        assert_eq!(
            ready_restarts_reason(&pod_with(&running(false))),
            (false, 2, None)
        );
        let killed = PodView {
            container: Container::Terminated {
                reason: "Error",
                exit_code: 137,
            },
            restarts: 0,
        };
        let pod = pod_with(&killed);
        assert_eq!(
            ready_restarts_reason(&pod),
            (false, 0, Some("Error".into()))
        );
        let t = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .expect("c")[0]
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        assert_eq!(t, Some(137));
        let creating = PodView {
            container: Container::Creating,
            restarts: 0,
        };
        assert_eq!(
            ready_restarts_reason(&pod_with(&creating)),
            (false, 0, Some("ContainerCreating".into()))
        );
    }

    #[test]
    fn a_stop_by_the_lab_is_a_terminated_container_with_a_kubelets_words() {
        let term = observe("unused", None, 1, Some(SignalName::Term));
        assert_eq!(
            term.container,
            Container::Terminated {
                reason: "Completed",
                exit_code: 0
            }
        );
        let kill = observe("unused", None, 3, Some(SignalName::Kill));
        assert_eq!(kill.restarts, 2, "starts after the first are restarts");
        assert_eq!(
            kill.container,
            Container::Terminated {
                reason: "Error",
                exit_code: 137
            }
        );
        assert_eq!(
            observe("unused", None, 0, None).container,
            Container::Creating
        );
    }

    #[test]
    fn a_ready_pod_turns_not_ready_after_three_failed_answers_in_a_row() {
        let running = |ready, restarts| PodView {
            container: Container::Running { ready },
            restarts,
        };
        let mut failures = 0;
        let ready = running(true, 0);
        for _ in 0..2 {
            let v = debounce(Some(&ready), running(false, 0), &mut failures);
            assert!(v.ready(), "one slow answer is not a failure yet");
        }
        // An answer in between starts the count again.
        assert!(debounce(Some(&ready), running(true, 0), &mut failures).ready());
        assert_eq!(failures, 0);
        let mut last = ready.clone();
        for _ in 0..3 {
            last = debounce(Some(&ready), running(false, 0), &mut failures);
        }
        assert!(!last.ready(), "three in a row");
        // A process that ended, or a restarted one not ready yet, is taken at once.
        let ended = PodView {
            container: Container::Terminated {
                reason: "Error",
                exit_code: 1,
            },
            restarts: 0,
        };
        assert_eq!(debounce(Some(&ready), ended.clone(), &mut 0), ended);
        assert!(!debounce(Some(&ready), running(false, 1), &mut 0).ready());
        assert!(!debounce(None, running(false, 0), &mut 0).ready());
    }

    #[test]
    fn a_zombies_exit_code_is_read_from_its_stat_line() {
        let tail = "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0";
        let line = |state: &str, status: i32| format!("42 (kuport (x)) {state} {tail} {status}");
        assert_eq!(zombie_exit_code(&line("Z", 256)), Some(1));
        assert_eq!(zombie_exit_code(&line("Z", 9)), Some(137));
        assert_eq!(zombie_exit_code(&line("Z", 0)), Some(0));
        assert_eq!(zombie_exit_code(&line("S", 0)), None, "still running");
        assert_eq!(zombie_exit_code("garbage"), None);
    }

    #[test]
    fn the_daemon_set_counts_follow_the_ready_pods() {
        let mut ds = objects::agent_daemonset();
        ds["status"] = daemon_set_status(3, 2)["status"].clone();
        let ds: DaemonSet = serde_json::from_value(ds).expect("a DaemonSet");
        let s = ds.status.expect("a status");
        assert_eq!(
            (
                s.desired_number_scheduled,
                s.current_number_scheduled,
                s.updated_number_scheduled,
                s.number_ready,
                s.number_available,
                s.number_unavailable
            ),
            (3, 3, Some(3), 2, Some(2), Some(1))
        );
    }
}
