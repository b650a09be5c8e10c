//! Label selector matching (`metav1.LabelSelector`), as the API server defines it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` match `selector`. `None` when the selector cannot be parsed (an unknown
/// operator, `In`/`NotIn` without values, `Exists`/`DoesNotExist` with values): the caller treats
/// that as selecting nothing.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> Option<bool> {
    let mut all = true;
    for (key, value) in selector.match_labels.iter().flatten() {
        all &= labels.get(key) == Some(value);
    }
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        let present = labels.get(&req.key);
        let ok = match req.operator.as_str() {
            "In" if !values.is_empty() => present.is_some_and(|v| values.contains(v)),
            "NotIn" if !values.is_empty() => present.is_none_or(|v| !values.contains(v)),
            "Exists" if values.is_empty() => present.is_some(),
            "DoesNotExist" if values.is_empty() => present.is_none(),
            _ => return None,
        };
        all &= ok;
    }
    Some(all)
}

/// True when the selector is absent or has no requirement (selects everything).
pub fn is_empty(selector: Option<&LabelSelector>) -> bool {
    selector.is_none_or(|s| {
        s.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && s.match_expressions.as_ref().is_none_or(Vec::is_empty)
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.to_owned(),
                operator: op.to_owned(),
                values: values.map(|v| v.iter().map(|s| (*s).to_owned()).collect()),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn match_labels_require_every_pair() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("a", "1"), ("b", "2")])),
            ..Default::default()
        };
        assert_eq!(
            matches(&sel, &labels(&[("a", "1"), ("b", "2"), ("c", "3")])),
            Some(true)
        );
        assert_eq!(matches(&sel, &labels(&[("a", "1")])), Some(false));
        assert_eq!(
            matches(&sel, &labels(&[("a", "1"), ("b", "3")])),
            Some(false)
        );
    }

    #[test]
    fn each_operator() {
        let l = labels(&[("tier", "public")]);
        assert_eq!(
            matches(&expr("tier", "In", Some(&["public", "x"])), &l),
            Some(true)
        );
        assert_eq!(matches(&expr("tier", "In", Some(&["x"])), &l), Some(false));
        assert_eq!(
            matches(&expr("tier", "NotIn", Some(&["x"])), &l),
            Some(true)
        );
        assert_eq!(
            matches(&expr("tier", "NotIn", Some(&["public"])), &l),
            Some(false)
        );
        assert_eq!(
            matches(&expr("other", "NotIn", Some(&["x"])), &l),
            Some(true)
        );
        assert_eq!(matches(&expr("tier", "Exists", None), &l), Some(true));
        assert_eq!(matches(&expr("other", "Exists", None), &l), Some(false));
        assert_eq!(
            matches(&expr("other", "DoesNotExist", None), &l),
            Some(true)
        );
        assert_eq!(
            matches(&expr("tier", "DoesNotExist", None), &l),
            Some(false)
        );
    }

    #[test]
    fn unparsable_selectors_are_reported() {
        let l = labels(&[("tier", "public")]);
        assert_eq!(matches(&expr("tier", "Maybe", Some(&["x"])), &l), None);
        assert_eq!(matches(&expr("tier", "In", Some(&[])), &l), None);
        assert_eq!(matches(&expr("tier", "In", None), &l), None);
        assert_eq!(matches(&expr("tier", "Exists", Some(&["x"])), &l), None);
    }

    #[test]
    fn empty_selectors() {
        assert!(is_empty(None));
        assert!(is_empty(Some(&LabelSelector::default())));
        assert!(!is_empty(Some(&expr("a", "Exists", None))));
    }
}
