//! Ids, keys and tokens: how every mock makes them (the system's random
//! generator, no bias) and compares them (in time independent of where two
//! values differ). Shared by every provider.

/// Lowercase letters and digits (E2B's ids, instance labels).
pub const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
/// Hex digits, for tokens and keys.
pub const HEX: &[u8] = b"0123456789abcdef";

/// `len` random characters of `alphabet` (rejection sampling, no bias).
pub fn random_text(len: usize, alphabet: &[u8]) -> Result<String, getrandom::Error> {
    let limit = 256 - 256 % alphabet.len();
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 64];
    while out.len() < len {
        getrandom::fill(&mut buf)?;
        for byte in buf {
            if out.len() < len && usize::from(byte) < limit {
                out.push(char::from(alphabet[usize::from(byte) % alphabet.len()]));
            }
        }
    }
    Ok(out)
}

/// A random UUID, version 4, in its hyphenated lowercase form.
pub fn uuid_v4() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// Whether two secrets are equal, in time independent of where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_use_the_alphabet() {
        let id = random_text(20, ALPHABET).unwrap();
        assert_eq!(id.len(), 20);
        assert!(id.bytes().all(|b| ALPHABET.contains(&b)));
    }

    #[test]
    fn uuids_are_version_4() {
        let id = uuid_v4().unwrap();
        assert_eq!(id.len(), 36);
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!(matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
    }
}
