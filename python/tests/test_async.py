"""The asyncio classes answer what the blocking ones answer."""

from __future__ import annotations

import asyncio
import time

import pytest

import silo_sandbox
from conftest import unique


def test_async_and_sync_give_the_same_results(local):
    async def journey():
        sandbox = await silo_sandbox.AsyncSandbox.connect(local.sandbox_id)
        run = await sandbox.commands.run("echo out; echo err >&2; exit 0", envs={"A": "1"})
        await sandbox.files.write("async/x.txt", "same")
        listing = await sandbox.files.list("async")
        text = await sandbox.files.read("async/x.txt")
        failed = await sandbox.commands.run("exit 5", check=False)
        with pytest.raises(silo_sandbox.CommandExitError):
            await sandbox.commands.run("exit 6")
        session = sandbox.commands.session("s")
        await session.run("cd /tmp && V=7")
        in_session = await session.run('echo "$(pwd) $V"')
        host = await sandbox.get_host(8080)
        return run, listing, text, failed, in_session, host

    run, listing, text, failed, in_session, host = asyncio.run(journey())
    assert host == local.get_host(8080) == "127.0.0.1:8080"
    sync_run = local.commands.run("echo out; echo err >&2; exit 0", envs={"A": "1"})
    assert (run.stdout, run.stderr, run.exit_code) == (sync_run.stdout, sync_run.stderr, sync_run.exit_code)
    assert [e.name for e in listing] == [e.name for e in local.files.list("async")]
    assert text == local.files.read("async/x.txt")
    assert failed.exit_code == local.commands.run("exit 5", check=False).exit_code == 5
    assert in_session.stdout == local.commands.session("s").run('echo "$(pwd) $V"').stdout == "/tmp 7\n"


def test_async_calls_run_concurrently_and_stream(local):
    async def main():
        sandbox = await silo_sandbox.AsyncSandbox.connect(local.sandbox_id)
        begun = time.monotonic()
        results = await asyncio.gather(*(sandbox.commands.run(f"sleep 1; echo {i}") for i in range(4)))
        elapsed = time.monotonic() - begun
        seen: list[str] = []

        async def collect(text: str) -> None:
            seen.append(text)

        streamed = await sandbox.commands.run("echo a; sleep 0.1; echo b", on_stdout=collect)
        handle = await sandbox.commands.run("echo x; echo y", background=True)
        chunks = [out async for out, _, _ in handle]
        return results, elapsed, seen, streamed, chunks

    results, elapsed, seen, streamed, chunks = asyncio.run(main())
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
    # One after another they would take 4 s.
    assert elapsed < 3.5, elapsed
    assert "".join(seen) == streamed.stdout == "a\nb\n"
    assert "".join(c for c in chunks if c) == "x\ny\n"


def test_cancelling_an_async_run_interrupts_the_command(local):
    async def main():
        sandbox = await silo_sandbox.AsyncSandbox.connect(local.sandbox_id)
        task = asyncio.create_task(sandbox.commands.run("sleep 30 && touch /tmp/py-async-marker"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)
        return await sandbox.files.exists("/tmp/py-async-marker")

    assert asyncio.run(main()) is False


def test_async_lifecycle_and_errors():
    async def main():
        name = unique("py-async")
        async with await silo_sandbox.AsyncSandbox.create(name=name) as sandbox:
            assert name in [s.name for s in await silo_sandbox.AsyncSandbox.list()]
            assert (await sandbox.commands.run("echo hi")).stdout == "hi\n"
        assert name not in [s.name for s in await silo_sandbox.AsyncSandbox.list()]
        with pytest.raises(silo_sandbox.SandboxNotFoundError):
            await silo_sandbox.AsyncSandbox.connect(name)

    asyncio.run(main())
