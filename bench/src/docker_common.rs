//! What the Docker scenarios share: the engine and the base image (skipped
//! outside CI when there is no engine, as the tests do), a silo home of
//! their own, and the plain Engine API operations silo is compared with.

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder,
    WaitContainerOptions,
};
use futures_util::StreamExt;
use silo::client::ExecEvent;
use silo::{BackendKind, CreateRequest, SandboxSpec, Silo};
use silo_protocol::exec::ExecSpec;
use silo_tests::docker::BASE_IMAGE;

/// An engine with the base image, and a silo home to make sandboxes in.
pub struct DockerBench {
    pub engine: Docker,
    pub silo: Silo,
    _home: tempfile::TempDir,
}

impl DockerBench {
    /// `None` (with the reason printed) when there is no engine outside CI.
    pub async fn start() -> anyhow::Result<Option<Self>> {
        let Some(engine) = silo_tests::docker::engine_with_base().await else {
            return Ok(None);
        };
        let home = tempfile::Builder::new().prefix("silo-bench-").tempdir()?;
        let silo = Silo::open(Some(home.path().join("home")))?;
        Ok(Some(Self {
            engine,
            silo,
            _home: home,
        }))
    }

    /// The silo home the bench's library uses, for a CLI on the same one.
    pub fn home(&self) -> std::path::PathBuf {
        self._home.path().join("home")
    }

    /// A request for a base-image sandbox called `name`.
    pub fn request(name: &str) -> CreateRequest {
        CreateRequest {
            name: Some(name.to_owned()),
            spec: SandboxSpec {
                image: Some(BASE_IMAGE.to_owned()),
                ..SandboxSpec::new(BackendKind::Docker)
            },
        }
    }
}

/// Runs `argv` on a connection and returns when its first output arrives
/// (the exec is then drained, untimed by the caller's clock if it stopped it).
pub async fn first_output(
    conn: &silo::client::ExecConnection,
    argv: &[&str],
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut handle = conn
        .exec(ExecSpec {
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        })
        .await?;
    let mut took = None;
    while let Some(event) = handle.next_event().await {
        match event {
            ExecEvent::Output { .. } if took.is_none() => took = Some(t.elapsed()),
            ExecEvent::Exit(_) => break,
            _ => {}
        }
    }
    took.ok_or_else(|| anyhow::anyhow!("{argv:?} printed nothing"))
}

/// `docker exec CONTAINER true` through the Engine API, as the docker CLI
/// does it: create the exec, start it attached, drain it, inspect its code.
pub async fn engine_exec_true(engine: &Docker, container: &str) -> anyhow::Result<()> {
    engine_exec(engine, container, &["true"]).await
}

/// `docker exec CONTAINER ARGV…`, as [`engine_exec_true`] does it; fails
/// unless the command exits 0.
pub async fn engine_exec(engine: &Docker, container: &str, argv: &[&str]) -> anyhow::Result<()> {
    let exec = engine
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(argv.to_vec()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await?;
    if let StartExecResults::Attached { mut output, .. } = engine.start_exec(&exec.id, None).await?
    {
        while output.next().await.is_some() {}
    }
    let code = engine.inspect_exec(&exec.id).await?.exit_code;
    anyhow::ensure!(code == Some(0), "{argv:?} exited {code:?}");
    Ok(())
}

/// Creates a plain container of the base image running `argv`.
pub async fn plain_container(engine: &Docker, name: &str, argv: &[&str]) -> anyhow::Result<()> {
    let body = ContainerCreateBody {
        image: Some(BASE_IMAGE.to_owned()),
        cmd: Some(argv.iter().map(|a| (*a).to_owned()).collect()),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::new().name(name).build();
    engine.create_container(Some(options), body).await?;
    Ok(())
}

/// Starts a container and waits for it to exit.
pub async fn start_and_wait(engine: &Docker, name: &str) -> anyhow::Result<()> {
    engine.start_container(name, None).await?;
    let mut wait = engine.wait_container(name, None::<WaitContainerOptions>);
    while let Some(step) = wait.next().await {
        step?;
    }
    Ok(())
}

/// Starts a stopped container and returns when its first output arrives
/// (attached before the start, so no byte is missed); then waits for its exit.
pub async fn start_to_first_output(engine: &Docker, name: &str) -> anyhow::Result<Duration> {
    let options = AttachContainerOptionsBuilder::new()
        .stream(true)
        .stdout(true)
        .stderr(true)
        .build();
    let mut attached = engine.attach_container(name, Some(options)).await?;
    let t = Instant::now();
    engine.start_container(name, None).await?;
    let first = attached.output.next().await;
    let took = t.elapsed();
    anyhow::ensure!(
        matches!(first, Some(Ok(_))),
        "container {name} printed nothing"
    );
    let mut wait = engine.wait_container(name, None::<WaitContainerOptions>);
    while let Some(step) = wait.next().await {
        step?;
    }
    Ok(took)
}

/// Removes a container, running or not.
pub async fn remove(engine: &Docker, name: &str) -> anyhow::Result<()> {
    let options = RemoveContainerOptionsBuilder::new().force(true).build();
    engine.remove_container(name, Some(options)).await?;
    Ok(())
}

/// Bakes this build's agent into the base image as `tag` (a template or
/// image that carries the agent).
pub async fn bake_base(tag: &str) -> anyhow::Result<()> {
    let engine = silo::internals::docker::connect().await?;
    let baked = silo::internals::image::BakeRequest {
        base: silo_tests::docker::BASE_IMAGE,
        tag,
        agent: silo_tests::agent_binary(),
        listen: silo::DEFAULT_LISTEN,
    };
    silo::internals::image::bake(
        &engine,
        &silo::internals::docker::DOCKER,
        &baked,
        &mut |_| {},
    )
    .await?;
    Ok(())
}
