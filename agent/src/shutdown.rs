//! The agent's shutdown phases, broadcast to every long-lived task.
//!
//! Shutdown is staged so clients see their commands end: first the listener
//! stops accepting and plain HTTP connections finish ([`Phase::Draining`])
//! while execs and the workload are terminated; only then are exec
//! connections closed ([`Phase::Closing`]), after the exits they carry have
//! been sent.

use tokio::sync::watch;

/// Where the agent is in its life; only ever moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Serving.
    Running,
    /// Not accepting; execs and workload being stopped.
    Draining,
    /// Closing exec connections; the process is about to exit.
    Closing,
}

/// Resolves once the agent has reached `phase` (or its phase sender is gone,
/// which means the agent is exiting anyway).
pub async fn reached(phase_rx: &mut watch::Receiver<Phase>, phase: Phase) {
    let _ = phase_rx.wait_for(|now| *now >= phase).await;
}
