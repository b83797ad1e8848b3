"""Berth: a fast, explainable VM scheduler with Nova's filter-scheduler semantics.

The pure core lives in :mod:`berth.pipeline` (``Scheduler.select_destinations``), fed by a
columnar :class:`berth.snapshot.HostSnapshot`, a :class:`berth.model.RequestSpec` and a frozen
:class:`berth.config.SchedulerConfig`. Filters and weighers are in :mod:`berth.filters` and
:mod:`berth.weighers`; adapters (store, HTTP API, CLI) wrap the core.
"""

__version__ = "0.1.0"
