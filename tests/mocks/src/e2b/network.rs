//! A sandbox's egress rules: `network.allowOut`/`denyOut` and
//! `allow_internet_access` on create, and `PUT /sandboxes/{id}/network`,
//! checked as the API's `validateEgressRules` checks them (a denied entry
//! is an IP or CIDR, an allowed one an IP, a CIDR or a domain, an
//! unspecified address is refused but for `0.0.0.0/0`, and a domain in
//! `allowOut` needs `0.0.0.0/0` in `denyOut`). Transform rules are refused
//! as for a team without them, an egress proxy as for a team without it.
//!
//! The rules are recorded and reported (`SandboxDetail.network`,
//! `allowInternetAccess`), not enforced: blocking a container's egress
//! would cut the published ports the proxy relays to as well.

use std::net::IpAddr;

use http::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::model::NetworkUpdate;
use super::store::Refusal;

/// The CIDR meaning all of the internet.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";
/// The API's message for a domain allowed without blocking the rest.
const DOMAINS_NEED_BLOCK_ALL: &str = "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.";
/// The API's message for transform rules a team does not have.
const RULES_UNAVAILABLE: &str = "Network transform rules are not available for your team.";
/// The fields of `SandboxNetworkConfig` a network update replaces.
const EGRESS_FIELDS: [&str; 5] = ["allowOut", "denyOut", "dnsServers", "egressProxy", "rules"];

/// The egress fields of a create's `network`, typed as the API reads them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Egress {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    egress_proxy: Option<Value>,
    rules: Option<Value>,
    allow_public_traffic: Option<bool>,
}

/// Checks a create's `network`; whether it asks for private traffic.
pub fn check_create(network: &Value) -> Result<bool, Refusal> {
    let egress: Egress = serde_json::from_value(network.clone()).map_err(|e| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("Error when parsing request: {e}"),
        )
    })?;
    check_egress(
        egress.allow_out.as_deref().unwrap_or_default(),
        egress.deny_out.as_deref().unwrap_or_default(),
    )?;
    if egress.rules.is_some_and(|r| !r.is_null()) {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, RULES_UNAVAILABLE));
    }
    if egress.egress_proxy.is_some_and(|p| !p.is_null()) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "Egress proxy (network.egressProxy) is not enabled for this team.",
        ));
    }
    Ok(egress.allow_public_traffic == Some(false))
}

/// Checks a network update before the sandbox is looked up (rules are
/// refused after, as the API needs the sandbox's envd version for them).
pub fn check_update(update: &NetworkUpdate) -> Result<(), Refusal> {
    check_egress(
        update.allow_out.as_deref().unwrap_or_default(),
        update.deny_out.as_deref().unwrap_or_default(),
    )?;
    if update.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "Egress proxy (egressProxy) is not enabled for this team.",
        ));
    }
    Ok(())
}

/// The refusal of an update's transform rules, if it has any.
pub fn refuse_rules(update: &NetworkUpdate) -> Result<(), Refusal> {
    match &update.rules {
        Some(rules) if !rules.is_null() => {
            Err(Refusal::new(StatusCode::BAD_REQUEST, RULES_UNAVAILABLE))
        }
        _ => Ok(()),
    }
}

/// A sandbox's `network` after `update`: its egress fields replaced
/// whole, its ingress fields (`allowPublicTraffic`, `maskRequestHost`,
/// `httpsPorts`) kept.
pub fn apply(network: Option<&Value>, update: &NetworkUpdate) -> Value {
    let mut fields = network
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_else(Map::new);
    for field in EGRESS_FIELDS {
        fields.remove(field);
    }
    let lists = [
        ("allowOut", &update.allow_out),
        ("denyOut", &update.deny_out),
        ("dnsServers", &update.dns_servers),
    ];
    for (field, list) in lists {
        if let Some(list) = list {
            fields.insert(field.to_owned(), Value::from(list.clone()));
        }
    }
    Value::Object(fields)
}

