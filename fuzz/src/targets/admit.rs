//! Request admission: the agent's `admit` (version header, then the
//! signature) over requests that start validly signed and are then garbled
//! as text (method, target, header names and values). Oracle: an admitted
//! request must be the one that was signed (same canonical request).

use fastrand::Rng;
use silo_agent::server::auth::admit;
use silo_protocol::auth::{
    EMPTY_BODY_SHA256, Key, SignedHeaders, Verifier, canonical_request, sign,
};
use silo_protocol::http::HEADER_PROTOCOL;
use silo_protocol::{PROTOCOL_VERSION, Versions};

use super::Target;
use crate::mutate::mutate;

/// Requests the agent serves, signed as seeds.
const SEEDS: [(&str, &str); 4] = [
    ("GET", "/v1/exec"),
    ("POST", "/v1/push?mount=%2Fworkspace%2Fmanaged%2Fapp"),
    ("GET", "/v1/snapshot?parent=abc"),
    ("POST", "/v1/sessions?x=1&y=%00"),
];

/// The admission target.
pub struct Admit {
    key: Key,
    dict: Vec<Vec<u8>>,
    /// The canonical request of the last generated input.
    signed: Option<String>,
}

impl Admit {
    /// The target with a fresh key.
    pub fn new() -> anyhow::Result<Self> {
        let key = Key::generate()?;
        let mut dict: Vec<Vec<u8>> = [
            "x-silo-",
            "\n",
            ": ",
            "?",
            "&",
            "=",
            "%",
            "/..",
            "//",
            " ",
            "\t",
            "0",
            "-1",
            "99999999999999999999",
            "GET",
            "POST",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        if let Ok(pairs) = sign(&key, "GET", "/", EMPTY_BODY_SHA256) {
            dict.extend(
                pairs
                    .pairs()
                    .iter()
                    .map(|(name, _)| name.as_bytes().to_vec()),
            );
        }
        dict.push(HEADER_PROTOCOL.as_bytes().to_vec());
        Ok(Self {
            key,
            dict,
            signed: None,
        })
    }
}

/// Renders a request as text: `METHOD TARGET` then `name: value` lines.
fn render(method: &str, target: &str, headers: &[(String, String)]) -> Vec<u8> {
    let mut text = format!("{method} {target}\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\n"));
    }
    text.into_bytes()
}

/// The headers of a request signed so, with our protocol version.
fn headers_of(signed: &SignedHeaders) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = signed
        .pairs()
        .iter()
        .map(|(name, value)| ((*name).to_owned(), value.clone()))
        .collect();
    headers.push((HEADER_PROTOCOL.to_owned(), PROTOCOL_VERSION.to_string()));
    headers
}

/// The request `render` wrote (after mutation), if http accepts it.
fn parse(input: &[u8]) -> Option<http::Request<()>> {
    let text = String::from_utf8_lossy(input);
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or_default();
    let (method, target) = first.split_once(' ').unwrap_or((first, "/"));
    let mut builder = http::Request::builder().method(method).uri(target);
    for line in lines {
        if let Some((name, value)) = line.split_once(": ") {
            builder = builder.header(name, value);
        }
    }
    builder.body(()).ok()
}

impl Target for Admit {
    fn name(&self) -> &'static str {
        "admit"
    }

    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let (method, target) = SEEDS[rng.usize(..SEEDS.len())];
        let body_sha = if rng.bool() {
            EMPTY_BODY_SHA256.to_owned()
        } else {
            "ab".repeat(32)
        };
        let Ok(signed) = sign(&self.key, method, target, &body_sha) else {
            return Vec::new();
        };
        self.signed = Some(canonical_request(
            method,
            target,
            signed.timestamp,
            &signed.nonce,
            &signed.content_sha256,
        ));
        let mut headers = headers_of(&signed);
        rng.shuffle(&mut headers);
        let valid = render(method, target, &headers);
        if rng.u8(0..10) == 0 {
            valid
        } else {
            mutate(rng, &valid, &[], &self.dict)
        }
    }

    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let signed = self.signed.take();
        // What http refuses never reaches the agent.
        let Some(request) = parse(input) else {
            return Ok(());
        };
        let verifier = Verifier::new(self.key.clone());
        let Ok(headers) = admit(&request, &verifier, Versions::OURS) else {
            return Ok(());
        };
        let path_and_query = request
            .uri()
            .path_and_query()
            .map_or_else(|| request.uri().path(), |pq| pq.as_str());
        let admitted = canonical_request(
            request.method().as_str(),
            path_and_query,
            headers.timestamp,
            &headers.nonce,
            &headers.content_sha256,
        );
        match signed {
            Some(signed) if signed != admitted => Err(format!(
                "admitted a request that was never signed: {admitted:?}"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unmutated_request_is_admitted_and_a_changed_one_is_not() {
        let mut target = Admit::new().unwrap();
        let key = target.key.clone();
        let signed = sign(&key, "GET", "/v1/exec", EMPTY_BODY_SHA256).unwrap();
        let headers = headers_of(&signed);
        let request = |text: &[u8]| parse(text).unwrap();
        let verifier = Verifier::new(key.clone());
        assert!(
            admit(
                &request(&render("GET", "/v1/exec", &headers)),
                &verifier,
                Versions::OURS
            )
            .is_ok()
        );
        let verifier = Verifier::new(key);
        assert!(
            admit(
                &request(&render("GET", "/v1/exec?x", &headers)),
                &verifier,
                Versions::OURS
            )
            .is_err()
        );
        assert!(target.run(&render("GET", "/v1/exec", &headers)).is_ok());
    }
}
