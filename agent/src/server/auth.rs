//! Admission of a request: protocol version first, then its signature.
//!
//! The version is checked before anything else so a stale agent in an old
//! image, or a stale controller, fails with a message naming both versions
//! rather than a confusing signature error. Rejections name what was wrong
//! and never echo key material (the protocol's error texts guarantee that).

use http::{Request, Response};
use silo_protocol::ErrorKind;
use silo_protocol::auth::{AuthError, SignedHeaders, Verifier};
use silo_protocol::http::HEADER_PROTOCOL;
use silo_protocol::version::{VersionError, check_peer};

use super::{Body, error_response};

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The client speaks another protocol version (or none).
    #[error(transparent)]
    Version(#[from] VersionError),
    /// The signature is missing, stale, replayed or wrong.
    #[error(transparent)]
    Auth(#[from] AuthError),
}

impl AdmitError {
    /// The JSON error response for this rejection.
    pub fn response(&self) -> Response<Body> {
        let kind = match self {
            Self::Version(_) => ErrorKind::VersionMismatch,
            Self::Auth(_) => ErrorKind::Unauthorized,
        };
        error_response(kind, self.to_string())
    }
}

/// Checks the version header, then the signature.
pub fn admit<B>(req: &Request<B>, verifier: &Verifier) -> Result<SignedHeaders, AdmitError> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    check_peer(header(HEADER_PROTOCOL))?;
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path(), |pq| pq.as_str());
    Ok(verifier.verify(req.method().as_str(), path_and_query, header)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use silo_protocol::PROTOCOL_VERSION;
    use silo_protocol::auth::{EMPTY_BODY_SHA256, Key, sign};

    fn request(key: Option<&Key>, version: Option<&str>) -> Request<()> {
        let mut builder = Request::get("/v1/exec?x=1");
        if let Some(version) = version {
            builder = builder.header(HEADER_PROTOCOL, version);
        }
        if let Some(key) = key {
            for (name, value) in sign(key, "GET", "/v1/exec?x=1", EMPTY_BODY_SHA256)
                .unwrap()
                .pairs()
            {
                builder = builder.header(name, value);
            }
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn version_is_checked_before_the_signature() {
        let key = Key::generate().unwrap();
        let verifier = Verifier::new(key.clone());
        let ours = PROTOCOL_VERSION.to_string();
        assert!(admit(&request(Some(&key), Some(&ours)), &verifier).is_ok());
        let status = |req| admit(&req, &verifier).unwrap_err().response().status();
        assert_eq!(
            status(request(Some(&key), Some("999"))),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(status(request(None, Some(&ours))), StatusCode::UNAUTHORIZED);
        let other = Key::generate().unwrap();
        assert_eq!(
            status(request(Some(&other), Some(&ours))),
            StatusCode::UNAUTHORIZED
        );
    }
}
