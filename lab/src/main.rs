//! kuport's network-namespace lab. Not built yet: this binary exists so `cargo lab` resolves, and
//! it says so instead of pretending to prove anything.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("kuport-lab: the lab is not built yet (see the lab issue); nothing was run");
    ExitCode::from(2)
}
