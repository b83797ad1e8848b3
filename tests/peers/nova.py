"""A real multi-process Nova 34 as a peer, for the drop-in scheduler tests.

From its own environment (``.venv-nova``, ``make nova-env``): nova-api (served by
waitress), nova-conductor, several nova-compute on fake virt drivers, and the scheduler
under test. The scheduler is either the real ``nova-scheduler`` or ``berth nova-scheduler``.
All of them run on MariaDB and RabbitMQ as on this machine. Beside them:

* Keystone (:mod:`peers.keystone`; Nova 34's API has no noauth2 any more): nova-api
  validates the tests' tokens there;
* Berth's own Placement API (``berth placement serve``), protected by that Keystone and
  listed in its catalog: Nova's services and the scheduler find it there and
  authenticate with ``[placement]`` password credentials, as in a real deployment;
* stand-ins for Glance and Neutron (:mod:`peers.novafakes`).

Each run has its own RabbitMQ virtual host and its own databases
(``berthnova_<random>_api``, ``_cell0``, ``_cell1``); stopping removes both. Berth never
imports Nova: everything here talks to it over HTTP, AMQP and SQL.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from berth.service.localcluster import free_port
from peers import ROOT, serve, stop, wait_up

VENV = ROOT / ".venv-nova"
TESTS = ROOT / "tests"
MARIADB = "mysql+pymysql://root@127.0.0.1:3306/{}"
RABBIT = "rabbit://guest:guest@127.0.0.1:5672/{}"


def _up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def available() -> str | None:
    """Why the stack cannot run here, or None."""
    if not (VENV / "bin" / "nova-conductor").exists():
        return f"no Nova environment at {VENV} (make test builds it: make nova-env)"
    from peers import keystone

    why = keystone.available()
    if why:
        return why
    if not _up(5672):
        return "RabbitMQ is not running on 127.0.0.1:5672 (rabbitmq-server -detached)"
    if not _up(3306):
        return "MariaDB is not running on 127.0.0.1:3306"
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not on PATH (a virtual host per run is made with it)"
    try:
        import pymysql  # noqa: F401
    except ImportError:
        return "PyMySQL is not installed (make install)"
    return None


@dataclass
class Compute:
    """One nova-compute: its host name and fake driver (``fake.SmallFakeDriver``: 2
    vCPU, 8 GiB, 1 TB), and extra ``[DEFAULT]`` options."""

    host: str
    driver: str = "fake.SmallFakeDriver"
    options: dict[str, str] = field(default_factory=dict)


@dataclass
class NovaStack:
    """The running stack (see the module's docstring)."""

    workdir: Path
    computes: list[Compute]
    #: "nova" (the real nova-scheduler) or "berth" (berth nova-scheduler).
    scheduler: str = "berth"
    #: Options added to every service's nova.conf: {section: {option: value}}.
    options: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Scheduler processes side by side (calls shared round-robin on topic scheduler).
    schedulers: int = 1
    run: str = field(default_factory=lambda: f"berthnova_{uuid.uuid4().hex[:8]}")
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    keystone: Any = None

    # ---------------------------------------------------------------- places
    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def placement_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['placement']}"

    @property
    def transport_url(self) -> str:
        return RABBIT.format(self.run)

    def db(self, name: str) -> str:
        return MARIADB.format(f"{self.run}_{name}")

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    # ---------------------------------------------------------------- start
    def start(self) -> NovaStack:
        """Every service up and the computes mapped. What does not wait on anything else
        runs side by side (the nova-manage runs beside Keystone and Placement starting, the
        schedulers beside the API and the computes' registration): each step is mostly a
        Python interpreter importing Nova, and one after the other they took about a
        minute."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in ("api", "placement", "glance", "neutron"):
            self.ports[name] = free_port()
        from peers.keystone import Keystone

        self.keystone = Keystone(self.workdir / "keystone")
        self._broker()
        self._databases()
        self._write_conf()
        with ThreadPoolExecutor(1, thread_name_prefix="nova-manage") as pool:
            sync = pool.submit(self._sync)
            try:
                self.keystone.start()
                self._fakes()
                self._placement()
            finally:
                sync.result()
        self._spawn("conductor", [str(VENV / "bin" / "nova-conductor"), "--config-file",
                                  str(self.workdir / "nova.conf")])
        for compute in self.computes:
            conf = self.workdir / f"{compute.host}.conf"
            extra = "".join(f"{k} = {v}\n" for k, v in compute.options.items())
            (self.workdir / compute.host).mkdir(exist_ok=True)
            conf.write_text(f"[DEFAULT]\nhost = {compute.host}\ncompute_driver = "
                            f"{compute.driver}\nstate_path = {self.workdir / compute.host}\n"
                            f"instances_path = {self.workdir / compute.host}/instances\n{extra}")
            self._spawn(f"compute-{compute.host}", [
                str(VENV / "bin" / "nova-compute"), "--config-file",
                str(self.workdir / "nova.conf"), "--config-file", str(conf)])
        self._spawn_schedulers()
        self._api()
        self._discover()
        self._wait_scheduler()
        return self

    def _broker(self) -> None:
        for args in (["add_vhost", self.run],
                     ["set_permissions", "-p", self.run, "guest", ".*", ".*", ".*"]):
            subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True,
                           timeout=60)

    def _databases(self) -> None:
        import sqlalchemy as sa

        admin = sa.create_engine(MARIADB.format(""))
        with admin.begin() as conn:
            for name in ("api", "cell0", "cell1"):
                conn.execute(sa.text(f"CREATE DATABASE {self.run}_{name} CHARACTER SET utf8mb4"))
        admin.dispose()

    def _fakes(self) -> None:
        for kind in ("glance", "neutron"):
            with open(self.log(kind), "ab") as out:
                self.procs[kind] = subprocess.Popen(
                    [sys.executable, "-m", "peers.novafakes", kind, str(self.ports[kind])],
                    cwd=TESTS, stdout=out, stderr=out)
            self._wait_port(self.ports[kind], kind)

    def _placement(self) -> None:
        conf = self.workdir / "placement.conf"
        conf.write_text("[api]\nauth_strategy = keystone\n" + self.keystone.authtoken_section())
        with open(self.log("placement"), "ab") as out:
            self.procs["placement"] = subprocess.Popen(
                [sys.executable, "-m", "berth.cli", "placement", "serve", "--config-file",
                 str(conf), "--port", str(self.ports["placement"]), "--db",
                 f"sqlite:///{self.workdir}/placement.sqlite"], stdout=out, stderr=out)
        wait_up(self.placement_url + "/", self.procs["placement"], self.log("placement"))
        self.keystone.add_endpoint("placement", "placement", self.placement_url)

    def placement_headers(self) -> dict[str, str]:
        """Headers of an admin's call to Placement."""
        return {"X-Auth-Token": self.keystone.token("admin"),
                "OpenStack-API-Version": "placement 1.39"}

    def _write_conf(self) -> None:
        shutil.copy(VENV / "etc" / "nova" / "api-paste.ini", self.workdir / "api-paste.ini")
        sections: dict[str, dict[str, str]] = {
            "DEFAULT": {"transport_url": self.transport_url, "my_ip": "127.0.0.1",
                        "compute_driver": "fake.SmallFakeDriver",
                        "state_path": str(self.workdir / "state"),
                        "instances_path": str(self.workdir / "instances"),
                        "report_interval": "2", "service_down_time": "30",
                        # The resource trackers' periodic update every 5 s, not every
                        # 60: a compute's running_vms counts a deleted server until it
                        # runs, and scenarios wait for empty hosts (35 s a wait).
                        "update_resources_interval": "5",
                        "rpc_response_timeout": "60", "debug": "false"},
            "api": {"auth_strategy": "keystone"},
            "api_database": {"connection": self.db("api")},
            "database": {"connection": self.db("cell1")},
            "placement": {"auth_type": "password", "auth_url": self.keystone.url,
                          "username": "berth", "password": "secret",
                          "project_name": "service", "user_domain_name": "Default",
                          "project_domain_name": "Default", "region_name": "RegionOne",
                          "valid_interfaces": "public"},
            "glance": {"endpoint_override": f"http://127.0.0.1:{self.ports['glance']}",
                       "num_retries": "0"},
            "neutron": {"auth_type": "admin_token", "token": "admin",
                        "endpoint_override": f"http://127.0.0.1:{self.ports['neutron']}"},
            "oslo_concurrency": {"lock_path": str(self.workdir / "lock")},
            # One scheduler process (unset: one per CPU, for either scheduler).
            "scheduler": {"discover_hosts_in_cells_interval": "-1", "workers": "1"},
            "wsgi": {"api_paste_config": str(self.workdir / "api-paste.ini")},
            "filter_scheduler": {"host_subset_size": "1"},
            "oslo_messaging_rabbit": {"heartbeat_timeout_threshold": "0"},
        }
        for section, values in self.options.items():
            sections.setdefault(section, {}).update(values)
        text = "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in opts.items()) + "\n"
                       for s, opts in sections.items())
        text += self.keystone.authtoken_section()
        (self.workdir / "nova.conf").write_text(text)

    def manage(self, *args: str, timeout: float = 600) -> str:
        """``nova-manage`` with this stack's nova.conf; its output."""
        done = subprocess.run([str(VENV / "bin" / "nova-manage"), "--config-file",
                               str(self.workdir / "nova.conf"), *args], capture_output=True,
                              text=True, timeout=timeout)
        with open(self.log("manage"), "a") as out:
            out.write(f"$ nova-manage {' '.join(args)}\n{done.stdout}{done.stderr}\n")
        if done.returncode not in (0, 1):  # discover_hosts answers 1 when nothing is new
            raise RuntimeError(f"nova-manage {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout

    def _sync(self) -> None:
        self.manage("api_db", "sync")
        self.manage("cell_v2", "map_cell0", "--database_connection", self.db("cell0"))
        self.manage("cell_v2", "create_cell", "--name", "cell1", "--database_connection",
                    self.db("cell1"), "--transport-url", self.transport_url)
        self.manage("db", "sync")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.log(name), "ab") as out:
            self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=out, cwd=self.workdir,
                                                env={**os.environ, **(env or {})})

    def _api(self) -> None:
        env = {"OS_NOVA_CONFIG_DIR": str(self.workdir), "PATH": os.environ["PATH"]}
        self.procs["api"] = serve(VENV, "nova-api", "nova.wsgi.osapi_compute",
                                  self.ports["api"], self.workdir, env, self.log("api"))
        wait_up(self.api_url + "/", self.procs["api"], self.log("api"), timeout=120)

    def _discover(self, timeout: float = 120) -> None:
        """Until every compute's node is in Placement and mapped to cell1."""
        deadline = time.monotonic() + timeout
        want = len(self.computes)
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                providers = httpx.get(self.placement_url + "/resource_providers",
                                      headers=self.placement_headers(), timeout=5).json()
                if len(providers.get("resource_providers", [])) >= want:
                    self.manage("cell_v2", "discover_hosts")
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError("the computes did not register in Placement in time")

    def start_scheduler(self) -> None:
        self._spawn_schedulers()
        self._wait_scheduler()

    def _spawn_schedulers(self) -> None:
        conf = str(self.workdir / "nova.conf")
        for i in range(1, self.schedulers + 1):
            name = "scheduler" if i == 1 else f"scheduler-{i}"
            host = ["--host", f"{self.scheduler}-sched-{i}"] if self.scheduler == "berth" else []
            if self.scheduler == "nova":
                self._spawn(name, [str(VENV / "bin" / "nova-scheduler"), "--config-file", conf])
            else:
                self._spawn(name, [sys.executable, "-m", "berth.cli", "nova-scheduler",
                                   "--config-file", conf, "--explain", *host],
                            env={"PYTHONUNBUFFERED": "1"})

    def _wait_scheduler(self, timeout: float = 120) -> None:
        """Until a scheduler consumes topic ``scheduler``: a call of a method no scheduler
        has comes back as NoSuchMethod only once one listens."""
        sys.path.insert(0, str(ROOT / "src"))
        from berth.service.bus import Bus, _oslo_messaging

        bus = Bus(self.transport_url, exchange="nova", timeout=5)
        om = _oslo_messaging()
        client = om.get_rpc_client(bus.transport, om.Target(topic="scheduler", version="4.0"),
                                   timeout=5)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    client.call({}, "berth_probe")
                except om.MessagingTimeout:
                    continue
                except Exception:
                    return
            raise RuntimeError("no scheduler consumed topic scheduler in time")
        finally:
            bus.close()

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: "
                                   f"{self.log(name).read_text(errors='replace')[-3000:]}")

    def _wait_port(self, port: int, name: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not _up(port):
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not listen on {port}")
            time.sleep(0.1)

    def stop_scheduler(self) -> None:
        for name in [n for n in self.procs if n.startswith("scheduler")]:
            stop(self.procs.pop(name))

    # ---------------------------------------------------------------- the API
    def client(self, user: str = "admin") -> httpx.Client:
        """A client of nova-api with a Keystone token of ``user`` (the admin by default),
        at microversion 2.95."""
        return httpx.Client(base_url=self.api_url + "/v2.1", timeout=60, headers={
            "X-Auth-Token": self.keystone.token(user), "X-OpenStack-Nova-API-Version": "2.95",
            "Content-Type": "application/json"})

    # ---------------------------------------------------------------- stop
    def stop(self) -> None:
        # Every service is asked to stop at once, then each is waited for (one after the
        # other, each could take its full grace time).
        procs = [self.procs.pop(name) for name in list(self.procs)]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            stop(proc)
        if self.keystone is not None:
            self.keystone.stop()
        try:
            import sqlalchemy as sa

            admin = sa.create_engine(MARIADB.format(""))
            with admin.begin() as conn:
                for name in ("api", "cell0", "cell1"):
                    conn.execute(sa.text(f"DROP DATABASE IF EXISTS {self.run}_{name}"))
            admin.dispose()
        finally:
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", self.run], capture_output=True,
                           timeout=60)

    def __enter__(self) -> NovaStack:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
