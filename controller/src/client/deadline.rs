//! `/v1/deadline` (protocol 8): the lifetime after which a sandbox's agent
//! stops it, read and set at run time.

use std::time::Duration;

use bytes::Bytes;
use http::Method;
use silo_protocol::http::{Deadline, DeadlineState, PATH_DEADLINE};

use super::{AgentClient, ClientError, rejection};

impl AgentClient {
    /// Sets the agent's lifetime deadline to `after` from now (rounded up
    /// to whole seconds), or clears it (`None`); answers the time left.
    pub async fn set_deadline(
        &self,
        after: Option<Duration>,
    ) -> Result<Option<Duration>, ClientError> {
        let seconds = after.map(|after| after.as_secs() + u64::from(after.subsec_nanos() > 0));
        let body = serde_json::to_vec(&Deadline { seconds })
            .map_err(|e| ClientError::Protocol(format!("encoding a deadline: {e}")))?;
        self.deadline_call(Method::PUT, Bytes::from(body)).await
    }

    /// The time left before the agent stops the sandbox; `None` when no
    /// deadline is set.
    pub async fn deadline(&self) -> Result<Option<Duration>, ClientError> {
        self.deadline_call(Method::GET, Bytes::new()).await
    }

    async fn deadline_call(
        &self,
        method: Method,
        body: Bytes,
    ) -> Result<Option<Duration>, ClientError> {
        let answer = self.request(method, PATH_DEADLINE, body).await?;
        if !answer.status.is_success() {
            return Err(rejection(answer.status.as_u16(), Some(&answer.body)));
        }
        let state: DeadlineState = serde_json::from_slice(&answer.body)
            .map_err(|e| ClientError::Protocol(format!("unreadable deadline answer: {e}")))?;
        Ok(state.remaining_ms.map(Duration::from_millis))
    }
}
