//! The control plane's JSON, field for field as e2b-dev/infra
//! `spec/openapi.yml` declares it: `NewSandbox` and the bodies of the other
//! requests, `Sandbox`, `ListedSandbox`, `SandboxDetail` and `Error`.
//! Optional fields a response leaves out are omitted, not `null`, except
//! where the spec marks them nullable and the API writes `null`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `Error`: every control-plane failure. `code` is the HTTP status.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    /// The HTTP status.
    pub code: u16,
    /// What went wrong.
    pub message: String,
}

/// `NewSandbox`, the body of `POST /sandboxes`, and `NewSandboxV2`, the
/// body of `POST /v2/sandboxes` (the same without `secure`, which v2 reads
/// as always on).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// Template id or alias, optionally with `:tag`.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox times out (default 15).
    pub timeout: Option<i64>,
    /// Pause instead of kill on timeout.
    pub auto_pause: Option<bool>,
    /// Full-memory auto-pause (default true); false needs `autoPause`.
    pub auto_pause_memory: Option<bool>,
    /// Resume on traffic (stored, not modelled by the proxy).
    pub auto_resume: Option<AutoResume>,
    /// Issue an `envdAccessToken`.
    pub secure: Option<bool>,
    /// Outbound internet (stored, not enforced).
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Network settings; only `allowPublicTraffic` has an effect.
    pub network: Option<serde_json::Value>,
    /// Labels to find the sandbox by.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment of every process.
    pub env_vars: Option<BTreeMap<String, String>>,
    /// MCP configuration (ignored).
    pub mcp: Option<serde_json::Value>,
    /// Workload identity (ignored).
    pub iam: Option<serde_json::Value>,
    /// Volume mounts (refused: not enabled).
    pub volume_mounts: Option<Vec<serde_json::Value>>,
}

/// `SandboxAutoResumeConfig`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct AutoResume {
    /// Whether traffic resumes a paused sandbox.
    pub enabled: bool,
}

/// `ConnectSandbox` (`POST /sandboxes/{id}/connect`: `timeout` required)
/// and `ConnectSandboxV2` (`POST /v2/sandboxes/{id}/connect`: optional,
/// 300 s by default).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConnectSandbox {
    /// Seconds from now the sandbox lives at least.
    pub timeout: Option<i64>,
    /// `false`: resume from disk only (a cold boot).
    pub memory: Option<bool>,
}

/// `SandboxPauseRequest`, the optional body of `POST /sandboxes/{id}/pause`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseRequest {
    /// `false`: keep only the filesystem.
    pub memory: Option<bool>,
    /// Refuse to pause a guest whose envd does not answer.
    pub require_healthy_guest: Option<bool>,
}

/// `SandboxTimeoutRequest`.
#[derive(Debug, Clone, Deserialize)]
pub struct TimeoutRequest {
    /// Seconds from now; negative counts as 0.
    pub timeout: i64,
}

/// `Sandbox`: what create and connect answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// The template's id.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The sandbox's id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated constant.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// The envd version the sandbox runs.
    pub envd_version: String,
    /// The template's alias.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Token for `X-Access-Token` (secure sandboxes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// Token for `e2b-traffic-access-token` (private sandboxes), else null.
    pub traffic_access_token: Option<String>,
    /// The sandbox domain.
    pub domain: Option<String>,
}

/// `ListedSandbox` (and, with [`SandboxDetail`]'s extras, the detail).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    /// The template's id.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The sandbox's id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated constant.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// The template's alias.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it times out (RFC 3339); for a paused sandbox, when it paused.
    pub end_at: String,
    /// vCPUs the template declares.
    pub cpu_count: u32,
    /// Memory the template declares.
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    /// Disk the template declares.
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    /// `running` or `paused`.
    pub state: String,
    /// The envd version.
    pub envd_version: String,
    /// Its metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `SandboxDetail`: `GET /sandboxes/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    /// The fields every listing has.
    #[serde(flatten)]
    pub listed: ListedSandbox,
    /// Token for `X-Access-Token` (secure sandboxes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// As created.
    pub allow_internet_access: Option<bool>,
    /// The sandbox domain.
    pub domain: Option<String>,
    /// As created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<serde_json::Value>,
    /// What happens on timeout.
    pub lifecycle: Lifecycle,
}

/// `SandboxLifecycle`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Traffic resumes a paused sandbox.
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: String,
}
