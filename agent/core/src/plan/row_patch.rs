//! A class status write as a JSON patch of only what this node changed, when nothing of it is
//! shared: no compare-and-swap, so the nodes writing one class at the same moment (every
//! accepting node and the pods' nodes, after one pod moves) do not meet 409s, each of which
//! costs a read and another write.
//!
//! What a node may change this way is what no other node writes at the same element: its own
//! row (replaced, added or removed), and the `unusedSince` mark of an existing link claim (set
//! or cleared) or the removal of a claim (its collection). Each operation is guarded by a
//! `test` of the key at the index it touches, so if another node's write moved the list
//! meanwhile the server refuses the whole patch (422) and the agent merges into a fresh read
//! instead.
//!
//! A new claim takes a slot, which is unique only if no other writer changed the claim list
//! meanwhile: [`claims_patch`] replaces the whole list under a `test` of the whole list as
//! stored, a compare-and-swap of that list alone, so the rows other nodes patch at the same
//! moment do not make it fail. The Ready condition, `readyNodes`, the summary and the
//! refusals are computed from every row: any change to those goes through compare-and-swap of
//! the whole object.

use serde::Serialize;
use serde_json::{Value, json};

use crate::api::{ClassNodeStatus, LinkClaim, PortMapClassStatus};

/// The JSON patch (RFC 6902) operations that turn `stored` into `merged` by changing only
/// what `node` alone writes, in the order the server must apply them; `None` when the
/// difference touches something shared (or when a list it would patch is absent, since a
/// patch cannot guard an index in a list the server does not have).
pub fn unshared_patch(
    stored: &PortMapClassStatus,
    merged: &PortMapClassStatus,
    node: &str,
) -> Option<Vec<Value>> {
    if !same_beside_rows_and_claims(stored, merged) {
        return None;
    }
    let mut ops = row_ops(&stored.nodes, &merged.nodes, node)?;
    ops.extend(claim_ops(&stored.links, &merged.links)?);
    (!ops.is_empty()).then_some(ops)
}

/// Whether the two statuses differ at most in their rows and claims: nothing computed from
/// every row (the Ready condition, `readyNodes`, the summary) nor the refusals changed.
fn same_beside_rows_and_claims(stored: &PortMapClassStatus, merged: &PortMapClassStatus) -> bool {
    let rest = |s: &PortMapClassStatus| PortMapClassStatus {
        nodes: Vec::new(),
        links: Vec::new(),
        ..s.clone()
    };
    rest(stored) == rest(merged)
}

/// Whether every row but `node`'s is the same in both lists.
fn other_rows_same(stored: &[ClassNodeStatus], merged: &[ClassNodeStatus], node: &str) -> bool {
    let others = |rows: &[ClassNodeStatus]| -> Vec<ClassNodeStatus> {
        rows.iter().filter(|r| r.name != node).cloned().collect()
    };
    others(stored) == others(merged)
}

/// The operations on `status.nodes`: at most this node's row, replaced, added in name order or
/// removed; `None` when another row differs.
fn row_ops(
    stored: &[ClassNodeStatus],
    merged: &[ClassNodeStatus],
    node: &str,
) -> Option<Vec<Value>> {
    if !other_rows_same(stored, merged, node) {
        return None;
    }
    let before = stored.iter().position(|r| r.name == node);
    let after = merged.iter().find(|r| r.name == node);
    let key = |at: usize| test(&format!("/status/nodes/{at}/name"), &stored[at].name);
    match (before, after) {
        (Some(at), Some(row)) if *row == stored[at] => Some(Vec::new()),
        (Some(at), Some(row)) => Some(vec![key(at), op("replace", "nodes", at, row)]),
        (Some(at), None) => Some(vec![key(at), remove("nodes", at)]),
        (None, Some(row)) if !stored.is_empty() => {
            let at = stored
                .iter()
                .position(|r| r.name.as_str() > node)
                .unwrap_or(stored.len());
            // The neighbours it goes between, so that it lands in name order.
            let mut ops: Vec<Value> = [at.checked_sub(1), (at < stored.len()).then_some(at)]
                .into_iter()
                .flatten()
                .map(key)
                .collect();
            ops.push(op("add", "nodes", at, row));
            Some(ops)
        }
        (None, Some(_)) => None,
        (None, None) => Some(Vec::new()),
    }
}

