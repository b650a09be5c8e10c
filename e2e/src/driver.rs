//! The end-to-end run: a real cluster with kuport installed from `crds/` and
//! `deploy/manifests/`, probed from clients outside the cluster. One sequence of steps
//! ([`run_on`]) for every cluster it runs on, a [`Platform`]: kind (kindnet, one control plane,
//! two workers, probes from containers on kind's network; [`Kind`]) or the local cluster of
//! real kubelets in the lab's namespaces (`crate::local`).
//!
//! Every step is a command run through a [`Shell`]. The real shell runs them with xshell; the
//! dry-run shell prints them and answers with the outputs a healthy run would give, so the whole
//! sequence, and the checks on what the commands print, run here without a cluster. Each step
//! prints one line (`ok`/`FAIL`, its name, its time) and the run ends with `N passed, N failed`.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

use crate::manifests;

/// The image the echo responder and the probing containers run (socat, with a shell).
pub const SOCAT_IMAGE: &str = "docker.io/alpine/socat:1.8.0.3";

/// How many asks the rolling-restart probe loop sends (10 a second).
pub const LOOP_ASKS: u32 = 900;

/// How many asks the probe loop sends while the accepting node is drained (10 a second).
pub const DRAIN_ASKS: u32 = 200;

/// One command: a program, its arguments and what it reads on standard input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cmd {
    /// `kind`, `kubectl` or `docker`.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Standard input, when the command reads some.
    pub stdin: Option<String>,
}

impl Cmd {
    /// `program` with `args`.
    pub fn new<I, S>(program: &str, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            program: program.to_owned(),
            args: args.into_iter().map(Into::into).collect(),
            stdin: None,
        }
    }

    /// The same command, reading `text` on standard input.
    pub fn with_stdin(mut self, text: String) -> Self {
        self.stdin = Some(text);
        self
    }
}

impl fmt::Display for Cmd {
    /// As a shell would take it, each word quoted when it needs to be; standard input is
    /// summarised after the command.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.program)?;
        for arg in &self.args {
            write!(f, " {}", quote(arg))?;
        }
        if let Some(stdin) = &self.stdin {
            write!(f, " <<< ({} lines on stdin)", stdin.lines().count())?;
        }
        Ok(())
    }
}

fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Runs commands.
pub trait Shell {
    /// Runs `cmd` and returns what it printed on standard output; fails when it exits non-zero.
    fn run(&mut self, cmd: &Cmd) -> Result<String>;
}

/// The real shell: runs each command with xshell, echoing it first.
pub struct RealShell {
    sh: xshell::Shell,
}

impl RealShell {
    /// A shell in the current directory.
    pub fn new() -> Result<Self> {
        Ok(Self {
            sh: xshell::Shell::new().context("starting a shell")?,
        })
    }
}

impl Shell for RealShell {
    fn run(&mut self, cmd: &Cmd) -> Result<String> {
        eprintln!("+ {cmd}");
        let mut c = self.sh.cmd(&cmd.program).args(&cmd.args).quiet();
        if let Some(stdin) = &cmd.stdin {
            c = c.stdin(stdin);
        }
        c.read().with_context(|| format!("running {cmd}"))
    }
}

/// The dry-run shell: records (and optionally prints) every command and answers as a healthy
/// run would.
#[derive(Debug, Default)]
pub struct DryRun {
    /// Every command run, in order.
    pub commands: Vec<Cmd>,
    /// Print each command to standard output as it is run.
    pub print: bool,
}

impl Shell for DryRun {
    fn run(&mut self, cmd: &Cmd) -> Result<String> {
        if self.print {
            println!("{cmd}");
        }
        self.commands.push(cmd.clone());
        Ok(healthy_output(cmd))
    }
}

/// What a command prints in a healthy run, for the dry run.
pub fn healthy_output(cmd: &Cmd) -> String {
    let joined = cmd.args.join(" ");
    if cmd.program == "kubectl" && joined.contains("InternalIP") {
        "172.18.0.3".to_owned()
    } else if cmd.program == "docker" && joined.contains("refusal-check") {
        "refusal-check".to_owned()
    } else if cmd.program == "docker" && joined.contains("prober-address") {
        "prober-address 172.18.0.9\nsaw 172.18.0.9:41234".to_owned()
    } else if cmd.program == "kubectl" && joined.contains(CONDITIONS_JSONPATH) {
        // Every state a step waits for, so each wait ends at its first look.
        "Accepted=False/PortInUse\nProgrammed=False/NoReadyEndpoint\nProgrammed=True/Programmed\n"
            .to_owned()
    } else if cmd.program == "kubectl" && joined.contains(".message}") {
        "NodePort of Service kuport-e2e/echo-np; hostPort of Pod kuport-e2e/hostport".to_owned()
    } else if cmd.program == "docker" && cmd.args.first().is_some_and(|a| a == "logs") {
        // The prober is named after the number of asks it sends (`<cluster>-prober-<asks>`).
        let asks = cmd
            .args
            .last()
            .and_then(|name| name.rsplit('-').next())
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(LOOP_ASKS);
        format!("sent {asks} answered {asks}")
    } else {
        String::new()
    }
}

/// Settings of a run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The repository (for `crds/`, `deploy/manifests/` and the Dockerfile).
    pub repo: PathBuf,
    /// The kind cluster's name.
    pub cluster: String,
    /// The agent image reference to run (built or loaded under this name).
    pub image: String,
    /// Load the image from this archive (`docker load`) instead of building it.
    pub image_archive: Option<PathBuf>,
    /// Leave the cluster up afterwards.
    pub keep: bool,
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The prober's own address, as the pod saw it, per probe.
    pub probes: Vec<String>,
    /// Asks sent and answered by the loop during the rolling restart.
    pub loop_sent: u32,
    /// Asks answered.
    pub loop_answered: u32,
    /// Asks sent and answered by the loop while the accepting node was drained.
    pub drain_sent: u32,
    /// Asks answered during the drain.
    pub drain_answered: u32,
    /// Per sample, from the serving node's kubelet stopped to the other edge answering.
    pub failover_ms: Vec<u64>,
    /// Per sample, from the kubelet resumed to the first edge answering again.
    pub failback_ms: Vec<u64>,
    /// Per client inside the cluster, `<client>: <what the pod saw>`.
    pub inside: Vec<String>,
}

/// The workload's namespace.
pub const NAMESPACE: &str = "kuport-e2e";

fn kind_config() -> String {
    "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n  - role: control-plane\n  - role: worker\n  - role: worker\n".to_owned()
}

