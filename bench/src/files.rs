//! `files`: one file into and out of a running Docker sandbox through the
//! agent's file API (`Sandbox::files()`, `write` and `read`), beside
//! `docker cp` of the same file into and out of the same container, run as
//! a user runs it (the docker CLI). A 1 KiB file (p50 of many) and a
//! 100 MiB one (median of a few).
//!
//! Both sides go from a host file to a host file: silo's timing includes
//! reading the source from the host and writing the copy out, as `docker
//! cp` does. Each copy is checked to be the same bytes once, untimed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::docker_common::DockerBench;
use crate::report::Row;
use crate::stats::Samples;

/// The small file.
const SMALL: usize = 1024;
/// The big file.
const BIG: usize = 100 << 20;
/// Where silo's copy goes in the sandbox.
const SILO_PATH: &str = "/tmp/bench-silo.bin";
/// Where docker cp's copy goes, apart from silo's.
const DOCKER_PATH: &str = "/tmp/bench-docker.bin";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    // (silo small, docker small, big each side); quick also shrinks the big file.
    let (n_silo, n_docker, n_big, big) = if quick {
        (50, 5, 1, BIG / 10)
    } else {
        (500, 30, 3, BIG)
    };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let record = bench
        .silo
        .create(DockerBench::request("bench-files"))
        .await?;
    let container = silo::internals::docker::container_name(&record.id);
    let sandbox = bench.silo.sandbox(&record.id).await?;
    let work = tempfile::tempdir()?;

    let mut rows = Vec::new();
    for (size, n_silo, n_docker, label) in [
        (SMALL, n_silo, n_docker, "1 KiB".to_owned()),
        (big, n_big, n_big, format!("{} MiB", big >> 20)),
    ] {
        let source = work.path().join("source.bin");
        std::fs::write(&source, silo_tests::push::incompressible(size as u64, size))?;
        let silo_out = work.path().join("silo-out.bin");
        let docker_out = work.path().join("docker-out.bin");
        let docker_in = format!("{container}:{DOCKER_PATH}");

        // One untimed round each, which also checks the bytes.
        silo_in(&sandbox, &source).await?;
        silo_out_to(&sandbox, &silo_out).await?;
        docker(&["cp", &source.display().to_string(), &docker_in])?;
        docker(&["cp", &docker_in, &docker_out.display().to_string()])?;
        let want = std::fs::read(&source)?;
        anyhow::ensure!(std::fs::read(&silo_out)? == want, "silo's copy differs");
        anyhow::ensure!(
            std::fs::read(&docker_out)? == want,
            "docker cp's copy differs"
        );

        let (mut write, mut read) = (Samples::default(), Samples::default());
        for _ in 0..n_silo {
            let t = Instant::now();
            silo_in(&sandbox, &source).await?;
            write.push(t.elapsed());
            let t = Instant::now();
            silo_out_to(&sandbox, &silo_out).await?;
            read.push(t.elapsed());
        }
        let (mut cp_in, mut cp_out) = (Samples::default(), Samples::default());
        for _ in 0..n_docker {
            let t = Instant::now();
            docker(&["cp", &source.display().to_string(), &docker_in])?;
            cp_in.push(t.elapsed());
            let t = Instant::now();
            docker(&["cp", &docker_in, &docker_out.display().to_string()])?;
            cp_out.push(t.elapsed());
        }
        rows.extend(report(
            size,
            &label,
            n_silo,
            n_docker,
            [
                ("write", &write, &cp_in, "docker cp in"),
                ("read", &read, &cp_out, "docker cp out"),
            ],
        ));
    }
    bench.silo.remove(&record.id).await?;
    Ok(rows)
}

/// Rows for one size: p50 in ms for the small file, MiB/s at the median
/// for the big one.
fn report(
    size: usize,
    label: &str,
    n_silo: usize,
    n_docker: usize,
    sides: [(&str, &Samples, &Samples, &'static str); 2],
) -> Vec<Row> {
    sides
        .into_iter()
        .map(|(verb, silo, docker, baseline)| {
            let (silo_ms, docker_ms) = (silo.percentile(50.0), docker.percentile(50.0));
            if size == SMALL {
                Row::untargeted(
                    "files",
                    format!("{verb} {label}, p50 ({n_silo} vs {n_docker})"),
                    "ms",
                    silo_ms,
                    Some((docker_ms, baseline)),
                )
            } else {
                let mib = size as f64 / f64::from(1 << 20);
                let rate = |ms: f64| mib / (ms / 1000.0);
                Row::untargeted(
                    "files",
                    format!("{verb} {label}, median of {n_silo}"),
                    "MiB/s",
                    rate(silo_ms),
                    Some((rate(docker_ms), baseline)),
                )
            }
        })
        .collect()
}

/// The host file into the sandbox through the agent.
async fn silo_in(sandbox: &silo::Sandbox, source: &Path) -> anyhow::Result<()> {
    let data = tokio::fs::read(source).await?;
    sandbox.files().write(SILO_PATH, data, None).await?;
    Ok(())
}

/// The sandbox's copy out to a host file through the agent.
async fn silo_out_to(sandbox: &silo::Sandbox, dest: &Path) -> anyhow::Result<()> {
    let data = sandbox.files().read(SILO_PATH).await?;
    tokio::fs::write(dest, &data).await?;
    Ok(())
}

/// Runs the docker CLI; a failure carries its stderr.
fn docker(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "docker {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
