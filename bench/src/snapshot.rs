//! `snapshot`: on a Debian image (a `debootstrap` rootfs loaded with the
//! Engine API's import, built once and kept), change 1 KB, then take a silo
//! snapshot beside the reference users come from: `docker commit -p`, then
//! `docker save` of the committed image to a file. Then rewind to the first
//! output of a command, beside `docker load` of that file and a start of a
//! container from it. The first snapshot, on an image the store lacks, is
//! captured against the container's own listing before the image is
//! stored; creating that container (which lists it) is timed beside
//! creating one once the image is stored. Then the same snapshot with a 50 MB change, to show
//! how the cost follows the change rather than the image.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerConfig, ContainerCreateBody};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, CreateContainerOptionsBuilder, CreateImageOptionsBuilder,
};
use futures_util::StreamExt;
use silo::no_progress;
use silo::{BackendKind, CreateRequest, SandboxSpec};
use tokio::io::AsyncWriteExt;

use silo_tests::docker::remove_image;

use crate::docker_common::{DockerBench, first_output, remove, start_to_first_output};
use crate::report::Row;
use crate::stats::Samples;

/// The Debian image the scenario runs on.
pub const IMAGE: &str = "silo-bench-debian:bookworm";
/// The floor for "an image users have": at least this many bytes.
const MIN_IMAGE_BYTES: i64 = 150_000_000;
/// Durable snapshot target for a 1 KB change, in milliseconds.
const TARGET_DURABLE_MS: f64 = 200.0;
/// New bytes in the store for a 1 KB change, at most.
const TARGET_NEW_KB: f64 = 256.0;
/// First snapshot on an image the store lacks, captured, in milliseconds.
const TARGET_FIRST_CAPTURED_MS: f64 = 50.0;
/// Rewind to first output target, in milliseconds.
const TARGET_REWIND_MS: f64 = 300.0;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (n_small, n_rewind, n_reference) = if quick { (3, 3, 1) } else { (9, 9, 3) };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let image_bytes = ensure_debian_image(&bench.engine).await?;
    let name = "bench-snapshot";
    let request = CreateRequest {
        name: Some(name.to_owned()),
        spec: SandboxSpec {
            image: Some(IMAGE.to_owned()),
            ..SandboxSpec::new(BackendKind::Docker)
        },
    };
    // The store lacks the image: the container lists its own paths as it
    // is made, so its first snapshot need not wait for the image's export.
    let t = Instant::now();
    bench.silo.create(request.clone()).await?;
    let create_listed = t.elapsed();
    let progress = no_progress();
    let exec = |script: String| {
        let silo = &bench.silo;
        async move {
            let sandbox = silo.get(name)?;
            let out = silo.client(&sandbox)?.run(silo_tests::sh(&script)).await?;
            anyhow::ensure!(out.exit.code == Some(0), "{script:?} failed");
            anyhow::Ok(())
        }
    };

    // The first snapshot on an image is captured against that listing and
    // then stores the image's layers, once.
    exec("head -c 1024 /dev/urandom > /root/first.bin".into()).await?;
    let snapshots = bench
        .silo
        .snapshots_of(name)?
        .with_progress(std::sync::Arc::clone(&progress));
    let first = snapshots.take(None).await?;
    let base = first
        .base_stored
        .clone()
        .ok_or_else(|| anyhow::anyhow!("the first snapshot stored no base"))?;
    // With the image stored, a new container needs no listing.
    let second = CreateRequest {
        name: Some(format!("{name}-2")),
        ..request
    };
    let t = Instant::now();
    bench.silo.create(second).await?;
    let create_stored = t.elapsed();
    bench.silo.remove(&format!("{name}-2")).await?;

    let mut durable = Samples::default();
    let mut captured = Samples::default();
    let mut loaded = Samples::default();
    let mut new_kb = Vec::new();
    let mut last = first.snapshot.id.clone();
    for i in 0..n_small {
        exec(format!("head -c 1024 /dev/urandom > /root/change-{i}.bin")).await?;
        let report = snapshots.take(None).await?;
        durable.push(Duration::from_secs_f64(report.durable_ms / 1000.0));
        captured.push(Duration::from_secs_f64(report.captured_ms / 1000.0));
        // A snapshot no longer makes its engine image; what that costs a
        // restore that needs one, asked for apart.
        let t = Instant::now();
        bench
            .silo
            .make_engine_image(&report.snapshot.id, &progress)
            .await?;
        loaded.push(t.elapsed());
        new_kb.push(report.snapshot.new_bytes as f64 / 1024.0);
        last = report.snapshot.id;
    }
    new_kb.sort_by(f64::total_cmp);
    let new_kb = new_kb[new_kb.len() / 2];

    // The reference: a plain container with the same change, committed with
    // a pause, and the committed image saved to a file.
    let plain = format!("silo-bench-snapshot-plain-{}", std::process::id());
    let dir = tempfile::tempdir()?;
    let saved = dir.path().join("saved.tar");
    create_plain(
        &bench.engine,
        &plain,
        &[
            "sh",
            "-c",
            "head -c 1024 /dev/urandom > /root/change.bin; sleep 1000",
        ],
    )
    .await?;
    bench.engine.start_container(&plain, None).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut commit = Samples::default();
    let mut commit_save = Samples::default();
    let mut save_bytes = 0;
    for round in 0..n_reference {
        let tag = format!("silo-bench-committed:{round}");
        let t = Instant::now();
        commit_image(&bench.engine, &plain, &tag).await?;
        commit.push(t.elapsed());
        save_bytes = save_image(&bench.engine, &tag, &saved).await?;
        commit_save.push(t.elapsed());
        if round + 1 < n_reference {
            remove_image(&bench.engine, &tag).await;
        }
    }
    let reference_tag = format!("silo-bench-committed:{}", n_reference - 1);

    // Rewind to first output, beside load + run of the saved image.
    let mut rewind = Samples::default();
    for _ in 0..n_rewind {
        let t = Instant::now();
        let restored = snapshots.rewind(&last).await?;
        let conn = bench.silo.connect(&restored.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        rewind.push(t.elapsed());
    }
    // And from the store alone, after the engine lost the snapshot's image.
    let snapshot = bench.silo.snapshot_info(&last)?;
    let mut from_store = Samples::default();
    for _ in 0..n_rewind.min(3) {
        snapshots.rewind(&first.snapshot.id).await?;
        remove_image(&bench.engine, &format!("silo-snapshot:{}", snapshot.id)).await;
        let t = Instant::now();
        let restored = snapshots.rewind(&last).await?;
        let conn = bench.silo.connect(&restored.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        from_store.push(t.elapsed());
    }
    let mut load_run = Samples::default();
    let loaded_name = format!("{plain}-loaded");
    for _ in 0..n_reference {
        remove_image(&bench.engine, &reference_tag).await;
        let t = Instant::now();
        load_file(&bench.engine, &saved).await?;
        create_plain_from(
            &bench.engine,
            &loaded_name,
            &reference_tag,
            &["echo", "ready"],
        )
        .await?;
        let _ = start_to_first_output(&bench.engine, &loaded_name).await?;
        load_run.push(t.elapsed());
        remove(&bench.engine, &loaded_name).await?;
    }

    // A 50 MB change, both ways.
    exec("head -c 52428800 /dev/urandom > /root/big.bin".into()).await?;
    let big = snapshots.take(None).await?;
    let cmd = "head -c 52428800 /dev/urandom > /root/big.bin; sleep 1000";
    let plain_big = format!("{plain}-big");
    create_plain(&bench.engine, &plain_big, &["sh", "-c", cmd]).await?;
    bench.engine.start_container(&plain_big, None).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t = Instant::now();
    commit_image(&bench.engine, &plain_big, "silo-bench-committed:big").await?;
    let big_save_bytes = save_image(&bench.engine, "silo-bench-committed:big", &saved).await?;
    let big_reference = t.elapsed().as_secs_f64() * 1000.0;

    for container in [&plain, &plain_big] {
        remove(&bench.engine, container).await?;
    }
    for tag in [reference_tag.as_str(), "silo-bench-committed:big"] {
        remove_image(&bench.engine, tag).await;
    }
    for listed in bench.silo.snapshots(None)? {
        let _ = bench.silo.remove_snapshot(&listed.id).await;
    }
    bench.silo.remove(name).await?;
    let _ = bench.silo.gc_store(false).await;

    let mb = |bytes: u64| bytes as f64 / 1_048_576.0;
    let mut rows = vec![
        Row {
            scenario: "snapshot",
            metric: format!("1 KB change, durable p50 of {n_small}"),
            unit: "ms",
            silo: durable.percentile(50.0),
            baseline: Some(commit_save.percentile(50.0)),
            baseline_name: "commit -p + save",
            target: format!("<= {TARGET_DURABLE_MS} ms"),
            met: durable.percentile(50.0) <= TARGET_DURABLE_MS,
        },
        Row::untargeted(
            "snapshot",
            format!("1 KB change, captured p50 of {n_small}"),
            "ms",
            captured.percentile(50.0),
            Some((commit.percentile(50.0), "commit -p")),
        ),
        Row::untargeted(
            "snapshot",
            format!("1 KB change, engine image made later, p50 of {n_small}"),
            "ms",
            loaded.percentile(50.0),
            Some((commit.percentile(50.0), "commit -p")),
        ),
        Row {
            scenario: "snapshot",
            metric: "1 KB change, new bytes stored".into(),
            unit: "KiB",
            silo: new_kb,
            baseline: Some(save_bytes as f64 / 1024.0),
            baseline_name: "save archive",
            target: format!("<= {TARGET_NEW_KB} KiB"),
            met: new_kb <= TARGET_NEW_KB,
        },
        Row {
            scenario: "snapshot",
            metric: format!("rewind to output p50 of {n_rewind}"),
            unit: "ms",
            silo: rewind.percentile(50.0),
            baseline: Some(load_run.percentile(50.0)),
            baseline_name: "load + run",
            target: format!("<= {TARGET_REWIND_MS} ms"),
            met: rewind.percentile(50.0) <= TARGET_REWIND_MS,
        },
        Row::untargeted(
            "snapshot",
            "rewind from store, p50",
            "ms",
            from_store.percentile(50.0),
            Some((load_run.percentile(50.0), "load + run")),
        ),
        Row::untargeted(
            "snapshot",
            "50 MB change, durable",
            "ms",
            big.durable_ms,
            Some((big_reference, "commit -p + save")),
        ),
        Row::untargeted(
            "snapshot",
            "50 MB change, new bytes",
            "MiB",
            mb(big.snapshot.new_bytes),
            Some((mb(big_save_bytes), "save archive")),
        ),
        Row {
            scenario: "snapshot",
            metric: "first (image not stored), 1 KB change, captured".into(),
            unit: "ms",
            silo: first.captured_ms,
            baseline: Some(commit.percentile(50.0)),
            baseline_name: "commit -p",
            target: format!("<= {TARGET_FIRST_CAPTURED_MS} ms"),
            met: first.captured_ms <= TARGET_FIRST_CAPTURED_MS,
        },
        Row::untargeted(
            "snapshot",
            "first: durable (stores the image once)",
            "ms",
            first.durable_ms,
            Some((commit_save.percentile(50.0), "commit -p + save")),
        ),
        Row::untargeted(
            "snapshot",
            "create, image not stored (lists the container)",
            "ms",
            create_listed.as_secs_f64() * 1000.0,
            Some((create_stored.as_secs_f64() * 1000.0, "create, image stored")),
        ),
    ];
    rows.push(Row::untargeted(
        "snapshot",
        format!("base stored ({:.0} MiB image)", mb(image_bytes)),
        "MiB",
        mb(base.bytes),
        None,
    ));
    Ok(rows)
}

/// The Debian image, made with `debootstrap` and the Engine API's import
/// the first time; returns its size.
pub async fn ensure_debian_image(engine: &Docker) -> anyhow::Result<u64> {
    if let Ok(found) = engine.inspect_image(IMAGE).await {
        return Ok(u64::try_from(found.size.unwrap_or(0)).unwrap_or(0));
    }
    let dir = tempfile::tempdir()?;
    let rootfs = dir.path().join("rootfs");
    eprintln!("building {IMAGE} with debootstrap (once; about a minute)...");
    let status = Command::new("debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(&rootfs)
        .arg("http://deb.debian.org/debian")
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run debootstrap ({e}); scripts/bench.sh installs it (apt-get install debootstrap)"
            )
        })?;
    anyhow::ensure!(status.success(), "debootstrap failed: {status}");
    let archive = dir.path().join("rootfs.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()?;
    anyhow::ensure!(status.success(), "tar of the rootfs failed: {status}");
    let (repo, tag) = IMAGE.split_once(':').unwrap_or((IMAGE, "latest"));
    let options = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .build();
    let body = bollard::body_full(std::fs::read(&archive)?.into());
    let mut progress = engine.create_image(Some(options), Some(body), None);
    while let Some(step) = progress.next().await {
        step?;
    }
    let size = engine.inspect_image(IMAGE).await?.size.unwrap_or(0);
    anyhow::ensure!(
        size >= MIN_IMAGE_BYTES,
        "{IMAGE} is only {size} bytes; the scenario wants at least {MIN_IMAGE_BYTES}"
    );
    Ok(u64::try_from(size).unwrap_or(0))
}

