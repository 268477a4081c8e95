//! `pool`: `silo up NAME --pool POOL` to the first output of `echo ready`
//! (a started sandbox claimed from a warm pool), beside the Engine API
//! creating and starting a plain container of the same image that runs
//! `echo ready`, to its first output.

use std::time::Instant;

use crate::docker_common::{
    DockerBench, first_output, plain_container, remove, start_to_first_output,
};
use crate::report::Row;
use crate::stats::Samples;

/// Claim to first output, p50, in milliseconds.
const TARGET_MS: f64 = 20.0;
/// How many times faster than a plain container's create and start.
const TARGET_SPEEDUP: f64 = 15.0;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n: u32 = if quick { 4 } else { 16 };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let spec = DockerBench::request("unused").spec;
    bench.silo.create_pool("bench", spec, n)?;
    let filled = bench.silo.fill_pool("bench").await?;
    anyhow::ensure!(
        filled.failed.is_empty(),
        "filling the pool: {:?}",
        filled.failed
    );

    let mut claim = Samples::default();
    for round in 0..n {
        let name = format!("bench-pool-{round}");
        let t = Instant::now();
        let outcome = bench.silo.up_from_pool(&name, "bench").await?;
        let conn = bench.silo.connect(&outcome.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        claim.push(t.elapsed());
        anyhow::ensure!(
            outcome.action == silo::UpAction::Claimed,
            "round {round} was not claimed: {:?}",
            outcome.notes
        );
    }

    let mut plain = Samples::default();
    for round in 0..n.min(8) {
        let container = format!("silo-bench-pool-plain-{}-{round}", std::process::id());
        let t = Instant::now();
        plain_container(&bench.engine, &container, &["echo", "ready"]).await?;
        let created = t.elapsed();
        plain.push(created + start_to_first_output(&bench.engine, &container).await?);
        remove(&bench.engine, &container).await?;
    }
    for round in 0..n {
        bench.silo.remove(&format!("bench-pool-{round}")).await?;
    }
    bench.silo.remove_pool("bench").await?;

    let (silo_ms, plain_ms) = (claim.percentile(50.0), plain.percentile(50.0));
    Ok(vec![
        Row {
            scenario: "pool",
            metric: format!("up --pool to output, p50 of {n}"),
            unit: "ms",
            silo: silo_ms,
            baseline: Some(plain_ms),
            baseline_name: "create+start to output",
            target: format!("<= {TARGET_MS} ms"),
            met: silo_ms <= TARGET_MS,
        },
        Row {
            scenario: "pool",
            metric: format!("up --pool to output, speed-up p50 of {n}"),
            unit: "x",
            silo: plain_ms / silo_ms,
            baseline: None,
            baseline_name: "-",
            target: format!(">= {TARGET_SPEEDUP}x faster"),
            met: plain_ms / silo_ms >= TARGET_SPEEDUP,
        },
        Row::untargeted(
            "pool",
            format!("up --pool to output, p99 of {n}"),
            "ms",
            claim.percentile(99.0),
            Some((plain.percentile(99.0), "create+start to output")),
        ),
    ])
}
