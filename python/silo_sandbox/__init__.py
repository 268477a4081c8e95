"""silo for Python: sandboxes that keep state, take files pushed to many at
once, snapshot, rewind and fork, with E2B's verbs where the concept is the
same.

    from silo_sandbox import Sandbox

    with Sandbox.create("silo-base:latest") as sandbox:
        print(sandbox.commands.run("echo hello").stdout)

``Sandbox`` blocks; ``AsyncSandbox`` is the same for asyncio. Both work on
the ``$SILO_HOME`` the ``silo`` command uses, so each sees the other's
sandboxes. The package carries silo's agent, as the command does.

Named ``silo_sandbox`` because ``silo`` and ``silo-sdk`` are other projects
on PyPI.
"""

from ._async import (
    AsyncCommandHandle,
    AsyncCommands,
    AsyncFiles,
    AsyncPty,
    AsyncSandbox,
    AsyncSession,
    AsyncSnapshots,
    AsyncWatchHandle,
    async_push_to_sandboxes,
)
from ._core import Event, FilesystemEventType, PtySize
from ._native import (  # the results: frozen classes, made in Rust from the library's reports
    CommandResult,
    CopyReport,
    Diff,
    EntryInfo,
    Exit,
    FilesystemEvent,
    FillReport,
    ForkReport,
    Lost,
    OpenReport,
    PathChange,
    PoolInfo,
    PortUrl,
    ProcessInfo,
    PushFailure,
    Pushed,
    PushReport,
    RewindReport,
    SandboxInfo,
    SandboxRecord,
    SessionInfo,
    Snapshot,
    Stderr,
    Stdout,
)
from ._native import AGENT_TARGET
from ._sync import (
    CommandHandle,
    Commands,
    Files,
    LostOutput,
    Pools,
    Pty,
    Sandbox,
    Session,
    Snapshots,
    WatchHandle,
    push_to_sandboxes,
    snapshots,
)
from ._native import (  # the exceptions, made and mapped in Rust (errors.rs)
    AgentUnreachableError,
    BusyError,
    CommandExitError,
    ImageNotFoundError,
    InvalidArgumentError,
    NotFoundError,
    ProviderError,
    PushError,
    SandboxNotFoundError,
    SandboxNotRunningError,
    SiloException,
    SiloTimeoutError,
    SnapshotError,
    SpecDriftError,
    TimeoutError,  # SiloTimeoutError's old name; not in __all__, so no star import shadows the builtin
)

__all__ = [
    "AGENT_TARGET",
    "AgentUnreachableError",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncPty",
    "AsyncSandbox",
    "AsyncSession",
    "AsyncSnapshots",
    "AsyncWatchHandle",
    "BusyError",
    "CommandExitError",
    "CommandHandle",
    "CommandResult",
    "Commands",
    "CopyReport",
    "Diff",
    "EntryInfo",
    "Event",
    "Exit",
    "Files",
    "FilesystemEvent",
    "FilesystemEventType",
    "FillReport",
    "ForkReport",
    "ImageNotFoundError",
    "InvalidArgumentError",
    "Lost",
    "LostOutput",
    "NotFoundError",
    "OpenReport",
    "PathChange",
    "PoolInfo",
    "Pools",
    "PortUrl",
    "ProcessInfo",
    "ProviderError",
    "Pty",
    "PtySize",
    "PushError",
    "PushFailure",
    "PushReport",
    "Pushed",
    "RewindReport",
    "Sandbox",
    "SandboxInfo",
    "SandboxNotFoundError",
    "SandboxNotRunningError",
    "SandboxRecord",
    "Session",
    "SessionInfo",
    "SiloException",
    "SiloTimeoutError",
    "Snapshot",
    "SnapshotError",
    "Snapshots",
    "SpecDriftError",
    "Stderr",
    "Stdout",
    "WatchHandle",
    "async_push_to_sandboxes",
    "push_to_sandboxes",
    "snapshots",
]
