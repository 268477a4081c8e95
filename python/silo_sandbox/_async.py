"""The asyncio classes: ``AsyncSandbox`` and what hangs off it, with the
names and meanings of the blocking ones.

Each call returns at once to the event loop; the work runs on the native
runtime's threads and resolves an asyncio future. Cancelling a task that
awaits a command's end (``run`` without ``background``, ``wait``)
interrupts the command in the sandbox first, as Ctrl-C does for the
blocking classes. Callbacks may be plain functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from . import _core, _native
from ._core import Event, PtySize, RunOptions, aio
from ._native import (
    CommandResult,
    CopyReport,
    Diff,
    EntryInfo,
    FilesystemEvent,
    ForkReport,
    OpenReport,
    PortUrl,
    ProcessInfo,
    PushReport,
    RewindReport,
    SandboxInfo,
    SandboxRecord,
    SessionInfo,
    Snapshot,
    Stderr,
    Stdout,
)
from ._base import HandleBase, SandboxBase, SessionBase, push_home, raw
from ._sync import HostPath, PushFiles, _home, _snapshot_id

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from 3.11

#: A target of ``async_push_to_sandboxes``: an ``AsyncSandbox`` or a name or id.
AsyncTarget = TypeVar("AsyncTarget", bound="AsyncSandbox | str")


async def _deliver(callback: Callable[[str], Any] | None, decoder: Any, data: bytes) -> None:
    if callback is None:
        return
    text = decoder.decode(data)
    if text:
        made = callback(text)
        if inspect.isawaitable(made):
            await made


class AsyncCommandHandle(HandleBase):
    """A command started with ``background=True`` or found again with
    ``commands.connect``; ``CommandHandle``'s verbs, awaited."""

    async def events(self) -> AsyncIterator[Event]:
        """Each event as it comes: ``Stdout``, ``Stderr``, ``Lost``, then ``Exit``."""
        while (event := self._seen(await aio(self._process.next))) is not None:
            yield event

    async def __aiter__(self) -> AsyncIterator[tuple[str | None, str | None, None]]:
        """``(stdout, stderr, pty)`` text chunks, one side set."""
        async for event in self.events():
            if (texts := self._texts(event)) is not None:
                yield texts

    async def wait(
        self,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        *,
        check: bool = True,
    ) -> CommandResult:
        """Waits for the end; answers everything it printed since it started.
        Cancelling the wait interrupts the command."""
        try:
            if on_stdout is not None or on_stderr is not None:
                async for step in self.events():
                    if isinstance(step, Stdout):
                        await _deliver(on_stdout, self._decoders.stdout, step.data)
                    elif isinstance(step, Stderr):
                        await _deliver(on_stderr, self._decoders.stderr, step.data)
            result = await aio(self._process.wait)
        except asyncio.CancelledError:
            await asyncio.shield(aio(self._process.interrupt, None))
            raise
        return _core.checked(result, check)

    async def interrupt(self, grace: float | None = None) -> None:
        """SIGINT to its process group, ``grace`` seconds, then SIGKILL."""
        await aio(self._process.interrupt, grace)

    async def kill(self) -> bool:
        """Kills it at once; answers whether it was running."""
        return await aio(self._process.interrupt, 0.0) == "running"

    async def send_stdin(self, data: str | bytes) -> None:
        """Writes to the command's stdin (run with ``stdin=True``)."""
        await aio(self._process.send_stdin, raw(data))

    async def close_stdin(self) -> None:
        """Closes the command's stdin, so it reads EOF."""
        await aio(self._process.send_stdin, None)


