//! Condition reasons and the outcome of one condition.

use serde::{Deserialize, Serialize};

/// Reasons of a PortMap's `Accepted` condition, in the order they are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AcceptedReason {
    /// Every check passed.
    Valid,
    /// `className` names no PortMapClass.
    ClassNotFound,
    /// `endPort < port`.
    InvalidPortRange,
    /// An interface the mapping would bind has a name the kernel or nft would refuse.
    InvalidInterfaceName,
    /// The namespace's labels do not match the class's selector.
    NamespaceNotSelected,
    /// A port of the range lies outside the class window.
    PortOutOfRange,
    /// The range contains a reserved port.
    PortReserved,
    /// The Service `serviceRef` names does not exist (no Service object and no EndpointSlice
    /// of it): the mapping holds no port until it does.
    ServiceNotFound,
    /// The range contains a port the node itself depends on: a return-link port, the CNI's
    /// overlay port, or a port a host socket, a NodePort or a hostPort holds (or held) on an
    /// accepting node.
    PortInUse,
    /// `spec.interfaces` names an interface no node of the class carries.
    InterfaceNotInClass,
    /// An earlier accepted mapping holds an overlapping port.
    PortConflict,
    /// The ports would take the namespace past its port quota in the class
    /// (`spec.ports.perNamespace`, or its entry in `spec.ports.namespaceQuotas`).
    PortQuotaExceeded,
    /// Accepted (true): a host socket on an accepting node took one of the ports after the
    /// mapping was accepted; the mapping keeps it (earliest wins) and the message names the socket.
    PortAlsoHeldByHost,
}

/// Reasons of a PortMap's `Programmed` condition, in gate order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ProgrammedReason {
    /// Every gate passed.
    AllNodesReady,
    /// The named port has no ready endpoint.
    NoReadyEndpoint,
    /// The named port has ready endpoints, but none is a pod address of the cluster (outside
    /// every pod network, or a node's, loopback, link-local or kuport's own address).
    EndpointNotAllowed,
    /// A programming node is not ready, or no accepting node is.
    NodeNotReady,
    /// A range whose pod port differs from its first port.
    RangeTranslation,
    /// The pod is remote and the path back is missing or refused.
    ReturnPathUnavailable,
    /// The mapping's interfaces leave a programming node nothing to bind.
    NoInterfaceOnNode,
    /// A node at one end of a return link the mapping needs has not reported its end built at
    /// the link's current slot: its agent is missing, stopped or behind.
    NotAcknowledged,
    /// A node's probes across a return link the mapping needs found it down (no answer, or
    /// full-size probes lost while small ones pass); the message names both nodes and the check.
    ReturnLinkDown,
    /// A node's kernel refused the mapping's nftables rules or the return link it uses; the
    /// message carries the kernel's words. Every other mapping on that node is programmed.
    HostRefused,
}

/// Reasons of a PortMapClass's `Ready` condition, in check order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ClassReason {
    /// The class is usable.
    Valid,
    /// `returnPath.vxlan.subnet` is not a usable IPv4 CIDR.
    InvalidSubnet,
    /// Another Vxlan class's VNI range or subnet overlaps this one's.
    ReturnPathOverlap,
    /// The link port equals the CNI's VXLAN port.
    VxlanPortConflict,
    /// A needed node pair has no claim and no /31 is free.
    SubnetExhausted,
    /// A preflight class whose deadline passed: it needs no link, and its links are taken
    /// down.
    PreflightExpired,
}

macro_rules! reason_names {
    ($ty:ty { $($variant:ident),* $(,)? }) => {
        impl $ty {
            /// Every reason, in declaration order: the list docs and metrics enumerate. The
            /// `match` in `as_str` names the same variants, so a variant missing here does not
            /// compile.
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];

            /// The reason as written in the condition.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => stringify!($variant)),* }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

reason_names!(AcceptedReason {
    Valid,
    ClassNotFound,
    InvalidPortRange,
    InvalidInterfaceName,
    NamespaceNotSelected,
    PortOutOfRange,
    PortReserved,
    ServiceNotFound,
    PortInUse,
    InterfaceNotInClass,
    PortConflict,
    PortQuotaExceeded,
    PortAlsoHeldByHost,
});
reason_names!(ProgrammedReason {
    AllNodesReady,
    NoReadyEndpoint,
    EndpointNotAllowed,
    NodeNotReady,
    RangeTranslation,
    ReturnPathUnavailable,
    NoInterfaceOnNode,
    NotAcknowledged,
    ReturnLinkDown,
    HostRefused,
});
reason_names!(ClassReason {
    Valid,
    InvalidSubnet,
    ReturnPathOverlap,
    VxlanPortConflict,
    SubnetExhausted,
    PreflightExpired,
});

/// Whether a condition's message is written out ([`super::Detail`]): a pass writes the
/// sentences only of the mappings whose status its node writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Say(pub bool);

impl Say {
    /// `sentence()` when messages are written, else an empty message.
    pub fn message(self, sentence: impl FnOnce() -> String) -> String {
        if self.0 { sentence() } else { String::new() }
    }

    /// True when messages are written.
    pub fn says(self) -> bool {
        self.0
    }
}

/// The computed value of one condition: true only for the success reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome<R> {
    /// The reason.
    pub reason: R,
    /// A full sentence naming the objects involved; empty on success.
    pub message: String,
}

impl<R> Outcome<R> {
    /// An outcome with a message.
    pub fn new(reason: R, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

impl Outcome<AcceptedReason> {
    /// True when the mapping is accepted.
    pub fn is_true(&self) -> bool {
        matches!(
            self.reason,
            AcceptedReason::Valid | AcceptedReason::PortAlsoHeldByHost
        )
    }
}

impl Outcome<ProgrammedReason> {
    /// True when the mapping is programmed everywhere it should be.
    pub fn is_true(&self) -> bool {
        self.reason == ProgrammedReason::AllNodesReady
    }
}

impl Outcome<ClassReason> {
    /// True when the class is ready.
    pub fn is_true(&self) -> bool {
        self.reason == ClassReason::Valid
    }
}
