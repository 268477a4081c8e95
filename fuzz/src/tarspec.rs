//! Structured tar and gzip generation: `arbitrary` shapes random bytes into
//! entries with hostile names (`..`, absolute, long, non-UTF-8, duplicates,
//! whiteouts), every entry type (links, devices, FIFOs, unknown), GNU
//! long-name and PAX headers, sizes that lie about the data, and broken
//! ends; headers are written raw, so nothing the `tar` crate's builder would
//! refuse is out of reach.

use std::io::Write;

use arbitrary::Arbitrary;
use flate2::Compression;
use flate2::write::GzEncoder;

/// Tar block size.
const BLOCK: usize = 512;
/// Bytes of the old-style name and link name fields.
const NAME_FIELD: usize = 100;
/// Name segments names are built from.
const SEGMENTS: [&str; 12] = [
    "a",
    "b",
    "dir",
    "f.txt",
    ".",
    "..",
    ".wh.a",
    ".wh..wh..opq",
    "",
    "a/b",
    "-",
    "ünï",
];

/// A whole tar stream.
#[derive(Debug, Arbitrary)]
pub struct TarSpec {
    /// Its entries, in order.
    pub entries: Vec<EntrySpec>,
    /// How it ends.
    pub end: EndSpec,
}

/// One entry.
#[derive(Debug, Arbitrary)]
pub struct EntrySpec {
    name: NameSpec,
    kind: Kind,
    mode: u16,
    data: Vec<u8>,
    size: SizeSpec,
    form: Form,
    link: NameSpec,
}

#[derive(Debug, Arbitrary)]
enum NameSpec {
    Plain(Vec<u8>),
    Up {
        levels: u8,
        rest: Vec<u8>,
    },
    /// An absolute name under the target's probe directory.
    Probe(Vec<u8>),
    Root,
    Long {
        segment: u8,
        repeat: u16,
    },
    NonUtf8(Vec<u8>),
    /// The name of an earlier entry.
    Again(u8),
    Raw(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Kind {
    File,
    Dir,
    Symlink,
    Hardlink,
    Char,
    Block,
    Fifo,
    Contiguous,
    Other(u8),
}

#[derive(Debug, Arbitrary)]
enum SizeSpec {
    True,
    Shorter(u16),
    Longer(u16),
    Huge,
    Garbage([u8; 12]),
}

#[derive(Debug, Arbitrary)]
enum Form {
    Ustar,
    Gnu,
    GnuLongName,
    Pax,
}

/// How the stream ends.
#[derive(Debug, Arbitrary)]
pub enum EndSpec {
    /// Two zero blocks.
    Proper,
    /// No end marker.
    Missing,
    /// One zero block.
    Half,
    /// Bytes after the end marker.
    Trailing(Vec<u8>),
}

/// How a tar is wrapped in gzip.
#[derive(Debug, Arbitrary)]
pub enum GzipSpec {
    /// One member.
    Plain(u8),
    /// Split into two members at a point.
    TwoMembers(u16),
    /// Cut short by some bytes.
    Truncated(u16),
    /// Garbage after the gzip stream.
    Trailing(Vec<u8>),
    /// Not compressed at all.
    Raw,
}

impl TarSpec {
    /// The tar bytes; absolute names go under `probe`.
    pub fn build(&self, probe: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let mut names: Vec<Vec<u8>> = Vec::new();
        for entry in &self.entries {
            let name = entry.name.bytes(probe, &names);
            let link = entry.link.bytes(probe, &names);
            entry.write(&mut out, &name, &link);
            names.push(name);
        }
        match &self.end {
            EndSpec::Proper => out.resize(out.len() + 2 * BLOCK, 0),
            EndSpec::Missing => {}
            EndSpec::Half => out.resize(out.len() + BLOCK, 0),
            EndSpec::Trailing(bytes) => {
                out.resize(out.len() + 2 * BLOCK, 0);
                out.extend_from_slice(bytes);
            }
        }
        out
    }
}

impl NameSpec {
    fn bytes(&self, probe: &str, earlier: &[Vec<u8>]) -> Vec<u8> {
        let join = |picks: &[u8]| -> Vec<u8> {
            let parts: Vec<&str> = picks
                .iter()
                .map(|p| SEGMENTS[usize::from(*p) % SEGMENTS.len()])
                .collect();
            parts.join("/").into_bytes()
        };
        match self {
            Self::Plain(picks) => join(picks),
            Self::Up { levels, rest } => {
                let mut name = "../".repeat(usize::from(levels % 6) + 1).into_bytes();
                name.extend(join(rest));
                name
            }
            Self::Probe(picks) => {
                let mut name = format!("{probe}/").into_bytes();
                name.extend(join(picks));
                name
            }
            Self::Root => b"/".to_vec(),
            Self::Long { segment, repeat } => {
                let segment = SEGMENTS[usize::from(*segment) % SEGMENTS.len()];
                vec![segment; usize::from(repeat % 600) + 1]
                    .join("/")
                    .into_bytes()
            }
            Self::NonUtf8(bytes) => {
                let mut name = b"x\xff\xfe".to_vec();
                name.extend(bytes.iter().filter(|b| **b != 0));
                name
            }
            Self::Again(index) if !earlier.is_empty() => {
                earlier[usize::from(*index) % earlier.len()].clone()
            }
            Self::Again(_) => b"a".to_vec(),
            Self::Raw(bytes) => bytes.clone(),
        }
    }
}

impl EntrySpec {
    fn type_byte(&self) -> u8 {
        match self.kind {
            Kind::File => b'0',
            Kind::Dir => b'5',
            Kind::Symlink => b'2',
            Kind::Hardlink => b'1',
            Kind::Char => b'3',
            Kind::Block => b'4',
            Kind::Fifo => b'6',
            Kind::Contiguous => b'7',
            Kind::Other(byte) => byte,
        }
    }

    fn write(&self, out: &mut Vec<u8>, name: &[u8], link: &[u8]) {
        let gnu = !matches!(self.form, Form::Ustar | Form::Pax);
        match self.form {
            Form::GnuLongName => {
                let mut long = name.to_vec();
                long.push(0);
                push_entry(
                    out,
                    b"././@LongLink",
                    b'L',
                    0o644,
                    &size_field(long.len() as u64),
                    &[],
                    &long,
                    true,
                );
            }
            Form::Pax => {
                let mut records = pax_record("path", name);
                if !link.is_empty() {
                    records.extend(pax_record("linkpath", link));
                }
                push_entry(
                    out,
                    b"PaxHeader",
                    b'x',
                    0o644,
                    &size_field(records.len() as u64),
                    &[],
                    &records,
                    false,
                );
            }
            Form::Ustar | Form::Gnu => {}
        }
        let size = match &self.size {
            SizeSpec::True => size_field(self.data.len() as u64),
            SizeSpec::Shorter(n) => {
                size_field(self.data.len().saturating_sub(usize::from(*n)) as u64)
            }
            SizeSpec::Longer(n) => size_field(self.data.len() as u64 + u64::from(*n)),
            SizeSpec::Huge => size_field(u64::MAX >> 28),
            SizeSpec::Garbage(bytes) => *bytes,
        };
        push_entry(
            out,
            name,
            self.type_byte(),
            u32::from(self.mode),
            &size,
            link,
            &self.data,
            gnu,
        );
    }
}

/// One PAX record, `"<len> <key>=<value>\n"`, its length counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while len.to_string().len() + body != len {
        len += 1;
    }
    let mut record = format!("{len} {key}=").into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    record
}

