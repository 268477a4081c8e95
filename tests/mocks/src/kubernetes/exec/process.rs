//! The exec'd process, whatever carries its streams: started in the pod's
//! container through the engine ([`Container::spawn`]), its output handed
//! to the transport as it comes, the client's stdin written to it (the
//! end of stdin closes its stdin), terminal sizes applied, and how it
//! ended ([`Outcome`]). The transports ([`super::channels`],
//! [`super::streams`]) only translate their framing into [`Input`] and
//! out of [`Output`].

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::containers::Container;
use crate::containers::exec::{NotStarted, Output, SpawnRequest};

/// Input held for the process before the transport stops reading.
pub const INPUT_QUEUE: usize = 16;
/// Output chunks queued towards the transport before the process's
/// output is no longer read.
pub const OUTPUT_QUEUE: usize = 64;
/// Most bytes of an unfinished terminal-size message kept.
const MAX_SIZE_MESSAGE: usize = 4 << 10;
/// Longest wait for a terminal's first size before the command starts
/// without one (clients send it as soon as the streams are open).
pub const FIRST_SIZE_WAIT: Duration = Duration::from_secs(1);

/// What the client sends the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Bytes for its stdin.
    Stdin(Bytes),
    /// The end of its stdin.
    StdinEnd,
    /// A new terminal size.
    Resize(TerminalSize),
}

/// A terminal size as clients send it on the resize stream: client-go's
/// `TerminalSize`, whose fields have no JSON names, so Go writes them
/// capitalized (and reads any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct TerminalSize {
    /// Columns.
    #[serde(rename = "Width", alias = "width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height", alias = "height")]
    pub height: u16,
}

/// How the process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It exited with this code.
    Exited(i64),
    /// It could not be run, or the engine failed while it ran: what the
    /// runtime would say.
    Failed(String),
}

/// What to run and which streams the client attached.
#[derive(Debug, Clone)]
pub struct Command {
    /// Program and arguments (not run through a shell).
    pub argv: Vec<String>,
    /// The client sends stdin.
    pub stdin: bool,
    /// On a terminal.
    pub tty: bool,
}

