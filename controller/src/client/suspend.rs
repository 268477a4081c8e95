//! Suspending the agent for a memory checkpoint and resuming it (protocol
//! 11, `silo_protocol::suspend`).

use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde::de::DeserializeOwned;
use silo_protocol::http::{PATH_RESUME, PATH_SUSPEND};
use silo_protocol::suspend::{Resumed, SuspendRequest, Suspended};

use super::{AgentClient, ClientError, rejection};

impl AgentClient {
    /// Stops the sandbox's processes and has the agent let go of every host
    /// socket; it wakes on a key file or after `wake_after`. Answers how
    /// many processes were stopped. The agent's socket file is gone once it
    /// holds nothing of the host: wait for that before the checkpoint.
    pub async fn suspend(&self, wake_after: Duration) -> Result<usize, ClientError> {
        let wake_after_ms = u64::try_from(wake_after.as_millis()).unwrap_or(u64::MAX);
        let body = serde_json::to_vec(&SuspendRequest { wake_after_ms })
            .map_err(|e| ClientError::Protocol(format!("encoding a suspend: {e}")))?;
        let answer: Suspended = self.call(PATH_SUSPEND, Bytes::from(body)).await?;
        Ok(answer.stopped)
    }

    /// Continues what a suspend stopped; answers how many processes.
    pub async fn resume(&self) -> Result<usize, ClientError> {
        let answer: Resumed = self.call(PATH_RESUME, Bytes::new()).await?;
        Ok(answer.continued)
    }

    async fn call<T: DeserializeOwned>(&self, path: &str, body: Bytes) -> Result<T, ClientError> {
        let answer = self.request(Method::POST, path, body).await?;
        if !answer.status.is_success() {
            return Err(rejection(answer.status.as_u16(), Some(&answer.body)));
        }
        serde_json::from_slice(&answer.body)
            .map_err(|e| ClientError::Protocol(format!("unreadable answer from {path}: {e}")))
    }
}
