//! Everything the CLI prints on success, in one place: aligned tables for
//! people, JSON (`--json`) for scripts. Errors go to stderr as `silo: …`.
//! Snapshot results and their progress bar are in `snapshots`, `silo diff`'s
//! paths in `diff`, file results (`cp`, `cat`, `ls-files`) in `files`.

mod diff;
mod files;
mod pools;
mod snapshots;

use std::io::{self, Write};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use silo::doctor::{Check, Verdict};
use silo::unix_ms_to_rfc3339;
use silo::{
    EventRecord, GcReport, HostRecord, MachineState, SandboxRecord, Started, UpAction, UpOutcome,
    human_bytes,
};
use silo::{PushEvent, PushProgressFn, PushReport};
use silo_protocol::exec::{ExecState, ExecSummary};
use silo_protocol::session::SessionInfo;

/// The shell's exit code for a process killed by SIGPIPE, used when our own
/// stdout goes away (`silo exec … | head`, `silo cat … | head`).
pub const BROKEN_PIPE_CODE: i32 = 128 + 13;

/// How results are printed.
pub struct Output {
    json: bool,
}

/// One step of `silo demo`, with how long it took.
#[derive(Serialize)]
pub struct DemoStep {
    pub step: String,
    pub millis: f64,
    pub detail: String,
}

/// A sandbox with its live status, as `ls --json` prints it.
#[derive(Serialize)]
struct SandboxView<'a> {
    #[serde(flatten)]
    sandbox: &'a SandboxRecord,
    /// `None` when the backend could not be asked (shown as `unknown`),
    /// or the machine is on another host (`elsewhere`).
    status: Option<MachineState>,
}

/// What `silo ls` knows of a sandbox's machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// What its backend said.
    State(MachineState),
    /// Its backend could not be asked.
    Unknown,
    /// It lives on another host of the fleet, which alone can ask.
    Elsewhere,
}

impl Listed {
    fn as_str(self) -> &'static str {
        match self {
            Self::State(state) => state.as_str(),
            Self::Unknown => "unknown",
            Self::Elsewhere => "elsewhere",
        }
    }

    fn state(self) -> Option<MachineState> {
        match self {
            Self::State(state) => Some(state),
            Self::Unknown | Self::Elsewhere => None,
        }
    }
}

impl Output {
    pub fn new(json: bool) -> Self {
        Self { json }
    }

    pub fn created(&self, sandbox: &SandboxRecord) -> anyhow::Result<()> {
        if self.json {
            return print_json(sandbox);
        }
        print_lines(&format!("created {} ({})", sandbox.name, sandbox.id))
    }

    /// A sandbox's outbound rules (`silo network`); JSON: the sandbox.
    pub fn network(&self, sandbox: &SandboxRecord) -> anyhow::Result<()> {
        if self.json {
            return print_json(sandbox);
        }
        let list = |entries: &[String]| match entries {
            [] => "none".to_owned(),
            entries => entries.join(" "),
        };
        let spec = &sandbox.spec;
        print_lines(&format!(
            "{}: network {}\nallow-out: {}\ndeny-out: {}",
            sandbox.name,
            spec.network.as_deref().unwrap_or("bridge"),
            list(&spec.allow_out),
            list(&spec.deny_out)
        ))
    }

    pub fn started(&self, started: &Started) -> anyhow::Result<()> {
        if self.json {
            return print_json(started);
        }
        let name = &started.sandbox.name;
        if started.was_running {
            print_lines(&format!("{name} was already running"))
        } else {
            print_lines(&format!("started {name}"))
        }
    }

    /// A stop; `paused` when the backend kept memory and processes.
    pub fn stopped(
        &self,
        sandbox: &SandboxRecord,
        was_running: bool,
        paused: bool,
    ) -> anyhow::Result<()> {
        if self.json {
            return print_json(&serde_json::json!({
                "sandbox": sandbox,
                "was_running": was_running,
                "paused": paused,
            }));
        }
        let line = match (was_running, paused) {
            (true, true) => format!(
                "paused {} (memory and processes kept; `silo start` resumes them)",
                sandbox.name
            ),
            (true, false) => format!("stopped {}", sandbox.name),
            (false, _) => format!("was not running: {}", sandbox.name),
        };
        print_lines(&line)
    }

