//! The agent's peak RSS with 1,000 PortMaps and 500 Nodes in the API server model; and the same
//! with every PortMap carrying a 100 KiB `kubectl.kubernetes.io/last-applied-configuration`
//! annotation (what `kubectl apply` leaves on an object; the API server allows 256 KiB of
//! annotations per object), against the DaemonSet's 128 MiB memory limit.
//!
//! In one namespace: `kuport-sim serve`, then 500 Ready Nodes, 10 labelled Namespaces, one Vxlan
//! class whose only accepting node is the agent's (`node-000`, so it programs and reports every
//! mapping), 1,000 PortMaps and their EndpointSlices with the pods spread over all 500 nodes,
//! and the class's link claims landed as the pod nodes' agents would have written them (so the
//! agent builds return links to the other nodes: as many as its link marks allow, 254 with the
//! default mark mask; the rest of the mappings are refused for want of a mark). Then `kuport agent` for
//! `node-000`, until `/readyz` answers 200 and passes stop coming (its status writes echo back
//! as watch events for a while); then `VmHWM`.
//!
//! And the same cluster with about 100 MB of EndpointSlices (`bulk_slices.rs`) for a Service no
//! PortMap refers to, beside the same cluster without them and, as the control, with one more
//! PortMap referring to that Service, in one session.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures_util::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kuport_core::api::{PortMap, PortMapClass};
use kuport_testkit::netns::{Netns, owned_name};
use kuport_testkit::objects::{
    self, endpoint, link_claim, nodes_json, pm, slice, vxlan_return_path,
};
use kuport_testkit::process::Proc;
use serde_json::json;

use super::bulk_slices;
use super::{Measurement, PREFIX, list, median};

