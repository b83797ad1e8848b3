"""The order of the hosts of one ranking, produced lazily (reference §8.3).

Nova sorts every filtered host by weight for every instance of a request, and the next
instance's stable sort breaks ties by that previous order. The pipeline needs far less:
the best ``host_subset_size`` hosts (plus those tied for best when shuffling), the
claim walk (almost always the first host) and a few same-cell alternates. So a ranking
is kept as a *level*: the explicit first entries of the order (``prefix``) and, for the
rest, the rule "descending weight, ties by the previous level's order" (the first level's
ties go by ascending row, the order hosts enter the pipeline in, or by the scheduler's
tie order, see :func:`tie_keys`). Any head of the order
can then be produced exactly, with a partial selection (``np.partition``) and a sort of
the few candidates, instead of a full sort of 100,000 hosts. ``tests/test_paths_agree``
proves the result equals the full stable sort (the per-host reference path).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def tie_keys(salt: int, rows: np.ndarray) -> np.ndarray:
    """Each row's place among equally weighed hosts for a scheduler with tie salt
    ``salt``: a 64-bit mix (splitmix64) of salt and row, distinct for distinct rows.

    Nova walks hosts in the order of a Python set of (host, node) keys, which string
    hashing makes arbitrary and different in every scheduler process, but stable within
    one. Several Nova schedulers in front of identical hosts therefore start on different
    hosts, where schedulers that all break ties by row would all claim the same one.
    A per-scheduler salt gives Berth the same spread, reproducibly.
    """
    offset = (salt * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF  # wraps as uint64 would
    z = rows.astype(np.uint64) + np.uint64(offset)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Levels(list["Level"]):
    """The rankings of one request; ``salt`` orders the first ranking's ties (None: by
    ascending row)."""

    salt: int | None = None


class Level:
    """One ranking of a request: its hosts, their weights and the explicit order prefix.

    ``rows`` are the ranked hosts in ascending row order; ``weights`` is indexed by
    snapshot row (only ``rows`` are meaningful) and is None when the whole order is
    explicit (``prefix`` then holds every host). It is built from the weights aligned
    with ``rows`` when first read: most levels are never read again (no ties to break,
    no alternates to walk).
    """

    __slots__ = ("rows", "prefix", "_aligned", "_size", "_weights", "rank", "rank_prefix")

    def __init__(self, rows: np.ndarray, aligned: np.ndarray | None, prefix: np.ndarray,
                 size: int = 0) -> None:
        self.rows = rows
        self.prefix = prefix
        self._aligned = aligned
        self._size = size
        self._weights: np.ndarray | None = None
        #: Each of ``rows``' place in this level's whole order (see :func:`_level_rank`),
        #: valid while ``prefix`` is ``rank_prefix``.
        self.rank: np.ndarray | None = None
        self.rank_prefix: np.ndarray | None = None

    @property
    def aligned(self) -> np.ndarray | None:
        """The weights aligned with ``rows`` (None for an explicit order)."""
        return self._aligned

    @property
    def explicit(self) -> bool:
        """True when the ranker gave the whole order (no weights to derive it from)."""
        return self._aligned is None

    @property
    def weights(self) -> np.ndarray | None:
        """Weights by snapshot row (None for an explicit order)."""
        if self._weights is None and self._aligned is not None:
            self._weights = np.empty(self._size)
            self._weights[self.rows] = self._aligned
        return self._weights

    def prefix_positions(self, rows: np.ndarray) -> np.ndarray:
        """Position of each of ``rows`` in ``prefix``, or -1."""
        if len(self.prefix) == 0 or len(rows) == 0:
            return np.full(len(rows), -1, dtype=np.int64)
        if len(self.prefix) == 1:  # the chosen host alone (host_subset_size 1, no ties)
            positions = np.full(len(rows), -1, dtype=np.int64)
            positions[rows == self.prefix[0]] = 0
            return positions
        if len(rows) > 8 * len(self.prefix) and (
                rows is self.rows or bool(np.all(rows[1:] > rows[:-1]))):
            # Many ascending rows, a short prefix: look the prefix up in the rows.
            at = np.minimum(np.searchsorted(rows, self.prefix), len(rows) - 1)
            present = rows[at] == self.prefix
            positions = np.full(len(rows), -1, dtype=np.int64)
            positions[at[present]] = np.flatnonzero(present)
            return positions
        by_row = np.argsort(self.prefix, kind="stable")
        sorted_prefix = self.prefix[by_row]
        at = np.searchsorted(sorted_prefix, rows)
        at_clipped = np.minimum(at, len(sorted_prefix) - 1)
        found = sorted_prefix[at_clipped] == rows
        return np.where(found, by_row[at_clipped], -1)


def head_of(levels: Levels, level: int, rows: np.ndarray, m: int) -> np.ndarray:
    """The first ``m`` of ``rows`` in the order of ``levels[level]`` (level -1: by row,
    or by :func:`tie_keys` when the levels carry a salt).

    ``rows`` must be a subset of that level's hosts. Exactly the stable-sort result:
    the prefix first, then the rest by descending weight with ties in the previous
    level's order; only hosts that can reach the first ``m`` places are sorted.
    """
    m = min(m, len(rows))
    if m <= 0:
        return rows[:0]
    if len(rows) == 1:
        return rows
    if level < 0:
        if levels.salt is not None:
            keys = tie_keys(levels.salt, rows)
            if m == 1:
                return rows[[int(np.argmin(keys))]]
            return rows[np.argsort(keys)[:m]]
        return np.sort(rows)[:m] if m < len(rows) else np.sort(rows)
    lvl = levels[level]
    aligned = lvl.aligned if rows is lvl.rows else None  # weights of ``rows`` as they are
    if len(lvl.prefix):
        pos = lvl.prefix_positions(rows)
        in_prefix = pos >= 0
        head = rows[in_prefix][np.argsort(pos[in_prefix], kind="stable")]
        if len(head):
            rest = rows[~in_prefix]
            if aligned is not None:
                aligned = aligned[~in_prefix]
        else:
            rest = rows
    else:
        head, rest = rows[:0], rows
    need = m - len(head)
    if need <= 0 or lvl.explicit:
        return head[:m]
    neg = np.negative(aligned) if aligned is not None else -lvl.weights[rest]  # type: ignore[index]
    if need < len(rest):
        # The need-th smallest of -weight (NaN sorts last in both forms).
        threshold = neg.min() if need == 1 else np.partition(neg, need - 1)[need - 1]
        if not np.isnan(threshold):
            # Everything that could be among the first ``need``: strictly better hosts
            # and every host tied with the threshold (their order is decided below).
            keep = neg <= threshold
            rest, neg = rest[keep], neg[keep]
    by_weight = np.argsort(neg, kind="stable")
    ranked = neg[by_weight]
    if bool(np.any(ranked[1:] == ranked[:-1])) or np.count_nonzero(np.isnan(neg)) > 1:
        # Ties: order the candidates by the previous level, then stable-sort by weight.
        rest = _in_order(levels, level - 1, rest)
        neg = -_aligned_at(lvl, rest)
        by_weight = np.argsort(neg, kind="stable")
    ordered = rest[by_weight]
    return np.concatenate([head, ordered[:need]])


def _aligned_at(lvl: Level, rows: np.ndarray) -> np.ndarray:
    """The weights of ``rows`` (a subset of ``lvl.rows``, which ascend) at ``lvl``."""
    assert lvl.aligned is not None
    return lvl.aligned[np.searchsorted(lvl.rows, rows)]


def _in_order(levels: Levels, level: int, rows: np.ndarray) -> np.ndarray:
    """``rows`` (a subset of that level's hosts) in the order of ``levels[level]``: the
    same as ``head_of(levels, level, rows, len(rows))``, read off the level's whole order
    (:func:`_level_rank`) instead of sorting again through every level below. A
    multi-create on identical hosts ties on every level; ordering the ties by recursing
    down the levels cost each instance as many sorts as instances before it."""
    if level < 0:
        return head_of(levels, level, rows, len(rows))
    lvl = levels[level]
    rank = _level_rank(levels, level)
    return rows[np.argsort(rank[np.searchsorted(lvl.rows, rows)], kind="stable")]


def _level_rank(levels: Levels, level: int) -> np.ndarray:
    """Each host's place in the whole order of ``levels[level]`` (aligned with its
    ``rows``), computed from the nearest level below whose order is known, upwards;
    each level's order is computed once. Only the newest known order is kept (older
    levels are never read again once a newer one is known), so memory stays at one
    array whatever the number of instances."""
    start = level
    while start >= 0 and not _rank_known(levels[start]):
        start -= 1
    if start == level:
        rank = levels[level].rank
        assert rank is not None
        return rank
    for k in range(start + 1, level + 1):
        lvl = levels[k]
        order = _whole_order(levels, k)
        rank = np.empty(len(lvl.rows), dtype=np.int64)
        rank[np.searchsorted(lvl.rows, order)] = np.arange(len(order))
        lvl.rank, lvl.rank_prefix = rank, lvl.prefix
        if k > 0:
            below = levels[k - 1]
            below.rank = below.rank_prefix = None
    rank = levels[level].rank
    assert rank is not None
    return rank


def _rank_known(lvl: Level) -> bool:
    return lvl.rank is not None and lvl.rank_prefix is lvl.prefix


def _whole_order(levels: Levels, k: int) -> np.ndarray:
    """The hosts of ``levels[k]`` in its order (the level below known or not needed)."""
    lvl = levels[k]
    if lvl.explicit:
        return lvl.prefix
    rows, aligned = lvl.rows, lvl.aligned
    assert aligned is not None
    head = rows[:0]
    if len(lvl.prefix):
        pos = lvl.prefix_positions(rows)
        in_prefix = pos >= 0
        head = rows[in_prefix][np.argsort(pos[in_prefix], kind="stable")]
        rows, aligned = rows[~in_prefix], aligned[~in_prefix]
    neg = np.negative(aligned)
    by_weight = np.argsort(neg, kind="stable")
    ranked = neg[by_weight]
    if bool(np.any(ranked[1:] == ranked[:-1])) or np.count_nonzero(np.isnan(neg)) > 1:
        rows = _in_order(levels, k - 1, rows)
        by_weight = np.argsort(-_aligned_at(lvl, rows), kind="stable")
    return np.concatenate([head, rows[by_weight]])


def best_of(levels: Levels, rows: np.ndarray, weights: np.ndarray) -> list[int]:
    """``head_of(levels, len(levels) - 1, rows, 1)`` for the level just appended (empty
    prefix, ``weights`` aligned with ``rows``): the highest weight, ties in the previous
    level's order, in three passes over the hosts instead of a partition."""
    top = weights.max()
    if top != top:  # a NaN weight: the general path orders NaN last
        return head_of(levels, len(levels) - 1, rows, 1).tolist()
    at = np.flatnonzero(weights == top)
    if len(at) == 1:
        return [int(rows[at[0]])]
    return head_of(levels, len(levels) - 2, rows[at], 1).tolist()


