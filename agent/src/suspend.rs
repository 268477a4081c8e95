//! Suspending the sandbox for a checkpoint of its memory, and waking from it
//! (the protocol's side is `silo_protocol::suspend`).
//!
//! [`Suspender`] owns what lasts from a suspend to its resume: the
//! processes it stopped ([`Frozen`], continued when dropped, so on every
//! path) and the wake. The server does the rest: after answering a suspend
//! it ends every connection, closes its listener, calls [`Suspender::wake`]
//! and listens again with the key that returns.
//!
//! A woken agent takes the key it finds in its key file: a restore writes
//! the restored sandbox's own key there before starting it, so a copy
//! never answers its parent's key. An agent with no key file (a key from
//! the environment) cannot be told a new key, and refuses to suspend.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use silo_protocol::auth::Key;
use silo_protocol::suspend::HOLD_AFTER_WAKE_MS;

use crate::config::KeyFile;
use crate::process::ProcessOps;
use crate::snapshot::FreezeScope;
use crate::snapshot::freeze::{self, FreezeError, Frozen};

/// How often a suspended agent looks for its key file: a look is one stat
/// through the runtime's file proxy, and the restore waits on it.
const WAKE_POLL: Duration = Duration::from_millis(5);

/// Why a suspend was refused.
#[derive(Debug, thiserror::Error)]
pub enum SuspendError {
    /// The agent may stop no processes here (not PID 1, not a machine's agent).
    #[error("this agent cannot stop the sandbox's processes: {0}")]
    Freeze(#[from] FreezeError),
    /// The agent's key came from the environment, so a restored copy could
    /// not be given its own.
    #[error(
        "the agent was started without --key-file, so a restored copy could not take its own key"
    )]
    NoKeyFile,
    /// This agent stops no processes at all.
    #[error("this agent is not the sandbox's init and was not started with --machine-agent")]
    NoScope,
    /// A suspend is already under way.
    #[error("the sandbox is already suspended")]
    Already,
}

impl SuspendError {
    /// The wire's kind for it.
    pub fn kind(&self) -> silo_protocol::ErrorKind {
        use silo_protocol::ErrorKind;
        match self {
            Self::Already => ErrorKind::Busy,
            Self::Freeze(_) | Self::NoKeyFile | Self::NoScope => ErrorKind::Unsupported,
        }
    }
}

/// How a suspended agent woke.
#[derive(Debug)]
pub enum Wake {
    /// Its key file appeared: a restore, with this key.
    Restored(Key),
    /// Nothing came in time: no checkpoint was taken.
    TimedOut,
}

/// The suspend service.
pub struct Suspender {
    scope: Option<FreezeScope>,
    ops: std::sync::Arc<dyn ProcessOps>,
    key_file: Option<KeyFile>,
    /// What the suspend stopped, until the resume (or the hold's end).
    held: Mutex<Held>,
}

/// The processes a suspend stopped, with which suspend it was, so a hold's
/// end never continues a later suspend's processes.
#[derive(Default)]
struct Held {
    suspends: u64,
    frozen: Option<Frozen>,
}

