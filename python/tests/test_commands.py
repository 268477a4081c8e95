"""Commands: run, background handles, re-attach from another process,
sessions, Ctrl-C, and every way a command can fail."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

import silo_sandbox
from conftest import run_python, unique

# A command whose output is known in advance, printed over about two
# seconds in many small writes, so a reader can die in the middle of it.
LINES = 4000
SLOW_PRINTER = f"i=0; while [ $i -lt {LINES} ]; do echo line $i; i=$((i+1)); [ $((i % 400)) -eq 0 ] && sleep 0.2; done"
EXPECTED = "".join(f"line {i}\n" for i in range(LINES)).encode()


def test_run_answers_output_exit_and_environment(local):
    result = local.commands.run("echo out; echo err >&2; pwd; echo $GREETING", envs={"GREETING": "hi"}, cwd="/tmp")
    assert result.stdout == "out\n/tmp\nhi\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 0 and result.error is None
    argv = local.commands.run(["printf", "%s|", "a b", "c"])
    assert argv.stdout == "a b|c|"


def test_a_failing_command_raises_with_its_exit_and_output(local):
    with pytest.raises(silo_sandbox.CommandExitError) as raised:
        local.commands.run("echo partial; echo broken >&2; exit 3")
    assert raised.value.exit_code == 3
    assert raised.value.stdout == "partial\n"
    assert "broken" in raised.value.stderr
    unchecked = local.commands.run("exit 4", check=False)
    assert unchecked.exit_code == 4 and "4" in unchecked.error


def test_a_timeout_ends_the_command_and_raises(local):
    begun = time.monotonic()
    with pytest.raises(silo_sandbox.TimeoutError):
        local.commands.run("sleep 30", timeout=0.5)
    assert time.monotonic() - begun < 20


def test_callbacks_see_the_output_in_order(local):
    seen: list[str] = []
    errors: list[str] = []
    result = local.commands.run("for i in 1 2 3; do echo $i; done; echo e >&2", on_stdout=seen.append, on_stderr=errors.append)
    assert "".join(seen) == "1\n2\n3\n" == result.stdout
    assert "".join(errors) == "e\n"


def test_a_blocking_call_inside_an_output_callback_works(local):
    # The callback runs on silo's own threads; a blocking call there must
    # neither panic into Python nor deadlock.
    seen: list[str] = []

    def on_stdout(text: str) -> None:
        seen.append(text)
        seen.append(local.commands.run("echo inner").stdout)

    result = local.commands.run("echo outer", on_stdout=on_stdout)
    assert result.stdout == "outer\n"
    assert seen == ["outer\n", "inner\n"]


def test_a_command_on_a_killed_sandbox_says_it_has_been_removed():
    sandbox = silo_sandbox.Sandbox.create(name=unique("py-killed"))
    sandbox.kill()
    with pytest.raises(silo_sandbox.SandboxNotFoundError, match="has been removed"):
        sandbox.commands.run("true")


def test_a_background_handle_iterates_waits_and_is_killed(local):
    handle = local.commands.run("echo one; sleep 0.2; echo two", background=True)
    chunks = [stdout for stdout, _, _ in handle if stdout]
    assert "".join(chunks) == "one\ntwo\n"
    assert handle.wait().stdout == "one\ntwo\n"
    sleeper = local.commands.run("sleep 60", background=True)
    assert sleeper.kill() is True
    ended = sleeper.wait(check=False)
    assert ended.interrupted and ended.exit_code != 0


def test_reattach_from_a_second_process_after_the_first_was_killed_gets_every_byte_once(local, tmp_path):
    """Process A starts the command, keeps what it received in a file and
    is SIGKILLed mid-stream; process B re-attaches from A's offset. A's
    bytes and B's together are the command's output, byte for byte."""
    received = tmp_path / "received"
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import os, signal, sys, silo_sandbox
sandbox = silo_sandbox.Sandbox.connect(sys.argv[1])
handle = sandbox.commands.run(sys.argv[2], background=True)
print(handle.pid, flush=True)
with open(sys.argv[3], "wb") as out:
    for event in handle.events():
        if isinstance(event, silo_sandbox.Stdout):
            out.write(event.data)
            out.flush()
            if out.tell() > 20000:
                os.kill(os.getpid(), signal.SIGKILL)
""",
            local.sandbox_id,
            SLOW_PRINTER,
            str(received),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pid = int(first.stdout.readline())
    assert first.wait(timeout=60) == -signal.SIGKILL, first.stderr.read().decode()
    head = received.read_bytes()
    assert 0 < len(head) < len(EXPECTED)
    second = run_python(
        """
import sys, silo_sandbox
sandbox = silo_sandbox.Sandbox.connect(sys.argv[1])
handle = sandbox.commands.connect(int(sys.argv[2]), offset=int(sys.argv[3]))
result = handle.wait()
sys.stdout.buffer.write(result.stdout_bytes)
sys.stderr.write(f"lost={result.lost_bytes}")
""",
        local.sandbox_id,
        str(pid),
        str(len(head)),
    )
    assert second.returncode == 0, second.stderr.decode()
    assert second.stderr.decode().endswith("lost=0")
    whole = head + second.stdout
    assert hashlib.sha256(whole).hexdigest() == hashlib.sha256(EXPECTED).hexdigest()
    # From offset 0 another reader gets the whole output again, once.
    again = local.commands.connect(pid).wait()
    assert again.stdout_bytes == EXPECTED


