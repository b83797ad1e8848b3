"""The real Placement 16 as a peer process, for the parity tests.

It runs from its own environment, ``.venv-placement`` (``make placement-env``, which
``make test`` builds), on a SQLite database in a scratch directory, noauth2, served by
waitress on a free loopback port. Berth never imports Placement: the tests talk to it
over HTTP.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from berth.service.localcluster import free_port
from peers import ROOT, missing, serve, stop, wait_up

VENV = ROOT / ".venv-placement"
__all__ = ["Placement", "available", "free_port", "wait_up"]


def available() -> str | None:
    """Why the peer cannot run here, or None."""
    return missing(VENV, "placement-manage", "placement-env")


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
        with open(self.workdir / "placement.log", "ab") as log:
            subprocess.run([str(VENV / "bin" / "placement-manage"), "--config-file",
                            str(self.workdir / "placement.conf"), "db", "sync"],
                           check=True, stdout=log, stderr=log, timeout=120)
        env = {"OS_PLACEMENT_CONFIG_DIR": str(self.workdir), "PATH": os.environ["PATH"],
               "PYTHONHASHSEED": str(self.hash_seed)}
        self.proc = serve(VENV, "placement", "placement.wsgi.api", self.port, self.workdir,
                          env, self.workdir / "placement.log")
        wait_up(self.url + "/", self.proc, self.workdir / "placement.log")
        return self

    def stop(self) -> None:
        stop(self.proc)
