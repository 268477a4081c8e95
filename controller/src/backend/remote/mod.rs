//! What every remote backend (E2B, Daytona) shares: the provider's VM runs
//! the same static agent as a Docker container does, and silo reaches it
//! through the provider's HTTPS port proxy.
//!
//! A remote backend only makes, finds, pauses, resumes and removes VMs, and
//! gets the agent running in a fresh one: it uploads the agent and the
//! sandbox's key through the provider's file API and starts the agent in the
//! background through its process API (a template that already carries the
//! agent needs only the key). From then on everything goes through the
//! agent, signed with the sandbox's own key, exactly as on Docker: TLS ends
//! at the provider's proxy, so the proxy is not trusted with anything the
//! signature does not cover.
//!
//! The agent there is not PID 1 (the provider's init is), so it runs as a
//! *machine agent*: a child subreaper that freezes only what it started
//! when it snapshots. Its key reaches it as a file it deletes once read,
//! never through the VM's environment or metadata, which the provider lists.
//!
//! Layout:
//! - [`backend`]: [`backend::RemoteBackend`], the one backend of every
//!   provider, over [`backend::Provider`], a provider's API mapping.
//! - [`api`]: [`api::ProviderApi`], the one client of a provider's control
//!   plane, over its [`api::Dialect`].
//! - [`config`]: [`config::ProviderConfig`], how to reach a provider, read
//!   from the environment the same way for every one.
//! - [`rest`]: [`rest::Rest`], the REST client under every provider's
//!   clients, and [`rest::RestError`], a refusal among its errors.
//! - [`error`]: [`error::RemoteError`], why a step every provider takes the
//!   same way failed.
//! - Here: the agent's place and command line in a VM, the routes through a
//!   provider's proxy, waiting for the agent behind it, and the sweep.

pub mod api;
pub mod backend;
pub mod config;
pub mod error;
pub mod rest;

use std::time::Duration;

use silo_protocol::http::error_chain;

use std::collections::HashSet;
use std::path::PathBuf;

use crate::client::{AgentClient, ClientError, Endpoint};
use crate::retry::Deadline;
use crate::spec::SandboxSpec;

/// The port the agent listens on inside a VM, behind the provider's proxy.
pub const AGENT_PORT: u16 = 49999;
/// Where silo keeps its files in a VM (left out of snapshots).
pub const SILO_DIR: &str = "/.silo";
/// Where the uploaded agent lives in a VM.
pub const AGENT_PATH: &str = "/.silo/silo-agent";
/// Where the sandbox's key waits for the agent, which deletes it on start.
pub const KEY_PATH: &str = "/.silo/key";
/// How long a freshly started or resumed VM's agent has to answer.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a single health probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long gc's sweep of a provider's orphans retries an unreachable API:
/// what it misses, the next gc finds.
pub const SWEEP_RETRY_BUDGET: Duration = Duration::from_secs(3);
/// Pause between health probes while waiting.
const POLL: Duration = Duration::from_millis(10);
/// How long a single health check keeps asking while the provider's proxy
/// answers 502, 503 or 504 (a sandbox resuming, its ports not yet open): a
/// busy proxy is not an agent that is gone.
pub const PROXY_BUSY_BUDGET: Duration = Duration::from_secs(5);
/// Pause between probes the proxy answered busy.
const PROXY_BUSY_PAUSE: Duration = Duration::from_millis(200);

