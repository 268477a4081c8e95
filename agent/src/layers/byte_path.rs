//! A layer path as the apply's journal writes it: a JSON string when the
//! path is UTF-8 (as every journal before names were bytes), else the
//! array of its bytes. For `#[serde(with = "byte_path")]` on `Vec<u8>`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Either form a journal may hold, as written.
#[derive(Serialize)]
#[serde(untagged)]
enum Written<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
}

/// What a journal holds, owned (a string read back may need unescaping).
#[derive(Deserialize)]
#[serde(untagged)]
enum Read {
    Text(String),
    Bytes(Vec<u8>),
}

/// Writes `path` as a string if it is UTF-8, else as its bytes.
pub fn serialize<S: Serializer>(path: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    match std::str::from_utf8(path) {
        Ok(text) => Written::Text(text).serialize(serializer),
        Err(_) => Written::Bytes(path).serialize(serializer),
    }
}

/// Reads either form.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    Ok(match Read::deserialize(deserializer)? {
        Read::Text(text) => text.into_bytes(),
        Read::Bytes(bytes) => bytes,
    })
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder(#[serde(with = "super")] Vec<u8>);

    #[test]
    fn a_utf8_path_is_a_string_and_another_its_bytes() {
        let text = serde_json::to_string(&Holder(b"etc/hosts".to_vec())).unwrap();
        assert_eq!(text, r#""etc/hosts""#);
        let raw = serde_json::to_string(&Holder(b"a/\xff".to_vec())).unwrap();
        assert_eq!(raw, "[97,47,255]");
        for holder in [Holder(b"etc/hosts".to_vec()), Holder(b"a/\xff".to_vec())] {
            let text = serde_json::to_string(&holder).unwrap();
            assert_eq!(serde_json::from_str::<Holder>(&text).unwrap(), holder);
        }
    }
}