const NODES: usize = 500;
const PORTMAPS: usize = 1_000;
const NAMESPACES: usize = 10;
const AGENT_NODE: &str = "node-000";
const API: &str = "127.0.0.1:6443";
const HEALTH: &str = "127.0.0.1:8081";
const METRICS: &str = "127.0.0.1:9090";
const TARGET_MIB: f64 = 64.0;
/// The annotation each PortMap carries in the annotated run.
const ANNOTATION_BYTES: usize = 100 * 1024;
/// The DaemonSet's memory limit: the annotated run must stay under it.
const LIMIT_MIB: f64 = 128.0;
/// Requests in flight while creating the objects.
const CONCURRENCY: usize = 16;
/// The agent counts as settled once no pass has completed for this long.
const QUIET: Duration = Duration::from_secs(3);
/// Runs, each with a fresh agent: the peak varies by several MiB from run to run.
const SAMPLES: usize = 3;

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the API server model holds besides the 1,000 PortMaps and 500 Nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Workload {
    /// Bytes of annotation on each PortMap (none for 0).
    annotation: usize,
    /// The bulk EndpointSlices, and whether a PortMap refers to their Service.
    slices: Option<Referred>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Referred(bool);

pub fn measure(bins: &Path) -> Result<Vec<Measurement>> {
    let sampled = sample(bins, Workload::default())?;
    let name = "agent memory (peak RSS) with 1,000 PortMaps and 500 Nodes in the API server model";
    Ok(vec![sampled.row(name, None, TARGET_MIB)])
}

/// The same with every PortMap carrying a [`ANNOTATION_BYTES`] annotation.
pub fn measure_annotated(bins: &Path) -> Result<Vec<Measurement>> {
    let workload = Workload {
        annotation: ANNOTATION_BYTES,
        ..Workload::default()
    };
    let sampled = sample(bins, workload)?;
    let name = format!(
        "agent memory (peak RSS) with 1,000 PortMaps each annotated with {} KiB, 500 Nodes, in \
         the API server model",
        ANNOTATION_BYTES / 1024
    );
    Ok(vec![sampled.row(&name, None, LIMIT_MIB)])
}

/// The cluster with about 100 MB of EndpointSlices no PortMap refers to, against the same
/// cluster without them (the baseline, sampled in the same session) and, as the control, with a
/// PortMap referring to their Service.
pub fn measure_slices(bins: &Path) -> Result<Vec<Measurement>> {
    let without = sample(bins, Workload::default())?;
    let unrelated = sample(
        bins,
        Workload {
            slices: Some(Referred(false)),
            ..Workload::default()
        },
    )?;
    let referred = sample(
        bins,
        Workload {
            slices: Some(Referred(true)),
            ..Workload::default()
        },
    )?;
    let mb = bulk_slices::TOTAL_BYTES / 1_000_000;
    let mut rows = vec![unrelated.row(
        &format!(
            "agent memory (peak RSS) with 1,000 PortMaps, 500 Nodes and {mb} MB of EndpointSlices \
             no PortMap refers to, in the API server model; baseline: the same without them"
        ),
        Some(without.peak),
        (without.peak + SLICES_MARGIN_MIB).min(LIMIT_MIB),
    )];
    let mut control = referred.row(
        &format!(
            "control: the same {mb} MB of EndpointSlices, their Service referred to by a PortMap"
        ),
        Some(without.peak),
        LIMIT_MIB,
    );
    // The control shows what the slices cost when they concern the agent: no target of its own.
    control.target = String::new();
    control.met = None;
    rows.push(control);
    Ok(rows)
}

/// How much more than without them the agent may take with the unrelated slices: the list pages
/// it decodes and drops (50 slices of 1,000 endpoints are about 17 MB of JSON), and the
/// allocator's high-water mark from them.
const SLICES_MARGIN_MIB: f64 = 24.0;

/// The samples of one workload.
struct Sampled {
    runs: Vec<Watched>,
    peak: f64,
    profile: String,
}

fn sample(bins: &Path, workload: Workload) -> Result<Sampled> {
    let kuport = bins.join("kuport");
    let sim = bins.join("kuport-sim");
    for b in [&kuport, &sim] {
        if !b.is_file() {
            bail!(
                "{} is missing (build the kuport and kuport-sim binaries)",
                b.display()
            );
        }
    }
    let runs = (0..SAMPLES)
        .map(|i| one_run(i, &kuport, &sim, workload))
        .collect::<Result<Vec<_>>>()?;
    let peaks: Vec<f64> = runs.iter().map(|r| mib(r.hwm_kib)).collect();
    Ok(Sampled {
        peak: median(&peaks),
        runs,
        profile: agent_profile(&kuport),
    })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

impl Sampled {
    /// The row of the median peak, against `target` MiB (and `baseline`, measured beside it).
    fn row(&self, name: &str, baseline: Option<f64>, target: f64) -> Measurement {
        let runs = &self.runs;
        let first = &runs[0];
        let of =
            |f: fn(&Watched) -> u64| list(&runs.iter().map(|r| mib(f(r))).collect::<Vec<_>>(), 1);
        let beside = baseline.map_or(String::new(), |b| {
            format!(
                "; the baseline's median {b:.1} MiB, {:+.1} MiB",
                self.peak - b
            )
        });
        Measurement {
            name: name.to_owned(),
            value: self.peak,
            unit: "MiB".to_owned(),
            samples: runs.len(),
            baseline,
            target: format!("≤ {target:.1} MiB"),
            met: Some(self.peak <= target),
            note: format!(
                "median VmHWM of `kuport agent` ({}) once passes stopped, one fresh API server \
                 model and agent per sample: [{}] MiB{beside}; VmHWM when /readyz first answered \
                 [{}] MiB, VmRSS once settled [{}] MiB; first sample: {} objects created, ready \
                 after {:.1} s, settled after {:.1} s, {} passes ok, {} failed, EndpointSlices \
                 kept: {}, Programmed: {}, {} kup-* links",
                self.profile,
                of(|r| r.hwm_kib),
                of(|r| r.hwm_at_ready_kib),
                of(|r| r.rss_kib),
                first.created,
                first.ready_after.as_secs_f64(),
                first.settled_after.as_secs_f64(),
                first.passes_ok,
                first.passes_failed,
                first.slices_kept,
                first.programmed,
                first.links,
            ),
        }
    }
}

/// One sample: a fresh namespace, API server model and agent, the model holding `workload`.
fn one_run(i: usize, kuport: &Path, sim_bin: &Path, workload: Workload) -> Result<Watched> {
    let dir = TempDir(std::env::temp_dir().join(owned_name(PREFIX, &format!("mem{i}"))));
    std::fs::create_dir_all(&dir.0).with_context(|| format!("creating {}", dir.0.display()))?;
    let kubeconfig = dir.0.join("kubeconfig");
    let ns = Netns::create(PREFIX, &format!("mem{i}"))?;
    // The agent's underlay: its InternalIP on a device, so its return links can be built.
    ns.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
    ])?;
    ns.ip(&[
        "addr",
        "add",
        &format!("{}/16", internal_ip(0)),
        "dev",
        "eth0",
    ])?;
    ns.ip(&["link", "set", "eth0", "up"])?;
    ns.ip(&["link", "set", "eth0p", "up"])?;

    let mut sim = {
        let mut cmd = ns.command(sim_bin);
        cmd.args([
            "serve",
            "--listen",
            API,
            "--history",
            "100000",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(log_file(&dir.0, "sim")?);
        Proc::spawn(cmd, "kuport-sim serve")?
    };
    let created = match ns.run("populate", move || populate(workload)) {
        Ok(c) => c,
        Err(e) => {
            sim.check_running()?;
            return Err(e.context(tail(&dir.0, "sim")));
        }
    };

    let started = Instant::now();
    let mut agent = {
        let mut cmd = ns.command(kuport);
        cmd.args(["agent", "--node-name", AGENT_NODE, "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--health-addr", HEALTH, "--metrics-addr", METRICS])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log_file(&dir.0, "agent")?);
        Proc::spawn(cmd, "kuport agent")?
    };
    let mut watched = watch_agent(&ns, &mut agent, &mut sim, started)
        .map_err(|e| e.context(tail(&dir.0, "agent")))?;
    watched.created = created;
    watched.links = count_links(&ns);
    // No graceful teardown (seconds for hundreds of links): deleting the namespace removes it all.
    agent.stop(Duration::ZERO);
    sim.stop(Duration::ZERO);
    // The memory measured is that of an agent forwarding to pods across its links: one that
    // refused every endpoint (no pod network) would measure a smaller agent, not this one.
    if watched.links == 0 {
        bail!(
            "the agent built no return link (Programmed: {}): the workload is not the one measured",
            watched.programmed
        );
    }
    Ok(watched)
}

fn log_file(dir: &Path, name: &str) -> Result<File> {
    let path = dir.join(format!("{name}.log"));
    File::create(&path).with_context(|| format!("creating {}", path.display()))
}

/// The last lines of a process's log, for an error.
fn tail(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(15);
    format!(
        "last lines of the {name} log:\n{}",
        lines[from..].join("\n")
    )
}

/// The bins directory says which build the agent is.
fn agent_profile(kuport: &Path) -> String {
    kuport.parent().and_then(Path::file_name).map_or_else(
        || "unknown build".to_owned(),
        |p| format!("{} build", p.to_string_lossy()),
    )
}

fn node_name(i: usize) -> String {
    format!("node-{i:03}")
}

fn internal_ip(i: usize) -> String {
    format!("100.64.{}.{}", i / 250, 1 + i % 250)
}

/// A client of the model at [`API`], once it listens (within 20 s).
async fn api_client() -> Result<kube::Client> {
    let addr: SocketAddr = API.parse().context("parsing the API address")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            bail!("kuport-sim did not listen on {API} within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = format!("http://{API}")
        .parse()
        .context("parsing the API URL")?;
    let client =
        kube::Client::try_from(kube::Config::new(url)).context("building the Kubernetes client")?;
    Ok(client)
}

/// Creates the class `public` on the agent's node and lands every pod node's link claim in its
/// status; returns how many objects it created.
async fn create_class(client: &kube::Client) -> Result<usize> {
    let spec = json!({"nodes": nodes_json(&[(AGENT_NODE, &["eth0"])]),
                      "ports": {"min": 1024, "max": 65535},
                      "namespaceSelector": {"matchLabels": {"tier": "public"}},
                      // The pods' addresses (`mapping`): an endpoint outside every pod network
                      // is never used, and then no link is built.
                      "podNetworks": ["10.100.0.0/16"],
                      "returnPath": vxlan_return_path(10000, 4790, "169.254.0.0/20")});
    let class: PortMapClass = serde_json::from_value(objects::class("public", spec).object())
        .context("building the PortMapClass")?;
    let count = create_all(&Api::all(client.clone()), vec![class], |_| None).await?;
    // Every pod node's agent would have claimed its pair with the agent's node; only this
    // one agent runs, so the claims are written as landed.
    let links: Vec<serde_json::Value> = (1..NODES)
        .map(|i| {
            let base = 2 * i as u32;
            let subnet = format!("169.254.{}.{}/31", base / 256, base % 256);
            link_claim(&format!("{AGENT_NODE}/{}", node_name(i)), i, &subnet)
        })
        .collect();
    Api::<PortMapClass>::all(client.clone())
        .patch_status(
            "public",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"links": links}})),
        )
        .await
        .context("landing the link claims in the class status")?;
    Ok(count)
}

