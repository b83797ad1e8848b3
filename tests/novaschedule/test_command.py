"""``berth nova-scheduler --config-file nova.conf`` as a process: Nova's databases on
MariaDB, Berth's Placement API as Placement, RabbitMQ as the bus, and a client that calls
it as Nova's conductor does. Claims land in Placement; a refusal is NoValidHost; new
hosts appear without a restart, a new cell after SIGHUP; bad configuration is one line."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from berth.nova import hoststate as hs
from berth.nova.rpc import TOPIC
from berth.nova.service_row import SERVICE_TABLES, SERVICE_VERSION, service_rows
from berth.service.bus import Bus, _oslo_messaging
from berth.service.localcluster import rabbit_vhost

from .novadb import CELL2, mariadb_databases, mariadb_up, node_row, service_row
from .test_rpc import rabbit_up, spec

pytestmark = [
    pytest.mark.skipif(not rabbit_up(), reason="RabbitMQ is not running on 127.0.0.1:5672"),
    pytest.mark.skipif(not mariadb_up(), reason="MariaDB is not running on 127.0.0.1:3306"),
]
CELL1 = str(uuid.uuid4())
HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}


def free_port() -> int:
    from service.serving import free_port as port

    return port()


def wait_line(proc: subprocess.Popen[bytes], prefix: str, log: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        for line in text.splitlines():
            if line.startswith(prefix):
                return line
        assert proc.poll() is None, text
        time.sleep(0.2)
    raise AssertionError(f"no {prefix!r} line: {log.read_text()}")


def register(placement: str, node: dict[str, Any]) -> None:
    with httpx.Client(base_url=placement, headers=HEADERS, timeout=30) as http:
        assert http.post("/resource_providers", json={
            "uuid": node["uuid"], "name": node["hypervisor_hostname"]}).status_code == 200
        assert http.put(f"/resource_providers/{node['uuid']}/inventories", json={
            "resource_provider_generation": 0, "inventories": {
                "VCPU": {"total": node["vcpus"], "allocation_ratio": 4.0},
                "MEMORY_MB": {"total": node["memory_mb"]},
                "DISK_GB": {"total": node["local_gb"]}}}).status_code == 200


class _ComputeHeartbeats:
    """Stamps ``last_seen_up`` of every nova-compute row in a cell now and every
    ``interval`` seconds, in a thread, until ``stop``."""

    def __init__(self, engine: sa.Engine, interval: float = 5.0) -> None:
        self._engine = engine
        self._stopped = threading.Event()
        self.beat()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def beat(self) -> None:
        with self._engine.begin() as conn:
            conn.execute(sa.update(hs.services).where(
                hs.services.c.binary == "nova-compute").values(
                last_seen_up=sa.func.utc_timestamp(), updated_at=sa.func.utc_timestamp()))

    def _run(self, interval: float) -> None:
        while not self._stopped.wait(interval):
            self.beat()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    pytest.importorskip("pymysql", reason="PyMySQL is not installed")
    work = tmp_path_factory.mktemp("novasched")
    # A virtual host of its own: the scheduler topic's queue is named after the topic
    # alone, and test_rpc's scheduler may serve it at the same time.
    with mariadb_databases("api", "cell1", "cell2") as urls, \
            rabbit_vhost("berth_novasched") as rabbit:
        api = sa.create_engine(urls["api"])
        cell1 = sa.create_engine(urls["cell1"])
        hs.NOVA_TABLES.create_all(api, tables=[hs.cell_mappings, hs.aggregates,
                                               hs.aggregate_hosts, hs.aggregate_metadata])
        hs.NOVA_TABLES.create_all(cell1, tables=[hs.compute_nodes, hs.instances])
        SERVICE_TABLES.create_all(cell1)  # Nova's whole services table
        with api.begin() as conn:
            conn.execute(sa.insert(hs.cell_mappings), [
                {"id": 1, "uuid": hs.CELL0_UUID, "name": "cell0", "database_connection": "x://",
                 "disabled": False},
                {"id": 2, "uuid": CELL1, "name": "cell1",
                 "database_connection": "{scheme}://{username}@{hostname}:{port}/"
                 + urls["cell1"].rsplit("/", 1)[1], "disabled": False}])
        nodes = [node_row(i, f"a{i}", i) for i in (1, 2, 3)]
        with cell1.begin() as conn:
            conn.execute(sa.insert(hs.services), [
                service_row(1, "a1"), service_row(2, "a2", disabled=True), service_row(3, "a3")])
            conn.execute(sa.insert(hs.compute_nodes), nodes)
        # The compute services' heartbeats must stay fresh for ComputeFilter
        # (service_down_time 60 s) however long the module runs: stamp them now and every
        # few seconds, as each nova-compute does every report_interval.
        heartbeats = _ComputeHeartbeats(cell1)
        port = free_port()
        placement_log = work / "placement.log"
        with open(placement_log, "wb") as out:
            placement_proc = subprocess.Popen(
                [sys.executable, "-m", "berth.cli", "placement", "serve", "--auth-strategy",
                 "noauth2", "--port", str(port), "--db", f"sqlite:///{work}/placement.sqlite"],
                stdout=out, stderr=subprocess.STDOUT)
        placement = f"http://127.0.0.1:{port}"
        exchange = f"nova_test_{uuid.uuid4().hex[:8]}"
        conf = work / "nova.conf"
        conf.write_text(f"""[DEFAULT]
