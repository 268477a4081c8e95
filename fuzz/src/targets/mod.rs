//! The fuzz targets: each makes inputs from a case's random stream and runs
//! one through the code under test, returning an escape for what its oracle
//! forbids (panics are caught by the runner).

use arbitrary::{Arbitrary, Unstructured};
use fastrand::Rng;

use crate::mutate::{entropy, mutate};
use crate::tarspec::TarSpec;

pub mod admit;
pub mod archive;
pub mod exec;
pub mod extract;
pub mod layer;

/// One fuzz target.
pub trait Target {
    /// Its name on the command line.
    fn name(&self) -> &'static str;
    /// One input, made from the case's random stream.
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8>;
    /// Runs one input; `Err` names what the oracle caught.
    fn run(&mut self, input: &[u8]) -> Result<(), String>;
}

/// Every target, cheapest first.
pub const TARGET_NAMES: [&str; 5] = ["exec", "admit", "layer", "extract", "archive"];

/// The target called `name`.
pub fn make_target(name: &str) -> anyhow::Result<Box<dyn Target>> {
    Ok(match name {
        "exec" => Box::new(exec::Exec::new()),
        "admit" => Box::new(admit::Admit::new()?),
        "layer" => Box::new(layer::Layer::new()),
        "extract" => Box::new(extract::Extract::new()?),
        "archive" => Box::new(archive::Archive::new()?),
        other => anyhow::bail!(
            "unknown target {other:?} (known: {})",
            TARGET_NAMES.join(", ")
        ),
    })
}

/// A typed value shaped by `arbitrary` from up to `max` random bytes.
pub fn shape<T: for<'a> Arbitrary<'a>>(rng: &mut Rng, max: usize) -> Option<T> {
    let bytes = entropy(rng, max);
    T::arbitrary(&mut Unstructured::new(&bytes)).ok()
}

/// Random bytes shaped into one structured tar.
pub const TAR_SHAPE_BYTES: usize = 2048;

/// In `structured` cases of 4 a structured tar (absolute names under
/// `/probe`), otherwise a mutant of one of `seeds`.
pub fn tar_or_mutant(
    rng: &mut Rng,
    structured: u8,
    seeds: &[Vec<u8>],
    dict: &[Vec<u8>],
) -> Vec<u8> {
    if rng.u8(0..4) < structured || seeds.is_empty() {
        return shape::<TarSpec>(rng, TAR_SHAPE_BYTES)
            .map(|spec| spec.build("/probe"))
            .unwrap_or_default();
    }
    let seed = &seeds[rng.usize(..seeds.len())];
    mutate(rng, seed, seeds, dict)
}
