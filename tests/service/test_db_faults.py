"""An unavailable database is retried where safe and otherwise a 503 with Retry-After,
never a 500: in the scheduler API and the Placement API.

SQLite: another connection really holds the write lock (``BEGIN EXCLUSIVE``) past the
server's busy timeout. PostgreSQL: a real ``berth serve`` process has its backends
terminated (``pg_terminate_backend``) again and again while requests flow.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from berth.service.api import SchedulerApp
from berth.service.localcluster import free_port
from berth.service.stack import Stack, open_stack

from .builders import node
from .conftest import TEST_CONFIG

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

PLACEMENT = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}
CONSUMER = "00000000-0000-4000-8000-0000000000c1"
TINY = {"flavor": {"vcpus": 1, "memory_mb": 512, "root_gb": 1}}


@pytest.fixture
def impatient(template_db: Path, tmp_path: Path) -> Iterator[tuple[Stack, Path]]:
    """A stack whose SQLite connections wait 0.3 s for a lock (not 30)."""
    from berth.placement.db import create_db_engine

    path = tmp_path / "berth.sqlite"
    shutil.copy(template_db, path)
    url = f"sqlite:///{path}?timeout=0.3"
    stack = open_stack(url, TEST_CONFIG, engine=create_db_engine(url))
    stack.register_hosts([node("h0"), node("h1")])
    yield stack, path
    stack.close()


@contextlib.contextmanager
def _write_lock(path: Path) -> Iterator[None]:
    """Another process's view: a connection holding SQLite's write lock."""
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=5)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_a_sqlite_lock_past_its_timeout_is_a_503_and_reads_still_work(
        impatient: tuple[Stack, Path]) -> None:
    stack, path = impatient
    service = stack.scheduler(seed=1)
    app = SchedulerApp(service, stack.conductor(service), stack.placement_app,
                       groups=stack.groups)
    api = httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://berth", headers=ADMIN)
    rp = stack.agents["h0"].uuid
    claim = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p",
             "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}
    with _write_lock(path):
        put = api.put(f"/placement/allocations/{CONSUMER}", json=claim, headers=PLACEMENT)
        assert put.status_code == 503 and put.headers["Retry-After"] == "2", put.text
        assert "the database is locked" in put.json()["errors"][0]["detail"]
        boot = api.post("/boot", json=TINY)
        assert boot.status_code == 503 and boot.headers["Retry-After"] == "2"
        assert boot.json()["error"]["code"] == "berth.unavailable"
        # WAL: readers do not wait for the writer.
        assert api.get("/placement/resource_providers", headers=PLACEMENT).status_code == 200
        assert api.get("/hosts").status_code == 200
    # Nothing was half-written: no allocation, no build record, and all works again.
    assert stack.client.get_allocations(CONSUMER).allocations == {}
    with stack.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM berth_builds")).scalar() == 0
    put = api.put(f"/placement/allocations/{CONSUMER}", json=claim, headers=PLACEMENT)
    assert put.status_code == 204
    assert api.post("/boot", json=TINY).status_code == 200


#: Room for ~10,000 tiny boots: the traffic must never fill the cloud (a NoValidHost
#: would be a 409), however fast the boots go (~900 in 5 s).
ROOMY_CLOUD = ('hosts:\n  - {host: "n{index}", count: 4, vcpus: 640, '
               'memory_mb: 5242880, local_gb: 20000}\n')


@contextlib.contextmanager
def _serve(tmp_path: Path, db: str) -> Iterator[tuple[Any, str]]:
    """A ``berth serve`` process on ``db`` with :data:`ROOMY_CLOUD`, once it answers;
    (the process, its URL)."""
    import os
    import subprocess
    import sys

    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(ROOMY_CLOUD)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "serve", "--auth-strategy", "noauth2",
         "--db", db, "--port", str(port), "--cloud", str(cloud)],
        # A file, not a pipe nobody reads: the access log of this much traffic would
        # fill a pipe and block the server.
        stdout=(tmp_path / "serve.log").open("w"), stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        yield proc, url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class _Traffic:
    """Threads calling the server until stopped, one per call kind: its answers as
    (status, Retry-After), and the text of every answer neither 200 nor 503."""

    def __init__(self, url: str, calls: tuple[str, ...], pause: float = 0.0) -> None:
        self.url, self.pause = url, pause
        self.answers: list[tuple[int, str | None]] = []
        self.odd: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(c,)) for c in calls]
        for thread in self.threads:
            thread.start()

    def _run(self, call: str) -> None:
        with httpx.Client(base_url=self.url, timeout=60, headers=ADMIN) as client:
            while not self.stop.is_set():
                if call == "boot":
                    r = client.post("/boot", json=TINY)
                elif call == "group":
                    r = client.post("/server-groups",
                                    json={"name": "g", "policy": "anti-affinity"})
                elif call == "hosts":
                    r = client.get("/hosts")
                else:
                    r = client.get("/placement/resource_providers", headers=PLACEMENT)
                self.answers.append((r.status_code, r.headers.get("retry-after")))
                if r.status_code not in (200, 503):
                    self.odd.append(f"{call} {r.status_code} {r.text[:300]}")
                time.sleep(self.pause)

    def finish(self, timeout: float = 60) -> list[int]:
        """Stop the threads; the statuses answered."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=timeout)
        return [status for status, _ in self.answers]