impl Suspender {
    /// A suspender that stops the processes of `scope`; `key_file` is where
    /// a woken agent finds its key.
    pub fn new(
        scope: Option<FreezeScope>,
        ops: std::sync::Arc<dyn ProcessOps>,
        key_file: Option<KeyFile>,
    ) -> Self {
        Self {
            scope,
            ops,
            key_file,
            held: Mutex::new(Held::default()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the sandbox's processes and holds them; answers how many.
    pub fn suspend(&self) -> Result<usize, SuspendError> {
        if self.key_file.is_none() {
            return Err(SuspendError::NoKeyFile);
        }
        let scope = self.scope.ok_or(SuspendError::NoScope)?;
        let mut held = self.held();
        if held.frozen.is_some() {
            return Err(SuspendError::Already);
        }
        let frozen = freeze::freeze(&*self.ops, scope)?;
        let stopped = frozen.count();
        held.suspends += 1;
        held.frozen = Some(frozen);
        Ok(stopped)
    }

    /// Continues what the suspend stopped; answers how many (0: nothing was held).
    pub fn resume(&self) -> usize {
        let frozen = self.held().frozen.take();
        frozen.map_or(0, thaw)
    }

    /// Waits, with every host socket let go, until the key file appears
    /// (a restore) or `wake_after` passes. The file is read as soon as it
    /// holds a whole key: the restore writes it atomically.
    pub async fn wake(&self, wake_after: Duration) -> Wake {
        let Some(file) = &self.key_file else {
            return Wake::TimedOut;
        };
        let deadline = Instant::now() + wake_after;
        loop {
            if file.path.exists() {
                match file.read() {
                    Ok(key) => return Wake::Restored(key),
                    Err(err) => tracing::warn!(%err, "the key file a restore left is unreadable"),
                }
            }
            if Instant::now() >= deadline {
                return Wake::TimedOut;
            }
            tokio::time::sleep(WAKE_POLL).await;
        }
    }

    /// After a wake by restore: continues the processes by itself once the
    /// hold has run out with no resume (a client that died between the
    /// wake and its resume leaves nothing stopped).
    pub fn release_after_hold(self: &std::sync::Arc<Self>) {
        let this = std::sync::Arc::clone(self);
        let suspend = self.held().suspends;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(HOLD_AFTER_WAKE_MS)).await;
            let frozen = {
                let mut held = this.held();
                if held.suspends == suspend {
                    held.frozen.take()
                } else {
                    None
                }
            };
            let continued = frozen.map_or(0, thaw);
            if continued > 0 {
                tracing::warn!(
                    continued,
                    "no resume came after the wake; processes continued"
                );
            }
        });
    }
}

/// Continues `frozen`'s processes; answers how many there were.
fn thaw(mut frozen: Frozen) -> usize {
    let count = frozen.count();
    frozen.thaw();
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::System;

    const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn suspender(scope: Option<FreezeScope>, key_file: Option<KeyFile>) -> Suspender {
        Suspender::new(scope, std::sync::Arc::new(System::default()), key_file)
    }

    #[test]
    fn a_suspend_is_refused_without_a_key_file_or_processes_it_may_stop() {
        let dir = tempfile::tempdir().unwrap();
        let file = KeyFile {
            path: dir.path().join("agent.key"),
            remove: false,
        };
        let refused = suspender(Some(FreezeScope::Namespace), None).suspend();
        assert!(
            matches!(refused, Err(SuspendError::NoKeyFile)),
            "{refused:?}"
        );
        let refused = suspender(None, Some(file)).suspend();
        assert!(matches!(refused, Err(SuspendError::NoScope)), "{refused:?}");
        assert_eq!(suspender(None, None).resume(), 0, "nothing held");
    }

    #[tokio::test]
    async fn a_suspended_agent_wakes_on_the_key_a_restore_writes_or_by_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.key");
        let file = KeyFile {
            path: path.clone(),
            remove: true,
        };
        let waiting = suspender(None, Some(file));
        let woke = waiting.wake(Duration::from_millis(50)).await;
        assert!(matches!(woke, Wake::TimedOut), "{woke:?}");

        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            // As a restore writes it: whole, by rename.
            let temp = path.with_extension("tmp");
            std::fs::write(&temp, KEY).unwrap();
            std::fs::rename(&temp, &path).unwrap();
        });
        let woke = waiting.wake(Duration::from_secs(10)).await;
        writer.await.unwrap();
        match woke {
            Wake::Restored(key) => assert_eq!(key.to_hex(), KEY),
            Wake::TimedOut => panic!("the key file was written"),
        }
        assert!(
            !dir.path().join("agent.key").exists(),
            "--remove-key-file removes it"
        );
    }
}
