"""The package's types catch a user's mistakes: ``mypy --strict`` passes on
the package and its examples, and rejects each marked line of
typing/mistakes.py, line by line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, unavailable

MISTAKES = Path(__file__).with_name("typing") / "mistakes.py"


def mypy(*targets: str | Path) -> subprocess.CompletedProcess[str]:
    try:
        import mypy  # noqa: F401
    except ImportError:
        unavailable("mypy is not installed (python/tests/requirements.txt)")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--hide-error-context", *map(str, targets)],
        capture_output=True,
        text=True,
        cwd=MISTAKES.parent,
    )


def test_the_package_and_its_examples_pass_mypy_strict():
    package = mypy("-p", "silo_sandbox")
    assert package.returncode == 0, package.stdout
    examples = mypy(REPO / "python" / "examples")
    assert examples.returncode == 0, examples.stdout


def test_each_mistake_is_rejected_on_its_own_line_and_nothing_else():
    marked = {
        number
        for number, line in enumerate(MISTAKES.read_text().splitlines(), start=1)
        if "# error" in line
    }
    checked = mypy(MISTAKES)
    rejected = {int(m.group(1)) for m in re.finditer(r"^mistakes\.py:(\d+): error", checked.stdout, re.M)}
    assert marked - rejected == set(), f"not caught: lines {sorted(marked - rejected)}\n{checked.stdout}"
    assert rejected - marked == set(), f"unexpected errors: lines {sorted(rejected - marked)}\n{checked.stdout}"


def test_a_misspelt_keyword_is_refused_when_run_too(local):
    with pytest.raises(TypeError, match="timout"):
        local.commands.run("true", timout=5)
    with pytest.raises(TypeError, match="env"):
        local.commands.session("s").run("true", env={"A": "1"})
