"""A stack re-creates the agents of the hosts an earlier run stored."""

from __future__ import annotations

from typing import Any

import pytest

from berth.config import SchedulerConfig
from berth.model.aggregate import Aggregate
from berth.model.request import Flavor
from berth.service.records import SnapshotFeed
from berth.service.stack import Stack

from .builders import node, reopen

SMALL = Flavor(name="small", vcpus=2, memory_mb=1024, root_gb=10, id=7)


@pytest.mark.parametrize("remote", [False, True], ids=["store in process", "placement API"])
def test_stored_hosts_get_agents_that_report_what_they_reported_before(
        first: Stack, remote: bool) -> None:
    """What placement holds of each provider (traits, PCPU, custom classes) is read from
    the store's provider graph in one go, or through the API when placement is another
    service; either way the agents come back as they were."""
    agg = Aggregate(1, "a", uuid="11111111-2222-3333-4444-555555555555", hosts=("h1",))
    fast = node("h1", traits=["CUSTOM_FAST"], pcpus=2, stats={"rack": "r7"})
    fast.resources = {"CUSTOM_GPU": {"total": 4, "reserved": 0, "min_unit": 1, "max_unit": 2,
                                     "step_size": 1, "allocation_ratio": 1.0}}
    h1, h2 = first.register_hosts([fast, node("h2")], [agg])
    first.client.put_allocations("00000000-0000-4000-8000-00000000000a",
                                 {h1.uuid: {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 10}},
                                 project_id="p", user_id="u", consumer_generation=None)
    h1.spawn("00000000-0000-4000-8000-00000000000a", SMALL, "p")
    h2.set_disabled(True, "maintenance")
    before = {r["host"]: r for r in first.records.reports()}
    again = reopen(first)
    again.remote_placement = remote
    try:
        resumed = again.resume_agents()
        assert sorted(a.node.host for a in resumed) == ["h1", "h2"]
        assert again.agents["h1"].node.resources == fast.resources
        after = {r["host"]: r for r in again.records.reports()}
        for host in ("h1", "h2"):
            for field in ("vcpus_used", "free_ram_mb", "free_disk_mb", "stats", "instances",
                          "cpu_info", "supported_instances"):
                assert after[host][field] == before[host][field], (host, field)
            assert after[host]["service"]["disabled"] == before[host]["service"]["disabled"]
        assert again.agents["h2"].disabled_reason == "maintenance"
        assert sorted(again.client.get_provider_traits(h1.uuid)[1]) == ["CUSTOM_FAST"]
        assert again.client.get_inventories(h1.uuid)[1]["PCPU"]["total"] == 2
        assert again.client.get_aggregates(h1.uuid)[1] == [agg.uuid]
        assert not any(a.silent for a in resumed)
        # Heartbeats are fresh again: the time the system was stopped does not count.
        assert after["h1"]["service"]["last_seen_up"] >= before["h1"]["service"]["last_seen_up"]
    finally:
        again.close()


def test_a_host_that_was_down_when_the_system_stopped_stays_down(first: Stack) -> None:
    up, down = first.register_hosts([node("up"), node("down")])
    stale = up.clock() - 3600
    down.report(now=stale)
    again = reopen(first)
    try:
        again.resume_agents()
        assert again.agents["down"].silent and not again.agents["up"].silent
        snap = SnapshotFeed(again.records).refresh()
        row = snap.row_of("down")
        assert row is not None and snap.num("service_heartbeat")[row] == stale
    finally:
        again.close()


def test_hosts_that_already_have_an_agent_are_not_resumed(first: Stack) -> None:
    first.register_hosts([node("h1"), node("h2")])
    again = reopen(first)
    try:
        again.register_hosts([node("h1")])
        assert [a.node.host for a in again.resume_agents()] == ["h2"]
        assert again.resume_agents() == []
    finally:
        again.close()


def test_each_node_of_a_multi_node_host_keeps_its_own_agent_across_a_restart(
        first: Stack) -> None:
    a, b = first.register_hosts([node("ironic1", nodename="node-a"),
                                 node("ironic1", nodename="node-b")])
    assert first.agents == {"ironic1/node-a": a, "ironic1/node-b": b}
    first.client.put_allocations("00000000-0000-4000-8000-00000000000b",
                                 {b.uuid: {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 10}},
                                 project_id="p", user_id="u", consumer_generation=None)
    b.spawn("00000000-0000-4000-8000-00000000000b", SMALL, "p")
    again = reopen(first)
    try:
        resumed = again.resume_agents()
        assert sorted(again.agents) == ["ironic1/node-a", "ironic1/node-b"]
        assert len(resumed) == 2
        snap = SnapshotFeed(again.records).refresh()
        assert [snap.num("num_instances")[snap.row_of("ironic1", n)] for n in
                ("node-a", "node-b")] == [0, 1]
    finally:
        again.close()


