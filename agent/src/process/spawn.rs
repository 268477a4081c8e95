//! Starting a plain (non-terminal) exec with `posix_spawn(3)`.
//!
//! `std::process::Command` can only start a process in a new session
//! through a `pre_exec` hook, and any hook makes it `fork` the agent: the
//! kernel copies the agent's page tables, every page either side writes is
//! copied again, and `exec` throws the copy away. `posix_spawn` starts the
//! child on a `vfork`-style clone that shares the agent's memory until
//! `exec`, and both libcs the agent is built with (musl, glibc) do the
//! `setsid` themselves (`POSIX_SPAWN_SETSID`), so the child still leads a
//! session of its own. Measured by `silo-bench exec-rtt`; see
//! docs/benchmarks.md.
//!
//! What the child gets is what `Command` gave it: the agent's environment
//! with the request's variables laid over it, its three standard streams
//! (stdin `/dev/null` or a pipe, stdout and stderr pipes), the working
//! directory, SIGPIPE back at its default, the agent's signal mask, and no
//! other descriptor (the agent opens everything close-on-exec). A program
//! named without a `/` is looked up in the `PATH` of the child's own
//! environment, the way `execvp` does, with missing candidates skipped by a
//! `stat` here rather than by a failed spawn each. PTY execs keep `Command`:
//! making the terminal the controlling one needs an `ioctl` between
//! `setsid` and `exec`, which `posix_spawn` cannot run.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use nix::fcntl::OFlag;
use nix::unistd::pipe2;

/// `PATH` when the child's environment has none: musl's `execvp` default,
/// which is what the agent's lookup followed before.
const DEFAULT_PATH: &str = "/usr/local/bin:/bin:/usr/bin";

/// What to start.
#[derive(Debug)]
pub struct SpawnRequest<'a> {
    /// `argv`; the first is the program.
    pub argv: &'a [String],
    /// Working directory of the child.
    pub cwd: &'a Path,
    /// Variables laid over the agent's environment, in order (a later one wins).
    pub env: Vec<(&'a str, &'a str)>,
    /// Give the child a pipe for stdin (else `/dev/null`).
    pub stdin: bool,
}

/// A started child, leader of its own session, and the agent's ends of its pipes.
#[derive(Debug)]
pub struct Spawned {
    /// Its pid, session id and process group id.
    pub pid: u32,
    /// The write end of its stdin, when asked for.
    pub stdin: Option<OwnedFd>,
    /// The read end of its stdout.
    pub stdout: OwnedFd,
    /// The read end of its stderr.
    pub stderr: OwnedFd,
}

/// Starts `request` in a new session. Errors are the kernel's, as `exec`
/// reports them (`NotFound`, `PermissionDenied`, ...); a child whose `exec`
/// failed has been reaped by the libc before this returns, so the caller
/// must hold off other `waitpid(-1)` callers (the reaper's lock) around it.
pub fn spawn(request: &SpawnRequest<'_>) -> io::Result<Spawned> {
    let program = request
        .argv
        .first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "argv is empty"))?;
    let argv = request
        .argv
        .iter()
        .map(|arg| cstring(arg.as_bytes()))
        .collect::<io::Result<Vec<_>>>()?;
    let overrides: BTreeMap<&str, &str> = request.env.iter().copied().collect();
    let inherited = inherited();
    let envp: Vec<&CString> = inherited
        .iter()
        .filter(|var| {
            var.name
                .to_str()
                .is_none_or(|name| !overrides.contains_key(name))
        })
        .map(|var| &var.entry)
        .collect();
    let laid_over = overrides
        .iter()
        .map(|(name, value)| cstring(format!("{name}={value}").as_bytes()))
        .collect::<io::Result<Vec<_>>>()?;
    let cwd = cstring(request.cwd.as_os_str().as_bytes())?;

    let (stdin_pipe, stdin_ours) = if request.stdin {
        let (read, write) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        (Some(read), Some(write))
    } else {
        (None, None)
    };
    let stdin_child = match &stdin_pipe {
        Some(read) => read.as_fd(),
        None => dev_null()?,
    };
    let (stdout, stdout_child) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let (stderr, stderr_child) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;

    let mut actions = FileActions::new()?;
    actions.dup2(stdin_child, libc::STDIN_FILENO)?;
    actions.dup2(stdout_child.as_fd(), libc::STDOUT_FILENO)?;
    actions.dup2(stderr_child.as_fd(), libc::STDERR_FILENO)?;
    actions.chdir(&cwd)?;
    let attrs = Attrs::new()?;
    let call = Call {
        actions: &actions,
        attrs: &attrs,
        argv: null_terminated(argv.iter()),
        envp: null_terminated(envp.into_iter().chain(&laid_over)),
    };

    let pid = if program.contains('/') {
        call.spawn(&cstring(program.as_bytes())?)?
    } else {
        let path = match overrides.get("PATH") {
            Some(path) => OsStr::new(path),
            None => inherited
                .iter()
                .find(|var| var.name == "PATH")
                .map_or(OsStr::new(DEFAULT_PATH), |var| var.value()),
        };
        search(program, path, request.cwd, |candidate| {
            call.spawn(candidate)
        })?
    };
    // The child has its own copies now; ours would hold its output open.
    drop((stdin_pipe, stdout_child, stderr_child));
    Ok(Spawned {
        pid,
        stdin: stdin_ours,
        stdout,
        stderr,
    })
}

