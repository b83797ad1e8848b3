"""A ``berth serve`` process for the tests that run Berth as users run it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from berth.service.localcluster import free_port


@contextmanager
def berth_serve(workdir: Path, *args: str, timeout: float = 60.0,
                procs: list[subprocess.Popen[bytes]] | None = None) -> Iterator[str]:
    """``berth serve`` (noauth2, SQLite in ``workdir``, a free port, then ``args``) until
    it answers ``/healthz``; yields its URL (the process goes into ``procs`` when given)
    and stops it on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "serve", "--auth-strategy", "noauth2",
         "--db", f"sqlite:///{workdir}/b.sqlite", "--port", str(port), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if procs is not None:
        procs.append(proc)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
