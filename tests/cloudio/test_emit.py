"""The emitter alone: how nodes and provider trees become host entries."""

from __future__ import annotations

from berth.cloudio.emit import build_document, to_document
from berth.cloudio.state import CloudState, ComputeNode, Provider, Server

N1 = "0b8f9c3e-0000-4000-8000-00000000c001"
AGG = "0b8f9c3e-0000-4000-8000-00000000a001"
LONE_AGG = "0b8f9c3e-0000-4000-8000-00000000a002"


def _inv(total: int, **fields: float) -> dict[str, float]:
    return {"total": total, "reserved": 0, "min_unit": 1, "max_unit": total, "step_size": 1,
            "allocation_ratio": 1.0, **fields}


def _state() -> CloudState:
    state = CloudState(source="test")
    state.nodes = [ComputeNode("h1", "h1", N1, service={"up": True}),
                   ComputeNode("h2", "h2", None, capacity={"vcpus": 4, "memory_mb": 4096,
                                                           "local_gb": 40})]
    state.providers = [
        Provider(N1, "h1", None, N1, {"VCPU": _inv(16, allocation_ratio=4.0),
                                      "MEMORY_MB": _inv(65536, reserved=512),
                                      "DISK_GB": _inv(400), "PCPU": _inv(4)},
                 aggregates=[AGG], allocations={"i1": {"VCPU": 2, "MEMORY_MB": 2048},
                                                "i2": {"PCPU": 3}}),
        Provider("numa1", "h1_NUMA1", N1, N1, {"MEMORY_MB": _inv(32768)}),
        Provider("pf", "h1_NUMA1_pf0", "numa1", N1, {"SRIOV_NET_VF": _inv(8)},
                 traits=["CUSTOM_PHYSNET_A"]),
        Provider("nfs", "nfs", None, "nfs", {"DISK_GB": _inv(5000)},
                 traits=["MISC_SHARES_VIA_AGGREGATE"], aggregates=[AGG, LONE_AGG]),
    ]
    state.aggregates = [{"name": "rack1", "uuid": AGG, "hosts": ["h2"], "metadata": {}}]
    state.servers = [Server("i1", "h1", "h1")]
    return state


def test_a_tree_of_providers_becomes_nested_providers_each_after_its_parent() -> None:
    doc = build_document(_state())
    h1 = doc["hosts"][0]
    # Named as the loader names them: "<node>_NAME"; parent another entry, none for root.
    assert h1["providers"] == [
        {"name": "NUMA1", "resources": {"MEMORY_MB": {"total": 32768, "max_unit": 32768}}},
        {"name": "NUMA1_pf0", "parent": "NUMA1",
         "resources": {"SRIOV_NET_VF": {"total": 8, "max_unit": 8}},
         "traits": ["CUSTOM_PHYSNET_A"]}]
    # used = what consumers hold + reserved, pinned vCPUs counted as used vCPUs (as the
    # compute counts them); the dedicated CPUs are numbered after the 16 shared ones.
    assert (h1["vcpus"], h1["vcpus_used"], h1["cpu_allocation_ratio"]) == (16, 2 + 3, 4.0)
    assert (h1["memory_mb"], h1["memory_mb_used"]) == (65536, 2560)
    assert h1["cpu_dedicated_set"] == "16-19"
    assert h1["instances"] == [{"uuid": "i1"}]


def test_the_numa_topology_names_the_dedicated_cpus_when_it_holds_them_all() -> None:
    state = _state()
    state.nodes[0].fields["numa_topology"] = {"cells": [
        {"id": 0, "cpuset": [0, 1], "pcpuset": [2, 3]}, {"id": 1, "cpuset": [4], "pcpuset": [6, 7]}]}
    assert build_document(state)["hosts"][0]["cpu_dedicated_set"] == "2-3,6-7"


def test_a_placement_only_aggregate_and_disagreeing_mirrors_are_warned_about() -> None:
    state = _state()
    doc = build_document(state)
    assert doc["sharing_providers"] == [{
        "name": "nfs", "uuid": "nfs", "resources": {"DISK_GB": {"total": 5000, "max_unit": 5000}},
        "aggregates": ["rack1", f"placement-{LONE_AGG}"]}]
    assert {"name": f"placement-{LONE_AGG}", "uuid": LONE_AGG, "hosts": []} in doc["aggregates"]
    assert state.warnings == [
        "compute node h2 of host h2: no resource provider in placement; its size comes from "
        "the compute API",
        f"sharing provider nfs: placement aggregate {LONE_AGG} is no host aggregate; written "
        f"as aggregate placement-{LONE_AGG}",
        "aggregate rack1: placement's membership differs for compute nodes h1; the file "
        "follows the host aggregate",
    ]


def test_a_node_listed_twice_is_written_once() -> None:
    state = _state()
    state.nodes.append(ComputeNode("h1", "h1", N1))
    assert [h["host"] for h in to_document(state)["hosts"]] == ["h1", "h2"]
    assert "compute node h1 of host h1: listed twice; the second left out" in state.warnings
