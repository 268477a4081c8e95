//! The file API: read, write, stat, list, make and remove paths in a
//! sandbox, and move whole trees in and out as tar streams.
//!
//! Every request names its path in the `path` query parameter (see
//! [`FileQuery`]); every request is signed like the rest, and a body's
//! SHA-256 is checked before anything it carries becomes visible.
//!
//! # Which paths are allowed
//! The agent acts with the sandbox user's rights, so the file API reaches
//! what a command in the sandbox could reach, no more: an absolute path is
//! the sandbox's own path (on the local backend, a host path, as commands
//! see it); a relative one is taken from the agent's working directory.
//! `.` and `..` components and NUL bytes are refused outright.
//!
//! With `confine=DIR` the caller asks for confinement: the path must lie
//! under `DIR`, and no component from `DIR` down may be a symlink, so a
//! link planted in the tree cannot steer a read or a write outside it (the
//! same rule push applies below its roots).
//!
//! # Endpoints
//! | method and path | does | answers |
//! |---|---|---|
//! | `GET` [`PATH_FILE`] | reads a regular file | its bytes |
//! | `PUT` [`PATH_FILE`] | writes a file atomically (temp file and rename); `mode`, `parents` | [`FileStat`] |
//! | `DELETE` [`PATH_FILE`] | removes a file, a symlink or an empty directory; `recursive` for a tree | [`Removed`] |
//! | `GET` [`PATH_STAT`] | describes a path without following a final symlink | [`FileStat`] |
//! | `GET` [`PATH_LIST`] | a directory's entries, sorted by name | [`Listing`] |
//! | `POST` [`PATH_MKDIR`] | makes a directory; `mode`, `parents` | [`FileStat`] |
//! | `POST` [`PATH_RENAME`] | moves `path` to `to` (`rename(2)`: atomic, same file system; an existing file at `to` is replaced, a directory only when empty); `parents` | [`FileStat`] of `to` |
//! | `GET` [`PATH_TREE`] | a file or a tree as an uncompressed tar, entries named relative to the path's parent | tar bytes |
//! | `PUT` [`PATH_TREE`] | unpacks a tar into the directory `path` (made if missing), merging; the push extract's rules apply to every entry | [`TreeWritten`] |
//!
//! Failure is the usual [`crate::http::ErrorBody`]; its kinds are those of
//! [`crate::error::ErrorKind`] marked for the file API and the shared ones
//! (`malformed`, `permission_denied`, `not_found`, `too_large`,
//! `hash_mismatch`, `disk_full`, `internal`).

use serde::{Deserialize, Serialize};

use crate::query::{Query, QueryBuilder, QueryError};

/// One file: `GET` reads, `PUT` writes, `DELETE` removes.
pub const PATH_FILE: &str = "/v1/files/file";
/// `GET`: what is at a path.
pub const PATH_STAT: &str = "/v1/files/stat";
/// `GET`: a directory's entries.
pub const PATH_LIST: &str = "/v1/files/list";
/// `POST`: make a directory.
pub const PATH_MKDIR: &str = "/v1/files/mkdir";
/// `POST`: move a path to the name in `to` (new in protocol 8).
pub const PATH_RENAME: &str = "/v1/files/rename";
/// A tree as tar: `GET` downloads, `PUT` uploads.
pub const PATH_TREE: &str = "/v1/files/tree";

/// Largest single file `PUT` [`PATH_FILE`] takes (larger ones go as a tree).
pub const MAX_FILE_WRITE: u64 = 4 << 30;

/// The query of every file request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileQuery {
    /// The path the request is about.
    pub path: String,
    /// Keep the request beneath this absolute directory, through no symlink.
    pub confine: Option<String>,
    /// Permission bits of a written file or a made directory (default
    /// 0644 and 0755, before the agent's umask; an existing file's mode is
    /// kept when unset).
    pub mode: Option<u32>,
    /// Make missing parent directories (write, mkdir, tree upload).
    pub parents: bool,
    /// Remove a directory with everything in it.
    pub recursive: bool,
    /// Rename only: the new name (`confine` applies to it too).
    pub to: Option<String>,
}

impl FileQuery {
    /// A query about `path` with every option at its default.
    pub fn new(path: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }

    /// `endpoint?path=…&…`: the exact text to sign.
    pub fn path_and_query(&self, endpoint: &str) -> String {
        let mode = self.mode.map(|m| format!("{m:o}"));
        QueryBuilder::new(endpoint)
            .param("path", &self.path)
            .param_opt("confine", self.confine.as_deref())
            .param_opt("mode", mode.as_deref())
            .flag("parents", self.parents)
            .flag("recursive", self.recursive)
            .param_opt("to", self.to.as_deref())
            .finish()
    }

    /// Reads a file request's query.
    pub fn parse(query: Option<&str>) -> Result<Self, QueryError> {
        let query = Query::parse(query)?;
        let mode = match query.get("mode")? {
            None => None,
            Some(text) => Some(
                u32::from_str_radix(text, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or(QueryError::BadValue {
                        name: "mode",
                        expected: "octal permission bits, at most 7777",
                    })?,
            ),
        };
        Ok(Self {
            path: query.require("path")?.to_owned(),
            confine: query.get("confine")?.map(str::to_owned),
            mode,
            parents: query.flag("parents")?,
            recursive: query.flag("recursive")?,
            to: query.get("to")?.map(str::to_owned),
        })
    }
}

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by stat or list).
    Symlink,
    /// A device, socket or FIFO.
    Other,
}

/// One path's description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// The path as the request named it (for a listing: the directory's path
    /// joined with the entry's name).
    pub path: String,
    /// The last component.
    pub name: String,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes (a symlink's: its target's length).
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Last modification, milliseconds since the Unix epoch.
    pub modified_ms: i64,
    /// Where a symlink points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// A directory's entries, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// The directory's entries (not `.` or `..`).
    pub entries: Vec<FileStat>,
}

/// What a `DELETE` removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    /// Paths removed (1 for a file; everything in a tree).
    pub entries: u64,
}

/// What a tree upload wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeWritten {
    /// Regular files written.
    pub files: u64,
    /// Directories made or kept.
    pub dirs: u64,
    /// Bytes of file contents written.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn queries_round_trip() {
        let full = FileQuery {
            path: "rel/a b.txt".into(),
            confine: Some("/workspace".into()),
            mode: Some(0o755),
            parents: true,
            recursive: true,
            to: Some("new name/b.txt".into()),
        };
        for q in [FileQuery::new("/etc/hosts"), full] {
            let text = q.path_and_query(PATH_FILE);
            let (path, query) = text.split_once('?').unwrap();
            assert_eq!(path, PATH_FILE);
            assert_eq!(FileQuery::parse(Some(query)).unwrap(), q);
        }
        assert!(FileQuery::parse(Some("path=/a&mode=9")).is_err());
        assert!(FileQuery::parse(Some("path=/a&mode=17777")).is_err());
        assert!(FileQuery::parse(Some("mode=644")).is_err());
    }

    #[test]
    fn stats_are_plain_json() {
        let stat = FileStat {
            path: "/a".into(),
            name: "a".into(),
            kind: FileKind::Symlink,
            size: 4,
            mode: 0o777,
            modified_ms: 1,
            link_target: Some("/etc".into()),
        };
        let json = serde_json::to_string(&stat).unwrap();
        assert!(json.contains(r#""kind":"symlink""#), "{json}");
        assert_eq!(serde_json::from_str::<FileStat>(&json).unwrap(), stat);
    }
}