/// The operations on `status.links`: claims removed, and `unusedSince` set or cleared on a
/// claim kept; `None` for a claim added, or changed in anything else (its slot is shared).
/// From the last index down, so that each operation's index is still the stored one.
fn claim_ops(stored: &[LinkClaim], merged: &[LinkClaim]) -> Option<Vec<Value>> {
    if merged
        .iter()
        .any(|m| !stored.iter().any(|s| s.key == m.key))
    {
        return None;
    }
    let mut ops = Vec::new();
    for (at, claim) in stored.iter().enumerate().rev() {
        let key = test(&format!("/status/links/{at}/key"), &claim.key);
        match merged.iter().find(|m| m.key == claim.key) {
            None => ops.extend([key, remove("links", at)]),
            Some(m) if m == claim => {}
            Some(m) => {
                let marked_only = LinkClaim {
                    unused_since: claim.unused_since.clone(),
                    ..m.clone()
                } == *claim;
                if !marked_only {
                    return None;
                }
                let path = format!("/status/links/{at}/unusedSince");
                ops.push(key);
                ops.push(match &m.unused_since {
                    Some(since) => json!({"op": "add", "path": path, "value": since}),
                    None => json!({"op": "remove", "path": path}),
                });
            }
        }
    }
    Some(ops)
}

/// The patch of a write whose shared part is the claim list alone (new claims, or a claim's
/// slot changed) besides this node's own row: the row's guarded operations, then a `test` that
/// the list is still `stored_links` and its replacement by `merged_links`. The two lists are
/// the JSON as the server holds it and as it is to be written (fields this version does not
/// know kept), not this version's reading of it: the test compares the whole list. `None` when
/// anything else shared differs, another row differs, or the server holds no list (a patch
/// cannot test that a list is absent).
pub fn claims_patch(
    stored: &PortMapClassStatus,
    merged: &PortMapClassStatus,
    node: &str,
    stored_links: &Value,
    merged_links: &Value,
) -> Option<Vec<Value>> {
    if !same_beside_rows_and_claims(stored, merged)
        || stored.links == merged.links
        || !stored_links.is_array()
    {
        return None;
    }
    let mut ops = row_ops(&stored.nodes, &merged.nodes, node)?;
    ops.push(json!({"op": "test", "path": "/status/links", "value": stored_links}));
    ops.push(json!({"op": "replace", "path": "/status/links", "value": merged_links}));
    Some(ops)
}

/// Whether everything `merged` changes of `stored` is what nobody waits for: ends of return
/// links this node took down left out of its row (or the row itself gone), and `unusedSince`
/// set on claims.
/// Such a change may wait for the node's next write that someone does wait for, which usually
/// comes within a round trip during a move (the new link's acknowledgement), so that the two
/// become one write and a mark does not meet the new pod's node's claims. False when nothing
/// changed.
pub fn settles_only(stored: &PortMapClassStatus, merged: &PortMapClassStatus, node: &str) -> bool {
    let row_settles = row_settles_only(
        stored.nodes.iter().find(|r| r.name == node),
        merged.nodes.iter().find(|r| r.name == node),
    );
    let marks_only = stored.links.len() == merged.links.len()
        && stored.links.iter().zip(&merged.links).all(|(old, new)| {
            old == new
                || (old.unused_since.is_none()
                    && new.unused_since.is_some()
                    && LinkClaim {
                        unused_since: None,
                        ..new.clone()
                    } == *old)
        });
    stored != merged
        && same_beside_rows_and_claims(stored, merged)
        && other_rows_same(&stored.nodes, &merged.nodes, node)
        && row_settles
        && marks_only
}

/// Whether a node's row going from `old` to `new` only takes link ends down (or the row away),
/// its pass time aside.
pub fn row_settles_only(old: Option<&ClassNodeStatus>, new: Option<&ClassNodeStatus>) -> bool {
    match (old, new) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(old), Some(new)) => {
            let ends_only_gone = new.links.iter().all(|l| old.links.contains(l));
            let unlinked = |r: &ClassNodeStatus| ClassNodeStatus {
                links: Vec::new(),
                last_pass_time: None,
                ..r.clone()
            };
            ends_only_gone && unlinked(old) == unlinked(new)
        }
    }
}

fn test(path: &str, value: &str) -> Value {
    json!({"op": "test", "path": path, "value": value})
}

fn op(kind: &str, list: &str, at: usize, value: &impl Serialize) -> Value {
    json!({"op": kind, "path": format!("/status/{list}/{at}"), "value": value})
}

