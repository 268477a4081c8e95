//! What clients asked a mock's control plane, so a test can assert the
//! exact route and body a backend or an SDK sent (a fork's count, the
//! network rules of a create) rather than only what came of it.
//!
//! Each provider's control plane records every request it routes after
//! the key check (method, path with its query, and the body as JSON, or
//! `null` when there is none or it is not JSON). The last
//! [`MAX_RECORDED`] are kept. A test holding the in-process mock reads
//! them through `MockE2b::requests` or `MockDaytona::requests`; a test
//! driving a mock binary reads them as JSON from the test-only route
//! [`JOURNAL_PATH`] (with the API key), which is itself not recorded.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// The test-only route answering the recorded requests (`GET`, oldest first).
pub const JOURNAL_PATH: &str = "/_mock/requests";
/// Most requests kept; the oldest is forgotten past it.
pub const MAX_RECORDED: usize = 1024;

/// One request as a client sent it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Asked {
    /// `POST`, `PUT`, …
    pub method: String,
    /// The path as sent (the provider's prefix included), with its query.
    pub path: String,
    /// The body as JSON; `null` when empty or not JSON.
    pub body: serde_json::Value,
}

/// The requests one mock's control plane was asked.
#[derive(Debug, Default)]
pub struct Journal {
    asked: Mutex<VecDeque<Asked>>,
}

impl Journal {
    /// Records a request; `body` is its raw bytes.
    pub fn record(&self, method: &str, path: &str, body: &[u8]) {
        let body = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        asked.push_back(Asked {
            method: method.to_owned(),
            path: path.to_owned(),
            body,
        });
        while asked.len() > MAX_RECORDED {
            asked.pop_front();
        }
    }

    /// Every request kept, oldest first.
    pub fn all(&self) -> Vec<Asked> {
        let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        asked.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_json_or_null_and_the_oldest_go_first() {
        let journal = Journal::default();
        journal.record("POST", "/sandboxes/i1/fork", br#"{"count": 2}"#);
        journal.record("DELETE", "/sandboxes/i1", b"");
        journal.record("POST", "/files", b"not json");
        let all = journal.all();
        assert_eq!(all[0].body, serde_json::json!({"count": 2}));
        assert_eq!(all[1].body, serde_json::Value::Null);
        assert_eq!(all[2].body, serde_json::Value::Null);
        for i in 0..MAX_RECORDED {
            journal.record("GET", &format!("/n/{i}"), b"");
        }
        let all = journal.all();
        assert_eq!(all.len(), MAX_RECORDED);
        assert_eq!(all[0].path, "/n/0");
    }
}
