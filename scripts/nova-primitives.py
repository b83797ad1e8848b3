"""Write the golden primitives of ``tests/data/nova/`` from Nova's own objects.

Run in an environment where Nova is installed (``make nova-env``)::

    .venv-nova/bin/python scripts/nova-primitives.py tests/data/nova

Berth never imports Nova; this script runs beside it, as the conductor would, and
serializes real objects the way the RPC layer does (``NovaObjectSerializer``), so the
conversion tests read exactly what a Nova 34 deployment sends and expects back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nova.objects import base

from nova import objects

objects.register_all()

CELL = "3b1a7c2e-0d4f-4a5b-8c6d-7e8f9a0b1c2d"
NODE = "8f6e0a3c-6b4e-4b8e-9b8e-1c2d3e4f5a6b"
GROUP = "0c3e3a55-8b5c-4a5e-9b9e-2f2e7f7f0a01"
MEMBER = "0c3e3a55-8b5c-4a5e-9b9e-2f2e7f7f0a02"
INSTANCE = "0c3e3a55-8b5c-4a5e-9b9e-2f2e7f7f0a03"


def serialize(obj: object) -> object:
    return base.NovaObjectSerializer().serialize_entity(None, obj)


def move_spec() -> objects.RequestSpec:
    """Everything a RequestSpec can carry: a pinned, NUMA, PCI, grouped, retried move."""
    flavor = objects.Flavor(
        id=3, name="pinned", memory_mb=4096, vcpus=4, root_gb=20, ephemeral_gb=5, swap=512,
        flavorid="p4", rxtx_factor=1.0, vcpu_weight=0, disabled=False, is_public=True,
        extra_specs={"hw:cpu_policy": "dedicated", "hw:numa_nodes": "2",
                     "pci_passthrough:alias": "nic:1"}, description=None)
    image = objects.ImageMeta.from_dict({
        "id": "155d900f-4e14-4e4c-a73d-069cbf4541e6", "name": "cirros", "disk_format": "raw",
        "container_format": "bare", "min_ram": 0, "min_disk": 0, "status": "active",
        "properties": {"hw_architecture": "x86_64", "hw_numa_nodes": "2",
                       "img_hv_type": "kvm", "trait:CUSTOM_GOLD": "required"}})
    group = objects.InstanceGroup(
        uuid=GROUP, name="web", policy="anti-affinity", rules={"max_server_per_host": 2},
        members=[MEMBER, INSTANCE], hosts=["c1"], project_id="p1", user_id="u1")
    cells = [objects.InstanceNUMACell(id=i, cpuset=set(), pcpuset={2 * i, 2 * i + 1},
                                      memory=2048, cpu_policy="dedicated")
             for i in range(2)]
    return objects.RequestSpec(
        id=7, project_id="p1", user_id="u1", availability_zone="az1", flavor=flavor,
        image=image, num_instances=1, instance_uuid=INSTANCE,
        ignore_hosts=["c9"], force_hosts=None, force_nodes=None,
        requested_destination=objects.Destination(
            host="c2", node="c2", cell=objects.CellMapping(
                uuid=CELL, name="cell1", disabled=False, transport_url="none:///",
                database_connection="none:///"),
            aggregates=["agg-a,agg-b", "agg-c"], forbidden_aggregates={"agg-x"},
            allow_cross_cell_move=False),
        retry=objects.SchedulerRetries(num_attempts=2, hosts=objects.ComputeNodeList(
            objects=[objects.ComputeNode(host="c1", hypervisor_hostname="c1")])),
        limits=objects.SchedulerLimits(), instance_group=group,
        scheduler_hints={"group": [GROUP], "different_host": [MEMBER],
                         "_nova_check_type": ["resize"]},
        numa_topology=objects.InstanceNUMATopology(cells=cells,
                                                   emulator_threads_policy="share"),
        pci_requests=objects.InstancePCIRequests(requests=[objects.InstancePCIRequest(
            count=1, spec=[{"vendor_id": "8086", "product_id": "1520"}], alias_name="nic",
            numa_policy="preferred", request_id=None)]),
        requested_resources=[objects.RequestGroup(
            requester_id="port-1", resources={"NET_BW_EGR_KILOBIT_PER_SEC": 1000},
            required_traits={"CUSTOM_PHYSNET_P1"}, forbidden_traits={"CUSTOM_SLOW"},
            aggregates=[["agg-a"]], use_same_provider=True, provider_uuids=[])],
        request_level_params=objects.RequestLevelParams(
            root_required={"HW_CPU_X86_AVX2"}, root_forbidden={"CUSTOM_OLD"},
            same_subtree=[["port-1", "port-2"]]),
        network_metadata=objects.NetworkMetadata(physnets={"p1"}, tunneled=True),
        is_bfv=False,
        security_groups=objects.SecurityGroupList(
            objects=[objects.SecurityGroup(name="default")]))


def selection() -> objects.Selection:
    limits = objects.SchedulerLimits(
        numa_topology=objects.NUMATopologyLimits(
            cpu_allocation_ratio=4.0, ram_allocation_ratio=1.0,
            network_metadata=objects.NetworkMetadata(physnets={"p1"}, tunneled=False)),
        vcpu=None, disk_gb=None, memory_mb=None)
    request = json.dumps({"allocations": {NODE: {"resources": {
        "VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}}, "mappings": {"": [NODE]}})
    return objects.Selection(compute_node_uuid=NODE, service_host="c1", nodename="c1",
                             cell_uuid=CELL, limits=limits, allocation_request=request,
                             allocation_request_version="1.36", availability_zone="az1")


def host_numa() -> str:
    pages = [objects.NUMAPagesTopology(size_kb=4, total=1048576, used=0, reserved=0),
             objects.NUMAPagesTopology(size_kb=2048, total=512, used=8, reserved=0)]
    cells = [objects.NUMACell(
        id=i, cpuset={4 * i, 4 * i + 1}, pcpuset={4 * i + 2, 4 * i + 3}, memory=8192,
        cpu_usage=1, memory_usage=512, pinned_cpus={4 * i + 2} if i else set(),
        siblings=[{4 * i, 4 * i + 1}, {4 * i + 2, 4 * i + 3}], mempages=pages,
        network_metadata=objects.NetworkMetadata(physnets={"p1"}, tunneled=False), socket=i)
        for i in range(2)]
    return objects.NUMATopology(cells=cells)._to_json()


def pci_stats() -> str:
    from oslo_serialization import jsonutils

    pools = objects.PciDevicePoolList(objects=[objects.PciDevicePool(
        product_id="1520", vendor_id="8086", numa_node=1,
        tags={"dev_type": "type-VF", "physical_network": "p1"}, count=4)])
    return jsonutils.dumps(pools.obj_to_primitive())


def main(out: str) -> int:
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    files = {
        "request_spec_move.json": serialize(move_spec()),
        "selection_numa.json": serialize(selection()),
        "compute_node_numa_topology.json": json.loads(host_numa()),
        "compute_node_pci_stats.json": json.loads(pci_stats()),
    }
    for name, value in files.items():
        (target / name).write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
        print(f"wrote {target / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
