//! What `silo diff` prints: a line a path for people, each name escaped so
//! that it stays on its line and bytes that are not UTF-8 stay apart; the
//! report as it is for `--json`, where a path that is not UTF-8 carries its
//! exact bytes in `path_raw` (see `silo::DiffedPath`).

use std::fmt::Write as _;

use silo::{DiffReport, PathChange};

use super::{Output, print_json, print_lines};

impl Output {
    /// What differs between a sandbox's live tree and a snapshot: a line
    /// a path (`+` added since the snapshot, `-` removed, `~` changed,
    /// with how).
    pub fn diff(&self, report: &DiffReport) -> anyhow::Result<()> {
        if self.json {
            return print_json(report);
        }
        print_lines(&diff_lines(report).join("\n"))
    }
}

/// The lines people see: a heading, then one line a path.
fn diff_lines(report: &DiffReport) -> Vec<String> {
    let mut lines = vec![format!(
        "{} against snapshot {} ({} paths differ; its files now are snapshot {})",
        report.sandbox,
        report.snapshot,
        report.paths.len(),
        report.live
    )];
    for path in &report.paths {
        let name = escaped(path.path_bytes());
        lines.push(match &path.change {
            PathChange::Added => format!("+ {name}"),
            PathChange::Removed => format!("- {name}"),
            PathChange::Changed { what } => {
                let what: Vec<String> = what
                    .iter()
                    .map(|aspect| {
                        serde_json::to_value(aspect)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    })
                    .collect();
                format!("~ {name} ({})", what.join(", "))
            }
        });
    }
    lines
}

/// A path as one readable line: UTF-8 printed as it is, but a backslash
/// as `\\`, a newline, tab or carriage return as `\n`, `\t`, `\r`, any
/// other control character and every byte that is not UTF-8 as `\xNN`.
fn escaped(path: &[u8]) -> String {
    let mut out = String::with_capacity(path.len());
    for chunk in path.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for byte in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(out, "\\x{byte:02x}");
                    }
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use silo::{Aspect, DiffedPath};

    use super::*;

    fn report(paths: Vec<DiffedPath>) -> DiffReport {
        DiffReport {
            sandbox: "work".to_owned(),
            snapshot: "snap-1".to_owned(),
            live: "snap-2".to_owned(),
            paths,
        }
    }

    #[test]
    fn a_newline_in_a_name_does_not_hide_a_change() {
        let content = PathChange::Changed {
            what: vec![Aspect::Content],
        };
        let lines = diff_lines(&report(vec![
            DiffedPath::new(b"w/a\nb", content.clone()),
            DiffedPath::new(b"w/b", content),
        ]));
        assert_eq!(lines[1..], ["~ /w/a\\nb (content)", "~ /w/b (content)"]);
    }

    #[test]
    fn names_that_are_not_utf8_print_apart() {
        let lines = diff_lines(&report(vec![
            DiffedPath::new(b"w/\xff\xfe", PathChange::Added),
            DiffedPath::new(b"w/\xfe\xff", PathChange::Removed),
            DiffedPath::new("w/é\\\x07".as_bytes(), PathChange::Added),
        ]));
        assert_eq!(
            lines[1..],
            ["+ /w/\\xff\\xfe", "- /w/\\xfe\\xff", "+ /w/é\\\\\\x07"]
        );
    }
}
