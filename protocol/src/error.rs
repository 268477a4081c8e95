//! The one list of error kinds: the `kind` of every JSON error body the agent
//! answers with ([`crate::http::ErrorBody`]) and of every error message on
//! the exec channel ([`crate::exec::AgentMessage::Error`]).
//!
//! A kind is the stable, machine-readable half of an error; the message
//! beside it is for people. Clients branch on kinds, never on message text.
//! Each kind's wire spelling (snake_case) never changes. A kind this build
//! does not know, such as a newer agent's, reads as [`ErrorKind::Unknown`]
//! with its spelling kept, so an older client still reads the error and
//! can show it.
//!
//! Every kind an HTTP answer can carry has exactly one status
//! ([`ErrorKind::status`]); the agent derives the status from the kind, so
//! the two never disagree. Kinds marked "exec channel" only travel in
//! exec-channel messages, which have no status.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Category of a failed request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
#[non_exhaustive]
pub enum ErrorKind {
    /// 400: the query, a header or the body cannot be read (a bad escape,
    /// bad gzip or tar, a body that does not parse or was cut off).
    Malformed,
    /// 400: the exec upgrade is not a well-formed WebSocket upgrade, or has
    /// a body. Exec channel: a message that cannot be parsed or is invalid.
    BadRequest,
    /// 400: the request announced no protocol version, or one the agent
    /// does not speak.
    VersionMismatch,
    /// 400: a push's bundle holds an entry the agent refuses; the message
    /// names the entry and the reason.
    RejectedEntry,
    /// 401: the signature is missing, malformed, replayed or wrong.
    Unauthorized,
    /// 401: the request's timestamp is outside the agent's window: the
    /// signer's clock and the machine's disagree.
    ClockSkew,
    /// 403: a push's mount path is not under an allowed push root.
    MountNotAllowed,
    /// 403: a file request's path lies outside its `confine`, or reaches
    /// it through a symlink.
    OutsideConfine,
    /// 403: the sandbox user may not do this.
    PermissionDenied,
    /// 404: no route for the path, or (file API) nothing at the path.
    NotFound,
    /// 405: the path exists but does not take this method.
    MethodNotAllowed,
    /// 409: something silo does not manage is in the way of a push's mount.
    MountConflict,
    /// 409: a directory where a file was asked for.
    IsADirectory,
    /// 409: something other than a directory where one was asked for.
    NotADirectory,
    /// 409: a non-empty directory removed without `recursive`.
    NotEmpty,
    /// 409: another snapshot is being taken. Exec channel: the session runs
    /// another command and the request asked not to wait.
    Busy,
    /// 412: a snapshot or rewind named its baseline by a digest the agent
    /// holds no tree for (it restarted, or its last snapshot or rewind left
    /// another tree); send the request again with the whole baseline.
    UnknownBaseline,
    /// 413: the body, a file, an unpacked total or an entry count is over a limit.
    TooLarge,
    /// 422: the body does not match its signed SHA-256; nothing was written.
    HashMismatch,
    /// 500: the agent failed for a reason of its own. Exec channel too.
    Internal,
    /// 501: the agent cannot do this where it runs (a snapshot from an
    /// agent that is not the sandbox's PID 1).
    Unsupported,
    /// 507: the sandbox's disk is full; nothing was written.
    DiskFull,
    /// 500: a layer was only partly applied (placing failed half way, a
    /// full disk included): the machine holds part of it and should be
    /// replaced by a fresh one rather than used.
    Incomplete,
    /// Exec channel: the exec id is not known to this agent.
    UnknownExec,
    /// Exec channel: the command could not be started (no pid or file
    /// descriptor left, another refusal of the kernel). A working directory
    /// that is not a directory is `NotADirectory` (older agents answered
    /// this for it too).
    SpawnFailed,
    /// Exec channel: the program was not found (on `PATH`, or at the path given).
    CommandNotFound,
    /// Exec channel: the program was found but cannot be executed (no
    /// permission, not an executable format).
    NotExecutable,
    /// Exec channel: a limit was reached (too many execs or sessions).
    LimitReached,
    /// Exec channel: no session with that id.
    UnknownSession,
    /// A kind this build does not know, spelt as it arrived. Build kinds
    /// with [`ErrorKind::from`], which never makes this of a known spelling.
    Unknown(String),
}