/// Namespace [`NAMESPACE`] and the start of Deployment `echo` (one replica, recreated, allowed
/// on `pod_node` and `moved_to` only, `extra_spec` lines added to its pod spec), up to its
/// `containers:` line: the part the workloads of every platform share.
pub fn echo_deployment_head(pod_node: &str, moved_to: &str, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NAMESPACE}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: echo
  namespace: {NAMESPACE}
spec:
  replicas: 1
  strategy:
    type: Recreate
  selector:
    matchLabels: {{app: echo}}
  template:
    metadata:
      labels: {{app: echo}}
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - {{key: kubernetes.io/hostname, operator: In, values: [{pod_node}, {moved_to}]}}
{extra_spec}      terminationGracePeriodSeconds: 1
      containers:
"#
    )
}

/// PortMap `name` in [`NAMESPACE`] of class `class` for `protocol` on `port` (through `end_port`
/// for a range) to the `echo` Service's port named `service_port`, as one YAML document.
pub fn portmap_doc(
    name: &str,
    class: &str,
    protocol: &str,
    port: u16,
    end_port: Option<u16>,
    service_port: &str,
) -> String {
    let end = end_port
        .map(|e| format!("  endPort: {e}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  className: {class}
  protocol: {protocol}
  port: {port}
{end}  serviceRef: {{name: echo, port: {service_port}}}
"#
    )
}

/// The workload: an echo responder (socat answering each datagram with the address it came
/// from) allowed on `pod_node` and `moved_to` only (the run cordons the one it should not
/// start on), ready while `/tmp/unready` does not exist, its Service, a class accepting on
/// `accepting_node`, and the mapping.
pub fn workload(accepting_node: &str, pod_node: &str, moved_to: &str) -> String {
    let head = echo_deployment_head(
        pod_node,
        moved_to,
        "      tolerations:\n        - {key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}\n",
    );
    format!(
        r#"{head}        - name: echo
          image: {SOCAT_IMAGE}
          args: ["-T5", "UDP4-RECVFROM:3000,fork", "SYSTEM:echo saw $SOCAT_PEERADDR:$SOCAT_PEERPORT"]
          ports:
            - {{name: echo, containerPort: 3000, protocol: UDP}}
          readinessProbe:
            exec: {{command: ["sh", "-c", "test ! -e /tmp/unready"]}}
            periodSeconds: 1
            failureThreshold: 1
---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: {NAMESPACE}
spec:
  selector: {{app: echo}}
  ports:
    - {{name: echo, port: 3000, protocol: UDP}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata:
  name: e2e
spec:
  nodes:
    {accepting_node}: {{interfaces: [eth0]}}
  returnPath: {{mode: Vxlan}}
---
{portmap}"#,
        portmap = portmap_doc("echo", "e2e", "UDP", 3000, None, "echo"),
    )
}

/// What differs between the clusters the run proves kuport on: how the cluster comes and goes,
/// how kubectl reaches it, what the workload runs, and where the probes come from.
pub trait Platform {
    /// Creates the cluster and makes the agent image available on every node.
    fn create(&mut self, sh: &mut dyn Shell) -> Result<()>;
    /// Whether the platform runs a CNI that reports its own health ([`Platform::cni_status`]).
    fn reports_cni(&self) -> bool {
        false
    }
    /// The CNI's own account of its health on every node, one line each (real Cilium: its
    /// version and `cilium-dbg status --brief`); an error when a node's is not healthy.
    fn cni_status(&mut self, _sh: &mut dyn Shell) -> Result<Vec<String>> {
        bail!("this platform's CNI reports nothing")
    }
    /// Deletes the cluster (also after a failed step).
    fn delete(&mut self, sh: &mut dyn Shell) -> Result<()>;
    /// `kubectl` with `args`, pointed at the cluster.
    fn kubectl(&self, args: Vec<String>) -> Cmd;
    /// The install command (run through [`Platform::kubectl`]'s shape) and the uninstall one.
    fn install(&self) -> Result<(Cmd, Cmd)>;
    /// (the accepting node, the node the pod starts on, the node it is moved to).
    fn nodes(&self) -> (String, String, String);
    /// The workload: Namespace [`NAMESPACE`], Deployment and Service `echo` answering on UDP
    /// 3000 (allowed on `pod_node` and `moved_to` only, ready while its container
    /// [`Platform::probed_container`] has no `/tmp/unready`), a class accepting on `accepting`,
    /// PortMap `echo`.
    fn workload(&self, accepting: &str, pod_node: &str, moved_to: &str) -> String;
    /// The workload's container whose readiness probe the run fails on purpose.
    fn probed_container(&self) -> &'static str {
        "echo"
    }
    /// Checks that the mapping refuses now that its only pod is unready (no answer, or an
    /// explicit refusal where the platform's prober can see one).
    fn expect_refused(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<()>;
    /// A NodePort Service and a `hostPort` Pod on `accepting` with PortMaps `np` and `hp` for
    /// their ports, when this platform can probe them ([`Platform::ask_tcp`]).
    fn held_ports_workload(&self, accepting: &str) -> Option<String> {
        let _ = accepting;
        None
    }
    /// A TCP ask from outside the cluster to `port` on the accepting node: its InternalIP from
    /// a VPN client when `internal` (kube-proxy's nftables mode serves NodePorts on a node's
    /// primary address only, by default), else its public address from the internet; succeeds
    /// only on an answer.
    fn ask_tcp(&mut self, sh: &mut dyn Shell, port: u16, internal: bool) -> Result<String> {
        let _ = (sh, port, internal);
        bail!("this platform has no TCP prober")
    }
    /// Probes the mapping on the accepting node (`internal_ip` is its InternalIP) and returns
    /// the client addresses the pod saw, after checking each is the client's own.
    fn probe(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<Vec<String>>;
    /// Clients inside the cluster (`docs/datapath.md`, "Clients inside the cluster"): UDP from
    /// the accepting node's own processes, from the pod's node's, and from the workload pod
    /// itself, each to a published address of the accepting node it can route to; each answer
    /// must come from the address and port dialed. Returns, per client, what the pod saw (recorded, not
    /// judged: a node or the pod itself may be translated). Only where
    /// [`Platform::has_inside_clients`].
    fn probe_inside(&mut self, sh: &mut dyn Shell) -> Result<Vec<String>> {
        let _ = sh;
        bail!("this platform cannot place clients inside the cluster")
    }
    /// Whether [`Platform::probe_inside`] can run here.
    fn has_inside_clients(&self) -> bool {
        false
    }
    /// The kuport CLI with `args`, pointed at the cluster, where the platform has it.
    fn kuport_cli(&self, _args: Vec<String>) -> Option<Cmd> {
        None
    }
    /// A Single class over two public edges for the failover step, when this platform can stop
    /// a node's kubelet ([`Platform::pause_kubelet`]).
    fn failover(&self) -> Option<Failover> {
        None
    }
    /// Stops (`paused`) or resumes a node's kubelet: the node-lifecycle controller marks a node
    /// whose kubelet stopped reporting NotReady after its grace period.
    fn pause_kubelet(&mut self, sh: &mut dyn Shell, node: &str, paused: bool) -> Result<()> {
        let _ = (sh, node, paused);
        bail!("this platform cannot stop a kubelet")
    }
    /// One UDP ask from outside the cluster to `port` on `node`'s public address, waiting at
    /// most `timeout_ms`; its first line, whatever it was.
    fn ask_node(
        &mut self,
        sh: &mut dyn Shell,
        node: &str,
        port: u16,
        timeout_ms: u32,
    ) -> Result<String> {
        let _ = (sh, node, port, timeout_ms);
        bail!("this platform has no per-node prober")
    }
    /// Starts a loop of `asks` probes, 10 a second, in the background.
    fn start_loop(&mut self, sh: &mut dyn Shell, internal_ip: &str, asks: u32) -> Result<()>;
    /// Waits for the loop and returns its `sent N answered M`.
    fn finish_loop(&mut self, sh: &mut dyn Shell) -> Result<String>;
    /// `nft list tables` and `ip -o link show` on `node`.
    fn node_state(&mut self, sh: &mut dyn Shell, node: &str) -> Result<(String, String)>;
    /// `helm` with `args`, pointed at the cluster, when this platform installs the chart too.
    fn helm(&self, args: Vec<String>) -> Option<Cmd> {
        let _ = args;
        None
    }
}

struct Run<'a> {
    sh: &'a mut dyn Shell,
    p: &'a mut dyn Platform,
    passed: usize,
    failed: usize,
}

impl Run<'_> {
    fn kubectl<I, S>(&mut self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let cmd = self.p.kubectl(args.into_iter().map(Into::into).collect());
        self.sh.run(&cmd)
    }

    fn helm(&mut self, args: &[&str]) -> Result<String> {
        let cmd = self
            .p
            .helm(args.iter().map(|a| (*a).to_owned()).collect())
            .context("this platform has no helm")?;
        self.sh.run(&cmd)
    }

    /// Every node in `nodes` without a kuport table or link.
    fn nodes_clean(&mut self, nodes: &[String]) -> Result<()> {
        let mut all = nodes.to_vec();
        all.sort();
        all.dedup();
        for node in all {
            let (nft, links) = self.p.node_state(self.sh, &node)?;
            let left = leftovers(&nft, &links);
            ensure!(
                left.is_empty(),
                "node {node} is not clean after uninstall: {}",
                left.join(", ")
            );
        }
        Ok(())
    }

    /// Runs one named step, printing its line.
    fn step<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let started = std::time::Instant::now();
        let result = f(self);
        let secs = started.elapsed().as_secs_f64();
        match &result {
            Ok(_) => {
                self.passed += 1;
                println!("ok   {name} ({secs:.1} s)");
            }
            Err(e) => {
                self.failed += 1;
                println!("FAIL {name} ({secs:.1} s): {e:#}");
            }
        }
        result.with_context(|| format!("step {name:?}"))
    }

    /// Waits for a Deployment's or DaemonSet's rollout (`kubectl rollout status`).
    fn rollout_status(&mut self, namespace: &str, object: &str, timeout: &str) -> Result<String> {
        self.kubectl([
            "-n",
            namespace,
            "rollout",
            "status",
            object,
            &format!("--timeout={timeout}"),
        ])
    }

    fn kubectl_stdin(&mut self, args: &[&str], stdin: String) -> Result<String> {
        let cmd = self
            .p
            .kubectl(args.iter().map(|a| (*a).to_owned()).collect())
            .with_stdin(stdin);
        self.sh.run(&cmd)
    }

    fn cordon(&mut self, node: &str, on: bool) -> Result<String> {
        self.kubectl([if on { "cordon" } else { "uncordon" }, node])
    }

    /// Polls PortMap `name` until it has the condition `wanted` (see [`has_condition`]); fails
    /// after `timeout` with the conditions it last saw. Returns how long it took.
    fn wait_condition(
        &mut self,
        name: &str,
        wanted: &str,
        timeout: std::time::Duration,
    ) -> Result<std::time::Duration> {
        let started = std::time::Instant::now();
        loop {
            let seen = self.kubectl([
                "-n",
                NAMESPACE,
                "get",
                &format!("portmap/{name}"),
                "-o",
                &format!("jsonpath={CONDITIONS_JSONPATH}"),
            ])?;
            if has_condition(&seen, wanted) {
                return Ok(started.elapsed());
            }
            ensure!(
                started.elapsed() < timeout,
                "PortMap {NAMESPACE}/{name} did not reach {wanted} within {timeout:?}; its conditions: {}",
                seen.trim().replace('\n', ", ")
            );
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }

    /// The message of PortMap `name`'s condition `kind`.
    fn condition_message(&mut self, name: &str, kind: &str) -> Result<String> {
        self.kubectl([
            "-n",
            NAMESPACE,
            "get",
            &format!("portmap/{name}"),
            "-o",
            &format!("jsonpath={{.status.conditions[?(@.type==\"{kind}\")].message}}"),
        ])
    }

    /// Creates or removes `/tmp/unready` in the workload's probed container (its readiness
    /// probe fails while the file exists).
    fn set_unready(&mut self, unready: bool) -> Result<String> {
        let container = self.p.probed_container();
        let script = if unready {
            "touch /tmp/unready"
        } else {
            "rm -f /tmp/unready"
        };
        self.kubectl([
            "-n",
            NAMESPACE,
            "exec",
            "deployment/echo",
            "-c",
            container,
            "--",
            "sh",
            "-c",
            script,
        ])
    }

    /// Waits until the mapping is programmed with its endpoint on `node`.
    fn wait_programmed(&mut self, node: &str) -> Result<()> {
        self.kubectl([
            "-n",
            NAMESPACE,
            "wait",
            "portmap/echo",
            &format!("--for=jsonpath={{.status.endpoint.node}}={node}"),
            "--timeout=180s",
        ])?;
        self.wait_echo_programmed()
    }

    /// Waits until PortMap `echo` is `Programmed`.
    fn wait_echo_programmed(&mut self) -> Result<()> {
        self.kubectl([
            "-n",
            NAMESPACE,
            "wait",
            "portmap/echo",
            "--for=condition=Programmed",
            "--timeout=180s",
        ])
        .map(|_| ())
    }
}

/// The JSONPath printing a PortMap's conditions one per line as `Type=Status/Reason`.
pub const CONDITIONS_JSONPATH: &str =
    "{range .status.conditions[*]}{.type}={.status}/{.reason}{\"\\n\"}{end}";

/// Whether `conditions` (as [`CONDITIONS_JSONPATH`] prints them) has `wanted`
/// (`Type=Status/Reason`, or `Type=Status` for any reason).
pub fn has_condition(conditions: &str, wanted: &str) -> bool {
    conditions.lines().map(str::trim).any(|line| {
        line == wanted
            || (!wanted.contains('/')
                && line
                    .split_once('/')
                    .is_some_and(|(state, _)| state == wanted))
    })
}

/// Checks a probe's output: the pod must have seen the prober's own address.
pub fn check_probe(output: &str) -> Result<String> {
    let mut prober = None;
    let mut saw = None;
    for line in output.lines() {
        if let Some(a) = line.strip_prefix("prober-address ") {
            prober = a.split_whitespace().next().map(str::to_owned);
        }
        if let Some(a) = line.strip_prefix("saw ") {
            saw = a.trim().rsplit_once(':').map(|(ip, _)| ip.to_owned());
        }
    }
    let prober = prober.context("the prober did not print its own address")?;
    let saw = saw.with_context(|| {
        format!("no answer from the mapped port (the prober at {prober} got nothing back)")
    })?;
    ensure!(
        saw == prober,
        "the pod saw {saw}, not the prober's own address {prober}: the client address was lost"
    );
    Ok(prober)
}

/// Parses the loop's `sent N answered M`.
pub fn parse_loop(output: &str) -> Result<(u32, u32)> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.starts_with("sent "))
        .context("the probe loop printed no `sent N answered M` line")?;
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["sent", sent, "answered", answered] => Ok((
            sent.parse().context("the loop's sent count")?,
            answered.parse().context("the loop's answered count")?,
        )),
        _ => bail!("unexpected loop output {line:?}"),
    }
}

