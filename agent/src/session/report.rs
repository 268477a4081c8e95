//! Reading the records a session's shell writes to its stderr (see `script`
//! for who writes what).
//!
//! The stream also carries whatever else the shell prints outside a run (a
//! job-done notice, an error about its own input), so the parser treats
//! anything outside a record as noise and resynchronises on the next record
//! separator. Every field is bounded; an oversized one drops its record (or,
//! for the environment, keeps the record without it), so a shell that writes
//! garbage costs bounded memory and never a panic.

use silo_protocol::exec::ExecId;

use super::script::{RS, US};

/// Largest exported environment kept for a restore.
pub const MAX_ENV_BYTES: usize = 256 * 1024;
/// Largest other field (a cwd may be up to PATH_MAX, 4096 bytes).
const MAX_FIELD: usize = 8 * 1024;

/// What the shell reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// The run's line started executing: the shell has read all of it.
    Started {
        /// The run.
        run: ExecId,
    },
    /// The run's line ran to its end.
    Done {
        /// The run.
        run: ExecId,
        /// Its script's exit status.
        status: i32,
        /// `export -p` afterwards; `None` when it was too large to keep.
        env: Option<Vec<u8>>,
        /// `$PWD` afterwards.
        cwd: Vec<u8>,
    },
    /// The shell printed its prompt: it is reading commands again.
    Prompt {
        /// The run whose line set the prompt; `None` before the first.
        run: Option<ExecId>,
        /// `$?` at the prompt (130 after SIGINT aborted a run).
        status: i32,
    },
    /// Answer to a fence line.
    Fence {
        /// The token it echoes.
        token: u64,
    },
}

#[derive(Debug, Default)]
enum State {
    /// Outside any record.
    #[default]
    Noise,
    /// Just read a record separator; the next byte is the kind.
    Kind,
    /// Reading the unit-separated fields of a record of this kind.
    Fields {
        kind: u8,
        fields: Vec<Vec<u8>>,
        current: Vec<u8>,
    },
    /// Reading the environment of a `D` record, up to the `E` that ends it.
    Env {
        run: ExecId,
        status: i32,
        env: Option<Vec<u8>>,
    },
    /// Read a separator inside the environment: `E` must follow.
    EnvEnd {
        run: ExecId,
        status: i32,
        env: Option<Vec<u8>>,
    },
    /// Reading the cwd that ends a `D` record.
    Cwd {
        run: ExecId,
        status: i32,
        env: Option<Vec<u8>>,
        cwd: Vec<u8>,
    },
}

/// Incremental parser; feed it whatever the pipe gave.
#[derive(Debug, Default)]
pub struct Parser {
    state: State,
}

impl Parser {
    /// Parses `bytes`, appending complete records to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Record>) {
        for &byte in bytes {
            self.state = step(std::mem::take(&mut self.state), byte, out);
        }
    }
}

/// How many fields a record kind has before its end (`D` goes on to its
/// environment after two).
fn field_count(kind: u8) -> Option<usize> {
    match kind {
        b'S' | b'F' => Some(1),
        b'P' | b'D' => Some(2),
        _ => None,
    }
}

fn step(state: State, byte: u8, out: &mut Vec<Record>) -> State {
    match state {
        State::Noise if byte == RS => State::Kind,
        State::Noise => State::Noise,
        State::Kind => match field_count(byte) {
            Some(_) => State::Fields {
                kind: byte,
                fields: Vec::new(),
                current: Vec::new(),
            },
            None if byte == RS => State::Kind,
            None => State::Noise,
        },
        State::Fields { .. } if byte == RS => State::Kind,
        State::Fields {
            kind,
            mut fields,
            current,
        } if byte == US => {
            fields.push(current);
            if Some(fields.len()) == field_count(kind) {
                finish_fields(kind, &fields, out)
            } else {
                State::Fields {
                    kind,
                    fields,
                    current: Vec::new(),
                }
            }
        }
        State::Fields {
            kind,
            fields,
            mut current,
        } => {
            if current.len() >= MAX_FIELD {
                return State::Noise;
            }
            current.push(byte);
            State::Fields {
                kind,
                fields,
                current,
            }
        }
        State::Env { run, status, env } if byte == RS => State::EnvEnd { run, status, env },
        State::Env {
            run,
            status,
            mut env,
        } => {
            if env.as_ref().is_some_and(|e| e.len() >= MAX_ENV_BYTES) {
                env = None;
            }
            if let Some(env) = env.as_mut() {
                env.push(byte);
            }
            State::Env { run, status, env }
        }
        State::EnvEnd { run, status, env } if byte == b'E' => State::Cwd {
            run,
            status,
            env,
            cwd: Vec::new(),
        },
        // Not the end of this record: it was cut short, and a new one starts.
        State::EnvEnd { .. } => step(State::Kind, byte, out),
        State::Cwd { .. } if byte == RS => State::Kind,
        State::Cwd {
            run,
            status,
            env,
            cwd,
        } if byte == US => {
            out.push(Record::Done {
                run,
                status,
                env,
                cwd,
            });
            State::Noise
        }
        State::Cwd {
            run,
            status,
            env,
            mut cwd,
        } => {
            if cwd.len() >= MAX_FIELD {
                return State::Noise;
            }
            cwd.push(byte);
            State::Cwd {
                run,
                status,
                env,
                cwd,
            }
        }
    }
}

