//! [`Members`]: a tar's entries as every silo reader takes them, each with
//! its whole name, its link target and its [`Extras`], read exactly.
//!
//! The tar crate splits a PAX block at each newline rather than taking
//! each record by the length it starts with, so an attribute value that
//! holds a newline makes the block unreadable, and its own lookup of
//! `path` skips records it cannot parse, so such a value could even hold a
//! second, forged record. This reader asks the tar crate for the raw
//! headers only and reads the extensions itself:
//! - a GNU long name (`L`) or long link (`K`) gives the next entry's name
//!   or target (cut at its first NUL);
//! - a local PAX block (`x`) is read record by record, each by its
//!   length (`"<len> <key>=<value>\n"`, `len` counting the whole record),
//!   so a value holds any bytes: `path` and `linkpath` give the name and
//!   target where no GNU entry did (as Go's reader and the tar crate
//!   order them), `uid` and `gid` the owner, `mtime` and `SCHILY.xattr.*`
//!   the [`Extras`]; a `size` that differs from the header's is refused,
//!   since the header's size is what frames the data here;
//! - a global PAX block (`g`) is skipped.
//!
//! Each extension's data is capped at [`MAX_EXTENSION_BYTES`]. A GNU
//! sparse entry whose map continues past its header is refused: the tar
//! crate reads those extra blocks only when it does not read raw.

use std::borrow::Cow;
use std::io::{self, Read};

use tar::{Entries, Entry, EntryType, Header};

use crate::blocks::{PAX_PATCH, Patch};
use crate::extras::{Extras, MAX_XATTR_BYTES, PAX_MTIME, PAX_XATTR_PREFIX, parse_mtime};

/// Most bytes of one extension's data (a long name, a long link, a PAX
/// block): the attributes an entry may carry, with room for the records'
/// keys, its name and its target.
pub const MAX_EXTENSION_BYTES: u64 = 2 * MAX_XATTR_BYTES as u64;

/// The PAX key of an entry's name.
const PAX_PATH: &[u8] = b"path";
/// The PAX key of an entry's link target.
const PAX_LINKPATH: &[u8] = b"linkpath";
/// The PAX key of an entry's data size.
const PAX_SIZE: &[u8] = b"size";
/// The PAX key of an entry's owner.
const PAX_UID: &[u8] = b"uid";
/// The PAX key of an entry's group.
const PAX_GID: &[u8] = b"gid";

/// Why a tar's entries could not be read (inside an `io::Error` of kind
/// `InvalidData`, as the tar crate's own errors come).
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// An extension's data is over [`MAX_EXTENSION_BYTES`].
    #[error("a {kind} header of {size} bytes is over the {limit} bytes a reader takes")]
    ExtensionTooLarge {
        /// What it is (`long name`, `long link`, `pax`).
        kind: &'static str,
        /// Its size.
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// Two extensions of one kind before one entry.
    #[error("two {0} headers before one entry")]
    Repeated(&'static str),
    /// The archive ends after an extension, with no entry for it.
    #[error("the archive ends after a header that describes a next entry")]
    Dangling,
    /// A PAX record is not `"<len> <key>=<value>\n"`.
    #[error("malformed pax record at byte {at} of its block")]
    MalformedPax {
        /// Where it starts in the block.
        at: usize,
    },
    /// A PAX `size` record gives the data another size than the header.
    #[error("a pax size record ({record:?}) differs from the header's size ({header})")]
    SizeRecord {
        /// The record's value.
        record: String,
        /// The header's size.
        header: u64,
    },
    /// An entry's attributes are over [`MAX_XATTR_BYTES`].
    #[error("an entry carries over {MAX_XATTR_BYTES} bytes of extended attributes")]
    XattrsTooLarge,
    /// A PAX patch record that is not one, or not of the entry's data.
    #[error("malformed patch record {value:?}")]
    Patch {
        /// The record's value.
        value: String,
    },
    /// A GNU sparse entry whose map goes on in blocks after its header.
    #[error("a gnu sparse entry with extension blocks cannot be read")]
    ExtendedSparse,
}

impl From<MemberError> for io::Error {
    fn from(err: MemberError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, err)
    }
}

