//! Long use on Docker: `soak` and `push-many`.
//!
//! `soak`: 1,000 commands of 1 MiB output each, one after another, in a
//! sandbox with `--memory 64m`, beside the same commands run by `docker
//! exec` (the Engine API) in the same container. It reports both totals,
//! and the agent's RSS at the start, its peak (VmHWM) and at the end: the
//! bound is idle + 20 MiB (docs/limits.md).
//!
//! `push-many`: a bundle of 100,000 entries (the entry cap) pushed onto the
//! container's root file system, beside `tar xzf` of the same bundle in the
//! same container: time and files per second. The bundle is built once
//! beforehand and copied in untimed for tar.

use std::path::Path;
use std::time::{Duration, Instant};

use silo::{PushOptions, RetryPolicy, files_from_dir};
use silo_protocol::bundle::{Bundle, BundleLimits};
use silo_protocol::exec::ExecSpec;

use crate::docker_common::{DockerBench, engine_exec};
use crate::report::Row;

/// Commands in the soak.
const SOAK_COMMANDS: usize = 1000;
/// Output of each.
const SOAK_OUTPUT: usize = 1 << 20;
/// The sandbox's memory limit.
const SOAK_MEMORY: u64 = 64 << 20;
/// What the agent may grow above its start (docs/limits.md).
const RSS_BOUND_MIB: f64 = 20.0;
/// Entries of the push: the default entry cap.
const PUSH_ENTRIES: usize = 100_000;
/// Directories among them (the rest are one-line files).
const PUSH_DIRS: usize = 100;

fn argv(words: &[&str]) -> ExecSpec {
    ExecSpec {
        argv: words.iter().map(|w| (*w).to_owned()).collect(),
        ..Default::default()
    }
}

/// A field of the agent's `/proc/1/status`, in MiB.
async fn agent_mib(sandbox: &silo::Sandbox, field: &str) -> anyhow::Result<f64> {
    let out = sandbox
        .commands()
        .run(argv(&["cat", "/proc/1/status"]))
        .await?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let kib: f64 = text
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/1/status"))?;
    Ok(kib / 1024.0)
}

pub async fn soak(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 100 } else { SOAK_COMMANDS };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let mut request = DockerBench::request("bench-soak");
    request.spec.memory_bytes = Some(SOAK_MEMORY);
    let record = bench.silo.create(request).await?;
    let container = silo::internals::docker::container_name(&record.id);
    let sandbox = bench.silo.sandbox(&record.id).await?;
    let count = SOAK_OUTPUT.to_string();
    let command = ["head", "-c", count.as_str(), "/dev/zero"];

    let start = agent_mib(&sandbox, "VmRSS").await?;
    let mut sampled_peak = start;
    let t = Instant::now();
    for i in 0..n {
        let out = sandbox.commands().run(argv(&command)).await?;
        anyhow::ensure!(
            out.stdout.len() == SOAK_OUTPUT,
            "command {i} gave {} bytes",
            out.stdout.len()
        );
        if i % 100 == 99 {
            sampled_peak = sampled_peak.max(agent_mib(&sandbox, "VmRSS").await?);
        }
    }
    let silo_secs = t.elapsed().as_secs_f64();
    let peak = agent_mib(&sandbox, "VmHWM").await?.max(sampled_peak);
    let end = agent_mib(&sandbox, "VmRSS").await?;

    let t = Instant::now();
    for _ in 0..n {
        engine_exec(&bench.engine, &container, &command).await?;
    }
    let docker_secs = t.elapsed().as_secs_f64();
    remove(&bench, &record.id).await;

    let label = format!("{n} × 1 MiB output, --memory 64m");
    let rss = |metric: &str, value: f64| Row {
        scenario: "soak",
        metric: format!("agent RSS {metric}, {label}"),
        unit: "MiB",
        silo: value,
        baseline: None,
        baseline_name: "-",
        target: format!("≤ start + {RSS_BOUND_MIB} MiB"),
        met: value <= start + RSS_BOUND_MIB,
    };
    Ok(vec![
        Row::untargeted(
            "soak",
            format!("total, {label}"),
            "s",
            silo_secs,
            Some((docker_secs, "docker exec")),
        ),
        rss("start", start),
        rss("peak", peak),
        rss("end", end),
    ])
}

/// Removes the sandbox; a container of 200,000 files on fuse-overlayfs can
/// take the engine longer than its timeout to remove, which does not spoil
/// the figures, so it is only noted.
async fn remove(bench: &DockerBench, id: &str) {
    if let Err(error) = bench.silo.remove(id).await {
        eprintln!("  removing {id} failed (figures kept): {error}");
    }
}

/// `count` one-line files spread over [`PUSH_DIRS`] directories.
fn make_tree(dir: &Path, count: usize) -> anyhow::Result<()> {
    for i in 0..count {
        let sub = dir.join(format!("d{:03}", i % PUSH_DIRS));
        if i < PUSH_DIRS {
            std::fs::create_dir_all(&sub)?;
        }
        std::fs::write(sub.join(format!("f{i:06}.txt")), format!("file {i}\n"))?;
    }
    Ok(())
}

pub async fn push_many(quick: bool) -> anyhow::Result<Vec<Row>> {
    let entries = if quick {
        PUSH_ENTRIES / 10
    } else {
        PUSH_ENTRIES
    };
    let files = entries - PUSH_DIRS;
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let work = tempfile::tempdir()?;
    let tree = work.path().join("tree");
    make_tree(&tree, files)?;
    let set = files_from_dir(&tree)?;
    let t = Instant::now();
    let bundle = Bundle::build(&set, &BundleLimits::default())?;
    let build_secs = t.elapsed().as_secs_f64();
    eprintln!(
        "  bundle: {} entries, {:.1} MiB compressed, built in {build_secs:.2} s",
        bundle.entries,
        bundle.bytes.len() as f64 / f64::from(1 << 20)
    );

    let record = bench
        .silo
        .create(DockerBench::request("bench-push-many"))
        .await?;
    let container = silo::internals::docker::container_name(&record.id);
    let sandbox = bench.silo.sandbox(&record.id).await?;
    sandbox
        .files()
        .write("/tmp/bundle.tar.gz", bundle.bytes.clone(), None)
        .await?;

    let options = PushOptions {
        retry: RetryPolicy {
            attempt_timeout: Duration::from_secs(600),
            ..RetryPolicy::default()
        },
        ..PushOptions::default()
    };
    let t = Instant::now();
    let report = sandbox
        .push("/workspace/managed/many", set, &options)
        .await?;
    let silo_secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(report.succeeded == 1, "push failed: {:?}", report.failures);

    engine_exec(&bench.engine, &container, &["mkdir", "-p", "/tmp/tar-x"]).await?;
    let t = Instant::now();
    engine_exec(
        &bench.engine,
        &container,
        &["tar", "xzf", "/tmp/bundle.tar.gz", "-C", "/tmp/tar-x"],
    )
    .await?;
    let tar_secs = t.elapsed().as_secs_f64();
    remove(&bench, &record.id).await;

    let label = format!("{entries} entries onto the container root");
    let rate = |secs: f64| files as f64 / secs;
    Ok(vec![
        Row::untargeted(
            "push-many",
            format!("time, {label} (bundle built in {build_secs:.1} s)"),
            "s",
            silo_secs,
            Some((tar_secs, "tar xzf in the container")),
        ),
        Row::untargeted(
            "push-many",
            format!("files/s, {label}"),
            "files/s",
            rate(silo_secs),
            Some((rate(tar_secs), "tar xzf in the container")),
        ),
    ])
}