/// Runs the whole end-to-end sequence on kind (see the module documentation), deleting the
/// cluster at the end unless `keep`, also when a step failed.
pub fn run(sh: &mut dyn Shell, o: &Options) -> Result<Summary> {
    let mut kind = Kind::new(o.clone());
    run_on(sh, &mut kind, o.keep)
}

/// Runs the sequence on `platform`: creates its cluster, runs every step (stopping at the first
/// failure), deletes the cluster unless `keep`, prints `N passed, N failed`.
pub fn run_on(sh: &mut dyn Shell, platform: &mut dyn Platform, keep: bool) -> Result<Summary> {
    let mut run = Run {
        sh,
        p: platform,
        passed: 0,
        failed: 0,
    };
    let result = steps(&mut run);
    if !keep {
        let deleted = run.p.delete(run.sh);
        if let (Ok(_), Err(e)) = (&result, deleted) {
            println!("{} passed, {} failed", run.passed, run.failed + 1);
            return Err(e.context("deleting the cluster"));
        }
    }
    println!("{} passed, {} failed", run.passed, run.failed);
    result
}

fn steps(r: &mut Run<'_>) -> Result<Summary> {
    let mut summary = Summary::default();
    r.step("create the cluster and load the agent image", |r| {
        r.p.create(r.sh)
    })?;
    cni_status_step(r, "the CNI reports itself healthy on every node")?;
    let (install, uninstall) = r.p.install()?;
    install_step(r, install)?;
    preflight_step(r)?;

    // The mapping: accepted on one node, the pod on another.
    let (accepting, pod_node, moved_to) = r.p.nodes();
    let address = r.step("read the accepting node's InternalIP", |r| {
        internal_ip(r, &accepting)
    })?;
    r.step(
        "workload and mapping: the pod on another node, Programmed",
        |r| start_workload(r, &accepting, &pod_node, &moved_to),
    )?;
    let seen = r.step(
        "probe across nodes: the pod sees the client's own address",
        |r| r.p.probe(r.sh, &address),
    )?;
    summary.probes.extend(seen);
    if r.p.has_inside_clients() {
        summary.inside = r.step(
            "clients inside the cluster (the accepting node, the pod's node, the pod itself) are answered from the address dialed",
            |r| r.p.probe_inside(r.sh),
        )?;
    }
    r.step(
        "the pod turns unready (its readiness probe fails): NoReadyEndpoint, the port refuses; ready again, it answers",
        |r| unready_and_back(r, &address, &mut summary),
    )?;
    (summary.drain_sent, summary.drain_answered) = r.step(
        "kubectl drain of the accepting node under a probe loop: no probe lost",
        |r| drain_under_loop(r, &address, &accepting),
    )?;
    // The pod is still on pod_node (the failover must not take the pod's node with it).
    if let Some(f) = r.p.failover() {
        failover_steps(r, f, &mut summary)?;
    }
    r.step(
        "the scheduler moves the pod (its node cordoned, the pod deleted); the mapping follows",
        |r| reschedule(r, &pod_node, &moved_to),
    )?;
    let seen = r.step(
        "probe after the move: the pod sees the client's own address",
        |r| r.p.probe(r.sh, &address),
    )?;
    summary.probes.extend(seen);
    if let Some(held) = r.p.held_ports_workload(&accepting) {
        held_port_steps(r, &address, held, &mut summary)?;
    }
    (summary.loop_sent, summary.loop_answered) = r.step(
        "rolling restart of the DaemonSet under a probe loop: no probe lost",
        |r| restart_under_loop(r, &address),
    )?;

    // Uninstall: the agents see their DaemonSet go and clean their nodes.
    let nodes = vec![accepting, pod_node, moved_to];
    r.step(
        "uninstall leaves no kuport table or link on any node",
        |r| {
            r.sh.run(&uninstall)?;
            r.nodes_clean(&nodes)
        },
    )?;
    if r.p.helm(Vec::new()).is_some() {
        chart_steps(r, &address, &nodes, &mut summary)?;
    }
    Ok(summary)
}

