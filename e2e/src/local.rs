//! The local cluster as a [`Platform`]: real kubelets, containerd and kube-proxy inside the
//! lab's node namespaces (`kuport-lab cluster`), the images built here and imported into every
//! node, probes from the lab's internet client and VPN client.
//!
//! The cluster runs as a child process (`kuport-lab cluster`, see [`lab_command`]), which writes a
//! description of the cluster once every node is Ready and removes everything it made on
//! SIGTERM. kubectl runs in the API server's network namespace (the lab's underlay).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

use crate::driver::{
    Cmd, Failover, HELD_HOST_PORT, HELD_NODE_PORT, NAMESPACE, Platform, Shell, portmap_doc,
    repo_dir,
};

/// The workload image `deploy/image/local-images.sh` builds.
pub const ECHO_IMAGE: &str = "localhost/kuport-echo:e2e";

/// The accepting node, the node the pod starts on (another node: cross-node), and the node it
/// is moved to (the accepting node itself: same-node).
const ACCEPTING: &str = "edge-a";
const POD_NODE: &str = "worker-b";
const MOVED_TO: &str = "edge-a";
/// The other public edge, which takes over a Single mapping when the accepting node fails.
const STANDBY: &str = "edge-c";
/// The failover class's port (delivered to the echo pod's UDP 3000).
const FAILOVER_PORT: u16 = 3100;
/// The Multi class's port, on the same two edges.
const MULTI_PORT: u16 = 3200;
/// The UDP range the workload serves and maps (port for port).
const RANGE: (u16, u16) = (5000, 5005);

/// How to run `kuport-lab`: the binary `KUPORT_LAB_BIN` names (CI passes the one `cargo test
/// --workspace` built, whose dependencies carry the workspace's features), or else `cargo run
/// -p kuport-lab`, which builds it first (rebuilding shared dependencies with the features of
/// that package alone).
fn lab_command() -> (String, Vec<String>) {
    match std::env::var("KUPORT_LAB_BIN") {
        Ok(bin) if !bin.is_empty() => (bin, Vec::new()),
        _ => (
            std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()),
            ["run", "--quiet", "--locked", "-p", "kuport-lab", "--"]
                .map(str::to_owned)
                .to_vec(),
        ),
    }
}

/// What `kuport-lab cluster` writes once the cluster is Ready.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    pub kubeconfig: PathBuf,
    pub api_netns: String,
    pub nodes: Vec<NodeDescription>,
    pub internet: Client,
    pub vpn_clients: Vec<Client>,
    pub echo: PathBuf,
    /// Under real Cilium: the directory of its binaries.
    #[serde(default)]
    pub cilium: Option<PathBuf>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDescription {
    pub name: String,
    pub netns: String,
    pub mesh: Ipv4Addr,
    pub public: Option<Ipv4Addr>,
    /// Under real Cilium: the node's agent API, for `cilium-dbg -H`.
    #[serde(default)]
    pub cilium_api: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Client {
    pub name: String,
    pub netns: String,
    pub address: Ipv4Addr,
}

/// Settings of a local run.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// The agent image (an OCI archive, as `deploy/image/build-local.sh` writes); built from
    /// the debug binary when absent.
    pub agent_image: Option<PathBuf>,
    /// Where the run keeps its images, logs and the cluster's description.
    pub work: PathBuf,
    /// The pod network: `kindnet` (the bridge plugin), or real Cilium built from source by
    /// e2e/cilium/build.sh, `cilium-tunnel` or `cilium-native`.
    pub cni: String,
}

/// The pod networks `--cni` takes.
pub const CNIS: [&str; 3] = ["kindnet", "cilium-tunnel", "cilium-native"];

/// The local cluster, while it runs.
pub struct Local {
    o: LocalOptions,
    lab: Option<Child>,
    /// helm, built by e2e/helm/build.sh.
    helm: Option<String>,
    desc: Option<Description>,
    loop_pid: Option<String>,
}

impl Local {
    pub fn new(o: LocalOptions) -> Self {
        Self {
            o,
            lab: None,
            helm: None,
            desc: None,
            loop_pid: None,
        }
    }

    fn desc(&self) -> Result<&Description> {
        self.desc.as_ref().context("the local cluster is not up")
    }

