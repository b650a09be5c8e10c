//! The node checks a row reports: the host's (read by the agent, [`HostFacts::node_checks`])
//! and the CNI configuration's as it bears on this class (decided here, from what the agent
//! read of `kube-system/cilium-config`). A check that cannot be decided says "not checked" and
//! why, rather than guess.

use super::state::ClassState;
use crate::api::{NodeCheck, ReturnPathMode, checks};
use crate::snapshot::{CniFacts, HostFacts};

/// The checks of this node's row in `state`'s class: the host's and the CNI's, unsorted and
/// uncut (`status` bounds them to the schema).
pub fn row_checks(state: &ClassState, cni: Option<&CniFacts>, facts: &HostFacts) -> Vec<NodeCheck> {
    facts
        .node_checks
        .iter()
        .cloned()
        .chain(cni_checks(state, cni))
        .collect()
}

fn check(name: &str, ok: Option<bool>, message: String) -> NodeCheck {
    NodeCheck {
        name: name.to_owned(),
        ok,
        message,
    }
}

/// What the CNI's configuration means for the class: its overlay port against the class's
/// link port, and whether pod traffic passes the host's netfilter (legacy host routing).
fn cni_checks(state: &ClassState, cni: Option<&CniFacts>) -> [NodeCheck; 2] {
    let Some(cni) = cni else {
        let why = "not checked: no kube-system/cilium-config was found, and kuport reads no other CNI's configuration";
        return [
            check(
                checks::CNI_OVERLAY_PORT,
                None,
                format!(
                    "{why}; the CNI's own VXLAN port (4789 on Calico, 8472 on Flannel) must differ from the link port"
                ),
            ),
            check(
                checks::CNI_HOST_ROUTING,
                None,
                format!("{why}; pod replies must pass the host's netfilter"),
            ),
        ];
    };
    let overlay = if state.mode == ReturnPathMode::None {
        check(
            checks::CNI_OVERLAY_PORT,
            None,
            "not checked: the class builds no return links (returnPath.mode None)".to_owned(),
        )
    } else {
        let port = state.class.spec.return_path.vxlan.port;
        check(
            checks::CNI_OVERLAY_PORT,
            Some(port != i32::from(cni.vxlan_port)),
            overlay_message(cni, port),
        )
    };
    [overlay, host_routing(cni)]
}

fn overlay_message(cni: &CniFacts, port: i32) -> String {
    if port == i32::from(cni.vxlan_port) {
        format!(
            "the link port {port} is the VXLAN port of {} (tunnel-port in cilium-config): choose another returnPath.vxlan.port",
            cni.name
        )
    } else {
        format!(
            "the link port {port} differs from the VXLAN port of {} ({})",
            cni.name, cni.vxlan_port
        )
    }
}

/// Whether Cilium routes pod traffic through the host's stack: `enable-host-legacy-routing`
/// as set; unset, Cilium uses BPF host routing only together with BPF masquerading (and a
/// kernel that supports it, which only the agent of Cilium knows).
fn host_routing(cni: &CniFacts) -> NodeCheck {
    let name = checks::CNI_HOST_ROUTING;
    match (cni.host_legacy_routing, cni.bpf_masquerade) {
        (Some(true), _) => check(
            name,
            Some(true),
            "cilium-config sets enable-host-legacy-routing: true: pod traffic passes the host's netfilter".to_owned(),
        ),
        (Some(false), _) => check(
            name,
            Some(false),
            "cilium-config sets enable-host-legacy-routing: false (BPF host routing): pod replies bypass the host's netfilter, so conntrack cannot return them over kuport's link; set it to true".to_owned(),
        ),
        (None, Some(true)) => check(
            name,
            None,
            "not checked: cilium-config leaves enable-host-legacy-routing unset with BPF masquerading on, so Cilium uses BPF host routing if the kernel supports it (pod replies would bypass the host's netfilter); set enable-host-legacy-routing: true to be sure".to_owned(),
        ),
        (None, _) => check(
            name,
            Some(true),
            "cilium-config leaves BPF masquerading off, so Cilium uses legacy host routing: pod traffic passes the host's netfilter".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cilium(legacy: Option<bool>, bpf_masquerade: Option<bool>) -> CniFacts {
        CniFacts {
            name: "cilium".into(),
            routing_mode: Some("tunnel".into()),
            vxlan_port: 8472,
            pod_cidrs: Vec::new(),
            host_legacy_routing: legacy,
            bpf_masquerade,
        }
    }

    #[test]
    fn host_routing_is_decided_only_from_what_the_configuration_says() {
        assert_eq!(host_routing(&cilium(Some(true), Some(true))).ok, Some(true));
        assert_eq!(host_routing(&cilium(Some(false), None)).ok, Some(false));
        let unset = host_routing(&cilium(None, Some(true)));
        assert_eq!(unset.ok, None);
        assert!(
            unset.message.starts_with("not checked"),
            "{}",
            unset.message
        );
        assert_eq!(host_routing(&cilium(None, Some(false))).ok, Some(true));
        assert_eq!(host_routing(&cilium(None, None)).ok, Some(true));
    }
}
