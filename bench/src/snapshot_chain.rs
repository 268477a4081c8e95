//! `snapshot-chain`: a checkpoint after every step. On the Debian image of
//! `snapshot`, 100 consecutive snapshots, each after a 1 KB change, beside
//! `docker commit -p` of a plain container after the same changes (which
//! stores every change since the container was made, each time). Then
//! rewinds to snapshots spread along the chain, beside creating and
//! starting a container from a committed image.

use std::time::{Duration, Instant};

use silo::no_progress;
use silo::{BackendKind, CreateRequest, SandboxSpec};

use crate::docker_common::{DockerBench, engine_exec, first_output, remove, start_to_first_output};
use crate::report::Row;
use crate::snapshot::{IMAGE, commit_image, create_plain, create_plain_from, ensure_debian_image};
use crate::stats::Samples;
use silo_tests::docker::remove_image;

/// Durable target for each link of the chain, p50, in milliseconds (the
/// per-call target of a checkpoint, on the Debian image too).
const TARGET_DURABLE_MS: f64 = 10.0;
/// New bytes in the store for each link, at most.
const TARGET_NEW_KIB: f64 = 16.0;
/// Rewind to first output, to any link, in milliseconds.
const TARGET_REWIND_MS: f64 = 300.0;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (links, commits) = if quick { (20, 5) } else { (100, 20) };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    ensure_debian_image(&bench.engine).await?;
    let name = "bench-chain";
    let request = CreateRequest {
        name: Some(name.to_owned()),
        spec: SandboxSpec {
            image: Some(IMAGE.to_owned()),
            ..SandboxSpec::new(BackendKind::Docker)
        },
    };
    bench.silo.create(request).await?;
    let progress = no_progress();
    let conn = bench.silo.connect(&bench.silo.get(name)?).await?;
    // The chain's first snapshot stores the image; the links come after.
    let snapshots = bench
        .silo
        .snapshots_of(name)?
        .with_progress(std::sync::Arc::clone(&progress));
    snapshots.take(None).await?;

    let mut durable = Samples::default();
    let mut captured = Samples::default();
    let mut squashes = Samples::default();
    let mut new_kib = Samples::default();
    let mut chain = Vec::new();
    let mut by_digest = 0u32;
    for i in 0..links {
        let script = format!("head -c 1024 /dev/urandom > /root/step-{i}.bin");
        let out = conn.run(silo_tests::sh(&script)).await?;
        anyhow::ensure!(out.exit.code == Some(0), "{script:?} failed");
        let report = snapshots.take(None).await?;
        durable.push(Duration::from_secs_f64(report.durable_ms / 1000.0));
        captured.push(Duration::from_secs_f64(report.captured_ms / 1000.0));
        if let Some(compacted) = &report.compacted {
            squashes.push(Duration::from_secs_f64(compacted.ms / 1000.0));
        }
        new_kib.push_value(report.snapshot.new_bytes as f64 / 1024.0);
        if report.baseline_sent == silo::client::BaselineSent::Digest {
            by_digest += 1;
        }
        chain.push(report.snapshot.id);
    }
    drop(conn);

    // Rewind to links spread along the chain, oldest last so each is a
    // real change of files.
    let mut rewind = Samples::default();
    let picks = [links - 1, links / 2, links / 4, 0, links * 3 / 4, 1];
    for &pick in &picks {
        let t = Instant::now();
        let restored = snapshots.rewind(&chain[pick]).await?;
        let conn = bench.silo.connect(&restored.sandbox).await?;
        first_output(&conn, &["ls", &format!("/root/step-{pick}.bin")]).await?;
        rewind.push(t.elapsed());
    }

    // The reference: the same steps in a plain container, committed each
    // time, then a container made from a commit and run to first output.
    let plain = format!("silo-bench-chain-plain-{}", std::process::id());
    create_plain(&bench.engine, &plain, &["sleep", "1000"]).await?;
    bench.engine.start_container(&plain, None).await?;
    let mut commit = Samples::default();
    for i in 0..commits {
        let script = format!("head -c 1024 /dev/urandom > /root/step-{i}.bin");
        engine_exec(&bench.engine, &plain, &["sh", "-c", &script]).await?;
        let tag = format!("silo-bench-chain:{i}");
        let t = Instant::now();
        commit_image(&bench.engine, &plain, &tag).await?;
        commit.push(t.elapsed());
    }
    let mut run_commit = Samples::default();
    let from = format!("{plain}-run");
    for _ in 0..picks.len() {
        let t = Instant::now();
        let tag = format!("silo-bench-chain:{}", commits - 1);
        create_plain_from(&bench.engine, &from, &tag, &["echo", "ready"]).await?;
        start_to_first_output(&bench.engine, &from).await?;
        run_commit.push(t.elapsed());
        remove(&bench.engine, &from).await?;
    }
    remove(&bench.engine, &plain).await?;
    for i in 0..commits {
        remove_image(&bench.engine, &format!("silo-bench-chain:{i}")).await;
    }
    for listed in bench.silo.snapshots(None)? {
        let _ = bench.silo.remove_snapshot(&listed.id).await;
    }
    bench.silo.remove(name).await?;
    let _ = bench.silo.gc_store(false).await;

    let kib = |p: f64| new_kib.percentile(p);
    Ok(vec![
        Row {
            scenario: "snapshot-chain",
            metric: format!("1 KB step, durable p50 of {links}"),
            unit: "ms",
            silo: durable.percentile(50.0),
            baseline: Some(commit.percentile(50.0)),
            baseline_name: "commit -p",
            target: format!("<= {TARGET_DURABLE_MS} ms"),
            met: durable.percentile(50.0) <= TARGET_DURABLE_MS,
        },
        Row::untargeted(
            "snapshot-chain",
            format!("1 KB step, durable p99 of {links}"),
            "ms",
            durable.percentile(99.0),
            Some((commit.percentile(99.0), "commit -p")),
        ),
        Row::untargeted(
            "snapshot-chain",
            format!("1 KB steps whose baseline went by digest, of {links}"),
            "count",
            f64::from(by_digest),
            None,
        ),
        Row::untargeted(
            "snapshot-chain",
            format!("1 KB step, captured p50 of {links}"),
            "ms",
            captured.percentile(50.0),
            None,
        ),
        Row::untargeted(
            "snapshot-chain",
            format!(
                "squash of {} links, max of {}",
                silo::COMPACT_AT,
                squashes.len()
            ),
            "ms",
            squashes.percentile(100.0),
            None,
        ),
        Row {
            scenario: "snapshot-chain",
            metric: format!("1 KB step, new bytes, max of {links}"),
            unit: "KiB",
            silo: kib(100.0),
            baseline: None,
            baseline_name: "-",
            target: format!("<= {TARGET_NEW_KIB} KiB"),
            met: kib(100.0) <= TARGET_NEW_KIB,
        },
        Row {
            scenario: "snapshot-chain",
            metric: format!("rewind along the chain, max of {}", picks.len()),
            unit: "ms",
            silo: rewind.percentile(100.0),
            baseline: Some(run_commit.percentile(100.0)),
            baseline_name: "run a commit",
            target: format!("<= {TARGET_REWIND_MS} ms"),
            met: rewind.percentile(100.0) <= TARGET_REWIND_MS,
        },
        Row::untargeted(
            "snapshot-chain",
            format!("rewind along the chain, p50 of {}", picks.len()),
            "ms",
            rewind.percentile(50.0),
            Some((run_commit.percentile(50.0), "run a commit")),
        ),
    ])
}
