//! `Process`: one command in a sandbox, followed from Python.
//!
//! Its output is kept as it arrives (so `wait` after some iteration still
//! answers all of it, as E2B's handle does) with the offset up to which it
//! was delivered. The library's `Execution` re-attaches by itself after a
//! dropped connection; a forked child, whose copy of the connection belongs
//! to the parent, re-attaches from that offset on its own connection.
//!
//! A blocking `wait` gives way to Ctrl-C: the command is interrupted in the
//! sandbox (SIGINT, grace, SIGKILL), its end is collected, and then
//! `KeyboardInterrupt` is raised. A second Ctrl-C while it ends kills it
//! without grace.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use silo::silo_protocol::exec::StreamOffsets;
use silo::{Execution, ExitInfo};
use tokio::sync::Mutex;

use crate::bind::{self, SandboxRef, Step};
use crate::results::commands::{CommandResult, Exit, Lost, Stderr, Stdout};
use crate::runtime::{self, Answer, Signals};

/// Everything a process has delivered, and where it stands.
pub struct ProcState {
    /// The process that follows it (its connection is that process's).
    pid: u32,
    execution: Option<Execution>,
    /// Output offset delivered up to (lost bytes counted as delivered).
    offset: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    lost: u64,
    exit: Option<ExitInfo>,
    /// Each stream's bytes delivered so far, when the agent says; read
    /// without waiting for a step under way.
    streams: Arc<StdMutex<Option<StreamOffsets>>>,
}

impl ProcState {
    pub fn following(execution: Execution) -> Self {
        Self {
            pid: std::process::id(),
            offset: execution.offset(),
            streams: Arc::new(StdMutex::new(execution.streams())),
            execution: Some(execution),
            stdout: Vec::new(),
            stderr: Vec::new(),
            lost: 0,
            exit: None,
        }
    }

    /// A command that never started, ended as a shell ends it: exit
    /// `code`, `message` on stderr.
    pub fn refused(code: i32, message: &str) -> Self {
        Self {
            pid: std::process::id(),
            execution: None,
            offset: 0,
            stdout: Vec::new(),
            stderr: format!("{message}\n").into_bytes(),
            lost: 0,
            streams: Arc::default(),
            exit: Some(ExitInfo {
                code: Some(code),
                ..ExitInfo::default()
            }),
        }
    }

    /// The next step, re-attaching first when this process does not own
    /// the connection. `None` once the exit has been seen.
    async fn step(&mut self, sandbox: &SandboxRef, id: u64) -> PyResult<Option<Step>> {
        if self.exit.is_some() {
            return Ok(None);
        }
        let execution = self.execution(sandbox, id).await?;
        let step = bind::next_step(execution).await?;
        let (offset, streams) = (execution.offset(), execution.streams());
        self.offset = offset;
        *self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = streams;
        match &step {
            Some(Step::Output { stderr, data, .. }) => {
                if *stderr {
                    self.stderr.extend_from_slice(data);
                } else {
                    self.stdout.extend_from_slice(data);
                }
            }
            Some(Step::Lost { bytes, .. }) => self.lost += bytes,
            Some(Step::Exit(exit)) => self.exit = Some(exit.clone()),
            None => {}
        }
        Ok(step)
    }

    /// The execution this process follows the command with, attached
    /// from the delivered offset when it has none of its own (a fork).
    async fn execution(&mut self, sandbox: &SandboxRef, id: u64) -> PyResult<&mut Execution> {
        if self.pid != std::process::id() {
            // The parent's connection: never used nor dropped here.
            std::mem::forget(self.execution.take());
            self.pid = std::process::id();
        }
        if self.execution.is_none() {
            self.execution = Some(sandbox.attach(id, self.offset).await?);
        }
        self.execution
            .as_mut()
            .ok_or_else(|| crate::errors::SiloException::new_err("no execution to follow"))
    }

