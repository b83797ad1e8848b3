"""Small builders for test data: hosts, clouds and requests.

    snap = cloud(host("h1", free_ram_mb=2048).in_aggregate("fast", ssd="true"),
                 host("h2", free_ram_mb=512))
    hs = state(snap, "h1")                      # a HostState view
    req = spec(memory_mb=1024, extra_specs={"ssd": "true"})
"""

from __future__ import annotations

from typing import Any

import numpy as np

from berth.filters.base import BaseHostFilter
from berth.host_state import HostState, WorkingSet
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

NOW = 1_700_000_000.0


class HostBuilder:
    """Builds one HostRecord plus the aggregates it belongs to."""

    def __init__(self, name: str, node: str | None = None, **fields: Any) -> None:
        defaults: dict[str, Any] = {
            "total_usable_ram_mb": 8192,
            "free_ram_mb": 8192,
            "total_usable_disk_gb": 100,
            "free_disk_mb": 100 * 1024,
            "vcpus_total": 8,
            "vcpus_used": 0,
            "hypervisor_type": "QEMU",
            "hypervisor_version": 6000000,
            "supported_instances": [["x86_64", "kvm", "hvm"]],
            "cpu_info": '{"vendor": "Intel", "features": ["aes", "mmx"], "maxphysaddr": {"bits": 46}}',
            "service": ServiceRecord(host=name, last_seen_up=NOW),
        }
        defaults.update(fields)
        instances = defaults.pop("instances", {})
        if isinstance(instances, (list, tuple, set)):
            instances = {u: Instance(uuid=u) for u in instances}
        self.record = HostRecord(host=name, nodename=node, instances=instances, **defaults)
        self.aggregates: list[tuple[str, dict[str, str]]] = []

    def in_aggregate(self, name: str, **metadata: str) -> HostBuilder:
        """Put this host in aggregate ``name`` with ``metadata`` (merged across hosts)."""
        self.aggregates.append((name, {k: str(v) for k, v in metadata.items()}))
        return self


def host(name: str = "host1", node: str | None = None, **fields: Any) -> HostBuilder:
    """A host builder with sensible defaults (8 vCPU, 8 GiB, 100 GB, KVM x86_64, up)."""
    return HostBuilder(name, node, **fields)


def cloud(*builders: HostBuilder) -> HostSnapshot:
    """A snapshot of the built hosts; aggregates with the same name are merged."""
    aggs: dict[str, tuple[list[str], dict[str, str]]] = {}
    for b in builders:
        for name, metadata in b.aggregates:
            hosts, md = aggs.setdefault(name, ([], {}))
            if b.record.host not in hosts:
                hosts.append(b.record.host)
            md.update(metadata)
    aggregates = [
        Aggregate(id=i + 1, name=name, uuid=f"agg-{name}", hosts=tuple(hosts), metadata=md)
        for i, (name, (hosts, md)) in enumerate(aggs.items())
    ]
    return HostSnapshot.from_records([b.record for b in builders], aggregates)


def working_set(snapshot: HostSnapshot, now: float = NOW) -> WorkingSet:
    """A fresh request working set."""
    return WorkingSet(snapshot, now)


def state(snapshot: HostSnapshot, name: str, node: str | None = None, now: float = NOW) -> HostState:
    """The HostState view of one host in a fresh working set."""
    row = snapshot.row_of(name, node)
    assert row is not None, name
    return WorkingSet(snapshot, now).host_state(row)


def spec(
    *,
    vcpus: int = 1,
    memory_mb: int = 512,
    root_gb: int = 1,
    ephemeral_gb: int = 0,
    swap: int = 0,
    flavor_name: str = "m1.test",
    flavor_id: int | str | None = 1,
    extra_specs: dict[str, str] | None = None,
    image_props: dict[str, Any] | None = None,
    image_id: str | None = "image-1",
    no_image: bool = False,
    hints: dict[str, Any] | None = None,
    group: InstanceGroup | None = None,
    **fields: Any,
) -> RequestSpec:
    """A request spec with a flavor, an image and optional hints / server group."""
    flavor = Flavor(
        name=flavor_name, vcpus=vcpus, memory_mb=memory_mb, root_gb=root_gb,
        ephemeral_gb=ephemeral_gb, swap=swap, id=flavor_id, extra_specs=dict(extra_specs or {}),
    )
    image = None if no_image else ImageMeta(id=image_id, properties=image_props or {})
    return RequestSpec(flavor=flavor, image=image, scheduler_hints=hints, instance_group=group, **fields)


def passes_per_host(f: BaseHostFilter, snapshot: HostSnapshot, req: RequestSpec, now: float = NOW) -> list[bool]:
    """The per-host path: ``host_passes`` on each row, in a fresh working set."""
    ws = WorkingSet(snapshot, now)
    return [f.host_passes(ws.host_state(r), req) for r in range(len(snapshot))]


def passes_bulk(f: BaseHostFilter, snapshot: HostSnapshot, req: RequestSpec, now: float = NOW) -> list[bool]:
    """The bulk path: ``filter_all_hosts`` over every row, in a fresh working set."""
    ws = WorkingSet(snapshot, now)
    mask = f.filter_all_hosts(ws.hosts(np.arange(len(snapshot))), req)
    return [bool(x) for x in mask]
