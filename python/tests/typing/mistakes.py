"""Mistakes a user makes, each on a line whose comment says which:
``mypy --strict`` must reject every such line and nothing else
(test_typing.py). Never run, only type-checked."""

from __future__ import annotations

from pathlib import Path

from silo_sandbox import AsyncSandbox, Pools, Sandbox, push_to_sandboxes


def sync_mistakes(sandbox: Sandbox) -> None:
    sandbox.commands.run("env", env={"A": "1"})  # error: envs=, not env=
    sandbox.commands.run("sleep 1", timout=5)  # error: misspelt timeout
    result = sandbox.commands.run("true")
    print(result.exitcode)  # error: exit_code
    handle = sandbox.commands.run("sleep 9", background=True)
    print(handle.exit_code)  # error: a handle has no exit code before wait()
    sandbox.files.write("/tmp/a", 42)  # error: data is str or bytes
    sandbox.files.read("/tmp/a", format="json")  # error: text or bytes
    info = sandbox.info()
    print(info["name"])  # error: a record, not a dict
    report = sandbox.snapshots.rewind("snap-1")
    print(report.in_placed)  # error: in_place
    for pool in Pools.list():
        print(pool.readiness)  # error: ready
    sandbox.commands.session("s").run("true", timeout="5")  # error: seconds are a number
    for process in sandbox.commands.list():
        print(process.command)  # error: cmd and args
    sandbox.pty.create((24, 80, 1))  # error: a PtySize of rows and cols
    sandbox.files.rename("/tmp/a")  # error: the new name is missing
    for chunk in sandbox.files.read("/tmp/a", format="stream"):
        print(chunk.decode() + 1)  # error: chunks are bytes
    sandbox.set_timeout("1h")  # error: seconds are a number
    sandbox.commands.connect(1, stdout_offest=3)  # error: stdout_offset


async def async_mistakes(sandbox: AsyncSandbox) -> None:
    await sandbox.commands.run("env", env={"A": "1"})  # error: envs=, not env=
    result = await sandbox.commands.run("true")
    print(result.stdot)  # error: stdout


def push_mistakes(sandboxes: list[Sandbox]) -> None:
    report = push_to_sandboxes("/workspace/managed/m", {sandbox: {"a.txt": "a"} for sandbox in sandboxes})
    print(report.pushed[0]["sandbox"])  # error: a Pushed, not a dict
    push_to_sandboxes("/workspace/managed/m", {sandboxes[0]: {"a.txt": 1}})  # error: int is no file content
    push_to_sandboxes("/workspace/managed/m", {sandboxes[0]: Path("skills")})
