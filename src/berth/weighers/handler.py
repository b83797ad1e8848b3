"""Rank hosts: Nova's weighing handler (reference §7.1) over the bulk weigher methods.

``weight(host) = Σ multiplier_w(host) × normalize_w(raw_w)[host]``, summed in weigher
order. With 0 or 1 hosts nothing is weighed (every weight is 0.0). The order is a stable
sort by descending weight, so ties keep the order the hosts came in.
"""

from __future__ import annotations

import math
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


#: What each row-local built-in reads of a row that a request can change (WorkingSet
#: field names, see ``WorkingSet.touched_fields``): a touched row is re-weighed only by
#: the weighers that read the touched field. Missing from this table: every field.
_WEIGHER_INPUTS: dict[str, frozenset[str]] = {
    "RAMWeigher": frozenset({"free_ram_mb"}),
    "CPUWeigher": frozenset({"vcpus_total", "vcpus_used", "cpu_allocation_ratio"}),
    "DiskWeigher": frozenset({"free_disk_mb"}),
    "IoOpsWeigher": frozenset({"num_io_ops"}),
    "NumInstancesWeigher": frozenset({"num_instances"}),
    "HypervisorVersionWeigher": frozenset({"hypervisor_version"}),
    "BuildFailureWeigher": frozenset({"failed_builds"}),
    "CrossCellWeigher": frozenset(),
    "PCIWeigher": frozenset({"pci_stats"}),
    "MetricsWeigher": frozenset({"metrics"}),
    "ServerGroupSoftAffinityWeigher": frozenset({"instances"}),
    "ServerGroupSoftAntiAffinityWeigher": frozenset({"instances"}),
    "ImagePropertiesWeigher": frozenset({"instances"}),
}


def _inputs(weigher: BaseHostWeigher) -> frozenset[str] | None:
    """The fields a built-in weigher reads, or None (any field)."""
    if not _is_row_local(weigher):
        return None
    return _WEIGHER_INPUTS.get(type(weigher).__name__)


def _is_row_local(weigher: BaseHostWeigher) -> bool:
    cls = type(weigher)
    return f"{cls.__module__}:{cls.__name__}" in ROW_LOCAL_WEIGHERS


class _Term:
    """One built-in weigher's state during a request, by snapshot row: raw weights,
    multipliers, the normalization range over the hosts in play and its weighted,
    normalized term ``multiplier * (raw - low) / (high - low)``."""

    __slots__ = ("raw", "mult", "mult_const", "mult_finite", "low", "high", "skip", "term")

    def __init__(self) -> None:
        self.raw = np.empty(0)
        self.mult = np.empty(0)
        self.mult_const: float | None = None
        self.mult_finite = True
        self.low = math.nan
        self.high = math.nan
        self.skip = False
        self.term: np.ndarray | None = None

    def multiplier_of(self, rows: np.ndarray) -> np.ndarray | float:
        """The multipliers of ``rows`` (a float when every host has the same)."""
        return self.mult_const if self.mult_const is not None else self.mult[rows]

    def set_range(self, weigher: BaseHostWeigher, low: float, high: float) -> None:
        """Apply the class's fixed ``minval``/``maxval`` over the hosts' extremes."""
        self.low = low if weigher.minval is None else float(weigher.minval)
        self.high = high if weigher.maxval is None else float(weigher.maxval)

    def decide_skip(self) -> bool:
        """True when the term is (signed) zero on every host: a constant column with
        finite multipliers, or zero multipliers over a finite range."""
        if self.low == self.high:
            return self.mult_finite
        return (self.mult_const == 0.0 and math.isfinite(self.low)
                and math.isfinite(self.high))

    def full_term(self, size: int) -> None:
        """Recompute the term on every row (values off the hosts in play are unused)."""
        with np.errstate(all="ignore"):
            term = self.raw - self.low
            term /= self.high - self.low
            term *= self.mult_const if self.mult_const is not None else self.mult
        self.term = term

    def rows_term(self, rows: np.ndarray) -> None:
        """Recompute the term on ``rows`` only."""
        assert self.term is not None
        with np.errstate(all="ignore"):
            term = self.raw[rows] - self.low
            term /= self.high - self.low
            term *= self.multiplier_of(rows)
        self.term[rows] = term