/// One entry of a tar, with what its extensions said.
pub struct Member<'a, R: 'a + Read> {
    /// Its header, with the PAX `uid` and `gid` where it had them (its
    /// name, link and time fields are the header's own: use the fields
    /// below).
    pub header: Header,
    /// Its whole name, as bytes.
    pub path: Vec<u8>,
    /// Its link target (hard or symbolic), as bytes, when it has one.
    pub link: Option<Vec<u8>>,
    /// Its time to the nanosecond and its extended attributes.
    pub extras: Extras,
    /// Its data: exactly the size its header declared (`size()`), and
    /// where that starts (`raw_file_position()`). Its own `path_bytes`,
    /// `link_name_bytes` and `header` are the raw header's.
    pub data: Entry<'a, R>,
}

/// The entries of a tar, extensions applied (see the module docs).
pub struct Members<'a, R: 'a + Read> {
    raw: Entries<'a, R>,
    done: bool,
}

impl<'a, R: 'a + Read> Members<'a, R> {
    /// Reads `entries` (of `Archive::entries` or `entries_with_seek`),
    /// switched to raw mode.
    pub fn new(entries: Entries<'a, R>) -> Self {
        Self {
            raw: entries.raw(true),
            done: false,
        }
    }

    fn next_member(&mut self) -> io::Result<Option<Member<'a, R>>> {
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax: Option<Vec<u8>> = None;
        loop {
            let Some(entry) = self.raw.next() else {
                if long_name.is_some() || long_link.is_some() || pax.is_some() {
                    return Err(MemberError::Dangling.into());
                }
                return Ok(None);
            };
            let mut entry = entry?;
            let kind = entry.header().entry_type();
            let slot = match kind {
                EntryType::GNULongName => Some((&mut long_name, "long name")),
                EntryType::GNULongLink => Some((&mut long_link, "long link")),
                EntryType::XHeader => Some((&mut pax, "pax")),
                EntryType::XGlobalHeader => continue,
                _ => None,
            };
            if let Some((slot, what)) = slot {
                if slot.is_some() {
                    return Err(MemberError::Repeated(what).into());
                }
                *slot = Some(read_extension(&mut entry, what)?);
                continue;
            }
            if kind == EntryType::GNUSparse
                && entry
                    .header()
                    .as_gnu()
                    .is_some_and(|gnu| gnu.isextended[0] != 0)
            {
                return Err(MemberError::ExtendedSparse.into());
            }
            let mut header = entry.header().clone();
            let mut extras = Extras {
                mtime: crate::extras::Mtime::of_header(&header)?,
                xattrs: Vec::new(),
                patch: None,
            };
            let said = match &pax {
                Some(block) => apply_pax(block, &mut header, &mut extras, entry.size())?,
                None => Pax::default(),
            };
            let path = match (long_name, said.path) {
                (Some(name), _) => until_nul(name),
                (None, Some(path)) => path.to_vec(),
                (None, None) => entry.path_bytes().into_owned(),
            };
            let link = match (long_link, said.link) {
                (Some(link), _) => Some(until_nul(link)),
                (None, Some(link)) => Some(link.to_vec()),
                (None, None) => entry.link_name_bytes().map(Cow::into_owned),
            };
            return Ok(Some(Member {
                header,
                path,
                link,
                extras,
                data: entry,
            }));
        }
    }
}

impl<'a, R: 'a + Read> Iterator for Members<'a, R> {
    type Item = io::Result<Member<'a, R>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_member();
        if !matches!(next, Ok(Some(_))) {
            self.done = true;
        }
        next.transpose()
    }
}

/// The name and link target a PAX block gives the entry after it.
#[derive(Default)]
struct Pax<'b> {
    path: Option<&'b [u8]>,
    link: Option<&'b [u8]>,
}

