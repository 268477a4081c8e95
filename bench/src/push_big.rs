//! `push-big`: a ~100 MiB bundle of ~2000 files pushed into one sandbox,
//! beside `tar xzf` of the same bundle into a fresh local directory, and
//! `docker cp` of the same tree into a container when an engine is there.
//!
//! Figures are unpacked MiB per second, end to end: for silo that is the
//! upload over the agent's socket, the streaming extract, the hash check and
//! the swap; for tar, decompress and write; for docker cp, the engine's own
//! tar stream. The bundle is built once beforehand (its build time is shown
//! as a row of its own).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use silo::internals::push::{RetryPolicy, SharedBundle, files_from_dir, push_to_sandbox};
use silo_protocol::bundle::{Bundle, BundleLimits};
use silo_tests::TestAgent;

use crate::report::Row;

/// Files in the tree.
const FILES: usize = 2000;
/// Bytes of file data: just under the 100 MiB bundle cap with tar headers.
const TOTAL: usize = 98 * 1024 * 1024;
/// Runs of each side; the best is reported (the machine is shared).
const RUNS: usize = 3;
/// The image `docker cp` copies into: imported from an empty tar, no registry needed.
const DOCKER_IMAGE: &str = "silo-bench-empty:latest";

pub async fn run(quick: bool) -> anyhow::Result<Vec<Row>> {
    let work = tempfile::tempdir()?;
    let tree = work.path().join("tree");
    let (files, total) = if quick {
        (FILES / 10, TOTAL / 10)
    } else {
        (FILES, TOTAL)
    };
    make_tree(&tree, files, total)?;
    let started = Instant::now();
    let set = files_from_dir(&tree)?;
    let bundle: SharedBundle = Bundle::build(&set, &BundleLimits::default())?.into();
    let build_secs = started.elapsed().as_secs_f64();
    let archive = work.path().join("bundle.tar.gz");
    std::fs::write(&archive, &bundle.bytes)?;
    let mib = bundle.unpacked_bytes as f64 / (1024.0 * 1024.0);
    eprintln!(
        "  bundle: {} files, {:.1} MiB unpacked, {:.1} MiB compressed, built in {build_secs:.2} s",
        bundle.files,
        mib,
        bundle.bytes.len() as f64 / (1024.0 * 1024.0)
    );

    let root = work.path().join("managed");
    let agent = TestAgent::start_with(&["--push-root", &root.display().to_string()], &[]).await;
    let mut silo_best = f64::INFINITY;
    for run in 0..RUNS {
        // A new mount each run: the same bundle twice would be "unchanged".
        let mount = root.join(format!("app{run}")).display().to_string();
        let t = Instant::now();
        let (answer, _) = push_to_sandbox(
            &agent.client(),
            &mount,
            &bundle,
            &RetryPolicy::default(),
            None,
        )
        .await?;
        silo_best = silo_best.min(t.elapsed().as_secs_f64());
        anyhow::ensure!(
            answer.files == bundle.files,
            "pushed {} files",
            answer.files
        );
    }

    let mut tar_best = f64::INFINITY;
    for run in 0..RUNS {
        let dest = work.path().join(format!("tar{run}"));
        std::fs::create_dir(&dest)?;
        let t = Instant::now();
        let status = Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&dest)
            .status()?;
        tar_best = tar_best.min(t.elapsed().as_secs_f64());
        anyhow::ensure!(status.success(), "tar xzf failed");
    }

    let silo_rate = mib / silo_best;
    let tar_rate = mib / tar_best;
    let mut rows = vec![
        Row {
            scenario: "push-big",
            metric: format!("{} files, {mib:.0} MiB", bundle.files),
            unit: "MiB/s",
            silo: silo_rate,
            baseline: Some(tar_rate),
            baseline_name: "tar xzf into a new dir",
            target: ">= 0.5x tar".into(),
            met: silo_rate >= 0.5 * tar_rate,
        },
        Row::untargeted("push-big", "bundle build (once)", "s", build_secs, None),
    ];
    rows.push(match docker_cp_secs(&tree) {
        Ok(secs) => Row::untargeted(
            "push-big",
            "vs docker cp",
            "MiB/s",
            silo_rate,
            Some((mib / secs, "docker cp of the tree")),
        ),
        Err(reason) if silo_tests::docker::in_ci() => {
            anyhow::bail!("CI=true but the docker cp baseline failed: {reason}")
        }
        Err(reason) => {
            eprintln!("  docker cp row skipped: {reason}");
            Row {
                scenario: "push-big",
                metric: "vs docker cp".into(),
                unit: "MiB/s",
                silo: silo_rate,
                baseline: None,
                baseline_name: "docker cp (skipped)",
                target: format!("skipped: {reason}"),
                met: true,
            }
        }
    });
    Ok(rows)
}

/// `files` files of incompressible bytes adding up to `total`, in 20 directories.
fn make_tree(dir: &Path, files: usize, total: usize) -> anyhow::Result<()> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        // xorshift64: fast, and incompressible enough for gzip.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let average = total / files;
    for i in 0..files {
        let sub = dir.join(format!("d{:02}", i % 20));
        std::fs::create_dir_all(&sub)?;
        // Sizes spread between half and one and a half times the average.
        let size = average / 2 + (i * 7919) % average;
        let mut data = Vec::with_capacity(size + 8);
        while data.len() < size {
            data.extend_from_slice(&next().to_le_bytes());
        }
        data.truncate(size);
        std::fs::write(sub.join(format!("f{i:04}.bin")), data)?;
    }
    Ok(())
}

/// Best of [`RUNS`] `docker cp`s of `tree` into a fresh container, or why
/// it cannot be measured here (a failure under `CI=true`, a skipped row
/// elsewhere).
fn docker_cp_secs(tree: &Path) -> Result<f64, String> {
    let docker = |args: &[&str]| {
        Command::new("docker")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run docker: {e}"))
    };
    let info = docker(&["info"])?;
    if !info.status.success() {
        return Err("no Docker engine reachable".into());
    }
    if !docker(&["image", "inspect", DOCKER_IMAGE])?
        .status
        .success()
    {
        import_empty_image()?;
    }
    let mut best = f64::INFINITY;
    for run in 0..RUNS {
        let name = format!("silo-bench-cp-{}-{run}", std::process::id());
        let created = docker(&["create", "--name", &name, DOCKER_IMAGE, "/none"])?;
        if !created.status.success() {
            return Err(format!(
                "docker create failed: {}",
                String::from_utf8_lossy(&created.stderr).trim()
            ));
        }
        let source = format!("{}/.", tree.display());
        let t = Instant::now();
        let copied = docker(&["cp", &source, &format!("{name}:/dest")])?;
        let secs = t.elapsed().as_secs_f64();
        let _ = docker(&["rm", "-f", &name]);
        if !copied.status.success() {
            return Err(format!(
                "docker cp failed: {}",
                String::from_utf8_lossy(&copied.stderr).trim()
            ));
        }
        best = best.min(secs);
    }
    Ok(best)
}

/// An image with nothing but `/tmp`, made from a local tar (no registry).
fn import_empty_image() -> Result<(), String> {
    let tar = tar_header_only();
    let mut child = Command::new("docker")
        .args(["import", "-", DOCKER_IMAGE])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run docker import: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(&tar)
            .map_err(|e| format!("docker import: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("docker import: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "docker import failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A tar holding one directory entry, `tmp/`.
fn tar_header_only() -> Vec<u8> {
    let mut entry = silo_tests::push::tar_entry(b"tmp/", b'5', b"", b"");
    entry.extend_from_slice(&[0u8; 1024]);
    entry
}
