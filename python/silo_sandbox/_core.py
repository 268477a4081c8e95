"""What the sync and async classes share besides the results: the
arguments' checks and the native specs built from them, the raising of a
failed command, and the wait on a native call made with an asyncio future.
The results themselves are the native module's frozen classes, made in Rust
from the library's reports, the same for ``Sandbox`` and ``AsyncSandbox``.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import enum
import json
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, TypeVar, Union

from . import _native
from ._native import (
    CommandExitError,
    CommandResult,
    Exit,
    InvalidArgumentError,
    Lost,
    SandboxInfo,
    SiloTimeoutError,
    Stderr,
    Stdout,
)

T = TypeVar("T")

#: What a file to push can be: its bytes, its text, a host file to read, or
#: ``None`` for an empty directory.
FileContent = Union[bytes, str, Path, None]


async def aio(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Awaits a native call made with an asyncio future: what the call
    answers without one (its stub's type) is what the future resolves to."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    call(*args, **kwargs, aio=(loop, future, _resolve))
    answer: T = await future
    return answer


def _resolve(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Called on the loop's thread with a native call's outcome."""
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


# ------------------------------------------------------- commands' results


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


#: What a followed command gives, in order: output, losses, then its end.
Event = Union[Stdout, Stderr, Lost, Exit]


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


def stream_offsets(stdout: int | None, stderr: int | None) -> tuple[int, int] | None:
    """Per-stream offsets for an attach, when either is given (the other
    then counts from 0)."""
    if stdout is None and stderr is None:
        return None
    if (stdout or 0) < 0 or (stderr or 0) < 0:
        raise InvalidArgumentError("stream offsets are byte counts, 0 or more")
    return (stdout or 0, stderr or 0)


# A str enum (``event.type == "create"`` holds) is a Python class: a native
# class cannot subclass str. The native ``FilesystemEvent`` looks it up here.
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
