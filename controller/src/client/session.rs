//! Shell sessions over an exec connection: open, list, close, interrupt.
//!
//! Running a command in a session needs nothing here: it is
//! [`ExecConnection::exec`] with `session` set in the spec, and the handle it
//! returns works like any other (output, stdin, interrupt, re-attach).

use std::collections::BTreeMap;
use std::time::Duration;

use silo_protocol::exec::{AgentMessage, ClientMessage, ExecId};
use silo_protocol::session::SessionInfo;

use super::ClientError;
use super::connection::ExecConnection;

/// What a session created by [`ExecConnection::open_session`] starts from.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// Shell program; the agent's default (bash if present, else sh) when `None`.
    pub shell: Option<String>,
    /// Initial working directory; the agent's workdir when `None`.
    pub cwd: Option<String>,
    /// Variables added to the shell's environment.
    pub env: BTreeMap<String, String>,
}

impl ExecConnection {
    /// Finds the session `id`, or creates it from `options`. Returns it and
    /// whether this call created it (`options` only apply then).
    pub async fn open_session(
        &self,
        id: &str,
        options: SessionOptions,
    ) -> Result<(SessionInfo, bool), ClientError> {
        let tag = self.tag();
        let request = ClientMessage::SessionOpen {
            tag,
            session: id.to_owned(),
            shell: options.shell,
            cwd: options.cwd,
            env: options.env,
        };
        match self.call(tag, request).await?.message {
            AgentMessage::SessionOpened {
                session, created, ..
            } => Ok((session, created)),
            other => Err(unexpected(other)),
        }
    }

    /// Every session of the sandbox, by id.
    pub async fn list_sessions(&self) -> Result<Vec<SessionInfo>, ClientError> {
        let tag = self.tag();
        match self
            .call(tag, ClientMessage::SessionList { tag })
            .await?
            .message
        {
            AgentMessage::SessionList { sessions, .. } => Ok(sessions),
            other => Err(unexpected(other)),
        }
    }

    /// Closes a session (its running command, its shell and everything
    /// started from it are killed). False when there was no such session.
    pub async fn close_session(&self, id: &str) -> Result<bool, ClientError> {
        let tag = self.tag();
        let request = ClientMessage::SessionClose {
            tag,
            session: id.to_owned(),
        };
        match self.call(tag, request).await?.message {
            AgentMessage::SessionClosed { existed, .. } => Ok(existed),
            other => Err(unexpected(other)),
        }
    }

    /// Interrupts whatever the session runs (SIGINT, `grace`, then SIGKILL of
    /// the command; the shell stays). Returns the interrupted exec, or `None`
    /// when the session was idle (nothing is done then).
    pub async fn interrupt_session(
        &self,
        id: &str,
        grace: Option<Duration>,
    ) -> Result<Option<ExecId>, ClientError> {
        let tag = self.tag();
        let request = ClientMessage::SessionInterrupt {
            tag,
            session: id.to_owned(),
            grace_ms: grace.map(|g| u64::try_from(g.as_millis()).unwrap_or(u64::MAX)),
        };
        match self.call(tag, request).await?.message {
            AgentMessage::SessionInterrupted { exec_id, .. } => Ok(exec_id),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(message: AgentMessage) -> ClientError {
    ClientError::Protocol(format!("unexpected reply from agent: {message:?}"))
}
