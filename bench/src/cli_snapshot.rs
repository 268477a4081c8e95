//! `cli-snapshot`: a checkpoint as a harness takes one. On the base image
//! (so it needs nothing the set-up lacks), after each 1 KB step, `silo snapshot NAME` as a new
//! process (spawn to exit), beside its floor: `silo --version` plus one
//! round trip on a connection this program holds open, timed in the same
//! rounds. Then the library's checkpoint after the same step, wall time
//! and durable, beside `docker commit -p` of a plain container.

use std::time::Instant;

use silo::no_progress;
use silo_protocol::exec::ExecSpec;

use crate::cli::run_silo;
use crate::docker_common::{DockerBench, remove};
use crate::docker_resume::silo_beside_this_program;
use crate::report::Row;
use crate::snapshot::{commit_image, create_plain_from};
use crate::stats::Samples;
use silo_tests::docker::{BASE_IMAGE, remove_image};

/// Most `silo snapshot` may cost above its floor at p50, in milliseconds.
const TARGET_ABOVE_FLOOR_MS: f64 = 20.0;
/// The library's checkpoint of a 1 KB step, durable, p50, in milliseconds.
const TARGET_DURABLE_MS: f64 = 10.0;
/// The sandbox the scenario makes (and removes).
const SANDBOX: &str = "bench-cli-snapshot";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (n, commits) = if quick { (10, 5) } else { (50, 20) };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    bench.silo.create(DockerBench::request(SANDBOX)).await?;
    let measured = measure(&bench, n).await;
    let removed = bench.silo.remove(SANDBOX).await;
    let rounds = measured?;
    removed?;
    let _ = bench.silo.gc_store(false).await;

    // The reference: `docker commit -p` of a plain container after a 1 KB step.
    let plain = format!("silo-bench-cli-snapshot-plain-{}", std::process::id());
    create_plain_from(
        &bench.engine,
        &plain,
        BASE_IMAGE,
        &[
            "sh",
            "-c",
            "head -c 1024 /dev/urandom > /root/change.bin; sleep 1000",
        ],
    )
    .await?;
    bench.engine.start_container(&plain, None).await?;
    let mut commit = Samples::default();
    let tag = "silo-bench-cli-snapshot-committed:latest";
    for _ in 0..commits {
        let t = Instant::now();
        commit_image(&bench.engine, &plain, tag).await?;
        commit.push(t.elapsed());
    }
    remove(&bench.engine, &plain).await?;
    remove_image(&bench.engine, tag).await;

    let p50 = |s: &Samples| s.percentile(50.0);
    let floor = p50(&rounds.version) + p50(&rounds.open);
    let cli = p50(&rounds.cli);
    Ok(vec![
        Row {
            scenario: "cli-snapshot",
            metric: format!("`silo snapshot` after a 1 KB step, new process, p50 of {n}"),
            unit: "ms",
            silo: cli,
            baseline: Some(floor),
            baseline_name: "floor: --version + round trip",
            target: format!("<= floor + {TARGET_ABOVE_FLOOR_MS} ms"),
            met: cli <= floor + TARGET_ABOVE_FLOOR_MS,
        },
        Row::untargeted(
            "cli-snapshot",
            format!("`silo snapshot`, p99 of {n}"),
            "ms",
            rounds.cli.percentile(99.0),
            Some((floor, "floor")),
        ),
        Row {
            scenario: "cli-snapshot",
            metric: format!("library checkpoint of a 1 KB step, durable p50 of {n}"),
            unit: "ms",
            silo: p50(&rounds.durable),
            baseline: Some(p50(&commit)),
            baseline_name: "commit -p",
            target: format!("<= {TARGET_DURABLE_MS} ms"),
            met: p50(&rounds.durable) <= TARGET_DURABLE_MS,
        },
        Row::untargeted(
            "cli-snapshot",
            format!("library checkpoint, call to return, p50 of {n}"),
            "ms",
            p50(&rounds.library),
            Some((p50(&commit), "commit -p")),
        ),
    ])
}

/// One sample set per thing timed in each round.
#[derive(Default)]
struct Rounds {
    version: Samples,
    open: Samples,
    cli: Samples,
    library: Samples,
    durable: Samples,
}

async fn measure(bench: &DockerBench, n: usize) -> anyhow::Result<Rounds> {
    let silo_bin = silo_beside_this_program()?;
    let home = bench.home();
    let silo = |args: &[&str]| run_silo(&silo_bin, &home, args);
    let conn = bench.silo.connect(&bench.silo.get(SANDBOX)?).await?;
    let step = |i: usize, who: &str| {
        let script = format!("head -c 1024 /dev/urandom > /root/{who}-{i}.bin");
        let conn = &conn;
        async move {
            let out = conn.run(silo_tests::sh(&script)).await?;
            anyhow::ensure!(out.exit.code == Some(0), "{script:?} failed");
            anyhow::Ok(())
        }
    };
    let snapshots = bench
        .silo
        .snapshots_of(SANDBOX)?
        .with_progress(no_progress());
    // The first snapshot stores the image; the rounds come after.
    snapshots.take(None).await?;
    let spec = ExecSpec {
        argv: vec!["true".into()],
        ..Default::default()
    };
    let mut rounds = Rounds::default();
    for i in 0..n {
        let t = Instant::now();
        let status = silo(&["--version"])?;
        rounds.version.push(t.elapsed());
        anyhow::ensure!(status.success(), "silo --version failed: {status}");
        let t = Instant::now();
        let out = conn.run(spec.clone()).await?;
        rounds.open.push(t.elapsed());
        anyhow::ensure!(out.exit.code == Some(0), "true failed: {:?}", out.exit);

        step(i, "cli").await?;
        let t = Instant::now();
        let status = silo(&["snapshot", SANDBOX])?;
        rounds.cli.push(t.elapsed());
        anyhow::ensure!(status.success(), "silo snapshot failed: {status}");

        step(i, "library").await?;
        let t = Instant::now();
        let report = snapshots.take(None).await?;
        rounds.library.push(t.elapsed());
        rounds.durable.push(std::time::Duration::from_secs_f64(
            report.durable_ms / 1000.0,
        ));
    }
    Ok(rounds)
}