/// An octal size field.
fn size_field(size: u64) -> [u8; 12] {
    let mut field = [0u8; 12];
    let text = format!("{size:011o}");
    let bytes = text.as_bytes();
    let n = bytes.len().min(11);
    field[..n].copy_from_slice(&bytes[bytes.len() - n..]);
    field
}

/// Writes one raw header block and `data` padded to a block.
#[allow(clippy::too_many_arguments)] // reason: one raw header's fields, written in one place
fn push_entry(
    out: &mut Vec<u8>,
    name: &[u8],
    kind: u8,
    mode: u32,
    size: &[u8; 12],
    link: &[u8],
    data: &[u8],
    gnu: bool,
) {
    let mut block = [0u8; BLOCK];
    let n = name.len().min(NAME_FIELD);
    block[..n].copy_from_slice(&name[..n]);
    block[100..108].copy_from_slice(format!("{:07o}\0", mode & 0o7777).as_bytes());
    block[108..116].copy_from_slice(b"0000000\0");
    block[116..124].copy_from_slice(b"0000000\0");
    block[124..136].copy_from_slice(size);
    block[136..148].copy_from_slice(b"00000000000\0");
    block[156] = kind;
    let l = link.len().min(NAME_FIELD);
    block[157..157 + l].copy_from_slice(&link[..l]);
    if gnu {
        block[257..265].copy_from_slice(b"ustar  \0");
    } else {
        block[257..263].copy_from_slice(b"ustar\0");
        block[263..265].copy_from_slice(b"00");
    }
    block[148..156].fill(b' ');
    let sum: u32 = block.iter().map(|b| u32::from(*b)).sum();
    block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    out.extend_from_slice(&block);
    out.extend_from_slice(data);
    let pad = (BLOCK - data.len() % BLOCK) % BLOCK;
    out.resize(out.len() + pad, 0);
}

impl GzipSpec {
    /// `tar` wrapped as this spec says.
    pub fn wrap(&self, tar: &[u8]) -> Vec<u8> {
        match self {
            Self::Plain(level) => gzip(tar, u32::from(level % 10)),
            Self::TwoMembers(at) => {
                let at = usize::from(*at).min(tar.len());
                let mut out = gzip(&tar[..at], 1);
                out.extend(gzip(&tar[at..], 1));
                out
            }
            Self::Truncated(cut) => {
                let mut out = gzip(tar, 1);
                out.truncate(out.len().saturating_sub(usize::from(*cut)));
                out
            }
            Self::Trailing(bytes) => {
                let mut out = gzip(tar, 1);
                out.extend_from_slice(bytes);
                out
            }
            Self::Raw => tar.to_vec(),
        }
    }
}

/// `bytes` gzipped at `level`.
pub fn gzip(bytes: &[u8], level: u32) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::new(level));
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(bytes);
    encoder.finish().unwrap_or_default()
}

/// Inflates a gzip stream (to mutate a valid bundle's tar and wrap it again).
pub fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut out);
    out
}
