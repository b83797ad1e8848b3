"""The distributed form under load and faults, as an operator runs it.

Real processes on RabbitMQ and PostgreSQL: 2 ``berth api``, 4 ``berth scheduler``, a
``berth compute --fleet`` of 500 hosts. Thousands of boots (three flavors,
multi-creates, hard anti-affinity and affinity groups) are pushed from client threads
until capacity runs out; meanwhile a scheduler and an API process are SIGKILLed and the
broker restarts once. Then, in SQL and through the Placement API: no over-commit, no
group-policy violation, every built instance holds exactly one allocation on its host,
every instance a client was told was built exists, no allocation is left without an
instance once the surviving API process's reconciler has released the claims of the
boots the killed one had in flight (``berth audit`` finds nothing), and every host is
up again.

``BERTH_DISTRIBUTED_HOSTS`` (default 500) scales the fleet for a bigger run.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from berth.placement.client import PlacementClient
from berth.service.localcluster import (
    LocalCluster,
    rabbit_unavailable,
    rabbit_vhost,
    restart_broker,
)
from pgdb import fresh_pg_database

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

HOSTS = int(os.environ.get("BERTH_DISTRIBUTED_HOSTS", "500"))
GROUPS = 30
CLIENTS = 12
#: Seconds after which the reconciler of the surviving API process releases the claims
#: of the boots the killed one had in flight.
BUILD_TIMEOUT = 20


def _cloud(path: Path, hosts: int) -> None:
    lines = [
        "flavors:",
        "  - {name: tiny, vcpus: 1, memory_mb: 1024, root_gb: 5}",
        "  - {name: small, vcpus: 2, memory_mb: 2048, root_gb: 10}",
        "  - {name: medium, vcpus: 4, memory_mb: 4096, root_gb: 20}",
        "hosts:",
        f'  - {{host: "h{{index:05d}}", count: {hosts}, vcpus: 8, memory_mb: 16896, '
        "local_gb: 200, cpu_allocation_ratio: 1.0, ram_allocation_ratio: 1.0, "
        "disk_allocation_ratio: 1.0}",
        "server_groups:",
    ]
    for i in range(GROUPS):
        lines.append(f"  - {{name: anti{i}, policy: anti-affinity}}")
        lines.append(f"  - {{name: aff{i}, policy: affinity}}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    cloud = tmp_path / "cloud.yaml"
    _cloud(cloud, HOSTS)
    with fresh_pg_database("berth_dist") as db, rabbit_vhost("berth_dist") as bus:
        c = LocalCluster(tmp_path / "run", db, bus, cloud, schedulers=4, apis=2, options={
            "DEFAULT": {"report_interval": 2, "service_down_time": 20,
                        "rpc_response_timeout": 15}},
            api_args=("--build-timeout", str(BUILD_TIMEOUT), "--reconcile-interval", "2"))
        try:
            c.start()
            yield c
        finally:
            c.close()


class Load:
    """Client threads posting boots to the live API processes, retrying a boot on
    another process when one is gone or answers 503 (the boot's uuids are new each
    time: a retried boot is a new request, as a client's would be)."""

    def __init__(self, cluster: LocalCluster, seed: int = 7) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.built: dict[str, str] = {}
        self.answers: collections.Counter[str] = collections.Counter()
        self.done = 0
        self.no_valid_host_streak = 0
        self.stop = threading.Event()

    def body(self) -> dict[str, Any]:
        with self.lock:
            roll = self.rng.random()
            flavor = self.rng.choice(["tiny", "small", "medium"])
            if roll < 0.55:
                return {"flavor": flavor}
            if roll < 0.75:
                return {"flavor": flavor, "num": self.rng.randint(2, 5)}
            if roll < 0.9:
                return {"flavor": "tiny", "num": self.rng.randint(1, 3),
                        "hints": {"group": f"anti{self.rng.randrange(GROUPS)}"}}
            return {"flavor": "tiny", "num": self.rng.randint(1, 2),
                    "hints": {"group": f"aff{self.rng.randrange(GROUPS)}"}}

    def boot(self, client: httpx.Client) -> None:
        body = self.body()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            urls = self.cluster.alive_urls()
            if not urls:
                raise AssertionError("no API process left")
            url = urls[self.rng.randrange(len(urls))]
            try:
                resp = client.post(url + "/boot", json=body, timeout=60, headers=ADMIN)
            except httpx.HTTPError:
                with self.lock:
                    self.answers["connection error"] += 1
                time.sleep(0.3)
                continue
            if resp.status_code == 503:
                with self.lock:
                    self.answers["503"] += 1
                time.sleep(float(resp.headers.get("Retry-After", "1")))
                continue
            data = resp.json()
            assert resp.status_code in (200, 409), (resp.status_code, data)
            with self.lock:
                self.done += 1
                self.answers[str(resp.status_code)] += 1
                for inst in data.get("instances") or []:
                    self.built[inst["instance_uuid"]] = inst["compute_node_uuid"]
                plain = "hints" not in body
                if resp.status_code == 409 and plain:
                    self.no_valid_host_streak += 1
                elif plain:
                    self.no_valid_host_streak = 0
                if self.no_valid_host_streak >= 40:
                    self.stop.set()
            return
        raise AssertionError(f"boot {body} got no answer within 90 s")

    def worker(self) -> None:
        with httpx.Client(headers=ADMIN) as client:
            while not self.stop.is_set():
                self.boot(client)


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.2)


