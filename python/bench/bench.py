"""Times the Python package beside the plain alternative, in one run, and
prints both with their ratio, as ``silo-bench`` does (docs/benchmarks.md).

    python python/bench/bench.py [--runs 500] [--pool 8] [--json out.json]

Run it with the installed wheel (a release build for figures worth
writing down). Scenarios:

- ``run("true")`` on a kept local sandbox handle, against
  ``subprocess.run(["true"])`` on the host (target <= 1.3x);
- a 1 KiB file write and read back through ``files``, against the same on
  the host's file system (a synced temp file renamed into place, as the
  agent writes);
- ``Sandbox.create(pool=...)`` to the first output of ``echo ready`` on a
  warm Docker pool, against ``docker run --rm`` of the same image to its
  first output (target <= 20 ms);
- ``e2b``: ``run("true")`` and the 1 KiB write and read on an e2b sandbox
  through the mock E2B, beside the official ``e2b`` SDK's
  ``commands.run("true")`` and ``files.write``/``read`` against the same
  mock (needs ``e2b`` and ``pytest`` installed, as in tests/sdk, and the
  mock built: ``cargo build -p
  silo-mocks --bins``; SILO_TARGET_DIR or CARGO_TARGET_DIR names the target
  directory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

import silo_sandbox

IMAGE = "silo-base:latest"
KIB = b"x" * 1024


@dataclass
class Row:
    scenario: str
    metric: str
    unit: str
    silo: float
    baseline: float | None
    baseline_name: str
    target: str
    met: bool

    def ratio(self) -> float | None:
        return self.silo / self.baseline if self.baseline else None


def timed(runs: int, action: Callable[[], object]) -> list[float]:
    """Milliseconds of each of ``runs`` calls, after a few unmeasured ones."""
    for _ in range(min(10, runs)):
        action()
    out = []
    for _ in range(runs):
        begun = time.perf_counter()
        action()
        out.append((time.perf_counter() - begun) * 1000)
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def exec_rtt(runs: int) -> list[Row]:
    sandbox = silo_sandbox.Sandbox.create(name=f"bench-py-{uuid.uuid4().hex[:6]}")
    try:
        silo = timed(runs, lambda: sandbox.commands.run("true"))
        argv = timed(runs, lambda: sandbox.commands.run(["true"]))
        host = timed(runs, lambda: subprocess.run(["true"], check=True))
        host_sh = timed(runs, lambda: subprocess.run("true", shell=True, check=True))
    finally:
        sandbox.kill()
    target = 1.3
    return [
        Row("py-exec-rtt", f'p50 of {runs} run("true"), kept handle', "ms", statistics.median(silo),
            statistics.median(host), 'subprocess.run(["true"])', f"<= {target}x host",
            statistics.median(silo) <= target * statistics.median(host)),
        Row("py-exec-rtt", f'p50 of {runs} run(["true"]) (no sh)', "ms", statistics.median(argv),
            statistics.median(host), 'subprocess.run(["true"])', "-", True),
        Row("py-exec-rtt", f'p50 of {runs} run("true") against a shell', "ms", statistics.median(silo),
            statistics.median(host_sh), 'subprocess.run("true", shell=True)', "-", True),
        Row("py-exec-rtt", "p99", "ms", p(silo, 0.99), p(host, 0.99), 'subprocess.run(["true"])', "-", True),
    ]


def file_rtt(runs: int) -> list[Row]:
    sandbox = silo_sandbox.Sandbox.create(name=f"bench-py-{uuid.uuid4().hex[:6]}")
    directory = tempfile.mkdtemp(prefix="bench-py-")
    host_path = os.path.join(directory, "f")

    def silo_round() -> None:
        sandbox.files.write("/tmp/bench-py-file", KIB)
        assert len(sandbox.files.read("/tmp/bench-py-file", format="bytes")) == 1024

    def host_round() -> None:
        # What the agent does for a write: a temp file, synced, renamed
        # over the old one (readers see old or new, and it survives a
        # crash); then a read.
        with open(host_path + ".tmp", "wb") as out:
            out.write(KIB)
            out.flush()
            os.fsync(out.fileno())
        os.replace(host_path + ".tmp", host_path)
        with open(host_path, "rb") as data:
            assert len(data.read()) == 1024

    try:
        silo = timed(runs, silo_round)
        host = timed(runs, host_round)
    finally:
        sandbox.kill()
        shutil.rmtree(directory, ignore_errors=True)
    return [
        Row("py-files", f"p50 of {runs} 1 KiB write + read", "ms", statistics.median(silo),
            statistics.median(host), "synced atomic write + read, host", "-", True),
        Row("py-files", "p99", "ms", p(silo, 0.99), p(host, 0.99), "synced atomic write + read, host", "-", True),
    ]


def pool(size: int) -> list[Row]:
    have = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True)
    if have.returncode != 0:
        print(f"skipping py-pool: {IMAGE} is not built (silo image base)", file=sys.stderr)
        return []
    name = f"bench-py-{uuid.uuid4().hex[:6]}"
    silo_sandbox.Pools.create(name, size, IMAGE)
    claimed = []
    silo = []
    try:
        for _ in range(size):
            begun = time.perf_counter()
            sandbox = silo_sandbox.Sandbox.create(pool=name)
            assert sandbox.commands.run("echo ready").stdout == "ready\n"
            silo.append((time.perf_counter() - begun) * 1000)
            claimed.append(sandbox)
    finally:
        for sandbox in claimed:
            sandbox.kill()
        silo_sandbox.Pools.remove(name)
    plain = []
    for _ in range(max(3, size // 2)):
        begun = time.perf_counter()
        out = subprocess.run(["docker", "run", "--rm", IMAGE, "echo", "ready"], capture_output=True, check=True)
        assert out.stdout == b"ready\n"
        plain.append((time.perf_counter() - begun) * 1000)
    return [
        Row("py-pool", f"create(pool=) to first output, p50 of {size}", "ms", statistics.median(silo),
            statistics.median(plain), "docker run --rm, to output", "<= 20 ms", statistics.median(silo) <= 20),
        Row("py-pool", "p99", "ms", p(silo, 0.99), p(plain, 0.99), "docker run --rm, to output", "-", True),
    ]


def e2b_mock(runs: int) -> list[Row]:
    """silo_sandbox and the e2b SDK through one mock E2B."""
    from pathlib import Path

    try:
        import e2b
    except ImportError:
        print("skipping e2b: the e2b SDK is not installed (pip install e2b==2.63.0)", file=sys.stderr)
        return []
    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo / "tests" / "sdk"))
    import conftest  # the SDK journeys' mock starter and image (tests/sdk)

    mock = conftest.start_e2b_mock(conftest.ensure_sdk_image())
    saved = {k: os.environ.get(k) for k in mock.env}
    os.environ.update(mock.env)
    os.environ["SSL_CERT_FILE"] = mock.env["SILO_E2B_CA_PEM"]
    home = tempfile.mkdtemp(prefix="bench-py-e2b-")
    try:
        ours = silo_sandbox.Sandbox.create("base", backend="e2b", name="bench-e2b", home=home)
        theirs = e2b.Sandbox.create(template="base", timeout=300, **conftest.e2b_options(mock.env))
        try:
            silo_run = timed(runs, lambda: ours.commands.run("true"))
            sdk_run = timed(runs, lambda: theirs.commands.run("true"))

            def silo_file() -> None:
                ours.files.write("/tmp/bench-file", KIB)
                ours.files.read("/tmp/bench-file", format="bytes")

            def sdk_file() -> None:
                theirs.files.write("/tmp/bench-file", KIB)
                theirs.files.read("/tmp/bench-file", format="bytes")

            silo_io = timed(runs, silo_file)
            sdk_io = timed(runs, sdk_file)
        finally:
            ours.kill()
            theirs.kill()
    finally:
        mock.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(home, ignore_errors=True)
    return [
        Row("py-e2b", f'p50 of {runs} run("true") via the mock', "ms", statistics.median(silo_run),
            statistics.median(sdk_run), 'e2b SDK commands.run("true")', "-", True),
        Row("py-e2b", f"p50 of {runs} 1 KiB write + read via the mock", "ms", statistics.median(silo_io),
            statistics.median(sdk_io), "e2b SDK files.write + read", "-", True),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("scenarios", nargs="*", default=["exec", "files", "pool", "e2b"])
    args = parser.parse_args()
    rows: list[Row] = []
    if "exec" in args.scenarios:
        rows += exec_rtt(args.runs)
    if "files" in args.scenarios:
        rows += file_rtt(args.runs)
    if "pool" in args.scenarios:
        rows += pool(args.pool)
    if "e2b" in args.scenarios:
        rows += e2b_mock(max(20, args.runs // 10))
    print(f"{'scenario':<12} {'metric':<46} {'silo':>9} {'baseline':>9} {'ratio':>7}  {'baseline is':<32} {'target':<14} met")
    for row in rows:
        ratio = row.ratio()
        print(
            f"{row.scenario:<12} {row.metric + ' (' + row.unit + ')':<46} {row.silo:>9.3f} "
            f"{row.baseline if row.baseline is not None else float('nan'):>9.3f} "
            f"{(f'{ratio:.2f}x' if ratio else '-'):>7}  {row.baseline_name:<32} {row.target:<14} "
            f"{'yes' if row.met else 'no'}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump([asdict(r) | {"ratio": r.ratio()} for r in rows], out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
