"""Rank hosts: Nova's weighing handler (reference §7.1) over the bulk weigher methods.

``weight(host) = Σ multiplier_w(host) × normalize_w(raw_w)[host]``, summed in weigher
order. With 0 or 1 hosts nothing is weighed (every weight is 0.0). The order is a stable
sort by descending weight, so ties keep the order the hosts came in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from berth.host_state import Hosts
from berth.model.request import RequestSpec
from berth.weighers.base import BaseHostWeigher, WeighedHost, normalize, uniform_per_snapshot
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

    ``by_cost`` marks a least-cost ranking (explanations then show costs, lower is
    better, as seed 001 defines them). ``order`` may be left out: it is then the stable descending sort of ``weights``,
    computed only if someone reads it. The pipeline does not: it needs only the best
    ``host_subset_size`` hosts and a few alternates, which it finds without sorting every
    host (:attr:`explicit_order` tells it whether it may).
    """

    __slots__ = ("weights", "_order", "_columns", "_columns_fn", "by_cost")

    def __init__(
        self,
        weights: np.ndarray,
        order: np.ndarray | None = None,
        columns: list[WeigherColumn] | None = None,
        columns_fn: Callable[[], list[WeigherColumn]] | None = None,
        by_cost: bool = False,
    ) -> None:
        self.weights = weights
        #: True for least-cost rankings: ``weights`` are minus the costs, and each
        #: column's ``multiplier * normalized`` is the function's share of the cost.
        self.by_cost = by_cost
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
    """One built-in weigher's state during a request, by position in the memo's base
    rows: raw weights, multipliers, the normalization range over the hosts in play and
    its weighted, normalized term ``multiplier * (raw - low) / (high - low)``."""

    __slots__ = ("raw", "owned", "mult", "mult_const", "_mult_finite", "low", "high",
                 "skip", "term", "live_low", "live_high")

    def __init__(self) -> None:
        self.raw = np.empty(0)
        #: Whether ``raw`` is the memo's own copy (it may be the weigher's array).
        self.owned = True
        self.mult = np.empty(0)
        #: The multiplier when every host's is the same (zero: the term is skipped
        #: over a finite range); None otherwise (the column ``mult`` is used).
        self.mult_const: float | None = None
        #: Whether every multiplier is finite; read only for a constant column.
        self._mult_finite: bool | None = None
        self.low = math.nan
        self.high = math.nan
        self.skip = False
        self.term: np.ndarray | None = None
        #: ``raw`` with the hosts out of play set to +inf / -inf, made when the range
        #: is first recomputed: its min / max is the range over the hosts in play in one
        #: pass, without gathering them (an extreme host leaves at almost every
        #: instance of a multi-create: the chosen host is usually the best).
        self.live_low: np.ndarray | None = None
        self.live_high: np.ndarray | None = None

    def low_in_play(self, alive: np.ndarray) -> float:
        """The minimum raw value over the hosts in play (NaN if one of them is)."""
        if self.live_low is None:
            self.live_low = self.raw.copy()
            self.live_low[~alive] = math.inf
        return float(self.live_low.min())

    def high_in_play(self, alive: np.ndarray) -> float:
        """The maximum raw value over the hosts in play (NaN if one of them is)."""
        if self.live_high is None:
            self.live_high = self.raw.copy()
            self.live_high[~alive] = -math.inf
        return float(self.live_high.max())

    def follow(self, moved: list[int], values: list[float], alive: np.ndarray,
               gone: list[int]) -> None:
        """Keep the in-play copies current: changed values, hosts that left."""
        for live, out in ((self.live_low, math.inf), (self.live_high, -math.inf)):
            if live is None:
                continue
            for at, value in zip(moved, values):
                live[at] = value if alive[at] else out
            for at in gone:
                live[at] = out

    def multiplier_of(self, rows: np.ndarray) -> np.ndarray | float:
        """The multipliers of ``rows`` (a float when every host's is zero)."""
        return self.mult_const if self.mult_const is not None else self.mult[rows]

    @property
    def mult_finite(self) -> bool:
        """Whether every multiplier is finite (computed when first asked)."""
        if self._mult_finite is None:
            self._mult_finite = (math.isfinite(self.mult_const) if self.mult_const is not None
                                 else bool(np.isfinite(self.mult).all()))
        return self._mult_finite

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

    def full_term(self) -> None:
        """Recompute the term everywhere (values off the hosts in play are unused), in
        the term's own buffer when it has one (a request's arrays are few and reused)."""
        with np.errstate(all="ignore"):
            term = np.subtract(self.raw, self.low, out=self.term)
            term /= self.high - self.low
            term *= self.mult_const if self.mult_const is not None else self.mult
        self.term = term

    def rows_term(self, rows: np.ndarray) -> None:
        """Recompute the term at the positions ``rows`` only."""
        assert self.term is not None
        with np.errstate(all="ignore"):
            term = self.raw[rows] - self.low
            term /= self.high - self.low
            term *= self.multiplier_of(rows)
        self.term[rows] = term


