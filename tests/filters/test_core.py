"""CoreFilter and AggregateCoreFilter (reference §12.2)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import random_cloud, run_both

from berth.filters.core import AggregateCoreFilter, CoreFilter
from builders import cloud, host, spec, state


@pytest.mark.parametrize(
    ("vcpus_total", "vcpus_used", "ratio", "requested", "expected", "limit"),
    [
        (4, 7, 2.0, 1, True, 8.0),
        (4, 8, 2.0, 1, False, 8.0),
        (0, 100, 2.0, 64, True, None),
        (1, 0, 2.0, 2, False, 2.0),
        (4, 4, 1.0, 1, False, 4.0),
        (4, 0, 16.0, 4, True, 64.0),
        (4, 0, 0.0, 1, False, None),
    ],
    ids=[
        "free over-committed vCPUs pass and the limit is total times ratio",
        "no free over-committed vCPU fails but still sets the limit",
        "a host reporting no vCPUs passes (fail safe) without a limit",
        "a flavor with more vCPUs than the host fails even with over-commit",
        "ratio 1.0 on a full host fails",
        "ratio 16 (the old default) multiplies the cores",
        "a zero ratio sets no limit and leaves no room",
    ],
)
def test_core_filter(vcpus_total: int, vcpus_used: int, ratio: float, requested: int,
                     expected: bool, limit: float | None) -> None:
    snap = cloud(host("h1", vcpus_total=vcpus_total, vcpus_used=vcpus_used, cpu_allocation_ratio=ratio))
    per_host, per_host_limits, bulk, bulk_limits = run_both(CoreFilter(), snap, spec(vcpus=requested))
    assert per_host == bulk == [expected]
    expected_limits = [{"vcpu": limit}] if limit is not None else [{}]
    assert per_host_limits == bulk_limits == expected_limits


def test_reasons_carry_the_numbers() -> None:
    snap = cloud(host("h1", vcpus_total=4, vcpus_used=8, cpu_allocation_ratio=2.0),
                 host("h2", vcpus_total=1, cpu_allocation_ratio=16.0))
    reject = CoreFilter().check(state(snap, "h1"), spec(vcpus=1))
    assert reject is not None and reject.reason == "insufficient vCPUs"
    assert reject.numbers == {"requested": 1, "usable": 0.0}
    reject = CoreFilter().check(state(snap, "h2"), spec(vcpus=2))
    assert reject is not None and reject.numbers == {"requested": 2, "vcpus_total": 1}


@pytest.mark.parametrize(
    ("values", "expected", "limit"),
    [
        ([], True, 8.0),
        (["1.0"], False, 4.0),
        (["4.0", "3"], True, 12.0),
        (["x"], True, 8.0),
        (["x", "1.0"], True, 8.0),
    ],
    ids=[
        "no aggregate ratio uses the host's",
        "an aggregate ratio replaces the host's",
        "several aggregate ratios: the minimum wins",
        "a bad value falls back to the host's ratio",
        "one bad value discards the good ones too",
    ],
)
def test_aggregate_core_filter_ratio(values: list[str], expected: bool, limit: float) -> None:
    b = host("h1", vcpus_total=4, vcpus_used=5, cpu_allocation_ratio=2.0)
    for i, v in enumerate(values):
        b.in_aggregate(f"a{i}", cpu_allocation_ratio=v)
    snap = cloud(b)
    per_host, per_host_limits, bulk, bulk_limits = run_both(AggregateCoreFilter(), snap, spec(vcpus=2))
    assert per_host == bulk == [expected]
    assert per_host_limits == bulk_limits == [{"vcpu": limit}]


@settings(max_examples=50, deadline=None)
@given(snap=random_cloud(agg_keys=("cpu_allocation_ratio",)), requested=st.sampled_from([0, 1, 2, 4, 9]))
def test_bulk_and_per_host_paths_agree_with_the_same_limits(snap, requested) -> None:  # type: ignore[no-untyped-def]
    for f in (CoreFilter(), AggregateCoreFilter()):
        per_host, per_host_limits, bulk, bulk_limits = run_both(f, snap, spec(vcpus=requested))
        assert per_host == bulk
        assert per_host_limits == bulk_limits


def test_an_unset_host_ratio_behaves_the_same_on_both_paths() -> None:
    # total = vcpus_total * NaN: no limit, and "free < requested" is false, so it passes.
    snap = cloud(host("h1", cpu_allocation_ratio=None))
    per_host, per_host_limits, bulk, bulk_limits = run_both(CoreFilter(), snap, spec(vcpus=1))
    assert per_host == bulk == [True]
    assert per_host_limits == bulk_limits == [{}]
