//! What passes between the mock and a session's shell: the block written
//! for each command, and the end markers read back out of the shell's
//! output, wherever the engine's chunks happen to cut them.
//!
//! A block `eval`s the command text, given through a here-document whose
//! quoted delimiter carries the session's nonce (so no quoting in the
//! command can end it early), with stdin from `/dev/null` (so a command
//! cannot read the commands queued behind it) and stderr joined to stdout
//! (so the output keeps its order), then prints `\x1e{nonce} {status}\x1e`.

/// Byte that opens and closes an end marker.
const MARK: u8 = 0x1e;

/// The text written to the session shell for one command.
pub fn block(nonce: &str, command: &str) -> String {
    format!(
        "{{ eval \"$(cat <<'SILO_MOCK_{nonce}'\n{command}\nSILO_MOCK_{nonce}\n)\"; }} </dev/null 2>&1\nprintf '\\036%s %d\\036' '{nonce}' \"$?\"\n"
    )
}

/// A command's output as the daemon reads its log back: line by line, so
/// a last line without a newline gets one.
pub fn output_text(log: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(log).into_owned();
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
        assert!(text.ends_with("printf '\\036%s %d\\036' 'n0' \"$?\"\n"));
    }

    #[test]
    fn output_ends_with_a_newline() {
        assert_eq!(output_text(b"hi"), "hi\n");
        assert_eq!(output_text(b"hi\n"), "hi\n");
        assert_eq!(output_text(b""), "");
    }
}
