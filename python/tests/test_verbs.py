"""The verbs E2B's and Modal's SDKs have that silo added last: listing
commands, terminals, renames, streamed reads, a lifetime deadline and
per-stream offsets, each on a Docker sandbox and on an E2B one (the mock:
a container running the real agent behind a TLS proxy)."""

from __future__ import annotations

import asyncio
import time

import pytest

import silo_sandbox
from silo_sandbox import FilesystemEventType, PtySize
from conftest import provider_mock, unique


@pytest.fixture(params=["docker", "e2b"])
def sandbox(request, base_image, monkeypatch, tmp_path):
    """A sandbox of silo's base image on Docker, or on the E2B mock (with a
    home of its own: a home reads the provider's settings when it opens)."""
    name = unique(f"py-verbs-{request.param}")
    if request.param == "docker":
        made = silo_sandbox.Sandbox.create(base_image, name=name)
        yield made
        _kill(made)
        return
    with provider_mock("e2b", base_image, monkeypatch):
        made = silo_sandbox.Sandbox.create("base", backend="e2b", name=name, home=tmp_path / "home")
        yield made
        _kill(made)


def _kill(sandbox: silo_sandbox.Sandbox) -> None:
    try:
        sandbox.kill()
    except silo_sandbox.SandboxNotFoundError:
        pass


def _until(check, what: str, limit: float = 30.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"{what} within {limit}s")


def test_commands_list_shows_what_runs_and_what_ended(sandbox):
    sleeper = sandbox.commands.run("sleep 300", background=True)
    done = sandbox.commands.run(["echo", "listed"])
    running = {p.pid: p for p in sandbox.commands.list()}
    assert sleeper.pid in running, running
    info = running[sleeper.pid]
    assert (info.cmd, info.args) == ("sh", ("-c", "sleep 300"))
    assert info.running and not info.tty and info.os_pid > 0 and info.age >= 0
    assert all(p.running for p in running.values())
    ended = [p for p in sandbox.commands.list(all=True) if p.cmd == "echo"]
    assert ended and not ended[-1].running and done.stdout == "listed\n"
    assert sandbox.commands.kill(sleeper.pid)
    _until(lambda: sleeper.pid not in {p.pid for p in sandbox.commands.list()}, "the killed command leaves the list")


def test_a_pty_runs_a_shell_that_is_typed_into_and_resized(sandbox):
    terminal = sandbox.pty.create(PtySize(rows=30, cols=90))
    sandbox.pty.send_stdin(terminal.pid, "stty size; echo typed-$((6*7))\n")
    seen = b""
    events = terminal.events()
    while b"typed-42" not in seen or b"30 90" not in seen:
        event = next(events)
        assert isinstance(event, silo_sandbox.Stdout), f"{event!r} after {seen!r}"
        seen += event.data
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert listed[terminal.pid].tty
    sandbox.pty.resize(terminal.pid, PtySize(rows=50, cols=120))
    sandbox.pty.send_stdin(terminal.pid, "stty size\n")
    while b"50 120" not in seen:
        event = next(events)
        if isinstance(event, silo_sandbox.Stdout):
            seen += event.data
    assert sandbox.pty.kill(terminal.pid)
    result = terminal.wait(check=False)
    assert result.exit_code != 0
    assert not sandbox.pty.kill(terminal.pid), "a second kill finds it ended"


def test_rename_moves_a_file_in_one_step(sandbox):
    sandbox.files.write("/tmp/before.txt", "moved")
    moved = sandbox.files.rename("/tmp/before.txt", "/tmp/after/renamed.txt")
    assert (moved.name, moved.type, moved.size) == ("renamed.txt", "file", 5)
    assert sandbox.files.read("/tmp/after/renamed.txt") == "moved"
    assert not sandbox.files.exists("/tmp/before.txt")
    with pytest.raises(silo_sandbox.NotFoundError, match="before.txt"):
        sandbox.files.rename("/tmp/before.txt", "/tmp/elsewhere.txt")


