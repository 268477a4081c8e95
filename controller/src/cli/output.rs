//! Everything the CLI prints on success, in one place: aligned tables for
//! people, JSON (`--json`) for scripts. Errors go to stderr as `silo: …`.

use std::io::{self, Write};

use anyhow::Context;
use serde::Serialize;
use silo::{Event, MachineState, Sandbox};

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
    sandbox: &'a Sandbox,
    status: MachineState,
}

impl Output {
    pub fn new(json: bool) -> Self {
        Self { json }
    }

    pub fn created(&self, sandbox: &Sandbox) -> anyhow::Result<()> {
        if self.json {
            return print_json(sandbox);
        }
        print_lines(&format!("created {} ({})", sandbox.name, sandbox.id))
    }

    pub fn started(&self, sandbox: &Sandbox) -> anyhow::Result<()> {
        if self.json {
            return print_json(sandbox);
        }
        print_lines(&format!("{} is running", sandbox.name))
    }

    pub fn stopped(&self, sandbox: &Sandbox, was_running: bool) -> anyhow::Result<()> {
        if self.json {
            return print_json(
                &serde_json::json!({ "sandbox": sandbox, "was_running": was_running }),
            );
        }
        let verb = if was_running {
            "stopped"
        } else {
            "was not running:"
        };
        print_lines(&format!("{verb} {}", sandbox.name))
    }

    pub fn removed(&self, sandboxes: &[Sandbox]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&sandboxes);
        }
        let lines: Vec<String> = sandboxes
            .iter()
            .map(|s| format!("removed {} ({})", s.name, s.id))
            .collect();
        print_lines(&lines.join("\n"))
    }

    pub fn sandboxes(&self, rows: &[(Sandbox, MachineState)]) -> anyhow::Result<()> {
        if self.json {
            let views: Vec<SandboxView<'_>> = rows
                .iter()
                .map(|(sandbox, status)| SandboxView {
                    sandbox,
                    status: *status,
                })
                .collect();
            return print_json(&views);
        }
        let mut table = vec![row(["NAME", "ID", "BACKEND", "STATUS", "CREATED"])];
        for (sandbox, status) in rows {
            table.push(row([
                &sandbox.name,
                &sandbox.id,
                sandbox.backend.as_str(),
                status.as_str(),
                &utc(sandbox.created_at_ms),
            ]));
        }
        print_lines(&render(&table))
    }

    pub fn events(&self, events: &[Event]) -> anyhow::Result<()> {
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

    /// Closes the demo: the whole list as JSON, or nothing more for people.
    pub fn demo_done(&self, steps: &[DemoStep]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&steps);
        }
        Ok(())
    }

    /// Reports one failure while the command carries on with the rest.
    pub fn error(&self, error: &anyhow::Error) {
        eprintln!("silo: {error:#}");
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
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
