"""The reference's shared-storage scenario: two compute trees and a sharing disk provider.

Expected counts and amounts are the ones Placement's own functional tests assert for this
layout (two compute nodes with NUMA children and PFs, cn2 with local disk, one sharing
storage provider in the same aggregate):

    ss (DISK_GB 2000 - 100 reserved, MISC_SHARES_VIA_AGGREGATE) --agg-- cn1, cn2
    cn1 (VCPU 24 x16, MEMORY_MB 128 GiB x1.5, HW_CPU_X86_SSE/SSE2)
      numa1_1 -> pf1_1 (SRIOV_NET_VF 8)       numa1_2 -> pf1_2 (SRIOV_NET_VF 8)
    cn2 (VCPU 24 x16, MEMORY_MB 128 GiB x1.5, DISK_GB 2000 - 100 reserved)
      numa2_1 -> pf2_1 (SRIOV_NET_VF 8)       numa2_2 -> pf2_2 (SRIOV_NET_VF 8)
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import pytest

from berth.placement.candidates import allocation_candidates
from berth.placement.candidates_builders import GraphBuilder, agg_uuid, inv
from berth.placement.candidates_graph import ProviderGraph
from berth.placement.errors import BadRequest


@pytest.fixture(scope="module")
def fx() -> tuple[ProviderGraph, dict[str, str]]:
    agg = agg_uuid("shared")
    b = GraphBuilder()
    u: dict[str, str] = {}
    for cn in ("cn1", "cn2"):
        extra: dict[str, Any] = {}
        if cn == "cn2":
            extra["DISK_GB"] = inv(2000, reserved=100)
        u[cn] = b.provider(
            cn,
            aggregates={agg},
            traits={"HW_CPU_X86_SSE", "HW_CPU_X86_SSE2"} if cn == "cn1" else set(),
            VCPU=inv(24, allocation_ratio=16.0),
            MEMORY_MB=inv(128 * 1024, allocation_ratio=1.5),
            **extra,
        )
    u["ss"] = b.provider(
        "ss",
        aggregates={agg},
        traits={"MISC_SHARES_VIA_AGGREGATE"},
        DISK_GB=inv(2000, reserved=100),
    )
    for c in (1, 2):
        for k in (1, 2):
            u[f"numa{c}_{k}"] = b.provider(f"numa{c}_{k}", parent=u[f"cn{c}"])
    for c in (1, 2):
        for k in (1, 2):
            u[f"pf{c}_{k}"] = b.provider(
                f"pf{c}_{k}", parent=u[f"numa{c}_{k}"], SRIOV_NET_VF=inv(8)
            )
    return b.graph(), u


def get(fx: tuple[ProviderGraph, dict[str, str]], qs: str, mv: tuple[int, int]) -> dict[str, Any]:
    graph, u = fx
    for name, value in u.items():
        qs = qs.replace("$" + name.upper(), value)
    params: dict[str, list[str]] = {}
    for key, value in parse_qsl(qs, keep_blank_values=True):
        params.setdefault(key, []).append(value)
    return allocation_candidates(graph, params, mv)


def amounts(body: dict[str, Any], uuid: str, rc: str) -> list[int]:
    """Every amount of ``rc`` on ``uuid`` across the (dict-form) allocation requests."""
    return sorted(
        r["allocations"][uuid]["resources"][rc]
        for r in body["allocation_requests"]
        if uuid in r["allocations"] and rc in r["allocations"][uuid]["resources"]
    )


BASE = "resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"


def test_no_allocations_yet_list_form(fx: Any) -> None:
    _, u = fx
    body = get(fx, BASE, (1, 10))
    assert len(body["provider_summaries"]) == 3
    assert len(body["allocation_requests"]) == 3
    per_rp: dict[str, list[dict[str, int]]] = {}
    for r in body["allocation_requests"]:
        for a in r["allocations"]:
            per_rp.setdefault(a["resource_provider"]["uuid"], []).append(a["resources"])
    assert per_rp[u["cn1"]] == [{"VCPU": 1, "MEMORY_MB": 1024}]
    assert sorted(x.get("DISK_GB", 0) for x in per_rp[u["cn2"]]) == [0, 100]
    assert per_rp[u["ss"]] == [{"DISK_GB": 100}, {"DISK_GB": 100}]
    summaries = body["provider_summaries"]
    assert summaries[u["cn1"]]["resources"]["VCPU"] == {"capacity": 384, "used": 0}
    assert summaries[u["cn1"]]["resources"]["MEMORY_MB"] == {"capacity": 196608, "used": 0}
    assert summaries[u["cn2"]]["resources"]["DISK_GB"] == {"capacity": 1900, "used": 0}
    assert summaries[u["ss"]]["resources"]["DISK_GB"] == {"capacity": 1900, "used": 0}


def test_dict_form_at_1_12(fx: Any) -> None:
    _, u = fx
    body = get(fx, BASE, (1, 12))
    assert len(body["provider_summaries"]) == 3
    assert len(body["allocation_requests"]) == 3
    assert amounts(body, u["cn2"], "VCPU") == [1, 1]
    assert amounts(body, u["cn2"], "DISK_GB") == [100]
    assert amounts(body, u["ss"], "DISK_GB") == [100, 100]
    assert len(get(fx, BASE + "&limit=1", (1, 16))["allocation_requests"]) == 1


def test_required_and_forbidden_traits(fx: Any) -> None:
    _, u = fx
    body = get(fx, BASE + "&required=HW_CPU_X86_SSE", (1, 17))
    assert len(body["allocation_requests"]) == 1
    assert len(body["provider_summaries"]) == 2
    assert sorted(body["provider_summaries"][u["cn1"]]["traits"]) == [
        "HW_CPU_X86_SSE",
        "HW_CPU_X86_SSE2",
    ]
    body = get(fx, BASE + "&required=!HW_CPU_X86_SSE", (1, 22))
    assert len(body["allocation_requests"]) == 2
    assert amounts(body, u["cn2"], "VCPU") == [1, 1]
    assert amounts(body, u["ss"], "DISK_GB") == [100]
    body = get(fx, BASE + "&required=HW_CPU_X86_SSE,HW_CPU_X86_SSE2", (1, 17))
    assert (len(body["allocation_requests"]), len(body["provider_summaries"])) == (1, 2)
    body = get(fx, BASE + "&required=HW_CPU_X86_SSE3", (1, 17))
    assert body == {"allocation_requests": [], "provider_summaries": {}}
    assert len(get(fx, BASE, (1, 16))["provider_summaries"][u["cn1"]]) == 1


def test_summaries_by_microversion(fx: Any) -> None:
    _, u = fx
    body = get(fx, "resources=VCPU:1", (1, 26))
    assert (len(body["allocation_requests"]), len(body["provider_summaries"])) == (2, 2)
    assert body["provider_summaries"][u["cn1"]]["resources"] == {
        "VCPU": {"capacity": 384, "used": 0}
    }
    body = get(fx, "resources=VCPU:1", (1, 27))
    assert len(body["provider_summaries"][u["cn1"]]["resources"]) == 2
    assert len(body["provider_summaries"][u["cn2"]]["resources"]) == 3
    body = get(fx, "resources=VCPU:1", (1, 28))
    assert (len(body["allocation_requests"]), len(body["provider_summaries"])) == (2, 2)
    assert len(body["provider_summaries"][u["cn1"]]) == 2
    body = get(fx, "resources=VCPU:1", (1, 29))
    summaries = body["provider_summaries"]
    assert (len(body["allocation_requests"]), len(summaries)) == (2, 10)
    assert len(summaries[u["cn1"]]) == 4
    assert summaries[u["cn1"]]["parent_provider_uuid"] is None
    assert summaries[u["cn1"]]["root_provider_uuid"] == u["cn1"]
    assert summaries[u["numa1_1"]]["parent_provider_uuid"] == u["cn1"]
    assert summaries[u["pf1_2"]]["parent_provider_uuid"] == u["numa1_2"]
    assert summaries[u["pf1_2"]]["root_provider_uuid"] == u["cn1"]


@pytest.mark.parametrize(
    ("qs", "mv", "n_requests", "n_summaries"),
    [
        ("resources=SRIOV_NET_VF:4", (1, 28), 4, 4),
        ("resources=SRIOV_NET_VF:4", (1, 29), 4, 10),
        ("resources=VCPU:1,SRIOV_NET_VF:4", (1, 28), 0, 0),
        ("resources=VCPU:1,SRIOV_NET_VF:4", (1, 29), 4, 10),
        ("resources=DISK_GB:10,SRIOV_NET_VF:4", (1, 28), 4, 5),
        ("resources=VCPU:1,SRIOV_NET_VF:4&in_tree=$CN1", (1, 31), 2, 5),
        ("resources=VCPU:1,SRIOV_NET_VF:4&in_tree=$PF1_2", (1, 31), 2, 5),
        ("resources=VCPU:1,DISK_GB:10&in_tree=$CN1", (1, 31), 0, 0),
        ("resources=VCPU:1,DISK_GB:10&in_tree=$CN2", (1, 31), 1, 5),
        ("resources=VCPU:1,DISK_GB:10&in_tree=$SS", (1, 31), 0, 0),
        ("resources1=VCPU:1&in_tree1=$CN1", (1, 31), 1, 5),
        ("resources1=VCPU:1&in_tree1=$PF1_1", (1, 31), 1, 5),
        ("resources1=SRIOV_NET_VF:4&in_tree1=$CN1", (1, 31), 2, 5),
        ("resources1=SRIOV_NET_VF:4&in_tree1=$PF1_1", (1, 31), 2, 5),
        ("resources=VCPU:1&resources1=DISK_GB:10&in_tree1=$CN1", (1, 31), 0, 0),
        ("resources=VCPU:1&resources1=DISK_GB:10&in_tree1=$CN2", (1, 31), 1, 5),
        ("resources=VCPU:1&resources1=DISK_GB:10&in_tree1=$SS", (1, 31), 2, 11),
        ("resources=VCPU:1&in_tree=$CN1&resources1=DISK_GB:10", (1, 31), 1, 6),
        ("resources=VCPU:1&in_tree=$CN2&resources1=DISK_GB:10", (1, 31), 2, 6),
        (
            "resources1=VCPU:1&in_tree1=$CN1&resources2=DISK_GB:10&in_tree2=$SS&group_policy=none",
            (1, 31),
            1,
            6,
        ),
    ],
    ids=[
        "only nested providers before 1.29",
        "only nested providers from 1.29 summarize whole trees",
        "root plus nested is impossible before 1.29",
        "root plus nested from 1.29",
        "sharing plus nested before 1.29",
        "in_tree of a root",
        "in_tree of a child means its whole tree",
        "in_tree excludes the sharing disk from the unsuffixed group",
        "in_tree with local disk",
        "in_tree of the sharing provider which has no VCPU",
        "granular in_tree of a root",
        "granular in_tree of a child",
        "granular child resource in a root's tree",
        "granular child resource in a child's tree",
        "granular local disk in a tree without disk",
        "granular local disk in a tree with disk",
        "granular disk from the sharing provider for any compute node",
        "unsuffixed in_tree with granular disk from anywhere",
        "unsuffixed in_tree with local or shared granular disk",
        "granular compute and granular sharing disk",
    ],
)
def test_nested_sharing_and_in_tree_counts(
    fx: Any, qs: str, mv: tuple[int, int], n_requests: int, n_summaries: int
) -> None:
    body = get(fx, qs, mv)
    assert len(body["allocation_requests"]) == n_requests
    assert len(body["provider_summaries"]) == n_summaries


def test_granular_shared_disk_is_used_twice_and_local_disk_once(fx: Any) -> None:
    _, u = fx
    body = get(fx, "resources=VCPU:1&resources1=DISK_GB:10&in_tree1=$SS", (1, 31))
    assert amounts(body, u["ss"], "DISK_GB") == [10, 10]
    body = get(fx, "resources=VCPU:1&in_tree=$CN2&resources1=DISK_GB:10", (1, 31))
    assert amounts(body, u["cn2"], "VCPU") == [1, 1]
    assert amounts(body, u["cn2"], "DISK_GB") == [10]
    assert amounts(body, u["ss"], "DISK_GB") == [10]


def test_in_tree_errors(fx: Any) -> None:
    with pytest.raises(BadRequest, match="Invalid query string parameters"):
        get(fx, "resources=VCPU:1,SRIOV_NET_VF:4&in_tree=$CN1", (1, 30))
    with pytest.raises(BadRequest, match="Expected 'in_tree' parameter to be a format of uuid"):
        get(fx, "resources=VCPU:1&in_tree=life-is-beautiful", (1, 31))
    with pytest.raises(BadRequest, match="All request groups must specify resources."):
        get(fx, "resources=VCPU:1&in_tree1=$CN1", (1, 31))
