//! Request signing and verification.
//!
//! Every request but `/healthz` carries an HMAC-SHA256 signature made with the
//! key of one sandbox. The signed text ([`canonical_request`]) binds the method,
//! path and query, a timestamp, a nonce and the body's SHA-256, so a captured
//! request cannot be altered, replayed (the [`Verifier`] remembers nonces for the
//! whole skew window) or sent to another sandbox (each key is derived from the
//! controller's master key and the sandbox id by [`derive_sandbox_key`]).
//!
//! Failures name what was wrong (missing header, stale clock, replay, bad
//! signature) and never echo key material.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::http::{HEADER_CONTENT_SHA256, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use crate::limits::SIGNATURE_SKEW;
use crate::replay::{Admission, ReplayGuard};

type HmacSha256 = Hmac<Sha256>;

/// Length in bytes of every silo key (master and per-sandbox).
pub const KEY_LEN: usize = 32;
/// Hex SHA-256 of the empty body, which bodyless requests must claim.
pub const EMPTY_BODY_SHA256: &str =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// A 32-byte key. `Debug` never prints the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_LEN]);

impl Key {
    /// Wraps raw key bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// Draws a fresh random key from the operating system.
    pub fn generate() -> Result<Self, AuthError> {
        let mut bytes = [0u8; KEY_LEN];
        getrandom::fill(&mut bytes).map_err(|_| AuthError::NoRandomness)?;
        Ok(Self(bytes))
    }

    /// Parses the hex form written by [`Key::to_hex`] (surrounding whitespace allowed).
    pub fn from_hex(text: &str) -> Result<Self, AuthError> {
        let raw = hex::decode(text.trim()).map_err(|_| AuthError::MalformedKey)?;
        let bytes: [u8; KEY_LEN] = raw.try_into().map_err(|_| AuthError::MalformedKey)?;
        Ok(Self(bytes))
    }

    /// Lowercase hex, the form keys take in files and environment variables.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length; ours is fixed, so this cannot fail.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts a 32-byte key"),
        }
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// Derives the key of one sandbox from the controller's master key.
///
/// The agent only ever sees its own derived key, so a sandbox that leaks it
/// exposes nothing about its neighbours.
pub fn derive_sandbox_key(master: &Key, sandbox_id: &str) -> Key {
    let mut mac = master.mac();
    mac.update(b"silo-sandbox-key\n");
    mac.update(sandbox_id.as_bytes());
    Key(mac.finalize().into_bytes().into())
}

/// Lowercase hex SHA-256 of `body`.
pub fn body_sha256(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// Whether `text` has the form [`body_sha256`] gives: 64 lowercase hex digits.
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The exact text that is signed. Fields are newline-separated; none of them can
/// contain a newline (header values and request targets cannot).
pub fn canonical_request(
    method: &str,
    path_and_query: &str,
    timestamp: u64,
    nonce: &str,
    content_sha256: &str,
) -> String {
    format!("silo-request-v1\n{method}\n{path_and_query}\n{timestamp}\n{nonce}\n{content_sha256}")
}

/// The headers a signed request carries, as (name, value) pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedHeaders {
    /// Unix seconds at signing time.
    pub timestamp: u64,
    /// Random per-request hex string.
    pub nonce: String,
    /// Hex SHA-256 of the body.
    pub content_sha256: String,
    /// Hex HMAC-SHA256 of the canonical request.
    pub signature: String,
}

impl SignedHeaders {
    /// The four headers as (name, value) pairs, ready to add to a request.
    pub fn pairs(&self) -> [(&'static str, String); 4] {
        [
            (HEADER_TIMESTAMP, self.timestamp.to_string()),
            (HEADER_NONCE, self.nonce.clone()),
            (HEADER_CONTENT_SHA256, self.content_sha256.clone()),
            (HEADER_SIGNATURE, self.signature.clone()),
        ]
    }
}

/// Signs a request now, with a fresh nonce.
///
/// `content_sha256` is the hex SHA-256 of the body ([`EMPTY_BODY_SHA256`] for none);
/// for a streamed body the caller hashes it first and the receiver checks it at the end.
pub fn sign(
    key: &Key,
    method: &str,
    path_and_query: &str,
    content_sha256: &str,
) -> Result<SignedHeaders, AuthError> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|_| AuthError::NoRandomness)?;
    Ok(sign_at(
        key,
        method,
        path_and_query,
        content_sha256,
        unix_now(),
        &hex::encode(nonce),
    ))
}

