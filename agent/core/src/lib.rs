//! kuport's pure core: the API types of the two CRDs, their generated CustomResourceDefinitions,
//! and (as later work lands) the plan every agent computes and the datapath IR it emits.
//!
//! Nothing in this crate performs I/O, reads a clock or draws randomness: every input is an
//! argument, so every agent that sees the same objects computes the same result.

pub mod api;
pub mod api_docs;
pub mod crd;
pub mod ir;
pub mod keys;
pub mod plan;
pub mod render;
pub mod report;
pub mod snapshot;
pub mod summary;
pub mod text;
pub mod trace;