    pub fn removed(&self, sandboxes: &[SandboxRecord]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&sandboxes);
        }
        let lines: Vec<String> = sandboxes
            .iter()
            .map(|s| format!("removed {} ({})", s.name, s.id))
            .collect();
        print_lines(&lines.join("\n"))
    }

    pub fn sandboxes(&self, rows: &[(SandboxRecord, Listed)]) -> anyhow::Result<()> {
        if self.json {
            let views: Vec<SandboxView<'_>> = rows
                .iter()
                .map(|(sandbox, status)| SandboxView {
                    sandbox,
                    status: status.state(),
                })
                .collect();
            return print_json(&views);
        }
        let mut table = vec![row(["NAME", "ID", "BACKEND", "STATUS", "CREATED", "HOST"])];
        for (sandbox, status) in rows {
            table.push(row([
                &sandbox.name,
                &sandbox.id,
                sandbox.backend.as_str(),
                status.as_str(),
                &utc(sandbox.created_at_ms),
                sandbox.host.as_deref().unwrap_or("-"),
            ]));
        }
        print_lines(&render(&table))
    }

    /// Each host with the sandboxes it made (by name) and when it last
    /// used the state; `this` marks the host running the command.
    pub fn hosts(
        &self,
        this: &str,
        hosts: &[HostRecord],
        sandboxes: &[SandboxRecord],
    ) -> anyhow::Result<()> {
        let made_by = |host: &str| -> Vec<&str> {
            sandboxes
                .iter()
                .filter(|s| s.host.as_deref() == Some(host))
                .map(|s| s.name.as_str())
                .collect()
        };
        if self.json {
            let views: Vec<serde_json::Value> = hosts
                .iter()
                .map(|host| {
                    serde_json::json!({
                        "name": host.name,
                        "this": host.name == this,
                        "seen_at_ms": host.seen_at_ms,
                        "sandboxes": made_by(&host.name),
                    })
                })
                .collect();
            return print_json(&views);
        }
        let mut table = vec![row(["HOST", "LAST SEEN (UTC)", "SANDBOXES", "NAMES"])];
        for host in hosts {
            let names = made_by(&host.name);
            let marked = if host.name == this {
                format!("{} (this host)", host.name)
            } else {
                host.name.clone()
            };
            table.push(row([
                &marked,
                &utc(host.seen_at_ms),
                &names.len().to_string(),
                &names.join(" "),
            ]));
        }
        print_lines(&render(&table))
    }

    pub fn events(&self, events: &[EventRecord]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&events);
        }
        let mut table = vec![row(["SEQ", "AT (UTC)", "SANDBOX", "KIND", "DETAIL"])];
        for event in events {
            let detail = match &event.detail {
                serde_json::Value::Object(map) if map.is_empty() => String::new(),
                other => other.to_string(),
            };
            table.push(row([
                &event.seq.to_string(),
                &utc(event.at_ms),
                &event.sandbox_name,
                &event.kind,
                &detail,
            ]));
        }
        print_lines(&render(&table))
    }

    /// Shows a demo step as it completes (people only; JSON waits for the end).
    pub fn demo_step(&self, step: &DemoStep) {
        if !self.json {
            println!("{:<16} {:>9.2} ms  {}", step.step, step.millis, step.detail);
        }
    }

    /// Closes the demo: the whole list as JSON, or a summary line for people.
    pub fn demo_done(&self, steps: &[DemoStep], took: std::time::Duration) -> anyhow::Result<()> {
        if self.json {
            return print_json(&steps);
        }
        let names: Vec<&str> = steps.iter().map(|s| s.step.as_str()).collect();
        print_lines(&format!(
            "done: {} steps in {:.1} s ({})",
            steps.len(),
            took.as_secs_f64(),
            names.join(", ")
        ))
    }

    /// A progress bar over a push's targets, on stderr; hidden with
    /// `--json` (and by indicatif when stderr is not a terminal).
    pub fn push_progress(&self, targets: usize) -> PushBar {
        let bar = if self.json {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(targets as u64)
        };
        let style = ProgressStyle::with_template("pushing [{bar:30}] {pos}/{len} sandboxes  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        PushBar { bar }
    }

    /// The outcome of a push: one row per sandbox and a summary line.
    pub fn pushed(&self, report: &PushReport) -> anyhow::Result<()> {
        if self.json {
            return print_json(report);
        }
        let mut table = vec![row([
            "SANDBOX", "RESULT", "VERSION", "FILES", "BYTES", "TRIES", "DETAIL",
        ])];
        for p in &report.pushed {
            let result = if p.unchanged { "unchanged" } else { "pushed" };
            // seq and the first 12 hex digits of the hash are enough to tell versions apart.
            let version: String = p.version.chars().take(19).collect();
            table.push(row([
                &p.sandbox,
                result,
                &version,
                &p.files.to_string(),
                &human_bytes(p.bytes),
                &p.attempts.to_string(),
                &format!("{} ms", p.millis),
            ]));
        }
        for f in &report.failures {
            table.push(row([
                &f.sandbox,
                "FAILED",
                "-",
                "-",
                "-",
                &f.attempts.to_string(),
                &format!("{}: {}", f.reason, f.detail),
            ]));
        }
        let summary = format!(
            "{} of {} sandboxes have {} ({} unchanged, {} failed)",
            report.succeeded,
            report.targets,
            report.mount,
            report.unchanged,
            report.failures.len()
        );
        print_lines(&format!("{}\n{summary}", render(&table)))
    }

    /// What `silo up` did, with the reasons it passed over a tier.
    pub fn up(&self, outcome: &UpOutcome) -> anyhow::Result<()> {
        if self.json {
            return print_json(outcome);
        }
        let sandbox = &outcome.sandbox;
        let what = match outcome.action {
            UpAction::Attached => "attached to running",
            UpAction::Started => "started stopped",
            UpAction::Restored => "restored",
            UpAction::Created => "created",
            UpAction::Recreated => "recreated",
            UpAction::Claimed => "claimed from a pool",
        };
        let mut lines = vec![format!(
            "{what} sandbox {} ({}, tier {})",
            sandbox.name, sandbox.id, outcome.tier
        )];
        lines.extend(outcome.notes.iter().map(|note| format!("  note: {note}")));
        print_lines(&lines.join("\n"))
    }

    /// What `silo gc` removed (or would remove) and what it left alone.
    pub fn gc(&self, report: &GcReport) -> anyhow::Result<()> {
        if self.json {
            return print_json(report);
        }
        let verb = if report.dry_run {
            "would remove"
        } else {
            "removed"
        };
        let mut lines: Vec<String> = report
            .removed
            .iter()
            .map(|c| {
                let (name, id) = (&c.sandbox.name, &c.sandbox.id);
                let expired = format!("idle TTL expired {} UTC", utc(c.expired_at_ms));
                if c.machine_only {
                    format!(
                        "{verb} the machine of {name} ({id}): {expired}; its snapshots keep \
                         the sandbox for `silo up`"
                    )
                } else {
                    format!("{verb} {name} ({id}): {expired}")
                }
            })
            .collect();
        lines.extend(
            report
                .orphans
                .iter()
                .map(|name| format!("{verb} container {name}: no sandbox owns it")),
        );
        lines.extend(
            report
                .skipped
                .iter()
                .map(|(name, why)| format!("skipped {name}: {why}")),
        );
        let store = &report.store;
        if store.blobs_removed > 0 || store.temps_removed > 0 {
            lines.push(format!(
                "{verb} {} unnamed blobs ({}) and {} unfinished writes from the store",
                store.blobs_removed,
                human_bytes(store.bytes_freed),
                store.temps_removed
            ));
        }
        if store.shared_blobs_removed > 0 {
            lines.push(format!(
                "{verb} {} unnamed blobs ({}) from the shared store",
                store.shared_blobs_removed,
                human_bytes(store.shared_bytes_freed)
            ));
        }
        if store.cache_evicted > 0 {
            lines.push(format!(
                "{verb} {} blobs ({}) from this host's cache: the shared store keeps them",
                store.cache_evicted,
                human_bytes(store.cache_bytes_evicted)
            ));
        }
        lines.extend(
            store
                .engine_images_removed
                .iter()
                .map(|id| format!("{verb} image {id}: its snapshot was deleted")),
        );
        if lines.is_empty() {
            lines.push("nothing to collect".into());
        }
        print_lines(&lines.join("\n"))
    }

    /// One line of a long job's progress (an image build), on stderr;
    /// silent with `--json`.
    pub fn progress(&self, line: &str) {
        if !self.json {
            eprintln!("{line}");
        }
    }

    /// An image that was built.
    pub fn image_built(&self, tag: &str, id: &str) -> anyhow::Result<()> {
        if self.json {
            return print_json(&serde_json::json!({ "tag": tag, "id": id }));
        }
        print_lines(&format!("built {tag} ({id})"))
    }

    /// A sandbox's shell sessions.
    pub fn sessions(&self, sessions: &[SessionInfo]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&sessions);
        }
        let mut table = vec![row([
            "ID", "SHELL", "PID", "RUNNING", "RUNS", "RESTARTS", "CWD",
        ])];
        for s in sessions {
            // The command's words when the agent tells them, else its exec id.
            let what = |id: u64| s.command.clone().unwrap_or_else(|| id.to_string());
            let running = match (s.running, s.queued) {
                (Some(id), 0) => what(id),
                (Some(id), queued) => format!("{} (+{queued} queued)", what(id)),
                (None, _) => "-".to_owned(),
            };
            table.push(row([
                &s.id,
                &s.shell,
                &s.pid.map_or_else(|| "-".to_owned(), |pid| pid.to_string()),
                &running,
                &s.runs.to_string(),
                &s.restarts.to_string(),
                &s.cwd,
            ]));
        }
        print_lines(&render(&table))
    }

    /// The commands an agent holds, as `silo ps` shows them.
    pub fn execs(&self, execs: &[ExecSummary]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&execs);
        }
        let mut table = vec![row([
            "ID", "PID", "STATE", "AGE", "SESSION", "CWD", "COMMAND",
        ])];
        for e in execs {
            let state = match e.state {
                ExecState::Running => "running",
                ExecState::Finished => "ended",
                ExecState::Unknown => "unknown",
            };
            let command = match (e.tty, e.argv.is_empty()) {
                (true, true) => "(shell on a terminal)".to_owned(),
                (true, false) => format!("{} (terminal)", e.argv.join(" ")),
                (false, _) => e.argv.join(" "),
            };
            table.push(row([
                &e.exec_id.to_string(),
                &e.pid.to_string(),
                state,
                &format!("{:.1}s", e.age_ms as f64 / 1000.0),
                e.session.as_deref().unwrap_or("-"),
                &e.cwd,
                &command,
            ]));
        }
        print_lines(&render(&table))
    }

    /// A sandbox's lifetime deadline, as `silo timeout` shows it.
    pub fn deadline(&self, sandbox: &str, left: Option<std::time::Duration>) -> anyhow::Result<()> {
        if self.json {
            return print_json(&serde_json::json!({
                "sandbox": sandbox,
                "remaining_ms": left.map(|left| left.as_millis()),
            }));
        }
        match left {
            Some(left) => print_lines(&format!(
                "{sandbox} stops in {}s, whatever runs",
                left.as_secs()
            )),
            None => print_lines(&format!("{sandbox} has no lifetime deadline")),
        }
    }

    /// `silo doctor`'s findings: a line per check, the fix under each problem.
    pub fn doctor(&self, checks: &[Check]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&checks);
        }
        let mut lines = String::new();
        for check in checks {
            let mark = match check.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            lines.push_str(&format!("{mark}  {:<11} {}\n", check.name, check.detail));
            if let Some(fix) = &check.fix {
                lines.push_str(&format!("      {:<11} fix: {fix}\n", ""));
            }
        }
        print_lines(lines.trim_end())
    }

    /// What interrupting a session did.
    pub fn session_interrupted(&self, id: &str, exec_id: Option<u64>) -> anyhow::Result<()> {
        if self.json {
            return print_json(&serde_json::json!({ "session": id, "exec_id": exec_id }));
        }
        print_lines(&match exec_id {
            Some(exec_id) => format!("interrupted exec {exec_id} in session {id}"),
            None => format!("session {id} was idle; nothing to interrupt"),
        })
    }

    /// What closing a session did.
    pub fn session_closed(&self, id: &str, existed: bool) -> anyhow::Result<()> {
        if self.json {
            return print_json(&serde_json::json!({ "session": id, "existed": existed }));
        }
        print_lines(&if existed {
            format!("closed session {id}")
        } else {
            format!("no session {id}")
        })
    }

    /// Reports one failure while the command carries on with the rest.
    pub fn error(&self, error: &anyhow::Error) {
        eprintln!("silo: {error:#}");
    }
}

