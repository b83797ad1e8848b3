"""Records a compute host reports: its instances, its service row and its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Instance:
    """An instance known to be on a host (often a stub holding only the uuid).

    ``instance_type_id`` is the flavor id (TypeAffinityFilter); ``image_properties`` the
    properties of the image it was built from (ImagePropertiesWeigher).
    """

    uuid: str
    instance_type_id: int | str | None = None
    image_properties: dict[str, Any] = field(default_factory=dict)
    project_id: str | None = None
    #: Berth: the NUMA cells and PCI requests its compute claimed for it, as JSON
    #: (``{"numa": InstanceNUMATopology.to_dict(), "pci": [InstancePCIRequest.to_dict()]}``),
    #: kept in the host's stored record so that a restarted agent claims them again.
    claims: dict[str, Any] | None = None


@dataclass(frozen=True)
class MetricItem:
    """One monitor metric of a host (Nova's ``MonitorMetric``)."""

    name: str
    value: float
    timestamp: float | None = None
    source: str | None = None


@dataclass(frozen=True)
class ServiceRecord:
    """The nova-compute service row of a host, as ComputeFilter reads it.

    Timestamps are seconds since the epoch (UTC); ``last_seen_up`` None falls back to
    ``created_at``, as Nova's db servicegroup driver does.
    """

    host: str
    disabled: bool = False
    disabled_reason: str | None = None
    forced_down: bool = False
    last_seen_up: float | None = None
    created_at: float | None = None
    updated_at: float | None = None
    binary: str = "nova-compute"
    topic: str = "compute"

    def as_dict(self) -> dict[str, Any]:
        """The read-only dict Nova exposes as ``host_state.service``."""
        return {
            "host": self.host,
            "binary": self.binary,
            "topic": self.topic,
            "disabled": self.disabled,
            "disabled_reason": self.disabled_reason,
            "forced_down": self.forced_down,
            "last_seen_up": self.last_seen_up,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
