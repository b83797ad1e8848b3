"""Synthetic clouds for benchmarks: N compute nodes built directly as HostRecords.

    from synthetic import make_cloud, requests
    cloud = make_cloud(10_000, seed=1)
    snap = cloud.snapshot()                   # a fresh HostSnapshot (timed separately)
    req = requests(cloud)["medium"]

Deterministic for a given ``(n, seed)``. What varies, and why it matters for speed:

* three hardware sizes (32/64/96 vCPU, 128/256/512 GiB, 1/2/4 TB) with random usage, so
  weights rarely tie and RAM/disk/core filters keep most but not all hosts;
* four cells, three availability zones, and aggregates with metadata (``ssd``, ``gpu``,
  ``hw_class``, tenant isolation, per-aggregate ``max_instances_per_host`` and
  ``ram_weight_multiplier`` overrides), giving a few dozen membership signatures;
* a few ``cpu_info`` / ``supported_instances`` / hypervisor variants (interned columns);
* ``stats`` with ``num_instances``, ``io_workload`` and ``failed_builds`` (low cardinality);
* a few instance stubs on most hosts (for Same/DifferentHost and server groups);
* about 1% disabled services and a few stale heartbeats;
* optionally several nodes per service host (``nodes_per_host``), whose instances every
  node of the host sees;
* NUMA topologies on every 10th host and PCI pools on every 20th, when
  ``berth.hardware`` provides ``NUMATopology.from_dict`` / ``PciDeviceStats.from_pools``.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from berth.model import (
    Aggregate,
    Flavor,
    ImageMeta,
    Instance,
    InstanceGroup,
    RequestSpec,
    ServiceRecord,
)
from berth.snapshot import HostRecord, HostSnapshot

#: The scheduling instant every benchmark uses.
NOW = 1_700_000_000.0

CELLS = tuple(f"c0ffee00-0000-4000-8000-00000000000{i}" for i in range(1, 5))
AZS = ("az1", "az2", "az3")
TENANT = "tenant-isolated"

_SIZES = (  # vcpus, ram_mb, disk_gb
    (32, 128 * 1024, 1000),
    (64, 256 * 1024, 2000),
    (96, 512 * 1024, 4000),
)
_CPU_INFOS = tuple(
    json.dumps(info, sort_keys=True)
    for info in (
        {"arch": "x86_64", "vendor": "Intel", "model": "Skylake-Server",
         "features": ["aes", "avx", "avx2", "sse4.2", "vmx"],
         "topology": {"sockets": 2, "cores": 16, "threads": 2}, "maxphysaddr": {"bits": 46}},
        {"arch": "x86_64", "vendor": "Intel", "model": "Cascadelake-Server",
         "features": ["aes", "avx", "avx2", "avx512f", "sse4.2", "vmx"],
         "topology": {"sockets": 2, "cores": 24, "threads": 2}, "maxphysaddr": {"bits": 46}},
        {"arch": "x86_64", "vendor": "AMD", "model": "EPYC-Rome",
         "features": ["aes", "avx", "avx2", "sse4.2", "svm"],
         "topology": {"sockets": 1, "cores": 64, "threads": 2}, "maxphysaddr": {"bits": 48}},
        {"arch": "aarch64", "vendor": "ARM", "model": "Neoverse-N1",
         "features": ["aes", "asimd", "sha2"],
         "topology": {"sockets": 1, "cores": 80, "threads": 1}, "maxphysaddr": {"bits": 48}},
    )
)
_HV_VERSIONS = (6_002_000, 7_002_000, 8_000_000)


@dataclass
class SyntheticCloud:
    """Host records and aggregates of a synthetic cloud, plus handles for requests."""

    n: int
    records: list[HostRecord]
    aggregates: list[Aggregate]
    #: A few existing instance uuids (same_host / different_host hints, group members).
    sample_instances: list[str] = field(default_factory=list)
    has_numa: bool = False
    has_pci: bool = False

    def snapshot(self) -> HostSnapshot:
        """A fresh snapshot of the cloud (this is what the snapshot-build figure times)."""
        return HostSnapshot.from_records(self.records, self.aggregates)


def _hardware() -> tuple[Any, Any]:
    """``(NUMATopology, PciDeviceStats)`` classes if ``berth.hardware`` has them."""
    numa_cls = pci_cls = None
    try:
        from berth.hardware.numa import NUMATopology

        if hasattr(NUMATopology, "from_dict"):
            numa_cls = NUMATopology
    except ImportError:
        pass
    try:
        from berth.hardware.pci import PciDeviceStats

        if hasattr(PciDeviceStats, "from_pools"):
            pci_cls = PciDeviceStats
    except ImportError:
        pass
    return numa_cls, pci_cls


def _numa_dict(vcpus: int, ram_mb: int) -> dict[str, Any]:
    half = vcpus // 2
    return {
        "cells": [
            {"id": cell, "cpuset": list(range(cell * half, (cell + 1) * half)),
             "pcpuset": [], "memory": ram_mb // 2, "cpu_usage": 0, "memory_usage": 0,
             "pinned_cpus": [], "siblings": [], "mempages": [
                 {"size_kb": 4, "total": ram_mb // 2 * 256, "used": 0, "reserved": 0}]}
            for cell in range(2)
        ]
    }


def _pci_pools() -> list[dict[str, Any]]:
    return [
        {"vendor_id": "8086", "product_id": "154d", "numa_node": 0, "count": 4,
         "dev_type": "type-PF", "physical_network": "physnet1", "tags": {}},
        {"vendor_id": "10de", "product_id": "1eb8", "numa_node": 1, "count": 2,
         "dev_type": "type-PCI", "tags": {}},
    ]


def make_cloud(n: int, seed: int = 0, with_hardware: bool = True,
               nodes_per_host: int = 1) -> SyntheticCloud:
    """A deterministic synthetic cloud of ``n`` compute nodes (see the module docstring);
    with ``nodes_per_host`` > 1, consecutive nodes share a service host (Ironic-style)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of long-lived objects: generational GC passes are pure waste
    try:
        return _make_cloud(n, seed, with_hardware, max(1, nodes_per_host))
    finally:
        if gc_was_enabled:
            gc.enable()


