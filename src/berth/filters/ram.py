"""RamFilter (removed in Nova 20): reject hosts without enough RAM, allowing over-commit.

A host fails if its total RAM is below the flavor's (no over-commit against itself), or if
``total_usable_ram_mb * ratio - (total_usable_ram_mb - free_ram_mb)`` is below the
flavor's ``memory_mb``; a passing host gets ``limits['memory_mb'] = total * ratio`` for the
compute's claim (reference §12.1). Ratio: the host's ``ram_allocation_ratio`` (nova.conf
``[DEFAULT] ram_allocation_ratio`` / ``initial_ram_allocation_ratio`` resolve it on the
node). AggregateRamFilter takes the minimum aggregate ``ram_allocation_ratio`` instead,
falling back to the host's on none or any bad value. Lever: the ratio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.allocation_ratio import host_ratio, ratios_all, unset_as_nan
from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

KEY = "ram_allocation_ratio"


class RamFilter(BaseHostFilter):
    """Pass hosts whose over-committed free RAM holds the flavor; sets limits['memory_mb']."""

    #: Whether aggregate metadata may override the host's ratio.
    aggregate_override: ClassVar[bool] = False

    def _ratio(self, host_state: HostState) -> float:
        # An unset ratio (NaN in the snapshot) compares false everywhere, as in bulk.
        ratio = unset_as_nan(host_state.ram_allocation_ratio)
        if self.aggregate_override:
            return host_ratio(ratio, host_state.aggregates, KEY)
        return ratio

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when the flavor's RAM exceeds the host's total or over-committed free RAM."""
        requested = spec_obj.memory_mb
        total = host_state.total_usable_ram_mb
        # No over-commit of an instance against itself.
        if not total >= requested:
            return Reject.of("insufficient RAM", requested_mb=requested, total_mb=total)
        limit = total * self._ratio(host_state)
        usable = limit - (total - host_state.free_ram_mb)
        if not usable >= requested:
            return Reject.of("insufficient RAM", requested_mb=requested, usable_mb=usable)
        host_state.limits["memory_mb"] = limit
        return None

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Vectorized over the RAM columns; limits set on the passing rows at once."""
        requested = spec_obj.memory_mb
        total = hosts.col("total_usable_ram_mb")
        ratio = ratios_all(hosts, KEY) if self.aggregate_override else hosts.col(KEY)
        limit = total * ratio
        usable = limit - (total - hosts.col("free_ram_mb"))
        passes = (total >= requested) & (usable >= requested)
        hosts.ws.set_limits("memory_mb", hosts.rows[passes], limit[passes])
        return passes


class AggregateRamFilter(RamFilter):
    """RamFilter with the minimum aggregate ram_allocation_ratio (else the host's)."""

    aggregate_override: ClassVar[bool] = True
