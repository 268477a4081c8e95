//! The files' results: one path described (`EntryInfo`), what a copy moved
//! (`CopyReport`), and one change in a watched directory
//! (`FilesystemEvent`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDateTime;
use silo::silo_protocol::exec::{FsEvent, FsEventKind};
use silo::silo_protocol::files::FileKind;
use silo::{Copied, FileStat};

use super::utc;

result_class! {
    /// One path in a sandbox (E2B's ``EntryInfo``).
    EntryInfo {
        name: String,
        /// ``file``, ``dir``, ``symlink`` or ``other``.
        r#type: String,
        path: String,
        size: u64,
        /// Permission bits, as an int (0o644).
        mode: u32,
        modified_time: Py<PyDateTime>,
        symlink_target: Option<String> = None,
    }

    /// The mode as ``ls`` shows it, without the type (``rw-r--r--``).
    #[getter]
    fn permissions(&self) -> String {
        "rwxrwxrwx"
            .chars()
            .enumerate()
            .map(|(i, c)| if self.mode & (1 << (8 - i)) != 0 { c } else { '-' })
            .collect()
    }
}

impl EntryInfo {
    /// What the agent says of one path.
    pub fn of(py: Python<'_>, stat: &FileStat) -> PyResult<Self> {
        let kind = match stat.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        };
        Ok(Self {
            name: stat.name.clone(),
            r#type: kind.to_owned(),
            path: stat.path.clone(),
            size: stat.size,
            mode: stat.mode,
            modified_time: utc(py, stat.modified_ms)?,
            symlink_target: stat.link_target.clone(),
        })
    }
}

result_class! {
    /// What ``files.upload`` or ``files.download`` copied.
    CopyReport {
        /// Where it landed.
        path: String,
        files: u64,
        dirs: u64,
        bytes: u64,
    }
}

impl CopyReport {
    /// What the library's copy moved.
    pub fn of(_py: Python<'_>, copied: &Copied) -> PyResult<Self> {
        Ok(Self {
            path: copied.path.clone(),
            files: copied.files,
            dirs: copied.dirs,
            bytes: copied.bytes,
        })
    }
}

result_class! {
    /// One change in a watched directory (E2B's ``FilesystemEvent``).
    FilesystemEvent {
        /// The path, relative to the watched directory.
        name: String,
        /// A ``FilesystemEventType``.
        r#type: Py<PyAny>,
        /// The path is a directory.
        is_dir: bool = false,
    }
}

/// `silo_sandbox.FilesystemEventType`, looked up on the first event: a
/// `str` enum is a Python class, since a native class cannot subclass `str`.
static EVENT_TYPE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

impl FilesystemEvent {
    /// One change the agent reported.
    pub fn of(py: Python<'_>, event: &FsEvent) -> PyResult<Self> {
        let kind = match event.kind {
            FsEventKind::Create => "create",
            FsEventKind::Write => "write",
            FsEventKind::Remove => "remove",
            FsEventKind::Rename => "rename",
            FsEventKind::Chmod => "chmod",
            FsEventKind::Overflow => "overflow",
        };
        let types = EVENT_TYPE.get_or_try_init(py, || {
            let core = py.import("silo_sandbox._core")?;
            Ok::<_, PyErr>(core.getattr("FilesystemEventType")?.unbind())
        })?;
        Ok(Self {
            name: event.name.clone(),
            r#type: types.bind(py).call1((kind,))?.unbind(),
            is_dir: event.dir,
        })
    }
}

/// Adds this module's classes.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<EntryInfo>()?;
    module.add_class::<CopyReport>()?;
    module.add_class::<FilesystemEvent>()
}
