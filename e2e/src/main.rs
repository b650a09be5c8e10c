//! `cargo e2e`: the kind end-to-end run, and the release artifacts built from `deploy/`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kuport_e2e::driver::{self, DryRun, Options, RealShell};
use kuport_e2e::{krew, local, manifests};

/// kuport's end-to-end driver and release helpers. Without a subcommand, `run`.
#[derive(Debug, Parser)]
#[command(name = "kuport-e2e", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a cluster, install kuport from crds/ and deploy/manifests/, and prove the
    /// datapath from clients outside the cluster: the pod sees the client's own address, also
    /// after the pod moved to another node; a rolling restart of the DaemonSet loses no probe;
    /// uninstalling leaves every node clean. One line per step, then `N passed, N failed`.
    /// On kind (kindnet, two workers; needs kind, kubectl and docker), or with `--cluster
    /// local` on the local cluster: real kubelets, containerd and kube-proxy in the lab's
    /// network namespaces (needs root and the binaries of e2e/controlplane/build.sh).
    Run(RunArgs),
    /// Print `kuport-<version>.yaml`: deploy/manifests/ as one stream, the image pinned to a
    /// digest.
    Bundle {
        /// `<repository>[:<tag>]@sha256:<hex>`.
        #[arg(long)]
        image: String,
    },
    /// Set `image.digest` in a chart's values.yaml (the packaged chart of a release).
    ChartDigest {
        /// `sha256:<hex>`.
        #[arg(long)]
        digest: String,
        /// The values file to rewrite in place.
        #[arg(long, default_value = "deploy/chart/values.yaml")]
        values: PathBuf,
    },
    /// Print the krew plugin manifest of a release (`kubectl kuport ...`), made from the
    /// checksum files of its CLI archives (deploy/release/cli-archive.sh writes them): one
    /// platform per archive, its download URL on the GitHub release, its SHA-256.
    KrewManifest {
        /// The release, `X.Y.Z` (its tag is `vX.Y.Z`).
        #[arg(long)]
        version: String,
        /// The GitHub repository the release is published in, `OWNER/NAME`.
        #[arg(long)]
        repository: String,
        /// The `.sha256` files of the archives, `<hex>  kuport-vX.Y.Z-<os>-<arch>.tar.gz`.
        #[arg(required = true, value_name = "SHA256_FILE")]
        checksums: Vec<PathBuf>,
    },
}

#[derive(Debug, Default, clap::Args)]
struct RunArgs {
    /// Print every command the run would execute, in order, and execute none.
    #[arg(long)]
    dry_run: bool,
    /// The kind cluster's name, or `local` for the local cluster of real kubelets in the lab's
    /// network namespaces.
    #[arg(long, default_value = "kuport-e2e")]
    cluster: String,
    /// With `--cluster local`: the agent image as an OCI archive (what
    /// deploy/image/build-local.sh writes); built from the debug binary when absent.
    #[arg(long, value_name = "FILE")]
    agent_image: Option<PathBuf>,
    /// With `--cluster local`: the pod network, `kindnet` (the bridge plugin on each node's
    /// range) or real Cilium built from source by e2e/cilium/build.sh, `cilium-tunnel` (VXLAN
    /// on 8472) or `cilium-native` (the pod ranges routed over the mesh).
    #[arg(long, default_value = "kindnet", value_parser = local::CNIS)]
    cni: String,
    /// The agent image to test (built from the Dockerfile under this name unless
    /// --image-archive is given).
    #[arg(long, default_value = "kuport-agent:e2e")]
    image: String,
    /// A `docker save` archive holding --image, loaded instead of building.
    #[arg(long, value_name = "FILE")]
    image_archive: Option<PathBuf>,
    /// Leave the cluster up afterwards.
    #[arg(long)]
    keep: bool,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kuport-e2e: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `run --cluster local`: the end-to-end steps on the local cluster.
fn run_local(args: RunArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.dry_run,
        "--dry-run prints the kind run; the local run needs its cluster"
    );
    let options = local::LocalOptions {
        agent_image: args.agent_image,
        work: repo_root().join("target/e2e-local"),
        cni: args.cni,
    };
    let summary = local::run(&mut RealShell::new()?, options, args.keep)?;
    eprintln!(
        "end-to-end passed on the local cluster: the pod saw the clients' own addresses ({}); clients inside the cluster were answered from the address dialed ({}); the rolling restart answered {} of {} probes",
        summary.probes.join(", "),
        summary.inside.join("; "),
        summary.loop_answered,
        summary.loop_sent
    );
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command.unwrap_or(Command::Run(RunArgs {
        cluster: "kuport-e2e".into(),
        image: "kuport-agent:e2e".into(),
        ..RunArgs::default()
    })) {
        Command::Run(args) if args.cluster == "local" => run_local(args),
        Command::Run(args) => {
            anyhow::ensure!(
                args.cni.is_empty() || args.cni == "kindnet",
                "--cni {} needs --cluster local (kind runs kindnet)",
                args.cni
            );
            let options = Options {
                repo: repo_root(),
                cluster: args.cluster,
                image: args.image,
                image_archive: args.image_archive,
                keep: args.keep,
            };
            if args.dry_run {
                let mut shell = DryRun {
                    print: true,
                    ..DryRun::default()
                };
                driver::run(&mut shell, &options)?;
                eprintln!("dry run: {} commands, none executed", shell.commands.len());
                return Ok(());
            }
            let summary = driver::run(&mut RealShell::new()?, &options)?;
            eprintln!(
                "end-to-end passed: the pod saw the prober's own address ({}); the rolling restart answered {} of {} probes",
                summary.probes.join(", "),
                summary.loop_answered,
                summary.loop_sent
            );
            Ok(())
        }
        Command::Bundle { image } => {
            print!(
                "{}",
                manifests::bundle(&repo_root().join("deploy/manifests"), &image)?
            );
            Ok(())
        }
        Command::ChartDigest { digest, values } => {
            let text = std::fs::read_to_string(&values)
                .with_context(|| format!("reading {}", values.display()))?;
            let updated = manifests::set_chart_digest(&text, &digest)?;
            std::fs::write(&values, updated)
                .with_context(|| format!("writing {}", values.display()))?;
            eprintln!("{}: image.digest = {digest}", values.display());
            Ok(())
        }
        Command::KrewManifest {
            version,
            repository,
            checksums,
        } => {
            print!("{}", krew_manifest(&version, &repository, &checksums)?);
            Ok(())
        }
    }
}

/// The krew manifest of release `version` from the archives' checksum files.
fn krew_manifest(version: &str, repository: &str, checksums: &[PathBuf]) -> anyhow::Result<String> {
    let mut archives = Vec::new();
    for path in checksums {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        archives.extend(krew::parse_checksums(
            &text,
            &path.display().to_string(),
            version,
        )?);
    }
    Ok(krew::manifest(version, repository, &archives)?)
}
