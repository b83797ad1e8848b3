"""Real OpenStack services the tests run beside Berth as peer processes, each from an
environment of its own that the Makefile builds (Berth never imports them)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

#: The repository root (the peer environments live there).
ROOT = Path(__file__).resolve().parents[2]

_SERVE = """
import sys
sys.argv = [{name!r}]
from {module} import application
import waitress
waitress.serve(application, host="127.0.0.1", port={port}, threads=4)
"""


def missing(venv: Path, tool: str, target: str) -> str | None:
    """Why a peer from ``venv`` cannot run here, or None."""
    if not (venv / "bin" / tool).exists():
        return f"no environment at {venv} (make test builds it: make {target})"
    return None


def serve(venv: Path, name: str, module: str, port: int, workdir: Path,
          env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Serve ``module``'s WSGI ``application`` with waitress from ``venv`` (the service
    reads its own command line at import, so it gets only its name)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(venv / "bin" / "python"), "-c",
             _SERVE.format(name=name, module=module, port=port)],
            stdout=out, stderr=out, cwd=workdir, env=env)


def wait_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """Until ``url`` answers 200 (RuntimeError with the log's end if the process dies)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not start in {timeout} s")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Terminate a peer (kill it after 10 s)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
