"""A distributed Berth on one machine: the processes of the distributed form, started
as an operator would start them, for the integration tests, benchmarks and demos.

:class:`LocalCluster` writes a nova.conf (the bus URL and any options given), starts
``berth api`` processes, one ``berth compute --fleet`` and ``berth scheduler``
processes, waits until each says it serves, and stops them (SIGTERM, then SIGKILL)
when closed. Each process logs to its own file in the work directory.
:func:`rabbit_vhost` gives a run its own RabbitMQ virtual host (queues left behind by
one run cannot reach another), removed afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

RABBIT_HOST = "127.0.0.1"
RABBIT_PORT = 5672


def rabbit_unavailable() -> str | None:
    """Why a local RabbitMQ cannot be used (None when it can): the port, and
    ``rabbitmqctl`` for the virtual hosts."""
    try:
        with socket.create_connection((RABBIT_HOST, RABBIT_PORT), timeout=2):
            pass
    except OSError as exc:
        return f"RabbitMQ not reachable at {RABBIT_HOST}:{RABBIT_PORT}: {exc}"
    try:
        subprocess.run(["rabbitmqctl", "list_vhosts"], check=True, capture_output=True,
                       timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"rabbitmqctl cannot manage the local RabbitMQ: {exc}"
    return None


@contextlib.contextmanager
def rabbit_vhost(prefix: str = "berth") -> Iterator[str]:
    """A fresh RabbitMQ virtual host for guest; yields its transport URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    subprocess.run(["rabbitmqctl", "add_vhost", name], check=True, capture_output=True,
                   timeout=60)
    try:
        subprocess.run(["rabbitmqctl", "set_permissions", "-p", name, "guest", ".*", ".*", ".*"],
                       check=True, capture_output=True, timeout=60)
        yield f"rabbit://guest:guest@{RABBIT_HOST}:{RABBIT_PORT}/{name}"
    finally:
        subprocess.run(["rabbitmqctl", "delete_vhost", name], capture_output=True, timeout=60)


def restart_broker() -> None:
    """Stop and start the local RabbitMQ application (every connection drops)."""
    subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True, timeout=120)
    subprocess.run(["rabbitmqctl", "start_app"], check=True, capture_output=True, timeout=120)


