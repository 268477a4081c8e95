//! Secrets: stored as given, with `stringData` folded into `data` on create
//! (its values win, as the API server does) and `type` `Opaque` unless
//! given; keys must be what a file name may be. Pods read them through
//! `secret` volumes ([`super::volumes`]).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use super::objects::Stored;
use super::status::{FieldProblem, Kind};
use super::store::{Table, secrets};

/// Whether `key` may be a Secret's key (letters, digits, `-`, `_`, `.`; not `.` or `..`).
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Stored for Secret {
    const NAMES: Kind = Kind {
        kind: "Secret",
        resource: "secrets",
        group: "",
    };
    const TABLE: Table<Self> = secrets;

    fn admit(&mut self) -> Vec<FieldProblem> {
        let mut data = self.data.take().unwrap_or_default();
        for (key, value) in self.string_data.take().unwrap_or_default() {
            data.insert(key, ByteString(value.into_bytes()));
        }
        let problems = data
            .keys()
            .filter(|k| !valid_key(k))
            .map(|k| {
                FieldProblem::invalid(
                    format!("data[{k}]"),
                    k,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                )
            })
            .collect();
        self.data = Some(data);
        self.type_.get_or_insert_with(|| "Opaque".to_owned());
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn string_data_folds_into_data() {
        let mut secret = Secret {
            data: Some(BTreeMap::from([
                ("a".into(), ByteString(b"old".to_vec())),
                ("b".into(), ByteString(b"kept".to_vec())),
            ])),
            string_data: Some(BTreeMap::from([("a".into(), "new".into())])),
            ..Default::default()
        };
        assert!(secret.admit().is_empty());
        let data = secret.data.as_ref().unwrap();
        assert_eq!(data["a"].0, b"new");
        assert_eq!(data["b"].0, b"kept");
        assert!(secret.string_data.is_none());
        assert_eq!(secret.type_.as_deref(), Some("Opaque"));
        let json = serde_json::to_value(&secret).unwrap();
        assert_eq!(json["data"]["a"], "bmV3");
        let mut bad = Secret {
            string_data: Some(BTreeMap::from([("no/slash".into(), "x".into())])),
            ..Default::default()
        };
        assert_eq!(bad.admit().len(), 1);
    }
}
