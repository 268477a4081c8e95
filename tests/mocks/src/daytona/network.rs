//! A sandbox's outbound network rules: `networkBlockAll`,
//! `networkAllowList` (IPv4 CIDRs) and `domainAllowList` on create and on
//! `POST /sandbox/{idOrName}/network-settings`, checked as the API's
//! `validateNetworkAllowList` and `validateDomainAllowList` check them
//! (JavaScript's `parseInt` for a prefix included) and combined as its
//! `updateNetworkSettings` combines them.
//!
//! The rules are recorded and reported on the sandbox, not enforced:
//! blocking a container's egress would also cut the published ports the
//! preview proxy relays to.

use std::net::Ipv4Addr;

use serde_json::Value;

use super::store::{Record, Refusal};

/// Most entries in `networkAllowList` or `domainAllowList`.
const MAX_ALLOW_LIST: usize = 10;

/// What a network-settings update asks (`UpdateSandboxNetworkSettings`):
/// `None` for a field left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkSettings {
    /// Block all egress (`true` clears the CIDR list).
    pub block_all: Option<bool>,
    /// CIDRs; an empty or blank text clears the list.
    pub allow_list: Option<String>,
    /// Domains; an empty or blank text clears the list.
    pub domain_allow_list: Option<String>,
}

/// Reads an update body as the validation pipe and the controller do:
/// each field left out or of its type (`null` is not), then at least one.
pub fn parse_update(body: &Value) -> Result<NetworkSettings, Refusal> {
    let empty = serde_json::Map::new();
    let fields = match body {
        Value::Object(fields) => fields,
        Value::Null => &empty,
        _ => return Err(Refusal::bad("body must be a JSON object")),
    };
    let mut messages = Vec::new();
    let flag = |name: &str, messages: &mut Vec<String>| match fields.get(name) {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            messages.push(format!("{name} must be a boolean value"));
            None
        }
    };
    let text = |name: &str, messages: &mut Vec<String>| match fields.get(name) {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            messages.push(format!("{name} must be a string"));
            None
        }
    };
    let settings = NetworkSettings {
        block_all: flag("networkBlockAll", &mut messages),
        allow_list: text("networkAllowList", &mut messages),
        domain_allow_list: text("domainAllowList", &mut messages),
    };
    if !messages.is_empty() {
        return Err(Refusal::bad(messages.join(", ")));
    }
    if settings == NetworkSettings::default() {
        return Err(Refusal::bad(
            "At least one of networkBlockAll, networkAllowList or domainAllowList must be provided",
        ));
    }
    if let Some(list) = settings
        .domain_allow_list
        .as_deref()
        .filter(|l| !l.trim().is_empty())
    {
        check_domain_allow_list(list).map_err(Refusal::bad)?;
    }
    if let Some(list) = settings
        .allow_list
        .as_deref()
        .filter(|l| !l.trim().is_empty())
    {
        check_network_allow_list(list).map_err(Refusal::bad)?;
    }
    Ok(settings)
}

/// Applies an update as `updateNetworkSettings` does: a blank list clears
/// it; blocking all clears the CIDRs; a CIDR list unblocks; unblocking
/// without a list clears the CIDRs.
pub fn apply(record: &mut Record, update: &NetworkSettings) {
    if let Some(domains) = &update.domain_allow_list {
        record.domain_allow_list = (!domains.trim().is_empty()).then(|| domains.clone());
    }
    if let Some(block_all) = update.block_all {
        record.network_block_all = block_all;
        if block_all {
            record.network_allow_list = None;
        }
    }
    match &update.allow_list {
        Some(list) if list.trim().is_empty() => record.network_allow_list = None,
        Some(list) => {
            record.network_allow_list = Some(list.clone());
            record.network_block_all = false;
        }
        None if update.block_all == Some(false) => record.network_allow_list = None,
        None => {}
    }
}

