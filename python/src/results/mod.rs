//! The result types: what the package's calls answer, as frozen classes
//! made here from the library's own reports (a `silo::FileStat`, a
//! `silo::RestoreReport`), the same objects for the blocking and the
//! asyncio classes.
//!
//! Each class is a value, as the dataclasses it replaced were: its fields
//! are read-only attributes, it compares and hashes by them, reads back as
//! `Name(field=value, ...)`, and pickles and copies through its
//! constructor, which takes the fields in order (`result_class!`). A field
//! that is free-form JSON (a spec, a whole report) is a dict made by
//! [`runtime::json_object`], the crate's one conversion of JSON data; a
//! time is an aware `datetime` in UTC.
//!
//! # Layout
//! - `commands`: a command's end and events, sessions and processes.
//! - `files`: a path's description, a copy's report, a watched change.
//! - `sandboxes`: a sandbox as listed and recorded, how it was opened or
//!   forked, where a port is reached.
//! - `snapshots`: a snapshot, a rewind, a diff.
//! - `pools`: a warm pool and a fill.
//! - `push`: a fan-out push and its targets.

/// Declares a result class: the struct (frozen, each field a read-only
/// attribute of the same name), a constructor taking the fields in order
/// (`= default` on trailing ones, as a dataclass has them: a literal, which
/// the signature Python shows spells out, or a `{ block }`), and the value
/// methods of [`Fields`]. Methods of the class's own (a derived property)
/// follow the braces.
macro_rules! result_class {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$field_meta:meta])* $field:ident : $ty:ty $(= $default:tt)? ),+ $(,)?
        }
        $($methods:tt)*
    ) => {
        $(#[$meta])*
        #[::pyo3::pyclass(frozen, get_all, module = "silo_sandbox")]
        pub struct $name {
            $( $(#[$field_meta])* $field: $ty, )+
        }

        impl $crate::results::Fields for $name {
            const NAME: &'static str = stringify!($name);
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),+];
        }

        #[::pyo3::pymethods]
        impl $name {
            #[new]
            #[pyo3(signature = ($($field $(= $default)?),+))]
            #[allow(clippy::too_many_arguments, reason = "a value's constructor takes each field")]
            fn new($($field: $ty),+) -> Self {
                Self { $($field),+ }
            }

            fn __repr__(slf: &::pyo3::Bound<'_, Self>) -> ::pyo3::PyResult<String> {
                $crate::results::repr::<Self>(slf.as_any())
            }

            fn __eq__(
                slf: &::pyo3::Bound<'_, Self>,
                other: &::pyo3::Bound<'_, ::pyo3::PyAny>,
            ) -> ::pyo3::PyResult<::pyo3::Py<::pyo3::PyAny>> {
                $crate::results::equal::<Self>(slf.as_any(), other)
            }

            fn __hash__(slf: &::pyo3::Bound<'_, Self>) -> ::pyo3::PyResult<isize> {
                $crate::results::hash::<Self>(slf.as_any())
            }

            fn __reduce__<'py>(
                slf: &::pyo3::Bound<'py, Self>,
            ) -> ::pyo3::PyResult<::pyo3::Bound<'py, ::pyo3::types::PyTuple>> {
                $crate::results::reduce::<Self>(slf.as_any())
            }

            $($methods)*
        }
    };
}

pub mod commands;
pub mod files;
pub mod pools;
pub mod push;
pub mod sandboxes;
pub mod snapshots;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDateTime, PyDict, PyTuple, PyTzInfo};

use crate::runtime::{self, Answer};

/// What the value methods of a result class read: its name and its
/// fields, in the constructor's order.
pub trait Fields {
    /// The class's name.
    const NAME: &'static str;
    /// Its fields, as Rust spells them (`r#type` for `type`).
    const FIELDS: &'static [&'static str];
}

/// A field's attribute name (a Rust keyword is written raw).
fn attribute(field: &'static str) -> &'static str {
    field.strip_prefix("r#").unwrap_or(field)
}

/// The values of `value`'s fields, in order: what it compares, hashes and
/// pickles by.
pub fn fields<'py, T: Fields>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
    let values = T::FIELDS
        .iter()
        .map(|field| value.getattr(attribute(field)))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(value.py(), values)
}

