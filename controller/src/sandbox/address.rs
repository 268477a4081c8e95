//! Where a sandbox's agent is and the key it accepts: what a client written
//! in another language needs before it can speak docs/protocol.md
//! ("Connecting to a sandbox"). Holding it is holding the sandbox: the key
//! signs any request, so it is handed out only to the home's owner.

use serde::Serialize;

use crate::client::Endpoint;

/// How to reach one sandbox's agent.
#[derive(Debug, Clone, Serialize)]
pub struct AgentAddress {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// `unix`, `tcp` (plain HTTP, perhaps through a proxy) or `tls`.
    pub transport: &'static str,
    /// The Unix socket's path (`unix` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// Host to connect to (`tcp`, `tls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Port to connect to (`tcp`, `tls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The `Host` header every request carries, and the name the server
    /// certificate must have under TLS (a provider's proxy routes on it).
    pub host_header: String,
    /// The agent's base URL as an HTTP library takes it (`http+unix://…`
    /// for a socket, whose path is percent-encoded).
    pub url: String,
    /// Headers every request carries besides silo's own (a provider's
    /// proxy token).
    pub headers: Vec<(String, String)>,
    /// PEM file of the roots the TLS certificate is checked against; the
    /// system's roots when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// The sandbox's key, 64 hex digits: the HMAC key of every signature.
    pub key: String,
}

impl AgentAddress {
    pub(super) fn new(sandbox_id: &str, endpoint: &Endpoint, key: String) -> Self {
        let mut address = Self {
            sandbox_id: sandbox_id.to_owned(),
            transport: "unix",
            socket: None,
            host: None,
            port: None,
            host_header: endpoint.host_header().to_owned(),
            url: String::new(),
            headers: endpoint.extra_headers().to_vec(),
            ca_pem: None,
            key,
        };
        match endpoint {
            Endpoint::Unix(path) => {
                let path = path.display().to_string();
                address.url = format!("http+unix://{}", path.replace('/', "%2F"));
                address.socket = Some(path);
            }
            Endpoint::Tcp { host, port } => {
                address.transport = "tcp";
                address.url = format!("http://{host}:{port}");
                address.host = Some(host.clone());
                address.port = Some(*port);
            }
            Endpoint::Http {
                host,
                port,
                host_header,
                ..
            } => {
                address.transport = "tcp";
                address.url = format!("http://{host_header}");
                address.host = Some(host.clone());
                address.port = Some(*port);
            }
            Endpoint::Tls {
                host, port, ca_pem, ..
            } => {
                address.transport = "tls";
                address.url = format!("https://{}", endpoint.host_header());
                address.host = Some(host.clone());
                address.port = Some(*port);
                address.ca_pem = ca_pem.as_ref().map(|p| p.display().to_string());
            }
        }
        address
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_socket_address_names_its_path_and_a_url_with_it_encoded() {
        let endpoint = Endpoint::Unix(PathBuf::from("/home/a/sandboxes/sbx-1/agent.sock"));
        let address = AgentAddress::new("sbx-1", &endpoint, "ab".repeat(32));
        assert_eq!(address.transport, "unix");
        assert_eq!(
            address.socket.as_deref(),
            Some("/home/a/sandboxes/sbx-1/agent.sock")
        );
        assert_eq!(
            address.url,
            "http+unix://%2Fhome%2Fa%2Fsandboxes%2Fsbx-1%2Fagent.sock"
        );
        assert_eq!(address.host_header, "agent");
        assert!(address.headers.is_empty() && address.host.is_none());
    }

    #[test]
    fn a_proxied_address_carries_its_route_headers_and_roots() {
        let endpoint = Endpoint::Tls {
            host: "127.0.0.1".into(),
            port: 4443,
            server_name: "49999-abc.e2b.test".into(),
            ca_pem: Some(PathBuf::from("/ca.pem")),
            headers: vec![("e2b-traffic-access-token".into(), "t".into())],
            host_header: None,
        };
        let address = AgentAddress::new("sbx-2", &endpoint, "cd".repeat(32));
        assert_eq!(address.transport, "tls");
        assert_eq!(
            (address.host.as_deref(), address.port),
            (Some("127.0.0.1"), Some(4443))
        );
        assert_eq!(address.host_header, "49999-abc.e2b.test");
        assert_eq!(address.url, "https://49999-abc.e2b.test");
        assert_eq!(address.ca_pem.as_deref(), Some("/ca.pem"));
        assert_eq!(
            address.headers,
            [("e2b-traffic-access-token".to_owned(), "t".to_owned())]
        );
    }
}