@pytest.mark.alone  # it restarts the broker every other test's processes use
def test_distributed_boots_hold_under_kills_and_a_broker_restart(cluster: LocalCluster) -> None:
    api = cluster.alive_urls()[0]
    cluster.wait_hosts(api, HOSTS)
    load = Load(cluster)
    faults: list[str] = []

    def inject() -> None:
        _wait(lambda: load.done >= 250 or load.stop.is_set(), 600)
        cluster.kill("scheduler0")
        faults.append(f"scheduler0 killed after {load.done} boots")
        _wait(lambda: load.done >= 450 or load.stop.is_set(), 600)
        cluster.kill("api1")
        faults.append(f"api1 killed after {load.done} boots")
        _wait(lambda: load.done >= 650 or load.stop.is_set(), 600)
        faults.append(f"broker restarted after {load.done} boots")
        restart_broker()

    injector = threading.Thread(target=inject)
    injector.start()
    with ThreadPoolExecutor(CLIENTS) as pool:
        for future in [pool.submit(load.worker) for _ in range(CLIENTS)]:
            future.result()
    injector.join(timeout=300)
    assert len(faults) == 3, (faults, load.done)
    assert load.done >= 1000, (load.done, load.answers)

    # Reports resume after the broker restart: every host is up again.
    cluster.wait_hosts(api, HOSTS, timeout=60)
    time.sleep(3)  # the last builds' reports

    engine = sa.create_engine(cluster.db_url)

    def unclaimed() -> set[str]:
        with engine.connect() as conn:
            held = set(conn.execute(sa.text("SELECT DISTINCT consumer_id FROM allocations"))
                       .scalars())
            reports = conn.execute(sa.text("SELECT report FROM berth_compute_nodes")).scalars()
            running = {i["uuid"] for r in reports for i in json.loads(r).get("instances") or []}
        return held - running

    # The claims of the boots the killed API process had in flight: released by the
    # reconciler once their builds go BUILD_TIMEOUT seconds without a heartbeat.
    leaked = len(unclaimed())
    _wait(lambda: not unclaimed(), BUILD_TIMEOUT + 60)

    def building() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(*) FROM berth_builds WHERE state = 'building'")).scalar() or 0)

    # The builds the killed API left that finished on their hosts: recorded as active by
    # the reconciler, with their instance rows.
    _wait(lambda: building() == 0, BUILD_TIMEOUT + 60)
    try:
        with engine.connect() as conn:
            listed = set(conn.execute(sa.text("SELECT uuid FROM berth_instances")).scalars())
            over = conn.execute(sa.text(
                "SELECT a.resource_provider_id, a.resource_class_id, SUM(a.used), "
                "MAX(i.total), MAX(i.reserved), MAX(i.allocation_ratio) FROM allocations a "
                "JOIN inventories i ON i.resource_provider_id = a.resource_provider_id "
                "AND i.resource_class_id = a.resource_class_id "
                "GROUP BY a.resource_provider_id, a.resource_class_id "
                "HAVING SUM(a.used) > (MAX(i.total) - MAX(i.reserved)) * MAX(i.allocation_ratio)"
            )).all()
            reports = [json.loads(r) for r in conn.execute(
                sa.text("SELECT report FROM berth_compute_nodes")).scalars()]
            allocs = conn.execute(sa.text(
                "SELECT a.consumer_id, rp.uuid FROM allocations a "
                "JOIN resource_providers rp ON rp.id = a.resource_provider_id")).all()
            members: dict[str, list[str]] = {}
            for group_uuid, instance_uuid in conn.execute(sa.text(
                    "SELECT group_uuid, instance_uuid FROM berth_server_group_members "
                    "ORDER BY id")):
                members.setdefault(group_uuid, []).append(instance_uuid)
            groups = [(name, policy, members.get(uuid, [])) for uuid, name, policy in conn.execute(
                sa.text("SELECT uuid, name, policy FROM berth_server_groups"))]
    finally:
        engine.dispose()
    assert over == [], f"over-committed (provider, class, used, total, reserved, ratio): {over}"

    where: dict[str, str] = {}
    duplicated = []
    for report in reports:
        for inst in report.get("instances") or []:
            if inst["uuid"] in where:
                duplicated.append(inst["uuid"])
            where[inst["uuid"]] = report["uuid"]
    assert duplicated == [], f"instances on two hosts: {duplicated[:10]}"
    held: dict[str, set[str]] = collections.defaultdict(set)
    for consumer, provider in allocs:
        held[consumer].add(provider)
    wrong = {u: (h, sorted(held.get(u, ()))) for u, h in where.items()
             if held.get(u) != {h}}
    assert wrong == {}, f"built instances without exactly one allocation on their host: " \
                        f"{list(wrong.items())[:10]}"
    lost = sorted(set(load.built) - set(where))
    assert lost == [], f"instances answered as built but on no host: {lost[:10]}"
    unlisted = sorted(set(where) - listed)
    assert unlisted == [], f"instances on a host that the API does not know: {unlisted[:10]}"

    violations = []
    host_of = {u: h for u, h in where.items()}
    for name, policy, members in groups:
        hosts = [host_of[m] for m in members if m in host_of]
        if policy == "anti-affinity" and len(hosts) != len(set(hosts)):
            violations.append((name, collections.Counter(hosts).most_common(2)))
        if policy == "affinity" and len(set(hosts)) > 1:
            violations.append((name, sorted(set(hosts))))
    assert violations == [], f"group policy violations: {violations}"

    orphans = sorted(set(held) - set(where))
    assert orphans == [], f"{len(orphans)} allocations without an instance after reconciliation"
    audit = subprocess.run([sys.executable, "-m", "berth.cli", "audit", "--db", cluster.db_url],
                           capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stdout + audit.stderr

    # The same through the Placement API: each built instance's allocations, and every
    # provider's usage within its capacity.
    with PlacementClient(api + "/placement") as client:
        for uuid, provider in random.Random(1).sample(sorted(where.items()), k=min(300, len(where))):
            got = client.get_allocations(uuid).allocations
            assert list(got) == [provider], (uuid, got)
        for provider in {r["uuid"] for r in reports}:
            usages = client.provider_usages(provider)
            _, inventories = client.get_inventories(provider)
            for rc, used in usages.items():
                inv = inventories[rc]
                assert used <= (inv["total"] - inv["reserved"]) * inv["allocation_ratio"], (
                    provider, rc, used, inv)
    print(f"\n{load.done} boots, {len(where)} instances on {HOSTS} hosts, answers "
          f"{dict(load.answers)}, {leaked} claims left by the killed API (reconciled); {faults}")


def _up_count(url: str) -> int:
    hosts = httpx.get(url + "/hosts", timeout=30, headers=ADMIN).json()["hosts"]
    return sum(1 for h in hosts if h["up"])


@contextlib.contextmanager
def _small_cluster(tmp_path: Path, name: str, hosts: int) -> Iterator[tuple[LocalCluster, str]]:
    """One API, one scheduler and a fleet of ``hosts`` reporting every second (down
    after 6 s), every host up; the cluster and its API's URL."""
    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    cloud = tmp_path / "cloud.yaml"
    _cloud(cloud, hosts)
    with fresh_pg_database(name) as db, rabbit_vhost(name) as bus:
        c = LocalCluster(tmp_path / "run", db, bus, cloud, schedulers=1, apis=1, options={
            "DEFAULT": {"report_interval": 1, "service_down_time": 6}})
        try:
            c.start()
            api = c.alive_urls()[0]
            c.wait_hosts(api, hosts, timeout=30)
            yield c, api
        finally:
            c.close()


def test_hosts_whose_reports_stop_go_down_and_come_back(tmp_path: Path) -> None:
    """A fleet's reports stop (its process paused): its hosts go down after
    service_down_time and come back when the reports resume. A scheduler that starts
    meanwhile counts the hosts up from its start (the grace period) rather than down
    because their stored heartbeats are old, and down once no report came in time."""
    with _small_cluster(tmp_path, "berth_live", 20) as (c, api):
        compute = c.procs["compute"]
        compute.send_signal(signal.SIGSTOP)
        try:
            _wait(lambda: _up_count(api) == 0, 30)
            assert _up_count(api) == 0
            # A new scheduler, while no host reports: up during the grace period.
            c.kill("scheduler0")
            c.start_scheduler("scheduler1")
            assert _up_count(api) == 20
            _wait(lambda: _up_count(api) == 0, 30)
            assert _up_count(api) == 0
        finally:
            compute.send_signal(signal.SIGCONT)
        c.wait_hosts(api, 20, timeout=30)


def test_a_group_s_members_count_where_they_are_claimed_before_their_hosts_report(
        tmp_path: Path) -> None:
    """A boot into a hard anti-affinity group right after a multi-create into it: the
    scheduler may not have had the hosts' reports since those builds (they come over the
    bus), but the members' claims are in the shared database, so it never picks a
    member's host (it did about one time in three: the late check on the compute then
    sent it from member to member, and equal hosts rank alike, until retries ran out)."""
    with _small_cluster(tmp_path, "berth_claimed_members", 40) as (_c, api), \
            httpx.Client(base_url=api, headers=ADMIN, timeout=60) as http:
        for i in range(12):
            group = http.post("/server-groups", json={
                "name": f"g{i}", "policy": "anti-affinity"}).json()["server_group"]
            first = http.post("/boot", json={"flavor": "tiny", "num": 3,
                                             "hints": {"group": group["uuid"]}})
            assert first.status_code == 200, first.text
            members = {x["host"] for x in first.json()["instances"]}
            then = http.post("/boot", json={"flavor": "tiny",
                                            "hints": {"group": group["uuid"]}})
            assert then.status_code == 200, then.text
            (placed,) = then.json()["instances"]
            assert placed["tried"] == [placed["host"]] and placed["host"] not in members


def test_an_api_process_lists_shows_and_deletes_instances(tmp_path: Path) -> None:
    """``berth api`` records the instances it builds: they are listed and shown, and a
    delete frees the claim, has the host's agent forget the instance (its report says
    so) and takes it out of its group; moves are berth serve's (404 saying so)."""
    with _small_cluster(tmp_path, "berth_api_servers", 6) as (c, api), \
            httpx.Client(base_url=api, headers=ADMIN, timeout=60) as http:
        group = http.post("/server-groups", json={
            "name": "web", "policy": "anti-affinity"}).json()["server_group"]
        booted = http.post("/boot", json={"flavor": "tiny", "num": 2,
                                          "hints": {"group": group["uuid"]}})
        assert booted.status_code == 200, booted.text
        first, second = booted.json()["instances"]
        listed = {s["instance_uuid"]: s for s in http.get("/servers").json()["servers"]}
        assert listed[first["instance_uuid"]]["host"] == first["host"]
        shown = http.get(f"/servers/{first['instance_uuid']}").json()
        assert shown["status"] == "ACTIVE" and shown["allocations"]["instance"]
        assert list(shown["providers"].values()) == [f"{first['host']}/{first['host']}"]
        moved = http.post(f"/servers/{first['instance_uuid']}/migrate", json={})
        assert moved.status_code == 404 and "berth serve" in moved.json()["error"]["message"]
        gone = http.delete(f"/servers/{first['instance_uuid']}")
        assert gone.status_code == 200, gone.text
        assert http.get(f"/servers/{first['instance_uuid']}").status_code == 404
        with PlacementClient(api + "/placement") as client:
            assert not client.get_allocations(first["instance_uuid"]).allocations

        engine = sa.create_engine(c.db_url)

        def reported() -> set[str]:
            with engine.connect() as conn:
                reports = conn.execute(sa.text("SELECT report FROM berth_compute_nodes"))
                return {i["uuid"] for (r,) in reports
                        for i in json.loads(r).get("instances") or []}

        try:
            _wait(lambda: first["instance_uuid"] not in reported(), 30)
            assert second["instance_uuid"] in reported()
        finally:
            engine.dispose()
        members = [g for g in http.get("/server-groups").json()["server_groups"]
                   if g["uuid"] == group["uuid"]][0]["members"]
        assert members == [second["instance_uuid"]]


def _services(url: str) -> dict[str, dict[str, Any]]:
    answer = httpx.get(url + "/os-services", timeout=30, headers=ADMIN).json()
    return {s["host"]: s for s in answer["services"]}


def _generations(url: str) -> dict[str, int]:
    providers = httpx.get(url + "/placement/resource_providers", headers=ADMIN,
                          timeout=30).json()["resource_providers"]
    return {p["name"]: p["generation"] for p in providers}


def _service_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "berth.cli", "service", *args, "--url", url,
                           "--token", "admin"], capture_output=True, text=True, timeout=60)


