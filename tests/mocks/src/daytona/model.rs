//! Daytona's JSON, field for field as the current generated clients declare
//! it (`daytona-api-client` 0.231.0 for the control plane,
//! `daytona-toolbox-api-client` 0.226.1 for the toolbox; the last published
//! repository, daytonaio/daytona v0.190.0, for how the services write it): the `Sandbox` and `SandboxListItem`
//! objects, the listing page, the preview URL, the toolbox's answers, and
//! the two error bodies. The control plane (NestJS) writes nullable columns
//! as `null` and leaves unset optional fields out; the proxy, runner and
//! toolbox (Go) write `null` for nil pointers unless the field is
//! `omitempty`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::format_description::well_known::iso8601::{self, EncodedConfig, Iso8601};

/// `Sandbox`: what create, get, start, stop, delete and the label update answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// UUID.
    pub id: String,
    /// The organization of the API key.
    pub organization_id: String,
    /// The name (the id unless one was given; renamed on delete).
    pub name: String,
    /// The snapshot's name.
    pub snapshot: String,
    /// The OS user (`daytona` unless one was given).
    pub user: String,
    /// Environment of the sandbox.
    pub env: BTreeMap<String, String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Previews open without a token.
    pub public: bool,
    /// As created (not enforced).
    pub network_block_all: bool,
    /// Whether `/dev/kvm` is exposed (as created; never, here).
    pub kvm: bool,
    /// As created (not enforced), else null.
    pub network_allow_list: Option<String>,
    /// As created (not enforced), else null.
    pub domain_allow_list: Option<String>,
    /// The region.
    pub target: String,
    /// vCPUs of the snapshot.
    pub cpu: u32,
    /// GPUs of the snapshot.
    pub gpu: u32,
    /// GiB of memory of the snapshot.
    pub memory: u32,
    /// GiB of disk of the snapshot.
    pub disk: u32,
    /// `SandboxState`, derived from the state and the desired state.
    pub state: &'static str,
    /// `SandboxDesiredState`.
    pub desired_state: &'static str,
    /// Why the sandbox is in `error`, else null.
    pub error_reason: Option<String>,
    /// Never recoverable here.
    pub recoverable: bool,
    /// `BackupState`: always `None`.
    pub backup_state: &'static str,
    /// Minutes of inactivity before a stop (0: never).
    pub auto_stop_interval: i64,
    /// Minutes of inactivity before a pause (0: never; pauses are not modelled).
    pub auto_pause_interval: i64,
    /// Minutes stopped before an archive (stored, not modelled).
    pub auto_archive_interval: i64,
    /// Minutes stopped before a delete (negative: never, 0: at stop).
    pub auto_delete_interval: i64,
    /// Always empty (volumes are not modelled).
    pub volumes: Vec<serde_json::Value>,
    /// ISO 8601 with milliseconds.
    pub created_at: String,
    /// ISO 8601 with milliseconds.
    pub updated_at: String,
    /// ISO 8601 with milliseconds.
    pub last_activity_at: String,
    /// `SandboxClass`: the snapshot's, `container` or `linux-vm`.
    pub sandbox_class: &'static str,
    /// Null: the mock runs no daemon that reports one.
    pub daemon_version: Option<String>,
    /// The mock's one runner.
    pub runner_id: String,
    /// Base of the toolbox: `{toolboxProxyUrl}/{id}/...`.
    pub toolbox_proxy_url: String,
}

/// `SandboxListItem`: one entry of `GET /sandbox`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxListItem {
    /// UUID.
    pub id: String,
    /// The organization.
    pub organization_id: String,
    /// The name.
    pub name: String,
    /// The region.
    pub target: String,
    /// The mock's one runner.
    pub runner_id: String,
    /// `container` or `linux-vm`.
    pub sandbox_class: &'static str,
    /// Derived state.
    pub state: &'static str,
    /// Desired state.
    pub desired_state: &'static str,
    /// The snapshot's name.
    pub snapshot: String,
    /// The OS user.
    pub user: String,
    /// Null unless in `error`.
    pub error_reason: Option<String>,
    /// Never recoverable here.
    pub recoverable: bool,
    /// Previews open without a token.
    pub public: bool,
    /// As created (not enforced).
    pub network_block_all: bool,
    /// As created, else null.
    pub network_allow_list: Option<String>,
    /// As created, else null.
    pub domain_allow_list: Option<String>,
    /// vCPUs.
    pub cpu: u32,
    /// GPUs.
    pub gpu: u32,
    /// GiB of memory.
    pub memory: u32,
    /// GiB of disk.
    pub disk: u32,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// `None`.
    pub backup_state: &'static str,
    /// Minutes.
    pub auto_stop_interval: i64,
    /// Minutes.
    pub auto_pause_interval: i64,
    /// Minutes.
    pub auto_archive_interval: i64,
    /// Minutes.
    pub auto_delete_interval: i64,
    /// ISO 8601.
    pub created_at: String,
    /// ISO 8601.
    pub updated_at: String,
    /// ISO 8601.
    pub last_activity_at: String,
    /// Null.
    pub daemon_version: Option<String>,
    /// Base of the toolbox.
    pub toolbox_proxy_url: String,
}

