//! The host layer's errors, and the step of an apply each belongs to (errors and metrics name
//! the step).

/// Errors of the host layer, naming the object and the operation.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// `nft` refused or could not be run.
    #[error("nftables: {op}: {detail}")]
    Nft {
        /// What was being done.
        op: &'static str,
        /// What nft said.
        detail: String,
    },
    /// A netlink request failed.
    #[error("netlink: {op} {object}: {source}")]
    Netlink {
        /// The step of the apply it belongs to.
        stage: HostStage,
        /// What was being done.
        op: &'static str,
        /// The object.
        object: String,
        /// The error.
        source: rtnetlink::Error,
    },
    /// A VXLAN link could not be created because another device holds its VNI and port.
    #[error("link {link}: VNI {vni} with UDP port {port} is already used by device {holder}")]
    VniHeld {
        /// The link kuport wanted.
        link: String,
        /// Its VNI.
        vni: u32,
        /// Its port.
        port: u16,
        /// The device holding them.
        holder: String,
    },
    /// Something the IR depends on is not on the host.
    #[error("{what}")]
    Missing {
        /// The step of the apply it belongs to.
        stage: HostStage,
        /// What is missing.
        what: String,
    },
    /// A host fact could not be read.
    #[error("reading host facts: {detail}")]
    Facts {
        /// What failed.
        detail: String,
    },
    /// The netlink socket could not be opened.
    #[error("netlink: opening a socket: {0}")]
    Socket(std::io::Error),
}

/// The steps of an apply (and the facts read before it), as errors and metrics name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostStage {
    /// Reading the host facts.
    Facts,
    /// VXLAN links (devices, addresses, MTU, sysctls).
    Links,
    /// The nftables transaction.
    Nftables,
    /// ip rules.
    Rules,
    /// Routes.
    Routes,
}

impl HostError {
    /// The step of the apply this error belongs to.
    pub fn stage(&self) -> HostStage {
        match self {
            HostError::Nft { .. } => HostStage::Nftables,
            HostError::Netlink { stage, .. } | HostError::Missing { stage, .. } => *stage,
            HostError::VniHeld { .. } | HostError::Socket(_) => HostStage::Links,
            HostError::Facts { .. } => HostStage::Facts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_their_stage_by_what_failed_not_by_their_text() {
        let missing = |stage| HostError::Missing {
            stage,
            what: "link kup-x: device wt0 not present".into(),
        };
        // A missing device while writing routes is a routes failure, whatever the text says.
        assert_eq!(missing(HostStage::Routes).stage(), HostStage::Routes);
        assert_eq!(missing(HostStage::Links).stage(), HostStage::Links);
        let nft = HostError::Nft {
            op: "apply transaction",
            detail: "ip rule".into(),
        };
        assert_eq!(nft.stage(), HostStage::Nftables);
        let held = HostError::VniHeld {
            link: "kup-x".into(),
            vni: 4242,
            port: 4790,
            holder: "squat".into(),
        };
        assert_eq!(held.stage(), HostStage::Links);
        let facts = HostError::Facts {
            detail: "reading /proc/self/net/tcp".into(),
        };
        assert_eq!(facts.stage(), HostStage::Facts);
    }
}
