//! `kuport status`: what kuport is doing in a cluster, read with the user's kubeconfig: the
//! agents on every node, every mapping, every class, and what is not working; or, for one
//! mapping, why, step by step.
//!
//! Two layers: a thin fetch ([`fetch`], the lists it names and nothing else) into a [`Dump`],
//! and the pure renderer ([`render`], [`agents`], [`explain`]) over that dump, which
//! `--objects` also feeds from recorded files. `kuport version` ([`version`]) reads the agents
//! the same way.

pub mod agents;
mod classes;
mod condition;
mod explain;
mod fetch;
pub mod render;
pub(crate) mod terminal;
pub mod version;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use k8s_openapi::jiff::Timestamp;

use self::agents::{AgentSelector, DEFAULT_AGENT_SELECTOR};
use self::render::ReportOptions;
use crate::objects::{Dump, Unread, load_dump};

/// Exit status when something is not programmed (or a class or node is not ready).
const EXIT_NOT_PROGRAMMED: u8 = 1;
/// Exit status when the mapping asked for does not exist.
const EXIT_NOT_FOUND: u8 = 3;
/// Exit status when the cluster could not be read (no kubeconfig, unreachable, refused): a
/// monitor must not take it for "something is not programmed", nor for healthy.
pub const EXIT_CLUSTER_UNREADABLE: u8 = 4;

/// A command line `kuport status` cannot use (a mapping not written `NAMESPACE/NAME`, `--wait`
/// with `--objects`); `main` exits 2 on it, as clap does for the flags it checks itself.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub(crate) String);

/// The cluster could not be read; `main` exits [`EXIT_CLUSTER_UNREADABLE`] on it.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the cluster: {0:#}")]
pub struct ClusterUnreadable(pub(crate) anyhow::Error);

/// What `kuport status` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    /// Tables and sentences for people.
    #[default]
    Text,
    /// One JSON document (the fields of the text, structured) for scripts.
    Json,
}

/// Flags of `kuport status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One mapping to explain step by step, as `NAMESPACE/NAME`; without it, everything.
    #[arg(value_name = "NAMESPACE/NAME")]
    pub target: Option<String>,
    /// What to print.
    #[arg(short, long, value_enum, value_name = "FORMAT", default_value_t = StatusOutput::Text)]
    pub output: StatusOutput,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    /// Read a recorded cluster from files instead of the API server (repeatable): what
    /// `kubectl get portmapclasses,portmaps,endpointslices,services,nodes,namespaces,events,daemonsets,pods
    /// -A -o yaml` prints, as `kuport plan --objects` reads it. Without DaemonSets and Pods the
    /// agents are reported as not read.
    #[arg(long, value_name = "FILE|DIR")]
    pub objects: Vec<PathBuf>,
    /// The current time (RFC 3339), for ages; defaults to the clock.
    #[arg(long, value_name = "RFC3339", value_parser = crate::plan_cmd::parse_now)]
    pub now: Option<Timestamp>,
    /// Read the cluster again every 2 seconds until everything asked about is programmed, for
    /// at most this long (`90s`, `5m`, or seconds); then print the last reading. The exit
    /// status is that reading's. Not with --objects.
    #[arg(long, value_name = "DURATION", value_parser = parse_wait)]
    pub wait: Option<Duration>,
    /// Only the PortMaps of this namespace (the classes and agents are still shown when
    /// readable). A user who may read PortMaps only there needs it.
    #[arg(short, long, value_name = "NAMESPACE", conflicts_with = "target")]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub agents: AgentFlags,
}

/// How the CLI reaches the cluster: the same two flags for `status`, `preflight` and `version`.
#[derive(Debug, Args)]
pub struct ClusterFlags {
    /// The kubeconfig to read the cluster with; defaults to $KUBECONFIG, then ~/.kube/config,
    /// then the in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use instead of its current one.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterFlags {
    /// A client as these flags say.
    pub(crate) async fn client(&self) -> anyhow::Result<kube::Client> {
        client_for(self.kubeconfig.as_deref(), self.context.as_deref()).await
    }
}

/// Where kuport's agents are: the same two flags for `status`, `preflight` and `version`.
#[derive(Debug, Args)]
pub struct AgentFlags {
    /// The namespace of kuport's DaemonSet and agent Pods; every namespace by default.
    #[arg(long, value_name = "NAMESPACE")]
    pub agent_namespace: Option<String>,
    /// The labels of kuport's DaemonSet and agent Pods (`key=value`, comma-separated).
    #[arg(long, value_name = "SELECTOR", default_value = DEFAULT_AGENT_SELECTOR)]
    pub agent_selector: String,
}

impl AgentFlags {
    /// The selector these flags give, or a usage error naming the flag.
    pub(crate) fn selector(&self) -> Result<AgentSelector, UsageError> {
        AgentSelector::parse(&self.agent_selector, self.agent_namespace.clone())
            .map_err(|e| UsageError(format!("--agent-selector {e}")))
    }
}

/// How often `--wait` reads the cluster again.
const WAIT_POLL: Duration = Duration::from_secs(2);