/// Applies a PAX `block` to the entry after it: its owner to `header`,
/// its time and attributes to `extras`; checks a `size` record against the
/// header's `size`; answers the name and link target it gives.
fn apply_pax<'b>(
    block: &'b [u8],
    header: &mut Header,
    extras: &mut Extras,
    size: u64,
) -> Result<Pax<'b>, MemberError> {
    let mut said = Pax::default();
    let mut xattr_bytes = 0usize;
    for record in Records::new(block) {
        let (key, value) = record?;
        match key {
            PAX_PATH => said.path = Some(value),
            PAX_LINKPATH => said.link = Some(value),
            PAX_SIZE => check_size(value, size)?,
            PAX_UID => {
                if let Some(uid) = parse_number(value) {
                    header.set_uid(uid);
                }
            }
            PAX_GID => {
                if let Some(gid) = parse_number(value) {
                    header.set_gid(gid);
                }
            }
            _ if key == PAX_MTIME.as_bytes() => {
                if let Some(mtime) = parse_mtime(value) {
                    extras.mtime = mtime;
                }
            }
            _ if key == PAX_PATCH.as_bytes() => {
                let patch = Patch::from_pax(value).ok_or_else(|| MemberError::Patch {
                    value: String::from_utf8_lossy(value).into_owned(),
                })?;
                if patch.data_len() != size {
                    return Err(MemberError::Patch {
                        value: format!("{} for {size} bytes of data", patch.to_pax()),
                    });
                }
                extras.patch = Some(patch);
            }
            _ => {
                // A name that is not UTF-8 cannot be an attribute's here.
                let Some(Ok(name)) = key
                    .strip_prefix(PAX_XATTR_PREFIX.as_bytes())
                    .map(std::str::from_utf8)
                else {
                    continue;
                };
                xattr_bytes = xattr_bytes.saturating_add(name.len() + value.len());
                if xattr_bytes > MAX_XATTR_BYTES {
                    return Err(MemberError::XattrsTooLarge);
                }
                extras.xattrs.push((name.to_owned(), value.to_vec()));
            }
        }
    }
    Ok(said)
}

/// An extension entry's data, up to [`MAX_EXTENSION_BYTES`].
fn read_extension<R: Read>(entry: &mut Entry<'_, R>, kind: &'static str) -> io::Result<Vec<u8>> {
    let size = entry.size();
    if size > MAX_EXTENSION_BYTES {
        return Err(MemberError::ExtensionTooLarge {
            kind,
            size,
            limit: MAX_EXTENSION_BYTES,
        }
        .into());
    }
    let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    entry.read_to_end(&mut data)?;
    Ok(data)
}

/// A GNU name up to its first NUL (the field pads with them).
fn until_nul(mut name: Vec<u8>) -> Vec<u8> {
    if let Some(end) = name.iter().position(|&b| b == 0) {
        name.truncate(end);
    }
    name
}

/// Refuses a PAX `size` other than the header's `size`.
fn check_size(value: &[u8], size: u64) -> Result<(), MemberError> {
    if parse_number(value) == Some(size) {
        return Ok(());
    }
    Err(MemberError::SizeRecord {
        record: String::from_utf8_lossy(value).into_owned(),
        header: size,
    })
}

/// A decimal number, or `None`.
fn parse_number(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The records of a PAX block, each `(key, value)` taken by its length.
pub struct Records<'a> {
    block: &'a [u8],
    at: usize,
}

impl<'a> Records<'a> {
    /// The records of `block`, a PAX header's data.
    pub fn new(block: &'a [u8]) -> Self {
        Self { block, at: 0 }
    }

