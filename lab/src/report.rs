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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report() -> Report {
        let mut r = Report::default();
        r.push(ScenarioReport {
            name: "cross".into(),
            ok: true,
            seconds: 4.2,
            steps: vec![StepReport {
                kind: "probe".into(),
                name: "internet-udp".into(),
                ok: true,
                detail: json!({"dialed": "203.0.113.1:3000", "replyFrom": "203.0.113.1:3000",
                    "clientAddr": "198.51.100.10:40311", "podSaw": "198.51.100.10:40311", "rttMicros": 812}),
            }],
            error: None,
        });
        r.push(ScenarioReport {
            name: "broken".into(),
            ok: false,
            seconds: 1.0,
            steps: vec![StepReport {
                kind: "expectStatus".into(),
                name: "expectStatus-1".into(),
                ok: false,
                detail: json!({"expected": "a", "got": "b"}),
            }],
            error: None,
        });
        r
    }

    #[test]
    fn the_json_has_the_contract_fields() {
        let v = serde_json::to_value(report()).expect("encode");
        assert_eq!(
            (v["passed"].clone(), v["failed"].clone()),
            (json!(1), json!(1))
        );
        let s = &v["scenarios"][0];
        for k in ["name", "ok", "seconds", "steps"] {
            assert!(s.get(k).is_some(), "{k}");
        }
        assert!(
            s.get("error").is_none(),
            "no error field when there is none"
        );
        let step = &s["steps"][0];
        for k in ["kind", "name", "ok", "detail"] {
            assert!(step.get(k).is_some(), "{k}");
        }
        assert_eq!(step["detail"]["podSaw"], "198.51.100.10:40311");
    }

    #[test]
    fn the_table_shows_what_the_pods_saw_and_why_a_scenario_failed() {
        let t = table(&report());
        assert!(t.contains("cross") && t.contains("198.51.100.10"), "{t}");
        assert!(
            t.contains("broken failed:") && t.contains("expectStatus-1"),
            "{t}"
        );
    }
}
