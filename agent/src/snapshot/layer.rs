//! Writing the walk's findings as an image layer (a tar stream).
//!
//! [`Layer`] is the walk's [`Sink`]: a directory becomes a header with its
//! mode, owner and mtime; a regular file its header and exactly the bytes its
//! header announces; a symlink its target, verbatim ([`append_symlink`]); a
//! second name of an inode already in the layer a hard link to the first;
//! fifos and devices their headers; a deletion an empty `.wh.` file; the
//! root directory's own metadata an entry named [`ROOT_ENTRY`]. A time
//! with a fraction of a second goes before its entry as a PAX `mtime`
//! record, and extended attributes as `SCHILY.xattr.` records
//! ([`Extras`]). Long names use the GNU extension. The tar
//! end marker is written by [`Layer::finish`] alone: a layer dropped after an
//! error, or unfinished for any other reason, ends without it, so a reader
//! can tell it was cut short.

use std::collections::HashMap;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use silo_protocol::exact::ExactReader;
use silo_protocol::extras::{Extras, MAX_XATTR_BYTES, Mtime, Xattr, is_pax_name};
use silo_protocol::link::append_symlink;
use silo_protocol::snapshot::ROOT_ENTRY;
use tar::{Builder, EntryType, Header, HeaderMode};

use super::walk::Sink;

/// Mode of a whiteout entry.
const WHITEOUT_MODE: u32 = 0o644;

/// What a finished layer holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Entries written, whiteouts included.
    pub entries: u64,
    /// File content bytes written.
    pub bytes: u64,
}

/// A tar stream of the paths under `root` that the walk reports.
pub struct Layer<W: Write> {
    root: PathBuf,
    builder: Builder<Sealed<W>>,
    /// (device, inode) → the first name written for an inode with more than
    /// one name.
    links: HashMap<(u64, u64), PathBuf>,
    stats: LayerStats,
}

impl<W: Write> Layer<W> {
    /// A layer of paths under `root`, written to `out`.
    pub fn new(root: &Path, out: W) -> Self {
        Self {
            root: root.to_owned(),
            builder: Builder::new(Sealed {
                inner: out,
                sealed: false,
            }),
            links: HashMap::new(),
            stats: LayerStats::default(),
        }
    }

    /// Writes the end marker: the layer is complete.
    pub fn finish(mut self) -> io::Result<LayerStats> {
        self.builder.finish()?;
        Ok(self.stats)
    }

    fn append(&mut self, rel: &Path, meta: &Metadata) -> io::Result<()> {
        let kind = meta.file_type();
        if kind.is_socket() {
            // Sockets (and anything stranger) are no part of an image.
            return Ok(());
        }
        // The root directory's own entry has a name of its own.
        let rel = if rel.as_os_str().is_empty() {
            Path::new(ROOT_ENTRY)
        } else {
            rel
        };
        let mut header = Header::new_gnu();
        header.set_metadata_in_mode(meta, HeaderMode::Complete);
        // Permission bits only (setuid, setgid and sticky included): the type
        // is the entry type's business.
        header.set_mode(meta.mode() & 0o7777);
        header.set_size(0);
        // A second name of an inode already in the layer (a file, a symlink,
        // a FIFO: any but a directory) is a hard link to the first.
        let inode = (!kind.is_dir() && meta.nlink() > 1).then(|| (meta.dev(), meta.ino()));
        let extras = Extras {
            mtime: Mtime {
                secs: meta.mtime(),
                nanos: u32::try_from(meta.mtime_nsec()).unwrap_or(0),
            },
            xattrs: xattrs_of(&self.root.join(rel))?,
            patch: None,
        };
        header.set_mtime(extras.mtime.header_secs());
        // A hard link carries its inode's time too: an engine sets the
        // times of every entry it makes, a link's included, and would
        // leave the shared inode with the link's whole seconds.
        extras.append(&mut self.builder)?;
        if let Some(first) = inode.and_then(|inode| self.links.get(&inode)) {
            header.set_entry_type(EntryType::Link);
            self.builder.append_link(&mut header, rel, first)?;
            self.stats.entries += 1;
            return Ok(());
        }
        if kind.is_dir() || kind.is_fifo() {
            self.builder.append_data(&mut header, rel, io::empty())?;
        } else if kind.is_symlink() {
            let target = fs::read_link(self.root.join(rel))?;
            append_symlink(
                &mut self.builder,
                &mut header,
                rel,
                target.as_os_str().as_bytes(),
            )?;
        } else if kind.is_file() {
            let file = open_same(&self.root.join(rel), meta)?;
            header.set_size(meta.len());
            let content = ExactReader::new(file, meta.len());
            self.builder.append_data(&mut header, rel, content)?;
            self.stats.bytes += meta.len();
        } else if kind.is_char_device() || kind.is_block_device() {
            let (major, minor) = device_numbers(meta.rdev());
            header.set_device_major(major)?;
            header.set_device_minor(minor)?;
            self.builder.append_data(&mut header, rel, io::empty())?;
        } else {
            // Linux has no other type (sockets went first).
            return Err(io::Error::other("a file of no type a layer can hold"));
        }
        if let Some(inode) = inode {
            self.links.insert(inode, rel.to_owned());
        }
        self.stats.entries += 1;
        Ok(())
    }

