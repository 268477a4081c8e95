"""What every SDK journey shares: the mock binaries, the sandbox image with
bash, and a step marker that names the route a failure happened on.

The journeys run the providers' official SDKs unpatched: they are pointed at
a mock only through the parameters and environment variables the SDKs
document (API URL, key, domain, E2B's sandbox URL) and the CA bundle
variables Python's TLS stacks read (SSL_CERT_FILE). Every connection goes
to 127.0.0.1.

Under CI=true a missing engine or binary fails the run; elsewhere the
journeys are skipped with the reason.
"""

import contextlib
import hashlib
import http.client
import io
import json
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The image the journeys' sandboxes run: silo's base (busybox) plus Debian's
# bash-static as /bin/bash, since E2B runs every command as `bash -l -c`.
SDK_IMAGE = "silo-sdk-journey"
BASH_STATIC = Path("/bin/bash-static")
# Label holding the hash of what the image was built from, so an unchanged
# image is not built again.
CONTENT_LABEL = "silo.test.sdk-content"
# How long a mock binary has to print its environment.
MOCK_START_TIMEOUT = 60.0


def in_ci() -> bool:
    return os.environ.get("CI", "") in ("true", "1")


def unavailable(reason: str):
    """Fails under CI, skips elsewhere."""
    if in_ci():
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(f"{reason} (CI=true makes this fail)")


