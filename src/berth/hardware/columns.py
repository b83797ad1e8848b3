"""Per-row signature codes of hardware objects, for once-per-distinct-value evaluation.

NUMA topologies and PCI pools are per-host objects, but hosts of one hardware model
report equal ones. :func:`object_codes` gives each row a small integer code, equal for
equal objects (by value: both classes are hashable values), so a bulk filter evaluates
each distinct topology once and spreads the result with NumPy. The snapshot's codes are
built once per snapshot generation; a request's own overrides (virtual consumption
during a multi-create) are patched in per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from berth.host_state import Hosts

#: Code of a row whose object is None.
NONE_CODE = -1


class _Interner:
    """Value -> code table; unhashable objects are interned by identity."""

    __slots__ = ("table", "index")

    def __init__(self, table: list[Any] | None = None, index: dict[Any, int] | None = None) -> None:
        self.table: list[Any] = table if table is not None else []
        self.index: dict[Any, int] = index if index is not None else {}

    def code(self, obj: Any) -> int:
        if obj is None:
            return NONE_CODE
        try:
            key: Any = obj
            hash(key)
        except TypeError:
            key = ("__id__", id(obj))
        code = self.index.get(key)
        if code is None:
            code = self.index[key] = len(self.table)
            self.table.append(obj)
        return code


def object_codes(hosts: Hosts, name: str) -> tuple[np.ndarray, list[Any]]:
    """``(codes, table)``: per host of ``hosts`` the code of its ``name`` object
    (:data:`NONE_CODE` for None), and the distinct objects indexed by code."""
    snapshot = hosts.snapshot

    def build() -> tuple[np.ndarray, _Interner]:
        interner = _Interner()
        column = snapshot.obj(name)
        codes = np.fromiter((interner.code(o) for o in column), dtype=np.int64, count=len(column))
        return codes, interner

    base_codes, interner = snapshot.cached(("hardware.object_codes", name), build)
    codes = base_codes[hosts.rows]
    overrides = hosts.ws.overridden(name)
    if not overrides:
        return codes, interner.table
    local = _Interner(list(interner.table), dict(interner.index))
    positions = np.flatnonzero(np.isin(hosts.rows, np.fromiter(overrides, dtype=np.int64)))
    for pos in positions.tolist():
        codes[pos] = local.code(overrides[int(hosts.rows[pos])])
    return codes, local.table


def keep_candidates(
    candidates: Sequence[dict[str, Any]],
    fit: Callable[[Any], bool],
    key: Callable[[Any], Any] | None,
) -> list[dict[str, Any]]:
    """Nova's ``filter_candidates``: the candidates whose ``mappings`` fit.

    ``key`` maps a candidate's mappings to what the fit reads of them, so equal keys are
    evaluated once; None means the mapping cannot change the answer (no PCI requests or
    no pools), and one evaluation serves every candidate.
    """
    if not candidates:
        return []
    if key is None:
        return list(candidates) if fit(candidates[0].get("mappings")) else []
    answers: dict[Any, bool] = {}
    kept = []
    for cand in candidates:
        mapping = cand.get("mappings")
        k = key(mapping)
        ok = answers.get(k)
        if ok is None:
            ok = answers[k] = fit(mapping)
        if ok:
            kept.append(cand)
    return kept
