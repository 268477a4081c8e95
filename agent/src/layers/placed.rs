//! The record of the last layer placed on this machine, kept in the
//! agent's own directory (`placed.json`, written beside and renamed, so it
//! is whole or absent) across restarts: a controller that died while its
//! rewind's layer was placed learns from `GET /healthz` that the layer is
//! in, and an agent that finished a cut apply at boot reports that layer
//! the same way.
//!
//! The record is written after the layer is in place and its staging gone;
//! a failure to write it is logged, never the apply's failure (the layer
//! is in either way; what is lost is only a dead client's way to learn it).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use silo_protocol::layers::PlacedLayer;

use crate::paths::STATE_DIR;

/// The record, in the agent's directory.
const RECORD: &str = "placed.json";
/// The record while it is written.
const RECORD_PART: &str = "placed.json.part";

/// The last layer placed, and the one being applied now.
#[derive(Debug, Default)]
pub struct LastPlaced {
    root: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<PlacedLayer>,
    applying: Option<String>,
}

impl LastPlaced {
    /// What the record under `root` says (blocking): nothing if there is
    /// none or it cannot be read.
    pub fn load(root: &Path) -> Self {
        let path = root.join(STATE_DIR).join(RECORD);
        let last = fs::read(&path)
            .ok()
            .and_then(|text| serde_json::from_slice(&text).ok());
        Self {
            root: root.to_owned(),
            state: Mutex::new(State {
                last,
                applying: None,
            }),
        }
    }

    /// The last layer placed, and the one being applied now.
    pub fn get(&self) -> (Option<PlacedLayer>, Option<String>) {
        let state = self.lock();
        (state.last.clone(), state.applying.clone())
    }

    /// Notes that the layer `sha256` is being applied (until placed, or
    /// `done` without it).
    pub fn applying(&self, sha256: &str) {
        self.lock().applying = Some(sha256.to_owned());
    }

    /// Notes that no layer is being applied any more.
    pub fn done(&self) {
        self.lock().applying = None;
    }

    /// Records `layer` as placed (blocking).
    pub fn placed(&self, layer: PlacedLayer) {
        if let Err(err) = write(&self.root, &layer) {
            tracing::warn!(%err, sha256 = layer.sha256, "cannot record the layer placed");
        }
        let mut state = self.lock();
        state.last = Some(layer);
        state.applying = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Writes the record of `layer` under `root` (blocking).
pub fn write(root: &Path, layer: &PlacedLayer) -> std::io::Result<()> {
    let dir = root.join(STATE_DIR);
    let part = dir.join(RECORD_PART);
    fs::write(&part, serde_json::to_vec(layer)?)?;
    fs::rename(&part, dir.join(RECORD))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn the_record_outlives_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(STATE_DIR)).unwrap();
        let first = LastPlaced::load(dir.path());
        assert_eq!(first.get(), (None, None));
        first.applying("abc");
        assert_eq!(first.get().1.as_deref(), Some("abc"));
        let layer = PlacedLayer {
            sha256: "abc".into(),
            applied_at_ns: 7,
        };
        first.placed(layer.clone());
        assert_eq!(first.get(), (Some(layer.clone()), None));
        assert_eq!(LastPlaced::load(dir.path()).get(), (Some(layer), None));
    }
}
