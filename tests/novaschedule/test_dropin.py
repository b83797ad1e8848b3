"""Berth as the only scheduler of a real Nova 34 (nova-api, nova-conductor, three
nova-compute on fake drivers, MariaDB, RabbitMQ, Keystone, a Keystone-protected Placement
found through the catalog; :mod:`peers.nova`), driven through Nova's own API. Two
``berth nova-scheduler`` processes run side by side. Every scenario also runs with the
real nova-scheduler first, and Berth's outcome must be the same.

Hosts: ``c1`` and ``c2`` (fake.SmallFakeDriver: 2 vCPU, 8 GiB, 1 TB; c2 reserves more
memory, so the RAM weigher never ties them), and ``c3``
(fake.FakeRescheduleDriver: huge, so the weighers prefer it, but the first build of each
instance fails there). ``c3`` stays disabled except in the reschedule scenario.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from peers.nova import Compute, NovaStack, available

IMAGE = "155d900f-4e14-4e4c-a73d-069cbf4541e6"
#: Each scenario's outcome per scheduler, to compare Berth's with Nova's.
OUTCOMES: dict[str, dict[str, Any]] = {"nova": {}, "berth": {}}

why = available()
pytestmark = [pytest.mark.skipif(why is not None, reason=why or ""), pytest.mark.slow]


class Cloud:
    """The stack and a Nova API client, with the helpers the scenarios share."""

    def __init__(self, stack: NovaStack) -> None:
        self.stack = stack
        self.api = stack.client()
        self.placement = stack.placement_headers()
        self.flavors: dict[str, str] = {}
        for name, ram, vcpus in (("tiny", 512, 1), ("small", 2048, 1), ("huge", 16384, 1)):
            made = self.call("POST", "/flavors", {"flavor": {
                "name": name, "ram": ram, "vcpus": vcpus, "disk": 1}})
            self.flavors[name] = made["flavor"]["id"]

    def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 202, 204)) -> Any:
        resp = self.api.request(method, path, json=body)
        assert resp.status_code in ok, f"{method} {path}: {resp.status_code} {resp.text[:500]}"
        return resp.json() if resp.content else None

    def boot(self, flavor: str = "tiny", **extra: Any) -> list[str]:
        hints = extra.pop("hints", None)
        body: dict[str, Any] = {"server": {"name": "s", "imageRef": IMAGE,
                                           "flavorRef": self.flavors[flavor],
                                           "networks": "none", **extra}}
        if hints:
            body["os:scheduler_hints"] = hints
        if extra.get("min_count", 1) > 1:
            body["server"]["return_reservation_id"] = True
        answer = self.call("POST", "/servers", body)
        if "reservation_id" in answer:  # a multi-create answers its reservation
            listed = self.call("GET", f"/servers?reservation_id={answer['reservation_id']}")
            return sorted(s["id"] for s in listed["servers"])
        return [answer["server"]["id"]]

    def settle(self, server: str, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.call("GET", f"/servers/{server}")["server"]
            if found["status"] in ("ACTIVE", "ERROR", "VERIFY_RESIZE") and not found.get(
                    "OS-EXT-STS:task_state"):
                return found
            assert time.monotonic() < deadline, found
            time.sleep(0.5)

    def host(self, server: dict[str, Any]) -> str | None:
        return server.get("OS-EXT-SRV-ATTR:host")

    def allocations(self, consumer: str) -> dict[str, dict[str, int]]:
        """The consumer's allocations by compute host name."""
        url, headers = self.stack.placement_url, self.placement
        held = httpx.get(f"{url}/allocations/{consumer}", headers=headers).json()
        names = {p["uuid"]: p["name"] for p in httpx.get(
            f"{url}/resource_providers", headers=headers).json()["resource_providers"]}
        return {names[rp]: body["resources"] for rp, body in held["allocations"].items()}

    def delete(self, *servers: str) -> None:
        for server in servers:
            self.call("DELETE", f"/servers/{server}")
        deadline = time.monotonic() + 60
        for server in servers:
            while self.api.get(f"/servers/{server}").status_code != 404:
                assert time.monotonic() < deadline, f"{server} was not deleted"
                time.sleep(0.5)

    def quiet(self, hosts: tuple[str, ...] = ("c1", "c2"), timeout: float = 90,
              busy_with: dict[str, tuple[int, int]] | None = None) -> None:
        """Wait until ``hosts`` report no instance and no vCPU in use (their resource
        trackers have written the earlier scenarios' deletes to ``compute_nodes``, which
        both schedulers weigh from): under load that lags the API's 404 of a deleted
        server, and a host still counting a gone instance weighs differently.
        ``busy_with``: (instances, vCPUs) some hosts report instead."""
        wanted = {h: (busy_with or {}).get(h, (0, 0)) for h in hosts}
        deadline = time.monotonic() + timeout
        while True:
            listed = self.api.get("/os-hypervisors/detail",
                                  headers={"X-OpenStack-Nova-API-Version": "2.87"}).json()
            busy = {h["hypervisor_hostname"]: (h["running_vms"], h["vcpus_used"])
                    for h in listed["hypervisors"] if h["hypervisor_hostname"] in hosts}
            if busy == wanted:
                return
            assert time.monotonic() < deadline, busy
            time.sleep(0.5)

    def service(self, host: str, status: str) -> None:
        (svc,) = self.call("GET", f"/os-services?binary=nova-compute&host={host}")["services"]
        body: dict[str, Any] = {"status": status}
        if status == "disabled":
            body["disabled_reason"] = "test"
        self.call("PUT", f"/os-services/{svc['id']}", body)

    def wait_scheduled(self, servers: list[str]) -> list[dict[str, Any]]:
        return [self.settle(s) for s in servers]


