//! Every route of the control plane's specs (method and path template
//! under `/api`): the last published repository's
//! (`libs/api-client-go/api/openapi.yaml`, v0.190.0, in [`PUBLISHED`]) and
//! the current client's (`docs/providers/daytona-api-client.txt`, the
//! listing `scripts/provider-api.sh` makes, read at build time), so a
//! route the mock does not serve answers `501` saying so, while a path
//! neither has answers the real API's `404`.

/// The current client's listing (`route METHOD PATH ...` lines).
const CURRENT: &str = include_str!("../../../../docs/providers/daytona-api-client.txt");

/// `(method, template)`; `{name}` segments match any one segment.
pub const PUBLISHED: [(&str, &str); 230] = [
    ("GET", "/config"),
    ("GET", "/api-keys"),
    ("POST", "/api-keys"),
    ("GET", "/api-keys/current"),
    ("DELETE", "/api-keys/{name}"),
    ("GET", "/api-keys/{name}"),
    ("DELETE", "/api-keys/{userId}/{name}"),
    ("GET", "/organizations/invitations"),
    ("GET", "/organizations/invitations/count"),
    ("POST", "/organizations/invitations/{invitationId}/accept"),
    ("POST", "/organizations/invitations/{invitationId}/decline"),
    ("GET", "/organizations"),
    ("POST", "/organizations"),
    ("PATCH", "/organizations/{organizationId}/default-region"),
    ("DELETE", "/organizations/{organizationId}"),
    ("GET", "/organizations/{organizationId}"),
    ("GET", "/organizations/{organizationId}/usage"),
    ("PATCH", "/organizations/{organizationId}/quota"),
    ("PATCH", "/organizations/{organizationId}/quota/{regionId}"),
    ("POST", "/organizations/{organizationId}/leave"),
    ("POST", "/organizations/{organizationId}/suspend"),
    ("POST", "/organizations/{organizationId}/unsuspend"),
    (
        "GET",
        "/organizations/otel-config/by-sandbox-auth-token/{authToken}",
    ),
    ("DELETE", "/organizations/{organizationId}/otel-config"),
    ("GET", "/organizations/{organizationId}/otel-config"),
    ("PUT", "/organizations/{organizationId}/otel-config"),
    (
        "POST",
        "/organizations/{organizationId}/sandbox-default-limited-network-egress",
    ),
    ("PUT", "/organizations/{organizationId}/experimental-config"),
    ("GET", "/organizations/{organizationId}/roles"),
    ("POST", "/organizations/{organizationId}/roles"),
    ("DELETE", "/organizations/{organizationId}/roles/{roleId}"),
    ("PUT", "/organizations/{organizationId}/roles/{roleId}"),
    ("GET", "/organizations/{organizationId}/users"),
    (
        "POST",
        "/organizations/{organizationId}/users/{userId}/access",
    ),
    ("DELETE", "/organizations/{organizationId}/users/{userId}"),
    ("GET", "/organizations/{organizationId}/invitations"),
    ("POST", "/organizations/{organizationId}/invitations"),
    (
        "PUT",
        "/organizations/{organizationId}/invitations/{invitationId}",
    ),
    (
        "POST",
        "/organizations/{organizationId}/invitations/{invitationId}/cancel",
    ),
    ("GET", "/regions"),
    ("POST", "/regions"),
    ("DELETE", "/regions/{id}"),
    ("GET", "/regions/{id}"),
    ("PATCH", "/regions/{id}"),
    ("POST", "/regions/{id}/regenerate-proxy-api-key"),
    ("POST", "/regions/{id}/regenerate-ssh-gateway-api-key"),
    (
        "POST",
        "/regions/{id}/regenerate-snapshot-manager-credentials",
    ),
    ("GET", "/users/me"),
    ("GET", "/users/account-providers"),
    ("POST", "/users/linked-accounts"),
    (
        "DELETE",
        "/users/linked-accounts/{provider}/{providerUserId}",
    ),
    ("POST", "/users/mfa/sms/enroll"),
    ("GET", "/shared-regions"),
    ("GET", "/sandbox"),
    ("POST", "/sandbox"),
    ("GET", "/sandbox/paginated"),
    ("GET", "/sandbox/for-runner"),
    ("DELETE", "/sandbox/{sandboxIdOrName}"),
    ("GET", "/sandbox/{sandboxIdOrName}"),
    ("POST", "/sandbox/{sandboxIdOrName}/recover"),
    ("POST", "/sandbox/{sandboxIdOrName}/start"),
    ("POST", "/sandbox/{sandboxIdOrName}/stop"),
    ("POST", "/sandbox/{sandboxIdOrName}/pause"),
    ("POST", "/sandbox/{sandboxIdOrName}/resize"),
    ("PUT", "/sandbox/{sandboxIdOrName}/labels"),
    ("PUT", "/sandbox/{sandboxId}/state"),
    ("POST", "/sandbox/{sandboxIdOrName}/backup"),
    ("POST", "/sandbox/{sandboxIdOrName}/snapshot"),
    ("POST", "/sandbox/{sandboxIdOrName}/fork"),
    ("GET", "/sandbox/{sandboxIdOrName}/forks"),
    ("GET", "/sandbox/{sandboxIdOrName}/parent"),
    ("GET", "/sandbox/{sandboxIdOrName}/ancestors"),
    ("POST", "/sandbox/{sandboxIdOrName}/public/{isPublic}"),
    ("POST", "/sandbox/{sandboxId}/last-activity"),
    ("POST", "/sandbox/{sandboxIdOrName}/autostop/{interval}"),
    ("POST", "/sandbox/{sandboxIdOrName}/autoarchive/{interval}"),
    ("POST", "/sandbox/{sandboxIdOrName}/autodelete/{interval}"),
    ("POST", "/sandbox/{sandboxIdOrName}/network-settings"),
    ("POST", "/sandbox/{sandboxIdOrName}/archive"),
    ("GET", "/sandbox/{sandboxIdOrName}/ports/{port}/preview-url"),
    (
        "GET",
        "/sandbox/{sandboxIdOrName}/ports/{port}/signed-preview-url",
    ),
    (
        "POST",
        "/sandbox/{sandboxIdOrName}/ports/{port}/signed-preview-url/{token}/expire",
    ),
    ("GET", "/sandbox/{sandboxIdOrName}/build-logs"),
    ("GET", "/sandbox/{sandboxIdOrName}/build-logs-url"),
    ("DELETE", "/sandbox/{sandboxIdOrName}/ssh-access"),
    ("POST", "/sandbox/{sandboxIdOrName}/ssh-access"),
    ("GET", "/sandbox/ssh-access/validate"),
    ("GET", "/sandbox/{sandboxId}/toolbox-proxy-url"),
    ("GET", "/sandbox/{sandboxId}/organization"),
    ("GET", "/sandbox/{sandboxId}/region-quota"),
    ("GET", "/runners"),
    ("POST", "/runners"),
    ("GET", "/runners/me"),
    ("GET", "/runners/by-sandbox/{sandboxId}"),
    ("GET", "/runners/by-snapshot-ref"),
    ("DELETE", "/runners/{id}"),
    ("GET", "/runners/{id}"),
    ("GET", "/runners/{id}/full"),
    ("PATCH", "/runners/{id}/scheduling"),
    ("PATCH", "/runners/{id}/draining"),
    ("POST", "/runners/healthcheck"),
    ("GET", "/toolbox/{sandboxId}/toolbox/project-dir"),
    ("GET", "/toolbox/{sandboxId}/toolbox/user-home-dir"),
    ("GET", "/toolbox/{sandboxId}/toolbox/work-dir"),
    ("DELETE", "/toolbox/{sandboxId}/toolbox/files"),
    ("GET", "/toolbox/{sandboxId}/toolbox/files"),
    ("GET", "/toolbox/{sandboxId}/toolbox/files/download"),
    ("POST", "/toolbox/{sandboxId}/toolbox/files/bulk-download"),
    ("GET", "/toolbox/{sandboxId}/toolbox/files/find"),
    ("POST", "/toolbox/{sandboxId}/toolbox/files/folder"),
    ("GET", "/toolbox/{sandboxId}/toolbox/files/info"),
    ("POST", "/toolbox/{sandboxId}/toolbox/files/move"),
    ("POST", "/toolbox/{sandboxId}/toolbox/files/permissions"),
    ("POST", "/toolbox/{sandboxId}/toolbox/files/replace"),
    ("GET", "/toolbox/{sandboxId}/toolbox/files/search"),
    ("POST", "/toolbox/{sandboxId}/toolbox/files/upload"),
    ("POST", "/toolbox/{sandboxId}/toolbox/files/bulk-upload"),
    ("POST", "/toolbox/{sandboxId}/toolbox/git/add"),
    ("DELETE", "/toolbox/{sandboxId}/toolbox/git/branches"),
    ("GET", "/toolbox/{sandboxId}/toolbox/git/branches"),
    ("POST", "/toolbox/{sandboxId}/toolbox/git/branches"),
    ("POST", "/toolbox/{sandboxId}/toolbox/git/clone"),
    ("POST", "/toolbox/{sandboxId}/toolbox/git/commit"),
    ("GET", "/toolbox/{sandboxId}/toolbox/git/history"),
    ("POST", "/toolbox/{sandboxId}/toolbox/git/pull"),
    ("POST", "/toolbox/{sandboxId}/toolbox/git/push"),
    ("POST", "/toolbox/{sandboxId}/toolbox/git/checkout"),
    ("GET", "/toolbox/{sandboxId}/toolbox/git/status"),
    ("POST", "/toolbox/{sandboxId}/toolbox/process/execute"),
    ("GET", "/toolbox/{sandboxId}/toolbox/process/session"),
    ("POST", "/toolbox/{sandboxId}/toolbox/process/session"),
    (
        "DELETE",
        "/toolbox/{sandboxId}/toolbox/process/session/{sessionId}",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/process/session/{sessionId}",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/process/session/{sessionId}/exec",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/process/session/{sessionId}/command/{commandId}",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/process/session/{sessionId}/command/{commandId}/logs",
    ),
    ("GET", "/toolbox/{sandboxId}/toolbox/process/pty"),
    ("POST", "/toolbox/{sandboxId}/toolbox/process/pty"),
    (
        "DELETE",
        "/toolbox/{sandboxId}/toolbox/process/pty/{sessionId}",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/process/pty/{sessionId}",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/process/pty/{sessionId}/resize",
    ),
    ("POST", "/toolbox/{sandboxId}/toolbox/lsp/completions"),
    ("POST", "/toolbox/{sandboxId}/toolbox/lsp/did-close"),
    ("POST", "/toolbox/{sandboxId}/toolbox/lsp/did-open"),
    ("GET", "/toolbox/{sandboxId}/toolbox/lsp/document-symbols"),
    ("POST", "/toolbox/{sandboxId}/toolbox/lsp/start"),
    ("POST", "/toolbox/{sandboxId}/toolbox/lsp/stop"),
    ("GET", "/toolbox/{sandboxId}/toolbox/lsp/workspace-symbols"),
    ("POST", "/toolbox/{sandboxId}/toolbox/computeruse/start"),
    ("POST", "/toolbox/{sandboxId}/toolbox/computeruse/stop"),
    ("GET", "/toolbox/{sandboxId}/toolbox/computeruse/status"),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/process/{processName}/status",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/computeruse/process/{processName}/restart",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/process/{processName}/logs",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/process/{processName}/errors",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/mouse/position",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/computeruse/mouse/move",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/computeruse/mouse/click",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/computeruse/mouse/drag",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/computeruse/mouse/scroll",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/computeruse/keyboard/type",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/computeruse/keyboard/key",
    ),
    (
        "POST",
        "/toolbox/{sandboxId}/toolbox/computeruse/keyboard/hotkey",
    ),
    ("GET", "/toolbox/{sandboxId}/toolbox/computeruse/screenshot"),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/screenshot/region",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/screenshot/compressed",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/screenshot/region/compressed",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/display/info",
    ),
    (
        "GET",
        "/toolbox/{sandboxId}/toolbox/computeruse/display/windows",
    ),
    ("GET", "/snapshots"),
    ("POST", "/snapshots"),
    ("DELETE", "/snapshots/{id}"),
    ("GET", "/snapshots/{id}"),
    ("GET", "/snapshots/{id}/build-logs"),
    ("GET", "/snapshots/{id}/build-logs-url"),
    ("POST", "/snapshots/{id}/activate"),
    ("POST", "/snapshots/{id}/deactivate"),
    ("GET", "/preview/{sandboxId}/public"),
    ("GET", "/preview/{sandboxId}/validate/{authToken}"),
    ("GET", "/preview/{sandboxId}/access"),
    ("GET", "/preview/{signedPreviewToken}/{port}/sandbox-id"),
    ("GET", "/volumes"),
    ("POST", "/volumes"),
    ("DELETE", "/volumes/{volumeId}"),
    ("GET", "/volumes/{volumeId}"),
    ("GET", "/volumes/by-name/{name}"),
    ("GET", "/jobs"),
    ("GET", "/jobs/poll"),
    ("GET", "/jobs/{jobId}"),
    ("POST", "/jobs/{jobId}/status"),
    ("GET", "/docker-registry"),
    ("POST", "/docker-registry"),
    ("GET", "/docker-registry/registry-push-access"),
    ("DELETE", "/docker-registry/{id}"),
    ("GET", "/docker-registry/{id}"),
    ("PATCH", "/docker-registry/{id}"),
    ("GET", "/admin/runners"),
    ("POST", "/admin/runners"),
    ("DELETE", "/admin/runners/{id}"),
    ("GET", "/admin/runners/{id}"),
    ("PATCH", "/admin/runners/{id}/scheduling"),
    ("POST", "/admin/sandbox/{sandboxId}/recover"),
    ("GET", "/admin/users"),
    ("POST", "/admin/users"),
    ("POST", "/admin/users/{id}/regenerate-key-pair"),
    ("GET", "/admin/users/{id}"),
    (
        "POST",
        "/admin/webhooks/organizations/{organizationId}/send",
    ),
    (
        "GET",
        "/admin/webhooks/organizations/{organizationId}/messages/{messageId}/attempts",
    ),
    ("GET", "/admin/webhooks/status"),
    (
        "POST",
        "/admin/webhooks/organizations/{organizationId}/initialize",
    ),
    ("POST", "/admin/docker-registry/{id}/set-default"),
    ("GET", "/admin/snapshots/can-cleanup-image"),
    ("PATCH", "/admin/snapshots/{id}/general"),
    ("GET", "/admin/audit"),
    (
        "PATCH",
        "/admin/organizations/{organizationId}/quota/{regionId}",
    ),
    (
        "POST",
        "/admin/organizations/{organizationId}/quota/{regionId}",
    ),
    (
        "DELETE",
        "/admin/organizations/{organizationId}/quota/{regionId}/{sandboxClass}",
    ),
    (
        "GET",
        "/admin/organizations/{organizationId}/quota/{regionId}/{sandboxClass}",
    ),
    (
        "POST",
        "/webhooks/organizations/{organizationId}/app-portal-access",
    ),
    (
        "GET",
        "/webhooks/organizations/{organizationId}/initialization-status",
    ),
    (
        "POST",
        "/webhooks/organizations/{organizationId}/initialize",
    ),
    (
        "POST",
        "/webhooks/organizations/{organizationId}/refresh-endpoints",
    ),
    ("GET", "/audit/organizations/{organizationId}"),
    ("GET", "/object-storage/push-access"),
    ("GET", "/health"),
    ("GET", "/health/ready"),
    ("GET", "/sandbox/{sandboxId}/telemetry/logs"),
    ("GET", "/sandbox/{sandboxId}/telemetry/traces"),
    ("GET", "/sandbox/{sandboxId}/telemetry/traces/{traceId}"),
    ("GET", "/sandbox/{sandboxId}/telemetry/metrics"),
];

