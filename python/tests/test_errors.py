"""Each failure a Python user can meet is a named class, worded for Python.

The exception list is written once, in the native module (errors.rs); the
stubs type it and the package exports it, and these tests hold the three
together.
"""

from __future__ import annotations

import builtins
import re
from pathlib import Path

import pytest

import silo_sandbox
from silo_sandbox import _native

from conftest import unique

STUBS = Path(silo_sandbox.__file__).with_name("_native.pyi")


def native_exceptions() -> set[str]:
    return {
        name
        for name, value in vars(_native).items()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__name__ == name
    }


def test_the_exception_list_agrees_in_the_module_the_stubs_and_the_package():
    made = native_exceptions()
    typed = set(re.findall(r"^class (\w+)\((?:\w+Error|SiloException|Exception)", STUBS.read_text(), re.M))
    exported = {name for name in silo_sandbox.__all__ if name in made}
    assert made == typed, (made ^ typed)
    assert made == exported, (made ^ exported)
    for name in made:
        assert issubclass(getattr(silo_sandbox, name), silo_sandbox.SiloException), name


def test_the_timeout_error_is_the_builtins_and_a_star_import_does_not_shadow_it():
    assert issubclass(silo_sandbox.SiloTimeoutError, builtins.TimeoutError)
    assert issubclass(silo_sandbox.SiloTimeoutError, silo_sandbox.SiloException)
    assert silo_sandbox.TimeoutError is silo_sandbox.SiloTimeoutError
    scope: dict[str, object] = {}
    exec("from silo_sandbox import *", scope)
    assert "TimeoutError" not in scope


def test_a_command_timeout_is_caught_as_the_builtin(local):
    with pytest.raises(TimeoutError) as caught:
        local.commands.run("sleep 5", timeout=0.3)
    assert isinstance(caught.value, silo_sandbox.SiloException)


def test_a_missing_program_fails_as_a_shell_would_whichever_the_form(docker):
    for cmd in (["py-no-such-program"], "py-no-such-program"):
        result = docker.commands.run(cmd, check=False)
        assert result.exit_code == 127, (cmd, result)
        assert "py-no-such-program" in result.stderr, (cmd, result)
        with pytest.raises(silo_sandbox.CommandExitError) as caught:
            docker.commands.run(cmd)
        assert caught.value.exit_code == 127
    result = docker.commands.run(["/etc/hostname"], check=False)
    assert result.exit_code == 126, result


def test_a_working_directory_that_is_not_one_is_an_invalid_argument(docker):
    with pytest.raises(silo_sandbox.InvalidArgumentError, match="/py-no-such-dir"):
        docker.commands.run("true", cwd="/py-no-such-dir")


def test_a_missing_image_is_image_not_found(base_image):
    # Named on a loopback registry nothing listens on, so the engine's pull
    # fails at once and never leaves the machine.
    image = "127.0.0.1:9/py-no-such-image:1"
    with pytest.raises(silo_sandbox.ImageNotFoundError, match="py-no-such-image"):
        silo_sandbox.Sandbox.create(image, name=unique("py-noimage"))


def test_every_call_on_a_killed_sandbox_says_it_was_removed(docker):
    docker.kill()
    calls = {
        "commands.run": lambda: docker.commands.run("true"),
        "files.read": lambda: docker.files.read("/etc/hostname"),
        "files.write": lambda: docker.files.write("/tmp/x", "x"),
        "info": lambda: docker.info(),
    }
    for name, call in calls.items():
        with pytest.raises(silo_sandbox.SandboxNotFoundError) as caught:
            call()
        assert "silo up" not in str(caught.value), (name, caught.value)
