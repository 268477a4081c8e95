"""What a blocking class and its asyncio twin share, written once: the
state they hold, the properties that read it, and the steps of a verb that
do not wait. Each pair (``CommandHandle`` and ``AsyncCommandHandle``,
``Sandbox`` and ``AsyncSandbox``, ...) subclasses one of these and adds only
the calls that wait, blocking or awaited.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Generic, TypeVar

from . import _core, _native
from ._core import Event
from ._native import ForkReport, InvalidArgumentError, Lost, OpenReport, SessionInfo, Stderr, Stdout


class LostOutput(UserWarning):
    """Output the agent no longer held when a handle came back for it."""


def raw(data: str | bytes) -> bytes:
    """Text as UTF-8, bytes as they are: what stdin and files take."""
    return data.encode() if isinstance(data, str) else data


class HandleBase:
    """One command followed from this process: its id, where each stream
    stands, and what was lost."""

    def __init__(self, process: _native.Process):
        self._followed: _native.Process | None = process
        self._pid = process.id
        self._decoders = _core.Decoders()
        #: Output bytes reported lost so far.
        self.lost_bytes = 0

    @property
    def _process(self) -> _native.Process:
        if self._followed is None:
            raise InvalidArgumentError(f"command {self._pid} was disconnected; commands.connect({self._pid}) follows it again")
        return self._followed

    @property
    def pid(self) -> int:
        """The command's id in the sandbox's agent (E2B calls it ``pid``;
        ``commands.connect(pid)`` finds it again from any process)."""
        return self._pid

    @property
    def id(self) -> int:
        """The same as ``pid``."""
        return self._pid

    @property
    def stdout_offset(self) -> int | None:
        """Stdout bytes this handle has delivered (or found lost): where
        ``commands.connect(pid, stdout_offset=...)`` continues; ``None`` when
        the sandbox's agent does not count streams apart."""
        streams = self._followed.streams if self._followed is not None else None
        return streams[0] if streams is not None else None

    @property
    def stderr_offset(self) -> int | None:
        """Stderr bytes this handle has delivered, as ``stdout_offset``."""
        streams = self._followed.streams if self._followed is not None else None
        return streams[1] if streams is not None else None

    def disconnect(self) -> None:
        """Stops following it here; it runs on (``commands.connect`` again)."""
        self._followed = None

    def _seen(self, event: Event | None) -> Event | None:
        """A native step's event as it is; a loss is counted and warned of."""
        if isinstance(event, Lost):
            self.lost_bytes += event.count
            warnings.warn(f"{event.count} output bytes at offset {event.offset} were lost", LostOutput, stacklevel=3)
        return event

    def _texts(self, event: Event) -> tuple[str | None, str | None, None] | None:
        """E2B's ``(stdout, stderr, pty)`` shape of an output event, one
        side set; ``None`` for other events and for bytes that end inside
        a character (they come with the next chunk)."""
        if isinstance(event, Stdout):
            text = self._decoders.stdout.decode(event.data)
            return (text, None, None) if text else None
        if isinstance(event, Stderr):
            text = self._decoders.stderr.decode(event.data)
            return (None, text, None) if text else None
        return None


Commands = TypeVar("Commands")


class SessionBase(Generic[Commands]):
    """A shell session of a sandbox: its id and its sandbox's commands."""

    def __init__(self, commands: Commands, session_id: str):
        self._commands = commands
        #: The session's id.
        self.id = session_id

    def _running(self, sessions: list[SessionInfo]) -> int | None:
        """The command this session runs now, among ``sessions``."""
        for info in sessions:
            if info.id == self.id:
                return info.running
        return None


class SandboxBase:
    """One sandbox's handle: its native half, its home and how it was made."""

    def __init__(self, native: _native.Sandbox, home: _native.Home, made: ForkReport | OpenReport | None = None):
        self._native = native
        self._home = home
        #: How this sandbox came to be, when this process made or opened
        #: it: a ``ForkReport`` (from which pool, or why on a new machine)
        #: or an ``OpenReport`` (the tier ``open`` took); else ``None``.
        self.made = made

    @property
    def sandbox_id(self) -> str:
        """Its stable id (``sbx-…``)."""
        return self._native.id

    @property
    def name(self) -> str:
        """Its name (``silo ls`` shows it)."""
        return self._native.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, sandbox_id={self.sandbox_id!r})"


def push_home(default: _native.Home, targets: Iterable[object]) -> _native.Home:
    """The home a fan-out push runs in: the first sandbox handle's among
    ``targets``, else ``default`` (targets named by string)."""
    for target in targets:
        if isinstance(target, SandboxBase):
            return target._home
    return default
