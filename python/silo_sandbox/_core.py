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
import json
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar, Union

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
    args: tuple
    kwargs: dict
    post: Callable[[Any], T]

    def run(self) -> T:
        return self.post(self.call(*self.args, **self.kwargs))

    async def run_async(self) -> T:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.call(*self.args, **self.kwargs, aio=(loop, future, _resolve))
        return self.post(await future)


def _resolve(future: asyncio.Future, ok: bool, value: Any) -> None:
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


def command_result(parts: tuple) -> CommandResult:
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
    info: dict


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


def entry(data: dict) -> EntryInfo:
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
    spec: dict


def sandbox_info(row: dict) -> SandboxInfo:
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
    report: dict = dataclasses.field(default_factory=dict)


def snapshot(data: dict, report: dict | None = None) -> Snapshot:
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


def taken(report: dict) -> Snapshot:
    return snapshot(report["snapshot"], report)


@dataclasses.dataclass
class PushReport:
    """What a fan-out push did, per sandbox."""

    mount: str
    targets: int
    succeeded: int
    #: Of the succeeded, how many had the same files live already.
    unchanged: int
    #: ``{sandbox, version, sha256, files, bytes, unchanged, attempts, millis}`` each.
    pushed: list[dict]
    #: ``{sandbox, reason, detail, attempts}`` each.
    failures: list[dict]

    @property
    def ok(self) -> bool:
        """Whether every target has the files live."""
        return not self.failures and self.succeeded == self.targets


def push_report(data: dict) -> PushReport:
    return PushReport(
        mount=data["mount"],
        targets=data["targets"],
        succeeded=data["succeeded"],
        unchanged=data["unchanged"],
        pushed=data["pushed"],
        failures=data["failures"],
    )


# ------------------------------------------------------------- arguments


def home(path: str | os.PathLike | None) -> _native.Home:
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


def claim_name(name: str | None, pool: str | None) -> str | None:
    """The name a sandbox taken from ``pool`` gets when none is given."""
    if name is None and pool is not None:
        return f"{pool}-{uuid.uuid4().hex[:8]}"
    return name


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
    if isinstance(files, (str, os.PathLike)):
        root = Path(files)
        if not root.is_dir():
            raise InvalidArgumentError(f"{root} is not a directory to push")
        entries = []
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                raise InvalidArgumentError(f"{path} is a symlink; a push carries files and directories only")
            if path.is_dir():
                entries.append((relative, "dir", None, False))
            else:
                entries.append((relative, "path", str(path), os.access(path, os.X_OK)))
        return entries
    entries = []
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
