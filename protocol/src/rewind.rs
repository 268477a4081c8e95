//! The in-place rewind channel (protocol version 3): a sandbox brought back
//! to one of its snapshots by its own agent, without a new machine.
//!
//! A rewind is two requests. `POST /v1/rewind` carries a
//! [`crate::snapshot::SnapshotRequest`] (the same walk a snapshot makes:
//! what counts as changed since the moment the tree was last known, and
//! that tree's paths as the baseline). The agent takes the snapshot slot,
//! holds pushes and new commands off, ends every process but itself (the
//! workload, every exec and session shell, and whatever else runs in its
//! scope), then walks the file system and answers with what changed:
//! [`CHANGES_CONTENT_TYPE`], one record per path ([`Change`]), and the
//! token of the rewind in [`HEADER_REWIND`]. The sandbox stays held,
//! processes ended and nothing new started, until the second request, or
//! until [`HOLD_SECS`] pass, when the agent lets it go unchanged and starts
//! its workload again.
//!
//! The second request is a layer apply (`POST /v1/layers?rewind=TOKEN`,
//! see [`crate::layers`]) with the layer the controller computed from its
//! store: every changed path as the snapshot has it, or a whiteout where
//! the snapshot has nothing. It is staged and placed like any layer, under
//! the rewind's hold, and then the hold ends and the workload starts again.
//! Its answer carries [`crate::layers::ApplyResponse::applied_at_ns`]: the
//! moment from which a path changed after the rewind.

use crate::blocks::BlockSums;
use crate::http::PATH_REWIND;

/// Content type of the change list.
pub const CHANGES_CONTENT_TYPE: &str = "application/octet-stream";
/// Answer header: the rewind's token, which the layer apply names.
pub const HEADER_REWIND: &str = "x-silo-rewind";
/// The query key of a layer apply that finishes a rewind.
pub const QUERY_REWIND: &str = "rewind";
/// Query flag of a rewind's layer apply: once the layer is placed, the
/// agent keeps the hold for [`crate::snapshot::CTIME_MARGIN_NS`] (and a
/// millisecond) before it stamps `applied_at_ns`, so that every path it
/// placed has a ctime before the next snapshot's margin and counts as
/// unchanged by its noted identity. For a pool member made ahead, whose
/// claim would otherwise take every path placed in the margin again. An
/// agent older than protocol 8 ignores it.
pub const QUERY_SETTLE: &str = "settle";
/// How long the agent holds a sandbox for a rewind's layer before it lets
/// it go unchanged.
pub const HOLD_SECS: u64 = 60;
/// Largest change list the agent sends; a rewind of more is refused as
/// `too_large` (the controller then makes a new machine instead).
pub const MAX_CHANGES_BYTES: usize = 64 * 1024 * 1024;
/// The byte that ends each record of the change list.
pub const RECORD_END: u8 = 0;
/// The first byte of a record that gives the block sums of the file the
/// record before it names (protocol 10, asked for by `block_sums`): `s`,
/// then the sums as hex ([`BlockSums::to_hex`]).
pub const SUMS_RECORD: u8 = b's';

/// What a changed path is now: the first byte of its record, before the
/// path (relative to `/`, as in a layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// A directory (`d`).
    Dir,
    /// A regular file (`f`).
    File,
    /// A symbolic link (`l`).
    Symlink,
    /// Anything else: a device, a FIFO (`o`).
    Other,
    /// Gone: it was in the baseline and its directory no longer has it
    /// (`-`). Everything that was under it is gone too.
    Gone,
}

impl Change {
    /// The record's kind byte.
    pub fn byte(self) -> u8 {
        match self {
            Self::Dir => b'd',
            Self::File => b'f',
            Self::Symlink => b'l',
            Self::Other => b'o',
            Self::Gone => b'-',
        }
    }

    /// The kind a record's first byte names.
    pub fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            b'd' => Self::Dir,
            b'f' => Self::File,
            b'l' => Self::Symlink,
            b'o' => Self::Other,
            b'-' => Self::Gone,
            _ => return None,
        })
    }
}

/// Appends one record (`kind`, `path`, [`RECORD_END`]) to `out`.
pub fn push_record(out: &mut Vec<u8>, kind: Change, path: &[u8]) {
    out.push(kind.byte());
    out.extend_from_slice(path);
    out.push(RECORD_END);
}

/// Appends the block sums of the file whose record was appended last.
pub fn push_sums(out: &mut Vec<u8>, sums: &BlockSums) {
    out.push(SUMS_RECORD);
    out.extend_from_slice(&sums.to_hex());
    out.push(RECORD_END);
}