/// `validateEgressRules`.
fn check_egress(allow_out: &[String], deny_out: &[String]) -> Result<(), Refusal> {
    let bad = |message: String| Refusal::new(StatusCode::BAD_REQUEST, message);
    if let Some(denied) = deny_out.iter().find(|e| !is_specified_ip_or_cidr(e)) {
        return Err(bad(format!("invalid denied CIDR {denied}")));
    }
    let (addresses, domains): (Vec<&String>, Vec<&String>) =
        allow_out.iter().partition(|e| is_ip_or_cidr(e));
    if let Some(address) = addresses.iter().find(|a| !is_specified_ip_or_cidr(a)) {
        return Err(bad(format!("invalid allowed address {address}")));
    }
    if !domains.is_empty() && !deny_out.iter().any(|d| d == ALL_TRAFFIC) {
        return Err(bad(DOMAINS_NEED_BLOCK_ALL.to_owned()));
    }
    Ok(())
}

/// Go's `net.ParseIP(s) != nil || net.ParseCIDR(s) succeeds`.
fn is_ip_or_cidr(entry: &str) -> bool {
    address_of(entry).is_some()
}

/// An IP or CIDR whose address is not `0.0.0.0` or `::`, or exactly `0.0.0.0/0`.
fn is_specified_ip_or_cidr(entry: &str) -> bool {
    entry == ALL_TRAFFIC || address_of(entry).is_some_and(|ip| !ip.is_unspecified())
}

/// The address of an IP or a CIDR (prefix within the address's width).
fn address_of(entry: &str) -> Option<IpAddr> {
    let (address, prefix) = match entry.split_once('/') {
        Some((address, prefix)) => (address, Some(prefix)),
        None => (entry, None),
    };
    let ip: IpAddr = address.parse().ok()?;
    if let Some(prefix) = prefix {
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let valid = !prefix.is_empty()
            && prefix.bytes().all(|b| b.is_ascii_digit())
            && prefix.parse::<u32>().is_ok_and(|p| p <= width);
        if !valid {
            return None;
        }
    }
    Some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn egress_rules_are_checked_as_the_api_checks_them() {
        let ok = |allow: &[&str], deny: &[&str]| check_egress(&strings(allow), &strings(deny));
        assert!(ok(&["1.1.1.1", "8.8.8.0/24"], &["10.0.0.0/8"]).is_ok());
        assert!(ok(&["example.com"], &[ALL_TRAFFIC]).is_ok());
        assert!(ok(&[], &[ALL_TRAFFIC, "::1"]).is_ok());
        let message = |allow: &[&str], deny: &[&str]| ok(allow, deny).unwrap_err().message;
        assert_eq!(
            message(&[], &["example.com"]),
            "invalid denied CIDR example.com"
        );
        assert_eq!(message(&[], &["0.0.0.0"]), "invalid denied CIDR 0.0.0.0");
        assert_eq!(
            message(&[], &["1.2.3.4/33"]),
            "invalid denied CIDR 1.2.3.4/33"
        );
        assert_eq!(
            message(&["0.0.0.0/8"], &[]),
            "invalid allowed address 0.0.0.0/8"
        );
        assert_eq!(
            message(&["example.com"], &["8.8.8.8"]),
            DOMAINS_NEED_BLOCK_ALL
        );
    }

    #[test]
    fn creates_refuse_rules_and_proxies_and_report_private_traffic() {
        assert_eq!(
            check_create(&json!({"allowPublicTraffic": false})),
            Ok(true)
        );
        assert_eq!(check_create(&json!({"denyOut": [ALL_TRAFFIC]})), Ok(false));
        let rules = check_create(&json!({"rules": {"a.com": []}})).unwrap_err();
        assert_eq!(rules.message, RULES_UNAVAILABLE);
        let proxy = check_create(&json!({"egressProxy": {"address": "p:1080"}})).unwrap_err();
        assert_eq!(proxy.status, StatusCode::FORBIDDEN);
        let typed = check_create(&json!({"allowOut": "1.1.1.1"})).unwrap_err();
        assert!(
            typed.message.starts_with("Error when parsing request"),
            "{typed:?}"
        );
    }

    #[test]
    fn updates_replace_egress_and_keep_ingress() {
        let before =
            json!({"allowPublicTraffic": false, "allowOut": ["1.1.1.1"], "dnsServers": []});
        let update = NetworkUpdate {
            deny_out: Some(strings(&[ALL_TRAFFIC])),
            ..NetworkUpdate::default()
        };
        assert_eq!(
            apply(Some(&before), &update),
            json!({"allowPublicTraffic": false, "denyOut": [ALL_TRAFFIC]})
        );
        assert_eq!(apply(None, &NetworkUpdate::default()), json!({}));
    }
}
