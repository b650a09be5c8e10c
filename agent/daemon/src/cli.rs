//! Command-line interface.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;

use crate::plan_cmd::{Output, PlanArgs};

/// kuport makes a TCP or UDP port (or range) on a node's addresses reach a pod on any node of a
/// Kubernetes cluster, with the client's own source address intact on the pod and on every
/// reply. It runs as a DaemonSet; these subcommands are the agent and its offline tools.
#[derive(Debug, Parser)]
#[command(name = "kuport", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent: watch the cluster, program this node, write the status it owns.
    ///
    /// Runs until SIGTERM or SIGINT and exits 0; a second signal exits at once (status 130). A
    /// stop keeps the datapath for the next agent to adopt (an upgrade drops no traffic), except
    /// when the DaemonSet owning the agent's Pod (--pod-name, --pod-namespace) is being deleted
    /// or is gone: then it removes everything kuport programmed on the node first. API server
    /// errors never remove anything. Every flag can also be set by the environment variable
    /// shown. See docs/operations.md.
    Agent(kuport::agent::cmd::AgentArgs),
    /// Remove everything kuport programmed on this host: the nftables table `ip kuport`, the
    /// `kup-*` links, kuport's ip rules and routes.
    ///
    /// For a node kuport was removed from while its API server could not be reached, or an
    /// agent run by hand. Stop the agent first: a running agent programs the node again. Needs
    /// NET_ADMIN (root) in the host's network namespace; contacts no API server.
    Cleanup,
    /// Print the CustomResourceDefinitions of PortMapClass and PortMap, generated from kuport's
    /// own types.
    ///
    /// Without --out, both CRDs are printed to standard output as one multi-document YAML
    /// stream, ready for `kubectl apply -f -`. With --out DIR, each is written to its own file
    /// (`<plural>.kuport.wlz.li.yaml`); the repository's crds/ directory is made this way.
    /// With --markdown, the field reference of docs/api.md is printed instead (every spec and
    /// status field with its type, default, validation and description, from the same schema);
    /// --update FILE replaces the generated section of FILE with it.
    #[command(after_help = "Examples:
  kuport crds | kubectl apply -f -
  kuport crds --out crds
  kuport crds --markdown --update docs/api.md")]
    Crds {
        /// Write one file per kind into this directory (created when missing) instead of
        /// printing.
        #[arg(long, value_name = "DIR", conflicts_with = "markdown")]
        out: Option<PathBuf>,
        /// Print the Markdown field reference generated from the CRDs instead of the CRDs.
        #[arg(long)]
        markdown: bool,
        /// With --markdown: replace the section of this file between the generated-section
        /// markers instead of printing.
        #[arg(long, value_name = "FILE", requires = "markdown")]
        update: Option<PathBuf>,
    },
    /// Compute offline the plan the agent on one node would compute, from objects on disk.
    ///
    /// Reads Kubernetes objects as `kubectl get ... -o yaml` prints them (PortMapClasses,
    /// PortMaps, EndpointSlices, Nodes, Namespaces, and the kube-system/cilium-config
    /// ConfigMap; other kinds are skipped), computes the plan for --node, and prints it. Nothing
    /// is contacted and nothing is changed.
    ///
    /// Exit status: 0 on success; 2 when an input cannot be read (a missing path, text that is
    /// not YAML or JSON, an object that does not fit its type, an invalid --facts file or
    /// --now), with a message naming the file and the problem; 1 on other errors.
    #[command(after_help = "Example:
  mkdir objects
  kubectl get portmapclasses,portmaps,endpointslices,services,nodes,namespaces -A -o yaml > objects/cluster.yaml
  kubectl -n kube-system get configmap cilium-config -o yaml > objects/cilium.yaml
  kuport plan --objects objects --node worker-1 --output text")]
    Plan {
        /// A file or directory of Kubernetes objects; repeat the flag or give several paths.
        ///
        /// A file holds one or more YAML documents (separated by `---`), `List` objects whose
        /// items are read, or JSON (files named `*.json`). A directory is searched recursively
        /// for `*.yaml`, `*.yml` and `*.json` files, read in sorted path order; entries whose
        /// names start with `.` are skipped.
        #[arg(long, value_name = "FILE|DIR", required = true, num_args = 1..)]
        objects: Vec<PathBuf>,
        /// The node whose agent the plan is computed for (its Node object's name).
        ///
        /// A name with no Node object among the objects is allowed: a warning is printed and
        /// the node programs nothing.
        #[arg(long, value_name = "NAME")]
        node: String,
        /// A YAML or JSON file of the facts only the node itself can read.
        ///
        /// `{interfaces: {<name>: <ipv4>}, underlayDevice: <name>, underlayMTU: <int>}`, every
        /// key optional: the IPv4 address of each interface the classes name, the device
        /// carrying the node's InternalIP, and its MTU. Without it no interface resolves (no
        /// address is published) and return links carry no MTU.
        #[arg(long, value_name = "FILE")]
        facts: Option<PathBuf>,
        /// The current time, as an RFC 3339 timestamp (e.g. 2026-01-01T00:00:00Z).
        ///
        /// It stamps condition transitions and link claims newly marked unused, and decides
        /// when unused claims expire. Defaults to the clock; pass it for reproducible output.
        #[arg(long, value_name = "RFC3339", value_parser = crate::plan_cmd::parse_now)]
        now: Option<Timestamp>,
        /// What to print.
        #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Output::Json)]
        output: Output,
    },
    /// Show what kuport is doing in the cluster: its agents first, then every mapping and
    /// class, and what is not working; or explain one mapping step by step.
    ///
    /// Reads the cluster with your kubeconfig (nothing is changed): kuport's DaemonSets and
    /// agent Pods (by --agent-selector), PortMapClasses, PortMaps, EndpointSlices, Nodes,
    /// Namespaces, the kube-system/cilium-config ConfigMap, and the Events about kuport's
    /// objects. It leads with the agents: each DaemonSet's desired, ready and updated counts,
    /// then one line per Node (its agent Pod ready, not ready or missing, image and version,
    /// restarts, last pass). For every mapping it prints the protocol and ports, the published
    /// addresses, the endpoint (pod and node) and Programmed with its reason, and checks the
    /// written status against what the agents compute from the current objects and against its
    /// writer's agent; for every class the accepting nodes and the return links. With
    /// NAMESPACE/NAME it explains that mapping as the agents compute it, compares that with the
    /// status written, and lists the mapping's Events.
    ///
    /// A list your RBAC refuses is left out and named under "Not read" (and on standard
    /// error); the report then never says "Everything is programmed.". Only the PortMaps are
    /// required: a user who may read them in one namespace gives -n NAMESPACE.
    ///
    /// Exit status: 0 when nothing that could be read is wrong; 1 when something is (an agent
    /// missing, not ready, stale or of another version, no kuport DaemonSet, a mapping not
    /// accepted or not programmed, a status not caught up or written by a node whose agent is
    /// not running, a class or an accepting node not ready, a node check an agent reports
    /// failing); 2 when the command line or
    /// --objects input cannot be used; 3 when the mapping asked for does not exist; 4 when
    /// the cluster cannot be read (unreachable, no credentials, the PortMaps refused).
    #[command(after_help = "Examples:
  kuport status
  kuport status -o json | jq '.problems'
  kuport status -n games --wait 2m
  kuport status games/gameserver
  kuport status --objects dump.yaml   # a recorded cluster, from
      kubectl get portmapclasses,portmaps,endpointslices,services,nodes,namespaces,events,daemonsets,pods -A -o yaml > dump.yaml")]
    Status(crate::status_cmd::StatusArgs),
    /// Check the installation's preconditions before the first class: the agents, the nodes'
    /// settings, and the link port and MTU between every pair of nodes.
    ///
    /// From the API server: kuport's DaemonSet has a ready agent on every node tested, its
    /// namespace has the Pod Security label pod-security.kubernetes.io/enforce=privileged,
    /// every node has an IPv4 InternalIP, and the link port differs from the CNI's VXLAN port
    /// (kube-system/cilium-config). Then it creates the PortMapClass kuport-preflight
    /// (annotated kuport.wlz.li/preflight: "true"; it can accept no PortMap), in which every
    /// agent builds a return link to every other node tested, probes it (full-size probes
    /// verify the link MTU) and reports its host checks (ip_forward, rp_filter, src_valid_mark,
    /// the InternalIP's device, the CNI's overlay port and host routing). It waits for every
    /// node's row and a verdict from both ends of every pair, prints one line per node and
    /// per pair, and deletes the class (unless --keep).
    ///
    /// Needs create, get and delete on portmapclasses, and list on nodes, namespaces,
    /// daemonsets and pods, and get on the ConfigMap kube-system/cilium-config.
    ///
    /// Exit status: 0 when every precondition passed; 1 when one failed (each is named); 2
    /// when the command line cannot be used or the class kuport-preflight already exists; 4
    /// when the cluster cannot be read or the class cannot be created.
    #[command(after_help = "Examples:
  kuport preflight
  kuport preflight --nodes edge-a,worker-b --port 4790 --timeout 2m
  kuport preflight -o json | jq '.problems'")]
    Preflight(crate::preflight_cmd::PreflightArgs),
    /// Print this client's version and, when it can read the cluster, the version of the agent
    /// on every node.
    ///
    /// The agents are found as `kuport status` finds them: their Pods by --agent-selector (the
    /// image), and the version each agent stamps on its PortMapClass rows. More than one
    /// version is said (a rollout in progress, or version skew). With --client, or when the
    /// cluster cannot be read within --timeout, only the client's version is printed, with a
    /// note under "Agents" and on standard error.
    ///
    /// Exit status: 0 whenever the client's version is printed, even when the cluster cannot
    /// be read (`kuport status` judges the cluster); 2 when the command line cannot be used.
    #[command(after_help = "Examples:
  kuport version
  kuport version --client
  kuport version -o json | jq -r '.agents.versions[]'")]
    Version(crate::status_cmd::version::VersionArgs),
}

impl Cli {
    /// Runs the chosen subcommand.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let done = ExitCode::SUCCESS;
        match self.command {
            Command::Agent(args) => kuport::agent::cmd::run(args).map(|()| done),
            Command::Cleanup => kuport::agent::cmd::cleanup().map(|()| done),
            Command::Crds {
                markdown: true,
                update,
                ..
            } => {
                crate::crds::markdown(update.as_deref())?;
                Ok(done)
            }
            Command::Crds { out: None, .. } => {
                print!("{}", crate::crds::render_stream()?);
                Ok(done)
            }
            Command::Crds { out: Some(dir), .. } => {
                for path in crate::crds::write_dir(&dir)? {
                    eprintln!("wrote {}", path.display());
                }
                Ok(done)
            }
            Command::Plan {
                objects,
                node,
                facts,
                now,
                output,
            } => crate::plan_cmd::run(&PlanArgs {
                objects: &objects,
                node: &node,
                facts: facts.as_deref(),
                now,
                output,
            })
            .map(|()| done),
            Command::Status(args) => crate::status_cmd::run(&args),
            Command::Preflight(args) => crate::preflight_cmd::run(&args),
            Command::Version(args) => crate::status_cmd::version::run(&args),
        }
    }
}
