"""A compute agent claims its instances' NUMA cells and PCI devices (Nova's resource
tracker): what one boot took is not offered to the next request, a delete gives it
back, a move holds the source's until confirmed, and a build whose devices no longer
fit fails and is rescheduled."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth.config import SchedulerConfig
from berth.errors import NoValidHost
from berth.hardware.numa import NUMATopology
from berth.hardware.pci import PciDeviceStats
from berth.model.request import Flavor, RequestSpec
from berth.moves import MoveRequest
from berth.service.compute import DeviceClaimFailed
from berth.service.conductor import FakeDriver
from berth.service.moves import MoveService
from berth.service.stack import Stack

from .builders import node
from .conftest import fresh_stack

ALIAS = json.dumps({"name": "gpu", "vendor_id": "10de", "product_id": "1db4",
                    "device_type": "type-PCI", "live_migratable": "true"})
GPU = Flavor(name="gpu", vcpus=1, memory_mb=1024, root_gb=1, id=1,
             extra_specs={"pci_passthrough:alias": "gpu:1"})
BIG_CELL = Flavor(name="cell", vcpus=2, memory_mb=10240, root_gb=1, id=2,
                  extra_specs={"hw:numa_nodes": "1"})


def _numa() -> NUMATopology:
    return NUMATopology.from_dict({"cells": [
        {"id": 0, "memory": 16384, "cpuset": "0-7"}, {"id": 1, "memory": 16384, "cpuset": "8-15"}]})


def _pools(count: int) -> PciDeviceStats:
    return PciDeviceStats.from_pools([{"vendor_id": "10de", "product_id": "1db4",
                                       "numa_node": 0, "count": count,
                                       "live_migratable": "true"}], _numa())


@pytest.fixture
def devices(template_db: Path, tmp_path: Path) -> Iterator[Stack]:
    """d1 and d2: two NUMA cells of 16 GiB and 2 GPUs each; plain: neither (and the
    most memory, so the weighers prefer it when they may)."""
    config = SchedulerConfig.from_dict({
        "pci": {"alias": [ALIAS]},
        "filter_scheduler": {"enabled_filters": ["ComputeFilter", "PciPassthroughFilter",
                                                 "NUMATopologyFilter"],
                             "weight_classes": ["RAMWeigher"]}})
    stack = fresh_stack(template_db, tmp_path, config)
    stack.register_hosts([
        node("d1", vcpus=16, memory_mb=32768, numa_topology=_numa(), pci_stats=_pools(2)),
        node("d2", vcpus=16, memory_mb=33792, numa_topology=_numa(), pci_stats=_pools(2)),
        node("plain", vcpus=16, memory_mb=65536)])
    yield stack
    stack.close()


def _moves(stack: Stack, driver: FakeDriver | None = None) -> MoveService:
    service = stack.scheduler(seed=1)
    return stack.moves(stack.conductor(service, driver or FakeDriver(agents=stack.agents)))


def _boot(moves: MoveService, flavor: Flavor) -> tuple[str, str]:
    from berth.hardware.numa import prepare_request

    spec = RequestSpec(flavor=flavor)
    prepare_request(spec, moves.scheduler.config)
    (built,) = moves.conductor.build_instances(spec)
    return built.instance_uuid, built.host


def _free_gpus(stack: Stack, host: str) -> int:
    pci = stack.agents[host].host_record(0).pci_stats
    return pci.free_count() if pci is not None else 0


def test_gpus_taken_by_one_boot_are_not_offered_to_the_next(devices: Stack) -> None:
    moves = _moves(devices)
    booted = [_boot(moves, GPU) for _ in range(4)]
    assert sorted(host for _, host in booted) == ["d1", "d1", "d2", "d2"]
    assert (_free_gpus(devices, "d1"), _free_gpus(devices, "d2")) == (0, 0)
    with pytest.raises(NoValidHost):
        _boot(moves, GPU)
    # A delete gives the device back.
    moves.delete(booted[0][0])
    assert _free_gpus(devices, booted[0][1]) == 1
    assert _boot(moves, GPU)[1] == booted[0][1]


def test_numa_cells_filled_by_earlier_boots_refuse_the_next(devices: Stack) -> None:
    moves = _moves(devices)
    hosts = sorted(_boot(moves, BIG_CELL)[1] for _ in range(4))  # one 10 GiB guest a cell
    assert hosts == ["d1", "d1", "d2", "d2"]
    used = [c.memory_usage for c in devices.agents["d1"].host_record(0).numa_topology.cells]
    assert used == [10240, 10240]
    with pytest.raises(NoValidHost):
        _boot(moves, BIG_CELL)


def test_a_live_migration_moves_the_device_claim_with_the_instance(devices: Stack) -> None:
    moves = _moves(devices)
    uuid, source = _boot(moves, GPU)
    answer = moves.move(uuid, MoveRequest("live-migrate"))
    dest = answer["host"]
    assert dest != source and dest in ("d1", "d2")
    assert (_free_gpus(devices, source), _free_gpus(devices, dest)) == (2, 1)


def test_a_migration_holds_the_source_s_device_until_confirmed(devices: Stack) -> None:
    moves = _moves(devices)
    uuid, source = _boot(moves, GPU)
    dest = moves.move(uuid, MoveRequest("migrate"))["host"]
    assert (_free_gpus(devices, source), _free_gpus(devices, dest)) == (1, 1)
    moves.confirm(uuid)
    assert (_free_gpus(devices, source), _free_gpus(devices, dest)) == (2, 1)


def test_devices_that_no_longer_fit_at_the_compute_fail_the_build(devices: Stack) -> None:
    """The scheduler decided on a report that no longer holds (another scheduler's
    boot took the devices first): the agent's claim fails, the build is rescheduled."""
    from berth.hardware.pci import InstancePCIRequest

    agent = devices.agents["d1"]
    request = [InstancePCIRequest(count=3, spec=[{"vendor_id": "10de", "product_id": "1db4"}],
                                  alias_name="gpu")]
    with pytest.raises(DeviceClaimFailed, match="cannot be served"):
        agent.spawn("i-x", GPU, pci_requests=request)
    assert "i-x" not in agent.host_record(0).instances
    assert _free_gpus(devices, "d1") == 2


def test_a_restarted_agent_claims_its_instances_devices_again(
        template_db: Path, tmp_path: Path) -> None:
    """The node's stored record keeps each instance's claims: after a restart the
    devices stay taken, and a delete then gives them back."""
    from .builders import reopen

    config = SchedulerConfig.from_dict({"pci": {"alias": [ALIAS]}})
    first = fresh_stack(template_db, tmp_path, config)
    spec = [node("d1", vcpus=16, memory_mb=32768, numa_topology=_numa(), pci_stats=_pools(2))]
    try:
        first.register_hosts(spec)
        moves = _moves(first)
        uuid, _ = _boot(moves, GPU)
        cell, _ = _boot(moves, BIG_CELL)
        assert _free_gpus(first, "d1") == 1
        again = reopen(first, config)
    finally:
        first.close()
    try:
        again.register_hosts(spec)
        assert _free_gpus(again, "d1") == 1
        record = again.agents["d1"].host_record(0)
        assert sum(c.memory_usage for c in record.numa_topology.cells) == 10240
        _moves(again).delete(uuid)
        assert _free_gpus(again, "d1") == 2
    finally:
        again.close()
