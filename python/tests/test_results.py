"""The results are frozen native classes made in Rust from the library's
reports: the same objects from ``Sandbox`` and ``AsyncSandbox``, values (equal,
hashed, printed and pickled by their fields, as the dataclasses before them
were), and typed, so ``mypy --strict`` catches a misspelt attribute."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import inspect
import pickle
import subprocess
import sys

import pytest

import silo_sandbox
from silo_sandbox import _native
from conftest import unavailable

#: Every result class, as the package exports it.
RESULTS = [
    "CommandResult",
    "CopyReport",
    "Diff",
    "EntryInfo",
    "Exit",
    "FilesystemEvent",
    "FillReport",
    "ForkReport",
    "Lost",
    "OpenReport",
    "PathChange",
    "PoolInfo",
    "PortUrl",
    "ProcessInfo",
    "PushFailure",
    "PushReport",
    "Pushed",
    "RewindReport",
    "SandboxInfo",
    "SandboxRecord",
    "SessionInfo",
    "Snapshot",
    "Stderr",
    "Stdout",
]

WHEN = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)


def made() -> dict[str, object]:
    """One of each, made by its constructor (no sandbox needed)."""
    s = silo_sandbox
    fill = s.FillReport(2, ("one failed",))
    return {
        "CommandResult": s.CommandResult("out\n", "", 0, stdout_bytes=b"out\n", duration_ms=3),
        "CopyReport": s.CopyReport("/w/a", 1, 0, 5),
        "Diff": s.Diff("snap-1", "snap-2", (s.PathChange("/a", "changed", ("content",)),)),
        "EntryInfo": s.EntryInfo("a", "file", "/w/a", 5, 0o644, WHEN),
        "Exit": s.Exit(0, {"code": 0, "duration_ms": 3}),
        "FilesystemEvent": s.FilesystemEvent("a", s.FilesystemEventType.CREATE, False),
        "FillReport": fill,
        "ForkReport": s.ForkReport("snap-1", "warm", None, 12.5),
        "Lost": s.Lost(10, 4),
        "OpenReport": s.OpenReport("created", 3, ("no such sandbox",), 40.0),
        "PathChange": s.PathChange("/a", "added"),
        "PoolInfo": s.PoolInfo("warm", 2, 2, ("sbx-1", "sbx-2"), {"backend": "local"}, None, fill),
        "PortUrl": s.PortUrl("127.0.0.1:8080", "http://127.0.0.1:8080", (("x-token", "t"),)),
        "ProcessInfo": s.ProcessInfo(1, 42, "sleep", ("9",), "/w", None, False, True, 0.5, 0),
        "PushFailure": s.PushFailure("b", "stopped", "sandbox b is stopped", 1),
        "PushReport": s.PushReport("/m", 1, 1, 0, [s.Pushed("a", "v1", "00", 1, 5, False, 1, 7)], []),
        "Pushed": s.Pushed("a", "v1", "00", 1, 5, False, 1, 7),
        "RewindReport": s.RewindReport("snap-1", True, None, 3, 0, 9.5, {"ms": 9.5}),
        "SandboxInfo": s.SandboxInfo("sbx-1", "a", "local", "running", {"team": "x"}, WHEN, {"backend": "local"}),
        "SandboxRecord": s.SandboxRecord("sbx-1", "a", "local", {}, {"backend": "local"}, WHEN, WHEN, None, None, {"id": "sbx-1"}),
        "SessionInfo": s.SessionInfo("work", "/bin/sh", 7, "/w", None, None, 0),
        "Snapshot": s.Snapshot("snap-1", "sbx-1", "a", None, "step 1", 512, WHEN),
        "Stderr": s.Stderr(b"err", 0),
        "Stdout": s.Stdout(b"out", 0),
    }


def fields(value: object) -> list[str]:
    return list(inspect.signature(type(value)).parameters)


def test_every_result_is_a_native_class_the_package_exports():
    native = {name for name, value in vars(_native).items() if isinstance(value, type) and value.__module__ == "silo_sandbox"}
    assert native == set(RESULTS)
    for name in RESULTS:
        cls = getattr(silo_sandbox, name)
        assert cls is getattr(_native, name) and name in silo_sandbox.__all__, name
        assert not dataclasses.is_dataclass(cls), name
        assert cls.__doc__, name
    assert set(made()) == set(RESULTS)


@pytest.mark.parametrize("name", RESULTS)
def test_a_result_is_frozen(name):
    value = made()[name]
    for field in fields(value):
        with pytest.raises(AttributeError):
            setattr(value, field, getattr(value, field))
        with pytest.raises(AttributeError):
            delattr(value, field)
    with pytest.raises(AttributeError):
        value.anything_else = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", RESULTS)
def test_a_result_is_a_value(name):
    value = made()[name]
    again = type(value)(*(getattr(value, f) for f in fields(value)))
    assert again == value and not (again != value)
    assert value != made()["Lost" if name != "Lost" else "Stdout"]
    assert pickle.loads(pickle.dumps(value)) == value
    assert copy.copy(value) == value and copy.deepcopy(value) == value
    first, *rest = (getattr(value, f) for f in fields(value))
    changed = type(value)(first + {int: 1, str: "x", bytes: b"x"}[type(first)], *rest)
    assert changed != value
    try:
        hash(value)
    except TypeError:
        # A dict or list among its fields, as in a frozen dataclass.
        assert any(isinstance(getattr(value, f), (dict, list)) for f in fields(value)), name
    else:
        assert hash(again) == hash(value)


@pytest.mark.parametrize("name", RESULTS)
def test_a_result_reads_back_as_its_constructor_call(name):
    value = made()[name]
    text = repr(value)
    assert text.startswith(f"{name}(") and all(f"{f}=" in text for f in fields(value)), text
    if name != "FilesystemEvent":  # an enum member reads as <...>
        scope = {n: getattr(silo_sandbox, n) for n in RESULTS} | {"datetime": datetime}
        assert eval(text, scope) == value


def test_derived_properties_and_defaults():
    s = silo_sandbox
    assert made()["EntryInfo"].permissions == "rw-r--r--"  # type: ignore[attr-defined]
    assert s.EntryInfo("x", "dir", "/x", 0, 0o751, WHEN).permissions == "rwxr-x--x"
    assert made()["PushReport"].ok  # type: ignore[attr-defined]
    assert not s.PushReport("/m", 2, 1, 0, [], [made()["PushFailure"]]).ok
    bare = s.CommandResult("", "", 0)
    assert (bare.error, bare.stdout_bytes, bare.lost_bytes, bare.signal, bare.ended_by_rewind) == (None, b"", 0, None, None)
    assert s.PortUrl("h", "u").headers == () and s.PathChange("/a", "added").what == ()
    assert s.Snapshot("snap-1", "sbx-1", "a", None, None, 0, WHEN).report == {}
    assert "exit_code" in inspect.signature(s.CommandResult).parameters


def test_results_from_a_sandbox_are_the_native_classes_sync_and_async(local, tmp_path):
    s = silo_sandbox
    ran = local.commands.run("printf 'h\\303'; printf x >&2; exit 3", check=False)
    assert isinstance(ran, s.CommandResult)
    assert (ran.stdout, ran.stdout_bytes, ran.stderr, ran.exit_code) == ("h\ufffd", b"h\xc3", "x", 3)
    assert ran.error == "the command exited with code 3"
    killed = local.commands.run("kill -9 $$", check=False)
    assert (killed.signal, killed.exit_code, killed.error) == (9, 137, "the command was killed by signal 9")
    handle = local.commands.run("echo hi", background=True)
    events = list(handle.events())
    assert isinstance(events[0], s.Stdout) and events[0].data == b"hi\n"
    assert isinstance(events[-1], s.Exit) and events[-1].exit_code == 0 and events[-1].info["code"] == 0
    written = local.files.write("r/a.txt", "abc")
    assert isinstance(written, s.EntryInfo) and written == local.files.get_info("r/a.txt")
    assert written.modified_time.tzinfo is datetime.timezone.utc
    assert local.files.list("r") == [written]
    (tmp_path / "up.txt").write_text("up")
    copied = local.files.upload(tmp_path / "up.txt", "r/up.txt")
    assert isinstance(copied, s.CopyReport) and (copied.files, copied.dirs, copied.bytes) == (1, 0, 2)
    local.commands.session("work").run("true")
    assert [type(i) for i in local.commands.sessions()] == [s.SessionInfo]
    record = local.info()
    assert isinstance(record, s.SandboxRecord) and record.sandbox_id == local.sandbox_id and record.raw["id"] == local.sandbox_id
    listed = [i for i in s.Sandbox.list() if i.sandbox_id == local.sandbox_id]
    assert [type(i) for i in listed] == [s.SandboxInfo] and listed[0].state == "running"
    assert isinstance(local.get_port_url(8080), s.PortUrl)

    async def from_async():
        sandbox = await s.AsyncSandbox.connect(local.sandbox_id)
        return (
            await sandbox.files.get_info("r/a.txt"),
            await sandbox.info(),
            await sandbox.commands.run("printf 'h\\303'; printf x >&2; exit 3", check=False),
        )

    entry, info, again = asyncio.run(from_async())
    assert entry == written and type(info) is s.SandboxRecord and info.sandbox_id == record.sandbox_id
    assert type(again) is s.CommandResult and again.error == ran.error and again.stdout == ran.stdout


def test_snapshot_results_are_the_native_classes(docker):
    s = silo_sandbox
    docker.files.write("/work/a.txt", "one")
    taken = docker.snapshots.take("one")
    assert isinstance(taken, s.Snapshot) and taken.report["snapshot"]["id"] == taken.id
    assert docker.snapshots.list()[-1] == s.Snapshot(taken.id, taken.sandbox_id, taken.sandbox_name, taken.parent, taken.message, taken.layer_bytes, taken.created_at)
    docker.files.write("/work/a.txt", "two")
    diff = docker.snapshots.diff(taken)
    assert isinstance(diff, s.Diff) and all(type(p) is s.PathChange for p in diff.paths)
    edited = next(p for p in diff.paths if p.path == "/work/a.txt")
    assert edited.change == "changed" and "content" in edited.what, edited
    rewound = docker.snapshots.rewind(taken)
    assert isinstance(rewound, s.RewindReport) and rewound.snapshot == taken.id
    with pytest.raises(AttributeError):
        rewound.in_place = False  # type: ignore[misc]


def test_mypy_catches_a_misspelt_or_assigned_attribute_on_a_result(tmp_path):
    try:
        import mypy  # noqa: F401
    except ImportError:
        unavailable("mypy is not installed (python/tests/requirements.txt)")
    source = tmp_path / "results_use.py"
    source.write_text(
        "from silo_sandbox import EntryInfo, Sandbox\n"
        "\n"
        "def use(sandbox: Sandbox, entry: EntryInfo) -> None:\n"
        "    result = sandbox.commands.run('true')\n"
        "    print(result.exit_code, entry.permissions, entry.modified_time.year)\n"
        "    print(result.exitcode)\n"
        "    entry.size = 3\n"
    )
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["6", "7"], checked.stdout
    assert '"CommandResult" has no attribute "exitcode"' in errors[0]
    assert "read-only" in errors[1]
