//! What an apply reports: what it changed, and what the kernel refused (each refusal with the
//! mappings it takes out, as the agent writes them into the class status).

use std::collections::BTreeSet;

use kuport_core::snapshot::KernelRefusal;

/// What one apply changed. A second apply of the same IR reports zero mutations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Whether an nftables transaction was sent.
    pub nft_changed: bool,
    /// Lines of the nftables transaction (only what differed is sent).
    pub nft_lines: usize,
    /// Whether kuport's table was listed: only a verifying pass after someone else changed
    /// the ruleset needs to.
    pub nft_listed: bool,
    /// Links created.
    pub links_created: usize,
    /// Links changed in place (address, MTU, rp_filter, up).
    pub links_updated: usize,
    /// Links deleted.
    pub links_deleted: usize,
    /// ip rules added.
    pub rules_added: usize,
    /// ip rules deleted.
    pub rules_deleted: usize,
    /// Routes added.
    pub routes_added: usize,
    /// Routes deleted.
    pub routes_deleted: usize,
    /// What the kernel refused. Everything else was applied: a refusal takes out only the
    /// mappings that depend on the refused part.
    pub refused: Vec<Refusal>,
    /// Whether a sweep of the conntrack table for stale entries of kuport's flows was asked
    /// for: only after an apply that changed what the node translates, or on a verifying pass.
    /// It runs on the host's sweeping thread; how it ends goes to the observer given with
    /// [`crate::Host::observe_sweeps`].
    pub conntrack_sweep_asked: bool,
}

impl ApplyReport {
    /// The number of kernel mutations performed.
    pub fn mutations(&self) -> usize {
        usize::from(self.nft_changed)
            + self.links_created
            + self.links_updated
            + self.links_deleted
            + self.rules_added
            + self.rules_deleted
            + self.routes_added
            + self.routes_deleted
    }
}

/// A part of the desired state the kernel refused, and the mappings it takes out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What was refused: `return link kup-…` or `nftables rules`.
    pub unit: String,
    /// The refused return link's device name, when the unit is a link.
    pub link: Option<String>,
    /// The mappings (`namespace/name`) that lost rules with it, sorted.
    pub mappings: BTreeSet<String>,
    /// What the kernel (or nft) said.
    pub message: String,
}

impl Refusal {
    /// The kernel refused return link `name`; `mappings` lost their rules with it.
    pub fn of_link(name: &str, mappings: BTreeSet<String>, message: String) -> Self {
        Self {
            unit: format!("return link {name}"),
            link: Some(name.to_owned()),
            mappings,
            message,
        }
    }

    /// nft refused the rules of `mapping`.
    pub fn of_rules(mapping: String, message: String) -> Self {
        Self {
            unit: "nftables rules".to_owned(),
            link: None,
            mappings: BTreeSet::from([mapping]),
            message,
        }
    }

    /// Every mapping the refusals take out.
    pub fn mappings_of(refusals: &[Refusal]) -> BTreeSet<String> {
        refusals
            .iter()
            .flat_map(|r| r.mappings.iter().cloned())
            .collect()
    }

    /// The refusal as each mapping it takes out reports it (in its node's class row).
    pub fn by_mapping(refusals: &[Refusal]) -> Vec<KernelRefusal> {
        let mut out: Vec<KernelRefusal> = refusals
            .iter()
            .flat_map(|r| {
                r.mappings.iter().map(|m| KernelRefusal {
                    mapping: m.clone(),
                    message: format!("the kernel refused its {}: {}", r.unit, r.message),
                    link: r.link.clone(),
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}
