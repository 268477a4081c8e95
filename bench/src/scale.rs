//! `scale`: many sandboxes live at once. 1,000 local sandboxes (agents as
//! host processes) and 100 Docker sandboxes of the base image, each made
//! through the library eight at a time. At each count: `silo ls` as a new
//! process beside the plain listing of the same things (`ps` of every
//! process; the Engine API's container list), `silo exec NAME -- true` as
//! a new process beside the same with one sandbox (and a host spawn of
//! `/bin/true` at both counts, for what the machine itself does), the `silo ls` process's
//! peak resident memory, and each idle agent's proportional share of memory
//! (PSS, from `/proc/PID/smaps_rollup`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use silo::{BackendKind, CreateRequest, SandboxSpec, Silo};

use crate::docker_common::DockerBench;
use crate::docker_resume::silo_beside_this_program;
use crate::report::Row;
use crate::stats::Samples;

/// `silo ls` at the full count, p50, in milliseconds.
const TARGET_LS_MS: f64 = 200.0;
/// `silo exec` at the full count, as a multiple of the same with one.
const TARGET_EXEC_RATIO: f64 = 1.2;
/// Sandboxes made at once.
const CONCURRENCY: usize = 8;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (local, docker) = if quick { (100, 20) } else { (1000, 100) };
    let mut rows = Vec::new();
    let home = tempfile::Builder::new()
        .prefix("silo-bench-scale-")
        .tempdir()?;
    let silo = Silo::open(Some(home.path().join("home")))?;
    let spec = SandboxSpec::new(BackendKind::Local);
    let measured = measure(&silo, spec, local, "local", || async {
        plain(Command::new("ps").args(["-e", "-o", "pid,stat"]))
    })
    .await;
    remove_all(&silo).await;
    rows.extend(measured?);

    let Some(bench) = DockerBench::start().await? else {
        return Ok(rows);
    };
    let spec = DockerBench::request("unused").spec;
    let engine = bench.engine.clone();
    let measured = measure(&bench.silo, spec, docker, "docker", || {
        let engine = engine.clone();
        async move {
            let t = Instant::now();
            let options = None::<bollard::query_parameters::ListContainersOptions>;
            engine.list_containers(options).await?;
            Ok(t.elapsed())
        }
    })
    .await;
    remove_all(&bench.silo).await;
    rows.extend(measured?);
    Ok(rows)
}

/// Makes `count` sandboxes of `spec` (one first, for the exec baseline)
/// and measures; `plain_list` times the plain alternative to `silo ls`.
async fn measure<F: Future<Output = anyhow::Result<Duration>>>(
    silo: &Silo,
    spec: SandboxSpec,
    count: usize,
    backend: &'static str,
    plain_list: impl Fn() -> F,
) -> anyhow::Result<Vec<Row>> {
    let bin = silo_beside_this_program()?;
    let home = silo.home().root().to_owned();
    let request = |i: usize| CreateRequest {
        name: Some(format!("scale-{i}")),
        spec: spec.clone(),
    };
    silo.create(request(0)).await?;
    let exec_one = exec_samples(&bin, &home, 30)?;
    let spawn_one = spawn_samples(30)?;

    let t = Instant::now();
    let made: Vec<_> = stream::iter(1..count)
        .map(|i| silo.create(request(i)))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let make_ms = t.elapsed().as_secs_f64() * 1000.0;
    for result in made {
        result?;
    }

    let mut ls = Samples::default();
    let mut listing = Samples::default();
    for _ in 0..5 {
        let t = Instant::now();
        let status = quiet(
            Command::new(&bin)
                .arg("--home")
                .arg(&home)
                .args(["ls", "-o", "json"]),
        )?;
        anyhow::ensure!(status.success(), "silo ls failed");
        ls.push(t.elapsed());
        listing.push(plain_list().await?);
    }
    // Every child so far has exited and been waited for; `silo ls` at the
    // full count is the largest of them.
    let peak_kib = children_peak_rss_kib()?;
    let exec_many = exec_samples(&bin, &home, 30)?;
    let spawn_many = spawn_samples(30)?;
    let pss = agent_pss_kib(silo)?;

    let scenario = "scale";
    let ls_p50 = ls.percentile(50.0);
    let exec_ratio = exec_many.percentile(50.0) / exec_one.percentile(50.0);
    let mut rows = vec![
        Row {
            scenario,
            metric: format!("`silo ls`, {count} {backend} sandboxes, p50 of 5"),
            unit: "ms",
            silo: ls_p50,
            baseline: Some(listing.percentile(50.0)),
            baseline_name: if backend == "local" {
                "ps -e"
            } else {
                "engine container list"
            },
            target: format!("<= {TARGET_LS_MS} ms"),
            met: ls_p50 <= TARGET_LS_MS,
        },
        Row {
            scenario,
            metric: format!("`silo exec -- true` at {count} {backend}, p50 of 30"),
            unit: "ms",
            silo: exec_many.percentile(50.0),
            baseline: Some(exec_one.percentile(50.0)),
            baseline_name: "the same with one sandbox",
            target: format!("<= {TARGET_EXEC_RATIO}x"),
            met: exec_ratio <= TARGET_EXEC_RATIO,
        },
        // What the machine itself does at this count: a process start,
        // which every `silo exec` pays twice (the CLI, the command).
        Row::untargeted(
            scenario,
            format!("host spawn of `/bin/true` at {count} {backend}, p50 of 30"),
            "ms",
            spawn_many.percentile(50.0),
            Some((spawn_one.percentile(50.0), "the same with one sandbox")),
        ),
        Row::untargeted(
            scenario,
            format!("`silo ls` peak RSS, {count} {backend}"),
            "MiB",
            peak_kib as f64 / 1024.0,
            None,
        ),
        Row::untargeted(
            scenario,
            format!("making {count} {backend} sandboxes, {CONCURRENCY} at a time"),
            "s",
            make_ms / 1000.0,
            None,
        ),
    ];
    if let Some(pss) = pss {
        rows.push(Row::untargeted(
            scenario,
            format!("idle agent PSS, mean of {count} {backend}"),
            "MiB",
            pss / 1024.0,
            None,
        ));
    }
    Ok(rows)
}

