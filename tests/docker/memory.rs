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
/// to /count: going back in memory makes it count from the old value.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /count; sleep 0.05; done";

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
    assert!(silo.resume_processes(name).await.unwrap() >= 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let went_on = count().await;
    assert!(went_on > at_checkpoint, "{went_on} after {at_checkpoint}");
    assert_eq!(
        run(format!("kill -0 {pid} && echo alive")).await,
        "alive",
        "the same process counts on"
    );

    // Back to the image: the process counts on from where it stood.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = count().await;
    silo.restore_memory(name, image.path()).await.unwrap();
    silo.resume_processes(name).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = count().await;
    assert!(
        after < before && after >= at_checkpoint,
        "the counter went back to {at_checkpoint}: {after}, from {before}"
    );
    assert_eq!(run(format!("kill -0 {pid} && echo alive")).await, "alive");
    silo.remove(name).await.unwrap();
}