@pytest.fixture(scope="module", params=["nova", "berth"])
def cloud(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    work = tmp_path_factory.mktemp(f"dropin-{request.param}")
    # Two Berth schedulers side by side, as nova-schedulers run: calls alternate.
    # Decisions must not hang on ties, whose order Nova leaves to a per-process hash: c2
    # reserves 1,300 MB (free RAM never equal to c1's in steps of 512 MB) and only the
    # RAM weigher of the resource weighers counts.
    stack = NovaStack(work, [Compute("c1"),
                             Compute("c2", options={"reserved_host_memory_mb": "1300"}),
                             Compute("c3", "fake.FakeRescheduleDriver")],
                      scheduler=request.param, schedulers=2 if request.param == "berth" else 1,
                      options={"filter_scheduler": {"cpu_weight_multiplier": "0.0",
                                                    "disk_weight_multiplier": "0.0"}})
    try:
        stack.start()
        cloud = Cloud(stack)
        cloud.service("c3", "disabled")
        cloud.scheduler = request.param  # type: ignore[attr-defined]
        yield cloud
    finally:
        stack.stop()


def record(cloud: Cloud, scenario: str, outcome: Any) -> None:
    """Keep the outcome; under Berth it must equal the real scheduler's."""
    scheduler = cloud.scheduler  # type: ignore[attr-defined]
    OUTCOMES[scheduler][scenario] = outcome
    if scheduler == "berth" and scenario in OUTCOMES["nova"]:
        assert outcome == OUTCOMES["nova"][scenario], (scenario, OUTCOMES["nova"][scenario])


def test_boot_one_and_several(cloud: Cloud) -> None:
    (one,) = cloud.boot()
    server = cloud.settle(one)
    assert server["status"] == "ACTIVE"
    host = cloud.host(server)
    assert cloud.allocations(one) == {host: {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    # Both schedulers weigh the next boot from compute_nodes: its row counts ``one``.
    cloud.quiet(busy_with={host or "": (1, 1)})
    many = cloud.boot("small", min_count=3, max_count=3)
    servers = cloud.wait_scheduled(many)
    assert [s["status"] for s in servers] == ["ACTIVE"] * 3
    for s in servers:
        assert cloud.allocations(s["id"]) == {cloud.host(s): {
            "VCPU": 1, "MEMORY_MB": 2048, "DISK_GB": 1}}
    hosts = sorted(cloud.host(s) or "" for s in servers)
    # Spread by the weighers over c1 and c2 (c3 is disabled); c1 has more free RAM.
    assert set(hosts) == {"c1", "c2"} and host == "c1"
    record(cloud, "boot", {"one": host, "many": hosts})
    cloud.delete(one, *many)
    assert cloud.allocations(one) == {}


def test_no_valid_host_puts_the_server_in_error(cloud: Cloud) -> None:
    (server,) = cloud.boot("huge")
    found = cloud.settle(server)
    assert found["status"] == "ERROR"
    assert "No valid host was found" in found["fault"]["message"]
    assert cloud.allocations(server) == {}
    record(cloud, "no valid host", found["fault"]["message"].split(".")[0])
    cloud.delete(server)


def test_availability_zone_from_aggregate_metadata(cloud: Cloud) -> None:
    made = cloud.call("POST", "/os-aggregates", {"aggregate": {
        "name": f"zone-{cloud.scheduler}", "availability_zone": "az-x"}})  # type: ignore[attr-defined]
    agg = made["aggregate"]["id"]
    cloud.call("POST", f"/os-aggregates/{agg}/action", {"add_host": {"host": "c2"}})
    time.sleep(1)  # the update_aggregates fanout
    servers = [cloud.boot(availability_zone="az-x")[0] for _ in range(2)]
    found = cloud.wait_scheduled(servers)
    hosts = [cloud.host(s) for s in found]
    assert hosts == ["c2", "c2"] and all(s["OS-EXT-AZ:availability_zone"] == "az-x"
                                         for s in found)
    record(cloud, "az", hosts)
    cloud.delete(*servers)
    cloud.call("POST", f"/os-aggregates/{agg}/action", {"remove_host": {"host": "c2"}})
    cloud.call("DELETE", f"/os-aggregates/{agg}")


def test_anti_affinity_group(cloud: Cloud) -> None:
    group = cloud.call("POST", "/os-server-groups", {"server_group": {
        "name": "web", "policy": "anti-affinity"}})["server_group"]["id"]
    servers = []
    for _ in range(3):
        servers += cloud.boot(hints={"group": group})
        cloud.settle(servers[-1])
    found = [cloud.settle(s) for s in servers]
    statuses = [s["status"] for s in found]
    assert statuses == ["ACTIVE", "ACTIVE", "ERROR"]
    assert {cloud.host(s) for s in found[:2]} == {"c1", "c2"}
    record(cloud, "anti-affinity", statuses)
    cloud.delete(*servers)
    cloud.call("DELETE", f"/os-server-groups/{group}")


def test_a_disabled_compute_is_never_picked(cloud: Cloud) -> None:
    cloud.service("c1", "disabled")
    try:
        servers = cloud.boot(min_count=2, max_count=2)
        hosts = [cloud.host(s) for s in cloud.wait_scheduled(servers)]
        assert hosts == ["c2", "c2"]
        record(cloud, "disabled", hosts)
        cloud.delete(*servers)
    finally:
        cloud.service("c1", "enabled")


def test_cold_migrate_and_resize(cloud: Cloud) -> None:
    (server,) = cloud.boot()
    before = cloud.host(cloud.settle(server))
    cloud.call("POST", f"/servers/{server}/action", {"migrate": None})
    moved = cloud.settle(server)
    assert moved["status"] == "VERIFY_RESIZE" and cloud.host(moved) != before
    cloud.call("POST", f"/servers/{server}/action", {"confirmResize": None})
    deadline = time.monotonic() + 60
    while cloud.settle(server)["status"] != "ACTIVE":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    after = cloud.host(cloud.settle(server))
    assert cloud.allocations(server) == {after: {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    cloud.call("POST", f"/servers/{server}/action", {"resize": {
        "flavorRef": cloud.flavors["small"]}})
    resized = cloud.settle(server)
    assert resized["status"] == "VERIFY_RESIZE"
    cloud.call("POST", f"/servers/{server}/action", {"confirmResize": None})
    deadline = time.monotonic() + 60
    while cloud.settle(server)["status"] != "ACTIVE":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    final = cloud.host(cloud.settle(server))
    assert cloud.allocations(server) == {final: {"VCPU": 1, "MEMORY_MB": 2048, "DISK_GB": 1}}
    record(cloud, "migrate", [before, after, final])
    cloud.delete(server)


def test_live_migrate(cloud: Cloud) -> None:
    """Nova's LiveMigrationTask asks for a destination in the server's cell with its
    source ignored and no alternates; the server runs on the destination, which alone
    holds its allocation once the source's compute has let go."""
    cloud.quiet()  # the earlier scenarios' deletes reported: both schedulers weigh alike
    (server,) = cloud.boot()
    source = cloud.host(cloud.settle(server))
    cloud.call("POST", f"/servers/{server}/action",
               {"os-migrateLive": {"host": None, "block_migration": "auto"}})
    deadline = time.monotonic() + 90
    while True:
        found = cloud.settle(server)
        if cloud.host(found) != source or found["status"] == "ERROR":
            break
        migrations = cloud.call("GET", f"/servers/{server}/migrations")["migrations"]
        assert not any(m["status"] in ("error", "failed") for m in migrations), migrations
        assert time.monotonic() < deadline, found
        time.sleep(0.5)
    assert found["status"] == "ACTIVE", found.get("fault")
    dest = cloud.host(found)
    assert dest not in (None, source)
    deadline = time.monotonic() + 60
    while cloud.allocations(server) != {dest: {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}:
        assert time.monotonic() < deadline, cloud.allocations(server)
        time.sleep(0.5)
    record(cloud, "live-migrate", [source, dest])
    cloud.delete(server)


def test_a_failed_build_is_rescheduled_onto_an_alternate(cloud: Cloud) -> None:
    # The alternate is the better of c1 and c2 by free memory: both must be empty as
    # their compute_nodes rows say, for Nova and for Berth alike.
    cloud.quiet()
    cloud.service("c3", "enabled")
    try:
        time.sleep(1)
        (server,) = cloud.boot()
        found = cloud.settle(server)
        assert found["status"] == "ACTIVE"
        # c3 is weighed best and fails the first build; the conductor claims an
        # alternate's allocation request and builds there.
        host = cloud.host(found)
        assert host in {"c1", "c2"}
        assert cloud.allocations(server) == {host: {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
        record(cloud, "reschedule", host)
        cloud.delete(server)
    finally:
        cloud.service("c3", "disabled")


def test_both_berth_schedulers_took_calls(cloud: Cloud) -> None:
    """The shared ``scheduler`` queue hands calls to both processes in turn."""
    if cloud.scheduler != "berth":  # type: ignore[attr-defined]
        pytest.skip("one nova-scheduler runs in the reference stack")
    for name in ("scheduler", "scheduler-2"):
        assert "berth.nova.rpc" in cloud.stack.log(name).read_text(), name


def test_evacuate_from_a_compute_forced_down(cloud: Cloud) -> None:
    """The conductor asks for an evacuated server's new host with the server as the
    consumer, which still holds its source's allocations: the claim doubles them up
    (Nova's claim_resources) instead of failing as a consumer that exists. Last in the
    module: Nova lets the source up again only once its compute restarted."""
    (server,) = cloud.boot()
    source = cloud.host(cloud.settle(server))
    (svc,) = cloud.call("GET", f"/os-services?binary=nova-compute&host={source}")["services"]
    cloud.call("PUT", f"/os-services/{svc['id']}", {"forced_down": True})
    cloud.call("POST", f"/servers/{server}/action", {"evacuate": {}})
    deadline = time.monotonic() + 120
    while True:
        found = cloud.call("GET", f"/servers/{server}")["server"]
        if not found.get("OS-EXT-STS:task_state") and (
                found["status"] == "ERROR" or cloud.host(found) != source):
            break
        assert time.monotonic() < deadline, found
        time.sleep(0.5)
    assert found["status"] != "ERROR", found.get("fault")
    dest = cloud.host(found)
    assert dest not in (None, source)
    held = cloud.allocations(server)
    assert held[dest] == {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}, held
    record(cloud, "evacuate", sorted(held))
    cloud.delete(server)