    fn node(&self, name: &str) -> Result<&NodeDescription> {
        self.desc()?
            .nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("the local cluster has no node {name}"))
    }

    fn description_path(&self) -> PathBuf {
        self.o.work.join("cluster.json")
    }

    fn loop_log(&self) -> PathBuf {
        self.o.work.join("probe-loop.log")
    }

    /// The agent image, the workload and pause images, as docker archives.
    fn build_images(&self, sh: &mut dyn Shell) -> Result<Vec<PathBuf>> {
        // The lab's binaries, built only when missing or older than the sources: after `cargo
        // test --workspace` (as in CI) they are used as they are, instead of rebuilding their
        // dependencies with the feature set of a build of these packages alone.
        let (program, mut args) = lab_command();
        args.push("bins".to_owned());
        let dir = sh.run(&Cmd::new(&program, args))?;
        ensure!(!dir.trim().is_empty(), "kuport-lab bins named no directory");
        let bins = PathBuf::from(dir.trim());
        let agent = match &self.o.agent_image {
            Some(a) => a.clone(),
            None => {
                // The debug binary without its debug information: every node imports and
                // unpacks the image, and the symbols are most of a debug build's size.
                let out = self.o.work.join("kuport-agent.oci.tar");
                let bin = self.o.work.join("kuport");
                sh.run(&Cmd::new(
                    "objcopy",
                    [
                        "--strip-debug".to_owned(),
                        bins.join("kuport").display().to_string(),
                        bin.display().to_string(),
                    ],
                ))?;
                sh.run(&Cmd::new(
                    "env",
                    [
                        format!("KUPORT_BIN={}", bin.display()),
                        repo_dir("deploy/image/build-local.sh"),
                        out.display().to_string(),
                    ],
                ))?;
                out
            }
        };
        let dir = self.o.work.join("images");
        sh.run(&Cmd::new(
            repo_dir("deploy/image/local-images.sh").as_str(),
            [
                agent.display().to_string(),
                dir.display().to_string(),
                bins.join("kuport-echo").display().to_string(),
            ],
        ))?;
        Ok(["pause.tar", "agent.tar", "echo.tar"]
            .iter()
            .map(|f| dir.join(f))
            .collect())
    }

    /// Starts `kuport-lab cluster` and waits for its description.
    fn start_lab(&mut self, images: &[PathBuf], cilium: Option<&Path>) -> Result<()> {
        let desc_path = self.description_path();
        let _ = std::fs::remove_file(&desc_path);
        let log_path = self.o.work.join("cluster.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let err = log.try_clone().context("reopening the cluster log")?;
        let (program, args) = lab_command();
        let mut cmd = Command::new(program);
        cmd.args(args).arg("cluster");
        for image in images {
            cmd.arg("--image").arg(image);
        }
        cmd.arg("--cni").arg(&self.o.cni);
        if let Some(dir) = cilium {
            cmd.arg("--cilium-dir").arg(dir);
        }
        cmd.arg("--describe").arg(&desc_path);
        let child = cmd
            .current_dir(repo_dir(""))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .context("starting kuport-lab cluster")?;
        self.lab = Some(child);
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if let Ok(text) = std::fs::read_to_string(&desc_path) {
                self.desc = Some(
                    serde_json::from_str(&text)
                        .with_context(|| format!("reading {}", desc_path.display()))?,
                );
                return Ok(());
            }
            let exited = self
                .lab
                .as_mut()
                .map(|c| c.try_wait())
                .transpose()
                .context("watching kuport-lab cluster")?
                .flatten();
            if let Some(status) = exited {
                self.lab = None;
                bail!(
                    "kuport-lab cluster exited with {status} before the cluster was Ready; {} ends:\n{}",
                    log_path.display(),
                    tail(&log_path, 30)
                );
            }
            ensure!(
                Instant::now() < deadline,
                "the local cluster was not Ready within 600 s; {} ends:\n{}",
                log_path.display(),
                tail(&log_path, 30)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One ask from the internet client to `port` on the accepting node's public address; its
    /// first line whatever it was (a refusal or a timeout is not an error here).
    fn ask_public(&self, sh: &mut dyn Shell, protocol: &str, port: u16) -> Result<String> {
        self.ask_node_public(sh, ACCEPTING, protocol, port, 2000)
    }

    fn ask_node_public(
        &self,
        sh: &mut dyn Shell,
        node: &str,
        protocol: &str,
        port: u16,
        timeout_ms: u32,
    ) -> Result<String> {
        let desc = self.desc()?;
        let public = self
            .node(node)?
            .public
            .with_context(|| format!("node {node} has no public address"))?;
        let mut ask = self.ask(&desc.internet, protocol, SocketAddr::from((public, port)));
        if let Some(t) = ask.args.iter().position(|a| a == "--timeout-ms") {
            ask.args[t + 1] = timeout_ms.to_string();
        }
        let line = format!("{ask} || true");
        let out = sh.run(&Cmd::new("sh", ["-c", &line]))?;
        Ok(out.lines().next().unwrap_or("").trim().to_owned())
    }

    fn ask(&self, client: &Client, protocol: &str, dialed: SocketAddr) -> Cmd {
        let echo = self
            .desc
            .as_ref()
            .map(|d| d.echo.display().to_string())
            .unwrap_or_default();
        Cmd::new(
            "ip",
            [
                "netns".to_owned(),
                "exec".to_owned(),
                client.netns.clone(),
                echo,
                "ask".to_owned(),
                protocol.to_owned(),
                dialed.to_string(),
                "--timeout-ms".to_owned(),
                "2000".to_owned(),
            ],
        )
    }

    /// One probe, tried up to three times for UDP (a first ARP can lose a datagram); returns the
    /// address the pod saw after checking it is the client's own and that the reply came from
    /// the address dialed.
    fn probe_one(
        &self,
        sh: &mut dyn Shell,
        client: &Client,
        protocol: &str,
        dialed: SocketAddr,
    ) -> Result<String> {
        let tries = if protocol == "udp" { 3 } else { 1 };
        let mut last = String::new();
        for _ in 0..tries {
            let out = match sh.run(&self.ask(client, protocol, dialed)) {
                Ok(out) => out,
                Err(e) => format!("{e:#}"),
            };
            match check_echo(&out, dialed, client.address) {
                Ok(saw) => return Ok(saw),
                Err(e) => last = format!("{e:#}"),
            }
        }
        bail!(
            "{protocol} from {} ({}) to {dialed}: {last}",
            client.name,
            client.address
        )
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs one inside-the-cluster ask up to three times: the first datagram from a new client can
/// race the conntrack entry of the previous one, and one lost datagram is not a finding.
fn ask_with_retries(sh: &mut dyn Shell, cmd: &Cmd, dialed: SocketAddr) -> Result<String> {
    let mut last = anyhow::anyhow!("not asked");
    for _ in 0..3 {
        let out = sh.run(cmd).unwrap_or_else(|e| format!("{e:#}"));
        match answered_from(&out, dialed) {
            Ok(client) => return Ok(client),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Checks that a `kuport-echo ask` answer came from the address and port dialed, and returns
/// what the pod saw (`peer=`) beside the client's own address (`client=`), without judging it.
pub fn answered_from(output: &str, dialed: SocketAddr) -> Result<String> {
    let line = output.lines().next().unwrap_or("").trim();
    let mut words = line.split_whitespace();
    ensure!(
        words.next() == Some("reply"),
        "no reply from {dialed}: {line:?}"
    );
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_owned)
    };
    let from = field("from=").with_context(|| format!("no from= in {line:?}"))?;
    ensure!(
        from == dialed.to_string(),
        "the reply came from {from}, not the address dialed {dialed}"
    );
    let peer = field("peer=").with_context(|| format!("no peer= in {line:?}"))?;
    let own = field("client=").with_context(|| format!("no client= in {line:?}"))?;
    Ok(format!("the pod saw {peer} (the client's own {own})"))
}

/// Checks one `kuport-echo ask` answer (`reply from=<ip:port> peer=<ip:port> ... client=<ip:port>`):
/// the reply came from the address dialed and the pod saw the client's own address (its own
/// port too). Returns what the pod saw.
pub fn check_echo(output: &str, dialed: SocketAddr, client: Ipv4Addr) -> Result<String> {
    let line = output.lines().next().unwrap_or("").trim();
    let mut words = line.split_whitespace();
    let outcome = words.next().unwrap_or("");
    ensure!(outcome == "reply", "no reply from {dialed}: {line:?}");
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .map(str::to_owned)
    };
    let from = field("from").context("the answer names no sender")?;
    ensure!(
        from == dialed.to_string(),
        "the reply came from {from}, not from the address dialed {dialed}"
    );
    let peer = field("peer").context("the answer says nothing about what the pod saw")?;
    let own = field("client").context("the prober did not report its own address")?;
    let peer_ip = peer
        .parse::<SocketAddr>()
        .with_context(|| format!("the pod saw {peer:?}"))?
        .ip();
    ensure!(
        peer_ip == std::net::IpAddr::V4(client) && peer == own,
        "the pod saw {peer}, not the client's own address {own}: the client address was lost"
    );
    Ok(peer)
}

impl Platform for Local {
    fn create(&mut self, sh: &mut dyn Shell) -> Result<()> {
        std::fs::create_dir_all(&self.o.work)
            .with_context(|| format!("creating {}", self.o.work.display()))?;
        ensure!(
            CNIS.contains(&self.o.cni.as_str()),
            "--cni {}: expected one of {}",
            self.o.cni,
            CNIS.join(", ")
        );
        // Real Cilium, built from source (cached by version) before anything else.
        let cilium = match self.o.cni.starts_with("cilium") {
            true => {
                let out = sh.run(&Cmd::new("bash", [repo_dir("e2e/cilium/build.sh")]))?;
                let dir = out
                    .lines()
                    .last()
                    .context("e2e/cilium/build.sh printed no directory")?;
                Some(PathBuf::from(dir.trim()))
            }
            false => None,
        };
        let images = self.build_images(sh)?;
        let built = sh.run(&Cmd::new("bash", [repo_dir("e2e/helm/build.sh")]))?;
        self.helm = Some(
            built
                .lines()
                .last()
                .context("e2e/helm/build.sh printed no path")?
                .trim()
                .to_owned(),
        );
        self.start_lab(&images, cilium.as_deref())
    }

    /// Under real Cilium: its version and `cilium-dbg status --brief` from every node's agent,
    /// each of which must say OK.
    fn reports_cni(&self) -> bool {
        self.o.cni.starts_with("cilium")
    }

    fn cni_status(&mut self, sh: &mut dyn Shell) -> Result<Vec<String>> {
        let desc = self.desc()?.clone();
        let dir = desc
            .cilium
            .context("the cluster runs no real Cilium (its description names none)")?;
        let dbg = dir.join("cilium-dbg").display().to_string();
        let mut lines = Vec::new();
        let mut version = String::new();
        for n in &desc.nodes {
            let api = n
                .cilium_api
                .clone()
                .with_context(|| format!("node {} names no Cilium agent", n.name))?;
            if version.is_empty() {
                version = sh
                    .run(&Cmd::new(&dbg, ["-H", &api, "version"]))?
                    .lines()
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join("; ");
                lines.push(format!("Cilium {} ({version})", self.o.cni));
            }
            let status = sh.run(&Cmd::new(&dbg, ["-H", &api, "status", "--brief"]))?;
            let status = status.trim();
            ensure!(
                status.starts_with("OK"),
                "cilium-dbg status --brief on {}: {status}",
                n.name
            );
            lines.push(format!("{}: cilium-dbg status --brief: {status}", n.name));
        }
        Ok(lines)
    }

    fn delete(&mut self, _sh: &mut dyn Shell) -> Result<()> {
        let Some(mut child) = self.lab.take() else {
            return Ok(());
        };
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(180);
        let status = loop {
            if let Some(status) = child.try_wait().context("waiting for kuport-lab cluster")? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("kuport-lab cluster did not stop within 180 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let log = self.o.work.join("cluster.log");
        ensure!(
            status.success(),
            "kuport-lab cluster stopped with {status}; {} ends:\n{}",
            log.display(),
            tail(&log, 20)
        );
        Ok(())
    }

    fn kuport_cli(&self, args: Vec<String>) -> Option<Cmd> {
        // The CLI the agent image was built from (stripped), when this run built the image.
        let cli = self.o.work.join("kuport");
        let desc = self.desc.as_ref()?;
        if !cli.is_file() {
            return None;
        }
        let mut all = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            desc.api_netns.clone(),
            cli.display().to_string(),
        ];
        all.extend(args);
        all.extend([
            "--kubeconfig".to_owned(),
            desc.kubeconfig.display().to_string(),
        ]);
        Some(Cmd::new("ip", all))
    }

    fn kubectl(&self, args: Vec<String>) -> Cmd {
        let (netns, kubeconfig) = self
            .desc
            .as_ref()
            .map(|d| (d.api_netns.clone(), d.kubeconfig.display().to_string()))
            .unwrap_or_default();
        let mut all = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            netns,
            "kubectl".to_owned(),
            "--kubeconfig".to_owned(),
            kubeconfig,
        ];
        all.extend(args);
        Cmd::new("ip", all)
    }

    /// As the README says: `kubectl apply -k deploy/manifests`, the image already under the
    /// name the manifests use.
    fn install(&self) -> Result<(Cmd, Cmd)> {
        let dir = repo_dir("deploy/manifests");
        Ok((
            self.kubectl(vec!["apply".into(), "-k".into(), dir.clone()]),
            self.kubectl(vec![
                "delete".into(),
                "--wait=true".into(),
                "-k".into(),
                dir,
            ]),
        ))
    }

    fn nodes(&self) -> (String, String, String) {
        (ACCEPTING.into(), POD_NODE.into(), MOVED_TO.into())
    }

    fn workload(&self, accepting: &str, pod_node: &str, moved_to: &str) -> String {
        workload(accepting, pod_node, moved_to)
    }

    fn probed_container(&self) -> &'static str {
        "udp"
    }

    /// A TCP ask to the mapped port on the public address must be refused (a RST from the
    /// address dialed), not time out and not answer.
    fn expect_refused(&mut self, sh: &mut dyn Shell, _internal_ip: &str) -> Result<()> {
        let out = self.ask_public(sh, "tcp", 3000)?;
        ensure!(
            out.starts_with("refused"),
            "with its only pod unready the mapped TCP port gave {out:?}, not a refusal"
        );
        Ok(())
    }

    fn failover(&self) -> Option<Failover> {
        Some(Failover {
            primary: ACCEPTING.into(),
            standby: STANDBY.into(),
            port: FAILOVER_PORT,
            multi_port: MULTI_PORT,
            workload: failover_workload(ACCEPTING, STANDBY),
        })
    }

    /// SIGSTOP or SIGCONT to the kubelet running in the node's network namespace: stopped, it
    /// renews no Lease and reports no status, as a hung or partitioned kubelet would.
    fn pause_kubelet(&mut self, sh: &mut dyn Shell, node: &str, paused: bool) -> Result<()> {
        let netns = self.node(node)?.netns.clone();
        let signal = if paused { "STOP" } else { "CONT" };
        let script = format!(
            "found=0; for p in $(ip netns pids {netns}); do \
             if [ \"$(cat /proc/$p/comm 2>/dev/null)\" = kubelet ]; then kill -{signal} $p && found=1; fi; \
             done; [ $found = 1 ] || {{ echo 'no kubelet in {netns}' >&2; exit 1; }}"
        );
        sh.run(&Cmd::new("sh", ["-c", &script])).map(|_| ())
    }

    fn ask_node(
        &mut self,
        sh: &mut dyn Shell,
        node: &str,
        port: u16,
        timeout_ms: u32,
    ) -> Result<String> {
        self.ask_node_public(sh, node, "udp", port, timeout_ms)
    }

    fn held_ports_workload(&self, accepting: &str) -> Option<String> {
        Some(held_ports_workload(accepting))
    }

    /// Any answer counts: a NodePort's traffic is masqueraded by kube-proxy, so the pod sees a
    /// node address, not the client's.
    fn ask_tcp(&mut self, sh: &mut dyn Shell, port: u16, internal: bool) -> Result<String> {
        let out = if internal {
            let desc = self.desc()?;
            let vpn = desc
                .vpn_clients
                .first()
                .context("the local cluster has no VPN client")?;
            let mesh = self.node(ACCEPTING)?.mesh;
            let ask = self.ask(vpn, "tcp", SocketAddr::from((mesh, port)));
            let out = sh.run(&Cmd::new("sh", ["-c", &format!("{ask} || true")]))?;
            out.lines().next().unwrap_or("").trim().to_owned()
        } else {
            self.ask_public(sh, "tcp", port)?
        };
        ensure!(out.starts_with("reply "), "TCP to port {port}: {out:?}");
        Ok(out)
    }

    /// UDP and TCP from the internet to the node's public address, a port of the range, and
    /// UDP from the VPN client to its mesh address (the InternalIP).
    fn probe(&mut self, sh: &mut dyn Shell, internal_ip: &str) -> Result<Vec<String>> {
        let desc = self.desc()?.clone();
        let node = self.node(ACCEPTING)?.clone();
        let public = node
            .public
            .with_context(|| format!("node {ACCEPTING} has no public address"))?;
        let mesh: Ipv4Addr = internal_ip
            .parse()
            .with_context(|| format!("InternalIP {internal_ip:?}"))?;
        ensure!(
            mesh == node.mesh,
            "node {ACCEPTING}'s InternalIP is {mesh}, not its mesh address {}",
            node.mesh
        );
        let vpn = desc
            .vpn_clients
            .first()
            .context("the local cluster has no VPN client")?;
        let mid = RANGE.0 + (RANGE.1 - RANGE.0) / 2;
        let mut seen = Vec::new();
        for (client, protocol, dialed) in [
            (&desc.internet, "udp", SocketAddr::from((public, 3000))),
            (&desc.internet, "tcp", SocketAddr::from((public, 3000))),
            (&desc.internet, "udp", SocketAddr::from((public, mid))),
            (vpn, "udp", SocketAddr::from((mesh, 3000))),
        ] {
            seen.push(self.probe_one(sh, client, protocol, dialed)?);
        }
        Ok(seen)
    }

    fn has_inside_clients(&self) -> bool {
        true
    }

    /// The accepting node dials its own public address; the pod's node and the workload pod
    /// (on it) dial the accepting node's mesh address (its InternalIP, where the class also
    /// publishes): the public segment is not routed from a worker here, as on a real site.
    fn probe_inside(&mut self, sh: &mut dyn Shell) -> Result<Vec<String>> {
        let desc = self.desc()?.clone();
        let edge = self.node(ACCEPTING)?.clone();
        let public = edge
            .public
            .with_context(|| format!("node {ACCEPTING} has no public address"))?;
        let public = SocketAddr::from((public, 3000));
        let mesh = SocketAddr::from((edge.mesh, 3000));
        let echo = desc.echo.display().to_string();
        let ask = |ns: &str, dialed: SocketAddr| {
            Cmd::new(
                "ip",
                [
                    "netns",
                    "exec",
                    ns,
                    &echo,
                    "ask",
                    "udp",
                    &dialed.to_string(),
                    "--timeout-ms",
                    "2000",
                ]
                .map(str::to_owned),
            )
        };
        let kubectl = |args: &[&str]| {
            let mut all: Vec<String> =
                ["netns", "exec", &desc.api_netns, "kubectl", "--kubeconfig"]
                    .map(str::to_owned)
                    .to_vec();
            all.push(desc.kubeconfig.display().to_string());
            all.extend(args.iter().map(|a| (*a).to_owned()));
            Cmd::new("ip", all)
        };
        let target = mesh.to_string();
        let clients = [
            (
                format!("node {ACCEPTING}"),
                public,
                ask(&edge.netns, public),
            ),
            (
                format!("node {POD_NODE}"),
                mesh,
                ask(&self.node(POD_NODE)?.netns, mesh),
            ),
            (
                "the workload pod itself".to_owned(),
                mesh,
                kubectl(&[
                    "-n",
                    NAMESPACE,
                    "exec",
                    "deploy/echo",
                    "-c",
                    "udp",
                    "--",
                    "/usr/local/bin/kuport-echo",
                    "ask",
                    "udp",
                    &target,
                    "--timeout-ms",
                    "2000",
                ]),
            ),
        ];
        let mut seen = Vec::new();
        for (who, dialed, cmd) in clients {
            let saw = ask_with_retries(sh, &cmd, dialed)
                .with_context(|| format!("UDP from {who} to {dialed}"))?;
            seen.push(format!("{who} to {dialed}: {saw}"));
        }
        Ok(seen)
    }

    fn start_loop(&mut self, sh: &mut dyn Shell, _internal_ip: &str, asks: u32) -> Result<()> {
        let desc = self.desc()?.clone();
        let public = self
            .node(ACCEPTING)?
            .public
            .with_context(|| format!("node {ACCEPTING} has no public address"))?;
        let log = self.loop_log();
        let script = format!(
            "sent=0; answered=0\nwhile [ $sent -lt {asks} ]; do\n  \
             if {echo} ask udp {public}:3000 --timeout-ms 1000 | grep -q '^reply '; then answered=$((answered+1)); fi\n  \
             sent=$((sent+1)); sleep 0.1\ndone\necho sent $sent answered $answered\n",
            echo = desc.echo.display()
        );
        let file = self.o.work.join("probe-loop.sh");
        std::fs::write(&file, script).with_context(|| format!("writing {}", file.display()))?;
        let outer = format!(
            "ip netns exec {ns} sh {file} >{log} 2>&1 & echo $!",
            ns = desc.internet.netns,
            file = file.display(),
            log = log.display()
        );
        let pid = sh.run(&Cmd::new("sh", ["-c", &outer]))?;
        self.loop_pid = Some(pid.trim().to_owned());
        Ok(())
    }

    fn finish_loop(&mut self, sh: &mut dyn Shell) -> Result<String> {
        let pid = self.loop_pid.take().context("no probe loop running")?;
        ensure!(
            pid.chars().all(|c| c.is_ascii_digit()) && !pid.is_empty(),
            "the probe loop's pid is {pid:?}"
        );
        let wait = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.2; done; cat {}",
            self.loop_log().display()
        );
        sh.run(&Cmd::new("sh", ["-c", &wait]))
    }

    fn helm(&self, args: Vec<String>) -> Option<Cmd> {
        let helm = self.helm.clone()?;
        let desc = self.desc.as_ref()?;
        let mut all = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            desc.api_netns.clone(),
            helm,
            "--kubeconfig".to_owned(),
            desc.kubeconfig.display().to_string(),
        ];
        all.extend(args);
        Some(Cmd::new("ip", all))
    }

    fn node_state(&mut self, sh: &mut dyn Shell, node: &str) -> Result<(String, String)> {
        let netns = self.node(node)?.netns.clone();
        let nft = sh.run(&Cmd::new(
            "ip",
            ["netns", "exec", &netns, "nft", "list", "tables"],
        ))?;
        let links = sh.run(&Cmd::new("ip", ["-n", &netns, "-o", "link", "show"]))?;
        Ok((nft, links))
    }
}

/// The local workload: kuport-echo answering UDP and TCP on 3000 and UDP on the range, allowed
/// on `pod_node` and `moved_to` only, ready once its TCP port listens and while its `udp`
/// container has no `/tmp/unready`; its Service; a class accepting on the node's public and
/// mesh interfaces (opting in to the NodePort range, so that a PortMap there meets the NodePort
/// itself); a PortMap each for UDP, TCP and the range.
pub fn workload(accepting: &str, pod_node: &str, moved_to: &str) -> String {
    let (first, last) = RANGE;
    let head = crate::driver::echo_deployment_head(pod_node, moved_to, "");
    format!(
        r#"{head}        - name: udp
          image: {ECHO_IMAGE}
          imagePullPolicy: Never
          args: ["serve", "udp", "3000"]
          ports:
            - {{name: echo, containerPort: 3000, protocol: UDP}}
          readinessProbe:
            exec: {{command: ["sh", "-c", "test ! -e /tmp/unready"]}}
            periodSeconds: 1
            failureThreshold: 1
        - name: tcp
          image: {ECHO_IMAGE}
          imagePullPolicy: Never
          args: ["serve", "tcp", "3000"]
          ports:
            - {{name: echo-tcp, containerPort: 3000, protocol: TCP}}
          readinessProbe:
            tcpSocket: {{port: 3000}}
            periodSeconds: 1
        - name: range
          image: {ECHO_IMAGE}
          imagePullPolicy: Never
          args: ["serve", "udp", "{first}-{last}"]
          ports:
            - {{name: range, containerPort: {first}, protocol: UDP}}
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
    - {{name: echo-tcp, port: 3000, protocol: TCP}}
    - {{name: range, port: {first}, protocol: UDP}}
---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata:
  name: e2e
spec:
  nodes:
    {accepting}: {{interfaces: [enp1s0, wt0]}}
  returnPath: {{mode: Vxlan}}
  ports: {{systemReserved: []}}
---
{udp}---
{tcp}---
{range}"#,
        udp = portmap_doc("echo", "e2e", "UDP", 3000, None, "echo"),
        tcp = portmap_doc("echo-tcp", "e2e", "TCP", 3000, None, "echo-tcp"),
        range = portmap_doc("echo-range", "e2e", "UDP", first, Some(last), "range"),
    )
}

/// A NodePort Service (TCP [`HELD_NODE_PORT`] to the echo pods) and a Pod on `accepting`
/// answering TCP on hostPort [`HELD_HOST_PORT`], with PortMaps `np` and `hp` asking for those
/// ports in the workload's class.
pub fn held_ports_workload(accepting: &str) -> String {
    let portmap = |name: &str, port: u16| portmap_doc(name, "e2e", "TCP", port, None, "echo-tcp");
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: echo-np
  namespace: {NAMESPACE}
spec:
  type: NodePort
  selector: {{app: echo}}
  ports:
    - {{name: echo-tcp, port: 3000, targetPort: 3000, protocol: TCP, nodePort: {HELD_NODE_PORT}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: hostport
  namespace: {NAMESPACE}
spec:
  nodeSelector:
    kubernetes.io/hostname: {accepting}
  terminationGracePeriodSeconds: 1
  containers:
    - name: tcp
      image: {ECHO_IMAGE}
      imagePullPolicy: Never
      args: ["serve", "tcp", "{HELD_HOST_PORT}"]
      ports:
        - {{containerPort: {HELD_HOST_PORT}, hostPort: {HELD_HOST_PORT}, protocol: TCP}}
      readinessProbe:
        tcpSocket: {{port: {HELD_HOST_PORT}}}
        periodSeconds: 1
---
{np}---
{hp}"#,
        np = portmap("np", HELD_NODE_PORT),
        hp = portmap("hp", HELD_HOST_PORT),
    )
}

/// A Single class accepting on `primary` and `standby` (the first ready one serves) with
/// PortMap `failover` for UDP [`FAILOVER_PORT`], and a Multi class on both with PortMap
/// `failover-multi` for UDP [`MULTI_PORT`], both to the echo pods.
pub fn failover_workload(primary: &str, standby: &str) -> String {
    format!(
        r#"apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata:
  name: e2e-failover
spec:
  servingMode: Single
  nodes:
    {primary}: {{interfaces: [enp1s0]}}
    {standby}: {{interfaces: [enp1s0]}}
  # Its own VNIs and link addresses beside the e2e class's links between the same nodes.
  returnPath: {{mode: Vxlan, vxlan: {{vni: 6242, subnet: 169.254.78.0/24}}}}
---
{single}---
apiVersion: kuport.wlz.li/v1alpha1
kind: PortMapClass
metadata:
  name: e2e-multi
spec:
  servingMode: Multi
  nodes:
    {primary}: {{interfaces: [enp1s0]}}
    {standby}: {{interfaces: [enp1s0]}}
  returnPath: {{mode: Vxlan, vxlan: {{vni: 8242, subnet: 169.254.79.0/24}}}}
---
{multi}"#,
        single = portmap_doc(
            "failover",
            "e2e-failover",
            "UDP",
            FAILOVER_PORT,
            None,
            "echo"
        ),
        multi = portmap_doc(
            "failover-multi",
            "e2e-multi",
            "UDP",
            MULTI_PORT,
            None,
            "echo"
        ),
    )
}

/// Runs the end-to-end sequence on the local cluster (see [`crate::driver::run_on`]).
pub fn run(sh: &mut dyn Shell, o: LocalOptions, keep: bool) -> Result<crate::driver::Summary> {
    let mut local = Local::new(o);
    let result = crate::driver::run_on(sh, &mut local, keep);
    if keep && let Some(child) = local.lab.take() {
        let (kubeconfig, netns) = local
            .desc
            .as_ref()
            .map(|d| (d.kubeconfig.display().to_string(), d.api_netns.clone()))
            .unwrap_or_default();
        eprintln!(
            "the local cluster stays up (kuport-lab pid {pid}); kubectl: ip netns exec {netns} kubectl --kubeconfig {kubeconfig}; stop it with kill {pid}",
            pid = child.id()
        );
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inside_answer_must_come_from_the_address_dialed_and_records_what_the_pod_saw() {
        let dialed: SocketAddr = "203.0.113.1:3000".parse().expect("addr");
        let translated =
            "reply from=203.0.113.1:3000 peer=169.254.77.0:40000 port=3000 client=100.64.0.2:40000";
        assert_eq!(
            answered_from(translated, dialed).expect("a translated source is recorded, not judged"),
            "the pod saw 169.254.77.0:40000 (the client's own 100.64.0.2:40000)"
        );
        let wrong_sender =
            "reply from=10.244.2.5:3000 peer=100.64.0.2:40000 client=100.64.0.2:40000";
        assert!(answered_from(wrong_sender, dialed).is_err());
        assert!(answered_from("timeout after 2000 ms", dialed).is_err());
    }

    #[test]
    fn an_echo_answer_passes_only_with_the_client_address_and_the_dialed_source() {
        let dialed: SocketAddr = "203.0.113.1:3000".parse().expect("addr");
        let client = Ipv4Addr::new(198, 51, 100, 10);
        let good = "reply from=203.0.113.1:3000 peer=198.51.100.10:40000 port=3000 len=4 client=198.51.100.10:40000 rtt_us=300";
        assert_eq!(
            check_echo(good, dialed, client).expect("ok"),
            "198.51.100.10:40000"
        );
        for (bad, why) in [
            (
                "reply from=203.0.113.1:3000 peer=169.254.77.2:40000 port=3000 client=198.51.100.10:40000",
                "the client address was lost",
            ),
            (
                "reply from=10.244.2.5:3000 peer=198.51.100.10:40000 port=3000 client=198.51.100.10:40000",
                "not from the address dialed",
            ),
            ("timeout", "no reply"),
            ("", "no reply"),
        ] {
            let err = check_echo(bad, dialed, client).expect_err(bad);
            assert!(format!("{err:#}").contains(why), "{bad}: {err:#}");
        }
    }

    #[test]
    fn the_workload_maps_udp_tcp_and_the_range_on_the_accepting_node() {
        let w = workload("edge-a", "worker-b", "edge-a");
        assert!(w.contains("edge-a: {interfaces: [enp1s0, wt0]}"));
        assert!(w.contains("operator: In, values: [worker-b, edge-a]"));
        assert!(w.contains("test ! -e /tmp/unready"));
        assert_eq!(w.matches("kind: PortMap\n").count(), 3);
        assert!(w.contains("endPort: 5005"));
        assert_eq!(w.matches("imagePullPolicy: Never").count(), 3);
        for doc in w.split("---\n") {
            let v: serde_json::Value = serde_saphyr::from_str(doc).expect("each document parses");
            assert!(v["kind"].is_string(), "{doc}");
        }
    }

    #[test]
    fn the_held_ports_sit_on_the_accepting_node_with_a_portmap_each() {
        let w = held_ports_workload("edge-a");
        assert!(w.contains("nodePort: 31080"));
        assert!(w.contains("hostPort: 8443"));
        assert!(w.contains("kubernetes.io/hostname: edge-a"));
        assert_eq!(w.matches("kind: PortMap\n").count(), 2);
        for doc in w.split("---\n") {
            let v: serde_json::Value = serde_saphyr::from_str(doc).expect("each document parses");
            assert!(v["kind"].is_string(), "{doc}");
        }
    }

    #[test]
    fn the_failover_class_serves_single_from_two_edges_on_its_own_vnis() {
        let w = failover_workload("edge-a", "edge-c");
        let docs: Vec<serde_json::Value> = w
            .split("---\n")
            .map(|d| serde_saphyr::from_str(d).expect("each document parses"))
            .collect();
        let class = &docs[0]["spec"];
        assert_eq!(class["servingMode"], "Single");
        assert!(class["nodes"]["edge-a"].is_object() && class["nodes"]["edge-c"].is_object());
        assert_eq!(class["returnPath"]["vxlan"]["vni"], 6242);
        assert_eq!(class["returnPath"]["vxlan"]["subnet"], "169.254.78.0/24");
        assert_eq!(docs[1]["spec"]["port"], 3100);
        assert_eq!(docs[1]["spec"]["className"], "e2e-failover");
        assert_eq!(docs[2]["spec"]["servingMode"], "Multi");
        assert_eq!(
            docs[2]["spec"]["returnPath"]["vxlan"]["subnet"],
            "169.254.79.0/24"
        );
        assert_eq!(docs[3]["spec"]["port"], 3200);
        assert_eq!(docs[3]["spec"]["className"], "e2e-multi");
    }
}
