//! Where Daytona is and how to reach it, from the variables Daytona's own
//! SDKs read (`DAYTONA_API_KEY`, `DAYTONA_API_URL`, `DAYTONA_TARGET`) plus
//! silo's for reaching its proxies another way (a test proxy on loopback
//! with its own CA).

use std::path::PathBuf;

use crate::backend::remote::parse_host_port;

/// The API key (`Authorization: Bearer`).
pub const ENV_API_KEY: &str = "DAYTONA_API_KEY";
/// The control plane's URL.
pub const ENV_API_URL: &str = "DAYTONA_API_URL";
/// The target (region) sandboxes are made in; Daytona's default if unset.
pub const ENV_TARGET: &str = "DAYTONA_TARGET";
/// Where to connect for any preview or toolbox host (`HOST:PORT`).
pub const ENV_PROXY: &str = "SILO_DAYTONA_PROXY_ADDR";
/// A PEM file of the CA to trust for the proxies (instead of the system's).
pub const ENV_CA: &str = "SILO_DAYTONA_CA_PEM";
/// Minutes of inactivity after which Daytona stops a sandbox.
pub const ENV_AUTO_STOP: &str = "SILO_DAYTONA_AUTO_STOP";
/// Daytona's hosted control plane.
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";
/// Minutes of inactivity before Daytona stops a sandbox unless configured:
/// an hour, as E2B's timeout. Activity is what Daytona sees (its toolbox and
/// proxy), so a sandbox used only through the agent counts as used.
pub const DEFAULT_AUTO_STOP_MINUTES: u32 = 60;

/// The Daytona settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaytonaConfig {
    /// The API key; checked when first needed, so a home without Daytona
    /// settings still opens.
    pub api_key: Option<String>,
    /// The control plane.
    pub api_url: String,
    /// The target (region), when set.
    pub target: Option<String>,
    /// Where to connect for the proxies' hosts instead of their names.
    pub proxy: Option<(String, u16)>,
    /// The CA to trust for the proxies.
    pub ca_pem: Option<PathBuf>,
    /// Minutes of inactivity before a stop (0: never).
    pub auto_stop_minutes: u32,
}

impl DaytonaConfig {
    /// The settings in the environment.
    pub fn from_env() -> Result<Self, DaytonaConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// The settings `lookup` gives (tests, and libraries with their own
    /// configuration).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, DaytonaConfigError> {
        let proxy = match lookup(ENV_PROXY) {
            None => None,
            Some(text) => Some(parse_host_port(&text).ok_or(DaytonaConfigError::Proxy(text))?),
        };
        let auto_stop_minutes = match lookup(ENV_AUTO_STOP) {
            None => DEFAULT_AUTO_STOP_MINUTES,
            Some(text) => text
                .parse::<u32>()
                .map_err(|_| DaytonaConfigError::AutoStop(text))?,
        };
        Ok(Self {
            api_key: lookup(ENV_API_KEY),
            api_url: lookup(ENV_API_URL).unwrap_or_else(|| DEFAULT_API_URL.to_owned()),
            target: lookup(ENV_TARGET),
            proxy,
            ca_pem: lookup(ENV_CA).map(PathBuf::from),
            auto_stop_minutes,
        })
    }

    /// The API key, or why there is none.
    pub fn api_key(&self) -> Result<&str, DaytonaConfigError> {
        self.api_key.as_deref().ok_or(DaytonaConfigError::NoApiKey)
    }
}

/// Why the Daytona settings cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DaytonaConfigError {
    /// No API key.
    #[error("{ENV_API_KEY} is not set: Daytona needs an API key (from the Daytona dashboard)")]
    NoApiKey,
    /// The proxy address is not `HOST:PORT`.
    #[error("{ENV_PROXY}={0:?} is not HOST:PORT")]
    Proxy(String),
    /// The auto-stop interval is not a number of minutes.
    #[error("{ENV_AUTO_STOP}={0:?} is not a number of minutes (0 never stops)")]
    AutoStop(String),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<DaytonaConfig, DaytonaConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        DaytonaConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_follow_daytona_and_overrides_are_checked() {
        let plain = config(&[]).unwrap();
        assert_eq!(plain.api_url, DEFAULT_API_URL);
        assert_eq!(plain.api_key(), Err(DaytonaConfigError::NoApiKey));
        assert_eq!(plain.auto_stop_minutes, 60);
        let test = config(&[
            (ENV_API_KEY, "dtn_x"),
            (ENV_API_URL, "http://127.0.0.1:3000/api"),
            (ENV_TARGET, "eu"),
            (ENV_PROXY, "127.0.0.1:8443"),
            (ENV_AUTO_STOP, "0"),
        ])
        .unwrap();
        assert_eq!(test.api_key().unwrap(), "dtn_x");
        assert_eq!(test.target.as_deref(), Some("eu"));
        assert_eq!(test.proxy, Some(("127.0.0.1".into(), 8443)));
        assert_eq!(test.auto_stop_minutes, 0);
        assert_eq!(
            config(&[(ENV_PROXY, "nope")]),
            Err(DaytonaConfigError::Proxy("nope".into()))
        );
        assert_eq!(
            config(&[(ENV_AUTO_STOP, "soon")]),
            Err(DaytonaConfigError::AutoStop("soon".into()))
        );
    }
}
