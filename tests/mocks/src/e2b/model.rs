//! The control plane's JSON, field for field as the `e2b` 2.63.0 client
//! declares it: `NewSandbox` and the bodies of the other requests
//! (fork, snapshot, network update among them), `Sandbox`,
//! `ListedSandbox`, `SandboxDetail`, `SandboxForkResult`, `SnapshotInfo`
//! and `Error`.
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
    /// Outbound internet (recorded, not enforced).
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// `SandboxNetworkConfig`: checked as the API checks it and kept as
    /// sent; `allowPublicTraffic` has an effect, the egress rules are
    /// recorded, not enforced.
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

/// `SandboxForkRequest`, the optional body of `POST /sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ForkRequest {
    /// Seconds the forks live (15 by default).
    pub timeout: Option<i64>,
    /// How many forks (1 by default).
    pub count: Option<i64>,
}

/// `SandboxForkResult`: exactly one of `sandbox` and `error`.
#[derive(Debug, Clone, Serialize)]
pub struct ForkResult {
    /// The fork, when it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    /// Why it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

/// `SandboxSnapshotRequest`, the body of `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SnapshotRequest {
    /// `alias`, `namespace/alias`, either with `:tag`.
    pub name: Option<String>,
    /// `false`: the filesystem only (all the mock ever keeps).
    pub memory: Option<bool>,
}

/// `SnapshotInfo`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    /// What a create names to start from it: `{id or name}:{tag}`.
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    /// `namespace/alias` of a named snapshot.
    pub names: Vec<String>,
}

/// `SandboxNetworkUpdateConfig`, the body of `PUT /sandboxes/{id}/network`:
/// it replaces the egress rules whole (what it leaves out is cleared).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkUpdate {
    /// Allowed CIDRs, IPs and domains.
    pub allow_out: Option<Vec<String>>,
    /// Denied CIDRs and IPs.
    pub deny_out: Option<Vec<String>>,
    /// Nameservers reachable when `allowOut` has a domain.
    pub dns_servers: Option<Vec<String>>,
    /// A SOCKS5 proxy (refused: not enabled for the team).
    pub egress_proxy: Option<serde_json::Value>,
    /// Transform rules (refused: not available for the team).
    pub rules: Option<serde_json::Value>,
    /// `false` denies all egress.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
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
