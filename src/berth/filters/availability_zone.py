"""AvailabilityZoneFilter: pass hosts in the requested availability zone.

A host's zones are the ``availability_zone`` values of its aggregates (a value may list
several, comma-separated: a host in "az1,az2" is in both); a host in no such aggregate is
in ``[DEFAULT] default_availability_zone`` (``nova``). The requested zone is one zone,
compared whole, as Nova's code does. Removed from Nova in 28.0.0 (reference §12.8); kept
for the seeds' configurations. Lever: the request's zone, the aggregates'
``availability_zone`` metadata.

Seed 000 says a request may name several zones with a comma and match any of them; Nova's
filter never split the request (its API refuses such a zone name anyway, and the
placement pre-filter ``map_az_to_placement_aggregate`` looks for an aggregate whose zone
is the whole string). Berth follows the code, so that the filter and the pre-filter
agree; a rejection of a request whose zone has a comma says so (``note``).
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
    from berth.snapshot import HostSnapshot

AZ_KEY = "availability_zone"


#: Why a requested zone with a comma matches no host (see the module docstring).
COMMA_NOTE = "a request names one zone: Nova does not split a requested 'az1,az2'"


def host_zones(aggregates: Iterable[Aggregate], default_zone: str) -> set[str]:
    """The host's zones (comma-split aggregate values), or ``{default_zone}`` if none."""
    metadata = metadata_by_key(aggregates, key=AZ_KEY)
    if AZ_KEY in metadata:
        return metadata[AZ_KEY]
    return {default_zone}


def available_zones(snapshot: HostSnapshot, default_zone: str) -> set[str]:
    """The zones a boot may name, as Nova's API lists them before it accepts a request
    (``get_availability_zones(get_only_available=True)``): the zone of every enabled
    compute service; a service in several zones has them comma-joined, sorted."""
    enabled = ~snapshot.num("service_disabled").astype(bool)
    codes = np.unique(snapshot.codes("aggregates")[enabled])
    zones = set()
    for code in codes.tolist():
        aggregates = snapshot.aggregates_of_signature(int(code))
        zones.add(",".join(sorted(host_zones(aggregates, default_zone))))
    return zones


class AvailabilityZoneFilter(BaseHostFilter):
    """Pass hosts in the requested availability zone (one zone, compared whole)."""

    run_filter_once_per_request: ClassVar[bool] = True

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``not in availability zone`` with the requested and the host's zones, else None."""
        requested = spec_obj.availability_zone
        if not requested:
            return None
        zones = host_zones(host_state.aggregates, self.config.default_availability_zone)
        if requested in zones:
            return None
        if "," in requested:
            return Reject.of("not in availability zone", requested=requested,
                             host_zones=",".join(sorted(zones)), note=COMMA_NOTE)
        return Reject.of("not in availability zone", requested=requested,
                         host_zones=",".join(sorted(zones)))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Once per aggregate-membership signature."""
        requested = spec_obj.availability_zone
        if not requested:
            return np.ones(len(hosts), dtype=bool)
        default = self.config.default_availability_zone
        unique, inverse = hosts.signatures("aggregates")
        snapshot = hosts.snapshot
        verdicts = np.array(
            [
                requested in host_zones(snapshot.aggregates_of_signature(int(c)), default)
                for c in unique.tolist()
            ],
            dtype=bool,
        )
        return verdicts[inverse] if len(unique) else np.ones(len(hosts), dtype=bool)
