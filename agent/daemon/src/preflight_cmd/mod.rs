//! `kuport preflight`: the installation's preconditions, checked on the cluster before the
//! first class. The cluster's own ([`cluster`]: agents ready, Pod Security, InternalIPs, the
//! link port against the CNI's) from the API server; the nodes' and every pair's by the agents
//! themselves: a preflight class (`kuport.wlz.li/preflight: "true"`) makes them build, probe
//! and report a return link between every pair, and each node's row carries its host checks
//! ([`verdict`] reads them). The class is deleted afterwards unless `--keep`.

mod cluster;
mod verdict;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use kuport_core::api::{DEFAULT_VXLAN_PORT, PREFLIGHT_ANNOTATION, PortMapClass};
use serde_json::json;

use self::verdict::{PairState, Report};
use crate::objects::Dump;
use crate::status_cmd::agents::AgentSelector;
use crate::status_cmd::{AgentFlags, ClusterFlags, ClusterUnreadable, StatusOutput, UsageError};

/// The preflight class's name.
pub const CLASS_NAME: &str = "kuport-preflight";
/// The default link subnet: clear of the class default (169.254.77.0/24) and of kuport's
/// stand-in block (169.254.107.0/24); a /20 holds 2048 pairs, about 64 nodes.
pub const DEFAULT_SUBNET: &str = "169.254.112.0/20";
/// The default base VNI: its 2048 link ids (modulo 65536) stay clear of the class default's
/// (4242 and up).
pub const DEFAULT_VNI: u32 = 60000;
/// How often the class is read while waiting.
const POLL: Duration = Duration::from_secs(1);

/// Flags of `kuport preflight`.
#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// What to print.
    #[arg(short, long, value_enum, value_name = "FORMAT", default_value_t = StatusOutput::Text)]
    pub output: StatusOutput,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// The nodes to test (comma-separated Node names); every Node by default.
    #[arg(long, value_name = "NODE,...", value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// The link port to test (UDP): the returnPath.vxlan.port your classes will use.
    #[arg(long, value_name = "PORT", default_value_t = DEFAULT_VXLAN_PORT as u16,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// The link subnet of the preflight class; must not overlap any class's.
    #[arg(long, value_name = "CIDR", default_value = DEFAULT_SUBNET)]
    pub subnet: String,
    /// The base VNI of the preflight class; its range must not overlap any class's.
    #[arg(long, value_name = "VNI", default_value_t = DEFAULT_VNI,
          value_parser = clap::value_parser!(u32).range(1..=16_777_215))]
    pub vni: u32,
    /// How long to wait for every node's checks and every pair's verdict (`90s`, `5m`, or
    /// seconds).
    #[arg(long, value_name = "DURATION", default_value = "60s",
          value_parser = crate::status_cmd::parse_wait)]
    pub timeout: Duration,
    /// Leave the preflight class in place afterwards, for inspection (`kubectl get pmc
    /// kuport-preflight -o yaml`); delete it before the next run.
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub agents: AgentFlags,
}

