"""AvailabilityZoneFilter: pass hosts in the requested availability zone.

A host's zones are the ``availability_zone`` values of its aggregates; a host in no such
aggregate is in ``[DEFAULT] default_availability_zone`` (``nova``). The requested zone may
list several zones separated by commas ("az1,az2"): the host passes if it is in any of
them. Removed from Nova in 28.0.0 (reference §12.8); kept for the seeds' configurations.
Lever: the request's zone, the aggregates' ``availability_zone`` metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.filters.utils import metadata_by_key

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.aggregate import Aggregate
    from berth.model.request import RequestSpec

AZ_KEY = "availability_zone"


def requested_zones(availability_zone: str) -> list[str]:
    """The zones of a request: comma-separated, each stripped; the raw string if no piece
    is left (so ``","`` is compared as is)."""
    zones = [z.strip() for z in availability_zone.split(",") if z.strip()]
    return zones or [availability_zone]


def host_zones(aggregates: Iterable[Aggregate], default_zone: str) -> set[str]:
    """The host's zones (comma-split aggregate values), or ``{default_zone}`` if none."""
    metadata = metadata_by_key(aggregates, key=AZ_KEY)
    if AZ_KEY in metadata:
        return metadata[AZ_KEY]
    return {default_zone}


class AvailabilityZoneFilter(BaseHostFilter):
    """Pass hosts in the requested availability zone (any of a comma-separated list)."""

    run_filter_once_per_request: ClassVar[bool] = True

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``not in availability zone`` with the requested and the host's zones, else None."""
        requested = spec_obj.availability_zone
        if not requested:
            return None
        zones = host_zones(host_state.aggregates, self.config.default_availability_zone)
        if any(z in zones for z in requested_zones(requested)):
            return None
        return Reject.of("not in availability zone", requested=requested,
                         host_zones=",".join(sorted(zones)))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Once per aggregate-membership signature."""
        requested = spec_obj.availability_zone
        if not requested:
            return np.ones(len(hosts), dtype=bool)
        wanted = requested_zones(requested)
        default = self.config.default_availability_zone
        unique, inverse = hosts.signatures("aggregates")
        snapshot = hosts.snapshot
        verdicts = np.array(
            [
                any(z in host_zones(snapshot.aggregates_of_signature(int(c)), default)
                    for z in wanted)
                for c in unique.tolist()
            ],
            dtype=bool,
        )
        return verdicts[inverse] if len(unique) else np.ones(len(hosts), dtype=bool)
