//! Pseudo-terminals for PTY execs: opening one, making it the child's
//! controlling terminal, async I/O on the master side, and resizing.
//!
//! The child gets the slave as stdin, stdout and stderr, starts a new session
//! and takes the slave as its controlling terminal, so the line discipline
//! does what a terminal does: a `\x03` byte written to the master becomes
//! SIGINT for the foreground process group, and a resize becomes SIGWINCH.
//! The agent only holds the master. Reading it fails with `EIO` once every
//! slave descriptor is closed (the child and its descendants are gone); that
//! is the end of output, not an error.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::pty::{Winsize, openpty};
use silo_protocol::exec::WindowSize;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The agent's side of a pseudo-terminal. Shared by the output pump, the
/// stdin writer and the exec's record (for resizes); closed when all three
/// are done with it.
pub struct Master {
    fd: AsyncFd<OwnedFd>,
}

/// A freshly opened pseudo-terminal.
pub struct Pty {
    /// The agent's side.
    pub master: Arc<Master>,
    /// The child's side; the agent drops its copy once the child is spawned.
    pub slave: OwnedFd,
}

/// Opens a pseudo-terminal of the given size. Both descriptors are
/// close-on-exec (the child gets the slave through its standard streams), and
/// the master is non-blocking for the runtime.
pub fn open(window: WindowSize) -> io::Result<Pty> {
    let size = winsize(window);
    let pair = openpty(&size, None).map_err(io::Error::from)?;
    for fd in [&pair.master, &pair.slave] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
    }
    let flags = fcntl(&pair.master, FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(&pair.master, FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    // SAFETY: the `OwnedFd` keeps the descriptor open and unchanged for as
    // long as the `AsyncFd` that owns it exists.
    let fd = unsafe { AsyncFd::register(pair.master) }?;
    Ok(Pty {
        master: Arc::new(Master { fd }),
        slave: pair.slave,
    })
}

/// Gives `cmd` the slave as its standard streams and, after the `setsid` that
/// [`crate::process::new_session`] registers (which must come first), as its
/// controlling terminal.
pub fn attach(cmd: &mut Command, slave: &OwnedFd) -> io::Result<()> {
    cmd.stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave.try_clone()?));
    // SAFETY: runs in the forked child before exec; ioctl(2) is
    // async-signal-safe and only reads its integer argument.
    unsafe {
        cmd.pre_exec(|| {
            // fd 0 is the slave by now; a session leader without a
            // controlling terminal may take it.
            if libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

impl Master {
    /// Sets the window size; the foreground process group gets SIGWINCH.
    pub fn resize(&self, window: WindowSize) -> io::Result<()> {
        let size = winsize(window);
        // nix wraps neither TIOCSWINSZ nor TIOCSCTTY (see `attach`), hence libc.
        // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, which
        // points at a live local; the descriptor is owned by `self`.
        let rc = unsafe {
            libc::ioctl(
                self.fd.get_ref().as_raw_fd(),
                libc::TIOCSWINSZ,
                &size as *const Winsize,
            )
        };
        if rc == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Reads the master; `EIO` (no slave left) reads as end of file.
pub struct Reader(pub Arc<Master>);

/// Writes the master: raw terminal input.
pub struct Writer(pub Arc<Master>);

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard
                .try_io(|fd| nix::unistd::read(fd.get_ref(), unfilled).map_err(io::Error::from))
            {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(err)) if err.raw_os_error() == Some(libc::EIO) => {
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(err)) => return Poll::Ready(Err(err)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn winsize(window: WindowSize) -> Winsize {
    Winsize {
        ws_row: window.rows,
        ws_col: window.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn the_child_sees_a_terminal_of_the_asked_size_and_resizes() {
        let pty = open(WindowSize {
            rows: 30,
            cols: 100,
        })
        .unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "stty size; read line; stty size"]);
        crate::process::new_session(&mut cmd);
        attach(&mut cmd, &pty.slave).unwrap();
        let (_child, exit) = crate::reaper::test_reaper().spawn(&mut cmd).unwrap();
        // Every copy of the slave but the child's must go, or the master never reads EOF.
        drop(cmd);
        drop(pty.slave);
        let mut reader = Reader(Arc::clone(&pty.master));
        let mut writer = Writer(Arc::clone(&pty.master));
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains("30 100") {
            let n = reader.read(&mut buf).await.unwrap();
            assert!(n > 0, "eof before the first size: {seen:?}");
            seen.extend_from_slice(&buf[..n]);
        }
        pty.master.resize(WindowSize { rows: 5, cols: 7 }).unwrap();
        writer.write_all(b"go\n").await.unwrap();
        loop {
            let n = reader.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        assert!(String::from_utf8_lossy(&seen).contains("5 7"), "{seen:?}");
        assert!(exit.await.unwrap().success());
    }
}