/// A change list read: its records, and the block sums some of its files
/// came with.
pub type Split<'a> = (Vec<(Change, &'a [u8])>, Vec<(&'a [u8], BlockSums)>);

/// Splits a change list into its records, without block sums; `None` if it
/// is not one (see [`split_with_sums`]).
pub fn split_changes(body: &[u8]) -> Option<Vec<(Change, &[u8])>> {
    split_with_sums(body).map(|(records, _)| records)
}

/// Splits a change list into its records and the block sums that follow
/// file records; `None` if it is not one (a record without its end, an
/// unknown kind, an empty path but a directory's, a NUL inside, sums that
/// are not hex or follow anything but a file's record). A directory with
/// the empty path is the root itself: its own metadata changed.
pub fn split_with_sums(body: &[u8]) -> Option<Split<'_>> {
    let mut records: Vec<(Change, &[u8])> = Vec::new();
    let mut sums = Vec::new();
    if body.is_empty() {
        return Some((records, sums));
    }
    let body = body.strip_suffix(&[RECORD_END])?;
    for record in body.split(|&b| b == RECORD_END) {
        let (&kind, rest) = record.split_first()?;
        if kind == SUMS_RECORD {
            let (Change::File, path) = *records.last()? else {
                return None;
            };
            if sums.last().is_some_and(|(last, _)| *last == path) {
                return None;
            }
            sums.push((path, BlockSums::from_hex(rest)?));
            continue;
        }
        let kind = Change::from_byte(kind)?;
        (!rest.is_empty() || kind == Change::Dir).then_some(())?;
        records.push((kind, rest));
    }
    Some((records, sums))
}

/// The change list as a client speaking `version` reads it: before
/// [`crate::Feature::RootEntry`], without the root's own record (which
/// the walk lists first), since such a client refuses an empty path.
pub fn as_spoken(changes: Vec<u8>, version: u32) -> Vec<u8> {
    let root = [Change::Dir.byte(), RECORD_END];
    match changes.strip_prefix(&root) {
        Some(rest) if !crate::Feature::RootEntry.in_version(version) => rest.to_vec(),
        _ => changes,
    }
}

/// The request path.
pub fn path() -> &'static str {
    PATH_REWIND
}

/// The path and query of the layer apply that finishes rewind `token`
/// (settling, with `settle`: see [`QUERY_SETTLE`]).
pub fn apply_path(token: &str, settle: bool) -> String {
    crate::query::QueryBuilder::new(crate::layers::path())
        .param(QUERY_REWIND, token)
        .flag(QUERY_SETTLE, settle)
        .finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn records_round_trip_and_bad_lists_are_refused() {
        let mut body = Vec::new();
        for (kind, path) in [
            (Change::Dir, &b"etc"[..]),
            (Change::File, b"etc/passwd"),
            (Change::Symlink, b"bin/sh"),
            (Change::Other, b"run/fifo"),
            (Change::Gone, b"tmp/x\xff"),
        ] {
            push_record(&mut body, kind, path);
        }
        let records = split_changes(&body).unwrap();
        assert_eq!(records.len(), 5);
        assert_eq!(records[4], (Change::Gone, &b"tmp/x\xff"[..]));
        assert_eq!(split_changes(b"").unwrap(), Vec::new());
        assert_eq!(split_changes(b"fetc"), None, "cut inside a record");
        assert_eq!(split_changes(b"xetc\0"), None, "unknown kind");
        assert_eq!(split_changes(b"f\0"), None, "empty path");
        assert_eq!(
            split_changes(b"d\0").unwrap(),
            [(Change::Dir, &b""[..])],
            "the root"
        );
        // A client before the root's entry is spared its record.
        assert_eq!(as_spoken(b"d\0fa\0".to_vec(), 8), b"fa\0");
        assert_eq!(as_spoken(b"d\0fa\0".to_vec(), 9), b"d\0fa\0");
        assert_eq!(as_spoken(b"dx\0".to_vec(), 8), b"dx\0");
        assert_eq!(path(), "/v1/rewind");
        assert_eq!(apply_path("ab12", false), "/v1/layers?rewind=ab12");
        assert!(apply_path("ab12", true).starts_with("/v1/layers?rewind=ab12&settle"));
    }

    #[test]
    fn block_sums_follow_their_file_and_nothing_else() {
        let sums = BlockSums::read(&[5u8; 40_000][..]).unwrap();
        let mut body = Vec::new();
        push_record(&mut body, Change::Dir, b"w");
        push_record(&mut body, Change::File, b"w/big");
        push_sums(&mut body, &sums);
        push_record(&mut body, Change::File, b"w/small");
        let (records, got) = split_with_sums(&body).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(got, [(&b"w/big"[..], sums.clone())]);
        assert_eq!(split_changes(&body).unwrap(), records);
        // Sums after a directory, twice for one file, or not hex.
        let mut after_dir = Vec::new();
        push_record(&mut after_dir, Change::Dir, b"w");
        push_sums(&mut after_dir, &sums);
        assert_eq!(split_with_sums(&after_dir), None);
        let mut twice = body.clone();
        twice.truncate(twice.len() - b"fw/small\0".len());
        push_sums(&mut twice, &sums);
        assert_eq!(split_with_sums(&twice), None);
        assert_eq!(split_with_sums(b"fa\0szz\0"), None);
        assert_eq!(split_with_sums(b"s\0"), None, "sums of nothing");
    }
}
