"""AllHostsFilter (reference §3.1)."""

from __future__ import annotations

from berth.filters.all_hosts import AllHostsFilter
from builders import cloud, host, passes_bulk, passes_per_host, spec


def test_every_host_passes_on_both_paths() -> None:
    snap = cloud(host("h1"), host("h2", free_ram_mb=-1))
    f = AllHostsFilter()
    assert passes_per_host(f, snap, spec()) == [True, True]
    assert passes_bulk(f, snap, spec()) == [True, True]
    assert f.run_filter_once_per_request is True
    assert f.RUN_ON_REBUILD is False