class AsyncSession(SessionBase["AsyncCommands"]):
    """A shell session: cwd and variables carry over between runs."""

    @overload
    async def run(self, cmd: str, background: Literal[False] = False, **options: Unpack[RunOptions]) -> CommandResult: ...
    @overload
    async def run(self, cmd: str, background: Literal[True], **options: Unpack[RunOptions]) -> AsyncCommandHandle: ...

    async def run(
        self, cmd: str, background: bool = False, **options: Unpack[RunOptions]
    ) -> CommandResult | AsyncCommandHandle:
        """``commands.run`` in this session (see there): ``cmd`` is a script
        of the session's shell."""
        options["session"] = self.id
        if background:
            return await self._commands.run(cmd, True, **options)
        return await self._commands.run(cmd, False, **options)

    async def interrupt(self, grace: float | None = None) -> None:
        """Interrupts what the session runs; its shell survives."""
        if (running := self._running(await self._commands.sessions())) is not None:
            await self._commands.interrupt(running, grace)


class AsyncCommands:
    """Running commands; ``Commands``' verbs, awaited."""

    def __init__(self, native: _native.Sandbox):
        self._native = native

    @overload
    async def run(
        self, cmd: str | list[str], background: Literal[False] = False, **options: Unpack[RunOptions]
    ) -> CommandResult: ...
    @overload
    async def run(
        self, cmd: str | list[str], background: Literal[True], **options: Unpack[RunOptions]
    ) -> AsyncCommandHandle: ...

    async def run(
        self, cmd: str | list[str], background: bool = False, **options: Unpack[RunOptions]
    ) -> CommandResult | AsyncCommandHandle:
        """Runs ``cmd``; see ``Commands.run``. Answers a ``CommandResult``,
        or an ``AsyncCommandHandle`` with ``background=True``."""
        run = _core.run_options(options)
        handle = AsyncCommandHandle(await aio(self._native.spawn, run.spec(cmd, background)))
        if background:
            return handle
        return await handle.wait(run.on_stdout, run.on_stderr, check=run.check)

    async def connect(
        self,
        pid: int,
        offset: int = 0,
        *,
        stdout_offset: int | None = None,
        stderr_offset: int | None = None,
    ) -> AsyncCommandHandle:
        """Follows a command from another handle or process, from
        ``offset``, or from ``stdout_offset`` and ``stderr_offset``; see
        ``Commands.connect``."""
        streams = _core.stream_offsets(stdout_offset, stderr_offset)
        return AsyncCommandHandle(await aio(self._native.attach, pid, offset, streams))

    async def list(self, *, all: bool = False) -> builtins.list[ProcessInfo]:
        """The commands running in the sandbox (``all``: also ended ones)."""
        return [p for p in await aio(self._native.commands) if all or p.running]

    async def send_stdin(self, pid: int, data: str | bytes) -> None:
        """Writes to a command's stdin by its id."""
        await aio(self._native.send_input, pid, raw(data))

    async def close_stdin(self, pid: int) -> None:
        """Closes a command's stdin by its id."""
        await aio(self._native.send_input, pid, None)

    async def interrupt(self, pid: int, grace: float | None = None) -> None:
        """SIGINT to the command's group, ``grace`` seconds, then SIGKILL."""
        await aio(self._native.interrupt, pid, grace)

    async def kill(self, pid: int) -> bool:
        """Kills a command at once; answers whether it was running."""
        return await aio(self._native.interrupt, pid, 0.0) == "running"

    def session(self, session_id: str) -> AsyncSession:
        """A shell session of the sandbox (made on its first run)."""
        return AsyncSession(self, session_id)

    async def sessions(self) -> builtins.list[SessionInfo]:
        """The sandbox's shell sessions."""
        return await aio(self._native.sessions)


