//! Test support shared by kuport's tests, benches, lab and simulator, so each helper exists
//! once (not published; the agent's crates use it only as a dev-dependency):
//!
//! - [`process`]: commands run to completion, and a guard that stops the process a test or the
//!   lab started, by pid, when dropped (also when a test fails);
//! - [`bins`]: kuport's binaries from the running build, among them `kuport-echo`, the
//!   responder and prober of the kernel tests and the lab (`src/bin/kuport-echo.rs`).

pub mod bins;
pub mod process;
