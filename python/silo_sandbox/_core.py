"""What the sync and async classes share: the data types, the conversion
of the native answers into them, and the arguments' checks. The sync
classes call the native module directly; the async ones through ``aio``,
which hands the native call an asyncio future to resolve. The same
conversions on both sides keep ``Sandbox`` and ``AsyncSandbox`` alike.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import datetime as _dt
import enum
import json
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypedDict, TypeVar, Union

from . import _native
from ._native import CommandExitError, InvalidArgumentError, SiloTimeoutError

T = TypeVar("T")

#: What a file to push can be: its bytes, its text, a host file to read, or
#: ``None`` for an empty directory.
FileContent = Union[bytes, str, Path, None]


@dataclasses.dataclass(frozen=True)
class Op(Generic[T]):
    """One native call and the conversion of its answer."""

    call: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    post: Callable[[Any], T]

    def run(self) -> T:
        return self.post(self.call(*self.args, **self.kwargs))

    async def run_async(self) -> T:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.call(*self.args, **self.kwargs, aio=(loop, future, _resolve))
        return self.post(await future)


def _resolve(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Called on the loop's thread with a native call's outcome."""
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


async def aio(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Awaits a native call made with an asyncio future."""
    return await Op(call, args, kwargs, lambda v: v).run_async()


# ---------------------------------------------------------------- results


@dataclasses.dataclass
class CommandResult:
    """How a command ended and what it printed (E2B's ``CommandResult``)."""

    #: Everything it wrote to stdout, decoded as UTF-8 (bad bytes replaced).
    stdout: str
    #: Everything it wrote to stderr, decoded likewise.
    stderr: str
    #: Its exit code; 128 + the signal when a signal ended it.
    exit_code: int
    #: Why it failed in words, or ``None`` when it exited 0.
    error: str | None = None
    #: The raw bytes of stdout.
    stdout_bytes: bytes = b""
    #: The raw bytes of stderr.
    stderr_bytes: bytes = b""
    #: Output bytes the agent no longer held when this client came back
    #: for them (never dropped silently: counted here).
    lost_bytes: int = 0
    #: The signal that ended it, if one did.
    signal: int | None = None
    #: An interrupt (``interrupt()``, ``kill()``, Ctrl-C) ended it.
    interrupted: bool = False
    #: Its timeout ended it.
    timed_out: bool = False
    #: Wall time from start to exit, in milliseconds.
    duration_ms: int = 0
    #: Session runs: the session's shell had died and was started again
    #: with its last cwd and environment (shell variables were lost).
    restored: bool = False
    #: A rewind of the sandbox ended it: the snapshot it went back to
    #: (``""`` when the rewind did not say).
    ended_by_rewind: str | None = None


def command_result(parts: tuple[bytes, bytes, int, dict[str, Any] | None]) -> CommandResult:
    stdout, stderr, lost, exit_info = parts
    exit_info = exit_info or {}
    code = exit_info.get("code")
    signal = exit_info.get("signal")
    exit_code = code if code is not None else (128 + signal if signal is not None else 255)
    error = None
    rewound_to = exit_info.get("ended_by_rewind")
    if exit_info.get("timed_out"):
        error = "the command timed out"
    elif rewound_to is not None:
        error = "the command was ended by a rewind"
        if rewound_to:
            error += f" to {rewound_to}"
    elif exit_info.get("interrupted"):
        error = "the command was interrupted"
    elif signal is not None:
        error = f"the command was killed by signal {signal}"
    elif exit_code != 0:
        error = f"the command exited with code {exit_code}"
    return CommandResult(
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        exit_code=exit_code,
        error=error,
        stdout_bytes=stdout,
        stderr_bytes=stderr,
        lost_bytes=lost,
        signal=signal,
        interrupted=bool(exit_info.get("interrupted")),
        timed_out=bool(exit_info.get("timed_out")),
        duration_ms=int(exit_info.get("duration_ms", 0)),
        restored=bool(exit_info.get("restored")),
        ended_by_rewind=rewound_to,
    )


def checked(result: CommandResult, check: bool) -> CommandResult:
    """Raises as E2B does for a failed command: its timeout as
    ``SiloTimeoutError``, another non-zero exit as ``CommandExitError``."""
    if result.timed_out:
        raise SiloTimeoutError(f"{result.error} after {result.duration_ms} ms")
    if check and result.exit_code != 0:
        error = CommandExitError(f"{result.error}: {result.stderr.strip()[-500:]}".rstrip(": "))
        error.exit_code = result.exit_code
        error.stdout = result.stdout
        error.stderr = result.stderr
        error.result = result
        raise error
    return result


@dataclasses.dataclass(frozen=True)
class Stdout:
    """Output a command wrote to stdout, at byte ``offset`` of its output."""

    data: bytes
    offset: int


@dataclasses.dataclass(frozen=True)
class Stderr:
    """Output a command wrote to stderr, at byte ``offset`` of its output."""

    data: bytes
    offset: int


@dataclasses.dataclass(frozen=True)
class Lost:
    """``count`` output bytes from ``offset`` that the agent no longer held."""

    offset: int
    count: int


@dataclasses.dataclass(frozen=True)
class Exit:
    """The command ended; nothing follows."""

    exit_code: int
    info: dict[str, Any]


Event = Union[Stdout, Stderr, Lost, Exit]


def event(step: Any) -> Event | None:
    if step is None:
        return None
    kind = step[0]
    if kind == "stdout":
        return Stdout(step[1], step[2])
    if kind == "stderr":
        return Stderr(step[1], step[2])
    if kind == "lost":
        return Lost(step[1], step[2])
    return Exit(command_result((b"", b"", 0, step[1])).exit_code, step[1])


class Decoders:
    """Incremental UTF-8 decoding of each stream, so a character split
    across two chunks reaches a callback whole."""

    def __init__(self) -> None:
        self.stdout = codecs.getincrementaldecoder("utf-8")("replace")
        self.stderr = codecs.getincrementaldecoder("utf-8")("replace")

    def text_callback(self, stream: str, callback: Callable[[str], Any] | None) -> Callable[[bytes], Any] | None:
        if callback is None:
            return None
        decoder = self.stdout if stream == "stdout" else self.stderr

        def deliver(data: bytes) -> None:
            text = decoder.decode(data)
            if text:
                callback(text)

        return deliver


@dataclasses.dataclass
class EntryInfo:
    """One path in a sandbox (E2B's ``EntryInfo``)."""

    name: str
    #: ``file``, ``dir``, ``symlink`` or ``other``.
    type: str
    path: str
    size: int
    #: Permission bits, as an int (0o644).
    mode: int
    modified_time: _dt.datetime
    symlink_target: str | None = None

    @property
    def permissions(self) -> str:
        """The mode as ``ls`` shows it, without the type (``rw-r--r--``)."""
        bits = "rwxrwxrwx"
        return "".join(c if self.mode & (1 << (8 - i)) else "-" for i, c in enumerate(bits))


def entry(data: dict[str, Any]) -> EntryInfo:
    return EntryInfo(
        name=data["name"],
        type=data["kind"],
        path=data["path"],
        size=data["size"],
        mode=data["mode"],
        modified_time=_dt.datetime.fromtimestamp(data["modified_ms"] / 1000, tz=_dt.timezone.utc),
        symlink_target=data.get("link_target"),
    )


@dataclasses.dataclass
class SandboxInfo:
    """One sandbox as ``list`` sees it (E2B's ``SandboxInfo``)."""

    sandbox_id: str
    name: str
    backend: str
    #: ``running``, ``stopped`` or ``missing`` (what its backend says now).
    state: str
    #: Its labels (E2B's metadata).
    metadata: dict[str, str]
    started_at: _dt.datetime
    spec: dict[str, Any]


def sandbox_info(row: dict[str, Any]) -> SandboxInfo:
    return SandboxInfo(
        sandbox_id=row["id"],
        name=row["name"],
        backend=row["backend"],
        state=row.get("state", "unknown"),
        metadata=dict(row.get("spec", {}).get("labels", {})),
        started_at=_dt.datetime.fromtimestamp(row.get("created_at_ms", 0) / 1000, tz=_dt.timezone.utc),
        spec=row.get("spec", {}),
    )


@dataclasses.dataclass
class Snapshot:
    """A snapshot of a sandbox's file system (processes and memory are not
    captured)."""

    id: str
    sandbox_id: str
    sandbox_name: str
    parent: str | None
    message: str | None
    layer_bytes: int
    created_at: _dt.datetime
    #: The full report (timings, entries) when it was just taken.
    report: dict[str, Any] = dataclasses.field(default_factory=dict)


def snapshot(data: dict[str, Any], report: dict[str, Any] | None = None) -> Snapshot:
    return Snapshot(
        id=data["id"],
        sandbox_id=data["sandbox_id"],
        sandbox_name=data["sandbox_name"],
        parent=data.get("parent"),
        message=data.get("message"),
        layer_bytes=data.get("layer_bytes", 0),
        created_at=_dt.datetime.fromtimestamp(data.get("created_at_ms", 0) / 1000, tz=_dt.timezone.utc),
        report=report or {},
    )


def taken(report: dict[str, Any]) -> Snapshot:
    return snapshot(report["snapshot"], report)


@dataclasses.dataclass(frozen=True)
class Pushed:
    """One sandbox that has the pushed files live."""

    sandbox: str
    #: The mount's version now live.
    version: str
    #: Digest of the bundle.
    sha256: str
    files: int
    bytes: int
    #: It had the same files live already.
    unchanged: bool
    attempts: int
    millis: int


@dataclasses.dataclass(frozen=True)
class PushFailure:
    """One sandbox the push could not reach or was refused by."""

    sandbox: str
    #: ``stopped``, ``missing``, ``removed``, ``refused``, ``unreachable``, ...
    reason: str
    detail: str
    attempts: int


@dataclasses.dataclass
class PushReport:
    """What a fan-out push did, per sandbox."""

    mount: str
    targets: int
    succeeded: int
    #: Of the succeeded, how many had the same files live already.
    unchanged: int
    pushed: list[Pushed]
    failures: list[PushFailure]

    @property
    def ok(self) -> bool:
        """Whether every target has the files live."""
        return not self.failures and self.succeeded == self.targets


R = TypeVar("R")


def _picked(cls: type[R], data: dict[str, Any]) -> R:
    """``cls`` from the fields of ``data`` it has (the native side may add more)."""
    names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


def push_report(data: dict[str, Any]) -> PushReport:
    return PushReport(
        mount=data["mount"],
        targets=data["targets"],
        succeeded=data["succeeded"],
        unchanged=data["unchanged"],
        pushed=[_picked(Pushed, item) for item in data["pushed"]],
        failures=[_picked(PushFailure, item) for item in data["failures"]],
    )


@dataclasses.dataclass(frozen=True)
class SandboxRecord:
    """What silo's state recorded of a sandbox (``info()``)."""

    sandbox_id: str
    name: str
    backend: str
    #: Its labels (E2B's metadata).
    metadata: dict[str, str]
    #: The spec it was made with.
    spec: dict[str, Any]
    created_at: _dt.datetime
    updated_at: _dt.datetime
    #: The snapshot it was forked or restored from, if any.
    origin_snapshot: str | None
    #: The snapshot its files were last taken to or rewound to, if any.
    checkpoint: str | None
    #: The whole record, as ``silo ls --json`` prints it.
    raw: dict[str, Any]


def _time(ms: Any) -> _dt.datetime:
    return _dt.datetime.fromtimestamp((ms or 0) / 1000, tz=_dt.timezone.utc)


def sandbox_record(data: dict[str, Any]) -> SandboxRecord:
    spec = dict(data.get("spec") or {})
    checkpoint = data.get("checkpoint") or {}
    return SandboxRecord(
        sandbox_id=data["id"],
        name=data["name"],
        backend=data["backend"],
        metadata=dict(spec.get("labels", {})),
        spec=spec,
        created_at=_time(data.get("created_at_ms")),
        updated_at=_time(data.get("updated_at_ms")),
        origin_snapshot=data.get("origin_snapshot"),
        checkpoint=checkpoint.get("snapshot") if isinstance(checkpoint, dict) else None,
        raw=data,
    )


@dataclasses.dataclass(frozen=True)
class RewindReport:
    """How a rewind went (``snapshots.rewind``)."""

    #: The snapshot the files went back to.
    snapshot: str
    #: Restored in place by the agent (milliseconds), not on a new machine.
    in_place: bool
    #: Why a new machine was made instead, when one was.
    new_machine_because: str | None
    #: Paths the rewind changed, and the sandbox's processes it ended.
    changed: int
    processes_ended: int
    #: Wall time, in milliseconds.
    ms: float
    #: The whole report, with the phases' timings.
    raw: dict[str, Any]


def rewind_report(data: dict[str, Any], snapshot_id: str) -> RewindReport:
    image = data.get("image") or {}
    in_place = image.get("in_place") if isinstance(image, dict) else None
    return RewindReport(
        snapshot=snapshot_id,
        in_place=isinstance(in_place, dict),
        new_machine_because=data.get("new_machine_because"),
        changed=int(in_place.get("changed", 0)) if isinstance(in_place, dict) else 0,
        processes_ended=int(in_place.get("processes_ended", 0)) if isinstance(in_place, dict) else 0,
        ms=float(data.get("ms", 0.0)),
        raw=data,
    )


@dataclasses.dataclass(frozen=True)
class ForkReport:
    """How a fork was made (``Sandbox.made`` after ``fork`` or ``fork_many``)."""

    #: The snapshot it was made from.
    snapshot: str
    #: The warm pool it was claimed from, if any.
    pool: str | None
    #: Why a new machine was made instead of claiming a pool member, if one was.
    new_machine_because: str | None
    #: Wall time until its agent answered, in milliseconds.
    ms: float


def fork_report(data: dict[str, Any]) -> ForkReport:
    return ForkReport(
        snapshot=data.get("snapshot", ""),
        pool=data.get("pool"),
        new_machine_because=data.get("new_machine_because"),
        ms=float(data.get("ms", 0.0)),
    )


@dataclasses.dataclass(frozen=True)
class OpenReport:
    """What ``Sandbox.open`` did (``Sandbox.made``): the tier it took."""

    #: ``attached`` or ``started`` (tier 1), ``restored`` (tier 2: from
    #: its latest snapshot), ``created``, ``recreated`` or ``claimed`` (tier
    #: 3: new, or taken from a warm pool).
    action: str
    tier: int
    #: Why a tier was passed over (machine gone, spec changed, ...).
    notes: tuple[str, ...]
    #: Wall time of the call, in milliseconds.
    ms: float


def open_report(data: dict[str, Any], ms: float) -> OpenReport:
    return OpenReport(
        action=str(data.get("action", "")),
        tier=int(data.get("tier", 0)),
        notes=tuple(str(n) for n in data.get("notes", [])),
        ms=ms,
    )


@dataclasses.dataclass(frozen=True)
class PathChange:
    """One path that differs between two file systems."""

    path: str
    #: ``added``, ``removed`` or ``changed``.
    change: str
    #: For ``changed``: what differs (``content``, ``mode``, ``kind``, ...).
    what: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Diff:
    """What differs between a sandbox's files and a snapshot (``snapshots.diff``)."""

    #: The snapshot compared with.
    snapshot: str
    #: The snapshot the files now were captured as.
    live: str
    paths: tuple[PathChange, ...]


def diff(data: dict[str, Any]) -> Diff:
    paths = []
    for item in data.get("paths", []):
        what = item.get("what") or ()
        paths.append(PathChange(item["path"], item["change"], tuple(what) if isinstance(what, list) else (str(what),)))
    return Diff(snapshot=data["snapshot"], live=data["live"], paths=tuple(paths))


@dataclasses.dataclass(frozen=True)
class CopyReport:
    """What ``files.upload`` or ``files.download`` copied."""

    #: Where it landed.
    path: str
    files: int
    dirs: int
    bytes: int


def copy_report(data: dict[str, Any]) -> CopyReport:
    return CopyReport(path=data["path"], files=data["files"], dirs=data["dirs"], bytes=data["bytes"])


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """One shell session of a sandbox (``commands.sessions``)."""

    id: str
    shell: str
    #: The shell's pid, while it runs.
    pid: int | None
    #: Its working directory after its last command.
    cwd: str
    #: The id of the command it runs now (``commands.connect`` follows it), if any.
    running: int | None
    #: That command's text.
    command: str | None
    #: Commands waiting for it.
    queued: int


def session_info(data: dict[str, Any]) -> SessionInfo:
    return SessionInfo(
        id=data["id"],
        shell=data.get("shell", ""),
        pid=data.get("pid"),
        cwd=data.get("cwd", ""),
        running=data.get("running"),
        command=data.get("command"),
        queued=int(data.get("queued", 0)),
    )


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """One command the sandbox's agent holds (E2B's ``ProcessInfo``, from
    ``commands.list``)."""

    #: Its id: what ``commands.connect``, ``kill`` and the ``pty`` calls take.
    pid: int
    #: Its process id inside the sandbox.
    os_pid: int
    #: The program (a session run: its script).
    cmd: str
    args: tuple[str, ...]
    cwd: str
    #: The shell session it runs in, if any.
    session: str | None
    #: Under a pseudo-terminal (``pty.create``).
    tty: bool
    #: Still running; ``commands.list(all=True)`` also lists ended ones.
    running: bool
    #: Seconds since it started.
    age: float
    #: Output bytes so far, stdout and stderr together.
    output_bytes: int


def process_info(data: dict[str, Any]) -> ProcessInfo:
    argv = [str(a) for a in data.get("argv", [])]
    return ProcessInfo(
        pid=int(data["exec_id"]),
        os_pid=int(data["pid"]),
        cmd=argv[0] if argv else "",
        args=tuple(argv[1:]),
        cwd=data.get("cwd", ""),
        session=data.get("session"),
        tty=bool(data.get("tty", False)),
        running=data.get("state") == "running",
        age=int(data.get("age_ms", 0)) / 1000,
        output_bytes=int(data.get("output_bytes", 0)),
    )


def stream_offsets(stdout: int | None, stderr: int | None) -> tuple[int, int] | None:
    """Per-stream offsets for an attach, when either is given (the other
    then counts from 0)."""
    if stdout is None and stderr is None:
        return None
    if (stdout or 0) < 0 or (stderr or 0) < 0:
        raise InvalidArgumentError("stream offsets are byte counts, 0 or more")
    return (stdout or 0, stderr or 0)


class FilesystemEventType(str, enum.Enum):
    """What happened to a watched path (E2B's ``FilesystemEventType``, and
    ``OVERFLOW``: the kernel dropped changes; look at the tree again)."""

    CREATE = "create"
    WRITE = "write"
    REMOVE = "remove"
    #: Moved away; its new name, if inside the watch, comes as a ``CREATE``.
    RENAME = "rename"
    CHMOD = "chmod"
    OVERFLOW = "overflow"


@dataclasses.dataclass(frozen=True)
class FilesystemEvent:
    """One change in a watched directory (E2B's ``FilesystemEvent``)."""

    #: The path, relative to the watched directory.
    name: str
    type: FilesystemEventType
    #: The path is a directory.
    is_dir: bool = False


class WatchStep(NamedTuple):
    """What one step of a native watch says: changes, or why it ended."""

    events: list[FilesystemEvent]
    #: Set when the watch ended (its directory went away, or the
    #: connection to the agent did); nothing follows.
    ended: str | None = None


def watch_step(step: list[tuple[str, str, bool]] | tuple[str, str] | None) -> WatchStep:
    if step is None:
        return WatchStep([], "the connection to the sandbox's agent was lost")
    if isinstance(step, tuple):
        return WatchStep([], step[1])
    return WatchStep([FilesystemEvent(name, FilesystemEventType(kind), is_dir) for kind, name, is_dir in step])


class PtySize(NamedTuple):
    """A terminal's size in character cells (E2B's ``PtySize``)."""

    rows: int = 24
    cols: int = 80


def pty_spec(size: PtySize, cmd: str | list[str] | None, cwd: str | None, envs: Mapping[str, str] | None, timeout: float | None) -> str:
    """The exec spec of a command under a pseudo-terminal: ``cmd`` (a
    shell line, a program and arguments, or the sandbox's shell when
    ``None``), its window, stdin open, kept while nobody follows it."""
    argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd or [])
    spec: dict[str, Any] = {
        "argv": argv,
        "tty": True,
        "stdin": True,
        "window": {"rows": int(size.rows), "cols": int(size.cols)},
        "detach_timeout_ms": 0,
    }
    if cwd is not None:
        spec["cwd"] = cwd
    if envs:
        spec["env"] = dict(envs)
    if timeout is not None:
        spec["timeout_ms"] = int(timeout * 1000)
    return json.dumps(spec)


@dataclasses.dataclass(frozen=True)
class PortUrl:
    """Where a port inside a sandbox is reached from the host."""

    host: str
    url: str
    #: ``(name, value)`` headers a client must send (daytona's preview token).
    headers: tuple[tuple[str, str], ...] = ()


def port_url(data: dict[str, Any]) -> PortUrl:
    headers = tuple((str(name), str(value)) for name, value in data.get("headers", []))
    return PortUrl(host=data["host"], url=data["url"], headers=headers)


@dataclasses.dataclass(frozen=True)
class FillReport:
    """What filling a pool did."""

    #: Members made.
    made: int
    #: Why members could not be made, one line each.
    failed: tuple[str, ...]


def fill_report(data: dict[str, Any]) -> FillReport:
    return FillReport(made=int(data.get("made", 0)), failed=tuple(str(f) for f in data.get("failed", [])))


@dataclasses.dataclass(frozen=True)
class PoolInfo:
    """A warm pool (``Pools.list``, ``Pools.create``)."""

    name: str
    #: Members it keeps started.
    size: int
    #: Members ready to be claimed now.
    ready: int
    #: Their sandbox ids, oldest first.
    members: tuple[str, ...]
    #: The spec of every member.
    spec: dict[str, Any]
    #: The snapshot its members stand on (``Pools.create(snapshot=)``), if any.
    snapshot: str | None = None
    #: What the fill ``Pools.create`` ran did, when it ran one.
    fill: FillReport | None = None


def pool_info(data: dict[str, Any], fill: FillReport | None = None) -> PoolInfo:
    ready = int(data.get("ready", fill.made if fill is not None else 0))
    return PoolInfo(
        name=data["name"],
        size=int(data.get("size", 0)),
        ready=ready,
        members=tuple(data.get("members", [])),
        spec=dict(data.get("spec") or {}),
        snapshot=data.get("snapshot"),
        fill=fill,
    )


# ------------------------------------------------------------- arguments


def home(path: str | os.PathLike[str] | None) -> _native.Home:
    return _native.Home(os.fspath(path) if path is not None else None)


def spec_json(
    template: str | None,
    backend: str | None,
    envs: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    cwd: str | None,
    timeout: float | None,
    spec: Mapping[str, Any] | None,
) -> str:
    """A sandbox spec: docker when an image (template) is given, else
    local, as ``silo create`` chooses; ``spec`` adds any other field."""
    data: dict[str, Any] = dict(spec or {})
    if template is not None:
        data["image"] = template
    if backend is not None:
        data["backend"] = backend
    data.setdefault("backend", "docker" if data.get("image") else "local")
    if envs:
        data["env"] = {**data.get("env", {}), **envs}
    if metadata:
        data["labels"] = {**data.get("labels", {}), **metadata}
    if cwd is not None:
        data["workdir"] = cwd
    if timeout is not None:
        data["idle_timeout_secs"] = max(1, int(timeout))
    return json.dumps(data)


def labelled(rows: list[SandboxInfo], metadata: Mapping[str, str] | None) -> list[SandboxInfo]:
    """The sandboxes carrying every label of ``metadata``."""
    wanted = dict(metadata or {})
    return [r for r in rows if all(r.metadata.get(k) == v for k, v in wanted.items())]


def claim_name(name: str | None, pool: str | None) -> str | None:
    """The name a sandbox taken from ``pool`` gets when none is given."""
    if name is None and pool is not None:
        return f"{pool}-{uuid.uuid4().hex[:8]}"
    return name


class RunOptions(TypedDict, total=False):
    """The keywords of ``commands.run`` and a session's ``run`` (see
    ``Commands.run``), typed once for both classes: a misspelt one is a type
    error, and a ``TypeError`` when run."""

    envs: Mapping[str, str] | None
    cwd: str | None
    on_stdout: Callable[[str], Any] | None
    on_stderr: Callable[[str], Any] | None
    stdin: bool
    timeout: float | None
    session: str | None
    check: bool
    no_wait: bool


@dataclasses.dataclass(frozen=True)
class Run:
    """A run's options with their defaults."""

    envs: Mapping[str, str] | None = None
    cwd: str | None = None
    on_stdout: Callable[[str], Any] | None = None
    on_stderr: Callable[[str], Any] | None = None
    stdin: bool = False
    timeout: float | None = None
    session: str | None = None
    check: bool = True
    no_wait: bool = False

    def spec(self, cmd: str | list[str], background: bool) -> str:
        """The exec spec of ``cmd`` run with these options."""
        return exec_json(
            cmd, envs=self.envs, cwd=self.cwd, timeout=self.timeout, stdin=self.stdin,
            session=self.session, background=background, no_wait=self.no_wait,
        )


def run_options(options: Mapping[str, Any]) -> Run:
    """``options`` as a ``Run``, refusing a keyword ``run`` has not, as
    Python refuses one."""
    known = {field.name for field in dataclasses.fields(Run)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"run() got an unexpected keyword argument {unknown[0]!r}")
    return Run(**options)


def exec_json(
    cmd: str | list[str],
    *,
    envs: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    stdin: bool = False,
    session: str | None = None,
    background: bool = False,
    no_wait: bool = False,
) -> str:
    """An exec spec: a string is a shell line (``sh -c``), a list a program
    and its arguments; in a session a string is a script of the session's
    shell."""
    if isinstance(cmd, str):
        argv = [cmd] if session is not None else ["sh", "-c", cmd]
    else:
        argv = list(cmd)
    if not argv:
        raise InvalidArgumentError("an empty command")
    data: dict[str, Any] = {"argv": argv, "stdin": stdin}
    if envs:
        data["env"] = dict(envs)
    if cwd is not None:
        data["cwd"] = cwd
    if timeout is not None:
        if timeout <= 0:
            raise InvalidArgumentError(f"timeout {timeout} is not a positive number of seconds")
        data["timeout_ms"] = max(1, int(timeout * 1000))
    if session is not None:
        data["session"] = session
        data["no_wait"] = no_wait
    if background:
        # E2B's background commands run on without a client: so do these,
        # until they end, are killed, or the sandbox stops.
        data["detach_timeout_ms"] = 0
    return json.dumps(data)


def push_targets(targets: Mapping[Any, Any]) -> list[tuple[str, list[tuple[str, str, Any, bool]]]]:
    """``{sandbox or name: files}`` in the native shape. ``files`` is a
    mapping of relative path to content, or a host directory to push whole."""
    out = []
    for target, files in targets.items():
        name = target if isinstance(target, str) else target.sandbox_id
        out.append((name, file_entries(files)))
    return out


def file_entries(files: Any) -> list[tuple[str, str, Any, bool]]:
    """One target's files in the native shape: a host directory is read
    whole by the library, as ``silo push`` reads one (symlinks and special
    files refused by name)."""
    if isinstance(files, (str, os.PathLike)):
        return [("", "tree", os.fspath(files), False)]
    entries: list[tuple[str, str, Any, bool]] = []
    for relative, content in files.items():
        if content is None:
            entries.append((relative, "dir", None, False))
        elif isinstance(content, bytes):
            entries.append((relative, "bytes", content, False))
        elif isinstance(content, str):
            entries.append((relative, "bytes", content.encode(), False))
        elif isinstance(content, os.PathLike):
            entries.append((relative, "path", os.fspath(content), os.access(content, os.X_OK)))
        else:
            raise InvalidArgumentError(f"{relative}: {type(content).__name__} is not bytes, str, a path or None")
    return entries


def port_number(port: int) -> int:
    """A port of the sandbox, checked before it crosses to the native side."""
    if not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidArgumentError(f"{port!r} is not a port")
    return port
