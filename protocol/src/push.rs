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
/// The optional query parameter declaring the bundle's tar entries.
pub const QUERY_ENTRIES: &str = "entries";
/// The optional query parameter declaring the bytes the bundle unpacks to.
pub const QUERY_UNPACKED: &str = "unpacked";

/// What a client declares of its bundle before sending it, so an agent can
/// refuse one over its caps at once instead of part way through extracting
/// it (a 200k-entry bundle took minutes to reach the entry cap on
/// fuse-overlayfs). The query is signed; the agent still enforces its caps
/// while extracting, and refuses a bundle that holds more than it declared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Declared {
    /// Tar entries (files and directories).
    pub entries: Option<u64>,
    /// Bytes of the regular files together.
    pub unpacked: Option<u64>,
}

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

/// The same, declaring the bundle's size up front (agents before it ignore
/// the extra parameters).
pub fn path_and_query_declared(mount: &str, declared: Declared) -> String {
    let entries = declared.entries.map(|n| n.to_string());
    let unpacked = declared.unpacked.map(|n| n.to_string());
    QueryBuilder::new(PATH_PUSH)
        .param(QUERY_MOUNT, mount)
        .param_opt(QUERY_ENTRIES, entries.as_deref())
        .param_opt(QUERY_UNPACKED, unpacked.as_deref())
        .finish()
}

/// The mount path from a push's query string.
pub fn parse_query(query: Option<&str>) -> Result<String, QueryError> {
    Ok(Query::parse(query)?.require(QUERY_MOUNT)?.to_owned())
}

/// What a push's query declares of its bundle.
pub fn parse_declared(query: Option<&str>) -> Result<Declared, QueryError> {
    let query = Query::parse(query)?;
    let number = |name: &'static str| -> Result<Option<u64>, QueryError> {
        query
            .get(name)?
            .map(|text| {
                text.parse().map_err(|_| QueryError::BadValue {
                    name,
                    expected: "a whole number",
                })
            })
            .transpose()
    };
    Ok(Declared {
        entries: number(QUERY_ENTRIES)?,
        unpacked: number(QUERY_UNPACKED)?,
    })
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

    #[test]
    fn declared_sizes_round_trip_and_bad_ones_are_refused() {
        let declared = Declared {
            entries: Some(200_000),
            unpacked: Some(7),
        };
        let pq = path_and_query_declared("/w/m", declared);
        let query = pq.split_once('?').map(|(_, q)| q);
        assert_eq!(parse_query(query).unwrap(), "/w/m");
        assert_eq!(parse_declared(query).unwrap(), declared);
        assert_eq!(
            path_and_query_declared("/w/m", Declared::default()),
            path_and_query("/w/m")
        );
        assert_eq!(
            parse_declared(Some("mount=/a")).unwrap(),
            Declared::default()
        );
        assert!(parse_declared(Some("mount=/a&entries=lots")).is_err());
    }
}
