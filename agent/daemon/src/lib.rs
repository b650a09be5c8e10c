//! The `kuport` library: the node agent's runtime, usable from the binary and from tests that
//! run several agents in one process.

pub mod agent;
