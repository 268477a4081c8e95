//! The kinds of operation a step is drawn from, by the names
//! `SILO_EXACT_KINDS` lists, so a run can be narrowed to the kinds that
//! break the promise.

use super::KINDS_VAR;

/// One kind of operation; the names are what `SILO_EXACT_KINDS` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Write a file (new, or over one there), 0 to 64 KiB.
    Write,
    /// Append to a file.
    Append,
    /// Truncate a file to a shorter or longer size.
    Truncate,
    /// `mkdir -p` a few levels.
    Mkdir,
    /// Remove a file.
    Rm,
    /// `rm -rf` a directory made by a step.
    RmDir,
    /// Rename a file, to a new name or over another file.
    Mv,
    /// Rename a directory holding files.
    MvDir,
    /// A symlink, new or replacing a file.
    Symlink,
    /// A hard link to a file.
    HardLink,
    /// `chmod` with setuid, setgid and sticky bits.
    Chmod,
    /// `chown` to numeric ids (image directories too).
    Chown,
    /// `touch -d @SECONDS`, symlinks' own times included.
    Touch,
    /// A named pipe.
    Mkfifo,
    /// A file or directory whose name is not UTF-8.
    OddName,
    /// A name of up to 255 bytes.
    LongName,
    /// A file at the bottom of a deep directory chain.
    Deep,
    /// Delete a file of the image.
    RmImage,
    /// A file replaced by a directory at the same path, or the other way.
    Replace,
    /// A directory moved aside and a symlink put in its place, or the
    /// swap undone (the directory back where the link was).
    SwapLink,
    /// A file of megabytes: written, changed in the middle, appended to
    /// or cut short.
    BigFile,
    /// A sparse file, with holes at both ends, or a byte written into one.
    Sparse,
    /// `chmod` or `chown` of the root directory itself.
    Root,
    /// An extended attribute set (any bytes, empty included) or removed
    /// from the host, behind the agent's back, on a file, a directory or
    /// the root.
    Xattr,
}

impl OpKind {
    /// Every kind, in the order `SILO_EXACT_KINDS` documents them.
    pub const ALL: [OpKind; 24] = [
        Self::Write,
        Self::Append,
        Self::Truncate,
        Self::Mkdir,
        Self::Rm,
        Self::RmDir,
        Self::Mv,
        Self::MvDir,
        Self::Symlink,
        Self::HardLink,
        Self::Chmod,
        Self::Chown,
        Self::Touch,
        Self::Mkfifo,
        Self::OddName,
        Self::LongName,
        Self::Deep,
        Self::RmImage,
        Self::Replace,
        Self::SwapLink,
        Self::BigFile,
        Self::Sparse,
        Self::Root,
        Self::Xattr,
    ];

    /// Its name in `SILO_EXACT_KINDS`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Append => "append",
            Self::Truncate => "truncate",
            Self::Mkdir => "mkdir",
            Self::Rm => "rm",
            Self::RmDir => "rmdir",
            Self::Mv => "mv",
            Self::MvDir => "mvdir",
            Self::Symlink => "symlink",
            Self::HardLink => "hardlink",
            Self::Chmod => "chmod",
            Self::Chown => "chown",
            Self::Touch => "touch",
            Self::Mkfifo => "mkfifo",
            Self::OddName => "oddname",
            Self::LongName => "longname",
            Self::Deep => "deep",
            Self::RmImage => "rmimage",
            Self::Replace => "replace",
            Self::SwapLink => "swaplink",
            Self::BigFile => "bigfile",
            Self::Sparse => "sparse",
            Self::Root => "root",
            Self::Xattr => "xattr",
        }
    }

    /// The kind called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name.trim())
    }

    /// The kinds `SILO_EXACT_KINDS` lists, else all. Panics on a name it
    /// does not know, listing the ones it does.
    pub fn from_env() -> Vec<Self> {
        let Ok(list) = std::env::var(KINDS_VAR) else {
            return Self::ALL.to_vec();
        };
        let kinds: Vec<Self> = list
            .split(',')
            .filter(|n| !n.trim().is_empty())
            .map(|name| {
                Self::parse(name).unwrap_or_else(|| {
                    let known: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                    panic!("{KINDS_VAR}: no kind {name:?}; kinds: {}", known.join(","))
                })
            })
            .collect();
        assert!(!kinds.is_empty(), "{KINDS_VAR} names no kind");
        kinds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_named_once_and_parses_back() {
        for kind in OpKind::ALL {
            assert_eq!(OpKind::parse(kind.name()), Some(kind));
        }
    }
}
