//! The push's results: what a fan-out did (`PushReport`), per sandbox
//! that has the files live (`Pushed`) or could not get them
//! (`PushFailure`).

use pyo3::prelude::*;
use pyo3::types::PyList;

result_class! {
    /// One sandbox that has the pushed files live.
    Pushed {
        sandbox: String,
        /// The mount's version now live.
        version: String,
        /// Digest of the bundle.
        sha256: String,
        files: u64,
        bytes: u64,
        /// It had the same files live already.
        unchanged: bool,
        attempts: u32,
        millis: u64,
    }
}

result_class! {
    /// One sandbox the push could not reach or was refused by.
    PushFailure {
        sandbox: String,
        /// ``stopped``, ``missing``, ``removed``, ``refused``, ``unreachable``, ...
        reason: String,
        detail: String,
        attempts: u32,
    }
}

result_class! {
    /// What a fan-out push did, per sandbox.
    PushReport {
        mount: String,
        targets: usize,
        succeeded: usize,
        /// Of the succeeded, how many had the same files live already.
        unchanged: usize,
        pushed: Py<PyList>,
        failures: Py<PyList>,
    }

    /// Whether every target has the files live.
    #[getter]
    fn ok(&self, py: Python<'_>) -> bool {
        self.failures.bind(py).is_empty() && self.succeeded == self.targets
    }
}

impl PushReport {
    /// The library's report of the fan-out.
    pub fn of(py: Python<'_>, report: &silo::PushReport) -> PyResult<Self> {
        let pushed = report.pushed.iter().map(|done| Pushed {
            sandbox: done.sandbox.clone(),
            version: done.version.clone(),
            sha256: done.sha256.clone(),
            files: done.files,
            bytes: done.bytes,
            unchanged: done.unchanged,
            attempts: done.attempts,
            millis: done.millis,
        });
        let failures = report.failures.iter().map(|failed| PushFailure {
            sandbox: failed.sandbox.clone(),
            reason: failed.reason.clone(),
            detail: failed.detail.clone(),
            attempts: failed.attempts,
        });
        Ok(Self {
            mount: report.mount.clone(),
            targets: report.targets,
            succeeded: report.succeeded,
            unchanged: report.unchanged,
            pushed: PyList::new(py, pushed)?.unbind(),
            failures: PyList::new(py, failures)?.unbind(),
        })
    }
}

/// Adds this module's classes.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Pushed>()?;
    module.add_class::<PushFailure>()?;
    module.add_class::<PushReport>()
}
