//! The local terminal, for `silo exec -t` and `silo shell`: raw mode while a
//! remote program owns the screen, and the window size it should see.
//!
//! Raw mode is a guard: the saved settings are put back when it is dropped,
//! which happens on every way out of the command, an error or a panic
//! unwinding included. (A signal that kills the process outright cannot be
//! caught; the exec loop turns SIGTERM and SIGHUP into an orderly return so
//! the guard still runs.)

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};
use silo_protocol::exec::WindowSize;

/// `TERM` for the remote program when the local one has none.
const DEFAULT_TERM: &str = "xterm-256color";

/// Raw mode on the local terminal, until dropped.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Puts stdin's terminal in raw mode: no echo, no line editing, no
    /// signals from keys (Ctrl-C arrives as the byte 0x03, for the remote
    /// terminal to act on). `None` when stdin is not a terminal.
    pub fn enter() -> io::Result<Option<Self>> {
        let stdin = io::stdin();
        if !is_terminal(&stdin) {
            return Ok(None);
        }
        let saved = tcgetattr(stdin.as_fd()).map_err(io::Error::from)?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(stdin.as_fd(), SetArg::TCSADRAIN, &raw).map_err(io::Error::from)?;
        Ok(Some(Self { saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing sensible is left to do if the terminal went away meanwhile.
        let _ = tcsetattr(io::stdin().as_fd(), SetArg::TCSADRAIN, &self.saved);
    }
}

fn is_terminal(fd: &impl AsFd) -> bool {
    nix::unistd::isatty(fd.as_fd()).unwrap_or(false)
}

/// The size of the local terminal (stdout's, else stdin's or stderr's);
/// `None` when none of them is a terminal.
pub fn window_size() -> Option<WindowSize> {
    [
        io::stdout().as_raw_fd(),
        io::stdin().as_raw_fd(),
        io::stderr().as_raw_fd(),
    ]
    .into_iter()
    .find_map(size_of)
}

fn size_of(fd: RawFd) -> Option<WindowSize> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which
    // points at a live local; `fd` is one of this process's standard streams.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size as *mut libc::winsize) };
    (rc == 0 && size.ws_row > 0 && size.ws_col > 0).then_some(WindowSize {
        rows: size.ws_row,
        cols: size.ws_col,
    })
}

/// The local `TERM`, for the remote program to draw for the same terminal.
pub fn term() -> String {
    std::env::var("TERM")
        .ok()
        .filter(|term| !term.is_empty())
        .unwrap_or_else(|| DEFAULT_TERM.to_owned())
}
