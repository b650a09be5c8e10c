//! kuport's kind end-to-end driver. Not built yet: this binary exists so `cargo e2e` resolves,
//! and it says so instead of pretending to test anything.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("kuport-e2e: the end-to-end driver is not built yet; nothing was run");
    ExitCode::from(2)
}
