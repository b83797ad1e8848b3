"""MetricsFilter: reject hosts that do not report every metric the MetricsWeigher weighs.

The metric names come from ``[metrics] weight_setting`` (``name=ratio`` items, parsed as
Nova parses them: bad items dropped, keys not stripped); a host passes iff it reports each
of those names; an empty setting passes every host (reference §3.17). Lever: the metrics
the computes' monitors report, or the names in ``weight_setting``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.weighers.setting import parse_weight_setting

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


def _names(metrics: Iterable[Any] | None) -> set[str]:
    # A bare HostState has no metrics list (Nova raises TypeError); treat it as none.
    return {m.name for m in metrics or ()}


class MetricsFilter(BaseHostFilter):
    """Pass hosts reporting every metric named in [metrics] weight_setting."""

    RUN_ON_REBUILD: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        super().__init__(config)
        #: The metric names a host must report (parsed once, at start-up).
        self.keys: frozenset[str] = frozenset(
            name for name, _ in parse_weight_setting(
                self.config.metrics.weight_setting, "[metrics] weight_setting")
        )

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject a host lacking one of the weighed metrics."""
        missing = self.keys - _names(host_state.metrics)
        if not missing:
            return None
        return Reject.of("metrics missing", missing=sorted(missing))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """The pass mask is computed once per snapshot (metrics change only with reports).

        Metrics a plugin assigns to a HostState during a request are seen by the per-host
        path only; no built-in does that.
        """
        if not self.keys:
            return np.ones(len(hosts), dtype=bool)
        snapshot = hosts.snapshot
        keys = self.keys
        mask = snapshot.cached(
            ("metrics_filter", keys),
            lambda: np.fromiter((keys <= _names(m) for m in snapshot.obj("metrics")),
                                dtype=bool, count=len(snapshot)),
        )
        return mask[hosts.rows]
