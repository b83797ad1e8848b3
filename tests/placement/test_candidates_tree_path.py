"""The array path of one unsuffixed group over provider trees (``TreeResult``) gives
exactly what the general path gives: the same requests in the same order, the same
Placement order under ``limit``, and the same response bytes."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from berth.placement import candidates_order
from berth.placement.candidates import allocation_candidates, allocation_candidates_json
from berth.placement.candidates_builders import GraphBuilder, agg_uuid, inv
from berth.placement.candidates_graph import ProviderGraph
from berth.placement.candidates_order import general_order, tree_order
from berth.placement.candidates_query import parse_query
from berth.placement.candidates_search import (
    GeneralResult,
    TreeResult,
    _merge,
    _multi_provider_path,
    search,
)

CLASSES = ["VCPU", "MEMORY_MB", "DISK_GB"]
TRAITS = ["HW_CPU_X86_AVX", "HW_CPU_X86_SSE"]
AGG = agg_uuid("a1")


@st.composite
def forests(draw: Any) -> tuple[ProviderGraph, list[str]]:
    """Up to 5 trees of up to 4 providers, no sharing provider."""
    b = GraphBuilder()
    uuids: list[str] = []
    for t in range(draw(st.integers(1, 5))):
        members: list[str] = []
        for i in range(draw(st.integers(1, 4))):
            parent = draw(st.sampled_from(members)) if members else None
            invs = {rc: inv(draw(st.integers(1, 8)), max_unit=8)
                    for rc in CLASSES if draw(st.booleans())}
            used = {rc: draw(st.integers(0, 2)) for rc in invs}
            uuid = b.provider(f"t{t}p{i}", parent=parent, used=used,
                              traits=set(draw(st.sets(st.sampled_from(TRAITS)))),
                              aggregates={AGG} if draw(st.booleans()) else set(), **invs)
            members.append(uuid)
        uuids += members
    return b.graph(), uuids


@st.composite
def queries(draw: Any, uuids: list[str]) -> dict[str, list[str]]:
    classes = draw(st.lists(st.sampled_from(CLASSES), min_size=1, max_size=3, unique=True))
    params = {"resources": [",".join(f"{rc}:{draw(st.sampled_from([1, 1, 2]))}"
                                     for rc in classes)]}
    extra = draw(st.sampled_from(["", "required", "forbidden", "member_of", "in_tree",
                                  "root_required"]))
    if extra == "required":
        params["required"] = [draw(st.sampled_from(TRAITS))]
    elif extra == "forbidden":
        params["required"] = ["!" + draw(st.sampled_from(TRAITS))]
    elif extra == "member_of":
        params["member_of"] = [AGG]
    elif extra == "in_tree":
        params["in_tree"] = [draw(st.sampled_from(uuids))]
    elif extra == "root_required":
        params["root_required"] = [draw(st.sampled_from(TRAITS))]
    return params


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_array_path_equals_the_general_path(data: st.DataObject) -> None:
    graph, uuids = data.draw(forests())
    if not graph.has_trees:
        return
    params = data.draw(queries(uuids))
    # Filters other than required traits and member_of need 1.31 (in_tree) and 1.35
    # (root_required); 1.28 is below nested awareness.
    plain = set(params) <= {"resources", "member_of"}
    mv = data.draw(st.sampled_from([(1, 28), (1, 36), (1, 39)] if plain else [(1, 36), (1, 39)]))
    query = parse_query(params, mv)
    group = next(iter(query.groups.values()))
    result = search(graph, query, mv)
    allowed = None
    if query.root_required is not None:
        allowed = graph.is_root_mask.copy()
        for t in query.root_required:
            allowed &= graph.trait_mask(t)
    found = _multi_provider_path(graph, group, allowed, set())
    general = _merge(graph, query, [found]) if found else []
    if mv < (1, 29):
        root = graph.root
        general = [c for c in general if len({root[p] for p in c.amounts}) == len(c.amounts)]
    if not general:
        assert isinstance(result, GeneralResult) and result.candidates == []
        return
    assert isinstance(result, TreeResult)
    assert [(c.amounts, c.mappings, c.by_class) for c in result.candidates] == \
        [(c.amounts, c.mappings, c.by_class) for c in general]
    for cap in (None, 1, 3):
        candidates_order._TREE_ORDERS.clear()
        expected = general_order(graph, [c.amounts for c in general], group, cap,
                                 by_class=[c.by_class for c in general])
        got = tree_order(graph, group, result.combos, result.anchors, cap)
        assert got == expected
        assert tree_order(graph, group, result.combos, result.anchors, cap) == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_response_under_limit_is_the_rendered_one(data: st.DataObject) -> None:
    """The encoded body (the HTTP path) and the rendered dict agree, with a limit."""
    import json

    graph, uuids = data.draw(forests())
    params = data.draw(queries(uuids))
    params["limit"] = [str(data.draw(st.integers(1, 4)))]
    mv = (1, 36)
    assert json.loads(allocation_candidates_json(graph, params, mv)) == \
        allocation_candidates(graph, params, mv)


def test_a_kept_tree_order_is_reused_until_an_input_changes() -> None:
    b = GraphBuilder()
    for t in range(3):
        root = b.provider(f"r{t}", DISK_GB=inv(100))
        for cell in range(2):
            b.provider(f"r{t}n{cell}", parent=root, VCPU=inv(8), MEMORY_MB=inv(4096))
    graph = b.graph()
    query = parse_query({"resources": ["VCPU:1,MEMORY_MB:64,DISK_GB:1"]}, (1, 36))
    group = next(iter(query.groups.values()))
    result = search(graph, query, (1, 36))
    assert isinstance(result, TreeResult) and len(result) == 12
    candidates_order._TREE_ORDERS.clear()
    first = tree_order(graph, group, result.combos, result.anchors)
    assert len(candidates_order._TREE_ORDERS) == 1
    assert tree_order(graph, group, result.combos, result.anchors, keep=5) == first[:5]
    assert len(candidates_order._TREE_ORDERS) == 1
    other = parse_query({"resources": ["VCPU:2,MEMORY_MB:64,DISK_GB:1"]}, (1, 36))
    tree_order(graph, next(iter(other.groups.values())), result.combos, result.anchors)
    assert len(candidates_order._TREE_ORDERS) == 2
