"""The real Placement 16 as a peer process, for the parity tests.

It runs from its own environment, ``.venv-placement`` (``make placement-env``, which
``make test`` builds), on a SQLite database in a scratch directory, noauth2, served by
waitress on a free loopback port. Berth never imports Placement: the tests talk to it
over HTTP.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-placement"

_SERVE = """
import sys
sys.argv = ["placement"]
from placement.wsgi.api import application
import waitress
waitress.serve(application, host="127.0.0.1", port=int({port}), threads=4)
"""


def available() -> str | None:
    """Why the peer cannot run here, or None."""
    if not (VENV / "bin" / "placement-manage").exists():
        return f"no Placement environment at {VENV} (make test builds it: make placement-env)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Placement:
    """A running Placement 16 on ``url``; ``hash_seed`` is its PYTHONHASHSEED."""

    workdir: Path
    hash_seed: int = 0
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Placement:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "placement.conf").write_text(
            "[api]\nauth_strategy = noauth2\n"
            f"[placement_database]\nconnection = sqlite:///{self.workdir}/placement.sqlite\n"
            "[oslo_policy]\nenforce_new_defaults = false\n")
        log = open(self.workdir / "placement.log", "ab")  # noqa: SIM115 - kept by the process
        subprocess.run([str(VENV / "bin" / "placement-manage"), "--config-file",
                        str(self.workdir / "placement.conf"), "db", "sync"],
                       check=True, stdout=log, stderr=log, timeout=120)
        env = {"OS_PLACEMENT_CONFIG_DIR": str(self.workdir), "PATH": os.environ["PATH"],
               "PYTHONHASHSEED": str(self.hash_seed)}
        self.proc = subprocess.Popen(
            [str(VENV / "bin" / "python"), "-c", _SERVE.format(port=self.port)],
            stdout=log, stderr=log, cwd=self.workdir, env=env)
        wait_up(self.url, self.proc, self.workdir / "placement.log")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url + "/", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not start in {timeout} s")
