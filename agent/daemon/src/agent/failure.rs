//! Why a pass failed. Each failure is typed by the stage it happened in, and [`PassError::stage`]
//! is the one place that maps it to the `stage` label of `kuport_pass_failures_total` and the
//! log line; every failure is retried the same way (backoff, and a verify owed when the pass
//! verified), so the stage decides what is reported, not what is done.

use kuport_host::{HostError, HostStage};

use super::metrics::Stage;

/// Why one pass failed.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The host facts could not be read.
    #[error("reading host facts: {0}")]
    Facts(#[source] HostError),
    /// The plan did not finish (it panicked: a bug, reported rather than crashing the agent).
    #[error("computing the plan: {0}")]
    Plan(String),
    /// The kernel refused the datapath as a whole (a part it refused alone is a refusal, not a
    /// failure).
    #[error("applying the datapath: {0}")]
    Apply(#[source] HostError),
    /// Some status writes failed, each named with its object (`writing the status of ...`).
    #[error("{}", .0.join("; "))]
    Status(Vec<String>),
}

impl PassError {
    /// The stage the pass failed in.
    pub fn stage(&self) -> Stage {
        match self {
            PassError::Facts(_) => Stage::Facts,
            PassError::Plan(_) => Stage::Plan,
            PassError::Apply(e) => Stage::from(e.stage()),
            PassError::Status(_) => Stage::Status,
        }
    }
}

impl From<HostStage> for Stage {
    fn from(stage: HostStage) -> Self {
        match stage {
            HostStage::Facts => Stage::Facts,
            HostStage::Links => Stage::Links,
            HostStage::Nftables => Stage::Nftables,
            HostStage::Rules => Stage::Rules,
            HostStage::Routes => Stage::Routes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apply_failure_is_counted_at_the_host_stage_that_failed() {
        let missing = |stage| {
            PassError::Apply(HostError::Missing {
                stage,
                what: "device wt0 not present".into(),
            })
        };
        assert_eq!(missing(HostStage::Routes).stage(), Stage::Routes);
        assert_eq!(missing(HostStage::Links).stage(), Stage::Links);
        let nft = PassError::Apply(HostError::Nft {
            op: "apply",
            detail: "refused".into(),
        });
        assert_eq!(nft.stage(), Stage::Nftables);
        // Facts read through the host are the facts stage whatever the host said.
        let facts = PassError::Facts(HostError::Missing {
            stage: HostStage::Links,
            what: "x".into(),
        });
        assert_eq!(facts.stage(), Stage::Facts);
        let status = PassError::Status(vec!["PortMap a/b: 500".into(), "c/d: 409".into()]);
        assert_eq!(status.stage(), Stage::Status);
        assert_eq!(status.to_string(), "PortMap a/b: 500; c/d: 409");
    }
}
