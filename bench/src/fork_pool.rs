//! `fork-pool`: `silo fork` of a snapshot (a 1 KB step on the base image)
//! to the first output of `echo ready` in the fork, onto a started sandbox
//! claimed from a warm pool of the snapshot's spec and rewound in place to
//! the snapshot, beside the same fork onto a new container (no pool), in
//! the same run.

use std::time::Instant;

use silo::{ForkTarget, no_progress};

use crate::docker_common::{DockerBench, first_output};
use crate::report::Row;
use crate::stats::Samples;

/// Fork from a pool to first output, p50, in milliseconds.
const TARGET_MS: f64 = 50.0;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n: u32 = if quick { 4 } else { 16 };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let silo = &bench.silo;
    let source = DockerBench::request("bench-fork-source");
    let spec = source.spec.clone();
    silo.create(source).await?;
    let step = silo
        .client(&silo.get("bench-fork-source")?)?
        .run(silo_tests::sh(
            "mkdir -p /work && head -c 1024 /dev/urandom > /work/step.bin",
        ))
        .await?;
    anyhow::ensure!(step.exit.code == Some(0), "the step failed");
    let snapshot = silo
        .snapshots_of("bench-fork-source")?
        .take(None)
        .await?
        .snapshot
        .id;

    silo.create_pool("bench-fork", spec, n)?;
    let filled = silo.fill_pool("bench-fork").await?;
    anyhow::ensure!(
        filled.failed.is_empty(),
        "filling the pool: {:?}",
        filled.failed
    );
    let progress = no_progress();
    let target = ForkTarget::default();
    let mut pooled = Samples::default();
    for round in 0..n {
        let name = format!("bench-fork-pool-{round}");
        let t = Instant::now();
        let report = silo.fork(&snapshot, &name, &target, &progress).await?;
        let conn = silo.connect(&report.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        pooled.push(t.elapsed());
        anyhow::ensure!(
            report.pool.is_some(),
            "round {round} made a new machine: {:?}",
            report.new_machine_because
        );
    }
    silo.remove_pool("bench-fork").await?;

    let mut new_machine = Samples::default();
    for round in 0..n.min(8) {
        let name = format!("bench-fork-new-{round}");
        let t = Instant::now();
        let report = silo.fork(&snapshot, &name, &target, &progress).await?;
        let conn = silo.connect(&report.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        new_machine.push(t.elapsed());
        anyhow::ensure!(report.pool.is_none(), "round {round} took from a pool");
        silo.remove(&name).await?;
    }
    for round in 0..n {
        silo.remove(&format!("bench-fork-pool-{round}")).await?;
    }
    silo.remove("bench-fork-source").await?;

    let (pool_ms, new_ms) = (pooled.percentile(50.0), new_machine.percentile(50.0));
    Ok(vec![
        Row {
            scenario: "fork-pool",
            metric: format!("fork from a pool to output, p50 of {n}"),
            unit: "ms",
            silo: pool_ms,
            baseline: Some(new_ms),
            baseline_name: "fork onto a new container",
            target: format!("<= {TARGET_MS} ms"),
            met: pool_ms <= TARGET_MS,
        },
        Row::untargeted(
            "fork-pool",
            format!("fork from a pool to output, p99 of {n}"),
            "ms",
            pooled.percentile(99.0),
            Some((new_machine.percentile(99.0), "fork onto a new container")),
        ),
    ])
}
