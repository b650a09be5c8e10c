//! The JSON report (a public contract: fields are only added) and the table `cargo lab` prints.

use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub scenarios: Vec<ScenarioReport>,
    pub passed: usize,
    pub failed: usize,
}

#[derive(Debug, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub ok: bool,
    pub seconds: f64,
    pub steps: Vec<StepReport>,
    /// Extension: why the scenario could not run at all (topology, API server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    pub kind: String,
    pub name: String,
    pub ok: bool,
    pub detail: Value,
}

impl Report {
    pub fn push(&mut self, s: ScenarioReport) {
        if s.ok {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        self.scenarios.push(s);
    }
}

/// One line per scenario with the client addresses its pods saw, then every failed step.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let width = report
        .scenarios
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(8)
        .max(8);
    out.push_str(&format!(
        "{:<width$}  {:<4}  {:>6}  {:>6}  pod saw (client address per probe)\n",
        "scenario", "ok", "steps", "secs"
    ));
    for s in &report.scenarios {
        let saw = pod_saw(&s.steps);
        out.push_str(&format!(
            "{:<width$}  {:<4}  {:>6}  {:>6.1}  {}\n",
            s.name,
            if s.ok { "ok" } else { "FAIL" },
            s.steps.len(),
            s.seconds,
            saw
        ));
    }
    for s in report.scenarios.iter().filter(|s| !s.ok) {
        out.push_str(&format!("\n{} failed:\n", s.name));
        if let Some(e) = &s.error {
            out.push_str(&format!("  error: {e}\n"));
        }
        for step in failed_steps(&s.steps) {
            out.push_str(&format!(
                "  {} ({}): {}\n",
                step.name,
                step.kind,
                serde_json::to_string(&step.detail).unwrap_or_default()
            ));
        }
    }
    out
}

fn failed_steps(steps: &[StepReport]) -> Vec<&StepReport> {
    steps.iter().filter(|s| !s.ok).collect()
}

/// The addresses pods reported for the scenario's probes, deduplicated in order.
fn pod_saw(steps: &[StepReport]) -> String {
    let mut seen: Vec<String> = Vec::new();
    collect_saw(steps, &mut seen);
    if seen.is_empty() {
        return "-".into();
    }
    let mut text = seen.join(" ");
    if text.len() > 90 {
        text.truncate(87);
        text.push_str("...");
    }
    text
}

fn collect_saw(steps: &[StepReport], seen: &mut Vec<String>) {
    for step in steps {
        if let Some(ip) = step
            .detail
            .get("podSaw")
            .and_then(Value::as_str)
            .and_then(|a| a.rsplit_once(':').map(|(ip, _)| ip.to_string()))
            && !seen.contains(&ip)
        {
            seen.push(ip);
        }
        if let Some(inner) = step.detail.get("steps").and_then(Value::as_array) {
            let parsed: Vec<StepReport> = inner
                .iter()
                .filter_map(|v| {
                    Some(StepReport {
                        kind: v.get("kind")?.as_str()?.to_string(),
                        name: v.get("name")?.as_str()?.to_string(),
                        ok: v.get("ok")?.as_bool()?,
                        detail: v.get("detail")?.clone(),
                    })
                })
                .collect();
            collect_saw(&parsed, seen);
        }
    }
}
