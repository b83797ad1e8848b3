"""Rank hosts: Nova's weighing handler (reference §7.1) over the bulk weigher methods.

``weight(host) = Σ multiplier_w(host) × normalize_w(raw_w)[host]``, summed in weigher
order. With 0 or 1 hosts nothing is weighed (every weight is 0.0). The order is a stable
sort by descending weight, so ties keep the order the hosts came in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from berth.host_state import Hosts
from berth.model.request import RequestSpec
from berth.weighers.base import BaseHostWeigher, WeighedHost, normalize


@dataclass
class WeigherColumn:
    """One weigher's raw, normalized and multiplier values for every ranked host."""

    name: str
    raw: np.ndarray
    normalized: np.ndarray
    multiplier: np.ndarray


class Ranking:
    """Weights aligned with the ranked hosts, and the best-first order (positions).

    ``order`` may be left out: it is then the stable descending sort of ``weights``,
    computed only if someone reads it. The pipeline does not: it needs only the best
    ``host_subset_size`` hosts and a few alternates, which it finds without sorting every
    host (:attr:`explicit_order` tells it whether it may).
    """

    __slots__ = ("weights", "_order", "columns")

    def __init__(
        self,
        weights: np.ndarray,
        order: np.ndarray | None = None,
        columns: list[WeigherColumn] | None = None,
    ) -> None:
        self.weights = weights
        self._order = order
        self.columns: list[WeigherColumn] = columns if columns is not None else []

    @property
    def order(self) -> np.ndarray:
        """Best-first positions (a stable descending sort of the weights unless given)."""
        if self._order is None:
            self._order = stable_descending(self.weights)
        return self._order

    @property
    def explicit_order(self) -> np.ndarray | None:
        """The order the ranker gave explicitly, or None when it is implied by weights."""
        return self._order


class Ranker(Protocol):
    """Anything that ranks hosts: the weighers, or the legacy least-cost functions."""

    def rank(self, hosts: Hosts, spec: RequestSpec) -> Ranking:
        """Weights (higher is better) and the best-first order of ``hosts``."""
        ...


def stable_descending(weights: np.ndarray) -> np.ndarray:
    """Positions sorted by descending weight, ties in input order (Python's stable sort)."""
    return np.argsort(-weights, kind="stable")


class WeigherRanker:
    """Nova's weighing with a list of weighers."""

    def __init__(self, weighers: Sequence[BaseHostWeigher]) -> None:
        self.weighers = list(weighers)

    def rank(self, hosts: Hosts, spec: RequestSpec) -> Ranking:
        """Weigh, normalize, multiply and sum; then sort best first."""
        n = len(hosts)
        weights = np.zeros(n)
        columns: list[WeigherColumn] = []
        if n <= 1:
            return Ranking(weights, None, columns)
        for weigher in self.weighers:
            raw = np.asarray(weigher.weigh_all_hosts(hosts, spec), dtype=float)
            normalized = normalize(raw, weigher.minval, weigher.maxval)
            multiplier = np.asarray(weigher.multipliers_all_hosts(hosts), dtype=float)
            weights = weights + multiplier * normalized
            columns.append(WeigherColumn(type(weigher).__name__, raw, normalized, multiplier))
        return Ranking(weights, None, columns)


def normalize_list(
    weights: Sequence[float], minval: float | None = None, maxval: float | None = None
) -> list[float]:
    """Nova's ``normalize`` on a Python list, element by element (the per-host reference
    for :func:`~berth.weighers.base.normalize`)."""
    if not weights:
        return []
    high = max(weights) if maxval is None else maxval
    low = min(weights) if minval is None else minval
    span = high - low
    if span == 0:
        return [0.0] * len(weights)
    return [(w - low) / span for w in weights]


class PerHostRanker:
    """Nova's weighing handler host by host: ``_weigh_object`` and ``weight_multiplier``
    per host per weigher, list normalization, a stable ``sorted(..., reverse=True)``.

    The reference the columnar :class:`WeigherRanker` is measured and tested against.
    """

    def __init__(self, weighers: Sequence[BaseHostWeigher]) -> None:
        self.weighers = list(weighers)

    def rank(self, hosts: Hosts, spec: RequestSpec) -> Ranking:
        """Weigh every host one at a time, then sort best first."""
        states = list(hosts.states())
        n = len(states)
        weights = [0.0] * n
        columns: list[WeigherColumn] = []
        if n > 1:
            wrapped = [WeighedHost(state) for state in states]
            for weigher in self.weighers:
                raw = weigher.weigh_objects(wrapped, spec)
                normalized = normalize_list(raw, weigher.minval, weigher.maxval)
                multipliers = [weigher.weight_multiplier(state) for state in states]
                for i in range(n):
                    weights[i] += multipliers[i] * normalized[i]
                columns.append(WeigherColumn(
                    type(weigher).__name__, np.array(raw, dtype=float),
                    np.array(normalized, dtype=float), np.array(multipliers, dtype=float)))
        order = sorted(range(n), key=weights.__getitem__, reverse=True)
        return Ranking(np.array(weights, dtype=float), np.array(order, dtype=np.int64), columns)
