//! The pools' results: a warm pool (`PoolInfo`) and what a fill made
//! (`FillReport`).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use silo::{FillReport as Filled, PoolStatus};

use super::{json_dict, words};

result_class! {
    /// What filling a pool did.
    FillReport {
        /// Members made.
        made: usize,
        /// Why members could not be made, one line each.
        failed: Py<PyTuple>,
    }
}

impl FillReport {
    /// The library's fill.
    pub fn of(py: Python<'_>, filled: &Filled) -> PyResult<Self> {
        Ok(Self {
            made: filled.made,
            failed: words(py, &filled.failed)?,
        })
    }
}

result_class! {
    /// A warm pool (``Pools.list``, ``Pools.create``).
    PoolInfo {
        name: String,
        /// Members it keeps started.
        size: u32,
        /// Members ready to be claimed now.
        ready: usize,
        /// Their sandbox ids, oldest first.
        members: Py<PyTuple>,
        /// The spec of every member.
        spec: Py<PyDict>,
        /// The snapshot its members stand on (``Pools.create(snapshot=)``), if any.
        snapshot: Option<String> = None,
        /// What the fill ``Pools.create`` ran did, when it ran one.
        fill: Option<Py<FillReport>> = None,
    }
}

impl PoolInfo {
    /// A pool as listed.
    pub fn of(py: Python<'_>, status: &PoolStatus) -> PyResult<Self> {
        Self::make(py, status, None)
    }

    /// A pool just made, with the fill run on it, if one was.
    pub fn made(py: Python<'_>, (status, fill): &(PoolStatus, Option<Filled>)) -> PyResult<Self> {
        Self::make(py, status, fill.as_ref())
    }

    fn make(py: Python<'_>, status: &PoolStatus, fill: Option<&Filled>) -> PyResult<Self> {
        let fill = fill
            .map(|fill| Py::new(py, FillReport::of(py, fill)?))
            .transpose()?;
        Ok(Self {
            name: status.pool.name.clone(),
            size: status.pool.size,
            ready: status.ready,
            members: words(py, &status.members)?,
            spec: json_dict(py, &status.pool.spec)?,
            snapshot: status.pool.snapshot.clone(),
            fill,
        })
    }
}

/// Adds this module's classes.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<FillReport>()?;
    module.add_class::<PoolInfo>()
}
