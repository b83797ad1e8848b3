"""Rank hosts: Nova's weighing handler (reference §7.1) over the bulk weigher methods.

``weight(host) = Σ multiplier_w(host) × normalize_w(raw_w)[host]``, summed in weigher
order. With 0 or 1 hosts nothing is weighed (every weight is 0.0). The order is a stable
sort by descending weight, so ties keep the order the hosts came in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from berth.host_state import Hosts
from berth.model.request import RequestSpec
from berth.weighers.base import BaseHostWeigher, WeighedHost, normalize
from berth.weighers.registry import BUILTIN_WEIGHERS


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

    __slots__ = ("weights", "_order", "_columns", "_columns_fn")

    def __init__(
        self,
        weights: np.ndarray,
        order: np.ndarray | None = None,
        columns: list[WeigherColumn] | None = None,
        columns_fn: Callable[[], list[WeigherColumn]] | None = None,
    ) -> None:
        self.weights = weights
        self._order = order
        self._columns = columns
        self._columns_fn = columns_fn

    @property
    def columns(self) -> list[WeigherColumn]:
        """Per-weigher raw, normalized and multiplier values (built when first read:
        only explanations need them)."""
        if self._columns is None:
            self._columns = self._columns_fn() if self._columns_fn is not None else []
        return self._columns

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


#: Built-in weighers whose raw weight and multiplier for a host depend only on that
#: host's row (numbers, objects, instances, aggregates) and on request fields the pipeline
#: never changes between the instances of a request (flavor, image, group members,
#: destination). Between two rankings of one request their values can change only on the
#: rows the request touched (consumption, server-group stubs), so only those are weighed
#: again. A subclass or a plugin is not in this set and is always weighed in full.
ROW_LOCAL_WEIGHERS: frozenset[str] = frozenset(BUILTIN_WEIGHERS.values())


def _is_row_local(weigher: BaseHostWeigher) -> bool:
    cls = type(weigher)
    return f"{cls.__module__}:{cls.__name__}" in ROW_LOCAL_WEIGHERS


class _WeigherMemo:
    """Raw weights and multipliers of one row-local weigher, by snapshot row, kept for
    the duration of one request."""

    __slots__ = ("raw", "mult", "mult_const", "raw_const")

    def __init__(self, size: int) -> None:
        # Arrays by snapshot row, allocated only for non-constant columns (most weighers
        # are constant on a cloud without, say, metrics or server groups).
        self.raw = np.empty(0)
        self.mult = np.empty(0)
        #: The multiplier / raw weight when it is the same on every known row.
        self.mult_const: float | None = None
        self.raw_const: float | None = None


    def materialize(self, size: int) -> None:
        """Give constant columns their arrays back (before a row gets its own value)."""
        if self.raw_const is not None:
            self.raw = np.full(size, self.raw_const)
        if self.mult_const is not None:
            self.mult = np.full(size, self.mult_const)


def _constant(values: np.ndarray) -> float | None:
    """The common value of a non-empty array, or None (NaN is never constant)."""
    first = values[0]
    return float(first) if bool(np.all(values == first)) else None


class _RankerMemo:
    """A WeigherRanker's request-scoped state: per-weigher memos, which rows they hold,
    and the position in the touched-row log they are current with."""

    __slots__ = ("spec", "weighers", "known", "seen")

    def __init__(self, spec: RequestSpec, size: int, count: int) -> None:
        self.spec = spec
        self.weighers = [_WeigherMemo(size) for _ in range(count)]
        self.known = np.zeros(size, dtype=bool)
        self.seen = 0


class WeigherRanker:
    """Nova's weighing with a list of weighers.

    Within one request (one :class:`~berth.host_state.WorkingSet`), built-in weighers are
    weighed in full once; later rankings of the same request re-weigh only the rows the
    request changed (see :data:`ROW_LOCAL_WEIGHERS`), then normalize and sum exactly as
    Nova does over the hosts in play. A weigher whose values are the same on every host
    normalizes to 0 and adds nothing, so its arithmetic is skipped.
    """

    def __init__(self, weighers: Sequence[BaseHostWeigher]) -> None:
        self.weighers = list(weighers)
        self._row_local = [_is_row_local(w) for w in self.weighers]

    def _refresh(self, hosts: Hosts, spec: RequestSpec) -> _RankerMemo:
        """The request's memo, with every row of ``hosts`` weighed and current."""
        ws = hosts.ws
        key = ("WeigherRanker", id(self))
        memo = ws.memo.get(key)
        if not isinstance(memo, _RankerMemo) or memo.spec is not spec:
            memo = ws.memo[key] = _RankerMemo(spec, len(ws.snapshot), len(self.weighers))
            memo.seen = len(ws.touched)
        rows = hosts.rows
        missing = rows[~memo.known[rows]]
        again = np.empty(0, dtype=np.int64)
        touched = ws.touched
        if len(touched) > memo.seen:
            dirty = np.unique(np.asarray(touched[memo.seen:], dtype=np.int64))
            again = dirty[memo.known[dirty]]
        memo.seen = len(touched)
        if len(missing):
            sub = hosts if len(missing) == len(rows) else ws.hosts(missing)
            first = not memo.known.any()
            memo.known[missing] = True
            for index, weigher in enumerate(self.weighers):
                if not self._row_local[index]:
                    continue
                wm = memo.weighers[index]
                raw = np.asarray(weigher.weigh_all_hosts(sub, spec), dtype=float)
                mult = np.asarray(weigher.multipliers_all_hosts(sub), dtype=float)
                size = len(ws.snapshot)
                if first:
                    wm.raw_const, wm.mult_const = _constant(raw), _constant(mult)
                    if wm.raw_const is None:
                        wm.raw = np.empty(size)
                        wm.raw[missing] = raw
                    if wm.mult_const is None:
                        wm.mult = np.empty(size)
                        wm.mult[missing] = mult
                else:
                    wm.materialize(size)
                    wm.raw[missing] = raw
                    wm.mult[missing] = mult
                    wm.raw_const = _constant(wm.raw[memo.known])
                    wm.mult_const = _constant(wm.mult[memo.known])
        if len(again):
            sub = ws.hosts(again)
            for index, weigher in enumerate(self.weighers):
                if not self._row_local[index]:
                    continue
                wm = memo.weighers[index]
                raw = np.asarray(weigher.weigh_all_hosts(sub, spec), dtype=float)
                if wm.raw_const is not None and bool(np.all(raw == wm.raw_const)):
                    continue
                wm.materialize(len(ws.snapshot))
                wm.raw[again] = raw
                wm.raw_const = None
        return memo

    def rank(self, hosts: Hosts, spec: RequestSpec) -> Ranking:
        """Weigh, normalize, multiply and sum; the order is derived when asked."""
        n = len(hosts)
        weights = np.zeros(n)
        if n <= 1:
            return Ranking(weights, None, [])
        memo = self._refresh(hosts, spec) if any(self._row_local) else None
        rows = hosts.rows
        values: list[tuple[np.ndarray | float, np.ndarray | float]] = []
        for index, weigher in enumerate(self.weighers):
            raw: np.ndarray | float
            multiplier: np.ndarray | float
            if memo is not None and self._row_local[index]:
                wm = memo.weighers[index]
                raw = wm.raw_const if wm.raw_const is not None else wm.raw[rows]
                multiplier = wm.mult_const if wm.mult_const is not None else wm.mult[rows]
            else:
                raw = np.asarray(weigher.weigh_all_hosts(hosts, spec), dtype=float)
                multiplier = np.asarray(weigher.multipliers_all_hosts(hosts), dtype=float)
            values.append((raw, multiplier))
            if isinstance(raw, float):
                low = raw if weigher.minval is None else float(weigher.minval)
                high = raw if weigher.maxval is None else float(weigher.maxval)
            else:
                low = float(raw.min()) if weigher.minval is None else float(weigher.minval)
                high = float(raw.max()) if weigher.maxval is None else float(weigher.maxval)
            if low == high and bool(np.all(np.isfinite(multiplier))):
                # normalize() gives zeros; multiplier * 0 adds (signed) zero: skip.
                continue
            # Nova's arithmetic, in place: weight += multiplier * ((raw - low) / span).
            term = np.subtract(raw, low, dtype=float) if isinstance(raw, float) else raw - low
            term = np.broadcast_to(term, (n,)).copy() if term.shape != (n,) else term
            term /= high - low
            term *= multiplier
            weights += term

        def columns() -> list[WeigherColumn]:
            out = []
            for weigher, (raw, multiplier) in zip(self.weighers, values):
                raw_arr = np.full(n, raw) if isinstance(raw, float) else raw
                out.append(WeigherColumn(
                    type(weigher).__name__, raw_arr,
                    normalize(raw_arr, weigher.minval, weigher.maxval),
                    np.broadcast_to(np.asarray(multiplier, dtype=float), (n,)).copy(),
                ))
            return out

        return Ranking(weights, None, columns_fn=columns)


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
