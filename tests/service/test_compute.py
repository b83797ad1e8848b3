"""Compute agents publish inventories, traits and records; schedulers read them back."""

from __future__ import annotations

import pytest

from berth.config import SchedulerConfig
from berth.errors import InputError
from berth.model.aggregate import Aggregate
from berth.model.compute import MetricItem
from berth.model.request import Flavor, RequestSpec
from berth.service.compute import ComputeNodeSpec, inventories_for
from berth.service.records import (
    RunningInstances,
    SnapshotFeed,
    record_to_report,
    report_to_record,
)
from berth.service.reporting import Reporter
from berth.service.stack import Stack


def test_inventories_carry_reserved_amounts_and_resolved_ratios() -> None:
    config = SchedulerConfig.from_dict({"DEFAULT": {
        "reserved_host_cpus": 2, "reserved_host_memory_mb": 1024, "reserved_host_disk_mb": 1500,
        "ram_allocation_ratio": 1.5}})
    node = ComputeNodeSpec(host="h", vcpus=16, memory_mb=65536, local_gb=500, pcpus=4,
                           disk_allocation_ratio=2.0)
    inv = inventories_for(node, config)
    assert inv["VCPU"] == {"total": 16, "reserved": 2, "min_unit": 1, "max_unit": 16,
                           "step_size": 1, "allocation_ratio": 4.0}  # initial_cpu_allocation_ratio
    assert inv["MEMORY_MB"]["reserved"] == 1024 and inv["MEMORY_MB"]["allocation_ratio"] == 1.5
    assert inv["DISK_GB"]["reserved"] == 2 and inv["DISK_GB"]["allocation_ratio"] == 2.0  # ceil(1500/1024)
    assert inv["PCPU"] == {"total": 4, "reserved": 0, "min_unit": 1, "max_unit": 4,
                           "step_size": 1, "allocation_ratio": 1.0}


def test_a_node_without_dedicated_cpus_reports_no_pcpu() -> None:
    assert "PCPU" not in inventories_for(ComputeNodeSpec(host="h", vcpus=4, memory_mb=1024,
                                                         local_gb=10), SchedulerConfig.default())


def test_a_bad_node_size_names_the_field() -> None:
    with pytest.raises(InputError, match="compute node h: vcpus must be an integer >= 0, got -1"):
        ComputeNodeSpec(host="h", vcpus=-1, memory_mb=1, local_gb=1)


def test_registration_publishes_provider_inventory_traits_and_aggregates(stack: Stack) -> None:
    agg = Aggregate(1, "a", uuid="11111111-2222-3333-4444-555555555555", hosts=("h1",))
    (agent,) = stack.register_hosts(
        [ComputeNodeSpec(host="h1", vcpus=8, memory_mb=4096, local_gb=40,
                         traits=["HW_CPU_X86_AVX2", "CUSTOM_FAST"])], [agg])
    _, inventories = stack.client.get_inventories(agent.uuid)
    assert inventories["MEMORY_MB"]["reserved"] == 512
    assert sorted(stack.client.get_provider_traits(agent.uuid)[1]) == ["CUSTOM_FAST",
                                                                       "HW_CPU_X86_AVX2"]
    assert stack.client.get_aggregates(agent.uuid)[1] == [agg.uuid]


def test_disabling_adds_the_status_trait_and_the_service_flag(stack: Stack) -> None:
    (agent,) = stack.register_hosts([ComputeNodeSpec(host="h1", vcpus=8, memory_mb=4096,
                                                     local_gb=40)])
    agent.set_disabled(True, "maintenance")
    assert stack.client.get_provider_traits(agent.uuid)[1] == ["COMPUTE_STATUS_DISABLED"]
    snap = SnapshotFeed(stack.records).refresh()
    assert bool(snap.num("service_disabled")[0])
    assert snap.obj("service")[0].disabled_reason == "maintenance"
    agent.set_disabled(False)
    assert stack.client.get_provider_traits(agent.uuid)[1] == []


def test_the_feed_applies_only_changed_reports_in_place(stack: Stack) -> None:
    agents = stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=4096,
                                                   local_gb=40) for i in range(3)])
    feed = SnapshotFeed(stack.records)
    snap = feed.refresh()
    assert len(snap) == 3 and snap.num("free_ram_mb").tolist() == [3584.0] * 3
    seq = feed.seq
    agents[1].spawn("inst-1", Flavor(name="f", vcpus=2, memory_mb=1024, root_gb=5, id=7), "p")
    changes = stack.records.changes(seq)
    assert [r["host"] for r in changes.reports] == ["h1"] and changes.top == seq + 1
    assert feed.refresh() is snap  # the same snapshot object, updated in place
    row = snap.row_of("h1")
    assert row is not None
    assert snap.num("free_ram_mb")[row] == 2560 and snap.num("vcpus_used")[row] == 2
    assert snap.num("num_instances")[row] == 1 and snap.num("free_disk_mb")[row] == 35 * 1024
    assert snap.obj("instances")[row]["inst-1"].instance_type_id == 7
    assert feed.uuid_rows[agents[1].uuid] == row


