"""A long command started by one process, followed from another that
missed its start, then interrupted; the shell session it ran in keeps its
variables for the next command.

    python reattach_interrupt.py [IMAGE]      (default silo-base:latest)

The second process is a real one (``python -c``): it finds the command by
its id, receives the output it missed from the agent's ring (any bytes the
ring no longer held would be reported as lost, never skipped), and
interrupts it as Ctrl-C would.
"""

import subprocess
import sys
import time
import uuid

from silo_sandbox import Sandbox

FOLLOWER = """
import sys, silo_sandbox
sandbox = silo_sandbox.Sandbox.connect(sys.argv[1])
handle = sandbox.commands.connect(int(sys.argv[2]))
seen = ""
for stdout, _, _ in handle:
    seen += stdout or ""
    if seen.count("tick") >= 5:
        handle.interrupt()
result = handle.wait(check=False)
print(f"follower saw {result.stdout.count('tick')} ticks; interrupted={result.interrupted}, lost={result.lost_bytes}")
"""


def main() -> None:
    image = sys.argv[1] if len(sys.argv) > 1 else "silo-base:latest"
    with Sandbox.create(image, name=f"long-{uuid.uuid4().hex[:6]}") as sandbox:
        session = sandbox.commands.session("agent")
        session.run("export STEP=42 && cd /tmp")
        handle = session.run("while true; do echo tick; sleep 0.1; done", background=True)
        print(f"started command {handle.pid}; this process stops following it")
        handle.disconnect()
        time.sleep(0.5)
        follower = subprocess.run(
            [sys.executable, "-c", FOLLOWER, sandbox.sandbox_id, str(handle.pid)], capture_output=True, text=True, timeout=60
        )
        print(follower.stdout, end="", file=sys.stdout)
        assert follower.returncode == 0, follower.stderr
        after = session.run('echo "STEP=$STEP in $(pwd)"').stdout
        print(f"the session survived: {after}", end="")
        assert after == "STEP=42 in /tmp\n"


if __name__ == "__main__":
    main()
