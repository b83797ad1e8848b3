"""AvailabilityZoneFilter (reference §12.8): the requested zone is compared whole, as in
Nova's code (not split on commas as seed 000's sentence says)."""

from __future__ import annotations

import pytest
from host_filter_strategies import both_paths, random_cloud, random_request
from hypothesis import given, settings

from berth.config import SchedulerConfig
from berth.filters.availability_zone import COMMA_NOTE, AvailabilityZoneFilter
from berth.snapshot import HostSnapshot
from builders import cloud, host, spec, state

SNAP = cloud(
    host("h1").in_aggregate("a1", availability_zone="az1"),
    host("h2").in_aggregate("a2", availability_zone="az2"),
    host("h3"),
    host("h4").in_aggregate("fast", ssd="true"),
    host("h5").in_aggregate("a1", availability_zone="az1").in_aggregate("a2b", availability_zone="az2"),
)


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        (None, [True] * 5),
        ("", [True] * 5),
        ("az1", [True, False, False, False, True]),
        ("az2", [False, True, False, False, True]),
        ("nova", [False, False, True, True, False]),
        ("az1,az2", [False] * 5),
        ("az3, nova", [False] * 5),
        ("az3", [False] * 5),
        ("AZ1", [False] * 5),
    ],
    ids=[
        "no zone requested passes every host",
        "an empty zone passes every host",
        "a zone passes its hosts",
        "a host in two zones is in both",
        "hosts in no zone aggregate are in the default zone",
        "a comma-separated request is one zone name, as in Nova, and matches no host",
        "even when a piece of it names the default zone",
        "an unknown zone passes nothing",
        "zones are case-sensitive",
    ],
)
def test_hosts_pass_in_the_requested_zone(zone: str | None, expected: list[bool]) -> None:
    assert both_paths(AvailabilityZoneFilter(), SNAP, spec(availability_zone=zone)) == expected


def test_the_default_zone_comes_from_the_default_group() -> None:
    f = AvailabilityZoneFilter(SchedulerConfig.from_dict({"DEFAULT": {"default_availability_zone": "zone0"}}))
    assert both_paths(f, SNAP, spec(availability_zone="zone0")) == [False, False, True, True, False]
    assert both_paths(f, SNAP, spec(availability_zone="nova")) == [False] * 5


def test_a_comma_separated_aggregate_value_lists_several_zones() -> None:
    snap = cloud(host("h1").in_aggregate("a", availability_zone="az1, az2"))
    assert both_paths(AvailabilityZoneFilter(), snap, spec(availability_zone="az2")) == [True]


def test_a_rejected_comma_separated_request_says_why() -> None:
    reject = AvailabilityZoneFilter().check(state(SNAP, "h1"), spec(availability_zone="az1,az2"))
    assert reject is not None and reject.numbers["note"] == COMMA_NOTE


def test_the_reason_names_both_sides() -> None:
    reject = AvailabilityZoneFilter().check(state(SNAP, "h2"), spec(availability_zone="az1"))
    assert reject is not None
    assert reject.reason == "not in availability zone"
    assert reject.numbers == {"requested": "az1", "host_zones": "az2"}


def test_class_attributes_match_nova() -> None:
    assert AvailabilityZoneFilter.run_filter_once_per_request is True
    assert AvailabilityZoneFilter.RUN_ON_REBUILD is False


@settings(max_examples=60, deadline=None)
@given(snap=random_cloud(), req=random_request())
def test_the_bulk_path_agrees_with_the_per_host_path(snap: HostSnapshot, req: object) -> None:
    both_paths(AvailabilityZoneFilter(), snap, req)
