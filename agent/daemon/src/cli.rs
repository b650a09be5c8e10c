//! Command-line interface.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
    /// Print the CustomResourceDefinitions of PortMapClass and PortMap, generated from kuport's
    /// own types.
    ///
    /// Without --out, both CRDs are printed to standard output as one multi-document YAML
    /// stream, ready for `kubectl apply -f -`. With --out DIR, each is written to its own file
    /// (`<plural>.kuport.wlz.li.yaml`); the repository's crds/ directory is made this way.
    Crds {
        /// Write one file per kind into this directory (created when missing) instead of
        /// printing.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Print kuport's version.
    Version,
}

impl Cli {
    /// Runs the chosen subcommand.
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Crds { out: None } => {
                print!("{}", crate::crds::render_stream()?);
                Ok(())
            }
            Command::Crds { out: Some(dir) } => {
                for path in crate::crds::write_dir(&dir)? {
                    eprintln!("wrote {}", path.display());
                }
                Ok(())
            }
            Command::Version => {
                println!("kuport {}", env!("CARGO_PKG_VERSION"));
                Ok(())
            }
        }
    }
}