impl ErrorKind {
    /// Every known kind, in the order the protocol document lists them.
    pub const ALL: [Self; 29] = [
        Self::Malformed,
        Self::BadRequest,
        Self::VersionMismatch,
        Self::RejectedEntry,
        Self::Unauthorized,
        Self::ClockSkew,
        Self::MountNotAllowed,
        Self::OutsideConfine,
        Self::PermissionDenied,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::MountConflict,
        Self::IsADirectory,
        Self::NotADirectory,
        Self::NotEmpty,
        Self::Busy,
        Self::UnknownBaseline,
        Self::TooLarge,
        Self::HashMismatch,
        Self::Internal,
        Self::Unsupported,
        Self::DiskFull,
        Self::Incomplete,
        Self::UnknownExec,
        Self::SpawnFailed,
        Self::CommandNotFound,
        Self::NotExecutable,
        Self::LimitReached,
        Self::UnknownSession,
    ];

    /// The wire spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Malformed => "malformed",
            Self::BadRequest => "bad_request",
            Self::VersionMismatch => "version_mismatch",
            Self::RejectedEntry => "rejected_entry",
            Self::Unauthorized => "unauthorized",
            Self::ClockSkew => "clock_skew",
            Self::MountNotAllowed => "mount_not_allowed",
            Self::OutsideConfine => "outside_confine",
            Self::PermissionDenied => "permission_denied",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::MountConflict => "mount_conflict",
            Self::IsADirectory => "is_a_directory",
            Self::NotADirectory => "not_a_directory",
            Self::NotEmpty => "not_empty",
            Self::Busy => "busy",
            Self::UnknownBaseline => "unknown_baseline",
            Self::TooLarge => "too_large",
            Self::HashMismatch => "hash_mismatch",
            Self::Internal => "internal",
            Self::Unsupported => "unsupported",
            Self::DiskFull => "disk_full",
            Self::Incomplete => "incomplete",
            Self::UnknownExec => "unknown_exec",
            Self::SpawnFailed => "spawn_failed",
            Self::CommandNotFound => "command_not_found",
            Self::NotExecutable => "not_executable",
            Self::LimitReached => "limit_reached",
            Self::UnknownSession => "unknown_session",
            Self::Unknown(spelling) => spelling,
        }
    }

    /// The HTTP status of an answer with this kind; `None` for kinds that
    /// only travel on the exec channel, and for unknown ones.
    pub fn status(&self) -> Option<u16> {
        Some(match self {
            Self::Malformed | Self::BadRequest | Self::VersionMismatch | Self::RejectedEntry => 400,
            Self::Unauthorized | Self::ClockSkew => 401,
            Self::MountNotAllowed | Self::OutsideConfine | Self::PermissionDenied => 403,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::MountConflict
            | Self::IsADirectory
            | Self::NotADirectory
            | Self::NotEmpty
            | Self::Busy => 409,
            Self::UnknownBaseline => 412,
            Self::TooLarge => 413,
            Self::HashMismatch => 422,
            Self::Internal => 500,
            Self::Unsupported => 501,
            Self::DiskFull => 507,
            Self::Incomplete => 500,
            Self::UnknownExec
            | Self::SpawnFailed
            | Self::CommandNotFound
            | Self::NotExecutable
            | Self::LimitReached
            | Self::UnknownSession
            | Self::Unknown(_) => return None,
        })
    }

    /// The exit code a POSIX shell gives a command that failed this way (127
    /// not found, 126 not executable), for errors a shell user knows by it.
    pub fn shell_code(&self) -> Option<i32> {
        match self {
            Self::CommandNotFound => Some(127),
            Self::NotExecutable => Some(126),
            _ => None,
        }
    }
}

