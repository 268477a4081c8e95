//! [`Digest`]: the name of a blob, the lowercase hex sha256 of its bytes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The prefix engines put before a hex sha256 (`sha256:<hex>`), in image
/// ids, diff ids and layer digests.
pub const SHA256_PREFIX: &str = "sha256:";

/// Length of a hex sha256.
const HEX_LEN: usize = 64;

/// A sha256 as 64 lowercase hex digits: the name of a blob in the store and
/// of a layer (its diff id without the `sha256:` prefix).
///
/// Only [`Digest::parse`] and hashing make one, so a `Digest` is always a
/// safe single path component. Serialized as its hex string.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// Checks that `text` is exactly 64 lowercase hex digits.
    pub fn parse(text: &str) -> Result<Self, DigestError> {
        let valid = text.len() == HEX_LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if valid {
            Ok(Self(text.to_owned()))
        } else {
            Err(DigestError {
                text: text.chars().take(2 * HEX_LEN).collect(),
            })
        }
    }

    /// Parses the engine's `sha256:<hex>` form.
    pub fn parse_prefixed(text: &str) -> Result<Self, DigestError> {
        match text.strip_prefix(SHA256_PREFIX) {
            Some(hex) => Self::parse(hex),
            None => Err(DigestError {
                text: text.chars().take(2 * HEX_LEN).collect(),
            }),
        }
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest of everything fed to `hasher`.
    pub(crate) fn from_hasher(hasher: Sha256) -> Self {
        Self(hex::encode(hasher.finalize()))
    }

    /// The 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The engine's form, `sha256:<hex>`.
    pub fn prefixed(&self) -> String {
        format!("{SHA256_PREFIX}{}", self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(text: &str) -> Result<Self, DigestError> {
        Self::parse(text)
    }
}

impl TryFrom<String> for Digest {
    type Error = DigestError;

    fn try_from(text: String) -> Result<Self, DigestError> {
        Self::parse(&text)
    }
}

impl From<Digest> for String {
    fn from(digest: Digest) -> String {
        digest.0
    }
}

impl AsRef<str> for Digest {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A string that is not a sha256 digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a sha256 digest (64 lowercase hex digits)")]
pub struct DigestError {
    /// The rejected text (cut to 128 characters).
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn digests_are_64_lowercase_hex() {
        assert_eq!(Digest::of(b"").as_str(), EMPTY);
        assert_eq!(Digest::parse(EMPTY).unwrap(), Digest::of(b""));
        assert_eq!(Digest::of(b"").to_string(), EMPTY);
        assert_eq!(Digest::of(b"").prefixed(), format!("sha256:{EMPTY}"));
        assert_eq!(
            Digest::parse_prefixed(&format!("sha256:{EMPTY}")).unwrap(),
            Digest::of(b"")
        );
        for bad in [
            "",
            &EMPTY[1..],
            &format!("{EMPTY}0"),
            &EMPTY.to_uppercase(),
            &format!("sha256:{EMPTY}"),
            &format!("../{}", &EMPTY[3..]),
            &EMPTY.replace('e', "g"),
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Digest::parse_prefixed(EMPTY).is_err());
    }

    #[test]
    fn digests_serialize_as_strings() {
        let digest = Digest::of(b"x");
        let json = serde_json::to_string(&digest).unwrap();
        assert_eq!(json, format!("\"{digest}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), digest);
        assert!(serde_json::from_str::<Digest>("\"nope\"").is_err());
    }
}
