"""The remote backends through their mocks (tests/mocks): the same verbs on
E2B and Daytona sandboxes, whose machines are containers running the real
agent behind a TLS proxy, as the providers' VMs do."""

from __future__ import annotations

import pytest

import silo_sandbox
from conftest import provider_mock, unique


@pytest.fixture(params=["e2b", "daytona"])
def provider(request, base_image, monkeypatch, tmp_path):
    """A running mock of the provider, its variables exported, and a home
    of its own (a home reads the provider's settings when it opens)."""
    with provider_mock(request.param, base_image, monkeypatch):
        yield request.param, tmp_path / "home"


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
