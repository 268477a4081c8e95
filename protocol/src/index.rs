//! The path index channel (new with remote backends): `POST /v1/index`
//! with a JSON [`IndexRequest`]; no query. The answer
//! ([`INDEX_CONTENT_TYPE`]) is every path of the machine's file system,
//! streamed.
//!
//! The controller takes it once per template, from a fresh machine, as the
//! baseline a snapshot's deletions are found against (the
//! [`crate::snapshot::SnapshotRequest::baseline`] of its first snapshot):
//! on a machine that is not a Docker engine there is no image export to
//! read the paths from. It takes it too from the first container of a
//! Docker image its store lacks, before anything else runs there, so that
//! container's first snapshot need not wait for the image's export.
//!
//! The body is the controller's stored path index, uncompressed: each path
//! relative to `/`, without a leading or trailing slash, followed by one
//! NUL byte, in byte order; the root itself is not listed. The walk never
//! follows a symlink and leaves out `/proc`, `/sys`, `/dev`, every mount
//! point in the agent's `/proc/self/mountinfo` and the request's
//! exclusions, each with everything under it, and sockets. Names that are
//! not UTF-8 are left out (with everything under them): a baseline is JSON
//! strings and could not carry them. A body that does not end cleanly (the
//! chunked encoding's last chunk is missing) was cut short and must be
//! discarded; errors before the first byte are the usual
//! [`crate::http::ErrorBody`] with one of the [`crate::ErrorKind`] values.

use serde::{Deserialize, Serialize};

use crate::http::PATH_INDEX;

/// Content type of the answer.
pub const INDEX_CONTENT_TYPE: &str = "application/octet-stream";
/// The byte that ends each path of the answer.
pub const PATH_END: u8 = 0;

/// What the controller asks the agent to list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexRequest {
    /// Absolute paths left out with everything under them (the agent's own
    /// directory, the provider's files and the like).
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// The request path.
pub fn path() -> &'static str {
    PATH_INDEX
}

/// Splits an answer body into its paths; `None` if the last one is not
/// terminated (the body was cut inside a path).
pub fn split_paths(body: &[u8]) -> Option<Vec<&[u8]>> {
    if body.is_empty() {
        return Some(Vec::new());
    }
    let body = body.strip_suffix(&[PATH_END])?;
    Some(body.split(|&b| b == PATH_END).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn requests_default_and_bodies_split() {
        let request: IndexRequest = serde_json::from_str("{}").unwrap();
        assert!(request.exclude.is_empty());
        assert_eq!(path(), "/v1/index");
        assert_eq!(
            split_paths(b"etc\0etc/passwd\0").unwrap(),
            [&b"etc"[..], b"etc/passwd"]
        );
        assert_eq!(split_paths(b"").unwrap(), Vec::<&[u8]>::new());
        assert_eq!(split_paths(b"etc\0et"), None);
    }
}
