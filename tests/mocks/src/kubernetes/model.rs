//! What every part of the mock Kubernetes shares about objects: the key an
//! object is stored under (namespace and name), timestamps as the API
//! writes them (whole seconds, UTC), uids, the random suffix of a
//! `generateName`, and the checks of names the API server makes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::secret::random_text;

/// Characters of a generated name's suffix: the API server's, without
/// vowels and look-alike digits so no word or ambiguity appears.
const GENERATED_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Length of a generated name's suffix.
const GENERATED_SUFFIX_LEN: usize = 5;
/// Longest prefix a `generateName` keeps, so name plus suffix fits 63.
const GENERATED_PREFIX_MAX: usize = 58;
/// Longest DNS-1123 subdomain (an object name).
const MAX_SUBDOMAIN: usize = 253;
/// Longest DNS-1123 label (a namespace, a container name).
const MAX_LABEL: usize = 63;

/// Where an object is stored: its namespace and its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl Key {
    /// The key of `name` in `namespace`.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// Now, as the API writes times (whole seconds).
pub fn now() -> Time {
    time_at(SystemTime::now())
}

/// `at` as the API writes times.
pub fn time_at(at: SystemTime) -> Time {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let secs = i64::try_from(secs).unwrap_or_default();
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// `time` plus `after`.
pub fn later(time: &Time, after: Duration) -> Time {
    let secs = i64::try_from(after.as_secs()).unwrap_or(i64::MAX);
    let moved = time.0.as_second().saturating_add(secs);
    Time(Timestamp::from_second(moved).unwrap_or(time.0))
}

/// How long ago `time` was, never negative.
pub fn age(time: &Time) -> Duration {
    let now = now().0.as_second();
    Duration::from_secs(u64::try_from(now - time.0.as_second()).unwrap_or_default())
}

/// A Docker timestamp (RFC 3339, nanoseconds) as the API writes times.
pub fn parse_docker_time(text: &str) -> Option<Time> {
    let parsed: Timestamp = text.parse().ok()?;
    // The engine's zero time means "never".
    if parsed.as_second() <= 0 {
        return None;
    }
    Timestamp::from_second(parsed.as_second()).ok().map(Time)
}

/// A new object's uid.
pub fn new_uid() -> Result<String, getrandom::Error> {
    crate::secret::uuid_v4()
}

/// A name for `generate_name`: the prefix (cut to fit) and five random characters.
pub fn generated_name(prefix: &str) -> Result<String, getrandom::Error> {
    let mut name: String = prefix.chars().take(GENERATED_PREFIX_MAX).collect();
    name.push_str(&random_text(GENERATED_SUFFIX_LEN, GENERATED_ALPHABET)?);
    Ok(name)
}

/// Why `name` is not a DNS-1123 subdomain (an object's name), if it is not.
pub fn subdomain_problem(name: &str) -> Option<String> {
    if name.len() > MAX_SUBDOMAIN {
        return Some(format!("must be no more than {MAX_SUBDOMAIN} characters"));
    }
    let valid = !name.is_empty()
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    (!valid).then(|| {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
         '-' or '.', and must start and end with an alphanumeric character (e.g. \
         'example.com', regex used for validation is \
         '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            .to_owned()
    })
}

/// Why `name` is not a DNS-1123 label (a container's name), if it is not.
pub fn label_problem(name: &str) -> Option<String> {
    if name.len() > MAX_LABEL {
        return Some(format!("must be no more than {MAX_LABEL} characters"));
    }
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    (!valid).then(|| {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
         '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or \
         '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            .to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_the_api_checks_them() {
        assert!(subdomain_problem("web-1.example").is_none());
        assert!(subdomain_problem("Web").is_some());
        assert!(subdomain_problem("-web").is_some());
        assert!(subdomain_problem("").is_some());
        assert!(label_problem("app").is_none());
        assert!(label_problem("a.b").is_some());
    }

    #[test]
    fn generated_names_keep_the_prefix() {
        let name = generated_name("sandbox-").unwrap();
        assert!(name.starts_with("sandbox-"));
        assert_eq!(name.len(), "sandbox-".len() + 5);
        assert!(subdomain_problem(&name).is_none());
    }

    #[test]
    fn times_are_whole_seconds() {
        let text = serde_json::to_string(&now()).unwrap();
        assert!(text.ends_with("Z\""), "{text}");
        assert_eq!(text.len(), "\"2026-01-01T00:00:00Z\"".len());
        let docker = parse_docker_time("2026-03-04T05:06:07.123456789Z").unwrap();
        assert_eq!(
            serde_json::to_string(&docker).unwrap(),
            "\"2026-03-04T05:06:07Z\""
        );
        assert!(parse_docker_time("0001-01-01T00:00:00Z").is_none());
    }
}