fn finish_fields(kind: u8, fields: &[Vec<u8>], out: &mut Vec<Record>) -> State {
    let number =
        |i: usize| -> Option<u64> { std::str::from_utf8(fields.get(i)?).ok()?.parse().ok() };
    let status =
        |i: usize| -> Option<i32> { std::str::from_utf8(fields.get(i)?).ok()?.parse().ok() };
    match kind {
        b'S' => {
            if let Some(run) = number(0) {
                out.push(Record::Started { run });
            }
        }
        b'F' => {
            if let Some(token) = number(0) {
                out.push(Record::Fence { token });
            }
        }
        b'P' => {
            let run = if fields.first().is_some_and(Vec::is_empty) {
                Some(None)
            } else {
                number(0).map(Some)
            };
            if let (Some(run), Some(status)) = (run, status(1)) {
                out.push(Record::Prompt { run, status });
            }
        }
        b'D' => {
            if let (Some(run), Some(status)) = (number(0), status(1)) {
                return State::Env {
                    run,
                    status,
                    env: Some(Vec::new()),
                };
            }
        }
        _ => {}
    }
    State::Noise
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<Record> {
        let mut parser = Parser::default();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, &mut out);
        }
        out
    }

    #[test]
    fn a_whole_run_parses_in_any_chunking() {
        let stream = b"bash: no job control\n\x1eP\x1f0\x1f\x1eS7\x1f\x1eD7\x1f3\x1fdeclare -x A=\"1\"\n\x1eE/tmp\x1f\x1eP7\x1f0\x1f";
        let want = vec![
            Record::Prompt {
                run: None,
                status: 0,
            },
            Record::Started { run: 7 },
            Record::Done {
                run: 7,
                status: 3,
                env: Some(b"declare -x A=\"1\"\n".to_vec()),
                cwd: b"/tmp".to_vec(),
            },
            Record::Prompt {
                run: Some(7),
                status: 0,
            },
        ];
        assert_eq!(parse(&[stream]), want);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(parse(&bytes), want);
    }

    #[test]
    fn garbage_and_cut_records_resynchronise() {
        let out =
            parse(&[b"\x1eSx\x1f\x1eQ\x1e\x1eD7\x1f1\x1fpartial env\x1eP7\x1f130\x1f\x1eF9\x1f"]);
        assert_eq!(
            out,
            vec![
                Record::Prompt {
                    run: Some(7),
                    status: 130
                },
                Record::Fence { token: 9 }
            ]
        );
    }

    #[test]
    fn oversized_fields_are_bounded() {
        let mut stream = b"\x1eD1\x1f0\x1f".to_vec();
        stream.extend(std::iter::repeat_n(b'x', MAX_ENV_BYTES + 10));
        stream.extend_from_slice(b"\x1eE/\x1f");
        assert_eq!(
            parse(&[&stream]),
            vec![Record::Done {
                run: 1,
                status: 0,
                env: None,
                cwd: b"/".to_vec()
            }]
        );
        let mut long = b"\x1eS".to_vec();
        long.extend(std::iter::repeat_n(b'1', MAX_FIELD + 1));
        long.extend_from_slice(b"\x1f\x1eS2\x1f");
        assert_eq!(parse(&[&long]), vec![Record::Started { run: 2 }]);
    }
}
