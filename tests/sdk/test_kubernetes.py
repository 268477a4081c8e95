"""The official `kubernetes` Python client's journey, and kubectl's, against
the mock Kubernetes, unpatched.

Both load only the kubeconfig the mock printed (`KUBECONFIG=…`): the API's
https://127.0.0.1 address, the test CA inline, a bearer token and the
`default` namespace. The pods run silo's base image (busybox), serving
"hello" on port 8080 with busybox `nc`; every connection goes to the
loopback range (the API, and each pod's own 127.77.x.y address).

Under CI=true a missing engine, binary or kubectl fails the run; elsewhere
the journeys are skipped with the reason.
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import portforward, stream

from conftest import binary, docker, route, start_mock, unavailable

IMAGE = "silo-base:latest"
# A server answering "hello" to every connection (busybox nc, persistent).
HELLO_SERVER = "echo started; nc -ll -p 8080 -e echo hello"
PHASE_TIMEOUT = 60


@pytest.fixture(scope="module")
def base_image() -> str:
    """silo-base:latest on the engine, built with `silo image base` if missing."""
    if shutil.which("docker") is None or docker("info").returncode != 0:
        unavailable("no Docker engine answers")
    if docker("image", "inspect", IMAGE).returncode != 0:
        made = subprocess.run([binary("silo"), "image", "base"], capture_output=True, check=False)
        assert made.returncode == 0, f"silo image base: {made.stderr.decode()}"
    return IMAGE


@pytest.fixture
def kubeconfig(base_image):
    mock = start_mock("silo-mock-kubernetes", [], 1)
    try:
        path = mock.env["KUBECONFIG"]
        assert os.path.exists(path), mock.env
        yield path
    finally:
        mock.stop()


def hello_pod(name: str, labels: dict[str, str]) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            restart_policy="Never",
            termination_grace_period_seconds=1,
            containers=[
                client.V1Container(
                    name="app",
                    image=IMAGE,
                    command=["sh", "-c", HELLO_SERVER],
                    ports=[client.V1ContainerPort(container_port=8080)],
                )
            ],
        ),
    )


def read_all(sock, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk


def test_python_client_journey(kubeconfig):
    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    labels = {"journey": "python", "run": str(time.time_ns())}
    selector = ",".join(f"{k}={v}" for k, v in labels.items())

    with route("POST /api/v1/namespaces/default/pods"):
        made = api.create_namespaced_pod("default", hello_pod("py-hello", labels))
    assert made.metadata.uid and made.status.phase == "Pending", made.status

    with route("GET /api/v1/namespaces/default/pods?labelSelector"):
        listed = api.list_namespaced_pod("default", label_selector=selector)
    assert [p.metadata.name for p in listed.items] == ["py-hello"]
    assert listed.metadata.resource_version

    phases = []
    with route("GET /api/v1/namespaces/default/pods?watch=true"):
        watcher = watch.Watch()
        for event in watcher.stream(
            api.list_namespaced_pod, "default", label_selector=selector, timeout_seconds=PHASE_TIMEOUT
        ):
            phases.append((event["type"], event["object"].status.phase))
            if event["object"].status.phase == "Running":
                watcher.stop()
    assert phases[0] == ("ADDED", "Pending") or phases[0] == ("ADDED", "Running"), phases
    assert phases[-1][1] == "Running", phases

    with route("GET /api/v1/namespaces/default/pods/py-hello"):
        running = api.read_namespaced_pod("py-hello", "default")
    assert running.status.pod_ip.startswith("127.77."), running.status.pod_ip
    assert running.status.container_statuses[0].ready

    # The server may take a moment to listen after the container starts.
    data = b""
    deadline = time.monotonic() + 20
    while data != b"hello\n":
        assert time.monotonic() < deadline, f"port-forward read {data!r}"
        with route("GET /api/v1/namespaces/default/pods/py-hello/portforward (WebSocket)"):
            forwarded = portforward(api.connect_get_namespaced_pod_portforward, "py-hello", "default", ports="8080")
            sock = forwarded.socket(8080)
            data = read_all(sock)
            sock.close()
        time.sleep(0.2)

    with route("GET /api/v1/namespaces/default/pods/py-hello/log"):
        assert api.read_namespaced_pod_log("py-hello", "default") == "started\n"

    # Exec over WebSocket channels (the client offers v5 and v4): the
    # output of both streams, as the client collects it.
    with route("GET /api/v1/namespaces/default/pods/py-hello/exec (WebSocket)"):
        printed = stream(
            api.connect_get_namespaced_pod_exec,
            "py-hello",
            "default",
            command=["sh", "-c", "echo from exec; echo to stderr >&2"],
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        )
    assert "from exec\n" in printed and "to stderr\n" in printed, printed

    # Stdin written as the client writes a string (a text message), and
    # the exit code read from the error channel's Status.
    with route("GET /api/v1/namespaces/default/pods/py-hello/exec (stdin, exit code)"):
        session = stream(
            api.connect_get_namespaced_pod_exec,
            "py-hello",
            "default",
            command=["sh", "-c", "read line; echo got $line; exit 3"],
            stderr=True,
            stdin=True,
            stdout=True,
            tty=False,
            _preload_content=False,
        )
        session.write_stdin("hello\n")
        session.run_forever(timeout=PHASE_TIMEOUT)
        assert not session.is_open()
        assert session.read_stdout() == "got hello\n"
        assert session.returncode == 3

    with route("DELETE /api/v1/namespaces/default/pods/py-hello"):
        deleted = api.delete_namespaced_pod("py-hello", "default", grace_period_seconds=1)
    assert deleted.metadata.deletion_timestamp is not None

    seen = []
    with route("GET /api/v1/namespaces/default/pods?watch=true&fieldSelector=metadata.name"):
        for event in watch.Watch().stream(
            api.list_namespaced_pod,
            "default",
            field_selector="metadata.name=py-hello",
            timeout_seconds=PHASE_TIMEOUT,
        ):
            seen.append(event["type"])
            if event["type"] == "DELETED":
                break
    assert seen[-1] == "DELETED", seen

    with pytest.raises(ApiException) as missing:
        api.read_namespaced_pod("py-hello", "default")
    assert missing.value.status == 404
    assert '"reason":"NotFound"' in missing.value.body
    assert api.list_namespaced_pod("default", label_selector=selector).items == []


def kubectl_command(kubeconfig: str, cache: str):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        unavailable("kubectl is not installed (scripts/setup.sh kubectl)")

    def run(*args: str, check: bool = True, timeout: float = 90) -> str:
        done = subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig, "--cache-dir", cache, *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout + done.stderr

    return kubectl, run


MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: kubectl-hello
  labels:
    journey: kubectl
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: silo-base:latest
    command: ["sh", "-c", "echo started; nc -ll -p 8080 -e echo hello"]
    ports:
    - containerPort: 8080
"""


