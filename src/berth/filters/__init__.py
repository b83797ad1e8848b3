"""Host filters. ``from berth import filters`` then ``filters.BaseHostFilter`` is all a
custom filter written for Nova needs (replacing ``from nova.scheduler import filters``).

``all_filters()`` returns every built-in filter class, from the explicit registry in
:mod:`berth.filters.registry`.
"""

from berth.filters.base import BaseHostFilter, Reject


def all_filters() -> list[type[BaseHostFilter]]:
    """Every built-in filter class (what ``berth.filters.all_filters`` names in config)."""
    from berth.filters.registry import builtin_filter_classes

    return builtin_filter_classes()


__all__ = ["BaseHostFilter", "Reject", "all_filters"]
