//! `kuport version`: this client's version and, when it can read a cluster, the version of the
//! agent on every node, found as `kuport status` finds them (the agent Pods by label, and the
//! version each agent stamps on its class rows).
//!
//! The client part never depends on the cluster: the version is printed first and the exit
//! status is 0 even when the cluster cannot be read (said under "Agents" and on standard
//! error). Judging the cluster is `kuport status`'s job, with its exit statuses.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::agents::{AgentSelector, AgentView, agents, image_version};
use super::render::table;
use super::terminal::escape;
use super::{AgentFlags, ClusterFlags, StatusOutput, fetch, json, parse_wait};
use crate::objects::Dump;

/// Flags of `kuport version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print only the client's version; contact no cluster.
    #[arg(long)]
    pub client: bool,
    /// What to print.
    #[arg(short, long, value_enum, value_name = "FORMAT", default_value_t = StatusOutput::Text)]
    pub output: StatusOutput,
    #[command(flatten)]
    pub cluster: ClusterFlags,
    #[command(flatten)]
    pub agents: AgentFlags,
    /// How long to wait for the API server before reporting the agents as not read (`10s`,
    /// `1m`, or seconds).
    #[arg(long, value_name = "DURATION", value_parser = parse_wait, default_value = "10s")]
    pub timeout: Duration,
}

/// What `kuport version` prints; `-o json` prints it as it is.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionReport {
    pub client: ClientVersion,
    /// `None` with `--client`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<AgentVersions>,
}

/// This binary: its version and the platform it was built for (Rust's names).
#[derive(Debug, Serialize)]
pub struct ClientVersion {
    pub version: String,
    pub os: String,
    pub arch: String,
}

impl ClientVersion {
    fn this() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            os: std::env::consts::OS.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
        }
    }
}

/// The agents found in the cluster.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentVersions {
    /// Where they were looked for (`label ... in any namespace`).
    pub selector: String,
    /// Why the cluster could not be read at all; the lists below are then empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Lists the API server refused or does not have: what the versions may leave out.
    pub not_read: Vec<String>,
    /// The distinct versions, sorted: more than one means a rollout or a skew.
    pub versions: Vec<String>,
    /// One per node with an agent Pod or a class row, by node name.
    pub nodes: Vec<NodeAgent>,
}

/// One node's agent.
#[derive(Debug, Serialize)]
pub struct NodeAgent {
    pub node: String,
    /// The version its class rows carry, else its image's tag (`v` dropped); `None` when
    /// neither says.
    pub version: Option<String>,
    pub image: Option<String>,
    pub pod: Option<String>,
}

