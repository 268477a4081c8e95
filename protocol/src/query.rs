//! Query strings of signed requests: one encoder and one decoder, so both
//! tiers agree byte for byte on the text that is signed.
//!
//! Values are percent-encoded except for unreserved characters and `/`, so a
//! path stays readable in logs. A parameter given twice is refused rather
//! than guessed at; unknown parameters are ignored, so a newer client can
//! add optional ones.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// Bytes escaped in a query value: all but `A-Z a-z 0-9 - . _ ~ /`.
const VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// Builds `path?name=value&...`, the exact text to sign.
#[derive(Debug, Clone)]
pub struct QueryBuilder {
    text: String,
    first: bool,
}

impl QueryBuilder {
    /// A request to `path` with no parameters yet.
    pub fn new(path: &str) -> Self {
        Self {
            text: path.to_owned(),
            first: true,
        }
    }

    /// Adds `name=value`, the value percent-encoded.
    pub fn param(mut self, name: &str, value: &str) -> Self {
        self.text.push(if self.first { '?' } else { '&' });
        self.first = false;
        self.text.push_str(name);
        self.text.push('=');
        self.text.extend(utf8_percent_encode(value, VALUE));
        self
    }

    /// Adds `name=value` when there is a value.
    pub fn param_opt(self, name: &str, value: Option<&str>) -> Self {
        match value {
            Some(value) => self.param(name, value),
            None => self,
        }
    }

    /// Adds `name=1` when `flag` holds.
    pub fn flag(self, name: &str, flag: bool) -> Self {
        if flag { self.param(name, "1") } else { self }
    }

    /// The path and query.
    pub fn finish(self) -> String {
        self.text
    }
}

/// A decoded query string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Decodes a request's query string (absent means empty).
    pub fn parse(query: Option<&str>) -> Result<Self, QueryError> {
        let mut pairs = Vec::new();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            pairs.push((decode(name)?, decode(value)?));
        }
        Ok(Self { pairs })
    }

    /// The one value of `name`, if given; an error if given twice.
    pub fn get(&self, name: &'static str) -> Result<Option<&str>, QueryError> {
        let mut values = self.pairs.iter().filter(|(n, _)| n == name);
        let first = values.next().map(|(_, v)| v.as_str());
        if values.next().is_some() {
            return Err(QueryError::Repeated(name));
        }
        Ok(first)
    }

    /// The one value of `name`; an error if absent or given twice.
    pub fn require(&self, name: &'static str) -> Result<&str, QueryError> {
        self.get(name)?.ok_or(QueryError::Missing(name))
    }

    /// Whether flag `name` is set (`1` or `true`); an error for other values.
    pub fn flag(&self, name: &'static str) -> Result<bool, QueryError> {
        match self.get(name)? {
            None | Some("0" | "false") => Ok(false),
            Some("1" | "true") => Ok(true),
            Some(_) => Err(QueryError::BadValue {
                name,
                expected: "1 or 0",
            }),
        }
    }
}

/// Percent-decodes `text`, refusing a `%` without two hex digits after it
/// (the crate's decoder would pass it through, and so sign something other
/// than what was meant).
fn decode(text: &str) -> Result<String, QueryError> {
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('%') {
        let digits = bytes.get(at + 1..at + 3).ok_or(QueryError::BadEscape)?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return Err(QueryError::BadEscape);
        }
    }
    percent_decode_str(text)
        .decode_utf8()
        .map(|value| value.into_owned())
        .map_err(|_| QueryError::NotUtf8)
}

/// Why a query string cannot be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum QueryError {
    /// A required parameter is absent.
    #[error("missing query parameter {0}=")]
    Missing(&'static str),
    /// A parameter given more than once.
    #[error("query parameter {0} given more than once")]
    Repeated(&'static str),
    /// A parameter with a value of the wrong shape.
    #[error("query parameter {name} must be {expected}")]
    BadValue {
        /// The parameter.
        name: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A `%` not followed by two hex digits.
    #[error("malformed percent-escape in the query")]
    BadEscape,
    /// A decoded value is not UTF-8.
    #[error("query value is not UTF-8")]
    NotUtf8,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn values_round_trip_and_stay_readable() {
        for value in ["/workspace/managed/app", "/w/with space/é&x=%", "/", ""] {
            let text = QueryBuilder::new("/v1/x").param("p", value).finish();
            let (path, query) = text.split_once('?').unwrap();
            assert_eq!(path, "/v1/x");
            assert!(!query[2..].contains(['&', ' ', '=', '?']), "{text}");
            assert_eq!(Query::parse(Some(query)).unwrap().require("p"), Ok(value));
        }
        let text = QueryBuilder::new("/v1/x")
            .param("a", "/a b")
            .flag("f", true)
            .flag("g", false)
            .param_opt("h", None)
            .finish();
        assert_eq!(text, "/v1/x?a=/a%20b&f=1");
    }

    #[test]
    fn bad_queries_are_named() {
        let q = Query::parse(Some("p=/a&p=/b&f=yes&x=1")).unwrap();
        assert_eq!(q.get("p"), Err(QueryError::Repeated("p")));
        assert!(matches!(q.flag("f"), Err(QueryError::BadValue { .. })));
        assert_eq!(q.require("m"), Err(QueryError::Missing("m")));
        assert_eq!(Query::parse(None).unwrap().get("p"), Ok(None));
        assert_eq!(Query::parse(Some("p=%zz")), Err(QueryError::BadEscape));
        assert_eq!(Query::parse(Some("p=%f")), Err(QueryError::BadEscape));
        assert_eq!(Query::parse(Some("p=%ff")), Err(QueryError::NotUtf8));
    }
}
