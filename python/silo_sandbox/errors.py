"""The exceptions silo raises: one hierarchy under ``SiloException``.

Each class is raised from the library's own errors (the Rust side maps
them), with the same message the ``silo`` command prints. The package's
README names E2B's nearest class for each.
"""

from ._native import (
    AgentUnreachableError,
    BusyError,
    CommandExitError,
    InvalidArgumentError,
    NotFoundError,
    ProviderError,
    PushError,
    SandboxNotFoundError,
    SandboxNotRunningError,
    SiloException,
    SnapshotError,
    SpecDriftError,
    TimeoutError,
)

__all__ = [
    "AgentUnreachableError",
    "BusyError",
    "CommandExitError",
    "InvalidArgumentError",
    "NotFoundError",
    "ProviderError",
    "PushError",
    "SandboxNotFoundError",
    "SandboxNotRunningError",
    "SiloException",
    "SnapshotError",
    "SpecDriftError",
    "TimeoutError",
]
