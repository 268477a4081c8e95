//! `Silo`'s side of push: which sandboxes, their agents, one bundle per
//! distinct file set, and a `pushed` event for every push that changed a
//! mount. The pushing itself is `crate::push`.

use silo_protocol::http::error_chain;
use std::collections::HashMap;
use std::sync::Arc;

use futures_util::{StreamExt, stream};
use serde_json::json;
use silo_protocol::bundle::{BundleLimits, FileSet};

use super::{Silo, SiloError};
use crate::push::{
    GoneProbe, Job, PushError, PushEvent, PushFailure, PushOptions, PushReport, build_bundle,
    push_all,
};
use crate::state::{EventKind, SandboxRecord};

/// Failure reasons that may mean the sandbox is down rather than its agent
/// misbehaving; for these the backend is asked, to say which.
const DOWN_REASONS: &[&str] = &["unreachable", "timeout", "connection_lost"];

/// A push failure's reason for a sandbox that is down: `removed` (by `silo
/// rm`), `replaced` (a new machine since), `stopped`, or `missing` (gone
/// from outside silo).
fn down_reason(why: &SiloError) -> &'static str {
    match why {
        SiloError::Removed { .. } => "removed",
        SiloError::Replaced { .. } => "replaced",
        SiloError::NotRunning { .. } => "stopped",
        _ => "missing",
    }
}

impl Silo {
    /// Every sandbox carrying all of `labels` (key = value).
    pub fn with_labels(
        &self,
        labels: &[(String, String)],
    ) -> Result<Vec<SandboxRecord>, SiloError> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|sandbox| {
                labels
                    .iter()
                    .all(|(key, value)| sandbox.spec.labels.get(key) == Some(value))
            })
            .collect())
    }

    /// Pushes each target's files to `mount` in its sandbox, building each
    /// distinct file set's bundle once and pushing in parallel (bounded by
    /// `options.concurrency`, each push retried per `options.retry`).
    ///
    /// Fails only if a bundle cannot be built; a sandbox that cannot be
    /// pushed to is a failure in the report, and the others go ahead.
    pub async fn push_to_sandboxes(
        &self,
        mount: &str,
        targets: Vec<(SandboxRecord, FileSet)>,
        options: &PushOptions,
    ) -> Result<PushReport, PushError> {
        let mut report = PushReport {
            mount: mount.to_owned(),
            targets: targets.len(),
            ..PushReport::default()
        };
        // Distinct sets, each built once; equal sets share a bundle.
        let mut distinct: HashMap<FileSet, usize> = HashMap::new();
        let mut sets = Vec::new();
        let mut wanted = Vec::with_capacity(targets.len());
        for (sandbox, files) in targets {
            let index = *distinct.entry(files.clone()).or_insert_with(|| {
                sets.push(files);
                sets.len() - 1
            });
            wanted.push((sandbox, index));
        }
        drop(distinct);
        let mut bundles = Vec::with_capacity(sets.len());
        for files in sets {
            bundles.push(Arc::new(
                build_bundle(files, BundleLimits::default()).await?,
            ));
        }
        if let Some(progress) = &options.progress {
            progress(&PushEvent::Built {
                bundles: bundles.len(),
                bytes: bundles.iter().map(|b| b.bytes.len() as u64).sum(),
            });
        }

        let mut jobs = Vec::with_capacity(wanted.len());
        let mut by_name = HashMap::new();
        for (sandbox, index) in wanted {
            match self.client(&sandbox) {
                Ok(client) => jobs.push(Job {
                    sandbox: sandbox.name.clone(),
                    client,
                    bundle: Arc::clone(&bundles[index]),
                    gone: Some(self.gone_probe(&sandbox)),
                }),
                Err(err) => report.failures.push(PushFailure {
                    sandbox: sandbox.name.clone(),
                    reason: "unreachable".into(),
                    detail: error_chain(&err),
                    attempts: 0,
                }),
            }
            by_name.insert(sandbox.name.clone(), sandbox);
        }
        let (jobs, down) = self
            .leave_out_down(jobs, &by_name, options.concurrency)
            .await;
        report.failures.extend(down);

        for outcome in push_all(mount, jobs, options).await {
            let Some(sandbox) = by_name.get(&outcome.sandbox) else {
                continue;
            };
            match outcome.result {
                Ok((answer, attempts)) => {
                    if !answer.unchanged {
                        self.log_pushed(sandbox, mount, &answer);
                    }
                    report.add_pushed(outcome.sandbox, answer, attempts, outcome.elapsed);
                }
                Err(failed) => {
                    let mut reason = failed.last.reason();
                    let mut detail = error_chain(&failed.last);
                    if DOWN_REASONS.contains(&reason.as_str()) {
                        if let Some(why) = self.down(sandbox).await {
                            reason = down_reason(&why).into();
                            detail = why.to_string();
                        }
                    }
                    report.failures.push(PushFailure {
                        sandbox: outcome.sandbox,
                        reason,
                        detail,
                        attempts: failed.attempts,
                    });
                }
            }
        }
        report.sort();
        Ok(report)
    }

    /// Whether `sandbox` was removed or its machine is stopped or gone, for
    /// a push that cannot reach its agent (see [`crate::push::GoneProbe`]).
    fn gone_probe(&self, sandbox: &SandboxRecord) -> GoneProbe {
        let (silo, sandbox) = (self.clone(), sandbox.clone());
        Arc::new(move || {
            let (silo, sandbox) = (silo.clone(), sandbox.clone());
            Box::pin(async move { silo.down(&sandbox).await.is_some() })
        })
    }

    /// Splits off the jobs whose sandbox is known to be stopped or gone, so
    /// they fail at once, saying so, instead of being retried for the whole
    /// retry budget. Only a sandbox whose agent does not answer its health
    /// check costs a backend call.
    async fn leave_out_down(
        &self,
        jobs: Vec<Job>,
        by_name: &HashMap<String, SandboxRecord>,
        concurrency: usize,
    ) -> (Vec<Job>, Vec<PushFailure>) {
        let checked: Vec<(Job, Option<PushFailure>)> = stream::iter(jobs)
            .map(|job| async move {
                if job.client.healthz().await.is_ok() {
                    return (job, None);
                }
                let Some(sandbox) = by_name.get(&job.sandbox) else {
                    return (job, None);
                };
                let Some(err) = self.down(sandbox).await else {
                    return (job, None);
                };
                let reason = down_reason(&err);
                let failure = PushFailure {
                    sandbox: sandbox.name.clone(),
                    reason: reason.into(),
                    detail: err.to_string(),
                    attempts: 0,
                };
                (job, Some(failure))
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        let mut live = Vec::with_capacity(checked.len());
        let mut down = Vec::new();
        for (job, failure) in checked {
            match failure {
                Some(failure) => down.push(failure),
                None => live.push(job),
            }
        }
        (live, down)
    }

    fn log_pushed(
        &self,
        sandbox: &SandboxRecord,
        mount: &str,
        answer: &silo_protocol::push::PushResponse,
    ) {
        let detail = json!({
            "mount": mount,
            "version": answer.version,
            "hash": answer.sha256,
            "files": answer.files,
            "bytes": answer.bytes,
        });
        // The push happened whatever the log says; a failed write is reported, not fatal.
        if let Err(err) = self.db().append_event(sandbox, EventKind::Pushed, &detail) {
            tracing::warn!(sandbox = sandbox.name, "cannot log the push: {err}");
        }
    }
}
