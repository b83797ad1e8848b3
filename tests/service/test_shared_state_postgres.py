"""Shared state between real ``berth serve`` processes on one PostgreSQL database.

* Boots racing through two servers into hard anti-affinity and affinity groups end with
  0 policy violations, counted in SQL from the members' allocations.
* ``kill -9`` of a server with builds in flight: the other server's reconciler releases
  their claims and group memberships (checked in SQL and through the Placement API).
* A restart with the same ``--seed`` on the same database issues new uuids, and every
  instance keeps its own allocation.

Skipped when PostgreSQL is not reachable.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from berth.service.localcluster import free_port
from pgdb import fresh_pg_database

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

pytestmark = pytest.mark.postgres

HOSTS = 6
CLOUD = f"""
hosts:
  - {{host: "n{{index}}", count: {HOSTS}, vcpus: 16, memory_mb: 16896, local_gb: 200}}
server_groups:
  - {{name: spread, policy: anti-affinity}}
  - {{name: pack, policy: affinity}}
"""
PLACEMENT_HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_pg_database("berth_state") as url:
        yield url


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[str]]]:
    """Servers started by a test, stopped (or reaped) after it."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _start(procs: list[subprocess.Popen[str]], db: str, *args: str) -> str:
    """Start ``berth serve`` on ``db``; its URL once it answers."""
    port = free_port()
    # Output to a file, not a pipe nobody reads: the access log of many boots would fill
    # a pipe and block the server.
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (lives as long as the server)
    proc = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "serve", "--auth-strategy", "noauth2", "--db", db, "--port", str(port), *args],
        stdout=log, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(log.read())
    raise AssertionError("berth serve did not come up")


def _boot(url: str, group: str | None = None, num: int = 1) -> httpx.Response:
    # Inline: a server started without the cloud file knows no flavor "tiny".
    body: dict[str, Any] = {"flavor": {"name": "tiny", "vcpus": 1, "memory_mb": 512,
                                       "root_gb": 1}, "num": num}
    if group:
        body["hints"] = {"group": group}
    return httpx.post(url + "/boot", json=body, timeout=120, headers=ADMIN)


def _wait_for(what: Callable[[], bool], seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.2)
    raise AssertionError(message)


def _placements(engine: sa.Engine) -> dict[str, set[str]]:
    """Consumer -> the compute nodes (root provider names) its allocations are on."""
    rows = sa.text(
        "SELECT a.consumer_id, root.name FROM allocations a "
        "JOIN resource_providers rp ON rp.id = a.resource_provider_id "
        "JOIN resource_providers root ON root.id = COALESCE(rp.root_provider_id, rp.id)")
    out: dict[str, set[str]] = {}
    with engine.connect() as conn:
        for consumer, name in conn.execute(rows):
            out.setdefault(consumer, set()).add(name)
    return out


def _members(engine: sa.Engine, name: str) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT m.instance_uuid FROM berth_server_group_members m "
            "JOIN berth_server_groups g ON g.uuid = m.group_uuid WHERE g.name = :n "
            "ORDER BY m.id"), {"n": name}).scalars())


def _cloud(tmp_path: Path) -> str:
    path = tmp_path / "cloud.yaml"
    path.write_text(CLOUD)
    return str(path)


def test_boots_racing_through_two_servers_keep_hard_group_policies(
        pg_url: str, tmp_path: Path, servers: list[subprocess.Popen[str]]) -> None:
    urls = [_start(servers, pg_url, "--cloud", _cloud(tmp_path)),
            _start(servers, pg_url, "--no-resume")]
    # 2 x HOSTS single boots into anti-affinity (at most HOSTS can succeed), two
    # multi-creates into it, and 8 boots into affinity: all through both servers at once.
    jobs = [("spread", 1)] * (2 * HOSTS) + [("spread", 2)] * 2 + [("pack", 1)] * 8
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: _boot(urls[job[1] % 2], *job[0]),
                                [(j, i) for i, j in enumerate(jobs)]))
    assert {a.status_code for a in answers} <= {200, 409}, [a.text for a in answers]
    engine = sa.create_engine(pg_url)
    try:
        where = _placements(engine)
        spread = [next(iter(where[m])) for m in _members(engine, "spread")]
        pack = {next(iter(where[m])) for m in _members(engine, "pack")}
        # Every member holds an allocation on one node; 0 violations.
        assert all(len(where[m]) == 1 for m in _members(engine, "spread") + _members(engine, "pack"))
        assert len(spread) == len(set(spread)) and 0 < len(spread) <= HOSTS
        assert len(pack) == 1
        built = [i["instance_uuid"] for a in answers for i in a.json().get("instances", [])]
        assert sorted(built) == sorted(where)  # no allocation without a built instance
        with engine.connect() as conn:
            states = dict(conn.execute(sa.text(
                "SELECT state, count(*) FROM berth_builds GROUP BY state")).all())
        assert states.get("building", 0) == 0 and states["active"] == len(built)
    finally:
        engine.dispose()


