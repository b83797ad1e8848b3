"""IoOpsFilter: reject hosts already running ``max_io_ops_per_host`` or more I/O-heavy tasks.

A host passes iff ``num_io_ops < max_io_ops`` (``num_io_ops`` is the compute's
``io_workload`` stat: builds, resizes, snapshots... in progress, plus one per instance this
request already placed there). Option: ``[filter_scheduler] max_io_ops_per_host``
(default 8). AggregateIoOpsFilter reads the same key from aggregate metadata: the minimum
of the values wins, and a single value that is not an integer makes it fall back to the
option (reference §3.9). Lever: raise the option, or set the key on an aggregate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.filters.utils import numeric_override, numeric_override_all

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

KEY = "max_io_ops_per_host"


class IoOpsFilter(BaseHostFilter):
    """Pass hosts with fewer than max_io_ops_per_host I/O operations in progress."""

    def _max_io_ops(self, host_state: HostState) -> float:
        return float(self.config.filter_scheduler.max_io_ops_per_host)

    def _max_io_ops_all(self, hosts: Hosts) -> np.ndarray | float:
        return float(self.config.filter_scheduler.max_io_ops_per_host)

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when ``num_io_ops >= max_io_ops``."""
        max_io_ops = self._max_io_ops(host_state)
        num_io_ops = host_state.num_io_ops
        if num_io_ops < max_io_ops:
            return None
        return Reject.of("too many I/O operations", num_io_ops=num_io_ops, max=int(max_io_ops))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """One vectorized comparison of the ``num_io_ops`` column with the limit."""
        return np.asarray(hosts.col("num_io_ops") < self._max_io_ops_all(hosts), dtype=bool)


class AggregateIoOpsFilter(IoOpsFilter):
    """Like IoOpsFilter, with max_io_ops_per_host from aggregate metadata (minimum wins)."""

    def _max_io_ops(self, host_state: HostState) -> float:
        return numeric_override(
            host_state.aggregates, KEY, self.config.filter_scheduler.max_io_ops_per_host,
            cast_to=int, what="AggregateIoOpsFilter",
        )

    def _max_io_ops_all(self, hosts: Hosts) -> np.ndarray | float:
        return numeric_override_all(
            hosts, KEY, self.config.filter_scheduler.max_io_ops_per_host,
            cast_to=int, what="AggregateIoOpsFilter",
        )
