"""Nova's databases for the tests: the tables (the columns Berth reads) seeded with
compute nodes, services, instances, cells and an aggregate, on SQLite or MariaDB."""

from __future__ import annotations

import datetime as dt
import json
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from berth.nova import hoststate as hs
from berth.nova.primitives import primitive

NOW = dt.datetime(2026, 11, 27, 12, 0, 0)
CELL1 = str(uuid.uuid4())
CELL2 = str(uuid.uuid4())


def numa_primitive() -> str:
    pages = primitive("NUMAPagesTopology", "1.1", {"size_kb": 4, "total": 4096, "used": 0,
                                                   "reserved": 0})
    cells = [primitive("NUMACell", "1.5", {
        "id": i, "cpuset": [i * 4, i * 4 + 1], "pcpuset": [i * 4 + 2, i * 4 + 3],
        "memory": 16384, "cpu_usage": 0, "memory_usage": 0, "pinned_cpus": [],
        "siblings": [[i * 4, i * 4 + 1], [i * 4 + 2, i * 4 + 3]], "mempages": [pages],
        "network_metadata": primitive("NetworkMetadata", "1.0",
                                      {"physnets": ["public"], "tunneled": False})})
        for i in range(2)]
    return json.dumps(primitive("NUMATopology", "1.2", {"cells": cells}))


def pci_primitive() -> str:
    return json.dumps(primitive("PciDevicePoolList", "1.1", {"objects": [
        primitive("PciDevicePool", "1.1", {"product_id": "1520", "vendor_id": "8086",
                                           "numa_node": 1, "tags": {"dev_type": "type-VF",
                                                                    "physical_network": "p1"},
                                           "count": 4})]}))


def node_row(node_id: int, host: str, service_id: int, **extra: Any) -> dict[str, Any]:
    row = {"id": node_id, "uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, host)),
           "service_id": service_id, "host": host, "hypervisor_hostname": f"{host}.node",
           "vcpus": 8, "vcpus_used": 2, "memory_mb": 32768, "memory_mb_used": 4608,
           "free_ram_mb": 28160, "local_gb": 500, "local_gb_used": 40, "free_disk_gb": 460,
           "disk_available_least": 400, "hypervisor_version": 8002000,
           "hypervisor_type": "QEMU", "host_ip": "10.0.0.1",
           "cpu_info": json.dumps({"arch": "x86_64", "features": ["avx"]}),
           "supported_instances": json.dumps([["x86_64", "kvm", "hvm"]]),
           "stats": json.dumps({"num_instances": "1", "io_workload": "0"}),
           "metrics": "[]", "numa_topology": None, "pci_stats": None,
           "cpu_allocation_ratio": 4.0, "ram_allocation_ratio": 1.0,
           "disk_allocation_ratio": 1.0, "created_at": NOW, "updated_at": NOW,
           "deleted_at": None, "deleted": 0}
    row.update(extra)
    return row


def service_row(service_id: int, host: str, **extra: Any) -> dict[str, Any]:
    row = {"id": service_id, "host": host, "binary": "nova-compute", "disabled": False,
           "disabled_reason": None, "forced_down": False, "last_seen_up": NOW,
           "created_at": NOW, "updated_at": NOW, "deleted_at": None, "deleted": 0}
    row.update(extra)
    return row


def seed(api: Any, cells: dict[str, Any]) -> None:
    hs.NOVA_TABLES.create_all(api, tables=[hs.cell_mappings, hs.aggregates,
                                           hs.aggregate_hosts, hs.aggregate_metadata,
                                           hs.host_mappings])
    for engine in cells.values():
        hs.NOVA_TABLES.create_all(engine, tables=[hs.compute_nodes, hs.services, hs.instances])
    with api.begin() as conn:
        conn.execute(sa.insert(hs.cell_mappings), [
            {"id": 1, "uuid": hs.CELL0_UUID, "name": "cell0", "database_connection": "x://",
             "disabled": False},
            {"id": 2, "uuid": CELL1, "name": "cell1",
             "database_connection": "{scheme}:///{path}", "disabled": False},
            {"id": 3, "uuid": CELL2, "name": "cell2",
             "database_connection": str(cells[CELL2].url), "disabled": True}])
        conn.execute(sa.insert(hs.aggregates), [{"id": 1, "uuid": str(uuid.uuid4()),
                                                 "name": "fast"}])
        conn.execute(sa.insert(hs.aggregate_hosts), [{"id": 1, "host": "a1",
                                                      "aggregate_id": 1}])
        conn.execute(sa.insert(hs.aggregate_metadata), [
            {"id": 1, "aggregate_id": 1, "key": "availability_zone", "value": "az1"}])
    with cells[CELL1].begin() as conn:
        conn.execute(sa.insert(hs.services), [service_row(1, "a1"), service_row(
            2, "a2", disabled=True, disabled_reason="maintenance"),
            service_row(3, "a3", last_seen_up=NOW - dt.timedelta(hours=1)),
            {**service_row(4, "a1"), "binary": "nova-conductor"}])
        conn.execute(sa.insert(hs.compute_nodes), [
            node_row(1, "a1", 1, numa_topology=numa_primitive(), pci_stats=pci_primitive()),
            node_row(2, "a2", 2), node_row(3, "a3", 3),
            node_row(4, "gone", 9, deleted=4, deleted_at=NOW)])
        conn.execute(sa.insert(hs.instances), [
            {"id": 1, "uuid": "i-1", "host": "a1", "instance_type_id": 5, "project_id": "p",
             "created_at": NOW, "updated_at": NOW, "deleted_at": None, "deleted": 0},
            {"id": 2, "uuid": "i-2", "host": "a1", "instance_type_id": 5, "project_id": "p",
             "created_at": NOW, "updated_at": NOW, "deleted_at": NOW, "deleted": 2}])
    with cells[CELL2].begin() as conn:
        conn.execute(sa.insert(hs.services), [service_row(1, "b1")])
        conn.execute(sa.insert(hs.compute_nodes), [node_row(1, "b1", 1)])


def mariadb_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 3306), timeout=1):
            return True
    except OSError:
        return False




MARIADB = "mysql+pymysql://root@127.0.0.1:3306/{}"


@contextmanager
def mariadb_databases(*keys: str) -> Iterator[dict[str, str]]:
    """Fresh MariaDB databases (their URLs by key), dropped afterwards."""
    admin = sa.create_engine(MARIADB.format(""))
    names = {k: f"berth_nova_{uuid.uuid4().hex[:8]}_{k}" for k in keys}
    with admin.begin() as conn:
        for name in names.values():
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield {k: MARIADB.format(name) for k, name in names.items()}
    finally:
        with admin.begin() as conn:
            for name in names.values():
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()
