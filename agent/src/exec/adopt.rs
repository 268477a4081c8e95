//! Execs whose processes someone else starts: a run in a session's shell.
//!
//! The registry still numbers such an exec, takes its concurrency permit,
//! holds its ring and subscribers, and retires it when it ends, so attach,
//! replay, status and stdin work exactly as for a spawned exec. What differs
//! is who feeds it: the session's run driver pumps its output, decides when it
//! has ended, and stops it on interrupt (through the [`Interrupter`] the
//! record routes interrupts to).

use std::sync::Arc;

use bytes::Bytes;
use silo_protocol::exec::{Channel, ExecId, ExitInfo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use super::record::{ExecRecord, Interrupter, What};
use super::run::{STDIN_QUEUE, feed_stdin, pump};
use super::{EXEC_MARKER_VAR, ExecError, Execs, Inner, MAX_CONCURRENT_EXECS, Subscriber};
use crate::process::Scope;
use crate::reaper::ProcessExit;

/// An adopted exec, from registration to its exit report.
pub struct Adopted {
    record: Arc<ExecRecord>,
    inner: Arc<Inner>,
    permit: OwnedSemaphorePermit,
    /// The stdin queue's receiving end, until a writer takes it.
    stdin: Option<mpsc::Receiver<Bytes>>,
}

impl Execs {
    /// Registers an exec run by someone else. `pid` is what `started`
    /// reports (the shell's pid); its processes are found by the exec's
    /// environment marker alone, since they share the shell's session.
    pub fn adopt(
        &self,
        pid: u32,
        stdin: bool,
        what: What,
        sub: Subscriber,
        interrupter: Arc<dyn Interrupter>,
    ) -> Result<Adopted, ExecError> {
        let permit = Arc::clone(&self.inner.slots)
            .try_acquire_owned()
            .map_err(|_| ExecError::LimitReached(MAX_CONCURRENT_EXECS))?;
        let id = self
            .inner
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scope = Scope {
            leader: 0,
            marker: marker(id),
        };
        let (stdin_tx, stdin_rx) = if stdin {
            let (tx, rx) = mpsc::channel(STDIN_QUEUE);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let record = Arc::new(
            ExecRecord::new(id, pid, scope, self.inner.new_ring(), sub, stdin_tx)
                .with_interrupter(interrupter)
                .with_what(what),
        );
        self.inner.insert(Arc::clone(&record));
        Ok(Adopted {
            record,
            inner: Arc::clone(&self.inner),
            permit,
            stdin: stdin_rx,
        })
    }
}

/// The `NAME=value` entry an exec's processes carry.
pub fn marker(id: ExecId) -> String {
    format!("{EXEC_MARKER_VAR}={id}")
}

impl Adopted {
    /// The exec's id.
    pub fn id(&self) -> ExecId {
        self.record.id
    }

    /// The exec's shared state.
    pub fn record(&self) -> &Arc<ExecRecord> {
        &self.record
    }

    /// Starts writing queued stdin to `to` (EOF when the client closes it).
    /// Does nothing when stdin was not asked for, or was already handed out.
    pub fn feed_stdin(&mut self, to: impl AsyncWrite + Unpin + Send + 'static) {
        if let Some(rx) = self.stdin.take() {
            tokio::spawn(feed_stdin(to, rx, self.record.finished()));
        }
    }

    /// Moves one output stream into the exec until end of file.
    pub fn pump(
        &self,
        channel: Channel,
        from: impl AsyncRead + Unpin + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let record = Arc::clone(&self.record);
        tokio::spawn(async move { pump(&record, channel, from).await })
    }

    /// Adds a message of the agent's own to the exec's stderr, so the client
    /// sees why a run failed in the same place as the run's own errors.
    pub fn note(&self, text: &str) {
        self.record.append(
            Channel::Stderr,
            Bytes::from(format!("silo-agent: {text}\n")),
        );
    }

    /// Reports the exit (after all output) and retires the exec.
    pub fn finish(self, status: Option<ProcessExit>, restored: bool) -> ExitInfo {
        if restored {
            self.record.mark_restored();
        }
        self.record.leader_exited();
        let exit = self.record.finish(status, self.record.started.elapsed());
        self.inner
            .retire(self.record.id, self.record.output_memory());
        drop(self.permit);
        exit
    }
}
