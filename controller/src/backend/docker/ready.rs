//! Waiting for a container's agent: after the engine says a container
//! started, silo still waits until the agent inside answers its health check
//! on the sandbox's socket, and notices early (with the container's last
//! output) when the container exits instead.

use silo_protocol::http::error_chain;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::ContainerInspectResponse;

use super::engine::logs_tail;
use super::error::{DockerError, api};
use crate::client::AgentClient;
use crate::retry::Deadline;

/// How long a freshly started container's agent has to answer.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a single health probe may take before the agent counts as hung.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between health probes while waiting.
const POLL: Duration = Duration::from_millis(3);
/// How often the engine is asked whether the container died while waiting.
const INSPECT_EVERY: Duration = Duration::from_millis(250);
/// The agent's pid inside its container: it is the container's init.
const AGENT_PID: u32 = 1;

/// Whether the container's agent answers now.
pub async fn healthy(client: &AgentClient) -> bool {
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, client.healthz()).await,
        Ok(Ok(health)) if health.pid == AGENT_PID
    )
}

/// Whether the engine reports the container running.
pub fn is_running(info: &ContainerInspectResponse) -> bool {
    info.state.as_ref().and_then(|s| s.running).unwrap_or(false)
}

/// Polls the agent until it answers; fails early if the container exits,
/// and stops the container if the agent never answers, so nothing is left
/// half-started.
pub async fn wait_for_agent(
    engine: &Docker,
    container: &str,
    client: &AgentClient,
) -> Result<(), DockerError> {
    let deadline = Deadline::after(READY_TIMEOUT, POLL);
    let mut next_inspect = Instant::now() + INSPECT_EVERY;
    let mut last: String;
    loop {
        match tokio::time::timeout(PROBE_TIMEOUT, client.healthz()).await {
            Ok(Ok(health)) if health.pid == AGENT_PID => return Ok(()),
            Ok(Ok(health)) => {
                last = format!(
                    "an agent with pid {} answered, not the container's init",
                    health.pid
                );
            }
            Ok(Err(error)) => last = error_chain(&error),
            Err(_) => last = format!("no answer within {PROBE_TIMEOUT:?}"),
        }
        let now = Instant::now();
        if now >= next_inspect {
            next_inspect = now + INSPECT_EVERY;
            let info = engine
                .inspect_container(container, None)
                .await
                .map_err(api(format!("inspect container {container}")))?;
            if !is_running(&info) {
                let state = info.state.unwrap_or_default();
                let status = match (state.exit_code, state.oom_killed) {
                    (_, Some(true)) => "killed: out of memory".to_owned(),
                    (Some(code), _) => format!("exit code {code}"),
                    (None, _) => "not running".to_owned(),
                };
                return Err(DockerError::Exited {
                    container: container.to_owned(),
                    status,
                    logs: logs_tail(engine, container).await,
                });
            }
        }
        if !deadline.pause().await {
            let logs = logs_tail(engine, container).await;
            let stop = bollard::query_parameters::StopContainerOptionsBuilder::new()
                .t(0)
                .build();
            if let Err(error) = engine.stop_container(container, Some(stop)).await {
                tracing::warn!(
                    container,
                    "stopping a container whose agent never answered: {error}"
                );
            }
            return Err(DockerError::NotReady {
                container: container.to_owned(),
                waited: READY_TIMEOUT,
                last,
                logs,
            });
        }
    }
}
