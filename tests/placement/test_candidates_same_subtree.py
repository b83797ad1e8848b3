"""The reference's NUMA / network scenario for same_subtree and resourceless groups (1.36).

Expected results are the ones Placement's own functional tests assert for this layout:

    ss1 (aggA, sharing, DISK_GB 2000)
    cn1 (aggA, COMPUTE_VOLUME_MULTI_ATTACH, no inventory)
      numa0 (HW_NUMA_ROOT; VCPU 4 with 2 used; MEMORY_MB 2048 min_unit 512 step 256)
        fpga0 (CUSTOM_FPGA 1)   pgpu0 (VGPU 8)
      numa1 (HW_NUMA_ROOT, CUSTOM_FOO; VCPU 4; MEMORY_MB 2048 min_unit 256 max_unit 1024)
        fpga1_0 (CUSTOM_FPGA 1) fpga1_1 (CUSTOM_FPGA 1)
      sriov_agent (CUSTOM_VNIC_TYPE_DIRECT)
        esn1 (CUSTOM_PHYSNET1, NET_BW_EGR 10000)  esn2 (CUSTOM_PHYSNET2, NET_BW_EGR 20000)
      ovs_agent (CUSTOM_VNIC_TYPE_NORMAL)
        br_int (CUSTOM_PHYSNET0, NET_BW_EGR 1000)
    cn2 (aggA, CUSTOM_FOO; VCPU 8 with 3 used; MEMORY_MB 2048 min_unit 1024 step 128;
         DISK_GB 1000)
      nic1 (CUSTOM_HW_NIC_ROOT): pf1_1 (PHYSNET1, VF 4), pf1_2 (PHYSNET2, VF 4)
      nic2 (CUSTOM_HW_NIC_ROOT): pf2_1..pf2_4 (PHYSNET1/2/1/2, VF 2 each)
      nic3 (CUSTOM_HW_NIC_ROOT): pf3_1 (PHYSNET1, VF 8)
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import pytest

from berth.placement.candidates import allocation_candidates
from berth.placement.candidates_builders import GraphBuilder, agg_uuid, inv
from berth.placement.candidates_graph import ProviderGraph
from berth.placement.errors import BadRequest

AGG_A = agg_uuid("A")


@pytest.fixture(scope="module")
def fx() -> tuple[ProviderGraph, dict[str, str]]:
    b = GraphBuilder()
    u: dict[str, str] = {}
    u["ss1"] = b.provider(
        "ss1", aggregates={AGG_A}, traits={"MISC_SHARES_VIA_AGGREGATE"}, DISK_GB=inv(2000)
    )
    u["cn1"] = b.provider("cn1", aggregates={AGG_A}, traits={"COMPUTE_VOLUME_MULTI_ATTACH"})
    u["numa0"] = b.provider(
        "numa0",
        parent=u["cn1"],
        traits={"HW_NUMA_ROOT"},
        used={"VCPU": 2},
        VCPU=inv(4),
        MEMORY_MB=inv(2048, min_unit=512, step_size=256),
    )
    u["numa1"] = b.provider(
        "numa1",
        parent=u["cn1"],
        traits={"HW_NUMA_ROOT", "CUSTOM_FOO"},
        VCPU=inv(4),
        MEMORY_MB=inv(2048, min_unit=256, max_unit=1024),
    )
    u["fpga0"] = b.provider("fpga0", parent=u["numa0"], CUSTOM_FPGA=inv(1))
    u["pgpu0"] = b.provider("pgpu0", parent=u["numa0"], VGPU=inv(8))
    for i in (0, 1):
        u[f"fpga1_{i}"] = b.provider(f"fpga1_{i}", parent=u["numa1"], CUSTOM_FPGA=inv(1))
    u["sriov_agent"] = b.provider(
        "sriov_agent", parent=u["cn1"], traits={"CUSTOM_VNIC_TYPE_DIRECT"}
    )
    for i in (1, 2):
        u[f"esn{i}"] = b.provider(
            f"esn{i}",
            parent=u["sriov_agent"],
            traits={f"CUSTOM_PHYSNET{i}"},
            NET_BW_EGR_KILOBIT_PER_SEC=inv(10000 * i),
        )
    u["ovs_agent"] = b.provider("ovs_agent", parent=u["cn1"], traits={"CUSTOM_VNIC_TYPE_NORMAL"})
    u["br_int"] = b.provider(
        "br_int",
        parent=u["ovs_agent"],
        traits={"CUSTOM_PHYSNET0"},
        NET_BW_EGR_KILOBIT_PER_SEC=inv(1000),
    )
    u["cn2"] = b.provider(
        "cn2",
        aggregates={AGG_A},
        traits={"CUSTOM_FOO"},
        used={"VCPU": 3},
        VCPU=inv(8),
        MEMORY_MB=inv(2048, min_unit=1024, step_size=128),
        DISK_GB=inv(1000),
    )
    for i in (1, 2, 3):
        u[f"nic{i}"] = b.provider(f"nic{i}", parent=u["cn2"], traits={"CUSTOM_HW_NIC_ROOT"})
    for i in (1, 2):
        u[f"pf1_{i}"] = b.provider(
            f"pf1_{i}", parent=u["nic1"], traits={f"CUSTOM_PHYSNET{i}"}, CUSTOM_VF=inv(4)
        )
    for i in range(4):
        u[f"pf2_{i + 1}"] = b.provider(
            f"pf2_{i + 1}",
            parent=u["nic2"],
            traits={f"CUSTOM_PHYSNET{i % 2 + 1}"},
            CUSTOM_VF=inv(2),
        )
    u["pf3_1"] = b.provider("pf3_1", parent=u["nic3"], traits={"CUSTOM_PHYSNET1"}, CUSTOM_VF=inv(8))
    return b.graph(extra_traits=["CUSTOM_PHYSNET0"]), u


def get(fx: Any, qs: str, mv: tuple[int, int] = (1, 36)) -> dict[str, Any]:
    graph, _ = fx
    qs = qs.replace("$AGGA", AGG_A)
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


PORTS = "resources=VCPU:1&required_NIC=CUSTOM_HW_NIC_ROOT"


@pytest.mark.parametrize(
    ("qs", "n_requests"),
    [
        ("resources_COMPUTE=VCPU:1&resources_ACCEL=CUSTOM_FPGA:1&group_policy=none", 6),
        (
            "resources_COMPUTE=VCPU:1&resources_ACCEL=CUSTOM_FPGA:1&same_subtree=_COMPUTE"
            "&group_policy=none",
            6,
        ),
        (
            "resources_COMPUTE=VCPU:1&resources_ACCEL=CUSTOM_FPGA:1"
            "&same_subtree=_COMPUTE,_ACCEL&group_policy=none",
            3,
        ),
        (
            "resources_COMPUTE1=VCPU:1&resources_COMPUTE2=MEMORY_MB:1024"
            "&same_subtree=_COMPUTE1,_COMPUTE2&group_policy=none",
            3,
        ),
        (
            "resources_COMPUTE1=VCPU:1&resources_COMPUTE2=MEMORY_MB:1024"
            "&same_subtree=_COMPUTE1,_COMPUTE2&group_policy=isolate",
            0,
        ),
        (
            "resources=VCPU:1&resources_PORT1=CUSTOM_VF:4&required_PORT1=CUSTOM_PHYSNET1"
            "&resources_PORT2=CUSTOM_VF:4&required_PORT2=CUSTOM_PHYSNET2&group_policy=none",
            2,
        ),
        (
            PORTS + "&resources_PORT1=CUSTOM_VF:4&required_PORT1=CUSTOM_PHYSNET1"
            "&resources_PORT2=CUSTOM_VF:4&required_PORT2=CUSTOM_PHYSNET2"
            "&same_subtree=_NIC,_PORT1,_PORT2&group_policy=none",
            1,
        ),
        (
            PORTS + "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
            "&resources_PORT2=CUSTOM_VF:2&required_PORT2=CUSTOM_PHYSNET2"
            "&same_subtree=_NIC,_PORT1,_PORT2&group_policy=none",
            5,
        ),
        (
            PORTS + "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
            "&resources_PORT2=CUSTOM_VF:2&required_PORT2=CUSTOM_PHYSNET2"
            "&same_subtree=_NIC,_PORT1,_PORT2&group_policy=isolate",
            5,
        ),
        (
            PORTS + "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
            "&resources_PORT2A=CUSTOM_VF:1&required_PORT2A=CUSTOM_PHYSNET2"
            "&resources_PORT2B=CUSTOM_VF:1&required_PORT2B=CUSTOM_PHYSNET2"
            "&same_subtree=_NIC,_PORT1,_PORT2A,_PORT2B&group_policy=none",
            9,
        ),
        (
            PORTS + "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
            "&resources_PORT2A=CUSTOM_VF:1&required_PORT2A=CUSTOM_PHYSNET2"
            "&resources_PORT2B=CUSTOM_VF:1&required_PORT2B=CUSTOM_PHYSNET2"
            "&same_subtree=_NIC,_PORT1,_PORT2A,_PORT2B&group_policy=isolate",
            4,
        ),
        (
            "resources_PORT1=CUSTOM_VF:8&required_PORT2=CUSTOM_PHYSNET1"
            "&same_subtree=_PORT1,_PORT2&group_policy=none",
            1,
        ),
        (
            "resources_PORT1=CUSTOM_VF:8&required_PORT2=CUSTOM_PHYSNET1"
            "&same_subtree=_PORT1,_PORT2&group_policy=isolate",
            0,
        ),
        (
            "resources_COMPUTE1=VCPU:1&required_COMPUTE2=CUSTOM_FOO&required_COMPUTE3=HW_NUMA_ROOT"
            "&same_subtree=_COMPUTE1,_COMPUTE2,_COMPUTE3&group_policy=none",
            1,
        ),
        (
            "resources_COMPUTE1=VCPU:1&required_COMPUTE2=CUSTOM_FOO&required_COMPUTE3=HW_NUMA_ROOT"
            "&same_subtree=_COMPUTE1,_COMPUTE2,_COMPUTE3&group_policy=isolate",
            0,
        ),
        (
            "required_NUMA=HW_NUMA_ROOT&resources_ACCEL1=CUSTOM_FPGA:1"
            "&resources_ACCEL2=CUSTOM_FPGA:1&same_subtree=_NUMA,_ACCEL1,_ACCEL2"
            "&group_policy=isolate",
            2,
        ),
        (
            "required_NUMA=HW_NUMA_ROOT&resources_ACCEL1=CUSTOM_FPGA:1"
            "&resources_ACCEL2=CUSTOM_FPGA:1&same_subtree=_NUMA,_ACCEL1,_ACCEL2,_NUMA,_ACCEL1"
            "&group_policy=isolate",
            2,
        ),
        (
            "required_NUMA=HW_NUMA_ROOT,!CUSTOM_FOO&resources_ACCEL1=CUSTOM_FPGA:1"
            "&resources_ACCEL2=CUSTOM_FPGA:1&same_subtree=_NUMA,_ACCEL1,_ACCEL2"
            "&group_policy=isolate",
            0,
        ),
        (
            "resources_COMPUTE=VCPU:1&required_NIC=CUSTOM_HW_NIC_ROOT"
            "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
            "&same_subtree=_NIC,_COMPUTE&same_subtree=_NIC,_PORT1&group_policy=none",
            4,
        ),
        (
            "resources_COMPUTE=VCPU:1&required_NIC=CUSTOM_HW_NIC_ROOT"
            "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
            "&same_subtree=_NIC,_COMPUTE,_PORT1&group_policy=none",
            12,
        ),
        (
            "required_MULTI_ATTACH=COMPUTE_VOLUME_MULTI_ATTACH"
            "&resources_BW=NET_BW_EGR_KILOBIT_PER_SEC:100&resources_COMPUTE=VCPU:4"
            "&same_subtree=_MULTI_ATTACH,_BW,_COMPUTE&group_policy=isolate",
            3,
        ),
    ],
    ids=[
        "no resourceless group and no same_subtree",
        "a same_subtree of one group changes nothing",
        "same_subtree of compute and accelerator",
        "same_subtree includes the provider itself",
        "same_subtree on one provider cannot be isolated",
        "resourceful ports without same_subtree",
        "resourceless NIC with 4 VFs per port",
        "resourceless NIC with 2 VFs per port",
        "resourceless NIC with 2 VFs per port isolated",
        "resourceless NIC with 2+1+1 VFs",
        "resourceless NIC with 2+1+1 VFs isolated",
        "resourceless group on the same provider",
        "resourceless group on the same provider isolated",
        "several resourceless groups on one provider",
        "several resourceless groups on one provider isolated",
        "resourceless NUMA with two FPGAs",
        "duplicate suffixes in same_subtree are squashed",
        "resourceless NUMA with a forbidden trait",
        "overlapping same_subtree parameters",
        "one combined same_subtree parameter",
        "same_subtree with an ancestry hole",
    ],
)
def test_same_subtree_counts(fx: Any, qs: str, n_requests: int) -> None:
    assert len(get(fx, qs)["allocation_requests"]) == n_requests


def test_resourceless_nic_groups_map_to_the_nic_and_its_pfs(fx: Any) -> None:
    _, u = fx
    body = get(
        fx,
        PORTS + "&resources_PORT1=CUSTOM_VF:4&required_PORT1=CUSTOM_PHYSNET1"
        "&resources_PORT2=CUSTOM_VF:4&required_PORT2=CUSTOM_PHYSNET2"
        "&same_subtree=_NIC,_PORT1,_PORT2&group_policy=none",
    )
    (req,) = body["allocation_requests"]
    assert req["allocations"] == {
        u["cn2"]: {"resources": {"VCPU": 1}},
        u["pf1_1"]: {"resources": {"CUSTOM_VF": 4}},
        u["pf1_2"]: {"resources": {"CUSTOM_VF": 4}},
    }
    assert req["mappings"] == {
        "": [u["cn2"]],
        "_NIC": [u["nic1"]],
        "_PORT1": [u["pf1_1"]],
        "_PORT2": [u["pf1_2"]],
    }


def test_two_same_subtree_parameters_pin_numa_and_network_resources(fx: Any) -> None:
    _, u = fx
    body = get(
        fx,
        "required_NUMA=HW_NUMA_ROOT&resources_COMPUTE=VCPU:2,MEMORY_MB:512"
        "&resources_FPGA=CUSTOM_FPGA:1&resources_GPU=VGPU:1"
        "&required_SRIOV=CUSTOM_VNIC_TYPE_DIRECT"
        "&resources_NET1=NET_BW_EGR_KILOBIT_PER_SEC:100&required_NET1=CUSTOM_PHYSNET1"
        "&resources_NET2=NET_BW_EGR_KILOBIT_PER_SEC:100&required_NET2=CUSTOM_PHYSNET2"
        "&same_subtree=_NUMA,_COMPUTE,_GPU,_FPGA&same_subtree=_SRIOV,_NET1,_NET2"
        "&group_policy=none",
    )
    (req,) = body["allocation_requests"]
    assert req["allocations"] == {
        u["numa0"]: {"resources": {"VCPU": 2, "MEMORY_MB": 512}},
        u["fpga0"]: {"resources": {"CUSTOM_FPGA": 1}},
        u["pgpu0"]: {"resources": {"VGPU": 1}},
        u["esn1"]: {"resources": {"NET_BW_EGR_KILOBIT_PER_SEC": 100}},
        u["esn2"]: {"resources": {"NET_BW_EGR_KILOBIT_PER_SEC": 100}},
    }
    assert req["mappings"] == {
        "_NUMA": [u["numa0"]],
        "_COMPUTE": [u["numa0"]],
        "_FPGA": [u["fpga0"]],
        "_GPU": [u["pgpu0"]],
        "_SRIOV": [u["sriov_agent"]],
        "_NET1": [u["esn1"]],
        "_NET2": [u["esn2"]],
    }


def test_overlapping_same_subtree_summaries_cover_the_whole_tree(fx: Any) -> None:
    _, u = fx
    body = get(
        fx,
        "resources_COMPUTE=VCPU:1&required_NIC=CUSTOM_HW_NIC_ROOT"
        "&resources_PORT1=CUSTOM_VF:2&required_PORT1=CUSTOM_PHYSNET1"
        "&same_subtree=_NIC,_COMPUTE&same_subtree=_NIC,_PORT1&group_policy=none",
    )
    assert len(body["provider_summaries"]) == 11
    assert [r["mappings"]["_COMPUTE"] for r in body["allocation_requests"]] == [[u["cn2"]]] * 4
    for pf in ("pf1_1", "pf3_1", "pf2_1", "pf2_3"):
        assert amounts(body, u[pf], "CUSTOM_VF") == [2]


@pytest.mark.parametrize(
    ("qs", "text", "code"),
    [
        (
            "resources1=VCPU:1&required2=COMPUTE_VOLUME_MULTI_ATTACH&group_policy=none",
            "Resourceless suffixed group request should be specified in `same_subtree` query param",
            "placement.query.bad_value",
        ),
        (
            "resources1=VCPU:1&member_of2=$AGGA&group_policy=none",
            "Resourceless suffixed group request should be specified in `same_subtree` query param",
            "placement.query.bad_value",
        ),
        (
            "member_of1=$AGGA&group_policy=none",
            "There must be at least one resources or resources[$S] parameter.",
            "placement.query.missing_value",
        ),
        (
            "resources_COMPUTE=VCPU:1&resources_ACCEL=CUSTOM_FPGA:1"
            "&same_subtree=COMPUTE,_ACCEL&group_policy=none",
            "Real suffixes should be specified in `same_subtree`:",
            "placement.query.bad_value",
        ),
        (
            "resources_COMPUTE=VCPU:1&resources_ACCEL=CUSTOM_FPGA:1"
            "&same_subtree=_COMPUTE,,_ACCEL&group_policy=none",
            "Empty string (unsuffixed group) can not be specified in `same_subtree`",
            "placement.query.bad_value",
        ),
    ],
    ids=[
        "resourceless traits without same_subtree",
        "resourceless aggregates without same_subtree",
        "resourceless groups only",
        "same_subtree suffix missing its underscore",
        "same_subtree with an empty suffix",
    ],
)
def test_same_subtree_errors(fx: Any, qs: str, text: str, code: str) -> None:
    with pytest.raises(BadRequest) as info:
        get(fx, qs)
    assert text in info.value.message
    assert info.value.code == code


BASE3 = "resources=VCPU:1,MEMORY_MB:1024,DISK_GB:100"


@pytest.mark.parametrize(
    ("qs", "n_requests"),
    [
        ("resources=VCPU:1&root_required=HW_NUMA_ROOT", 0),
        (BASE3 + "&root_required=MISC_SHARES_VIA_AGGREGATE", 0),
        (BASE3 + "&root_required=HW_NUMA_ROOT", 0),
        (BASE3 + "&root_required=HW_CPU_X86_AVX2", 0),
        ("resources=VCPU:1,MEMORY_MB:1024&root_required=COMPUTE_VOLUME_MULTI_ATTACH", 4),
        (
            "resources1=VCPU:1&resources2=MEMORY_MB:1024&group_policy=none"
            "&root_required=COMPUTE_VOLUME_MULTI_ATTACH",
            4,
        ),
        (
            "resources1=VCPU:1&resources2=MEMORY_MB:1024&group_policy=isolate"
            "&root_required=COMPUTE_VOLUME_MULTI_ATTACH",
            2,
        ),
        (BASE3 + "&root_required=COMPUTE_VOLUME_MULTI_ATTACH", 4),
        (
            "resources1=VCPU:1,MEMORY_MB:1024&resources2=DISK_GB:100&group_policy=none"
            "&root_required=COMPUTE_VOLUME_MULTI_ATTACH",
            2,
        ),
        ("resources=VCPU:1,DISK_GB:100&required=CUSTOM_FOO", 3),
        ("resources=VCPU:1,DISK_GB:100&root_required=CUSTOM_FOO", 2),
        (
            "resources1=VCPU:1&required1=CUSTOM_FOO&resources2=DISK_GB:100&group_policy=none",
            3,
        ),
        (
            "resources1=VCPU:1&resources2=DISK_GB:100&group_policy=none&root_required=CUSTOM_FOO",
            2,
        ),
        ("resources=VCPU:3&root_required=!HW_NUMA_ROOT", 2),
        (BASE3 + "&root_required=!MISC_SHARES_VIA_AGGREGATE", 6),
        (BASE3 + "&root_required=CUSTOM_FOO,!HW_NUMA_ROOT", 2),
        (BASE3 + "&root_required=CUSTOM_FOO,!COMPUTE_VOLUME_MULTI_ATTACH", 2),
        (BASE3 + "&root_required=!CUSTOM_FOO,!COMPUTE_VOLUME_MULTI_ATTACH", 0),
        (
            "resources1=VCPU:1,MEMORY_MB:1024&resources2=DISK_GB:100&group_policy=none"
            "&root_required=!CUSTOM_FOO",
            2,
        ),
        ("resources=VCPU:1&required=CUSTOM_FOO&root_required=CUSTOM_FOO", 1),
        ("resources1=VCPU:1&required1=CUSTOM_FOO&root_required=CUSTOM_FOO", 1),
        ("resources1=VCPU:1&required1=CUSTOM_FOO&root_required=!CUSTOM_FOO", 1),
        ("resources1=VCPU:1&required1=!CUSTOM_FOO&root_required=CUSTOM_FOO", 0),
    ],
    ids=[
        "a root trait only children have",
        "a root trait only the sharing root has",
        "a root trait on children with sharing",
        "a root trait nobody has",
        "multiattach roots, unsuffixed, no sharing",
        "multiattach roots, granular not isolated",
        "multiattach roots, granular isolated",
        "multiattach roots, unsuffixed with sharing",
        "multiattach roots, granular with sharing",
        "unsuffixed required trait on a root and on a child",
        "unsuffixed root_required trait on one root",
        "granular required trait on a root and on a child",
        "granular root_required trait on one root",
        "a forbidden root trait only children have",
        "a forbidden root trait only the sharing root has",
        "required root trait with an irrelevant forbidden one",
        "redundant required and forbidden root traits",
        "forbidden root traits cancel each other",
        "forbidden root trait with granular sharing",
        "unsuffixed required and root_required of one trait",
        "granular required and root_required of one trait",
        "required trait forbidden on the root",
        "forbidden trait required on the root",
    ],
)
def test_root_required_counts(fx: Any, qs: str, n_requests: int) -> None:
    assert len(get(fx, qs, (1, 35))["allocation_requests"]) == n_requests


def test_root_required_keeps_the_sharing_disk_and_summaries(fx: Any) -> None:
    _, u = fx
    body = get(fx, BASE3 + "&root_required=!MISC_SHARES_VIA_AGGREGATE", (1, 35))
    assert amounts(body, u["ss1"], "DISK_GB") == [100] * 5
    body = get(fx, BASE3 + "&root_required=COMPUTE_VOLUME_MULTI_ATTACH", (1, 35))
    # In Placement's storage order: standard traits first, then custom ones as created.
    assert body["provider_summaries"][u["numa1"]]["traits"] == ["HW_NUMA_ROOT", "CUSTOM_FOO"]
    body = get(
        fx,
        "resources1=VCPU:1&resources2=MEMORY_MB:1024&group_policy=none"
        "&root_required=COMPUTE_VOLUME_MULTI_ATTACH",
        (1, 35),
    )
    assert body["provider_summaries"][u["numa0"]]["resources"]["VCPU"]["capacity"] == 4
    assert body["provider_summaries"][u["numa1"]]["resources"]["MEMORY_MB"]["capacity"] == 2048


@pytest.mark.parametrize(
    ("qs", "mv", "n_requests", "n_summaries", "mapping_sizes"),
    [
        ("resources=VCPU:1", (1, 34), 3, 23, {"": 1}),
        ("resources=VCPU:1", (1, 33), 3, 23, None),
        (
            "resources_LEFT=VCPU:1&resources_RIGHT=VCPU:1&group_policy=isolate",
            (1, 34),
            2,
            12,
            {"_LEFT": 1, "_RIGHT": 1},
        ),
        (
            "required_NET1=CUSTOM_PHYSNET1&resources_NET1=NET_BW_EGR_KILOBIT_PER_SEC:10"
            "&required_NET2=CUSTOM_PHYSNET2&resources_NET2=NET_BW_EGR_KILOBIT_PER_SEC:20"
            "&resources=VCPU:1&group_policy=isolate",
            (1, 34),
            2,
            12,
            {"": 1, "_NET1": 1, "_NET2": 1},
        ),
        (
            "resources_BWA=NET_BW_EGR_KILOBIT_PER_SEC:10&required_BWA=CUSTOM_PHYSNET1"
            "&resources_BWB=NET_BW_EGR_KILOBIT_PER_SEC:20&required_BWB=CUSTOM_PHYSNET1"
            "&group_policy=none",
            (1, 34),
            1,
            12,
            {"_BWA": 1, "_BWB": 1},
        ),
        (
            "required_NET1=CUSTOM_PHYSNET1&resources_NET1=NET_BW_EGR_KILOBIT_PER_SEC:10"
            "&required_NET2=CUSTOM_PHYSNET2&resources_NET2=NET_BW_EGR_KILOBIT_PER_SEC:20"
            "&resources_COMPUTE=VCPU:1,MEMORY_MB:1024&group_policy=isolate",
            (1, 34),
            2,
            12,
            {"_COMPUTE": 1, "_NET1": 1, "_NET2": 1},
        ),
    ],
    ids=[
        "simple mapping of the unsuffixed group",
        "no mappings at 1.33",
        "isolated granular mappings",
        "granular plus unsuffixed mappings",
        "two groups consolidated on one provider both map to it",
        "a provider giving two classes to one group is mapped once",
    ],
)
def test_reference_mappings_on_nested_providers(
    fx: Any,
    qs: str,
    mv: tuple[int, int],
    n_requests: int,
    n_summaries: int,
    mapping_sizes: dict[str, int] | None,
) -> None:
    _, u = fx
    body = get(fx, qs, mv)
    assert len(body["allocation_requests"]) == n_requests
    assert len(body["provider_summaries"]) == n_summaries
    for req in body["allocation_requests"]:
        if mapping_sizes is None:
            assert set(req) == {"allocations"}
        else:
            assert {s: len(ps) for s, ps in req["mappings"].items()} == mapping_sizes
            for suffix in ("_NET1", "_BWA", "_BWB"):
                if suffix in req["mappings"]:
                    assert req["mappings"][suffix] == [u["esn1"]]
            if "_NET2" in req["mappings"]:
                assert req["mappings"]["_NET2"] == [u["esn2"]]


def test_same_subtree_suffixes_are_stripped_of_whitespace_as_placement_does(fx: Any) -> None:
    qs = "resources_COMPUTE=VCPU:1&resources_ACCEL=CUSTOM_FPGA:1&group_policy=none"
    tight = get(fx, qs + "&same_subtree=_COMPUTE,_ACCEL")
    spaced = get(fx, qs + "&same_subtree= _COMPUTE , _ACCEL")
    assert len(spaced["allocation_requests"]) == 3
    assert spaced == tight


def test_summary_traits_are_in_the_stores_order_not_sorted() -> None:
    from berth.placement.candidates_graph import Inventory, Provider, ProviderGraph, ordered_traits

    inv = {"VCPU": Inventory(resource_class="VCPU", total=4, reserved=0, min_unit=1, max_unit=4,
                             step_size=1,
                             allocation_ratio=1.0)}
    provider = Provider(uuid="rp", name="rp", generation=0, parent_uuid=None, root_uuid="rp",
                        inventories=inv,
                        usages={}, traits=frozenset({"CUSTOM_B", "HW_CPU_X86_AVX", "CUSTOM_A"}),
                        aggregates=frozenset())
    graph = ProviderGraph([provider], ["HW_CPU_X86_AVX", "CUSTOM_B", "CUSTOM_A"], ["VCPU"])
    # Standard traits first, then custom ones in the order they were created.
    assert ordered_traits(graph, provider.traits) == ["HW_CPU_X86_AVX", "CUSTOM_B", "CUSTOM_A"]