/// The API's `validateNetworkAllowList`: IPv4 CIDRs, at most ten.
pub fn check_network_allow_list(list: &str) -> Result<(), String> {
    let networks: Vec<&str> = list.split(',').map(str::trim).collect();
    for network in networks.iter().filter(|n| !n.is_empty()) {
        let mut parts = network.split('/');
        let address = parts.next().unwrap_or_default();
        let prefix = parts.next().unwrap_or_default();
        if address.parse::<Ipv4Addr>().is_err() {
            return Err(format!(
                "Invalid IP address: \"{address}\" in network \"{network}\". Must be a valid IPv4 address"
            ));
        }
        if prefix.is_empty() {
            return Err(format!(
                "Invalid network format: \"{network}\". Missing CIDR prefix length (e.g., /24)"
            ));
        }
        // A prefix `parseInt` reads as no number passes, as it does there.
        if parse_int(prefix).is_some_and(|p| !(0..=32).contains(&p)) {
            return Err(format!(
                "Invalid CIDR prefix length: {network}. Prefix must be between 0 and 32"
            ));
        }
    }
    if networks.len() > MAX_ALLOW_LIST {
        return Err("Network allow list cannot contain more than 10 networks".to_owned());
    }
    Ok(())
}

/// The API's `validateDomainAllowList`: host names, optionally `*.`-prefixed, at most ten.
pub fn check_domain_allow_list(list: &str) -> Result<(), String> {
    let domains: Vec<&str> = list.split(',').map(str::trim).collect();
    for domain in domains.iter().filter(|d| !d.is_empty()) {
        if !is_domain(domain) {
            return Err(format!(
                "Invalid domain: \"{domain}\". Must be a valid domain name"
            ));
        }
    }
    if domains.len() > MAX_ALLOW_LIST {
        return Err("Domain allow list cannot contain more than 10 domains".to_owned());
    }
    Ok(())
}

/// JavaScript's `parseInt(text, 10)`: leading white space, a sign, then
/// the longest run of digits; `None` (NaN) without a digit.
fn parse_int(text: &str) -> Option<i64> {
    let text = text.trim_start();
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let run = digits.bytes().take_while(u8::is_ascii_digit).count();
    let value: i64 = digits[..run].parse().ok()?;
    Some(if negative { -value } else { value })
}

/// Labels of letters, digits and inner hyphens (up to 63), then a
/// top-level label of two or more letters.
fn is_domain(domain: &str) -> bool {
    let name = domain.strip_prefix("*.").unwrap_or(domain);
    let labels: Vec<&str> = name.split('.').collect();
    let Some((top, rest)) = labels.split_last() else {
        return false;
    };
    let label_ok = |label: &&str| {
        let bytes = label.as_bytes();
        (1..=63).contains(&bytes.len())
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
    };
    !rest.is_empty()
        && rest.iter().all(label_ok)
        && top.len() >= 2
        && top.bytes().all(|b| b.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn allow_lists_are_checked_as_the_api_checks_them() {
        assert!(check_network_allow_list("10.0.0.0/8, 192.168.1.0/24").is_ok());
        assert_eq!(
            check_network_allow_list("10.0.0.0").unwrap_err(),
            "Invalid network format: \"10.0.0.0\". Missing CIDR prefix length (e.g., /24)"
        );
        assert!(check_network_allow_list("10.0.0.0/33").is_err());
        assert!(check_network_allow_list("example.com/8").is_err());
        // parseInt reads a prefix's leading digits, and no digit as NaN, which passes.
        assert!(check_network_allow_list("10.0.0.0/24/7").is_ok());
        assert!(check_network_allow_list("10.0.0.0/8x").is_ok());
        assert!(check_network_allow_list("10.0.0.0/x").is_ok());
        assert!(check_network_allow_list("10.0.0.0/-1").is_err());
        let eleven = ["10.0.0.0/8"; 11].join(",");
        assert_eq!(
            check_network_allow_list(&eleven).unwrap_err(),
            "Network allow list cannot contain more than 10 networks"
        );
        assert!(check_domain_allow_list("*.daytona.io,pypi.org").is_ok());
        assert!(check_domain_allow_list("-bad.org").is_err());
        assert!(check_domain_allow_list("localhost").is_err());
    }

    #[test]
    fn updates_read_and_combine_as_the_api_does() {
        let refused = parse_update(&json!({})).unwrap_err();
        assert!(
            refused.message.starts_with("At least one of"),
            "{refused:?}"
        );
        let typed = parse_update(&json!({"networkBlockAll": null, "networkAllowList": 3}));
        assert_eq!(
            typed.unwrap_err().message,
            "networkBlockAll must be a boolean value, networkAllowList must be a string"
        );
        assert!(parse_update(&json!({"networkAllowList": "nope"})).is_err());
        let clear = parse_update(&json!({"networkAllowList": " "})).unwrap();
        assert_eq!(clear.allow_list.as_deref(), Some(" "));
        assert_eq!(parse_int(" 24abc"), Some(24));
        assert_eq!(parse_int("abc"), None);
    }
}