/// `kuport preflight` as the guide has it run once the agents are installed and before any
/// workload: every node's host and CNI checks and a return link between every pair, its
/// verdict printed; a failed check or pair fails the step (exit status 1).
fn preflight_step(r: &mut Run<'_>) -> Result<()> {
    let Some(preflight) = r.p.kuport_cli(vec![
        "preflight".to_owned(),
        "--timeout".to_owned(),
        "90s".to_owned(),
    ]) else {
        return Ok(());
    };
    let verdict = r.step(
        "kuport preflight before any workload: every node's checks and every pair's link pass",
        |r| r.sh.run(&preflight),
    )?;
    for line in verdict.lines() {
        println!("    {line}");
    }
    Ok(())
}

/// The CNI's status lines, printed, when the platform has them.
fn cni_status_step(r: &mut Run<'_>, name: &str) -> Result<()> {
    if !r.p.reports_cni() {
        return Ok(());
    }
    for line in r.step(name, |r| r.p.cni_status(r.sh))? {
        println!("    {line}");
    }
    Ok(())
}

/// CRDs, then the manifests; waits for the DaemonSet on every node and checks that the agents'
/// start recorded no failed probe (the readiness probe waits for the first pass instead of
/// failing before it).
fn install_step(r: &mut Run<'_>, install: Cmd) -> Result<()> {
    let crds = r.p.kubectl(vec![
        "apply".into(),
        "--server-side".into(),
        "-f".into(),
        repo_dir("crds"),
    ]);
    r.step(
        "install: CRDs, then the manifests; the DaemonSet ready on every node",
        |r| {
            r.sh.run(&crds)?;
            r.sh.run(&install)?;
            r.rollout_status("kuport-system", "daemonset/kuport-agent", "180s")?;
            let unhealthy = r.kubectl([
                "-n",
                "kuport-system",
                "get",
                "events",
                "--field-selector",
                "reason=Unhealthy",
                "-o",
                "name",
            ])?;
            ensure!(
                unhealthy.trim().is_empty(),
                "the agents' start recorded failed probes: {}",
                unhealthy.trim()
            );
            Ok(())
        },
    )
}

