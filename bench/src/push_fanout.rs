//! `push-fanout`: a 1 MiB bundle to 100 local sandboxes through
//! `Silo::push_to_sandboxes` (bundle built once, pushes in parallel), beside
//! `tar xzf` of the same bundle into 100 fresh directories one after another.

use std::process::Command;
use std::time::Instant;

use silo::PushOptions;
use silo::{BackendKind, CreateRequest, Silo};
use silo_protocol::bundle::{Bundle, BundleLimits, FileSet};

use crate::report::Row;

/// Sandboxes pushed to.
const SANDBOXES: usize = 100;
/// Files in the bundle, 16 KiB each: 1 MiB in all.
const FILES: usize = 64;
const FILE_BYTES: usize = 16 * 1024;
/// The mount every sandbox gets.
const MOUNT: &str = "/workspace/managed/app";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = if quick { SANDBOXES / 5 } else { SANDBOXES };
    let work = tempfile::tempdir()?;
    let silo = Silo::open(Some(work.path().join("home")))?;
    eprintln!("  creating {n} local sandboxes...");
    let mut sandboxes = Vec::with_capacity(n);
    for i in 0..n {
        sandboxes.push(
            silo.create(CreateRequest::new(BackendKind::Local).name(format!("f{i:03}")))
                .await?,
        );
    }

    let mut files = FileSet::new();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..FILES {
        let data: Vec<u8> = (0..FILE_BYTES)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        files.insert_bytes(&format!("lib/m{i:02}.bin"), data, false)?;
    }
    let targets: Vec<_> = sandboxes
        .iter()
        .map(|s| (s.clone(), files.clone()))
        .collect();
    let t = Instant::now();
    let report = silo
        .push_to_sandboxes(MOUNT, targets, &PushOptions::default())
        .await?;
    let push_secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.all_succeeded(),
        "fan-out failed: {:?}",
        report.failures
    );

    let targets: Vec<_> = sandboxes
        .iter()
        .map(|s| (s.clone(), files.clone()))
        .collect();
    let t = Instant::now();
    let again = silo
        .push_to_sandboxes(MOUNT, targets, &PushOptions::default())
        .await?;
    let unchanged_secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(again.unchanged == n, "re-push changed something");

    let bundle = Bundle::build(&files, &BundleLimits::default())?;
    let archive = work.path().join("bundle.tar.gz");
    std::fs::write(&archive, &bundle.bytes)?;
    let t = Instant::now();
    for i in 0..n {
        let dest = work.path().join(format!("tar{i}"));
        std::fs::create_dir(&dest)?;
        let status = Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&dest)
            .status()?;
        anyhow::ensure!(status.success(), "tar xzf failed");
    }
    let tar_secs = t.elapsed().as_secs_f64();

    eprintln!("  removing the sandboxes...");
    futures_util::future::join_all(sandboxes.iter().map(|s| silo.remove(&s.id))).await;

    Ok(vec![
        Row {
            scenario: "push-fanout",
            metric: format!("1 MiB to {n} sandboxes"),
            unit: "s",
            silo: push_secs,
            baseline: Some(tar_secs),
            baseline_name: "tar xzf x N, in turn",
            target: "<= 2 s".into(),
            met: push_secs <= 2.0,
        },
        Row::untargeted(
            "push-fanout",
            "same again (unchanged)",
            "s",
            unchanged_secs,
            None,
        ),
    ])
}
