"""Sandboxes: create, open-or-create, connect, list, stop, kill, the shared
home with the silo command, and the errors of each."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import silo_sandbox
from conftest import silo_binary, unique


def test_a_sandbox_made_here_is_seen_by_the_cli_and_the_reverse(local):
    listed = subprocess.run([silo_binary(), "ls", "--json"], capture_output=True, check=True, env=os.environ.copy())
    assert local.name in listed.stdout.decode()
    name = unique("py-cli")
    subprocess.run([silo_binary(), "create", "--name", name], capture_output=True, check=True, env=os.environ.copy())
    sandbox = silo_sandbox.Sandbox.connect(name)
    try:
        assert sandbox.commands.run("echo from python").stdout == "from python\n"
        assert name in [s.name for s in silo_sandbox.Sandbox.list()]
    finally:
        silo_sandbox.Sandbox.kill(name)
    assert name not in [s.name for s in silo_sandbox.Sandbox.list()]


def test_list_filters_by_metadata(base_image):
    # Labels are a container's: the docker backend.
    tagged = silo_sandbox.Sandbox.create(base_image, name=unique("py-tag"), metadata={"team": "a"})
    try:
        found = silo_sandbox.Sandbox.list(metadata={"team": "a"})
        assert [s.sandbox_id for s in found] == [tagged.sandbox_id]
        assert found[0].state == "running" and found[0].backend == "docker"
        assert silo_sandbox.Sandbox.list(metadata={"team": "b"}) == []
    finally:
        tagged.kill()


def test_open_reuses_and_refuses_a_changed_spec():
    name = unique("py-up")
    first = silo_sandbox.Sandbox.open(name, envs={"V": "1"})
    try:
        first.files.write("kept.txt", "kept")
        again = silo_sandbox.Sandbox.open(name, envs={"V": "1"})
        assert again.sandbox_id == first.sandbox_id
        # Each open says which tier it took.
        assert isinstance(first.made, silo_sandbox.OpenReport) and isinstance(again.made, silo_sandbox.OpenReport)
        assert (first.made.action, first.made.tier) == ("created", 3), first.made
        assert (again.made.action, again.made.tier) == ("attached", 1), again.made
        assert again.files.read("kept.txt") == "kept"
        with pytest.raises(silo_sandbox.SpecDriftError, match="different spec"):
            silo_sandbox.Sandbox.open(name, envs={"V": "2"})
    finally:
        first.kill()


def test_stopped_sandboxes_are_refused_or_started_on_connect(local):
    assert local.stop() is True
    with pytest.raises(silo_sandbox.SandboxNotRunningError, match="stopped"):
        silo_sandbox.Sandbox.connect(local.sandbox_id, start=False)
    started = silo_sandbox.Sandbox.connect(local.sandbox_id)
    assert started.commands.run("echo back").stdout == "back\n"
    assert started.is_running()


def test_unknown_sandboxes_bad_names_and_taken_names_raise():
    with pytest.raises(silo_sandbox.SandboxNotFoundError, match="ghost"):
        silo_sandbox.Sandbox.connect("ghost")
    with pytest.raises(silo_sandbox.InvalidArgumentError):
        silo_sandbox.Sandbox.create(name="no spaces allowed")
    with pytest.raises(silo_sandbox.InvalidArgumentError, match="bad sandbox spec"):
        silo_sandbox.Sandbox.create(spec={"backend": "nowhere"})
    assert all(s.name != "no spaces allowed" for s in silo_sandbox.Sandbox.list())


def test_a_provider_that_refuses_raises_provider_error(monkeypatch):
    # Without an API key E2B refuses before any request, with the hint.
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(silo_sandbox.ProviderError, match="E2B_API_KEY"):
        silo_sandbox.Sandbox.create(backend="e2b", name=unique("py-e2b"))


def test_get_host_on_the_local_backend_and_its_refusals(local, docker):
    assert local.get_host(8080) == "127.0.0.1:8080"
    with pytest.raises(silo_sandbox.InvalidArgumentError):
        local.get_host(0)
    assert local.get_port_url(8080) == silo_sandbox.PortUrl(host="127.0.0.1:8080", url="http://127.0.0.1:8080", headers=())
    with pytest.raises(silo_sandbox.InvalidArgumentError, match="docker sandbox publishes no ports"):
        docker.get_host(8080)


def test_the_package_carries_the_agent():
    assert silo_sandbox.AGENT_TARGET.endswith("linux-musl") or silo_sandbox.AGENT_TARGET.endswith("linux-gnu")


def test_every_public_name_has_a_docstring():
    import inspect

    for name in silo_sandbox.__all__:
        value = getattr(silo_sandbox, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        assert value.__doc__, name
        if inspect.isclass(value) and not issubclass(value, BaseException):
            for member, method in vars(value).items():
                if not member.startswith("_") and callable(method):
                    assert getattr(method, "__doc__", None), f"{name}.{member}"


def test_every_error_is_a_silo_exception_and_catchable_as_one():
    errors = [name for name in silo_sandbox.__all__ if name.endswith(("Error", "Exception"))]
    for name in errors:
        assert issubclass(getattr(silo_sandbox, name), silo_sandbox.SiloException), name
    with pytest.raises(silo_sandbox.SiloException):
        silo_sandbox.Sandbox.connect("ghost-too")