fn internal_ip(r: &mut Run<'_>, node: &str) -> Result<String> {
    let address = r.kubectl([
        "get",
        "node",
        node,
        "-o",
        "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
    ])?;
    let address = address.trim().to_owned();
    ensure!(!address.is_empty(), "node {node} has no InternalIP");
    Ok(address)
}

/// The workload may run on `pod_node` or `moved_to`; `moved_to` is cordoned while it starts so
/// that the scheduler puts it on `pod_node`.
fn start_workload(r: &mut Run<'_>, accepting: &str, pod_node: &str, moved_to: &str) -> Result<()> {
    r.cordon(moved_to, true)?;
    let workload = r.p.workload(accepting, pod_node, moved_to);
    let started = r
        .kubectl_stdin(&["apply", "-f", "-"], workload)
        .and_then(|_| r.rollout_status(NAMESPACE, "deployment/echo", "180s"));
    r.cordon(moved_to, false)?;
    started?;
    r.wait_programmed(pod_node)
}

/// The kubelet's readiness probe fails: the endpoint goes, the mapping refuses and says why;
/// ready again, it answers.
fn unready_and_back(r: &mut Run<'_>, address: &str, summary: &mut Summary) -> Result<()> {
    let minute = std::time::Duration::from_secs(60);
    r.set_unready(true)?;
    r.wait_condition("echo", "Programmed=False/NoReadyEndpoint", minute)?;
    r.p.expect_refused(r.sh, address)?;
    r.set_unready(false)?;
    r.wait_condition("echo", "Programmed=True", minute)?;
    let seen = r.p.probe(r.sh, address)?;
    summary.probes.extend(seen);
    Ok(())
}

/// A drain of the accepting node evicts nothing of kuport's (the agent is a DaemonSet pod) and
/// must not stop it accepting: a cordoned node still forwards.
fn drain_under_loop(r: &mut Run<'_>, address: &str, accepting: &str) -> Result<(u32, u32)> {
    r.p.start_loop(r.sh, address, DRAIN_ASKS)?;
    let drained = r.kubectl([
        "drain",
        accepting,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=120s",
    ]);
    let logs = r.p.finish_loop(r.sh);
    r.cordon(accepting, false)?;
    drained?;
    none_lost(&logs?, DRAIN_ASKS, "the drain")
}

/// The scheduler moves the pod: its node cordoned, the pod deleted.
fn reschedule(r: &mut Run<'_>, pod_node: &str, moved_to: &str) -> Result<()> {
    r.cordon(pod_node, true)?;
    let moved = r
        .kubectl([
            "-n",
            NAMESPACE,
            "delete",
            "pod",
            "-l",
            "app=echo",
            "--wait=true",
        ])
        .and_then(|_| r.rollout_status(NAMESPACE, "deployment/echo", "180s"));
    r.cordon(pod_node, false)?;
    moved?;
    r.wait_programmed(moved_to)
}

/// A rolling restart of the DaemonSet while a loop asks 10 times a second.
fn restart_under_loop(r: &mut Run<'_>, address: &str) -> Result<(u32, u32)> {
    r.p.start_loop(r.sh, address, LOOP_ASKS)?;
    r.kubectl([
        "-n",
        "kuport-system",
        "rollout",
        "restart",
        "daemonset/kuport-agent",
    ])?;
    r.rollout_status("kuport-system", "daemonset/kuport-agent", "300s")?;
    let logs = r.p.finish_loop(r.sh)?;
    none_lost(&logs, LOOP_ASKS, "the rolling restart")
}

/// The loop's `(sent, answered)`, when it sent all `asks` and every one was answered.
fn none_lost(logs: &str, asks: u32, during: &str) -> Result<(u32, u32)> {
    let (sent, answered) = parse_loop(logs)?;
    ensure!(
        sent == asks && answered == sent,
        "{during} lost {} of {sent} probes",
        sent.saturating_sub(answered)
    );
    Ok((sent, answered))
}

