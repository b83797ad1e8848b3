"""NUMA and PCI from a cloud file through ``berth schedule`` (loader, filters, consumption)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from berth.cli import main

CLOUD = """
cells:
  - name: cell1
hosts:
  - {host: "n{index}", count: 2, cell: cell1, vcpus: 16, memory_mb: 16384, local_gb: 100,
     numa_topology: {cells: [
       {id: 0, cpuset: "0-3", pcpuset: "4-7", siblings: [[4, 5], [6, 7]], memory: 8192},
       {id: 1, cpuset: "8-11", pcpuset: "12-15", siblings: [[12, 13], [14, 15]], memory: 8192}]},
     pci_pools: [{vendor_id: "8086", product_id: "1520", numa_node: 1, count: 2}]}
  - {host: flat, cell: cell1, vcpus: 16, memory_mb: 16384, local_gb: 100}
flavors:
  - {name: pinned, vcpus: 4, memory_mb: 2048, root_gb: 1,
     extra_specs: {"hw:cpu_policy": dedicated, "pci_passthrough:alias": "nic:1"}}
  - {name: plain, vcpus: 1, memory_mb: 512, root_gb: 1}
"""
CONF = """
[filter_scheduler]
enabled_filters = ComputeFilter,NUMATopologyFilter,PciPassthroughFilter
[pci]
alias = {"name": "nic", "vendor_id": "8086", "product_id": "1520", "numa_policy": "required"}
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str]:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(CLOUD)
    conf = tmp_path / "nova.conf"
    conf.write_text(CONF)
    return str(cloud), str(conf)


def test_pinned_pci_instances_fill_the_device_cell_of_each_numa_host(
    files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # The NICs sit on cell 1, whose four dedicated CPUs hold one 4-vCPU instance:
    # two NUMA hosts take one each, and a third instance finds no host.
    cloud, conf = files
    assert main(["schedule", cloud, "--flavor", "pinned", "--num", "2", "--config-file", conf,
                 "--json", "--seed", "1"]) == 0
    decision = json.loads(capsys.readouterr().out)
    hosts = sorted(i["host"] for i in decision["instances"])
    assert hosts == ["n1", "n2"]
    limits = decision["instances"][0]["limits"]["numa_topology"]
    assert set(limits) == {"cpu_allocation_ratio", "ram_allocation_ratio"}
    assert main(["schedule", cloud, "--flavor", "pinned", "--num", "3", "--config-file", conf,
                 "--json", "--seed", "1"]) != 0


def test_a_plain_flavor_is_not_constrained_by_the_numa_and_pci_filters(
    files: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cloud, conf = files
    assert main(["schedule", cloud, "--flavor", "plain", "--num", "3", "--config-file", conf,
                 "--json", "--seed", "1"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert len(decision["instances"]) == 3
