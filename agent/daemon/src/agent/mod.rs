//! `kuport agent`: the daemon every node runs.
//!
//! [`Agent`] is the runtime (watches, the pass loop, status writes); [`cmd`] is the command
//! around it (flags, logging, the real host, signals, HTTP endpoints).

mod budget;
mod clock;
pub mod cmd;
mod events;
mod failure;
pub mod health;
pub mod lifecycle;
pub mod metrics;
mod refusal;
mod relevance;
mod runtime;
mod slice_decode;
pub mod status;
mod status_task;
mod trim;

pub use clock::Clock;
pub use health::{Health, health_router, metrics_router};
pub use lifecycle::{StopAction, StopPolicy};
pub use metrics::{Metrics, Stage, WriteKind, WriteResult};
pub use runtime::{Agent, AgentConfig, AgentError, HostWatch, PassHook};
pub use status::RowsIn;
pub use tokio_util::sync::CancellationToken;
