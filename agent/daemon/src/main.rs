//! The `kuport` command: the node agent and its offline tools.

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod crds;
mod objects;
mod plan_cmd;
mod preflight_cmd;
mod status_cmd;

/// Exit status for input kuport cannot read (as clap uses for a bad command line).
const EXIT_BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli.run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("kuport: {err:#}");
            if err.downcast_ref::<objects::InputError>().is_some()
                || err.downcast_ref::<status_cmd::UsageError>().is_some()
            {
                ExitCode::from(EXIT_BAD_INPUT)
            } else if err
                .downcast_ref::<status_cmd::ClusterUnreadable>()
                .is_some()
            {
                ExitCode::from(status_cmd::EXIT_CLUSTER_UNREADABLE)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
