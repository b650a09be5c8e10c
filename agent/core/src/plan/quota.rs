//! Per-namespace port quotas of a class: how many ports the accepted PortMaps of each namespace
//! hold, counted as admission accepts them (in conflict order), against
//! `spec.ports.perNamespace` or the namespace's entry in `spec.ports.namespaceQuotas`.
//!
//! A class is shared by every namespace it selects, and one PortMap with a range can hold tens
//! of thousands of ports, so a count of objects would not stop one tenant from taking a whole
//! window. Ports are counted as Kubernetes counts `services.nodeports`: each (protocol, port)
//! of a mapping once, TCP and UDP apart.

use std::collections::BTreeMap;

use crate::api::PortMapClass;
use crate::ir::PortRange;
use crate::keys::Name;

/// The ports each (class, namespace) holds so far in a pass.
#[derive(Default)]
pub struct Quotas {
    used: BTreeMap<(Name, Name), u32>,
}

/// One namespace's use of a class's quota, as the class status reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceUse {
    pub namespace: Name,
    /// Ports its accepted PortMaps hold.
    pub used: u32,
    /// Ports it may hold.
    pub quota: u32,
}

/// How many ports a range is.
pub fn ports_in(range: PortRange) -> u32 {
    u32::from(range.last) - u32::from(range.first) + 1
}

impl Quotas {
    /// Takes `range` from the quota of `namespace` in `class` when it fits; otherwise the
    /// refusal's message, leaving the count as it was.
    pub fn take(
        &mut self,
        (class_name, class): (&Name, &PortMapClass),
        namespace: &Name,
        range: PortRange,
    ) -> Result<(), String> {
        let quota = class.spec.ports.quota_of(namespace);
        let asked = ports_in(range);
        let used = self
            .used
            .entry((class_name.clone(), namespace.clone()))
            .or_insert(0);
        if used.saturating_add(asked) > quota {
            return Err(refusal(class_name, namespace, *used, asked, quota));
        }
        *used += asked;
        Ok(())
    }

    /// Every namespace holding ports in `class_name`, by name.
    pub fn of_class(&self, class_name: &str, class: &PortMapClass) -> Vec<NamespaceUse> {
        self.used
            .iter()
            .filter(|((c, _), used)| &**c == class_name && **used > 0)
            .map(|((_, namespace), used)| NamespaceUse {
                namespace: namespace.clone(),
                used: *used,
                quota: class.spec.ports.quota_of(namespace),
            })
            .collect()
    }
}

fn refusal(class_name: &str, namespace: &str, used: u32, asked: u32, quota: u32) -> String {
    let asking = if asked == 1 {
        "1 port".to_owned()
    } else {
        format!("{asked} ports")
    };
    format!(
        "namespace {namespace} already holds {used} of its {quota} ports in class {class_name}; this mapping asks for {asking} more (the administrator sets spec.ports.perNamespace or spec.ports.namespaceQuotas.{namespace})"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PortMapClassSpec, PortWindow};

    fn class(per_namespace: i32, exceptions: &[(&str, i32)]) -> PortMapClass {
        let ports = PortWindow {
            per_namespace,
            namespace_quotas: exceptions
                .iter()
                .map(|(n, q)| ((*n).to_owned(), *q))
                .collect(),
            ..PortWindow::default()
        };
        PortMapClass::new(
            "public",
            PortMapClassSpec {
                ports,
                ..serde_json::from_value(serde_json::json!({"nodes": {"edge": {"interfaces": ["eth0"]}}, "returnPath": {"mode": "None"}}))
                    .expect("a class spec")
            },
        )
    }

    fn range(first: u16, last: u16) -> PortRange {
        PortRange { first, last }
    }

    #[test]
    fn a_namespace_takes_ports_until_its_quota_and_others_keep_theirs() {
        let class = class(100, &[("games", 1000)]);
        let name = Name::from("public");
        let mut quotas = Quotas::default();
        let (tenant, games) = (Name::from("tenant"), Name::from("games"));
        assert!(
            quotas
                .take((&name, &class), &tenant, range(2000, 2089))
                .is_ok()
        );
        let refused = quotas
            .take((&name, &class), &tenant, range(3000, 3010))
            .expect_err("90 + 11 is past 100");
        assert!(
            refused.contains("already holds 90 of its 100 ports"),
            "{refused}"
        );
        assert!(refused.contains("11 ports more"), "{refused}");
        // A refusal takes nothing: ten more still fit.
        assert!(
            quotas
                .take((&name, &class), &tenant, range(3000, 3009))
                .is_ok()
        );
        assert!(
            quotas
                .take((&name, &class), &games, range(5000, 5999))
                .is_ok()
        );
        assert_eq!(
            quotas.of_class("public", &class),
            [
                NamespaceUse {
                    namespace: games,
                    used: 1000,
                    quota: 1000
                },
                NamespaceUse {
                    namespace: tenant,
                    used: 100,
                    quota: 100
                },
            ]
        );
    }

    #[test]
    fn a_zero_quota_admits_nothing_and_a_whole_window_is_counted_in_ports() {
        let name = Name::from("public");
        let none = class(0, &[]);
        let mut quotas = Quotas::default();
        let ns = Name::from("tenant");
        assert!(quotas.take((&name, &none), &ns, range(2000, 2000)).is_err());
        let default = class(crate::api::DEFAULT_PORTS_PER_NAMESPACE, &[]);
        assert!(
            quotas
                .take((&name, &default), &ns, range(1024, 65535))
                .is_err()
        );
        assert_eq!(ports_in(range(1, 65535)), 65535);
    }
}