transport_url = {rabbit}
control_exchange = {exchange}
host = berth-sched-1
report_interval = 1
[api_database]
connection = {urls['api']}
[database]
connection = {urls['cell1']}
[placement]
endpoint_override = {placement}
[filter_scheduler]
host_subset_size = 1
# Nova's conductor makes the PCI request groups: its scheduler (and Berth in its
# place) takes the option and sends the groups it is given.
pci_in_placement = True
[scheduler]
workers = 1
""")
        log = work / "scheduler.log"
        proc = None
        bus = None
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(placement + "/", timeout=1)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, placement_log.read_text()
                    time.sleep(0.2)
            for node in nodes:
                register(placement, node)
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "berth.cli", "nova-scheduler", "--config-file",
                     str(conf), "--explain"], stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            ready = wait_line(proc, "ready:", log)
            bus = Bus(rabbit, exchange=exchange, timeout=30)
            om = _oslo_messaging()
            client = om.get_rpc_client(bus.transport, om.Target(topic=TOPIC, version="4.0"),
                                       timeout=30)
            yield {"client": client.prepare(version="4.5"), "om": om, "proc": proc,
                   "log": log, "ready": ready, "placement": placement, "api": api,
                   "urls": urls, "cell1": cell1, "nodes": nodes, "conf": conf}
        finally:
            heartbeats.stop()
            if bus is not None:
                bus.close()
            for p in (proc, placement_proc):
                if p is not None:
                    p.terminate()
                    p.wait(timeout=30)
            api.dispose()
            cell1.dispose()


def select(deployment: dict[str, Any], **spec_args: Any) -> tuple[str, Any]:
    instance = str(uuid.uuid4())
    primitive = spec(instance=instance, **spec_args)
    answer = deployment["client"].call({}, "select_destinations", spec_obj=primitive,
                                       instance_uuids=[instance], return_objects=True,
                                       return_alternates=True)
    return instance, answer


def test_it_starts_from_novas_databases(deployment: dict[str, Any]) -> None:
    assert deployment["ready"] == "ready: nova-scheduler berth-sched-1 with 3 compute nodes " \
                                  "in 1 cells"


def test_a_boot_is_placed_and_claimed_in_placement(deployment: dict[str, Any]) -> None:
    instance, answer = select(deployment)
    hosts = [s["nova_object.data"]["service_host"] for s in answer[0]]
    assert hosts[0] in {"a1", "a3"} and "a2" not in hosts  # a2's service is disabled
    chosen = answer[0][0]["nova_object.data"]
    assert chosen["nodename"] == f"{hosts[0]}.node"
    assert chosen["cell_uuid"] == CELL1
    held = httpx.get(f"{deployment['placement']}/allocations/{instance}", headers=HEADERS).json()
    assert held["allocations"][chosen["compute_node_uuid"]]["resources"] == {
        "VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}
    assert held["project_id"] == "p1" and held["user_id"] == "u1"
    # The decision was explained in the log, keyed by the instance.
    deadline = time.monotonic() + 10
    while f"[{instance}]" not in deployment["log"].read_text():
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_no_valid_host_reaches_the_caller(deployment: dict[str, Any]) -> None:
    with pytest.raises(deployment["om"].RemoteError) as caught:
        select(deployment, flavor_mb=10**6)
    assert caught.value.exc_type == "NoValidHost"


def test_hosts_appear_without_a_restart_and_a_cell_after_sighup(
        deployment: dict[str, Any]) -> None:
    # A new compute node in cell1: read by the next request.
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    # (Service id 40: the scheduler's own services row took the next free id.)
    node = node_row(4, "a4", 40, memory_mb=65536, free_ram_mb=65536, created_at=now,
                    updated_at=now)
    with deployment["cell1"].begin() as conn:
        conn.execute(sa.insert(hs.services), [service_row(40, "a4")])
        conn.execute(sa.insert(hs.compute_nodes), [node])
        conn.execute(sa.update(hs.services).values(last_seen_up=sa.func.utc_timestamp(),
                                                   updated_at=sa.func.utc_timestamp()))
    register(deployment["placement"], node)
    time.sleep(1.2)
    _, answer = select(deployment, flavor_mb=40000)
    assert answer[0][0]["nova_object.data"]["service_host"] == "a4"
    # A new cell: only after SIGHUP, as nova-scheduler reads cells at start and on reset.
    cell2 = sa.create_engine(deployment["urls"]["cell2"])
    hs.NOVA_TABLES.create_all(cell2, tables=[hs.compute_nodes, hs.services, hs.instances])
    big = node_row(1, "b1", 1, memory_mb=131072, free_ram_mb=131072)
    with cell2.begin() as conn:
        conn.execute(sa.insert(hs.services), [service_row(1, "b1")])
        conn.execute(sa.insert(hs.compute_nodes), [big])
        conn.execute(sa.update(hs.services).values(last_seen_up=sa.func.utc_timestamp(),
                                                   updated_at=sa.func.utc_timestamp()))
    cell2.dispose()
    with deployment["api"].begin() as conn:
        conn.execute(sa.insert(hs.cell_mappings), [{
            "id": 3, "uuid": CELL2, "name": "cell2",
            "database_connection": deployment["urls"]["cell2"], "disabled": False}])
    register(deployment["placement"], big)
    with pytest.raises(deployment["om"].RemoteError):
        select(deployment, flavor_mb=100000)
    deployment["proc"].send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while True:
        try:
            _, answer = select(deployment, flavor_mb=100000)
            break
        except deployment["om"].RemoteError:
            assert time.monotonic() < deadline, deployment["log"].read_text()
            time.sleep(0.5)
    chosen = answer[0][0]["nova_object.data"]
    assert (chosen["service_host"], chosen["cell_uuid"]) == ("b1", CELL2)


@pytest.mark.parametrize(("text", "message"), [
    ("[DEFAULT]\ntransport_url = rabbit://guest:guest@127.0.0.1:5672/\n",
     "[api_database] connection: not set (nova-scheduler reads cells and aggregates there)"),
    ("[api_database]\nconnection = sqlite://\n[placement]\n",
     "[placement]: neither auth_type nor endpoint_override is set"),
    ("[api_database]\nconnection = sqlite://\n[placement]\nendpoint_override = http://x\n",
     "cannot read Nova's databases: (sqlite3.OperationalError) no such table: cell_mappings"),
    ("[DEFAULT]\ntransport_url = fake:/\n[api_database]\nconnection = sqlite://\n"
     "[placement]\nendpoint_override = http://x\n",
     "[DEFAULT] transport_url: fake:/ is Berth's in-process bus; a Nova deployment's "
     "scheduler needs Nova's message bus"),
    ("[api_database]\nconnection = not a url\n[placement]\nendpoint_override = http://x\n",
     "[api_database] connection: Could not parse SQLAlchemy URL from given URL string"),
])
def test_bad_configuration_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "nova.conf"
    conf.write_text(text)
    done = subprocess.run([sys.executable, "-m", "berth.cli", "nova-scheduler",
                           "--config-file", str(conf)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"berth nova-scheduler: {message}"], done.stderr


def test_an_evacuated_instance_keeps_its_source_and_gets_a_destination(
        deployment: dict[str, Any]) -> None:
    """Nova's conductor asks for an evacuated instance's host with the instance as the
    consumer, which holds its source's allocations: the claim adds the destination and
    keeps the source (Nova's claim_resources), where a new-consumer claim was refused on
    every host (NoValidHost)."""
    instance, answer = select(deployment)
    source = answer[0][0]["nova_object.data"]
    primitive = spec(instance=instance)
    primitive["nova_object.data"]["ignore_hosts"] = [source["service_host"]]
    moved = deployment["client"].call({}, "select_destinations", spec_obj=primitive,
                                      instance_uuids=[instance], return_objects=True,
                                      return_alternates=False)
    dest = moved[0][0]["nova_object.data"]
    assert dest["service_host"] != source["service_host"]
    held = httpx.get(f"{deployment['placement']}/allocations/{instance}", headers=HEADERS).json()
    assert set(held["allocations"]) == {source["compute_node_uuid"], dest["compute_node_uuid"]}


def test_a_zone_is_not_checked_again_behind_novas_api(deployment: dict[str, Any]) -> None:
    """Nova's API refuses a zone no service is in; its scheduler takes the request as it
    comes (no aggregate has the zone: no restriction, and AvailabilityZoneFilter is not
    among the default filters), so an unshelve into a zone that lost its hosts is placed
    or refused with NoValidHost, not an error of another kind."""
    primitive = spec(instance=str(uuid.uuid4()))
    primitive["nova_object.data"]["availability_zone"] = "nowhere"
    instance = primitive["nova_object.data"]["instance_uuid"]
    answer = deployment["client"].call({}, "select_destinations", spec_obj=primitive,
                                       instance_uuids=[instance], return_objects=True,
                                       return_alternates=False)
    assert answer[0][0]["nova_object.data"]["service_host"] != "a2"  # disabled


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, processes: int) -> None:
    """Until ``processes`` "ready" lines are in ``log`` (each process writes one)."""
    deadline = time.monotonic() + 60
    while log.read_text().count("ready: nova-scheduler") < processes:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


def _two_processes(deployment: dict[str, Any], base: Path
                   ) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """``berth nova-scheduler`` with ``[scheduler] workers = 2``, both processes ready:
    (the first process, its nova.conf, its log)."""
    conf, log = base.with_suffix(".conf"), base.with_suffix(".log")
    conf.write_text(deployment["conf"].read_text() + "[scheduler]\nworkers = 2\n")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "berth.cli", "nova-scheduler", "--config-file", str(conf)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _wait_ready(proc, log, 2)
    return proc, conf, log


def test_scheduler_workers_start_that_many_processes_and_stop_with_the_first(
        deployment: dict[str, Any], tmp_path: Path) -> None:
    """``[scheduler] workers`` forks that many processes, as nova-scheduler does; each
    reads Nova's databases and serves the topic; one that dies is started again;
    SIGTERM to the first stops them all."""
    proc, conf, log = _two_processes(deployment, tmp_path / "workers")
    try:
        for _ in range(4):  # served by whichever process takes them
            instance, answer = select(deployment)
            assert answer[0][0]["nova_object.data"]["service_host"]
        # A worker that dies is started again, as Nova's launcher does.
        worker = subprocess.run(["pgrep", "-f", "--", f"--worker-index 1 --config-file {conf}"],
                                capture_output=True, text=True).stdout.split()
        assert len(worker) == 1, worker
        os.kill(int(worker[0]), signal.SIGKILL)
        _wait_ready(proc, log, 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    out = subprocess.run(["pgrep", "-f", str(conf)], capture_output=True,
                         text=True)
    assert out.stdout.strip() == "", "a worker process outlived the first"


def test_scheduler_workers_do_not_outlive_a_first_process_that_was_killed(
        deployment: dict[str, Any], tmp_path: Path) -> None:
    """SIGKILL (or the OOM killer) takes the first process without its clean-up: the
    others notice and stop, rather than serve on beside the next start's."""
    proc, conf, _ = _two_processes(deployment, tmp_path / "killed")
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-f", str(conf)], capture_output=True,
                         text=True).stdout.strip():
        assert time.monotonic() < deadline, "a worker process outlived the killed first one"
        time.sleep(0.5)


