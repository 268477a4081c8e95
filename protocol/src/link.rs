//! A symlink's target, written into a layer entry byte for byte.
//!
//! `tar::Builder::append_link` tidies a target as a path (`a//b` becomes
//! `a/b`, `/` becomes `//`), so every writer of silo's layers and tree
//! archives writes a symlink through [`append_symlink`]: a target that
//! fits the header's 100 bytes goes there verbatim, a longer one in a GNU
//! long-link entry before it (as the tar crate, GNU tar and every engine
//! read it).

use std::io::{self, Write};
use std::path::Path;

use tar::{Builder, EntryType, Header};

/// Bytes of a link target a tar header holds.
pub const HEADER_LINK_BYTES: usize = 100;
/// The name GNU tar gives a long-link entry.
const LONG_LINK_NAME: &[u8] = b"././@LongLink";

/// Appends symlink `path` with target `target` (verbatim) to `builder`;
/// `header` carries its owner, mode and time.
pub fn append_symlink<W: Write>(
    builder: &mut Builder<W>,
    header: &mut Header,
    path: &Path,
    target: &[u8],
) -> io::Result<()> {
    if target.contains(&0) || target.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a symlink's target is empty or holds a NUL byte",
        ));
    }
    header.set_entry_type(EntryType::Symlink);
    header.set_size(0);
    if target.len() > HEADER_LINK_BYTES {
        let mut long = Header::new_gnu();
        long.as_old_mut().name[..LONG_LINK_NAME.len()].copy_from_slice(LONG_LINK_NAME);
        long.set_entry_type(EntryType::GNULongLink);
        long.set_mode(0o644);
        long.set_size(target.len() as u64 + 1);
        long.set_cksum();
        builder.append(&long, io::Read::chain(target, &[0u8][..]))?;
    }
    header.set_link_name_literal(&target[..target.len().min(HEADER_LINK_BYTES)])?;
    builder.append_data(header, path, io::empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::io::Read as _;

    #[test]
    fn targets_come_back_byte_for_byte() {
        let long = [b'x'; 150];
        let mut long_odd = b"a//b/./".to_vec();
        long_odd.extend_from_slice(&[b'y'; 120]);
        long_odd.extend_from_slice(b"//\xff/");
        let targets: [&[u8]; 9] = [
            b"/",
            b"//",
            b".",
            b"..",
            b"a//b",
            b"dir/",
            b"\xfe\xff",
            &long,
            &long_odd,
        ];
        let mut builder = Builder::new(Vec::new());
        for (i, target) in targets.iter().enumerate() {
            let mut header = Header::new_gnu();
            header.set_mode(0o777);
            append_symlink(
                &mut builder,
                &mut header,
                Path::new(&format!("l{i}")),
                target,
            )
            .unwrap();
        }
        let bytes = builder.into_inner().unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        let read: Vec<(Vec<u8>, Vec<u8>)> = archive
            .entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                assert!(data.is_empty());
                assert_eq!(entry.header().entry_type(), EntryType::Symlink);
                (
                    entry.path_bytes().into_owned(),
                    entry.link_name_bytes().unwrap().into_owned(),
                )
            })
            .collect();
        assert_eq!(read.len(), targets.len());
        for (i, (path, target)) in read.iter().enumerate() {
            assert_eq!(path, format!("l{i}").as_bytes());
            assert_eq!(target.as_slice(), targets[i]);
        }
        let mut header = Header::new_gnu();
        assert!(
            append_symlink(
                &mut Builder::new(Vec::new()),
                &mut header,
                Path::new("l"),
                b"a\0b"
            )
            .is_err()
        );
    }
}
