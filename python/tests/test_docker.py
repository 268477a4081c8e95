"""Docker sandboxes: snapshots in a per-step loop, rewind, fork, pools and
the fan-out push with its report."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import silo_sandbox
from conftest import unique


def test_a_snapshot_per_step_and_a_rewind_to_any_of_them(docker):
    steps = []
    for i in range(3):
        docker.files.write(f"/work/step{i}.txt", f"step {i}")
        steps.append(docker.snapshots.take(f"after step {i}"))
    assert [s.message for s in docker.snapshots.list()][-3:] == ["after step 0", "after step 1", "after step 2"]
    docker.snapshots.rewind(steps[0])
    assert docker.files.exists("/work/step0.txt")
    assert not docker.files.exists("/work/step1.txt")
    # Commands work at once on the rewound sandbox (the kept connection was renewed).
    assert docker.commands.run("ls /work").stdout == "step0.txt\n"
    docker.snapshots.rewind(steps[2].id)
    assert docker.commands.run("ls /work").stdout == "step0.txt\nstep1.txt\nstep2.txt\n"


def test_diff_names_what_differs_from_a_snapshot(docker):
    docker.files.write("/work/kept.txt", "kept")
    docker.files.write("/work/edited.txt", "before")
    snap = docker.snapshots.take("before the edit")
    docker.files.write("/work/edited.txt", "after")
    docker.files.remove("/work/kept.txt")
    docker.files.write("/work/new.txt", "new")
    report = docker.snapshots.diff(snap)
    assert report.snapshot == snap.id
    changes = {p.path: p.change for p in report.paths}
    assert changes["/work/edited.txt"] == "changed"
    assert changes["/work/kept.txt"] == "removed"
    assert changes["/work/new.txt"] == "added"
    # By default: the latest snapshot a diff did not take.
    assert docker.snapshots.diff().snapshot == snap.id


def test_fork_makes_a_new_sandbox_and_snapshots_are_removed(docker):
    docker.files.write("/work/shared.txt", "from the parent")
    snap = docker.snapshots.take()
    child = docker.snapshots.fork(snap, unique("py-fork"))
    try:
        assert child.sandbox_id != docker.sandbox_id
        assert child.files.read("/work/shared.txt") == "from the parent"
        child.files.write("/work/shared.txt", "changed")
        assert docker.files.read("/work/shared.txt") == "from the parent"
        # A snapshot of one sandbox is not another's to rewind to.
        own = child.snapshots.take("the child's")
        with pytest.raises(silo_sandbox.SnapshotError):
            docker.snapshots.rewind(own)
    finally:
        child.kill()
    extra = docker.snapshots.take("to remove")
    docker.snapshots.remove(extra)
    assert extra.id not in [s.id for s in docker.snapshots.list()]
    with pytest.raises(silo_sandbox.NotFoundError):
        docker.snapshots.rewind("snap-000000000000")


def test_a_warm_pool_hands_out_started_sandboxes(base_image):
    pool = unique("py-pool")
    made = silo_sandbox.Pools.create(pool, 1, base_image)
    assert made.fill is not None and made.fill.made == 1
    try:
        begun = time.monotonic()
        sandbox = silo_sandbox.Sandbox.create(name=unique("py-claimed"), pool=pool)
        first = sandbox.commands.run("echo ready").stdout
        elapsed = time.monotonic() - begun
        assert first == "ready\n"
        assert elapsed < 10, elapsed
        assert [p.name for p in silo_sandbox.Pools.list()] == [pool]
        sandbox.kill()
    finally:
        silo_sandbox.Pools.remove(pool)
    with pytest.raises(silo_sandbox.InvalidArgumentError):
        silo_sandbox.Pools.create(unique("py-pool"), 0, base_image)


def test_forks_take_warm_sandboxes_of_the_snapshot_spec(docker, base_image):
    docker.files.write("/work/branch.txt", "the parent's")
    snap = docker.snapshots.take()
    pool = unique("py-forks")
    silo_sandbox.Pools.create(pool, 2, base_image)
    name = unique("py-branch")
    with pytest.raises(silo_sandbox.SnapshotError, match="1 to 64"):
        docker.snapshots.fork_many(snap, name, 0)
    branches = docker.snapshots.fork_many(snap, name, 3)
    try:
        assert [b.sandbox_id for b in branches] != [docker.sandbox_id] * 3
        assert len({b.sandbox_id for b in branches}) == 3
        for i, branch in enumerate(branches, start=1):
            assert branch.files.read("/work/branch.txt") == "the parent's"
            branch.files.write("/work/branch.txt", f"branch {i}")
        assert [b.files.read("/work/branch.txt") for b in branches] == [
            "branch 1",
            "branch 2",
            "branch 3",
        ]
        # Two came from the pool (its whole size), one from a new machine,
        # and each says which.
        assert next(p for p in silo_sandbox.Pools.list() if p.name == pool).ready == 0
        made = [b.made for b in branches]
        assert all(m is not None and m.snapshot == snap.id for m in made), made
        assert sorted(m.pool is not None for m in made if m is not None) == [False, True, True], made
        assert sum(m.new_machine_because is not None for m in made if m is not None) == 1, made
    finally:
        for branch in branches:
            branch.kill()
        silo_sandbox.Pools.remove(pool)


def test_a_pool_on_a_snapshot_makes_fork_many_a_claim(docker):
    docker.commands.run("mkdir -p /work/repo && for i in $(seq 300); do echo $i > /work/repo/f$i; done")
    root = docker.snapshots.take("root")
    pool = unique("py-leaves")
    with pytest.raises(silo_sandbox.InvalidArgumentError, match="snapshot's spec"):
        silo_sandbox.Pools.create(pool, 2, "silo-base:latest", snapshot=root)
    made = silo_sandbox.Pools.create(pool, 2, snapshot=root)
    assert made.snapshot == root.id and made.fill is not None and made.fill.made == 2, made
    leaves = docker.snapshots.fork_many(root, unique("py-leaf"), 2)
    try:
        for leaf in leaves:
            assert leaf.made is not None and leaf.made.pool == pool, leaf.made
            assert leaf.files.read("/work/repo/f300") == "300\n"
            assert len(leaf.files.list("/work/repo")) == 300
    finally:
        for leaf in leaves:
            leaf.kill()
        silo_sandbox.Pools.remove(pool)


def test_push_fans_out_with_a_report_per_sandbox(docker, base_image, tmp_path):
    second = silo_sandbox.Sandbox.create(base_image, name=unique("py-push"))
    stopped = silo_sandbox.Sandbox.create(base_image, name=unique("py-stopped"))
    stopped.stop()
    try:
        tree = tmp_path / "skills"
        tree.mkdir()
        (tree / "a.md").write_text("skill a")
        report = silo_sandbox.push_to_sandboxes(
            "/workspace/managed/skills",
            {docker: {"a.md": "skill a", "bin/run": Path(tree / "a.md"), "empty": None}, second: tree, stopped: tree},
        )
        assert (report.targets, report.succeeded) == (3, 2), report.failures
        assert [f.sandbox for f in report.failures] == [stopped.name]
        assert report.failures[0].reason == "stopped"
        assert docker.files.read("/workspace/managed/skills/bin/run") == "skill a"
        assert second.files.read("/workspace/managed/skills/a.md") == "skill a"
        # The same files again change nothing.
        again = silo_sandbox.push_to_sandboxes("/workspace/managed/skills", {second: tree})
        assert again.ok and again.unchanged == 1
        with pytest.raises(silo_sandbox.PushError):
            silo_sandbox.push_to_sandboxes("/workspace/managed/skills", {second: {"gone": Path(tmp_path / "missing")}})
        with pytest.raises(silo_sandbox.InvalidArgumentError):
            silo_sandbox.push_to_sandboxes("/workspace/managed/skills", {second: {"../escape": b"x"}})
    finally:
        second.kill()
        stopped.kill()
