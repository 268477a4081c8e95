//! The two requests that make snapshots work on a machine that is not an
//! engine: `POST /v1/index` (every path of the machine, the baseline its
//! snapshots' deletions are found against) and `POST /v1/layers` (a
//! snapshot's layer applied onto the machine).

use bytes::Bytes;
use silo_protocol::auth::body_sha256;
use silo_protocol::index::{self, IndexRequest};
use silo_protocol::layers::{self, ApplyResponse};

use super::{AgentClient, ClientError, rejection};

impl AgentClient {
    /// Every path of the machine's file system but `request.exclude`, in
    /// the store's index encoding before compression (each path followed
    /// by a NUL). A body cut inside a path is an error, never a shorter
    /// list.
    pub async fn index(&self, request: &IndexRequest) -> Result<Bytes, ClientError> {
        let json = serde_json::to_vec(request)
            .map_err(|e| ClientError::Protocol(format!("encoding an index request: {e}")))?;
        let answer = self
            .request(http::Method::POST, index::path(), Bytes::from(json))
            .await?;
        if !answer.status.is_success() {
            return Err(rejection(answer.status.as_u16(), Some(&answer.body)));
        }
        if index::split_paths(&answer.body).is_none() {
            return Err(ClientError::Protocol(
                "the agent's path index ends inside a path".into(),
            ));
        }
        Ok(answer.body)
    }

    /// Applies one uncompressed image layer onto the machine's root. A
    /// refusal changed nothing; an `incomplete` one left part of the layer
    /// applied (the machine should be made afresh).
    pub async fn apply_layer(&self, layer: Bytes) -> Result<ApplyResponse, ClientError> {
        let digest = body_sha256(&layer);
        let answer = self
            .request_streamed(http::Method::POST, layers::path(), layer, &digest, None)
            .await?;
        if !answer.status.is_success() {
            return Err(rejection(answer.status.as_u16(), Some(&answer.body)));
        }
        serde_json::from_slice(&answer.body)
            .map_err(|e| ClientError::Protocol(format!("the agent's apply answer: {e}")))
    }
}
