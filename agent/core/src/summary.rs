//! The short summary fields of the status (`publishedSummary` of a PortMap, `nodesSummary` of a
//! PortMapClass): what the printer columns show.
//!
//! A printer column's JSONPath with `[*]` shows only its first match on the API server, so a
//! list cannot be a column. The status writer derives these strings from the structured fields
//! in the same write, bounded so a wide cluster cannot make a column unreadable: at most
//! [`SHOWN`] entries, then `… +N` for the rest.

use crate::api::PublishedAddress;

/// How many entries a summary shows before it cuts off with `… +N`.
pub const SHOWN: usize = 4;

/// What an address not resolved yet shows as (the row exists, its node has not reported it).
pub const UNRESOLVED: &str = "?";

/// `items` joined by commas, at most [`SHOWN`] of them, then ` … +N` naming how many are left
/// out. Empty input gives an empty string.
pub fn bounded_join<S: AsRef<str>>(items: &[S]) -> String {
    let shown: Vec<&str> = items.iter().take(SHOWN).map(AsRef::as_ref).collect();
    let mut out = shown.join(",");
    if items.len() > SHOWN {
        out.push_str(&format!(" … +{}", items.len() - SHOWN));
    }
    out
}

/// The published addresses of a mapping, in the order of `published` (node, then interface),
/// each once; an address not resolved yet shows as [`UNRESOLVED`]. `None` when nothing is
/// published, so the field is absent exactly when `published` is empty.
pub fn published_summary(published: &[PublishedAddress]) -> Option<String> {
    if published.is_empty() {
        return None;
    }
    let mut addresses: Vec<&str> = Vec::with_capacity(published.len());
    for p in published {
        // A row of an IPv6-only mapping has only its IPv6 address; a dual-stack one both.
        let a = match (p.address.as_str(), p.address6.as_str()) {
            ("", "") => [Some(UNRESOLVED), None],
            ("", v6) => [Some(v6), None],
            (v4, "") => [Some(v4), None],
            (v4, v6) => [Some(v4), Some(v6)],
        };
        // The same address bound on two interfaces (or two unresolved rows) is one place.
        for a in a.into_iter().flatten() {
            if !addresses.contains(&a) {
                addresses.push(a);
            }
        }
    }
    Some(bounded_join(&addresses))
}

/// `ready/configured` then the ready nodes, for example `2/2 edge-a,edge-b` or `1/3 edge-a`.
/// `configured` is the number of nodes the class names; `ready` lists, sorted, the ones that
/// accept now (a Ready Node and a ready row).
pub fn class_nodes_summary<S: AsRef<str>>(configured: usize, ready: &[S]) -> String {
    let count = format!("{}/{configured}", ready.len());
    if ready.is_empty() {
        count
    } else {
        format!("{count} {}", bounded_join(ready))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(node: &str, interface: &str, address: &str) -> PublishedAddress {
        PublishedAddress {
            node: node.into(),
            interface: interface.into(),
            address: address.into(),
            address6: String::new(),
        }
    }

    #[test]
    fn a_row_served_over_ipv6_shows_its_ipv6_address_after_the_ipv4_one() {
        let mut dual = row("edge-a", "enp1s0", "203.0.113.1");
        dual.address6 = "2001:db8:203::1".to_owned();
        let mut only6 = row("edge-b", "enp1s0", "");
        only6.address6 = "2001:db8:203::2".to_owned();
        assert_eq!(
            published_summary(&[dual, only6]).as_deref(),
            Some("203.0.113.1,2001:db8:203::1,2001:db8:203::2")
        );
    }

    #[test]
    fn bounded_join_cuts_off_with_a_count() {
        let none: [&str; 0] = [];
        assert_eq!(bounded_join(&none), "");
        assert_eq!(bounded_join(&["a"]), "a");
        assert_eq!(bounded_join(&["a", "b", "c", "d"]), "a,b,c,d");
        assert_eq!(bounded_join(&["a", "b", "c", "d", "e"]), "a,b,c,d … +1");
        assert_eq!(
            bounded_join(&["a", "b", "c", "d", "e", "f", "g"]),
            "a,b,c,d … +3"
        );
    }

    #[test]
    fn published_summary_for_none_one_many_and_too_many() {
        assert_eq!(published_summary(&[]), None);
        assert_eq!(
            published_summary(&[row("edge-a", "enp1s0", "203.0.113.1")]).as_deref(),
            Some("203.0.113.1")
        );
        assert_eq!(
            published_summary(&[
                row("edge-a", "enp1s0", "203.0.113.1"),
                row("edge-b", "enp1s0", "203.0.113.2"),
            ])
            .as_deref(),
            Some("203.0.113.1,203.0.113.2")
        );
        let many: Vec<PublishedAddress> = (1..=7)
            .map(|i| row(&format!("edge-{i}"), "enp1s0", &format!("203.0.113.{i}")))
            .collect();
        assert_eq!(
            published_summary(&many).as_deref(),
            Some("203.0.113.1,203.0.113.2,203.0.113.3,203.0.113.4 … +3")
        );
    }

    #[test]
    fn published_summary_marks_unresolved_rows_and_counts_an_address_once() {
        assert_eq!(
            published_summary(&[
                row("edge-a", "enp1s0", "203.0.113.1"),
                row("edge-a", "wt0", ""),
                row("edge-b", "enp1s0", "203.0.113.1"),
                row("edge-b", "wt0", ""),
            ])
            .as_deref(),
            Some("203.0.113.1,?")
        );
    }

    #[test]
    fn class_nodes_summary_for_none_one_many_and_too_many() {
        let none: [&str; 0] = [];
        assert_eq!(class_nodes_summary(0, &none), "0/0");
        assert_eq!(class_nodes_summary(2, &none), "0/2");
        assert_eq!(class_nodes_summary(2, &["edge-a"]), "1/2 edge-a");
        assert_eq!(
            class_nodes_summary(2, &["edge-a", "edge-b"]),
            "2/2 edge-a,edge-b"
        );
        let many: Vec<String> = (1..=7).map(|i| format!("edge-{i}")).collect();
        assert_eq!(
            class_nodes_summary(8, &many),
            "7/8 edge-1,edge-2,edge-3,edge-4 … +3"
        );
    }
}
