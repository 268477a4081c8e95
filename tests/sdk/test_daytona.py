"""The official `daytona` SDK's journey against the mock Daytona, unpatched.

The SDK is pointed at the mock through its documented configuration (API
key, API URL, target); the toolbox it then reaches is wherever the
sandbox's `toolboxProxyUrl` says, which the mock started with
`--toolbox-host localhost` puts on the loopback address with the proxy's
port, as a self-hosted Daytona names its own proxy host. The mock's CA is
trusted through SSL_CERT_FILE (urllib3 and httpx both read it).
"""

import time
from urllib.parse import urlparse

import pytest
from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    ListSandboxesQuery,
    SessionExecuteRequest,
)

from conftest import daytona_config, fetch_through_proxy, record_timing, route


@pytest.fixture
def daytona(daytona_mock, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", daytona_mock.env["SILO_DAYTONA_CA_PEM"])
    yield daytona_mock, Daytona(daytona_config(daytona_mock.env))


def test_daytona_journey(daytona):
    mock, client = daytona
    labels = {"journey": "daytona", "run": str(time.time_ns())}

    started = time.monotonic()
    with route("POST /sandbox"):
        sandbox = client.create(CreateSandboxFromSnapshotParams(snapshot="base", labels=labels))
    with route("POST /process/execute (first command)"):
        first = sandbox.process.exec("echo ready")
    tti_ms = (time.monotonic() - started) * 1000
    assert first.result == "ready\n", first

    try:
        with route("GET /user-home-dir"):
            home = sandbox.get_user_home_dir()
        assert home == "/home/daytona", home

        with route("POST /files/bulk-upload"):
            sandbox.fs.upload_file(b"hello from the sdk\n", f"{home}/notes/hello.txt")
        with route("POST /files/bulk-download"):
            assert sandbox.fs.download_file(f"{home}/notes/hello.txt") == b"hello from the sdk\n"
        with route("GET /files"):
            listed = sandbox.fs.list_files(f"{home}/notes")
        assert [(f.name, f.is_dir, f.size) for f in listed] == [("hello.txt", False, 19)], listed

        with route("POST /process/execute (exit code)"):
            failed = sandbox.process.exec("echo out; echo err >&2; exit 3")
        assert failed.exit_code == 3, failed
        assert "out\n" in failed.result and "err\n" in failed.result, failed.result

        exec_times = []
        for _ in range(5):
            begun = time.monotonic()
            with route("POST /process/execute (timed)"):
                done = sandbox.process.exec("true")
            exec_times.append((time.monotonic() - begun) * 1000)
            assert done.exit_code == 0

        with route("POST /process/session"):
            sandbox.process.create_session("journey")
        with route("POST /process/session/{id}/exec (runAsync)"):
            command = sandbox.process.execute_session_command(
                "journey",
                SessionExecuteRequest(
                    command="echo to-out; echo to-err >&2; sleep 0.2; echo done", run_async=True
                ),
            )
        assert command.exit_code is None, command
        with route("GET /process/session/{id}/command/{cmd}"):
            deadline = time.monotonic() + 15
            while sandbox.process.get_session_command("journey", command.cmd_id).exit_code is None:
                assert time.monotonic() < deadline, "the session command never ended"
                time.sleep(0.1)
        with route("GET /process/session/{id}/command/{cmd}/logs"):
            logs = sandbox.process.get_session_command_logs("journey", command.cmd_id)
        assert logs.stdout == "to-out\ndone\n", logs
        assert logs.stderr == "to-err\n", logs
        with route("POST /process/session/{id}/exec (sync, split streams)"):
            synced = sandbox.process.execute_session_command(
                "journey", SessionExecuteRequest(command="echo a; echo b >&2; sh -c 'exit 4'")
            )
        assert (synced.exit_code, synced.stdout, synced.stderr) == (4, "a\n", "b\n"), synced

        with route("GET /sandbox/{id}/ports/{port}/preview-url"):
            sandbox.process.exec(
                "mkdir -p /tmp/www && echo served > /tmp/www/index.html && "
                "busybox httpd -p 8080 -h /tmp/www"
            )
            preview = sandbox.get_preview_link(8080)
        assert urlparse(preview.url).hostname == f"8080-{sandbox.id}.daytona.test", preview.url
        with route("proxy GET {preview url}"):
            status, body = fetch_through_proxy(
                mock.env["SILO_DAYTONA_PROXY_ADDR"],
                mock.env["SILO_DAYTONA_CA_PEM"],
                urlparse(preview.url).netloc,
                "/index.html",
                {"X-Daytona-Preview-Token": preview.token},
            )
        assert (status, body) == (200, b"served\n"), (status, body)

        with route("GET /sandbox?labels="):
            found = [s.id for s in client.list(ListSandboxesQuery(labels=labels))]
        assert found == [sandbox.id], found

        with route("POST /sandbox/{id}/stop"):
            sandbox.stop()
        assert sandbox.state.value == "stopped", sandbox.state
        with route("POST /sandbox/{id}/start"):
            sandbox.start()
        assert sandbox.state.value == "started", sandbox.state
        with route("POST /files/bulk-download (after a restart)"):
            assert sandbox.fs.download_file(f"{home}/notes/hello.txt") == b"hello from the sdk\n"
    finally:
        with route("DELETE /sandbox/{id}"):
            sandbox.delete(wait=True)
    with route("GET /sandbox?labels= (deleted)"):
        assert not [s.id for s in client.list(ListSandboxesQuery(labels=labels))]

    record_timing(
        "daytona",
        tti_ms=tti_ms,
        exec_ms=sorted(exec_times)[len(exec_times) // 2],
    )


def test_daytona_sdk_waits_out_or_reports_rate_limits(daytona):
    """The mock's 429 is what the SDK's HTTP client honours: a GET waits for
    Retry-After and tries again, a create (not idempotent) reports the
    SDK's rate-limit error with the header kept."""
    from daytona import DaytonaRateLimitError

    mock, client = daytona
    headers = {"Authorization": f"Bearer {mock.env['DAYTONA_API_KEY']}"}
    mock.admin(mock.env["DAYTONA_API_URL"], headers, rateLimitedRequests=1, retryAfterSecs=1)
    begun = time.monotonic()
    with route("GET /sandbox (429, then 200)"):
        assert list(client.list()) == []
    assert time.monotonic() - begun >= 0.9, "the SDK did not wait for Retry-After"

    mock.admin(mock.env["DAYTONA_API_URL"], headers, rateLimitedRequests=1, retryAfterSecs=2)
    with pytest.raises(DaytonaRateLimitError) as raised:
        client.create(CreateSandboxFromSnapshotParams(snapshot="base"))
    kept = {k.lower(): v for k, v in raised.value.headers.items()}
    assert kept.get("retry-after") == "2", raised.value.headers


def asked(mock, method: str, path: str) -> list:
    """The bodies of the requests `method path` (under /api) the mock was asked."""
    headers = {"Authorization": f"Bearer {mock.env['DAYTONA_API_KEY']}"}
    return [
        entry["body"]
        for entry in mock.requests(mock.env["DAYTONA_API_URL"], headers)
        if entry["method"] == method and entry["path"] == f"/api{path}"
    ]


def test_daytona_sdk_pauses_and_resumes_a_vm_sandbox(daytona):
    """sandbox.pause() and sandbox.start() on a linux-vm sandbox: a process
    started before the pause runs on after the resume; a container
    sandbox's pause is refused as Daytona refuses it."""
    from daytona import DaytonaError

    mock, client = daytona
    with route("POST /sandbox (vm)"):
        sandbox = client.create(CreateSandboxFromSnapshotParams(snapshot="vm", auto_stop_interval=0))
    try:
        with route("POST /process/session/{id}/exec (a ticker)"):
            sandbox.process.create_session("ticker")
            sandbox.process.execute_session_command(
                "ticker",
                SessionExecuteRequest(
                    command="while :; do echo t >> /tmp/ticks; sleep 0.1; done", run_async=True
                ),
            )

        def ticks() -> int:
            return int(sandbox.process.exec("cat /tmp/ticks | wc -l").result.strip() or 0)

        deadline = time.monotonic() + 10
        while ticks() == 0:
            assert time.monotonic() < deadline, "the ticker never ticked"
            time.sleep(0.1)
        with route("POST /sandbox/{id}/pause"):
            sandbox.pause()
        assert sandbox.state.value == "paused", sandbox.state
        assert asked(mock, "POST", f"/sandbox/{sandbox.id}/pause") == [None]
        with route("POST /sandbox/{id}/start (resume)"):
            sandbox.start()
        assert sandbox.state.value == "started", sandbox.state
        with route("POST /process/execute (ticks grow after the resume)"):
            before = ticks()
            deadline = time.monotonic() + 10
            while ticks() <= before:
                assert time.monotonic() < deadline, "the ticker did not survive the pause"
                time.sleep(0.1)
    finally:
        sandbox.delete()

    with route("POST /sandbox (container)"):
        container = client.create(CreateSandboxFromSnapshotParams(snapshot="base"))
    try:
        with pytest.raises(DaytonaError) as refused:
            container.pause()
        assert "Pausing is not supported for this sandbox" in str(refused.value), refused.value
    finally:
        container.delete()


def test_daytona_sdk_sends_network_rules(daytona):
    """Network rules reach the mock as the SDK sends them, on create and on
    update_network_settings; malformed ones are refused with the API's message."""
    from daytona import DaytonaError

    mock, client = daytona
    with route("POST /sandbox (network rules)"):
        sandbox = client.create(
            CreateSandboxFromSnapshotParams(
                snapshot="base",
                network_allow_list="10.0.0.0/8,192.168.0.0/16",
                domain_allow_list="pypi.org,*.daytona.io",
            )
        )
    try:
        create = asked(mock, "POST", "/sandbox")[-1]
        assert create["networkAllowList"] == "10.0.0.0/8,192.168.0.0/16", create
        assert create["domainAllowList"] == "pypi.org,*.daytona.io", create
        assert sandbox.network_allow_list == "10.0.0.0/8,192.168.0.0/16"
        with route("POST /sandbox/{id}/network-settings"):
            sandbox.update_network_settings(network_block_all=True)
        assert asked(mock, "POST", f"/sandbox/{sandbox.id}/network-settings") == [
            {"networkBlockAll": True}
        ]
        assert sandbox.network_block_all is True
        assert sandbox.network_allow_list is None
        with route("GET /sandbox/{id} (network rules)"):
            again = client.get(sandbox.id)
        assert again.network_block_all is True and again.domain_allow_list == "pypi.org,*.daytona.io"
    finally:
        sandbox.delete()

    with route("POST /sandbox (blocked)"):
        blocked = client.create(CreateSandboxFromSnapshotParams(network_block_all=True))
    try:
        assert asked(mock, "POST", "/sandbox")[-1]["networkBlockAll"] is True
        assert blocked.network_block_all is True
    finally:
        blocked.delete()
    with pytest.raises(DaytonaError) as refused:
        client.create(CreateSandboxFromSnapshotParams(network_allow_list="10.0.0.0"))
    assert "Missing CIDR prefix length" in str(refused.value), refused.value