def test_stdin_reaches_a_background_command(local):
    handle = local.commands.run("tr a-z A-Z", background=True, stdin=True)
    handle.send_stdin("hello ")
    handle.send_stdin(b"world\n")
    handle.close_stdin()
    assert handle.wait().stdout == "HELLO WORLD\n"


def test_sessions_keep_cwd_environment_and_variables(local):
    session = local.commands.session("work")
    session.run("mkdir -p /tmp/py-session && cd /tmp/py-session && export A=1 && B=2")
    result = session.run('echo "$(pwd) $A $B"')
    assert result.stdout == "/tmp/py-session 1 2\n"
    assert [s.id for s in local.commands.sessions()] == ["work"]


def test_keyboard_interrupt_interrupts_the_remote_command_and_the_session_survives(local, tmp_path):
    marker = tmp_path / "finished"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import sys, silo_sandbox
sandbox = silo_sandbox.Sandbox.connect(sys.argv[1])
session = sandbox.commands.session("repl")
session.run("X=42")
try:
    session.run(f"echo started; sleep 30 && touch {sys.argv[2]}", on_stdout=lambda t: print(t, end="", flush=True))
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
print("X=" + session.run('echo "$X"').stdout.strip(), flush=True)
""",
            local.sandbox_id,
            str(marker),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "started"
    begun = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.splitlines() == ["interrupted", "X=42"], out + err
    assert time.monotonic() - begun < 20
    # The command ended in the sandbox, not only here.
    time.sleep(0.5)
    assert not marker.exists()
    assert all(s.running is None for s in local.commands.sessions())


def test_a_busy_session_refuses_with_no_wait(local):
    session = local.commands.session("busy")
    handle = session.run("sleep 30", background=True)
    try:
        with pytest.raises(silo_sandbox.BusyError):
            session.run("true", no_wait=True)
    finally:
        handle.kill()


def test_an_agent_that_dies_under_a_command_is_unreachable(local):
    # The local backend's agent is the command's parent; the pause lets
    # the agent say the command started before it dies.
    with pytest.raises(silo_sandbox.AgentUnreachableError):
        local.commands.run("sleep 0.3; kill -9 $PPID; sleep 5")


def test_a_child_after_fork_runs_a_command(local):
    assert local.commands.run("echo parent").stdout == "parent\n"
    handle = local.commands.run("sleep 0.3; echo shared", background=True)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ok = local.commands.run("echo child").stdout == "child\n"
            fresh = silo_sandbox.Sandbox.connect(local.sandbox_id)
            ok = ok and fresh.files.write("forked.txt", "yes").size == 3
            # The parent's handle re-attaches on the child's own connection.
            ok = ok and handle.wait().stdout == "shared\n"
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert local.files.read("forked.txt") == "yes"
    assert local.commands.run("echo parent again").stdout == "parent again\n"


def test_multiprocessing_workers_use_the_parents_sandbox(local):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        outputs = pool.map(_worker_echo, [(local.sandbox_id, i) for i in range(4)])
    assert outputs == [f"{i}\n" for i in range(4)]


def _worker_echo(args: tuple[str, int]) -> str:
    sandbox_id, i = args
    return silo_sandbox.Sandbox.connect(sandbox_id).commands.run(f"echo {i}").stdout
