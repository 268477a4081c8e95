//! Admission of a request: protocol version first, then its signature.
//!
//! The version is checked before anything else so a stale agent in an old
//! image, or a stale controller, fails with a message naming both sides'
//! versions rather than a confusing signature error. Any version in the
//! agent's range is admitted (see `silo_protocol::version`): changes are
//! additive, so the agent serves an older client as it is. Rejections name
//! what was wrong and never echo key material (the protocol's error texts
//! guarantee that).

use http::{Request, Response};
use silo_protocol::auth::{AuthError, SignedHeaders, Verifier};
use silo_protocol::http::HEADER_PROTOCOL;
use silo_protocol::version::VersionError;
use silo_protocol::{ErrorKind, Versions};

use super::{Body, error_response};

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The client speaks a protocol version outside the agent's range (or none).
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
            Self::Auth(AuthError::Expired { .. }) => ErrorKind::ClockSkew,
            Self::Auth(_) => ErrorKind::Unauthorized,
        };
        error_response(kind, self.to_string())
    }
}

/// Checks the announced version against `versions`, then the signature.
pub fn admit<B>(
    req: &Request<B>,
    verifier: &Verifier,
    versions: Versions,
) -> Result<SignedHeaders, AdmitError> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    versions.admit(header(HEADER_PROTOCOL))?;
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
    use silo_protocol::auth::{EMPTY_BODY_SHA256, Key, sign};
    use silo_protocol::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

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
        let ours = Versions::OURS;
        for version in MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION {
            let req = request(Some(&key), Some(&version.to_string()));
            assert!(admit(&req, &verifier, ours).is_ok(), "version {version}");
        }
        let status = |req, versions| {
            admit(&req, &verifier, versions)
                .unwrap_err()
                .response()
                .status()
        };
        let current = PROTOCOL_VERSION.to_string();
        assert_eq!(
            status(request(Some(&key), Some("999")), ours),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(request(None, Some(&current)), ours),
            StatusCode::UNAUTHORIZED
        );
        let other = Key::generate().unwrap();
        assert_eq!(
            status(request(Some(&other), Some(&current)), ours),
            StatusCode::UNAUTHORIZED
        );
        // An agent capped at version 1 refuses what it would not know.
        let capped = Versions::capped(1).unwrap();
        assert_eq!(
            status(request(Some(&key), Some("2")), capped),
            StatusCode::BAD_REQUEST
        );
    }
}
