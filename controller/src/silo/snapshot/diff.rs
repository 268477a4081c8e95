//! `silo diff`: what differs between a sandbox's live tree and one of its
//! snapshots (by default its latest that no diff took), path by path. The live tree is
//! captured first, as a snapshot like any other (message `silo diff`, a
//! checkpoint the sandbox can be rewound to), so both sides are stored
//! trees and every path is compared exactly, bytes included, from the
//! store alone (`store::diff`).
//!
//! A path is bytes, as a name is on Linux. The report names it as the
//! protocol names a baseline's paths: a string when it is UTF-8, and its
//! bytes beside it when it is not (`path_raw`, an array of byte values in
//! JSON), so two names that differ only in bytes that are not UTF-8 stay
//! apart.

use serde::Serialize;

use super::{SnapshotError, blocking, digests, no_progress, remembered};
use crate::silo::{Silo, SiloError};
use crate::store::{PathChange, diff};

/// The message of the snapshot a diff takes of the live tree.
pub const DIFF_MESSAGE: &str = "silo diff";

/// What differs between a sandbox's live tree and a snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    /// The sandbox's name.
    pub sandbox: String,
    /// The snapshot compared with.
    pub snapshot: String,
    /// The snapshot taken of the live tree.
    pub live: String,
    /// Every path that differs, sorted: added and removed are from the
    /// snapshot's tree to the live one.
    pub paths: Vec<DiffedPath>,
}

/// One path that differs.
#[derive(Debug, Clone, Serialize)]
pub struct DiffedPath {
    /// Absolute. Exact when it is UTF-8; otherwise each byte that is not
    /// shown as U+FFFD, and the exact path is `path_raw`.
    pub path: String,
    /// The path's bytes, only when it is not UTF-8 (left out of JSON
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_raw: Option<Vec<u8>>,
    /// How it differs.
    #[serde(flatten)]
    pub change: PathChange,
}

impl DiffedPath {
    /// `path` (relative to `/`, as bytes) differing as `change`.
    pub fn new(path: &[u8], change: PathChange) -> Self {
        let mut absolute = Vec::with_capacity(path.len() + 1);
        absolute.push(b'/');
        absolute.extend_from_slice(path);
        match String::from_utf8(absolute) {
            Ok(path) => Self {
                path,
                path_raw: None,
                change,
            },
            Err(raw) => Self {
                path: String::from_utf8_lossy(raw.as_bytes()).into_owned(),
                path_raw: Some(raw.into_bytes()),
                change,
            },
        }
    }

    /// The path's exact bytes.
    pub fn path_bytes(&self) -> &[u8] {
        self.path_raw.as_deref().unwrap_or(self.path.as_bytes())
    }
}

impl Silo {
    /// What differs between sandbox `name_or_id`'s live tree and
    /// `snapshot` (when `None`, its latest that no diff took); see the
    /// module docs.
    pub async fn diff(
        &self,
        name_or_id: &str,
        snapshot: Option<&str>,
    ) -> Result<DiffReport, SiloError> {
        let sandbox = self.get(name_or_id)?;
        let target = match snapshot {
            Some(id) => self.db().snapshot(id)?,
            // The latest a diff did not take: a diff after a diff compares
            // with what the user took, not with the last diff's capture.
            None => self
                .snapshots(Some(&sandbox.id))?
                .into_iter()
                .rev()
                .find(|snapshot| snapshot.message.as_deref() != Some(DIFF_MESSAGE))
                .ok_or_else(|| SnapshotError::NoSnapshots {
                    name: sandbox.name.clone(),
                })?,
        };
        let live = self
            .snapshot(&sandbox.id, Some(DIFF_MESSAGE.to_owned()), &no_progress())
            .await?
            .snapshot;
        let store = self.store()?;
        // A provider's template is held as its paths alone.
        let base = self.base_of(&target)?;
        let unheld_base = match base.layers.is_empty() {
            true => Some(remembered::index(&store, &base, &[]).await?),
            false => None,
        };
        let (from, to) = (digests(&target.layers)?, digests(&live.layers)?);
        let found = blocking(move || {
            let unheld = unheld_base.as_ref().map(|tree| &tree.index);
            Ok(diff(&store, &from, &to, unheld)?)
        })
        .await?;
        let paths = found
            .into_iter()
            .map(|found| DiffedPath::new(&found.path, found.change))
            .collect();
        Ok(DiffReport {
            sandbox: sandbox.name,
            snapshot: target.id,
            live: live.id,
            paths,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn json_diff_keeps_non_utf8_names_apart() {
        let paths: Vec<DiffedPath> = [&b"w/\xff\xfe"[..], b"w/\xfe\xff", b"w/a\nb"]
            .into_iter()
            .map(|path| DiffedPath::new(path, PathChange::Added))
            .collect();
        let json: Vec<serde_json::Value> = paths
            .iter()
            .map(|path| serde_json::to_value(path).unwrap())
            .collect();
        assert_ne!(json[0], json[1]);
        // What a script does: the bytes when given, else the string's.
        let decoded: Vec<Vec<u8>> = json
            .iter()
            .map(|value| match value.get("path_raw") {
                Some(raw) => serde_json::from_value(raw.clone()).unwrap(),
                None => value["path"].as_str().unwrap().as_bytes().to_vec(),
            })
            .collect();
        assert_eq!(decoded, [&b"/w/\xff\xfe"[..], b"/w/\xfe\xff", b"/w/a\nb"]);
        assert_eq!(json[2]["path"], "/w/a\nb");
        assert_eq!(json[2]["change"], "added");
        assert_eq!(paths[0].path_bytes(), b"/w/\xff\xfe");
        assert_eq!(paths[2].path_bytes(), b"/w/a\nb");
    }
}
