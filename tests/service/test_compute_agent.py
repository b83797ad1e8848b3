"""Compute agents across restarts, their build counters, silence, and what registration
publishes again."""

from __future__ import annotations

from pathlib import Path

from berth.model.aggregate import Aggregate
from berth.model.request import Flavor
from berth.service.compute import node_from_record
from berth.service.records import SnapshotFeed
from berth.service.stack import Stack

from .builders import node, reopen
from .conftest import TEST_CONFIG, fresh_stack

SMALL = Flavor(name="small", vcpus=2, memory_mb=1024, root_gb=10, id=7)


def _row(stack: Stack, host: str) -> tuple[object, int]:
    snap = SnapshotFeed(stack.records).refresh()
    row = snap.row_of(host)
    assert row is not None
    return snap, row


# ----------------------------------------------------------------- restarts
def test_a_restarted_agent_reports_the_instances_placed_before(first: Stack) -> None:
    (agent,) = first.register_hosts([node()])
    for uuid in ("00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"):
        first.client.put_allocations(uuid, {agent.uuid: {"VCPU": 2, "MEMORY_MB": 1024,
                                                         "DISK_GB": 10}},
                                     project_id="p", user_id="u", consumer_generation=None)
        agent.spawn(uuid, SMALL, "p")
    again = reopen(first)
    try:
        (restarted,) = again.register_hosts([node()])
        snap, row = _row(again, "h1")
        # 8192 - 512 reserved - 2 x 1024 = 5632; the usage agrees with placement's.
        assert snap.num("free_ram_mb")[row] == 5632  # type: ignore[attr-defined]
        assert snap.num("vcpus_used")[row] == 4  # type: ignore[attr-defined]
        assert snap.num("num_instances")[row] == 2  # type: ignore[attr-defined]
        assert again.client.provider_usages(restarted.uuid) == {
            "VCPU": 4, "MEMORY_MB": 2048, "DISK_GB": 20}
        instances = snap.obj("instances")[row]  # type: ignore[attr-defined]
        assert instances["00000000-0000-4000-8000-00000000000a"].instance_type_id == 7
    finally:
        again.close()


def test_an_instance_whose_allocation_is_gone_is_not_restored(first: Stack) -> None:
    (agent,) = first.register_hosts([node()])
    agent.spawn("00000000-0000-4000-8000-00000000000c", SMALL, "p")  # no allocation
    again = reopen(first)
    try:
        again.register_hosts([node()])
        snap, row = _row(again, "h1")
        assert snap.num("num_instances")[row] == 0  # type: ignore[attr-defined]
        assert snap.num("free_ram_mb")[row] == 8192 - 512  # type: ignore[attr-defined]
    finally:
        again.close()


def test_usage_of_consumers_that_are_not_instances_comes_back_as_baseline(first: Stack) -> None:
    (agent,) = first.register_hosts([node()])
    first.client.put_allocations("00000000-0000-4000-8000-0000000000ff",
                                 {agent.uuid: {"VCPU": 3, "MEMORY_MB": 3000}},
                                 project_id="p", user_id="u", consumer_generation=None)
    again = reopen(first)
    try:
        (restarted,) = again.register_hosts([node()])
        assert restarted.baseline is not None
        assert (restarted.baseline.vcpus, restarted.baseline.memory_mb) == (3, 3000)
        snap, row = _row(again, "h1")
        assert snap.num("vcpus_used")[row] == 3  # type: ignore[attr-defined]
    finally:
        again.close()


# ----------------------------------------------------------------- registration sync
def test_registration_removes_traits_an_earlier_run_published(first: Stack) -> None:
    (agent,) = first.register_hosts([node(traits=["CUSTOM_OLD"])])
    agent.set_disabled(True, "maintenance")
    assert set(first.client.get_provider_traits(agent.uuid)[1]) == {
        "CUSTOM_OLD", "COMPUTE_STATUS_DISABLED"}
    again = reopen(first)
    try:
        (restarted,) = again.register_hosts([node()])
        # The node's old trait goes; the operator's switch stays (until set back).
        assert again.client.get_provider_traits(restarted.uuid)[1] == [
            "COMPUTE_STATUS_DISABLED"]
        assert (restarted.disabled, restarted.disabled_reason) == (True, "maintenance")
        restarted.set_service(disabled=False)
        assert again.client.get_provider_traits(restarted.uuid)[1] == []
    finally:
        again.close()