def _make_cloud(n: int, seed: int, with_hardware: bool, nodes_per_host: int) -> SyntheticCloud:
    rng = np.random.default_rng(seed)
    size = rng.integers(0, len(_SIZES), n)
    used_frac = rng.uniform(0.0, 0.95, n)
    disk_frac = rng.uniform(0.0, 0.9, n)
    cpu_frac = rng.uniform(0.0, 1.2, n)
    n_inst = rng.integers(0, 40, n)
    io_ops = rng.integers(0, 9, n)
    failed = np.where(rng.random(n) < 0.02, rng.integers(1, 4, n), 0)
    cpu_variant = rng.choice(len(_CPU_INFOS), n, p=(0.4, 0.35, 0.2, 0.05))
    hv_variant = rng.integers(0, len(_HV_VERSIONS), n)
    disabled = rng.random(n) < 0.01
    stale = rng.random(n) < 0.005
    heartbeat_age = rng.uniform(0, 50, n)
    updated_age = rng.uniform(0, 120, n)
    stubs = rng.integers(0, 4, n)
    numa_cls, pci_cls = _hardware() if with_hardware else (None, None)

    names = [f"cn{i:06d}" for i in range(n)]
    hosts = names if nodes_per_host == 1 else [f"svc{i // nodes_per_host:06d}" for i in range(n)]
    records: list[HostRecord] = []
    sample: list[str] = []
    for i in range(n):
        vcpus, ram, disk = _SIZES[size[i]]
        ram_used = int(ram * used_frac[i])
        disk_used_gb = int(disk * disk_frac[i])
        name = names[i]
        arch = "aarch64" if cpu_variant[i] == 3 else "x86_64"
        instances = {
            f"inst-{i}-{k}": Instance(uuid=f"inst-{i}-{k}", instance_type_id=1 + k % 3,
                                      project_id="tenant-a")
            for k in range(int(stubs[i]))
        }
        if instances and i % max(1, n // 8) == 0:
            sample.append(next(iter(instances)))
        numa = None
        if numa_cls is not None and i % 10 == 0:
            numa = numa_cls.from_dict(_numa_dict(vcpus, ram))
        pci = None
        if pci_cls is not None and i % 20 == 0:
            pci = pci_cls.from_pools(_pci_pools())
        records.append(HostRecord(
            host=hosts[i],
            nodename=name,
            cell_uuid=CELLS[i % len(CELLS)],
            uuid=f"00000000-0000-4000-8000-{i:012d}",
            total_usable_ram_mb=ram,
            free_ram_mb=ram - ram_used,
            total_usable_disk_gb=disk,
            disk_mb_used=disk_used_gb * 1024,
            free_disk_mb=(disk - disk_used_gb) * 1024,
            vcpus_total=vcpus,
            vcpus_used=int(vcpus * cpu_frac[i]),
            hypervisor_type="QEMU",
            hypervisor_version=_HV_VERSIONS[hv_variant[i]],
            hypervisor_hostname=name,
            host_ip=f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
            cpu_info=_CPU_INFOS[cpu_variant[i]],
            supported_instances=[[arch, "kvm", "hvm"]],
            stats={"num_instances": str(n_inst[i]), "io_workload": str(io_ops[i]),
                   "failed_builds": str(failed[i])},
            numa_topology=numa,
            pci_stats=pci,
            cpu_allocation_ratio=4.0 if i % 7 else 2.0,
            ram_allocation_ratio=1.0 if i % 5 else 1.5,
            disk_allocation_ratio=1.0,
            service=ServiceRecord(
                host=hosts[i], disabled=bool(disabled[i]),
                last_seen_up=NOW - (600.0 if stale[i] else float(heartbeat_age[i])),
            ),
            instances=instances,
            updated=NOW - float(updated_age[i]),
        ))
    return SyntheticCloud(n, records, _aggregates(list(dict.fromkeys(hosts))), sample,
                          has_numa=numa_cls is not None, has_pci=pci_cls is not None)


def _aggregates(names: list[str]) -> list[Aggregate]:
    """AZs, feature aggregates, a tenant-isolated aggregate and override aggregates."""
    aggs: list[Aggregate] = []

    def add(name: str, members: list[str], **metadata: str) -> None:
        aggs.append(Aggregate(id=len(aggs) + 1, name=name, uuid=f"agg-{name}",
                              hosts=tuple(members), metadata=metadata))

    for k, az in enumerate(AZS):
        add(az, names[k::len(AZS)], availability_zone=az)
    add("ssd", names[::5], ssd="true")
    add("gpu", names[::20], gpu="true", hw_class="accel")
    add("general", [h for i, h in enumerate(names) if i % 20], hw_class="standard")
    add("isolated", names[3::50], filter_tenant_id=TENANT)
    add("dense", names[1::11], max_instances_per_host="60", max_io_ops_per_host="12")
    add("ram-spread", names[2::13], ram_weight_multiplier="2.0")
    return aggs


def flavors() -> dict[str, Flavor]:
    """The flavor shapes requests use."""
    return {
        "small": Flavor("b.small", vcpus=1, memory_mb=2048, root_gb=20, id=1),
        "medium": Flavor("b.medium", vcpus=4, memory_mb=16384, root_gb=80, id=2),
        "large": Flavor("b.large", vcpus=16, memory_mb=65536, root_gb=160, ephemeral_gb=100,
                        id=3),
    }


def request(
    cloud: SyntheticCloud,
    shape: str = "medium",
    *,
    heavy: bool = False,
    num_instances: int = 1,
) -> RequestSpec:
    """A request of one flavor shape; ``heavy`` adds what the heavy filter set reads.

    The heavy request has an ``hw_class`` extra spec (AggregateInstanceExtraSpecsFilter),
    a ``different_host`` hint naming two existing instances (SameHostFilter has no hint
    and passes every host), a JsonFilter query, a project id (tenant isolation) and an
    anti-affinity server group.
    """
    flavor = flavors()[shape]
    extra_specs: dict[str, str] = {}
    hints: dict[str, Any] = {}
    if heavy:
        extra_specs = {"aggregate_instance_extra_specs:hw_class": "standard"}
        hints = {
            "different_host": cloud.sample_instances[:2],
            "query": json.dumps(["and", [">=", "$free_ram_mb", flavor.memory_mb],
                                 [">=", "$free_disk_mb", flavor.root_gb * 1024]]),
        }
    flavor = Flavor(flavor.name, flavor.vcpus, flavor.memory_mb, flavor.root_gb,
                    flavor.ephemeral_gb, flavor.swap, flavor.id, extra_specs=extra_specs)
    image = ImageMeta(id="image-1", properties={
        "hw_architecture": "x86_64", "img_hv_type": "kvm", "hw_vm_mode": "hvm"})
    return RequestSpec(
        flavor=flavor, image=image, scheduler_hints=hints or None, project_id="tenant-a",
        num_instances=num_instances,
        instance_group=InstanceGroup(policy="anti-affinity", uuid="group-1", name="g",
                                     members=[]) if heavy else None,
    )
