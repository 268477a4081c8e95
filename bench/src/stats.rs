//! Percentiles over latency samples.

use std::time::Duration;

/// Samples (latencies in milliseconds, or other values pushed as they
/// are), sorted on demand.
#[derive(Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1000.0);
    }

    /// Adds one sample that is not a time (a size, say), as it is.
    pub fn push_value(&mut self, value: f64) {
        self.0.push(value);
    }

    /// How many samples.
    #[allow(
        clippy::len_without_is_empty,
        reason = "nothing asks whether it is empty"
    )]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds every sample of `other`.
    pub fn append(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    /// The `p`th percentile (0..=100), nearest-rank.
    pub fn percentile(&self, p: f64) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        if sorted.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }
}