def test_kubectl_journey(kubeconfig):
    with tempfile.TemporaryDirectory() as cache:
        kubectl, run = kubectl_command(kubeconfig, cache)
        manifest = os.path.join(cache, "pod.yaml")
        with open(manifest, "w", encoding="utf-8") as out:
            out.write(MANIFEST)

        # The mock serves no OpenAPI document, so client-side validation is off.
        with route("kubectl apply"):
            assert "pod/kubectl-hello created" in run("apply", "--validate=false", "-f", manifest)
        with route("kubectl get pods -l"):
            printed = run("get", "pods", "-l", "journey=kubectl")
        assert re.search(r"^NAME\s+READY\s+STATUS\s+RESTARTS\s+AGE", printed, re.M), printed
        assert re.search(r"^kubectl-hello\s+\d/1\s+\w+", printed, re.M), printed
        with route("kubectl wait --for=condition=Ready"):
            assert "condition met" in run("wait", "--for=condition=Ready", "pod/kubectl-hello", "--timeout=60s")
        with route("kubectl get pods -o wide"):
            wide = run("get", "pods", "-l", "journey=kubectl", "-o", "wide")
        assert re.search(r"kubectl-hello\s+1/1\s+Running\s+0\s+\S+\s+127\.77\.", wide), wide
        with route("kubectl logs"):
            assert run("logs", "kubectl-hello") == "started\n"

        # kubectl exec: WebSocket v5 first (its default since 1.30), SPDY
        # when told not to use WebSockets; the command's exit code is
        # kubectl's.
        def kubectl_exec(*args: str, stdin: str | None = None, spdy: bool = False):
            env = dict(os.environ)
            if spdy:
                env["KUBECTL_REMOTE_COMMAND_WEBSOCKETS"] = "false"
            return subprocess.run(
                [kubectl, "--kubeconfig", kubeconfig, "--cache-dir", cache, "exec", *args],
                input=stdin,
                capture_output=True,
                text=True,
                check=False,
                timeout=90,
                env=env,
            )

        for spdy in (False, True):
            with route(f"kubectl exec -- sh -c 'echo hi; exit 3' (spdy={spdy})"):
                done = kubectl_exec("kubectl-hello", "--", "sh", "-c", "echo hi; exit 3", spdy=spdy)
            assert (done.returncode, done.stdout) == (3, "hi\n"), done
            assert "command terminated with exit code 3" in done.stderr, done.stderr
            with route(f"kubectl exec -- true (spdy={spdy})"):
                done = kubectl_exec("kubectl-hello", "--", "true", spdy=spdy)
            assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done
            with route(f"kubectl exec -i -- cat (spdy={spdy})"):
                done = kubectl_exec("-i", "kubectl-hello", "--", "cat", stdin="piped in\n", spdy=spdy)
            assert (done.returncode, done.stdout) == (0, "piped in\n"), done

        with route("kubectl port-forward"):
            forward = subprocess.Popen(
                [kubectl, "--kubeconfig", kubeconfig, "--cache-dir", cache, "port-forward", "pod/kubectl-hello", ":8080"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                line = forward.stdout.readline()
                found = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
                assert found, f"{line}{forward.stderr.read() if forward.poll() is not None else ''}"
                local = int(found.group(1))
                data = b""
                deadline = time.monotonic() + 20
                while data != b"hello\n":
                    assert time.monotonic() < deadline, f"port-forward read {data!r}"
                    assert forward.poll() is None, forward.stderr.read()
                    with socket.create_connection(("127.0.0.1", local), timeout=10) as sock:
                        data = read_all(sock)
                    time.sleep(0.2)
            finally:
                forward.terminate()
                forward.wait(timeout=10)

        with route("kubectl delete pod"):
            assert 'pod "kubectl-hello" deleted' in run("delete", "pod", "kubectl-hello", "--grace-period=1")
        with route("kubectl get pods (after delete)"):
            assert "No resources found" in run("get", "pods", "-l", "journey=kubectl")