/// A NodePort Service and a hostPort Pod on the accepting node beside kuport's mappings: a
/// PortMap for either port is refused `PortInUse` naming the holder, and both keep answering,
/// as does the mapping; then they go again.
fn held_port_steps(
    r: &mut Run<'_>,
    address: &str,
    held: String,
    summary: &mut Summary,
) -> Result<()> {
    r.step(
        "a NodePort and a hostPort on the accepting node: PortMaps for them refused PortInUse; both and the mapping answer",
        |r| {
            r.kubectl_stdin(&["apply", "-f", "-"], held.clone())?;
            r.kubectl([
                "-n",
                NAMESPACE,
                "wait",
                "pod/hostport",
                "--for=condition=Ready",
                "--timeout=120s",
            ])?;
            for (name, holder) in [
                ("np", format!("NodePort of Service {NAMESPACE}/echo-np")),
                ("hp", format!("hostPort of Pod {NAMESPACE}/hostport")),
            ] {
                r.wait_condition(
                    name,
                    "Accepted=False/PortInUse",
                    std::time::Duration::from_secs(60),
                )?;
                let message = r.condition_message(name, "Accepted")?;
                ensure!(
                    message.contains(&holder),
                    "PortMap {NAMESPACE}/{name} is refused, but its message does not name {holder}: {message}"
                );
            }
            // kube-proxy and the portmap plugin program their rules after the objects exist,
            // kube-proxy on its own sync period: each port gets 30 s to start answering.
            for (port, internal) in [(HELD_NODE_PORT, true), (HELD_HOST_PORT, false)] {
                let started = std::time::Instant::now();
                while let Err(e) = r.p.ask_tcp(r.sh, port, internal) {
                    if started.elapsed() > std::time::Duration::from_secs(30) {
                        return Err(e.context(format!("port {port} does not answer beside kuport")));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(250));
                }
            }
            let seen = r.p.probe(r.sh, address)?;
            summary.probes.extend(seen);
            r.kubectl_stdin(
                &["delete", "--wait=true", "--timeout=120s", "-f", "-"],
                held,
            )?;
            Ok(())
        },
    )
}

/// The failover step's setting: a Single class accepting on `primary` (which serves while it
/// is ready) and `standby`, its PortMap `failover` for UDP `port`; a Multi class on the same
/// two nodes, its PortMap `failover-multi` for UDP `multi_port` (both edges serve).
#[derive(Clone, Debug)]
pub struct Failover {
    pub primary: String,
    pub standby: String,
    pub port: u16,
    pub multi_port: u16,
    /// The classes and the PortMaps (the workload's Service and pod already exist).
    pub workload: String,
}

/// How many times the failover step stops the serving node's kubelet.
pub const FAILOVER_SAMPLES: usize = 10;