/// Creates every object; returns how many. Runs inside the namespace.
fn populate(workload: Workload) -> Result<usize> {
    let annotation = workload.annotation;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = api_client().await?;
        let mut count = 0;

        let namespaces: Vec<Namespace> = (0..NAMESPACES)
            .map(|k| {
                let ns = objects::namespace(&format!("ns-{k}"), json!({"tier": "public"}));
                serde_json::from_value(ns)
            })
            .collect::<Result<_, _>>()
            .context("building Namespaces")?;
        count += create_all(&Api::all(client.clone()), namespaces, |_| None).await?;

        let nodes: Vec<Node> = (0..NODES)
            .map(|i| {
                serde_json::from_value(objects::node(&node_name(i), Some(&internal_ip(i)), true))
            })
            .collect::<Result<_, _>>()
            .context("building Nodes")?;
        count += create_all(&Api::all(client.clone()), nodes, |_| None).await?;

        count += create_class(&client).await?;

        let mut portmaps = Vec::new();
        let mut slices = Vec::new();
        let mut portmaps_extra = Vec::new();
        // The agent's own node delivers only to its own Pods: those of its endpoints exist.
        count += create_own_pods(&client).await?;
        for j in 0..PORTMAPS {
            let (mut pm, slice) = mapping(j)?;
            if annotation > 0 {
                pm.metadata.annotations = Some(
                    [(
                        "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                        last_applied(j, annotation),
                    )]
                    .into(),
                );
            }
            portmaps.push(pm);
            slices.push(slice);
        }
        let c = client.clone();
        count += create_all(&Api::<PortMap>::all(client.clone()), portmaps, move |o| {
            Some(Api::namespaced(c.clone(), o.metadata.namespace.as_deref()?))
        })
        .await?;
        if let Some(Referred(referred)) = workload.slices {
            slices.extend(bulk(referred, &mut portmaps_extra)?);
        }
        let c = client.clone();
        count += create_all(
            &Api::<EndpointSlice>::all(client.clone()),
            slices,
            move |o| Some(Api::namespaced(c.clone(), o.metadata.namespace.as_deref()?)),
        )
        .await?;
        let c = client.clone();
        count += create_all(
            &Api::<PortMap>::all(client.clone()),
            portmaps_extra,
            move |o| Some(Api::namespaced(c.clone(), o.metadata.namespace.as_deref()?)),
        )
        .await?;
        Ok(count)
    })
}