class _RankerMemo:
    """A WeigherRanker's request-scoped state. Everything is indexed by position in
    ``base``, the rows of the request's first ranking (later rankings rank subsets of
    them: the pipeline's host list only shrinks): per-weigher terms, the total weight,
    which positions are in play (``alive``), and the position in the working set's
    touched-row log everything is current with."""

    __slots__ = ("spec", "terms", "base", "where", "alive", "seen", "total", "rows",
                 "positions")

    def __init__(self, spec: RequestSpec, rows: np.ndarray, size: int, count: int) -> None:
        self.spec = spec
        self.terms = [_Term() for _ in range(count)]
        self.base = rows
        #: Snapshot row -> position in ``base`` (-1: not weighed in this request).
        self.where = np.full(size, -1, dtype=np.intp)
        self.where[rows] = np.arange(len(rows), dtype=np.intp)
        self.alive = np.ones(len(rows), dtype=bool)
        self.seen = 0
        self.total = np.zeros(len(rows))
        #: The rows of the last ranking (the pipeline passes the same array when no
        #: host was filtered out since) and their positions (None: all of ``base``).
        self.rows = rows
        self.positions: np.ndarray | None = None


_NO_ROWS = np.empty(0, dtype=np.intp)
_MIN = np.minimum.reduce
_MAX = np.maximum.reduce
_NO_VALUES = np.empty(0)


def _array_min(values: list[float]) -> float:
    """``float(np.min(values))``: NaN if any value is NaN."""
    if len(values) == 1:
        return values[0]
    return math.nan if any(v != v for v in values) else min(values)