    fn record(&self) -> Option<(&'a [u8], &'a [u8], usize)> {
        let rest = self.block.get(self.at..)?;
        let space = rest.iter().take(20).position(|&b| b == b' ')?;
        let digits = &rest[..space];
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let len: usize = std::str::from_utf8(digits).ok()?.parse().ok()?;
        let record = rest.get(..len)?;
        let (&last, body) = record.get(space + 1..)?.split_last()?;
        if last != b'\n' {
            return None;
        }
        let equals = body.iter().position(|&b| b == b'=')?;
        let (key, value) = (&body[..equals], &body[equals + 1..]);
        if key.is_empty() {
            return None;
        }
        Some((key, value, len))
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), MemberError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.block.len() {
            return None;
        }
        match self.record() {
            Some((key, value, len)) => {
                self.at += len;
                Some(Ok((key, value)))
            }
            None => {
                let at = self.at;
                self.at = self.block.len();
                Some(Err(MemberError::MalformedPax { at }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::extras::{Mtime, Xattr};
    use tar::Builder;

    /// A tar of one empty regular file `name` after the PAX block of `xattrs`.
    fn with_xattrs(name: &str, xattrs: Vec<Xattr>) -> Vec<u8> {
        let mut builder = Builder::new(Vec::new());
        Extras {
            mtime: Mtime {
                secs: 1_700_000_000,
                nanos: 1,
            },
            xattrs,
            patch: None,
        }
        .append(&mut builder)
        .unwrap();
        let mut header = Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o644);
        builder.append_data(&mut header, name, io::empty()).unwrap();
        builder.into_inner().unwrap()
    }

    /// A member as read: its path, link, extras and data.
    type Got = (Vec<u8>, Option<Vec<u8>>, Extras, Vec<u8>);

    fn read_all(bytes: &[u8]) -> io::Result<Vec<Got>> {
        let mut archive = tar::Archive::new(bytes);
        Members::new(archive.entries()?)
            .map(|member| {
                let mut member = member?;
                let mut data = Vec::new();
                member.data.read_to_end(&mut data)?;
                Ok((member.path, member.link, member.extras, data))
            })
            .collect()
    }

    /// Appends a raw extension entry of `kind` holding `data`.
    fn extension(builder: &mut Builder<Vec<u8>>, kind: EntryType, data: &[u8]) {
        let mut header = Header::new_ustar();
        header.set_path("ext").unwrap();
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }

    #[test]
    fn an_xattr_value_with_a_newline_round_trips() {
        let xattrs = vec![
            ("user.a".to_owned(), b"line one\nline two\n".to_vec()),
            ("user.b".to_owned(), b"\n".to_vec()),
            ("user.c".to_owned(), b"\0\n\0=\xff".to_vec()),
            ("user.empty".to_owned(), Vec::new()),
            ("user.long".to_owned(), b"\n".repeat(300)),
        ];
        let read = read_all(&with_xattrs("f", xattrs.clone())).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].0, b"f");
        assert_eq!(read[0].2.xattrs, xattrs);
        assert_eq!(read[0].2.mtime.nanos, 1);
    }

    #[test]
    fn a_hostile_xattr_value_cannot_inject_a_record() {
        // Split at its newlines, this block holds a well-formed `path`
        // record of its own, which the tar crate's lookup would take.
        let forged = b"\n20 path=/etc/passwd\n".to_vec();
        let bytes = with_xattrs("f", vec![("user.x".to_owned(), forged.clone())]);
        let read = read_all(&bytes).unwrap();
        assert_eq!(read[0].0, b"f");
        assert_eq!(read[0].2.xattrs, [("user.x".to_owned(), forged)]);
        // The same for the size that frames the data, and the time.
        for forged in [&b"\n10 size=9\n"[..], b"\n21 mtime=1.000000005\n"] {
            let bytes = with_xattrs("g", vec![("user.y".to_owned(), forged.to_vec())]);
            let read = read_all(&bytes).unwrap();
            assert_eq!(
                (read[0].0.as_slice(), read[0].2.mtime.nanos),
                (&b"g"[..], 1)
            );
            assert_eq!(read[0].2.xattrs[0].1, forged);
        }
    }

    #[test]
    fn a_name_that_cannot_be_a_key_is_refused_by_the_writer() {
        let mut builder = Builder::new(Vec::new());
        for name in ["user.a=b", "", "user.\0"] {
            let extras = Extras {
                mtime: Mtime::default(),
                xattrs: vec![(name.to_owned(), b"v".to_vec())],
                patch: None,
            };
            assert!(extras.append(&mut builder).is_err(), "{name:?}");
        }
    }

    #[test]
    fn long_names_links_and_pax_records_apply_to_the_next_entry() {
        let mut builder = Builder::new(Vec::new());
        // A global block is skipped.
        extension(
            &mut builder,
            EntryType::XGlobalHeader,
            b"18 path=/etc/nope\n",
        );
        let long = "d/".repeat(80) + "file";
        let mut header = Header::new_gnu();
        header.set_size(3);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, &long, &b"abc"[..])
            .unwrap();
        // PAX path, linkpath, owner and a size equal to the header's.
        extension(
            &mut builder,
            EntryType::XHeader,
            b"12 path=p\xffq\n16 linkpath=t\nt\n16 uid=70000000\n8 gid=7\n10 size=0\n",
        );
        let mut header = Header::new_ustar();
        header.set_path("short").unwrap();
        header.set_entry_type(EntryType::Symlink);
        header.set_size(0);
        header.set_cksum();
        builder.append(&header, io::empty()).unwrap();
        // A GNU long link, and a long name beside a PAX path: the GNU one
        // wins, as Go's reader and the tar crate have it.
        extension(&mut builder, EntryType::XHeader, b"12 path=pax\n");
        extension(&mut builder, EntryType::GNULongName, b"gnu-name\0");
        extension(&mut builder, EntryType::GNULongLink, b"gnu-target\0");
        let mut header = Header::new_gnu();
        header.set_path("x").unwrap();
        header.set_entry_type(EntryType::Link);
        header.set_size(0);
        header.set_cksum();
        builder.append(&header, io::empty()).unwrap();
        let bytes = builder.into_inner().unwrap();
        let read = read_all(&bytes).unwrap();
        assert_eq!(read.len(), 3);
        assert_eq!(
            (read[0].0.as_slice(), read[0].3.as_slice()),
            (long.as_bytes(), &b"abc"[..])
        );
        assert_eq!(read[1].0, b"p\xffq");
        assert_eq!(read[1].1.as_deref(), Some(&b"t\nt"[..]));
        assert_eq!(read[2].0, b"gnu-name");
        assert_eq!(read[2].1.as_deref(), Some(&b"gnu-target"[..]));
        let mut archive = tar::Archive::new(bytes.as_slice());
        let owner = Members::new(archive.entries().unwrap())
            .nth(1)
            .unwrap()
            .unwrap()
            .header;
        assert_eq!(
            (owner.uid().unwrap(), owner.gid().unwrap()),
            (70_000_000, 7)
        );
    }