/// The bulk EndpointSlices, and (`referred`) the PortMap referring to their Service, pushed to
/// `portmaps`: created after the slices, so the agent fetches them as it would for a PortMap
/// created later.
fn bulk(referred: bool, portmaps: &mut Vec<PortMap>) -> Result<Vec<EndpointSlice>> {
    let n = bulk_slices::count(NODES)?;
    let slices = (0..n)
        .map(|k| bulk_slices::slice(k, NODES))
        .collect::<Result<Vec<_>>>()?;
    if referred {
        let portmap = pm(bulk_slices::NAMESPACE, "bulk", "public", 4_000)
            .service(bulk_slices::SERVICE, bulk_slices::PORT_NAME);
        portmaps
            .push(serde_json::from_value(portmap.object()).context("building the bulk PortMap")?);
    }
    Ok(slices)
}

/// PortMap `j` and its EndpointSlice: alternating TCP and UDP, the pod on node `j % 500`.
/// The Pods of the endpoints on the agent's node, bound to it and running at their address (as
/// the scheduler and the kubelet would have them): the agent delivers only to its own Pods.
async fn create_own_pods(client: &kube::Client) -> Result<usize> {
    let mut count = 0;
    for j in (0..PORTMAPS).filter(|j| node_name(j % NODES) == AGENT_NODE) {
        let (namespace, name) = (format!("ns-{}", j % NAMESPACES), format!("pm-{j:04}-0"));
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
        let pod = objects::bound_pod(&name, &name, AGENT_NODE, json!({"name": "c", "image": "x"}));
        let pod = serde_json::from_value(pod).with_context(|| format!("building Pod {name}"))?;
        api.create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating Pod {namespace}/{name}"))?;
        let ip = endpoint_address(j);
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("writing the status of Pod {namespace}/{name}"))?;
        count += 1;
    }
    Ok(count)
}

