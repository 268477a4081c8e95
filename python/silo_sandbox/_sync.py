"""The blocking classes: ``Sandbox`` and what hangs off it.

Every call releases the GIL while it waits. A blocking ``run`` or ``wait``
turns Ctrl-C into an interrupt of the command in the sandbox, waits for it
to end, then raises ``KeyboardInterrupt``.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from . import _core, _native
from ._base import HandleBase, LostOutput, SandboxBase, SessionBase, push_home, raw
from ._core import Event, PtySize, RunOptions
from ._native import (
    CommandResult,
    CopyReport,
    Diff,
    EntryInfo,
    FilesystemEvent,
    FillReport,
    ForkReport,
    InvalidArgumentError,
    OpenReport,
    PoolInfo,
    PortUrl,
    ProcessInfo,
    PushReport,
    RewindReport,
    SandboxInfo,
    SandboxRecord,
    SessionInfo,
    Snapshot,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from 3.11

#: A file or tree to upload or download on the host.
HostPath = str | os.PathLike[str]
#: What ``push_to_sandboxes`` takes per sandbox.
PushFiles = Mapping[str, _core.FileContent] | HostPath
#: A target of ``push_to_sandboxes``: a ``Sandbox`` or a name or id.
Target = TypeVar("Target", bound="Sandbox | str")

_homes: dict[str | None, _native.Home] = {}


def _home(path: HostPath | None) -> _native.Home:
    """One native home per path: it keeps the state connection open."""
    key = os.fspath(path) if path is not None else None
    found = _homes.get(key)
    if found is None:
        found = _homes[key] = _core.home(key)
    return found


class CommandHandle(HandleBase):
    """A command started with ``background=True`` or found again with
    ``commands.connect`` (E2B's ``CommandHandle``)."""

    def events(self) -> Iterator[Event]:
        """Each event as it comes: ``Stdout``, ``Stderr``, ``Lost``, then ``Exit``."""
        while (event := self._seen(self._process.next())) is not None:
            yield event

    def __iter__(self) -> Iterator[tuple[str | None, str | None, None]]:
        """E2B's shape: ``(stdout, stderr, pty)`` text chunks, one side set."""
        for event in self.events():
            if (texts := self._texts(event)) is not None:
                yield texts

    def wait(
        self,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        *,
        check: bool = True,
    ) -> CommandResult:
        """Waits for the end; answers everything it printed since it started.
        Raises ``CommandExitError`` on a non-zero exit unless ``check=False``."""
        result = self._process.wait(
            self._decoders.text_callback("stdout", on_stdout),
            self._decoders.text_callback("stderr", on_stderr),
        )
        return _core.checked(result, check)

    def interrupt(self, grace: float | None = None) -> None:
        """SIGINT to its process group, ``grace`` seconds, then SIGKILL."""
        self._process.interrupt(grace)

    def kill(self) -> bool:
        """Kills it at once (SIGKILL to its group); answers whether it was running."""
        return self._process.interrupt(0.0) == "running"

    def send_stdin(self, data: str | bytes) -> None:
        """Writes to the command's stdin (run with ``stdin=True``)."""
        self._process.send_stdin(raw(data))

    def close_stdin(self) -> None:
        """Closes the command's stdin, so it reads EOF."""
        self._process.send_stdin(None)


class Session(SessionBase["Commands"]):
    """A shell session in the sandbox: cwd, exported variables and shell
    variables carry over between runs, from any process."""

    @overload
    def run(self, cmd: str, background: Literal[False] = False, **options: Unpack[RunOptions]) -> CommandResult: ...
    @overload
    def run(self, cmd: str, background: Literal[True], **options: Unpack[RunOptions]) -> CommandHandle: ...

    def run(
        self, cmd: str, background: bool = False, **options: Unpack[RunOptions]
    ) -> CommandResult | CommandHandle:
        """``commands.run`` in this session (see there): ``cmd`` is a script
        of the session's shell."""
        options["session"] = self.id
        if background:
            return self._commands.run(cmd, True, **options)
        return self._commands.run(cmd, False, **options)

    def interrupt(self, grace: float | None = None) -> None:
        """Interrupts what the session runs; its shell survives."""
        if (running := self._running(self._commands.sessions())) is not None:
            self._commands.interrupt(running, grace)


class Commands:
    """Running commands (E2B's ``sandbox.commands``)."""

    def __init__(self, native: _native.Sandbox):
        self._native = native

    @overload
    def run(
        self, cmd: str | list[str], background: Literal[False] = False, **options: Unpack[RunOptions]
    ) -> CommandResult: ...
    @overload
    def run(
        self, cmd: str | list[str], background: Literal[True], **options: Unpack[RunOptions]
    ) -> CommandHandle: ...

    def run(
        self, cmd: str | list[str], background: bool = False, **options: Unpack[RunOptions]
    ) -> CommandResult | CommandHandle:
        """Runs ``cmd`` (a shell line, or a list of program and arguments).

        Waits for its end and answers a ``CommandResult``, raising
        ``CommandExitError`` on a non-zero exit (unless ``check=False``) and
        ``SiloTimeoutError`` (a builtin ``TimeoutError``) when ``timeout`` seconds ended it. With
        ``background=True`` answers a ``CommandHandle`` at once; the command
        runs on even if this process ends. ``session`` runs it in that shell
        session (created on first use); ``no_wait`` then fails with
        ``BusyError`` instead of queueing behind a running command.
        """
        run = _core.run_options(options)
        spec = run.spec(cmd, background)
        if background:
            return CommandHandle(self._native.spawn(spec))
        decoders = _core.Decoders()
        result = self._native.run(
            spec,
            decoders.text_callback("stdout", run.on_stdout),
            decoders.text_callback("stderr", run.on_stderr),
        )
        return _core.checked(result, run.check)

    def connect(
        self,
        pid: int,
        offset: int = 0,
        *,
        stdout_offset: int | None = None,
        stderr_offset: int | None = None,
    ) -> CommandHandle:
        """Follows a running (or recently ended) command from another handle
        or process, replaying its output from byte ``offset`` (stdout and
        stderr counted together), or from ``stdout_offset`` and
        ``stderr_offset`` bytes of each (a handle's own offsets); what the
        agent no longer holds is reported as ``Lost``, never skipped."""
        streams = _core.stream_offsets(stdout_offset, stderr_offset)
        return CommandHandle(self._native.attach(pid, offset, streams))

    def list(self, *, all: bool = False) -> builtins.list[ProcessInfo]:
        """The commands running in the sandbox (``all``: also those that
        ended, while the agent holds their result), by id."""
        return [p for p in self._native.commands() if all or p.running]

    def send_stdin(self, pid: int, data: str | bytes) -> None:
        """Writes to a command's stdin by its id (run with ``stdin=True``)."""
        self._native.send_input(pid, raw(data))

    def close_stdin(self, pid: int) -> None:
        """Closes a command's stdin by its id, so it reads EOF."""
        self._native.send_input(pid, None)

    def interrupt(self, pid: int, grace: float | None = None) -> None:
        """SIGINT to the command's group, ``grace`` seconds, then SIGKILL."""
        self._native.interrupt(pid, grace)

    def kill(self, pid: int) -> bool:
        """Kills a command at once; answers whether it was running."""
        return self._native.interrupt(pid, 0.0) == "running"

    def session(self, session_id: str) -> Session:
        """A shell session of the sandbox (made on its first run)."""
        return Session(self, session_id)

    def sessions(self) -> builtins.list[SessionInfo]:
        """The sandbox's shell sessions."""
        return self._native.sessions()


class Pty:
    """Commands under a pseudo-terminal (E2B's ``sandbox.pty``): a shell
    or program that sees a terminal, typed into with ``send_stdin``."""

    def __init__(self, native: _native.Sandbox):
        self._native = native

    def create(
        self,
        size: PtySize = PtySize(),
        *,
        cmd: str | list[str] | None = None,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandHandle:
        """Starts ``cmd`` (the sandbox's shell when ``None``) on a terminal
        of ``size``; its output (echo included) is the handle's stdout. It
        runs until it exits or is killed, followed or not."""
        spec = _core.pty_spec(size, cmd, cwd, envs, timeout)
        return CommandHandle(self._native.spawn(spec))

    def send_stdin(self, pid: int, data: str | bytes) -> None:
        """Types ``data`` into the terminal (``\\x03`` is Ctrl-C)."""
        self._native.send_input(pid, raw(data))

    def resize(self, pid: int, size: PtySize) -> None:
        """Changes the terminal's size (the program sees SIGWINCH)."""
        self._native.resize(pid, size.rows, size.cols)

    def kill(self, pid: int) -> bool:
        """Kills the terminal's program and what it started; answers
        whether it was running."""
        return self._native.interrupt(pid, 0.0) == "running"


class Files:
    """The sandbox's files (E2B's ``sandbox.files``)."""

    def __init__(self, native: _native.Sandbox):
        self._native = native

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...
    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["stream"]) -> Iterator[bytes]: ...

    def read(self, path: str, format: Literal["text", "bytes", "stream"] = "text") -> str | bytes | Iterator[bytes]:
        """A file's contents, as text (UTF-8), bytes, or (``stream``) an
        iterator of byte chunks as they arrive, for a file too large to
        hold; a missing file raises at the call, not at the first chunk."""
        if format == "stream":
            return _chunks(self._native.open_file(path))
        data = self._native.read_file(path)
        return data if format == "bytes" else data.decode("utf-8", "replace")

    def write(self, path: str, data: str | bytes, mode: int | None = None) -> EntryInfo:
        """Writes atomically (readers see the old file or the new one),
        making missing parents; answers what is there now."""
        return self._native.write_file(path, raw(data), mode)

    def list(self, path: str) -> builtins.list[EntryInfo]:
        """A directory's entries, sorted by name."""
        return self._native.list_dir(path)

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return self._native.exists(path)

    def get_info(self, path: str) -> EntryInfo:
        """What is at ``path`` (a symlink is described, not followed)."""
        return self._native.stat(path)

    stat = get_info

    def rename(self, old_path: str, new_path: str) -> EntryInfo:
        """Moves ``old_path`` to ``new_path`` in one step (atomic, within
        one file system), making missing parents; a file there is replaced,
        a directory only when empty. Answers what is at ``new_path``."""
        return self._native.rename(old_path, new_path)

    def watch_dir(self, path: str, recursive: bool = False) -> WatchHandle:
        """Watches the directory ``path`` (its subdirectories too with
        ``recursive``, those made later included); see ``WatchHandle``.
        A missing path raises ``NotFoundError``, a file
        ``InvalidArgumentError``."""
        return WatchHandle(self._native.watch(path, recursive))

    def remove(self, path: str, recursive: bool = True) -> int:
        """Removes a file, link or directory (a non-empty one only when
        ``recursive``); answers how many paths went."""
        return self._native.remove(path, recursive)

    def make_dir(self, path: str, mode: int | None = None) -> bool:
        """Makes a directory and its parents; answers False if it existed."""
        existed = self.exists(path)
        self._native.make_dir(path, mode)
        return not existed

    def upload(self, local: HostPath, path: str) -> CopyReport:
        """Copies a host file or tree into the sandbox (``docker cp``'s rules)."""
        return self._native.upload(os.fspath(local), path)

    def download(self, path: str, local: HostPath) -> CopyReport:
        """Copies a sandbox file or tree to the host (``docker cp``'s rules)."""
        return self._native.download(path, os.fspath(local))


class WatchHandle:
    """A watched directory (E2B's ``WatchHandle``): changes collect as they
    happen until ``stop``, or until the directory goes away."""

    def __init__(self, watcher: _native.DirWatcher):
        self._watcher = watcher
        #: Why the watch ended, once it has (``None`` while it runs).
        self.ended: str | None = None

    def get_new_events(self) -> builtins.list[FilesystemEvent]:
        """The changes received since the last call, without waiting."""
        events: builtins.list[FilesystemEvent] = []
        for taken, ended in self._watcher.take():
            events.extend(taken)
            self.ended = self.ended or ended
        return events

    def __iter__(self) -> Iterator[FilesystemEvent]:
        """Each change as it comes, waiting for it, until the watch ends."""
        while self.ended is None:
            events, self.ended = self._watcher.next()
            yield from events

    def stop(self) -> None:
        """Ends the watch."""
        self._watcher.stop()
        self.ended = self.ended or "stopped"


def _chunks(reader: _native.FileReader) -> Iterator[bytes]:
    while (chunk := reader.next()) is not None:
        yield chunk


class Snapshots:
    """Snapshots of the sandbox's file system: take, list, rewind, fork."""

    def __init__(self, sandbox: Sandbox):
        self._sandbox = sandbox

    def take(self, message: str | None = None) -> Snapshot:
        """Captures the file system now (processes and memory are not)."""
        return self._sandbox._native.snapshot(message)

    def list(self) -> list[Snapshot]:
        """Its snapshots, oldest first."""
        return self._sandbox._native.snapshots()

    def diff(self, snapshot: Snapshot | str | None = None) -> Diff:
        """What differs between the files now and ``snapshot`` (the latest
        one a diff did not take, by default), path by path: ``paths`` lists
        each with ``change`` (``added``, ``removed`` or ``changed``, with
        ``what``). The files now are captured as a snapshot first
        (``live``)."""
        snapshot_id = None if snapshot is None else _snapshot_id(snapshot)
        return self._sandbox._native.diff(snapshot_id)

    def rewind(self, snapshot: Snapshot | str) -> RewindReport:
        """Puts the file system back to ``snapshot``; its processes end."""
        return self._sandbox._native.rewind(_snapshot_id(snapshot))

    def fork(
        self, snapshot: Snapshot | str, name: str, *, backend: str | None = None, template: str | None = None
    ) -> Sandbox:
        """A new sandbox ``name`` from ``snapshot``, on any backend."""
        native, report = self._sandbox._home.fork(_snapshot_id(snapshot), name, backend, template)
        return Sandbox(native, self._sandbox._home, report)

    def fork_many(
        self,
        snapshot: Snapshot | str,
        name: str,
        count: int,
        *,
        backend: str | None = None,
        template: str | None = None,
    ) -> builtins.list[Sandbox]:
        """``count`` new sandboxes ``name-1`` .. ``name-count`` from ``snapshot``, made at
        once, each onto a started sandbox of a pool of the snapshot's spec when one fits.
        The first failure is raised; the sandboxes made are left."""
        home = self._sandbox._home
        made = home.fork_many(_snapshot_id(snapshot), name, count, backend, template)
        return [Sandbox(native, home, report) for native, report in made]

    def remove(self, snapshot: Snapshot | str) -> None:
        """Removes a snapshot (refused while another builds on it)."""
        self._sandbox._home.remove_snapshot(_snapshot_id(snapshot))


def _snapshot_id(snapshot: Snapshot | str) -> str:
    return snapshot if isinstance(snapshot, str) else snapshot.id


def _kill_by_id(sandbox_id: str, *, home: HostPath | None = None) -> bool:
    """``Sandbox.kill(id)``: removes the sandbox and its machine; answers True."""
    _home(home).kill(sandbox_id)
    return True


class _either:
    """A method callable on an instance or, with an id first, on the class
    (E2B's ``sbx.kill()`` and ``Sandbox.kill(id)``)."""

    def __init__(self, on_instance: Callable[..., bool], on_class: Callable[..., bool]):
        self.on_instance, self.on_class = on_instance, on_class
        self.__doc__ = on_instance.__doc__

    def __get__(self, instance: Any, owner: type) -> Callable[..., bool]:
        if instance is None:
            return lambda *a, **k: self.on_class(owner, *a, **k)
        return lambda *a, **k: self.on_instance(instance, *a, **k)


class Sandbox(SandboxBase):
    """One sandbox (E2B's ``Sandbox``), on the docker, podman, local, e2b
    or daytona backend, in the ``$SILO_HOME`` the ``silo`` command uses."""

    def __init__(self, native: _native.Sandbox, home: _native.Home, made: ForkReport | OpenReport | None = None):
        super().__init__(native, home, made)
        #: Running commands and sessions.
        self.commands = Commands(native)
        #: Reading and writing files.
        self.files = Files(native)
        #: Commands under a pseudo-terminal.
        self.pty = Pty(native)
        #: Taking, listing, rewinding to and forking from snapshots.
        self.snapshots = Snapshots(self)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

    @classmethod
    def create(
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
    ) -> Sandbox:
        """Creates and starts a sandbox. ``template`` is the image (docker)
        or template (e2b, daytona); the backend is docker when one is given,
        else local, unless ``backend`` says. ``timeout`` is the idle time in
        seconds after which it stops. ``pool`` takes a started one from a
        warm pool. A taken ``name`` is an error (``open`` reuses it)."""
        home_ = _home(home)
        spec_json = _core.spec_json(template, backend, envs, metadata, cwd, timeout, spec)
        native, _ = home_.create(_core.claim_name(name, pool), spec_json, pool)
        return cls(native, home_)

    @classmethod
    def open(
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
    ) -> Sandbox:
        """The sandbox ``name``, made if it does not exist (``silo up``):
        running, started, restored from its latest snapshot, or created. A
        changed spec raises ``SpecDriftError`` unless ``recreate``."""
        home_ = _home(home)
        spec_json = _core.spec_json(template, backend, envs, metadata, cwd, timeout, spec)
        native, opened = home_.up(name, spec_json, recreate)
        return cls(native, home_, opened)

    @classmethod
    def connect(cls, sandbox_id: str, *, start: bool = True, home: HostPath | None = None) -> Sandbox:
        """A handle on an existing sandbox by id or name; a stopped one is
        started (``start=False`` raises ``SandboxNotRunningError`` instead)."""
        home_ = _home(home)
        return cls(home_.connect(sandbox_id, start), home_)

    @staticmethod
    def list(*, metadata: Mapping[str, str] | None = None, home: HostPath | None = None) -> list[SandboxInfo]:
        """Every sandbox of the home (with ``metadata``: those carrying
        every label given)."""
        return _core.labelled(_home(home).list(), metadata)

    def _kill(self) -> bool:
        """Removes the sandbox and its machine; answers True."""
        self._home.kill(self.sandbox_id)
        return True

    kill = _either(_kill, lambda _owner, sandbox_id, *, home=None: _kill_by_id(sandbox_id, home=home))

    def stop(self) -> bool:
        """Stops it, keeping its files; answers whether it was running."""
        return self._native.stop()

    def set_timeout(self, timeout: float | None) -> None:
        """Stops it ``timeout`` seconds from now (rounded up to a whole
        second) whatever runs, its files kept as with ``stop``; ``None``
        lifts that. A later call replaces an earlier one. Beside the idle
        ``timeout`` of ``create``, which counts only time without use."""
        self._native.set_timeout(timeout)

    def get_timeout(self) -> float | None:
        """Seconds left before ``set_timeout`` stops it; ``None`` when unset."""
        return self._native.timeout()

    def pause(self) -> bool:
        """Pauses it with its memory where the backend can (e2b); elsewhere
        raises ``InvalidArgumentError`` (``stop`` keeps files only)."""
        return self._home.pause(self.sandbox_id)

    def start(self) -> None:
        """Starts it again after a stop or pause."""
        self._home.start(self.sandbox_id)

    def is_running(self) -> bool:
        """Whether its machine runs now."""
        return any(r.sandbox_id == self.sandbox_id and r.state == "running" for r in self._home.list())

    def info(self) -> SandboxRecord:
        """Its record: backend, spec, labels, where it came from."""
        return self._native.info()

    def get_host(self, port: int) -> str:
        """``host:port`` (or a proxy host name) reaching ``port`` inside the
        sandbox; a docker sandbox publishes none and raises
        ``InvalidArgumentError``. A daytona host also wants the headers
        ``get_port_url`` gives."""
        return self.get_port_url(port).host

    def get_port_url(self, port: int) -> PortUrl:
        """Where ``port`` inside the sandbox is reached: ``host``, ``url``
        and the ``headers`` (name, value pairs) a client must send, such as
        daytona's preview token."""
        return self._native.port_url(_core.port_number(port))

    def agent_address(self) -> dict[str, Any]:
        """How a client of its own reaches this sandbox's agent: transport,
        socket or host and port, Host header, proxy headers, CA file and
        the sandbox's key (docs/protocol.md, "Connecting to a sandbox")."""
        return self._native.agent_address()


class Pools:
    """Warm pools: started sandboxes of one spec, kept ready so that
    ``Sandbox.create(pool=...)`` costs a rename instead of a start."""

    @staticmethod
    def create(
        name: str,
        size: int,
        template: str | None = None,
        *,
        backend: str | None = None,
        spec: Mapping[str, Any] | None = None,
        snapshot: Snapshot | str | None = None,
        fill: bool = True,
        home: HostPath | None = None,
    ) -> PoolInfo:
        """Records a pool of ``size`` sandboxes and (``fill``) makes them.
        With ``snapshot`` its sandboxes are forks of that snapshot, made
        ahead (its spec; no ``template``, ``backend`` or ``spec``): a fork
        of the snapshot (``fork``, ``fork_many``) then claims one that
        stands on it already, however many files it holds."""
        home_ = _home(home)
        if snapshot is not None:
            if template is not None or backend is not None or spec is not None:
                raise InvalidArgumentError("a pool on a snapshot has the snapshot's spec; leave out template, backend and spec")
            return home_.create_pool(name, size, snapshot=_snapshot_id(snapshot), fill=fill)
        spec_json = _core.spec_json(template, backend, None, None, None, None, spec)
        return home_.create_pool(name, size, spec_json, fill=fill)

    @staticmethod
    def fill(name: str, *, home: HostPath | None = None) -> FillReport:
        """Makes the members the pool lacks."""
        return _home(home).fill_pool(name)

    @staticmethod
    def list(*, home: HostPath | None = None) -> builtins.list[PoolInfo]:
        """Every pool with its ready members."""
        return _home(home).pools()

    @staticmethod
    def remove(name: str, *, home: HostPath | None = None) -> int:
        """Removes a pool and its members; answers how many it had."""
        return _home(home).remove_pool(name)


def push_to_sandboxes(
    mount_path: str,
    sandbox_files: Mapping[Target, PushFiles],
    *,
    concurrency: int | None = None,
    home: HostPath | None = None,
) -> PushReport:
    """Pushes each sandbox's files to ``mount_path``, swapped in whole or
    not at all: ``{sandbox: {relative path: bytes | str | Path | None}}``
    or ``{sandbox: host directory}``. Each distinct set is bundled once;
    the pushes run in parallel with retries; one failing target never stops
    the others, and the report says what happened to each."""
    home_ = push_home(_home(home), sandbox_files)
    return home_.push(mount_path, _core.push_targets(sandbox_files), concurrency)


def snapshots(*, home: HostPath | None = None) -> list[Snapshot]:
    """Every snapshot of the home, of every sandbox."""
    return _home(home).snapshots()


__all__ = [
    "CommandHandle",
    "Commands",
    "Files",
    "LostOutput",
    "Pools",
    "Pty",
    "Sandbox",
    "Session",
    "Snapshots",
    "WatchHandle",
    "push_to_sandboxes",
    "snapshots",
]

