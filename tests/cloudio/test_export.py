"""``berth cloud export``: a running ``berth serve --cloud X`` written back is X again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from berth.cloudfile import load_cloud
from berth.service.localcluster import free_port

from .views import cloud_views, differences, node_views

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

NUMA = {"cells": [{"id": 0, "cpuset": [0, 1, 2, 3], "memory": 16384},
                  {"id": 1, "cpuset": [4, 5, 6, 7], "memory": 16384}]}

SOURCE: dict[str, Any] = {
    # cell3, disabled and empty, is known only from the server's cell mappings.
    "cells": [{"name": "cell1"}, {"name": "cell2"}, {"name": "cell3", "disabled": True}],
    "host_defaults": {"hypervisor_type": "QEMU", "hypervisor_version": 8002000,
                      "supported_instances": [["x86_64", "kvm", "hvm"]],
                      "cpu_info": {"arch": "x86_64", "features": ["avx2"]}},
    "hosts": [
        {"host": "a1", "cell": "cell1", "host_ip": "10.0.0.1", "vcpus": 8, "memory_mb": 32768,
         "local_gb": 400, "vcpus_used": 3, "memory_mb_used": 8192, "local_gb_used": 60,
         "cpu_allocation_ratio": 2.0, "ram_allocation_ratio": 1.5, "disk_allocation_ratio": 1.2,
         "numa_topology": NUMA,
         "pci_pools": [{"vendor_id": "8086", "product_id": "154d", "count": 4, "numa_node": 0,
                        "dev_type": "type-VF", "physical_network": "net1"}],
         "metrics": {"cpu.percent": 12.5}, "stats": {"rack": "r1"}, "io_workload": 2,
         "failed_builds": 1,
         "instances": [{"uuid": "0b8f9c3e-0000-4000-8000-0000000000e1", "flavor": "web",
                        "image": "ubuntu", "project_id": "acme"}]},
        {"host": "a2", "cell": "cell1", "vcpus": 16, "memory_mb": 65536, "local_gb": 800,
         "hypervisor_version": 9000000,
         "service": {"disabled": True, "disabled_reason": "maintenance"},
         "instances": [{"uuid": "0b8f9c3e-0000-4000-8000-0000000000e2", "flavor": "web",
                        "image": "windows", "project_id": "beta"}]},
        {"host": "b1", "cell": "cell2", "vcpus": 16, "memory_mb": 65536, "local_gb": 800,
         "service": {"up": False}},
        {"host": "b2", "cell": "cell2", "vcpus": 16, "memory_mb": 65536, "local_gb": 800,
         "service": {"forced_down": True}},
        {"host": "bm", "nodename": "bm-node-1", "cell": "cell2", "vcpus": 4,
         "memory_mb": 8192, "local_gb": 100, "hypervisor_type": "ironic"},
        {"host": "bm", "nodename": "bm-node-2", "cell": "cell2", "vcpus": 4,
         "memory_mb": 8192, "local_gb": 100, "hypervisor_type": "ironic"},
    ],
    "aggregates": [
        {"name": "az1", "availability_zone": "az1", "hosts": ["a1", "a2"]},
        {"name": "az2", "availability_zone": "az2", "hosts": ["b1", "b2", "bm"]},
        {"name": "fast", "hosts": ["a1"], "metadata": {"ssd": "true"}},
    ],
    "flavors": [
        {"name": "web", "vcpus": 2, "memory_mb": 4096, "root_gb": 20, "ephemeral_gb": 5,
         "extra_specs": {"hw:cpu_policy": "shared"}},
        {"name": "m1.small", "vcpus": 1, "memory_mb": 1024, "root_gb": 10,
         "extra_specs": {"aggregate_instance_extra_specs:ssd": "true"}},
    ],
    "images": [
        {"name": "ubuntu", "disk_format": "qcow2", "properties": {"hw_architecture": "x86_64"}},
        {"name": "windows", "disk_format": "raw", "properties": {"os_type": "windows"}},
    ],
    "server_groups": [
        {"name": "web", "policy": "anti-affinity", "rules": {"max_server_per_host": 1},
         "members": ["0b8f9c3e-0000-4000-8000-0000000000e1",
                     "0b8f9c3e-0000-4000-8000-0000000000e2"], "project_id": "acme"},
    ],
}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``berth serve --cloud SOURCE`` in its own process; yields (url, cloud file)."""
    cloud = tmp_path / "source.yaml"
    cloud.write_text(yaml.safe_dump(SOURCE, sort_keys=False))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "serve", "--auth-strategy", "noauth2", "--db", f"sqlite:///{tmp_path}/b.sqlite",
         "--port", str(port), "--cloud", str(cloud), "--seed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "berth serve did not come up"
            time.sleep(0.2)
        yield url, cloud
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _export(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "berth.cli", "cloud", "export", "--url", url,
                           "-o", str(out), *extra], capture_output=True, text=True, timeout=120)


