//! Memory checkpoints on Docker under gVisor: a sandbox's processes and
//! memory written out and put back (`Silo::checkpoint_memory`,
//! `Silo::restore_memory`), through the agent's suspend and the engine's
//! checkpoint API (which needs its experimental mode: `.ci/run` turns it on).

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use std::time::Duration;

use silo_tests::docker::{BASE_IMAGE, engine_with_base};

use crate::sandbox::has_runsc;

/// Whether the engine's checkpoint API is on (in CI its absence fails).
async fn has_checkpoints(engine: &bollard::Docker) -> bool {
    let on = engine.info().await.unwrap().experimental_build == Some(true);
    assert!(
        on || !silo_tests::docker::in_ci(),
        "the engine's experimental mode (its checkpoint API) is off"
    );
    if !on {
        eprintln!("skipped: the engine's checkpoint API is off");
    }
    on
}

/// A counter that lives only in a process's memory and writes each value
/// to /count (whole, by rename, so a reader never sees it half written): going back in memory makes it count from the old value.
const COUNTER: &str =
    "i=0; while true; do i=$((i+1)); echo $i > /count.new; mv /count.new /count; sleep 0.05; done";

#[tokio::test]
async fn a_gvisor_sandbox_goes_on_after_a_memory_checkpoint_and_goes_back_to_it() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    if !has_runsc(&engine).await || !has_checkpoints(&engine).await {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let silo = silo::Silo::open(Some(home.path().join("home"))).unwrap();
    let name = "mem";
    silo.create(silo::CreateRequest {
        name: Some(name.to_owned()),
        spec: silo::SandboxSpec {
            image: Some(BASE_IMAGE.to_owned()),
            runtime: Some("runsc".to_owned()),
            network: Some("none".to_owned()),
            ..silo::SandboxSpec::new(silo::BackendKind::Docker)
        },
    })
    .await
    .unwrap();
    let run = |script: String| {
        let silo = silo.clone();
        async move {
            let client = silo.client(&silo.get(name).unwrap()).unwrap();
            let out = client.run(silo_tests::sh(&script)).await.unwrap();
            assert_eq!(out.exit.code, Some(0), "{script}");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        }
    };
    let count = || async { run("cat /count".into()).await.parse::<u64>().unwrap() };
    run(format!(
        "({COUNTER}) >/dev/null 2>&1 & echo $! > /counter.pid"
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = run("cat /counter.pid".into()).await;

    let image = tempfile::tempdir().unwrap();
    let taken = silo.checkpoint_memory(name, image.path()).await.unwrap();
    assert!(taken.bytes > 0 && taken.stopped >= 1, "{taken:?}");
    eprintln!("memory checkpoint: {taken:?}");
    // Held stopped until the resume: the files are those the image saw.
    let at_checkpoint = count().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        count().await,
        at_checkpoint,
        "nothing runs before the resume"
    );
    let files = silo.snapshots_of(name).unwrap().take(None).await.unwrap();
    assert!(silo.resume_processes(name).await.unwrap() >= 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let went_on = count().await;
    assert!(went_on > at_checkpoint, "{went_on} after {at_checkpoint}");
    assert_eq!(
        run(format!("kill -0 {pid} && echo alive")).await,
        "alive",
        "the same process counts on"
    );

    // Back to the files and the image: the process counts on from where
    // it stood.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = count().await;
    // A restore needs the files the image saw: they go back first.
    let rewinds = silo.snapshots_of(name).unwrap();
    rewinds.rewind(&files.snapshot.id).await.unwrap();
    silo.restore_memory(name, image.path()).await.unwrap();
    silo.resume_processes(name).await.unwrap();
    // The first tick after the restore rewrites /count (a loaded machine
    // may take a while to give the restored process its turn).
    let after = changed_from(before, count).await;
    assert!(
        after < before && after >= at_checkpoint,
        "the counter went back to {at_checkpoint}: {after}, from {before}"
    );
    assert_eq!(run(format!("kill -0 {pid} && echo alive")).await, "alive");
    silo.remove(name).await.unwrap();
}

/// A copy of a sandbox restored from its memory image is its own sandbox:
/// its agent wakes on the copy's key and refuses the parent's, and the
/// copy's processes go on from where the parent's stood.
#[tokio::test]
async fn a_copy_restored_from_memory_answers_its_own_key_and_not_its_parents() {
    let Some(engine) = engine_with_base().await else {
        return;
    };
    if !has_runsc(&engine).await || !has_checkpoints(&engine).await {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let silo = silo::Silo::open(Some(home.path().join("home"))).unwrap();
    let (parent, copy) = ("mem-parent", "mem-copy");
    silo.create(silo::CreateRequest {
        name: Some(parent.to_owned()),
        spec: silo::SandboxSpec {
            image: Some(BASE_IMAGE.to_owned()),
            runtime: Some("runsc".to_owned()),
            network: Some("none".to_owned()),
            ..silo::SandboxSpec::new(silo::BackendKind::Docker)
        },
    })
    .await
    .unwrap();
    let client = |name: &'static str| silo.client(&silo.get(name).unwrap()).unwrap();
    let read = |client: silo::client::AgentClient, script: &'static str| async move {
        let out = client.run(silo_tests::sh(script)).await.unwrap();
        assert_eq!(out.exit.code, Some(0), "{script}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let start = format!("({COUNTER}) >/dev/null 2>&1 &");
    let out = client(parent).run(silo_tests::sh(&start)).await.unwrap();
    assert_eq!(out.exit.code, Some(0));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The image and the files it saw, taken while the processes are held.
    let image = tempfile::tempdir().unwrap();
    silo.checkpoint_memory(parent, image.path()).await.unwrap();
    let at_checkpoint: u64 = read(client(parent), "cat /count").await.parse().unwrap();
    let snap = silo.snapshots_of(parent).unwrap().take(None).await.unwrap();
    silo.resume_processes(parent).await.unwrap();
    silo.fork(
        &snap.snapshot.id,
        copy,
        &silo::ForkTarget::default(),
        &silo::no_progress(),
    )
    .await
    .unwrap();
    silo.restore_memory(copy, image.path()).await.unwrap();
    silo.resume_processes(copy).await.unwrap();

    let counted = changed_from(at_checkpoint, || async {
        read(client(copy), "cat /count")
            .await
            .parse::<u64>()
            .unwrap()
    })
    .await;
    assert!(counted > at_checkpoint, "{counted} after {at_checkpoint}");
    let parents_key = silo.sandbox_key(&silo.get(parent).unwrap());
    let forged = silo::client::AgentClient::new(client(copy).endpoint().clone(), parents_key);
    let refused = forged.run(silo_tests::sh("true")).await;
    assert!(refused.is_err(), "the copy answered its parent's key");
    silo.remove(copy).await.unwrap();
    silo.remove(parent).await.unwrap();
}

/// The first value `read` gives that is not `old`, within 10 s (else `old`).
async fn changed_from<F, Fut>(old: u64, read: F) -> u64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = read().await;
        if now != old || std::time::Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