def test_a_streamed_read_gives_the_file_in_chunks(sandbox):
    data = bytes(range(256)) * (12 * 1024)  # 3 MiB
    sandbox.files.write("/tmp/big.bin", data)
    chunks = list(sandbox.files.read("/tmp/big.bin", format="stream"))
    assert len(chunks) > 1 and b"".join(chunks) == data
    with pytest.raises(silo_sandbox.NotFoundError):
        sandbox.files.read("/tmp/missing.bin", format="stream")


def test_connect_by_stream_offsets_resumes_each_stream(sandbox):
    script = "printf ab; printf cde >&2; sleep 0.3; printf f; printf g >&2"
    first = sandbox.commands.run(script, background=True)
    whole = first.wait()
    assert (whole.stdout, whole.stderr) == ("abf", "cdeg")
    assert (first.stdout_offset, first.stderr_offset) == (3, 4)
    again = sandbox.commands.connect(first.pid, stdout_offset=1, stderr_offset=2)
    rest = again.wait()
    assert (rest.stdout, rest.stderr) == ("bf", "eg")
    assert (again.stdout_offset, again.stderr_offset) == (3, 4)


def test_a_lifetime_deadline_stops_the_sandbox_whatever_runs(sandbox):
    assert sandbox.get_timeout() is None
    sandbox.set_timeout(3600)
    left = sandbox.get_timeout()
    assert left is not None and 3590 < left <= 3600
    sandbox.set_timeout(None)
    assert sandbox.get_timeout() is None
    sandbox.files.write("/tmp/kept.txt", "kept")
    sandbox.commands.run("sleep 300", background=True)
    sandbox.set_timeout(2)
    _until(lambda: not sandbox.is_running(), "the sandbox stops at its deadline", limit=60)
    sandbox.start()
    assert sandbox.files.read("/tmp/kept.txt") == "kept"
    assert sandbox.get_timeout() is None, "a new boot has no deadline"


def test_watch_dir_reports_changes_in_new_subdirectories_too(sandbox):
    sandbox.files.make_dir("/tmp/watched")
    with pytest.raises(silo_sandbox.NotFoundError):
        sandbox.files.watch_dir("/tmp/no-such-dir")
    watch = sandbox.files.watch_dir("/tmp/watched", recursive=True)
    sandbox.commands.run("mkdir /tmp/watched/new && sleep 0.3 && echo x > /tmp/watched/new/a.txt && mv /tmp/watched/new/a.txt /tmp/watched/b.txt")
    seen: list[silo_sandbox.FilesystemEvent] = []

    def has(kind: FilesystemEventType, name: str) -> bool:
        return any(e.type == kind and e.name == name for e in seen)

    def arrived() -> bool:
        seen.extend(watch.get_new_events())
        return has(FilesystemEventType.CREATE, "b.txt")

    _until(arrived, "the move into the watched directory is seen")
    assert has(FilesystemEventType.CREATE, "new") and any(e.is_dir for e in seen if e.name == "new")
    assert has(FilesystemEventType.CREATE, "new/a.txt"), seen
    assert has(FilesystemEventType.RENAME, "new/a.txt"), seen
    watch.stop()
    sandbox.files.write("/tmp/watched/after.txt", "x")
    time.sleep(0.3)
    assert watch.get_new_events() == [], "nothing after stop"


def test_an_async_watch_calls_back_and_says_when_its_directory_goes(base_image):
    async def main() -> tuple[list[silo_sandbox.FilesystemEvent], str]:
        async with await silo_sandbox.AsyncSandbox.create(base_image, name=unique("py-watch-async")) as sandbox:
            await sandbox.files.make_dir("/tmp/w")
            seen: list[silo_sandbox.FilesystemEvent] = []
            ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()

            async def on_event(event: silo_sandbox.FilesystemEvent) -> None:
                seen.append(event)

            await sandbox.files.watch_dir("/tmp/w", on_event, on_exit=ended.set_result)
            await sandbox.files.write("/tmp/w/a.txt", "a")
            await sandbox.commands.run("sleep 0.3; rm -r /tmp/w")
            return seen, await asyncio.wait_for(ended, 30)

    seen, reason = asyncio.run(main())
    # An atomic write lands as a move into place: a create of the name.
    assert any(e.type == FilesystemEventType.CREATE and e.name == "a.txt" for e in seen), seen
    assert "removed" in reason