/// `ListSandboxesResponse`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListSandboxesResponse {
    /// This page.
    pub items: Vec<SandboxListItem>,
    /// The next page's cursor, null on the last page.
    pub next_cursor: Option<String>,
}

/// `PortPreviewUrl`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortPreviewUrl {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// `https://{port}-{id}.{proxyDomain}`.
    pub url: String,
    /// The sandbox's current preview token (`x-daytona-preview-token`).
    pub token: String,
}

/// `ToolboxProxyUrl`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolboxProxyUrl {
    /// The toolbox's base URL.
    pub url: String,
}

/// The control plane's error body (its exception filter).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiError {
    /// The request's path and query.
    pub path: String,
    /// When (ISO 8601 with milliseconds).
    pub timestamp: String,
    /// The HTTP status.
    pub status_code: u16,
    /// The status's reason phrase.
    pub error: String,
    /// What went wrong (several validation messages joined by `, `).
    pub message: String,
}

/// `ErrorResponse` of the proxy, the runner and the toolbox (Go).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceError {
    /// The HTTP status.
    pub status_code: u16,
    /// `"<kind>: <reason>"`, e.g. `not found: session not found`.
    pub message: String,
    /// `NOT_FOUND`, `BAD_REQUEST`, …; left out when empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    /// Go's RFC 3339 with nanoseconds (the zero time when unset).
    pub timestamp: String,
    /// The path as the answering service saw it.
    pub path: String,
    /// The method; left out when empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// `ExecuteResponse` of `POST /process/execute`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteResponse {
    /// The exit code (-1 when it did not start).
    pub exit_code: i64,
    /// stdout and stderr together.
    pub result: String,
}

/// `SessionExecuteResponse`; the optional fields are `null`, not left out.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionExecuteResponse {
    /// The command's id.
    pub cmd_id: String,
    /// Combined output (sync runs).
    pub output: Option<String>,
    /// Only for clients that ask for split output (never here).
    pub stdout: Option<String>,
    /// Only for clients that ask for split output (never here).
    pub stderr: Option<String>,
    /// The exit code (sync runs).
    pub exit_code: Option<i64>,
}

/// `Command`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandInfo {
    /// The command's id.
    pub id: String,
    /// The command's text.
    pub command: String,
    /// Left out while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
}

/// `Session`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    /// The session's id.
    pub session_id: String,
    /// Its commands in the order they were sent.
    pub commands: Vec<CommandInfo>,
}

/// JavaScript's `Date.toISOString()`: UTC, milliseconds, `Z`.
pub fn iso_millis(at: SystemTime) -> String {
    const FORMAT: EncodedConfig = iso8601::Config::DEFAULT
        .set_time_precision(iso8601::TimePrecision::Second {
            decimal_digits: std::num::NonZeroU8::new(3),
        })
        .encode();
    OffsetDateTime::from(at)
        .format(&Iso8601::<FORMAT>)
        .unwrap_or_default()
}

/// Go's `time.Time` in JSON: RFC 3339 with the fraction's trailing zeros dropped.
pub fn go_time(at: SystemTime) -> String {
    OffsetDateTime::from(at)
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// Go's zero `time.Time` in JSON, written by the toolbox's fallback error body.
pub const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn timestamps_read_as_their_services_write_them() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(iso_millis(at), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(go_time(at), "2023-11-14T22:13:20.123Z");
        assert_eq!(go_time(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn service_errors_leave_empty_code_and_method_out() {
        let error = ServiceError {
            status_code: 500,
            message: "failed".into(),
            code: None,
            timestamp: GO_ZERO_TIME.into(),
            path: String::new(),
            method: None,
        };
        assert_eq!(
            serde_json::to_value(&error).unwrap(),
            serde_json::json!({"statusCode": 500, "message": "failed", "timestamp": GO_ZERO_TIME, "path": ""})
        );
    }
}
