"""Nova's object primitives both ways, against golden files a real Nova 34 wrote
(``scripts/nova-primitives.py`` in ``.venv-nova``; the boot RequestSpec and Selection
come from a real conductor and NovaObjectSerializer, reference §1.3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from berth.hardware.numa import NUMATopology, NUMATopologyLimits
from berth.hardware.pci import PciDeviceStats
from berth.model.request import NetworkMetadata
from berth.model.selection import Selection
from berth.nova import hoststate, primitives
from berth.nova.primitives import PrimitiveError

DATA = Path(__file__).resolve().parents[1] / "data" / "nova"


def golden(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def test_the_boot_request_spec_of_a_real_conductor() -> None:
    spec = primitives.request_spec_from_primitive(golden("request_spec_boot.json"))
    assert (spec.flavor.name, spec.flavor.vcpus, spec.flavor.memory_mb, spec.flavor.root_gb,
            spec.flavor.flavorid) == ("m1.tiny", 1, 512, 1, "1")
    assert spec.image is not None and spec.image.id == "155d900f-4e14-4e4c-a73d-069cbf4541e6"
    assert (spec.project_id, spec.user_id, spec.num_instances) == ("p1", "u1", 1)
    assert spec.instance_uuid == "f75b9e78-4289-4c7f-b3c4-548fe83634fd"
    assert spec.scheduler_hints == {} and spec.instance_group is None
    assert spec.requested_destination is None and spec.retry is None
    assert spec.numa_topology is None and len(spec.pci_requests.requests) == 0
    assert spec.requested_networks == [{"network_id": "none", "port_id": None,
                                        "device_profile": None}]


def test_everything_a_move_request_spec_carries() -> None:
    spec = primitives.request_spec_from_primitive(golden("request_spec_move.json"))
    assert spec.flavor.extra_specs == {"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2",
                                       "pci_passthrough:alias": "nic:1"}
    assert (spec.flavor.ephemeral_gb, spec.flavor.swap) == (5, 512)
    props = spec.image.properties  # type: ignore[union-attr]
    assert props.get("hw_architecture") == "x86_64" and props.get("hw_numa_nodes") == 2
    assert props.get("traits_required") == ["CUSTOM_GOLD"]
    group = spec.instance_group
    assert group is not None and (group.policy, group.rules, group.hosts) == (
        "anti-affinity", {"max_server_per_host": 2}, ["c1"])
    assert len(group.members) == 2
    dest = spec.requested_destination
    assert dest is not None and (dest.host, dest.node) == ("c2", "c2")
    assert dest.cell is not None and dest.cell.name == "cell1"
    assert dest.aggregates == ["agg-a,agg-b", "agg-c"] and dest.forbidden_aggregates == {"agg-x"}
    assert spec.retry is not None and spec.retry.num_attempts == 2
    assert [(h.host, h.hypervisor_hostname) for h in spec.retry.hosts] == [("c1", "c1")]
    assert spec.ignore_hosts == ["c9"] and spec.availability_zone == "az1"
    assert spec.get_scheduler_hint("_nova_check_type") == "resize"
    numa = spec.numa_topology
    assert [sorted(c.pcpuset) for c in numa.cells] == [[0, 1], [2, 3]]
    assert numa.cells[0].cpu_policy == "dedicated" and numa.cells[1].memory == 2048
    assert numa.emulator_threads_policy == "share"
    (pci,) = spec.pci_requests.requests
    assert (pci.count, pci.alias_name, pci.numa_policy) == (1, "nic", "preferred")
    assert pci.spec == [{"vendor_id": "8086", "product_id": "1520"}]
    (group_req,) = spec.requested_resources
    assert group_req.requester_id == "port-1"
    assert group_req.resources == {"NET_BW_EGR_KILOBIT_PER_SEC": 1000}
    assert group_req.required_traits == {"CUSTOM_PHYSNET_P1"}
    assert group_req.forbidden_traits == {"CUSTOM_SLOW"}
    assert group_req.aggregates == [["agg-a"]]
    params = spec.request_level_params
    assert params.root_required == {"HW_CPU_X86_AVX2"}
    assert params.root_forbidden == {"CUSTOM_OLD"} and params.same_subtree == [["port-1", "port-2"]]
    assert spec.network_metadata == NetworkMetadata(physnets={"p1"}, tunneled=True)


def test_a_selection_is_written_as_nova_serializes_it() -> None:
    """Berth's Selection primitive equals Nova's own for the same values (the order of
    ``nova_object.changes`` aside, which Nova's deserializer does not read)."""
    want = golden("selection_numa.json")
    data = want["nova_object.data"]
    numa_limits = data["limits"]["nova_object.data"]["numa_topology"]["nova_object.data"]
    selection = Selection(
        compute_node_uuid=data["compute_node_uuid"], service_host="c1", nodename="c1",
        cell_uuid=data["cell_uuid"], limits={"numa_topology": NUMATopologyLimits(
            cpu_allocation_ratio=4.0, ram_allocation_ratio=1.0,
            network_metadata=NetworkMetadata(physnets={"p1"}, tunneled=False))},
        allocation_request=data["allocation_request"], allocation_request_version="1.36",
        availability_zone="az1")
    got = primitives.selection_primitive(selection)

    def without_changes(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: without_changes(v) for k, v in value.items()
                    if k != "nova_object.changes"}
        if isinstance(value, list):
            return [without_changes(v) for v in value]
        return value

    assert without_changes(got) == without_changes(want)
    assert numa_limits["cpu_allocation_ratio"] == 4.0
    assert set(got["nova_object.changes"]) == set(want["nova_object.changes"])
    legacy = primitives.legacy_selection(selection)
    assert legacy["host"] == "c1" and legacy["limits"]["numa_topology"][
        "nova_object.name"] == "NUMATopologyLimits"


def test_a_compute_nodes_numa_and_pci_columns() -> None:
    numa = NUMATopology.from_dict(hoststate.numa_dict(
        json.dumps(golden("compute_node_numa_topology.json"))))
    assert [c.id for c in numa.cells] == [0, 1]
    cell = numa.cells[1]
    assert sorted(cell.cpuset) == [4, 5] and sorted(cell.pcpuset) == [6, 7]
    assert sorted(cell.pinned_cpus) == [6] and cell.socket == 1
    assert [(p.size_kb, p.total, p.used) for p in cell.mempages] == [(4, 1048576, 0),
                                                                     (2048, 512, 8)]
    pools = hoststate.pci_pools(json.dumps(golden("compute_node_pci_stats.json")))
    stats = PciDeviceStats.from_pools(pools, numa)
    assert stats.pools[0]["count"] == 4 and stats.pools[0]["physical_network"] == "p1"


@pytest.mark.parametrize(("value", "message"), [
    ({"nova_object.name": "Flavor", "nova_object.data": {}}, "expected a RequestSpec primitive, got a Flavor"),
    ({"nova_object.name": "RequestSpec", "nova_object.data": {}}, "spec_obj.flavor: missing"),
    ([], "expected a RequestSpec primitive, got list"),
])
def test_a_primitive_that_is_not_what_it_should_be_is_one_error(value: Any, message: str) -> None:
    with pytest.raises(PrimitiveError, match=message):
        primitives.request_spec_from_primitive(value)


def test_a_request_for_more_instances_than_any_cloud_runs_is_refused() -> None:
    """2**31 - 1 instances grew a scheduler by gigabytes under the lock every request
    waits for; a request is bounded (Nova's own bound is its quotas)."""
    spec = golden("request_spec_boot.json")
    spec["nova_object.data"]["num_instances"] = 2**31 - 1
    with pytest.raises(PrimitiveError, match=r"spec_obj.num_instances: at most 10000"):
        primitives.request_spec_from_primitive(spec)
    spec["nova_object.data"]["num_instances"] = 10_000
    assert primitives.request_spec_from_primitive(spec).num_instances == 10_000


def test_a_spec_without_a_user_claims_as_the_caller_and_placement_hears_its_request_id() -> None:
    """Nova's ``claim_resources`` takes the context's user when the spec has none (specs
    older than Rocky), and its report client sends the context's global request id to
    Placement with every call made for the request."""
    from berth.model.selection import Selection
    from berth.nova.rpc import NovaSchedulerEndpoint
    from berth.pipeline import Decision
    from berth.placement.client import GLOBAL_REQUEST_ID

    seen: list[tuple[Any, Any]] = []

    class Scheduler:
        def select_destinations(self, spec: Any, instance_uuids: Any = None,
                                **_: Any) -> Decision:
            seen.append((spec.user_id, GLOBAL_REQUEST_ID.get()))
            chosen = Selection("cn", "h", "n", "cell", {}, None, None, "nova")
            return Decision([[chosen]], list(instance_uuids or []), None, {})

    endpoint = NovaSchedulerEndpoint(Scheduler())  # type: ignore[arg-type]
    primitive = golden("request_spec_boot.json")
    del primitive["nova_object.data"]["user_id"]
    ctxt = {"user_id": "u-ctx", "request_id": "req-2", "global_request_id": "req-1"}
    endpoint.select_destinations(ctxt, spec_obj=primitive, instance_uuids=["i1"],
                                 return_objects=True)
    endpoint.select_destinations({"user": "u-old", "request_id": "req-3"},
                                 spec_obj=golden("request_spec_boot.json"),
                                 instance_uuids=["i2"], return_objects=True)
    assert seen == [("u-ctx", "req-1"), ("u1", "req-3")]
    assert GLOBAL_REQUEST_ID.get() is None  # not left behind for the thread's next call
