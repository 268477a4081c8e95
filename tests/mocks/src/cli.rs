//! What the mock binaries share: reading `NAME=IMAGE` flags, and waiting
//! for Ctrl-C or SIGTERM before they clean up.

use std::collections::BTreeMap;

/// A `NAME=IMAGE` flag that is not one.
#[derive(Debug, thiserror::Error)]
#[error("--{flag} {value:?} is not NAME=IMAGE")]
pub struct ImagePairError {
    /// The flag's name.
    pub flag: &'static str,
    /// What was given.
    pub value: String,
}

/// The `NAME=IMAGE` values of `flag` as a map; `default` when none is given.
pub fn image_pairs(
    flag: &'static str,
    values: &[String],
    default: (&str, &str),
) -> Result<BTreeMap<String, String>, ImagePairError> {
    let mut pairs = BTreeMap::new();
    for value in values {
        let Some((name, image)) = value
            .split_once('=')
            .filter(|(n, i)| !n.is_empty() && !i.is_empty())
        else {
            return Err(ImagePairError {
                flag,
                value: value.clone(),
            });
        };
        pairs.insert(name.to_owned(), image.to_owned());
    }
    if pairs.is_empty() {
        pairs.insert(default.0.to_owned(), default.1.to_owned());
    }
    Ok(pairs)
}

/// Returns when the process gets Ctrl-C (SIGINT) or SIGTERM.
pub async fn wait_for_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_split_on_the_first_equals() {
        let given = vec!["a=img:1".to_owned(), "b=x=y".to_owned()];
        let pairs = image_pairs("template", &given, ("base", "silo-base:latest")).unwrap();
        assert_eq!(pairs["a"], "img:1");
        assert_eq!(pairs["b"], "x=y");
        let default = image_pairs("template", &[], ("base", "silo-base:latest")).unwrap();
        assert_eq!(default["base"], "silo-base:latest");
        let error = image_pairs("snapshot", &["=x".to_owned()], ("a", "b")).unwrap_err();
        assert_eq!(error.to_string(), "--snapshot \"=x\" is not NAME=IMAGE");
    }
}