def test_a_killed_server_s_builds_in_flight_are_released_by_the_other(
        pg_url: str, tmp_path: Path, servers: list[subprocess.Popen[str]]) -> None:
    fast = ("--build-timeout", "2", "--reconcile-interval", "0.3")
    doomed = _start(servers, pg_url, "--cloud", _cloud(tmp_path), "--build-delay", "30", *fast)
    survivor = _start(servers, pg_url, "--no-resume", *fast)
    engine = sa.create_engine(pg_url)
    try:
        threading.Thread(target=lambda: _safe(lambda: _boot(doomed, "spread", num=3)),
                         daemon=True).start()

        def claimed() -> bool:
            with engine.connect() as conn:
                return bool(conn.execute(sa.text(
                    "SELECT count(*) FROM berth_builds b JOIN allocations a "
                    "ON a.consumer_id = b.instance_uuid WHERE b.state = 'building'")).scalar())

        _wait_for(claimed, 30, "the boot never got to claim")
        with engine.connect() as conn:
            flying = [u for (u,) in conn.execute(sa.text(
                "SELECT instance_uuid FROM berth_builds WHERE state = 'building'"))]
        assert len(flying) == 3 and set(flying) <= set(_members(engine, "spread"))
        servers[0].send_signal(signal.SIGKILL)
        servers[0].wait(timeout=30)

        def released() -> bool:
            return not set(flying) & set(_placements(engine))

        _wait_for(released, 30, "the survivor never released the dead server's claims")
        # The same pass removes the never-built members next (after the allocations).
        _wait_for(lambda: _members(engine, "spread") == [], 30,
                  "the survivor never removed the dead server's members")
        with engine.connect() as conn:
            states = {u: s for u, s in conn.execute(sa.text(
                "SELECT instance_uuid, state FROM berth_builds"))}
        assert all(states[u] == "failed" for u in flying)
        for uuid in flying:
            answer = httpx.get(f"{survivor}/placement/allocations/{uuid}",
                               headers=PLACEMENT_HEADERS, timeout=10)
            assert answer.status_code == 200 and answer.json()["allocations"] == {}
        # The survivor still boots (the dead server's hosts are up until
        # service_down_time), and nothing is left for the audit.
        assert _boot(survivor, "spread").status_code == 200
        audit = subprocess.run([sys.executable, "-m", "berth.cli", "audit", "--db", pg_url,
                                "--json"], capture_output=True, text=True, timeout=60)
        findings = json.loads(audit.stdout)["findings"]
        assert findings["leaked"] == [] and findings["orphaned"] == [], findings
    finally:
        engine.dispose()


def test_a_restart_with_the_same_seed_never_reissues_a_uuid(
        pg_url: str, tmp_path: Path, servers: list[subprocess.Popen[str]]) -> None:
    url = _start(servers, pg_url, "--cloud", _cloud(tmp_path), "--seed", "5")
    before = [i["instance_uuid"] for i in _boot(url, num=3).json()["instances"]]
    servers[0].terminate()
    servers[0].communicate(timeout=30)
    url = _start(servers, pg_url, "--seed", "5")
    after = [i["instance_uuid"] for i in _boot(url, num=3).json()["instances"]]
    assert len(set(before) | set(after)) == 6
    engine = sa.create_engine(pg_url)
    try:
        where = _placements(engine)
        assert all(len(where[u]) == 1 for u in before + after)
    finally:
        engine.dispose()


def _safe(call: Callable[[], Any]) -> None:
    """Run ``call``; the connection dies with the server, which is the point."""
    with contextlib.suppress(httpx.HTTPError):
        call()
