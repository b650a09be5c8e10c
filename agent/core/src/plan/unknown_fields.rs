//! Keeping what this version does not know when it rewrites a shared class status.
//!
//! A class status is written whole (a compare-and-swap replace), by every agent, and during a
//! rollout agents of two versions write it side by side. The CRDs are applied first, so the API
//! server keeps fields that only the newer agents know; an older agent that read the status into
//! its own types and wrote those back would drop them from every other node's row. So the writer
//! grafts them back: every field of the status as stored that does not survive a round trip
//! through this version's types is put back where it was, matched by the identity of the list
//! element holding it. The writer's own row is the exception: it is the only writer of that row,
//! and a field a newer version of itself left there no longer describes the node.

use serde_json::{Map, Value};

/// Fields that identify an element of a status list (a row by `name`, a condition by `type`, a
/// link claim by `key`, a link end by `peer`, a refusal by `node` and `mapping`, a held port by
/// its protocol, port, address and holder): two elements with the same values here are the same
/// element, whatever else changed.
const IDENTITY_FIELDS: &[&str] = &[
    "name", "type", "key", "peer", "node", "mapping", "protocol", "port", "address", "holder",
];

/// Puts back into `merged` (the status this version is about to write, serialized) the fields of
/// `stored` (the status as the API server returned it) that `understood` (`stored` parsed into
/// this version's types and serialized again) lost, except in the row of `own_node`. An element
/// that `merged` no longer has (a row removed, a claim collected) stays removed.
pub fn keep_unknown_fields(stored: &Value, understood: &Value, merged: &mut Value, own_node: &str) {
    if let (Value::Object(s), Value::Object(u), Value::Object(m)) = (stored, understood, merged) {
        graft_object(s, u, m, own_node, true);
    }
}

fn graft_object(
    stored: &Map<String, Value>,
    understood: &Map<String, Value>,
    merged: &mut Map<String, Value>,
    own_node: &str,
    top: bool,
) {
    for (field, value) in stored {
        match (understood.get(field), merged.get_mut(field)) {
            // Unknown here: back in, unless this version wrote the field itself.
            (None, None) => {
                merged.insert(field.clone(), value.clone());
            }
            (Some(u), Some(m)) => {
                // The rows of `nodes` are the only ones with an owner.
                let owner = (top && field == "nodes").then_some(own_node);
                graft_value(value, u, m, owner);
            }
            _ => {}
        }
    }
}

fn graft_value(stored: &Value, understood: &Value, merged: &mut Value, owner: Option<&str>) {
    match (stored, understood, merged) {
        (Value::Object(s), Value::Object(u), Value::Object(m)) => {
            graft_object(s, u, m, "", false);
        }
        (Value::Array(s), Value::Array(u), Value::Array(m)) => {
            for element in s {
                let Some(id) = identity(element) else {
                    continue;
                };
                if owner.is_some_and(|own| is_row_of(element, own)) {
                    continue;
                }
                let known = u.iter().find(|e| identity(e).as_ref() == Some(&id));
                let written = m.iter_mut().find(|e| identity(e).as_ref() == Some(&id));
                if let (Some(known), Some(written)) = (known, written) {
                    graft_value(element, known, written, None);
                }
            }
        }
        _ => {}
    }
}

/// The identity of a list element: the values of its identity fields, in a fixed order; `None`
/// for an element with none (a plain string, or an object no rule can match).
fn identity(element: &Value) -> Option<Vec<(&'static str, &Value)>> {
    let object = element.as_object()?;
    let id: Vec<_> = IDENTITY_FIELDS
        .iter()
        .filter_map(|f| object.get(*f).map(|v| (*f, v)))
        .collect();
    (!id.is_empty()).then_some(id)
}