#: Linux's range of ports for the local end of outgoing connections.
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_GIVEN: set[int] = set()
_GIVEN_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port nothing listens on now on 127.0.0.1, for a server started next.

    Not one the kernel hands out for ``bind(("127.0.0.1", 0))``: that comes from the
    ephemeral range, from which every outgoing connection's local port comes too, so
    between this check and the server's bind a connection to PostgreSQL or RabbitMQ
    may take it ("Address already in use", seen in a whole test run). A port from the
    10,000 below that range (or, when the range starts too low for that, from above
    it) is taken only by listeners; none is given out twice by one process, and two
    processes calling this at once draw from different shares of it (see
    :func:`_share`): a port one of them has checked but not yet bound is not the
    other's to check."""
    try:
        low, high = (int(v) for v in _EPHEMERAL.read_text().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    first, last = max(1024, low - 10000), low - 1
    if last - first < 1000:  # the range starts low (say 1024): take ports above it
        first, last = high + 1, 65535
    # A range that leaves under 100 ports outside it: only the kernel can choose.
    tries = 500 if last - first >= 100 else 0
    with _GIVEN_LOCK:
        if tries:
            first, last = _share(first, last)
        for _ in range(tries):
            port = random.randint(first, last)
            if port in _GIVEN:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _GIVEN.add(port)
            return port
    with socket.socket() as s:  # every one tried is taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: How many shares :func:`free_port`'s range is cut into, and where their locks live.
_SHARES = 8
_SHARE_LOCKS = Path(tempfile.gettempdir()) / "berth-free-ports"
#: The share this process holds: (pid, index, the open lock file), or None.
_held: tuple[int, int, Any] | None = None


def _share(first: int, last: int) -> tuple[int, int]:
    """This process's share of ``first``-``last``: the first of :data:`_SHARES` equal
    parts whose lock file it can lock (``flock``, kept until the process ends, so a
    process that dies gives its share back), or the whole range when every share is
    held or no lock can be taken. Two test workers (or a test run and a bench) then
    never check the same port at once. Called under ``_GIVEN_LOCK``."""
    global _held
    if _held is None or _held[0] != os.getpid():  # none yet, or inherited over a fork
        _held = None
        with contextlib.suppress(OSError):
            _SHARE_LOCKS.mkdir(exist_ok=True)
            for index in range(_SHARES):
                lock = open(_SHARE_LOCKS / f"share-{index}.lock", "a")  # noqa: SIM115 - kept open
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    lock.close()
                    continue
                _held = (os.getpid(), index, lock)
                break
    if _held is None:
        return first, last
    size = (last - first + 1) // _SHARES
    start = first + _held[1] * size
    return start, start + size - 1


@dataclass
class LocalCluster:
    """``apis`` API processes, a fleet of the cloud file's hosts, ``schedulers``
    scheduler processes, on ``db_url`` and ``transport_url``."""

    workdir: Path
    db_url: str
    transport_url: str
    cloud: Path
    schedulers: int = 4
    apis: int = 2
    #: nova.conf options: {"DEFAULT": {"report_interval": 2}, ...}
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    ready_timeout: float = 300.0
    #: Extra arguments of every ``berth api`` (``--build-timeout 20``, ...).
    api_args: tuple[str, ...] = ()
    #: Extra arguments of the ``berth compute`` fleet and of every ``berth scheduler``.
    compute_args: tuple[str, ...] = ()
    scheduler_args: tuple[str, ...] = ()
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    ready_lines: dict[str, str] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        """The nova.conf every process reads."""
        return self.workdir / "nova.conf"

    def write_conf(self) -> None:
        """Write nova.conf: the transport URL and the options."""
        groups: dict[str, dict[str, Any]] = {"DEFAULT": {"transport_url": self.transport_url}}
        for group, values in self.options.items():
            groups.setdefault(group, {}).update(values)
        lines = []
        for group, values in groups.items():
            lines.append(f"[{group}]")
            lines += [f"{k} = {v}" for k, v in values.items()]
            lines.append("")
        self.conf.write_text("\n".join(lines))

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(
            [sys.executable, "-m", "berth.cli", *args, "--db", self.db_url,
             "--config-file", str(self.conf)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        self.procs[name] = proc
        return proc

    def _wait_ready(self, name: str, marker: str) -> str:
        deadline = time.monotonic() + self.ready_timeout
        path = self.workdir / f"{name}.log"
        while time.monotonic() < deadline:
            text = path.read_text(errors="replace") if path.exists() else ""
            for line in text.splitlines():
                if line.startswith(marker):
                    self.ready_lines[name] = line
                    return line
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited ({self.procs[name].returncode}):\n{text[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"{name} not ready within {self.ready_timeout} s:\n"
                           f"{path.read_text(errors='replace')[-3000:]}")

    def start_api(self, name: str) -> str:
        """Start one API process; returns its URL once it listens."""
        port = free_port()
        self._spawn(name, "api", "--auth-strategy", "noauth2", "--port", str(port), "--cloud", str(self.cloud), *self.api_args)
        self._wait_ready(name, "listening on")
        self.urls[name] = f"http://127.0.0.1:{port}"
        return self.urls[name]

    def start_compute(self, name: str = "compute") -> str:
        """Start the fleet; returns its ready line (with the registration time)."""
        placement = [arg for url in self.urls.values()
                     for arg in ("--placement-url", url + "/placement")]
        self._spawn(name, "compute", "--fleet", str(self.cloud), *placement,
                    *self.compute_args)
        return self._wait_ready(name, "ready:")

    def start_scheduler(self, name: str) -> str:
        """Start one scheduler process; returns its ready line."""
        self._spawn(name, "scheduler", "--name", name, "--workers", "1", *self.scheduler_args)
        return self._wait_ready(name, "ready:")

    def start(self) -> None:
        """Every process, in order: APIs, the fleet, the schedulers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.write_conf()
        for i in range(self.apis):
            self.start_api(f"api{i}")
        self.start_compute()
        for i in range(self.schedulers):
            self.start_scheduler(f"scheduler{i}")

    def kill(self, name: str) -> None:
        """SIGKILL one process."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        self.urls.pop(name, None)

    def alive_urls(self) -> list[str]:
        """The URLs of the API processes still running."""
        return [u for n, u in self.urls.items() if self.procs[n].poll() is None]

    def log(self, name: str) -> str:
        """A process's log so far."""
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def wait_hosts(self, url: str, count: int, timeout: float = 120.0) -> None:
        """Until a scheduler behind ``url`` sees ``count`` hosts up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                hosts = httpx.get(url + "/hosts", timeout=30,
                                  headers={"X-Auth-Token": "admin"}).json()["hosts"]
                if sum(1 for h in hosts if h["up"]) >= count:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"fewer than {count} hosts up behind {url} after {timeout} s")

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 20 s)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
