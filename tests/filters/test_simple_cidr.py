"""SimpleCIDRAffinityFilter (reference §3.8)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import random_cloud

from berth.errors import InputError, SchedulerHintError
from berth.filters.simple_cidr import SimpleCIDRAffinityFilter
from builders import cloud, host, passes_bulk, passes_per_host, spec, state


def hosts_with_ips():  # type: ignore[no-untyped-def]
    return cloud(host("h1", host_ip="10.8.1.5"), host("h2", host_ip="10.8.2.5"),
                 host("h3", host_ip="10.9.0.1"), host("h4", host_ip="2001:db8::5"))


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        ({}, [True, True, True, True]),
        ({"cidr": "/8"}, [True, True, True, True]),
        ({"build_near_host_ip": "10.8.1.100"}, [True, False, False, False]),
        ({"build_near_host_ip": "10.8.1.100", "cidr": "/16"}, [True, True, False, False]),
        ({"build_near_host_ip": "10.8.1.100", "cidr": "/8"}, [True, True, True, False]),
        ({"build_near_host_ip": "10.8.1.5", "cidr": ""}, [True, False, False, False]),
        ({"build_near_host_ip": "10.8.1.100", "cidr": "/32"}, [False, False, False, False]),
        ({"build_near_host_ip": "10.8.1.100", "cidr": "/255.255.0.0"}, [True, True, False, False]),
        ({"build_near_host_ip": "2001:db8::1", "cidr": "/64"}, [False, False, False, True]),
        ({"build_near_host_ip": "0.0.0.0", "cidr": "/0"}, [True, True, True, False]),
    ],
    ids=[
        "no hint passes every host",
        "a cidr alone does nothing",
        "the default cidr is /24",
        "a /16 takes in the neighbouring /24",
        "a /8 takes in every IPv4 host, never an IPv6 one",
        "an empty cidr means the single address",
        "a /32 that is not the host's address",
        "a netmask after the slash works as netaddr parses it",
        "IPv6 networks hold IPv6 hosts only",
        "a /0 holds every IPv4 address",
    ],
)
def test_simple_cidr(hints: dict, expected: list[bool]) -> None:  # type: ignore[type-arg]
    req = spec(hints=hints)
    f = SimpleCIDRAffinityFilter()
    f.validate_request(req)
    assert passes_per_host(f, hosts_with_ips(), req) == expected
    assert passes_bulk(f, hosts_with_ips(), req) == expected


@pytest.mark.parametrize(
    "hints",
    [
        {"build_near_host_ip": "10.8.1.100", "cidr": "16"},
        {"build_near_host_ip": "10.8.1.100", "cidr": "/33"},
        {"build_near_host_ip": "not-an-ip"},
        {"build_near_host_ip": ["10.0.0.1", "10.0.0.2"]},
        {"build_near_host_ip": "10.0.0.1", "cidr": ["/8", "/16"]},
    ],
    ids=[
        "a cidr without a slash concatenates into a bad address (Nova: AddrFormatError)",
        "a prefix too long for IPv4",
        "a near IP that is not an address",
        "two near IPs",
        "two cidrs",
    ],
)
def test_bad_hints_are_rejected_up_front_naming_both_hints(hints: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(SchedulerHintError) as err:
        SimpleCIDRAffinityFilter().validate_request(spec(hints=hints))
    assert "build_near_host_ip=" in str(err.value) and "cidr=" in str(err.value)


def test_the_concatenation_is_shown_in_the_error() -> None:
    with pytest.raises(SchedulerHintError, match="'10.8.1.10016' is not an IP network"):
        SimpleCIDRAffinityFilter().validate_request(
            spec(hints={"build_near_host_ip": "10.8.1.100", "cidr": "16"}))


def test_a_host_without_ip_fails_with_a_reason_instead_of_nova_type_error() -> None:
    snap = cloud(host("h1", host_ip=None), host("h2", host_ip="10.0.0.9"))
    req = spec(hints={"build_near_host_ip": "10.0.0.1"})
    f = SimpleCIDRAffinityFilter()
    assert passes_per_host(f, snap, req) == passes_bulk(f, snap, req) == [False, True]
    reject = f.check(state(snap, "h1"), req)
    assert reject is not None and reject.reason == "host IP unknown"
    assert reject.numbers == {"network": "10.0.0.1/24"}


def test_an_outside_host_reason_names_ip_and_network() -> None:
    reject = SimpleCIDRAffinityFilter().check(
        state(hosts_with_ips(), "h3"), spec(hints={"build_near_host_ip": "10.8.1.100"}))
    assert reject is not None and reject.reason == "host IP outside the requested network"
    assert reject.numbers == {"host_ip": "10.9.0.1", "network": "10.8.1.100/24"}


def test_a_host_ip_that_is_not_an_address_is_an_input_error_naming_the_host() -> None:
    snap = cloud(host("h1", host_ip="10.0.0.1"), host("bad", host_ip="10.0.0"))
    req = spec(hints={"build_near_host_ip": "10.0.0.1"})
    f = SimpleCIDRAffinityFilter()
    with pytest.raises(InputError, match="host bad: host_ip '10.0.0' is not an IP address"):
        passes_bulk(f, snap, req)
    with pytest.raises(InputError, match="host bad"):
        f.check(state(snap, "bad"), req)
    assert f.check(state(snap, "h1"), req) is None
    # Without the hint the bad address is never looked at.
    assert passes_bulk(f, snap, spec()) == [True, True]


def test_flags_are_novas() -> None:
    assert SimpleCIDRAffinityFilter.run_filter_once_per_request is True
    assert SimpleCIDRAffinityFilter.RUN_ON_REBUILD is False


@settings(max_examples=60, deadline=None)
@given(
    snap=random_cloud(),
    near=st.sampled_from(["10.0.0.1", "10.0.1.1", "10.1.0.9", "192.168.1.1", "fe80::2",
                          "2001:db8::1", "0.0.0.0"]),
    cidr=st.sampled_from(["/0", "/8", "/16", "/23", "/24", "/31", "/32", "/10", "/64", "/127", ""]),
)
def test_bulk_and_per_host_paths_agree(snap, near, cidr) -> None:  # type: ignore[no-untyped-def]
    req = spec(hints={"build_near_host_ip": near, "cidr": cidr})
    f = SimpleCIDRAffinityFilter()
    try:
        f.validate_request(req)
    except SchedulerHintError:
        return  # e.g. /64 on an IPv4 address
    assert passes_bulk(f, snap, req) == passes_per_host(f, snap, req)
