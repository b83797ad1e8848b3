"""The reference's granular scenario: three compute nodes and three sharing providers.

Expected results are the ones Placement's own functional tests assert for this layout:

    cn_left   (aggA)        VCPU 8, MEMORY_MB 4096, DISK_GB 500, VGPU 8, SRIOV_NET_VF 8,
                            CUSTOM_NET_MBPS 4000; AVX, AVX2, DXVA, DCB_PFC, CUSTOM_FOO
    cn_middle (aggA, aggB)  VCPU 8, MEMORY_MB 4096, SRIOV_NET_VF 8, CUSTOM_NET_MBPS 4000;
                            AVX, AVX2, SSE, NIC_ACCEL_TLS
    cn_right  (aggB, aggC)  VCPU 8, MEMORY_MB 4096, DISK_GB 500, VGPU 8 (max_unit 2);
                            MMX, DXVA, CUSTOM_DISK_SSD
    shr_disk_1 (aggA)       DISK_GB 1000; sharing, CUSTOM_DISK_SSD
    shr_disk_2 (aggA, aggB) DISK_GB 1000; sharing
    shr_net   (aggC)        SRIOV_NET_VF 16, CUSTOM_NET_MBPS 40000; sharing
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import pytest

from berth.placement.candidates import allocation_candidates
from berth.placement.candidates_builders import GraphBuilder, agg_uuid, inv
from berth.placement.candidates_graph import ProviderGraph

AGG = {name: agg_uuid(name) for name in ("A", "B", "C")}
SHARES = "MISC_SHARES_VIA_AGGREGATE"


@pytest.fixture(scope="module")
def fx() -> tuple[ProviderGraph, dict[str, str]]:
    b = GraphBuilder()
    u = {
        "cn_left": b.provider(
            "cn_left",
            aggregates={AGG["A"]},
            traits={"HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_GPU_API_DXVA", "HW_NIC_DCB_PFC"}
            | {"CUSTOM_FOO"},
            VCPU=inv(8),
            MEMORY_MB=inv(4096),
            DISK_GB=inv(500),
            VGPU=inv(8),
            SRIOV_NET_VF=inv(8),
            CUSTOM_NET_MBPS=inv(4000),
        ),
        "cn_middle": b.provider(
            "cn_middle",
            aggregates={AGG["A"], AGG["B"]},
            traits={"HW_CPU_X86_AVX", "HW_CPU_X86_AVX2", "HW_CPU_X86_SSE", "HW_NIC_ACCEL_TLS"},
            VCPU=inv(8),
            MEMORY_MB=inv(4096),
            SRIOV_NET_VF=inv(8),
            CUSTOM_NET_MBPS=inv(4000),
        ),
        "cn_right": b.provider(
            "cn_right",
            aggregates={AGG["B"], AGG["C"]},
            traits={"HW_CPU_X86_MMX", "HW_GPU_API_DXVA", "CUSTOM_DISK_SSD"},
            VCPU=inv(8),
            MEMORY_MB=inv(4096),
            DISK_GB=inv(500),
            VGPU=inv(8, max_unit=2),
        ),
        "shr_disk_1": b.provider(
            "shr_disk_1",
            aggregates={AGG["A"]},
            traits={SHARES, "CUSTOM_DISK_SSD"},
            DISK_GB=inv(1000),
        ),
        "shr_disk_2": b.provider(
            "shr_disk_2", aggregates={AGG["A"], AGG["B"]}, traits={SHARES}, DISK_GB=inv(1000)
        ),
        "shr_net": b.provider(
            "shr_net",
            aggregates={AGG["C"]},
            traits={SHARES},
            SRIOV_NET_VF=inv(16),
            CUSTOM_NET_MBPS=inv(40000),
        ),
    }
    return b.graph(), u


def get(fx: Any, qs: str, mv: tuple[int, int] = (1, 25)) -> dict[str, Any]:
    graph, _ = fx
    for name, value in AGG.items():
        qs = qs.replace("$AGG" + name, value)
    params: dict[str, list[str]] = {}
    for key, value in parse_qsl(qs, keep_blank_values=True):
        params.setdefault(key, []).append(value)
    return allocation_candidates(graph, params, mv)


def amounts(body: dict[str, Any], uuid: str, rc: str) -> list[int]:
    return sorted(
        r["allocations"][uuid]["resources"][rc]
        for r in body["allocation_requests"]
        if uuid in r["allocations"] and rc in r["allocations"][uuid]["resources"]
    )


@pytest.mark.parametrize(
    ("qs", "n_requests", "n_summaries"),
    [
        ("resources1=VCPU:1&resources2=MEMORY_MB:1024&group_policy=none", 3, 3),
        ("resources1=VCPU:1&resources2=MEMORY_MB:1024&group_policy=isolate", 0, 0),
        (
            "resources1=VCPU:1&resources2=MEMORY_MB:1024&group_policy=isolate&group_policy=none",
            0,
            0,
        ),
        (
            "resources=VCPU:3,MEMORY_MB:512&resources1=VCPU:1,MEMORY_MB:1024&resources2=VCPU:2"
            "&group_policy=none",
            3,
            3,
        ),
        ("resources=VCPU:1&resources1=MEMORY_MB:2048", 3, 3),
        ("resources1=VCPU:1,MEMORY_MB:1024&resources2=DISK_GB:100&group_policy=isolate", 5, 5),
        ("resources1=VCPU:1,MEMORY_MB:1024&resources2=DISK_GB:100&group_policy=none", 7, 5),
        ("resources1=DISK_GB:800", 2, 2),
        ("resources=DISK_GB:800", 2, 2),
        (
            "resources1=VCPU:1,MEMORY_MB:1024&resources2=DISK_GB:100&required2=CUSTOM_DISK_SSD"
            "&group_policy=isolate",
            2,
            3,
        ),
        (
            "resources1=VCPU:1&resources2=DISK_GB:100&required2=!CUSTOM_DISK_SSD&group_policy=none",
            4,
            4,
        ),
        ("resources1=VCPU:1&resources2=DISK_GB:100&member_of2=$AGGC&group_policy=none", 1, 1),
        (
            "resources1=VCPU:1&required1=!HW_CPU_X86_SSE&resources2=DISK_GB:100"
            "&required2=CUSTOM_DISK_SSD&member_of2=in:$AGGA,$AGGC&group_policy=none",
            2,
            3,
        ),
        (
            "resources1=VCPU:1&resources2=DISK_GB:100&member_of2=in:$AGGB,$AGGC"
            "&member_of2=$AGGA&group_policy=isolate",
            3,
            4,
        ),
        (
            "resources1=VCPU:1&resources2=VGPU:1&required2=HW_GPU_API_DXVA"
            "&resources3=MEMORY_MB:1024&resources4=DISK_GB:100&required4=CUSTOM_DISK_SSD"
            "&resources5=DISK_GB:50&required5=!CUSTOM_DISK_SSD"
            "&resources6=SRIOV_NET_VF:1,CUSTOM_NET_MBPS:1000"
            "&resources7=SRIOV_NET_VF:2,CUSTOM_NET_MBPS:2000&group_policy=none",
            3,
            5,
        ),
        (
            "resources=VCPU:2,MEMORY_MB:2048,SRIOV_NET_VF:1,CUSTOM_NET_MBPS:2000"
            "&resources1=SRIOV_NET_VF:1,CUSTOM_NET_MBPS:3000",
            1,
            2,
        ),
        ("resources=VGPU:1&resources1=VGPU:1&resources2=VGPU:1&group_policy=none", 1, 1),
    ],
    ids=[
        "different groups hit with group_policy none",
        "different groups miss with group_policy isolate",
        "of several group_policy values the first counts",
        "resources of all groups combine",
        "group_policy is not required with one numbered group",
        "disk sharing isolated",
        "disk sharing not isolated",
        "disk alone in a granular group",
        "disk alone in the unsuffixed group",
        "isolated ssd",
        "no isolation, forbidden ssd",
        "member_of filters the disk group",
        "required, forbidden and member_of in",
        "multiple member_of",
        "multiple disks, multiple networks",
        "combining request groups exceeds capacity",
        "combining request groups exceeds max_unit",
    ],
)
def test_granular_counts(fx: Any, qs: str, n_requests: int, n_summaries: int) -> None:
    body = get(fx, qs)
    assert len(body["allocation_requests"]) == n_requests
    assert len(body["provider_summaries"]) == n_summaries


def test_resources_of_all_groups_are_summed(fx: Any) -> None:
    _, u = fx
    body = get(
        fx,
        "resources=VCPU:3,MEMORY_MB:512&resources1=VCPU:1,MEMORY_MB:1024&resources2=VCPU:2"
        "&group_policy=none",
    )
    for cn in ("cn_left", "cn_middle", "cn_right"):
        assert amounts(body, u[cn], "VCPU") == [6]
        assert amounts(body, u[cn], "MEMORY_MB") == [1536]


def test_forbidden_ssd_uses_the_other_shared_disk(fx: Any) -> None:
    _, u = fx
    body = get(
        fx, "resources1=VCPU:1&resources2=DISK_GB:100&required2=!CUSTOM_DISK_SSD&group_policy=none"
    )
    assert amounts(body, u["cn_left"], "VCPU") == [1, 1]
    assert amounts(body, u["shr_disk_2"], "DISK_GB") == [100, 100, 100]
    assert amounts(body, u["shr_disk_1"], "DISK_GB") == []


def test_many_groups_combine_on_compute_and_sharing_providers(fx: Any) -> None:
    _, u = fx
    body = get(
        fx,
        "resources1=VCPU:1&resources2=VGPU:1&required2=HW_GPU_API_DXVA"
        "&resources3=MEMORY_MB:1024&resources4=DISK_GB:100&required4=CUSTOM_DISK_SSD"
        "&resources5=DISK_GB:50&required5=!CUSTOM_DISK_SSD"
        "&resources6=SRIOV_NET_VF:1,CUSTOM_NET_MBPS:1000"
        "&resources7=SRIOV_NET_VF:2,CUSTOM_NET_MBPS:2000&group_policy=none",
    )
    assert amounts(body, u["cn_left"], "SRIOV_NET_VF") == [3, 3]
    assert amounts(body, u["cn_left"], "CUSTOM_NET_MBPS") == [3000, 3000]
    assert amounts(body, u["cn_left"], "DISK_GB") == [50]
    assert amounts(body, u["shr_disk_1"], "DISK_GB") == [100, 100]
    assert amounts(body, u["shr_disk_2"], "DISK_GB") == [50, 50]
    assert amounts(body, u["cn_right"], "DISK_GB") == [100]
    assert amounts(body, u["shr_net"], "SRIOV_NET_VF") == [3]
    assert amounts(body, u["shr_net"], "CUSTOM_NET_MBPS") == [3000]


def test_summed_groups_go_to_the_sharing_provider_when_the_compute_node_is_full(
    fx: Any,
) -> None:
    _, u = fx
    body = get(
        fx,
        "resources=VCPU:2,MEMORY_MB:2048,SRIOV_NET_VF:1,CUSTOM_NET_MBPS:2000"
        "&resources1=SRIOV_NET_VF:1,CUSTOM_NET_MBPS:3000",
    )
    assert body["allocation_requests"][0]["allocations"] == {
        u["cn_right"]: {"resources": {"VCPU": 2, "MEMORY_MB": 2048}},
        u["shr_net"]: {"resources": {"SRIOV_NET_VF": 2, "CUSTOM_NET_MBPS": 5000}},
    }
    body = get(fx, "resources=VGPU:1&resources1=VGPU:1&resources2=VGPU:1&group_policy=none")
    assert amounts(body, u["cn_left"], "VGPU") == [3]


def test_long_suffixes_at_1_33(fx: Any) -> None:
    _, u = fx
    body = get(
        fx,
        "resources_compute=VCPU:1&required_compute=!HW_CPU_X86_SSE&resources_disk=DISK_GB:100"
        "&required_disk=CUSTOM_DISK_SSD&member_of_disk=in:$AGGA,$AGGC&group_policy=none",
        (1, 33),
    )
    assert len(body["allocation_requests"]) == 2
    assert amounts(body, u["shr_disk_1"], "DISK_GB") == [100]
    assert len(body["provider_summaries"]) == 3