fn remove(list: &str, at: usize) -> Value {
    json!({"op": "remove", "path": format!("/status/{list}/{at}")})
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kuport_testkit::cluster::timestamp as ts;

    use super::*;
    use crate::api::LinkEndStatus;
    use crate::plan::merge::tests::{link as claim, row};

    fn stored() -> PortMapClassStatus {
        PortMapClassStatus {
            nodes: vec![row("a"), row("m"), row("z")],
            ready_nodes: vec!["a".into(), "m".into(), "z".into()],
            links: vec![claim("a/p", 0), claim("m/p", 1), claim("z/p", 2)],
            ..Default::default()
        }
    }

    /// Applies `ops` to a status the way the API server would, through its JSON form.
    fn applied(status: &PortMapClassStatus, ops: &[Value]) -> Result<PortMapClassStatus, String> {
        let mut doc = json!({"status": status});
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(ops.to_vec())).map_err(|e| e.to_string())?;
        json_patch::patch(&mut doc, &patch).map_err(|e| e.to_string())?;
        serde_json::from_value(doc["status"].clone()).map_err(|e| e.to_string())
    }

    /// Every change this node alone makes is a patch giving exactly the merged status.
    #[test]
    fn the_own_row_and_claim_marks_are_patched_exactly() {
        let stored = stored();
        let mut changed = stored.clone();
        changed.nodes[1].message = Some("interface wt0 not present".into());
        let mut removed = stored.clone();
        removed.nodes.remove(1);
        let mut added = stored.clone();
        added.nodes.insert(1, row("b"));
        let mut last = stored.clone();
        last.nodes.push(row("zz"));
        let mut marked = stored.clone();
        marked.links[0].unused_since = Some(Time(ts("2026-01-02T00:00:00Z")));
        marked.links.remove(2);
        for (node, merged) in [
            ("m", &changed),
            ("m", &removed),
            ("b", &added),
            ("zz", &last),
            ("a", &marked),
        ] {
            let ops = unshared_patch(&stored, merged, node).expect("unshared");
            assert_eq!(applied(&stored, &ops).as_ref(), Ok(merged), "{ops:?}");
        }
        // And a mark cleared again.
        let ops = unshared_patch(&marked, &stored_without_z(), "a").expect("unshared");
        assert_eq!(applied(&marked, &ops), Ok(stored_without_z()));
        assert_eq!(unshared_patch(&stored, &stored, "m"), None);
    }

    fn stored_without_z() -> PortMapClassStatus {
        let mut s = stored();
        s.links.remove(2);
        s
    }

    #[test]
    fn anything_shared_needs_compare_and_swap() {
        let stored = stored();
        let mut other_row = stored.clone();
        other_row.nodes[2].ready = false;
        let mut ready = stored.clone();
        ready.nodes[1].ready = false;
        ready.ready_nodes.remove(1);
        let mut new_claim = stored.clone();
        new_claim.links.push(claim("q/z", 3));
        let mut new_slot = stored.clone();
        new_slot.links[1].slot = 7;
        let mut empty = PortMapClassStatus::default();
        empty.ready_nodes.push("m".into());
        let mut first = empty.clone();
        first.nodes.push(row("m"));
        for (node, from, merged) in [
            ("m", &stored, &other_row),
            ("m", &stored, &ready),
            ("m", &stored, &new_claim),
            ("m", &stored, &new_slot),
            ("m", &empty, &first),
        ] {
            assert_eq!(unshared_patch(from, merged, node), None);
        }
    }

    fn json(links: &[LinkClaim]) -> Value {
        serde_json::to_value(links).expect("claims serialise")
    }

    fn claims_ops(stored: &PortMapClassStatus, merged: &PortMapClassStatus) -> Option<Vec<Value>> {
        claims_patch(
            stored,
            merged,
            "m",
            &json(&stored.links),
            &json(&merged.links),
        )
    }

    /// New claims (and a claim's slot given up for a serving pair) with this node's row: the
    /// claim list replaced under a test of the whole list, and the row patched as usual.
    #[test]
    fn new_claims_replace_the_list_it_was_computed_from() {
        let stored = stored();
        let mut merged = stored.clone();
        merged.links.push(claim("q/z", 3));
        merged.links[1].slot = 7;
        merged.nodes[1].message = Some("link built".into());
        let ops = claims_ops(&stored, &merged).expect("a claims patch");
        assert_eq!(applied(&stored, &ops).as_ref(), Ok(&merged), "{ops:?}");
        // Another node's row patched meanwhile does not make it fail, and stays.
        let mut meanwhile = stored.clone();
        meanwhile.nodes[2].ready = false;
        let mut both = merged.clone();
        both.nodes[2].ready = false;
        assert_eq!(applied(&meanwhile, &ops), Ok(both));
        // Another claim landed or marked meanwhile: the slots may clash, so it fails whole.
        let mut landed = stored.clone();
        landed.links.push(claim("r/z", 3));
        let mut marked = stored.clone();
        marked.links[0].unused_since = Some(Time(ts("2026-01-02T00:00:00Z")));
        for moved in [landed, marked] {
            assert!(applied(&moved, &ops).is_err(), "{ops:?}");
        }
    }

    /// Anything shared besides the claims, another node's row, no claim change at all, or a
    /// list the server does not hold: no claims patch.
    #[test]
    fn a_claims_patch_is_only_for_claims() {
        let stored = stored();
        let mut claim_and_ready = stored.clone();
        claim_and_ready.links.push(claim("q/z", 3));
        claim_and_ready.ready_nodes.remove(1);
        let mut claim_and_other_row = stored.clone();
        claim_and_other_row.links.push(claim("q/z", 3));
        claim_and_other_row.nodes[2].ready = false;
        let mut row_only = stored.clone();
        row_only.nodes[1].message = Some("changed".into());
        for merged in [&claim_and_ready, &claim_and_other_row, &row_only] {
            assert_eq!(claims_ops(&stored, merged), None);
        }
        let mut first = stored.clone();
        first.links.push(claim("q/z", 3));
        assert_eq!(
            claims_patch(&stored, &first, "m", &Value::Null, &json(&first.links)),
            None
        );
    }

    /// What may wait for the node's next write: its link ends taken down, its row gone,
    /// claims marked unused. Anything else, a new end or a mark cleared above all (someone
    /// waits for those), is written at once.
    #[test]
    fn only_ends_taken_down_and_marks_set_may_wait() {
        let end = |peer: &str, slot| LinkEndStatus {
            peer: peer.into(),
            slot,
            ..Default::default()
        };
        let mut stored = stored();
        for at in [1, 2] {
            stored.nodes[at].links.push(end("p", 1));
        }
        let mut ends_gone = stored.clone();
        ends_gone.nodes[1].links.clear();
        let mut row_gone = stored.clone();
        row_gone.nodes.remove(1);
        let mut marked = stored.clone();
        marked.links[0].unused_since = Some(Time(ts("2026-01-02T00:00:00Z")));
        let mut both = marked.clone();
        both.nodes[1].links.clear();
        both.nodes[1].last_pass_time = Some(Time(ts("2026-01-02T00:00:00Z")));
        for merged in [&ends_gone, &row_gone, &marked, &both] {
            assert!(settles_only(&stored, merged, "m"), "{merged:?}");
        }
        let mut end_added = stored.clone();
        end_added.nodes[1].links.push(end("q", 9));
        let mut cleared = marked.clone();
        cleared.links[0].unused_since = None;
        let mut not_ready = ends_gone.clone();
        not_ready.nodes[1].ready = false;
        let mut new_claim = stored.clone();
        new_claim.links.push(claim("q/z", 3));
        let mut other_row = stored.clone();
        other_row.nodes[2].links.clear();
        let mut added = stored.clone();
        added.nodes.insert(1, row("b"));
        for (node, from, merged) in [
            ("m", &stored, &end_added),
            ("m", &marked, &cleared),
            ("m", &stored, &not_ready),
            ("m", &stored, &new_claim),
            ("m", &stored, &other_row),
            ("b", &stored, &added),
            ("m", &stored, &stored),
        ] {
            assert!(!settles_only(from, merged, node), "{merged:?}");
        }
    }

    /// The guards: a row or claim no longer where the patch was computed makes the whole patch
    /// fail, instead of changing another node's element.
    #[test]
    fn a_list_moved_meanwhile_refuses_the_patch() {
        let stored = stored();
        let mut changed = stored.clone();
        changed.nodes[1].message = Some("moved".into());
        let row_patch = unshared_patch(&stored, &changed, "m").expect("unshared");
        let mut marked = stored.clone();
        marked.links.remove(1);
        let claim_patch = unshared_patch(&stored, &marked, "m").expect("unshared");
        let mut added = stored.clone();
        added.nodes.insert(2, row("n"));
        let add_patch = unshared_patch(&stored, &added, "n").expect("unshared");
        let mut meanwhile = stored.clone();
        meanwhile.nodes.insert(0, row("0"));
        meanwhile.links.insert(0, claim("0/p", 9));
        for ops in [row_patch, claim_patch, add_patch] {
            assert!(applied(&meanwhile, &ops).is_err(), "{ops:?}");
        }
    }
}
