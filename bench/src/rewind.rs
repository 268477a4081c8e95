//! `rewind`: going back a step. On the Debian image of `snapshot`, a 1 KB
//! step, then a rewind to the snapshot before it and the first output of a
//! command, again and again: in place (the sandbox's agent puts back what
//! changed) beside a new machine made from the same snapshot (the sandbox
//! is stopped first, untimed, so the rewind makes one, as every rewind did
//! before). Then the same with a tree of 1,000, 10,000 and 100,000 files
//! made in the sandbox: the in-place rewind walks every directory changed
//! since the machine started, so its cost grows with the tree; the rows
//! say how, and which part (the agent's listing, the store's layer, the
//! apply) grows, and what a checkpoint after a 1 KB step costs beside it.

use std::time::{Duration, Instant};

use anyhow::Context;

use silo::{BackendKind, CreateRequest, SandboxSpec, Silo};
use silo::{ImageSource, InPlace, no_progress};

use crate::docker_common::{DockerBench, first_output};
use crate::report::Row;
use crate::snapshot::{IMAGE, ensure_debian_image};
use crate::stats::Samples;

/// Rewind in place to first output after a 1 KB step, p50, in milliseconds.
const TARGET_IN_PLACE_MS: f64 = 30.0;

/// Times of in-place rewinds and of what they did.
#[derive(Default)]
pub(crate) struct InPlaceSamples {
    pub(crate) total: Samples,
    listed: Samples,
    computed: Samples,
    applied: Samples,
    /// Bytes of the restoring layer.
    pub(crate) layer_bytes: Samples,
    /// Paths the agent listed as changed.
    changed: Samples,
    /// Entries the restoring layer put back or removed.
    restored: Samples,
}

impl InPlaceSamples {
    fn push(&mut self, total: Duration, done: &InPlace) {
        self.total.push(total);
        self.listed.push_value(done.listed_ms);
        self.computed.push_value(done.computed_ms);
        self.applied.push_value(done.applied_ms);
        self.layer_bytes.push_value(done.layer_bytes as f64);
        self.changed.push_value(done.stats.changed as f64);
        self.restored
            .push_value((done.stats.restored + done.stats.removed) as f64);
    }
}

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (rounds, new_machines, sizes): (usize, usize, &[usize]) = if quick {
        (10, 3, &[1_000, 10_000])
    } else {
        (50, 9, &[1_000, 10_000, 100_000])
    };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    ensure_debian_image(&bench.engine).await?;
    let measured = measure(&bench.silo, rounds, new_machines, sizes).await;
    // On the shared engine, what the scenario made goes whether it
    // finished or not.
    for sandbox in bench.silo.list()? {
        let _ = bench.silo.remove(&sandbox.id).await;
    }
    for listed in bench.silo.snapshots(None)? {
        let _ = bench.silo.remove_snapshot(&listed.id).await;
    }
    let _ = bench.silo.gc_store(false).await;
    measured
}

async fn measure(
    silo: &Silo,
    rounds: usize,
    new_machines: usize,
    sizes: &[usize],
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();

    let name = "bench-rewind";
    create(silo, name).await?;
    let parent = checkpoint(silo, name, "head -c 1024 /dev/urandom > /root/parent.bin").await?;
    let (in_place, new_machine) = rewinds(silo, name, &parent, rounds, new_machines).await?;
    let p50 = in_place.total.percentile(50.0);
    rows.push(Row {
        scenario: "rewind",
        metric: format!("1 KB step, in place to output p50 of {rounds}"),
        unit: "ms",
        silo: p50,
        baseline: Some(new_machine.percentile(50.0)),
        baseline_name: "a new machine",
        target: format!("<= {TARGET_IN_PLACE_MS} ms"),
        met: p50 <= TARGET_IN_PLACE_MS,
    });
    rows.push(Row::untargeted(
        "rewind",
        format!("1 KB step, in place to output p99 of {rounds}"),
        "ms",
        in_place.total.percentile(99.0),
        Some((new_machine.percentile(100.0), "a new machine, max")),
    ));
    rows.extend(parts("1 KB step", &in_place));
    silo.remove(name).await?;

    for &files in sizes {
        let name = format!("bench-rewind-{files}");
        create(silo, &name).await?;
        let dirs = files.div_ceil(100);
        let make = format!(
            "perl -e 'for $d (0..{last_dir}) {{ mkdir \"/repo/d$d\" or die; \
             for $f (0..99) {{ last if $d * 100 + $f >= {files}; \
             open F, \">/repo/d$d/f$f\" or die; print F \"x\" x 100; close F }} }}'",
            last_dir = dirs - 1
        );
        // The pause keeps the tree's files out of the ctime margin of the
        // checkpoint, which would put its last ones back on every rewind.
        let parent =
            checkpoint(silo, &name, &format!("mkdir /repo && {make} && sleep 0.1")).await?;
        let rounds = if files >= 100_000 {
            rounds / 5
        } else {
            rounds / 2
        };
        // A checkpoint after a 1 KB step costs a walk of what the machine
        // changed since it started: the tree is part of that.
        let mut checkpoints = Samples::default();
        for i in 0..rounds {
            step(
                silo,
                &name,
                &format!("head -c 1024 /dev/urandom > /root/c-{i}.bin"),
            )
            .await?;
            let t = Instant::now();
            silo.snapshots_of(&name)?.take(None).await?;
            checkpoints.push(t.elapsed());
        }
        rows.push(Row::untargeted(
            "rewind",
            format!("{files}-file tree, checkpoint after a 1 KB step p50 of {rounds}"),
            "ms",
            checkpoints.percentile(50.0),
            None,
        ));
        let (in_place, new_machine) =
            rewinds(silo, &name, &parent, rounds, new_machines / 3).await?;
        rows.push(Row::untargeted(
            "rewind",
            format!("{files}-file tree, in place p50 of {rounds}"),
            "ms",
            in_place.total.percentile(50.0),
            Some((new_machine.percentile(50.0), "a new machine")),
        ));
        rows.extend(parts(&format!("{files}-file tree"), &in_place));
        silo.remove(&name).await?;
    }
    Ok(rows)
}

