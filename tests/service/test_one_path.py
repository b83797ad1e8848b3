"""``berth schedule`` (offline) and ``berth serve`` + boot (online) answer alike.

Offline scheduling registers the cloud file into a scratch store through the agents and
asks the same scheduler service as ``berth serve`` does, so the two agree by
construction; these tests hold them to it, on the issue's examples and on random cloud
files and requests (fake driver, no failures, the same seed and so the same tie order
and instance uuids). ``BERTH_ONE_PATH_CASES`` raises the number of random cases.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from berth.cli import main
from berth.config import SchedulerConfig
from berth.service.api import SchedulerApp
from berth.service.localcluster import free_port
from berth.service.seeding import seed_from_cloud
from berth.service.stack import Stack, open_stack

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "cloud.yaml")

ONE_HOST = """
hosts: [{host: h1, vcpus: 8, memory_mb: 16384, local_gb: 100}]
flavors:
  - {name: avx, vcpus: 1, memory_mb: 1024, root_gb: 10, extra_specs: {"trait:HW_CPU_X86_AVX2": required}}
  - {name: gpu, vcpus: 1, memory_mb: 1024, root_gb: 10, extra_specs: {"resources:CUSTOM_GPU": "1"}}
  - {name: pinned, vcpus: 2, memory_mb: 1024, root_gb: 10, extra_specs: {"hw:cpu_policy": dedicated}}
"""


class Served:
    """A ``berth serve --cloud`` process on a fresh SQLite database."""

    def __init__(self, tmp: Path, cloud: str, *args: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "berth.cli", "serve", "--auth-strategy", "noauth2", "--db", f"sqlite:///{tmp}/serve.sqlite",
             "--port", self.url.rsplit(":", 1)[1], "--cloud", cloud, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
            if self.proc.poll() is not None:
                out = self.proc.stdout.read().decode() if self.proc.stdout else ""
                raise AssertionError(f"berth serve exited: {out}")
        raise AssertionError("berth serve did not come up")

    def boot(self, **body: Any) -> tuple[int, dict[str, Any]]:
        resp = httpx.post(self.url + "/boot", json=body, timeout=60, headers=ADMIN)
        return resp.status_code, resp.json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Any]:
    started: list[Served] = []

    def start(cloud: str, *args: str) -> Served:
        server = Served(tmp_path, cloud, *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _offline(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(["schedule", *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


# ----------------------------------------------------------------------------- examples
def test_the_one_host_examples_answer_as_nova_offline_and_online(
        tmp_path: Path, served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cloud = tmp_path / "one.yaml"
    cloud.write_text(ONE_HOST)
    nofallback = tmp_path / "nofallback.conf"
    nofallback.write_text("[workarounds]\ndisable_fallback_pcpu_query = true\n")
    server = served(str(cloud))
    strict = served(str(cloud), "--config-file", str(nofallback))
    for flavor in ("avx", "gpu"):
        # No AVX2 trait (the host lists no cpu_info features), no CUSTOM_GPU inventory.
        assert _offline(capsys, str(cloud), "--flavor", flavor)[0] == 4
        status, answer = server.boot(flavor=flavor)
        assert status == 409 and answer["error"]["code"] == "berth.scheduling.no_valid_host"
    # A dedicated-CPU flavor asks for PCPU, which h1 does not have. Nova 34's default
    # ([workarounds] disable_fallback_pcpu_query = False) asks again with VCPU, and
    # NUMATopologyFilter is not among the default filters: it lands on h1 ...
    code, answer = _offline(capsys, str(cloud), "--flavor", "pinned")
    assert code == 0 and answer["instances"][0]["host"] == "h1"
    status, answer = server.boot(flavor="pinned")
    assert status == 200 and answer["instances"][0]["host"] == "h1"
    # ... and without the fallback query there is no host for it.
    assert _offline(capsys, str(cloud), "--flavor", "pinned", "--config-file",
                    str(nofallback))[0] == 4
    assert strict.boot(flavor="pinned")[0] == 409


def test_the_issue_examples_place_with_traits_resources_and_pcpu_when_the_host_has_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cloud = tmp_path / "rich.yaml"
    cloud.write_text(ONE_HOST.replace(
        "local_gb: 100}", "local_gb: 100, cpu_info: {features: [avx2, sse4.2]}, "
        "resources: {CUSTOM_GPU: {total: 4, max_unit: 2}}, cpu_dedicated_set: '8-11'}"))
    for flavor, resource in (("avx", "VCPU"), ("gpu", "CUSTOM_GPU"), ("pinned", "PCPU")):
        code, answer = _offline(capsys, str(cloud), "--flavor", flavor)
        assert code == 0, flavor
        allocations = answer["instances"][0]["allocation_request"]["allocations"]
        assert resource in next(iter(allocations.values()))["resources"]


def test_availability_zones_count_offline_and_online(
        served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = served(EXAMPLE)
    code, answer = _offline(capsys, EXAMPLE, "--flavor", "m1.large", "--az", "az1", "--num", "3")
    assert code == 0
    assert {i["availability_zone"] for i in answer["instances"]} == {"az1"}
    status, online = server.boot(flavor="m1.large", availability_zone="az1", num=3)
    assert status == 200 and {i["availability_zone"] for i in online["instances"]} == {"az1"}
    # A zone no enabled compute service is in: Nova's API refuses it before scheduling.
    assert main(["schedule", EXAMPLE, "--flavor", "m1.large", "--az", "nosuchzone"]) == 3
    assert "'nosuchzone' is not available (available: az1, az2, az3)" in capsys.readouterr().err
    status, answer = server.boot(flavor="m1.large", availability_zone="nosuchzone")
    assert status == 400 and answer["error"]["message"].startswith(
        "availability_zone: the requested availability zone 'nosuchzone' is not available")


def test_a_default_flavor_is_not_taken_for_the_clouds_flavor_with_its_id(
        tmp_path: Path, served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The cloud file's first flavor has id 1, as m1.tiny has among Berth's defaults:
    m1.tiny takes another id, so TypeAffinityFilter keeps an m1.tiny off a host that
    runs the file's flavor, offline and online alike."""
    cloud = tmp_path / "typed.yaml"
    cloud.write_text("hosts: [{host: h1, vcpus: 8, memory_mb: 16384, local_gb: 100, "
                     "instances: [{uuid: 6f1c1b1e-5f0e-4c83-9a43-1b3f0a6f3c11, flavor: big}]}]\n"
                     "flavors: [{name: big, vcpus: 2, memory_mb: 2048, root_gb: 10}]\n")
    conf = tmp_path / "typed.conf"
    conf.write_text("[filter_scheduler]\nenabled_filters = ComputeFilter,TypeAffinityFilter\n")
    server = served(str(cloud), "--config-file", str(conf))
    for flavor, placed in (("big", True), ("m1.tiny", False)):
        code, _ = _offline(capsys, str(cloud), "--flavor", flavor, "--config-file", str(conf))
        status, answer = server.boot(flavor=flavor)
        assert (code, status) == ((0, 200) if placed else (4, 409)), (flavor, answer)
    assert {f["name"]: f["id"] for f in httpx.get(server.url + "/flavors", headers=ADMIN,
                                                   timeout=30).json()["flavors"]}["m1.tiny"] == -1