def test_where_instances_run_follows_each_host_s_latest_report(stack: Stack) -> None:
    h0, h1 = stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=4096,
                                                    local_gb=40) for i in range(2)])
    tiny = Flavor(name="f", vcpus=1, memory_mb=256, root_gb=1, id=1)
    h0.spawn("a", tiny)
    running = RunningInstances(stack.records)
    assert running.hosts_of(["a", "never-built"]) == {"a": "h0"}
    # Later reports are read at the next look: no scheduler snapshot in between.
    h1.spawn("b", tiny)
    h0.destroy("a")
    assert running.hosts_of(["a", "b"]) == {"b": "h1"}
    h0.report()  # nothing changed: still nowhere
    assert running.hosts_of(["a"]) == {}


def test_aggregates_reach_the_snapshot(stack: Stack) -> None:
    agg = Aggregate(3, "zone", uuid="11111111-2222-3333-4444-555555555555", hosts=("h0",),
                    metadata={"availability_zone": "az9"})
    stack.register_hosts([ComputeNodeSpec(host="h0", vcpus=1, memory_mb=1024, local_gb=1)], [agg])
    snap = SnapshotFeed(stack.records).refresh()
    assert snap.aggregates == [agg]


def test_a_report_round_trips_through_json() -> None:
    from berth.service.compute import ComputeAgent

    node = ComputeNodeSpec(host="h", vcpus=4, memory_mb=2048, local_gb=20, cell_uuid="c1",
                           cpu_info={"arch": "x86_64"}, metrics=[MetricItem("cpu.percent", 5.0)])
    agent = ComputeAgent(node, client=None, records=None)  # type: ignore[arg-type]
    agent.spawn("i1", Flavor(name="f", vcpus=1, memory_mb=256), publish=False)
    record = agent.host_record(now=100.0)
    again = report_to_record(record_to_report(record))
    assert again == record
    assert again.service is not None  # an agent's node always has its service record


def test_agents_report_periodically_from_one_thread_until_stopped(stack: Stack) -> None:
    import threading

    stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=1, memory_mb=1024, local_gb=1)
                          for i in range(3)])
    stored = threading.Event()
    beats = stack.records.heartbeats

    def spy(batch: dict[str, float]) -> int:
        if len(batch) == 3:
            stored.set()
        return beats(batch)

    stack.records.heartbeats = spy  # type: ignore[method-assign]
    reporter = Reporter(lambda: list(stack.agents.values()), stack.records)
    reporter.start(interval=0.01)
    try:
        assert stored.wait(timeout=10)  # the three heartbeats in one call
    finally:
        reporter.stop()
    assert reporter._thread is not None and not reporter._thread.is_alive()
    assert [t.name for t in threading.enumerate()].count("compute-reports") == 0


def test_a_round_sends_heartbeats_alone_and_the_feed_applies_them(stack: Stack) -> None:
    clock = [1000.0]
    stack.clock = lambda: clock[0]
    h0, h1 = stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=4096,
                                                    local_gb=40) for i in range(2)])
    feed = SnapshotFeed(stack.records)
    snap = feed.refresh()
    reporter = Reporter(lambda: [h0, h1], stack.records)
    written = stack.records.publish
    published: list[str] = []
    stack.records.publish = (  # type: ignore[method-assign]
        lambda uuid, report, beat: published.append(uuid) or written(uuid, report, beat))
    clock[0] = 1010.0
    assert reporter.report_round() == 2
    assert published == []  # no report: the state went out with the last one
    changes = stack.records.changes(feed.seq)
    assert changes.reports == [] and changes.beats == {h0.uuid: 1010.0, h1.uuid: 1010.0}
    assert feed.refresh() is snap
    assert snap.num("service_heartbeat").tolist() == [1010.0, 1010.0]
    assert [s.last_seen_up for s in snap.obj("service")] == [1010.0, 1010.0]
    # A whole round publishes only what changed (a failed build's counter here) ...
    h1.record_failed_build()
    clock[0] = 1020.0
    assert reporter.report_round(whole=True) == 2
    assert published == [h1.uuid]
    feed.refresh()
    row = snap.row_of("h1")
    assert row is not None and snap.interned_value("stats", row)["failed_builds"] == "1"
    assert snap.num("service_heartbeat").tolist() == [1020.0, 1020.0]
    # ... and a stored report comes back with its newest heartbeat (a restart reads it).
    clock[0] = 1030.0
    reporter.report_round()
    assert stack.records.report_of(h0.uuid)["service"]["last_seen_up"] == 1030.0
    assert {r["host"]: r["service"]["last_seen_up"] for r in stack.records.reports()} == {
        "h0": 1030.0, "h1": 1030.0}
    # A silent host sends nothing, and an older heartbeat never wins over a newer one.
    h0.silent = True
    clock[0] = 1040.0
    assert reporter.report_round() == 1
    feed.refresh()
    assert snap.num("service_heartbeat").tolist() == [1030.0, 1040.0]


