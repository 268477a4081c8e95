"""The Kubernetes backend through the mock API server (tests/mocks), whose
pods are containers running the real agent: the path of a harness whose
sandboxes are pods (Onyx's), files pushed to many pods at once with a report
per pod, reached through the API server's port-forward and at the pods'
own addresses."""

from __future__ import annotations

import signal
import subprocess

import pytest

import silo_sandbox
from conftest import silo_binary, start_mock, unique

#: The image an init container copies the agent from into each pod.
AGENT_IMAGE = "silo-py-kubernetes-agent:latest"


@pytest.fixture(params=["port-forward", "pod-ip"])
def cluster(request, base_image, monkeypatch, tmp_path):
    """The mock API server running, its kubeconfig exported, the agent image
    built, agents reached as the parameter says; a home of its own."""
    built = subprocess.run(
        [silo_binary(), "image", "agent", "-t", AGENT_IMAGE], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr
    process, env = start_mock("silo-mock-kubernetes", [], lines=1)
    monkeypatch.setenv("KUBECONFIG", env["KUBECONFIG"])
    monkeypatch.setenv("SILO_KUBERNETES_AGENT_IMAGE", AGENT_IMAGE)
    monkeypatch.setenv("SILO_KUBERNETES_REACH", request.param)
    try:
        yield tmp_path / "home"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def test_files_are_pushed_to_many_pods_with_a_report_per_pod(cluster, base_image):
    home = cluster
    pods = [
        silo_sandbox.Sandbox.create(base_image, backend="kubernetes", name=unique("py-pod"), home=home)
        for _ in range(3)
    ]
    try:
        assert pods[0].commands.run("echo from a pod").stdout == "from a pod\n"
        report = silo_sandbox.push_to_sandboxes(
            "/workspace/managed/skills",
            {pod: {"skill.md": f"for {pod.name}", "bin/tool": b"#!/bin/sh\n"} for pod in pods},
        )
        assert (report.targets, report.succeeded) == (3, 3), report.failures
        for pod in pods:
            assert pod.files.read("/workspace/managed/skills/skill.md") == f"for {pod.name}"
        # A pod stopped (its files snapshotted, the pod deleted) is reported,
        # the others still pushed to.
        pods[2].stop()
        again = silo_sandbox.push_to_sandboxes(
            "/workspace/managed/skills", {pod: {"skill.md": "v2"} for pod in pods}
        )
        assert again.succeeded == 2 and [f.reason for f in again.failures] == ["stopped"]
        pods[2].start()
        assert pods[2].files.read("/workspace/managed/skills/skill.md") == f"for {pods[2].name}"
    finally:
        for pod in pods:
            pod.kill()