    /// The error `bytes` reads with.
    fn error_of(bytes: &[u8]) -> String {
        let err = read_all(bytes).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        err.to_string()
    }

    #[test]
    fn what_cannot_be_read_exactly_is_refused() {
        let entry = |builder: &mut Builder<Vec<u8>>, size: u64| {
            let mut header = Header::new_gnu();
            header.set_size(size);
            header.set_mode(0o644);
            builder
                .append_data(&mut header, "f", io::repeat(b'x').take(size))
                .unwrap();
        };
        // A size record the header does not agree with.
        let mut builder = Builder::new(Vec::new());
        extension(&mut builder, EntryType::XHeader, b"12 size=100\n");
        entry(&mut builder, 1);
        let message = error_of(&builder.into_inner().unwrap());
        assert!(message.contains("pax size record"), "{message}");
        // A record whose length is not its own.
        for block in [
            &b"13 path=abc\n"[..],
            b"11 path=abc\n",
            b"x path=a\n",
            b"6 pa\n",
        ] {
            let mut builder = Builder::new(Vec::new());
            extension(&mut builder, EntryType::XHeader, block);
            entry(&mut builder, 0);
            let message = error_of(&builder.into_inner().unwrap());
            assert!(message.contains("malformed pax record"), "{message}");
        }
        // Two blocks for one entry, and one for none.
        let mut builder = Builder::new(Vec::new());
        extension(&mut builder, EntryType::XHeader, b"10 path=a\n");
        extension(&mut builder, EntryType::XHeader, b"10 path=b\n");
        entry(&mut builder, 0);
        assert!(error_of(&builder.into_inner().unwrap()).contains("two pax headers"));
        let mut builder = Builder::new(Vec::new());
        extension(&mut builder, EntryType::GNULongName, b"name\0");
        assert!(error_of(&builder.into_inner().unwrap()).contains("archive ends"));
        // An extension over the cap.
        let mut builder = Builder::new(Vec::new());
        let big = vec![b'a'; usize::try_from(MAX_EXTENSION_BYTES).unwrap() + 1];
        extension(&mut builder, EntryType::GNULongName, &big);
        entry(&mut builder, 0);
        assert!(error_of(&builder.into_inner().unwrap()).contains("is over"));
    }
}
