//! The journal of a layer being placed, so that an agent killed half way
//! leaves a machine the next boot finishes, never one holding part of a
//! layer.
//!
//! Once a layer is staged and checked, and before the first live change,
//! its plan is written into its staging directory (`journal`, written
//! beside and renamed, so it is whole or absent). When the removals are
//! done a marker (`removed`) says so. The staging directory, journal
//! included, is removed once the layer is in place. At boot, before the
//! agent serves anything, [`finish_interrupted`] places again every staged
//! layer that still has its journal: the removals only if they were not
//! done (a removal run again could remove what the layer placed since),
//! the files and symlinks still in staging (those renamed into place are
//! gone from it), every directory, hard link and directory metadata
//! (placing those twice changes nothing).
//!
//! Neither file is fsynced: the journal guards against the agent's death
//! (a `kill -9`, the container killed), whose writes the kernel keeps,
//! not against the machine's; the layer's files are not synced either.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use silo_protocol::layers::PlacedLayer;

use super::place::{self, Resume, Target};
use super::placed;
use super::stage::Plan;
use super::{STAGING_DIR, excluded_roots, remove_staging};
use crate::fs_error::FsError;
use crate::paths::STATE_DIR;

/// The plan, in a staging directory (staged entries are numbers).
const JOURNAL: &str = "journal";
/// The journal while it is written.
const JOURNAL_PART: &str = "journal.part";
/// Present once the plan's removals are done.
const REMOVED: &str = "removed";

/// Writes `plan` as the journal of the layer staged in `staging`.
pub fn write(staging: &Path, plan: &Plan) -> Result<(), FsError> {
    let part = staging.join(JOURNAL_PART);
    let text = serde_json::to_vec(plan).map_err(|err| FsError::new("encode", &part, err.into()))?;
    let mut file = fs::File::create(&part).map_err(FsError::at("create", &part))?;
    file.write_all(&text).map_err(FsError::at("write", &part))?;
    let journal = staging.join(JOURNAL);
    fs::rename(&part, &journal).map_err(FsError::at("rename", &journal))
}

/// Records that the removals of the layer staged in `staging` are done.
pub fn mark_removed(staging: &Path) -> Result<(), FsError> {
    let marker = staging.join(REMOVED);
    fs::File::create(&marker)
        .map(drop)
        .map_err(FsError::at("create", &marker))
}

/// Whether the layer staged in `staging` was being placed.
pub fn exists(staging: &Path) -> bool {
    staging.join(JOURNAL).is_file()
}

/// What finishing the interrupted applies at boot did.
#[derive(Debug, Default)]
pub struct Finished {
    /// Layers placed whole.
    pub finished: usize,
    /// Layers that could not be: the staging directory and the reason.
    pub failed: Vec<(PathBuf, String)>,
}

/// Places every layer under `root`'s staging area that an earlier agent
/// had begun to place (blocking). Those that cannot be placed keep their
/// staging directory and journal, and are reported.
pub fn finish_interrupted(root: &Path) -> Finished {
    let mut done = Finished::default();
    let dir = root.join(STATE_DIR).join(STAGING_DIR);
    let Ok(entries) = fs::read_dir(&dir) else {
        return done;
    };
    for staging in entries.flatten().map(|entry| entry.path()) {
        if !exists(&staging) {
            continue;
        }
        match finish(root, &staging) {
            Ok(sha256) => {
                remove_staging(&staging);
                done.finished += 1;
                // The controller that sent it may have died meanwhile: the
                // record tells whoever asks next that it is in.
                let placed = PlacedLayer {
                    sha256,
                    applied_at_ns: crate::clock::unix_ns_now().unwrap_or(0),
                };
                if !placed.sha256.is_empty()
                    && let Err(err) = placed::write(root, &placed)
                {
                    tracing::warn!(%err, "cannot record the layer finished at boot");
                }
            }
            Err(err) => {
                let reason = silo_protocol::http::error_chain(&err);
                done.failed.push((staging, reason));
            }
        }
    }
    done
}

/// Places the journaled layer staged in `staging` again; its SHA-256
/// (empty from a journal that predates it).
fn finish(root: &Path, staging: &Path) -> Result<String, FsError> {
    let journal = staging.join(JOURNAL);
    let text = fs::read(&journal).map_err(FsError::at("read", &journal))?;
    let plan: Plan = serde_json::from_slice(&text)
        .map_err(|err| FsError::new("decode", &journal, err.into()))?;
    let excluded = excluded_roots(root).map_err(|err| {
        FsError::new(
            "list the mounts under",
            root,
            std::io::Error::other(silo_protocol::http::error_chain(&err)),
        )
    })?;
    let target = Target {
        root,
        staging,
        excluded: &excluded,
    };
    let resume = Resume {
        again: true,
        removals_done: staging.join(REMOVED).exists(),
    };
    let placed = place::place(&plan, target, resume, || mark_removed(staging))?;
    tracing::info!(
        staging = %staging.display(),
        files = placed.files,
        whiteouts = placed.whiteouts,
        "finished placing a layer an earlier agent had begun"
    );
    Ok(plan.sha256)
}
