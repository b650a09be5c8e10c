//! Test support shared by kuport's tests, benches, lab and simulator, so each helper exists
//! once (not published; the agent's crates use it only as a dev-dependency):
//!
//! - [`objects`]: Nodes, Namespaces, PortMaps, classes, EndpointSlices and the agent's
//!   DaemonSet as JSON, and [`cluster`], a snapshot builder for plan tests on top of them;
//! - [`netns`] and [`process`]: guards that delete the namespaces and stop the processes a test
//!   or the lab started, by name and pid, when dropped (also when a test fails), and commands
//!   run to completion;
//! - [`fs::write_atomically`]: files replaced whole;
//! - [`wait`]: waiting on a condition with a deadline;
//! - [`conntrack`]: a namespace's conntrack table filled with entries written over ctnetlink,
//!   for the sweep's kernel test and bench;
//! - [`bins`]: kuport's binaries from the running build, among them `kuport-echo`, the
//!   responder and prober of the kernel tests and the lab (`src/bin/kuport-echo.rs`);
//! - [`link_probes`]: a forger of the agent's link probe answers, and the prober as it matched
//!   answers before nonces (`kuport-echo forge-probes` and `old-probe`).

pub mod bins;
pub mod cluster;
pub mod conntrack;
pub mod fs;
pub mod link_probes;
pub mod netns;
pub mod objects;
pub mod process;
pub mod wait;
