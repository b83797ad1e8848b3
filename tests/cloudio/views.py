"""What a loaded cloud file says, as plain data, to compare two clouds field by field."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from berth.cloudfile import Cloud
from berth.snapshot import FLOAT_COLUMNS, INT_COLUMNS

#: The per-node fields of a view, by name.
NODE_FIELDS = (*INT_COLUMNS, *FLOAT_COLUMNS, "service_disabled", "service_forced_down",
               "service_heartbeat", "has_service", "cell_uuid", "hypervisor_type", "cpu_info",
               "stats", "supported_instances", "aggregates", "uuid", "host_ip",
               "hypervisor_hostname", "instances", "metrics", "numa_topology", "pci_stats",
               "disabled_reason")


def _num(value: float) -> float | None:
    return None if math.isnan(value) else round(float(value), 6)


def node_views(cloud: Cloud) -> dict[tuple[str, str], dict[str, Any]]:
    """Every compute node's fields, keyed by (host, node)."""
    snap = cloud.snapshot
    out = {}
    for row in range(len(snap)):
        view: dict[str, Any] = {}
        for name in (*INT_COLUMNS, *FLOAT_COLUMNS, "service_heartbeat"):
            view[name] = _num(snap.num(name)[row])
        for name in ("service_disabled", "service_forced_down", "has_service"):
            view[name] = bool(snap.num(name)[row])
        for name in ("cell_uuid", "hypervisor_type", "stats", "supported_instances"):
            view[name] = snap.interned_value(name, row)
        view["cpu_info"] = json.loads(snap.interned_value("cpu_info", row) or "{}")
        view["aggregates"] = _aggregates_of(cloud, snap.obj("host")[row])
        for name in ("uuid", "host_ip", "hypervisor_hostname"):
            view[name] = snap.obj(name)[row]
        view["instances"] = {u: asdict(i) for u, i in snap.obj("instances")[row].items()}
        view["metrics"] = sorted((m.name, m.value, m.source) for m in snap.obj("metrics")[row])
        numa = snap.obj("numa_topology")[row]
        view["numa_topology"] = numa.to_dict() if numa is not None else None
        pci = snap.obj("pci_stats")[row]
        view["pci_stats"] = pci.to_dict() if pci is not None else None
        service = snap.obj("service")[row]
        view["disabled_reason"] = service.disabled_reason if service is not None else None
        out[(snap.obj("host")[row], snap.obj("nodename")[row])] = view
    return out


def _aggregates_of(cloud: Cloud, host: str) -> list[str]:
    return sorted(a.name for a in cloud.snapshot.aggregates if host in a.hosts)


def cloud_views(cloud: Cloud) -> dict[str, Any]:
    """The cloud's named objects (aggregates, flavors, images, server groups, cells)."""
    return {
        "aggregates": {a.name: {"id": a.id, "uuid": a.uuid, "hosts": sorted(a.hosts),
                                "metadata": a.metadata} for a in cloud.snapshot.aggregates},
        "flavors": {n: asdict(f) for n, f in cloud.flavors.items()},
        "images": {n: {"id": i.id, "disk_format": i.disk_format, "properties": i.properties.raw}
                   for n, i in cloud.images.items()},
        "server_groups": {n: asdict(g) for n, g in cloud.server_groups.items()},
        "cells": {c.uuid: c.disabled for c in cloud.cells.values()},
    }


def differences(expected: dict[Any, dict[str, Any]], got: dict[Any, dict[str, Any]],
                ignore: tuple[str, ...] = ()) -> list[str]:
    """Readable differences between two keyed views, field by field."""
    problems = []
    for key in sorted(set(expected) | set(got), key=str):
        if key not in got:
            problems.append(f"{key}: missing")
            continue
        if key not in expected:
            problems.append(f"{key}: unexpected")
            continue
        for name in sorted(set(expected[key]) | set(got[key])):
            if name in ignore:
                continue
            if expected[key].get(name) != got[key].get(name):
                problems.append(f"{key}.{name}: expected {expected[key].get(name)!r}, "
                                f"got {got[key].get(name)!r}")
    return problems
