//! The snapshots' results: a snapshot (`Snapshot`), how a rewind went
//! (`RewindReport`), and what differs from one (`Diff` of `PathChange`s).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDateTime, PyDict, PyTuple};
use silo::{
    Aspect, DiffReport, DiffedPath, ImageSource, PathChange as Change, RestoreReport,
    Snapshot as Recorded, SnapshotReport,
};

use super::{json_dict, no_entries, no_items, utc};

result_class! {
    /// A snapshot of a sandbox's file system (processes and memory are not
    /// captured).
    Snapshot {
        id: String,
        sandbox_id: String,
        sandbox_name: String,
        parent: Option<String>,
        message: Option<String>,
        layer_bytes: u64,
        created_at: Py<PyDateTime>,
        /// The full report (timings, entries) when it was just taken.
        report: Py<PyDict> = { no_entries() },
    }
}

impl Snapshot {
    /// A snapshot as the state recorded it.
    pub fn of(py: Python<'_>, snapshot: &Recorded) -> PyResult<Self> {
        Self::with_report(py, snapshot, PyDict::new(py).unbind())
    }

    /// A snapshot just taken, with the report of its taking.
    pub fn taken(py: Python<'_>, report: &SnapshotReport) -> PyResult<Self> {
        Self::with_report(py, &report.snapshot, json_dict(py, report)?)
    }

    fn with_report(py: Python<'_>, snapshot: &Recorded, report: Py<PyDict>) -> PyResult<Self> {
        Ok(Self {
            id: snapshot.id.clone(),
            sandbox_id: snapshot.sandbox_id.clone(),
            sandbox_name: snapshot.sandbox_name.clone(),
            parent: snapshot.parent.clone(),
            message: snapshot.message.clone(),
            layer_bytes: snapshot.layer_bytes,
            created_at: utc(py, snapshot.created_at_ms)?,
            report,
        })
    }
}

result_class! {
    /// How a rewind went (``snapshots.rewind``).
    RewindReport {
        /// The snapshot the files went back to.
        snapshot: String,
        /// Restored in place by the agent (milliseconds), not on a new machine.
        in_place: bool,
        /// Why a new machine was made instead, when one was.
        new_machine_because: Option<String>,
        /// Paths the rewind changed.
        changed: u64,
        /// The sandbox's processes it ended.
        processes_ended: u64,
        /// Wall time, in milliseconds.
        ms: f64,
        /// The whole report, with the phases' timings.
        raw: Py<PyDict>,
    }
}

impl RewindReport {
    /// What the library's rewind did.
    pub fn of(py: Python<'_>, report: &RestoreReport) -> PyResult<Self> {
        let (in_place, changed, processes_ended) = match &report.image {
            ImageSource::InPlace(done) => (true, done.stats.changed, done.processes_ended),
            _ => (false, 0, 0),
        };
        Ok(Self {
            snapshot: report.snapshot.clone(),
            in_place,
            new_machine_because: report.new_machine_because.clone(),
            changed,
            processes_ended,
            ms: report.ms,
            raw: json_dict(py, report)?,
        })
    }
}

result_class! {
    /// One path that differs between two file systems.
    PathChange {
        path: String,
        /// ``added``, ``removed`` or ``changed``.
        change: String,
        /// For ``changed``: what differs (``content``, ``mode``, ``kind``, ...).
        what: Py<PyTuple> = { no_items() },
        /// The path's exact bytes when it is not UTF-8 (``path`` then shows
        /// each bad byte as U+FFFD); ``None`` when ``path`` is exact.
        path_raw: Option<Py<PyBytes>> = None,
    }
}

impl PathChange {
    /// One path of the library's diff.
    fn of(py: Python<'_>, diffed: &DiffedPath) -> PyResult<Self> {
        let (change, what) = match &diffed.change {
            Change::Added => ("added", Vec::new()),
            Change::Removed => ("removed", Vec::new()),
            Change::Changed { what } => ("changed", what.iter().map(|a| aspect(*a)).collect()),
        };
        Ok(Self {
            path: diffed.path.clone(),
            change: change.to_owned(),
            what: PyTuple::new(py, what)?.unbind(),
            path_raw: diffed
                .path_raw
                .as_deref()
                .map(|raw| PyBytes::new(py, raw).unbind()),
        })
    }
}

/// A respect in which a path differs, by the name the CLI's JSON gives it.
fn aspect(aspect: Aspect) -> &'static str {
    match aspect {
        Aspect::Kind => "kind",
        Aspect::Mode => "mode",
        Aspect::Owner => "owner",
        Aspect::Content => "content",
        Aspect::Target => "target",
        Aspect::Xattrs => "xattrs",
        Aspect::Mtime => "mtime",
        Aspect::Links => "links",
    }
}

result_class! {
    /// What differs between a sandbox's files and a snapshot (``snapshots.diff``).
    Diff {
        /// The snapshot compared with.
        snapshot: String,
        /// The snapshot the files now were captured as.
        live: String,
        paths: Py<PyTuple>,
    }
}

impl Diff {
    /// The library's diff.
    pub fn of(py: Python<'_>, report: &DiffReport) -> PyResult<Self> {
        let paths = report
            .paths
            .iter()
            .map(|diffed| Py::new(py, PathChange::of(py, diffed)?))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Self {
            snapshot: report.snapshot.clone(),
            live: report.live.clone(),
            paths: PyTuple::new(py, paths)?.unbind(),
        })
    }
}

/// Adds this module's classes.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Snapshot>()?;
    module.add_class::<RewindReport>()?;
    module.add_class::<PathChange>()?;
    module.add_class::<Diff>()
}
