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
    } else if cmd.program == "docker" && joined.contains("prober-address") {
        "prober-address 172.18.0.9\nsaw 172.18.0.9:41234".to_owned()
    } else if cmd.program == "docker" && cmd.args.first().is_some_and(|a| a == "logs") {
        format!("sent {LOOP_ASKS} answered {LOOP_ASKS}")
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
}

/// The workload's namespace.
pub const NAMESPACE: &str = "kuport-e2e";

fn kind_config() -> String {
    "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n  - role: control-plane\n  - role: worker\n  - role: worker\n".to_owned()
}

/// The workload: an echo responder (socat answering each datagram with the address it came
/// from) pinned to `pod_node`, its Service, a class accepting on `accepting_node`, and the
/// mapping.
pub fn workload(accepting_node: &str, pod_node: &str) -> String {
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
      nodeSelector:
        kubernetes.io/hostname: {pod_node}
      tolerations:
        - operator: Exists
      containers:
        - name: echo
          image: {SOCAT_IMAGE}
          args: ["-T5", "UDP4-RECVFROM:3000,fork", "SYSTEM:echo saw $SOCAT_PEERADDR:$SOCAT_PEERPORT"]
          ports:
            - {{name: echo, containerPort: 3000, protocol: UDP}}
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
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMap
metadata:
  name: echo
  namespace: {NAMESPACE}
spec:
  className: e2e
  protocol: UDP
  port: 3000
  serviceRef: {{name: echo, port: echo}}
"#
    )
}

/// What differs between the clusters the run proves kuport on: how the cluster comes and goes,
/// how kubectl reaches it, what the workload runs, and where the probes come from.
pub trait Platform {
    /// Creates the cluster and makes the agent image available on every node.
    fn create(&mut self, sh: &mut dyn Shell) -> Result<()>;
    /// Deletes the cluster (also after a failed step).
    fn delete(&mut self, sh: &mut dyn Shell) -> Result<()>;
    /// `kubectl` with `args`, pointed at the cluster.
    fn kubectl(&self, args: Vec<String>) -> Cmd;
    /// The install command (run through [`Platform::kubectl`]'s shape) and the uninstall one.
    fn install(&self) -> Result<(Cmd, Cmd)>;
    /// (the accepting node, the node the pod starts on, the node it is moved to).
    fn nodes(&self) -> (String, String, String);
    /// The workload: Namespace [`NAMESPACE`], Deployment and Service `echo` answering on UDP
    /// 3000 (pinned to `pod_node`), a class accepting on `accepting`, PortMap `echo`.
    fn workload(&self, accepting: &str, pod_node: &str) -> String;
    /// Probes the mapping on the accepting node (`internal_ip` is its InternalIP) and returns
    /// the client addresses the pod saw, after checking each is the client's own.
    fn probe(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<Vec<String>>;
    /// Starts a loop of [`LOOP_ASKS`] probes, 10 a second, in the background.
    fn start_loop(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<()>;
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
        self.kubectl([
            "-n",
            NAMESPACE,
            "wait",
            "portmap/echo",
            "--for=condition=Programmed",
            "--timeout=180s",
        ])?;
        Ok(())
    }
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
    let (install, uninstall) = r.p.install()?;
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
            // A normal start records no failed probe (the readiness probe waits for the
            // first pass instead of failing before it).
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
    )?;

    // The mapping: accepted on one node, the pod on another.
    let (accepting, pod_node, moved_to) = r.p.nodes();
    let address = r.step("read the accepting node's InternalIP", |r| {
        let address = r.kubectl([
            "get",
            "node",
            &accepting,
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
        ])?;
        let address = address.trim().to_owned();
        ensure!(!address.is_empty(), "node {accepting} has no InternalIP");
        Ok(address)
    })?;
    r.step(
        "workload and mapping: the pod on another node, Programmed",
        |r| {
            let workload = r.p.workload(&accepting, &pod_node);
            r.kubectl_stdin(&["apply", "-f", "-"], workload)?;
            r.rollout_status(NAMESPACE, "deployment/echo", "180s")?;
            r.wait_programmed(&pod_node)
        },
    )?;
    let seen = r.step(
        "probe across nodes: the pod sees the client's own address",
        |r| r.p.probe(r.sh, &address),
    )?;
    summary.probes.extend(seen);

