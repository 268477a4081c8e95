"""Files: read, write, list, stat, exists, remove, make_dir, trees."""

from __future__ import annotations

import pytest

import silo_sandbox


def test_write_read_list_stat_remove(local):
    written = local.files.write("notes/a.txt", "héllo\n", mode=0o600)
    assert (written.name, written.type, written.size, written.mode) == ("a.txt", "file", 7, 0o600)
    assert written.permissions == "rw-------"
    assert local.files.read("notes/a.txt") == "héllo\n"
    assert local.files.read("notes/a.txt", format="bytes") == "héllo\n".encode()
    local.files.write("notes/b.bin", bytes(range(256)))
    assert local.files.read("notes/b.bin", format="bytes") == bytes(range(256))
    assert [e.name for e in local.files.list("notes")] == ["a.txt", "b.bin"]
    assert local.files.get_info("notes").type == "dir"
    assert local.files.exists("notes/a.txt") and not local.files.exists("notes/nope")
    assert local.files.make_dir("deep/er/dir") is True
    assert local.files.make_dir("deep/er/dir") is False
    assert local.files.remove("notes") == 3
    assert not local.files.exists("notes")


def test_missing_paths_and_bad_requests_raise_by_kind(local):
    with pytest.raises(silo_sandbox.NotFoundError, match="nope"):
        local.files.read("nope/x.txt")
    local.files.write("dir/f", "x")
    with pytest.raises(silo_sandbox.InvalidArgumentError):
        local.files.remove("dir", recursive=False)
    assert local.files.exists("dir/f")


def test_trees_go_in_and_out(local, tmp_path):
    source = tmp_path / "tree"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "one.txt").write_text("1")
    (source / "two.txt").write_text("22")
    copied = local.files.upload(source, "/tmp/py-tree-in")
    assert copied.files == 2
    assert local.files.read("/tmp/py-tree-in/sub/one.txt") == "1"
    out = tmp_path / "out"
    local.files.download("/tmp/py-tree-in", out)
    assert (out / "two.txt").read_text() == "22"
