"""The remote backends through their mocks (tests/mocks): the same verbs on
E2B and Daytona sandboxes, whose machines are containers running the real
agent behind a TLS proxy, as the providers' VMs do."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

import pytest

import silo_sandbox
from conftest import silo_binary, unique

#: Lines of `KEY=value` each mock prints before it serves.
MOCK_ENV_LINES = 5
MOCK_START_TIMEOUT = 60.0


def start_mock(name: str, args: list[str]) -> tuple[subprocess.Popen, dict[str, str]]:
    binary = silo_binary().parent / name
    if not binary.exists():
        pytest.fail(f"{binary} is not built (cargo build -p silo-mocks --bins)")
    process = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    env: dict[str, str] = {}
    deadline = time.monotonic() + MOCK_START_TIMEOUT
    buffer = b""
    while len(env) < MOCK_ENV_LINES:
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


@pytest.fixture(params=["e2b", "daytona"])
def provider(request, base_image, monkeypatch, tmp_path):
    """A running mock of the provider, its variables exported, and a home
    of its own (a home reads the provider's settings when it opens)."""
    if request.param == "e2b":
        process, env = start_mock("silo-mock-e2b", ["--template", f"base={base_image}", "--ports", "49999,8080"])
    else:
        process, env = start_mock("silo-mock-daytona", ["--snapshot", f"base={base_image}", "--ports", "49999,8080"])
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        yield request.param, tmp_path / "home"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def test_a_remote_sandbox_runs_commands_files_and_snapshots(provider):
    backend, home = provider
    sandbox = silo_sandbox.Sandbox.create("base", backend=backend, name=unique(f"py-{backend}"), home=home)
    try:
        assert sandbox.commands.run("echo remote").stdout == "remote\n"
        sandbox.files.write("/tmp/remote.txt", "over tls")
        assert sandbox.files.read("/tmp/remote.txt") == "over tls"
        address = sandbox.agent_address()
        assert address["transport"] == "tls"
        host = sandbox.get_host(8080)
        port = sandbox.get_port_url(8080)
        assert port.host == host and port.url == "https://" + host
        if backend == "e2b":
            assert address["host_header"].startswith("49999-")
            assert host == "8080-" + address["host_header"].partition("-")[2]
            assert port.headers == ()
        else:
            assert [name for name, _ in address["headers"]] == ["x-daytona-preview-token"]
            # The preview host and token come from Daytona's preview-url route.
            # The Host header keeps a preview URL's port, as the URL gave it.
            preview_host = address["host_header"].partition("-")[2].partition(":")[0]
            assert host.partition(":")[0] == "8080-" + preview_host
            assert list(port.headers) == [tuple(h) for h in address["headers"]]
        snap = sandbox.snapshots.take("remote")
        sandbox.files.write("/tmp/remote.txt", "changed")
        sandbox.snapshots.rewind(snap)
        assert sandbox.files.read("/tmp/remote.txt") == "over tls"
        listed = silo_sandbox.Sandbox.list(home=home)
        assert [(s.name, s.backend) for s in listed] == [(sandbox.name, backend)]
    finally:
        sandbox.kill()
