"""SameHostFilter and DifferentHostFilter (reference §3.7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import UUIDS, random_cloud

from berth.filters.host_affinity import DifferentHostFilter, SameHostFilter
from berth.host_state import WorkingSet
from berth.model import Instance
from builders import NOW, cloud, host, passes_bulk, passes_per_host, spec, state


def three_hosts():  # type: ignore[no-untyped-def]
    return cloud(host("h1", instances=["a", "b"]), host("h2", instances=["c"]), host("h3"))


@pytest.mark.parametrize(
    ("hints", "same", "different"),
    [
        ({}, [True, True, True], [True, True, True]),
        ({"same_host": "a", "different_host": "a"}, [True, False, False], [False, True, True]),
        ({"same_host": ["a", "c"], "different_host": ["a", "c"]},
         [True, True, False], [False, False, True]),
        ({"same_host": ["zz"], "different_host": ["zz"]}, [False, False, False], [True, True, True]),
        ({"same_host": [], "different_host": []}, [True, True, True], [True, True, True]),
        ({"same_host": "", "different_host": ""}, [True, True, True], [True, True, True]),
        ({"same_host": ["b", "a"], "different_host": ["b", "a"]},
         [True, False, False], [False, True, True]),
    ],
    ids=[
        "no hint passes every host",
        "a single uuid arrives as a string",
        "several uuids arrive as a list",
        "an unknown uuid: same_host passes no host, different_host every host",
        "an empty list passes every host",
        "an empty string passes every host",
        "two instances on one host",
    ],
)
def test_same_and_different_host(hints: dict, same: list[bool], different: list[bool]) -> None:  # type: ignore[type-arg]
    req = spec(hints=hints)
    snap = three_hosts()
    for f, expected in ((SameHostFilter(), same), (DifferentHostFilter(), different)):
        assert passes_per_host(f, snap, req) == expected
        assert passes_bulk(f, snap, req) == expected


def test_reasons() -> None:
    snap = three_hosts()
    reject = SameHostFilter().check(state(snap, "h3"), spec(hints={"same_host": ["a", "c"]}))
    assert reject is not None and reject.reason == "not on the same host as a hinted instance"
    assert reject.numbers == {"instances": ["a", "c"]}
    reject = DifferentHostFilter().check(state(snap, "h1"), spec(hints={"different_host": ["b", "c"]}))
    assert reject is not None and reject.reason == "a hinted instance is on the host"
    assert reject.numbers == {"instances": ["b"]}


def test_flags_are_novas() -> None:
    for cls in (SameHostFilter, DifferentHostFilter):
        assert cls.run_filter_once_per_request is True and not cls.RUN_ON_REBUILD


@settings(max_examples=60, deadline=None)
@given(
    snap=random_cloud(),
    same=st.lists(st.sampled_from([*UUIDS, "zz"]), max_size=3),
    different=st.lists(st.sampled_from([*UUIDS, "zz"]), max_size=3),
    stubs=st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["zz", UUIDS[1]])), max_size=2),
)
def test_bulk_and_per_host_paths_agree(snap, same, different, stubs) -> None:  # type: ignore[no-untyped-def]
    req = spec(hints={"same_host": same, "different_host": different})
    ws = WorkingSet(snap, NOW)
    for row, uuid in stubs:
        if row < len(snap):
            ws.add_instance(row, Instance(uuid=uuid))
    for f in (SameHostFilter(), DifferentHostFilter()):
        bulk = [bool(x) for x in f.filter_all_hosts(ws.hosts(np.arange(len(snap))), req)]
        assert bulk == [f.host_passes(ws.host_state(r), req) for r in range(len(snap))]