def test_an_export_of_a_served_cloud_file_is_that_cloud_file(
        served: tuple[str, Path], tmp_path: Path) -> None:
    url, source = served
    out = tmp_path / "exported.yaml"
    result = _export(url, out)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("warning")] == []
    now = time.time()
    expected, got = load_cloud(str(source), now=now), load_cloud(str(out), now=now)
    assert differences(node_views(expected), node_views(got)) == []
    want, have = cloud_views(expected), cloud_views(got)
    # The server knows Nova's classic flavors besides the file's (m1.small is the file's):
    # they stay out of the export, which every cloud knows them without.
    assert have["flavors"] == want["flavors"]
    for key in ("aggregates", "images", "server_groups", "cells"):
        assert have[key] == want[key], key


def test_an_instance_booted_online_is_exported_with_its_flavor_and_image(
        served: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = served
    # Onto the two-node service host: the instance is written on the node it was built on.
    resp = httpx.post(url + "/boot", json={"flavor": "m1.small", "image": "ubuntu",
                                           "project_id": "gamma", "force_hosts": ["bm"]},
                      timeout=60, headers=ADMIN)
    assert resp.status_code == 200, resp.text
    booted = resp.json()["instances"][0]
    out = tmp_path / "after.json"
    result = _export(url, out)
    assert result.returncode == 0, result.stderr
    assert out.read_text().lstrip().startswith("{")
    got = load_cloud(str(out))
    row = got.snapshot.row_of(booted["host"], booted["nodename"])
    assert row is not None
    instance = got.snapshot.obj("instances")[row][booted["instance_uuid"]]
    assert instance.instance_type_id == got.flavors["m1.small"].id
    assert instance.image_properties == {"hw_architecture": "x86_64"}
    assert instance.project_id == "gamma"
    # The boot's claim is in placement and in the written usage: the host has 1 vCPU more.
    before = load_cloud(str(served[1]))
    old_row = before.snapshot.row_of(booted["host"], booted["nodename"])
    assert got.snapshot.num("vcpus_used")[row] == before.snapshot.num("vcpus_used")[old_row] + 1


def test_an_unreachable_server_is_one_line_and_exit_7(tmp_path: Path) -> None:
    result = _export(f"http://127.0.0.1:{free_port()}", tmp_path / "x.yaml")
    assert result.returncode == 7
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: http://127.0.0.1:"), result.stderr
    assert "cannot GET /compute-nodes" in lines[0]


def test_an_api_process_without_a_scheduler_of_its_own_says_so_with_a_404() -> None:
    from berth.service.api import SchedulerApp

    app = SchedulerApp(object(), None, None, hosts_view=lambda: {"hosts": []})  # type: ignore[arg-type]
    seen: list[str] = []
    body = b"".join(app({"PATH_INFO": "/compute-nodes", "REQUEST_METHOD": "GET",
                         "HTTP_X_AUTH_TOKEN": "admin"},
                        lambda status, headers: seen.append(status)))
    assert seen == ["404 Not Found"]
    assert b"served by berth serve" in body
