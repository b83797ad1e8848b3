"""Parsing of ``name=ratio`` list options (``[metrics] weight_setting``,
``[filter_scheduler] image_props_weight_setting``), exactly as Nova parses them.

Each item is split at the first ``=``; the value goes through ``float()``. An item is
kept only when the key is non-empty, ``=`` was present and the value converts; bad items
are dropped with a warning (``name``, ``=5``, ``name=2.0t``). The key is not stripped, and
duplicates are kept (the result is a list of pairs).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

LOG = logging.getLogger(__name__)


def parse_weight_setting(items: Iterable[str], option: str = "weight_setting") -> list[tuple[str, float]]:
    """``["a=1.0", "b=-2"]`` -> ``[("a", 1.0), ("b", -2.0)]``; bad items dropped."""
    parsed: list[tuple[str, float]] = []
    for item in items:
        name, sep, value = item.partition("=")
        try:
            ratio = float(value)
        except ValueError:
            ratio = None
        if not name or not sep or ratio is None:
            LOG.warning("%s: ignoring %r (expected name=ratio)", option, item)
            continue
        parsed.append((name, ratio))
    return parsed
