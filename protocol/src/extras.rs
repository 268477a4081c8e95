//! What a layer entry carries beyond its tar header: its modification
//! time to the nanosecond and its extended attributes, as PAX records.
//!
//! A tar header holds whole seconds and no attributes. Every writer of
//! silo's layers (the agent's snapshot, the store's restoring layer and
//! squash) puts one PAX block before an entry that needs it: `mtime`
//! (`SECONDS.NANOSECONDS`) when the time has a fraction, and
//! `SCHILY.xattr.NAME` for each extended attribute, as engines write and
//! read them, each record prefixed with its length so that a value may
//! hold any byte (a newline, a NUL) or none. Every reader (the agent's
//! apply, the store's tables, squash and index) takes them through
//! [`crate::members`], which reads records by that length. An entry
//! without a block has the header's seconds and no attributes.

use std::io::{self, Write};

use tar::Builder;

use crate::blocks::{PAX_PATCH, Patch};

/// The PAX key of an entry's modification time.
pub const PAX_MTIME: &str = "mtime";
/// The prefix of the PAX keys of extended attributes (the name follows).
pub const PAX_XATTR_PREFIX: &str = "SCHILY.xattr.";
/// Most bytes of extended attributes one entry may carry (Linux allows
/// 64 KiB per value; a layer entry with more is refused).
pub const MAX_XATTR_BYTES: usize = 256 * 1024;

/// An extended attribute: its name (UTF-8, as PAX keys are) and value.
pub type Xattr = (String, Vec<u8>);

/// What a layer entry carries beyond its header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    /// Its modification time.
    pub mtime: Mtime,
    /// Its extended attributes, by name.
    pub xattrs: Vec<Xattr>,
    /// For a rewind's layer only: the entry's data patches the file at its
    /// path rather than being all of it ([`crate::blocks`]). Written only
    /// by [`Extras::append_patch`].
    pub patch: Option<Patch>,
}

impl Extras {
    /// Writes the PAX block this entry needs to `builder`, before the
    /// entry; nothing when its header says it all. An attribute whose
    /// name holds `=` or a NUL cannot be a PAX key, and is refused.
    pub fn append<W: Write>(&self, builder: &mut Builder<W>) -> io::Result<()> {
        self.append_records(builder, Vec::new())
    }

    /// [`Extras::append`], and `patch` in the same block: the entry after
    /// it is that patch on the file at its path.
    pub fn append_patch<W: Write>(
        &self,
        builder: &mut Builder<W>,
        patch: &Patch,
    ) -> io::Result<()> {
        let record = (PAX_PATCH.to_owned(), patch.to_pax().into_bytes());
        self.append_records(builder, vec![record])
    }

    fn append_records<W: Write>(
        &self,
        builder: &mut Builder<W>,
        mut records: Vec<(String, Vec<u8>)>,
    ) -> io::Result<()> {
        if self.mtime.nanos != 0 || self.mtime.secs < 0 {
            records.push((PAX_MTIME.to_owned(), format(self.mtime).into_bytes()));
        }
        for (name, value) in &self.xattrs {
            if !is_pax_name(name) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("extended attribute {name:?} cannot be a pax record's key"),
                ));
            }
            records.push((format!("{PAX_XATTR_PREFIX}{name}"), value.clone()));
        }
        if records.is_empty() {
            return Ok(());
        }
        builder.append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
    }
}

/// A modification time: seconds since the epoch and the nanoseconds past them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mtime {
    /// Whole seconds (negative before 1970).
    pub secs: i64,
    /// Nanoseconds past `secs`, below one second.
    pub nanos: u32,
}

impl Mtime {
    /// The time a header's whole seconds give, with no fraction.
    pub fn of_header(header: &tar::Header) -> io::Result<Self> {
        let secs = i64::try_from(header.mtime()?).unwrap_or(i64::MAX);
        Ok(Self { secs, nanos: 0 })
    }

    /// Seconds for the header: before 1970 is written as the epoch, which
    /// the PAX record then corrects.
    pub fn header_secs(self) -> u64 {
        u64::try_from(self.secs).unwrap_or(0)
    }
}

/// Whether an attribute named `name` can be written as a PAX record: its
/// key ends at the first `=`, and a NUL ends names on Linux.
pub fn is_pax_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// `SECONDS.NANOSECONDS`, nine digits after the point.
fn format(time: Mtime) -> String {
    format!("{}.{:09}", time.secs, time.nanos)
}

/// Reads `SECONDS[.FRACTION]` (a fraction of up to nine digits used, more
/// cut off); `None` if it is not that.
pub(crate) fn parse_mtime(value: &[u8]) -> Option<Mtime> {
    let text = std::str::from_utf8(value).ok()?;
    let (secs, fraction) = text.split_once('.').unwrap_or((text, ""));
    let secs: i64 = secs.parse().ok()?;
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits: String = fraction.chars().take(9).collect();
    let nanos = if digits.is_empty() {
        0
    } else {
        format!("{digits:0<9}").parse().ok()?
    };
    Some(Mtime { secs, nanos })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn records_read_back_to_the_nanosecond_with_attributes() {
        let mut builder = Builder::new(Vec::new());
        let times = [
            Mtime {
                secs: 1_700_000_000,
                nanos: 123_456_789,
            },
            Mtime {
                secs: 1_700_000_001,
                nanos: 0,
            },
            Mtime { secs: -5, nanos: 7 },
        ];
        for (i, time) in times.iter().enumerate() {
            let xattrs = match i {
                0 => vec![("user.note".to_owned(), b"a\0b".to_vec())],
                _ => Vec::new(),
            };
            Extras {
                mtime: *time,
                xattrs,
                patch: None,
            }
            .append(&mut builder)
            .unwrap();
            let mut header = tar::Header::new_gnu();
            header.set_mtime(time.header_secs());
            header.set_size(0);
            header.set_mode(0o644);
            builder
                .append_data(&mut header, format!("f{i}"), io::empty())
                .unwrap();
        }
        let bytes = builder.into_inner().unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        let read: Vec<Extras> = crate::members::Members::new(archive.entries().unwrap())
            .map(|member| member.unwrap().extras)
            .collect();
        assert_eq!(read.iter().map(|e| e.mtime).collect::<Vec<_>>(), times);
        assert_eq!(read[0].xattrs, [("user.note".to_owned(), b"a\0b".to_vec())]);
        assert!(read[1].xattrs.is_empty());
    }

    #[test]
    fn fractions_of_any_length_are_read() {
        assert_eq!(
            parse_mtime(b"12.5"),
            Some(Mtime {
                secs: 12,
                nanos: 500_000_000
            })
        );
        assert_eq!(parse_mtime(b"12"), Some(Mtime { secs: 12, nanos: 0 }));
        assert_eq!(
            parse_mtime(b"12.1234567891"),
            Some(Mtime {
                secs: 12,
                nanos: 123_456_789
            })
        );
        assert_eq!(parse_mtime(b"x.1"), None);
        assert_eq!(parse_mtime(b"1.x"), None);
    }
}
