//! The floor of an exec round trip over a WebSocket, for `exec-rtt`: a
//! bare server on a Unix socket (tokio-tungstenite on one thread, as the
//! agent runs) that, for each text message, starts `true` with its output
//! piped, answers `started`, waits for the exit and answers `exit`: the
//! same messages an agent sends, with nothing else (no signing, no exec
//! registry, no output rings, no supervisor). The client writes and reads
//! the socket from the caller's own task, which no client that follows
//! several execs on one connection can do. What silo costs above this is
//! what its design costs; what this costs above the host's own spawn is
//! the socket and the two processes' wake-ups.

use std::path::Path;
use std::process::Stdio;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// A bare WebSocket server on its own thread, and one connection to it.
pub struct Floor {
    socket: WebSocketStream<UnixStream>,
    _dir: tempfile::TempDir,
}

impl Floor {
    /// Starts the server and connects to it.
    pub async fn start() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("silo-bench-floor-")
            .tempdir()?;
        let path = dir.path().join("floor.sock");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let server_path = path.clone();
        std::thread::spawn(move || serve(&server_path, ready_tx));
        ready_rx.await??;
        let stream = UnixStream::connect(&path).await?;
        let (socket, _) = tokio_tungstenite::client_async("ws://floor/", stream).await?;
        Ok(Self { socket, _dir: dir })
    }

    /// One round trip: the request, `started`, `exit`.
    pub async fn round_trip(&mut self) -> anyhow::Result<()> {
        self.socket.send(Message::text("true")).await?;
        for expected in ["started", "exit"] {
            match self.socket.next().await {
                Some(Ok(Message::Text(text))) if text.as_str() == expected => {}
                other => anyhow::bail!("floor server answered {other:?}, not {expected}"),
            }
        }
        Ok(())
    }
}

/// Runs the server until its one client leaves.
fn serve(path: &Path, ready: tokio::sync::oneshot::Sender<anyhow::Result<()>>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = ready.send(Err(error.into()));
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match UnixListener::bind(path) {
            Ok(listener) => listener,
            Err(error) => {
                let _ = ready.send(Err(error.into()));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        if let Err(error) = answer(&listener).await {
            eprintln!("exec-rtt floor server: {error:#}");
        }
    });
}

async fn answer(listener: &UnixListener) -> anyhow::Result<()> {
    let (stream, _) = listener.accept().await?;
    let mut socket = tokio_tungstenite::accept_async(stream).await?;
    // The client leaves without a close frame when the scenario ends.
    while let Some(Ok(message)) = socket.next().await {
        let argv = match message {
            Message::Text(text) => text,
            Message::Close(_) => break,
            _ => continue,
        };
        // Blocking waits are fine on this thread, which serves nothing
        // else; the harness's runtime never sees a SIGCHLD of its own.
        let child = std::process::Command::new(argv.as_str())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        socket.send(Message::text("started")).await?;
        child.wait_with_output()?;
        socket.send(Message::text("exit")).await?;
    }
    Ok(())
}
