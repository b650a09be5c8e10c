//! The `kuport` command: the node agent and its offline tools.

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod crds;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kuport: {err:#}");
            ExitCode::from(1)
        }
    }
}
