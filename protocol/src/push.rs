//! The push channel: `POST /v1/push?mount=ABS_PATH` with a tar.gz bundle
//! (see [`crate::bundle`]) as the body, its SHA-256 in the signed
//! `x-silo-content-sha256` header.
//!
//! The mount path travels percent-encoded in the query ([`crate::query`]);
//! [`path_and_query`] and [`parse_query`] are the two halves, so both tiers agree on the exact
//! text that is signed. Success is a [`PushResponse`]; failure is the usual
//! [`crate::http::ErrorBody`], whose [`crate::error::ErrorKind`] the
//! controller uses to decide whether a retry can help.

use serde::{Deserialize, Serialize};

use crate::http::PATH_PUSH;
pub use crate::query::QueryError;
use crate::query::{Query, QueryBuilder};

/// The query parameter naming the mount path.
pub const QUERY_MOUNT: &str = "mount";

/// What the agent did with a push.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushResponse {
    /// The version now live at the mount (`<seq>-<sha256>`).
    pub version: String,
    /// Hex SHA-256 of the bundle now live.
    pub sha256: String,
    /// Regular files extracted (0 when unchanged: nothing was extracted).
    pub files: u64,
    /// Their total size in bytes (0 when unchanged).
    pub bytes: u64,
    /// The bundle was already live, so nothing was written.
    pub unchanged: bool,
}

/// `/v1/push?mount=…` for `mount`, percent-encoded: the exact text to sign.
pub fn path_and_query(mount: &str) -> String {
    QueryBuilder::new(PATH_PUSH)
        .param(QUERY_MOUNT, mount)
        .finish()
}

/// The mount path from a push's query string.
pub fn parse_query(query: Option<&str>) -> Result<String, QueryError> {
    Ok(Query::parse(query)?.require(QUERY_MOUNT)?.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn mount_paths_round_trip_through_the_query() {
        for mount in ["/workspace/managed/app", "/w/with space/é&x=%", "/"] {
            let pq = path_and_query(mount);
            let (path, query) = pq.split_once('?').unwrap();
            assert_eq!(path, PATH_PUSH);
            assert!(!query[QUERY_MOUNT.len() + 1..].contains(['&', ' ', '=']));
            assert_eq!(parse_query(Some(query)).unwrap(), mount);
        }
        assert_eq!(parse_query(None), Err(QueryError::Missing(QUERY_MOUNT)));
        assert_eq!(
            parse_query(Some("mount=/a&mount=/b")),
            Err(QueryError::Repeated(QUERY_MOUNT))
        );
        assert_eq!(parse_query(Some("mount=%zz")), Err(QueryError::BadEscape));
        assert_eq!(parse_query(Some("mount=%ff")), Err(QueryError::NotUtf8));
        assert_eq!(parse_query(Some("x=1&mount=/a")).unwrap(), "/a");
    }
}
