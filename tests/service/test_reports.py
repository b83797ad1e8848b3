"""Host reports through the bus: what reaches the database, what a scheduler applies,
and the start-up grace."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from berth.model.request import CellMapping
from berth.placement.db import prepare
from berth.service.bus import Bus
from berth.service.compute import ComputeAgent, ComputeNodeSpec
from berth.service.records import ComputeRecordStore, SnapshotFeed, record_to_report
from berth.service.reports import BusFeed, BusRecordStore, received_reports


def _report(host: str, beat: float, instances: int = 0) -> dict[str, Any]:
    agent = ComputeAgent(ComputeNodeSpec(host=host, vcpus=8, memory_mb=8192, local_gb=100),
                         client=None, records=None, clock=lambda: 1.0)  # type: ignore[arg-type]
    for i in range(instances):
        from berth.model.request import Flavor

        agent.spawn(f"00000000-0000-4000-8000-{i:012d}", Flavor("t", 1, 512, 1), publish=False)
    return record_to_report(agent.host_record(beat))


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = prepare(f"sqlite:///{tmp_path}/r.sqlite")
    yield eng
    eng.dispose()


def test_a_report_reaches_the_database_only_when_more_than_its_heartbeat_changed(engine: Any) -> None:
    bus = Bus("fake:/")
    got: list[dict[str, Any]] = []

    class Scheduler:
        def update_host_states(self, ctxt: Any, reports_json: str) -> None:
            got.extend(received_reports(reports_json=reports_json))

    bus.serve("scheduler", "s1", [Scheduler()])
    records = BusRecordStore(engine, bus, flush_interval=0.01)
    try:
        first = _report("h1", 100.0)
        records.publish(first["uuid"], first, 100.0)
        top = records.latest()
        records.publish(first["uuid"], _report("h1", 110.0), 110.0)
        assert records.latest() == top  # a heartbeat alone is not written
        records.publish(first["uuid"], _report("h1", 120.0, instances=1), 120.0)
        assert records.latest() == top + 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                r["service"]["last_seen_up"] == 120.0 for r in got):
            time.sleep(0.05)
        assert got and got[-1]["service"]["last_seen_up"] == 120.0
    finally:
        records.close()
        bus.close()


def test_a_scheduler_keeps_the_newest_report_of_each_host(engine: Any) -> None:
    feed = BusFeed(ComputeRecordStore(engine), service_down_time=60, clock=lambda: 1000.0)
    feed.warm()
    feed.receive([_report("h1", 200.0, instances=2), _report("h1", 150.0)])
    snapshot = feed.refresh()
    row = snapshot.row_of("h1")
    assert row is not None and len(snapshot.obj("instances")[row]) == 2
    assert feed.stale_dropped == 1


def test_a_deleted_node_goes_and_only_a_report_sent_after_brings_it_back(engine: Any) -> None:
    feed = BusFeed(ComputeRecordStore(engine), service_down_time=60, clock=lambda: 1000.0)
    feed.warm()
    h1, h2, h3 = (_report(h, 200.0) for h in ("h1", "h2", "h3"))
    feed.receive([h1, h2, h3])
    feed.refresh()
    feed.receive_deleted([h2["uuid"]], 300.0)
    feed.receive([_report("h2", 250.0)])  # sent before the deletion, still on its way
    feed.receive_beats({h2["uuid"]: 260.0})
    snapshot = feed.refresh()
    assert [snapshot.obj("host")[r] for r in range(len(snapshot))] == ["h1", "h3"]
    assert dict(feed.uuid_rows) == {h1["uuid"]: 0, h3["uuid"]: 1}
    feed.receive([_report("h2", 310.0)])  # its agent started again
    snapshot = feed.refresh()
    assert snapshot.row_of("h2") == 2 and feed.uuid_rows[h2["uuid"]] == 2


def test_a_starting_scheduler_counts_stored_heartbeats_from_its_start(engine: Any) -> None:
    store = ComputeRecordStore(engine)
    for host, beat in [("fresh", 500.0), ("lagging", 470.0), ("old", 100.0)]:
        report = _report(host, beat)
        store.publish(report["uuid"], report, beat)
    feed = BusFeed(store, service_down_time=60, clock=lambda: 5000.0)
    snapshot = feed.warm()
    beats = {snapshot.obj("host")[r]: snapshot.num("service_heartbeat")[r]
             for r in range(len(snapshot))}
    # Stored heartbeats lag by design (a heartbeat alone is not written): each host has
    # service_down_time from the scheduler's start to report.
    assert beats == {"fresh": 5000.0, "lagging": 5000.0, "old": 5000.0}
    # A report from the bus that predates the start still applies (ordered by the beat
    # the host sent, not the lifted one).
    feed.receive([_report("fresh", 600.0, instances=1)])
    snapshot = feed.refresh()
    row = snapshot.row_of("fresh")
    assert row is not None and snapshot.num("service_heartbeat")[row] == 600.0


def test_an_unchanged_host_reports_its_heartbeat_alone_and_the_scheduler_applies_it(
        engine: Any) -> None:
    bus = Bus("fake:/")
    feed = BusFeed(ComputeRecordStore(engine), service_down_time=60, clock=lambda: 0.0)
    calls: list[str] = []

    class Scheduler:
        def update_host_states(self, ctxt: Any, reports_json: str) -> None:
            calls.append("reports")
            feed.receive(received_reports(reports_json=reports_json))

        def host_heartbeats(self, ctxt: Any, beats: dict[str, float]) -> None:
            calls.append("beats")
            feed.receive_beats(beats)

    bus.serve("scheduler", "s1", [Scheduler()])
    records = BusRecordStore(engine, bus, flush_interval=0.01)
    try:
        feed.warm()
        first = _report("h1", 100.0)
        records.publish(first["uuid"], first, 100.0)
        records.flush()
        records.publish(first["uuid"], _report("h1", 130.0), 130.0)
        records.flush()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and calls != ["reports", "beats"]:
            time.sleep(0.05)
        assert calls == ["reports", "beats"]
        snapshot = feed.refresh()
        row = snapshot.row_of("h1")
        assert row is not None and snapshot.num("service_heartbeat")[row] == 130.0
        assert snapshot.obj("service")[row].last_seen_up == 130.0
    finally:
        records.close()
        bus.close()


def test_reports_written_from_many_threads_share_commits_and_all_arrive(engine: Any) -> None:
    import threading

    bus = Bus("fake:/")
    records = BusRecordStore(engine, bus, flush_interval=0.01)
    try:
        reports = [_report(f"h{i}", 100.0, instances=i % 3) for i in range(40)]
        threads = [threading.Thread(target=records.publish, args=(r["uuid"], r, 100.0))
                   for r in reports]
        start = records.latest()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stored = {r["uuid"] for r in ComputeRecordStore(engine).reports()}
        assert stored == {r["uuid"] for r in reports}
        # One change number per shared commit.
        assert 1 <= records.latest() - start <= 40
    finally:
        records.close()
        bus.close()


def test_stored_report_text_round_trips_and_older_text_still_reads(engine: Any) -> None:
    """Reports are stored through orjson: what ``json.dumps(report, default=str)`` made
    reads back the same, and text the standard encoder wrote before (``NaN`` included,
    which orjson alone refuses) still reads."""
    import json
    import math
    from datetime import UTC, datetime

    import numpy as np

    from berth.service.records import decode_report, encode_report

    report = {**_report("h1", 5.0, instances=3), "odd": {1: datetime(2026, 1, 2, tzinfo=UTC)},
              "updated": np.float64(1.7e9)}
    assert decode_report(encode_report(report)) == json.loads(json.dumps(report, default=str)) | {
        "odd": {"1": "2026-01-02T00:00:00+00:00"}}
    assert type(decode_report(encode_report(report))["updated"]) is float
    old = json.dumps({**_report("h2", 5.0), "metrics": [{"name": "cpu", "value": math.nan}]})
    assert math.isnan(decode_report(old)["metrics"][0]["value"])
    store = ComputeRecordStore(engine)
    store.publish("u1", _report("h1", 5.0, instances=2), 5.0)
    got = store.report_of("u1")
    assert got is not None and [i["uuid"] for i in got["instances"]] == [
        i["uuid"] for i in _report("h1", 5.0, instances=2)["instances"]]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_each_write_takes_the_next_change_number_and_the_feed_reads_it(
        database: str, tmp_path: Path) -> None:
    """One report (on PostgreSQL one statement), a wave larger than one statement (a
    pipeline), heartbeats: each under the next number, read back after the one before."""
    from pgdb import fresh_pg_database

    with contextlib.ExitStack() as stack:
        url = (f"sqlite:///{tmp_path}/r.sqlite" if database == "sqlite"
               else stack.enter_context(fresh_pg_database("berth_reports")))
        eng = prepare(url)
        stack.callback(eng.dispose)
        store = ComputeRecordStore(eng)
        one = _report("h0", 100.0)
        first = store.publish(one["uuid"], one, 100.0)
        wave = [_report(f"h{i}", 101.0) for i in range(1, 251)]
        second = store.publish_many([(r["uuid"], r, 101.0) for r in wave])
        third = store.heartbeats({one["uuid"]: 102.0, wave[0]["uuid"]: 102.0})
        again = store.publish(one["uuid"], _report("h0", 103.0, instances=1), 103.0)
        assert [second, third, again] == [first + 1, first + 2, first + 3]
        changes = store.changes(first)
        assert sorted(r["host"] for r in changes.reports) == sorted(
            ["h0"] + [r["host"] for r in wave])
        assert changes.top == again
        assert store.changes(third).reports[0]["host"] == "h0"


def test_a_reports_cast_is_read_as_one_json_string_or_as_a_list() -> None:
    """Agents send a chunk of reports as one JSON string; a list (an agent of an earlier
    version) is still read; a string that is not a JSON list is refused by name."""
    report = _report("h1", 100.0)
    assert received_reports(reports_json=orjson.dumps([report]).decode()) == [report]
    assert received_reports(reports=[report]) == [report]
    assert received_reports() == []
    with pytest.raises(ValueError, match="reports_json is not a JSON list"):
        received_reports(reports_json="{}")
    with pytest.raises(ValueError):
        received_reports(reports_json="[")
    with pytest.raises(ValueError, match="reports is not a list"):
        received_reports(reports=5)
    with pytest.raises(ValueError, match="reports_json is not a string"):
        received_reports(reports_json=[report])


def test_entries_that_are_not_reports_are_dropped_and_a_bad_report_fails_nothing(
        engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    """One malformed entry of a cast is dropped, the others kept; a report that names its
    host but cannot be applied is dropped when the snapshot is refreshed (inside a
    scheduling request), which goes on with every other report."""
    good = _report("h1", 100.0)
    assert received_reports(reports_json=orjson.dumps(
        [1, {"uuid": "u"}, {"host": 7}, good]).decode()) == [good]
    assert "3 of 4 entries are not host reports" in caplog.text
    feed = BusFeed(ComputeRecordStore(engine), service_down_time=60, clock=lambda: 1000.0)
    feed.warm()
    broken = {**_report("h2", 100.0), "vcpus": "many"}
    feed.receive([broken, good])
    feed.receive_beats({"h1-uuid": "soon"})
    snapshot = feed.refresh()
    assert [h for h in snapshot.obj("host")] == ["h1"]
    assert feed.malformed == 2


def test_an_old_scheduler_refuses_the_new_cast_by_version_and_a_new_one_reads_both() -> None:
    """Rolling upgrade: agents cast reports as one JSON string at RPC 1.1. A scheduler of
    1.0 (which knows only ``reports``) refuses that cast by its version, as oslo.messaging
    does, instead of failing on an unknown argument; a scheduler of 1.1 reads the 1.0
    cast of an agent not upgraded yet."""
    report = _report("h1", 100.0)
    bus = Bus("fake:/")
    old_got: list[Any] = []
    new_got: list[Any] = []

    class OldScheduler:
        def __init__(self) -> None:
            import oslo_messaging

            self.target = oslo_messaging.Target(version="1.0")

        def update_host_states(self, ctxt: Any, reports: list[dict[str, Any]]) -> None:
            old_got.extend(reports)

    class NewScheduler:
        def update_host_states(self, ctxt: Any, reports: Any = None,
                               reports_json: Any = None) -> None:
            new_got.extend(received_reports(reports, reports_json))

    bus.serve("scheduler", "old", [OldScheduler()])
    bus.serve("scheduler", "new", [NewScheduler()])
    try:
        fanout = bus.client("scheduler", fanout=True)
        fanout.cast("update_host_states", version="1.1",
                    reports_json=orjson.dumps([report]).decode())
        fanout.cast("update_host_states", reports=[report])  # an agent of 1.0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(new_got) < 2 or not old_got):
            time.sleep(0.05)
        assert new_got == [report, report]
        assert old_got == [report]  # only the 1.0 cast
    finally:
        bus.close()


def test_the_scheduler_endpoint_drops_malformed_casts(
        engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Casts nobody answers: a malformed one is logged and dropped, never raised into
    the bus's dispatcher, and never queued for a scheduling request to trip on."""
    from berth.service.scheduler_rpc import SchedulerEndpoint

    feed = BusFeed(ComputeRecordStore(engine), service_down_time=60, clock=lambda: 1000.0)
    feed.warm()
    endpoint = SchedulerEndpoint(None, feed)  # type: ignore[arg-type]
    endpoint.update_host_states({}, reports=5)
    endpoint.update_host_states({}, reports_json="{")
    endpoint.host_heartbeats({}, beats=[1, 2])  # type: ignore[arg-type]
    endpoint.hosts_deleted({}, uuids="abc", deleted_at=1.0)  # type: ignore[arg-type]
    endpoint.hosts_deleted({}, uuids=["u"], deleted_at="later")  # type: ignore[arg-type]
    assert caplog.text.count("dropped") == 5
    good = _report("h1", 100.0)
    endpoint.update_host_states({}, reports_json=orjson.dumps([good]).decode())
    assert list(feed.refresh().obj("host")) == ["h1"]


def test_schedulers_learn_the_disabled_cells_with_the_aggregates(engine: Any) -> None:
    """Nova's host manager reads the enabled cells only. The cloud file's cells are
    stored with the aggregates; a scheduler reads both when it warms and when it is told
    the aggregates changed (berth schedule and berth serve ignored disabled cells)."""
    store = ComputeRecordStore(engine)
    store.set_aggregates([], [CellMapping("c1", "cell1", disabled=True), CellMapping("c2", "cell2")])
    in_process = SnapshotFeed(store)
    assert in_process.refresh().disabled_cells == {"c1"}
    feed = BusFeed(store, service_down_time=60, clock=lambda: 1000.0)
    assert feed.warm().disabled_cells == {"c1"}
    store.set_aggregates([], [CellMapping("c1", "cell1"), CellMapping("c2", "cell2", disabled=True)])
    feed.aggregates_changed()
    assert feed.refresh().disabled_cells == {"c2"}
    assert in_process.refresh().disabled_cells == {"c2"}
    store.set_aggregates([])  # no cells given: the stored ones stay
    assert store.disabled_cells() == {"c2"}