/// The progress bar of one `silo push`.
pub struct PushBar {
    bar: ProgressBar,
}

impl PushBar {
    /// What the library calls as the push goes.
    pub fn callback(&self) -> PushProgressFn {
        let bar = self.bar.clone();
        let sent = Arc::new(AtomicU64::new(0));
        Arc::new(move |event: &PushEvent| match event {
            PushEvent::Built { bytes, .. } => {
                bar.set_message(format!("bundle {}", human_bytes(*bytes)))
            }
            PushEvent::Sent(n) => {
                let total = sent.fetch_add(*n, Ordering::Relaxed) + n;
                bar.set_message(format!("{} sent", human_bytes(total)));
            }
            PushEvent::Done { .. } => bar.inc(1),
        })
    }

    /// Removes the bar before the results are printed.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| (*c).to_owned()).collect()
}

/// Left-aligned columns two spaces apart; the last column is not padded.
fn render(table: &[Vec<String>]) -> String {
    let columns = table.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            table
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let lines: Vec<String> = table
        .iter()
        .map(|r| {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                if c + 1 == columns {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
                }
            }
            line.trim_end().to_owned()
        })
        .collect();
    lines.join("\n")
}

fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("encoding JSON output")?;
    print_lines(&text)
}

fn print_lines(text: &str) -> anyhow::Result<()> {
    if text.is_empty() {
        return Ok(());
    }
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

/// `YYYY-MM-DD HH:MM:SS` in UTC for a Unix time in milliseconds.
fn utc(ms: i64) -> String {
    let text = unix_ms_to_rfc3339(ms);
    text.get(..19).unwrap_or(&text).replace('T', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_763_776_380_123), "2025-11-22 01:53:00");
    }

    #[test]
    fn tables_align() {
        let table = vec![row(["A", "BB", "C"]), row(["long", "x", "y"])];
        assert_eq!(render(&table), "A     BB  C\nlong  x   y");
    }
}