def test_the_scheduler_keeps_its_services_row_as_nova_scheduler(
        deployment: dict[str, Any]) -> None:
    """Its own row in the services table of [database] connection (binary
    nova-scheduler, topic scheduler, Nova 34's service version), heartbeat every
    report_interval, so `openstack compute service list` shows it up; the compute
    services' rows are not touched, and the host state reads none of it."""
    cell1 = deployment["cell1"]

    def row() -> Any:
        with cell1.connect() as conn:
            return conn.execute(sa.select(service_rows).where(
                service_rows.c.binary == "nova-scheduler")).mappings().all()

    (first,) = row()
    assert (first["host"], first["topic"], first["version"], first["deleted"]) == (
        "berth-sched-1", "scheduler", SERVICE_VERSION, 0)
    assert uuid.UUID(first["uuid"])
    deadline = time.monotonic() + 20
    while row()[0]["report_count"] < first["report_count"] + 2:
        assert time.monotonic() < deadline, deployment["log"].read_text()
        time.sleep(0.5)
    (later,) = row()
    assert later["last_seen_up"] is not None and later["id"] == first["id"]
    # The scheduler's row is no host of the feed.
    hosts = {s["nova_object.data"]["service_host"] for s in select(deployment)[1][0]}
    assert hosts and "berth-sched-1" not in hosts


