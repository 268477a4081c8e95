//! A sandbox's results: as `list` sees it (`SandboxInfo`), as the state
//! recorded it (`SandboxRecord`), how it came to be (`OpenReport`,
//! `ForkReport`), and where one of its ports is reached (`PortUrl`).

use pyo3::prelude::*;
use pyo3::types::{PyDateTime, PyDict, PyTuple};
use silo::{RestoreReport, SandboxRecord as Record, UpAction, UpOutcome};

use super::{json_dict, utc, words};

result_class! {
    /// One sandbox as ``list`` sees it (E2B's ``SandboxInfo``).
    SandboxInfo {
        sandbox_id: String,
        name: String,
        backend: String,
        /// ``running``, ``stopped`` or ``missing`` (what its backend says now).
        state: String,
        /// Its labels (E2B's metadata).
        metadata: Py<PyDict>,
        started_at: Py<PyDateTime>,
        spec: Py<PyDict>,
    }
}

impl SandboxInfo {
    /// A record with what its backend says of its machine now.
    pub fn of(py: Python<'_>, (record, state): &(Record, String)) -> PyResult<Self> {
        Ok(Self {
            sandbox_id: record.id.clone(),
            name: record.name.clone(),
            backend: record.backend.as_str().to_owned(),
            state: state.clone(),
            metadata: labels(py, record)?,
            started_at: utc(py, record.created_at_ms)?,
            spec: json_dict(py, &record.spec)?,
        })
    }
}

/// A sandbox's labels, as a dict of its own.
fn labels(py: Python<'_>, record: &Record) -> PyResult<Py<PyDict>> {
    let labels = PyDict::new(py);
    for (key, value) in &record.spec.labels {
        labels.set_item(key, value)?;
    }
    Ok(labels.unbind())
}

result_class! {
    /// What silo's state recorded of a sandbox (``info()``).
    SandboxRecord {
        sandbox_id: String,
        name: String,
        backend: String,
        /// Its labels (E2B's metadata).
        metadata: Py<PyDict>,
        /// The spec it was made with.
        spec: Py<PyDict>,
        created_at: Py<PyDateTime>,
        updated_at: Py<PyDateTime>,
        /// The snapshot it was forked or restored from, if any.
        origin_snapshot: Option<String>,
        /// The snapshot its files were last taken to or rewound to, if any.
        checkpoint: Option<String>,
        /// The whole record, as ``silo ls --json`` prints it.
        raw: Py<PyDict>,
    }
}

impl SandboxRecord {
    /// The state's record.
    pub fn of(py: Python<'_>, record: &Record) -> PyResult<Self> {
        Ok(Self {
            sandbox_id: record.id.clone(),
            name: record.name.clone(),
            backend: record.backend.as_str().to_owned(),
            metadata: labels(py, record)?,
            spec: json_dict(py, &record.spec)?,
            created_at: utc(py, record.created_at_ms)?,
            updated_at: utc(py, record.updated_at_ms)?,
            origin_snapshot: record.origin_snapshot.clone(),
            checkpoint: record.checkpoint.as_ref().map(|c| c.snapshot.clone()),
            raw: json_dict(py, record)?,
        })
    }
}

result_class! {
    /// What ``Sandbox.open`` did (``Sandbox.made``): the tier it took.
    OpenReport {
        /// ``attached`` or ``started`` (tier 1), ``restored`` (tier 2: from
        /// its latest snapshot), ``created``, ``recreated`` or ``claimed`` (tier
        /// 3: new, or taken from a warm pool).
        action: String,
        tier: u8,
        /// Why a tier was passed over (machine gone, spec changed, ...).
        notes: Py<PyTuple>,
        /// Wall time of the call, in milliseconds.
        ms: f64,
    }
}

impl OpenReport {
    /// What `silo up` did, and how long it took.
    pub fn of(py: Python<'_>, (outcome, ms): &(UpOutcome, f64)) -> PyResult<Self> {
        Ok(Self {
            action: action_name(outcome.action).to_owned(),
            tier: outcome.tier,
            notes: words(py, &outcome.notes)?,
            ms: *ms,
        })
    }
}

/// What `silo up` did, by the name the CLI's JSON gives it.
pub fn action_name(action: UpAction) -> &'static str {
    match action {
        UpAction::Attached => "attached",
        UpAction::Started => "started",
        UpAction::Restored => "restored",
        UpAction::Created => "created",
        UpAction::Recreated => "recreated",
        UpAction::Claimed => "claimed",
    }
}

result_class! {
    /// How a fork was made (``Sandbox.made`` after ``fork`` or ``fork_many``).
    ForkReport {
        /// The snapshot it was made from.
        snapshot: String,
        /// The warm pool it was claimed from, if any.
        pool: Option<String>,
        /// Why a new machine was made instead of claiming a pool member, if one was.
        new_machine_because: Option<String>,
        /// Wall time until its agent answered, in milliseconds.
        ms: f64,
    }
}

impl ForkReport {
    /// What the library's fork did.
    pub fn of(_py: Python<'_>, report: &RestoreReport) -> PyResult<Self> {
        Ok(Self {
            snapshot: report.snapshot.clone(),
            pool: report.pool.clone(),
            new_machine_because: report.new_machine_because.clone(),
            ms: report.ms,
        })
    }
}

result_class! {
    /// Where a port inside a sandbox is reached from the host.
    PortUrl {
        host: String,
        url: String,
        /// ``(name, value)`` headers a client must send (daytona's preview token).
        headers: Py<PyTuple> = { super::no_items() },
    }
}

impl PortUrl {
    /// Where the backend routes the port.
    pub fn of(py: Python<'_>, url: &silo::PortUrl) -> PyResult<Self> {
        let headers = url
            .headers
            .iter()
            .map(|(name, value)| PyTuple::new(py, [name, value]))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Self {
            host: url.host.clone(),
            url: url.url.clone(),
            headers: PyTuple::new(py, headers)?.unbind(),
        })
    }
}

/// Adds this module's classes.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<SandboxInfo>()?;
    module.add_class::<SandboxRecord>()?;
    module.add_class::<OpenReport>()?;
    module.add_class::<ForkReport>()?;
    module.add_class::<PortUrl>()
}