    fn add_whiteout(&mut self, rel: &Path) -> io::Result<()> {
        let mut header = Header::new_gnu();
        header.set_entry_type(EntryType::Regular);
        header.set_mode(WHITEOUT_MODE);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(0);
        self.builder.append_data(&mut header, rel, io::empty())?;
        self.stats.entries += 1;
        Ok(())
    }

    /// After a failed write nothing more may reach the stream, least of all
    /// the end marker that would make a partial layer look whole.
    fn seal_on_error<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        if result.is_err() {
            self.builder.get_mut().sealed = true;
        }
        result
    }
}

impl<W: Write> Sink for Layer<W> {
    fn root(&mut self, meta: &Metadata, _changed: bool) -> io::Result<()> {
        let result = self.append(Path::new(""), meta);
        self.seal_on_error(result)
    }

    fn entry(&mut self, rel: &Path, meta: &Metadata) -> io::Result<()> {
        let result = self.append(rel, meta);
        self.seal_on_error(result)
    }

    fn whiteout(&mut self, rel: &Path) -> io::Result<()> {
        let result = self.add_whiteout(rel);
        self.seal_on_error(result)
    }
}

impl<W: Write> Drop for Layer<W> {
    fn drop(&mut self) {
        // The builder writes the end marker when dropped unfinished; after
        // `finish` it writes nothing more, so sealing here only stops that.
        self.builder.get_mut().sealed = true;
    }
}

/// The output, refusing every write once sealed.
struct Sealed<W> {
    inner: W,
    sealed: bool,
}

impl<W: Write> Write for Sealed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.sealed {
            return Err(io::Error::other("layer abandoned after an error"));
        }
        self.inner.write(buf).inspect_err(|_| self.sealed = true)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Opens the regular file `path` without following a symlink or blocking on
/// a fifo, and checks it is still the inode `meta` describes.
fn open_same(path: &Path, meta: &Metadata) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let now = file.metadata()?;
    if !now.is_file() || now.dev() != meta.dev() || now.ino() != meta.ino() {
        return Err(io::Error::other("replaced while being read"));
    }
    Ok(file)
}

/// Prefixes of extended attributes no layer carries and no apply removes:
/// the overlay file system's own bookkeeping.
pub(crate) const XATTRS_LEFT_OUT: &[&str] = &["trusted.overlay."];

/// Whether a layer carries the extended attribute `name`.
pub(crate) fn carried(name: &str) -> bool {
    !XATTRS_LEFT_OUT
        .iter()
        .any(|prefix| name.starts_with(prefix))
}

/// The extended attributes of `path` (not following a symlink), those
/// whose names are UTF-8, can be PAX keys (no `=`) and are not the file
/// system's own; none where the file system has none. An empty value is
/// carried as one (`lgetxattr` tells it from an absent attribute).
fn xattrs_of(path: &Path) -> io::Result<Vec<Xattr>> {
    let names = match xattr::list(path) {
        Ok(names) => names,
        Err(err) if err.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for name in names {
        let Some(name) = name.to_str().filter(|name| is_pax_name(name)) else {
            continue;
        };
        if !carried(name) {
            continue;
        }
        // Gone since it was listed: nothing to carry.
        let Some(value) = xattr::get(path, name)? else {
            continue;
        };
        bytes = bytes.saturating_add(name.len() + value.len());
        if bytes > MAX_XATTR_BYTES {
            return Err(io::Error::other(format!(
                "over {MAX_XATTR_BYTES} bytes of extended attributes"
            )));
        }
        out.push((name.to_owned(), value));
    }
    out.sort();
    Ok(out)
}

/// Linux's `dev_t` split into major and minor numbers.
fn device_numbers(rdev: u64) -> (u32, u32) {
    let major = ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0x0000_0fff);
    let minor = ((rdev >> 12) & 0xffff_ff00) | (rdev & 0x0000_00ff);
    (
        u32::try_from(major).unwrap_or(u32::MAX),
        u32::try_from(minor).unwrap_or(u32::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_split_like_the_kernel() {
        // makedev(8, 1) and makedev(259, 70000).
        assert_eq!(device_numbers(0x801), (8, 1));
        let rdev = (70000u64 & 0xff) | ((259u64 & 0xfff) << 8) | ((70000u64 & !0xff) << 12);
        assert_eq!(device_numbers(rdev), (259, 70000));
    }

    #[test]
    fn an_abandoned_layer_has_no_end_marker() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("f"), b"x").unwrap();
        // Whole seconds: no time record before the entry.
        let whole = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        File::options()
            .write(true)
            .open(dir.path().join("f"))
            .unwrap()
            .set_modified(whole)
            .unwrap();
        let meta = fs::symlink_metadata(dir.path().join("f")).unwrap();
        let mut finished = Vec::new();
        let mut layer = Layer::new(dir.path(), &mut finished);
        layer.entry(Path::new("f"), &meta).unwrap();
        layer.finish().unwrap();
        assert_eq!(finished.len(), 512 * 2 + 1024);
        assert!(finished.ends_with(&[0; 1024]));

        let mut abandoned = Vec::new();
        let mut layer = Layer::new(dir.path(), &mut abandoned);
        layer.entry(Path::new("f"), &meta).unwrap();
        // Asking for a file that is not there fails and seals the layer.
        assert!(layer.entry(Path::new("missing"), &meta).is_err());
        assert!(layer.whiteout(Path::new(".wh.x")).is_err());
        drop(layer);
        assert_eq!(abandoned.len(), 512 * 2);
    }
}
