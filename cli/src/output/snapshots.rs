//! What snapshot, rewind and fork print, and the progress bar they show.

use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use silo::Snapshot;
use silo::human_bytes;
use silo::{
    ImageSource, RestoreReport, SnapshotProgress as Progress, SnapshotProgressFn, SnapshotReport,
};

use super::{Output, print_json, print_lines, render, row, utc};

impl Output {
    /// A progress bar for a snapshot, rewind or fork, on stderr; hidden with
    /// `--json` (and by indicatif when stderr is not a terminal).
    pub fn snapshot_progress(&self) -> SnapshotBar {
        let bar = if self.json {
            ProgressBar::hidden()
        } else {
            ProgressBar::new_spinner()
        };
        SnapshotBar { bar }
    }

    /// A snapshot just taken, with its moments and sizes.
    pub fn snapshot_taken(&self, report: &SnapshotReport) -> anyhow::Result<()> {
        if self.json {
            return print_json(report);
        }
        let s = &report.snapshot;
        let mut lines = vec![format!(
            "snapshot {} of {}: {} entries ({} deletions), layer {}, store grew {}",
            s.id,
            s.sandbox_name,
            report.entries,
            report.deletions,
            human_bytes(s.layer_bytes),
            human_bytes(s.new_bytes)
        )];
        if let Some(base) = &report.base_stored {
            lines.push(format!(
                "  stored base image {} once{}: {} layers, {} in {:.0} ms",
                base.image_id,
                if base.after_capture {
                    ", after the capture, while the sandbox ran"
                } else {
                    ""
                },
                base.layers,
                human_bytes(base.bytes),
                base.ms
            ));
        }
        lines.push(format!(
            "  captured {:.0} ms (processes stopped: {}), durable {:.0} ms",
            report.captured_ms, report.processes_stopped, report.durable_ms,
        ));
        if let Some(compacted) = &report.compacted {
            lines.push(format!(
                "  squashed its chain of {} layers into one ({}, store grew {}) in {:.0} ms",
                compacted.layers,
                human_bytes(compacted.bytes),
                human_bytes(compacted.new_bytes),
                compacted.ms
            ));
        }
        if report.processes_unsettled > 0 {
            lines.push(format!(
                "  warning: {} of {} processes had not stopped when the layer was read \
                 (uninterruptible sleep?); a write of theirs under way may be in it half done",
                report.processes_unsettled, report.processes_stopped
            ));
        }
        print_lines(&lines.join("\n"))
    }

    /// Snapshots as a table.
    pub fn snapshots(&self, snapshots: &[Snapshot]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&snapshots);
        }
        let mut table = vec![row([
            "ID",
            "SANDBOX",
            "TAKEN (UTC)",
            "LAYER",
            "NEW",
            "PARENT",
            "MESSAGE",
        ])];
        for s in snapshots {
            table.push(row([
                &s.id,
                &s.sandbox_name,
                &utc(s.created_at_ms),
                &human_bytes(s.layer_bytes),
                &human_bytes(s.new_bytes),
                s.parent.as_deref().unwrap_or("-"),
                s.message.as_deref().unwrap_or(""),
            ]));
        }
        print_lines(&render(&table))
    }

    /// A snapshot that was deleted.
    pub fn snapshot_removed(&self, snapshot: &Snapshot) -> anyhow::Result<()> {
        if self.json {
            return print_json(snapshot);
        }
        print_lines(&format!(
            "removed snapshot {} of {} (its blobs go at the next `silo gc`)",
            snapshot.id, snapshot.sandbox_name
        ))
    }

    /// A sandbox made (again) from a snapshot: `rewound NAME to` it, or
    /// `made NAME from` it.
    pub fn restored(
        &self,
        what: &str,
        preposition: &str,
        report: &RestoreReport,
    ) -> anyhow::Result<()> {
        if self.json {
            return print_json(report);
        }
        print_lines(&restored_line(what, preposition, report))
    }

    /// Forks made at once (`silo fork --count`), one line each.
    pub fn forks(&self, reports: &[RestoreReport]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&reports);
        }
        let lines: Vec<String> = reports
            .iter()
            .map(|report| restored_line("made", "from", report))
            .collect();
        print_lines(&lines.join("\n"))
    }
}

/// One line of [`Output::restored`]: the sandbox, the snapshot, how long,
/// and how the machine got the snapshot's files.
fn restored_line(what: &str, preposition: &str, report: &RestoreReport) -> String {
    let source = match &report.image {
        ImageSource::Engine => "image on the engine".to_owned(),
        ImageSource::Store { layers_sent, bytes } => format!(
            "loaded from the store: {layers_sent} layers, {}",
            human_bytes(*bytes)
        ),
        ImageSource::Applied { layers, bytes } => format!(
            "fresh from the template, {layers} layers applied, {}",
            human_bytes(*bytes)
        ),
        ImageSource::InPlace(done) => format!(
            "in place: {} paths changed, {} put back, {} removed, {}",
            done.stats.changed,
            done.stats.restored,
            done.stats.removed,
            human_bytes(done.layer_bytes)
        ),
    };
    let source = match (&report.pool, &report.new_machine_because) {
        (Some(pool), _) => format!("taken from pool {pool}, {source}"),
        (None, Some(why)) => format!("{source}; a new machine, since {why}"),
        (None, None) => source,
    };
    format!(
        "{what} {} ({}) {preposition} snapshot {} in {:.0} ms ({source})",
        report.sandbox.name, report.sandbox.id, report.snapshot, report.ms
    )
}

/// The progress bar of one snapshot, rewind or fork.
pub struct SnapshotBar {
    bar: ProgressBar,
}

impl SnapshotBar {
    /// What the library calls as the work goes.
    pub fn callback(&self) -> SnapshotProgressFn {
        let bar = self.bar.clone();
        Arc::new(move |event| match event {
            Progress::Step { label, total } => {
                let style = match total {
                    Some(total) => {
                        bar.set_length(total);
                        ProgressStyle::with_template(
                            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                        )
                    }
                    None => ProgressStyle::with_template("{spinner} {msg} {bytes} {bytes_per_sec}"),
                };
                bar.set_style(style.unwrap_or_else(|_| ProgressStyle::default_bar()));
                bar.set_position(0);
                bar.set_message(label);
            }
            Progress::Bytes(n) => bar.inc(n),
        })
    }

    /// Removes the bar before the results are printed.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