/// A sandbox of the Debian image, its first snapshot taken (which stores
/// the image), so later ones are checkpoints of a step.
pub(crate) async fn create(silo: &Silo, name: &str) -> anyhow::Result<()> {
    let request = CreateRequest {
        name: Some(name.to_owned()),
        spec: SandboxSpec {
            image: Some(IMAGE.to_owned()),
            ..SandboxSpec::new(BackendKind::Docker)
        },
    };
    silo.create(request).await?;
    silo.snapshots_of(name)?.take(None).await?;
    Ok(())
}

/// Runs `script` in the sandbox and snapshots it; the snapshot's id.
pub(crate) async fn checkpoint(silo: &Silo, name: &str, script: &str) -> anyhow::Result<String> {
    step(silo, name, script).await?;
    Ok(silo.snapshots_of(name)?.take(None).await?.snapshot.id)
}

pub(crate) async fn step(silo: &Silo, name: &str, script: &str) -> anyhow::Result<()> {
    let out = silo
        .client(&silo.get(name)?)?
        .run(silo_tests::sh(script))
        .await?;
    anyhow::ensure!(out.exit.code == Some(0), "{script:?} failed");
    Ok(())
}

/// `rounds` in-place rewinds to `parent`, each after a 1 KB step, then
/// `new_machines` rewinds to it onto a new machine; each to the first
/// output of a command on a new connection.
async fn rewinds(
    silo: &Silo,
    name: &str,
    parent: &str,
    rounds: usize,
    new_machines: usize,
) -> anyhow::Result<(InPlaceSamples, Samples)> {
    let one_kb = |i: usize| format!("head -c 1024 /dev/urandom > /root/step-{i}.bin");
    let in_place = in_place_rewinds(silo, name, parent, rounds, one_kb).await?;
    let progress = no_progress();
    let mut new_machine = Samples::default();
    for i in 0..new_machines.max(1) {
        step(
            silo,
            name,
            &format!("head -c 1024 /dev/urandom > /root/new-{i}.bin"),
        )
        .await?;
        silo.stop(name).await?;
        let (report, took) = rewind_to_output(silo, name, parent, &progress)
            .await
            .with_context(|| format!("rewind {i} of {name} onto a new machine"))?;
        new_machine.push(took);
        anyhow::ensure!(
            report.new_machine_because.is_some(),
            "a stopped sandbox was rewound in place"
        );
    }
    Ok((in_place, new_machine))
}

/// `rounds` in-place rewinds to `parent`, each after the step
/// `script(round)`, each to the first output of a command on a new
/// connection.
pub(crate) async fn in_place_rewinds(
    silo: &Silo,
    name: &str,
    parent: &str,
    rounds: usize,
    script: impl Fn(usize) -> String,
) -> anyhow::Result<InPlaceSamples> {
    let progress = no_progress();
    let mut in_place = InPlaceSamples::default();
    for i in 0..rounds {
        step(silo, name, &script(i)).await?;
        let (report, took) = rewind_to_output(silo, name, parent, &progress)
            .await
            .with_context(|| format!("in-place rewind {i} of {name}"))?;
        let ImageSource::InPlace(done) = &report.image else {
            anyhow::bail!(
                "the rewind made a new machine: {}",
                report.new_machine_because.unwrap_or_default()
            );
        };
        in_place.push(took, done);
    }
    Ok(in_place)
}

/// Rewinds `name` to `parent` and waits for the first output of a command
/// on a new connection; the report, and how long it all took.
async fn rewind_to_output(
    silo: &Silo,
    name: &str,
    parent: &str,
    progress: &silo::SnapshotProgressFn,
) -> anyhow::Result<(silo::RestoreReport, Duration)> {
    let t = Instant::now();
    let report = silo
        .snapshots_of(name)?
        .with_progress(std::sync::Arc::clone(progress))
        .rewind(parent)
        .await?;
    let conn = silo.connect(&report.sandbox).await?;
    first_output(&conn, &["ls", "-a", "/root"])
        .await
        .with_context(|| format!("after {report:?}"))?;
    Ok((report, t.elapsed()))
}

/// Where an in-place rewind's time goes, p50 of each part, and how much
/// it listed and put back.
pub(crate) fn parts(what: &str, samples: &InPlaceSamples) -> Vec<Row> {
    [
        ("agent ends and lists", "ms", &samples.listed),
        ("store makes the layer", "ms", &samples.computed),
        ("agent applies", "ms", &samples.applied),
        ("paths listed", "paths", &samples.changed),
        ("entries put back or removed", "entries", &samples.restored),
    ]
    .into_iter()
    .map(|(part, unit, values)| {
        Row::untargeted(
            "rewind",
            format!("{what}, {part} p50"),
            unit,
            values.percentile(50.0),
            None,
        )
    })
    .collect()
}