def test_novas_pci_request_groups_claim_a_device_of_the_provider_the_pool_is_tagged_with(
        deployment: dict[str, Any]) -> None:
    """``pci_in_placement = True`` (this deployment's nova.conf): Nova's conductor sends
    a flavor's PCI alias request with its request group (``{request_id}-0``, one device
    of the alias's class from one provider). Berth asks placement for it, so only the
    host whose PF provider has the class is a candidate; the claim takes one device
    there, and PciPassthroughFilter matched the pool tagged with that provider."""
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    pf = str(uuid.uuid4())
    pools = {"nova_object.name": "PciDevicePoolList", "nova_object.namespace": "nova",
             "nova_object.version": "1.1", "nova_object.data": {"objects": [{
                 "nova_object.name": "PciDevicePool", "nova_object.namespace": "nova",
                 "nova_object.version": "1.1", "nova_object.data": {
                     "vendor_id": "8086", "product_id": "1563", "numa_node": None, "count": 2,
                     "tags": {"dev_type": "type-PF", "rp_uuid": pf}}}]}}
    node = node_row(5, "p1", 41, created_at=now, updated_at=now, pci_stats=json.dumps(pools))
    with deployment["cell1"].begin() as conn:
        conn.execute(sa.insert(hs.services), [service_row(41, "p1")])
        conn.execute(sa.insert(hs.compute_nodes), [node])
        conn.execute(sa.update(hs.services).values(last_seen_up=sa.func.utc_timestamp(),
                                                   updated_at=sa.func.utc_timestamp()))
    register(deployment["placement"], node)
    with httpx.Client(base_url=deployment["placement"], headers=HEADERS, timeout=30) as http:
        assert http.post("/resource_providers", json={
            "uuid": pf, "name": "p1.node_0000:81:00.0",
            "parent_provider_uuid": node["uuid"]}).status_code == 200
        assert http.put("/resource_classes/CUSTOM_PCI_8086_1563").status_code in (201, 204)
        assert http.put(f"/resource_providers/{pf}/inventories", json={
            "resource_provider_generation": 0,
            "inventories": {"CUSTOM_PCI_8086_1563": {"total": 2}}}).status_code == 200
    time.sleep(1.2)
    request_id = str(uuid.uuid4())
    instance = str(uuid.uuid4())
    primitive = spec(instance=instance)
    data = primitive["nova_object.data"]
    data["flavor"]["nova_object.data"]["extra_specs"] = {"pci_passthrough:alias": "nic:1"}
    data["pci_requests"] = {
        "nova_object.name": "InstancePCIRequests", "nova_object.namespace": "nova",
        "nova_object.version": "1.1", "nova_object.data": {"requests": [{
            "nova_object.name": "InstancePCIRequest", "nova_object.namespace": "nova",
            "nova_object.version": "1.4", "nova_object.data": {
                "alias_name": "nic", "count": 1, "numa_policy": None,
                "request_id": request_id,
                "spec": [{"vendor_id": "8086", "product_id": "1563"}]}}]}}
    data["requested_resources"] = [{
        "nova_object.name": "RequestGroup", "nova_object.namespace": "nova",
        "nova_object.version": "1.3", "nova_object.data": {
            "use_same_provider": True, "requester_id": f"{request_id}-0",
            "resources": {"CUSTOM_PCI_8086_1563": 1}, "required_traits": [],
            "forbidden_traits": [], "aggregates": [], "forbidden_aggregates": [],
            "in_tree": None, "provider_uuids": []}}]
    answer = deployment["client"].call({}, "select_destinations", spec_obj=primitive,
                                       instance_uuids=[instance], return_objects=True,
                                       return_alternates=True)
    chosen = [s["nova_object.data"] for s in answer[0]]
    assert [s["service_host"] for s in chosen] == ["p1"]  # no other host has the class
    request = json.loads(chosen[0]["allocation_request"])
    assert request["mappings"][f"{request_id}-0"] == [pf]
    held = httpx.get(f"{deployment['placement']}/allocations/{instance}", headers=HEADERS).json()
    assert held["allocations"][pf]["resources"] == {"CUSTOM_PCI_8086_1563": 1}
    assert held["allocations"][node["uuid"]]["resources"] == {
        "VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}
