//! Where E2B is and how to reach it, from the environment variables E2B's
//! own SDKs read (`E2B_API_KEY`, `E2B_DOMAIN`, `E2B_API_URL`) plus silo's
//! for reaching the sandbox proxy a different way (a test proxy on loopback
//! with its own CA).

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::remote::{connect_to, parse_host_port, tls_route};
use crate::client::Endpoint;

/// The API key.
pub const ENV_API_KEY: &str = "E2B_API_KEY";
/// The sandbox domain (`e2b.app` by default).
pub const ENV_DOMAIN: &str = "E2B_DOMAIN";
/// The control plane's URL (`https://api.{domain}` by default).
pub const ENV_API_URL: &str = "E2B_API_URL";
/// `HOST:PORT` to connect to for every sandbox host instead of resolving
/// `{port}-{id}.{domain}` (the name still goes in SNI and `Host`).
pub const ENV_PROXY: &str = "SILO_E2B_PROXY_ADDR";
/// A PEM file of the roots to trust for the API and the proxy instead of
/// the system's.
pub const ENV_CA: &str = "SILO_E2B_CA_PEM";
/// Seconds a sandbox lives without silo touching it before E2B pauses it.
pub const ENV_TIMEOUT: &str = "SILO_E2B_TIMEOUT";
/// E2B's own domain.
pub const DEFAULT_DOMAIN: &str = "e2b.app";
/// The template when a spec names none: E2B's stock one.
pub const DEFAULT_TEMPLATE: &str = "base";
/// How long a sandbox lives between silo's touches: E2B kills (or, with
/// auto-pause, pauses) a sandbox when its timeout passes, and every `up`
/// and start pushes it out again.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// How to reach E2B.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bConfig {
    /// The API key; `None` until one is set, and then every call says so.
    pub api_key: Option<String>,
    /// The sandbox domain.
    pub domain: String,
    /// The control plane's URL.
    pub api_url: String,
    /// Where to connect for sandbox hosts, when not by their names.
    pub proxy: Option<(String, u16)>,
    /// Roots to trust instead of the system's.
    pub ca_pem: Option<PathBuf>,
    /// A sandbox's timeout, renewed on every start.
    pub timeout: Duration,
}

impl E2bConfig {
    /// The configuration the environment describes.
    pub fn from_env() -> Result<Self, E2bConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// The configuration `lookup` describes (the environment, in tests a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, E2bConfigError> {
        let domain = lookup(ENV_DOMAIN).unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
        let api_url = lookup(ENV_API_URL).unwrap_or_else(|| format!("https://api.{domain}"));
        let proxy = match lookup(ENV_PROXY) {
            None => None,
            Some(text) => Some(parse_host_port(&text).ok_or(E2bConfigError::Proxy(text))?),
        };
        let timeout = match lookup(ENV_TIMEOUT) {
            None => DEFAULT_TIMEOUT,
            Some(text) => match text.parse::<u64>() {
                Ok(secs) if secs > 0 => Duration::from_secs(secs),
                _ => return Err(E2bConfigError::Timeout(text)),
            },
        };
        Ok(Self {
            api_key: lookup(ENV_API_KEY),
            domain,
            api_url,
            proxy,
            ca_pem: lookup(ENV_CA).map(PathBuf::from),
            timeout,
        })
    }

    /// The key, or the error that says how to set one.
    pub fn api_key(&self) -> Result<&str, E2bConfigError> {
        self.api_key.as_deref().ok_or(E2bConfigError::NoApiKey)
    }

    /// The host name of `port` of sandbox `id`, as E2B's proxy routes it.
    pub fn sandbox_host(&self, port: u16, id: &str, domain: Option<&str>) -> String {
        format!("{port}-{id}.{}", domain.unwrap_or(&self.domain))
    }

    /// Where to connect for `host` (port 443 of the name itself, unless a
    /// proxy address is set).
    pub fn connect_to(&self, host: &str) -> (String, u16) {
        connect_to(self.proxy.as_ref(), host)
    }
}

impl E2bConfig {
    /// The route through E2B's proxy to `port` of sandbox `id`, carrying
    /// `headers` (an access token) on every request.
    pub fn route(
        &self,
        port: u16,
        id: &str,
        domain: Option<&str>,
        headers: Vec<(String, String)>,
    ) -> Endpoint {
        let server_name = self.sandbox_host(port, id, domain);
        tls_route(
            server_name,
            self.proxy.as_ref(),
            self.ca_pem.clone(),
            headers,
        )
    }
}

/// What is wrong with the E2B configuration.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum E2bConfigError {
    /// No API key.
    #[error("{ENV_API_KEY} is not set: E2B needs an API key (from the E2B dashboard, e2b_…)")]
    NoApiKey,
    /// The proxy address is not `HOST:PORT`.
    #[error("{ENV_PROXY}={0:?} is not HOST:PORT")]
    Proxy(String),
    /// The timeout is not a positive number of seconds.
    #[error("{ENV_TIMEOUT}={0:?} is not a positive number of seconds")]
    Timeout(String),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<E2bConfig, E2bConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        E2bConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_follow_e2b_and_overrides_are_checked() {
        let plain = config(&[]).unwrap();
        assert_eq!(plain.api_url, "https://api.e2b.app");
        assert_eq!(plain.api_key(), Err(E2bConfigError::NoApiKey));
        assert_eq!(
            plain.sandbox_host(49999, "iabc", None),
            "49999-iabc.e2b.app"
        );
        assert_eq!(
            plain.connect_to("49999-iabc.e2b.app"),
            ("49999-iabc.e2b.app".into(), 443)
        );

        let test = config(&[
            (ENV_API_KEY, "e2b_x"),
            (ENV_DOMAIN, "e2b.test"),
            (ENV_PROXY, "127.0.0.1:8443"),
            (ENV_TIMEOUT, "60"),
        ])
        .unwrap();
        assert_eq!(test.api_url, "https://api.e2b.test");
        assert_eq!(test.connect_to("whatever"), ("127.0.0.1".into(), 8443));
        assert_eq!(test.timeout, Duration::from_secs(60));

        assert_eq!(
            config(&[(ENV_PROXY, "nope")]),
            Err(E2bConfigError::Proxy("nope".into()))
        );
        assert!(matches!(
            config(&[(ENV_TIMEOUT, "0")]),
            Err(E2bConfigError::Timeout(_))
        ));
    }
}