    // The pod moves to another node; the mapping follows.
    r.step("the pod moves to another node; the mapping follows", |r| {
        let patch = format!(
            r#"{{"spec":{{"template":{{"spec":{{"nodeSelector":{{"kubernetes.io/hostname":"{moved_to}"}}}}}}}}}}"#
        );
        r.kubectl([
            "-n",
            NAMESPACE,
            "patch",
            "deployment/echo",
            "--type",
            "merge",
            "-p",
            &patch,
        ])?;
        r.rollout_status(NAMESPACE, "deployment/echo", "180s")?;
        r.wait_programmed(&moved_to)
    })?;
    let seen = r.step(
        "probe after the move: the pod sees the client's own address",
        |r| r.p.probe(r.sh, &address),
    )?;
    summary.probes.extend(seen);

    // A rolling restart of the DaemonSet while a loop asks 10 times a second.
    let (sent, answered) = r.step(
        "rolling restart of the DaemonSet under a probe loop: no probe lost",
        |r| {
            r.p.start_loop(r.sh, &address)?;
            r.kubectl([
                "-n",
                "kuport-system",
                "rollout",
                "restart",
                "daemonset/kuport-agent",
            ])?;
            r.rollout_status("kuport-system", "daemonset/kuport-agent", "300s")?;
            let logs = r.p.finish_loop(r.sh)?;
            let (sent, answered) = parse_loop(&logs)?;
            ensure!(
                sent == LOOP_ASKS && answered == sent,
                "the rolling restart lost {} of {sent} probes",
                sent.saturating_sub(answered)
            );
            Ok((sent, answered))
        },
    )?;
    summary.loop_sent = sent;
    summary.loop_answered = answered;

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

/// The chart through a real helm, on the same cluster and with the workload still in place:
/// lint, install (the mapping answers again), upgrade (a changed argument: a rolling update;
/// it still answers), uninstall (every node clean).
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
        "helm install: the DaemonSet ready; the mapping answers again",
        |r| {
            // The chart leaves the namespace to the user, labelled for Pod Security first
            // (values.yaml, README.md).
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
                &chart,
                "--namespace",
                "kuport-system",
                "--wait",
                "--timeout",
                "180s",
            ])?;
            r.rollout_status("kuport-system", "daemonset/kuport-agent", "180s")?;
            r.kubectl([
                "-n",
                NAMESPACE,
                "wait",
                "portmap/echo",
                "--for=condition=Programmed",
                "--timeout=180s",
            ])?;
            let seen = r.p.probe(r.sh, address)?;
            summary.probes.extend(seen);
            Ok(())
        },
    )?;
    r.step(
        "helm upgrade (logLevel=debug): a rolling update; the mapping answers",
        |r| {
            r.helm(&[
                "upgrade",
                "kuport",
                &chart,
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
        },
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
}

impl Kind {
    pub fn new(o: Options) -> Self {
        Self { o }
    }

    fn node(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.o.cluster)
    }

    fn manifests(&self) -> Result<String> {
        manifests::with_image(&self.o.repo.join("deploy/manifests"), &self.o.image)
            .context("rendering deploy/manifests with the image under test")
    }

    fn prober(&self) -> String {
        format!("{}-prober", self.o.cluster)
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

    fn workload(&self, accepting: &str, pod_node: &str) -> String {
        workload(accepting, pod_node)
    }

    /// One UDP probe from a container on kind's network (outside the cluster).
    fn probe(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<Vec<String>> {
        let script = format!(
            "echo prober-address $(hostname -i); echo ping | socat -T3 - UDP4:{internal_ip}:3000"
        );
        let out = sh.run(&Cmd::new(
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
                &script,
            ],
        ))?;
        Ok(vec![check_probe(&out)?])
    }

    fn start_loop(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<()> {
        let script = format!(
            "sent=0; answered=0; while [ $sent -lt {LOOP_ASKS} ]; do \
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
