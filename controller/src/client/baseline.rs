//! Sending a snapshot's or rewind's baseline (protocol 5): by its digest to
//! an agent that may keep it, and by its paths once if that agent answers
//! `unknown_baseline` (it restarted, or its last snapshot or rewind left
//! another tree). An older agent always gets the paths. The agent walks
//! against a kept tree only if its digest is the one named, so the answer
//! is the one the paths would have given.

use std::future::Future;

use serde::Serialize;
use silo_protocol::Feature;
use silo_protocol::snapshot::SnapshotRequest;

use super::{AgentClient, ClientError, LayerAnswer, RewindBegun};

/// A baseline the controller can name by digest or list in full.
pub trait BaselinePaths: Sync {
    /// [`silo_protocol::snapshot::tree_digest`] of the paths.
    fn digest(&self) -> &str;
    /// The paths, sorted, for an agent that does not keep them.
    fn paths(&self) -> Vec<Vec<u8>>;
}

/// How a request's baseline reached the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineSent {
    /// Its paths (an agent older than protocol 5).
    Paths,
    /// Its digest, which named the tree the agent kept.
    Digest,
    /// Its digest, which the agent did not keep, then its paths.
    DigestThenPaths,
}

impl AgentClient {
    /// [`AgentClient::snapshot`] with `baseline` sent as this module says.
    pub async fn snapshot_against(
        &self,
        request: SnapshotRequest,
        baseline: &dyn BaselinePaths,
    ) -> Result<(LayerAnswer, BaselineSent), ClientError> {
        self.send_against(request, baseline, |request| async move {
            self.snapshot(&request).await
        })
        .await
    }

    /// [`AgentClient::begin_rewind`] with `baseline` sent as this module says.
    pub async fn begin_rewind_against(
        &self,
        request: SnapshotRequest,
        baseline: &dyn BaselinePaths,
    ) -> Result<(RewindBegun, BaselineSent), ClientError> {
        self.send_against(request, baseline, |request| async move {
            self.begin_rewind(&request).await
        })
        .await
    }

    async fn send_against<T, F, Fut>(
        &self,
        mut request: SnapshotRequest,
        baseline: &dyn BaselinePaths,
        send: F,
    ) -> Result<(T, BaselineSent), ClientError>
    where
        F: Fn(SnapshotRequest) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let spoken = self.protocol().await?;
        let by_digest = spoken.require(Feature::BaselineDigest).is_ok();
        if spoken.require(Feature::WalkHint).is_err() {
            // A hint only spares work: an agent without it walks everything.
            request.walk_hint = None;
        }
        if by_digest {
            request.set_baseline(Vec::new());
            request.baseline_digest = Some(baseline.digest().to_owned());
            match send(request.clone()).await {
                Ok(answer) => return Ok((answer, BaselineSent::Digest)),
                Err(ClientError::UnknownBaseline(why)) => {
                    tracing::debug!("the agent keeps another tree ({why}); sending the paths");
                }
                Err(other) => return Err(other),
            }
        }
        request.baseline_digest = None;
        request.set_baseline(baseline.paths());
        let answer = send(request).await?;
        let sent = match by_digest {
            true => BaselineSent::DigestThenPaths,
            false => BaselineSent::Paths,
        };
        Ok((answer, sent))
    }
}
