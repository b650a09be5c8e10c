//! The `kuport.wlz.li/v1alpha1` API: `PortMapClass` (cluster-scoped, the administrator's),
//! `PortMap` (namespaced, the workload's) and `PortMapNode` (cluster-scoped, one per node,
//! written by that node's agent). These types are the source of truth; the YAML in
//! `crds/` is generated from them.

mod class;
mod node;
mod portmap;
mod preflight;

pub use class::{
    ClassNode, ClassNodeStatus, CniInfo, DEFAULT_PORTS_PER_NAMESPACE, DEFAULT_SYSTEM_RESERVED,
    HeldPort, LinkClaim, LinkEndStatus, NamespacePorts, NodeCheck, PortMapClass, PortMapClassSpec,
    PortMapClassStatus, PortSpan, PortWindow, RefusedMapping, ReturnPath, ReturnPathMode,
    ServingMode, VxlanSettings,
};
pub use node::{MAX_NODE_CLASSES, NodeClassRow, PortMapNode, PortMapNodeSpec};
pub use portmap::{
    EndpointStatus, PortMap, PortMapSpec, PortMapStatus, Protocol, PublishedAddress, ServiceRef,
};
pub use preflight::{
    PREFLIGHT_ANNOTATION, PREFLIGHT_CLOCK_SKEW_SECONDS, PREFLIGHT_DEADLINE_ANNOTATION,
    PREFLIGHT_UNDATED_LIFETIME_SECONDS, PreflightLife, is_preflight, preflight_life,
};

/// The API group of every kind.
pub const GROUP: &str = "kuport.wlz.li";
/// The API version of every kind.
pub const VERSION: &str = "v1alpha1";

/// Lowest TCP/UDP port, and the default `ports.min` of a class.
pub const MIN_PORT: i32 = 1;
/// Highest TCP/UDP port, and the default `ports.max` of a class.
pub const MAX_PORT: i32 = 65535;
/// Highest VXLAN network identifier (24 bits).
pub const MAX_VNI: i32 = 16_777_215;
/// Default base VNI of a class's links.
pub const DEFAULT_VXLAN_VNI: i32 = 4242;
/// Default UDP port of a class's links (the IANA VXLAN port 4789 plus one, to stay clear of
/// CNIs that use 4789; Cilium uses 8472).
pub const DEFAULT_VXLAN_PORT: i32 = 4790;
/// Default link address space: link-local, so no other route is touched.
pub const DEFAULT_VXLAN_SUBNET: &str = "169.254.77.0/24";
/// Default IPv6 prefix of the links' inner IPv6 addresses (a unique local prefix: "kp" in its
/// global ID); each end's IPv4 link address is its low 32 bits.
pub const DEFAULT_VXLAN_SUBNET6: &str = "fd6b:7570::/96";
/// The interface names kuport accepts, as a schema pattern: the kernel's rules (1 to 15 bytes,
/// no `/`, `:` or whitespace, not `.` or `..`) narrowed to characters nft reads literally inside
/// a quoted name (no quote, backslash or `*` wildcard) and no leading dot.
pub const INTERFACE_NAME_PATTERN: &str = "^[A-Za-z0-9_@+-][A-Za-z0-9._@+-]{0,14}$";

/// True when `name` matches [`INTERFACE_NAME_PATTERN`].
pub fn valid_interface_name(name: &str) -> bool {
    let allowed = |b: u8, first: bool| {
        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'@' | b'+' | b'-') || (!first && b == b'.')
    };
    let bytes = name.as_bytes();
    (1..=15).contains(&bytes.len()) && bytes.iter().enumerate().all(|(i, b)| allowed(*b, i == 0))
}

/// The class annotation that releases held-port claims for good: an RFC 3339 time; each
/// accepting node drops the claims in its row whose holder has been gone since that time or
/// earlier. Only whoever may edit the cluster-scoped class (the administrator) can set it.
pub const RELEASE_HELD_PORTS_ANNOTATION: &str = "kuport.wlz.li/release-held-ports";

/// The names of the node checks agents report in their class rows (`status.nodes[].checks`).
pub mod checks {
    /// `net.ipv4.ip_forward` is 1.
    pub const IP_FORWARD: &str = "ipForward";
    /// `net.ipv6.conf.all.forwarding` is 1, on a node that serves IPv6 mappings.
    pub const IPV6_FORWARD: &str = "ipv6Forward";
    /// The effective `rp_filter` of kuport's links is not strict.
    pub const RP_FILTER: &str = "rpFilter";
    /// `src_valid_mark` is 1 on the interfaces that capture mapped ports.
    pub const SRC_VALID_MARK: &str = "srcValidMark";
    /// The Node's InternalIP is an address of a device that is up.
    pub const INTERNAL_IP: &str = "internalIP";
    /// The class's link port differs from the CNI's overlay port.
    pub const CNI_OVERLAY_PORT: &str = "cniOverlayPort";
    /// The CNI routes pod traffic through the host's netfilter (not BPF host routing).
    pub const CNI_HOST_ROUTING: &str = "cniHostRouting";
}

/// The condition types kuport writes, and the condition statuses, spelled once.
pub mod conditions {
    /// A PortMap's admission.
    pub const ACCEPTED: &str = "Accepted";
    /// A PortMap's datapath on every node that must carry it.
    pub const PROGRAMMED: &str = "Programmed";
    /// A PortMapClass's usability (and a Node's readiness).
    pub const READY: &str = "Ready";
    /// A condition that holds.
    pub const TRUE: &str = "True";
    /// A condition that does not hold.
    pub const FALSE: &str = "False";

    /// `True` or `False`.
    pub fn status(holds: bool) -> &'static str {
        if holds { TRUE } else { FALSE }
    }
}