pub async fn create_plain(engine: &Docker, name: &str, argv: &[&str]) -> anyhow::Result<()> {
    create_plain_from(engine, name, IMAGE, argv).await
}

pub async fn create_plain_from(
    engine: &Docker,
    name: &str,
    image: &str,
    argv: &[&str],
) -> anyhow::Result<()> {
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(argv.iter().map(|a| (*a).to_owned()).collect()),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::new().name(name).build();
    engine.create_container(Some(options), body).await?;
    Ok(())
}

/// `docker commit -p CONTAINER TAG`.
pub async fn commit_image(engine: &Docker, container: &str, tag: &str) -> anyhow::Result<()> {
    let (repo, tag) = tag.split_once(':').unwrap_or((tag, "latest"));
    let options = CommitContainerOptionsBuilder::new()
        .container(container)
        .repo(repo)
        .tag(tag)
        .pause(true)
        .build();
    engine
        .commit_container(options, ContainerConfig::default())
        .await?;
    Ok(())
}

/// `docker save TAG > FILE`, streamed to disk; returns its size.
async fn save_image(engine: &Docker, tag: &str, file: &Path) -> anyhow::Result<u64> {
    let engine = engine
        .clone()
        .with_timeout(silo::internals::docker::LONG_REQUEST_TIMEOUT);
    let mut out = tokio::fs::File::create(file).await?;
    let mut stream = engine.export_image(tag);
    let mut bytes = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        bytes += chunk.len() as u64;
        out.write_all(&chunk).await?;
    }
    out.sync_all().await?;
    Ok(bytes)
}

/// `docker load < FILE`.
async fn load_file(engine: &Docker, file: &Path) -> anyhow::Result<()> {
    let engine = engine
        .clone()
        .with_timeout(silo::internals::docker::LONG_REQUEST_TIMEOUT);
    let body = tokio::fs::read(file).await?;
    let options = bollard::query_parameters::ImportImageOptionsBuilder::new()
        .quiet(true)
        .build();
    let mut progress = engine.import_image(options, bollard::body_full(body.into()), None);
    while let Some(step) = progress.next().await {
        step?;
    }
    Ok(())
}
