"""Shared helpers of the Placement API tests: server process, API wrapper, error accessors."""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Server:
    """A running server process and its base URL."""

    url: str
    proc: subprocess.Popen[str]
    db: str

    def stop(self) -> None:
        """SIGTERM and wait."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server(db: str, *extra: str) -> Server:
    """Start ``python -m berth.placement serve`` on a free port and wait until it listens.

    It runs noauth2 trusting the role and project headers clients send, as Placement's
    own functional tests run it (their ``X-Roles: service`` and ``X-Project-Id``)."""
    cmd = [
        sys.executable,
        "-m",
        "berth.placement",
        "serve",
        "--auth-strategy",
        "noauth2",
        "--noauth2-trust-client-roles",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--db",
        db,
        *extra,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return Server(url=line.split()[-1], proc=proc, db=db)


class Api:
    """httpx with Placement headers: ``api.get(path, mv="1.39")``."""

    def __init__(self, base: str, token: str = "admin") -> None:
        self.base = base
        self.token = token
        self.http = httpx.Client(base_url=base, timeout=30)

    def request(
        self,
        method: str,
        path: str,
        *,
        mv: str | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        token: str | None = "default",
        **kw: Any,
    ) -> httpx.Response:
        """Send a request; ``mv=None`` sends no microversion header."""
        hdrs: dict[str, str] = {}
        tok = self.token if token == "default" else token
        if tok is not None:
            hdrs["X-Auth-Token"] = tok
        if mv is not None:
            hdrs["OpenStack-API-Version"] = f"placement {mv}"
        hdrs.update(headers or {})
        return self.http.request(method, path, json=json, headers=hdrs, **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        """GET."""
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        """POST."""
        return self.request("POST", path, **kw)

    def put(self, path: str, **kw: Any) -> httpx.Response:
        """PUT."""
        return self.request("PUT", path, **kw)

    def delete(self, path: str, **kw: Any) -> httpx.Response:
        """DELETE."""
        return self.request("DELETE", path, **kw)

    # -- builders ------------------------------------------------------------------------

    def provider(self, name: str | None = None, parent: str | None = None, **inv: int) -> str:
        """Create a provider (optionally with inventory totals ``VCPU=8``); its uuid."""
        u = str(uuid.uuid4())
        body: dict[str, Any] = {"name": name or f"rp-{u}", "uuid": u}
        if parent:
            body["parent_provider_uuid"] = parent
        r = self.post("/resource_providers", json=body, mv="1.39")
        assert r.status_code == 200, r.text
        if inv:
            r = self.put(
                f"/resource_providers/{u}/inventories",
                mv="1.39",
                json={
                    "resource_provider_generation": 0,
                    "inventories": {k: {"total": v} for k, v in inv.items()},
                },
            )
            assert r.status_code == 200, r.text
        return u

    def generation(self, rp: str) -> int:
        """Current provider generation."""
        return int(self.get(f"/resource_providers/{rp}", mv="1.39").json()["generation"])


def detail(resp: httpx.Response) -> str:
    """The error detail text of a Placement error response."""
    return str(resp.json()["errors"][0]["detail"])


def code(resp: httpx.Response) -> str | None:
    """The error code, if any."""
    return resp.json()["errors"][0].get("code")