class HostOrder:
    """The hosts of one ranking, best first, produced lazily (see the module's docstring).

    ``len()`` is the number of hosts; :meth:`head` gives the first ``m``; iterating walks
    the whole order, computing it in growing chunks.
    """

    def __init__(self, levels: Levels, level: int, full: np.ndarray | None = None) -> None:
        self._levels = levels
        self._level = level
        self._full = full
        self._known = levels[level].prefix if level >= 0 else np.empty(0, dtype=np.int64)

    @classmethod
    def empty(cls) -> HostOrder:
        """No hosts."""
        return cls(Levels(), -1, np.empty(0, dtype=np.int64))

    @property
    def is_explicit(self) -> bool:
        """True when the ranker gave the whole order (no weights to derive it from)."""
        return self._level >= 0 and self._levels[self._level].explicit

    @property
    def rows(self) -> np.ndarray:
        """The hosts, in ascending row order (what the next ranking filters)."""
        if self._full is not None and self._level < 0:
            return np.sort(self._full)
        return self._levels[self._level].rows

    def __len__(self) -> int:
        if self._level < 0:
            return len(self._full) if self._full is not None else 0
        return len(self._levels[self._level].rows)

    def head(self, m: int) -> np.ndarray:
        """The first ``m`` hosts, best first."""
        if self._level < 0:
            assert self._full is not None
            return self._full[:m]
        if m > len(self._known):
            lvl = self._levels[self._level]
            self._known = head_of(self._levels, self._level, lvl.rows, m)
        return self._known[:m]

    def __iter__(self) -> Iterator[int]:
        # The known prefix first: a claim almost always stops at the first host.
        yield from self._known.tolist()
        done = len(self._known)
        chunk = max(16, 2 * done)
        total = len(self)
        while done < total:
            part = self.head(chunk)
            yield from part[done:].tolist()
            done = len(part)
            chunk *= 8

    def to_array(self) -> np.ndarray:
        """The whole order as an array."""
        return self.head(len(self))