    /// Steps to the exit, handing output to the callbacks as it comes.
    pub async fn finish(
        &mut self,
        sandbox: &SandboxRef,
        id: u64,
        callbacks: &Callbacks,
    ) -> PyResult<()> {
        while let Some(step) = self.step(sandbox, id).await? {
            if let Step::Output { stderr, data, .. } = step {
                callbacks.call(stderr, &data)?;
            }
        }
        Ok(())
    }

    /// The `CommandResult` of everything delivered (an exit never seen
    /// is a default one: code 255).
    pub fn answer(&self) -> Answer {
        let stdout = self.stdout.clone();
        let stderr = self.stderr.clone();
        let lost = self.lost;
        let exit = self.exit.clone().unwrap_or_default();
        Box::new(move |py| CommandResult::of(py, &stdout, &stderr, lost, &exit)?.into_py_any(py))
    }
}

/// Python callables for stdout and stderr, given bytes.
#[derive(Default)]
pub struct Callbacks {
    stdout: Option<Py<PyAny>>,
    stderr: Option<Py<PyAny>>,
}

impl Callbacks {
    pub fn new(stdout: Option<Py<PyAny>>, stderr: Option<Py<PyAny>>) -> Self {
        Self { stdout, stderr }
    }

    fn call(&self, stderr: bool, data: &[u8]) -> PyResult<()> {
        let callback = if stderr { &self.stderr } else { &self.stdout };
        if let Some(callback) = callback {
            let called =
                runtime::attach(|py| callback.call1(py, (PyBytes::new(py, data),)).map(drop));
            called.unwrap_or(Ok(()))?;
        }
        Ok(())
    }
}

/// A command started by `spawn` or found again by `attach`.
#[pyclass(frozen, module = "silo_sandbox._native")]
pub struct Process {
    sandbox: Arc<SandboxRef>,
    id: u64,
    state: Arc<Mutex<ProcState>>,
    streams: Arc<StdMutex<Option<StreamOffsets>>>,
}

impl Process {
    pub fn new(sandbox: Arc<SandboxRef>, execution: Execution) -> Self {
        let id = execution.id();
        let state = ProcState::following(execution);
        Self {
            id,
            sandbox,
            streams: Arc::clone(&state.streams),
            state: Arc::new(Mutex::new(state)),
        }
    }
}

#[pymethods]
impl Process {
    /// The agent's id of the command (for `attach` from elsewhere).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// `(stdout, stderr)`: each stream's bytes delivered so far, for an
    /// `attach` by streams from elsewhere; `None` when the agent does not
    /// say (older than protocol 8).
    #[getter]
    fn streams(&self) -> Option<(u64, u64)> {
        let streams = *self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        streams.map(|s| (s.stdout, s.stderr))
    }

    /// The next event: `Stdout`, `Stderr`, `Lost`, `Exit`, or `None` after
    /// the exit.
    #[pyo3(signature = (aio=None))]
    fn next(&self, py: Python<'_>, aio: Option<Bound<'_, PyTuple>>) -> PyResult<Py<PyAny>> {
        let sandbox = Arc::clone(&self.sandbox);
        let state = Arc::clone(&self.state);
        let id = self.id;
        runtime::dispatch(py, aio, Signals::Interrupt, async move {
            let step = state.lock().await.step(&sandbox, id).await?;
            Ok(step_answer(step))
        })
    }

    /// Follows the command to its end; answers its `CommandResult`, with
    /// everything it printed since it started.
    #[pyo3(signature = (on_stdout=None, on_stderr=None, aio=None))]
    fn wait(
        &self,
        py: Python<'_>,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let callbacks = Callbacks::new(on_stdout, on_stderr);
        if aio.is_some() {
            let sandbox = Arc::clone(&self.sandbox);
            let state = Arc::clone(&self.state);
            let id = self.id;
            return runtime::dispatch(py, aio, Signals::Defer, async move {
                let mut state = state.lock().await;
                state.finish(&sandbox, id, &callbacks).await?;
                Ok(state.answer())
            });
        }
        let answer = py.detach(|| self.wait_blocking(&callbacks))?;
        answer(py)
    }

