//! `kuport preflight`: the installation's preconditions, checked on the cluster before the
//! first class. The cluster's own ([`cluster`]: agents ready, Pod Security, InternalIPs, the
//! link port against the CNI's) from the API server; the nodes' and every pair's by the agents
//! themselves: a preflight class (`kuport.wlz.li/preflight: "true"`) makes them build, probe
//! and report a return link between every pair, and each node's row carries its host checks
//! ([`verdict`] reads them). The class is deleted afterwards unless `--keep`, also when the run is
//! stopped by a signal ([`signals`]); a run that could not delete it (SIGKILL, a lost connection)
//! leaves a class with a deadline (`kuport.wlz.li/preflight-deadline`), after which the agents
//! take its links down and the next run replaces it.

mod cluster;
mod signals;
mod verdict;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::jiff::SignedDuration;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kuport_core::api::{
    DEFAULT_VXLAN_PORT, PREFLIGHT_ANNOTATION, PREFLIGHT_DEADLINE_ANNOTATION, PortMapClass,
    PortMapNode, PreflightLife, preflight_life,
};
use kuport_core::plan::node_rows::with_node_rows;
use serde_json::json;

use self::signals::Signals;
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
/// How long past `--timeout` the class's deadline lies: time to read the last verdicts and
/// delete it.
const DEADLINE_GRACE: Duration = Duration::from_secs(60);
/// How much longer a class kept with `--keep` lives, for inspection.
const KEPT_FOR: Duration = Duration::from_secs(15 * 60);
/// How long a replaced class may take to go.
const REPLACE_WAIT: Duration = Duration::from_secs(10);

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
    /// kuport-preflight -o yaml`): its links stay up for 15 minutes past --timeout, after which
    /// the agents take them down and the next run replaces it.
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
/// namespace matches, so no PortMap can ever be accepted by it; it expires at `deadline`.
pub fn class_object(
    nodes: &[String],
    port: u16,
    subnet: &str,
    vni: u32,
    deadline: Timestamp,
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
            "annotations": {
                PREFLIGHT_ANNOTATION: "true",
                PREFLIGHT_DEADLINE_ANNOTATION: deadline.to_string(),
            },
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
        report.problems.extend(waited.cut_short);
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
    /// Why it ended before every verdict came: a signal, or the class gone.
    cut_short: Option<String>,
}

/// The deadline of a class created now: past the wait, with time to clean up (and to inspect
/// with `--keep`).
fn deadline(args: &PreflightArgs, now: Timestamp) -> anyhow::Result<Timestamp> {
    let life = args.timeout + DEADLINE_GRACE + if args.keep { KEPT_FOR } else { Duration::ZERO };
    let life = SignedDuration::try_from(life).context("--timeout is too long")?;
    now.checked_add(life).context("--timeout is too long")
}

/// Creates the preflight class (replacing an expired one), waits for the verdicts, and deletes
/// it (unless `--keep`), also when the wait failed or a signal cut it short.
async fn test_links(
    client: &kube::Client,
    args: &PreflightArgs,
    tested: &[String],
) -> anyhow::Result<Waited> {
    let api: Api<PortMapClass> = Api::all(client.clone());
    // From here on a signal is a message: it ends the wait, and the class is deleted.
    let mut signals = Signals::catch()?;
    make_room(&api).await?;
    let class = class_object(
        tested,
        args.port,
        &args.subnet,
        args.vni,
        deadline(args, Timestamp::now())?,
    )?;
    let created = api
        .create(&PostParams::default(), &class)
        .await
        .map_err(create_error)?;
    let uid = created.metadata.uid.clone().unwrap_or_default();
    let waited = wait(&api, &uid, tested, args.timeout, &mut signals).await;
    if !args.keep {
        delete_own(&api, &uid).await;
    }
    waited.map_err(|e| ClusterUnreadable(e).into())
}

/// What a failed create of the class means: another run made it meanwhile (a usage error), or
/// the cluster refused it.
fn create_error(e: kube::Error) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.is_already_exists() || s.code == 409 => UsageError(format!(
            "PortMapClass {CLASS_NAME} was created by another kuport preflight just now"
        ))
        .into(),
        e => ClusterUnreadable(anyhow::Error::new(e).context(format!(
            "creating PortMapClass {CLASS_NAME} (the preflight needs create and delete on portmapclasses)"
        )))
        .into(),
    }
}

