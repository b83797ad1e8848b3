"""AggregateTypeAffinityFilter (reference §3.13) and TypeAffinityFilter (§12.7)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import FLAVOR_IDS, random_cloud

from berth.filters.type_affinity import AggregateTypeAffinityFilter, TypeAffinityFilter
from berth.host_state import WorkingSet
from berth.model import Instance
from builders import NOW, cloud, host, passes_bulk, passes_per_host, spec, state


@pytest.mark.parametrize(
    ("values", "flavor", "expected"),
    [
        ([], "m1.small", True),
        (["m1.small"], "m1.small", True),
        (["m1.large"], "m1.small", False),
        (["m1.large, m1.small"], "m1.small", True),
        (["m1.large,m1.small "], "m1.small", True),
        (["M1.SMALL"], "m1.small", False),
        (["m1.small.x"], "m1.small", False),
        (["m1.large", "m1.small"], "m1.small", True),
        (["m1.large", "m1.tiny"], "m1.small", False),
    ],
    ids=[
        "a host without instance_type metadata accepts any flavor",
        "the named flavor passes",
        "another flavor fails",
        "values are comma-separated lists",
        "pieces are stripped of spaces",
        "names are case-sensitive",
        "names match exactly, not as substrings",
        "any aggregate naming the flavor is enough",
        "no aggregate naming the flavor fails",
    ],
)
def test_aggregate_type_affinity(values: list[str], flavor: str, expected: bool) -> None:
    b = host("h1")
    for i, v in enumerate(values):
        b.in_aggregate(f"a{i}", instance_type=v)
    snap = cloud(b)
    f = AggregateTypeAffinityFilter()
    req = spec(flavor_name=flavor)
    assert passes_per_host(f, snap, req) == [expected]
    assert passes_bulk(f, snap, req) == [expected]


def test_aggregate_type_affinity_reason_names_flavor_and_allowed_lists() -> None:
    snap = cloud(host("h1").in_aggregate("a", instance_type="m1.large"))
    reject = AggregateTypeAffinityFilter().check(state(snap, "h1"), spec(flavor_name="m1.small"))
    assert reject is not None
    assert reject.reason == "flavor not allowed in aggregate"
    assert reject.numbers == {"aggregate": "a", "flavor": "m1.small", "allowed": "m1.large"}
    assert reject.render() == ("flavor not allowed in aggregate (aggregate a, flavor m1.small, "
                               "allowed m1.large)")


def test_aggregates_without_the_key_do_not_restrict() -> None:
    snap = cloud(host("h1").in_aggregate("a", ssd="true"))
    assert passes_bulk(AggregateTypeAffinityFilter(), snap, spec()) == [True]


@pytest.mark.parametrize(
    ("type_ids", "flavor_id", "expected"),
    [
        ([], 1, True),
        ([1, 1], 1, True),
        ([1, 2], 1, False),
        ([2], 1, False),
        ([None], 1, False),
        (["1"], 1, False),
    ],
    ids=[
        "an empty host passes",
        "a host with only this flavor passes",
        "a host with another flavor too fails",
        "a host with only another flavor fails",
        "an instance of unknown flavor counts as another flavor",
        "flavor ids compare by value and type, as in Python",
    ],
)
def test_type_affinity(type_ids: list, flavor_id: int, expected: bool) -> None:  # type: ignore[type-arg]
    instances = {f"u{i}": Instance(uuid=f"u{i}", instance_type_id=t) for i, t in enumerate(type_ids)}
    snap = cloud(host("h1", instances=instances))
    f = TypeAffinityFilter()
    req = spec(flavor_id=flavor_id)
    assert passes_per_host(f, snap, req) == [expected]
    assert passes_bulk(f, snap, req) == [expected]


def test_type_affinity_follows_novas_code_not_seed_001s_sentence() -> None:
    # Seed 001: "only passes hosts that are not already running an instance of the
    # requested type". Nova's code, which Berth follows, does the opposite.
    running = cloud(host("same", instances={"a": Instance(uuid="a", instance_type_id=1)}),
                    host("other", instances={"b": Instance(uuid="b", instance_type_id=2)}))
    req = spec(flavor_id=1)
    assert passes_per_host(TypeAffinityFilter(), running, req) == [True, False]
    import berth.filters.type_affinity as module

    assert module.__doc__ is not None and "For readers of seed 001" in module.__doc__


def test_type_affinity_reason_lists_the_other_flavors() -> None:
    instances = {"a": Instance(uuid="a", instance_type_id=2), "b": Instance(uuid="b", instance_type_id=1)}
    snap = cloud(host("h1", instances=instances))
    reject = TypeAffinityFilter().check(state(snap, "h1"), spec(flavor_id=1))
    assert reject is not None and reject.reason == "other flavor on host"
    assert reject.numbers == {"flavor_id": 1, "other_flavor_ids": ["2"]}


def test_type_affinity_bulk_sees_stubs_this_request_placed() -> None:
    snap = cloud(host("h1"), host("h2", instances={"x": Instance(uuid="x", instance_type_id=1)}))
    ws = WorkingSet(snap, NOW)
    ws.add_instance(0, Instance(uuid="new", instance_type_id=2))
    ws.add_instance(1, Instance(uuid="new2", instance_type_id=1))
    f = TypeAffinityFilter()
    req = spec(flavor_id=1)
    bulk = list(f.filter_all_hosts(ws.hosts(), req))
    per_host = [f.host_passes(ws.host_state(r), req) for r in range(2)]
    assert bulk == per_host == [False, True]


def test_flags_are_novas() -> None:
    assert AggregateTypeAffinityFilter.run_filter_once_per_request is True
    assert TypeAffinityFilter.run_filter_once_per_request is False
    assert not AggregateTypeAffinityFilter.RUN_ON_REBUILD and not TypeAffinityFilter.RUN_ON_REBUILD


@settings(max_examples=50, deadline=None)
@given(
    snap=random_cloud(agg_keys=("instance_type",)),
    flavor_id=st.sampled_from([*FLAVOR_IDS, None, "1"]),
    name=st.sampled_from(["1", "2", "abc", "m1.small"]),
    stubs=st.lists(st.tuples(st.integers(0, 6), st.sampled_from([*FLAVOR_IDS, None])), max_size=3),
)
def test_bulk_and_per_host_paths_agree(snap, flavor_id, name, stubs) -> None:  # type: ignore[no-untyped-def]
    req = spec(flavor_id=flavor_id, flavor_name=name)
    ws = WorkingSet(snap, NOW)
    for k, (row, type_id) in enumerate(stubs):
        if row < len(snap):
            ws.add_instance(row, Instance(uuid=f"stub{k}", instance_type_id=type_id))
    for f in (AggregateTypeAffinityFilter(), TypeAffinityFilter()):
        bulk = [bool(x) for x in f.filter_all_hosts(ws.hosts(), req)]
        assert bulk == [f.host_passes(ws.host_state(r), req) for r in range(len(snap))]
