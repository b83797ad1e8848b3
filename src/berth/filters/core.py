"""CoreFilter (removed in Nova 20): reject hosts without enough vCPUs, allowing over-commit.

With ``total = vcpus_total * ratio``: a host reporting no vCPUs passes (fail-safe: the
collection is assumed broken); when ``total > 0`` the host gets ``limits['vcpu'] = total``
(even if it then fails) and fails if the flavor has more vCPUs than the host (no
over-commit against itself); it fails if ``total - vcpus_used`` is below the flavor's
vCPUs (reference §12.2). Ratio: the host's ``cpu_allocation_ratio``; AggregateCoreFilter
takes the minimum aggregate ``cpu_allocation_ratio`` instead, falling back to the host's on
none or any bad value. Lever: the ratio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.allocation_ratio import host_ratio, ratios_all, unset_as_nan
from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

KEY = "cpu_allocation_ratio"


class CoreFilter(BaseHostFilter):
    """Pass hosts whose over-committed free vCPUs hold the flavor; sets limits['vcpu']."""

    #: Whether aggregate metadata may override the host's ratio.
    aggregate_override: ClassVar[bool] = False

    def _ratio(self, host_state: HostState) -> float:
        # An unset ratio (NaN in the snapshot) compares false everywhere, as in bulk.
        ratio = unset_as_nan(host_state.cpu_allocation_ratio)
        if self.aggregate_override:
            return host_ratio(ratio, host_state.aggregates, KEY)
        return ratio

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when the flavor's vCPUs exceed the host's or its over-committed free vCPUs."""
        vcpus_total = host_state.vcpus_total
        if not vcpus_total:
            return None  # Fail safe: a host without a vCPU count is not judged.
        requested = spec_obj.vcpus
        total = vcpus_total * self._ratio(host_state)
        if total > 0:
            # Set before the checks below, as Nova does: a failing host keeps it too.
            host_state.limits["vcpu"] = total
            if requested > vcpus_total:
                return Reject.of("insufficient vCPUs", requested=requested, vcpus_total=vcpus_total)
        free = total - host_state.vcpus_used
        if free < requested:
            return Reject.of("insufficient vCPUs", requested=requested, usable=free)
        return None

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Vectorized over the vCPU columns; limits set on every row with a positive total."""
        requested = spec_obj.vcpus
        vcpus_total = hosts.col("vcpus_total")
        unknown = (vcpus_total == 0) | np.isnan(vcpus_total)
        ratio = ratios_all(hosts, KEY) if self.aggregate_override else hosts.col(KEY)
        total = vcpus_total * ratio
        limited = ~unknown & (total > 0)
        hosts.ws.set_limits("vcpu", hosts.rows[limited], total[limited])
        fails = (limited & (requested > vcpus_total)) | (total - hosts.col("vcpus_used") < requested)
        return unknown | ~fails


class AggregateCoreFilter(CoreFilter):
    """CoreFilter with the minimum aggregate cpu_allocation_ratio (else the host's)."""

    aggregate_override: ClassVar[bool] = True
