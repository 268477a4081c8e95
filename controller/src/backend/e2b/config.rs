//! Where E2B is and how to reach it ([`E2bConfig`]: the configuration
//! every provider has, with E2B's own [`E2bSettings`]), from the environment
//! variables E2B's own SDKs read (`E2B_API_KEY`, `E2B_DOMAIN`,
//! `E2B_API_URL`) plus silo's for reaching the sandbox proxy a different way
//! (a test proxy on loopback with its own CA) and for a sandbox's timeout.

use std::time::Duration;

use crate::backend::remote::config::{
    Env, ProviderConfig, ProviderConfigError, Settings, whole_number,
};
use crate::backend::remote::{connect_to, tls_route};
use crate::client::Endpoint;

/// The provider, as people know it.
pub const NAME: &str = "E2B";
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
pub type E2bConfig = ProviderConfig<E2bSettings>;

/// What only E2B's configuration has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSettings {
    /// The sandbox domain.
    pub domain: String,
    /// A sandbox's timeout, renewed on every start.
    pub timeout: Duration,
}

impl Settings for E2bSettings {
    const ENV: Env = Env {
        provider: NAME,
        api_key: ENV_API_KEY,
        key_from: "from the E2B dashboard, e2b_…",
        api_url: ENV_API_URL,
        proxy: ENV_PROXY,
        ca: ENV_CA,
    };

    fn read(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ProviderConfigError> {
        let timeout = whole_number(lookup, ENV_TIMEOUT, 1, "a positive number of seconds")?;
        Ok(Self {
            domain: lookup(ENV_DOMAIN).unwrap_or_else(|| DEFAULT_DOMAIN.to_owned()),
            timeout: timeout.map_or(DEFAULT_TIMEOUT, Duration::from_secs),
        })
    }

    fn default_api_url(&self) -> String {
        format!("https://api.{}", self.domain)
    }
}

impl E2bConfig {
    /// The host name of `port` of sandbox `id`, as E2B's proxy routes it.
    pub fn sandbox_host(&self, port: u16, id: &str, domain: Option<&str>) -> String {
        format!("{port}-{id}.{}", domain.unwrap_or(&self.own.domain))
    }

    /// Where to connect for `host` (port 443 of the name itself, unless a
    /// proxy address is set).
    pub fn connect_to(&self, host: &str) -> (String, u16) {
        connect_to(self.proxy.as_ref(), host)
    }

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::backend::remote::config::tests::lookup;

    fn config(vars: &[(&str, &str)]) -> Result<E2bConfig, ProviderConfigError> {
        E2bConfig::from_lookup(lookup(vars))
    }

    #[test]
    fn defaults_follow_e2b_and_overrides_are_checked() {
        let plain = config(&[]).unwrap();
        assert_eq!(plain.api_url, "https://api.e2b.app");
        assert_eq!(
            plain.api_key().unwrap_err().to_string(),
            "E2B_API_KEY is not set: E2B needs an API key (from the E2B dashboard, e2b_…)"
        );
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
        assert_eq!(test.own.timeout, Duration::from_secs(60));

        assert_eq!(
            config(&[(ENV_PROXY, "nope")]).unwrap_err().to_string(),
            r#"SILO_E2B_PROXY_ADDR="nope" is not HOST:PORT"#
        );
        assert_eq!(
            config(&[(ENV_TIMEOUT, "0")]).unwrap_err().to_string(),
            r#"SILO_E2B_TIMEOUT="0" is not a positive number of seconds"#
        );
    }
}