def test_an_operator_disables_and_forces_down_services_through_an_api_process(
        tmp_path: Path) -> None:
    """``berth service set`` against a ``berth api``: the switch reaches the host's agent
    in the fleet process over the bus, the scheduler stops choosing the host, and the
    switches outlive a restart of the fleet, until the operator sets them back. Then
    ``berth service delete`` takes a host out of the fleet, placement and the scheduler."""
    with _small_cluster(tmp_path, "berth_svc", 8) as (c, api):
        done = _service_cli(api, "set", "h00002", "--disable", "--disable-reason",
                            "new disks")
        assert done.returncode == 0, done.stderr
        assert "disabled" in done.stdout and "new disks" in done.stdout
        done = _service_cli(api, "set", "h00003", "--down")
        assert done.returncode == 0, done.stderr
        _wait(lambda: _up_count(api) == 6, 30)
        services = _services(api)
        assert (services["h00002"]["status"], services["h00002"]["state"]) == (
            "disabled", "up")
        assert (services["h00003"]["status"], services["h00003"]["state"]) == (
            "enabled", "down")
        for host in ("h00002", "h00003"):
            refused = httpx.post(api + "/boot", headers=ADMIN, timeout=60, json={
                "flavor": "tiny", "force_hosts": [host]})
            assert refused.status_code == 409, refused.text
        # The fleet restarts: each agent takes its switches back from its record, and
        # reads what placement holds of its provider first: nothing has changed, so
        # nothing is written (every provider keeps its generation).
        generations = _generations(api)
        c.kill("compute")
        c.start_compute()
        time.sleep(2)  # the restarted fleet's first round of reports
        c.wait_hosts(api, 6, timeout=30)
        assert _up_count(api) == 6
        assert _generations(api) == generations
        services = _services(api)
        assert services["h00002"]["disabled_reason"] == "new disks"
        assert services["h00003"]["forced_down"] is True
        assert _service_cli(api, "set", "h00002", "--enable").returncode == 0
        assert _service_cli(api, "set", "h00003", "--up").returncode == 0
        c.wait_hosts(api, 8, timeout=30)
        missing = _service_cli(api, "set", "h09999", "--up")
        assert missing.returncode == 4 and "no compute service" in missing.stderr
        # An API process knows the instances it built: an unknown one is not found.
        shown = subprocess.run([sys.executable, "-m", "berth.cli", "server",
                                "00000000-0000-4000-8000-00000000000a", "--url", api,
                                "--token", "admin"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 3 and "no such instance" in shown.stderr, shown.stderr
        # A host taken out: its agent in the fleet stops, the scheduler drops it.
        done = _service_cli(api, "delete", "h00007")
        assert done.returncode == 0, done.stderr
        _wait(lambda: "h00007" not in _services(api), 30)
        time.sleep(3)  # three report rounds: none brings it back
        assert sorted(_services(api)) == [f"h{i:05d}" for i in range(1, 9) if i != 7]
        providers = httpx.get(api + "/placement/resource_providers", headers=ADMIN,
                              timeout=30).json()["resource_providers"]
        assert "h00007" not in {p["name"] for p in providers} and len(providers) == 7
        # The fleet starts again with it in its file: it registers anew.
        c.kill("compute")
        c.start_compute()
        c.wait_hosts(api, 8, timeout=30)


def test_a_fleet_sets_the_service_states_its_cloud_file_gives(tmp_path: Path) -> None:
    """``berth compute --fleet`` takes a host's ``service`` entry as ``berth serve
    --cloud`` does: disabled with its reason, forced down, or down (``up: false``) from
    its registration on; only the operator sets them back."""
    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(
        "flavors:\n  - {name: tiny, vcpus: 1, memory_mb: 1024, root_gb: 5}\nhosts:\n"
        "  - {host: h1, vcpus: 8, memory_mb: 16896, local_gb: 200}\n"
        "  - {host: h2, vcpus: 8, memory_mb: 16896, local_gb: 200,\n"
        "     service: {disabled: true, disabled_reason: new disks}}\n"
        "  - {host: h3, vcpus: 8, memory_mb: 16896, local_gb: 200,\n"
        "     service: {forced_down: true}}\n"
        "  - {host: h4, vcpus: 8, memory_mb: 16896, local_gb: 200, service: {up: false}}\n")
    with fresh_pg_database("berth_fleet_svc") as db, rabbit_vhost("berth_fleet_svc") as bus:
        c = LocalCluster(tmp_path / "run", db, bus, cloud, schedulers=1, apis=1, options={
            "DEFAULT": {"report_interval": 1, "service_down_time": 4}})
        try:
            c.start()
            api = c.alive_urls()[0]
            c.wait_hosts(api, 1, timeout=30)
            # Up through the scheduler's start-up grace, then down: no report came.
            _wait(lambda: _services(api)["h4"]["state"] == "down", 30)
            assert _up_count(api) == 1  # a disabled service is not "up" in /hosts
            services = _services(api)
            assert (services["h1"]["status"], services["h1"]["state"]) == ("enabled", "up")
            assert (services["h2"]["status"], services["h2"]["state"]) == ("disabled", "up")
            assert services["h2"]["disabled_reason"] == "new disks"
            assert services["h3"]["forced_down"] is True and services["h3"]["state"] == "down"
            assert services["h4"]["state"] == "down" and services["h4"]["forced_down"] is False
            for host in ("h2", "h3", "h4"):
                refused = httpx.post(api + "/boot", headers=ADMIN, timeout=60, json={
                    "flavor": "tiny", "force_hosts": [host]})
                assert refused.status_code == 409, refused.text
            placed = httpx.post(api + "/boot", headers=ADMIN, timeout=60,
                                json={"flavor": "tiny"})
            assert placed.json()["instances"][0]["host"] == "h1", placed.text
            assert _service_cli(api, "set", "h2", "--enable").returncode == 0
            assert _service_cli(api, "set", "h3", "--up").returncode == 0
            c.wait_hosts(api, 3, timeout=30)
            assert _services(api)["h2"]["status"] == "enabled"
        finally:
            c.close()


def test_gpus_are_claimed_by_the_compute_processes_across_api_and_scheduler(
        tmp_path: Path) -> None:
    """One API, one scheduler and a compute process, each deriving the boot's PCI
    request from the flavor with the same [pci] alias: the compute process claims the
    device, its stored report (SQL) lists the pool empty, so the next GPU boot goes to
    the other host and the third finds none; a delete gives the device back."""
    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    alias = json.dumps({"name": "gpu", "vendor_id": "10de", "product_id": "1db4"})
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(
        "flavors: [{name: gpu, vcpus: 1, memory_mb: 1024, root_gb: 5, "
        "extra_specs: {'pci_passthrough:alias': 'gpu:1'}}]\n"
        "hosts:\n"
        "  - {host: 'g{index}', count: 2, vcpus: 8, memory_mb: 16384, local_gb: 200,\n"
        "     pci_pools: [{vendor_id: '10de', product_id: '1db4', count: 1}]}\n")
    with fresh_pg_database("berth_dist_gpu") as db, rabbit_vhost("berth_dist_gpu") as bus:
        c = LocalCluster(tmp_path / "run", db, bus, cloud, schedulers=1, apis=1, options={
            "DEFAULT": {"report_interval": 1},
            "filter_scheduler": {"enabled_filters": "ComputeFilter,PciPassthroughFilter"},
            "pci": {"alias": alias}})
        engine = sa.create_engine(db)
        try:
            c.start()
            api = c.alive_urls()[0]
            c.wait_hosts(api, 2, timeout=30)

            def free_devices() -> dict[str, int]:
                with engine.connect() as conn:
                    rows = conn.execute(sa.text(
                        "SELECT host, report FROM berth_compute_nodes")).all()
                return {host: sum(p["count"] for p in json.loads(report)["pci_stats"] or [])
                        for host, report in rows}

            with httpx.Client(base_url=api, headers=ADMIN, timeout=60) as http:
                first = http.post("/boot", json={"flavor": "gpu"})
                assert first.status_code == 200, first.text
                _wait(lambda: sum(free_devices().values()) == 1, 30)
                second = http.post("/boot", json={"flavor": "gpu"})
                assert second.status_code == 200, second.text
                hosts = {first.json()["instances"][0]["host"],
                         second.json()["instances"][0]["host"]}
                assert hosts == {"g1", "g2"}
                _wait(lambda: free_devices() == {"g1": 0, "g2": 0}, 30)
                third = http.post("/boot", json={"flavor": "gpu"})
                assert third.status_code == 409, third.text
                gone = first.json()["instances"][0]
                assert http.delete(f"/servers/{gone['instance_uuid']}").status_code == 200
                _wait(lambda: free_devices()[gone["host"]] == 1, 30)
        finally:
            engine.dispose()
            c.close()
