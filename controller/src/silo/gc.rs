//! Garbage collection (`silo gc`): removes sandboxes whose idle TTL expired
//! long enough ago, and containers of this home that no sandbox owns.
//!
//! An expired sandbox is only stopped (its agent exited on its idle timeout);
//! `silo up` already treats it as gone, and gc reclaims its disk after
//! `older_than`. A sandbox with snapshots keeps its record (and id): gc
//! removes only its machine, and `silo up` restores it from its latest
//! snapshot. A sandbox another process is working on (its lease is held)
//! is skipped, never waited for. Snapshots are kept; the store sheds what
//! no snapshot names (see `snapshot::gc_store`).

use silo_protocol::http::error_chain;
use std::collections::HashSet;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::{Silo, SiloError, StoreGc, backend_error, machine};
use crate::backend::Backend;
use crate::state::{EventKind, SandboxRecord, now_ms};

/// One sandbox gc removed (or would remove, in a dry run).
#[derive(Debug, Clone, Serialize)]
pub struct Collected {
    /// The sandbox.
    pub sandbox: SandboxRecord,
    /// When its idle TTL expired (unix ms).
    pub expired_at_ms: i64,
    /// Only its machine was removed: its snapshots keep the sandbox, for
    /// `silo up` to restore.
    pub machine_only: bool,
}

/// What `silo gc` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    /// Nothing was removed; this is what would have been.
    pub dry_run: bool,
    /// Expired sandboxes removed.
    pub removed: Vec<Collected>,
    /// Machines of this home without a sandbox (containers, E2B VMs), removed.
    pub orphans: Vec<String>,
    /// Sandboxes left alone, and why (busy, or their backend failed).
    pub skipped: Vec<(String, String)>,
    /// What the snapshot store shed.
    pub store: StoreGc,
}

impl Silo {
    /// Removes sandboxes whose idle TTL expired at least `older_than` ago,
    /// this home's orphaned containers and VMs, and the store's unnamed blobs.
    pub async fn gc(&self, older_than: Duration, dry_run: bool) -> Result<GcReport, SiloError> {
        let mut report = GcReport {
            dry_run,
            ..GcReport::default()
        };
        let cutoff =
            now_ms().saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
        for listed in self.list()? {
            // Each host of a fleet collects the machines it holds.
            if listed.spec.idle_timeout_secs.is_none() || !self.fleet().may_operate(&listed) {
                continue;
            }
            let Some(_lease) = self.try_lease(&listed.name, "gc").await? else {
                report
                    .skipped
                    .push((listed.name, "another silo process is using it".into()));
                continue;
            };
            let Ok(sandbox) = self.get(&listed.id) else {
                continue; // removed meanwhile
            };
            match self.expired_at(&sandbox).await {
                Ok(Some(at)) if at <= cutoff => {
                    let machine_only = self.db().latest_snapshot(&sandbox.id)?.is_some();
                    if !dry_run {
                        self.collect(&sandbox, at, machine_only).await?;
                    }
                    report.removed.push(Collected {
                        sandbox,
                        expired_at_ms: at,
                        machine_only,
                    });
                }
                Ok(_) => {}
                Err(error) => report.skipped.push((sandbox.name, error_chain(&error))),
            }
        }
        // Pool members own their machines too, though no list shows them.
        let live: HashSet<String> = self.db().machine_owner_ids()?.into_iter().collect();
        for backend in self.backends().all() {
            match backend.sweep_orphans(&live, dry_run).await {
                Ok(names) => report.orphans.extend(names),
                Err(error) => report.skipped.push((
                    format!("orphaned {} machines", backend.kind()),
                    error_chain(&error),
                )),
            }
        }
        report.store = self.gc_store(dry_run).await?;
        self.gc_shared_store(older_than, dry_run, &mut report.store)
            .await?;
        Ok(report)
    }

    /// Removes an expired sandbox, or only its machine when its snapshots
    /// keep it; the `removed` or `reclaimed` event says why.
    async fn collect(
        &self,
        sandbox: &SandboxRecord,
        expired_at_ms: i64,
        machine_only: bool,
    ) -> Result<(), SiloError> {
        let key = self.sandbox_key(sandbox);
        self.backend_of(sandbox)?
            .remove(machine(sandbox, &key))
            .await
            .map_err(|e| backend_error("remove", sandbox, e))?;
        let detail = json!({ "reason": "idle ttl expired", "expired_at_ms": expired_at_ms });
        if machine_only {
            self.db().update_backend_ref(
                sandbox,
                &json!({}),
                Some((EventKind::Reclaimed, detail)),
            )?;
        } else {
            self.db().delete_sandbox(sandbox, &detail)?;
        }
        Ok(())
    }
}