/// `Name(field=repr, ...)`, as a dataclass reads.
pub fn repr<T: Fields>(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut parts = Vec::with_capacity(T::FIELDS.len());
    for field in T::FIELDS {
        let name = attribute(field);
        parts.push(format!("{name}={}", value.getattr(name)?.repr()?.to_cow()?));
    }
    Ok(format!("{}({})", T::NAME, parts.join(", ")))
}

/// Equal when `other` is of the same class with equal fields; another
/// class is left to decide (`NotImplemented`), as a dataclass does.
pub fn equal<T: Fields>(value: &Bound<'_, PyAny>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let py = value.py();
    if !other.get_type().is(value.get_type()) {
        return Ok(py.NotImplemented());
    }
    fields::<T>(value)?.eq(fields::<T>(other)?)?.into_py_any(py)
}

/// The hash of its fields (a dict among them makes it unhashable, as it
/// makes a frozen dataclass).
pub fn hash<T: Fields>(value: &Bound<'_, PyAny>) -> PyResult<isize> {
    fields::<T>(value)?.hash()
}

/// `(class, fields)`: pickling and `copy` make it again by its constructor.
pub fn reduce<'py, T: Fields>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
    let class = value.get_type().into_any();
    PyTuple::new(value.py(), [class, fields::<T>(value)?.into_any()])
}

/// An answer of the result `make` builds from `value` once the GIL is held.
pub fn answer<T, R>(value: T, make: fn(Python<'_>, &T) -> PyResult<R>) -> Answer
where
    T: Send + 'static,
    R: for<'py> IntoPyObject<'py> + 'static,
{
    Box::new(move |py| make(py, &value)?.into_py_any(py))
}

/// An answer of a list of the results `make` builds, one per value.
pub fn answer_each<T, R>(values: Vec<T>, make: fn(Python<'_>, &T) -> PyResult<R>) -> Answer
where
    T: Send + 'static,
    R: for<'py> IntoPyObject<'py> + 'static,
{
    Box::new(move |py| {
        let made = values
            .iter()
            .map(|value| make(py, value))
            .collect::<PyResult<Vec<R>>>()?;
        made.into_py_any(py)
    })
}

/// A time the library gives in Unix milliseconds, as an aware `datetime`
/// in UTC.
pub fn utc(py: Python<'_>, unix_ms: i64) -> PyResult<Py<PyDateTime>> {
    // Milliseconds are exact in an f64 for some 280 000 years either way.
    #[allow(clippy::cast_precision_loss, reason = "exact in this range")]
    let seconds = unix_ms as f64 / 1000.0;
    let zone = PyTzInfo::utc(py)?;
    Ok(PyDateTime::from_timestamp(py, seconds, Some(&*zone))?.unbind())
}

/// Free-form JSON data (a spec, a whole report) as a dict.
pub fn json_dict<T: serde::Serialize>(py: Python<'_>, data: &T) -> PyResult<Py<PyDict>> {
    Ok(runtime::json_object(py, data)?
        .cast_into::<PyDict>()?
        .unbind())
}

/// Words as a tuple of `str`.
pub fn words<S: AsRef<str>>(py: Python<'_>, words: &[S]) -> PyResult<Py<PyTuple>> {
    Ok(PyTuple::new(py, words.iter().map(AsRef::as_ref))?.unbind())
}

/// The default of an empty bytes field.
fn no_bytes() -> Py<PyBytes> {
    Python::attach(|py| PyBytes::new(py, b"").unbind())
}

/// The default of an empty tuple field.
fn no_items() -> Py<PyTuple> {
    Python::attach(|py| PyTuple::empty(py).unbind())
}

/// The default of an empty dict field.
fn no_entries() -> Py<PyDict> {
    Python::attach(|py| PyDict::new(py).unbind())
}

/// Adds every result class to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    commands::register(module)?;
    files::register(module)?;
    sandboxes::register(module)?;
    snapshots::register(module)?;
    pools::register(module)?;
    push::register(module)
}
