"""Aggregate helpers shared by filters and weighers (reference §1.2), per host and in bulk.

Per host (Nova's helpers, same names): :func:`aggregate_values_from_key` (raw values, no
comma split), :func:`aggregate_metadata_get_by_host` (comma-split, stripped sets) and
:func:`validate_num_values` (minimum; a value that will not cast raises ValueError).

In bulk: every host with the same aggregate membership shares one evaluation, so the
functions below compute once per distinct membership signature and spread the result to
the rows (``result[inverse]``).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.aggregate import Aggregate

LOG = logging.getLogger(__name__)


def aggregate_values_from_key(host_state: HostState, key_name: str) -> set[str]:
    """The raw metadata values of ``key_name`` across the host's aggregates."""
    return values_from_key(host_state.aggregates, key_name)


def values_from_key(aggregates: Iterable[Aggregate], key_name: str) -> set[str]:
    """The raw metadata values of ``key_name`` across ``aggregates``."""
    return {agg.metadata[key_name] for agg in aggregates if key_name in agg.metadata}


def aggregate_metadata_get_by_host(
    host_state: HostState, key: str | None = None
) -> defaultdict[str, set[str]]:
    """Metadata key -> union of comma-split, stripped values over the host's aggregates.

    With ``key``, only aggregates carrying ``key`` count, but then all of their keys do.
    """
    return metadata_by_key(host_state.aggregates, key)


def metadata_by_key(
    aggregates: Iterable[Aggregate], key: str | None = None
) -> defaultdict[str, set[str]]:
    """:func:`aggregate_metadata_get_by_host` over an explicit aggregate list."""
    metadata: defaultdict[str, set[str]] = defaultdict(set)
    for agg in aggregates:
        if key is not None and key not in agg.metadata:
            continue
        for k, v in agg.metadata.items():
            metadata[k].update(x.strip() for x in v.split(","))
    return metadata


def validate_num_values(
    vals: Iterable[Any],
    default: Any = None,
    cast_to: Callable[[Any], Any] = int,
    based_on: Callable[[Iterable[Any]], Any] = min,
) -> Any:
    """``default`` for no values, else ``based_on`` of the cast values (ValueError if one
    will not cast)."""
    vals = list(vals)
    if not vals:
        return default
    return based_on(cast_to(v) for v in vals)


def numeric_override(
    aggregates: Iterable[Aggregate],
    key: str,
    default: float,
    cast_to: Callable[[Any], Any] = int,
    what: str = "",
) -> float:
    """The minimum of ``key``'s values cast with ``cast_to``; ``default`` when there are
    none or when any value will not cast (logged), as Nova's callers do."""
    values = values_from_key(aggregates, key)
    try:
        return float(validate_num_values(values, default, cast_to=cast_to))
    except (ValueError, TypeError) as exc:
        LOG.warning("could not decode %s aggregate metadata %s=%s: %s; using %s",
                    what or key, key, sorted(values), exc, default)
        return float(default)


def per_signature(hosts: Hosts, compute: Callable[[list[Aggregate]], Any]) -> list[Any]:
    """``compute(aggregates)`` once per distinct membership among ``hosts``, one result per
    host (a list aligned with ``hosts.rows``)."""
    unique, inverse = hosts.signatures("aggregates")
    snapshot = hosts.snapshot
    results = [compute(snapshot.aggregates_of_signature(int(code))) for code in unique]
    return [results[i] for i in inverse.tolist()]


def per_signature_array(
    hosts: Hosts, compute: Callable[[list[Aggregate]], Any], dtype: Any = float
) -> np.ndarray:
    """Like :func:`per_signature`, as a NumPy array (numbers or booleans)."""
    unique, inverse = hosts.signatures("aggregates")
    snapshot = hosts.snapshot
    results = np.array(
        [compute(snapshot.aggregates_of_signature(int(code))) for code in unique], dtype=dtype
    )
    if len(results) == 0:
        return np.zeros(len(hosts), dtype=dtype)
    return results[inverse]


def numeric_override_all(
    hosts: Hosts, key: str, default: float, cast_to: Callable[[Any], Any] = int, what: str = ""
) -> np.ndarray:
    """:func:`numeric_override` for every host, evaluated once per aggregate signature."""
    return per_signature_array(
        hosts, lambda aggs: numeric_override(aggs, key, default, cast_to, what), dtype=float
    )


def nova_updated(value: Any) -> Any:
    """A host's ``updated`` as Nova's host state holds it: an aware UTC datetime (the
    compute node's ``updated_at``), where Berth keeps seconds since the epoch. Filters
    that show or compare it as a value (JsonFilter's ``$updated``, a capability) read
    this, so a comparison with a number raises and a string is a date, as in Nova."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return dt.datetime.fromtimestamp(value, dt.UTC)
    return value