/// The address of mapping `j`'s endpoint.
fn endpoint_address(j: usize) -> String {
    format!("10.100.{}.{}", j / 250, 1 + j % 250)
}

fn mapping(j: usize) -> Result<(PortMap, EndpointSlice)> {
    let namespace = format!("ns-{}", j % NAMESPACES);
    let name = format!("pm-{j:04}");
    let protocol = if j.is_multiple_of(2) { "UDP" } else { "TCP" };
    let port = i32::try_from(2_000 + j).with_context(|| format!("the port of {name}"))?;
    let portmap = pm(&namespace, &name, "public", port).protocol(protocol);
    let pm = serde_json::from_value(portmap.object())
        .with_context(|| format!("building PortMap {name}"))?;
    let pod = endpoint(&endpoint_address(j), &node_name(j % NODES))
        .ready(true)
        .pod(&namespace, &format!("{name}-0"));
    let slice = slice(&namespace, &format!("{name}-x"), &name)
        .port("game", protocol, 7_000 + j)
        .endpoint(pod);
    let slice = serde_json::from_value(slice.object())
        .with_context(|| format!("building the EndpointSlice of {name}"))?;
    Ok((pm, slice))
}

/// A last-applied-configuration of about `bytes` bytes: a JSON object whose padding differs per
/// PortMap (no two annotations share their text, as no two real objects would).
fn last_applied(j: usize, bytes: usize) -> String {
    let head = format!(
        "{{\"apiVersion\":\"kuport.wlz.li/v1alpha1\",\"kind\":\"PortMap\",\"metadata\":{{\"name\":\"pm-{j:04}\",\"annotations\":{{\"note\":\""
    );
    let tail = "\"}}}";
    let pad = bytes.saturating_sub(head.len() + tail.len());
    let mut text = String::with_capacity(bytes);
    text.push_str(&head);
    text.extend((0..pad).map(|k| char::from(b'a' + ((j + k) % 26) as u8)));
    text.push_str(tail);
    text
}