@contextlib.contextmanager
def route(name: str):
    """Names the provider route (and so the field) a failure came from."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - re-raised with the route named
        raise AssertionError(f"{name}: {type(error).__name__}: {error}") from error


def target_dir() -> Path:
    given = os.environ.get("SILO_TARGET_DIR") or os.environ.get("CARGO_TARGET_DIR")
    return Path(given) if given else REPO / "target"


def binary(name: str) -> Path:
    path = target_dir() / "debug" / name
    if not path.exists():
        unavailable(f"{path} is not built (cargo build -p silo-mocks --bins -p silo-cli)")
    return path


def docker(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args], input=stdin, capture_output=True, check=False, timeout=600
    )


@pytest.fixture(scope="session")
def sdk_image() -> str:
    return ensure_sdk_image()


def ensure_sdk_image() -> str:
    """silo-base plus bash, built once and again only when its inputs change."""
    if shutil.which("docker") is None or docker("info").returncode != 0:
        unavailable("no Docker engine answers")
    if not BASH_STATIC.exists():
        unavailable(f"{BASH_STATIC} is missing (Debian's bash-static; scripts/setup.sh installs it)")
    base = docker("image", "inspect", "--format", "{{.Id}}", "silo-base:latest")
    if base.returncode != 0:
        made = subprocess.run([binary("silo"), "image", "base"], capture_output=True, check=False)
        assert made.returncode == 0, f"silo image base: {made.stderr.decode()}"
        base = docker("image", "inspect", "--format", "{{.Id}}", "silo-base:latest")
    bash = BASH_STATIC.read_bytes()
    content = hashlib.sha256(base.stdout.strip() + bash).hexdigest()
    tag = f"{SDK_IMAGE}:{content[:12]}"
    have = docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{CONTENT_LABEL}"}}}}', tag)
    if have.returncode == 0 and have.stdout.decode().strip() == content:
        return tag
    dockerfile = (
        "FROM silo-base:latest\n"
        "COPY bash /bin/bash\n"
        f'LABEL {CONTENT_LABEL}="{content}"\n'
    ).encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data, mode in (("Dockerfile", dockerfile, 0o644), ("bash", bash, 0o755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    built = docker("build", "-q", "-t", tag, "-", stdin=context.getvalue())
    assert built.returncode == 0, f"building {tag}: {built.stderr.decode()}"
    return tag


class Mock:
    """A running mock binary and the environment it printed."""

    def __init__(self, process: subprocess.Popen, env: dict[str, str]):
        self.process = process
        self.env = env

    def admin(self, api_url: str, headers: dict[str, str], **switches) -> dict:
        """Sets the mock's fault switches through its test-only route."""
        request = urllib.request.Request(
            f"{api_url}/_mock/faults",
            data=json.dumps(switches).encode(),
            headers={"content-type": "application/json", **headers},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def requests(self, api_url: str, headers: dict[str, str]) -> list[dict]:
        """What clients asked the mock's control plane, oldest first
        (`{method, path, body}`), from its test-only journal route."""
        request = urllib.request.Request(f"{api_url}/_mock/requests", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_mock(name: str, args: list[str], wanted: int) -> Mock:
    """Starts `name` and reads the `KEY=value` lines it prints first."""
    process = subprocess.Popen(
        [binary(name), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    env: dict[str, str] = {}
    deadline = time.monotonic() + MOCK_START_TIMEOUT
    buffer = b""
    while len(env) < wanted:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([process.stdout], [], [], max(left, 0))
        if not ready:
            process.kill()
            raise AssertionError(f"{name} printed no environment within {MOCK_START_TIMEOUT}s")
        chunk = os.read(process.stdout.fileno(), 4096)
        if not chunk:
            raise AssertionError(f"{name} exited: {process.stderr.read().decode()}")
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            key, _, value = line.decode().partition("=")
            env[key] = value
    # Keep the pipe from filling while the journey runs.
    stderr = process.stderr
    if stderr is not None:
        threading.Thread(target=lambda: stderr.read(), daemon=True).start()
    return Mock(process, env)


def start_e2b_mock(image: str) -> Mock:
    return start_mock("silo-mock-e2b", ["--template", f"base={image}", "--ports", "49999,8080"], 5)


def start_daytona_mock(image: str) -> Mock:
    """A mock Daytona with `base` (container sandboxes) and `vm` (linux-vm
    sandboxes, which Daytona pauses) from the journeys' image."""
    return start_mock(
        "silo-mock-daytona",
        [
            "--snapshot",
            f"base={image}",
            "--vm-snapshot",
            f"vm={image}",
            "--ports",
            "49999,8080",
            "--toolbox-host",
            "localhost",
        ],
        5,
    )


@pytest.fixture(scope="session")
def e2b_mock(sdk_image):
    """One mock E2B for the session: the e2b SDK builds its TLS transport
    once per process, trusting the CA that SSL_CERT_FILE names then, and
    every mock makes a CA of its own."""
    mock = start_e2b_mock(sdk_image)
    try:
        yield mock
    finally:
        mock.stop()


@pytest.fixture
def daytona_mock(sdk_image):
    mock = start_daytona_mock(sdk_image)
    try:
        yield mock
    finally:
        mock.stop()


def fetch_through_proxy(
    proxy_addr: str, ca_pem: str, host: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """GET https://{host}{path} through a mock's TLS proxy at `proxy_addr`
    (TLS server name the host without its port), as `curl --resolve` does."""
    address, port = proxy_addr.rsplit(":", 1)
    context = ssl.create_default_context(cafile=ca_pem)
    connection = http.client.HTTPSConnection(address, int(port), context=context, timeout=10)
    connection.sock = context.wrap_socket(
        socket.create_connection((address, int(port)), timeout=10),
        server_hostname=urllib.parse.urlsplit(f"//{host}").hostname,
    )
    connection.request("GET", path, headers={"Host": host, **(headers or {})})
    answer = connection.getresponse()
    return answer.status, answer.read()


def e2b_options(env: dict[str, str]) -> dict[str, str]:
    """The e2b SDK's documented options for a mock E2B: its API, and its TLS
    proxy as the sandbox URL (the SDK then routes by its E2b-Sandbox-Id and
    E2b-Sandbox-Port headers). The CA comes from SSL_CERT_FILE."""
    proxy_port = env["SILO_E2B_PROXY_ADDR"].rsplit(":", 1)[1]
    return {
        "api_key": env["E2B_API_KEY"],
        "api_url": env["E2B_API_URL"],
        "domain": env["E2B_DOMAIN"],
        "sandbox_url": f"https://localhost:{proxy_port}",
    }


def daytona_config(env: dict[str, str]):
    """The daytona SDK's documented configuration for a mock Daytona."""
    from daytona import DaytonaConfig

    return DaytonaConfig(
        api_key=env["DAYTONA_API_KEY"],
        api_url=env["DAYTONA_API_URL"],
        target=env["DAYTONA_TARGET"],
    )


def record_timing(provider: str, **figures: float):
    """Prints a journey's figures and appends them to $SILO_SDK_TIMINGS."""
    line = {"provider": provider, **{k: round(v, 1) for k, v in figures.items()}}
    print(f"TIMING {json.dumps(line)}")
    path = os.environ.get("SILO_SDK_TIMINGS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
