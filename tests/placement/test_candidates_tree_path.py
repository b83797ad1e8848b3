"""The array path (``ArrayResult``: groups without sharing providers, over trees or
not) gives exactly what the general path gives: the same requests in the same order,
the same Placement order under ``limit``, and the same response bytes."""

from __future__ import annotations

import itertools
from typing import Any

import hypothesis.strategies as st
import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings

from berth.placement import candidates_order
from berth.placement.candidates import (
    _array_requests_json,
    _render_candidate,
    allocation_candidates,
    allocation_candidates_json,
)
from berth.placement.candidates_builders import GraphBuilder, agg_uuid, inv
from berth.placement.candidates_graph import ProviderGraph
from berth.placement.candidates_order import (
    general_merged_order,
    general_order,
    merged_order,
    request_hashes,
    set_order,
    tree_order,
)
from berth.placement.candidates_query import parse_query
from berth.placement.candidates_search import (
    ArrayResult,
    GeneralResult,
    _merge,
    _multi_provider_path,
    _single_provider_path,
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


def _resources(draw: Any, most: int) -> str:
    classes = draw(st.lists(st.sampled_from(CLASSES), min_size=1, max_size=most, unique=True))
    return ",".join(f"{rc}:{draw(st.sampled_from([1, 1, 2]))}" for rc in classes)


@st.composite
def queries(draw: Any, uuids: list[str]) -> dict[str, list[str]]:
    """An unsuffixed group (sometimes none) and up to two numbered groups, with a filter."""
    params: dict[str, list[str]] = {}
    numbered = draw(st.integers(0, 2))
    if numbered == 0 or draw(st.booleans()):
        params["resources"] = [_resources(draw, 3)]
    for k in range(1, numbered + 1):
        params[f"resources{k}"] = [_resources(draw, 2)]
        if draw(st.integers(0, 3)) == 0:
            params[f"required{k}"] = [draw(st.sampled_from(TRAITS))]
    if numbered > 1:
        params["group_policy"] = [draw(st.sampled_from(["none", "isolate"]))]
    extra = draw(st.sampled_from(["", "required", "forbidden", "member_of", "in_tree",
                                  "root_required"]))
    if "resources" not in params and extra in ("required", "forbidden", "member_of",
                                                "in_tree"):
        extra = ""
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


def general_search(graph: ProviderGraph, query: Any, mv: tuple[int, int]) -> list[Any]:
    """The general path: each group's Python path, then :func:`_merge`."""
    allowed = None
    if query.root_required is not None:
        allowed = graph.is_root_mask.copy()
        for t in query.root_required:
            allowed &= graph.trait_mask(t)
    per_group = []
    for group in query.groups.values():
        if allowed is not None and not allowed.any():
            return []
        if group.use_same_provider or not graph.has_trees:
            found = _single_provider_path(graph, group, allowed)
        else:
            found = _multi_provider_path(graph, group, allowed, set())
        if not found:
            return []
        per_group.append(found)
    general = _merge(graph, query, per_group)[0]
    if mv < (1, 29) and graph.has_trees:
        root = graph.root
        general = [c for c in general if len({root[p] for p in c.amounts}) == len(c.amounts)]
    return general


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_array_path_equals_the_general_path(data: st.DataObject) -> None:
    graph, uuids = data.draw(forests())
    params = data.draw(queries(uuids))
    # in_tree needs 1.31, root_required 1.35, numbered groups 1.25; 1.28 is below
    # nested awareness.
    plain = set(params) <= {"resources", "member_of", "required"}
    mv = data.draw(st.sampled_from([(1, 28), (1, 36), (1, 39)] if plain else [(1, 36), (1, 39)]))
    query = parse_query(params, mv)
    result = search(graph, query, mv)
    if len(query.groups) == 1 and "resources" in params and not graph.has_trees:
        return  # the flat path (FlatResult), checked elsewhere
    general = general_search(graph, query, mv)
    if not general:
        assert isinstance(result, GeneralResult) and result.candidates == []
        return
    assert isinstance(result, ArrayResult)
    assert [(c.amounts, c.mappings, c.by_class) for c in result.candidates] == \
        [(c.amounts, c.mappings, c.by_class) for c in general]
    for version in ((1, 36), (1, 30)):  # the HTTP path's bytes are the rendered ones
        assert _array_requests_json(graph, result, version >= (1, 34)) == orjson.dumps(
            [_render_candidate(graph.uuids, c, version) for c in result.candidates])
    groups = list(query.groups.values())
    if len(groups) == 1:
        for cap in (None, 1, 3):
            candidates_order._TREE_ORDERS.clear()
            expected = general_order(graph, [c.amounts for c in general], groups[0], cap,
                                     by_class=[c.by_class for c in general])
            assert tree_order(graph, groups[0], result.combos, result.anchors, cap) == expected
            assert tree_order(graph, groups[0], result.combos, result.anchors, cap) == expected
        return
    assert result.parts is not None and result.picks is not None
    sequence = _placement_merge(graph, groups, result.parts, result.picks)
    assert candidates_order._merge_sequence(graph, groups, result.parts, result.picks,
                                            result.anchors).tolist() == sequence
    # The answer's set filled in that sequence, with each request's hash computed
    # from its amounts (request_hashes, not the arrays' own hashing).
    hashes = request_hashes(graph, [c.amounts for c in general])
    for cap in (None, 1, 3):
        candidates_order._TREE_ORDERS.clear()
        expected = set_order(hashes, sequence[:cap])
        for _ in range(2):  # formed, then kept
            assert merged_order(graph, result.combos, result.classes, result.amounts,
                                result.anchors, cap, groups=groups, parts=result.parts,
                                picks=result.picks) == expected


def _placement_merge(graph: ProviderGraph, groups: list[Any], parts: Any, picks: Any) -> list[int]:
    """Placement's ``_merge_candidates`` over the groups' lists (each in its order):
    files every group's requests by anchor, first seen first, and forms each anchor's
    product; the rows of the result (those ``picks`` has) in the order they come."""
    by_anchor: dict[int, dict[int, list[int]]] = {}
    for g, (group, (anchors, combos)) in enumerate(zip(groups, parts)):
        ranks = candidates_order._group_ranks(graph, group, anchors, combos)
        for item in np.argsort(ranks, kind="stable").tolist():
            by_anchor.setdefault(int(anchors[item]), {}).setdefault(g, []).append(item)
    row_of = {tuple(p): i for i, p in enumerate(picks.tolist())}
    out = []
    for per_group in by_anchor.values():
        if len(per_group) != len(groups):
            continue
        for combo in itertools.product(*(per_group[g] for g in range(len(groups)))):
            if combo in row_of:
                out.append(row_of[combo])
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_same_subtree_and_resourceless_groups_merge_in_placements_sequence(
        data: st.DataObject) -> None:
    """The general path (``same_subtree``, resourceless groups) keeps each group's list
    and picks: its candidates come in the sequence of Placement's merge, and the order
    under ``limit`` is the answer's set filled in that sequence."""
    graph, _ = data.draw(forests())
    params: dict[str, list[str]] = {"resources1": [_resources(data.draw, 2)],
                                    "resources2": [_resources(data.draw, 2)],
                                    "group_policy": [data.draw(st.sampled_from(["none",
                                                                                "isolate"]))]}
    if data.draw(st.booleans()):
        params["resources"] = [_resources(data.draw, 2)]
    subtree = ["1", "2"]
    if data.draw(st.booleans()):
        params["required3"] = [data.draw(st.sampled_from(TRAITS))]
        subtree = data.draw(st.sampled_from([["1", "3"], ["2", "3"], ["1", "2", "3"]]))
    params["same_subtree"] = [",".join(subtree)]
    query = parse_query(params, (1, 39))
    result = search(graph, query, (1, 39))
    assert isinstance(result, GeneralResult)
    if not result.candidates:
        return
    merge = result.merge
    assert merge is not None
    assert merge.candidate.tolist() == list(range(len(result.candidates)))  # no sharing
    groups = list(query.groups.values())
    sequence = _placement_merge(graph, groups, merge.parts, merge.picks)
    assert candidates_order._merge_sequence(graph, groups, merge.parts, merge.picks,
                                            merge.anchors).tolist() == sequence
    hashes = request_hashes(graph, [c.amounts for c in result.candidates])
    for cap in (None, 1, 3):
        candidates_order._TREE_ORDERS.clear()
        assert general_merged_order(graph, [c.amounts for c in result.candidates], cap,
                                    groups=groups, merge=merge) == set_order(hashes, sequence[:cap])


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
    assert isinstance(result, ArrayResult) and len(result) == 12
    candidates_order._TREE_ORDERS.clear()
    first = tree_order(graph, group, result.combos, result.anchors)
    assert len(candidates_order._TREE_ORDERS) == 1
    assert tree_order(graph, group, result.combos, result.anchors, keep=5) == first[:5]
    assert len(candidates_order._TREE_ORDERS) == 1
    other = parse_query({"resources": ["VCPU:2,MEMORY_MB:64,DISK_GB:1"]}, (1, 36))
    tree_order(graph, next(iter(other.groups.values())), result.combos, result.anchors)
    assert len(candidates_order._TREE_ORDERS) == 2



def test_a_kept_group_list_is_reused_until_the_walk_changes() -> None:
    """A merge keeps each group's list by what it depends on: the same query again
    reuses them; a provider that no longer has room for a group's last class changes
    that group's walk, and the list is formed again (the same one as a fresh cache)."""
    b = GraphBuilder()
    for t in range(4):
        root = b.provider(f"r{t}", DISK_GB=inv(100))
        for cell in range(2):
            b.provider(f"r{t}n{cell}", parent=root, VCPU=inv(8), MEMORY_MB=inv(4096),
                       used={"MEMORY_MB": 4000} if (t, cell) == (3, 1) else None)
    params = {"resources": ["DISK_GB:1"], "resources1": ["VCPU:1,MEMORY_MB:64"],
              "resources2": ["VCPU:1"], "group_policy": ["none"]}
    query = parse_query(params, (1, 36))
    groups = list(query.groups.values())

    def order(graph: ProviderGraph) -> list[int]:
        result = search(graph, query, (1, 36))
        assert isinstance(result, ArrayResult)
        return merged_order(graph, result.combos, result.classes, result.amounts,
                            result.anchors, groups=groups, parts=result.parts,
                            picks=result.picks)

    graph = b.graph()
    candidates_order._GROUP_ORDERS.clear()
    first = order(graph)
    assert len(candidates_order._GROUP_ORDERS) == 3
    assert order(graph) == first and len(candidates_order._GROUP_ORDERS) == 3
    b.rows[-1].used = {"MEMORY_MB": 4090}  # r3n1 has no room for 64 MB any more
    changed = b.graph()
    again = order(changed)
    assert len(candidates_order._GROUP_ORDERS) > 3
    candidates_order._GROUP_ORDERS.clear()
    assert order(changed) == again

def test_an_unsuffixed_and_a_numbered_group_of_the_same_providers_keep_their_own_orders() -> None:
    """The same requests from an unsuffixed group over trees (Placement's walk) and from
    a numbered group (the engine's order): two orders, never one kept for both."""
    b = GraphBuilder()
    for t in range(300):  # enough requests for insertion order to matter
        root = b.provider(f"r{t}", DISK_GB=inv(100))
        for cell in range(2):
            b.provider(f"r{t}n{cell}", parent=root, VCPU=inv(8))
    graph = b.graph()
    candidates_order._TREE_ORDERS.clear()
    for params in ({"resources": ["VCPU:1"]}, {"resources1": ["VCPU:1"]},
                   {"resources": ["VCPU:1"]}):
        query = parse_query(params, (1, 36))
        group = next(iter(query.groups.values()))
        result = search(graph, query, (1, 36))
        assert isinstance(result, ArrayResult) and len(result) == 600
        general = general_search(graph, query, (1, 36))
        expected = general_order(graph, [c.amounts for c in general], group, None,
                                 by_class=[c.by_class for c in general])
        assert tree_order(graph, group, result.combos, result.anchors) == expected
