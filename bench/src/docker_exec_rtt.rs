//! `docker-exec-rtt`: `true` in a running Docker sandbox, through silo's
//! agent on one connection, beside the Engine API's own exec (create, start
//! attached, inspect: what `docker exec` does) in the same container.

use std::time::Instant;

use silo_protocol::exec::ExecSpec;

use crate::docker_common::{DockerBench, engine_exec_true};
use crate::report::Row;
use crate::stats::Samples;

/// The speed-up over the Engine API's exec that silo aims for.
const TARGET_SPEEDUP: f64 = 40.0;
/// silo's p50 target, in milliseconds.
const TARGET_P50_MS: f64 = 1.0;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (n, n_engine) = if quick { (100, 20) } else { (1000, 100) };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let sandbox = bench
        .silo
        .create(DockerBench::request("bench-exec-rtt"))
        .await?;
    let container = silo::internals::docker::container_name(&sandbox.id);
    let conn = bench.silo.connect(&sandbox).await?;
    let spec = ExecSpec {
        argv: vec!["true".into()],
        ..Default::default()
    };
    for _ in 0..20 {
        conn.run(spec.clone()).await?;
        engine_exec_true(&bench.engine, &container).await?;
    }
    let silo = crate::exec_rtt::time_true(&conn, n).await?;
    let mut engine = Samples::default();
    for _ in 0..n_engine {
        let t = Instant::now();
        engine_exec_true(&bench.engine, &container).await?;
        engine.push(t.elapsed());
    }
    drop(conn);
    bench.silo.remove(&sandbox.id).await?;

    let row = |metric: &str, p: f64, target: Option<f64>| Row {
        scenario: "docker-exec-rtt",
        metric: format!("{metric} ({n} vs {n_engine})"),
        unit: "ms",
        silo: silo.percentile(p),
        baseline: Some(engine.percentile(p)),
        baseline_name: "Engine API exec",
        target: target.map_or_else(|| "-".into(), |t| format!("<= {t} ms")),
        met: target.is_none_or(|t| silo.percentile(p) <= t),
    };
    let speedup = engine.percentile(50.0) / silo.percentile(50.0);
    Ok(vec![
        row("p50", 50.0, Some(TARGET_P50_MS)),
        row("p99", 99.0, None),
        Row {
            scenario: "docker-exec-rtt",
            metric: "speed-up at p50".into(),
            unit: "x",
            silo: speedup,
            baseline: None,
            baseline_name: "-",
            target: format!(">= {TARGET_SPEEDUP}x"),
            met: speedup >= TARGET_SPEEDUP,
        },
    ])
}
