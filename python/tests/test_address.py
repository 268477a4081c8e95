"""`agent_address`: what docs/protocol.md's "Connecting to a sandbox" says a
client of its own needs, checked by being such a client."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import time


def signed_get(address: dict, target: str) -> tuple[int, bytes]:
    """One signed request over the agent's Unix socket, written from the
    document alone (no silo code)."""
    timestamp = str(int(time.time()))
    nonce = os.urandom(16).hex()
    body_sha = hashlib.sha256(b"").hexdigest()
    canonical = "\n".join(["silo-request-v1", "GET", target, timestamp, nonce, body_sha])
    signature = hmac.new(bytes.fromhex(address["key"]), canonical.encode(), hashlib.sha256).hexdigest()
    headers = {
        "Host": address["host_header"],
        "x-silo-protocol": "1",
        "x-silo-timestamp": timestamp,
        "x-silo-nonce": nonce,
        "x-silo-content-sha256": body_sha,
        "x-silo-signature": signature,
        "Connection": "close",
        **dict(address["headers"]),
    }
    request = f"GET {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(address["socket"])
        sock.sendall(request.encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    return status, body


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


def test_a_client_of_its_own_reaches_the_agent_with_the_address(local):
    local.files.write("/tmp/py-address.txt", "reached")
    address = local.agent_address()
    assert address["transport"] == "unix" and len(address["key"]) == 64
    status, body = signed_get(address, "/v1/files/stat?path=/tmp/py-address.txt")
    assert status == 200, body
    assert json.loads(body)["size"] == len("reached")
    # Another sandbox's key is refused.
    forged = dict(address, key="00" * 32)
    status, body = signed_get(forged, "/v1/files/stat?path=/tmp/py-address.txt")
    assert status == 401 and json.loads(body)["kind"] == "unauthorized"
