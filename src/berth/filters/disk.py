"""DiskFilter (removed in Nova 20): reject hosts without enough disk, allowing over-commit.

Requested disk is ``1024 * (root_gb + ephemeral_gb) + swap`` MB (swap is in MB). A host
fails if its total disk is below that, or if ``total_mb * ratio - (total_mb -
free_disk_mb)`` is; a passing host gets ``limits['disk_gb'] = total_mb * ratio / 1024``
(reference §12.3). Ratio: the host's ``disk_allocation_ratio``; AggregateDiskFilter takes
the minimum aggregate ``disk_allocation_ratio`` instead, falling back to the host's on none
or any bad value. Lever: the ratio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.allocation_ratio import host_ratio, ratios_all, unset_as_nan
from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

KEY = "disk_allocation_ratio"


def requested_disk_mb(spec_obj: RequestSpec) -> int:
    """Root and ephemeral disk in MB plus swap (already MB)."""
    return 1024 * (spec_obj.root_gb + spec_obj.ephemeral_gb) + spec_obj.swap


class DiskFilter(BaseHostFilter):
    """Pass hosts whose over-committed free disk holds the flavor; sets limits['disk_gb']."""

    #: Whether aggregate metadata may override the host's ratio.
    aggregate_override: ClassVar[bool] = False

    def _ratio(self, host_state: HostState) -> float:
        # An unset ratio (NaN in the snapshot) compares false everywhere, as in bulk.
        ratio = unset_as_nan(host_state.disk_allocation_ratio)
        if self.aggregate_override:
            return host_ratio(ratio, host_state.aggregates, KEY)
        return ratio

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when the flavor's disk exceeds the host's total or over-committed free disk."""
        requested = requested_disk_mb(spec_obj)
        total_mb = host_state.total_usable_disk_gb * 1024
        # No over-commit of an instance against itself.
        if not total_mb >= requested:
            return Reject.of("insufficient disk", requested_mb=requested, total_mb=total_mb)
        limit_mb = total_mb * self._ratio(host_state)
        usable = limit_mb - (total_mb - host_state.free_disk_mb)
        if not usable >= requested:
            return Reject.of("insufficient disk", requested_mb=requested, usable_mb=usable)
        host_state.limits["disk_gb"] = limit_mb / 1024
        return None

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Vectorized over the disk columns; limits set on the passing rows at once."""
        requested = requested_disk_mb(spec_obj)
        total_mb = hosts.col("total_usable_disk_gb") * 1024
        ratio = ratios_all(hosts, KEY) if self.aggregate_override else hosts.col(KEY)
        limit_mb = total_mb * ratio
        usable = limit_mb - (total_mb - hosts.col("free_disk_mb"))
        passes = (total_mb >= requested) & (usable >= requested)
        hosts.ws.set_limits("disk_gb", hosts.rows[passes], limit_mb[passes] / 1024)
        return passes


class AggregateDiskFilter(DiskFilter):
    """DiskFilter with the minimum aggregate disk_allocation_ratio (else the host's)."""

    aggregate_override: ClassVar[bool] = True
