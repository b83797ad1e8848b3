"""NumInstancesFilter: reject hosts already running ``max_instances_per_host`` instances.

A host passes iff ``num_instances < max_instances`` (reference §3.10). Option:
``[filter_scheduler] max_instances_per_host`` (default 50). AggregateNumInstancesFilter
reads the same key from aggregate metadata: the minimum of the values wins, and a single
value that is not an integer makes it fall back to the option. Lever: raise the option,
or set the key on an aggregate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.filters.utils import numeric_override, numeric_override_all

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

KEY = "max_instances_per_host"


class NumInstancesFilter(BaseHostFilter):
    """Pass hosts running fewer than max_instances_per_host instances."""

    def _max_instances(self, host_state: HostState) -> float:
        return float(self.config.filter_scheduler.max_instances_per_host)

    def _max_instances_all(self, hosts: Hosts) -> np.ndarray | float:
        return float(self.config.filter_scheduler.max_instances_per_host)

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when ``num_instances >= max_instances``."""
        max_instances = self._max_instances(host_state)
        num_instances = host_state.num_instances
        if num_instances < max_instances:
            return None
        return Reject.of(
            "too many instances", num_instances=num_instances, max=int(max_instances)
        )

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """One vectorized comparison of the ``num_instances`` column with the limit."""
        return np.asarray(
            hosts.col("num_instances") < self._max_instances_all(hosts), dtype=bool
        )


class AggregateNumInstancesFilter(NumInstancesFilter):
    """Like NumInstancesFilter, with max_instances_per_host from aggregates (minimum wins)."""

    def _max_instances(self, host_state: HostState) -> float:
        return numeric_override(
            host_state.aggregates, KEY, self.config.filter_scheduler.max_instances_per_host,
            cast_to=int, what="AggregateNumInstancesFilter",
        )

    def _max_instances_all(self, hosts: Hosts) -> np.ndarray | float:
        return numeric_override_all(
            hosts, KEY, self.config.filter_scheduler.max_instances_per_host,
            cast_to=int, what="AggregateNumInstancesFilter",
        )
