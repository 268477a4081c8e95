//! The Connect protocol with the JSON codec, as envd speaks it: unary
//! calls (`application/json` in and out, errors as a non-200 status with
//! `{"code","message"}`) and server streams (`application/connect+json`,
//! one request envelope, response envelopes of 1 flag byte and a 4-byte
//! big-endian length, always HTTP 200, ending with an end-stream envelope
//! (flag `0x02`) that carries `{}` or `{"error":{…}}`).
//!
//! The binary (`+proto`) codec and compression are not modelled; such
//! requests get `415`.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::http::{Body, BoxError, header, json, read_body, status};

/// Flag of a compressed envelope.
const FLAG_COMPRESSED: u8 = 0x01;
/// Flag of the end-stream envelope.
const FLAG_END_STREAM: u8 = 0x02;
/// Largest request message the mock reads.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Content type of streaming calls with the JSON codec.
pub const STREAM_JSON: &str = "application/connect+json";

/// A Connect error code (the ones envd's process and filesystem services use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `invalid_argument`.
    InvalidArgument,
    /// `deadline_exceeded`.
    DeadlineExceeded,
    /// `not_found`.
    NotFound,
    /// `unimplemented`.
    Unimplemented,
    /// `internal`.
    Internal,
    /// `unauthenticated`.
    Unauthenticated,
    /// `already_exists`.
    AlreadyExists,
}

impl Code {
    /// The code's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unauthenticated => "unauthenticated",
            Code::AlreadyExists => "already_exists",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::AlreadyExists => StatusCode::CONFLICT,
        }
    }
}

/// A Connect error: its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// The code.
    pub code: Code,
    /// What went wrong.
    pub message: String,
}

impl RpcError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The error as Connect writes it.
    fn wire(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.name(), "message": self.message })
    }
}

/// A unary call's message, or the response refusing it.
pub async fn unary_request<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let json_type = header(&request, CONTENT_TYPE.as_str()).is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|m| m.trim() == "application/json")
    });
    if !json_type {
        return Err(status(StatusCode::UNSUPPORTED_MEDIA_TYPE));
    }
    let body = read_body(request.into_body(), MAX_MESSAGE_BYTES)
        .await
        .map_err(|e| unary_error(RpcError::new(Code::InvalidArgument, e.to_string())))?;
    let body = if body.is_empty() {
        Bytes::from_static(b"{}")
    } else {
        body
    };
    serde_json::from_slice(&body).map_err(|e| {
        unary_error(RpcError::new(
            Code::InvalidArgument,
            format!("unmarshal into message: {e}"),
        ))
    })
}

/// A unary call's successful answer.
pub fn unary_ok<T: Serialize>(message: &T) -> Response<Body> {
    json(StatusCode::OK, message)
}

/// A unary call's error.
pub fn unary_error(error: RpcError) -> Response<Body> {
    json(error.code.http_status(), &error.wire())
}

/// A streaming call's one request message, or the response refusing it.
pub async fn stream_request<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<Result<T, RpcError>, Response<Body>> {
    if header(&request, CONTENT_TYPE.as_str()) != Some(STREAM_JSON) {
        return Err(status(StatusCode::UNSUPPORTED_MEDIA_TYPE));
    }
    let body = match read_body(request.into_body(), MAX_MESSAGE_BYTES + 5).await {
        Ok(body) => body,
        Err(e) => return Ok(Err(RpcError::new(Code::InvalidArgument, e.to_string()))),
    };
    let message = match body.as_ref() {
        [flags, ..] if flags & FLAG_COMPRESSED != 0 => {
            return Ok(Err(RpcError::new(
                Code::Unimplemented,
                "the mock does not model compressed messages",
            )));
        }
        [_, a, b, c, d, payload @ ..]
            if u32::from_be_bytes([*a, *b, *c, *d]) as usize == payload.len() =>
        {
            payload
        }
        _ => {
            return Ok(Err(RpcError::new(
                Code::InvalidArgument,
                "protocol error: the request is not exactly one envelope",
            )));
        }
    };
    Ok(serde_json::from_slice(message).map_err(|e| {
        RpcError::new(
            Code::InvalidArgument,
            format!("unmarshal into message: {e}"),
        )
    }))
}

/// One envelope holding `message`.
pub fn envelope<T: Serialize>(message: &T) -> Bytes {
    frame(
        0,
        &serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// The end-stream envelope: `{}` or `{"error":{…}}`.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let payload = match error {
        None => b"{}".to_vec(),
        Some(error) => serde_json::to_vec(&serde_json::json!({ "error": error.wire() }))
            .unwrap_or_else(|_| b"{}".to_vec()),
    };
    frame(FLAG_END_STREAM, &payload)
}

fn frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    out.put_slice(payload);
    out.freeze()
}

/// A streaming answer whose envelopes come from `envelopes`; the body
/// ends when the sender is dropped.
pub fn stream_response(envelopes: mpsc::Receiver<Bytes>) -> Response<Body> {
    let frames = futures_util::stream::unfold(envelopes, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, BoxError>(Frame::data(bytes)), rx))
    });
    let body = StreamBody::new(frames).boxed_unsync();
    crate::http::with_body(StatusCode::OK, STREAM_JSON, body)
}

/// A streaming call that fails before its first message.
pub fn stream_error(error: &RpcError) -> Response<Body> {
    crate::http::with_body(
        StatusCode::OK,
        STREAM_JSON,
        crate::http::full(end_stream(Some(error))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_flag_length_payload() {
        let bytes = envelope(&serde_json::json!({"a": 1}));
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(&bytes[5..], br#"{"a":1}"#);
        let end = end_stream(None);
        assert_eq!(end.as_ref(), &[2, 0, 0, 0, 2, b'{', b'}']);
    }
}