class AsyncFiles:
    """The sandbox's files; ``Files``' verbs, awaited."""

    def __init__(self, native: _native.Sandbox):
        self._native = native

    @overload
    async def read(self, path: str, format: Literal["text"] = "text") -> str: ...
    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    @overload
    async def read(self, path: str, format: Literal["stream"]) -> AsyncIterator[bytes]: ...

    async def read(self, path: str, format: Literal["text", "bytes", "stream"] = "text") -> str | bytes | AsyncIterator[bytes]:
        """A file's contents, as text (UTF-8), bytes, or (``stream``) an
        async iterator of byte chunks as they arrive."""
        if format == "stream":
            return _chunks(await aio(self._native.open_file, path))
        data = await aio(self._native.read_file, path)
        return data if format == "bytes" else data.decode("utf-8", "replace")

    async def write(self, path: str, data: str | bytes, mode: int | None = None) -> EntryInfo:
        """Writes atomically, making missing parents."""
        return await aio(self._native.write_file, path, raw(data), mode)

    async def list(self, path: str) -> builtins.list[EntryInfo]:
        """A directory's entries, sorted by name."""
        return await aio(self._native.list_dir, path)

    async def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return await aio(self._native.exists, path)

    async def get_info(self, path: str) -> EntryInfo:
        """What is at ``path``."""
        return await aio(self._native.stat, path)

    stat = get_info

    async def rename(self, old_path: str, new_path: str) -> EntryInfo:
        """Moves ``old_path`` to ``new_path`` in one step; see ``Files.rename``."""
        return await aio(self._native.rename, old_path, new_path)

    async def watch_dir(
        self,
        path: str,
        on_event: Callable[[FilesystemEvent], Any],
        *,
        recursive: bool = False,
        on_exit: Callable[[str], Any] | None = None,
    ) -> AsyncWatchHandle:
        """Watches the directory ``path``, calling ``on_event`` (a function
        or a coroutine function) for each change; see ``Files.watch_dir``."""
        return AsyncWatchHandle(await aio(self._native.watch, path, recursive), on_event, on_exit)

    async def remove(self, path: str, recursive: bool = True) -> int:
        """Removes a file, link or directory; answers how many paths went."""
        return await aio(self._native.remove, path, recursive)

    async def make_dir(self, path: str, mode: int | None = None) -> bool:
        """Makes a directory and its parents; answers False if it existed."""
        existed = await self.exists(path)
        await aio(self._native.make_dir, path, mode)
        return not existed

    async def upload(self, local: HostPath, path: str) -> CopyReport:
        """Copies a host file or tree into the sandbox."""
        return await aio(self._native.upload, os.fspath(local), path)

    async def download(self, path: str, local: HostPath) -> CopyReport:
        """Copies a sandbox file or tree to the host."""
        return await aio(self._native.download, path, os.fspath(local))


class AsyncWatchHandle:
    """A watched directory (E2B's ``AsyncWatchHandle``): ``on_event`` is
    called for each change from a task of the running loop until ``stop``
    or the watch's end, when ``on_exit`` gets the reason."""

    def __init__(
        self,
        watcher: _native.DirWatcher,
        on_event: Callable[[FilesystemEvent], Any],
        on_exit: Callable[[str], Any] | None,
    ):
        self._watcher = watcher
        self._task = asyncio.get_running_loop().create_task(self._pump(on_event, on_exit))
        #: Why the watch ended, once it has (``None`` while it runs).
        self.ended: str | None = None

    async def _pump(self, on_event: Callable[[FilesystemEvent], Any], on_exit: Callable[[str], Any] | None) -> None:
        while self.ended is None:
            events, ended = await aio(self._watcher.next)
            for event in events:
                await _called(on_event, event)
            self.ended = ended
        if on_exit is not None:
            await _called(on_exit, self.ended)

    async def stop(self) -> None:
        """Ends the watch; ``on_exit`` is not called."""
        self._task.cancel()
        self.ended = self.ended or "stopped"
        await aio(self._watcher.stop)


async def _called(callback: Callable[..., Any], *args: Any) -> None:
    made = callback(*args)
    if inspect.isawaitable(made):
        await made


async def _chunks(reader: _native.FileReader) -> AsyncIterator[bytes]:
    while (chunk := await aio(reader.next)) is not None:
        yield chunk


