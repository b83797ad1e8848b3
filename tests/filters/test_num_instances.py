"""NumInstancesFilter and AggregateNumInstancesFilter (reference §3.10)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from misc_filter_strategies import random_cloud

from berth.config import SchedulerConfig
from berth.filters.num_instances import AggregateNumInstancesFilter, NumInstancesFilter
from builders import cloud, host, passes_bulk, passes_per_host, spec, state


def config(max_instances: int = 8) -> SchedulerConfig:
    return SchedulerConfig.from_dict({"filter_scheduler": {"max_instances_per_host": max_instances}})


@pytest.mark.parametrize(
    ("num_instances", "expected"),
    [(7, True), (8, False), (9, False), (0, True)],
    ids=[
        "a host one below the limit passes",
        "a host at the limit fails",
        "a host above the limit fails",
        "an idle host passes",
    ],
)
def test_num_instances_filter_compares_num_instances_with_the_option(num_instances: int, expected: bool) -> None:
    snap = cloud(host("h1", num_instances=num_instances))
    f = NumInstancesFilter(config(8))
    assert passes_per_host(f, snap, spec()) == [expected]
    assert passes_bulk(f, snap, spec()) == [expected]


def test_a_rejection_names_the_count_and_the_limit() -> None:
    snap = cloud(host("h1", num_instances=8))
    reject = NumInstancesFilter(config(8)).check(state(snap, "h1"), spec())
    assert reject is not None
    assert reject.reason == "too many instances"
    assert reject.numbers == {"num_instances": 8, "max": 8}


def test_num_instances_comes_from_the_num_instances_stat() -> None:
    snap = cloud(host("h1", stats={"num_instances": "3"}), host("h2", stats={"num_instances": "2"}))
    assert passes_bulk(NumInstancesFilter(config(3)), snap, spec()) == [False, True]


def test_a_limit_of_one_rejects_any_occupied_host() -> None:
    snap = cloud(host("h1", num_instances=0), host("h2", num_instances=1))
    assert passes_per_host(NumInstancesFilter(config(1)), snap, spec()) == [True, False]


@pytest.mark.parametrize(
    ("values", "num_instances", "expected"),
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
def test_aggregate_num_instances_filter_takes_the_minimum_of_int_values(
    values: list[str], num_instances: int, expected: bool
) -> None:
    b = host("h1", num_instances=num_instances)
    for i, v in enumerate(values):
        b.in_aggregate(f"a{i}", max_instances_per_host=v)
    snap = cloud(b)
    f = AggregateNumInstancesFilter(config(8))
    assert passes_per_host(f, snap, spec()) == [expected]
    assert passes_bulk(f, snap, spec()) == [expected]


def test_aggregate_rejection_reports_the_aggregate_limit() -> None:
    snap = cloud(host("h1", num_instances=4).in_aggregate("a", max_instances_per_host="2"))
    reject = AggregateNumInstancesFilter(config(8)).check(state(snap, "h1"), spec())
    assert reject is not None and reject.numbers == {"num_instances": 4, "max": 2}


def test_flags_are_novas() -> None:
    for cls in (NumInstancesFilter, AggregateNumInstancesFilter):
        assert cls.run_filter_once_per_request is False
        assert cls.RUN_ON_REBUILD is False


@settings(max_examples=50, deadline=None)
@given(snap=random_cloud(agg_keys=("max_instances_per_host",)))
def test_bulk_and_per_host_paths_agree(snap) -> None:  # type: ignore[no-untyped-def]
    for f in (NumInstancesFilter(config(5)), AggregateNumInstancesFilter(config(5))):
        assert passes_bulk(f, snap, spec()) == passes_per_host(f, snap, spec())