/// Deletes the class this run created (by its uid: never one another run made since).
async fn delete_own(api: &Api<PortMapClass>, uid: &str) {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(CLASS_NAME, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.is_conflict() => {
            eprintln!(
                "kuport: warning: PortMapClass {CLASS_NAME} was deleted or replaced by someone else before this run deleted it"
            );
        }
        Err(e) => eprintln!(
            "kuport: warning: deleting PortMapClass {CLASS_NAME}: {e}; delete it with kubectl delete portmapclass {CLASS_NAME} (the agents take its links down after its {PREFLIGHT_DEADLINE_ANNOTATION} anyway)"
        ),
    }
}

/// Makes room for the class: nothing to do when there is none; an expired preflight class
/// (its deadline passed: a run was killed or lost the cluster) is deleted; a live one, or a
/// class of that name that is not a preflight class, is refused.
async fn make_room(api: &Api<PortMapClass>) -> anyhow::Result<()> {
    let read = |e: kube::Error| {
        ClusterUnreadable(
            anyhow::Error::new(e).context(format!("reading PortMapClass {CLASS_NAME}")),
        )
    };
    let Some(existing) = api.get_opt(CLASS_NAME).await.map_err(read)? else {
        return Ok(());
    };
    let message = match replaceable(&existing, Timestamp::now()) {
        Ok(message) => message,
        Err(refusal) => return Err(UsageError(refusal).into()),
    };
    eprintln!("kuport: replacing PortMapClass {CLASS_NAME}: {message}");
    let old_uid = existing.metadata.uid.clone();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: old_uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(CLASS_NAME, &params).await {
        // Gone already, or replaced by a run as quick as this one: the create decides.
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.is_conflict() => {}
        Err(e) => {
            return Err(ClusterUnreadable(anyhow::Error::new(e).context(format!(
                "deleting the expired PortMapClass {CLASS_NAME} (the preflight needs delete on portmapclasses)"
            )))
            .into());
        }
    }
    let start = Instant::now();
    while start.elapsed() < REPLACE_WAIT {
        let current = api.get_opt(CLASS_NAME).await.map_err(read)?;
        if current.is_none_or(|c| c.metadata.uid != old_uid) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(UsageError(format!(
        "the expired PortMapClass {CLASS_NAME} is still there {}s after this run deleted it (a finalizer?): kubectl get portmapclass {CLASS_NAME} -o yaml",
        REPLACE_WAIT.as_secs()
    ))
    .into())
}

/// Whether the existing class `existing` may be replaced at `now`: `Ok` with why (its deadline
/// passed), or `Err` with why not.
fn replaceable(existing: &PortMapClass, now: Timestamp) -> Result<String, String> {
    match preflight_life(existing, now) {
        Some(PreflightLife::Expired { message }) => Ok(message),
        Some(PreflightLife::Live { until }) => {
            let until = until.map_or_else(
                || "it has no deadline".to_owned(),
                |t| format!("it stays live until {t}, after which the next run replaces it"),
            );
            Err(format!(
                "PortMapClass {CLASS_NAME} already exists: another kuport preflight is running, or a run with --keep left it ({until}); or delete it with kubectl delete portmapclass {CLASS_NAME}"
            ))
        }
        None => Err(format!(
            "PortMapClass {CLASS_NAME} already exists and is not a preflight class (no {PREFLIGHT_ANNOTATION}: \"true\"): rename it, the preflight needs that name"
        )),
    }
}

/// Reads the class every [`POLL`] until nothing more is worth waiting for
/// ([`verdict::settled`]), the class says it cannot work (`Ready` False), the time is up, the
/// class is gone (deleted, or replaced by another run), or a signal comes.
/// `class` with every node's row from its own `PortMapNode` (`node_rows`): none to read when
/// the kind is not installed (agents of a version before it write rows into the class).
async fn with_own_rows(
    api: &Api<PortMapClass>,
    mut class: PortMapClass,
) -> anyhow::Result<PortMapClass> {
    let nodes: Api<PortMapNode> = Api::all(api.clone().into_client());
    let objects = match nodes.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
        Err(e) => return Err(e).context("listing PortMapNodes (the nodes' rows)"),
    };
    with_node_rows(std::slice::from_mut(&mut class), &objects);
    Ok(class)
}