def test_registration_clears_aggregate_membership_the_host_lost(first: Stack) -> None:
    agg = Aggregate(1, "a", uuid="11111111-2222-3333-4444-555555555555", hosts=("h1",))
    (agent,) = first.register_hosts([node()], [agg])
    assert first.client.get_aggregates(agent.uuid)[1] == [agg.uuid]
    again = reopen(first)
    try:
        (restarted,) = again.register_hosts([node()], [])
        assert again.client.get_aggregates(restarted.uuid)[1] == []
    finally:
        again.close()


def test_an_emptied_aggregate_list_reaches_a_scheduler_that_read_the_old_one(
        first: Stack) -> None:
    agg = Aggregate(1, "a", uuid="11111111-2222-3333-4444-555555555555", hosts=("h1",))
    first.register_hosts([node()], [agg])
    feed = SnapshotFeed(first.records)
    assert [a.name for a in feed.refresh().aggregates] == ["a"]
    first.records.set_aggregates([])
    assert feed.refresh().aggregates == []


# ----------------------------------------------------------------- stats and builds
def test_a_node_reports_its_own_stats_and_io_workload(stack: Stack) -> None:
    stack.register_hosts([node(stats={"gpu_vendor": "acme"}, io_workload=3)])
    snap, row = _row(stack, "h1")
    assert snap.num("num_io_ops")[row] == 3  # type: ignore[attr-defined]
    assert snap.interned_value("stats", row)["gpu_vendor"] == "acme"  # type: ignore[attr-defined]


def test_failed_builds_count_until_a_build_succeeds(stack: Stack) -> None:
    (agent,) = stack.register_hosts([node()])
    agent.record_failed_build()
    agent.record_failed_build()
    agent.report()
    snap, row = _row(stack, "h1")
    assert snap.num("failed_builds")[row] == 2  # type: ignore[attr-defined]
    agent.record_successful_build()
    agent.report()
    snap, row = _row(stack, "h1")
    assert snap.num("failed_builds")[row] == 0  # type: ignore[attr-defined]


def test_a_zero_build_failure_threshold_reports_no_failed_builds(
        template_db: Path, tmp_path: Path) -> None:
    config = TEST_CONFIG.replace("compute", consecutive_build_service_disable_threshold=0)
    st = fresh_stack(template_db, tmp_path, config)
    try:
        (agent,) = st.register_hosts([node()])
        agent.record_failed_build()
        agent.report()
        snap, row = _row(st, "h1")
        assert snap.num("failed_builds")[row] == 0  # type: ignore[attr-defined]
        assert "failed_builds" not in snap.interned_value("stats", row)  # type: ignore[attr-defined]
    finally:
        st.close()


def test_a_silent_agent_keeps_its_last_heartbeat_when_its_usage_changes(stack: Stack) -> None:
    (agent,) = stack.register_hosts([node()])
    old = agent.clock() - 3600
    agent.report(now=old)
    agent.silent = True
    agent.spawn("00000000-0000-4000-8000-00000000000d", SMALL, "p")
    snap, row = _row(stack, "h1")
    assert snap.num("service_heartbeat")[row] == old  # type: ignore[attr-defined]
    assert snap.num("num_instances")[row] == 1  # type: ignore[attr-defined]
    assert agent.down


def test_a_node_rebuilt_from_its_record_reports_the_same_record(stack: Stack) -> None:
    (agent,) = stack.register_hosts([node(stats={"k": "v"}, io_workload=2, pcpus=2,
                                          traits=["CUSTOM_X"])])
    record = agent.host_record(100.0)
    rebuilt = node_from_record(record, ["CUSTOM_X", "COMPUTE_STATUS_DISABLED"], pcpus=2)
    assert rebuilt.traits == ["CUSTOM_X"] and rebuilt.pcpus == 2
    assert rebuilt.stats == {"k": "v"} and rebuilt.io_workload == 2
    twin = type(agent)(rebuilt, stack.client, stack.records, stack.config)
    twin.created_at = agent.created_at
    assert twin.host_record(100.0) == record