def _array_max(values: list[float]) -> float:
    """``float(np.max(values))``: NaN if any value is NaN."""
    if len(values) == 1:
        return values[0]
    return math.nan if any(v != v for v in values) else max(values)


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
        #: Weighers whose uniform multiplier is a function of the snapshot's aggregates
        #: and the (frozen) configuration alone.
        self._snapshot_uniform = [uniform_per_snapshot(w) for w in self.weighers]
        #: (aggregates epoch of the snapshot, signatures, the weighers' uniform
        #: multipliers) of the last ranking.
        self._uniforms: tuple[object, int, list[float | None]] | None = None

    def uniform_multipliers(self, hosts: Hosts) -> list[float | None]:
        """Each weigher's :meth:`~BaseHostWeigher.uniform_multiplier` for ``hosts``.

        The built-in answer depends only on the snapshot's aggregates and the
        configuration, so it is asked once per aggregates epoch of the snapshot (one
        lookup a request instead of one per weigher); a weigher that answers its own
        way is asked every time."""
        snapshot = hosts.snapshot
        epoch = snapshot.table_cached(("aggregates epoch",), object)
        signatures = len(snapshot.table("aggregates"))
        kept = self._uniforms
        if kept is None or kept[0] is not epoch or kept[1] != signatures:
            kept = self._uniforms = (epoch, signatures, [
                w.uniform_multiplier(hosts) if fixed else None
                for w, fixed in zip(self.weighers, self._snapshot_uniform)])
        values = kept[2]
        if all(self._snapshot_uniform):
            return values
        return [value if fixed else w.uniform_multiplier(hosts)
                for w, fixed, value in zip(self.weighers, self._snapshot_uniform, values)]

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
        values: list[tuple[np.ndarray, np.ndarray | float]] = []
        for weigher, uniform in zip(self.weighers, self.uniform_multipliers(hosts)):
            raw = np.asarray(weigher.weigh_all_hosts(hosts, spec), dtype=float)
            # One number when every host's multiplier is the same (no aggregate
            # overrides it): no column to gather, and a zero one is seen at once.
            multiplier: np.ndarray | float
            if uniform is None:
                multiplier = np.asarray(weigher.multipliers_all_hosts(hosts), dtype=float)
                finite = bool(np.all(np.isfinite(multiplier)))
            else:
                multiplier, finite = uniform, math.isfinite(uniform)
            values.append((raw, multiplier))
            # The ufuncs' reductions themselves (what ndarray.min/max call, without the
            # wrapper): the same values, NaN included.
            low = float(_MIN(raw)) if weigher.minval is None else float(weigher.minval)
            high = float(_MAX(raw)) if weigher.maxval is None else float(weigher.maxval)
            if low == high and finite:
                continue  # normalize() gives zeros; multiplier * 0 adds (signed) zero
            if uniform == 0.0 and math.isfinite(low) and math.isfinite(high):
                continue  # 0 * a finite normalized value: (signed) zero on every host
            # Nova's arithmetic, in place: weight += multiplier * ((raw - low) / span).
            term = raw - low
            term /= high - low
            term *= multiplier
            weights += term

        def columns() -> list[WeigherColumn]:
            return [
                WeigherColumn(type(w).__name__, raw, normalize(raw, w.minval, w.maxval),
                              np.broadcast_to(np.asarray(mult, dtype=float), raw.shape).copy())
                for w, (raw, mult) in zip(self.weighers, values)
            ]

        return Ranking(weights, None, columns_fn=columns)

    def _rank_memo(self, hosts: Hosts, spec: RequestSpec) -> Ranking:
        ws = hosts.ws
        rows = hosts.rows
        key = ("WeigherRanker", id(self))
        memo = ws.memo.get(key)
        if not isinstance(memo, _RankerMemo) or memo.spec is not spec:
            return self._first(hosts, spec, key)
        if memo.rows is rows:
            removed = _NO_ROWS
        else:
            positions = memo.where[rows]
            if positions.min() < 0:  # a host this request has not weighed: start over
                return self._first(hosts, spec, key)
            alive = np.zeros(len(memo.base), dtype=bool)
            alive[positions] = True
            removed = np.flatnonzero(memo.alive & ~alive)
            in_play = len(memo.base) if memo.positions is None else len(memo.positions)
            if in_play - len(removed) != len(positions):
                # A host back in play (or a repeated one): start over.
                return self._first(hosts, spec, key)
            memo.alive, memo.rows, memo.positions = alive, rows, positions
        # Positions touched since the last ranking, by changed field.
        by_field: dict[str, set[int]] = {}
        touched = ws.touched
        if len(touched) > memo.seen:
            where = memo.where
            for row, name in zip(touched[memo.seen:], ws.touched_fields[memo.seen:]):
                at = int(where[row])
                if at >= 0:
                    by_field.setdefault(name, set()).add(at)
            memo.seen = len(touched)
        if not by_field and not len(removed):
            return self._memo_ranking(memo)  # nothing changed since the last ranking
        # Incremental: the few touched hosts are weighed again by the weighers that read
        # what changed, and the ranges follow the changed and removed values. The
        # bookkeeping is on Python scalars (a ranking touches a handful of hosts).
        alive = memo.alive
        base = memo.base
        all_touched = set().union(*by_field.values()) if by_field else set()
        gone_at = removed.tolist()
        recompute_total = False
        changed: set[int] = set()
        views: dict[tuple[int, ...], Hosts] = {}  # weighers touched on the same hosts share one
        for index, weigher in enumerate(self.weighers):
            t = memo.terms[index]
            inputs = self._inputs[index]
            if inputs is None:
                mine = all_touched
            else:
                mine = set()
                for name, touched_at in by_field.items():
                    if name in inputs or name == "*attrs":
                        mine |= touched_at
            if not mine and not gone_at:
                continue  # nothing this weigher reads changed: same range, same term
            raw = t.raw
            moved: list[int] = []
            olds: list[float] = []
            afters: list[float] = []
            news: list[float] = []  # the changed values of hosts still in play
            if mine:
                mine_at = sorted(mine)
                view = views.get(view_key := tuple(mine_at))
                if view is None:
                    view = views[view_key] = ws.hosts(base[mine_at])
                new = np.asarray(weigher.weigh_all_hosts(view, spec), dtype=float).tolist()
                for at, after in zip(mine_at, new):
                    before = raw.item(at)
                    # NaN counts as a change (as an array comparison would say).
                    if before == after and before == before:
                        continue
                    moved.append(at)
                    olds.append(before)
                    afters.append(after)
                    if alive[at]:
                        news.append(after)
                if moved:
                    if not t.owned:
                        raw = t.raw = raw.copy()
                        t.owned = True
                    for at, after in zip(moved, afters):
                        raw[at] = after
            gone = [raw.item(at) for at in gone_at]
            if not olds and not gone and not news:
                continue  # this weigher's values did not change: nor did its range
            t.follow(moved, afters, alive, gone_at)
            old_low, old_high, old_skip = t.low, t.high, t.skip
            if not (math.isfinite(t.low) and math.isfinite(t.high)):
                t.set_range(weigher, t.low_in_play(alive), t.high_in_play(alive))
            else:
                low, high = t.low, t.high
                if weigher.minval is None:
                    if low in olds or low in gone:
                        low = t.low_in_play(alive)
                    elif news:
                        low = min(low, _array_min(news))
                if weigher.maxval is None:
                    if high in olds or high in gone:
                        high = t.high_in_play(alive)
                    elif news:
                        high = max(high, _array_max(news))
                t.set_range(weigher, low, high)
            t.skip = t.decide_skip()
            if t.skip:
                recompute_total = recompute_total or not old_skip
                continue
            if old_skip or not (t.low == old_low and t.high == old_high) or t.term is None:
                t.full_term()
                recompute_total = True
            elif moved:
                span = t.high - t.low
                if span != 0.0 and t.term is not None:
                    # The array arithmetic of full_term on Python floats (IEEE doubles
                    # both): the same values, without a NumPy call per touched host.
                    term, low, const = t.term, t.low, t.mult_const
                    for at, value in zip(moved, afters):
                        term[at] = (value - low) / span * (
                            const if const is not None else float(t.mult[at]))
                else:
                    t.rows_term(np.array(moved, dtype=np.intp))
                changed.update(moved)
        if recompute_total:
            memo.total = self._total(memo)
        elif changed:
            active = self._active(memo)
            total = memo.total
            for at in changed:
                partial = 0.0  # as np.zeros: 0.0 + term + term ..., in weigher order
                for term in active:
                    partial += term[at]
                total[at] = partial
        return self._memo_ranking(memo)

    def _first(self, hosts: Hosts, spec: RequestSpec, key: Hashable) -> Ranking:
        """The request's first ranking (or a fresh start): weigh every host, as the
        plain path does, and keep each weigher's values by position."""
        ws = hosts.ws
        memo = ws.memo[key] = _RankerMemo(spec, hosts.rows, len(ws.snapshot),
                                          len(self.weighers))
        memo.seen = len(ws.touched)
        uniforms = self.uniform_multipliers(hosts)
        for index, weigher in enumerate(self.weighers):
            t = memo.terms[index]
            # Not copied: a weigher may hand out a cached array; the memo copies it
            # before its first change (most weighers never change in a request).
            t.raw = np.asarray(weigher.weigh_all_hosts(hosts, spec), dtype=float)
            t.owned = False
            uniform = uniforms[index]
            if uniform is not None:
                # One multiplier for every host: kept as a number.
                t.mult_const, t.mult = uniform, _NO_VALUES
            else:
                t.mult = np.asarray(weigher.multipliers_all_hosts(hosts), dtype=float)
                first = float(t.mult[0])
                if first == 0.0 and not t.mult.any():
                    # Every multiplier is (signed) zero: the term is skipped over a
                    # finite range (any() is True for NaN); one value says it all.
                    t.mult_const, t.mult = first, _NO_VALUES
            t.set_range(weigher, float(t.raw.min()), float(t.raw.max()))
            t.skip = t.decide_skip()
            if not t.skip:
                t.full_term()
        memo.total = self._total(memo)
        return self._memo_ranking(memo)

    @staticmethod
    def _active(memo: _RankerMemo) -> list[np.ndarray]:
        return [t.term for t in memo.terms if not t.skip and t.term is not None]

    def _total(self, memo: _RankerMemo) -> np.ndarray:
        """Σ of the active terms, in weigher order (the full weighing's additions), in
        the memo's buffer (rankings hand out copies of it)."""
        total = memo.total
        total.fill(0.0)
        for term in self._active(memo):
            total += term
        return total

    def _memo_ranking(self, memo: _RankerMemo) -> Ranking:
        positions = memo.positions
        weights = memo.total.copy() if positions is None else memo.total[positions]
        terms = list(memo.terms)

        def columns() -> list[WeigherColumn]:
            # Read right after ranking (explanations): the memo still holds these values.
            at = np.arange(len(memo.base)) if positions is None else positions
            out = []
            for w, t in zip(self.weighers, terms):
                raw = t.raw[at]
                mult = np.broadcast_to(np.asarray(t.multiplier_of(at), dtype=float),
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
