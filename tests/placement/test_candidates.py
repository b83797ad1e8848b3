"""GET /allocation_candidates: the search (reference section 5) and the response shapes."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

import pytest

from berth.placement.candidates import (
    CandidateOptions,
    allocation_candidates,
    allocation_candidates_json,
)
from berth.placement.candidates_builders import GraphBuilder, agg_uuid, inv
from berth.placement.candidates_graph import ProviderGraph

LATEST = (1, 39)


def params(qs: str) -> dict[str, list[str]]:
    """A query string as the multi-dict the engine takes."""
    out: dict[str, list[str]] = {}
    for key, value in parse_qsl(qs, keep_blank_values=True):
        out.setdefault(key, []).append(value)
    return out


def ac(graph: ProviderGraph, qs: str, mv: tuple[int, int] = LATEST, **opts: Any) -> dict[str, Any]:
    """Run the engine and check the pre-encoded JSON path gives the same body."""
    options = CandidateOptions(**opts)
    body = allocation_candidates(graph, params(qs), mv, options)
    assert json.loads(allocation_candidates_json(graph, params(qs), mv, options)) == body
    return body


def alloc_sets(body: dict[str, Any]) -> list[dict[str, dict[str, int]]]:
    """Allocation requests (dict form) as {uuid: resources}, sorted for comparison."""
    reqs = [
        {u: dict(a["resources"]) for u, a in r["allocations"].items()}
        for r in body["allocation_requests"]
    ]
    return sorted(reqs, key=lambda r: json.dumps(r, sort_keys=True))


def expect(*reqs: dict[str, dict[str, int]]) -> list[dict[str, dict[str, int]]]:
    return sorted(reqs, key=lambda r: json.dumps(r, sort_keys=True))


def compute(b: GraphBuilder, name: str, **kw: Any) -> str:
    """A compute node with 8 VCPU, 2048 MB and 100 GB unless overridden."""
    invs = {"VCPU": inv(8), "MEMORY_MB": inv(2048), "DISK_GB": inv(100)}
    invs.update({k: v for k, v in kw.items() if k.isupper()})
    rest = {k: v for k, v in kw.items() if not k.isupper()}
    return b.provider(name, **rest, **invs)


# -- capacity rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inventory", "used", "amount", "fits"),
    [
        (inv(8), 0, 8, True),
        (inv(8), 1, 8, False),
        (inv(8, reserved=2), 0, 6, True),
        (inv(8, reserved=2), 0, 7, False),
        (inv(8, allocation_ratio=1.5), 10, 2, True),  # 10 + 2 <= 8 * 1.5
        (inv(8, allocation_ratio=1.5), 10, 3, False),
        (inv(8, reserved=8), 0, 1, False),  # capacity 0
        (inv(8, min_unit=2), 0, 1, False),
        (inv(8, min_unit=2), 0, 2, True),
        (inv(8, max_unit=4), 0, 5, False),
        (inv(8, step_size=2), 0, 3, False),
        (inv(8, step_size=2), 0, 4, True),
    ],
    ids=[
        "the whole capacity fits",
        "one unit over capacity does not fit",
        "reserved units are not available",
        "reserved units plus one do not fit",
        "allocation ratio overcommits the capacity",
        "overcommitted capacity still has a limit",
        "reserved equal to total leaves nothing",
        "below min_unit does not fit",
        "exactly min_unit fits",
        "above max_unit does not fit",
        "an amount off the step size does not fit",
        "an amount on the step size fits",
    ],
)
def test_capacity_rule(inventory: Any, used: int, amount: int, fits: bool) -> None:
    b = GraphBuilder()
    cn = b.provider("cn", VCPU=inventory, used={"VCPU": used})
    body = ac(b.graph(), f"resources=VCPU:{amount}")
    assert alloc_sets(body) == (expect({cn: {"VCPU": amount}}) if fits else [])


def test_each_flat_provider_with_room_is_one_candidate_and_summarized() -> None:
    b = GraphBuilder()
    cn1 = compute(b, "cn1", used={"VCPU": 2})
    compute(b, "cn2", VCPU=inv(1))
    cn3 = compute(b, "cn3")
    body = ac(b.graph(), "resources=VCPU:2,MEMORY_MB:512")
    assert alloc_sets(body) == expect(
        {cn1: {"VCPU": 2, "MEMORY_MB": 512}}, {cn3: {"VCPU": 2, "MEMORY_MB": 512}}
    )
    assert set(body["provider_summaries"]) == {cn1, cn3}
    assert body["provider_summaries"][cn1]["resources"]["VCPU"] == {"capacity": 8, "used": 2}
    assert body["allocation_requests"][0]["mappings"] == {"": [cn1]}


def test_no_match_is_an_empty_list_and_empty_summaries() -> None:
    b = GraphBuilder()
    compute(b, "cn1")
    assert ac(b.graph(), "resources=VCPU:100") == {
        "allocation_requests": [],
        "provider_summaries": {},
    }


# -- traits and aggregates ----------------------------------------------------------------


def test_required_and_forbidden_traits_filter_flat_providers() -> None:
    b = GraphBuilder()
    avx = compute(b, "avx", traits={"HW_CPU_X86_AVX"})
    both = compute(b, "both", traits={"HW_CPU_X86_AVX", "HW_CPU_X86_SSE"})
    compute(b, "none")
    g = b.graph()
    assert alloc_sets(ac(g, "resources=VCPU:1&required=HW_CPU_X86_AVX")) == expect(
        {avx: {"VCPU": 1}}, {both: {"VCPU": 1}}
    )
    assert alloc_sets(ac(g, "resources=VCPU:1&required=HW_CPU_X86_AVX,!HW_CPU_X86_SSE")) == (
        expect({avx: {"VCPU": 1}})
    )


def test_any_of_traits_at_1_39_match_either_trait() -> None:
    b = GraphBuilder()
    avx = compute(b, "avx", traits={"HW_CPU_X86_AVX"})
    sse = compute(b, "sse", traits={"HW_CPU_X86_SSE"})
    compute(b, "none")
    body = ac(b.graph(), "resources=VCPU:1&required=in:HW_CPU_X86_AVX,HW_CPU_X86_SSE")
    assert alloc_sets(body) == expect({avx: {"VCPU": 1}}, {sse: {"VCPU": 1}})


def test_repeated_required_is_anded_at_1_39_and_last_wins_before() -> None:
    b = GraphBuilder()
    avx = compute(b, "avx", traits={"HW_CPU_X86_AVX"})
    both = compute(b, "both", traits={"HW_CPU_X86_AVX", "HW_CPU_X86_SSE"})
    g = b.graph()
    qs = "resources=VCPU:1&required=HW_CPU_X86_SSE&required=HW_CPU_X86_AVX"
    assert alloc_sets(ac(g, qs)) == expect({both: {"VCPU": 1}})
    assert alloc_sets(ac(g, qs, (1, 38))) == expect({avx: {"VCPU": 1}}, {both: {"VCPU": 1}})


def test_member_of_forms_and_forbidden_aggregates() -> None:
    a1, a2, a3 = agg_uuid("a1"), agg_uuid("a2"), agg_uuid("a3")
    b = GraphBuilder()
    p1 = compute(b, "p1", aggregates={a1})
    p2 = compute(b, "p2", aggregates={a2})
    p12 = compute(b, "p12", aggregates={a1, a2})
    compute(b, "p3", aggregates={a3})
    g = b.graph()
    r = {"VCPU": 1}
    assert alloc_sets(ac(g, f"resources=VCPU:1&member_of={a1}")) == expect({p1: r}, {p12: r})
    assert alloc_sets(ac(g, f"resources=VCPU:1&member_of=in:{a1},{a2}")) == expect(
        {p1: r}, {p2: r}, {p12: r}
    )
    assert alloc_sets(ac(g, f"resources=VCPU:1&member_of={a1}&member_of={a2}")) == expect({p12: r})
    assert alloc_sets(ac(g, f"resources=VCPU:1&member_of=!{a1}&member_of=!{a3}")) == expect({p2: r})
    assert alloc_sets(ac(g, f"resources=VCPU:1&member_of={agg_uuid('nope')}")) == []


def test_limit_keeps_the_first_candidates_of_placements_order_and_their_summaries() -> None:
    """Placement's order is that of a Python set of its requests (the suite compares
    it with Placement 16 itself in test_candidates_limit_parity)."""
    from berth.placement.candidates_order import flat_order

    b = GraphBuilder()
    names = [compute(b, f"cn{i}") for i in range(5)]
    g = b.graph()
    body = ac(g, "resources=VCPU:1&limit=2")
    kept = [next(iter(r["allocations"])) for r in body["allocation_requests"]]
    order = flat_order(g, list(range(5)), {"VCPU": 1}, list(range(5)))
    assert kept == [names[i] for i in order[:2]]
    assert set(body["provider_summaries"]) == set(kept)


def test_randomized_limit_is_a_seeded_sample_and_max_candidates_caps() -> None:
    b = GraphBuilder()
    names = [compute(b, f"cn{i}") for i in range(20)]
    g = b.graph()
    first = ac(g, "resources=VCPU:1&limit=3", randomize_allocation_candidates=True, seed=7)
    again = ac(g, "resources=VCPU:1&limit=3", randomize_allocation_candidates=True, seed=7)
    assert first == again
    assert len(first["allocation_requests"]) == 3
    capped = ac(g, "resources=VCPU:1", max_allocation_candidates=4)
    kept = [next(iter(r["allocations"])) for r in capped["allocation_requests"]]
    assert len(set(kept)) == 4 and set(kept) <= set(names)


# -- response shape by microversion ---------------------------------------------------------


def _one_compute() -> tuple[ProviderGraph, str]:
    b = GraphBuilder()
    cn = compute(b, "cn", traits={"HW_CPU_X86_AVX"}, used={"MEMORY_MB": 100})
    return b.graph(), cn


def test_allocation_requests_are_a_list_before_1_12() -> None:
    g, cn = _one_compute()
    body = ac(g, "resources=VCPU:1", (1, 10))
    assert body["allocation_requests"] == [
        {"allocations": [{"resource_provider": {"uuid": cn}, "resources": {"VCPU": 1}}]}
    ]
    assert body["provider_summaries"] == {cn: {"resources": {"VCPU": {"capacity": 8, "used": 0}}}}


def test_allocation_requests_are_a_dict_from_1_12_without_mappings_before_1_34() -> None:
    g, cn = _one_compute()
    for mv in [(1, 12), (1, 33)]:
        body = ac(g, "resources=VCPU:1", mv)
        assert body["allocation_requests"] == [{"allocations": {cn: {"resources": {"VCPU": 1}}}}]
    body = ac(g, "resources=VCPU:1", (1, 34))
    assert body["allocation_requests"][0]["mappings"] == {"": [cn]}


@pytest.mark.parametrize(
    ("mv", "keys", "classes"),
    [
        ((1, 16), {"resources"}, {"VCPU"}),
        ((1, 17), {"resources", "traits"}, {"VCPU"}),
        ((1, 26), {"resources", "traits"}, {"VCPU"}),
        ((1, 27), {"resources", "traits"}, {"VCPU", "MEMORY_MB", "DISK_GB"}),
        (
            (1, 29),
            {"resources", "traits", "parent_provider_uuid", "root_provider_uuid"},
            {"VCPU", "MEMORY_MB", "DISK_GB"},
        ),
    ],
    ids=[
        "1.16 summaries hold only resources",
        "1.17 adds traits",
        "1.26 still lists only the requested classes",
        "1.27 lists every inventoried class",
        "1.29 adds parent and root uuids",
    ],
)
def test_provider_summary_shape(mv: tuple[int, int], keys: set[str], classes: set[str]) -> None:
    g, cn = _one_compute()
    summary = ac(g, "resources=VCPU:1", mv)["provider_summaries"][cn]
    assert set(summary) == keys
    assert set(summary["resources"]) == classes
    if "traits" in keys:
        assert summary["traits"] == ["HW_CPU_X86_AVX"]
    if mv >= (1, 29):
        assert summary["parent_provider_uuid"] is None
        assert summary["root_provider_uuid"] == cn
    if mv >= (1, 27):
        assert summary["resources"]["MEMORY_MB"] == {"capacity": 2048, "used": 100}


# -- nested trees ------------------------------------------------------------------------------


def _numa_tree(b: GraphBuilder, name: str) -> dict[str, str]:
    """A compute root with DISK_GB and two NUMA children with VCPU and MEMORY_MB."""
    root = b.provider(name, DISK_GB=inv(100))
    n0 = b.provider(
        f"{name}-numa0", parent=root, traits={"HW_NUMA_ROOT"}, VCPU=inv(4), MEMORY_MB=inv(1024)
    )
    n1 = b.provider(
        f"{name}-numa1",
        parent=root,
        traits={"HW_NUMA_ROOT", "HW_CPU_X86_AVX"},
        VCPU=inv(4),
        MEMORY_MB=inv(1024),
    )
    return {"root": root, "n0": n0, "n1": n1}


def test_unsuffixed_group_spans_providers_of_one_tree_from_1_29() -> None:
    b = GraphBuilder()
    t = _numa_tree(b, "cn1")
    empty = b.provider("cn1-nic", parent=t["root"])
    g = b.graph()
    body = ac(g, "resources=VCPU:2,MEMORY_MB:512,DISK_GB:10")
    root, n0, n1 = t["root"], t["n0"], t["n1"]
    assert alloc_sets(body) == expect(
        {root: {"DISK_GB": 10}, n0: {"VCPU": 2, "MEMORY_MB": 512}},
        {root: {"DISK_GB": 10}, n1: {"VCPU": 2, "MEMORY_MB": 512}},
        {root: {"DISK_GB": 10}, n0: {"VCPU": 2}, n1: {"MEMORY_MB": 512}},
        {root: {"DISK_GB": 10}, n1: {"VCPU": 2}, n0: {"MEMORY_MB": 512}},
    )
    # The whole tree is summarized, including the provider with no inventory.
    assert set(body["provider_summaries"]) == {root, n0, n1, empty}
    assert body["provider_summaries"][empty]["resources"] == {}
    assert body["provider_summaries"][n0]["parent_provider_uuid"] == root
    assert body["provider_summaries"][n0]["root_provider_uuid"] == root


def test_before_1_29_a_request_may_not_use_two_providers_of_one_tree() -> None:
    b = GraphBuilder()
    t = _numa_tree(b, "cn1")
    flat = compute(b, "flat")
    g = b.graph()
    body = ac(g, "resources=VCPU:2,DISK_GB:10", (1, 28))
    assert alloc_sets(body) == expect({flat: {"VCPU": 2, "DISK_GB": 10}})
    assert set(body["provider_summaries"]) == {flat}
    body = ac(g, "resources=VCPU:2", (1, 28))
    assert alloc_sets(body) == expect(
        {t["n0"]: {"VCPU": 2}}, {t["n1"]: {"VCPU": 2}}, {flat: {"VCPU": 2}}
    )
    # Only the providers actually used are summarized below 1.29.
    assert set(body["provider_summaries"]) == {t["n0"], t["n1"], flat}


def test_unsuffixed_required_trait_counts_only_on_providers_supplying_resources() -> None:
    b = GraphBuilder()
    t = _numa_tree(b, "cn1")
    g = b.graph()
    body = ac(g, "resources=VCPU:1,DISK_GB:1&required=HW_CPU_X86_AVX")
    assert alloc_sets(body) == expect({t["root"]: {"DISK_GB": 1}, t["n1"]: {"VCPU": 1}})
    # A trait on the root that supplies nothing does not help.
    b2 = GraphBuilder()
    root = b2.provider("cn", traits={"HW_CPU_X86_SSE"})
    b2.provider("numa", parent=root, VCPU=inv(4))
    assert ac(b2.graph(), "resources=VCPU:1&required=HW_CPU_X86_SSE")["allocation_requests"] == []


def test_forbidden_trait_excludes_a_tree_member_from_the_unsuffixed_group() -> None:
    b = GraphBuilder()
    t = _numa_tree(b, "cn1")
    body = ac(b.graph(), "resources=VCPU:1,DISK_GB:1&required=!HW_CPU_X86_AVX")
    assert alloc_sets(body) == expect({t["root"]: {"DISK_GB": 1}, t["n0"]: {"VCPU": 1}})


def test_member_of_on_the_root_covers_its_whole_tree_in_the_unsuffixed_group() -> None:
    a1 = agg_uuid("a1")
    b = GraphBuilder()
    root = b.provider("cn", aggregates={a1}, DISK_GB=inv(10))
    numa = b.provider("numa", parent=root, VCPU=inv(4))
    other = b.provider("cn2", VCPU=inv(4), DISK_GB=inv(10))
    g = b.graph()
    body = ac(g, f"resources=VCPU:1,DISK_GB:1&member_of={a1}")
    assert alloc_sets(body) == expect({root: {"DISK_GB": 1}, numa: {"VCPU": 1}})
    body = ac(g, f"resources=VCPU:1,DISK_GB:1&member_of=!{a1}")
    assert alloc_sets(body) == expect({other: {"VCPU": 1, "DISK_GB": 1}})


def test_in_tree_limits_candidates_to_one_tree() -> None:
    b = GraphBuilder()
    t1 = _numa_tree(b, "cn1")
    _numa_tree(b, "cn2")
    g = b.graph()
    body = ac(g, f"resources=VCPU:4&in_tree={t1['n0']}")
    assert alloc_sets(body) == expect({t1["n0"]: {"VCPU": 4}}, {t1["n1"]: {"VCPU": 4}})
    unknown = "00000000-0000-0000-0000-000000000001"
    assert ac(g, f"resources=VCPU:4&in_tree={unknown}")["allocation_requests"] == []
    body = ac(g, f"resources=VCPU:4&resources1=MEMORY_MB:1&in_tree1={t1['n1']}&group_policy=none")
    assert {u for r in alloc_sets(body) for u in r} <= {t1["n0"], t1["n1"]}
    assert len(body["allocation_requests"]) == 4


def test_root_required_keeps_only_trees_whose_root_has_the_traits() -> None:
    b = GraphBuilder()
    good = b.provider("good", traits={"COMPUTE_VOLUME_MULTI_ATTACH"}, VCPU=inv(4))
    numa = b.provider("good-numa", parent=good, VCPU=inv(4))
    b.provider("bad", VCPU=inv(4))
    g = b.graph()
    body = ac(g, "resources=VCPU:1&root_required=COMPUTE_VOLUME_MULTI_ATTACH")
    assert alloc_sets(body) == expect({good: {"VCPU": 1}}, {numa: {"VCPU": 1}})
    body = ac(g, "resources=VCPU:1&root_required=!COMPUTE_VOLUME_MULTI_ATTACH")
    assert alloc_sets(body) == expect({b.uuid("bad"): {"VCPU": 1}})


# -- sharing providers ---------------------------------------------------------------------


def test_sharing_provider_serves_trees_in_its_aggregate() -> None:
    shared = agg_uuid("shared")
    b = GraphBuilder()
    cn1 = b.provider("cn1", aggregates={shared}, VCPU=inv(8))
    cn2 = b.provider("cn2", aggregates={shared}, VCPU=inv(8), DISK_GB=inv(100))
    b.provider("cn3", VCPU=inv(8))
    ss = b.provider(
        "ss", aggregates={shared}, traits={"MISC_SHARES_VIA_AGGREGATE"}, DISK_GB=inv(1000)
    )
    g = b.graph()
    body = ac(g, "resources=VCPU:1,DISK_GB:10")
    assert alloc_sets(body) == expect(
        {cn1: {"VCPU": 1}, ss: {"DISK_GB": 10}},
        {cn2: {"VCPU": 1}, ss: {"DISK_GB": 10}},
        {cn2: {"VCPU": 1, "DISK_GB": 10}},
    )
    assert set(body["provider_summaries"]) == {cn1, cn2, ss}


def test_sharing_provider_in_a_granular_group_is_copied_to_each_anchor_and_deduplicated() -> None:
    shared = agg_uuid("shared")
    b = GraphBuilder()
    cn1 = b.provider("cn1", aggregates={shared}, VCPU=inv(8))
    cn2 = b.provider("cn2", aggregates={shared}, VCPU=inv(8))
    ss = b.provider(
        "ss", aggregates={shared}, traits={"MISC_SHARES_VIA_AGGREGATE"}, DISK_GB=inv(1000)
    )
    g = b.graph()
    body = ac(g, "resources1=DISK_GB:10")
    assert alloc_sets(body) == expect({ss: {"DISK_GB": 10}})
    body = ac(g, "resources=VCPU:1&resources1=DISK_GB:10")
    assert alloc_sets(body) == expect(
        {cn1: {"VCPU": 1}, ss: {"DISK_GB": 10}}, {cn2: {"VCPU": 1}, ss: {"DISK_GB": 10}}
    )
    mappings = [r["mappings"] for r in body["allocation_requests"]]
    assert {"": [cn1], "1": [ss]} in mappings


# -- granular groups ----------------------------------------------------------------------


def _two_pf_host() -> tuple[ProviderGraph, dict[str, str]]:
    b = GraphBuilder()
    cn = b.provider("cn", VCPU=inv(8), MEMORY_MB=inv(4096))
    pf1 = b.provider("pf1", parent=cn, traits={"CUSTOM_PHYSNET_A"}, SRIOV_NET_VF=inv(4))
    pf2 = b.provider("pf2", parent=cn, traits={"CUSTOM_PHYSNET_B"}, SRIOV_NET_VF=inv(4))
    return b.graph(), {"cn": cn, "pf1": pf1, "pf2": pf2}


def test_group_policy_isolate_puts_granular_groups_on_distinct_providers() -> None:
    g, t = _two_pf_host()
    base = "resources=VCPU:1&resources1=SRIOV_NET_VF:1&resources2=SRIOV_NET_VF:1"
    isolate = ac(g, base + "&group_policy=isolate")
    vf = {"SRIOV_NET_VF": 1}
    assert alloc_sets(isolate) == expect(
        {t["cn"]: {"VCPU": 1}, t["pf1"]: vf, t["pf2"]: vf},
        {t["cn"]: {"VCPU": 1}, t["pf1"]: vf, t["pf2"]: vf},
    )
    assert {
        (r["mappings"]["1"][0], r["mappings"]["2"][0]) for r in isolate["allocation_requests"]
    } == {(t["pf1"], t["pf2"]), (t["pf2"], t["pf1"])}
    none = ac(g, base + "&group_policy=none")
    assert len(none["allocation_requests"]) == 4
    assert {"SRIOV_NET_VF": 2} in [
        r["allocations"].get(t["pf1"], {}).get("resources") for r in none["allocation_requests"]
    ]


def test_granular_required_trait_must_be_on_the_provider_of_that_group() -> None:
    g, t = _two_pf_host()
    body = ac(g, "resources=VCPU:1&resources1=SRIOV_NET_VF:1&required1=CUSTOM_PHYSNET_B")
    assert alloc_sets(body) == expect({t["cn"]: {"VCPU": 1}, t["pf2"]: {"SRIOV_NET_VF": 1}})
    assert body["allocation_requests"][0]["mappings"] == {"": [t["cn"]], "1": [t["pf2"]]}


def test_summed_amounts_of_several_groups_are_rechecked_against_capacity() -> None:
    b = GraphBuilder()
    cn = b.provider("cn", VCPU=inv(3))
    g = b.graph()
    ok = ac(g, "resources1=VCPU:1&resources2=VCPU:2&group_policy=none")
    assert alloc_sets(ok) == expect({cn: {"VCPU": 3}})
    assert (
        ac(g, "resources1=VCPU:2&resources2=VCPU:2&group_policy=none")["allocation_requests"] == []
    )


def test_reference_example_two_computes_eight_children_of_eight_vfs_gives_128() -> None:
    b = GraphBuilder()
    for c in range(2):
        cn = b.provider(f"cn{c}", DISK_GB=inv(1000), MEMORY_MB=inv(8192), VCPU=inv(16))
        for k in range(8):
            b.provider(f"cn{c}-pf{k}", parent=cn, CUSTOM_VF=inv(8))
    body = ac(
        b.graph(),
        "resources=DISK_GB:20,MEMORY_MB:2048,VCPU:2"
        "&resources1=CUSTOM_VF:1&resources2=CUSTOM_VF:1&group_policy=none",
    )
    assert len(body["allocation_requests"]) == 128


def test_same_subtree_requires_a_common_ancestor_among_the_groups() -> None:
    b = GraphBuilder()
    cn = b.provider("cn", VCPU=inv(8))
    n0 = b.provider("numa0", parent=cn, traits={"HW_NUMA_ROOT"})
    n1 = b.provider("numa1", parent=cn, traits={"HW_NUMA_ROOT"})
    acc0 = b.provider("acc0", parent=n0, FPGA=inv(1))
    nic0 = b.provider("nic0", parent=n0, SRIOV_NET_VF=inv(4))
    b.provider("nic1", parent=n1, SRIOV_NET_VF=inv(4))
    g = b.graph()
    qs = (
        "resources=VCPU:1&resources_ACC=FPGA:1&resources_NIC=SRIOV_NET_VF:1"
        "&required_NUMA=HW_NUMA_ROOT&same_subtree=_ACC,_NIC,_NUMA&group_policy=none"
    )
    body = ac(g, qs)
    assert alloc_sets(body) == expect(
        {cn: {"VCPU": 1}, acc0: {"FPGA": 1}, nic0: {"SRIOV_NET_VF": 1}}
    )
    assert body["allocation_requests"][0]["mappings"] == {
        "": [cn],
        "_ACC": [acc0],
        "_NIC": [nic0],
        "_NUMA": [n0],
    }
    # Without the resourceless NUMA group nothing matches: the FPGA and a NIC are
    # siblings at best, and the common ancestor must itself be one of the mapped providers.
    body = ac(
        g,
        "resources_ACC=FPGA:1&resources_NIC=SRIOV_NET_VF:1&same_subtree=_ACC,_NIC"
        "&group_policy=none",
    )
    assert body["allocation_requests"] == []


def test_same_subtree_with_an_ancestor_among_the_groups_passes() -> None:
    b = GraphBuilder()
    cn = b.provider("cn", VCPU=inv(8))
    n0 = b.provider("numa0", parent=cn, MEMORY_MB=inv(1024))
    nic0 = b.provider("nic0", parent=n0, SRIOV_NET_VF=inv(4))
    n1 = b.provider("numa1", parent=cn, MEMORY_MB=inv(1024))
    g = b.graph()
    body = ac(
        g,
        "resources_M=MEMORY_MB:1&resources_V=SRIOV_NET_VF:1&same_subtree=_M,_V&group_policy=isolate",
    )
    assert alloc_sets(body) == expect({n0: {"MEMORY_MB": 1}, nic0: {"SRIOV_NET_VF": 1}})
    assert n1 not in body["provider_summaries"] or len(body["allocation_requests"]) == 1


def test_json_path_matches_the_dict_path_on_every_microversion() -> None:
    b = GraphBuilder()
    for i in range(5):
        compute(b, f"cn{i}", traits={"HW_CPU_X86_AVX"} if i % 2 else set(), used={"VCPU": i})
    g = b.graph()
    for minor in range(10, 40):
        qs = "resources=VCPU:2,MEMORY_MB:100"
        body = ac(g, qs, (1, minor))  # ac() itself compares the two paths
        assert len(body["allocation_requests"]) == 5


def test_sharing_provider_outside_member_of_does_not_serve_the_unsuffixed_group() -> None:
    shared, other = agg_uuid("shared"), agg_uuid("other")
    b = GraphBuilder()
    cn1 = b.provider("cn1", aggregates={shared, other}, VCPU=inv(8))
    ss = b.provider(
        "ss", aggregates={shared}, traits={"MISC_SHARES_VIA_AGGREGATE"}, DISK_GB=inv(1000)
    )
    g = b.graph()
    assert alloc_sets(ac(g, f"resources=VCPU:1,DISK_GB:1&member_of={shared}")) == expect(
        {cn1: {"VCPU": 1}, ss: {"DISK_GB": 1}}
    )
    # The compute node is in ``other`` but the sharing provider is not: no candidate.
    assert ac(g, f"resources=VCPU:1,DISK_GB:1&member_of={other}")["allocation_requests"] == []


def test_in_tree_on_the_unsuffixed_group_ignores_sharing_providers() -> None:
    shared = agg_uuid("shared")
    b = GraphBuilder()
    cn1 = b.provider("cn1", aggregates={shared}, VCPU=inv(8))
    b.provider("ss", aggregates={shared}, traits={"MISC_SHARES_VIA_AGGREGATE"}, DISK_GB=inv(10))
    g = b.graph()
    assert ac(g, f"resources=VCPU:1,DISK_GB:1&in_tree={cn1}")["allocation_requests"] == []
    assert alloc_sets(ac(g, f"resources=VCPU:1&in_tree={cn1}")) == expect({cn1: {"VCPU": 1}})


def test_general_path_renders_every_microversion_shape() -> None:
    b = GraphBuilder()
    t = _numa_tree(b, "cn1")
    g = b.graph()
    old = ac(g, "resources=VCPU:1", (1, 10))
    assert sorted(
        r["allocations"][0]["resource_provider"]["uuid"] for r in old["allocation_requests"]
    ) == sorted([t["n0"], t["n1"]])
    assert set(old["provider_summaries"][t["n0"]]) == {"resources"}
    assert set(old["provider_summaries"][t["n0"]]["resources"]) == {"VCPU"}
    mid = ac(g, "resources=VCPU:1,DISK_GB:1", (1, 33))
    assert all("mappings" not in r for r in mid["allocation_requests"])
    new = ac(g, "resources=VCPU:1,DISK_GB:1", (1, 34))
    assert sorted(sorted(r["mappings"][""]) for r in new["allocation_requests"]) == sorted(
        [sorted([t["root"], t["n0"]]), sorted([t["root"], t["n1"]])]
    )


@pytest.mark.parametrize(
    ("member_of", "expected"),
    [
        (["in:{A},{B}"], {"cn1", "cn2"}),
        (["{C}"], {"cn1"}),
        (["{A}", "{B}"], {"cn2"}),
        (["!{C}"], {"cn2", "cn3"}),
        (["!in:{B},{C}"], {"cn3"}),
        (["!{B}", "{C}"], {"cn1"}),
        (["!in:{B},{C}", "{A}"], set()),
        (["!{B}", "in:{B},{C}"], {"cn1"}),
        (["!{B}", "{B}"], set()),
    ],
    ids=[
        "any of two aggregates",
        "one aggregate",
        "both aggregates",
        "not in an aggregate",
        "in neither of two aggregates",
        "not in one but in another",
        "excluded everywhere the required one applies",
        "forbidden beats an any-of that includes it",
        "forbidden and required the same aggregate",
    ],
)
def test_reference_member_of_cases(member_of: list[str], expected: set[str]) -> None:
    aggs = {name: agg_uuid(name) for name in "ABC"}
    b = GraphBuilder()
    for name, member in (("cn1", {"A", "C"}), ("cn2", {"A", "B"}), ("cn3", set())):
        compute(b, name, aggregates={aggs[m] for m in member})
    qs = "resources=VCPU:1" + "".join(f"&member_of={m.format(**aggs)}" for m in member_of)
    body = ac(b.graph(), qs, (1, 32))
    names = {b.uuid(n): n for n in ("cn1", "cn2", "cn3")}
    assert {names[u] for r in body["allocation_requests"] for u in r["allocations"]} == expected
    assert {names[u] for u in body["provider_summaries"]} == expected


@pytest.mark.parametrize(
    ("qs", "expected"),
    [
        ("resources=VCPU:1", [["n11"], ["n12"], ["n21"], ["n22"]]),
        ("resources=VCPU:1&member_of={A}", [["n11"], ["n12"], ["n21"], ["n22"]]),
        ("resources=VCPU:1&member_of={B}", [["n21"], ["n22"]]),
        ("resources=VCPU:1&member_of={C}", [["n11"]]),
        (
            "resources=VCPU:1,DISK_GB:1000",
            [
                ["n11", "ss1"],
                ["n11", "ss2"],
                ["n12", "ss1"],
                ["n12", "ss2"],
                ["n21", "ss1"],
                ["n22", "ss1"],
            ],
        ),
        (
            "resources=VCPU:1,DISK_GB:1000&member_of={A}",
            [["n11", "ss1"], ["n12", "ss1"], ["n21", "ss1"], ["n22", "ss1"]],
        ),
        ("resources=VCPU:1,DISK_GB:1000&member_of={B}", []),
        ("resources=VCPU:1,DISK_GB:1000&member_of={C}", [["n11", "ss2"]]),
        ("resources=VCPU:1,DISK_GB:1000&member_of=!{A}", []),
        (
            "resources=VCPU:1,DISK_GB:1000&member_of=!{B}",
            [["n11", "ss1"], ["n11", "ss2"], ["n12", "ss1"], ["n12", "ss2"]],
        ),
        (
            "resources=VCPU:1,DISK_GB:1000&member_of=!{C}",
            [["n12", "ss1"], ["n21", "ss1"], ["n22", "ss1"]],
        ),
        (
            "resources=VCPU:1,DISK_GB:1000&member_of=in:{A},{B}&member_of=!{C}",
            [["n12", "ss1"], ["n21", "ss1"], ["n22", "ss1"]],
        ),
        (
            "resources=VCPU:1,DISK_GB:1000&member_of={A}&member_of=!in:{B},{C}",
            [["n12", "ss1"]],
        ),
    ],
    ids=[
        "no aggregate",
        "an aggregate on both roots covers both trees",
        "an aggregate on one root covers its tree",
        "an aggregate on a child covers only that child",
        "sharing disks serve the trees of their aggregates",
        "sharing disk in the requested root aggregate",
        "no sharing disk in the requested aggregate",
        "sharing disk with a child's aggregate serves only that child",
        "forbidden aggregate on both roots",
        "forbidden aggregate on one root",
        "forbidden aggregate on a child and a sharing disk",
        "any-of aggregates with a forbidden one",
        "required aggregate with forbidden any-of",
    ],
)
def test_reference_aggregates_on_nested_and_sharing_providers(
    qs: str, expected: list[list[str]]
) -> None:
    aggs = {name: agg_uuid(name) for name in "ABC"}
    b = GraphBuilder()
    cn1 = b.provider("cn1", aggregates={aggs["A"]})
    cn2 = b.provider("cn2", aggregates={aggs["A"], aggs["B"]})
    shares = {"MISC_SHARES_VIA_AGGREGATE"}
    b.provider("ss1", aggregates={aggs["A"]}, traits=shares, DISK_GB=inv(2000, reserved=100))
    b.provider("ss2", aggregates={aggs["C"]}, traits=shares, DISK_GB=inv(2000, reserved=100))
    vcpu = inv(24, allocation_ratio=16.0)
    b.provider("n11", parent=cn1, aggregates={aggs["C"]}, VCPU=vcpu)
    b.provider("n12", parent=cn1, VCPU=vcpu)
    b.provider("n21", parent=cn2, VCPU=vcpu)
    b.provider("n22", parent=cn2, VCPU=vcpu)
    body = ac(b.graph(), qs.format(**aggs), (1, 32))
    names = {b.uuid(n): n for n in ("ss1", "ss2", "n11", "n12", "n21", "n22")}
    got = sorted(sorted(names[u] for u in r["allocations"]) for r in body["allocation_requests"])
    assert got == expected


def test_reference_mappings_with_sharing_providers() -> None:
    aggs = {name: agg_uuid(name) for name in "AB"}
    b = GraphBuilder()
    middle = b.provider(
        "cn_middle",
        aggregates={aggs["A"], aggs["B"]},
        traits={"HW_CPU_X86_SSE"},
        VCPU=inv(8),
        MEMORY_MB=inv(4096),
    )
    b.provider("cn_left", aggregates={aggs["A"]}, VCPU=inv(8), DISK_GB=inv(500))
    shares = {"MISC_SHARES_VIA_AGGREGATE"}
    d1 = b.provider("shr_disk_1", aggregates={aggs["A"]}, traits=shares, DISK_GB=inv(1000))
    d2 = b.provider(
        "shr_disk_2", aggregates={aggs["A"], aggs["B"]}, traits=shares, DISK_GB=inv(1000)
    )
    g = b.graph()
    body = ac(g, "resources=VCPU:1&required=HW_CPU_X86_SSE", (1, 34))
    assert [r["mappings"] for r in body["allocation_requests"]] == [{"": [middle]}]
    body = ac(g, "resources=VCPU:1,DISK_GB:1&required=HW_CPU_X86_SSE", (1, 34))
    assert len(body["provider_summaries"]) == 3
    assert sorted(sorted(r["mappings"][""]) for r in body["allocation_requests"]) == sorted(
        [sorted([middle, d1]), sorted([middle, d2])]
    )
    body = ac(
        g,
        "resources=VCPU:1&resources_DISK_A=DISK_GB:1&resources_DISK_B=DISK_GB:1"
        "&required=HW_CPU_X86_SSE&group_policy=isolate",
        (1, 34),
    )
    assert len(body["allocation_requests"]) == 2
    assert len(body["provider_summaries"]) == 3
    for r in body["allocation_requests"]:
        assert r["mappings"][""] == [middle]
        assert {r["mappings"]["_DISK_A"][0], r["mappings"]["_DISK_B"][0]} == {d1, d2}


def test_with_updates_reflects_a_claim_without_rebuilding_indexes() -> None:
    b = GraphBuilder()
    cn1 = compute(b, "cn1", VCPU=inv(2))
    cn2 = compute(b, "cn2", VCPU=inv(2))
    g = b.graph()
    assert len(ac(g, "resources=VCPU:2")["allocation_requests"]) == 2
    old = g.providers[g.index[cn1]]
    claimed = type(old)(
        old.uuid,
        old.name,
        2,
        None,
        old.uuid,
        old.inventories,
        {"VCPU": 1},
        old.traits,
        old.aggregates,
    )
    g2 = g.with_updates([claimed])
    assert g2.by_trait is g.by_trait  # indexes shared, not rebuilt
    assert alloc_sets(ac(g2, "resources=VCPU:2")) == expect({cn2: {"VCPU": 2}})
    assert ac(g2, "resources=VCPU:1")["provider_summaries"][cn1]["resources"]["VCPU"] == {
        "capacity": 2,
        "used": 1,
    }
    # The original snapshot is unchanged.
    assert len(ac(g, "resources=VCPU:2")["allocation_requests"]) == 2


def test_with_updates_shares_capacity_columns_only_while_inventories_stay() -> None:
    b = GraphBuilder()
    cn1 = compute(b, "cn1", VCPU=inv(2))
    compute(b, "cn2", VCPU=inv(2))
    g = b.graph()
    old = g.providers[g.index[cn1]]

    def changed(inventories: object, usages: dict[str, int]) -> object:
        return type(old)(old.uuid, old.name, old.generation + 1, None, old.uuid, inventories,
                         usages, old.traits, old.aggregates)

    claimed = g.with_updates([changed(old.inventories, {"VCPU": 1})])
    assert claimed.columns["VCPU"].cap is g.columns["VCPU"].cap
    assert claimed.columns["VCPU"].used is not g.columns["VCPU"].used
    grown = claimed.with_updates([changed({"VCPU": inv(4)}, {"VCPU": 1})])
    assert grown.columns["VCPU"].cap is not claimed.columns["VCPU"].cap
    assert ac(grown, "resources=VCPU:3")["provider_summaries"][cn1]["resources"]["VCPU"] == {
        "capacity": 4, "used": 1}
    # The earlier graphs keep their numbers.
    assert cn1 not in ac(claimed, "resources=VCPU:3")["provider_summaries"]
    assert ac(g, "resources=VCPU:2")["provider_summaries"][cn1]["resources"]["VCPU"] == {
        "capacity": 2, "used": 0}


def test_an_amount_beyond_any_inventory_integer_matches_nothing() -> None:
    b = GraphBuilder()
    b.provider("cn", VCPU=inv(8))
    b.provider("child", parent=b.uuid("cn"), MEMORY_MB=inv(8))
    g = b.graph()
    huge = "9" * 30
    assert ac(g, f"resources=VCPU:{huge}")["allocation_requests"] == []
    assert ac(g, f"resources1=VCPU:{huge}")["allocation_requests"] == []