    /// Sends bytes to the command's stdin (started with `stdin=True`);
    /// `None` closes it, so the command reads EOF.
    #[pyo3(signature = (data, aio=None))]
    fn send_stdin(
        &self,
        py: Python<'_>,
        data: Option<Bound<'_, PyBytes>>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let data = data.map(|d| d.as_bytes().to_vec());
        let sandbox = Arc::clone(&self.sandbox);
        let state = Arc::clone(&self.state);
        let id = self.id;
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let mut state = state.lock().await;
            let execution = state.execution(&sandbox, id).await?;
            match data {
                Some(data) => bind::write_stdin(execution, &data).await?,
                None => bind::close_stdin(execution).await?,
            }
            Ok(runtime::value(()))
        })
    }

    /// Interrupts the command: SIGINT to its process group, `grace` seconds
    /// (the agent's default when `None`), then SIGKILL. Its exit still
    /// arrives through `next` or `wait`.
    #[pyo3(signature = (grace=None, aio=None))]
    fn interrupt(
        &self,
        py: Python<'_>,
        grace: Option<f64>,
        aio: Option<Bound<'_, PyTuple>>,
    ) -> PyResult<Py<PyAny>> {
        let grace = grace.map(seconds).transpose()?;
        let sandbox = Arc::clone(&self.sandbox);
        let id = self.id;
        runtime::dispatch(py, aio, Signals::Defer, async move {
            let state = sandbox.interrupt(id, grace).await?;
            runtime::json(&state)
        })
    }
}

impl Process {
    /// A blocking wait that turns Ctrl-C into an interrupt of the command
    /// (called without the GIL).
    pub fn wait_blocking(&self, callbacks: &Callbacks) -> PyResult<Answer> {
        let (sandbox, id, state) = (&*self.sandbox, self.id, &*self.state);
        let runtime = runtime::runtime()?;
        let finish = || async {
            let mut state = state.lock().await;
            state.finish(sandbox, id, callbacks).await?;
            Ok(state.answer())
        };
        let first = match runtime::block_on(runtime, Signals::Interrupt, finish()) {
            Err(error) if is_keyboard_interrupt(&error) => error,
            done => return done,
        };
        // Ctrl-C: the command ends in the sandbox too, as `silo exec` does it.
        runtime::block_on(runtime, Signals::Defer, sandbox.interrupt(id, None))?;
        if let Err(second) = runtime::block_on(runtime, Signals::Interrupt, finish()) {
            if !is_keyboard_interrupt(&second) {
                return Err(second);
            }
            runtime::block_on(
                runtime,
                Signals::Defer,
                sandbox.interrupt(id, Some(Duration::ZERO)),
            )?;
            drop(runtime::block_on(runtime, Signals::Defer, finish())?);
        }
        Err(first)
    }
}

fn is_keyboard_interrupt(error: &PyErr) -> bool {
    runtime::attach(|py| error.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py))
        .unwrap_or(false)
}

/// Seconds as Python gives them, refused when negative or not a number.
pub fn seconds(value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| crate::errors::invalid(format!("{value} is not a number of seconds")))
}

/// A step as its event class: `Stdout`, `Stderr`, `Lost` or `Exit`;
/// `None` after the exit.
fn step_answer(step: Option<Step>) -> Answer {
    Box::new(move |py| match step {
        None => Ok(py.None()),
        Some(Step::Output {
            stderr: false,
            offset,
            data,
        }) => Stdout::of(py, &data, offset).into_py_any(py),
        Some(Step::Output {
            stderr: true,
            offset,
            data,
        }) => Stderr::of(py, &data, offset).into_py_any(py),
        Some(Step::Lost { offset, bytes }) => Lost::of(offset, bytes).into_py_any(py),
        Some(Step::Exit(exit)) => Exit::of(py, &exit)?.into_py_any(py),
    })
}
