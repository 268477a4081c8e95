//! `silo push DIR --mount PATH (SANDBOX… | --all | --label k=v)`: make a
//! directory's files the tree at a mount path in every chosen sandbox.
//! Exits 1 if any sandbox did not get them.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use silo::Silo;
use silo::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_CONCURRENCY, DEFAULT_RETRY_BUDGET, PushOptions, RetryPolicy,
    files_from_dir,
};

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory whose contents become the tree at the mount.
    dir: PathBuf,
    /// Absolute path in the sandbox; must lie under the agent's push root
    /// (/workspace/managed unless the agent was told otherwise).
    #[arg(long, value_name = "PATH")]
    mount: String,
    /// Names or ids of the sandboxes.
    #[arg(value_name = "SANDBOX", required_unless_present_any = ["all", "label"])]
    sandboxes: Vec<String>,
    /// Every sandbox.
    #[arg(long, conflicts_with_all = ["sandboxes", "label"])]
    all: bool,
    /// Sandboxes carrying this label (repeatable: all must match).
    #[arg(long, value_name = "KEY=VALUE", value_parser = super::parse_key_value, conflicts_with = "sandboxes")]
    label: Vec<(String, String)>,
    /// Pushes in flight at once.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONCURRENCY)]
    concurrency: usize,
    /// Seconds to keep retrying a sandbox that cannot be reached.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_RETRY_BUDGET.as_secs_f64())]
    retry_budget: f64,
    /// Seconds one try (upload, extract, answer) may take before it is
    /// given up, and retried within the retry budget.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_ATTEMPT_TIMEOUT.as_secs_f64())]
    attempt_timeout: f64,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let sandboxes = if args.all {
        silo.list()?
    } else if !args.label.is_empty() {
        silo.with_labels(&args.label)?
    } else {
        let mut seen = HashSet::new();
        let mut found = Vec::new();
        for name in &args.sandboxes {
            let sandbox = silo.get(name)?;
            if seen.insert(sandbox.id.clone()) {
                found.push(sandbox);
            }
        }
        found
    };
    if sandboxes.is_empty() {
        bail!("no sandbox to push to");
    }
    let budget = Duration::try_from_secs_f64(args.retry_budget).with_context(|| {
        format!(
            "--retry-budget {} is not a number of seconds",
            args.retry_budget
        )
    })?;
    let attempt_timeout = Duration::try_from_secs_f64(args.attempt_timeout).with_context(|| {
        format!(
            "--attempt-timeout {} is not a number of seconds",
            args.attempt_timeout
        )
    })?;
    let files = files_from_dir(&args.dir)
        .with_context(|| format!("reading {} to push", args.dir.display()))?;
    let progress = out.push_progress(sandboxes.len());
    let options = PushOptions {
        concurrency: args.concurrency,
        retry: RetryPolicy {
            budget,
            attempt_timeout,
            ..RetryPolicy::default()
        },
        progress: Some(progress.callback()),
    };
    let targets = sandboxes.into_iter().map(|s| (s, files.clone())).collect();
    let report = silo.push_to_sandboxes(&args.mount, targets, &options).await;
    progress.finish();
    let report = report.with_context(|| format!("pushing {}", args.dir.display()))?;
    out.pushed(&report)?;
    Ok(i32::from(!report.all_succeeded()))
}