@pytest.mark.postgres
def test_terminated_postgres_backends_are_retried_or_503_never_500(tmp_path: Path) -> None:
    from pgdb import fresh_pg_database

    with fresh_pg_database("berth_faults") as db, _serve(tmp_path, db) as (proc, url):
        admin = sa.create_engine(db, isolation_level="AUTOCOMMIT")
        try:
            traffic = _Traffic(url, ("boot", "boot", "hosts", "providers"))
            for _ in range(5):
                time.sleep(0.8)
                with admin.connect() as conn:
                    conn.execute(sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
            time.sleep(0.5)
            statuses = traffic.finish()
            assert 500 not in statuses, sorted(set(statuses))
            assert set(statuses) <= {200, 503} and statuses.count(200) > 20, traffic.odd
            # Served normally afterwards, by the same process.
            assert httpx.post(url + "/boot", json=TINY, timeout=60, headers=ADMIN).status_code == 200
            assert proc.poll() is None
        finally:
            admin.dispose()


class _Outage:
    """A TCP relay to PostgreSQL that can go down: while down it refuses connections
    and has cut every open one, as a stopped or unreachable server would."""

    def __init__(self, target: tuple[str, int]) -> None:
        import socket

        self.socket = socket
        self.target = target
        self.port = free_port()
        self.pipes: list[Any] = []
        self.lock = threading.Lock()
        self.listener: Any = None
        self.up()

    def up(self) -> None:
        listener = self.socket.socket()
        listener.setsockopt(self.socket.SOL_SOCKET, self.socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        self.listener.close()
        with self.lock:
            pipes, self.pipes = self.pipes, []
        for sock in pipes:
            with contextlib.suppress(OSError):
                sock.shutdown(self.socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: Any) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = self.socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.pipes += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: Any, sink: Any) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.close()


def test_a_database_that_goes_down_is_503_and_served_again_when_it_is_back(
        tmp_path: Path) -> None:
    """The database stops answering and refuses new connections for a few seconds under
    a real ``berth serve`` with boots, group creations and both APIs' reads in flight:
    every answer is a success or a 503 with Retry-After (a connection that cannot be
    made was a 500), and the same process serves again once it is back."""
    from pgdb import fresh_pg_database

    with fresh_pg_database("berth_outage") as db:
        parsed = sa.engine.make_url(db)
        relay = _Outage((parsed.host or "127.0.0.1", parsed.port or 5432))
        relayed = parsed.set(port=relay.port).render_as_string(hide_password=False)
        try:
            with _serve(tmp_path, relayed) as (proc, url):
                traffic = _Traffic(url, ("boot", "group", "hosts", "providers"), pause=0.02)
                time.sleep(1.0)
                relay.down()
                time.sleep(3.0)
                relay.up()
                time.sleep(2.0)
                statuses = traffic.finish(timeout=90)
                assert not traffic.odd, traffic.odd[:5]
                assert 503 in statuses and statuses.count(200) > 20
                assert all(after for status, after in traffic.answers if status == 503)
                # Served normally afterwards, by the same process.
                assert httpx.post(url + "/boot", json=TINY, timeout=60,
                                  headers=ADMIN).status_code == 200
                assert proc.poll() is None
        finally:
            relay.down()
