//! `fleet`: silo on a fleet's PostgreSQL and S3 server beside the embedded
//! defaults (the home's SQLite and store), in the same run. Needs the
//! services `scripts/fleet.sh up` starts, found as the tests find them
//! (`eval "$(scripts/fleet.sh test-env)"`); each run uses a schema and a
//! bucket prefix of its own.
//!
//! - a checkpoint after a 1 KB step, to durable (in the bucket, with the
//!   fleet), p50;
//! - a fork of a snapshot holding a 2,000-file tree on the other host with
//!   its cache empty, beside the same fork on the host that took it (both
//!   with the engine image removed first, so both load it);
//! - `silo ls` with 1,000 local sandboxes;
//! - a pool claim (`up --pool`) to first output.

use std::process::{Command, Stdio};
use std::time::Instant;

use futures_util::{StreamExt, stream};
use silo::fleet::Fleet;
use silo::internals::ScratchSchema;
use silo::{BackendKind, CreateRequest, ForkTarget, SandboxSpec, Silo, SiloOptions, StateLocation};

use crate::docker_common::{DockerBench, first_output};
use crate::docker_resume::silo_beside_this_program;
use crate::report::Row;
use crate::stats::Samples;

/// Durable after a 1 KB step, p50, with the shared store on loopback (ms).
const TARGET_DURABLE_MS: f64 = 15.0;
/// A cold-cache fork on another host, as a multiple of the same fork on
/// the host that took the snapshot.
const TARGET_FORK_RATIO: f64 = 2.0;
/// `silo ls` with 1,000 records (ms).
const TARGET_LS_MS: f64 = 50.0;
/// A pool claim to first output (ms).
const TARGET_CLAIM_MS: f64 = 20.0;
/// Local sandboxes made at once for the listing.
const CONCURRENCY: usize = 8;
/// The snapshot's tree: 20 directories of 100 files.
const TREE: &str = "mkdir -p /work/repo && cd /work/repo && for d in $(seq 20); do \
                    mkdir d$d; for f in $(seq 100); do echo $d.$f > d$d/f$f; done; done";

/// The homes of one run: two hosts of a fleet and one on the defaults.
struct Homes {
    a: Silo,
    b: Silo,
    defaults: Silo,
    dir: tempfile::TempDir,
    fleet_env: Vec<(String, String)>,
    _schema: ScratchSchema,
}

fn homes() -> anyhow::Result<Homes> {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{name} is not set: start the services with `scripts/fleet.sh up` and \
                 `eval \"$(scripts/fleet.sh test-env)\"`"
                )
            })
    };
    let (postgres, bucket) = (var("SILO_TEST_POSTGRES_URL")?, var("SILO_TEST_S3_URL")?);
    let schema = ScratchSchema::create(&postgres)?;
    let store = format!("{}/bench-{}", bucket.trim_end_matches('/'), schema.name());
    let dir = tempfile::Builder::new()
        .prefix("silo-bench-fleet-")
        .tempdir()?;
    let host = |name: &str| {
        Silo::open_with(SiloOptions {
            home: Some(dir.path().join(name)),
            fleet: Some(Fleet {
                host: name.to_owned(),
                state: StateLocation::Postgres(schema.url.clone()),
                store: Some(store.clone()),
            }),
            ..SiloOptions::default()
        })
    };
    let (a, b) = (host("a")?, host("b")?);
    let defaults = Silo::open(Some(dir.path().join("defaults")))?;
    let fleet_env = vec![
        (silo::fleet::STATE_URL_ENV.to_owned(), schema.url.clone()),
        (silo::fleet::STORE_URL_ENV.to_owned(), store),
        (silo::fleet::HOST_ENV.to_owned(), "a".to_owned()),
    ];
    Ok(Homes {
        a,
        b,
        defaults,
        dir,
        fleet_env,
        _schema: schema,
    })
}

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    let homes = homes()?;
    let mut rows = Vec::new();
    rows.extend(checkpoints(&homes, quick).await?);
    rows.extend(forks(&bench, &homes, quick).await?);
    rows.extend(claims(&homes, quick).await?);
    rows.extend(listing(&homes, quick).await?);
    Ok(rows)
}

