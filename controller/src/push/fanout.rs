//! Many pushes at once, and what came of them.
//!
//! [`push_all`] runs one [`push_to_sandbox`] per job with at most
//! [`PushOptions::concurrency`] in flight (a stream of futures, so nothing
//! waits in an unbounded queue), and returns every outcome; one target's
//! failure never stops the others. [`PushReport`] is the aggregate a caller
//! shows or prints as JSON.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use silo_protocol::push::PushResponse;

use super::SharedBundle;
use super::send::{GoneProbe, PushFailed, RetryPolicy, push_unless_gone};
use crate::client::AgentClient;

/// Pushes in flight at once unless told otherwise.
pub const DEFAULT_CONCURRENCY: usize = 32;

/// Something that happened during a fan-out, for progress displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEvent {
    /// The distinct bundles are built.
    Built {
        /// How many distinct bundles.
        bundles: usize,
        /// Their total size.
        bytes: u64,
    },
    /// More bundle bytes went out (to any target, retries included).
    Sent(u64),
    /// One target is finished.
    Done {
        /// The sandbox.
        sandbox: String,
        /// Whether it succeeded.
        ok: bool,
    },
}

/// Receives [`PushEvent`]s; called from whichever task made progress.
pub type PushProgressFn = Arc<dyn Fn(&PushEvent) + Send + Sync>;

/// How a fan-out runs.
#[derive(Clone)]
pub struct PushOptions {
    /// Pushes in flight at once (at least 1).
    pub concurrency: usize,
    /// Retries of each push.
    pub retry: RetryPolicy,
    /// Told of progress, if anyone is watching.
    pub progress: Option<PushProgressFn>,
}

impl Default for PushOptions {
    fn default() -> Self {
        Self {
            concurrency: DEFAULT_CONCURRENCY,
            retry: RetryPolicy::default(),
            progress: None,
        }
    }
}

impl std::fmt::Debug for PushOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushOptions")
            .field("concurrency", &self.concurrency)
            .field("retry", &self.retry)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl PushOptions {
    fn emit(&self, event: &PushEvent) {
        if let Some(progress) = &self.progress {
            progress(event);
        }
    }
}

/// One target of a fan-out.
#[derive(Clone)]
pub struct Job {
    /// The sandbox's name, for the report.
    pub sandbox: String,
    /// Its agent.
    pub client: AgentClient,
    /// What it gets.
    pub bundle: Arc<SharedBundle>,
    /// Whether its machine is gone, asked when its agent cannot be reached.
    pub gone: Option<GoneProbe>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("sandbox", &self.sandbox)
            .field("client", &self.client)
            .field("bundle", &self.bundle)
            .field("gone", &self.gone.is_some())
            .finish()
    }
}

/// What came of one job.
#[derive(Debug)]
pub struct Outcome {
    /// The sandbox.
    pub sandbox: String,
    /// The answer and the tries it took, or the final failure.
    pub result: Result<(PushResponse, u32), PushFailed>,
    /// From the first try to the outcome.
    pub elapsed: Duration,
}

/// Pushes every job's bundle to `mount` of its agent, at most
/// `options.concurrency` at once. Outcomes come in completion order.
pub async fn push_all(mount: &str, jobs: Vec<Job>, options: &PushOptions) -> Vec<Outcome> {
    let sent = options.progress.as_ref().map(|progress| {
        let progress = Arc::clone(progress);
        Arc::new(move |bytes: u64| progress(&PushEvent::Sent(bytes))) as crate::client::SentCallback
    });
    futures_util::stream::iter(jobs)
        .map(|job| {
            let sent = sent.clone();
            async move {
                let start = Instant::now();
                let result = push_unless_gone(
                    &job.client,
                    mount,
                    &job.bundle,
                    &options.retry,
                    sent,
                    job.gone.as_ref(),
                )
                .await;
                options.emit(&PushEvent::Done {
                    sandbox: job.sandbox.clone(),
                    ok: result.is_ok(),
                });
                Outcome {
                    sandbox: job.sandbox,
                    result,
                    elapsed: start.elapsed(),
                }
            }
        })
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await
}

/// The aggregate result of a fan-out.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PushReport {
    /// The mount path pushed to.
    pub mount: String,
    /// How many sandboxes were targeted.
    pub targets: usize,
    /// How many have the bundle live now (changed or unchanged).
    pub succeeded: usize,
    /// Of those, how many already had it (nothing was written).
    pub unchanged: usize,
    /// The ones that failed, with why.
    pub failures: Vec<PushFailure>,
    /// The ones that succeeded, sorted by sandbox name.
    pub pushed: Vec<Pushed>,
}

/// One successful push.
#[derive(Debug, Clone, Serialize)]
pub struct Pushed {
    /// The sandbox.
    pub sandbox: String,
    /// The version now live.
    pub version: String,
    /// The bundle's hash.
    pub sha256: String,
    /// Files extracted (0 when unchanged).
    pub files: u64,
    /// Bytes extracted (0 when unchanged).
    pub bytes: u64,
    /// It was already live.
    pub unchanged: bool,
    /// Tries it took.
    pub attempts: u32,
    /// Milliseconds from the first try to the answer.
    pub millis: u64,
}

/// One failed push.
#[derive(Debug, Clone, Serialize)]
pub struct PushFailure {
    /// The sandbox.
    pub sandbox: String,
    /// A short category: `unreachable`, `timeout`, `connection_lost`; for
    /// a sandbox that is down, `stopped`, `removed` (by `silo rm`, before
    /// or during the push), `replaced` (a new machine since) or `missing`
    /// (gone from outside silo); or the agent's error kind
    /// (`rejected_entry`, `too_large`, `hash_mismatch`, ...).
    pub reason: String,
    /// The full explanation.
    pub detail: String,
    /// Tries made.
    pub attempts: u32,
}

impl PushReport {
    /// Adds a success.
    pub fn add_pushed(
        &mut self,
        sandbox: String,
        answer: PushResponse,
        attempts: u32,
        elapsed: Duration,
    ) {
        self.succeeded += 1;
        if answer.unchanged {
            self.unchanged += 1;
        }
        self.pushed.push(Pushed {
            sandbox,
            version: answer.version,
            sha256: answer.sha256,
            files: answer.files,
            bytes: answer.bytes,
            unchanged: answer.unchanged,
            attempts,
            millis: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        });
    }

    /// Sorts both lists by sandbox name, for stable output.
    pub fn sort(&mut self) {
        self.pushed.sort_by(|a, b| a.sandbox.cmp(&b.sandbox));
        self.failures.sort_by(|a, b| a.sandbox.cmp(&b.sandbox));
    }

    /// Whether every target succeeded.
    pub fn all_succeeded(&self) -> bool {
        self.failures.is_empty() && self.succeeded == self.targets
    }
}
