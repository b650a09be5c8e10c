//! kuport's delivery tooling: the kind end-to-end driver (`cargo e2e`), a renderer for the thin
//! Helm templates in `deploy/chart/` (so tests here check the chart without Helm), and the
//! release artifacts built from `deploy/manifests/`, with the krew manifest of the CLI.

pub mod chart;
pub mod driver;
pub mod krew;
pub mod local;
pub mod manifests;