/// One variable of the agent's own environment, ready for `envp`.
struct Inherited {
    /// The name, to find the variables a request lays over.
    name: OsString,
    /// `NAME=value`.
    entry: CString,
}

impl Inherited {
    fn value(&self) -> &OsStr {
        let bytes = self.entry.as_bytes();
        OsStr::from_bytes(bytes.get(self.name.len() + 1..).unwrap_or_default())
    }
}

/// The agent's environment, read and encoded once. Nothing in the agent
/// changes it once `main` has removed the key variable (before the first
/// exec), and reading and encoding it again for every exec was a visible
/// part of an exec's cost. A variable whose name is not UTF-8 is passed on
/// but cannot be laid over.
fn inherited() -> &'static [Inherited] {
    static VARS: OnceLock<Vec<Inherited>> = OnceLock::new();
    VARS.get_or_init(|| {
        std::env::vars_os()
            .filter_map(|(name, value)| {
                let mut entry = name.as_bytes().to_vec();
                entry.push(b'=');
                entry.extend_from_slice(value.as_bytes());
                Some(Inherited {
                    name,
                    entry: CString::new(entry).ok()?,
                })
            })
            .collect()
    })
}

/// `/dev/null`, opened once (close-on-exec) and shared by every exec whose
/// stdin is not a pipe: the open was a path walk per exec. Each child gets
/// its own copy on fd 0 through the spawn's `dup2`.
fn dev_null() -> io::Result<BorrowedFd<'static>> {
    static NULL: OnceLock<OwnedFd> = OnceLock::new();
    if NULL.get().is_none() {
        // The copy is numbered 3 or above: if the agent was started with a
        // standard stream closed, the open could take its number for good.
        let opened = OwnedFd::from(File::open("/dev/null")?).try_clone()?;
        // Another thread may have won the race; its descriptor is as good.
        let _ = NULL.set(opened);
    }
    NULL.get()
        .map(AsFd::as_fd)
        .ok_or_else(|| io::Error::other("/dev/null was not kept"))
}

/// `execvp`'s walk of `path` for `program`: a candidate that does not exist
/// (`ENOENT`, `ENOTDIR`) is skipped, one the kernel refuses (`EACCES`) is
/// remembered while the walk goes on, and any other failure ends it. An
/// empty entry is the working directory, as relative entries are relative
/// to it. The existence check runs here, so only a candidate that exists
/// costs a spawn.
fn search(
    program: &str,
    path: &OsStr,
    cwd: &Path,
    mut start: impl FnMut(&CString) -> io::Result<u32>,
) -> io::Result<u32> {
    let mut refused = None;
    for dir in path.as_bytes().split(|&b| b == b':') {
        let mut candidate = dir.to_vec();
        if !candidate.is_empty() {
            candidate.push(b'/');
        }
        candidate.extend_from_slice(program.as_bytes());
        // The child resolves a relative candidate after its chdir; so does this check.
        if let Err(err) = std::fs::metadata(cwd.join(OsStr::from_bytes(&candidate)))
            && matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
        {
            continue;
        }
        match start(&cstring(&candidate)?) {
            Ok(pid) => return Ok(pid),
            Err(err) => match err.raw_os_error() {
                Some(libc::EACCES) => refused = Some(err),
                Some(libc::ENOENT | libc::ENOTDIR) => {}
                _ => return Err(err),
            },
        }
    }
    Err(refused.unwrap_or_else(|| io::Error::from_raw_os_error(libc::ENOENT)))
}

/// Everything one `posix_spawn` call takes but the path.
struct Call<'a> {
    actions: &'a FileActions,
    attrs: &'a Attrs,
    /// Pointers into live `CString`s, ending with a null pointer.
    argv: Vec<*mut libc::c_char>,
    /// Pointers into live `CString`s, ending with a null pointer.
    envp: Vec<*mut libc::c_char>,
}