/// The `q` quantile (0..=1) of `samples` by the nearest-rank method.
pub fn quantile(samples: &[u64], q: f64) -> u64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Asks `node` until it answers, for at most `limit`; returns how long it took.
fn until_answered(
    r: &mut Run<'_>,
    node: &str,
    port: u16,
    limit: std::time::Duration,
) -> Result<std::time::Duration> {
    let started = std::time::Instant::now();
    loop {
        let out = r.p.ask_node(r.sh, node, port, 300)?;
        if out.starts_with("reply ") {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < limit,
            "{node} did not answer on port {port} within {limit:?} (last: {out:?})"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The serving node's kubelet stopped [`FAILOVER_SAMPLES`] times: each time the real
/// node-lifecycle controller marks it NotReady after its grace period and the other edge
/// answers; resumed, the first edge serves again.
fn failover_steps(r: &mut Run<'_>, f: Failover, summary: &mut Summary) -> Result<()> {
    r.step(
        &format!(
            "a stopped kubelet, {FAILOVER_SAMPLES} times: the node turns NotReady, the other edge takes over (Single) and keeps answering (Multi); resumed, the first edge again"
        ),
        |r| {
            r.kubectl_stdin(&["apply", "-f", "-"], f.workload.clone())?;
            for name in ["failover", "failover-multi"] {
                r.wait_condition(name, "Programmed=True", std::time::Duration::from_secs(120))?;
            }
            let limit = std::time::Duration::from_secs(90);
            until_answered(r, &f.primary, f.port, limit)?;
            for node in [&f.primary, &f.standby] {
                until_answered(r, node, f.multi_port, limit)?;
            }
            for _ in 0..FAILOVER_SAMPLES {
                r.p.pause_kubelet(r.sh, &f.primary, true)?;
                let over = until_answered(r, &f.standby, f.port, limit).and_then(|over| {
                    // The node is NotReady now: the Multi mapping's other edge still answers,
                    // at its first ask.
                    let multi = r.p.ask_node(r.sh, &f.standby, f.multi_port, 1000)?;
                    ensure!(
                        multi.starts_with("reply "),
                        "the Multi mapping's other edge {} stopped answering while {} was NotReady: {multi:?}",
                        f.standby,
                        f.primary
                    );
                    Ok(over)
                });
                r.p.pause_kubelet(r.sh, &f.primary, false)?;
                summary.failover_ms.push(over?.as_millis() as u64);
                let back = until_answered(r, &f.primary, f.port, limit)?;
                summary.failback_ms.push(back.as_millis() as u64);
            }
            println!(
                "     failover (kubelet stopped -> other edge answers): p50 {} ms, p99 {} ms, samples {:?}",
                quantile(&summary.failover_ms, 0.5),
                quantile(&summary.failover_ms, 0.99),
                summary.failover_ms
            );
            println!(
                "     failback (kubelet resumed -> first edge answers): p50 {} ms, p99 {} ms, samples {:?}",
                quantile(&summary.failback_ms, 0.5),
                quantile(&summary.failback_ms, 0.99),
                summary.failback_ms
            );
            r.kubectl_stdin(
                &["delete", "--wait=true", "--timeout=120s", "-f", "-"],
                f.workload.clone(),
            )?;
            Ok(())
        },
    )
}

/// The NodePort [`Platform::held_ports_workload`] asks for.
pub const HELD_NODE_PORT: u16 = 31080;
/// The hostPort [`Platform::held_ports_workload`] asks for.
pub const HELD_HOST_PORT: u16 = 8443;

/// The chart through a real helm, on the same cluster and with the workload still in place:
/// lint, a value the schema refuses, install (the mapping answers again), `helm test` (kuport
/// status in a Pod), upgrade (a changed argument: a rolling update; it still answers),
/// uninstall (every node clean).
fn chart_steps(
    r: &mut Run<'_>,
    address: &str,
    nodes: &[String],
    summary: &mut Summary,
) -> Result<()> {
    let chart = repo_dir("deploy/chart");
    r.step("helm lint deploy/chart", |r| {
        r.helm(&["lint", &chart]).map(|_| ())
    })?;
    r.step(
        "helm refuses a value outside values.schema.json",
        |r| match r.helm(&["template", "kuport", &chart, "--set", "logLevel=loud"]) {
            Err(_) => Ok(()),
            Ok(_) => anyhow::bail!("helm rendered the chart with logLevel=loud"),
        },
    )?;
    r.step(
        "helm install: the DaemonSet ready; the mapping answers again",
        |r| helm_install(r, &chart, address, summary),
    )?;
    r.step(
        "helm test: kuport status from inside the cluster, under its reader role",
        |r| {
            r.helm(&[
                "test",
                "kuport",
                "--namespace",
                "kuport-system",
                "--timeout",
                "300s",
            ])
            .map(|_| ())
        },
    )?;
    r.step(
        "helm upgrade (logLevel=debug): a rolling update; the mapping answers",
        |r| helm_upgrade(r, &chart, address, summary),
    )?;
    r.step(
        "helm uninstall leaves no kuport table or link on any node",
        |r| {
            r.helm(&[
                "uninstall",
                "kuport",
                "--namespace",
                "kuport-system",
                "--wait",
                "--timeout",
                "180s",
            ])?;
            r.kubectl([
                "delete",
                "namespace",
                "kuport-system",
                "--wait=true",
                "--timeout=180s",
            ])?;
            r.nodes_clean(nodes)
        },
    )?;
    Ok(())
}

/// An upgrade that changes an argument: the DaemonSet rolls, and the mapping still answers.
fn helm_upgrade(r: &mut Run<'_>, chart: &str, address: &str, summary: &mut Summary) -> Result<()> {
    r.helm(&[
        "upgrade",
        "kuport",
        chart,
        "--namespace",
        "kuport-system",
        "--reuse-values",
        "--set",
        "logLevel=debug",
        "--wait",
        "--timeout",
        "300s",
    ])?;
    r.rollout_status("kuport-system", "daemonset/kuport-agent", "300s")?;
    let seen = r.p.probe(r.sh, address)?;
    summary.probes.extend(seen);
    Ok(())
}

/// The chart leaves the namespace to the user, labelled for Pod Security first (values.yaml,
/// README.md); installed, every agent ready and the mapping programmed again, it answers.
fn helm_install(r: &mut Run<'_>, chart: &str, address: &str, summary: &mut Summary) -> Result<()> {
    r.kubectl(["create", "namespace", "kuport-system"])?;
    r.kubectl([
        "label",
        "namespace",
        "kuport-system",
        "pod-security.kubernetes.io/enforce=privileged",
    ])?;
    r.helm(&[
        "install",
        "kuport",
        chart,
        "--namespace",
        "kuport-system",
        "--wait",
        "--timeout",
        "180s",
    ])?;
    r.rollout_status("kuport-system", "daemonset/kuport-agent", "180s")?;
    r.wait_echo_programmed()?;
    let seen = r.p.probe(r.sh, address)?;
    summary.probes.extend(seen);
    Ok(())
}

/// A directory of the repository this driver was built from.
pub fn repo_dir(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
        .display()
        .to_string()
}

/// kind: a cluster named [`Options::cluster`] (kindnet, a control plane and two workers), the
/// image built from the Dockerfile or loaded from an archive, probes from containers on kind's
/// network.
pub struct Kind {
    o: Options,
    /// How many asks the running probe loop sends.
    loop_asks: u32,
}

impl Kind {
    pub fn new(o: Options) -> Self {
        Self {
            o,
            loop_asks: LOOP_ASKS,
        }
    }

    fn node(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.o.cluster)
    }

    fn manifests(&self) -> Result<String> {
        manifests::with_image(&self.o.repo.join("deploy/manifests"), &self.o.image)
            .context("rendering deploy/manifests with the image under test")
    }

    /// The loop's container, named after the number of asks it sends.
    fn prober(&self) -> String {
        format!("{}-prober-{}", self.o.cluster, self.loop_asks)
    }
}

impl Platform for Kind {
    fn create(&mut self, sh: &mut dyn Shell) -> Result<()> {
        let o = &self.o;
        sh.run(
            &Cmd::new(
                "kind",
                [
                    "create", "cluster", "--name", &o.cluster, "--config", "-", "--wait", "180s",
                ],
            )
            .with_stdin(kind_config()),
        )?;
        match &o.image_archive {
            Some(archive) => sh.run(&Cmd::new(
                "docker",
                ["load", "--input", &archive.display().to_string()],
            ))?,
            None => sh.run(&Cmd::new(
                "docker",
                ["build", "--tag", &o.image, &o.repo.display().to_string()],
            ))?,
        };
        sh.run(&Cmd::new(
            "kind",
            ["load", "docker-image", &o.image, "--name", &o.cluster],
        ))?;
        Ok(())
    }

    fn delete(&mut self, sh: &mut dyn Shell) -> Result<()> {
        sh.run(&Cmd::new(
            "kind",
            ["delete", "cluster", "--name", &self.o.cluster],
        ))
        .map(|_| ())
    }

    fn kubectl(&self, args: Vec<String>) -> Cmd {
        let mut all = vec!["--context".to_owned(), format!("kind-{}", self.o.cluster)];
        all.extend(args);
        Cmd::new("kubectl", all)
    }

    fn install(&self) -> Result<(Cmd, Cmd)> {
        // The image under test replaces the shipped one: the manifests go in on stdin.
        let manifests = self.manifests()?;
        Ok((
            self.kubectl(vec!["apply".into(), "-f".into(), "-".into()])
                .with_stdin(manifests.clone()),
            self.kubectl(vec![
                "delete".into(),
                "--wait=true".into(),
                "-f".into(),
                "-".into(),
            ])
            .with_stdin(manifests),
        ))
    }

    fn nodes(&self) -> (String, String, String) {
        (
            self.node("worker"),
            self.node("worker2"),
            self.node("control-plane"),
        )
    }

    fn workload(&self, accepting: &str, pod_node: &str, moved_to: &str) -> String {
        workload(accepting, pod_node, moved_to)
    }

    /// socat's UDP probe cannot tell a refusal from a loss: the probe must get no answer.
    fn expect_refused(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<()> {
        let script =
            format!("echo refusal-check; echo ping | socat -T3 - UDP4:{internal_ip}:3000 || true");
        let out = sh.run(&socat_once(&script))?;
        ensure!(
            !out.lines().any(|l| l.starts_with("saw ")),
            "the mapping answered with its only pod unready: {out:?}"
        );
        Ok(())
    }

    /// One UDP probe from a container on kind's network (outside the cluster).
    fn probe(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<Vec<String>> {
        let script = format!(
            "echo prober-address $(hostname -i); echo ping | socat -T3 - UDP4:{internal_ip}:3000"
        );
        let out = sh.run(&socat_once(&script))?;
        Ok(vec![check_probe(&out)?])
    }

    fn start_loop(&mut self, sh: &mut dyn Shell, internal_ip: &str, asks: u32) -> Result<()> {
        self.loop_asks = asks;
        let script = format!(
            "sent=0; answered=0; while [ $sent -lt {asks} ]; do \
             if echo ping | socat -T1 - UDP4:{internal_ip}:3000 | grep -q '^saw '; then answered=$((answered+1)); fi; \
             sent=$((sent+1)); sleep 0.1; done; echo sent $sent answered $answered"
        );
        let prober = self.prober();
        sh.run(&Cmd::new(
            "docker",
            [
                "run",
                "--detach",
                "--name",
                &prober,
                "--network",
                "kind",
                "--entrypoint",
                "sh",
                SOCAT_IMAGE,
                "-c",
                &script,
            ],
        ))?;
        Ok(())
    }

    fn finish_loop(&mut self, sh: &mut dyn Shell) -> Result<String> {
        let prober = self.prober();
        sh.run(&Cmd::new("docker", ["wait", &prober]))?;
        let logs = sh.run(&Cmd::new("docker", ["logs", &prober]))?;
        sh.run(&Cmd::new("docker", ["rm", &prober]))?;
        Ok(logs)
    }

    fn node_state(&mut self, sh: &mut dyn Shell, node: &str) -> Result<(String, String)> {
        let nft = sh.run(&Cmd::new(
            "docker",
            [
                "run",
                "--rm",
                "--network",
                &format!("container:{node}"),
                "--cap-add",
                "NET_ADMIN",
                "--entrypoint",
                "nft",
                &self.o.image,
                "list",
                "tables",
            ],
        ))?;
        let links = sh.run(&Cmd::new(
            "docker",
            ["exec", node, "ip", "-o", "link", "show"],
        ))?;
        Ok((nft, links))
    }
}

/// `script` run once in a socat container on kind's network (outside the cluster).
fn socat_once(script: &str) -> Cmd {
    Cmd::new(
        "docker",
        [
            "run",
            "--rm",
            "--network",
            "kind",
            "--entrypoint",
            "sh",
            SOCAT_IMAGE,
            "-c",
            script,
        ],
    )
}

/// kuport's objects in `nft list tables` and `ip -o link show` output.
pub fn leftovers(nft_tables: &str, links: &str) -> Vec<String> {
    let mut left: Vec<String> = nft_tables
        .lines()
        .filter(|l| l.trim() == "table ip kuport")
        .map(|l| l.trim().to_owned())
        .collect();
    for line in links.lines() {
        if let Some(name) = line.split(": ").nth(1) {
            let name = name.split('@').next().unwrap_or(name);
            if name.starts_with(kuport_core::ir::LINK_PREFIX) {
                left.push(format!("link {name}"));
            }
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell() {
        let c = Cmd::new("kubectl", ["get", "-o", "jsonpath={.a}", "it's"]);
        assert_eq!(c.to_string(), "kubectl get -o 'jsonpath={.a}' 'it'\\''s'");
    }

    #[test]
    fn a_probe_passes_only_when_the_pod_saw_the_prober() {
        assert_eq!(
            check_probe("prober-address 172.18.0.9\nsaw 172.18.0.9:5000\n").expect("ok"),
            "172.18.0.9"
        );
        for bad in [
            "prober-address 172.18.0.9\nsaw 10.244.1.1:5000\n",
            "prober-address 172.18.0.9\n",
            "saw 172.18.0.9:5000\n",
        ] {
            assert!(check_probe(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_kind_workload_parses_and_tolerates_only_the_control_plane() {
        let w = workload("kt-worker", "kt-worker2", "kt-control-plane");
        let docs: Vec<serde_json::Value> = w
            .split("---\n")
            .map(|d| serde_saphyr::from_str(d).expect("each document parses"))
            .collect();
        let pod = &docs[1]["spec"]["template"]["spec"];
        assert_eq!(
            pod["tolerations"][0]["key"],
            "node-role.kubernetes.io/control-plane"
        );
        assert_eq!(pod["containers"][0]["name"], "echo");
        assert_eq!(docs.len(), 5);
    }

    #[test]
    fn a_portmap_document_has_an_end_port_only_for_a_range() {
        let single = portmap_doc("a", "c", "TCP", 3000, None, "web");
        let range = portmap_doc("b", "c", "UDP", 5000, Some(5005), "range");
        assert!(!single.contains("endPort"));
        assert!(
            range.contains(
                "  port: 5000\n  endPort: 5005\n  serviceRef: {name: echo, port: range}\n"
            )
        );
        for doc in [single, range] {
            let v: serde_json::Value = serde_saphyr::from_str(&doc).expect("parses");
            assert_eq!(v["kind"], "PortMap");
            assert_eq!(v["metadata"]["namespace"], NAMESPACE);
        }
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let samples = [900, 100, 500, 300, 700, 200, 400, 600, 800, 1000];
        assert_eq!(quantile(&samples, 0.5), 500);
        assert_eq!(quantile(&samples, 0.99), 1000);
        assert_eq!(quantile(&samples, 0.0), 100);
        assert_eq!(quantile(&[], 0.5), 0);
    }

    #[test]
    fn a_condition_matches_on_type_status_and_reason() {
        let seen = "Accepted=True/Accepted\nProgrammed=False/NoReadyEndpoint\n";
        assert!(has_condition(seen, "Programmed=False/NoReadyEndpoint"));
        assert!(has_condition(seen, "Programmed=False"));
        assert!(!has_condition(seen, "Programmed=True"));
        assert!(!has_condition(seen, "Programmed=False/HostRefused"));
        assert!(!has_condition("", "Accepted=True"));
    }

    #[test]
    fn loop_output_and_leftovers_parse() {
        assert_eq!(
            parse_loop("noise\nsent 900 answered 897\n").expect("ok"),
            (900, 897)
        );
        assert!(parse_loop("sent x answered 1").is_err());
        assert!(parse_loop("").is_err());
        let links = "1: lo: <LOOPBACK,UP> mtu 65536\n7: kup-a1b2@eth0: <BROADCAST> mtu 1450\n";
        assert_eq!(
            leftovers("table ip filter\ntable ip kuport\n", links),
            vec!["table ip kuport".to_owned(), "link kup-a1b2".to_owned()]
        );
        assert!(leftovers("table ip filter\n", "1: lo: <LOOPBACK>\n").is_empty());
    }
}
