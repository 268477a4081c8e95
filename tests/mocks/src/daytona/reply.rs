//! The answers Daytona's Go services (the proxy, the runner behind it, and
//! the toolbox daemon) share the shape of: `ErrorResponse` for a typed
//! error, its zero-valued fallback for an untyped one, and gin's bare
//! abort. The control plane's error body is another shape (see `api`).
//!
//! A typed error (`not found: …`, `bad request: …`) comes with its code
//! and the path as the answering service saw it. An untyped one gets
//! status 500, the zero time and an empty path. A handler that aborts
//! with a status writes the header before the error middleware runs, so
//! that answer has the status and no body at all.

use std::time::SystemTime;

use http::{Method, Response, StatusCode};

use super::model::{GO_ZERO_TIME, ServiceError, go_time};
use crate::http::{Body, json_as, status};

/// The error kinds of `common-go/pkg/errors`, each with its status, code
/// and the prefix its message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoError {
    /// `404 NOT_FOUND`, `not found: …`.
    NotFound,
    /// `401 UNAUTHORIZED`, `unauthorized: …`.
    Unauthorized,
    /// `400 INVALID_REQUEST_BODY`, `invalid body request: …`.
    InvalidBody,
    /// `409 CONFLICT`, `conflict: …`.
    Conflict,
    /// `400 BAD_REQUEST`, `bad request: …`.
    BadRequest,
    /// `408 REQUEST_TIMEOUT`, `request timeout: …`.
    RequestTimeout,
}

impl GoError {
    fn parts(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            GoError::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND", "not found"),
            GoError::Unauthorized => (StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "unauthorized"),
            GoError::InvalidBody => (
                StatusCode::BAD_REQUEST,
                "INVALID_REQUEST_BODY",
                "invalid body request",
            ),
            GoError::Conflict => (StatusCode::CONFLICT, "CONFLICT", "conflict"),
            GoError::BadRequest => (StatusCode::BAD_REQUEST, "BAD_REQUEST", "bad request"),
            GoError::RequestTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "REQUEST_TIMEOUT",
                "request timeout",
            ),
        }
    }

    /// The message this kind gives `reason`.
    pub fn message(self, reason: &str) -> String {
        format!("{}: {reason}", self.parts().2)
    }
}

/// A typed error's answer; `path` and `method` are the request's as the
/// answering service saw it.
pub fn go_error(kind: GoError, reason: &str, path: &str, method: &Method) -> Response<Body> {
    let (code, name, _) = kind.parts();
    let body = ServiceError {
        status_code: code.as_u16(),
        message: kind.message(reason),
        code: Some(name),
        timestamp: go_time(SystemTime::now()),
        path: path.to_owned(),
        method: Some(method.to_string()),
    };
    json_as(code, "application/json", &body)
}

/// An untyped error's answer: 500, the zero time, an empty path.
pub fn go_fallback(message: &str) -> Response<Body> {
    let body = ServiceError {
        status_code: 500,
        message: message.to_owned(),
        code: None,
        timestamp: GO_ZERO_TIME.to_owned(),
        path: String::new(),
        method: None,
    };
    json_as(StatusCode::INTERNAL_SERVER_ERROR, "application/json", &body)
}

/// The mock's own answer for a route of the real service it does not
/// model: `501` in the `ErrorResponse` shape, so a client notices.
pub fn unmodelled(path: &str, method: &Method) -> Response<Body> {
    let body = ServiceError {
        status_code: 501,
        message: format!("the mock does not model {method} {path}"),
        code: Some("NOT_IMPLEMENTED"),
        timestamp: go_time(SystemTime::now()),
        path: path.to_owned(),
        method: Some(method.to_string()),
    };
    json_as(StatusCode::NOT_IMPLEMENTED, "application/json", &body)
}

/// gin's `AbortWithError(status, …)`: the status and an empty body.
pub fn aborted(code: StatusCode) -> Response<Body> {
    status(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_prefix_their_messages() {
        assert_eq!(
            GoError::NotFound.message("session not found"),
            "not found: session not found"
        );
        assert_eq!(
            GoError::InvalidBody.message("EOF"),
            "invalid body request: EOF"
        );
        assert_eq!(
            GoError::RequestTimeout.parts().0,
            StatusCode::REQUEST_TIMEOUT
        );
    }
}
