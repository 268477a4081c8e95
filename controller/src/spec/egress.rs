//! Outbound rules, enforced by the provider's own firewall. An allow-list
//! (`--allow-out`): the destinations a sandbox's outbound traffic may
//! reach, everything else blocked (E2B's `allowOut` over `denyOut:
//! 0.0.0.0/0`, Daytona's `networkAllowList` and `domainAllowList`). A deny
//! list (`--deny-out`, E2B only): the blocks it may not reach, everything
//! else open; beside a deny list, `--allow-out` names the exceptions to it,
//! as E2B's allowed entries win over denied ones. An allowed destination
//! is an IPv4 address, an IPv4 CIDR block or a host name (`*.` for its
//! subdomains), as both providers take them; a denied one an address or a
//! block, as E2B takes them. The checks here are the ones the providers
//! apply, so a bad entry is refused before anything is made.

/// Most characters of a host name (DNS's limit).
const MAX_HOST_LEN: usize = 253;
/// Most characters of one label of a host name.
const MAX_LABEL_LEN: usize = 63;
/// Every IPv4 destination, as a block.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// One destination of an allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// An IPv4 block, as `a.b.c.d/n` (a bare address is `/32`).
    Cidr(String),
    /// A host name, lowercase, perhaps `*.` for every subdomain.
    Host(String),
}

impl Destination {
    /// Reads one `--allow-out` entry; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        match Self::read(text)? {
            Self::Cidr(all) if all == ALL_TRAFFIC => Err(format!(
                "{:?} allows every address; leave --allow-out out instead",
                text.trim()
            )),
            destination => Ok(destination),
        }
    }

    /// Reads one `--deny-out` entry, an address or a block (`0.0.0.0/0`
    /// for every one): the providers deny no host names.
    pub fn parse_denied(text: &str) -> Result<String, String> {
        match Self::read(text)? {
            Self::Cidr(block) => Ok(block),
            Self::Host(_) => Err(format!(
                "{:?}: a host name cannot be denied; deny rules are IPv4 addresses and blocks",
                text.trim()
            )),
        }
    }

    /// An address, a block (any prefix) or a host name.
    fn read(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("an empty destination".into());
        }
        if text.contains(':') {
            return Err(format!(
                "{text:?}: IPv6 (and ports) cannot be given; the providers' rules are \
                 IPv4 addresses, CIDR blocks and host names"
            ));
        }
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        if let Ok(ip) = address.parse::<std::net::Ipv4Addr>() {
            let bits = match prefix {
                None => 32,
                Some(prefix) => prefix
                    .parse::<u8>()
                    .ok()
                    .filter(|bits| *bits <= 32)
                    .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to 32"))?,
            };
            if ip.is_unspecified() && bits != 0 {
                // E2B refuses it: only 0.0.0.0/0 may name that address.
                return Err(format!(
                    "{text:?}: 0.0.0.0 names no destination (0.0.0.0/0 is every one)"
                ));
            }
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            if u32::from(ip) & !mask != 0 {
                return Err(format!(
                    "{text:?}: address bits are set past the /{bits} prefix"
                ));
            }
            return Ok(Self::Cidr(format!("{ip}/{bits}")));
        }
        if prefix.is_some() || address.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(format!(
                "{text:?} is neither an IPv4 address or block nor a host name"
            ));
        }
        check_host(text).map(Self::Host)
    }

    /// The destination as the providers take it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Cidr(text) | Self::Host(text) => text,
        }
    }
}

/// A host name, lowercased, with an optional leading `*.`.
fn check_host(text: &str) -> Result<String, String> {
    let host = text.to_ascii_lowercase();
    let bare = host.strip_prefix("*.").unwrap_or(&host);
    let bad = |why: &str| Err(format!("{text:?} is not a host name: {why}"));
    if bare.len() > MAX_HOST_LEN {
        return bad("longer than 253 characters");
    }
    if !bare.contains('.') {
        return bad("it has no domain (like example.com)");
    }
    for label in bare.split('.') {
        if label.is_empty() || label.len() > MAX_LABEL_LEN {
            return bad("each part between dots must be 1 to 63 characters");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a part may not start or end with '-'");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return bad("only letters, digits, '-' and a leading '*.' may appear");
        }
    }
    Ok(host)
}

/// An allow-list read whole: each entry checked, in one form, sorted, each
/// once (so the same list in another order is the same spec).
pub fn canonical(entries: &[String]) -> Result<Vec<String>, String> {
    let mut out = entries
        .iter()
        .map(|entry| Destination::parse(entry).map(|d| d.as_str().to_owned()))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// A deny list read whole, as [`canonical`] reads an allow-list.
pub fn canonical_denied(entries: &[String]) -> Result<Vec<String>, String> {
    let mut out = entries
        .iter()
        .map(|entry| Destination::parse_denied(entry))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// The list split into IPv4 blocks and host names, in their one form.
pub fn split(entries: &[String]) -> (Vec<String>, Vec<String>) {
    let mut cidrs = Vec::new();
    let mut hosts = Vec::new();
    for entry in entries {
        match Destination::parse(entry) {
            Ok(Destination::Cidr(cidr)) => cidrs.push(cidr),
            Ok(Destination::Host(host)) => hosts.push(host),
            // The spec's check refuses it before anything is made.
            Err(_) => {}
        }
    }
    (cidrs, hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_blocks_and_hosts_read_in_one_form() {
        assert_eq!(
            Destination::parse("1.1.1.1"),
            Ok(Destination::Cidr("1.1.1.1/32".into()))
        );
        assert_eq!(
            Destination::parse("8.8.8.0/24"),
            Ok(Destination::Cidr("8.8.8.0/24".into()))
        );
        assert_eq!(
            Destination::parse("*.PyPI.org"),
            Ok(Destination::Host("*.pypi.org".into()))
        );
        assert_eq!(
            canonical(&[
                "b.example.com".into(),
                "1.1.1.1".into(),
                "b.example.com".into()
            ]),
            Ok(vec!["1.1.1.1/32".into(), "b.example.com".into()])
        );
    }

    #[test]
    fn deny_lists_take_blocks_and_every_address_but_no_hosts() {
        assert_eq!(
            canonical_denied(&["10.0.0.0/8".into(), "0.0.0.0/0".into(), "1.1.1.1".into()]),
            Ok(vec![
                "0.0.0.0/0".into(),
                "1.1.1.1/32".into(),
                "10.0.0.0/8".into()
            ])
        );
        for (bad, says) in [
            ("example.com", "host name cannot be denied"),
            ("10.0.0.1/8", "past the /8"),
            ("::1", "IPv6"),
        ] {
            let error = Destination::parse_denied(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }

    #[test]
    fn bad_destinations_are_named() {
        for (bad, says) in [
            ("", "empty"),
            ("0.0.0.0/0", "every address"),
            ("10.0.0.1/8", "past the /8"),
            ("10.0.0.0/33", "0 to 32"),
            ("::1", "IPv6"),
            ("example.com:443", "IPv6 (and ports)"),
            ("localhost", "no domain"),
            ("bad_name.com", "only letters"),
            ("-a.com", "start or end"),
            ("999.1.1.1", "neither"),
            ("0.0.0.0/8", "names no destination"),
        ] {
            let error = Destination::parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
    }
}
