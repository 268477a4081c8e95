"""The official `e2b` SDK's journey against the mock E2B, unpatched.

The SDK is pointed at the mock through its documented options: the API URL,
key and domain, and `sandbox_url` (E2B_SANDBOX_URL) for the sandbox side,
where it names the sandbox and port in its `E2b-Sandbox-Id` and
`E2b-Sandbox-Port` headers, as it does against E2B's own `sandbox.{domain}`.
The mock's CA is trusted through SSL_CERT_FILE.
"""

import time

import pytest
from e2b import CommandExitException, Sandbox, SandboxQuery

from conftest import e2b_options, fetch_through_proxy, record_timing, route


@pytest.fixture
def e2b(e2b_mock, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", e2b_mock.env["SILO_E2B_CA_PEM"])
    yield e2b_mock, e2b_options(e2b_mock.env)
    # The mock is the session's: the next test starts with every fault off.
    e2b_mock.admin(
        e2b_mock.env["E2B_API_URL"],
        {"X-API-Key": e2b_mock.env["E2B_API_KEY"]},
        dropOnPause=False,
        unreadySecs=0,
        rateLimitedRequests=0,
    )


def test_e2b_journey(e2b):
    mock, options = e2b
    metadata = {"journey": "e2b", "run": str(time.time_ns())}

    started = time.monotonic()
    with route("POST /v2/sandboxes"):
        sandbox = Sandbox.create(template="base", metadata=metadata, timeout=300, **options)
    first_output = None

    def on_stdout(_):
        nonlocal first_output
        if first_output is None:
            first_output = time.monotonic()

    with route("process.Process/Start (first command)"):
        sandbox.commands.run("echo ready", on_stdout=on_stdout)
    assert first_output is not None, "the first command printed nothing"
    tti_ms = (first_output - started) * 1000

    try:
        with route("POST /files"):
            info = sandbox.files.write("notes/hello.txt", "hello from the sdk\n")
        assert info.path == "/home/user/notes/hello.txt", info
        with route("GET /files"):
            assert sandbox.files.read("notes/hello.txt") == "hello from the sdk\n"
        with route("filesystem.Filesystem/ListDir"):
            names = [entry.name for entry in sandbox.files.list("notes")]
        assert names == ["hello.txt"], names
        with route("filesystem.Filesystem/Stat"):
            assert sandbox.files.exists("notes/hello.txt")
            assert not sandbox.files.exists("notes/missing.txt")

        with route("process.Process/Start (exit code and both streams)"):
            with pytest.raises(CommandExitException) as raised:
                sandbox.commands.run("echo out; echo err >&2; exit 3", timeout=30)
        result = raised.value
        assert result.exit_code == 3, result
        assert result.stdout == "out\n", result.stdout
        assert result.stderr == "err\n", result.stderr

        exec_times = []
        for _ in range(5):
            begun = time.monotonic()
            with route("process.Process/Start (timed exec)"):
                done = sandbox.commands.run("true")
            exec_times.append((time.monotonic() - begun) * 1000)
            assert done.exit_code == 0

        with route("process.Process/Start (background)"):
            background = sandbox.commands.run("sleep 600", background=True, timeout=0)
        with route("process.Process/List"):
            assert background.pid in [p.pid for p in sandbox.commands.list()]
        with route("process.Process/SendSignal"):
            assert background.kill()
        with route("process.Process/List (after kill)"):
            deadline = time.monotonic() + 10
            while background.pid in [p.pid for p in sandbox.commands.list()]:
                assert time.monotonic() < deadline, "the killed command is still listed"
                time.sleep(0.05)

        with route("GET /v2/sandboxes"):
            listed = Sandbox.list(query=SandboxQuery(metadata=metadata), **options).next_items()
        assert [s.sandbox_id for s in listed] == [sandbox.sandbox_id], listed
        assert listed[0].metadata == metadata

        with route("POST /sandboxes/{id}/timeout"):
            sandbox.set_timeout(600)
        with route("GET /sandboxes/{id}"):
            info = sandbox.get_info()
        left = (info.end_at - info.started_at).total_seconds()
        assert 590 <= left <= 610, left

        with route("process.Process/Start (survivor)"):
            survivor = sandbox.commands.run(
                "while :; do date +%s%N >> /tmp/ticks; sleep 0.1; done",
                background=True,
                timeout=0,
            )
        with route("POST /sandboxes/{id}/pause"):
            assert sandbox.pause()
        with route("GET /sandboxes/{id} (paused)"):
            assert sandbox.get_info().state.value == "paused"
        with route("POST /v2/sandboxes/{id}/connect"):
            resumed = Sandbox.connect(sandbox.sandbox_id, **options)
        with route("process.Process/List (after resume)"):
            assert survivor.pid in [p.pid for p in resumed.commands.list()]
        with route("process.Process/Start (ticks grow after resume)"):
            before = int(resumed.commands.run("wc -l < /tmp/ticks").stdout)
            time.sleep(0.5)
            after = int(resumed.commands.run("wc -l < /tmp/ticks").stdout)
        assert after > before, (before, after)

        host = resumed.get_host(8080)
        assert host == f"8080-{sandbox.sandbox_id}.{options['domain']}", host
        with route("proxy GET https://{host}/ (a server in the sandbox)"):
            resumed.commands.run(
                "mkdir -p /tmp/www && echo served > /tmp/www/index.html && "
                "busybox httpd -p 8080 -h /tmp/www",
            )
            status, body = fetch_through_proxy(
                mock.env["SILO_E2B_PROXY_ADDR"], mock.env["SILO_E2B_CA_PEM"], host, "/index.html"
            )
        assert (status, body) == (200, b"served\n"), (status, body)
    finally:
        with route("DELETE /sandboxes/{id}"):
            assert sandbox.kill()
    with route("GET /sandboxes/{id} (killed)"):
        assert not Sandbox.list(query=SandboxQuery(metadata=metadata), **options).next_items()

    record_timing(
        "e2b",
        tti_ms=tti_ms,
        exec_ms=sorted(exec_times)[len(exec_times) // 2],
    )


def test_e2b_sdk_waits_out_rate_limits(e2b):
    """The mock's 429 (with Retry-After) is what the SDK's retries expect."""
    mock, options = e2b
    switches = mock.admin(
        mock.env["E2B_API_URL"],
        {"X-API-Key": mock.env["E2B_API_KEY"]},
        rateLimitedRequests=2,
        retryAfterSecs=1,
    )
    assert switches["rateLimitedRequests"] == 2, switches
    begun = time.monotonic()
    with route("GET /v2/sandboxes (429, 429, then 200)"):
        Sandbox.list(**options).next_items()
    assert time.monotonic() - begun >= 1.5, "the SDK did not wait for Retry-After"


def test_e2b_sdk_sees_a_pause_cut_its_stream(e2b):
    """With the drop-on-pause switch on, a pause breaks the SDK's open
    command stream as a real pause does: its health probe then finds the
    sandbox gone from the proxy, and the process itself lives on."""
    from e2b.exceptions import SandboxNotRunningException

    mock, options = e2b
    mock.admin(mock.env["E2B_API_URL"], {"X-API-Key": mock.env["E2B_API_KEY"]}, dropOnPause=True)
    with route("POST /v2/sandboxes"):
        sandbox = Sandbox.create(template="base", timeout=120, **options)
    try:
        with route("process.Process/Start (background)"):
            handle = sandbox.commands.run(
                "while :; do echo tick; sleep 0.1; done", background=True, timeout=0
            )
        with route("POST /sandboxes/{id}/pause"):
            assert sandbox.pause()
        with pytest.raises(SandboxNotRunningException):
            handle.wait()
        with route("POST /v2/sandboxes/{id}/connect"):
            resumed = Sandbox.connect(sandbox.sandbox_id, **options)
        with route("process.Process/List (after resume)"):
            assert handle.pid in [p.pid for p in resumed.commands.list()]
    finally:
        sandbox.kill()


def asked(mock, method: str, path: str) -> list:
    """The bodies of the requests `method path` the mock was asked."""
    headers = {"X-API-Key": mock.env["E2B_API_KEY"]}
    return [
        entry["body"]
        for entry in mock.requests(mock.env["E2B_API_URL"], headers)
        if entry["method"] == method and entry["path"] == path
    ]


def test_e2b_sdk_forks_a_sandbox(e2b):
    """Sandbox.fork goes through POST /sandboxes/{id}/fork: the forks have
    the original's files (not its processes: the mock has no memory
    snapshots), and the original runs on."""
    mock, options = e2b
    with route("POST /v2/sandboxes"):
        sandbox = Sandbox.create(template="base", timeout=120, **options)
    forks = []
    try:
        with route("POST /files"):
            sandbox.files.write("notes/kept.txt", "kept\n")
        with route("process.Process/Start (background)"):
            sleeper = sandbox.commands.run("sleep 600", background=True, timeout=0)
        with route("POST /sandboxes/{id}/fork"):
            forks = sandbox.fork(count=2, timeout=60)
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
        assert asked(mock, "POST", f"/sandboxes/{sandbox.sandbox_id}/fork") == [
            {"timeout": 60, "count": 2}
        ]
        for fork in forks:
            assert fork.sandbox_id != sandbox.sandbox_id
            with route("GET /files (a fork)"):
                assert fork.files.read("notes/kept.txt") == "kept\n"
            with route("process.Process/List (a fork)"):
                assert fork.commands.list() == []
            with route("process.Process/Start (a fork)"):
                assert fork.commands.run("echo forked").stdout == "forked\n"
        with route("GET /sandboxes/{id} (the original)"):
            assert sandbox.get_info().state.value == "running"
        with route("process.Process/List (the original)"):
            assert sleeper.pid in [p.pid for p in sandbox.commands.list()]
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()
        sandbox.kill()


def test_e2b_sdk_snapshots_a_sandbox_and_creates_from_the_snapshot(e2b):
    mock, options = e2b
    name = f"journey-{time.time_ns()}"
    with route("POST /v2/sandboxes"):
        sandbox = Sandbox.create(template="base", timeout=120, **options)
    try:
        with route("POST /files"):
            sandbox.files.write("notes/kept.txt", "kept\n")
        with route("POST /sandboxes/{id}/snapshots"):
            info = sandbox.create_snapshot(name=name)
        assert info.snapshot_id == f"silo-mock/{name}:default", info
        assert info.names == [f"silo-mock/{name}"], info
        with route("GET /snapshots"):
            listed = sandbox.list_snapshots().next_items()
        assert [s.snapshot_id for s in listed] == [info.snapshot_id], listed
        with route("POST /v2/sandboxes (from the snapshot)"):
            copy = Sandbox.create(template=info.snapshot_id, timeout=60, **options)
        try:
            with route("GET /files (from the snapshot)"):
                assert copy.files.read("notes/kept.txt") == "kept\n"
        finally:
            copy.kill()
        with route("DELETE /templates/{id}"):
            assert Sandbox.delete_snapshot(info.snapshot_id, **options)
            assert not Sandbox.delete_snapshot(info.snapshot_id, **options)
    finally:
        sandbox.kill()


def test_e2b_sdk_sends_network_rules(e2b):
    """Egress rules reach the mock as the SDK sends them, on create and on
    update_network; malformed ones are refused with the API's message."""
    from e2b.exceptions import InvalidArgumentException, SandboxException

    mock, options = e2b
    network = {"allow_out": ["1.1.1.1", "example.com"], "deny_out": ["0.0.0.0/0"]}
    with route("POST /v2/sandboxes (network)"):
        sandbox = Sandbox.create(
            template="base", timeout=60, network=network, allow_internet_access=False, **options
        )
    try:
        create = asked(mock, "POST", "/v2/sandboxes")[-1]
        assert create["network"] == {"allowOut": ["1.1.1.1", "example.com"], "denyOut": ["0.0.0.0/0"]}
        assert create["allow_internet_access"] is False
        with route("GET /sandboxes/{id} (network)"):
            info = sandbox.get_info()
        assert info.allow_internet_access is False
        assert info.network["allow_out"] == ["1.1.1.1", "example.com"], info.network
        with route("PUT /sandboxes/{id}/network"):
            sandbox.update_network({"deny_out": ["10.0.0.0/8"], "allow_internet_access": True})
        assert asked(mock, "PUT", f"/sandboxes/{sandbox.sandbox_id}/network") == [
            {"denyOut": ["10.0.0.0/8"], "allow_internet_access": True}
        ]
        with route("GET /sandboxes/{id} (updated)"):
            info = sandbox.get_info()
        assert info.network.get("deny_out") == ["10.0.0.0/8"], info.network
        assert "allow_out" not in info.network, info.network
        assert info.allow_internet_access is True
        with pytest.raises((InvalidArgumentException, SandboxException)) as refused:
            Sandbox.create(template="base", network={"deny_out": ["example.com"]}, **options)
        assert "invalid denied CIDR example.com" in str(refused.value), refused.value
    finally:
        sandbox.kill()
