//! A sample tree for copies in and out of sandboxes, and a digest of a
//! tree that two copies of it share: every path with its kind, mode and
//! the SHA-256 of its contents.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

/// Size of the sample's big file.
pub const BIG_FILE_BYTES: usize = 5 << 20;

/// Makes under `dir`: nested directories, an empty one, a binary file with
/// every byte value, an executable, a private file and a 5 MiB file.
pub fn sample(dir: &Path) {
    std::fs::create_dir_all(dir.join("nested/deeper/deepest")).unwrap();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    std::fs::write(dir.join("nested/deeper/deepest/leaf.txt"), "leaf\n").unwrap();
    std::fs::write(dir.join("nested/notes.md"), "# notes\n").unwrap();
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    std::fs::write(dir.join("binary.bin"), every_byte).unwrap();
    std::fs::write(dir.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    set_mode(&dir.join("run.sh"), 0o755);
    std::fs::write(dir.join("nested/private.key"), "secret\n").unwrap();
    set_mode(&dir.join("nested/private.key"), 0o600);
    let big = crate::push::incompressible(7, BIG_FILE_BYTES);
    std::fs::write(dir.join("big.bin"), big).unwrap();
}

/// Path → `dir`, `link -> target` or `file <mode> <sha256>`, for the tree
/// under `dir`.
pub fn digest(dir: &Path) -> BTreeMap<String, String> {
    crate::push::listing_with(dir, sha256_hex)
}

/// The SHA-256 of `data` in hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
