//! Build contexts made in memory: a tar stream holding a Dockerfile and the
//! files it copies, sent to the engine's build API as it is. Nothing is
//! staged on disk, so a build never depends on (or litters) the working
//! directory.

use std::io;

/// Modification time recorded in every entry: fixed, so the same inputs
/// give the same context bytes and the engine's build cache can match them.
const MTIME: u64 = 0;

/// A tar build context being assembled.
pub struct Context {
    builder: tar::Builder<Vec<u8>>,
}

impl Default for Context {
    fn default() -> Self {
        Self::new()
    }
}

impl Context {
    /// An empty context.
    pub fn new() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
        }
    }

    /// Adds a regular file.
    pub fn file(&mut self, path: &str, mode: u32, bytes: &[u8]) -> io::Result<()> {
        let mut header = header(tar::EntryType::Regular, mode);
        header.set_size(bytes.len() as u64);
        self.builder.append_data(&mut header, path, bytes)
    }

    /// Adds a directory.
    pub fn dir(&mut self, path: &str, mode: u32) -> io::Result<()> {
        let mut header = header(tar::EntryType::Directory, mode);
        header.set_size(0);
        self.builder.append_data(&mut header, path, io::empty())
    }

    /// Adds a symbolic link.
    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        let mut header = header(tar::EntryType::Symlink, 0o777);
        header.set_size(0);
        self.builder.append_link(&mut header, path, target)
    }

    /// The finished tar bytes.
    pub fn finish(self) -> io::Result<Vec<u8>> {
        self.builder.into_inner()
    }
}

fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_mtime(MTIME);
    header.set_uid(0);
    header.set_gid(0);
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let mut context = Context::new();
        context
            .file("Dockerfile", 0o644, b"FROM scratch\n")
            .unwrap();
        context.dir("rootfs/tmp", 0o1777).unwrap();
        context.symlink("rootfs/bin/sh", "/bin/busybox").unwrap();
        let bytes = context.finish().unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let names: Vec<(String, tar::EntryType, u32)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let header = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    header.entry_type(),
                    header.mode().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names[0],
            ("Dockerfile".into(), tar::EntryType::Regular, 0o644)
        );
        assert_eq!(names[1].2, 0o1777);
        assert_eq!(names[2].1, tar::EntryType::Symlink);
    }
}