/// `0.1.0` from `v0.1.0`: the agent stamps rows without the `v` its image tags carry.
fn bare(version: &str) -> &str {
    version
        .strip_prefix('v')
        .filter(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or(version)
}

fn node_agent(a: &AgentView) -> NodeAgent {
    let from_image = a
        .image
        .as_deref()
        .map(image_version)
        .filter(|v| v != "latest" && v != "-");
    NodeAgent {
        node: a.node.clone(),
        version: a
            .version
            .clone()
            .or(from_image)
            .map(|v| bare(&v).to_owned()),
        image: a.image.clone(),
        pod: a.pod.clone(),
    }
}

/// The agents' versions in `dump`, read as `kuport status` reads the agents.
pub fn agent_versions(dump: &Dump, selector: &AgentSelector, now: Timestamp) -> AgentVersions {
    let found = agents(dump, selector, &BTreeSet::new(), now);
    let nodes: Vec<NodeAgent> = found
        .nodes
        .iter()
        .filter(|a| a.pod.is_some() || a.version.is_some())
        .map(node_agent)
        .collect();
    let versions: BTreeSet<String> = nodes.iter().filter_map(|n| n.version.clone()).collect();
    AgentVersions {
        selector: selector.describe(),
        error: None,
        not_read: dump
            .unread
            .iter()
            .map(|u| format!("{} ({})", u.what, u.why))
            .collect(),
        versions: versions.into_iter().collect(),
        nodes,
    }
}

/// The report as text: the client line, then the agents' summary and one line per node.
pub fn text(report: &VersionReport) -> String {
    let c = &report.client;
    let mut out = format!("Client: kuport {} ({}/{})\n", c.version, c.os, c.arch);
    let Some(a) = &report.agents else {
        return out;
    };
    let place = escape(&a.selector);
    if let Some(error) = &a.error {
        out.push_str(&format!("Agents: not read: {}\n", escape(error)));
        return out;
    }
    let summary = match a.versions.as_slice() {
        [] if a.nodes.is_empty() => "none found".to_owned(),
        [] => "version unknown".to_owned(),
        [one] => escape(one).into_owned(),
        many => format!(
            "{} (more than one: a rollout in progress, or version skew; see kuport status)",
            escape(&many.join(", "))
        ),
    };
    out.push_str(&format!("Agents ({place}): {summary}\n"));
    for what in &a.not_read {
        out.push_str(&format!("  not read: {}\n", escape(what)));
    }
    if !a.nodes.is_empty() {
        let dash = || "-".to_owned();
        let rows: Vec<Vec<String>> = a
            .nodes
            .iter()
            .map(|n| {
                vec![
                    escape(&n.node).into_owned(),
                    n.version
                        .as_deref()
                        .map_or_else(dash, |v| escape(v).into_owned()),
                    n.image
                        .as_deref()
                        .map_or_else(dash, |i| escape(i).into_owned()),
                ]
            })
            .collect();
        out.push_str(&table(&["NODE", "VERSION", "IMAGE"], &rows));
    }
    out
}

/// Runs `kuport version`. Exit status 0 whenever the client's version is printed; a bad
/// `--agent-selector` is a usage error (exit 2).
pub fn run(args: &VersionArgs) -> anyhow::Result<ExitCode> {
    let agents = if args.client {
        None
    } else {
        let selector = args.agents.selector()?;
        Some(read_agents(args, &selector))
    };
    if let Some(error) = agents.as_ref().and_then(|a| a.error.as_ref()) {
        eprintln!(
            "kuport: warning: could not read the agents' versions: {}",
            escape(error)
        );
    }
    let report = VersionReport {
        client: ClientVersion::this(),
        agents,
    };
    let printed = match args.output {
        StatusOutput::Text => text(&report),
        StatusOutput::Json => json(&report)?,
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(printed.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing the version to standard output")?;
    Ok(ExitCode::SUCCESS)
}

/// The agents' versions, or why they could not be read (within `--timeout`).
fn read_agents(args: &VersionArgs, selector: &AgentSelector) -> AgentVersions {
    let reading = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
        .and_then(|runtime| {
            runtime.block_on(async {
                let read = async {
                    let client = args.cluster.client().await?;
                    fetch::fetch_agents(&client, selector).await
                };
                tokio::time::timeout(args.timeout, read)
                    .await
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "the API server did not answer within {}s",
                            args.timeout.as_secs()
                        )
                    })?
            })
        });
    match reading {
        Ok(dump) => agent_versions(&dump, selector, Timestamp::now()),
        Err(e) => AgentVersions {
            selector: selector.describe(),
            error: Some(format!("{e:#}")),
            not_read: Vec::new(),
            versions: Vec::new(),
            nodes: Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(agents: Option<AgentVersions>) -> VersionReport {
        VersionReport {
            client: ClientVersion {
                version: "0.2.0".into(),
                os: "linux".into(),
                arch: "x86_64".into(),
            },
            agents,
        }
    }

    fn node(name: &str, version: Option<&str>, image: Option<&str>) -> NodeAgent {
        NodeAgent {
            node: name.into(),
            version: version.map(Into::into),
            image: image.map(Into::into),
            pod: None,
        }
    }

    fn versions(nodes: Vec<NodeAgent>, versions: &[&str]) -> AgentVersions {
        AgentVersions {
            selector: "label app.kubernetes.io/name=kuport in any namespace".into(),
            error: None,
            not_read: Vec::new(),
            versions: versions.iter().map(|v| (*v).to_owned()).collect(),
            nodes,
        }
    }

    #[test]
    fn the_client_line_comes_first_and_alone_with_client() {
        assert_eq!(text(&report(None)), "Client: kuport 0.2.0 (linux/x86_64)\n");
    }

    #[test]
    fn the_agents_are_summed_up_then_listed_by_node() {
        let a = versions(
            vec![
                node("n1", Some("0.2.0"), Some("ghcr.io/x/kuport-agent:v0.2.0")),
                node("n2", None, None),
            ],
            &["0.2.0"],
        );
        assert_eq!(
            text(&report(Some(a))),
            "Client: kuport 0.2.0 (linux/x86_64)
Agents (label app.kubernetes.io/name=kuport in any namespace): 0.2.0
NODE   VERSION   IMAGE
n1     0.2.0     ghcr.io/x/kuport-agent:v0.2.0
n2     -         -
"
        );
    }

    #[test]
    fn several_versions_or_none_or_an_unreadable_cluster_are_said() {
        let two = versions(
            vec![
                node("n1", Some("0.1.0"), None),
                node("n2", Some("0.2.0"), None),
            ],
            &["0.1.0", "0.2.0"],
        );
        assert!(
            text(&report(Some(two))).contains("0.1.0, 0.2.0 (more than one"),
            "two versions"
        );
        let none = text(&report(Some(versions(Vec::new(), &[]))));
        assert!(none.contains("): none found\n"), "{none}");
        let mut unreadable = versions(Vec::new(), &[]);
        unreadable.error = Some("connection refused\x1b[2J".into());
        let t = text(&report(Some(unreadable)));
        assert!(
            t.ends_with("Agents: not read: connection refused\\x1b[2J\n"),
            "{t}"
        );
    }

    #[test]
    fn a_version_is_read_from_the_rows_else_the_image_tag() {
        assert_eq!(bare("v0.1.0"), "0.1.0");
        assert_eq!(bare("0.1.0"), "0.1.0");
        assert_eq!(bare("vnext"), "vnext");
    }
}
