//! A request's path, made absolute and held to its `confine`.
//!
//! The lexical rules come first and need no disk: no empty path, no NUL,
//! no `.` or `..` component (so `starts_with` on components is a sound
//! "is under" test). Under `confine`, every existing component from the
//! confining directory down, the last included, is then looked at with
//! `symlink_metadata`, and a symlink anywhere refuses the request. The
//! walk is repeated by every operation right before it acts, and parents
//! are made one checked component at a time, as `push::mount` does for
//! mount paths.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use silo_protocol::files::FileQuery;

use super::{DEFAULT_DIR_MODE, FilesError};
use crate::fs_error::FsError;

/// A checked request path.
#[derive(Debug, Clone)]
pub struct Target {
    /// The path as the request named it, for answers.
    pub shown: String,
    /// The path on disk, absolute.
    pub path: PathBuf,
    /// The directory the request must stay beneath, if it asked.
    pub confine: Option<PathBuf>,
}

impl Target {
    /// Checks `query`'s path and confinement lexically; a relative path is
    /// taken from `workdir`.
    pub fn resolve(query: &FileQuery, workdir: &Path) -> Result<Self, FilesError> {
        lexical(&query.path)?;
        let given = Path::new(&query.path);
        let path = if given.is_absolute() {
            given.to_path_buf()
        } else {
            workdir.join(given)
        };
        let confine = match &query.confine {
            None => None,
            Some(dir) => {
                lexical(dir)?;
                let dir = PathBuf::from(dir);
                if !dir.is_absolute() {
                    return Err(FilesError::BadPath {
                        path: query.confine.clone().unwrap_or_default(),
                        reason: "confine must be an absolute path",
                    });
                }
                if !path.starts_with(&dir) {
                    return Err(FilesError::OutsideConfine {
                        path,
                        reason: "is not beneath it",
                    });
                }
                Some(dir)
            }
        };
        Ok(Self {
            shown: query.path.clone(),
            path,
            confine,
        })
    }

    /// The last component, as answers name it.
    pub fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.shown.clone(),
            |name| name.to_string_lossy().into_owned(),
        )
    }

    /// The directory holding the path.
    pub fn parent(&self) -> Result<&Path, FilesError> {
        self.path.parent().ok_or_else(|| FilesError::BadPath {
            path: self.shown.clone(),
            reason: "has no parent directory",
        })
    }

    /// Under `confine`, refuses a symlink at any existing component from the
    /// confining directory down, the path's own included.
    pub fn check(&self) -> Result<(), FilesError> {
        let Some(confine) = &self.confine else {
            return Ok(());
        };
        let mut at = confine.clone();
        for part in below(&self.path, confine) {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(FilesError::OutsideConfine {
                        path: at,
                        reason: "is a symlink",
                    });
                }
                Ok(_) => {}
                // What is missing cannot be a symlink; a file used as a
                // directory is for the operation itself to report.
                Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                    return Ok(());
                }
                Err(err) => return Err(FsError::new("inspect", &at, err).into()),
            }
        }
        Ok(())
    }

    /// Makes the missing directories above the path, each with
    /// [`DEFAULT_DIR_MODE`], and names those it made (for [`undo`]).
    pub fn make_parents(&self) -> Result<Vec<PathBuf>, FilesError> {
        let parent = self.parent()?.to_path_buf();
        let mut made = Vec::new();
        let result = self.make_dirs_to(&parent, &mut made);
        if result.is_err() {
            undo(&made);
        }
        result.map(|()| made)
    }

    /// With `parents`, [`Target::make_parents`]; without, insists that the
    /// parent is there and a directory.
    pub fn ensure_parent(&self, parents: bool) -> Result<Vec<PathBuf>, FilesError> {
        if parents {
            return self.make_parents();
        }
        let parent = self.parent()?;
        match std::fs::metadata(parent) {
            Ok(meta) if meta.is_dir() => Ok(Vec::new()),
            Ok(_) => Err(FilesError::NotADirectory(parent.to_path_buf())),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                Err(FilesError::NotFound(parent.to_path_buf()))
            }
            Err(err) => Err(FsError::new("inspect", parent, err).into()),
        }
    }

    fn make_dirs_to(&self, dir: &Path, made: &mut Vec<PathBuf>) -> Result<(), FilesError> {
        let mut at = PathBuf::new();
        for part in dir.components() {
            at.push(part);
            let confined = self
                .confine
                .as_ref()
                .is_some_and(|c| at.starts_with(c) && at != *c);
            match std::fs::symlink_metadata(&at) {
                Ok(meta) if meta.is_dir() => {}
                Ok(meta) if meta.file_type().is_symlink() => {
                    if confined {
                        return Err(FilesError::OutsideConfine {
                            path: at,
                            reason: "is a symlink",
                        });
                    }
                    // Unconfined, a link to a directory is used as a command would.
                    if !std::fs::metadata(&at).is_ok_and(|m| m.is_dir()) {
                        return Err(FilesError::NotADirectory(at));
                    }
                }
                Ok(_) => return Err(FilesError::NotADirectory(at)),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    match std::fs::DirBuilder::new()
                        .mode(DEFAULT_DIR_MODE)
                        .create(&at)
                    {
                        Ok(()) => made.push(at.clone()),
                        // Made by someone else meanwhile: it is there now.
                        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(err) => return Err(FsError::new("create", &at, err).into()),
                    }
                }
                Err(err) => return Err(FsError::new("inspect", &at, err).into()),
            }
        }
        Ok(())
    }
}

/// Removes directories [`Target::make_parents`] made, deepest first, as
/// far as they are still empty.
pub fn undo(made: &[PathBuf]) {
    for dir in made.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
}

/// The components of `path` below `dir` (which it starts with).
fn below<'a>(path: &'a Path, dir: &Path) -> impl Iterator<Item = Component<'a>> {
    path.components().skip(dir.components().count())
}

/// The rules every path meets before anything looks at the disk.
fn lexical(text: &str) -> Result<(), FilesError> {
    let bad = |reason| FilesError::BadPath {
        path: text.to_owned(),
        reason,
    };
    if text.is_empty() {
        return Err(bad("is empty"));
    }
    if text.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    if text.split('/').any(|part| part == "." || part == "..") {
        return Err(bad("has a '.' or '..' component"));
    }
    Ok(())
}
