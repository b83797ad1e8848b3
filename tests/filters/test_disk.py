"""DiskFilter and AggregateDiskFilter (reference §12.3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import random_cloud, run_both

from berth.filters.disk import AggregateDiskFilter, DiskFilter
from builders import cloud, host, spec, state


@pytest.mark.parametrize(
    ("root", "eph", "swap", "free_gb", "total_gb", "ratio", "expected", "limit_gb"),
    [
        (1, 1, 512, 11, 13, 1.0, True, 13.0),
        (10, 1, 1024, 11, 13, 1.0, False, None),
        (3, 3, 1024, 11, 12, 10.0, True, 120.0),
        (10, 2, 1024, 29, 12, 10.0, False, None),
        (5, 0, 0, 5, 5, 1.0, True, 5.0),
        (5, 0, 1, 5, 5, 1.0, False, None),
    ],
    ids=[
        "enough free disk passes and the limit is total times ratio in GB",
        "root plus ephemeral plus swap beyond free disk fails",
        "over-subscription with ratio 10 passes",
        "a flavor larger than the whole disk fails even with over-commit",
        "exactly the free disk passes",
        "swap counts in MB: one MB of swap more fails",
    ],
)
def test_disk_filter(root: int, eph: int, swap: int, free_gb: int, total_gb: int, ratio: float,
                     expected: bool, limit_gb: float | None) -> None:
    snap = cloud(host("h1", free_disk_mb=free_gb * 1024, total_usable_disk_gb=total_gb,
                      disk_allocation_ratio=ratio))
    req = spec(root_gb=root, ephemeral_gb=eph, swap=swap)
    per_host, per_host_limits, bulk, bulk_limits = run_both(DiskFilter(), snap, req)
    assert per_host == bulk == [expected]
    expected_limits = [{"disk_gb": limit_gb}] if limit_gb is not None else [{}]
    assert per_host_limits == bulk_limits == expected_limits


def test_reason_carries_requested_and_usable_disk() -> None:
    snap = cloud(host("h1", free_disk_mb=1024, total_usable_disk_gb=10))
    reject = DiskFilter().check(state(snap, "h1"), spec(root_gb=2, swap=100))
    assert reject is not None and reject.reason == "insufficient disk"
    assert reject.numbers == {"requested_mb": 2148, "usable_mb": 1024.0}


@pytest.mark.parametrize(
    ("values", "limit_gb"),
    [([], 10.0), (["2.0"], 20.0), (["3", "2.0"], 20.0), (["bad"], 10.0), (["0.5"], None)],
    ids=[
        "no aggregate ratio uses the host's",
        "an aggregate ratio replaces the host's",
        "several aggregate ratios: the minimum wins",
        "a bad value falls back to the host's ratio",
        "a low aggregate ratio can make the host fail",
    ],
)
def test_aggregate_disk_filter_ratio(values: list[str], limit_gb: float | None) -> None:
    b = host("h1", free_disk_mb=5 * 1024, total_usable_disk_gb=10, disk_allocation_ratio=1.0)
    for i, v in enumerate(values):
        b.in_aggregate(f"a{i}", disk_allocation_ratio=v)
    per_host, per_host_limits, bulk, bulk_limits = run_both(AggregateDiskFilter(), cloud(b), spec(root_gb=4))
    assert per_host == bulk == [limit_gb is not None]
    expected = [{"disk_gb": limit_gb}] if limit_gb is not None else [{}]
    assert per_host_limits == bulk_limits == expected


@settings(max_examples=50, deadline=None)
@given(snap=random_cloud(agg_keys=("disk_allocation_ratio",)),
       root=st.sampled_from([0, 1, 10, 50]), swap=st.sampled_from([0, 1, 512]))
def test_bulk_and_per_host_paths_agree_with_the_same_limits(snap, root, swap) -> None:  # type: ignore[no-untyped-def]
    for f in (DiskFilter(), AggregateDiskFilter()):
        per_host, per_host_limits, bulk, bulk_limits = run_both(f, snap, spec(root_gb=root, swap=swap))
        assert per_host == bulk
        assert per_host_limits == bulk_limits


def test_an_unset_host_ratio_fails_on_both_paths_instead_of_raising() -> None:
    snap = cloud(host("h1", disk_allocation_ratio=None))
    per_host, _, bulk, _ = run_both(DiskFilter(), snap, spec(root_gb=1))
    assert per_host == bulk == [False]
