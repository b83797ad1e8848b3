"""What a source read from a running cloud, before it becomes a cloud file.

Both sources (:mod:`berth.cloudio.openstack` and :mod:`berth.cloudio.berth_source`)
fill a :class:`CloudState`; :func:`berth.cloudio.emit.to_document` turns it into the
cloud-file document. Flavors, images, aggregates and server groups are already in
cloud-file form (the source knows its own API's shapes); compute nodes and placement
providers stay apart, because a host entry is made of both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Provider:
    """One Placement resource provider with everything the importer reads of it.

    ``allocations`` maps each consumer holding resources on this provider to its
    amounts per resource class (``GET /resource_providers/{uuid}/allocations``).
    """

    uuid: str
    name: str
    parent_uuid: str | None = None
    root_uuid: str | None = None
    inventories: dict[str, dict[str, Any]] = field(default_factory=dict)
    traits: list[str] = field(default_factory=list)
    aggregates: list[str] = field(default_factory=list)
    allocations: dict[str, dict[str, int]] = field(default_factory=dict)

    def used(self, resource_class: str) -> int:
        """The amount of ``resource_class`` all consumers together hold here."""
        return sum(int(amounts.get(resource_class, 0)) for amounts in self.allocations.values())


@dataclass
class ComputeNode:
    """A compute node and its service host, as the compute API describes them.

    ``fields`` are cloud-file host fields the source knows beyond placement
    (``hypervisor_type``, ``cpu_info``, ``numa_topology``, ``stats`` …); ``capacity``
    holds ``vcpus``/``memory_mb``/``local_gb`` and their ``*_used`` as the compute
    reported them, used only for a node placement does not know; ``service`` is the
    cloud-file ``service`` mapping (``disabled``, ``disabled_reason``, ``forced_down``,
    ``up``).
    """

    host: str
    nodename: str
    uuid: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    service: dict[str, Any] = field(default_factory=dict)


@dataclass
class Server:
    """An instance: where it runs (service host and node) and what it was built from."""

    uuid: str
    host: str | None
    nodename: str | None = None
    flavor: str | None = None
    image: str | None = None
    project_id: str | None = None


@dataclass
class CloudState:
    """Everything read from one cloud; ``warnings`` are one line each, naming the object."""

    source: str
    nodes: list[ComputeNode] = field(default_factory=list)
    providers: list[Provider] = field(default_factory=list)
    servers: list[Server] = field(default_factory=list)
    cells: list[dict[str, Any]] = field(default_factory=list)
    aggregates: list[dict[str, Any]] = field(default_factory=list)
    flavors: list[dict[str, Any]] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    server_groups: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        """Record one warning line."""
        self.warnings.append(message)


def names_list(names: list[str], shown: int = 3) -> str:
    """``a, b, c (+4 more)``: the objects one warning is about."""
    head = ", ".join(names[:shown])
    return head + (f" (+{len(names) - shown} more)" if len(names) > shown else "")