def test_a_boot_asks_for_the_flavor_s_pci_devices_and_numa_cells_online_too(
        tmp_path: Path, served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The API derives the guest's PCI requests and NUMA topology from the flavor, as
    Nova's API does, before the scheduler sees the request: online the hosts without
    the devices or the cells are filtered out, as offline."""
    cloud = tmp_path / "devices.yaml"
    cloud.write_text("""
hosts:
  - {host: plain, vcpus: 16, memory_mb: 65536, local_gb: 500}
  - {host: gpu, vcpus: 16, memory_mb: 32768, local_gb: 200,
     numa_topology: {cells: [{id: 0, memory: 16384, cpuset: "0-7"},
                             {id: 1, memory: 16384, cpuset: "8-15"}]},
     pci_pools: [{vendor_id: "10de", product_id: "1db4", numa_node: 0, count: 2}]}
flavors:
  - {name: gpu, vcpus: 2, memory_mb: 2048, root_gb: 10,
     extra_specs: {"pci_passthrough:alias": "gpu:1"}}
  - {name: numa2, vcpus: 4, memory_mb: 4096, root_gb: 10, extra_specs: {"hw:numa_nodes": "2"}}
""")
    conf = tmp_path / "devices.conf"
    conf.write_text("[filter_scheduler]\n"
                    "enabled_filters = ComputeFilter,PciPassthroughFilter,NUMATopologyFilter\n"
                    "[pci]\nalias = {\"name\": \"gpu\", \"vendor_id\": \"10de\", "
                    "\"product_id\": \"1db4\", \"device_type\": \"type-PCI\"}\n")
    server = served(str(cloud), "--config-file", str(conf))
    for flavor in ("gpu", "numa2"):
        code, offline = _offline(capsys, str(cloud), "--flavor", flavor, "--config-file",
                                 str(conf))
        status, online = server.boot(flavor=flavor)
        assert (code, status) == (0, 200), online
        assert offline["instances"][0]["host"] == online["instances"][0]["host"] == "gpu"


def test_schedule_json_and_boot_json_have_one_shape(
        served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = served(EXAMPLE, "--seed", "3")
    code, offline = _offline(capsys, EXAMPLE, "--flavor", "m1.large", "--num", "2", "--seed", "3")
    assert code == 0
    assert main(["boot", "--url", server.url, "--flavor", "m1.large", "--num", "2", "--json"]) == 0
    online = json.loads(capsys.readouterr().out)
    assert set(offline) == set(online) == {"instances"}
    for mine, theirs in zip(offline["instances"], online["instances"]):
        # The same fields, and the same values; a boot adds the hosts its builds tried.
        assert set(theirs) - set(mine) == {"tried"} and set(mine) <= set(theirs)
        assert {k: v for k, v in theirs.items() if k != "tried"} == mine


def test_serve_agents_report_the_traits_of_cpu_info(served: Any) -> None:
    server = served(EXAMPLE)
    traits = httpx.get(server.url + "/placement/traits?associated=true",
                       headers={"OpenStack-API-Version": "placement 1.6", "X-Auth-Token": "admin"},
                       timeout=10).json()
    assert "HW_CPU_X86_AVX2" in traits["traits"] and "COMPUTE_NODE" in traits["traits"]


RICH = """
aggregates:
  - {name: rack1, hosts: [g1, g2], availability_zone: az1}
sharing_providers:
  - {name: nfs1, resources: {DISK_GB: {total: 2000}}, aggregates: [rack1]}
hosts:
  - {host: g1, vcpus: 8, memory_mb: 16384, local_gb: 0, traits: [CUSTOM_FAST],
     resources: {CUSTOM_GPU: {total: 4, max_unit: 2}}, cpu_dedicated_set: "8-11",
     providers: [{name: NUMA0}, {name: pf0, parent: NUMA0, resources: {SRIOV_NET_VF: 8},
                  traits: [CUSTOM_PHYSNET_A]}],
     instances: [{uuid: 11111111-1111-4111-8111-111111111111, flavor: gpu}]}
  - {host: g2, vcpus: 8, memory_mb: 16384, local_gb: 100}
flavors:
  - {name: gpu, vcpus: 1, memory_mb: 1024, root_gb: 10, extra_specs: {"resources:CUSTOM_GPU": "2"}}
  - {name: vf, vcpus: 1, memory_mb: 1024, root_gb: 10,
     extra_specs: {"resources1:SRIOV_NET_VF": "1", "trait1:CUSTOM_PHYSNET_A": required}}
  - {name: big, vcpus: 1, memory_mb: 1024, root_gb: 1500}
"""

PLACEMENT = {"OpenStack-API-Version": "placement 1.39", "X-Auth-Token": "admin"}


def test_serve_publishes_nested_and_sharing_providers_and_claims_from_them(
        tmp_path: Path, served: Any) -> None:
    cloud = tmp_path / "rich.yaml"
    cloud.write_text(RICH)
    server = served(str(cloud))
    providers = {p["name"]: p for p in httpx.get(
        server.url + "/placement/resource_providers", headers=PLACEMENT,
        timeout=10).json()["resource_providers"]}
    g1, numa0, pf0, nfs1 = (providers[n] for n in ("g1", "g1_NUMA0", "g1_pf0", "nfs1"))
    assert numa0["parent_provider_uuid"] == g1["uuid"]
    assert pf0["parent_provider_uuid"] == numa0["uuid"] and pf0["root_provider_uuid"] == g1["uuid"]

    def get(path: str) -> Any:
        return httpx.get(server.url + "/placement" + path, headers=PLACEMENT, timeout=10).json()

    assert "MISC_SHARES_VIA_AGGREGATE" in get(f"/resource_providers/{nfs1['uuid']}/traits")["traits"]
    assert get(f"/resource_providers/{g1['uuid']}/inventories")["inventories"]["PCPU"]["total"] == 4
    # The file's gpu instance holds 2 of g1's 4 GPUs, and its disk on the shared storage.
    held = get("/allocations/11111111-1111-4111-8111-111111111111")["allocations"]
    assert held[g1["uuid"]]["resources"]["CUSTOM_GPU"] == 2
    assert held[nfs1["uuid"]]["resources"]["DISK_GB"] == 10
    status, answer = server.boot(flavor="vf")
    assert status == 200 and answer["instances"][0]["host"] == "g1"
    vf = get(f"/allocations/{answer['instances'][0]['instance_uuid']}")["allocations"]
    assert vf[pf0["uuid"]]["resources"] == {"SRIOV_NET_VF": 1}
    # 1,500 GB only the shared storage has; a second one does not fit (2,000 in all).
    status, answer = server.boot(flavor="big")
    assert status == 200
    assert server.boot(flavor="big")[0] == 409


# ----------------------------------------------------------------------------- property
def random_cloud(rng: random.Random) -> dict[str, Any]:
    """A small random cloud: sizes, traits (given or from cpu_info), custom and PCPU
    inventories, a nested VF provider, AZ aggregates, a disabled host, and flavors that
    use them."""
    hosts = []
    for i in range(rng.randint(2, 6)):
        host: dict[str, Any] = {"host": f"h{i}", "vcpus": rng.choice([4, 8, 16]),
                                "memory_mb": rng.choice([4096, 8192, 16384]),
                                "local_gb": rng.choice([40, 100, 200])}
        if rng.random() < 0.5:
            host["cpu_info"] = {"features": rng.sample(["avx2", "sse4.2", "aes", "avx"], 2)}
        if rng.random() < 0.3:
            host["traits"] = rng.sample(["HW_CPU_X86_AVX2", "CUSTOM_FAST", "COMPUTE_NODE"], 2)
        if rng.random() < 0.3:
            host["resources"] = {"CUSTOM_GPU": {"total": rng.randint(1, 4), "max_unit": 2}}
        if rng.random() < 0.3:
            host["cpu_dedicated_set"] = f"{host['vcpus']}-{host['vcpus'] + rng.randint(1, 4)}"
        if rng.random() < 0.2:
            host["providers"] = [{"name": "pf0", "resources": {"SRIOV_NET_VF": 4},
                                  "traits": ["CUSTOM_PHYSNET_A"]}]
        if rng.random() < 0.1:
            host["service"] = {"disabled": True}
        if rng.random() < 0.3:
            host["vcpus_used"] = rng.randint(0, host["vcpus"])
        hosts.append(host)
    names = [h["host"] for h in hosts]
    half = rng.sample(names, max(1, len(names) // 2))
    flavors = [
        {"name": "plain", "vcpus": rng.randint(1, 4), "memory_mb": rng.choice([512, 2048, 4096]),
         "root_gb": rng.choice([1, 20])},
        {"name": "avx", "vcpus": 1, "memory_mb": 1024, "root_gb": 10,
         "extra_specs": {"trait:HW_CPU_X86_AVX2": "required"}},
        {"name": "gpu", "vcpus": 1, "memory_mb": 1024, "root_gb": 10,
         "extra_specs": {"resources:CUSTOM_GPU": "1"}},
        {"name": "pinned", "vcpus": 2, "memory_mb": 1024, "root_gb": 10,
         "extra_specs": {"hw:cpu_policy": "dedicated"}},
        {"name": "vf", "vcpus": 1, "memory_mb": 1024, "root_gb": 1,
         "extra_specs": {"resources1:SRIOV_NET_VF": "1", "trait1:CUSTOM_PHYSNET_A": "required"}},
        {"name": "notfast", "vcpus": 1, "memory_mb": 512, "root_gb": 1,
         "extra_specs": {"trait:CUSTOM_FAST": "forbidden"}},
    ]
    cloud = {"aggregates": [{"name": "zone1", "hosts": half, "availability_zone": "az1"}],
             "hosts": hosts, "flavors": flavors}
    if rng.random() < 0.3:
        cloud["sharing_providers"] = [{"name": "nfs", "aggregates": ["zone1"],
                                       "resources": {"DISK_GB": rng.choice([30, 500])}}]
    return cloud


def random_request(rng: random.Random) -> dict[str, Any]:
    request: dict[str, Any] = {
        "flavor": rng.choice(["plain", "avx", "gpu", "pinned", "vf", "notfast"]),
        "num": rng.randint(1, 3)}
    if rng.random() < 0.3:
        request["availability_zone"] = "az1"
    return request


def _offline_hosts(capsys: pytest.CaptureFixture[str], cloud: str, request: dict[str, Any],
                   seed: int) -> Any:
    argv = [cloud, "--flavor", request["flavor"], "--num", str(request["num"]), "--seed", str(seed)]
    if "availability_zone" in request:
        argv += ["--az", request["availability_zone"]]
    code, answer = _offline(capsys, *argv)
    if code != 0:
        return ("error", code)
    return [(i["instance_uuid"], i["host"], [a["host"] for a in i["alternates"]])
            for i in answer["instances"]]


def _online_hosts(status: int, answer: dict[str, Any]) -> Any:
    if status != 200:
        return ("error", {409: 4, 400: 3}.get(status, status))
    return [(i["instance_uuid"], i["host"], [a["host"] for a in i["alternates"]])
            for i in answer["instances"]]


def _in_process_boot(tmp: Path, cloud: str, request: dict[str, Any], seed: int) -> Any:
    """``POST /boot`` as ``berth serve`` answers it, in this process: the same stack,
    scheduler service, conductor (fake driver) and WSGI app, called over HTTP semantics."""
    stack = open_stack(f"sqlite:///{tmp}/online.sqlite", SchedulerConfig.default())
    try:
        flavors, images = seed_from_cloud(stack, cloud)
        service = stack.scheduler(seed=seed)
        app = SchedulerApp(service, stack.conductor(service), stack.placement_app, flavors,
                           images, groups=stack.groups)
        with httpx.Client(transport=httpx.WSGITransport(app=app),
                          base_url="http://berth.local", headers=ADMIN) as client:
            answer = client.post("/boot", json=request)
        return _online_hosts(answer.status_code, answer.json())
    finally:
        stack.close()


CASES = int(os.environ.get("BERTH_ONE_PATH_CASES", "16"))
PROCESS_CASES = max(1, CASES // 4)


def _random_case(name: str, tmp_path: Path) -> tuple[Path, dict[str, Any], int]:
    """A random cloud file (written), request and seed, the same for the same ``name``."""
    rng = random.Random(name)
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(yaml.safe_dump(random_cloud(rng)))
    return cloud, random_request(rng), rng.randint(0, 10_000)


@pytest.mark.parametrize("case", range(CASES))
def test_offline_and_online_choose_the_same_hosts(
        case: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cloud, request, seed = _random_case(f"one-path:{case}", tmp_path)
    offline = _offline_hosts(capsys, str(cloud), request, seed)
    online = _in_process_boot(tmp_path, str(cloud), request, seed)
    assert offline == online, (request, cloud.read_text())


@pytest.mark.parametrize("case", range(PROCESS_CASES))
def test_offline_and_a_serve_process_choose_the_same_hosts(
        case: int, tmp_path: Path, served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    cloud, request, seed = _random_case(f"one-path-process:{case}", tmp_path)
    offline = _offline_hosts(capsys, str(cloud), request, seed)
    server = served(str(cloud), "--seed", str(seed))
    online = _online_hosts(*server.boot(**request))
    assert offline == online, (request, cloud.read_text())


def test_a_file_s_usage_past_capacity_is_held_over_capacity_as_nova_s_is(stack: Stack,
                                                                         tmp_path: Path) -> None:
    """A host whose file gives it more usage than its capacity (a ratio lowered since):
    placement holds all of it, above capacity, and keeps its inventory as reported, so
    deleting one instance frees nothing that fits; the reports keep the file's usage."""
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(
        "hosts: [{host: h1, vcpus: 16, memory_mb: 65536, local_gb: 500, vcpus_used: 100,"
        " cpu_allocation_ratio: 4.0}]\n")
    seed_from_cloud(stack, str(cloud))
    agent = stack.agents["h1"]
    _, inventories = stack.client.get_inventories(agent.uuid)
    assert (inventories["VCPU"]["reserved"], inventories["VCPU"]["allocation_ratio"]) == (0, 4.0)
    assert stack.client.provider_usages(agent.uuid)["VCPU"] == 100
    assert agent.host_record(0.0).vcpus_used == 100


def test_a_restart_on_the_same_store_raises_no_inventory_for_usage_already_held(
        stack: Stack, tmp_path: Path) -> None:
    """A restart on the same database finds the usage past capacity held already: it
    writes none of it again and never raises the host's inventory, which other processes
    on that database could schedule into while it is raised."""
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(
        "hosts: [{host: h1, vcpus: 16, memory_mb: 65536, local_gb: 500, vcpus_used: 100,"
        " cpu_allocation_ratio: 4.0}]\n")
    seed_from_cloud(stack, str(cloud))
    client = stack.agents["h1"].client
    writes: list[Any] = []
    real = client.set_inventories

    def recording(*args: Any, **kwargs: Any) -> Any:
        writes.append(args[2] if len(args) > 2 else kwargs)
        return real(*args, **kwargs)

    client.set_inventories = recording  # type: ignore[method-assign]
    seed_from_cloud(stack, str(cloud))
    assert all(inv["VCPU"]["allocation_ratio"] == 4.0 for inv in writes if "VCPU" in inv)
    agent = stack.agents["h1"]
    assert stack.client.provider_usages(agent.uuid)["VCPU"] == 100
