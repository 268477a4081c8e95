//! A layer entry's modification time to the nanosecond.
//!
//! A tar header holds whole seconds. Every writer of silo's layers (the
//! agent's snapshot, the store's restoring layer and squash) puts a PAX
//! `mtime` record (`SECONDS.NANOSECONDS`) before an entry whose time has a
//! fraction, and every reader (the agent's apply, the store's tables)
//! takes it from there; engines read the same record when they load a
//! layer. An entry without one has the header's seconds.

use std::io::{self, Read, Write};

use tar::{Builder, Entry};

/// The PAX key of an entry's modification time.
pub const PAX_MTIME: &str = "mtime";

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

    /// The time of `entry`: its PAX `mtime` record if it has a readable
    /// one, else its header's seconds.
    pub fn of_entry<R: Read>(entry: &mut Entry<'_, R>) -> io::Result<Self> {
        let header = Self::of_header(entry.header())?;
        let Some(extensions) = entry.pax_extensions()? else {
            return Ok(header);
        };
        for extension in extensions {
            let extension = extension?;
            if extension.key_bytes() == PAX_MTIME.as_bytes() {
                return Ok(parse(extension.value_bytes()).unwrap_or(header));
            }
        }
        Ok(header)
    }

    /// Seconds for the header: before 1970 is written as the epoch, which
    /// the PAX record then corrects.
    pub fn header_secs(self) -> u64 {
        u64::try_from(self.secs).unwrap_or(0)
    }

    /// Writes the PAX record this time needs to `builder`, before the
    /// entry it belongs to; nothing when the header's seconds say it all.
    pub fn append_record<W: Write>(self, builder: &mut Builder<W>) -> io::Result<()> {
        if self.nanos == 0 && self.secs >= 0 {
            return Ok(());
        }
        let value = format(self);
        builder.append_pax_extensions([(PAX_MTIME, value.as_bytes())])
    }
}

/// `SECONDS.NANOSECONDS`, nine digits after the point.
fn format(time: Mtime) -> String {
    format!("{}.{:09}", time.secs, time.nanos)
}

/// Reads `SECONDS[.FRACTION]` (a fraction of up to nine digits used, more
/// cut off); `None` if it is not that.
fn parse(value: &[u8]) -> Option<Mtime> {
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
    fn records_read_back_to_the_nanosecond() {
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
            time.append_record(&mut builder).unwrap();
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
        let read: Vec<Mtime> = archive
            .entries()
            .unwrap()
            .map(|entry| Mtime::of_entry(&mut entry.unwrap()).unwrap())
            .collect();
        assert_eq!(read, times);
    }

    #[test]
    fn fractions_of_any_length_are_read() {
        assert_eq!(
            parse(b"12.5"),
            Some(Mtime {
                secs: 12,
                nanos: 500_000_000
            })
        );
        assert_eq!(parse(b"12"), Some(Mtime { secs: 12, nanos: 0 }));
        assert_eq!(
            parse(b"12.1234567891"),
            Some(Mtime {
                secs: 12,
                nanos: 123_456_789
            })
        );
        assert_eq!(parse(b"x.1"), None);
        assert_eq!(parse(b"1.x"), None);
    }
}
