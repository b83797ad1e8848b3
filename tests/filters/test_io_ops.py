"""IoOpsFilter and AggregateIoOpsFilter (reference §3.9)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from misc_filter_strategies import random_cloud

from berth.config import SchedulerConfig
from berth.filters.io_ops import AggregateIoOpsFilter, IoOpsFilter
from builders import cloud, host, passes_bulk, passes_per_host, spec, state


def config(max_io_ops: int = 8) -> SchedulerConfig:
    return SchedulerConfig.from_dict({"filter_scheduler": {"max_io_ops_per_host": max_io_ops}})


@pytest.mark.parametrize(
    ("num_io_ops", "expected"),
    [(7, True), (8, False), (9, False), (0, True)],
    ids=[
        "a host one below the limit passes",
        "a host at the limit fails",
        "a host above the limit fails",
        "an idle host passes",
    ],
)
def test_io_ops_filter_compares_num_io_ops_with_the_option(num_io_ops: int, expected: bool) -> None:
    snap = cloud(host("h1", num_io_ops=num_io_ops))
    f = IoOpsFilter(config(8))
    assert passes_per_host(f, snap, spec()) == [expected]
    assert passes_bulk(f, snap, spec()) == [expected]


def test_a_rejection_names_the_count_and_the_limit() -> None:
    snap = cloud(host("h1", num_io_ops=8))
    reject = IoOpsFilter(config(8)).check(state(snap, "h1"), spec())
    assert reject is not None
    assert reject.reason == "too many I/O operations"
    assert reject.numbers == {"num_io_ops": 8, "max": 8}


def test_io_ops_comes_from_the_io_workload_stat() -> None:
    snap = cloud(host("h1", stats={"io_workload": "3"}), host("h2", stats={"io_workload": "2"}))
    assert passes_bulk(IoOpsFilter(config(3)), snap, spec()) == [False, True]


def test_a_zero_limit_rejects_every_host() -> None:
    snap = cloud(host("h1", num_io_ops=0))
    assert passes_per_host(IoOpsFilter(config(0)), snap, spec()) == [False]


@pytest.mark.parametrize(
    ("values", "num_io_ops", "expected"),
    [
        ([], 5, True),
        (["3"], 3, False),
        (["3"], 2, True),
        (["10", "4"], 4, False),
        (["10", "4"], 3, True),
        (["abc"], 7, True),
        (["abc", "2"], 3, True),
        (["2.5"], 3, True),
        (["2.5"], 8, False),
        ([" 4 "], 4, False),
    ],
    ids=[
        "no aggregate value uses the option",
        "an aggregate value replaces the option",
        "below the aggregate value passes",
        "several aggregate values: the minimum wins",
        "below the minimum passes",
        "a non-integer value falls back to the option",
        "one bad value discards the good ones too",
        "a float-looking value is not an int and falls back",
        "with the fallback the option still applies",
        "int() accepts surrounding spaces",
    ],
)
def test_aggregate_io_ops_filter_takes_the_minimum_of_int_values(
    values: list[str], num_io_ops: int, expected: bool
) -> None:
    b = host("h1", num_io_ops=num_io_ops)
    for i, v in enumerate(values):
        b.in_aggregate(f"a{i}", max_io_ops_per_host=v)
    snap = cloud(b)
    f = AggregateIoOpsFilter(config(8))
    assert passes_per_host(f, snap, spec()) == [expected]
    assert passes_bulk(f, snap, spec()) == [expected]


def test_aggregate_rejection_reports_the_aggregate_limit() -> None:
    snap = cloud(host("h1", num_io_ops=4).in_aggregate("a", max_io_ops_per_host="2"))
    reject = AggregateIoOpsFilter(config(8)).check(state(snap, "h1"), spec())
    assert reject is not None and reject.numbers == {"num_io_ops": 4, "max": 2}


def test_flags_are_novas() -> None:
    for cls in (IoOpsFilter, AggregateIoOpsFilter):
        assert cls.run_filter_once_per_request is False
        assert cls.RUN_ON_REBUILD is False


@settings(max_examples=50, deadline=None)
@given(snap=random_cloud(agg_keys=("max_io_ops_per_host",)))
def test_bulk_and_per_host_paths_agree(snap) -> None:  # type: ignore[no-untyped-def]
    for f in (IoOpsFilter(config(5)), AggregateIoOpsFilter(config(5))):
        assert passes_bulk(f, snap, spec()) == passes_per_host(f, snap, spec())
