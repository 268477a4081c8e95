//! What `silo cp`, `silo cat` and `silo ls-files` print.

use std::io::{self, Write};

use anyhow::Context;

use silo::Copied;
use silo::human_bytes;
use silo_protocol::exec::FsEvent;
use silo_protocol::files::{FileKind, FileStat, TreeWritten};

use super::{BROKEN_PIPE_CODE, Output, print_json, print_lines, render, row, utc};

impl Output {
    /// What `silo cp` copied; `sandbox` names the side the path is in.
    pub fn copied(&self, copied: &Copied, sandbox: Option<&str>) -> anyhow::Result<()> {
        let to = match sandbox {
            Some(name) => format!("{name}:{}", copied.path),
            None => copied.path.clone(),
        };
        if self.json {
            return print_json(&serde_json::json!({
                "files": copied.files,
                "dirs": copied.dirs,
                "bytes": copied.bytes,
                "to": to,
            }));
        }
        print_lines(&format!(
            "copied {} files, {} directories ({}) to {to}",
            copied.files,
            copied.dirs,
            human_bytes(copied.bytes)
        ))
    }

    /// What `silo cp - SANDBOX:DIR` unpacked.
    pub fn tree_written(
        &self,
        written: &TreeWritten,
        sandbox: &str,
        dir: &str,
    ) -> anyhow::Result<()> {
        self.copied(
            &Copied {
                files: written.files,
                dirs: written.dirs,
                bytes: written.bytes,
                path: dir.to_owned(),
            },
            Some(sandbox),
        )
    }

    /// Raw bytes to stdout (`silo cat`, a tar for `silo cp … -`); answers
    /// the exit code to leave with when stdout has gone away, else 0.
    pub fn bytes(&self, bytes: &[u8]) -> anyhow::Result<i32> {
        let mut stdout = io::stdout().lock();
        match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
            Ok(()) => Ok(0),
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(BROKEN_PIPE_CODE),
            Err(err) => Err(err).context("writing to stdout"),
        }
    }

    /// Changes `silo watch` saw: a line each; answers the exit code to
    /// leave with when stdout has gone away, else 0.
    pub fn fs_events(&self, events: &[FsEvent]) -> anyhow::Result<i32> {
        let mut text = String::new();
        for event in events {
            if self.json {
                text += &serde_json::to_string(event).context("encoding an event")?;
            } else {
                let kind = serde_json::to_value(event.kind).context("encoding an event")?;
                let kind = kind.as_str().unwrap_or("change");
                let slash = if event.dir { "/" } else { "" };
                text += &format!("{kind:<8} {}{slash}", event.name);
            }
            text.push('\n');
        }
        self.bytes(text.as_bytes())
    }

    /// Paths in a sandbox, as `silo ls-files` shows them.
    pub fn file_entries(&self, entries: &[FileStat]) -> anyhow::Result<()> {
        if self.json {
            return print_json(&entries);
        }
        let mut table = vec![row(["KIND", "MODE", "SIZE", "MODIFIED (UTC)", "NAME"])];
        for e in entries {
            let kind = match e.kind {
                FileKind::File => "file",
                FileKind::Dir => "dir",
                FileKind::Symlink => "symlink",
                FileKind::Other => "other",
            };
            let name = match &e.link_target {
                Some(target) => format!("{} -> {target}", e.name),
                None => e.name.clone(),
            };
            table.push(row([
                kind,
                &format!("{:04o}", e.mode),
                &e.size.to_string(),
                &utc(e.modified_ms),
                &name,
            ]));
        }
        print_lines(&render(&table))
    }
}
