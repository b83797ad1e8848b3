"""RetryFilter (removed in Nova 22): reject the nodes a build already failed on.

When the request carries ``retry`` (a re-schedule after a failed build), a node passes iff
its ``[host, nodename]`` pair is not among ``retry.hosts`` (reference §12.5). It reads no
option; the conductor's ``[scheduler] max_attempts`` bounds how often it applies.
Alternates made it unnecessary in Nova 17+, but legacy configurations still list it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


def _tried(spec_obj: RequestSpec) -> set[tuple[str, str | None]]:
    retry = spec_obj.retry
    if not retry:
        return set()
    return {(cn.host, cn.hypervisor_hostname) for cn in retry.hosts}


class RetryFilter(BaseHostFilter):
    """Pass nodes this build has not already been attempted on."""

    RUN_ON_REBUILD: ClassVar[bool] = False

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when ``[host, nodename]`` is in ``retry.hosts``."""
        if not spec_obj.retry:
            return None
        if (host_state.host, host_state.nodename) in _tried(spec_obj):
            return Reject.of("already tried", num_attempts=spec_obj.retry.num_attempts)
        return None

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """The tried nodes are looked up by key (O(tries)), not compared row by row."""
        mask = np.ones(len(hosts), dtype=bool)
        snapshot = hosts.snapshot
        tried_rows = []
        for host, node in _tried(spec_obj):
            # A node key always has a nodename; a pair without one matches no node.
            row = snapshot.row_of(host, node) if node is not None else None
            if row is not None:
                tried_rows.append(row)
        if tried_rows:
            mask &= ~np.isin(hosts.rows, tried_rows)
        return mask