/// The agent's command line in a VM: listening on [`AGENT_PORT`] for the
/// proxy, taking its key from [`KEY_PATH`] once, supervising the spec's
/// workload.
pub fn agent_command(spec: &SandboxSpec) -> Vec<String> {
    let mut argv: Vec<String> = [
        AGENT_PATH,
        "--listen",
        &format!("tcp:0.0.0.0:{AGENT_PORT}"),
        "--machine-agent",
        "--key-file",
        KEY_PATH,
        "--remove-key-file",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    argv.extend(super::agent_flags(spec, &spec.workload));
    argv
}

/// `HOST:PORT` (IPv6 hosts in brackets), as the proxy-address variables
/// take it; `None` if it is not that.
pub fn parse_host_port(text: &str) -> Option<(String, u16)> {
    let (host, port) = text.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then_some(())?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// Where to connect for `host`: port 443 of the name itself, unless a
/// proxy address is set (a test proxy on loopback).
pub fn connect_to(proxy: Option<&(String, u16)>, host: &str) -> (String, u16) {
    proxy.cloned().unwrap_or_else(|| (host.to_owned(), 443))
}

/// The route to a name behind a provider's HTTPS proxy: TLS for
/// `server_name` (also the `Host`), through `proxy` when set, trusting
/// `ca_pem` when given, with `headers` (an access token) on every request.
pub fn tls_route(
    server_name: String,
    proxy: Option<&(String, u16)>,
    ca_pem: Option<PathBuf>,
    headers: Vec<(String, String)>,
) -> Endpoint {
    let (host, port) = connect_to(proxy, &server_name);
    Endpoint::Tls {
        host,
        port,
        server_name,
        ca_pem,
        headers,
        host_header: None,
    }
}

/// The route to a provider's URL for a port (a Daytona preview URL) as it
/// names it: its scheme (`https`, or `http` on a self-hosted provider), its
/// host (the TLS name), and its port, which then goes in the `Host` header
/// too; through `proxy` when set. `None` when the URL names no host or
/// another scheme.
pub fn url_route(
    url: &http::Uri,
    proxy: Option<&(String, u16)>,
    ca_pem: Option<PathBuf>,
    headers: Vec<(String, String)>,
) -> Option<Endpoint> {
    let host = url.host().filter(|host| !host.is_empty())?.to_owned();
    let tls = match url.scheme_str() {
        Some("https") | None => true,
        Some("http") => false,
        Some(_) => return None,
    };
    let default_port = if tls { 443 } else { 80 };
    let port = url.port_u16().unwrap_or(default_port);
    let authority = (port != default_port).then(|| format!("{host}:{port}"));
    let (to, to_port) = proxy.cloned().unwrap_or_else(|| (host.clone(), port));
    Some(if tls {
        Endpoint::Tls {
            host: to,
            port: to_port,
            server_name: host,
            ca_pem,
            headers,
            host_header: authority,
        }
    } else {
        Endpoint::Http {
            host: to,
            port: to_port,
            host_header: authority.unwrap_or(host),
            headers,
        }
    })
}

/// Removes the VMs among `found` (each a provider id and the silo sandbox
/// id it is labelled with) whose sandbox is not in `live`, unless
/// `dry_run`; answers them as `{provider}:{vm} ({sandbox})`. For gc: a VM
/// made by a create that died before recording it, or left by a removal
/// that did not reach the provider.
pub async fn sweep<E, Fut>(
    provider: &str,
    found: impl IntoIterator<Item = (String, Option<String>)>,
    live: &HashSet<String>,
    dry_run: bool,
    remove: impl Fn(String) -> Fut,
) -> Result<Vec<String>, E>
where
    Fut: std::future::Future<Output = Result<(), E>>,
{
    let mut swept = Vec::new();
    for (vm, owner) in found {
        let owner = owner.unwrap_or_default();
        if live.contains(&owner) {
            continue;
        }
        let name = format!("{provider}:{vm} ({owner})");
        if !dry_run {
            remove(vm).await?;
        }
        swept.push(name);
    }
    Ok(swept)
}

/// Whether the agent answers now; a proxy answering busy is asked again
/// for [`PROXY_BUSY_BUDGET`] before the agent counts as not answering.
pub async fn healthy(client: &AgentClient) -> bool {
    probe(client).await.is_ok()
}

/// One health check, a busy proxy waited out for [`PROXY_BUSY_BUDGET`];
/// the error is what the last probe met.
pub async fn probe(client: &AgentClient) -> Result<(), ClientError> {
    let deadline = tokio::time::Instant::now() + PROXY_BUSY_BUDGET;
    loop {
        match tokio::time::timeout(PROBE_TIMEOUT, client.healthz()).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(ClientError::Rejected { status, .. }))
                if proxy_busy(status) && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(PROXY_BUSY_PAUSE).await;
            }
            Ok(Err(error)) => return Err(error),
            Err(_) => {
                return Err(ClientError::Timeout {
                    what: "the agent's health".into(),
                });
            }
        }
    }
}

/// Whether an answer is the proxy refusing the sandbox's access token
/// (a redirect to sign in, 401, 403) rather than the agent answering.
pub fn access_refused(error: &ClientError) -> Option<u16> {
    match error {
        ClientError::Rejected { status, .. } if matches!(status, 301..=308 | 401 | 403) => {
            Some(*status)
        }
        _ => None,
    }
}

/// A status a provider's proxy answers for a sandbox it cannot reach for
/// the moment.
fn proxy_busy(status: u16) -> bool {
    matches!(status, 502..=504)
}

