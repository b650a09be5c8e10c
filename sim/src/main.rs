//! `kuport-sim`: runs the Kubernetes API server model by hand.
//!
//! `kuport-sim serve --listen 127.0.0.1:6443` serves plain HTTP without authentication, writes a
//! kubeconfig pointing at it and prints the file's path, so `kubectl --kubeconfig <path>` works.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kuport_sim::apiserver::{ApiServer, kubeconfig};
use kuport_testkit::fs::write_atomically;

#[derive(Parser)]
#[command(
    name = "kuport-sim",
    version,
    about = "kuport's Kubernetes API server model"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API server model over HTTP and write a kubeconfig for it.
    Serve {
        /// Address to listen on (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: SocketAddr,
        /// Where to write the kubeconfig (default: kuport-sim.kubeconfig in the temp directory).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Seed for uids, generated names and faults.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Changes kept for watches to resume from; older versions answer 410 Expired.
        #[arg(long, default_value_t = 1000)]
        history: usize,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Serve {
            listen,
            kubeconfig: path,
            seed,
            history,
        } => {
            let server = ApiServer::builder()
                .seed(seed)
                .history_limit(history)
                .build()
                .context("building the API server model")?;
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("listening on {listen}"))?;
            let addr = listener
                .local_addr()
                .context("reading the listening address")?;
            let path = path.unwrap_or_else(|| std::env::temp_dir().join("kuport-sim.kubeconfig"));
            // Readers poll for the kubeconfig while the server starts; a rename means they see
            // either no file or the whole file, never the empty one a truncating write leaves.
            write_atomically(&path, &kubeconfig(&format!("http://{addr}")))
                .with_context(|| format!("writing the kubeconfig {}", path.display()))?;
            println!("{}", path.display());
            eprintln!("kuport-sim: serving http://{addr} (Ctrl-C stops)");
            tokio::select! {
                served = server.serve(listener) => served.with_context(|| format!("serving on {addr}"))?,
                signal = tokio::signal::ctrl_c() => signal.context("waiting for Ctrl-C")?,
            }
            Ok(())
        }
    }
}
