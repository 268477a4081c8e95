//! What differs between two specs, setting by setting, for the error that
//! refuses to reuse a sandbox whose spec changed.
//!
//! It compares the specs' JSON forms, flattened to dotted keys (`env.PATH`,
//! `binds`), so every setting, including ones added later, is covered without
//! this module knowing each field.

use std::collections::BTreeMap;

use serde_json::Value;

use super::SandboxSpec;

impl SandboxSpec {
    /// One line per setting that differs from `stored` to `self`, in key
    /// order: `image: "busybox" -> "alpine"`, with `unset` for an absent setting.
    pub fn differences_from(&self, stored: &SandboxSpec) -> Vec<String> {
        let before = flatten(stored);
        let after = flatten(self);
        let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter_map(|key| {
                let (old, new) = (before.get(key), after.get(key));
                (old != new).then(|| format!("{key}: {} -> {}", shown(old), shown(new)))
            })
            .collect()
    }
}

fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "unset".to_owned(), Value::to_string)
}

/// The spec's settings as dotted keys; maps are opened one level (so each
/// environment variable or label is its own line), lists are kept whole.
fn flatten(spec: &SandboxSpec) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let Ok(Value::Object(fields)) = serde_json::to_value(spec) else {
        return out;
    };
    for (key, value) in fields {
        match value {
            Value::Object(map) => {
                for (inner, value) in map {
                    out.insert(format!("{key}.{inner}"), value);
                }
            }
            other => {
                out.insert(key, other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::BackendKind;

    #[test]
    fn differences_name_each_changed_setting() {
        let mut old = SandboxSpec::new(BackendKind::Docker);
        old.image = Some("busybox".into());
        old.env.insert("A".into(), "1".into());
        old.env.insert("B".into(), "2".into());
        let mut new = old.clone();
        assert!(new.differences_from(&old).is_empty());
        new.image = Some("alpine".into());
        new.env.remove("B");
        new.env.insert("C".into(), "3".into());
        new.idle_timeout_secs = Some(60);
        assert_eq!(
            new.differences_from(&old),
            [
                r#"env.B: "2" -> unset"#,
                r#"env.C: unset -> "3""#,
                "idle_timeout_secs: unset -> 60",
                r#"image: "busybox" -> "alpine""#,
            ]
        );
    }
}
