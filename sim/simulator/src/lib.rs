//! kuport's deterministic simulator: the real agent runtime (watches, plan, status writers,
//! pass loop) on N simulated nodes with in-memory hosts, against the API server model, over
//! turmoil's simulated network, with faults; invariants checked on every step and at
//! quiescence. Every random choice derives from one seed, so a failing seed replays exactly.

pub mod check;
pub mod net;
pub mod record;
pub mod scale;
pub mod scenario;
mod sync;
pub mod world;