/// Runs `command` in `container` until it exits or the transport goes
/// (`output` closed): its output goes to `output`, `input` feeds it.
pub async fn run(
    container: Container,
    command: Command,
    mut input: mpsc::Receiver<Input>,
    output: mpsc::Sender<Output>,
) -> Outcome {
    // A terminal starts at the client's size where the engine can do that
    // (API 1.42 and later); the size is applied again once the process
    // runs, for the engines that cannot, and whatever came before it is
    // replayed then too.
    let mut early = VecDeque::new();
    let mut size = None;
    if command.tty {
        let first = tokio::time::timeout(FIRST_SIZE_WAIT, async {
            while early.len() < INPUT_QUEUE {
                match input.recv().await? {
                    Input::Resize(size) => return Some(size),
                    other => early.push_back(other),
                }
            }
            None
        });
        size = first.await.ok().flatten();
        if let Some(size) = size {
            early.push_back(Input::Resize(size));
        }
    }
    let request = SpawnRequest {
        argv: command.argv.clone(),
        env: Vec::new(),
        // The engine starts execs in the container's working directory.
        cwd: ".".to_owned(),
        stdin: command.stdin,
        tty: command.tty,
        size: size.map(|s: TerminalSize| (s.width, s.height)),
    };
    let mut spawned = match container.spawn(request).await {
        Ok(Ok(spawned)) => spawned,
        Ok(Err(refused)) => return Outcome::Failed(not_started(&command.argv, &refused)),
        Err(error) => return Outcome::Failed(format!("failed to exec in container: {error}")),
    };
    let mut stdin = spawned.input.take();
    let exec_id = spawned.exec_id.clone();
    let feeding = async {
        loop {
            let next = match early.pop_front() {
                Some(next) => next,
                None => match input.recv().await {
                    Some(next) => next,
                    None => break,
                },
            };
            match next {
                Input::Stdin(bytes) => {
                    if let Some(writer) = stdin.as_mut() {
                        if writer.write_all(&bytes).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                Input::StdinEnd => {
                    if let Some(mut writer) = stdin.take() {
                        let _ = writer.shutdown().await;
                    }
                }
                Input::Resize(size) if command.tty => {
                    if let Err(error) = container.resize(&exec_id, size.width, size.height).await {
                        tracing::debug!(%error, "resizing an exec's terminal failed");
                    }
                }
                Input::Resize(_) => {}
            }
        }
        // The transport is gone: the process's stdin ends with it.
        if let Some(mut writer) = stdin.take() {
            let _ = writer.shutdown().await;
        }
        std::future::pending::<()>().await;
    };
    let relaying = async {
        while let Some(chunk) = spawned.next().await {
            match chunk {
                Ok(chunk) => {
                    if output.send(chunk).await.is_err() {
                        return Err(None);
                    }
                }
                Err(error) => return Err(Some(error.to_string())),
            }
        }
        Ok(())
    };
    let relayed = tokio::select! {
        relayed = relaying => relayed,
        () = feeding => Ok(()),
    };
    match relayed {
        Ok(()) => match container.exit_code(&exec_id).await {
            Ok(code) => Outcome::Exited(code),
            Err(error) => Outcome::Failed(error.to_string()),
        },
        Err(Some(error)) => Outcome::Failed(error),
        // Nobody is left to tell.
        Err(None) => Outcome::Failed("the client went away".to_owned()),
    }
}

/// What runc reports for a program it cannot start, as containerd
/// passes it on.
fn not_started(argv: &[String], refused: &NotStarted) -> String {
    let program = argv.first().map(String::as_str).unwrap_or_default();
    let why = match refused {
        NotStarted::NoProgram if program.contains('/') => {
            format!("stat {program}: no such file or directory")
        }
        NotStarted::NoProgram => "executable file not found in $PATH".to_owned(),
        NotStarted::NotExecutable => "permission denied".to_owned(),
        NotStarted::NoDirectory => "chdir to cwd: no such file or directory".to_owned(),
    };
    format!(
        "failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: unable to start container process: exec: {program:?}: {why}: unknown"
    )
}

/// Input waiting for the process. A transport holds what it read here
/// while the process's queue is full and stops reading from the client
/// meanwhile, rather than waiting inside its loop, so the output keeps
/// flowing whatever the process does with its stdin.
pub struct Inbox {
    waiting: VecDeque<Input>,
    to_process: mpsc::Sender<Input>,
}

impl Inbox {
    /// An inbox feeding `to_process`.
    pub fn new(to_process: mpsc::Sender<Input>) -> Self {
        Self {
            waiting: VecDeque::new(),
            to_process,
        }
    }

    /// Holds `input` for the process.
    pub fn push(&mut self, input: Input) {
        self.waiting.push_back(input);
    }

    /// Whether nothing is waiting (the transport may read more).
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Hands the oldest waiting input on once the process's queue has
    /// room; cancel-safe (nothing is taken until there is room). A process
    /// that has gone drops what waits.
    pub async fn deliver(&mut self) {
        match self.to_process.reserve().await {
            Ok(permit) => {
                if let Some(input) = self.waiting.pop_front() {
                    permit.send(input);
                }
            }
            Err(_) => self.waiting.clear(),
        }
    }
}

/// Terminal sizes from the resize stream's bytes: JSON objects one after
/// another, which a transport may split anywhere.
#[derive(Default)]
pub struct SizeDecoder {
    buffer: BytesMut,
}

impl SizeDecoder {
    /// The sizes completed by `bytes`; a malformed message is dropped.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<TerminalSize> {
        self.buffer.extend_from_slice(bytes);
        let mut sizes = Vec::new();
        let mut values =
            serde_json::Deserializer::from_slice(&self.buffer).into_iter::<TerminalSize>();
        let mut used = 0;
        loop {
            match values.next() {
                Some(Ok(size)) => {
                    sizes.push(size);
                    used = values.byte_offset();
                }
                Some(Err(error)) if error.is_eof() => break,
                Some(Err(_)) => {
                    used = self.buffer.len();
                    break;
                }
                None => {
                    used = self.buffer.len();
                    break;
                }
            }
        }
        let _ = self.buffer.split_to(used);
        if self.buffer.len() > MAX_SIZE_MESSAGE {
            self.buffer.clear();
        }
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_may_arrive_in_pieces() {
        let mut decoder = SizeDecoder::default();
        assert!(decoder.push(br#"{"Width":80,"#).is_empty());
        assert_eq!(
            decoder.push(b"\"Height\":24}\n{\"width\":100,\"height\":30}\n"),
            [
                TerminalSize {
                    width: 80,
                    height: 24
                },
                TerminalSize {
                    width: 100,
                    height: 30
                }
            ]
        );
        assert!(decoder.push(b"nonsense").is_empty());
        assert_eq!(decoder.push(br#"{"Width":1,"Height":2}"#).len(), 1);
    }

    #[test]
    fn a_program_that_cannot_start_is_named_as_runc_names_it() {
        let message = not_started(&["nope".to_owned()], &NotStarted::NoProgram);
        assert!(
            message.ends_with(r#"exec: "nope": executable file not found in $PATH: unknown"#),
            "{message}"
        );
    }

    #[tokio::test]
    async fn an_inbox_holds_input_until_there_is_room() {
        let (tx, mut rx) = mpsc::channel(1);
        let mut inbox = Inbox::new(tx);
        inbox.push(Input::Stdin(Bytes::from_static(b"a")));
        inbox.push(Input::StdinEnd);
        inbox.deliver().await;
        assert!(!inbox.is_empty());
        assert_eq!(
            rx.recv().await,
            Some(Input::Stdin(Bytes::from_static(b"a")))
        );
        inbox.deliver().await;
        assert!(inbox.is_empty());
        assert_eq!(rx.recv().await, Some(Input::StdinEnd));
        drop(rx);
        inbox.push(Input::StdinEnd);
        inbox.deliver().await;
        assert!(inbox.is_empty());
    }
}
