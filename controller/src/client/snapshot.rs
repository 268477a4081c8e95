//! `POST /v1/snapshot`: the sandbox's changes since its image, as one image
//! layer streamed from the agent.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use silo_protocol::PROTOCOL_VERSION;
use silo_protocol::auth::{body_sha256, sign};
use silo_protocol::http::HEADER_PROTOCOL;
use silo_protocol::snapshot::{self, LAYER_CONTENT_TYPE, SnapshotRequest};

use super::{AgentClient, ClientError, rejection, transport};

impl AgentClient {
    /// Asks the agent for a snapshot and answers the layer (`application/x-tar`)
    /// as it streams in. The layer is whole only if the body ends without an
    /// error and with the tar end marker; anything else was cut short and
    /// must be discarded. A refusal is the agent's error: HTTP 409 busy, 501
    /// unsupported (an agent that is not PID 1), 400/413 bad request.
    pub async fn snapshot(&self, request: &SnapshotRequest) -> Result<Incoming, ClientError> {
        let json = serde_json::to_vec(request)
            .map_err(|e| ClientError::Protocol(format!("encoding a snapshot request: {e}")))?;
        let body = Bytes::from(json);
        let path = snapshot::path();
        let signed = sign(&self.key, "POST", path, &body_sha256(&body))?;

        let stream = transport::open(&self.endpoint).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ClientError::Http)?;
        // Drives the socket until the layer has been read (or dropped).
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut builder = http::Request::builder()
            .method(http::Method::POST)
            .uri(path)
            .header(http::header::HOST, "agent")
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, LAYER_CONTENT_TYPE)
            .header(HEADER_PROTOCOL, PROTOCOL_VERSION.to_string());
        for (name, value) in signed.pairs() {
            builder = builder.header(name, value);
        }
        let request = builder
            .body(Full::new(body))
            .map_err(|e| ClientError::Protocol(format!("building request: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(ClientError::Http)?;
        let status = response.status();
        if status == http::StatusCode::OK {
            return Ok(response.into_body());
        }
        let refusal = response
            .into_body()
            .collect()
            .await
            .map_err(ClientError::Http)?
            .to_bytes();
        Err(rejection(status.as_u16(), Some(&refusal)))
    }
}
