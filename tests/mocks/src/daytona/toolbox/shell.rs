//! What passes between the mock and a session's shell: the block written
//! for each command, the end markers read back out of the shell's output
//! (wherever the engine's chunks happen to cut them), and the command's log
//! as each kind of client reads it.
//!
//! A block `eval`s the command text, given through a here-document whose
//! quoted delimiter carries the session's nonce (so no quoting in the
//! command can end it early), with stdin from `/dev/null` (so a command
//! cannot read the commands queued behind it), its stdout and stderr each
//! through a FIFO to a reader that prefixes every line with the stream's
//! marker ([`STDOUT_PREFIX`], [`STDERR_PREFIX`]), as the daemon's command
//! wrapper does; once both readers are done it prints
//! `\x1e{nonce} {status}\x1e`. The log keeps the markers; a client that
//! reads combined output gets them stripped, a current SDK gets them
//! demuxed ([`LogShape`]).

/// Byte that opens and closes an end marker.
const MARK: u8 = 0x1e;
/// What opens each stdout line in a command's log (the daemon's marker).
pub const STDOUT_PREFIX: &[u8] = b"\x01\x01\x01";
/// What opens each stderr line in a command's log.
pub const STDERR_PREFIX: &[u8] = b"\x02\x02\x02";

/// The text written to the session shell for one command.
pub fn block(nonce: &str, command: &str) -> String {
    let d = "\"$SILO_MOCK_DIR\"";
    format!(
        "SILO_MOCK_DIR=$(mktemp -d) && mkfifo {d}/o {d}/e\n\
         ( while IFS= read -r l || [ -n \"$l\" ]; do printf '\\001\\001\\001%s\\n' \"$l\"; done < {d}/o ) & SILO_MOCK_R1=$!\n\
         ( while IFS= read -r l || [ -n \"$l\" ]; do printf '\\002\\002\\002%s\\n' \"$l\"; done < {d}/e ) & SILO_MOCK_R2=$!\n\
         {{ eval \"$(cat <<'SILO_MOCK_{nonce}'\n{command}\nSILO_MOCK_{nonce}\n)\"; }} </dev/null >{d}/o 2>{d}/e\n\
         SILO_MOCK_STATUS=$?\n\
         wait $SILO_MOCK_R1 $SILO_MOCK_R2; rm -rf {d}\n\
         printf '\\036%s %d\\036' '{nonce}' \"$SILO_MOCK_STATUS\"\n"
    )
}

/// How a client gets a command's output, from the SDK version it sends
/// (`X-Daytona-SDK-Version`), as the daemon decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogShape {
    /// No version (or one before 0.27.0): `output` without the markers.
    Combined,
    /// 0.27.0 up to 0.167.0 (or no version with `X-Daytona-Split-Output:
    /// true`): `output` with the markers, no split.
    Labelled,
    /// 0.167.0 and later (or a `dev` build): `output` with the markers,
    /// `stdout` and `stderr` split by the server.
    Split,
}

impl LogShape {
    /// The shape for a request's headers.
    pub fn of(headers: &http::HeaderMap) -> Self {
        let text = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let version = text("x-daytona-sdk-version");
        if version.is_empty() {
            return if text("x-daytona-split-output") == "true" {
                LogShape::Labelled
            } else {
                LogShape::Combined
            };
        }
        let dev = version.contains("dev");
        let parsed = parse_version(&version);
        // An unreadable version counts as new for the first check and as
        // old for the second, as the daemon's comparisons fall back.
        if !dev && parsed.is_some_and(|v| v < (0, 27, 0)) {
            return LogShape::Combined;
        }
        if dev || parsed.is_some_and(|v| v >= (0, 167, 0)) {
            LogShape::Split
        } else {
            LogShape::Labelled
        }
    }
}

/// `MAJOR.MINOR.PATCH` of a version (a `v` prefix and a pre-release left out).
fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let core = text.trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// A command's log without the stream markers.
pub fn output_text(log: &[u8]) -> String {
    let mut stripped = Vec::with_capacity(log.len());
    let mut rest = log;
    while !rest.is_empty() {
        if rest.starts_with(STDOUT_PREFIX) || rest.starts_with(STDERR_PREFIX) {
            rest = &rest[STDOUT_PREFIX.len()..];
        } else {
            stripped.push(rest[0]);
            rest = &rest[1..];
        }
    }
    with_newline(String::from_utf8_lossy(&stripped).into_owned())
}

/// A command's log as it is, markers included.
pub fn raw_text(log: &[u8]) -> String {
    with_newline(String::from_utf8_lossy(log).into_owned())
}

