"""RamFilter and AggregateRamFilter (reference §12.1; seed 002's over-subscription flag)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import random_cloud, run_both

from berth.filters.ram import AggregateRamFilter, RamFilter
from builders import cloud, host, spec, state


@pytest.mark.parametrize(
    ("total", "free", "ratio", "requested", "expected", "limit"),
    [
        (1024, 1024, 1.0, 1024, True, 1024.0),
        (1024, 1023, 1.0, 1024, False, None),
        (2048, -1024, 2.0, 1024, True, 4096.0),
        (1024, 512, 2.0, 2048, False, None),
        (4096, 1024, 1.5, 2048, True, 6144.0),
        (4096, 0, 1.5, 2048, True, 6144.0),
        (4096, -100, 1.5, 2048, False, None),
    ],
    ids=[
        "exactly the free RAM passes and the limit is total times ratio",
        "one MB short fails",
        "over-subscription lets a host with negative free RAM pass",
        "a flavor larger than the whole host fails even with over-commit",
        "seed 002: ratio 1.5 adds half the RAM again",
        "ratio 1.5 on a full host still leaves half the RAM",
        "ratio 1.5 exhausted fails",
    ],
)
def test_ram_filter(total: int, free: int, ratio: float, requested: int, expected: bool,
                    limit: float | None) -> None:
    snap = cloud(host("h1", total_usable_ram_mb=total, free_ram_mb=free, ram_allocation_ratio=ratio))
    per_host, per_host_limits, bulk, bulk_limits = run_both(RamFilter(), snap, spec(memory_mb=requested))
    assert per_host == bulk == [expected]
    expected_limits = [{"memory_mb": limit}] if limit is not None else [{}]
    assert per_host_limits == bulk_limits == expected_limits


def test_reasons_carry_requested_and_usable_ram() -> None:
    snap = cloud(host("h1", total_usable_ram_mb=4096, free_ram_mb=1024),
                 host("h2", total_usable_ram_mb=1024, free_ram_mb=1024))
    reject = RamFilter().check(state(snap, "h1"), spec(memory_mb=2048))
    assert reject is not None and reject.reason == "insufficient RAM"
    assert reject.numbers == {"requested_mb": 2048, "usable_mb": 1024.0}
    assert reject.render() == "insufficient RAM (requested 2048 MB, usable 1024 MB)"
    reject = RamFilter().check(state(snap, "h2"), spec(memory_mb=2048))
    assert reject is not None and reject.numbers == {"requested_mb": 2048, "total_mb": 1024}


@pytest.mark.parametrize(
    ("values", "expected_limit"),
    [
        ([], 4096.0),
        (["2.0"], 8192.0),
        (["3.0", "1.5"], 6144.0),
        (["abc"], 4096.0),
        (["abc", "3.0"], 4096.0),
        (["0.5"], None),
    ],
    ids=[
        "no aggregate ratio uses the host's",
        "an aggregate ratio replaces the host's",
        "several aggregate ratios: the minimum wins",
        "a bad value falls back to the host's ratio",
        "one bad value discards the good ones too",
        "an aggregate ratio below the host's can make it fail",
    ],
)
def test_aggregate_ram_filter_ratio(values: list[str], expected_limit: float | None) -> None:
    b = host("h1", total_usable_ram_mb=4096, free_ram_mb=2048, ram_allocation_ratio=1.0)
    for i, v in enumerate(values):
        b.in_aggregate(f"a{i}", ram_allocation_ratio=v)
    snap = cloud(b)
    per_host, per_host_limits, bulk, bulk_limits = run_both(
        AggregateRamFilter(), snap, spec(memory_mb=2048))
    assert per_host == bulk == [expected_limit is not None]
    expected = [{"memory_mb": expected_limit}] if expected_limit is not None else [{}]
    assert per_host_limits == bulk_limits == expected


def test_plain_ram_filter_ignores_aggregate_ratios() -> None:
    snap = cloud(host("h1", total_usable_ram_mb=4096, free_ram_mb=0,
                      ram_allocation_ratio=1.0).in_aggregate("a", ram_allocation_ratio="2.0"))
    assert run_both(RamFilter(), snap, spec(memory_mb=1024))[0] == [False]
    assert run_both(AggregateRamFilter(), snap, spec(memory_mb=1024))[0] == [True]


def test_flags_are_novas() -> None:
    for cls in (RamFilter, AggregateRamFilter):
        assert not cls.run_filter_once_per_request and not cls.RUN_ON_REBUILD


@settings(max_examples=50, deadline=None)
@given(snap=random_cloud(agg_keys=("ram_allocation_ratio",)),
       requested=st.sampled_from([0, 512, 1024, 4096, 9000]))
def test_bulk_and_per_host_paths_agree_with_the_same_limits(snap, requested) -> None:  # type: ignore[no-untyped-def]
    for f in (RamFilter(), AggregateRamFilter()):
        per_host, per_host_limits, bulk, bulk_limits = run_both(f, snap, spec(memory_mb=requested))
        assert per_host == bulk
        assert per_host_limits == bulk_limits


def test_an_unset_host_ratio_fails_on_both_paths_instead_of_raising() -> None:
    snap = cloud(host("h1", ram_allocation_ratio=None))
    per_host, per_host_limits, bulk, bulk_limits = run_both(RamFilter(), snap, spec(memory_mb=512))
    assert per_host == bulk == [False]
    assert per_host_limits == bulk_limits == [{}]


def test_the_selection_carries_the_limits_the_legacy_filters_set() -> None:
    import random

    from berth.config import SchedulerConfig
    from berth.pipeline import Scheduler
    from builders import NOW

    config = SchedulerConfig.from_dict({"filter_scheduler": {
        "enabled_filters": ["RamFilter", "CoreFilter", "DiskFilter"]}})
    snap = cloud(host("h1", total_usable_ram_mb=4096, free_ram_mb=0, ram_allocation_ratio=1.5,
                      vcpus_total=4, cpu_allocation_ratio=16.0, total_usable_disk_gb=10,
                      free_disk_mb=10 * 1024, disk_allocation_ratio=2.0))
    decision = Scheduler(config).select_destinations(
        spec(memory_mb=1024, vcpus=2, root_gb=5), snap, now=NOW, rng=random.Random(1))
    assert decision.selections[0][0].limits == {"memory_mb": 6144.0, "vcpu": 64.0, "disk_gb": 20.0}
