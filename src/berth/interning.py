"""Interning: a code per value into a table of distinct values, so that a rule over a
low-cardinality field is evaluated once per distinct value (see :mod:`berth.snapshot`).

:func:`freeze` makes any reported value hashable; :class:`Interned` is one column's
table; the batch helpers intern a whole column at once, with a fast path for values that
are already hashable.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import chain, repeat
from typing import Any

import numpy as np

#: Sets of value types a whole column may have, for the batch fast paths.
_SELF_KEYED = frozenset({str, tuple, type(None)})
DICT_ONLY = frozenset({dict})
_SEQUENCES = frozenset({list, tuple})


def freeze(value: Any) -> Hashable:
    """A hashable, order-independent key for a JSON-like value (dicts, lists, scalars)."""
    if isinstance(value, Mapping):
        return ("__dict__", tuple(sorted((str(k), freeze(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("__list__", tuple(freeze(v) for v in value))
    if isinstance(value, set | frozenset):
        return ("__set__", tuple(sorted(freeze(v) for v in value)))  # type: ignore[type-var]
    return value  # type: ignore[no-any-return]


def _fast_key(value: Any) -> Hashable | None:
    """A cheap exact key for common interned values, or None (then freeze() decides).

    The type tag keeps ``"1"``, ``1`` and ``(1,)`` apart; a dict key is the frozenset of
    its items, which needs hashable values (anything else falls back to freeze()).
    """
    kind = type(value)
    if value is None or kind is str or kind is int:
        return (kind, value)
    if kind is tuple:
        try:
            hash(value)
        except TypeError:
            return None
        return (tuple, value)
    if kind is dict:
        try:
            return (dict, frozenset(value.items()))
        except TypeError:
            return None
    if kind is list and all(type(v) is list for v in value):
        key = (list, tuple(tuple(v) for v in value))
        try:
            hash(key)
        except TypeError:
            return None
        return key
    return None


def _batch_keys(values: Sequence[Any]) -> Sequence[Hashable] | None:
    """Exact keys of many values, computed in C-level passes, or None (no fast form).

    Equal keys imply the per-value :meth:`Interned.intern` would give equal codes:
    strings, None and tuples are their own keys; a dict's key is its items in order
    (equal items mean equal fast keys); a list of lists/tuples of scalars is keyed by its
    tuple of tuples (freeze() makes no difference between lists and tuples). Unhashable
    parts surface as a TypeError when the keys are hashed.
    """
    kinds = set(map(type, values))
    if kinds <= _SELF_KEYED:
        return values
    if kinds == DICT_ONLY:
        return list(map(tuple, map(dict.items, values)))
    if kinds <= _SEQUENCES and set(map(type, chain.from_iterable(values))) <= _SEQUENCES:
        return list(map(tuple, map(map, repeat(tuple), values)))
    return None


def intern_batch(
    col: Interned, values: Sequence[Any], copy: Callable[[Any], Any] | None = None
) -> np.ndarray:
    """Codes of many values: each distinct key is interned once per batch, in the order
    the values first appear (the codes a row-by-row build gives).

    ``copy`` makes the stored value (only for values not seen in this batch).
    """
    n = len(values)
    keys = _batch_keys(values) if n else None
    if keys is not None:
        # The first value of each distinct key, in first-seen order.
        firsts: dict[Hashable, Any] = {}
        try:
            for _ in map(firsts.setdefault, keys, values):
                pass
        except TypeError:  # unhashable parts: the general path decides
            pass
        else:
            intern = col.intern
            lookup = {key: intern(copy(value) if copy else value)
                      for key, value in firsts.items()}
            return np.fromiter(map(lookup.__getitem__, keys), dtype=np.int32, count=n)
    return intern_each(col, values, copy)


def intern_each(
    col: Interned, values: Sequence[Any], copy: Callable[[Any], Any] | None = None
) -> np.ndarray:
    """:func:`intern_batch` one value at a time (any values).

    A list equal to the previous row's (when that one had an exact key) takes its code
    without building a key: lists of lists of scalars compare equal exactly when their
    keys do, and neighbouring rows often report the same ``supported_instances``.
    """
    intern = col.intern
    seen: dict[Hashable, int] = {}
    codes = np.empty(len(values), dtype=np.int32)
    last_list: list[Any] | None = None
    last_code = 0
    for i, value in enumerate(values):
        kind = type(value)
        key: Hashable
        if kind is list and last_list is not None and value == last_list:
            codes[i] = last_code
            continue
        try:
            if kind is str or value is None:
                key = value
            elif kind is tuple:
                key = (tuple, value)
            elif kind is dict:
                key = (dict, frozenset(value.items()))
            elif kind is list:
                key = (list, tuple(tuple(v) if type(v) is list else v for v in value))
            else:
                codes[i] = intern(copy(value) if copy else value)
                continue
            code = seen.get(key)
        except TypeError:  # unhashable parts: the general path decides
            codes[i] = intern(copy(value) if copy else value)
            continue
        if code is None:
            code = seen[key] = intern(copy(value) if copy else value)
        codes[i] = code
        if kind is list:
            last_list, last_code = value, code
    return codes


class Interned:
    """A column of interned values: ``codes[row]`` indexes ``values``.

    Equal values (by :func:`freeze`) share one code, so per-signature evaluation visits
    each distinct value once.
    """

    __slots__ = ("codes", "values", "_index", "_fast", "_size")

    def __init__(self, capacity: int = 0) -> None:
        self.codes = np.zeros(capacity, dtype=np.int32)
        self.values: list[Any] = []
        self._index: dict[Hashable, int] = {}
        self._fast: dict[Hashable, int] = {}
        self._size = 0

    def intern(self, value: Any) -> int:
        """The code for ``value``, adding it to the table if new."""
        # Fast path: most values are strings, tuples of ints or flat dicts of scalars,
        # which have a cheap exact key; freeze() (sorting, recursion) runs once per new
        # fast key only. Equal fast keys imply equal values, so codes stay the same.
        fast = _fast_key(value)
        if fast is not None:
            code = self._fast.get(fast)
            if code is not None:
                return code
        key = freeze(value)
        code = self._index.get(key)
        if code is None:
            code = len(self.values)
            self.values.append(value)
            self._index[key] = code
        if fast is not None:
            self._fast[fast] = code
        return code

    def value(self, row: int) -> Any:
        """The value of ``row``."""
        return self.values[int(self.codes[row])]
