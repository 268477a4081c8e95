//! `POST /v1/snapshot`: the sandbox's changes since its image, as one image
//! layer streamed from the agent.

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use silo_protocol::Feature;
use silo_protocol::auth::body_sha256;
use silo_protocol::snapshot::{
    self, HEADER_STOPPED, HEADER_STOPPED_AT, HEADER_UNSETTLED, SnapshotRequest,
};

use super::{AgentClient, ClientError, rejection, transport};

/// A started snapshot: the layer as it streams in, and what the agent
/// stopped to take it.
pub struct LayerAnswer {
    /// The layer (crate-private: its type is the HTTP library's, which is
    /// not silo's to promise).
    pub(crate) body: Incoming,
    /// Processes the agent stopped while it read.
    pub stopped: u64,
    /// Processes that had not stopped when the layer started: their writes
    /// under way may be in it half done.
    pub unsettled: u64,
    /// When they had all stopped, in Unix ns on the machine's clock: the
    /// moment a later snapshot of the same machine counts changes from.
    /// `None` from an agent that does not say, which also does not know
    /// [`SnapshotRequest::descend_since_ns`].
    pub stopped_at_ns: Option<i64>,
}

impl AgentClient {
    /// Asks the agent for a snapshot and answers the layer (`application/x-tar`)
    /// as it streams in. The layer is whole only if the body ends without an
    /// error and with the tar end marker; anything else was cut short and
    /// must be discarded. A refusal is the agent's error: HTTP 409 busy, 501
    /// unsupported (an agent that is not PID 1), 400/413 bad request.
    pub async fn snapshot(&self, request: &SnapshotRequest) -> Result<LayerAnswer, ClientError> {
        self.require_request_features(request).await?;
        let response = self
            .post_json_for_stream(Feature::Snapshot, snapshot::path(), request)
            .await?;
        let status = response.status();
        if status == http::StatusCode::OK {
            // Counts an older agent does not send read as zero.
            let count = |name| header(&response, name).unwrap_or(0);
            let (stopped, unsettled) = (count(HEADER_STOPPED), count(HEADER_UNSETTLED));
            let stopped_at_ns = header(&response, HEADER_STOPPED_AT);
            return Ok(LayerAnswer {
                body: response.into_body(),
                stopped,
                unsettled,
                stopped_at_ns,
            });
        }
        let refusal = transport::whole(response.into_body()).await?;
        Err(rejection(status.as_u16(), Some(&refusal)))
    }

    /// Refuses, before anything is sent (so before the agent stops a single
    /// process), a snapshot or rewind request that uses a field the spoken
    /// version lacks: `descend_since_ns` is protocol 4's
    /// [`Feature::IncrementalSnapshot`].
    pub(super) async fn require_request_features(
        &self,
        request: &SnapshotRequest,
    ) -> Result<(), ClientError> {
        if request.descend_since_ns.is_some() {
            self.speak(Feature::IncrementalSnapshot).await?;
        }
        if request.block_sums {
            self.speak(Feature::BlockRewind).await?;
        }
        Ok(())
    }

    /// Sends `request` as the signed JSON body of a `POST` to `path`, once
    /// the spoken version has `feature`; the answer as it streams in.
    pub(super) async fn post_json_for_stream(
        &self,
        feature: Feature,
        path: &str,
        request: &impl serde::Serialize,
    ) -> Result<http::Response<Incoming>, ClientError> {
        let spoken = self.speak(feature).await?;
        let json = serde_json::to_vec(request)
            .map_err(|e| ClientError::Protocol(format!("encoding a {feature} request: {e}")))?;
        let body = Bytes::from(json);
        let digest = body_sha256(&body);
        transport::send_for_stream(
            &self.endpoint,
            Some((&self.key, &digest)),
            spoken.version,
            http::Method::POST,
            path,
            Full::new(body),
        )
        .await
    }
}

/// An answer header's value, if it is there and reads as a `T`.
pub(super) fn header<T: std::str::FromStr>(
    response: &http::Response<Incoming>,
    name: &str,
) -> Option<T> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}
