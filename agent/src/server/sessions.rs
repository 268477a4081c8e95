//! The session requests of the exec channel: open, list, close, interrupt.
//!
//! Like every handler here it only checks and translates: the work is done by
//! [`crate::session::Sessions`]. Running a command in a session is not here:
//! it is an ordinary `exec` request with `session` set.

use std::time::Duration;

use silo_protocol::exec::{AgentMessage, ClientMessage};

use crate::commands::{CommandError, Commands};
use crate::session::Options;
use silo_protocol::http::error_chain;

/// Answers one session request; `None` for messages that are not one.
pub fn handle(commands: &Commands, request: ClientMessage) -> Option<AgentMessage> {
    let (execs, sessions) = (commands.execs(), commands.sessions());
    let reply = match request {
        ClientMessage::SessionOpen {
            tag,
            session,
            shell,
            cwd,
            env,
        } => {
            let cwd = match cwd.as_deref().map(|dir| execs.resolve_cwd(Some(dir))) {
                Some(Err(err)) => return Some(failure(tag, err.into())),
                Some(Ok(dir)) => Some(dir),
                None => None,
            };
            match sessions.open(&session, Options { shell, cwd, env }) {
                Ok((session, created)) => AgentMessage::SessionOpened {
                    tag,
                    session,
                    created,
                },
                Err(err) => failure(tag, err.into()),
            }
        }
        ClientMessage::SessionList { tag } => AgentMessage::SessionList {
            tag,
            sessions: sessions.list(),
        },
        ClientMessage::SessionClose { tag, session } => match sessions.close(execs, &session) {
            Ok(existed) => AgentMessage::SessionClosed {
                tag,
                session,
                existed,
            },
            Err(err) => failure(tag, err.into()),
        },
        ClientMessage::SessionInterrupt {
            tag,
            session,
            grace_ms,
        } => match sessions.interrupt(execs, &session, grace_ms.map(Duration::from_millis)) {
            Ok(exec_id) => AgentMessage::SessionInterrupted {
                tag,
                session,
                exec_id,
            },
            Err(err) => failure(tag, err.into()),
        },
        _ => return None,
    };
    Some(reply)
}

fn failure(tag: u64, err: CommandError) -> AgentMessage {
    AgentMessage::Error {
        tag: Some(tag),
        exec_id: None,
        kind: err.kind(),
        message: error_chain(&err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionError;
    use silo_protocol::exec::ErrorKind;

    #[test]
    fn errors_keep_their_category() {
        let err = CommandError::from(SessionError::Busy("s".into()));
        assert_eq!(err.kind(), ErrorKind::Busy);
        let reply = failure(3, err);
        assert!(matches!(
            reply,
            AgentMessage::Error { tag: Some(3), kind: ErrorKind::Busy, ref message, .. }
                if message.contains("running another command")
        ));
    }
}