/// Polls the agent through the proxy until it answers; the error says what
/// the last probe saw.
pub async fn wait_for_agent(client: &AgentClient) -> Result<(), String> {
    let deadline = Deadline::after(READY_TIMEOUT, POLL);
    loop {
        let last = match tokio::time::timeout(PROBE_TIMEOUT, client.healthz()).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(error)) => error_chain(&error),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        if !deadline.pause().await {
            return Err(format!(
                "its agent did not answer within {READY_TIMEOUT:?}: {last}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::spec::BackendKind;

    #[tokio::test]
    async fn a_sweep_removes_only_vms_of_sandboxes_that_are_gone() {
        let removed = std::sync::Mutex::new(Vec::new());
        let live = HashSet::from(["sbx-live".to_owned()]);
        let found = [
            ("vm-1".to_owned(), Some("sbx-live".to_owned())),
            ("vm-2".to_owned(), Some("sbx-gone".to_owned())),
            ("vm-3".to_owned(), None),
        ];
        let remove = |vm: String| {
            removed.lock().map(|mut r| r.push(vm)).ok();
            async { Ok::<(), ()>(()) }
        };
        let dry = sweep("p", found.clone(), &live, true, &remove).await;
        assert_eq!(
            dry,
            Ok(vec!["p:vm-2 (sbx-gone)".to_owned(), "p:vm-3 ()".to_owned()])
        );
        assert!(
            removed.lock().is_ok_and(|r| r.is_empty()),
            "a dry run removed"
        );
        let swept = sweep("p", found, &live, false, &remove).await;
        assert_eq!(swept.map(|s| s.len()), Ok(2));
        assert!(removed.lock().is_ok_and(|r| *r == ["vm-2", "vm-3"]));
    }

    #[test]
    fn a_url_route_keeps_the_urls_scheme_port_and_host() {
        let token = vec![("x-token".to_owned(), "t".to_owned())];
        let route = |url: &str, proxy: Option<&(String, u16)>| {
            url_route(&url.parse().unwrap(), proxy, None, token.clone())
        };
        // A port other than the scheme's goes to the connection and the Host.
        let endpoint = route("https://49999-a.proxy.example:8443", None).unwrap();
        assert_eq!(endpoint.to_string(), "tls:49999-a.proxy.example:8443");
        assert_eq!(endpoint.host_header(), "49999-a.proxy.example:8443");
        assert_eq!(endpoint.extra_headers(), token.as_slice());
        // The default port stays out of the Host, as browsers send it.
        let endpoint = route("https://49999-a.proxy.example/", None).unwrap();
        assert_eq!(endpoint.to_string(), "tls:49999-a.proxy.example:443");
        assert_eq!(endpoint.host_header(), "49999-a.proxy.example");
        // Plain HTTP (a self-hosted proxy) is HTTP, the token still sent.
        let endpoint = route("http://49999-a.local:4000", None).unwrap();
        assert_eq!(endpoint.to_string(), "http:49999-a.local:4000");
        assert_eq!(endpoint.host_header(), "49999-a.local:4000");
        assert_eq!(endpoint.extra_headers(), token.as_slice());
        // A test proxy takes the connection; the name and Host stay the URL's.
        let proxy = ("127.0.0.1".to_owned(), 5555);
        let endpoint = route("https://49999-a.proxy.example:8443", Some(&proxy)).unwrap();
        assert_eq!(endpoint.to_string(), "tls:127.0.0.1:5555");
        assert_eq!(endpoint.host_header(), "49999-a.proxy.example:8443");
        assert!(route("ftp://49999-a.proxy.example", None).is_none());
    }

    #[test]
    fn the_agent_takes_its_key_once_and_runs_the_workload() {
        let mut spec = SandboxSpec::new(BackendKind::Local);
        spec.workload = vec!["jupyter".into(), "lab".into()];
        spec.idle_timeout_secs = Some(60);
        let argv = agent_command(&spec);
        assert_eq!(argv[0], AGENT_PATH);
        assert!(argv.windows(2).any(|w| w == ["--key-file", KEY_PATH]));
        assert!(argv.contains(&"--remove-key-file".to_owned()));
        assert!(argv.contains(&"--machine-agent".to_owned()));
        assert!(argv.windows(2).any(|w| w == ["--idle-timeout", "60"]));
        assert_eq!(argv[argv.len() - 3..], ["--", "jupyter", "lab"]);
    }
}
