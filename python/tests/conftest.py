"""What the Python suite shares: a silo home of its own, sandboxes that are
removed whatever a test did, and the Docker engine with silo's base image.

The suite runs against the installed wheel (``import silo_sandbox``), never
the source tree. Under CI=true a missing engine or binary fails the run;
elsewhere the tests that need it are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import silo_sandbox

REPO = Path(__file__).resolve().parents[2]
#: The image the Docker tests run: silo's base (FROM scratch + busybox).
BASE_IMAGE = "silo-base:latest"


def in_ci() -> bool:
    return os.environ.get("CI", "") in ("true", "1")


def unavailable(reason: str):
    """Fails under CI, skips elsewhere."""
    if in_ci():
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(f"{reason} (CI=true makes this fail)")


def silo_binary() -> Path:
    """The silo command of the same checkout (for the CLI cross-checks)."""
    given = os.environ.get("SILO_TARGET_DIR") or os.environ.get("CARGO_TARGET_DIR")
    path = (Path(given) if given else REPO / "target") / "debug" / "silo"
    if not path.exists():
        unavailable(f"{path} is not built (cargo build -p silo-cli)")
    return path


@pytest.fixture(scope="session", autouse=True)
def home():
    """A SILO_HOME for the whole run (short: the agent's socket path must
    fit a sockaddr), removed at the end with every sandbox in it."""
    path = Path(tempfile.mkdtemp(prefix="silo-py-", dir="/tmp"))
    previous = os.environ.get("SILO_HOME")
    os.environ["SILO_HOME"] = str(path)
    yield path
    for info in silo_sandbox.Sandbox.list():
        try:
            silo_sandbox.Sandbox.kill(info.sandbox_id)
        except silo_sandbox.SiloException as error:
            print(f"cleanup: {info.name}: {error}", file=sys.stderr)
    for pool in silo_sandbox.Pools.list():
        silo_sandbox.Pools.remove(pool.name)
    if previous is None:
        os.environ.pop("SILO_HOME", None)
    else:
        os.environ["SILO_HOME"] = previous
    shutil.rmtree(path, ignore_errors=True)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def local():
    """A local-backend sandbox (the agent as a host process)."""
    sandbox = silo_sandbox.Sandbox.create(name=unique("py-local"))
    yield sandbox
    try:
        sandbox.kill()
    except silo_sandbox.SandboxNotFoundError:
        pass


@pytest.fixture(scope="session")
def base_image() -> str:
    """silo's base image, built with the silo command when the engine lacks it."""
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        unavailable("no Docker engine answers")
    have = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True)
    if have.returncode != 0:
        made = subprocess.run([silo_binary(), "image", "base"], capture_output=True)
        assert made.returncode == 0, made.stderr.decode()
    return BASE_IMAGE


@pytest.fixture
def docker(base_image):
    """A Docker sandbox of silo's base image."""
    sandbox = silo_sandbox.Sandbox.create(base_image, name=unique("py-docker"))
    yield sandbox
    try:
        sandbox.kill()
    except silo_sandbox.SandboxNotFoundError:
        pass


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs ``code`` in a new interpreter of this environment (same SILO_HOME)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, timeout=timeout, env=os.environ.copy()
    )


#: Lines of `KEY=value` each mock prints before it serves.
MOCK_ENV_LINES = 5
MOCK_START_TIMEOUT = 60.0


def start_mock(name: str, args: list[str], lines: int = MOCK_ENV_LINES) -> tuple[subprocess.Popen, dict[str, str]]:
    binary = silo_binary().parent / name
    if not binary.exists():
        pytest.fail(f"{binary} is not built (cargo build -p silo-mocks --bins)")
    process = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    env: dict[str, str] = {}
    deadline = time.monotonic() + MOCK_START_TIMEOUT
    buffer = b""
    while len(env) < lines:
        ready, _, _ = select.select([process.stdout], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            process.kill()
            pytest.fail(f"{name} printed no environment within {MOCK_START_TIMEOUT}s")
        chunk = os.read(process.stdout.fileno(), 4096)
        if not chunk:
            pytest.fail(f"{name} exited before it served")
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            key, _, value = line.decode().partition("=")
            env[key] = value
    return process, env


@contextlib.contextmanager
def provider_mock(kind: str, base_image: str, monkeypatch: pytest.MonkeyPatch):
    """The mock of provider ``kind`` (``e2b``, ``daytona``) running, its
    variables exported, serving ``base`` as the base image; stopped after."""
    if kind == "e2b":
        process, env = start_mock("silo-mock-e2b", ["--template", f"base={base_image}", "--ports", "49999,8080"])
    else:
        process, env = start_mock("silo-mock-daytona", ["--snapshot", f"base={base_image}", "--ports", "49999,8080"])
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
