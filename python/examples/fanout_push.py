"""One push to many sandboxes with a report per sandbox: each gets its own
files (equal sets are bundled once), swapped in whole or not at all, and a
sandbox that cannot take them is a line in the report, not an exception.

    python fanout_push.py [IMAGE]      (default silo-base:latest)
"""

import sys
import uuid

from silo_sandbox import Sandbox, push_to_sandboxes

MOUNT = "/workspace/managed/skills"


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 else "silo-base:latest"
    run = uuid.uuid4().hex[:6]
    sandboxes = [Sandbox.create(image, name=f"pod-{run}-{i}") for i in range(3)]
    try:
        sandboxes[2].stop()  # one target down: its failure is reported
        files: dict[Sandbox, dict[str, str | bytes]] = {
            sandbox: {"README.md": "shared skills\n", "user.txt": f"user {i}\n", "bin/tool": b"#!/bin/sh\necho tool\n"}
            for i, sandbox in enumerate(sandboxes)
        }
        report = push_to_sandboxes(MOUNT, files)
        print(f"{report.succeeded}/{report.targets} sandboxes have the files")
        for pushed in report.pushed:
            print(f"  {pushed.sandbox}: version {pushed.version[:16]}… {pushed.files} files, {pushed.millis} ms")
        for failure in report.failures:
            print(f"  {failure.sandbox}: {failure.reason}: {failure.detail}")
        assert report.succeeded == 2 and len(report.failures) == 1
        assert sandboxes[1].files.read(f"{MOUNT}/user.txt") == "user 1\n"
    finally:
        for sandbox in sandboxes:
            sandbox.kill()


if __name__ == "__main__":
    main()