/// Durable after each 1 KB step, p50 (ms), on `silo`.
async fn checkpoint_p50(silo: &Silo, name: &str, steps: u32) -> anyhow::Result<f64> {
    silo.create(DockerBench::request(name)).await?;
    let conn = silo.connect(&silo.get(name)?).await?;
    let snapshots = silo.snapshots_of(name)?;
    // The first stores the base image; the steps come after.
    snapshots.take(None).await?;
    let mut durable = Samples::default();
    for i in 0..steps {
        let script = format!("head -c 1024 /dev/urandom > /root/step-{i}.bin");
        let out = conn.run(silo_tests::sh(&script)).await?;
        anyhow::ensure!(out.exit.code == Some(0), "{script:?} failed");
        let report = snapshots.take(None).await?;
        durable.push(std::time::Duration::from_secs_f64(
            report.durable_ms / 1000.0,
        ));
    }
    silo.remove(name).await?;
    Ok(durable.percentile(50.0))
}

async fn checkpoints(homes: &Homes, quick: bool) -> anyhow::Result<Vec<Row>> {
    let steps = if quick { 10 } else { 50 };
    let defaults = checkpoint_p50(&homes.defaults, "bench-step", steps).await?;
    let fleet = checkpoint_p50(&homes.a, "bench-step", steps).await?;
    Ok(vec![Row {
        scenario: "fleet",
        metric: format!("checkpoint after a 1 KB step, durable, p50 of {steps}"),
        unit: "ms",
        silo: fleet,
        baseline: Some(defaults),
        baseline_name: "the same on the home's SQLite and store",
        target: format!("<= {TARGET_DURABLE_MS} ms"),
        met: fleet <= TARGET_DURABLE_MS,
    }])
}

/// A fork of `snapshot` by `silo` to its first output, with the engine's
/// image of the snapshot removed first (and, on a host with `cold`, its
/// cache emptied), so the fork loads it.
async fn fork_once(
    bench: &DockerBench,
    silo: &Silo,
    snapshot: &str,
    name: &str,
    cold: bool,
) -> anyhow::Result<std::time::Duration> {
    silo_tests::docker::remove_image(&bench.engine, &format!("silo-snapshot:{snapshot}")).await;
    if cold {
        let store = silo.home().store_dir();
        if store.exists() {
            std::fs::remove_dir_all(&store)?;
        }
    }
    let t = Instant::now();
    let made = silo
        .fork(snapshot, name, &ForkTarget::default(), &silo::no_progress())
        .await?;
    let conn = silo.connect(&made.sandbox).await?;
    first_output(&conn, &["echo", "ready"]).await?;
    let took = t.elapsed();
    silo.remove(name).await?;
    Ok(took)
}

async fn forks(bench: &DockerBench, homes: &Homes, quick: bool) -> anyhow::Result<Vec<Row>> {
    let rounds = if quick { 2 } else { 5 };
    let a = &homes.a;
    a.create(DockerBench::request("bench-tree")).await?;
    let step = a
        .client(&a.get("bench-tree")?)?
        .run(silo_tests::sh(TREE))
        .await?;
    anyhow::ensure!(step.exit.code == Some(0), "making the tree failed");
    let snapshot = a.snapshots_of("bench-tree")?.take(None).await?.snapshot.id;
    let (mut here, mut there) = (Samples::default(), Samples::default());
    for round in 0..rounds {
        here.push(fork_once(bench, a, &snapshot, &format!("bench-here-{round}"), false).await?);
        there.push(
            fork_once(
                bench,
                &homes.b,
                &snapshot,
                &format!("bench-there-{round}"),
                true,
            )
            .await?,
        );
    }
    a.remove("bench-tree").await?;
    let (here_ms, there_ms) = (here.percentile(50.0), there.percentile(50.0));
    Ok(vec![Row {
        scenario: "fleet",
        metric: format!(
            "fork of a 2,000-file snapshot on the other host, cold cache, to output, p50 of {rounds}"
        ),
        unit: "ms",
        silo: there_ms,
        baseline: Some(here_ms),
        baseline_name: "the same fork on the host that took it",
        target: format!("<= {TARGET_FORK_RATIO}x"),
        met: there_ms <= here_ms * TARGET_FORK_RATIO,
    }])
}

