//! A snapshot's image config: the base image's (or its parent's) with the
//! snapshot's layers, a history entry and the labels that find its image
//! again, as a take records it and a rebase onto another engine image
//! writes it anew. The config's bytes name the snapshot's engine image
//! (`load_archive::image_id`), so what goes in, and in what order, is kept
//! the same for the same snapshot.

use serde_json::{Value, json};

use super::SnapshotError;
use crate::backend::SnapshotLabels;
use crate::state::{Snapshot, now_ms};
use crate::timestamp::unix_ms_to_rfc3339;

/// The image config of a snapshot: its parent's (or the base image's),
/// with its layers, a history entry (marked as adding no layer unless it
/// does), and the labels that find it again.
pub(super) fn snapshot_config(
    mut config: Value,
    layers: &[String],
    (id, adds_layer): (&str, bool),
    message: Option<&str>,
    labels: &SnapshotLabels,
) -> Result<String, SnapshotError> {
    set_diff_ids(&mut config, layers)?;
    let Some(object) = config.as_object_mut() else {
        return Err(SnapshotError::Inconsistent(
            "image config is not an object".into(),
        ));
    };
    object.insert(
        "created".into(),
        Value::String(unix_ms_to_rfc3339(now_ms())),
    );
    let history = object
        .entry("history")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Some(history) = history.as_array_mut() {
        let mut entry = json!({
            "created": unix_ms_to_rfc3339(now_ms()),
            "created_by": format!("silo snapshot {id}"),
            "comment": message.unwrap_or_default(),
        });
        // Engines refuse a history naming more layers than the image has.
        if !adds_layer {
            entry["empty_layer"] = Value::Bool(true);
        }
        history.push(entry);
    }
    let inner = object.entry("config").or_insert_with(|| json!({}));
    if inner.is_null() {
        *inner = json!({});
    }
    if let Some(inner) = inner.as_object_mut() {
        let found = inner.entry("Labels").or_insert_with(|| json!({}));
        if found.is_null() {
            *found = json!({});
        }
        if let Some(found) = found.as_object_mut() {
            for (label, value) in labels.of(id) {
                found.insert(label.into(), Value::String(value));
            }
        }
    }
    serde_json::to_string(&config).map_err(|e| SnapshotError::Inconsistent(e.to_string()))
}

/// The config of `snapshot` with its chain squashed into one layer:
/// `layers` as its layers, and the history entries of the `squashed`
/// topmost layers but the last marked as making none.
pub(super) fn squashed_config(
    snapshot: &Snapshot,
    layers: &[String],
    squashed: usize,
) -> Result<String, SnapshotError> {
    let mut config: Value = serde_json::from_str(&snapshot.config)
        .map_err(|e| SnapshotError::Inconsistent(format!("config of {}: {e}", snapshot.id)))?;
    set_diff_ids(&mut config, layers)?;
    merge_history(&mut config, squashed);
    serde_json::to_string(&config).map_err(|e| SnapshotError::Inconsistent(e.to_string()))
}

/// Marks the history entries of the `squashed` topmost layers but the last
/// as making no layer: engines refuse a config whose history names more
/// layers than its `rootfs` has.
fn merge_history(config: &mut Value, squashed: usize) {
    let Some(history) = config.get_mut("history").and_then(Value::as_array_mut) else {
        return;
    };
    let makes_layer = |entry: &Value| entry["empty_layer"] != Value::Bool(true);
    let tops: Vec<usize> = (0..history.len())
        .rev()
        .filter(|&i| makes_layer(&history[i]))
        .take(squashed)
        .collect();
    // `tops` runs from the newest down; the newest keeps its layer.
    for &i in tops.iter().skip(1) {
        if let Some(entry) = history[i].as_object_mut() {
            entry.insert("empty_layer".into(), Value::Bool(true));
        }
    }
}

/// Sets an image config's layers (`rootfs.diff_ids`).
fn set_diff_ids(config: &mut Value, layers: &[String]) -> Result<(), SnapshotError> {
    let Some(object) = config.as_object_mut() else {
        return Err(SnapshotError::Inconsistent(
            "image config is not an object".into(),
        ));
    };
    let diff_ids: Vec<Value> = layers
        .iter()
        .map(|l| Value::String(format!("sha256:{l}")))
        .collect();
    object.insert(
        "rootfs".into(),
        json!({ "type": "layers", "diff_ids": diff_ids }),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_config_carries_its_layers_history_and_labels() {
        let base = json!({
            "architecture": "amd64",
            "os": "linux",
            "config": null,
            "rootfs": { "type": "layers", "diff_ids": ["sha256:aa"] },
            "history": [{ "created_by": "import" }],
        });
        let labels = SnapshotLabels::new("home1".into());
        let text = snapshot_config(
            base,
            &["aa".into(), "bb".into()],
            ("snap-000000000001", true),
            Some("first"),
            &labels,
        )
        .unwrap();
        let config: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"],
            json!(["sha256:aa", "sha256:bb"])
        );
        assert_eq!(config["history"].as_array().unwrap().len(), 2);
        assert_eq!(config["history"][1]["comment"], "first");
        for (label, value) in labels.of("snap-000000000001") {
            assert_eq!(config["config"]["Labels"][label], value.as_str());
        }
        assert_eq!(
            config["config"]["Labels"].as_object().unwrap().len(),
            2,
            "the snapshot's id and the home's"
        );
    }

    #[test]
    fn a_squashed_chain_keeps_one_history_entry_making_a_layer() {
        let config = json!({
            "rootfs": { "type": "layers", "diff_ids": [] },
            "history": [
                { "created_by": "base" },
                { "created_by": "a" },
                { "created_by": "b", "empty_layer": true },
                { "created_by": "c" },
            ],
        });
        let snapshot = Snapshot {
            id: "snap-000000000002".into(),
            sandbox_id: "sbx-00000000000a".into(),
            sandbox_name: "a".into(),
            parent: None,
            spec: crate::spec::SandboxSpec::default(),
            base_image: "base".into(),
            layers: vec!["base".into(), "a".into(), "c".into()],
            config: config.to_string(),
            message: None,
            layer_bytes: 0,
            new_bytes: 0,
            created_at_ms: 0,
        };
        let text = squashed_config(&snapshot, &["base".into(), "ac".into()], 2).unwrap();
        let config: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"],
            json!(["sha256:base", "sha256:ac"])
        );
        let empty: Vec<bool> = config["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["empty_layer"] == Value::Bool(true))
            .collect();
        assert_eq!(empty, [false, true, true, false]);
    }
}