fn is_row_of(element: &Value, node: &str) -> bool {
    element.get("name").and_then(Value::as_str) == Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PortMapClassStatus;
    use serde_json::json;

    /// What an agent of this version writes after reading `stored`: its types' view, with
    /// `change` applied, and the unknown fields grafted back.
    fn write_back(stored: Value, change: impl FnOnce(&mut PortMapClassStatus)) -> Value {
        let typed: PortMapClassStatus = serde_json::from_value(stored.clone()).expect("parses");
        let understood = serde_json::to_value(&typed).expect("serializes");
        let mut next = typed;
        change(&mut next);
        let mut merged = serde_json::to_value(&next).expect("serializes");
        keep_unknown_fields(&stored, &understood, &mut merged, "n1");
        merged
    }

    fn newer_status() -> Value {
        json!({
            "futureSummary": {"shards": 3},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Valid", "message": "",
                            "lastTransitionTime": "2026-12-05T00:00:00Z", "futureHint": "h"}],
            "nodes": [
                {"name": "n1", "ready": true, "futureField": "mine"},
                {"name": "n2", "ready": true, "futureField": "theirs",
                 "links": [{"peer": "n1", "slot": 0, "futureLoss": 0.5}],
                 "heldPorts": [{"protocol": "TCP", "port": 25, "address": "192.0.2.1",
                                "holder": "sshd", "futureUid": 0}]}
            ],
            "links": [{"key": "public/n1/n2", "peers": ["n1", "n2"], "subnet": "169.254.77.0/24",
                       "slot": 0, "futureEpoch": 7}],
            "refused": [{"node": "n2", "mapping": "a/b", "message": "m", "futureCode": 1}]
        })
    }

    #[test]
    fn another_nodes_unknown_fields_survive_a_rewrite_and_its_own_do_not() {
        let merged = write_back(newer_status(), |s| {
            s.nodes[0].message = Some("changed by n1".to_owned());
        });
        assert_eq!(merged["futureSummary"], json!({"shards": 3}));
        assert_eq!(merged["conditions"][0]["futureHint"], "h");
        assert_eq!(merged["nodes"][1]["futureField"], "theirs");
        assert_eq!(merged["nodes"][1]["links"][0]["futureLoss"], 0.5);
        assert_eq!(merged["nodes"][1]["heldPorts"][0]["futureUid"], 0);
        assert_eq!(merged["links"][0]["futureEpoch"], 7);
        assert_eq!(merged["refused"][0]["futureCode"], 1);
        // The writer's own row is what it wrote, nothing more.
        assert_eq!(merged["nodes"][0].get("futureField"), None);
        assert_eq!(merged["nodes"][0]["message"], "changed by n1");
        // Nothing the writer knows is overridden by the stored value.
        let back: PortMapClassStatus = serde_json::from_value(merged).expect("parses");
        assert_eq!(back.nodes[0].message.as_deref(), Some("changed by n1"));
    }

    #[test]
    fn what_the_writer_removed_stays_removed() {
        let merged = write_back(newer_status(), |s| {
            s.links.clear();
            s.refused.clear();
            s.nodes.retain(|n| n.name != "n2");
        });
        assert_eq!(merged.get("links"), None);
        assert_eq!(merged.get("refused"), None);
        assert_eq!(merged["nodes"].as_array().map(Vec::len), Some(1));
        // A field the writer knows and cleared is not restored either.
        let merged = write_back(newer_status(), |s| s.nodes[1].held_ports.clear());
        assert_eq!(merged["nodes"][1].get("heldPorts"), None);
        assert_eq!(merged["nodes"][1]["futureField"], "theirs");
    }

    #[test]
    fn elements_match_by_identity_not_by_position() {
        let merged = write_back(newer_status(), |s| {
            // A new row sorts before n2: positions shift, identities do not.
            let mut row = s.nodes[0].clone();
            row.name = "n0".to_owned();
            s.nodes.insert(0, row);
        });
        assert_eq!(merged["nodes"][0]["name"], "n0");
        assert_eq!(merged["nodes"][0].get("futureField"), None);
        assert_eq!(merged["nodes"][2]["futureField"], "theirs");
    }

    #[test]
    fn a_status_of_this_version_is_written_exactly_as_merged() {
        let stored = json!({"nodes": [{"name": "n2", "ready": false, "message": "m"}]});
        let merged = write_back(stored, |s| s.nodes[0].ready = true);
        assert_eq!(
            merged,
            json!({"nodes": [{"name": "n2", "ready": true, "message": "m"}]})
        );
    }
}
