"""ComputeFilter (reference §3.2)."""

from __future__ import annotations

import pytest
from host_filter_strategies import both_paths, random_cloud
from hypothesis import given, settings

from berth.config import SchedulerConfig
from berth.errors import ConfigError
from berth.filters.compute import ComputeFilter, effective_service_down_time
from berth.model import ServiceRecord
from berth.snapshot import HostSnapshot
from builders import NOW, cloud, host, spec, state


def one(service: ServiceRecord) -> HostSnapshot:
    return cloud(host("h1", service=service))


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        (ServiceRecord("h1", last_seen_up=NOW), True),
        (ServiceRecord("h1", last_seen_up=NOW - 60), True),
        (ServiceRecord("h1", last_seen_up=NOW - 61), False),
        (ServiceRecord("h1", last_seen_up=NOW + 61), False),
        (ServiceRecord("h1", last_seen_up=None, created_at=NOW - 5), True),
        (ServiceRecord("h1", last_seen_up=None, created_at=NOW - 500), False),
        (ServiceRecord("h1", last_seen_up=NOW - 500, created_at=NOW), False),
        (ServiceRecord("h1"), False),
        (ServiceRecord("h1", last_seen_up=NOW, disabled=True), False),
        (ServiceRecord("h1", last_seen_up=NOW, forced_down=True), False),
    ],
    ids=[
        "a fresh heartbeat is up",
        "a heartbeat exactly service_down_time old is up",
        "a heartbeat one second too old is down",
        "a heartbeat from the future counts by its absolute distance",
        "without last_seen_up created_at is the heartbeat",
        "an old created_at without last_seen_up is down",
        "last_seen_up wins over a fresher created_at",
        "a service never seen is down",
        "a disabled service fails even when up",
        "a forced-down service is down even with a fresh heartbeat",
    ],
)
def test_liveness_follows_the_db_servicegroup_driver(service: ServiceRecord, expected: bool) -> None:
    snap = one(service)
    f = ComputeFilter()
    assert both_paths(f, snap, spec()) == [expected]


def test_reasons_say_disabled_or_down_with_the_heartbeat_age() -> None:
    f = ComputeFilter()
    disabled = f.check(state(one(ServiceRecord("h1", disabled=True, disabled_reason="maint")), "h1"), spec())
    assert disabled is not None and disabled.reason == "service disabled"
    assert disabled.render() == "service disabled (disabled reason maint)"
    down = f.check(state(one(ServiceRecord("h1", last_seen_up=NOW - 75)), "h1"), spec())
    assert down is not None and down.reason == "service down"
    assert down.render() == "service down (heartbeat age 75 s, service down time 60 s)"
    late = f.check(state(one(ServiceRecord("h1", last_seen_up=NOW - 609.7264215946198)), "h1"),
                   spec())
    assert late is not None
    assert late.render() == "service down (heartbeat age 609.7 s, service down time 60 s)"
    forced = f.check(state(one(ServiceRecord("h1", last_seen_up=NOW, forced_down=True)), "h1"), spec())
    assert forced is not None and forced.numbers == {"forced_down": True}


@pytest.mark.parametrize(
    ("down", "interval", "effective"),
    [(60, 10, 60), (10, 10, 25), (5, 10, 25), (11, 10, 11), (3, 3, 7)],
    ids=[
        "the defaults stay 60 s",
        "a down time equal to the interval becomes 2.5 intervals",
        "a down time below the interval becomes 2.5 intervals",
        "a down time just above the interval is kept",
        "2.5 intervals are truncated to an int",
    ],
)
def test_service_down_time_is_overridden_when_not_above_report_interval(
    down: int, interval: int, effective: int
) -> None:
    assert effective_service_down_time(down, interval) == effective
    config = SchedulerConfig.from_dict({"DEFAULT": {"service_down_time": down, "report_interval": interval}})
    f = ComputeFilter(config)
    assert f.service_down_time == effective
    snap = cloud(host("h1", service=ServiceRecord("h1", last_seen_up=NOW - effective)),
                 host("h2", service=ServiceRecord("h2", last_seen_up=NOW - effective - 1)))
    assert both_paths(f, snap, spec()) == [True, False]


def test_the_memcache_driver_is_a_config_error_at_start_up() -> None:
    config = SchedulerConfig.from_dict({"DEFAULT": {"servicegroup_driver": "mc"}})
    with pytest.raises(ConfigError, match="servicegroup_driver='mc'.*heartbeats"):
        ComputeFilter(config)


def test_class_attributes_match_nova() -> None:
    assert ComputeFilter.run_filter_once_per_request is True
    assert ComputeFilter.RUN_ON_REBUILD is False


@settings(max_examples=60, deadline=None)
@given(snap=random_cloud())
def test_the_bulk_path_agrees_with_the_per_host_path(snap: HostSnapshot) -> None:
    both_paths(ComputeFilter(), snap, spec())