/// Signs with an explicit clock and nonce (tests, and forging old requests in tests).
pub fn sign_at(
    key: &Key,
    method: &str,
    path_and_query: &str,
    content_sha256: &str,
    timestamp: u64,
    nonce: &str,
) -> SignedHeaders {
    let mut mac = key.mac();
    mac.update(
        canonical_request(method, path_and_query, timestamp, nonce, content_sha256).as_bytes(),
    );
    SignedHeaders {
        timestamp,
        nonce: nonce.to_owned(),
        content_sha256: content_sha256.to_owned(),
        signature: hex::encode(mac.finalize().into_bytes()),
    }
}

/// Checks signatures for one sandbox key and refuses replays.
#[derive(Debug)]
pub struct Verifier {
    /// Replaced whole by [`Verifier::rekey`] (a restored copy of a sandbox
    /// takes its own key).
    key: Mutex<Key>,
    skew: Duration,
    /// The nonces seen within the window.
    seen: Mutex<ReplayGuard>,
}

impl Verifier {
    /// A verifier with the default skew window.
    pub fn new(key: Key) -> Self {
        Self::with_skew(key, SIGNATURE_SKEW)
    }

    /// A verifier accepting timestamps within `skew` of its own clock.
    pub fn with_skew(key: Key, skew: Duration) -> Self {
        Self {
            key: Mutex::new(key),
            skew,
            seen: Mutex::new(ReplayGuard::new()),
        }
    }

    /// From now on, accepts only signatures made with `key`.
    pub fn rekey(&self, key: Key) {
        *self.key.lock().unwrap_or_else(PoisonError::into_inner) = key;
    }

    /// Verifies a request at the current time. `header` looks up a header by name.
    pub fn verify<'a>(
        &self,
        method: &str,
        path_and_query: &str,
        header: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<SignedHeaders, AuthError> {
        self.verify_at(unix_now(), method, path_and_query, header)
    }

    /// Verifies a request as if the clock read `now` (unix seconds).
    ///
    /// On success returns the signed headers; the caller must still check that the
    /// body matches `content_sha256`.
    pub fn verify_at<'a>(
        &self,
        now: u64,
        method: &str,
        path_and_query: &str,
        header: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<SignedHeaders, AuthError> {
        let get = |name: &'static str| header(name).ok_or(AuthError::MissingHeader(name));
        let timestamp: u64 = get(HEADER_TIMESTAMP)?
            .trim()
            .parse()
            .map_err(|_| AuthError::MalformedHeader(HEADER_TIMESTAMP))?;
        let nonce = get(HEADER_NONCE)?.trim();
        if nonce.len() < 16 || nonce.len() > 128 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(AuthError::MalformedHeader(HEADER_NONCE));
        }
        let content_sha256 = get(HEADER_CONTENT_SHA256)?.trim();
        let signature = hex::decode(get(HEADER_SIGNATURE)?.trim())
            .map_err(|_| AuthError::MalformedHeader(HEADER_SIGNATURE))?;

        let skew = self.skew.as_secs();
        if timestamp.abs_diff(now) > skew {
            return Err(AuthError::Expired {
                skew_secs: skew,
                request_secs: timestamp,
                agent_secs: now,
            });
        }

        let mut mac = self
            .key
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .mac();
        mac.update(
            canonical_request(method, path_and_query, timestamp, nonce, content_sha256).as_bytes(),
        );
        // verify_slice compares in constant time.
        mac.verify_slice(&signature)
            .map_err(|_| AuthError::BadSignature)?;

