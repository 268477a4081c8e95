//! The text forms of spec settings that people type on a command line:
//! `HOST:TARGET[:ro|:rw]` bind mounts, CPU counts (`1.5`) and memory sizes
//! (`512m`). Parsing lives with the spec so the CLI and library callers accept
//! exactly the same forms.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Thousandths of a CPU in one CPU.
const MILLIS_PER_CPU: f64 = 1000.0;

/// A host directory mounted into a container sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    /// Absolute path on the host.
    pub source: String,
    /// Absolute path inside the sandbox.
    pub target: String,
    /// Mounted read-only.
    #[serde(default, skip_serializing_if = "super::is_false")]
    pub read_only: bool,
}

impl FromStr for BindMount {
    type Err = ParseError;

    /// `HOST:TARGET`, `HOST:TARGET:ro` or `HOST:TARGET:rw`. A relative host
    /// path is taken from the current directory, so the stored spec (and its
    /// hash) names the same directory whichever directory `silo` runs from later.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &'static str| ParseError::Bind {
            text: text.to_owned(),
            reason,
        };
        let mut parts = text.split(':');
        let (Some(source), Some(target)) = (parts.next(), parts.next()) else {
            return Err(bad("expected HOST:TARGET[:ro|:rw]"));
        };
        let read_only = match parts.next() {
            None | Some("rw") => false,
            Some("ro") => true,
            Some(_) => return Err(bad("the mode after the second ':' must be ro or rw")),
        };
        if parts.next().is_some() {
            return Err(bad("too many ':' (paths containing ':' cannot be mounted)"));
        }
        if source.is_empty() || target.is_empty() {
            return Err(bad("both paths must be given"));
        }
        let source =
            std::path::absolute(source).map_err(|_| bad("cannot resolve the host path"))?;
        let source = source
            .to_str()
            .ok_or_else(|| bad("the host path is not UTF-8"))?
            .to_owned();
        Ok(Self {
            source,
            target: target.to_owned(),
            read_only,
        })
    }
}

impl std::fmt::Display for BindMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = if self.read_only { "ro" } else { "rw" };
        write!(f, "{}:{}:{mode}", self.source, self.target)
    }
}

/// A CPU count such as `2` or `0.5`, as thousandths of a CPU.
pub fn parse_cpus(text: &str) -> Result<u64, ParseError> {
    let bad = || ParseError::Cpus(text.to_owned());
    let cpus: f64 = text.trim().parse().map_err(|_| bad())?;
    let millis = (cpus * MILLIS_PER_CPU).round();
    if !millis.is_finite() || millis < 1.0 || millis > u32::MAX as f64 {
        return Err(bad());
    }
    Ok(millis as u64)
}

/// A memory size: bytes, or a number with a `k`, `m`, `g` or `t` suffix
/// (binary multiples, as the docker CLI reads them; an optional trailing `b`
/// and any case are accepted).
pub fn parse_memory(text: &str) -> Result<u64, ParseError> {
    let bad = || ParseError::Memory(text.to_owned());
    let lower = text.trim().to_ascii_lowercase();
    let digits = lower.strip_suffix('b').unwrap_or(&lower);
    let (number, shift) = match digits.char_indices().last() {
        Some((at, 'k')) => (&digits[..at], 10),
        Some((at, 'm')) => (&digits[..at], 20),
        Some((at, 'g')) => (&digits[..at], 30),
        Some((at, 't')) => (&digits[..at], 40),
        _ => (digits, 0),
    };
    let value: u64 = number.parse().map_err(|_| bad())?;
    value
        .checked_mul(1u64 << shift)
        .filter(|bytes| *bytes > 0)
        .ok_or_else(bad)
}

/// A setting that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A bind mount in the wrong form.
    #[error("bad bind mount {text:?}: {reason}")]
    Bind {
        /// What was given.
        text: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Not a positive CPU count.
    #[error("bad CPU count {0:?}: expected a positive number such as 1 or 0.5")]
    Cpus(String),
    /// Not a memory size.
    #[error("bad memory size {0:?}: expected bytes or a number with k, m, g or t, such as 512m")]
    Memory(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_take_a_mode_and_become_absolute() {
        let bind: BindMount = "/data:/mnt:ro".parse().unwrap();
        assert_eq!(
            bind,
            BindMount {
                source: "/data".into(),
                target: "/mnt".into(),
                read_only: true
            }
        );
        assert!(!"/a:/b".parse::<BindMount>().unwrap().read_only);
        assert!(!"/a:/b:rw".parse::<BindMount>().unwrap().read_only);
        let relative: BindMount = "rel:/b".parse().unwrap();
        assert!(relative.source.starts_with('/'), "{relative}");
        for bad in ["/a", "/a:/b:x", "/a:/b:ro:z", ":/b", "/a:"] {
            assert!(bad.parse::<BindMount>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn cpus_and_memory() {
        assert_eq!(parse_cpus("1.5"), Ok(1500));
        assert_eq!(parse_cpus("2"), Ok(2000));
        assert!(parse_cpus("0").is_err());
        assert!(parse_cpus("-1").is_err());
        assert!(parse_cpus("NaN").is_err());
        assert_eq!(parse_memory("512m"), Ok(512 << 20));
        assert_eq!(parse_memory("1G"), Ok(1 << 30));
        assert_eq!(parse_memory("64kb"), Ok(64 << 10));
        assert_eq!(parse_memory("1000"), Ok(1000));
        assert!(parse_memory("0").is_err());
        assert!(parse_memory("m").is_err());
        assert!(parse_memory("99999999999t").is_err());
    }
}
