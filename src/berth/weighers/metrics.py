"""MetricsWeigher: weigh hosts by a weighted sum of their monitor metrics.

Raw value ``Σ metric.value × ratio`` over ``[metrics] weight_setting`` (``name=ratio``
pairs, in order; duplicates each count), min/max normalized. A host missing a metric is
an error when ``[metrics] required`` is True (enable MetricsFilter to drop such hosts
first); otherwise it weighs ``[metrics] weight_of_unavailable`` (-10000.0), unless that
metric's ``ratio × multiplier`` is 0, in which case the metric is skipped. Option:
``[metrics] weight_multiplier`` (default 1.0); aggregate metadata
``metrics_weight_multiplier`` overrides it (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.errors import SchedulingError
from berth.weighers.setting import parse_weight_setting
from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class ComputeHostMetricNotFound(SchedulingError):
    """A host lacks a metric of ``[metrics] weight_setting`` while ``required`` is True."""

    code = "berth.scheduling.metric_not_found"

    def __init__(self, host: str, nodename: str, name: str) -> None:
        super().__init__(
            f"MetricsWeigher: metric {name!r} not found on host {host}/{nodename}, and "
            "[metrics] required is True (enable MetricsFilter to remove hosts lacking "
            "metrics, or set required = False to weigh them weight_of_unavailable)",
            host=host,
            nodename=nodename,
            metric=name,
        )


def _metric_values(metrics: Any) -> dict[str, float]:
    """Metric name -> value (a later duplicate name wins, as a dict built in order)."""
    return {m.name: m.value for m in metrics or []}


class MetricsWeigher(MultiplierWeigher):
    """Weighted sum of host metrics from [metrics] weight_setting."""

    multiplier_group: ClassVar[str] = "metrics"
    multiplier_option: ClassVar[str] = "weight_multiplier"
    multiplier_key: ClassVar[str | None] = "metrics_weight_multiplier"

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        super().__init__(config)
        #: Parsed once at start-up; bad items were dropped with a warning.
        self.setting: list[tuple[str, float]] = parse_weight_setting(
            self.config.metrics.weight_setting, "[metrics] weight_setting"
        )

    def _weigh(self, host: str, nodename: str, metrics: Any, multiplier: float) -> float:
        values = _metric_values(metrics)
        required = self.config.metrics.required
        weight = 0.0
        for name, ratio in self.setting:
            if name not in values:
                if required:
                    raise ComputeHostMetricNotFound(host, nodename, name)
                if ratio * multiplier != 0:
                    # The most negative weight: this host goes to the end of the list.
                    return float(self.config.metrics.weight_of_unavailable)
                continue
            weight += values[name] * ratio
        return weight

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """Σ value × ratio, or weight_of_unavailable for a host missing a weighed metric."""
        if not self.setting:
            return 0.0
        return self._weigh(
            host_state.host, host_state.nodename, host_state.metrics,
            self.weight_multiplier(host_state),
        )

    def _table(self, metrics_column: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(values, present)``: one row per host object, one column per setting item."""
        n, k = len(metrics_column), len(self.setting)
        values = np.zeros((n, k))
        present = np.zeros((n, k), dtype=bool)
        for i, metrics in enumerate(metrics_column):
            reported = _metric_values(metrics)
            for j, (name, _) in enumerate(self.setting):
                if name in reported:
                    values[i, j] = reported[name]
                    present[i, j] = True
        return values, present

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """Column arithmetic over a per-snapshot table of the weighed metrics."""
        if not self.setting or len(hosts) == 0:
            return np.zeros(len(hosts))
        snapshot = hosts.snapshot
        values, present = snapshot.cached(
            ("metrics_weigher_table", tuple(self.setting)),
            lambda: self._table(snapshot.obj("metrics")),
        )
        values, present = values[hosts.rows], present[hosts.rows]
        overridden = hosts.ws.overridden("metrics")
        if overridden:
            positions = np.flatnonzero(np.isin(hosts.rows, list(overridden)))
            patch_values, patch_present = self._table(
                [overridden[int(hosts.rows[p])] for p in positions.tolist()]
            )
            values[positions], present[positions] = patch_values, patch_present
        missing = ~present
        if self.config.metrics.required and missing.any():
            # The first host (in the hosts' order) lacking a metric, as the per-host loop.
            pos = int(np.flatnonzero(missing.any(axis=1))[0])
            row = int(hosts.rows[pos])
            name = self.setting[int(np.flatnonzero(missing[pos])[0])][0]
            raise ComputeHostMetricNotFound(
                snapshot.obj("host")[row], snapshot.obj("nodename")[row], name
            )
        multipliers = self.multipliers_all_hosts(hosts)
        weight = np.zeros(len(hosts))
        unavailable = np.zeros(len(hosts), dtype=bool)
        for j, (_, ratio) in enumerate(self.setting):
            # Summed item by item, in order, exactly like the per-host loop.
            weight = weight + np.where(missing[:, j], 0.0, values[:, j] * ratio)
            unavailable |= missing[:, j] & (ratio * multipliers != 0)
        weight = np.where(unavailable, float(self.config.metrics.weight_of_unavailable), weight)
        return self.clamp_all(weight)
