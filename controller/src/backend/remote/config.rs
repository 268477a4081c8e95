//! [`ProviderConfig`]: where a provider is and how to reach it, read once
//! from the environment the same way for every provider (its API's URL and
//! key, the CA to trust, the address of a test proxy), with what only that
//! provider has ([`Settings`]) beside it; and [`ProviderConfigError`], what
//! is wrong with it, naming the provider's own variables.

use std::path::PathBuf;

use super::parse_host_port;

/// The names a provider's configuration is read from, and what its
/// messages call it.
#[derive(Debug, PartialEq, Eq)]
pub struct Env {
    /// The provider as people know it.
    pub provider: &'static str,
    /// The variable of the API key.
    pub api_key: &'static str,
    /// Where a key comes from, told when none is set.
    pub key_from: &'static str,
    /// The variable of the control plane's URL.
    pub api_url: &'static str,
    /// The variable of `HOST:PORT` to connect to for every host behind the
    /// provider's proxies instead of resolving its name (the name still
    /// goes in SNI and `Host`).
    pub proxy: &'static str,
    /// The variable of a PEM file of the roots to trust for the API and
    /// the proxies instead of the system's.
    pub ca: &'static str,
}

/// What only one provider's configuration has, and how it is read.
pub trait Settings: Sized {
    /// The provider's variables.
    const ENV: Env;

    /// Its own settings from `lookup` (the environment, in tests a map).
    fn read(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ProviderConfigError>;

    /// The control plane's URL when its variable is not set.
    fn default_api_url(&self) -> String;
}

/// How to reach a provider: what every provider has, and `own`, what only
/// this one has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig<S> {
    /// The API key; `None` until one is set, and then every call says so,
    /// so a home without the provider's settings still opens.
    pub api_key: Option<String>,
    /// The control plane's URL.
    pub api_url: String,
    /// Where to connect for hosts behind the provider's proxies, when not
    /// by their names.
    pub proxy: Option<(String, u16)>,
    /// Roots to trust instead of the system's.
    pub ca_pem: Option<PathBuf>,
    /// The provider's own settings.
    pub own: S,
}

impl<S: Settings> ProviderConfig<S> {
    /// The configuration the environment describes (a blank variable is
    /// an unset one).
    pub fn from_env() -> Result<Self, ProviderConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// The configuration `lookup` describes (the environment, in tests a
    /// map, a library with its own configuration).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ProviderConfigError> {
        let own = S::read(&lookup)?;
        let proxy = match lookup(S::ENV.proxy) {
            None => None,
            Some(text) => Some(parse_host_port(&text).ok_or(ProviderConfigError::Proxy {
                var: S::ENV.proxy,
                value: text,
            })?),
        };
        Ok(Self {
            api_key: lookup(S::ENV.api_key),
            api_url: lookup(S::ENV.api_url).unwrap_or_else(|| own.default_api_url()),
            proxy,
            ca_pem: lookup(S::ENV.ca).map(PathBuf::from),
            own,
        })
    }

    /// The key, or the error that says how to set one.
    pub fn api_key(&self) -> Result<&str, ProviderConfigError> {
        self.api_key
            .as_deref()
            .ok_or(ProviderConfigError::NoApiKey {
                var: S::ENV.api_key,
                provider: S::ENV.provider,
                from: S::ENV.key_from,
            })
    }
}

/// The whole number in variable `var` (a timeout's seconds or minutes), at
/// least `least`; `None` when it is not set. `expected` says what it should
/// be, for the error.
pub fn whole_number(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
    least: u64,
    expected: &'static str,
) -> Result<Option<u64>, ProviderConfigError> {
    let Some(text) = lookup(var) else {
        return Ok(None);
    };
    match text.parse::<u64>() {
        Ok(number) if number >= least => Ok(Some(number)),
        _ => Err(ProviderConfigError::Number {
            var,
            value: text,
            expected,
        }),
    }
}

/// What is wrong with a provider's configuration.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ProviderConfigError {
    /// No API key.
    #[error("{var} is not set: {provider} needs an API key ({from})")]
    NoApiKey {
        /// The key's variable.
        var: &'static str,
        /// The provider, as people know it.
        provider: &'static str,
        /// Where a key comes from.
        from: &'static str,
    },
    /// The proxy address is not `HOST:PORT`.
    #[error("{var}={value:?} is not HOST:PORT")]
    Proxy {
        /// The variable.
        var: &'static str,
        /// What it says.
        value: String,
    },
    /// A number (a timeout) is not one, or too small.
    #[error("{var}={value:?} is not {expected}")]
    Number {
        /// The variable.
        var: &'static str,
        /// What it says.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::collections::HashMap;

    /// A lookup of `vars`, as the environment would answer.
    pub(crate) fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn a_number_is_read_whole_and_checked() {
        let vars = lookup(&[("N", "60"), ("Z", "0"), ("X", "soon")]);
        assert_eq!(whole_number(&vars, "N", 1, "n"), Ok(Some(60)));
        assert_eq!(whole_number(&vars, "UNSET", 1, "n"), Ok(None));
        assert_eq!(whole_number(&vars, "Z", 0, "n"), Ok(Some(0)));
        let error = whole_number(&vars, "Z", 1, "a positive number of seconds").unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"Z="0" is not a positive number of seconds"#
        );
        assert!(whole_number(&vars, "X", 0, "n").is_err());
    }
}
