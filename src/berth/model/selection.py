"""The scheduler's answer for one instance: a host (the first) or an alternate."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The fields of Nova's ``SchedulerLimits``; ``limits`` keys a filter sets beyond these
#: do not reach the compute (``SchedulerLimits.from_dict`` keeps only its fields).
SCHEDULER_LIMIT_FIELDS = ("numa_topology", "vcpu", "disk_gb", "memory_mb")
#: The ``SchedulerLimits`` fields that are IntegerFields (coerced with ``int()``).
INTEGER_LIMIT_FIELDS = ("vcpu", "disk_gb", "memory_mb")


def selection_dict(selection: Selection) -> dict[str, Any]:
    """A selection as JSON-ready data (reference §8.4 fields), as every answer prints it:
    ``berth schedule --json``, ``POST /boot`` and the move routes."""
    return {
        "host": selection.service_host,
        "nodename": selection.nodename,
        "compute_node_uuid": selection.compute_node_uuid,
        "cell_uuid": selection.cell_uuid,
        "availability_zone": selection.availability_zone,
        "limits": {k: _jsonable(v) for k, v in selection.limits.items()},
        "allocation_request": selection.allocation_request_dict,
        "allocation_request_version": selection.allocation_request_version,
    }


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return repr(value)


def scheduler_limits(limits: Mapping[str, Any]) -> dict[str, Any]:
    """``SchedulerLimits.from_dict(limits).to_dict()`` (reference §8.4): only the
    ``SchedulerLimits`` fields that are set, ``vcpu``/``disk_gb``/``memory_mb`` as
    integers (``int()`` truncates, as Nova's IntegerField does: 1501.5 MB -> 1501).
    ``numa_topology`` stays the limits object."""
    out: dict[str, Any] = {}
    for name in SCHEDULER_LIMIT_FIELDS:
        value = limits.get(name)
        if value is None:
            continue
        out[name] = int(value) if name in INTEGER_LIMIT_FIELDS else value
    return out


@dataclass(frozen=True)
class Selection:
    """Nova's ``Selection`` (version 1.1), built from a host state by the pipeline.

    ``allocation_request`` is the JSON text of the placement allocation request (the
    string ``"null"`` when there is none), exactly as Nova serializes it. ``limits`` is
    what ``SchedulerLimits`` holds (see :func:`scheduler_limits`).
    """

    compute_node_uuid: str | None
    service_host: str
    nodename: str
    cell_uuid: str | None
    limits: dict[str, Any] = field(default_factory=dict)
    allocation_request: str = "null"
    allocation_request_version: str | None = None
    availability_zone: str | None = None

    @property
    def allocation_request_dict(self) -> dict[str, Any] | None:
        """The decoded allocation request, or None."""
        value = json.loads(self.allocation_request)
        return value if isinstance(value, dict) else None

    def to_dict(self) -> dict[str, Any]:
        """Nova's legacy form: host, nodename and the set ``SchedulerLimits`` fields, with
        ``numa_topology`` as a primitive (so the dict is JSON-serializable)."""
        limits = scheduler_limits(self.limits)
        numa = limits.get("numa_topology")
        if numa is not None and hasattr(numa, "to_dict"):
            limits["numa_topology"] = numa.to_dict()
        return {"host": self.service_host, "nodename": self.nodename, "limits": limits}