/// Runs `kuport preflight`: exit 0 when every precondition passed, 1 when one failed. Errors:
/// [`ClusterUnreadable`] (exit 4) when the cluster cannot be read or the class not created,
/// [`UsageError`] (exit 2) for a command line it cannot use.
pub fn run(args: &PreflightArgs) -> anyhow::Result<ExitCode> {
    let selector = args.agents.selector()?;
    check_subnet(&args.subnet)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let report = runtime.block_on(preflight(args, &selector))?;
    let text = match args.output {
        StatusOutput::Text => verdict::text(&report),
        StatusOutput::Json => {
            let mut t = serde_json::to_string_pretty(&report).context("serialising the report")?;
            t.push('\n');
            crate::status_cmd::terminal::escape_json(&t).into_owned()
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing the report to standard output")?;
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn check_subnet(subnet: &str) -> anyhow::Result<()> {
    let holds_a_slot = subnet.split_once('/').is_some_and(|(addr, len)| {
        addr.parse::<std::net::Ipv4Addr>().is_ok() && len.parse::<u8>().is_ok_and(|l| l <= 31)
    });
    match holds_a_slot {
        true => Ok(()),
        false => Err(UsageError(format!(
            "--subnet {subnet:?} is not an IPv4 CIDR that holds a /31"
        ))
        .into()),
    }
}

/// The nodes to test: those asked for (each must exist), else every Node, sorted.
fn tested_nodes(asked: &[String], dump: &Dump) -> anyhow::Result<Vec<String>> {
    let known: Vec<String> = dump
        .snapshot
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let mut tested: Vec<String> = if asked.is_empty() {
        known.clone()
    } else {
        let unknown: Vec<&String> = asked.iter().filter(|n| !known.contains(n)).collect();
        if let Some(first) = unknown.first() {
            return Err(UsageError(format!("--nodes: no Node named {first}")).into());
        }
        asked.to_vec()
    };
    tested.sort();
    tested.dedup();
    if tested.is_empty() {
        return Err(UsageError("the cluster has no Node to test".into()).into());
    }
    Ok(tested)
}

/// The preflight class: every tested node with the interface `lo` (everywhere, so its row is
/// ready), a port window of the one port 1, itself reserved, and a namespace selector no
/// namespace matches, so no PortMap can ever be accepted by it.
pub fn class_object(
    nodes: &[String],
    port: u16,
    subnet: &str,
    vni: u32,
) -> anyhow::Result<PortMapClass> {
    let members: serde_json::Map<String, serde_json::Value> = nodes
        .iter()
        .map(|n| (n.clone(), json!({"interfaces": ["lo"]})))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "kuport.wlz.li/v1alpha1",
        "kind": "PortMapClass",
        "metadata": {
            "name": CLASS_NAME,
            "annotations": {PREFLIGHT_ANNOTATION: "true"},
            "labels": {"app.kubernetes.io/managed-by": "kuport-preflight"},
        },
        "spec": {
            "nodes": members,
            "ports": {"min": 1, "max": 1, "reserved": [1], "systemReserved": []},
            "namespaceSelector": {"matchLabels": {PREFLIGHT_ANNOTATION: "no-namespace-uses-this-class"}},
            "returnPath": {"mode": "Vxlan", "vxlan": {"port": port, "subnet": subnet, "vni": vni}},
        },
    }))
    .context("building the preflight class")
}

async fn preflight(args: &PreflightArgs, selector: &AgentSelector) -> anyhow::Result<Report> {
    let client = args.cluster.client().await.map_err(ClusterUnreadable)?;
    let dump = cluster::read(&client, selector)
        .await
        .map_err(ClusterUnreadable)?;
    let tested = tested_nodes(&args.nodes, &dump)?;
    let checked = cluster::checks(&dump, selector, &tested, args.port, Timestamp::now());
    let mut report = Report {
        ok: false,
        class: CLASS_NAME.to_owned(),
        port: args.port,
        cluster: checked.checks,
        nodes: Vec::new(),
        pairs: Vec::new(),
        problems: Vec::new(),
        not_tested: checked.links_untestable,
    };
    for c in report.cluster.iter().filter(|c| c.ok == Some(false)) {
        report.problems.push(format!("{}: {}", c.name, c.message));
    }
    if report.not_tested.is_none() {
        let waited = test_links(&client, args, &tested).await?;
        let (nodes, pairs) = verdict::evaluate(waited.class.as_ref(), &tested);
        let not_ready = verdict::class_not_ready(waited.class.as_ref());
        report.problems.extend(verdict::problems(
            CLASS_NAME,
            not_ready.as_deref(),
            &nodes,
            &pairs,
            args.port,
            waited.elapsed,
        ));
        if waited.interrupted {
            report
                .problems
                .push("interrupted before every verdict came".to_owned());
        }
        report.nodes = nodes;
        report.pairs = pairs;
    }
    report.ok = report.problems.is_empty();
    Ok(report)
}

/// What the wait ended with.
struct Waited {
    class: Option<PortMapClass>,
    elapsed: Duration,
    interrupted: bool,
}