/// Whether `method` and `path` (under `/api`, prefix removed) name a
/// route of either spec.
pub fn is_published(method: &str, path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let matches = |m: &str, template: &str| {
        let parts: Vec<&str> = template.trim_matches('/').split('/').collect();
        m == method
            && parts.len() == segments.len()
            && parts
                .iter()
                .zip(&segments)
                .all(|(part, segment)| part.starts_with('{') || part == segment)
    };
    PUBLISHED.iter().any(|(m, template)| matches(m, template))
        || current_routes().any(|(m, template)| matches(m, template))
}

/// `(method, template)` of every route in the current client's listing.
fn current_routes() -> impl Iterator<Item = (&'static str, &'static str)> {
    CURRENT.lines().filter_map(|line| {
        let mut words = line.strip_prefix("route ")?.split(' ');
        Some((words.next()?, words.next()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_one_segment_per_parameter() {
        assert!(is_published("POST", "/sandbox/abc/archive"));
        assert!(is_published("GET", "/sandbox/paginated"));
        assert!(!is_published("POST", "/sandbox/abc/process/execute"));
        assert!(!is_published("GET", "/abc/process/execute"));
        assert!(!is_published("PATCH", "/sandbox/abc/archive"));
        // New in the current client.
        assert!(is_published("POST", "/sandbox/abc/ttl/30"));
        assert!(is_published("POST", "/sandbox/abc/autopause/5"));
        assert!(current_routes().count() > 100);
    }
}
