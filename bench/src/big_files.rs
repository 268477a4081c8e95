//! `big-files`: going back from a step that changed a few bytes of big
//! files. On the Debian image of `snapshot`: a 50 MB file changed 4 KiB in
//! the middle, and a 50 MB log appended 1 MiB, each rewound in place to
//! the snapshot before it (the agent sums the changed file's blocks, the
//! store sends back only the blocks that differ) beside a new container
//! started from a `docker commit` of the same state; a tree of files of 1
//! to 5 MB with 20 of them changed, rewound the same way. Beside them,
//! what a checkpoint of the 4 KiB step costs and stores (a snapshot still
//! takes a changed file whole) beside `docker commit -p`, and the floor
//! under the in-place rewind: reading the 50 MB file inside the sandbox.

use std::time::Instant;

use silo::Silo;
use silo_tests::docker::remove_image;

use crate::docker_common::{DockerBench, remove, start_to_first_output};
use crate::report::Row;
use crate::rewind::{checkpoint, create, in_place_rewinds, parts, step};
use crate::snapshot::{IMAGE, commit_image, create_plain_from, ensure_debian_image};
use crate::stats::Samples;

/// Rewind in place to output after 4 KiB changed in a 50 MB file, p50, ms.
const TARGET_MIDDLE_MS: f64 = 20.0;
/// The restoring layer of that rewind, KiB.
const TARGET_MIDDLE_LAYER_KIB: f64 = 64.0;
/// Rewind in place to output after 1 MiB appended to a 50 MB log, p50, ms.
const TARGET_APPEND_MS: f64 = 30.0;
/// Rewind in place to output of a tree of big files, 20 changed, p50, ms.
const TARGET_TREE_MS: f64 = 40.0;

/// The big file and the log, 50 MB each.
const BIG_BYTES: u64 = 50 * 1024 * 1024;
/// 4 KiB blocks into the big file where its middle is.
const MIDDLE_BLOCK: u64 = BIG_BYTES / 4096 / 2;

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let (rounds, new_containers, tree_files) = if quick { (5, 2, 100) } else { (30, 5, 1_000) };
    let Some(bench) = DockerBench::start().await? else {
        return Ok(Vec::new());
    };
    ensure_debian_image(&bench.engine).await?;
    let measured = measure(&bench, rounds, new_containers, tree_files).await;
    for sandbox in bench.silo.list()? {
        let _ = bench.silo.remove(&sandbox.id).await;
    }
    for listed in bench.silo.snapshots(None)? {
        let _ = bench.silo.remove_snapshot(&listed.id).await;
    }
    let _ = bench.silo.gc_store(false).await;
    let _ = remove(&bench.engine, PLAIN).await;
    remove_image(&bench.engine, COMMITTED).await;
    measured
}

/// The plain container and the image committed from it.
const PLAIN: &str = "silo-bench-big-files-plain";
const COMMITTED: &str = "silo-bench-big-files:committed";