/// `90s`, `5m`, `1h` or plain seconds.
pub(crate) fn parse_wait(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        _ => {
            return Err(format!(
                "{text:?}: give seconds, or a number with s, m or h"
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?}: give seconds, or a number with s, m or h"))
}

/// Runs `kuport status`: exit 0 when nothing that could be read is wrong, 1 when something is,
/// 3 when the mapping asked for does not exist. Errors come back as `Err`: [`ClusterUnreadable`] (exit
/// 4) when the cluster cannot be read, [`UsageError`] or an input error (exit 2).
pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let target = match args.target.as_deref() {
        None => None,
        Some(t) => Some(parse_target(t)?),
    };
    let options = ReportOptions {
        namespace: args.namespace.clone(),
        agents: args.agents.selector()?,
    };
    if !args.objects.is_empty() {
        if args.wait.is_some() {
            return Err(UsageError(
                "--wait reads the cluster again and again; recorded --objects never change".into(),
            )
            .into());
        }
        let dump = load_dump(&args.objects)?;
        return finish(render_dump(args, &options, target.as_ref(), &dump)?);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let deadline = args.wait.map(|w| Instant::now() + w);
    loop {
        let reading = runtime
            .block_on(fetch::fetch(args, target.as_ref(), &options.agents))
            .map_err(ClusterUnreadable)
            .map_err(anyhow::Error::from)
            .and_then(|dump| render_dump(args, &options, target.as_ref(), &dump));
        let healthy = matches!(&reading, Ok(Reading::Found { ok: true, .. }));
        match deadline.map(|d| d.saturating_duration_since(Instant::now())) {
            Some(left) if !healthy && !left.is_zero() => std::thread::sleep(WAIT_POLL.min(left)),
            _ => return finish(reading?),
        }
    }
}

/// One reading of the cluster, rendered.
enum Reading {
    /// The text to print, whether everything asked about is programmed, and what could not be
    /// read.
    Found {
        text: String,
        ok: bool,
        unread: Vec<Unread>,
    },
    /// The mapping asked for does not exist.
    NotFound { namespace: String, name: String },
}

fn render_dump(
    args: &StatusArgs,
    options: &ReportOptions,
    target: Option<&(String, String)>,
    dump: &Dump,
) -> anyhow::Result<Reading> {
    let now = args.now.unwrap_or_else(Timestamp::now);
    let unread = dump.unread.clone();
    Ok(match target {
        None => {
            let report = render::report(dump, now, options);
            let text = match args.output {
                StatusOutput::Text => render::text(&report, now),
                StatusOutput::Json => json(&report)?,
            };
            Reading::Found {
                text,
                ok: report.ok,
                unread,
            }
        }
        Some((ns, name)) => match explain::explain(dump, ns, name, now, &options.agents) {
            None => Reading::NotFound {
                namespace: ns.clone(),
                name: name.clone(),
            },
            Some(explained) => {
                let text = match args.output {
                    StatusOutput::Text => explain::explain_text(&explained, now),
                    StatusOutput::Json => json(&explained)?,
                };
                Reading::Found {
                    text,
                    ok: explained.ok,
                    unread,
                }
            }
        },
    })
}

/// Prints a reading and gives its exit status.
fn finish(reading: Reading) -> anyhow::Result<ExitCode> {
    let (text, ok) = match reading {
        Reading::NotFound { namespace, name } => {
            eprintln!("kuport: PortMap {namespace}/{name} not found");
            return Ok(ExitCode::from(EXIT_NOT_FOUND));
        }
        Reading::Found { text, ok, unread } => {
            // Said on standard error too: a monitor that discards the report still logs that
            // it checked less than the whole cluster.
            if !unread.is_empty() {
                let what: Vec<&str> = unread.iter().map(|u| u.what.as_str()).collect();
                eprintln!(
                    "kuport: warning: could not read {}; the report says nothing about them",
                    terminal::escape(&what.join(", "))
                );
            }
            (text, ok)
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing the status to standard output")?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_NOT_PROGRAMMED)
    })
}

/// Pretty JSON; the controls JSON leaves raw (DEL, C1, bidirectional overrides) are written as
/// `\u` escapes, so the document is the same and safe to print on a terminal.
fn json<T: serde::Serialize>(value: &T) -> anyhow::Result<String> {
    let text = serde_json::to_string_pretty(value).context("serialising the status")?;
    let mut text = terminal::escape_json(&text).into_owned();
    text.push('\n');
    Ok(text)
}

fn parse_target(t: &str) -> anyhow::Result<(String, String)> {
    match t.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(UsageError(format!("{t:?} is not NAMESPACE/NAME of a PortMap")).into()),
    }
}

pub(super) async fn client(args: &StatusArgs) -> anyhow::Result<kube::Client> {
    args.cluster.client().await
}

/// A client from `kubeconfig` (else the usual places) and `context` (else its current one).
pub(crate) async fn client_for(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("loading the kubeconfig")?,
        None => kube::Config::infer()
            .await
            .context("finding a kubeconfig or an in-cluster service account")?,
    };
    kuport::kube_client(config).context("building the Kubernetes client")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_namespace_slash_name() {
        assert_eq!(
            parse_target("games/gs").ok(),
            Some(("games".to_owned(), "gs".to_owned()))
        );
        for bad in ["gs", "/gs", "games/", "a/b/c"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }
}
