//! Changes made to a live sandbox's tree from the host, behind its agent's
//! back, through `/proc/<pid>/root` of the container's init: what no
//! command in the sandbox can make where its image lacks the tool (busybox
//! has no `setfattr`), and what a snapshot must see all the same.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// `path` (absolute in the sandbox) as the host reaches it.
fn host_path(pid: u32, path: &[u8]) -> io::Result<CString> {
    let mut host = PathBuf::from(format!("/proc/{pid}/root")).into_os_string();
    host.push(std::ffi::OsStr::from_bytes(path));
    CString::new(host.as_bytes()).map_err(io::Error::other)
}

/// Sets extended attribute `name` of `path` to `value` (any bytes, empty
/// included), never following a link.
pub fn set_xattr(pid: u32, path: &[u8], name: &str, value: &[u8]) -> io::Result<()> {
    let (c_path, c_name) = (host_path(pid, path)?, CString::new(name)?);
    // SAFETY: both strings are NUL-terminated; `value` is valid for its length.
    let done = unsafe {
        libc::lsetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    match done {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Removes extended attribute `name` of `path`; one not there is no error.
pub fn remove_xattr(pid: u32, path: &[u8], name: &str) -> io::Result<()> {
    let (c_path, c_name) = (host_path(pid, path)?, CString::new(name)?);
    // SAFETY: both strings are NUL-terminated.
    let done = unsafe { libc::lremovexattr(c_path.as_ptr(), c_name.as_ptr()) };
    match done {
        0 => Ok(()),
        _ => match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENODATA) => Ok(()),
            e => Err(e),
        },
    }
}
