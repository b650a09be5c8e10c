//! `kuport-realapi`: the real control plane by hand. Starts etcd and kube-apiserver (and
//! kube-controller-manager with `--controllers`), installs the shipped CRDs unless `--no-crds`,
//! prints the admin kubeconfig's path and waits for Ctrl-C or SIGTERM, then stops everything.

use std::process::ExitCode;

use kuport_realapi::{CRD_DIR, ControlPlane, Options, binary_dir};

const USAGE: &str = "usage: kuport-realapi [--controllers a,b,...] [--no-crds]";

#[tokio::main]
async fn main() -> ExitCode {
    let mut options = Options::default();
    let mut crds = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--controllers" => match args.next() {
                Some(list) => {
                    options.controllers = list.split(',').map(str::to_owned).collect();
                }
                None => {
                    eprintln!("--controllers needs a list\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "--no-crds" => crds = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("unknown argument {other}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let bin = binary_dir();
    let cp = match ControlPlane::start(&bin, options).await {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!(
                "kuport-realapi: starting the control plane from {}: {e} (build it: just control-plane)",
                bin.display()
            );
            return ExitCode::FAILURE;
        }
    };
    if crds {
        match cp.install_crds(std::path::Path::new(CRD_DIR)).await {
            Ok(names) => eprintln!("installed {}", names.join(", ")),
            Err(e) => {
                eprintln!("kuport-realapi: installing the CRDs: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("kube-apiserver at {}; Ctrl-C stops it", cp.url());
    println!("export KUBECONFIG={}", cp.kubeconfig().display());
    // Dropping `cp` on return stops the processes, so SIGTERM must end main, not the process.
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("kuport-realapi: listening for SIGTERM: {e}");
                return ExitCode::FAILURE;
            }
        };
    tokio::select! {
        r = tokio::signal::ctrl_c() => {
            if let Err(e) = r {
                eprintln!("kuport-realapi: waiting for Ctrl-C: {e}");
                return ExitCode::FAILURE;
            }
        }
        _ = terminate.recv() => {}
    }
    eprintln!("kuport-realapi: stopping");
    drop(cp);
    ExitCode::SUCCESS
}
