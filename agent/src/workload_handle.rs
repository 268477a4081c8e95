//! The workload as the agent's parts share it: signalled on the agent's
//! behalf, stopped at shutdown, and stopped and started again around an
//! in-place rewind (a rewound sandbox boots its workload afresh, as a new
//! machine would).
//!
//! [`Workload`] owns one supervisor from start to stop; this handle keeps
//! what starting one takes, so a stopped workload can be started again,
//! and refuses to start one once shutdown has stopped it for good.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::process::ProcessOps;
use crate::reaper::{ProcessExit, Reaper};
use crate::workload::{RestartPolicy, Workload};

/// What starting the workload takes.
struct Launch {
    argv: Vec<String>,
    policy: RestartPolicy,
    reaper: Reaper,
    ops: Arc<dyn ProcessOps>,
    marker_value: String,
}

/// The current supervisor, if any, and whether shutdown has begun.
#[derive(Default)]
struct Slot {
    running: Option<Workload>,
    shut_down: bool,
}

/// The sandbox's workload, shared; a sandbox without one has a handle that
/// does nothing.
#[derive(Default)]
pub struct WorkloadHandle {
    launch: Option<Launch>,
    slot: Mutex<Slot>,
}

impl WorkloadHandle {
    /// Starts supervising `argv` (nothing when it is empty). `marker_value`
    /// must be unique to this agent.
    pub fn start(
        argv: Vec<String>,
        policy: RestartPolicy,
        reaper: Reaper,
        ops: Arc<dyn ProcessOps>,
        marker_value: &str,
    ) -> Self {
        if argv.is_empty() {
            return Self::default();
        }
        let handle = Self {
            launch: Some(Launch {
                argv,
                policy,
                reaper,
                ops,
                marker_value: marker_value.to_owned(),
            }),
            slot: Mutex::default(),
        };
        handle.resume();
        handle
    }

    /// Forwards a signal to the workload's process group, if it runs.
    pub fn forward(&self, signal: Signal) {
        if let Some(workload) = &self.slot().running {
            workload.forward(signal);
        }
    }

    /// Stops the workload (SIGTERM, SIGKILL after `grace`) until
    /// [`WorkloadHandle::resume`]; its last exit, if it had run.
    pub async fn pause(&self, grace: Duration) -> Option<ProcessExit> {
        let running = self.slot().running.take();
        match running {
            Some(workload) => workload.stop(grace).await,
            None => None,
        }
    }

    /// Starts the workload again after a pause (not after shutdown).
    pub fn resume(&self) {
        let Some(launch) = &self.launch else {
            return;
        };
        let mut slot = self.slot();
        if slot.shut_down || slot.running.is_some() {
            return;
        }
        slot.running = Some(Workload::start(
            launch.argv.clone(),
            launch.policy,
            launch.reaper.clone(),
            Arc::clone(&launch.ops),
            &launch.marker_value,
        ));
    }

    /// Shutdown: stops the workload for good; its last exit, if it ran.
    pub async fn stop(&self, grace: Duration) -> Option<ProcessExit> {
        let running = {
            let mut slot = self.slot();
            slot.shut_down = true;
            slot.running.take()
        };
        match running {
            Some(workload) => workload.stop(grace).await,
            None => None,
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
