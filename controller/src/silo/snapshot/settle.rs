//! A rewind in place whose client ended after sending its layer, settled
//! by whoever opens the sandbox next. Before the restoring layer goes out,
//! the rewind is recorded as under way (`state::PendingRewind`, with the
//! layer's digest); the transaction that records its outcome clears that.
//! A row left behind means the process that sent the layer ended first.
//! The agent knows the last layer it placed (`GET /healthz`, kept across
//! its restarts, and set by an agent that finished a cut apply at boot):
//! the rewind is recorded as done, at the moment the agent placed the
//! layer, when that is the layer sent, and forgotten when it is not (the
//! tree is as it was: a cut body or an expired hold changes nothing). A
//! machine whose agent does not answer keeps the row for later.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::silo::{Silo, SiloError};
use crate::state::SandboxRecord;

/// Longest a settle waits for the agent to finish placing the layer.
const APPLYING_WAIT: Duration = Duration::from_secs(30);
/// Pause between asks while it does.
const APPLYING_POLL: Duration = Duration::from_millis(50);

impl Silo {
    /// Settles the rewind `sandbox` was left with, if any (see the module
    /// docs); the sandbox as recorded now, and a note for the caller when
    /// something was settled.
    pub(crate) async fn settle_rewind(
        &self,
        sandbox: SandboxRecord,
    ) -> Result<(SandboxRecord, Option<String>), SiloError> {
        let Some(pending) = self.db().pending_rewind(&sandbox.id)? else {
            return Ok((sandbox, None));
        };
        let Ok(client) = self.client(&sandbox) else {
            return Ok((sandbox, None));
        };
        let deadline = Instant::now() + APPLYING_WAIT;
        let health = loop {
            let Ok(health) = client.healthz().await else {
                return Ok((sandbox, None));
            };
            let still_applying = health.applying.as_deref() == Some(&pending.layer_sha256);
            if still_applying && Instant::now() < deadline {
                tokio::time::sleep(APPLYING_POLL).await;
                continue;
            }
            break health;
        };
        let placed = health
            .last_layer
            .filter(|layer| layer.sha256 == pending.layer_sha256);
        let Some(placed) = placed else {
            self.db().clear_pending_rewind(&sandbox.id)?;
            let note = format!(
                "a rewind to {} was begun by a process that ended before its layer went in; \
                 the files are as they were",
                pending.snapshot
            );
            return Ok((sandbox, Some(note)));
        };
        let strategy = self.strategy_of(&sandbox)?;
        let detail = json!({
            "snapshot": pending.snapshot,
            "reason": if pending.fork { "fork" } else { "rewind" },
            "in_place": true,
            "recorded_later": "the process that sent the layer ended before recording it",
        });
        let sandbox = self.record_in_place(
            &strategy,
            &sandbox,
            (&pending.snapshot, pending.fork),
            placed.applied_at_ns,
            &detail,
        )?;
        let note = format!(
            "its files are snapshot {}'s: a rewind to it finished after the process that began \
             it ended, and is recorded now",
            pending.snapshot
        );
        Ok((sandbox, Some(note)))
    }
}