/// Creates the preflight class, waits for the verdicts, and deletes it (unless `--keep`), even
/// when the wait failed.
async fn test_links(
    client: &kube::Client,
    args: &PreflightArgs,
    tested: &[String],
) -> anyhow::Result<Waited> {
    let api: Api<PortMapClass> = Api::all(client.clone());
    let existing = api
        .get_opt(CLASS_NAME)
        .await
        .with_context(|| format!("reading PortMapClass {CLASS_NAME}"))
        .map_err(ClusterUnreadable)?;
    if existing.is_some() {
        return Err(UsageError(format!(
            "PortMapClass {CLASS_NAME} already exists (left by a run with --keep, or another preflight is running): delete it first with kubectl delete portmapclass {CLASS_NAME}"
        ))
        .into());
    }
    let class = class_object(tested, args.port, &args.subnet, args.vni)?;
    api.create(&PostParams::default(), &class)
        .await
        .with_context(|| {
            format!("creating PortMapClass {CLASS_NAME} (the preflight needs create and delete on portmapclasses)")
        })
        .map_err(ClusterUnreadable)?;
    let waited = wait(&api, tested, args.timeout).await;
    if !args.keep
        && let Err(e) = api.delete(CLASS_NAME, &DeleteParams::default()).await
    {
        eprintln!(
            "kuport: warning: deleting PortMapClass {CLASS_NAME}: {e}; delete it with kubectl delete portmapclass {CLASS_NAME}"
        );
    }
    waited.map_err(|e| ClusterUnreadable(e).into())
}

/// Reads the class every [`POLL`] until nothing more is worth waiting for
/// ([`verdict::settled`]), the class says it cannot work (`Ready` False), the time is up, or the
/// user interrupts.
async fn wait(
    api: &Api<PortMapClass>,
    tested: &[String],
    timeout: Duration,
) -> anyhow::Result<Waited> {
    let start = Instant::now();
    let mut down_since: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let class = api
            .get_opt(CLASS_NAME)
            .await
            .with_context(|| format!("reading PortMapClass {CLASS_NAME}"))?;
        let (nodes, pairs) = verdict::evaluate(class.as_ref(), tested);
        let now = Instant::now();
        down_since.retain(|key, _| {
            pairs
                .iter()
                .any(|p| &p.key == key && p.state == PairState::Down)
        });
        for p in pairs.iter().filter(|p| p.state == PairState::Down) {
            down_since.entry(p.key.clone()).or_insert(now);
        }
        let down_for = down_since
            .iter()
            .map(|(k, since)| (k.clone(), now.duration_since(*since)))
            .collect();
        // Every reason a class is not Ready is about its settings or its slots: no wait cures it.
        let stuck = verdict::class_not_ready(class.as_ref()).is_some();
        let elapsed = start.elapsed();
        if stuck || verdict::settled(&nodes, &pairs, &down_for) || elapsed >= timeout {
            return Ok(Waited {
                class,
                elapsed,
                interrupted: false,
            });
        }
        tokio::select! {
            () = tokio::time::sleep(POLL.min(timeout - elapsed)) => {}
            _ = tokio::signal::ctrl_c() => {
                return Ok(Waited { class, elapsed: start.elapsed(), interrupted: true });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_names_every_node_and_accepts_no_portmap() {
        let class = class_object(&["a".into(), "b".into()], 4790, DEFAULT_SUBNET, DEFAULT_VNI)
            .expect("class");
        assert!(kuport_core::api::is_preflight(&class));
        assert_eq!(class.spec.nodes.len(), 2);
        assert_eq!(class.spec.nodes["a"].interfaces, ["lo"]);
        assert_eq!((class.spec.ports.min, class.spec.ports.max), (1, 1));
        assert_eq!(class.spec.ports.reserved, [1]);
        assert_eq!(class.spec.return_path.vxlan.port, 4790);
    }

    #[test]
    fn a_subnet_must_hold_a_slot() {
        assert!(check_subnet(DEFAULT_SUBNET).is_ok());
        assert!(check_subnet("169.254.1.1/32").is_err());
        assert!(check_subnet("nonsense").is_err());
    }
}
