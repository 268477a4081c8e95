"""A checkpoint per step, and back to the last good one when a step fails,
as a chat REPL over a sandbox does: each turn's tool call runs in the
sandbox, a snapshot follows every turn that worked, and a turn that broke
something is undone by rewinding to the checkpoint before it.

    python snapshot_rewind_loop.py [IMAGE]      (default silo-base:latest)
"""

import sys
import uuid

from silo_sandbox import Sandbox

TURNS = [
    "mkdir -p /work && echo 'print(1)' > /work/app.py",
    "echo 'print(2)' >> /work/app.py",
    "rm -rf /work && false",  # a tool call that breaks the tree and fails
    "echo 'print(3)' >> /work/app.py",
]


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 else "silo-base:latest"
    with Sandbox.create(image, name=f"repl-{uuid.uuid4().hex[:6]}") as sandbox:
        checkpoint = sandbox.snapshots.take("start")
        for turn, command in enumerate(TURNS, 1):
            result = sandbox.commands.run(command, check=False)
            if result.exit_code == 0:
                checkpoint = sandbox.snapshots.take(f"after turn {turn}")
                print(f"turn {turn}: ok, checkpoint {checkpoint.id}")
            else:
                sandbox.snapshots.rewind(checkpoint)
                print(f"turn {turn}: failed ({result.error}); rewound to {checkpoint.id}")
        app = sandbox.files.read("/work/app.py")
        print(app, end="")
        assert app == "print(1)\nprint(2)\nprint(3)\n"
        print(f"{len(sandbox.snapshots.list())} snapshots")


if __name__ == "__main__":
    main()