async fn wait(
    api: &Api<PortMapClass>,
    uid: &str,
    tested: &[String],
    timeout: Duration,
    signals: &mut Signals,
) -> anyhow::Result<Waited> {
    let start = Instant::now();
    let mut down_since: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let class = api
            .get_opt(CLASS_NAME)
            .await
            .with_context(|| format!("reading PortMapClass {CLASS_NAME}"))?
            .filter(|c| c.metadata.uid.as_deref() == Some(uid));
        let class = match class {
            Some(c) => Some(with_own_rows(api, c).await?),
            None => None,
        };
        let elapsed = start.elapsed();
        if class.is_none() {
            return Ok(Waited {
                class,
                elapsed,
                cut_short: Some(format!(
                    "PortMapClass {CLASS_NAME} was deleted or replaced by another run before every verdict came"
                )),
            });
        }
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
        if stuck || verdict::settled(&nodes, &pairs, &down_for) || elapsed >= timeout {
            return Ok(Waited {
                class,
                elapsed,
                cut_short: None,
            });
        }
        tokio::select! {
            () = tokio::time::sleep(POLL.min(timeout - elapsed)) => {}
            name = signals.received() => {
                return Ok(Waited {
                    class,
                    elapsed: start.elapsed(),
                    cut_short: Some(format!("interrupted ({name}) before every verdict came")),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_names_every_node_and_accepts_no_portmap() {
        let deadline: Timestamp = "2026-06-01T12:00:00Z".parse().expect("a time");
        let class = class_object(
            &["a".into(), "b".into()],
            4790,
            DEFAULT_SUBNET,
            DEFAULT_VNI,
            deadline,
        )
        .expect("class");
        assert!(kuport_core::api::is_preflight(&class));
        assert_eq!(
            preflight_life(&class, deadline),
            Some(PreflightLife::Live {
                until: Some(deadline + SignedDuration::from_secs(60))
            }),
            "it lives to its deadline (and the skew allowance)"
        );
        assert_eq!(class.spec.nodes.len(), 2);
        assert_eq!(class.spec.nodes["a"].interfaces, ["lo"]);
        assert_eq!((class.spec.ports.min, class.spec.ports.max), (1, 1));
        assert_eq!(class.spec.ports.reserved, [1]);
        assert_eq!(class.spec.return_path.vxlan.port, 4790);
    }

    #[test]
    fn only_an_expired_preflight_class_is_replaced() {
        let deadline: Timestamp = "2026-06-01T12:00:00Z".parse().expect("a time");
        let class = class_object(&["a".into()], 4790, DEFAULT_SUBNET, DEFAULT_VNI, deadline)
            .expect("class");
        let live = replaceable(&class, deadline).expect_err("live at its deadline");
        assert!(live.contains("already exists"), "{live}");
        assert!(
            live.contains("stays live until 2026-06-01T12:01:00Z"),
            "{live}"
        );
        let after = deadline + SignedDuration::from_secs(61);
        let why = replaceable(&class, after).expect("expired a minute after it");
        assert!(why.contains("expired"), "{why}");
        let mut foreign = class.clone();
        foreign.metadata.annotations = None;
        let refused = replaceable(&foreign, after).expect_err("not a preflight class");
        assert!(refused.contains("not a preflight class"), "{refused}");
    }

    #[test]
    fn a_kept_class_lives_longer() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: PreflightArgs,
        }
        let now: Timestamp = "2026-06-01T12:00:00Z".parse().expect("a time");
        let plain = Cli::parse_from(["kuport", "--timeout", "30s"]).args;
        assert_eq!(
            deadline(&plain, now).expect("a deadline").to_string(),
            "2026-06-01T12:01:30Z"
        );
        let kept = Cli::parse_from(["kuport", "--timeout", "30s", "--keep"]).args;
        assert_eq!(
            deadline(&kept, now).expect("a deadline").to_string(),
            "2026-06-01T12:16:30Z"
        );
    }

    #[test]
    fn a_subnet_must_hold_a_slot() {
        assert!(check_subnet(DEFAULT_SUBNET).is_ok());
        assert!(check_subnet("169.254.1.1/32").is_err());
        assert!(check_subnet("nonsense").is_err());
    }
}