class _RankerMemo:
    """A WeigherRanker's request-scoped state: per-weigher terms, the total weight by
    row, which rows are weighed (``known``) and in play (``alive``), and the position in
    the working set's touched-row log everything is current with."""

    __slots__ = ("spec", "terms", "known", "alive", "seen", "total", "rows")

    def __init__(self, spec: RequestSpec, size: int, count: int) -> None:
        self.spec = spec
        self.terms = [_Term() for _ in range(count)]
        self.known = np.zeros(size, dtype=bool)
        self.alive = np.zeros(size, dtype=bool)
        self.seen = 0
        self.total = np.zeros(size)
        #: The rows of the last ranking (the pipeline passes the same array when no
        #: host was filtered out since).
        self.rows: np.ndarray | None = None


_NO_VALUES = np.empty(0)
_NO_ROWS = np.empty(0, dtype=np.int64)


def _changed(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Where ``new`` differs from ``old`` (NaN counts as a change)."""
    return ~(old == new) | np.isnan(old) | np.isnan(new)


class WeigherRanker:
    """Nova's weighing with a list of weighers.

    The first ranking of a request weighs every host. When the request ranks again (the
    next instance of a multi-create, the alternates), built-in weighers are not weighed
    again: their raw values change only on the rows the request touched (consumption,
    server-group stubs; see :data:`ROW_LOCAL_WEIGHERS`), so only those are re-weighed;
    a weigher's normalization range is kept up to date from the changed and removed
    values, and its term is recomputed on every host only when the range moves. The
    weights are bit-for-bit the ones a full weighing gives (same operations, same order).
    A weigher whose term is zero on every host (a constant column, a zero multiplier)
    is skipped.
    """

    def __init__(self, weighers: Sequence[BaseHostWeigher]) -> None:
        self.weighers = list(weighers)
        self._memoizable = bool(self.weighers) and all(_is_row_local(w) for w in self.weighers)
        self._inputs = [_inputs(w) for w in self.weighers]

    def rank(self, hosts: Hosts, spec: RequestSpec) -> Ranking:
        """Weigh, normalize, multiply and sum; the order is derived when asked."""
        n = len(hosts)
        if n <= 1:
            return Ranking(np.zeros(n), None, [])
        # The memo pays off only when the request ranks again (a multi-create); the
        # pipeline records how many instances the request has.
        if self._memoizable and hosts.ws.memo.get("instances", 2) > 1:
            return self._rank_memo(hosts, spec)
        weights = np.zeros(n)
        values: list[tuple[np.ndarray, np.ndarray]] = []
        for weigher in self.weighers:
            raw = np.asarray(weigher.weigh_all_hosts(hosts, spec), dtype=float)
            multiplier = np.asarray(weigher.multipliers_all_hosts(hosts), dtype=float)
            values.append((raw, multiplier))
            low = float(raw.min()) if weigher.minval is None else float(weigher.minval)
            high = float(raw.max()) if weigher.maxval is None else float(weigher.maxval)
            if low == high and bool(np.all(np.isfinite(multiplier))):
                continue  # normalize() gives zeros; multiplier * 0 adds (signed) zero
            # Nova's arithmetic, in place: weight += multiplier * ((raw - low) / span).
            term = raw - low
            term /= high - low
            term *= multiplier
            weights += term

        def columns() -> list[WeigherColumn]:
            return [
                WeigherColumn(type(w).__name__, raw, normalize(raw, w.minval, w.maxval), mult)
                for w, (raw, mult) in zip(self.weighers, values)
            ]

        return Ranking(weights, None, columns_fn=columns)

    def _rank_memo(self, hosts: Hosts, spec: RequestSpec) -> Ranking:
        ws = hosts.ws
        rows = hosts.rows
        size = len(ws.snapshot)
        key = ("WeigherRanker", id(self))
        memo = ws.memo.get(key)
        if not isinstance(memo, _RankerMemo) or memo.spec is not spec:
            memo = ws.memo[key] = _RankerMemo(spec, size, len(self.weighers))
            memo.seen = len(ws.touched)
        same_rows = memo.rows is rows
        missing = rows[:0] if same_rows else rows[~memo.known[rows]]
        dirty = np.empty(0, dtype=np.int64)
        by_field: dict[str, set[int]] = {}
        if len(ws.touched) > memo.seen:
            for row, name in zip(ws.touched[memo.seen:], ws.touched_fields[memo.seen:]):
                by_field.setdefault(name, set()).add(row)
            dirty = np.unique(np.asarray(ws.touched[memo.seen:], dtype=np.int64))
            dirty = dirty[memo.known[dirty]]
        dirty_rows = dirty.tolist()
        memo.seen = len(ws.touched)
        if same_rows:
            alive, removed = memo.alive, rows[:0]
        else:
            alive = np.zeros(size, dtype=bool)
            alive[rows] = True
            removed = np.flatnonzero(memo.alive & ~alive)
            memo.alive = alive
            memo.rows = rows
        memo.known[missing] = True
        refill = len(missing) > 0
        if not refill and not len(dirty) and not len(removed):
            return self._memo_ranking(memo, rows)  # nothing changed since the last ranking
        recompute_total = refill
        changed_rows: list[np.ndarray] = []
        sub = (hosts if len(missing) == len(rows) else ws.hosts(missing)) if refill else None
        for index, weigher in enumerate(self.weighers):
            t = memo.terms[index]
            if sub is not None:
                if len(t.raw) != size:
                    t.raw, t.mult = np.empty(size), np.empty(size)
                t.raw[missing] = np.asarray(weigher.weigh_all_hosts(sub, spec), dtype=float)
                t.mult[missing] = np.asarray(weigher.multipliers_all_hosts(sub), dtype=float)
                known_mult = t.mult[memo.known]
                first = known_mult[0]
                t.mult_const = float(first) if bool(np.all(known_mult == first)) else None
                t.mult_finite = bool(np.all(np.isfinite(known_mult)))
            old_low, old_high, old_skip = t.low, t.high, t.skip
            olds = news = gone = _NO_VALUES
            moved = _NO_ROWS
            mine = dirty
            inputs = self._inputs[index]
            if len(dirty) and inputs is not None:
                # Only the rows where a field this weigher reads changed.
                picked = set(by_field.get("*attrs", ()))
                for name in inputs:
                    picked.update(by_field.get(name, ()))
                mine = np.array(sorted(picked.intersection(dirty_rows)), dtype=np.int64)
            if not refill and not len(mine) and not len(removed):
                continue  # nothing this weigher reads changed: same range, same term
            if len(mine):
                new = np.asarray(weigher.weigh_all_hosts(ws.hosts(mine), spec), dtype=float)
                old = t.raw[mine]
                diff = _changed(old, new)
                if diff.any():
                    moved, olds, news = mine[diff], old[diff], new[diff]
                    t.raw[moved] = news
                    news = news[alive[moved]]
            if len(removed):
                gone = t.raw[removed]
            if not refill and not len(olds) and not len(gone) and not len(news):
                pass  # this weigher's values did not change: nor did its range
            elif refill or not (math.isfinite(t.low) and math.isfinite(t.high)):
                current = t.raw[rows]
                t.set_range(weigher, float(current.min()), float(current.max()))
            else:
                low, high = t.low, t.high
                if weigher.minval is None:
                    if bool(np.any(olds == low)) or bool(np.any(gone == low)):
                        low = float(t.raw[rows].min())
                    elif len(news):
                        low = min(low, float(news.min()))
                if weigher.maxval is None:
                    if bool(np.any(olds == high)) or bool(np.any(gone == high)):
                        high = float(t.raw[rows].max())
                    elif len(news):
                        high = max(high, float(news.max()))
                t.set_range(weigher, low, high)
            t.skip = t.decide_skip()
            range_moved = not (t.low == old_low and t.high == old_high)
            if t.skip:
                recompute_total = recompute_total or not old_skip
                continue
            if refill or old_skip or range_moved or t.term is None:
                t.full_term(size)
                recompute_total = True
            elif len(moved):
                t.rows_term(moved)
                changed_rows.append(moved)
        active = [t.term for t in memo.terms if not t.skip and t.term is not None]
        if recompute_total:
            total = np.zeros(size)
            for term in active:
                total += term
            memo.total = total
        elif changed_rows:
            where = np.unique(np.concatenate(changed_rows))
            partial = np.zeros(len(where))
            for term in active:
                partial += term[where]
            memo.total[where] = partial
        return self._memo_ranking(memo, rows)

    def _memo_ranking(self, memo: _RankerMemo, rows: np.ndarray) -> Ranking:
        weights = memo.total[rows]
        terms = list(memo.terms)

        def columns() -> list[WeigherColumn]:
            # Read right after ranking (explanations): the memo still holds these values.
            out = []
            for w, t in zip(self.weighers, terms):
                raw = t.raw[rows]
                mult = np.broadcast_to(np.asarray(t.multiplier_of(rows), dtype=float),
                                       raw.shape).copy()
                out.append(WeigherColumn(type(w).__name__, raw,
                                         normalize(raw, w.minval, w.maxval), mult))
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