/// The stdout and stderr of a command's log, as the daemon demuxes it:
/// each marker's bytes up to the next marker; bytes before any marker dropped.
pub fn demux(log: &[u8]) -> (String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut current: Option<bool> = None;
    let mut rest = log;
    while !rest.is_empty() {
        if rest.starts_with(STDOUT_PREFIX) {
            current = Some(true);
            rest = &rest[STDOUT_PREFIX.len()..];
        } else if rest.starts_with(STDERR_PREFIX) {
            current = Some(false);
            rest = &rest[STDERR_PREFIX.len()..];
        } else {
            match current {
                Some(true) => out.push(rest[0]),
                Some(false) => err.push(rest[0]),
                None => {}
            }
            rest = &rest[1..];
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// The daemon reads its log line by line: a last line gets a newline.
fn with_newline(mut text: String) -> String {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// What the shell's stdout says.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Output of the running command.
    Output(Vec<u8>),
    /// The running command ended with this status.
    End(i64),
}

/// Splits the shell's stdout at end markers (`\x1e{nonce} {status}\x1e`),
/// wherever they fall in the chunks.
pub struct Markers {
    prefix: Vec<u8>,
    buffer: Vec<u8>,
}

impl Markers {
    /// A splitter for the markers carrying `nonce`.
    pub fn new(nonce: &str) -> Self {
        let mut prefix = vec![MARK];
        prefix.extend_from_slice(nonce.as_bytes());
        prefix.push(b' ');
        Self {
            prefix,
            buffer: Vec::new(),
        }
    }

    /// The events in `bytes`, read after everything fed before.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        loop {
            let Some(start) = find_bytes(&self.buffer, &self.prefix) else {
                // Keep a tail that may be the start of a marker.
                let keep = (self.prefix.len() - 1).min(self.buffer.len());
                let emit: Vec<u8> = self.buffer.drain(..self.buffer.len() - keep).collect();
                if !emit.is_empty() {
                    events.push(Event::Output(emit));
                }
                return events;
            };
            let digits_at = start + self.prefix.len();
            let Some(length) = self.buffer[digits_at..].iter().position(|b| *b == MARK) else {
                if start > 0 {
                    events.push(Event::Output(self.buffer.drain(..start).collect()));
                }
                return events;
            };
            if start > 0 {
                events.push(Event::Output(self.buffer[..start].to_vec()));
            }
            let code = String::from_utf8_lossy(&self.buffer[digits_at..digits_at + length])
                .trim()
                .parse()
                .unwrap_or(-1);
            events.push(Event::End(code));
            self.buffer.drain(..digits_at + length + 1);
        }
    }

    /// What is left when the stream ends.
    pub fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buffer)
    }
}

fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(events: &[Event]) -> Vec<u8> {
        events
            .iter()
            .flat_map(|e| match e {
                Event::Output(b) => b.clone(),
                Event::End(_) => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn markers_split_wherever_the_chunks_break() {
        let stream = b"hello\npartial\x1eabc 3\x1enext\x1eabc 0\x1e";
        for cut in 0..stream.len() {
            let mut parser = Markers::new("abc");
            let mut events = parser.feed(&stream[..cut]);
            events.extend(parser.feed(&stream[cut..]));
            let ends: Vec<i64> = events
                .iter()
                .filter_map(|e| match e {
                    Event::End(code) => Some(*code),
                    Event::Output(_) => None,
                })
                .collect();
            assert_eq!(ends, [3, 0], "cut at {cut}");
            assert_eq!(output(&events), b"hello\npartialnext", "cut at {cut}");
        }
    }

    #[test]
    fn other_nonces_are_output() {
        let mut parser = Markers::new("abc");
        let events = parser.feed(b"\x1exyz 1\x1e\x1eabc 2\x1e");
        assert_eq!(
            events,
            [Event::Output(b"\x1exyz 1\x1e".to_vec()), Event::End(2)]
        );
    }

    #[test]
    fn blocks_quote_the_command_in_a_here_document() {
        let text = block("n0", "echo 'a' \"$HOME\"");
        assert!(text.contains("<<'SILO_MOCK_n0'\necho 'a' \"$HOME\"\nSILO_MOCK_n0\n"));
        assert!(text.ends_with("printf '\\036%s %d\\036' 'n0' \"$SILO_MOCK_STATUS\"\n"));
    }

    #[test]
    fn logs_read_as_each_client_reads_them() {
        let log = b"\x01\x01\x01out\n\x02\x02\x02err\n\x01\x01\x01tail\n";
        assert_eq!(output_text(log), "out\nerr\ntail\n");
        assert_eq!(demux(log), ("out\ntail\n".to_owned(), "err\n".to_owned()));
        assert_eq!(raw_text(log), String::from_utf8_lossy(log));
        assert_eq!(output_text(b"hi"), "hi\n");
        assert_eq!(output_text(b""), "");
    }

    #[test]
    fn the_sdk_version_decides_the_shape() {
        let shape = |pairs: &[(&'static str, &str)]| {
            let mut headers = http::HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, value.parse().unwrap());
            }
            LogShape::of(&headers)
        };
        assert_eq!(shape(&[]), LogShape::Combined);
        assert_eq!(
            shape(&[("x-daytona-split-output", "true")]),
            LogShape::Labelled
        );
        assert_eq!(
            shape(&[("x-daytona-sdk-version", "0.26.9")]),
            LogShape::Combined
        );
        assert_eq!(
            shape(&[("x-daytona-sdk-version", "0.100.0")]),
            LogShape::Labelled
        );
        assert_eq!(
            shape(&[("x-daytona-sdk-version", "0.167.0")]),
            LogShape::Split
        );
        assert_eq!(
            shape(&[("x-daytona-sdk-version", "0.226.1")]),
            LogShape::Split
        );
        assert_eq!(
            shape(&[("x-daytona-sdk-version", "0.0.0-dev")]),
            LogShape::Split
        );
    }
}