/// `up --pool` to first output, p50 (ms), on `silo`.
async fn claim_p50(silo: &Silo, n: u32) -> anyhow::Result<f64> {
    let spec = DockerBench::request("unused").spec;
    silo.create_pool("bench-warm", spec, n)?;
    let filled = silo.fill_pool("bench-warm").await?;
    anyhow::ensure!(filled.failed.is_empty(), "filling: {:?}", filled.failed);
    let mut claims = Samples::default();
    for round in 0..n {
        let name = format!("bench-claim-{round}");
        let t = Instant::now();
        let outcome = silo.up_from_pool(&name, "bench-warm").await?;
        let conn = silo.connect(&outcome.sandbox).await?;
        first_output(&conn, &["echo", "ready"]).await?;
        claims.push(t.elapsed());
        anyhow::ensure!(
            outcome.action == silo::UpAction::Claimed,
            "round {round} was not claimed: {:?}",
            outcome.notes
        );
    }
    for round in 0..n {
        silo.remove(&format!("bench-claim-{round}")).await?;
    }
    silo.remove_pool("bench-warm").await?;
    Ok(claims.percentile(50.0))
}

async fn claims(homes: &Homes, quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { 4 } else { 16 };
    let defaults = claim_p50(&homes.defaults, n).await?;
    let fleet = claim_p50(&homes.a, n).await?;
    Ok(vec![Row {
        scenario: "fleet",
        metric: format!("pool claim (up --pool) to output, p50 of {n}"),
        unit: "ms",
        silo: fleet,
        baseline: Some(defaults),
        baseline_name: "the same on the home's SQLite",
        target: format!("<= {TARGET_CLAIM_MS} ms"),
        met: fleet <= TARGET_CLAIM_MS,
    }])
}

/// `silo ls -o json` as a new process, p50 of 5 (ms), on a home with
/// `count` local sandboxes, and (with a fleet's `other` host and its
/// environment) the same from that host, which asks no machine of them.
async fn ls_p50(
    silo: &Silo,
    home: &std::path::Path,
    env: &[(String, String)],
    count: usize,
    other: Option<(&std::path::Path, &[(String, String)])>,
) -> anyhow::Result<(f64, Option<f64>)> {
    let spec = SandboxSpec::new(BackendKind::Local);
    let made: Vec<_> = stream::iter(0..count)
        .map(|i| {
            silo.create(CreateRequest {
                name: Some(format!("bench-many-{i}")),
                spec: spec.clone(),
            })
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for result in made {
        result?;
    }
    let bin = silo_beside_this_program()?;
    let time_ls = |home: &std::path::Path, env: &[(String, String)]| -> anyhow::Result<f64> {
        let mut ls = Samples::default();
        for _ in 0..5 {
            let t = Instant::now();
            let status = Command::new(&bin)
                .arg("--home")
                .arg(home)
                .args(["ls", "-o", "json"])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            anyhow::ensure!(status.success(), "silo ls failed");
            ls.push(t.elapsed());
        }
        Ok(ls.percentile(50.0))
    };
    let here = time_ls(home, env)?;
    let there = other.map(|(home, env)| time_ls(home, env)).transpose()?;
    let all = silo.list()?;
    let removed: Vec<_> = stream::iter(all)
        .map(|sandbox| async move { silo.remove(&sandbox.id).await })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for result in removed {
        result?;
    }
    Ok((here, there))
}

async fn listing(homes: &Homes, quick: bool) -> anyhow::Result<Vec<Row>> {
    let count = if quick { 100 } else { 1000 };
    let (defaults, _) = ls_p50(
        &homes.defaults,
        &homes.dir.path().join("defaults"),
        &[],
        count,
        None,
    )
    .await?;
    // Host b lists host a's sandboxes without asking their machines: the
    // records alone.
    let as_b: Vec<(String, String)> = homes
        .fleet_env
        .iter()
        .map(|(name, value)| {
            let value = if name == silo::fleet::HOST_ENV {
                "b"
            } else {
                value
            };
            (name.clone(), value.to_owned())
        })
        .collect();
    let (fleet, records) = ls_p50(
        &homes.a,
        &homes.dir.path().join("a"),
        &homes.fleet_env,
        count,
        Some((&homes.dir.path().join("b"), &as_b)),
    )
    .await?;
    let records = records.unwrap_or(f64::NAN);
    Ok(vec![
        Row::untargeted(
            "fleet",
            format!("`silo ls`, {count} local sandboxes, each machine asked, p50 of 5"),
            "ms",
            fleet,
            Some((defaults, "the same on the home's SQLite")),
        ),
        Row {
            scenario: "fleet",
            metric: format!(
                "`silo ls`, {count} records, from another host (no machine asked), p50 of 5"
            ),
            unit: "ms",
            silo: records,
            baseline: Some(fleet),
            baseline_name: "on their own host, each machine asked",
            target: format!("<= {TARGET_LS_MS} ms"),
            met: records <= TARGET_LS_MS,
        },
    ])
}
