"""Allocation ratios of the legacy resource filters (RamFilter, CoreFilter, DiskFilter).

The plain filters use the host's own ratio; the ``Aggregate*`` variants use the minimum of
the float values of the aggregate key (``ram_allocation_ratio`` ...), falling back to the
host's ratio when no aggregate has the key or when any value is not a float (reference
§12.1-§12.3). Shared here so the three filter families read ratios the same way on the
per-host and the bulk path.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from berth.filters.utils import validate_num_values, values_from_key

if TYPE_CHECKING:
    from berth.host_state import Hosts
    from berth.model.aggregate import Aggregate

LOG = logging.getLogger(__name__)


def unset_as_nan(value: float | None) -> float:
    """A HostState ratio, NaN when unset (the snapshot's NaN), so comparisons are false."""
    return math.nan if value is None else value


def aggregate_ratio(aggregates: Iterable[Aggregate], key: str) -> float | None:
    """The minimum float value of ``key`` over ``aggregates``; None means "use the host's
    ratio" (no value, or a value that will not convert, logged)."""
    values = values_from_key(aggregates, key)
    if not values:
        return None
    try:
        return float(validate_num_values(values, None, cast_to=float))
    except ValueError as exc:
        LOG.warning("could not decode %s aggregate metadata %s: %s; using the host's ratio",
                    key, sorted(values), exc)
        return None


def host_ratio(host_value: float, aggregates: Iterable[Aggregate], key: str) -> float:
    """The ratio a per-host check uses: the aggregate override, else the host's."""
    override = aggregate_ratio(aggregates, key)
    return host_value if override is None else override


def ratios_all(hosts: Hosts, key: str) -> np.ndarray:
    """:func:`host_ratio` for every host: the override once per aggregate signature,
    the host's ratio column where there is none."""
    unique, inverse = hosts.signatures("aggregates")
    snapshot = hosts.snapshot
    overrides = [aggregate_ratio(snapshot.aggregates_of_signature(int(c)), key) for c in unique]
    has = np.array([o is not None for o in overrides], dtype=bool)
    values = np.array([np.nan if o is None else o for o in overrides], dtype=float)
    host_values = hosts.col(key)
    if len(overrides) == 0:
        return host_values
    return np.where(has[inverse], values[inverse], host_values)