impl Call<'_> {
    fn spawn(&self, path: &CString) -> io::Result<u32> {
        let mut pid: libc::pid_t = 0;
        // SAFETY: every pointer is valid for the call: `path` and the strings
        // behind `argv` and `envp` outlive `self`, both arrays end with a null
        // pointer, and `actions` and `attrs` are initialised objects that are
        // destroyed only when dropped. posix_spawn does not keep any of them.
        let rc = unsafe {
            libc::posix_spawn(
                &mut pid,
                path.as_ptr(),
                &self.actions.0,
                &self.attrs.0,
                self.argv.as_ptr(),
                self.envp.as_ptr(),
            )
        };
        check(rc)?;
        u32::try_from(pid).map_err(|_| io::Error::other("posix_spawn returned a negative pid"))
    }
}

fn null_terminated<'a>(strings: impl Iterator<Item = &'a CString>) -> Vec<*mut libc::c_char> {
    strings
        .map(|s| s.as_ptr().cast_mut())
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect()
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in a spawn argument"))
}

/// `posix_spawn*` return their error number rather than setting `errno`.
fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// An initialised `posix_spawn_file_actions_t`, destroyed on drop. Neither
/// libc's object points into itself, so it may move once initialised.
struct FileActions(libc::posix_spawn_file_actions_t);

impl FileActions {
    fn new() -> io::Result<Self> {
        let mut raw = MaybeUninit::uninit();
        // SAFETY: init writes the object behind the pointer, a live local.
        check(unsafe { libc::posix_spawn_file_actions_init(raw.as_mut_ptr()) })?;
        // SAFETY: initialised by the successful call above.
        Ok(Self(unsafe { raw.assume_init() }))
    }

    fn dup2(&mut self, fd: BorrowedFd<'_>, target: libc::c_int) -> io::Result<()> {
        // SAFETY: the object is initialised; the call only records the action.
        check(unsafe {
            libc::posix_spawn_file_actions_adddup2(&mut self.0, fd.as_raw_fd(), target)
        })
    }