def test_periodic_rounds_spread_the_whole_reports(stack: Stack) -> None:
    agents = stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=4096,
                                                   local_gb=40) for i in range(5)])
    for agent in agents:
        agent.record_failed_build()  # a change no report carried yet
    written = stack.records.publish
    published: list[str] = []
    stack.records.publish = (  # type: ignore[method-assign]
        lambda uuid, report, beat: published.append(uuid) or written(uuid, report, beat))
    resent: list[set[str]] = []
    reporter = Reporter(lambda: agents, stack.records, whole_every=2)
    reporter.report_round(part=0)
    assert published == [agents[0].uuid, agents[2].uuid, agents[4].uuid]
    reporter.report_round(part=1)
    assert published[3:] == [agents[1].uuid, agents[3].uuid]
    reporter.report_round(part=2)
    assert published[5:] == []  # nothing changed since
    # On the bus, the due hosts' reports go whole in any case.
    bus = Reporter(lambda: agents, stack.records, whole_every=2, resend=resent.append)
    bus.report_round(part=1)
    assert resent == [{agents[1].uuid, agents[3].uuid}]
    assert published[5:] == [agents[1].uuid, agents[3].uuid]


def test_a_failed_placement_publication_is_retried_by_the_next_round(stack: Stack) -> None:
    (agent,) = stack.register_hosts([ComputeNodeSpec(host="h1", vcpus=8, memory_mb=4096,
                                                     local_gb=40)])
    assert not agent.placement_pending
    calls: list[str] = []
    client = agent.client  # the store itself in process, else the API's client
    get = client.get_provider
    client.get_provider = (  # type: ignore[method-assign]
        lambda uuid: calls.append(uuid) or get(uuid))
    reporter = Reporter(lambda: [agent], stack.records)
    reporter.report_round()
    agent.sync_placement()
    assert calls == []  # nothing changed: no call to Placement at all
    set_traits = client.set_provider_traits

    def down(*args: object) -> object:
        raise ConnectionError("placement is down")

    client.set_provider_traits = down  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        agent.set_disabled(True, "maintenance")
    assert agent.placement_pending
    client.set_provider_traits = set_traits  # type: ignore[method-assign]
    reporter.report_round()
    assert not agent.placement_pending
    assert stack.client.get_provider_traits(agent.uuid)[1] == ["COMPUTE_STATUS_DISABLED"]


def test_a_warmed_scheduler_reads_no_providers_on_its_first_request(stack: Stack) -> None:
    from berth.placement.store_graph import GraphMixin

    stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=4096, local_gb=40)
                          for i in range(3)])
    service = stack.scheduler(seed=1)
    loads: list[int] = []
    load = GraphMixin._load_all

    def counted(self: object, raw: object) -> None:
        loads.append(1)
        load(self, raw)  # type: ignore[arg-type]

    GraphMixin._load_all = counted  # type: ignore[method-assign]
    try:
        service.warm()
        warmed = len(loads)
        service.select_destinations(RequestSpec(flavor=Flavor(name="f", vcpus=1,
                                                               memory_mb=256, root_gb=1)))
    finally:
        GraphMixin._load_all = load  # type: ignore[method-assign]
    from berth.placement.local import LocalPlacement

    if not isinstance(stack.candidates_client, LocalPlacement):
        assert warmed == 0  # through the API: the server reads its providers itself
    else:
        assert warmed == 1 and len(loads) == 1  # the first request found them read


def test_a_create_sent_twice_is_read_back_by_uuid(stack: Stack) -> None:
    # The agent's provider POST may go on a kept connection, so libcurl may send it
    # again when that connection breaks: the first send created the provider and the
    # second is answered 409. The agent reads the provider back by its uuid and goes on.
    from berth.placement.client import ConflictError
    from berth.service.compute import ComputeAgent

    sends: list[bool] = []

    class Twice:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def create_provider(self, name: str, **kwargs: object) -> object:
            sends.append(bool(kwargs.get("repeatable")))
            self.inner.create_provider(name, **kwargs)  # type: ignore[attr-defined]
            raise ConflictError(409, "placement.duplicate_name", "already exists", None)

    node = ComputeNodeSpec(host="h1", vcpus=8, memory_mb=4096, local_gb=40,
                           traits=["HW_CPU_X86_AVX2"])
    agent = ComputeAgent(node, Twice(stack.client), stack.records,  # type: ignore[arg-type]
                         stack.config)
    agent.register([])
    assert sends == [True]  # one create, allowed to go twice
    _, inventories = stack.client.get_inventories(agent.uuid)
    assert inventories["VCPU"]["total"] == 8
    assert stack.client.get_provider_traits(agent.uuid)[1] == ["HW_CPU_X86_AVX2"]