        self.remember_nonce(now, nonce, timestamp.saturating_add(skew))?;
        Ok(SignedHeaders {
            timestamp,
            nonce: nonce.to_owned(),
            content_sha256: content_sha256.to_owned(),
            signature: hex::encode(signature),
        })
    }

    /// Records a nonce, refusing one already seen. Only called for valid signatures,
    /// so an attacker without the key cannot fill the guard.
    fn remember_nonce(&self, now: u64, nonce: &str, forget_after: u64) -> Result<(), AuthError> {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match seen.admit(now, nonce, forget_after) {
            Admission::Fresh => Ok(()),
            Admission::Replayed => Err(AuthError::Replayed),
            Admission::TooOld => Err(AuthError::TooOldToCheck),
        }
    }
}

/// Why a request was not accepted as signed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// A required signing header is absent.
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// A signing header is present but unreadable.
    #[error("malformed header {0}")]
    MalformedHeader(&'static str),
    /// The timestamp is outside the accepted window: the signer's clock and
    /// the agent's disagree (or the request is old).
    #[error(
        "request timestamp {request_secs} is {}s {} the agent's clock ({agent_secs}); at most \
         {skew_secs}s apart is accepted",
        request_secs.abs_diff(*agent_secs),
        if request_secs > agent_secs { "ahead of" } else { "behind" }
    )]
    Expired {
        /// The accepted window in seconds.
        skew_secs: u64,
        /// The request's timestamp (unix seconds).
        request_secs: u64,
        /// The agent's clock (unix seconds).
        agent_secs: u64,
    },
    /// The signature does not match this sandbox's key.
    #[error("signature does not match this sandbox's key")]
    BadSignature,
    /// The nonce was already used.
    #[error("nonce already used (replayed request)")]
    Replayed,
    /// Signed so long ago that, under the current request rate, the agent
    /// can no longer tell whether it was already used.
    #[error(
        "request was signed too long ago to rule out a replay at this request rate; sign it again"
    )]
    TooOldToCheck,
    /// A key file or variable is not 64 hex digits.
    #[error("key is not {} hex digits", KEY_LEN * 2)]
    MalformedKey,
    /// The operating system gave no random bytes.
    #[error("the operating system's random source failed")]
    NoRandomness,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn verify(
        v: &Verifier,
        now: u64,
        method: &str,
        pq: &str,
        h: &SignedHeaders,
    ) -> Result<SignedHeaders, AuthError> {
        let headers: HashMap<&str, String> = h.pairs().into_iter().collect();
        v.verify_at(now, method, pq, |name| {
            headers.get(name).map(String::as_str)
        })
    }

    #[test]
    fn sha256_hex_is_64_lowercase_digits() {
        assert!(is_sha256_hex(EMPTY_BODY_SHA256));
        assert!(!is_sha256_hex(&EMPTY_BODY_SHA256.to_uppercase()));
        assert!(!is_sha256_hex(&EMPTY_BODY_SHA256[1..]));
        assert!(!is_sha256_hex(&"g".repeat(64)));
    }

    #[test]
    fn round_trip_then_replay_is_refused() {
        let key = Key::generate().unwrap();
        let v = Verifier::new(key.clone());
        let h = sign_at(
            &key,
            "GET",
            "/v1/exec",
            EMPTY_BODY_SHA256,
            1000,
            "00112233445566778899aabbccddeeff",
        );
        assert!(verify(&v, 1000, "GET", "/v1/exec", &h).is_ok());
        assert_eq!(
            verify(&v, 1001, "GET", "/v1/exec", &h),
            Err(AuthError::Replayed)
        );
    }

    #[test]
    fn a_rekeyed_verifier_refuses_the_old_key_and_takes_the_new_one() {
        let old = Key::generate().unwrap();
        let new = Key::generate().unwrap();
        let v = Verifier::new(old.clone());
        v.rekey(new.clone());
        let signed = |key: &Key, nonce: &str| {
            sign_at(key, "GET", "/v1/exec", EMPTY_BODY_SHA256, 1000, nonce)
        };
        let by_old = signed(&old, "00112233445566778899aabbccddeeff");
        assert!(verify(&v, 1000, "GET", "/v1/exec", &by_old).is_err());
        let by_new = signed(&new, "ffeeddccbbaa99887766554433221100");
        assert!(verify(&v, 1000, "GET", "/v1/exec", &by_new).is_ok());
    }

    #[test]
    fn tampering_wrong_key_and_stale_clock_are_refused() {
        let key = Key::generate().unwrap();
        let other = Key::generate().unwrap();
        let v = Verifier::new(key.clone());
        let nonce = "00112233445566778899aabbccddeeff";
        let h = sign_at(
            &key,
            "POST",
            "/v1/push?mount=/a",
            EMPTY_BODY_SHA256,
            1000,
            nonce,
        );
        assert_eq!(
            verify(&v, 1000, "POST", "/v1/push?mount=/b", &h),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            verify(&v, 1000, "GET", "/v1/push?mount=/a", &h),
            Err(AuthError::BadSignature)
        );
        let forged = sign_at(
            &other,
            "POST",
            "/v1/push?mount=/a",
            EMPTY_BODY_SHA256,
            1000,
            nonce,
        );
        assert_eq!(
            verify(&v, 1000, "POST", "/v1/push?mount=/a", &forged),
            Err(AuthError::BadSignature)
        );
        assert!(matches!(
            verify(&v, 5000, "POST", "/v1/push?mount=/a", &h),
            Err(AuthError::Expired { .. })
        ));
        // A refused request does not burn its nonce.
        assert!(verify(&v, 1000, "POST", "/v1/push?mount=/a", &h).is_ok());
    }

    #[test]
    fn a_sustained_rate_past_any_cache_size_is_never_locked_out() {
        let key = Key::generate().unwrap();
        let v = Verifier::new(key.clone());
        // 1,000 signed requests a second for 110 s, all inside one skew window.
        for i in 0..110_000u64 {
            let now = 1_000 + i / 1_000;
            let h = sign_at(
                &key,
                "GET",
                "/v1/exec",
                EMPTY_BODY_SHA256,
                now,
                &format!("{i:032x}"),
            );
            assert!(
                verify(&v, now, "GET", "/v1/exec", &h).is_ok(),
                "request {i} refused"
            );
        }
        let again = sign_at(
            &key,
            "GET",
            "/v1/exec",
            EMPTY_BODY_SHA256,
            1_109,
            &format!("{:032x}", 109_999),
        );
        assert_eq!(
            verify(&v, 1_110, "GET", "/v1/exec", &again),
            Err(AuthError::Replayed)
        );
    }

    /// The worked example of `docs/protocol.md`, computed here so the
    /// document cannot drift from the code: every value it shows must be
    /// what this build computes.
    #[test]
    fn the_documented_signing_example_holds() {
        let doc = include_str!("../../docs/protocol.md");
        let master = Key::from_bytes(std::array::from_fn(|i| i as u8));
        let key = derive_sandbox_key(&master, "sbx-0123456789ab");
        let target = crate::files::FileQuery {
            mode: Some(0o644),
            parents: true,
            ..crate::files::FileQuery::new("notes/hello world.txt")
        }
        .path_and_query(crate::files::PATH_FILE);
        let body_hash = body_sha256(b"hello\n");
        let nonce = "00112233445566778899aabbccddeeff";
        let canonical = canonical_request("PUT", &target, 1_700_000_000, nonce, &body_hash);
        let signed = sign_at(&key, "PUT", &target, &body_hash, 1_700_000_000, nonce);
        for value in [
            master.to_hex(),
            key.to_hex(),
            target,
            body_hash,
            canonical,
            signed.signature,
        ] {
            assert!(doc.contains(&value), "docs/protocol.md lacks {value:?}");
        }
    }

    #[test]
    fn sandbox_keys_differ_and_errors_do_not_leak_keys() {
        let master = Key::generate().unwrap();
        let a = derive_sandbox_key(&master, "sbx-a");
        assert_ne!(a, derive_sandbox_key(&master, "sbx-b"));
        assert_eq!(a, derive_sandbox_key(&master, "sbx-a"));
        assert_eq!(format!("{a:?}"), "Key(..)");
        assert_eq!(Key::from_hex(&a.to_hex()).unwrap(), a);
        assert_eq!(Key::from_hex("abcd"), Err(AuthError::MalformedKey));
        assert_eq!(body_sha256(b""), EMPTY_BODY_SHA256);
    }
}
