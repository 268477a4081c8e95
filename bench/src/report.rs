//! One row per measured figure: silo's number, the plain alternative's, their
//! ratio and the target, printed as a table and written as JSON, with the
//! scenarios that could not run.

use std::path::Path;

use serde::Serialize;

/// One figure, measured both ways.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scenario name.
    pub scenario: &'static str,
    /// What was measured, e.g. "p50".
    pub metric: String,
    /// Unit of both values.
    pub unit: &'static str,
    /// silo's figure.
    pub silo: f64,
    /// The plain alternative's figure, when there is one.
    pub baseline: Option<f64>,
    /// What the baseline is.
    pub baseline_name: &'static str,
    /// The target, in words.
    pub target: String,
    /// Whether silo's figure meets the target.
    pub met: bool,
}

impl Row {
    /// A figure with no target of its own, shown beside its baseline (if any).
    pub fn untargeted(
        scenario: &'static str,
        metric: impl Into<String>,
        unit: &'static str,
        silo: f64,
        baseline: Option<(f64, &'static str)>,
    ) -> Self {
        Self {
            scenario,
            metric: metric.into(),
            unit,
            silo,
            baseline: baseline.map(|(value, _)| value),
            baseline_name: baseline.map_or("-", |(_, name)| name),
            target: "-".into(),
            met: true,
        }
    }

    /// silo / baseline.
    pub fn ratio(&self) -> Option<f64> {
        self.baseline.filter(|b| *b > 0.0).map(|b| self.silo / b)
    }
}

/// Prints the rows as an aligned table.
pub fn print(rows: &[Row]) {
    println!(
        "{:<16} {:<28} {:>12} {:>12} {:>8}  {:<22} {:<20} met",
        "scenario", "metric", "silo", "baseline", "ratio", "baseline is", "target"
    );
    for row in rows {
        let baseline = row
            .baseline
            .map(|b| format!("{b:.3}"))
            .unwrap_or_else(|| "-".into());
        let ratio = row
            .ratio()
            .map(|r| format!("{r:.2}x"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<16} {:<28} {:>12} {:>12} {:>8}  {:<22} {:<20} {}",
            row.scenario,
            format!("{} ({})", row.metric, row.unit),
            format!("{:.3}", row.silo),
            baseline,
            ratio,
            row.baseline_name,
            row.target,
            if row.met { "yes" } else { "NO" }
        );
    }
}

/// A scenario that could not run, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Scenario name.
    pub scenario: String,
    /// Its error, with its causes.
    pub error: String,
}

/// Prints the scenarios that could not run, after the table.
pub fn print_failures(failed: &[Failure]) {
    for failure in failed {
        println!("{:<16} could not run: {}", failure.scenario, failure.error);
    }
}

/// Writes the rows, with their ratios, and the scenarios that could not
/// run, as JSON.
pub fn write_json(path: &Path, rows: &[Row], failed: &[Failure]) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct WithRatio<'a> {
        #[serde(flatten)]
        row: &'a Row,
        ratio: Option<f64>,
    }
    #[derive(Serialize)]
    struct Results<'a> {
        rows: Vec<WithRatio<'a>>,
        failed: &'a [Failure],
    }
    let rows = rows
        .iter()
        .map(|row| WithRatio {
            row,
            ratio: row.ratio(),
        })
        .collect();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_vec_pretty(&Results { rows, failed })?)?;
    Ok(())
}
