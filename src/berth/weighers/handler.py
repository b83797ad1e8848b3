"""Rank hosts: Nova's weighing handler (reference §7.1) over the bulk weigher methods.

``weight(host) = Σ multiplier_w(host) × normalize_w(raw_w)[host]``, summed in weigher
order. With 0 or 1 hosts nothing is weighed (every weight is 0.0). The order is a stable
sort by descending weight, so ties keep the order the hosts came in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from berth.host_state import Hosts
from berth.model.request import RequestSpec
from berth.weighers.base import BaseHostWeigher, normalize


@dataclass
class WeigherColumn:
    """One weigher's raw, normalized and multiplier values for every ranked host."""

    name: str
    raw: np.ndarray
    normalized: np.ndarray
    multiplier: np.ndarray


@dataclass
class Ranking:
    """Weights aligned with the ranked hosts, and the best-first order (positions)."""

    weights: np.ndarray
    order: np.ndarray
    columns: list[WeigherColumn] = field(default_factory=list)


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
            return Ranking(weights, np.arange(n), columns)
        for weigher in self.weighers:
            raw = np.asarray(weigher.weigh_all_hosts(hosts, spec), dtype=float)
            normalized = normalize(raw, weigher.minval, weigher.maxval)
            multiplier = np.asarray(weigher.multipliers_all_hosts(hosts), dtype=float)
            weights = weights + multiplier * normalized
            columns.append(WeigherColumn(type(weigher).__name__, raw, normalized, multiplier))
        return Ranking(weights, stable_descending(weights), columns)