/// Creates `objects` with a few requests in flight; `scoped` gives the namespaced API of an
/// object (None: `api`).
async fn create_all<K>(
    api: &Api<K>,
    objects: Vec<K>,
    scoped: impl Fn(&K) -> Option<Api<K>>,
) -> Result<usize>
where
    K: kube::Resource<DynamicType: Default>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let n = objects.len();
    futures_util::stream::iter(objects.into_iter().map(|o| {
        let api = scoped(&o).unwrap_or_else(|| api.clone());
        async move {
            let name = o.meta().name.clone().unwrap_or_default();
            api.create(&PostParams::default(), &o)
                .await
                .with_context(|| format!("creating {} {name}", K::kind(&Default::default())))
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;
    Ok(n)
}

struct Watched {
    created: usize,
    links: usize,
    /// VmHWM when `/readyz` first answered 200 (the first pass done, status writes pending).
    hwm_at_ready_kib: u64,
    ready_after: Duration,
    settled_after: Duration,
    hwm_kib: u64,
    rss_kib: u64,
    slices_kept: String,
    passes_ok: u64,
    passes_failed: u64,
    programmed: String,
}

/// Waits for readiness, then for passes to stop; reads the agent's memory.
fn watch_agent(ns: &Netns, agent: &mut Proc, sim: &mut Proc, started: Instant) -> Result<Watched> {
    let pid = agent.pid();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let ready_deadline = started + Duration::from_secs(90);
    loop {
        agent.check_running()?;
        sim.check_running()?;
        if ns
            .run("readyz", || get(HEALTH, "/readyz"))
            .is_ok_and(|(status, _)| status == 200)
        {
            break;
        }
        if Instant::now() > ready_deadline {
            bail!("the agent was not ready within 90 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // `ip netns exec` execs the agent in place: the pid must be the agent's own by now.
    let comm_now = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm_now.trim() != "kuport" {
        bail!(
            "pid {pid} is {:?} (was {:?}), not the agent",
            comm_now.trim(),
            comm.trim()
        );
    }
    let ready_after = started.elapsed();
    let at_ready = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let settle_deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (u64::MAX, Instant::now());
    let metrics = loop {
        agent.check_running()?;
        let (status, text) = ns.run("metrics", || get(METRICS, "/metrics"))?;
        if status != 200 {
            bail!("/metrics answered {status}");
        }
        let ok = sum_series(&text, "kuport_passes_total", "result=\"ok\"");
        if ok != last.0 {
            last = (ok, Instant::now());
        } else if ok > 0 && last.1.elapsed() >= QUIET {
            break text;
        }
        if Instant::now() > settle_deadline {
            bail!(
                "the agent's passes did not stop within 60 s of readiness ({ok} passes; {})",
                dirtying_events(&text)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let programmed = metrics
        .lines()
        .filter(|l| l.starts_with("kuport_mappings{") && l.contains("condition=\"Programmed\""))
        .map(|l| l.trim_start_matches("kuport_mappings"))
        .collect::<Vec<_>>()
        .join(" ");
    Ok(Watched {
        created: 0,
        links: 0,
        hwm_at_ready_kib: status_kib(&at_ready, "VmHWM")?,
        ready_after,
        settled_after: started.elapsed(),
        hwm_kib: status_kib(&status, "VmHWM")?,
        rss_kib: status_kib(&status, "VmRSS")?,
        passes_ok: sum_series(&metrics, "kuport_passes_total", "result=\"ok\""),
        passes_failed: sum_series(&metrics, "kuport_passes_total", "result=\"failed\""),
        // An agent without the series (before it kept only referred-to slices) says so.
        slices_kept: metrics
            .lines()
            .find_map(|l| l.strip_prefix("kuport_endpoint_slices_kept "))
            .unwrap_or("not exported")
            .to_owned(),
        programmed,
    })
}

/// What woke an agent that does not settle: the watch events that marked it dirty, by kind.
fn dirtying_events(metrics: &str) -> String {
    let woke: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("kuport_watch_events_total{") && l.contains("\"pass\""))
        .collect();
    woke.join(", ")
}

fn count_links(ns: &Netns) -> usize {
    ns.run("links", || {
        let out = std::process::Command::new("ip")
            .args(["-br", "link"])
            .output()
            .context("listing links")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(kuport_core::ir::LINK_PREFIX))
            .count())
    })
    .unwrap_or(0)
}

/// A plain HTTP/1.0 GET: status and body.
fn get(addr: &str, path: &str) -> Result<(u16, String)> {
    let sa: SocketAddr = addr.parse().context("parsing an address")?;
    let mut stream = TcpStream::connect_timeout(&sa, Duration::from_secs(1))
        .with_context(|| format!("connecting to {addr}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .context("setting a read timeout")?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .with_context(|| format!("requesting {path}"))?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .with_context(|| format!("reading the answer to {path}"))?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no HTTP status in the answer to {path}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Ok((status, body))
}

/// Sum of the samples of `metric` whose labels contain `label`.
fn sum_series(text: &str, metric: &str, label: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kib(status: &str, field: &str) -> Result<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in /proc/<pid>/status"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_metrics() {
        let status = "Name:\tkuport\nVmHWM:\t   41234 kB\nVmRSS:\t   39000 kB\n";
        assert_eq!(status_kib(status, "VmHWM").unwrap(), 41_234);
        assert_eq!(status_kib(status, "VmRSS").unwrap(), 39_000);
        let metrics = "# HELP kuport_passes Passes\nkuport_passes_total{result=\"ok\"} 7\n\
                       kuport_passes_total{result=\"failed\"} 1\n";
        assert_eq!(
            sum_series(metrics, "kuport_passes_total", "result=\"ok\""),
            7
        );
        assert_eq!(
            sum_series(metrics, "kuport_passes_total", "result=\"failed\""),
            1
        );
    }

    #[test]
    fn the_annotation_is_json_of_the_size_asked_for() {
        let text = last_applied(7, ANNOTATION_BYTES);
        assert_eq!(text.len(), ANNOTATION_BYTES);
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["metadata"]["name"], "pm-0007");
        assert_ne!(text, last_applied(8, ANNOTATION_BYTES));
    }

    #[test]
    fn every_mapping_builds() {
        for j in [0, 1, 499, 999] {
            mapping(j).unwrap();
        }
    }
}
