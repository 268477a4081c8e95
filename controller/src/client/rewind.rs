//! The two requests of an in-place rewind (protocol 3): `POST /v1/rewind`
//! (the agent ends the sandbox's processes and lists what changed, then
//! holds the sandbox) and the layer apply that names its token and
//! finishes it.

use bytes::Bytes;
use silo_protocol::Feature;
use silo_protocol::auth::body_sha256;
use silo_protocol::layers::ApplyResponse;
use std::collections::HashMap;

use silo_protocol::blocks::BlockSums;
use silo_protocol::rewind::{self, Change, HEADER_REWIND, split_changes, split_with_sums};
use silo_protocol::snapshot::{HEADER_STOPPED, HEADER_UNSETTLED, SnapshotRequest};

use super::snapshot::header;
use super::{AgentClient, ClientError, rejection, transport};

/// A rewind the agent has begun: its sandbox is held until the layer.
#[derive(Debug, Clone)]
pub struct RewindBegun {
    /// The token the finishing apply names.
    pub token: String,
    /// The change list, checked to be one ([`RewindBegun::changes`]).
    pub body: Bytes,
    /// Processes the agent ended beyond the workload, execs and sessions.
    pub ended: u64,
    /// Of those, the ones still there when it gave up waiting.
    pub unsettled: u64,
}

impl RewindBegun {
    /// The change list's records.
    pub fn changes(&self) -> Vec<(Change, &[u8])> {
        split_changes(&self.body).unwrap_or_default()
    }

    /// The block sums the change list gives its big files, by path (asked
    /// for with the request's `block_sums`).
    pub fn sums(&self) -> HashMap<&[u8], BlockSums> {
        split_with_sums(&self.body)
            .map(|(_, sums)| sums.into_iter().collect())
            .unwrap_or_default()
    }
}

impl AgentClient {
    /// Begins an in-place rewind: the agent ends every process of the
    /// sandbox but itself, answers what changed since `request`'s moment,
    /// and holds the sandbox for [`AgentClient::finish_rewind`].
    pub async fn begin_rewind(
        &self,
        request: &SnapshotRequest,
    ) -> Result<RewindBegun, ClientError> {
        self.require_request_features(request).await?;
        let response = self
            .post_json_for_stream(Feature::Rewind, rewind::path(), request)
            .await?;
        let status = response.status();
        let (token, ended, unsettled): (Option<String>, _, _) = (
            header(&response, HEADER_REWIND),
            header(&response, HEADER_STOPPED).unwrap_or(0),
            header(&response, HEADER_UNSETTLED).unwrap_or(0),
        );
        let body = transport::whole(response.into_body()).await?;
        if !status.is_success() {
            return Err(rejection(status.as_u16(), Some(&body)));
        }
        let token = token.ok_or_else(|| {
            ClientError::Protocol("the agent began a rewind without a token".into())
        })?;
        if split_with_sums(&body).is_none() {
            return Err(ClientError::Protocol(
                "the agent's change list is not one (cut short, an unknown kind, or bad block sums)".into(),
            ));
        }
        Ok(RewindBegun {
            token,
            body,
            ended,
            unsettled,
        })
    }

    /// Applies the restoring layer under rewind `token`'s hold, which then
    /// ends: the agent starts the workload again, whether the layer was
    /// placed or refused (a refusal changed nothing; an `incomplete` one
    /// left part of the layer, which the machine should be made again for).
    pub async fn finish_rewind(
        &self,
        token: &str,
        layer: Bytes,
    ) -> Result<ApplyResponse, ClientError> {
        self.finish_rewind_with(token, layer, false).await
    }

    /// [`AgentClient::finish_rewind`], the agent keeping its hold for the
    /// clock margin once the layer is in place when `settle` (a pool member
    /// made ahead; see [`silo_protocol::rewind::QUERY_SETTLE`]).
    pub async fn finish_rewind_with(
        &self,
        token: &str,
        layer: Bytes,
        settle: bool,
    ) -> Result<ApplyResponse, ClientError> {
        self.speak(Feature::Rewind).await?;
        let digest = body_sha256(&layer);
        let answer = self
            .request_streamed(
                http::Method::POST,
                &rewind::apply_path(token, settle),
                layer,
                &digest,
                None,
            )
            .await?;
        if !answer.status.is_success() {
            return Err(rejection(answer.status.as_u16(), Some(&answer.body)));
        }
        serde_json::from_slice(&answer.body)
            .map_err(|e| ClientError::Protocol(format!("the agent's apply answer: {e}")))
    }
}
