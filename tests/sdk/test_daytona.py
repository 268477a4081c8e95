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