/// The largest peak resident set of this process's waited-for children,
/// in KiB.
fn children_peak_rss_kib() -> std::io::Result<i64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid, writable rusage for the call to fill.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: getrusage returned 0, so it filled `usage` (and zeroed is a
    // valid rusage anyway).
    Ok(unsafe { usage.assume_init() }.ru_maxrss)
}

/// `n` runs of `silo exec scale-0 -- true`, as new processes.
fn exec_samples(bin: &Path, home: &Path, n: usize) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let status = quiet(
            Command::new(bin)
                .arg("--home")
                .arg(home)
                .args(["exec", "scale-0", "--", "true"]),
        )?;
        anyhow::ensure!(status.success(), "silo exec failed");
        samples.push(t.elapsed());
    }
    Ok(samples)
}

/// `n` spawns of `/bin/true`, waited for.
fn spawn_samples(n: usize) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    for _ in 0..n {
        samples.push(plain(&mut Command::new("/bin/true"))?);
    }
    Ok(samples)
}

fn quiet(command: &mut Command) -> std::io::Result<std::process::ExitStatus> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
}

fn plain(command: &mut Command) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let status = quiet(command)?;
    anyhow::ensure!(status.success(), "{command:?} failed");
    Ok(t.elapsed())
}

/// The mean PSS of the local sandboxes' agents (from their pid files), in
/// KiB; `None` on a backend whose agents are not host processes here.
fn agent_pss_kib(silo: &Silo) -> anyhow::Result<Option<f64>> {
    let mut total = 0u64;
    let mut agents = 0u64;
    for sandbox in silo.list()? {
        let pid_file = silo.home().sandbox_dir(&sandbox.id).join("agent.pid");
        let Ok(pid) = std::fs::read_to_string(&pid_file) else {
            continue;
        };
        let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", pid.trim()))?;
        let pss = rollup
            .lines()
            .find_map(|line| line.strip_prefix("Pss:"))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            });
        if let Some(pss) = pss {
            total += pss;
            agents += 1;
        }
    }
    Ok((agents > 0).then(|| total as f64 / agents as f64))
}

/// Removes every sandbox of the home, a few at a time; failures are
/// printed, not fatal, so one stuck sandbox does not hide the figures.
async fn remove_all(silo: &Silo) {
    let Ok(all) = silo.list() else { return };
    let removed: Vec<_> = stream::iter(all)
        .map(|sandbox| async move { (sandbox.name.clone(), silo.remove(&sandbox.id).await) })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for (name, result) in removed {
        if let Err(error) = result {
            eprintln!("removing {name}: {error}");
        }
    }
}
