//! Sandbox ids and names, and snapshot ids.
//!
//! An id (`sbx-` and 12 hex digits) is drawn at random and never changes, even
//! when a sandbox is rewound or restored; it is what keys are derived from. A
//! name is what people type: chosen by the user or generated, unique among live
//! sandboxes, and restricted to characters that are safe in paths, labels and
//! shell commands.

/// Prefix of every sandbox id.
pub const ID_PREFIX: &str = "sbx-";
/// Random bytes in an id (shown as twice as many hex digits).
const ID_RANDOM_BYTES: usize = 6;
/// Longest accepted name; Docker container names and DNS labels fit in this.
pub const MAX_NAME_LEN: usize = 63;

const ADJECTIVES: &[&str] = &[
    "amber", "brisk", "calm", "deft", "eager", "fair", "glad", "hardy", "keen", "lucid", "merry",
    "nimble", "quiet", "rapid", "sage", "swift", "tidy", "vivid", "warm", "witty", "bold", "crisp",
    "lively", "plucky",
];
const NOUNS: &[&str] = &[
    "otter", "heron", "lynx", "finch", "badger", "marten", "ibis", "wren", "yak", "gecko", "koala",
    "puffin", "tapir", "vole", "egret", "newt", "okapi", "panda", "quail", "raven", "stoat",
    "tern", "viper", "walrus",
];

/// Prefix of every snapshot id.
pub const SNAPSHOT_ID_PREFIX: &str = "snap-";

/// A fresh random snapshot id (`snap-` and 12 hex digits).
pub fn new_snapshot_id() -> Result<String, NamingError> {
    Ok(format!(
        "{SNAPSHOT_ID_PREFIX}{}",
        hex::encode(random_bytes::<ID_RANDOM_BYTES>()?)
    ))
}

/// A fresh random sandbox id.
pub fn new_sandbox_id() -> Result<String, NamingError> {
    Ok(format!(
        "{ID_PREFIX}{}",
        hex::encode(random_bytes::<ID_RANDOM_BYTES>()?)
    ))
}

/// Whether `text` has the shape of a sandbox id.
pub fn looks_like_id(text: &str) -> bool {
    text.strip_prefix(ID_PREFIX).is_some_and(|rest| {
        rest.len() == ID_RANDOM_BYTES * 2
            && rest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A generated name such as `brisk-otter`; `attempt` > 0 adds a random suffix
/// so retries after a collision do not keep drawing from the same small space.
pub fn generated_name(attempt: u32) -> Result<String, NamingError> {
    let [a, b, c, d] = random_bytes::<4>()?;
    let adjective = ADJECTIVES[usize::from(a) % ADJECTIVES.len()];
    let noun = NOUNS[usize::from(b) % NOUNS.len()];
    Ok(if attempt == 0 {
        format!("{adjective}-{noun}")
    } else {
        format!("{adjective}-{noun}-{}", hex::encode([c, d]))
    })
}

/// Checks a user-chosen name: `[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}`, and not an id
/// (a name that looks like another sandbox's id would make lookups ambiguous).
pub fn validate_name(name: &str) -> Result<(), NamingError> {
    let invalid = |reason: &'static str| NamingError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    let mut bytes = name.bytes();
    match bytes.next() {
        None => return Err(invalid("it is empty")),
        Some(first) if !first.is_ascii_alphanumeric() => {
            return Err(invalid("it must start with a letter or digit"));
        }
        Some(_) => {}
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid("it is longer than 63 characters"));
    }
    if !bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')) {
        return Err(invalid(
            "only letters, digits, '_', '.' and '-' are allowed",
        ));
    }
    if looks_like_id(name) {
        return Err(invalid("it has the form of a sandbox id"));
    }
    Ok(())
}

fn random_bytes<const N: usize>() -> Result<[u8; N], NamingError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|_| NamingError::NoRandomness)?;
    Ok(bytes)
}

/// Why an id or name could not be made or accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NamingError {
    /// The name breaks the naming rule.
    #[error("invalid sandbox name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The operating system gave no random bytes.
    #[error("the operating system's random source failed")]
    NoRandomness,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_a_fixed_shape() {
        let id = new_sandbox_id().unwrap();
        assert!(looks_like_id(&id), "{id}");
        assert_ne!(id, new_sandbox_id().unwrap());
        assert!(!looks_like_id("sbx-0123"));
        assert!(!looks_like_id("sbx-0123456789AB"));
    }

    #[test]
    fn names_follow_the_rule() {
        for good in ["a", "A9", "web-1", "x_y.z", &"n".repeat(63)] {
            assert_eq!(validate_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "_a",
            "a b",
            "a/b",
            "ü",
            &"n".repeat(64),
            "sbx-0123456789ab",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn generated_names_are_valid() {
        for attempt in 0..20 {
            let name = generated_name(attempt).unwrap();
            assert_eq!(validate_name(&name), Ok(()), "{name}");
        }
    }
}