def test_a_restart_writes_to_placement_only_what_differs(first: Stack) -> None:
    """Placement is read before the agents register again: an unchanged provider gets
    no write (its generation stays), a changed setting rewrites the inventories it
    changes, and an aggregate membership placement lost is written back."""
    agg = Aggregate(1, "a", uuid="11111111-2222-3333-4444-555555555555", hosts=("h1",))
    h1, h2 = first.register_hosts([node("h1", traits=["CUSTOM_FAST"]), node("h2")], [agg])
    generations = {a.uuid: first.client.get_provider(a.uuid).generation for a in (h1, h2)}
    again = reopen(first)
    try:
        again.resume_agents()
        assert {u: again.client.get_provider(u).generation for u in generations} == generations
    finally:
        again.close()

    gen = first.client.get_provider(h1.uuid).generation
    first.client.set_aggregates(h1.uuid, gen, [])  # placement lost the membership
    config = SchedulerConfig.from_dict({
        "DEFAULT": {"reserved_host_memory_mb": 1024},
        "filter_scheduler": {"available_filters": ["berth.filters.compute.ComputeFilter"],
                             "enabled_filters": ["ComputeFilter"]}})
    again = reopen(first, config)
    try:
        again.resume_agents()
        for uuid in (h1.uuid, h2.uuid):
            assert again.client.get_inventories(uuid)[1]["MEMORY_MB"]["reserved"] == 1024
        assert again.client.get_aggregates(h1.uuid)[1] == [agg.uuid]
        assert again.client.get_aggregates(h2.uuid)[1] == []
        assert sorted(again.client.get_provider_traits(h1.uuid)[1]) == ["CUSTOM_FAST"]
    finally:
        again.close()


class _RacedOnce:
    """An agent's client whose first provider read races with another writer: the
    provider's inventories change right after its generation was read."""

    def __init__(self, client: Any, real: Any) -> None:
        self.client, self.real, self.raced = client, real, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def get_provider(self, uuid: str) -> Any:
        provider = self.client.get_provider(uuid)
        if not self.raced:
            self.raced = True
            _, inventory = self.real.get_inventories(uuid)
            inventory["MEMORY_MB"] = {**inventory["MEMORY_MB"], "reserved": 1}
            self.real.set_inventories(uuid, provider.generation, inventory)
        return provider


def test_a_restart_that_races_with_another_writer_writes_everything(first: Stack) -> None:
    """What a restart read is stale once a write conflicts: the retry writes the
    node's whole state, not only what differed from the stale reading."""
    agg = Aggregate(1, "a", uuid="11111111-2222-3333-4444-555555555555", hosts=("h1",))
    (h1,) = first.register_hosts([node("h1")], [agg])
    memory = first.client.get_inventories(h1.uuid)[1]["MEMORY_MB"]["reserved"]
    first.client.set_aggregates(h1.uuid, first.client.get_provider(h1.uuid).generation, [])
    again = reopen(first)
    try:
        again.agent_client = _RacedOnce(again.agent_client or again.client, again.client)
        again.resume_agents()
        assert again.agent_client.raced
        assert again.client.get_inventories(h1.uuid)[1]["MEMORY_MB"]["reserved"] == memory != 1
        assert again.client.get_aggregates(h1.uuid)[1] == [agg.uuid]
    finally:
        again.close()


def test_registering_the_same_hosts_again_writes_only_what_the_cloud_changed(
        first: Stack) -> None:
    """A restart with the cloud file (``berth serve --cloud`` again): the stored hosts
    start from what placement holds; an unchanged host gets no write, a host whose
    traits the file changed gets them."""
    agg = Aggregate(1, "a", uuid="11111111-2222-3333-4444-555555555555", hosts=("h1",))
    h1, h2 = first.register_hosts([node("h1", traits=["CUSTOM_FAST"]), node("h2")], [agg])
    generations = {a.node.host: first.client.get_provider(a.uuid).generation for a in (h1, h2)}
    again = reopen(first)
    try:
        again.register_hosts([node("h1", traits=["CUSTOM_FAST"]),
                              node("h2", traits=["CUSTOM_NEW"])], [agg])
        assert again.client.get_provider(h1.uuid).generation == generations["h1"]
        assert again.client.get_provider(h2.uuid).generation > generations["h2"]
        assert again.client.get_provider_traits(h2.uuid)[1] == ["CUSTOM_NEW"]
        assert again.client.get_aggregates(h1.uuid)[1] == [agg.uuid]
    finally:
        again.close()
