//! `resume`: a brand-new `silo` process running `silo exec NAME -- true` on
//! a running Docker sandbox, end to end (process start to exit), beside the
//! Engine API's exec; and a stopped sandbox brought back (`up`) to the first
//! output of `echo ready`, beside a bare start of a stopped plain container
//! of the same image to its first output.

use std::process::{Command, Stdio};
use std::time::Instant;

use silo::UpRequest;

use crate::docker_common::{
    DockerBench, engine_exec_true, first_output, plain_container, remove, start_to_first_output,
};
use crate::report::Row;
use crate::stats::Samples;

/// End-to-end target for a new process's exec, in milliseconds.
const TARGET_EXEC_MS: f64 = 15.0;
/// A resumed sandbox may take at most this many times a bare start.
const TARGET_START_RATIO: f64 = 1.2;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (n_exec, n_start) = if quick { (10, 3) } else { (50, 15) };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    // Found before any container exists, so a missing CLI leaves none behind.
    let silo_bin = silo_beside_this_program()?;
    let name = "bench-resume";
    let sandbox = bench.silo.create(DockerBench::request(name)).await?;
    let container = silo::internals::docker::container_name(&sandbox.id);
    let home = bench.silo.home().root().to_owned();
    let exec_true = || {
        Command::new(&silo_bin)
            .env("SILO_HOME", &home)
            .env_remove("SILO_AGENT")
            .args(["exec", name, "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
    };
    for _ in 0..5 {
        exec_true()?;
    }
    let mut new_process = Samples::default();
    for _ in 0..n_exec {
        let t = Instant::now();
        let status = exec_true()?;
        new_process.push(t.elapsed());
        anyhow::ensure!(status.success(), "silo exec failed: {status}");
    }
    let mut engine = Samples::default();
    for _ in 0..n_exec {
        let t = Instant::now();
        engine_exec_true(&bench.engine, &container).await?;
        engine.push(t.elapsed());
    }

    let plain = format!("silo-bench-resume-plain-{}", std::process::id());
    plain_container(&bench.engine, &plain, &["echo", "ready"]).await?;
    let mut resumed = Samples::default();
    let mut started = Samples::default();
    for round in 0..=n_start {
        bench.silo.stop(name).await?;
        let t = Instant::now();
        let up = bench
            .silo
            .up(UpRequest {
                name: name.to_owned(),
                spec: None,
                recreate: false,
            })
            .await?;
        let conn = bench.silo.connect(&up.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        let took = t.elapsed();
        drop(conn);
        let plain_took = start_to_first_output(&bench.engine, &plain).await?;
        if round > 0 {
            resumed.push(took);
            started.push(plain_took);
        }
    }
    remove(&bench.engine, &plain).await?;
    bench.silo.remove(name).await?;

    let start_ratio = resumed.percentile(50.0) / started.percentile(50.0);
    Ok(vec![
        Row {
            scenario: "resume",
            metric: format!("new process exec p50 of {n_exec}"),
            unit: "ms",
            silo: new_process.percentile(50.0),
            baseline: Some(engine.percentile(50.0)),
            baseline_name: "Engine API exec",
            target: format!("<= {TARGET_EXEC_MS} ms"),
            met: new_process.percentile(50.0) <= TARGET_EXEC_MS,
        },
        Row {
            scenario: "resume",
            metric: format!("stopped to output p50 of {n_start}"),
            unit: "ms",
            silo: resumed.percentile(50.0),
            baseline: Some(started.percentile(50.0)),
            baseline_name: "bare start to output",
            target: format!("<= {TARGET_START_RATIO}x"),
            met: start_ratio <= TARGET_START_RATIO,
        },
    ])
}

/// The `silo` CLI of the same build as this program (cargo puts every
/// binary of a profile in one directory).
pub(crate) fn silo_beside_this_program() -> anyhow::Result<std::path::PathBuf> {
    let me = std::env::current_exe()?;
    let silo = me.with_file_name("silo");
    anyhow::ensure!(
        silo.is_file(),
        "{} is missing: build the CLI with this program's profile first \
         (cargo build --release -p silo-cli)",
        silo.display()
    );
    Ok(silo)
}
