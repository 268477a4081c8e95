//! Where Daytona is and how to reach it ([`DaytonaConfig`]: the
//! configuration every provider has, with Daytona's own
//! [`DaytonaSettings`]), from the variables Daytona's own SDKs read
//! (`DAYTONA_API_KEY`, `DAYTONA_API_URL`, `DAYTONA_TARGET`) plus silo's for
//! reaching its proxies another way (a test proxy on loopback with its own
//! CA) and for its auto-stop.

use crate::backend::remote::config::{
    Env, ProviderConfig, ProviderConfigError, Settings, whole_number,
};

/// The provider, as people know it.
pub const NAME: &str = "Daytona";
/// The API key (`Authorization: Bearer`).
pub const ENV_API_KEY: &str = "DAYTONA_API_KEY";
/// The control plane's URL.
pub const ENV_API_URL: &str = "DAYTONA_API_URL";
/// The target (region) sandboxes are made in; Daytona's default if unset.
pub const ENV_TARGET: &str = "DAYTONA_TARGET";
/// Where to connect for any preview or toolbox host (`HOST:PORT`).
pub const ENV_PROXY: &str = "SILO_DAYTONA_PROXY_ADDR";
/// A PEM file of the CA to trust for the API and the proxies (instead of
/// the system's).
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
pub type DaytonaConfig = ProviderConfig<DaytonaSettings>;

/// What only Daytona's configuration has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaytonaSettings {
    /// The target (region), when set.
    pub target: Option<String>,
    /// Minutes of inactivity before a stop (0: never).
    pub auto_stop_minutes: u32,
}

impl Settings for DaytonaSettings {
    const ENV: Env = Env {
        provider: NAME,
        api_key: ENV_API_KEY,
        key_from: "from the Daytona dashboard",
        api_url: ENV_API_URL,
        proxy: ENV_PROXY,
        ca: ENV_CA,
    };

    fn read(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ProviderConfigError> {
        const EXPECTED: &str = "a number of minutes (0 never stops)";
        let auto_stop_minutes = match whole_number(lookup, ENV_AUTO_STOP, 0, EXPECTED)? {
            None => DEFAULT_AUTO_STOP_MINUTES,
            // The API takes a 32-bit number.
            Some(minutes) => u32::try_from(minutes).map_err(|_| ProviderConfigError::Number {
                var: ENV_AUTO_STOP,
                value: minutes.to_string(),
                expected: EXPECTED,
            })?,
        };
        Ok(Self {
            target: lookup(ENV_TARGET),
            auto_stop_minutes,
        })
    }

    fn default_api_url(&self) -> String {
        DEFAULT_API_URL.to_owned()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::backend::remote::config::tests::lookup;

    fn config(vars: &[(&str, &str)]) -> Result<DaytonaConfig, ProviderConfigError> {
        DaytonaConfig::from_lookup(lookup(vars))
    }

    #[test]
    fn defaults_follow_daytona_and_overrides_are_checked() {
        let plain = config(&[]).unwrap();
        assert_eq!(plain.api_url, DEFAULT_API_URL);
        assert_eq!(
            plain.api_key().unwrap_err().to_string(),
            "DAYTONA_API_KEY is not set: Daytona needs an API key (from the Daytona dashboard)"
        );
        assert_eq!(plain.own.auto_stop_minutes, 60);
        let test = config(&[
            (ENV_API_KEY, "dtn_x"),
            (ENV_API_URL, "http://127.0.0.1:3000/api"),
            (ENV_TARGET, "eu"),
            (ENV_PROXY, "127.0.0.1:8443"),
            (ENV_AUTO_STOP, "0"),
        ])
        .unwrap();
        assert_eq!(test.api_key().unwrap(), "dtn_x");
        assert_eq!(test.own.target.as_deref(), Some("eu"));
        assert_eq!(test.proxy, Some(("127.0.0.1".into(), 8443)));
        assert_eq!(test.own.auto_stop_minutes, 0);
        assert_eq!(
            config(&[(ENV_PROXY, "nope")]).unwrap_err().to_string(),
            r#"SILO_DAYTONA_PROXY_ADDR="nope" is not HOST:PORT"#
        );
        assert_eq!(
            config(&[(ENV_AUTO_STOP, "soon")]).unwrap_err().to_string(),
            r#"SILO_DAYTONA_AUTO_STOP="soon" is not a number of minutes (0 never stops)"#
        );
        assert!(config(&[(ENV_AUTO_STOP, "4294967296")]).is_err());
    }
}
