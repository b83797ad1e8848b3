"""AllHostsFilter: every host passes (a no-op filter).

Options: none. Lever: enable it alone to schedule on weights only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class AllHostsFilter(BaseHostFilter):
    """Every host passes."""

    run_filter_once_per_request: ClassVar[bool] = True

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Always None: no host is rejected."""
        return None

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """All True."""
        return np.ones(len(hosts), dtype=bool)
