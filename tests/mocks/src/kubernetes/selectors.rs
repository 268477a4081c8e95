//! Label and field selectors, as list and watch read them: labels with
//! equality (`k=v`, `k==v`, `k!=v`), existence (`k`, `!k`) and sets
//! (`k in (a,b)`, `k notin (a)`), terms joined by commas; fields with
//! equality on the few fields each resource lets one select by (the rest
//! are `400` as the API answers them).

use std::collections::BTreeMap;

/// One term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelTerm {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector`; empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelTerm>);

/// A parsed `fieldSelector`: `(field, value, equal)` terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, String, bool)>);

/// Splits on commas outside parentheses.
fn top_level_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

/// Whether `key` may be a label key (an optional DNS prefix and `/`, then a
/// name of letters, digits, `-`, `_`, `.`).
fn valid_key(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(_, n)| n);
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn valid_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn parse_set(key: &str, rest: &str, text: &str) -> Result<Vec<String>, String> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("unable to parse requirement: {text:?}: expected a (...) set"))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
    if values.iter().any(|v| !valid_value(v)) || !valid_key(key) {
        return Err(format!("unable to parse requirement: {text:?}"));
    }
    Ok(values)
}

impl LabelSelector {
    /// Parses a `labelSelector` query value.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(terms));
        }
        for raw in top_level_terms(text) {
            let term = raw.trim();
            let parsed = if let Some(key) = term.strip_prefix('!') {
                LabelTerm::Absent(key.trim().to_owned())
            } else if let Some((key, rest)) = term.split_once(" notin ") {
                LabelTerm::NotIn(key.trim().to_owned(), parse_set(key.trim(), rest, term)?)
            } else if let Some((key, rest)) = term.split_once(" in ") {
                LabelTerm::In(key.trim().to_owned(), parse_set(key.trim(), rest, term)?)
            } else if let Some((key, value)) = term.split_once("!=") {
                LabelTerm::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once("==") {
                LabelTerm::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once('=') {
                LabelTerm::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else {
                LabelTerm::Exists(term.to_owned())
            };
            let (key, value) = match &parsed {
                LabelTerm::Equals(k, v) | LabelTerm::NotEquals(k, v) => (k, Some(v)),
                LabelTerm::Exists(k) | LabelTerm::Absent(k) => (k, None),
                LabelTerm::In(k, _) | LabelTerm::NotIn(k, _) => (k, None),
            };
            if !valid_key(key) || value.is_some_and(|v| !valid_value(v)) {
                return Err(format!("unable to parse requirement: {term:?}"));
            }
            terms.push(parsed);
        }
        Ok(Self(terms))
    }

    /// Whether `labels` satisfy every term.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |key: &str| labels.and_then(|l| l.get(key));
        self.0.iter().all(|term| match term {
            LabelTerm::Equals(k, v) => get(k) == Some(v),
            LabelTerm::NotEquals(k, v) => get(k) != Some(v),
            LabelTerm::Exists(k) => get(k).is_some(),
            LabelTerm::Absent(k) => get(k).is_none(),
            LabelTerm::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            LabelTerm::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
        })
    }
}

impl FieldSelector {
    /// Parses a `fieldSelector` query value, allowing only `supported` fields.
    pub fn parse(text: &str, supported: &[&str]) -> Result<Self, String> {
        let mut terms = Vec::new();
        if text.trim().is_empty() {
            return Ok(Self(terms));
        }
        for raw in text.split(',') {
            let term = raw.trim();
            let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, true)
            } else {
                return Err(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                ));
            };
            if !supported.contains(&field.trim()) {
                return Err(format!("field label not supported: {}", field.trim()));
            }
            terms.push((field.trim().to_owned(), value.trim().to_owned(), equal));
        }
        Ok(Self(terms))
    }

    /// Whether an object satisfies every term; `field` reads a field's
    /// value (empty when unset, as the API compares it).
    pub fn matches(&self, field: impl Fn(&str) -> String) -> bool {
        self.0
            .iter()
            .all(|(name, value, equal)| (field(name) == *value) == *equal)
    }

    /// The name a `metadata.name=X` term selects, if there is one.
    pub fn name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(field, _, equal)| field == "metadata.name" && *equal)
            .map(|(_, value, _)| value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn label_terms_select_as_the_api_does() {
        let pod = labels(&[("app", "web"), ("tier", "front")]);
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("tier", true),
            ("owner", false),
            ("!owner", true),
            ("!tier", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("app in (db, web)", true),
            ("app notin (web)", false),
            ("owner notin (x)", true),
            ("app in (db),tier", false),
            ("silo.dev/sandbox!=x", true),
        ];
        for (selector, expected) in cases {
            let parsed = LabelSelector::parse(selector).unwrap();
            assert_eq!(parsed.matches(Some(&pod)), expected, "{selector}");
        }
        assert!(!LabelSelector::parse("app=web").unwrap().matches(None));
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
    }

    #[test]
    fn field_terms_allow_only_known_fields() {
        let selector = FieldSelector::parse(
            "metadata.name=web,status.phase!=Failed",
            &["metadata.name", "status.phase"],
        )
        .unwrap();
        assert_eq!(selector.name(), Some("web"));
        assert!(selector.matches(|f| match f {
            "metadata.name" => "web".into(),
            _ => "Running".into(),
        }));
        assert!(!selector.matches(|f| match f {
            "metadata.name" => "web".into(),
            _ => "Failed".into(),
        }));
        let refused = FieldSelector::parse("spec.image=x", &["metadata.name"]).unwrap_err();
        assert_eq!(refused, "field label not supported: spec.image");
    }
}
