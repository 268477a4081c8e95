"""Times the providers' official SDKs through the mocks, for comparison with
`silo-bench e2b` and `silo-bench daytona` (docs/benchmarks.md).

    tests/sdk/.venv/bin/python tests/sdk/bench.py [--rounds 8] [--execs 20]

Per provider and round: create to the first output of `echo ready` (the
SDK's time to interactive), `--execs` runs of `true` (each a new process
through the SDK: envd's Start stream for E2B, the toolbox's execute for
Daytona), and a pause or stop then connect or start to the first output
again. Prints p50s as a Markdown table. The mocks are the binaries the
journeys run (SILO_TARGET_DIR or CARGO_TARGET_DIR, else target/), every
sandbox a container of the journeys' image.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import conftest  # noqa: E402


def p50(values: list[float]) -> float:
    return statistics.median(values)


def bench_e2b(image: str, rounds: int, execs: int) -> dict[str, list[float]]:
    from e2b import Sandbox

    mock = conftest.start_e2b_mock(image)
    figures: dict[str, list[float]] = {"tti": [], "exec": [], "resume": []}
    try:
        os.environ["SSL_CERT_FILE"] = mock.env["SILO_E2B_CA_PEM"]
        options = conftest.e2b_options(mock.env)
        for _ in range(rounds):
            begun = time.monotonic()
            sandbox = Sandbox.create(template="base", timeout=300, **options)
            sandbox.commands.run("echo ready")
            figures["tti"].append((time.monotonic() - begun) * 1000)
            for _ in range(execs):
                begun = time.monotonic()
                sandbox.commands.run("true")
                figures["exec"].append((time.monotonic() - begun) * 1000)
            sandbox.pause()
            begun = time.monotonic()
            resumed = Sandbox.connect(sandbox.sandbox_id, **options)
            resumed.commands.run("echo ready")
            figures["resume"].append((time.monotonic() - begun) * 1000)
            resumed.kill()
    finally:
        mock.stop()
    return figures


def bench_daytona(image: str, rounds: int, execs: int) -> dict[str, list[float]]:
    from daytona import CreateSandboxFromSnapshotParams, Daytona

    mock = conftest.start_daytona_mock(image)
    figures: dict[str, list[float]] = {"tti": [], "exec": [], "resume": []}
    try:
        os.environ["SSL_CERT_FILE"] = mock.env["SILO_DAYTONA_CA_PEM"]
        client = Daytona(conftest.daytona_config(mock.env))
        for _ in range(rounds):
            begun = time.monotonic()
            sandbox = client.create(CreateSandboxFromSnapshotParams(snapshot="base"))
            sandbox.process.exec("echo ready")
            figures["tti"].append((time.monotonic() - begun) * 1000)
            for _ in range(execs):
                begun = time.monotonic()
                sandbox.process.exec("true")
                figures["exec"].append((time.monotonic() - begun) * 1000)
            sandbox.stop()
            begun = time.monotonic()
            sandbox.start()
            sandbox.process.exec("echo ready")
            figures["resume"].append((time.monotonic() - begun) * 1000)
            sandbox.delete()
    finally:
        mock.stop()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--execs", type=int, default=20)
    args = parser.parse_args()
    image = conftest.ensure_sdk_image()
    rows = []
    for provider, bench in (("e2b", bench_e2b), ("daytona", bench_daytona)):
        figures = bench(image, args.rounds, args.execs)
        resume = "pause + connect" if provider == "e2b" else "stop + start"
        rows += [
            (provider, f"create to first output, p50 of {args.rounds} (ms)", p50(figures["tti"])),
            (provider, f"exec `true`, p50 of {args.rounds * args.execs} (ms)", p50(figures["exec"])),
            (provider, f"{resume} to first output, p50 of {args.rounds} (ms)", p50(figures["resume"])),
        ]
    print("| provider | metric | official SDK |")
    print("| --- | --- | --- |")
    for provider, metric, value in rows:
        print(f"| {provider} | {metric} | {value:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
