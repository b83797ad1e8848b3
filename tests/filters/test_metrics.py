"""MetricsFilter (reference §3.17, §11.3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import METRIC_NAMES, random_cloud

from berth.config import SchedulerConfig
from berth.filters.metrics import MetricsFilter
from berth.model import MetricItem
from builders import cloud, host, passes_bulk, passes_per_host, spec, state


def metrics_filter(*setting: str) -> MetricsFilter:
    return MetricsFilter(SchedulerConfig.from_dict({"metrics": {"weight_setting": list(setting)}}))


def cloud_with_metrics():  # type: ignore[no-untyped-def]
    return cloud(
        host("h1", metrics=[MetricItem("cpu.percent", 5), MetricItem("cpu.frequency", 2000)]),
        host("h2", metrics=[MetricItem("cpu.percent", 5)]),
        host("h3", metrics=[]),
    )


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ((), [True, True, True]),
        (("cpu.percent=1.0",), [True, True, False]),
        (("cpu.percent=1.0", "cpu.frequency=-2"), [True, False, False]),
        (("cpu.percent", "cpu.frequency=x"), [True, True, True]),
        (("cpu.percent=1", "=5"), [True, True, False]),
        (("cpu.percent =1",), [False, False, False]),
    ],
    ids=[
        "an empty setting passes every host",
        "a host must report the weighed metric",
        "every weighed metric is required",
        "items without a number are dropped, so nothing is required",
        "an item without a name is dropped",
        "a space before = stays in the name, which no host reports",
    ],
)
def test_metrics_filter(setting: tuple[str, ...], expected: list[bool]) -> None:
    f = metrics_filter(*setting)
    assert passes_per_host(f, cloud_with_metrics(), spec()) == expected
    assert passes_bulk(f, cloud_with_metrics(), spec()) == expected


def test_the_list_option_strips_spaces_around_items_but_not_inside() -> None:
    config = SchedulerConfig.from_dict(
        {"metrics": {"weight_setting": " cpu.percent=1 , cpu.frequency =2"}})
    assert MetricsFilter(config).keys == {"cpu.percent", "cpu.frequency "}


def test_reason_lists_the_missing_metrics() -> None:
    f = metrics_filter("cpu.percent=1", "cpu.frequency=1", "mem.used=1")
    reject = f.check(state(cloud_with_metrics(), "h2"), spec())
    assert reject is not None and reject.reason == "metrics missing"
    assert reject.numbers == {"missing": ["cpu.frequency", "mem.used"]}


def test_flags_are_novas() -> None:
    assert not MetricsFilter.run_filter_once_per_request and not MetricsFilter.RUN_ON_REBUILD


@settings(max_examples=40, deadline=None)
@given(snap=random_cloud(), names=st.lists(st.sampled_from([*METRIC_NAMES, "x"]), max_size=3))
def test_bulk_and_per_host_paths_agree(snap, names) -> None:  # type: ignore[no-untyped-def]
    f = metrics_filter(*(f"{n}=1.0" for n in names))
    assert passes_bulk(f, snap, spec()) == passes_per_host(f, snap, spec())
