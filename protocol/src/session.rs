//! Shell sessions as the wire sees them: their ids and what the agent reports
//! about them.
//!
//! A session is a long-lived shell inside the sandbox, named by the client.
//! Commands run in it one at a time (as execs with `session` set) and share
//! its working directory, environment and shell variables, as consecutive
//! commands in one terminal do. The messages that create, list, close and
//! interrupt sessions live with the rest of the channel in [`crate::exec`].

use serde::{Deserialize, Serialize};

use crate::exec::ExecId;

/// Longest command text a session's info carries.
pub const MAX_COMMAND_SHOWN: usize = 200;

/// Longest session id.
pub const MAX_SESSION_ID_LEN: usize = 64;

/// What the agent says about one session.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionInfo {
    /// The client-chosen id.
    pub id: String,
    /// The shell program it runs (`/usr/bin/bash`, `/bin/sh`, …).
    pub shell: String,
    /// Pid of its shell in the sandbox; absent until the first command
    /// starts it, and while it is being restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Working directory as of the last command that finished normally.
    pub cwd: String,
    /// The command it is running, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<ExecId>,
    /// That command's words, as the run asked for them (shortened past
    /// [`MAX_COMMAND_SHOWN`] characters); absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Commands waiting for the running one to end.
    #[serde(default)]
    pub queued: u32,
    /// Commands it has run.
    #[serde(default)]
    pub runs: u64,
    /// Times its shell died and was restarted with its last cwd and environment.
    #[serde(default)]
    pub restarts: u32,
}

/// Why a session id is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionIdError {
    /// The id is empty.
    #[error("session id is empty")]
    Empty,
    /// The id is longer than [`MAX_SESSION_ID_LEN`].
    #[error("session id is longer than {MAX_SESSION_ID_LEN} bytes")]
    TooLong,
    /// The id has a character outside `A-Z a-z 0-9 . _ -`.
    #[error("session id {0:?} may only hold letters, digits, '.', '_' and '-'")]
    BadChar(String),
}

/// Checks a session id: 1 to [`MAX_SESSION_ID_LEN`] letters, digits, `.`,
/// `_` or `-`, so it is safe in logs, tables and file names alike.
pub fn check_id(id: &str) -> Result<(), SessionIdError> {
    if id.is_empty() {
        return Err(SessionIdError::Empty);
    }
    if id.len() > MAX_SESSION_ID_LEN {
        return Err(SessionIdError::TooLong);
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(SessionIdError::BadChar(id.to_owned()));
    }
    Ok(())
}

/// Single-quotes `text` for any POSIX shell (`'` becomes `'\''`): how a
/// word reaches a session shell, or any shell a provider runs a command
/// line in, as exactly itself.
pub fn quote(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 2);
    out.push(b'\'');
    for &b in text {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{AgentMessage, ClientMessage, ExecSpec, ExitInfo};

    #[test]
    fn ids_are_short_and_plain() {
        assert_eq!(check_id("build-1.x_y"), Ok(()));
        assert_eq!(check_id(""), Err(SessionIdError::Empty));
        assert_eq!(check_id(&"a".repeat(65)), Err(SessionIdError::TooLong));
        assert!(matches!(check_id("a b"), Err(SessionIdError::BadChar(_))));
        assert!(check_id("../x").is_err());
    }

    #[test]
    fn session_and_pty_fields_are_optional_on_the_wire() {
        // A message from a client that predates sessions still parses.
        let spec: ExecSpec = serde_json::from_str(r#"{"argv":["true"]}"#).unwrap();
        assert!(!spec.tty && spec.session.is_none() && !spec.no_wait);
        // And a plain spec serializes exactly as before.
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(text, r#"{"argv":["true"],"stdin":false}"#);
        let exit: ExitInfo = serde_json::from_str(r#"{"duration_ms":1}"#).unwrap();
        assert!(!exit.restored);
        assert!(!serde_json::to_string(&exit).unwrap().contains("restored"));
    }

    #[test]
    fn session_messages_round_trip() {
        let open: ClientMessage =
            serde_json::from_str(r#"{"type":"session_open","tag":4,"session":"s1","cwd":"/tmp"}"#)
                .unwrap();
        assert!(matches!(
            open,
            ClientMessage::SessionOpen { tag: 4, ref session, ref cwd, .. }
                if session == "s1" && cwd.as_deref() == Some("/tmp")
        ));
        let reply = AgentMessage::SessionInterrupted {
            tag: 5,
            session: "s1".into(),
            exec_id: None,
        };
        let text = serde_json::to_string(&reply).unwrap();
        assert_eq!(
            text,
            r#"{"type":"session_interrupted","tag":5,"session":"s1"}"#
        );
        assert_eq!(serde_json::from_str::<AgentMessage>(&text).unwrap(), reply);
    }
}