impl From<&str> for ErrorKind {
    fn from(spelling: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == spelling)
            .unwrap_or_else(|| Self::Unknown(spelling.to_owned()))
    }
}

impl From<String> for ErrorKind {
    fn from(spelling: String) -> Self {
        match Self::from(spelling.as_str()) {
            Self::Unknown(_) => Self::Unknown(spelling),
            known => known,
        }
    }
}

impl From<ErrorKind> for String {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::Unknown(spelling) => spelling,
            known => known.as_str().to_owned(),
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_spelling() {
        for kind in ErrorKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(serde_json::from_str::<ErrorKind>(&json).unwrap(), kind);
            let spelling = kind.as_str();
            assert!(
                spelling
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{spelling} is not snake_case"
            );
        }
        let mut spellings: Vec<_> = ErrorKind::ALL.iter().map(ErrorKind::as_str).collect();
        spellings.sort_unstable();
        spellings.dedup();
        assert_eq!(
            spellings.len(),
            ErrorKind::ALL.len(),
            "a spelling is used twice"
        );
    }

    #[test]
    fn the_protocol_document_lists_every_kind_with_its_status() {
        let doc = include_str!("../../docs/protocol.md");
        for kind in ErrorKind::ALL {
            let status = kind.status().map_or("exec".to_owned(), |s| s.to_string());
            let row = format!("| `{kind}` | {status} |");
            assert!(doc.contains(&row), "docs/protocol.md lacks the row {row:?}");
        }
    }

    #[test]
    fn a_newer_peers_kind_is_kept_not_refused() {
        let kind: ErrorKind = serde_json::from_str(r#""layer_conflict""#).unwrap();
        assert_eq!(kind, ErrorKind::Unknown("layer_conflict".into()));
        assert_eq!(kind.to_string(), "layer_conflict");
        assert_eq!(kind.status(), None);
        assert_eq!(serde_json::to_string(&kind).unwrap(), r#""layer_conflict""#);
        assert_eq!(ErrorKind::from("busy"), ErrorKind::Busy);
    }

    #[test]
    fn the_wire_spellings_are_the_ones_clients_already_know() {
        // These strings were on the wire before the list was one enum; a
        // client in the field branches on them.
        let known = [
            (ErrorKind::Malformed, "malformed", Some(400)),
            (ErrorKind::RejectedEntry, "rejected_entry", Some(400)),
            (ErrorKind::VersionMismatch, "version_mismatch", Some(400)),
            (ErrorKind::Unauthorized, "unauthorized", Some(401)),
            (ErrorKind::MountNotAllowed, "mount_not_allowed", Some(403)),
            (ErrorKind::OutsideConfine, "outside_confine", Some(403)),
            (ErrorKind::NotFound, "not_found", Some(404)),
            (ErrorKind::MountConflict, "mount_conflict", Some(409)),
            (ErrorKind::Busy, "busy", Some(409)),
            (ErrorKind::TooLarge, "too_large", Some(413)),
            (ErrorKind::HashMismatch, "hash_mismatch", Some(422)),
            (ErrorKind::Internal, "internal", Some(500)),
            (ErrorKind::Unsupported, "unsupported", Some(501)),
            (ErrorKind::DiskFull, "disk_full", Some(507)),
            (ErrorKind::CommandNotFound, "command_not_found", None),
            (ErrorKind::UnknownSession, "unknown_session", None),
        ];
        for (kind, spelling, status) in known {
            assert_eq!((kind.as_str(), kind.status()), (spelling, status));
        }
        assert_eq!(ErrorKind::CommandNotFound.shell_code(), Some(127));
        assert_eq!(ErrorKind::Busy.shell_code(), None);
    }
}
