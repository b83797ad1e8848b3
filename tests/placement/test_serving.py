"""``berth placement serve`` and ``berth serve`` as HTTP servers: stalled clients hold no
worker, oversized bodies are refused before they are read, a stop is clean.

Both run on waitress, which reads a request whole in its event loop before a worker
thread sees it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from berth.service.localcluster import free_port

HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}


def _start(argv: list[str], url: str, ready: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "berth.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + ready, headers=HEADERS, timeout=1).status_code < 500:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read().decode() if proc.stdout else "exited")
    proc.kill()
    raise AssertionError("server did not come up")


@pytest.fixture(params=["placement", "serve"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(base URL, a path that takes a POST body) of a server with 2 worker threads."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = f"sqlite:///{tmp_path}/db.sqlite"
    if request.param == "placement":
        argv = ["placement", "serve", "--auth-strategy", "noauth2", "--db", db, "--port", str(port), "--threads", "2",
                "--channel-timeout", "5"]
        proc, post = _start(argv, url, "/"), "/resource_providers"
    else:
        argv = ["serve", "--auth-strategy", "noauth2", "--db", db, "--port", str(port), "--threads", "2"]
        proc, post = _start(argv, url, "/healthz"), "/boot"
    try:
        yield url, post
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_half_sent_requests_do_not_starve_the_server(server: tuple[str, str]) -> None:
    url, post = server
    host, port = url.removeprefix("http://").split(":")
    stalled = []
    for _ in range(16):  # eight times the worker threads
        s = socket.create_connection((host, int(port)))
        s.sendall(f"POST {post} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode())
        stalled.append(s)
    try:
        started = time.monotonic()
        answer = httpx.get(url + "/", headers=HEADERS, timeout=10)
        assert answer.status_code < 500
        assert time.monotonic() - started < 5
    finally:
        for s in stalled:
            s.close()


def test_an_oversized_body_is_refused_before_it_is_read(server: tuple[str, str]) -> None:
    url, post = server
    body = b"{" + b" " * (2 * 1024 * 1024) + b"}"
    started = time.monotonic()
    answer = httpx.post(url + post, content=body, timeout=30,
                        headers={**HEADERS, "Content-Type": "application/json"})
    assert answer.status_code == 413
    assert time.monotonic() - started < 5
    # The server goes on answering.
    assert httpx.get(url + "/", headers=HEADERS, timeout=10).status_code < 500


def test_bad_serving_options_are_one_line_errors(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "berth.cli", "placement", "serve", "--auth-strategy", "noauth2", "--db",
                           f"sqlite:///{tmp_path}/db.sqlite", "--max-body", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "berth placement serve: --max-body must be >= 1, got 0"
