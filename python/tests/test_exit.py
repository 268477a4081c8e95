"""The interpreter exits cleanly after using the package: the native
runtime's threads never take the GIL once Python has begun to finalise
(which would abort the process with SIGABRT and lose unflushed output).

Each case runs a short script many times in fresh interpreters, a few at
once; one abort in any run fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

#: Runs of each script (the race lost 1 run in 30 to 6 in 20 before).
RUNS = int(os.environ.get("SILO_EXIT_RUNS", "200"))
#: Interpreters at once.
AT_ONCE = 4

CONNECT_AND_RUN = """
import asyncio, sys
from silo_sandbox import AsyncSandbox

async def main():
    sandbox = await AsyncSandbox.connect(sys.argv[1])
    result = await sandbox.commands.run("echo hi")
    print(result.stdout, end="")

asyncio.run(main())
print("done")
"""

CAUGHT_CONNECT_ERROR = """
import asyncio
from silo_sandbox import AsyncSandbox, SandboxNotFoundError

async def main():
    try:
        await AsyncSandbox.connect("py-exit-no-such-sandbox")
    except SandboxNotFoundError:
        print("caught")

asyncio.run(main())
print("done")
"""


THREADS_AND_FORK = """
import os, sys, threading
from silo_sandbox import Sandbox

sandbox = Sandbox.connect(sys.argv[1])
out = []
worker = threading.Thread(target=lambda: out.append(sandbox.commands.run("echo t").stdout))
worker.start()
pid = os.fork()
if pid == 0:
    code = 0 if Sandbox.connect(sys.argv[1]).commands.run("echo c").stdout == "c\\n" else 1
    os._exit(code)
worker.join()
_, status = os.waitpid(pid, 0)
print(out[0], end="")
print("child", os.waitstatus_to_exitcode(status))
"""


def run_many(script: str, *args: str) -> list[subprocess.CompletedProcess[str]]:
    def once(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    with ThreadPoolExecutor(AT_ONCE) as pool:
        return list(pool.map(once, range(RUNS)))


def failures(runs: list[subprocess.CompletedProcess[str]], expected: str) -> list[str]:
    return [
        f"exit {run.returncode}: {run.stdout!r} {run.stderr[-400:]!r}"
        for run in runs
        if run.returncode != 0 or run.stdout != expected
    ]


def test_scripts_using_async_sandbox_always_exit_cleanly(local):
    runs = run_many(CONNECT_AND_RUN, local.sandbox_id)
    bad = failures(runs, "hi\ndone\n")
    assert not bad, f"{len(bad)} of {RUNS} runs failed; first: {bad[0]}"


def test_scripts_with_threads_and_a_fork_always_exit_cleanly(local):
    runs = run_many(THREADS_AND_FORK, local.sandbox_id)
    bad = failures(runs, "t\nchild 0\n")
    assert not bad, f"{len(bad)} of {RUNS} runs failed; first: {bad[0]}"


def test_scripts_that_caught_a_connect_error_always_exit_cleanly():
    runs = run_many(CAUGHT_CONNECT_ERROR)
    bad = failures(runs, "caught\ndone\n")
    assert not bad, f"{len(bad)} of {RUNS} runs failed; first: {bad[0]}"