    fn chdir(&mut self, dir: &CString) -> io::Result<()> {
        // SAFETY: the object is initialised and `dir` is a valid C string,
        // which the libc copies.
        check(unsafe { libc::posix_spawn_file_actions_addchdir_np(&mut self.0, dir.as_ptr()) })
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once, here.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// An initialised `posix_spawnattr_t` asking for a new session and a
/// default SIGPIPE (the agent ignores it, and an ignored signal stays
/// ignored across `exec`), destroyed on drop.
struct Attrs(libc::posix_spawnattr_t);

impl Attrs {
    fn new() -> io::Result<Self> {
        let mut raw = MaybeUninit::uninit();
        // SAFETY: init writes the object behind the pointer, a live local.
        check(unsafe { libc::posix_spawnattr_init(raw.as_mut_ptr()) })?;
        // SAFETY: initialised by the successful call above.
        let mut attrs = Self(unsafe { raw.assume_init() });
        let mut defaults = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set behind the pointer (a live
        // local) and sigaddset updates it; neither can fail for SIGPIPE.
        let defaults = unsafe {
            libc::sigemptyset(defaults.as_mut_ptr());
            libc::sigaddset(defaults.as_mut_ptr(), libc::SIGPIPE);
            defaults.assume_init()
        };
        // Both flags fit a short (0x80 and 0x04), the type setflags takes.
        let flags = libc::POSIX_SPAWN_SETSID | libc::POSIX_SPAWN_SETSIGDEF as libc::c_short;
        // SAFETY: the object is initialised; both calls copy their arguments.
        unsafe {
            check(libc::posix_spawnattr_setsigdefault(&mut attrs.0, &defaults))?;
            check(libc::posix_spawnattr_setflags(&mut attrs.0, flags))?;
        }
        Ok(attrs)
    }
}

impl Drop for Attrs {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once, here.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use crate::reaper::{ProcessExit, test_reaper};

    fn with_path<'a>(argv: &'a [String], cwd: &'a Path, path: &'a str) -> SpawnRequest<'a> {
        SpawnRequest {
            argv,
            cwd,
            env: vec![("PATH", path)],
            stdin: false,
        }
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    /// Runs `request` through the test reaper; returns stdout, stderr and the exit.
    async fn run(
        request: &SpawnRequest<'_>,
        input: &[u8],
    ) -> io::Result<(String, String, ProcessExit)> {
        let (child, exit) = test_reaper().spawn_with(|| spawn(request), |c| c.pid)?;
        if let Some(stdin) = child.stdin {
            let mut stdin = File::from(stdin);
            stdin.write_all(input)?;
        }
        let read = |fd: OwnedFd| {
            let mut text = String::new();
            File::from(fd).read_to_string(&mut text).map(|_| text)
        };
        let stdout = read(child.stdout)?;
        let stderr = read(child.stderr)?;
        let exit = tokio::time::timeout(Duration::from_secs(10), exit)
            .await
            .expect("exit in time")
            .expect("exit delivered");
        Ok((stdout, stderr, exit))
    }

    #[tokio::test]
    async fn the_child_gets_cwd_env_session_and_a_default_sigpipe() {
        let dir = tempfile::tempdir().unwrap();
        let script = r#"pwd; echo "$A $B"; s=$(cut -d' ' -f6 /proc/$$/stat); [ "$s" = "$$" ] && echo leader; grep SigIgn /proc/$$/status; echo oops >&2; exit 3"#;
        let args = argv(&["sh", "-c", script]);
        let request = SpawnRequest {
            argv: &args,
            cwd: dir.path(),
            env: vec![("A", "1"), ("B", "2"), ("B", "3")],
            stdin: false,
        };
        let (stdout, stderr, exit) = run(&request, b"").await.unwrap();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines[0],
            dir.path().canonicalize().unwrap().to_str().unwrap()
        );
        assert_eq!(lines[1], "1 3", "a later variable wins");
        assert_eq!(lines[2], "leader", "the child leads its own session");
        let ignored =
            u64::from_str_radix(lines[3].trim_start_matches("SigIgn:").trim(), 16).unwrap();
        assert_eq!(
            ignored & (1 << (libc::SIGPIPE - 1)),
            0,
            "SIGPIPE is ignored: {stdout}"
        );
        assert_eq!(stderr, "oops\n");
        assert_eq!(exit, ProcessExit::Code(3));
    }

    #[tokio::test]
    async fn the_agents_environment_is_passed_on_under_the_requests_variables() {
        let dir = tempfile::tempdir().unwrap();
        let (name, value) = std::env::vars()
            .find(|(name, value)| name != "PATH" && !value.contains('\n'))
            .expect("the test process has a variable besides PATH");
        let args = argv(&["env"]);
        let request = SpawnRequest {
            argv: &args,
            cwd: dir.path(),
            env: vec![("PATH", "/nonexistent"), ("PATH", "/usr/bin:/bin")],
            stdin: false,
        };
        let (stdout, _, exit) = run(&request, b"").await.unwrap();
        assert_eq!(exit, ProcessExit::Code(0));
        let paths: Vec<&str> = stdout.lines().filter(|l| l.starts_with("PATH=")).collect();
        assert_eq!(
            paths,
            ["PATH=/usr/bin:/bin"],
            "one PATH, the request's last"
        );
        assert!(
            stdout.lines().any(|l| l == format!("{name}={value}")),
            "{name} is inherited: {stdout}"
        );
    }

    #[tokio::test]
    async fn stdin_is_null_unless_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let args = argv(&["cat"]);
        let mut request = SpawnRequest {
            argv: &args,
            cwd: dir.path(),
            env: Vec::new(),
            stdin: false,
        };
        let (stdout, _, exit) = run(&request, b"").await.unwrap();
        assert_eq!((stdout.as_str(), exit), ("", ProcessExit::Code(0)));
        request.stdin = true;
        let (stdout, _, _) = run(&request, b"piped\n").await.unwrap();
        assert_eq!(stdout, "piped\n");
    }

    #[tokio::test]
    async fn the_program_is_looked_up_in_the_childs_path() {
        let dir = tempfile::tempdir().unwrap();
        let refused = dir.path().join("refused");
        let allowed = dir.path().join("allowed");
        std::fs::create_dir(&refused).unwrap();
        std::fs::create_dir(&allowed).unwrap();
        let probe = "silo-spawn-probe";
        std::fs::write(refused.join(probe), "#!/bin/sh\necho refused\n").unwrap();
        std::fs::write(allowed.join(probe), "#!/bin/sh\necho found\n").unwrap();
        std::fs::set_permissions(allowed.join(probe), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let args = argv(&[probe]);
        let path = format!("/nonexistent:{}:{}", refused.display(), allowed.display());
        let (stdout, _, _) = run(&with_path(&args, dir.path(), &path), b"")
            .await
            .unwrap();
        assert_eq!(stdout, "found\n", "a refused candidate is passed over");
        // Relative entries are relative to the child's working directory.
        let relative = with_path(&args, dir.path(), "refused:allowed");
        let (stdout, _, _) = run(&relative, b"").await.unwrap();
        assert_eq!(stdout, "found\n");

        let err = run(&with_path(&args, dir.path(), "refused"), b"")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        let err = run(&with_path(&args, dir.path(), "/nonexistent"), b"")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let missing = argv(&["/nonexistent/silo-test-binary"]);
        let err = run(
            &SpawnRequest {
                argv: &missing,
                cwd: dir.path(),
                env: Vec::new(),
                stdin: false,
            },
            b"",
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
