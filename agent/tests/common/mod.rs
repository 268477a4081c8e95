//! The agent under test: started from the built binary on a temporary Unix
//! socket with a fresh key, killed and cleaned up on drop.
#![allow(dead_code, reason = "each test crate uses its own part")]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use silo_protocol::auth::Key;

/// Longest wait for the agent to come up or go down.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Agent {
    pub child: Child,
    pub dir: PathBuf,
    pub key: Key,
}

impl Agent {
    pub fn start(name: &str, extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("silo-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = Key::generate().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_silo-agent"))
            .arg("--listen")
            .arg(format!("unix:{}", dir.join("agent.sock").display()))
            .arg("--workdir")
            .arg(&dir)
            .args(extra)
            .env("SILO_AGENT_KEY", key.to_hex())
            .env(
                "SILO_AGENT_LOG",
                std::env::var("SILO_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let agent = Self { child, dir, key };
        let deadline = Instant::now() + WAIT;
        while std::os::unix::net::UnixStream::connect(agent.socket()).is_err() {
            assert!(Instant::now() < deadline, "agent never listened");
            std::thread::sleep(Duration::from_millis(5));
        }
        agent
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "agent did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