async fn measure(
    bench: &DockerBench,
    rounds: usize,
    new_containers: usize,
    tree_files: usize,
) -> anyhow::Result<Vec<Row>> {
    let silo = &bench.silo;
    let mut rows = Vec::new();
    let name = "bench-big-files";
    create(silo, name).await?;
    let make = format!(
        "mkdir -p /data && head -c {BIG_BYTES} /dev/urandom > /data/big.bin && \
         head -c {BIG_BYTES} /dev/urandom > /data/log && sleep 0.1"
    );
    let parent = checkpoint(silo, name, &make).await?;
    let middle = |_: usize| {
        format!(
            "head -c 4096 /dev/urandom | dd of=/data/big.bin bs=4096 seek={MIDDLE_BLOCK} \
             conv=notrunc status=none"
        )
    };

    // The floor: the agent reads the whole changed file to sum it.
    let mut reads = Samples::default();
    for _ in 0..rounds {
        reads.push_value(read_ms(silo, name, "/data/big.bin").await?);
    }

    let middle_rewinds = in_place_rewinds(silo, name, &parent, rounds, middle).await?;
    let new_container = new_containers_ms(bench, &make, &middle(0), new_containers).await?;
    let p50 = middle_rewinds.total.percentile(50.0);
    rows.push(Row {
        scenario: "big-files",
        metric: format!("50 MB file, 4 KiB changed mid-file, in place to output p50 of {rounds}"),
        unit: "ms",
        silo: p50,
        baseline: Some(new_container.percentile(50.0)),
        baseline_name: "docker run of a commit",
        target: format!("<= {TARGET_MIDDLE_MS} ms"),
        met: p50 <= TARGET_MIDDLE_MS,
    });
    let layer_kib = middle_rewinds.layer_bytes.percentile(50.0) / 1024.0;
    rows.push(Row {
        scenario: "big-files",
        metric: "50 MB file, 4 KiB changed mid-file, the rewind's layer p50".into(),
        unit: "KiB",
        silo: layer_kib,
        baseline: Some(BIG_BYTES as f64 / 1024.0),
        baseline_name: "the whole file",
        target: format!("<= {TARGET_MIDDLE_LAYER_KIB} KiB"),
        met: layer_kib <= TARGET_MIDDLE_LAYER_KIB,
    });
    rows.push(Row::untargeted(
        "big-files",
        "reading the 50 MB file inside the sandbox p50 (the floor)",
        "ms",
        reads.percentile(50.0),
        None,
    ));
    rows.extend(parts("50 MB file, 4 KiB mid-file", &middle_rewinds));

    // A checkpoint of the same step, beside `docker commit -p`.
    let mut checkpoints = Samples::default();
    let mut layers = Samples::default();
    for i in 0..rounds {
        step(silo, name, &middle(i)).await?;
        let t = Instant::now();
        let taken = silo.snapshots_of(name)?.take(None).await?;
        checkpoints.push(t.elapsed());
        layers.push_value(taken.snapshot.layer_bytes as f64 / 1024.0);
    }
    let commits = commits_ms(bench, &middle(0), new_containers).await?;
    rows.push(Row::untargeted(
        "big-files",
        format!("50 MB file, 4 KiB changed mid-file, checkpoint p50 of {rounds}"),
        "ms",
        checkpoints.percentile(50.0),
        Some((commits.percentile(50.0), "docker commit -p")),
    ));
    rows.push(Row::untargeted(
        "big-files",
        "50 MB file, 4 KiB changed mid-file, the checkpoint's layer p50",
        "KiB",
        layers.percentile(50.0),
        None,
    ));

    let append = |_: usize| "head -c 1048576 /dev/urandom >> /data/log".to_owned();
    let appended = in_place_rewinds(silo, name, &parent, rounds, append).await?;
    let p50 = appended.total.percentile(50.0);
    rows.push(Row {
        scenario: "big-files",
        metric: format!("50 MB log, 1 MiB appended, in place to output p50 of {rounds}"),
        unit: "ms",
        silo: p50,
        baseline: None,
        baseline_name: "",
        target: format!("<= {TARGET_APPEND_MS} ms"),
        met: p50 <= TARGET_APPEND_MS,
    });
    rows.extend(parts("50 MB log, 1 MiB appended", &appended));
    silo.remove(name).await?;

    let name = "bench-big-tree";
    create(silo, name).await?;
    let make_tree = format!(
        "mkdir /tree && i=0; while [ $i -lt {tree_files} ]; do \
         head -c $(( (1 + i % 5) * 1048576 )) /dev/urandom > /tree/f$i; i=$((i + 1)); done; \
         sleep 0.1"
    );
    let parent = checkpoint(silo, name, &make_tree).await?;
    let every = tree_files / 20;
    let twenty = |_: usize| {
        format!(
            "i=0; while [ $i -lt {tree_files} ]; do head -c 4096 /dev/urandom | \
             dd of=/tree/f$i bs=4096 seek=100 conv=notrunc status=none; i=$((i + {every})); done"
        )
    };
    let tree = in_place_rewinds(silo, name, &parent, rounds, twenty).await?;
    let p50 = tree.total.percentile(50.0);
    rows.push(Row {
        scenario: "big-files",
        metric: format!(
            "{tree_files} files of 1-5 MB, 20 changed, in place to output p50 of {rounds}"
        ),
        unit: "ms",
        silo: p50,
        baseline: None,
        baseline_name: "",
        target: format!("<= {TARGET_TREE_MS} ms"),
        met: p50 <= TARGET_TREE_MS,
    });
    rows.extend(parts(&format!("{tree_files} big files, 20 changed"), &tree));
    silo.remove(name).await?;
    Ok(rows)
}

/// How long `cat FILE > /dev/null` takes inside the sandbox, by the
/// shell's own clock (the exec's round trip left out).
async fn read_ms(silo: &Silo, name: &str, file: &str) -> anyhow::Result<f64> {
    let spec = silo_protocol::exec::ExecSpec {
        argv: vec![
            "bash".into(),
            "-c".into(),
            format!("TIMEFORMAT=%R; time cat {file} > /dev/null"),
        ],
        ..Default::default()
    };
    let out = silo.client(&silo.get(name)?)?.run(spec).await?;
    let text = String::from_utf8_lossy(&out.stderr);
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("no time in {text:?}"))?;
    Ok(secs * 1000.0)
}

/// The plain alternative's rewind: a container with the same files,
/// committed, then `rounds` new containers of the commit to first output
/// (each after `step` in the old one, which a new container drops).
async fn new_containers_ms(
    bench: &DockerBench,
    make: &str,
    change: &str,
    rounds: usize,
) -> anyhow::Result<Samples> {
    plain_with(bench, make).await?;
    commit_image(&bench.engine, PLAIN, COMMITTED).await?;
    let mut samples = Samples::default();
    for i in 0..rounds.max(1) {
        crate::docker_common::engine_exec(&bench.engine, PLAIN, &["sh", "-c", change]).await?;
        let fresh = format!("{PLAIN}-{i}");
        create_plain_from(&bench.engine, &fresh, COMMITTED, &["echo", "ready"]).await?;
        samples.push(start_to_first_output(&bench.engine, &fresh).await?);
        remove(&bench.engine, &fresh).await?;
    }
    Ok(samples)
}

/// `docker commit -p` of the plain container after `change`, `rounds` times.
async fn commits_ms(bench: &DockerBench, change: &str, rounds: usize) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    for i in 0..rounds.max(1) {
        crate::docker_common::engine_exec(&bench.engine, PLAIN, &["sh", "-c", change]).await?;
        let t = Instant::now();
        commit_image(&bench.engine, PLAIN, &format!("{COMMITTED}-{i}")).await?;
        samples.push(t.elapsed());
        remove_image(&bench.engine, &format!("{COMMITTED}-{i}")).await;
    }
    Ok(samples)
}

/// The plain container, running, with `make` run in it.
async fn plain_with(bench: &DockerBench, make: &str) -> anyhow::Result<()> {
    let _ = remove(&bench.engine, PLAIN).await;
    create_plain_from(&bench.engine, PLAIN, IMAGE, &["sleep", "infinity"]).await?;
    bench
        .engine
        .start_container(
            PLAIN,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await?;
    crate::docker_common::engine_exec(&bench.engine, PLAIN, &["sh", "-c", make]).await
}