class AsyncPty:
    """Commands under a pseudo-terminal; ``Pty``'s verbs, awaited."""

    def __init__(self, native: _native.Sandbox):
        self._native = native

    async def create(
        self,
        size: PtySize = PtySize(),
        *,
        cmd: str | list[str] | None = None,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> AsyncCommandHandle:
        """Starts ``cmd`` (the sandbox's shell when ``None``) on a terminal
        of ``size``; see ``Pty.create``."""
        spec = _core.pty_spec(size, cmd, cwd, envs, timeout)
        return AsyncCommandHandle(await aio(self._native.spawn, spec))

    async def send_stdin(self, pid: int, data: str | bytes) -> None:
        """Types ``data`` into the terminal."""
        await aio(self._native.send_input, pid, raw(data))

    async def resize(self, pid: int, size: PtySize) -> None:
        """Changes the terminal's size."""
        await aio(self._native.resize, pid, size.rows, size.cols)

    async def kill(self, pid: int) -> bool:
        """Kills the terminal's program; answers whether it was running."""
        return await aio(self._native.interrupt, pid, 0.0) == "running"


class AsyncSnapshots:
    """Snapshots; ``Snapshots``' verbs, awaited."""

    def __init__(self, sandbox: AsyncSandbox):
        self._sandbox = sandbox

    async def take(self, message: str | None = None) -> Snapshot:
        """Captures the file system now."""
        return await aio(self._sandbox._native.snapshot, message)

    async def list(self) -> list[Snapshot]:
        """Its snapshots, oldest first."""
        return self._sandbox._native.snapshots()

    async def diff(self, snapshot: Snapshot | str | None = None) -> Diff:
        """What differs between the files now and ``snapshot`` (see
        ``Snapshots.diff``)."""
        snapshot_id = None if snapshot is None else _snapshot_id(snapshot)
        return await aio(self._sandbox._native.diff, snapshot_id)

    async def rewind(self, snapshot: Snapshot | str) -> RewindReport:
        """Puts the file system back to ``snapshot``; its processes end."""
        return await aio(self._sandbox._native.rewind, _snapshot_id(snapshot))

    async def fork(
        self, snapshot: Snapshot | str, name: str, *, backend: str | None = None, template: str | None = None
    ) -> AsyncSandbox:
        """A new sandbox ``name`` from ``snapshot``, on any backend."""
        home = self._sandbox._home
        native, report = await aio(home.fork, _snapshot_id(snapshot), name, backend, template)
        return AsyncSandbox(native, home, report)

    async def fork_many(
        self,
        snapshot: Snapshot | str,
        name: str,
        count: int,
        *,
        backend: str | None = None,
        template: str | None = None,
    ) -> builtins.list[AsyncSandbox]:
        """``count`` new sandboxes ``name-1`` .. ``name-count`` from ``snapshot``, made at once."""
        home = self._sandbox._home
        made = await aio(home.fork_many, _snapshot_id(snapshot), name, count, backend, template)
        return [AsyncSandbox(native, home, report) for native, report in made]

    async def remove(self, snapshot: Snapshot | str) -> None:
        """Removes a snapshot."""
        await aio(self._sandbox._home.remove_snapshot, _snapshot_id(snapshot))


class AsyncSandbox(SandboxBase):
    """``Sandbox`` for asyncio: the same class methods and verbs, awaited."""

    def __init__(self, native: _native.Sandbox, home: _native.Home, made: ForkReport | OpenReport | None = None):
        super().__init__(native, home, made)
        #: Running commands and sessions.
        self.commands = AsyncCommands(native)
        #: Reading and writing files.
        self.files = AsyncFiles(native)
        #: Commands under a pseudo-terminal.
        self.pty = AsyncPty(native)
        #: Snapshots.
        self.snapshots = AsyncSnapshots(self)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill()

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        *,
        name: str | None = None,
        backend: str | None = None,
        envs: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        pool: str | None = None,
        spec: Mapping[str, Any] | None = None,
        home: HostPath | None = None,
    ) -> AsyncSandbox:
        """Creates and starts a sandbox; see ``Sandbox.create``."""
        home_ = _home(home)
        spec_json = _core.spec_json(template, backend, envs, metadata, cwd, timeout, spec)
        native, _ = await aio(home_.create, _core.claim_name(name, pool), spec_json, pool)
        return cls(native, home_)

    @classmethod
    async def open(
        cls,
        name: str,
        template: str | None = None,
        *,
        backend: str | None = None,
        envs: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        spec: Mapping[str, Any] | None = None,
        recreate: bool = False,
        home: HostPath | None = None,
    ) -> AsyncSandbox:
        """The sandbox ``name``, made if it does not exist; see ``Sandbox.open``."""
        home_ = _home(home)
        spec_json = _core.spec_json(template, backend, envs, metadata, cwd, timeout, spec)
        native, opened = await aio(home_.up, name, spec_json, recreate)
        return cls(native, home_, opened)

    @classmethod
    async def connect(cls, sandbox_id: str, *, start: bool = True, home: HostPath | None = None) -> AsyncSandbox:
        """A handle on an existing sandbox by id or name."""
        home_ = _home(home)
        return cls(await aio(home_.connect, sandbox_id, start), home_)

    @staticmethod
    async def list(*, metadata: Mapping[str, str] | None = None, home: HostPath | None = None) -> list[SandboxInfo]:
        """Every sandbox of the home (with ``metadata``: carrying those labels)."""
        return _core.labelled(await aio(_home(home).list), metadata)

    async def kill(self) -> bool:
        """Removes the sandbox and its machine; answers True."""
        await aio(self._home.kill, self.sandbox_id)
        return True

    async def stop(self) -> bool:
        """Stops it, keeping its files; answers whether it was running."""
        return await aio(self._native.stop)

    async def set_timeout(self, timeout: float | None) -> None:
        """Stops it ``timeout`` seconds from now whatever runs; ``None``
        lifts that. See ``Sandbox.set_timeout``."""
        await aio(self._native.set_timeout, timeout)

    async def get_timeout(self) -> float | None:
        """Seconds left before ``set_timeout`` stops it; ``None`` when unset."""
        return await aio(self._native.timeout)

    async def pause(self) -> bool:
        """Pauses it with its memory where the backend can (e2b)."""
        return await aio(self._home.pause, self.sandbox_id)

    async def start(self) -> None:
        """Starts it again after a stop or pause."""
        await aio(self._home.start, self.sandbox_id)

    async def info(self) -> SandboxRecord:
        """Its record: backend, spec, labels, where it came from."""
        return await aio(self._native.info)

    async def get_host(self, port: int) -> str:
        """Where ``port`` inside the sandbox is reached; see ``Sandbox.get_host``."""
        return (await self.get_port_url(port)).host

    async def get_port_url(self, port: int) -> PortUrl:
        """``host``, ``url`` and ``headers`` of ``port``; see ``Sandbox.get_port_url``."""
        return await aio(self._native.port_url, _core.port_number(port))

    async def agent_address(self) -> dict[str, Any]:
        """How a client of its own reaches this sandbox's agent."""
        return await aio(self._native.agent_address)


async def async_push_to_sandboxes(
    mount_path: str,
    sandbox_files: Mapping[AsyncTarget, PushFiles],
    *,
    concurrency: int | None = None,
    home: HostPath | None = None,
) -> PushReport:
    """``push_to_sandboxes`` for asyncio."""
    home_ = push_home(_home(home), sandbox_files)
    return await aio(home_.push, mount_path, _core.push_targets(sandbox_files), concurrency)


__all__ = [
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncPty",
    "AsyncSandbox",
    "AsyncSession",
    "AsyncSnapshots",
    "AsyncWatchHandle",
    "async_push_to_sandboxes",
]
