"""The host state of a Nova deployment read from its databases: cells, compute nodes with
their services and instances, aggregates; kept current incrementally; NUMA and PCI
columns that are object primitives."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from berth.model.compute import Instance
from berth.nova import hoststate as hs

from .novadb import CELL1, CELL2, NOW, mariadb_up, numa_primitive, pci_primitive, seed


@pytest.fixture
def feed(tmp_path: Path) -> Iterator[tuple[hs.NovaFeed, dict[str, Any]]]:
    api = sa.create_engine(f"sqlite:///{tmp_path}/api.sqlite")
    cells = {CELL1: sa.create_engine(f"sqlite:///{tmp_path}/cell1.sqlite"),
             CELL2: sa.create_engine(f"sqlite:///{tmp_path}/cell2.sqlite")}
    seed(api, cells)
    clock = [NOW.replace(tzinfo=dt.UTC).timestamp() + 5]
    feed = hs.NovaFeed(f"sqlite:///{tmp_path}/api.sqlite",
                       main_url=f"sqlite:///{tmp_path}/cell1.sqlite", clock=lambda: clock[0])
    try:
        yield feed, {"api": api, "cells": cells, "clock": clock}
    finally:
        feed.close()
        api.dispose()
        for engine in cells.values():
            engine.dispose()


def test_every_cell_but_cell0_is_read_and_a_disabled_cell_is_marked(feed: Any) -> None:
    nova, _ = feed
    snap = nova.refresh()
    hosts = sorted(snap.obj("host").tolist())
    assert hosts == ["a1", "a2", "a3", "b1"]  # a deleted compute node is not read
    assert snap.disabled_cells == frozenset({CELL2})
    assert {a.name: (a.hosts, a.metadata) for a in snap.aggregates} == {
        "fast": (("a1",), {"availability_zone": "az1"})}


def test_a_compute_node_reads_as_novas_host_state(feed: Any) -> None:
    nova, _ = feed
    snap = nova.refresh()
    row = snap.row_of("a1", "a1.node")
    assert row is not None and nova.uuid_rows[snap.obj("uuid")[row]] == row
    assert snap.num("free_disk_mb")[row] == 400 * 1024  # disk_available_least wins
    assert snap.num("total_usable_ram_mb")[row] == 32768
    assert snap.num("num_instances")[row] == 1
    assert list(snap.obj("instances")[row]) == ["i-1"]  # the deleted one is gone
    assert snap.interned_value("cell_uuid", row) == CELL1
    # The NUMA and PCI columns are object primitives, read into Berth's objects.
    numa = snap.obj("numa_topology")[row]
    assert [sorted(c.pcpuset) for c in numa.cells] == [[2, 3], [6, 7]]
    assert numa.cells[0].mempages[0].total == 4096
    record_numa = hs.numa_dict(numa_primitive())
    assert record_numa is not None
    assert record_numa["cells"][0]["network_metadata"] == {"physnets": ["public"],
                                                           "tunneled": False}
    assert snap.obj("pci_stats")[row].pools[0]["count"] == 4
    assert snap.obj("numa_topology")[snap.row_of("a2", "a2.node")] is None
    pools = hs.pci_pools(pci_primitive())
    assert pools == [{"dev_type": "type-VF", "physical_network": "p1", "vendor_id": "8086",
                      "product_id": "1520", "numa_node": 1, "count": 4}]


def test_services_decide_what_compute_filter_sees(feed: Any) -> None:
    nova, _ = feed
    snap = nova.refresh()
    disabled = snap.num("service_disabled")
    assert disabled[snap.row_of("a2", "a2.node")] == 1
    assert disabled[snap.row_of("a1", "a1.node")] == 0
    beat = snap.num("service_heartbeat")
    assert beat[snap.row_of("a1", "a1.node")] - beat[snap.row_of("a3", "a3.node")] == 3600
    assert snap.row_of("gone", "gone.node") is None


def test_later_refreshes_read_only_what_changed(feed: Any) -> None:
    nova, env = feed
    nova.refresh()
    later = NOW + dt.timedelta(seconds=30)
    with env["cells"][CELL1].begin() as conn:
        conn.execute(sa.update(hs.services).where(hs.services.c.host == "a2").values(
            disabled=False, disabled_reason=None, updated_at=later))
        conn.execute(sa.update(hs.compute_nodes).where(hs.compute_nodes.c.host == "a3").values(
            vcpus_used=6, updated_at=later))
        conn.execute(sa.insert(hs.instances), [
            {"id": 3, "uuid": "i-3", "host": "a3", "instance_type_id": 5, "project_id": "p",
             "created_at": later, "updated_at": later, "deleted_at": None, "deleted": 0}])
        conn.execute(sa.update(hs.instances).where(hs.instances.c.uuid == "i-1").values(
            host="a3", updated_at=later))
    env["clock"][0] += 0.5
    snap = nova.refresh()  # within min_interval and nothing cast: as it was
    assert snap.num("service_disabled")[snap.row_of("a2", "a2.node")] == 1
    env["clock"][0] += 30
    snap = nova.refresh()
    assert snap.num("service_disabled")[snap.row_of("a2", "a2.node")] == 0
    assert snap.num("vcpus_used")[snap.row_of("a3", "a3.node")] == 6
    assert sorted(snap.obj("instances")[snap.row_of("a3", "a3.node")]) == ["i-1", "i-3"]
    assert list(snap.obj("instances")[snap.row_of("a1", "a1.node")]) == []


def test_casts_make_the_next_request_read_at_once(feed: Any) -> None:
    nova, env = feed
    nova.refresh()
    with env["api"].begin() as conn:
        conn.execute(sa.insert(hs.aggregate_hosts), [{"id": 2, "host": "a2",
                                                      "aggregate_id": 1}])
    nova.aggregates_changed([])
    snap = nova.refresh()
    assert snap.aggregates[0].hosts == ("a1", "a2")
    with env["cells"][CELL1].begin() as conn:  # Nova deletes the row, then casts
        conn.execute(sa.update(hs.instances).where(hs.instances.c.uuid == "i-1").values(
            deleted=1, deleted_at=NOW))
    nova.instance_deleted("a1", "i-1")
    # The snapshot changes only in the next refresh (under the scheduler's lock).
    assert list(snap.obj("instances")[snap.row_of("a1", "a1.node")]) == ["i-1"]
    snap = nova.refresh()
    assert list(snap.obj("instances")[snap.row_of("a1", "a1.node")]) == []
    assert np.isfinite(snap.num("vcpus_total")).all()


def _on(snap: Any, host: str) -> list[str]:
    return sorted(snap.obj("instances")[snap.row_of(host, f"{host}.node")])


def _move(env: Any, uuid: str, host: str) -> None:
    later = NOW + dt.timedelta(seconds=30)
    with env["cells"][CELL1].begin() as conn:
        conn.execute(sa.update(hs.instances).where(hs.instances.c.uuid == uuid).values(
            host=host, updated_at=later))
    env["clock"][0] += 30


def test_a_host_s_instances_are_novas_tracked_ones_once_its_compute_casts(feed: Any) -> None:
    """Nova's host manager: after a compute's update_instance_info its host's instances
    are the ones the casts gave, until a sync finds them out of step. A live migration's
    source casts the instance to itself, so Nova keeps it there (and refuses the host to
    an anti-affinity member) until the source's next sync; Berth read the database and
    placed the member there (found against a real Nova)."""
    nova, env = feed
    assert _on(nova.refresh(), "a1") == ["i-1"]
    nova.instances_changed("a1", [Instance("i-1", 1, "p")])  # the build's update
    _move(env, "i-1", "a3")  # live migrated to a3
    nova.instances_changed("a1", [Instance("i-1", 1, "p")])  # _post_live_migration
    nova.instances_changed("a3", [Instance("i-1", 1, "p")])  # at the destination
    snap = nova.refresh()
    assert _on(snap, "a1") == ["i-1"] and "i-1" in _on(snap, "a3")
    nova.instances_synced("a1", [])  # the source's periodic sync: out of step
    snap = nova.refresh()
    assert _on(snap, "a1") == [] and "i-1" in _on(snap, "a3")


def test_a_resized_instance_stays_on_its_source_until_the_resize_is_confirmed(
        feed: Any) -> None:
    """It may come back there on a revert: Nova's view keeps it on the source until the
    confirm's delete_instance_info (a group member booted meanwhile is refused there)."""
    nova, env = feed
    nova.refresh()
    nova.instances_changed("a1", [Instance("i-1", 1, "p")])
    _move(env, "i-1", "a3")  # finish_resize on a3: VERIFY_RESIZE
    nova.instances_changed("a3", [Instance("i-1", 1, "p")])
    snap = nova.refresh()
    assert _on(snap, "a1") == ["i-1"]
    nova.instance_deleted("a1", "i-1")  # confirm_resize on the source
    assert _on(nova.refresh(), "a1") == []


def test_a_host_whose_compute_never_cast_is_read_from_the_database(feed: Any) -> None:
    """Before any cast (and after a sync out of step, or a single-instance update from
    a host the scheduler had no entry for) the database stands for the host."""
    nova, env = feed
    nova.refresh()
    _move(env, "i-1", "a3")
    snap = nova.refresh()
    assert _on(snap, "a1") == [] and "i-1" in _on(snap, "a3")
    nova.instances_changed("a2", [Instance("i-9")])  # no entry for a2: read again
    assert nova.tracked["a2"].updated is False
    nova.instances_changed("a2", [Instance("i-9")])  # now it has one: tracked
    snap = nova.refresh()
    assert _on(snap, "a2") == ["i-9"]


def test_a_template_needs_the_main_connection(tmp_path: Path) -> None:
    from berth.errors import ConfigError

    assert hs.cell_url("mysql+pymysql://{username}:{password}@{hostname}/{path}?{query}",
                       "mysql+pymysql://nova:pw@db1/nova_cell1?charset=utf8") == \
        "mysql+pymysql://nova:pw@db1/nova_cell1?charset=utf8"
    with pytest.raises(ConfigError, match=r"\[database\] connection"):
        hs.cell_url("{scheme}:///{path}", None)


@pytest.mark.skipif(not mariadb_up(), reason="MariaDB is not running on 127.0.0.1:3306")
def test_the_feed_reads_mariadb_as_nova_keeps_it(tmp_path: Path) -> None:
    """Reserved words (``binary``, ``key``) and DATETIME columns on MariaDB."""
    pytest.importorskip("pymysql", reason="PyMySQL is not installed")
    admin = sa.create_engine("mysql+pymysql://root@127.0.0.1:3306/")
    names = {k: f"berth_nova_{uuid.uuid4().hex[:8]}_{k}" for k in ("api", "c1", "c2")}
    with admin.begin() as conn:
        for name in names.values():
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        url = "mysql+pymysql://root@127.0.0.1:3306/{}"
        api = sa.create_engine(url.format(names["api"]))
        cells = {CELL1: sa.create_engine(url.format(names["c1"])),
                 CELL2: sa.create_engine(url.format(names["c2"]))}
        seed(api, cells)
        with api.begin() as conn:
            conn.execute(sa.update(hs.cell_mappings).where(hs.cell_mappings.c.uuid == CELL1)
                         .values(database_connection="{scheme}://{username}@{hostname}:{port}/"
                                 + names["c1"]))
        nova = hs.NovaFeed(url.format(names["api"]), main_url=url.format(names["api"]))
        try:
            snap = nova.refresh()
            assert sorted(snap.obj("host").tolist()) == ["a1", "a2", "a3", "b1"]
            assert snap.aggregates[0].metadata == {"availability_zone": "az1"}
        finally:
            nova.close()
            api.dispose()
            for engine in cells.values():
                engine.dispose()
    finally:
        with admin.begin() as conn:
            for name in names.values():
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def test_new_compute_hosts_are_mapped_to_their_cells_once(feed: Any) -> None:
    nova, env = feed
    with env["api"].begin() as conn:
        conn.execute(sa.insert(hs.host_mappings), [{"id": 1, "cell_id": 2, "host": "a1"}])
    nova.refresh()  # the command reads the cells before discovery starts
    assert sorted(nova.discover_hosts()) == ["a2", "a3", "b1"]
    with env["api"].connect() as conn:
        rows = conn.execute(sa.select(hs.host_mappings.c.host, hs.host_mappings.c.cell_id)
                            .order_by(hs.host_mappings.c.host)).all()
    assert [tuple(r) for r in rows] == [("a1", 2), ("a2", 2), ("a3", 2), ("b1", 3)]
    with env["cells"][CELL1].connect() as conn:
        flags = dict(conn.execute(sa.select(hs.compute_nodes.c.host, hs.compute_nodes.c.mapped)
                                  ).all())
    assert flags == {"a1": 1, "a2": 1, "a3": 1, "gone": None}  # a deleted node stays out
    assert nova.discover_hosts() == []


def test_a_node_deleted_or_an_instance_shelved_off_later_leaves_scheduling(feed: Any) -> None:
    nova, env = feed
    nova.refresh()
    later = NOW + dt.timedelta(seconds=30)
    with env["cells"][CELL1].begin() as conn:
        conn.execute(sa.update(hs.compute_nodes).where(hs.compute_nodes.c.host == "a3").values(
            deleted=3, deleted_at=later))
        # Shelve-offload (and a reschedule) set the instance's host to NULL.
        conn.execute(sa.update(hs.instances).where(hs.instances.c.uuid == "i-1").values(
            host=None, updated_at=later))
    env["clock"][0] += 30
    snap = nova.refresh()
    assert snap.num("has_service")[snap.row_of("a3", "a3.node")] == 0
    assert list(snap.obj("instances")[snap.row_of("a1", "a1.node")]) == []


def test_stamps_from_a_clock_behind_are_still_read(feed: Any) -> None:
    """Nova's services stamp rows with their own clocks: a row stamped a little before the
    newest one read is found by the overlap, and anything further behind by the next
    full read."""
    nova, env = feed
    nova.refresh()
    with env["cells"][CELL1].begin() as conn:  # the newest stamp moves ahead...
        conn.execute(sa.update(hs.compute_nodes).where(hs.compute_nodes.c.host == "a1").values(
            updated_at=NOW + dt.timedelta(seconds=60)))
    env["clock"][0] += 2
    nova.refresh()
    with env["cells"][CELL1].begin() as conn:  # ...then a host 5 s behind writes
        conn.execute(sa.update(hs.compute_nodes).where(hs.compute_nodes.c.host == "a2").values(
            vcpus_used=7, updated_at=NOW + dt.timedelta(seconds=55)))
        conn.execute(sa.update(hs.compute_nodes).where(hs.compute_nodes.c.host == "a3").values(
            vcpus_used=5, updated_at=NOW + dt.timedelta(seconds=10)))
    env["clock"][0] += 2
    snap = nova.refresh()
    assert snap.num("vcpus_used")[snap.row_of("a2", "a2.node")] == 7
    assert snap.num("vcpus_used")[snap.row_of("a3", "a3.node")] == 2  # 50 s behind: not yet
    env["clock"][0] += hs.RESYNC_INTERVAL
    snap = nova.refresh()
    assert snap.num("vcpus_used")[snap.row_of("a3", "a3.node")] == 5


def test_a_password_keeps_its_encoding_in_a_cell_template() -> None:
    assert hs.cell_url("{scheme}://{username}:{password}@{hostname}/{path}",
                       "mysql+pymysql://nova:p%40ss%2Fw@db/nova_cell1") == \
        "mysql+pymysql://nova:p%40ss%2Fw@db/nova_cell1"


def test_a_cell_whose_database_fails_is_skipped_and_a_moved_one_read_anew(
        feed: Any, tmp_path: Path) -> None:
    """Nova's scatter-gather skips a cell whose database fails and schedules in the
    others; a cell mapping moved to another database (nova-manage cell_v2 update_cell)
    is read there after a SIGHUP (``reset``)."""
    nova, db = feed
    api = db["api"]

    def point_cell2(url: str) -> None:
        with api.begin() as conn:
            conn.execute(sa.update(hs.cell_mappings).where(hs.cell_mappings.c.uuid == CELL2)
                         .values(database_connection=url, disabled=False))
        nova.reset()

    good = str(db["cells"][CELL2].url)
    point_cell2(good)
    assert nova.refresh().unreachable_cells == frozenset()
    point_cell2(f"sqlite:///{tmp_path}/no/such/dir/cell2.sqlite")
    snap = nova.refresh()
    assert snap.unreachable_cells == frozenset({CELL2})
    assert sorted(snap.obj("host").tolist()) == ["a1", "a2", "a3", "b1"]  # cell1 is read
    point_cell2(good)
    snap = nova.refresh()
    assert snap.unreachable_cells == frozenset() and "b1" in snap.obj("host").tolist()


def test_the_hosts_of_an_unreachable_cell_are_not_scheduled() -> None:
    from berth.explain import diagnosis_lines
    from berth.pipeline import Scheduler
    from builders import NOW as T
    from builders import cloud, host, spec

    snap = cloud(host("a", cell_uuid="c1"), host("b", cell_uuid="c2"))
    snap.unreachable_cells = frozenset({"c2"})
    decision = Scheduler(filters=[], weighers=[]).select_destinations(
        spec(), snap, now=T, rng=random.Random(0), explain=True)
    assert decision.hosts == [("a", "a")]
    assert decision.diagnosis is not None
    assert any("its cell's database did not answer" in line
               for line in diagnosis_lines(decision.diagnosis, verbose=True))


def test_metrics_read_as_novas_monitor_metrics() -> None:
    """MonitorMetricList.from_json: the CPU percents Nova stores as fractions come back
    multiplied by 100, and every value is an integer (truncated). Found by a differential
    run against Nova 34: Berth weighed 0.9 where Nova weighs 90."""
    metrics = [hs._metric(m) for m in (
        {"name": "cpu.percent", "value": 0.29, "source": "libvirt"},
        {"name": "cpu.frequency", "value": 2400.7, "timestamp": "2026-01-01T00:00:00"},
        {"name": "cpu.idle.percent", "value": 0.5})]
    assert [(m.name, m.value) for m in metrics] == [
        ("cpu.percent", 28), ("cpu.frequency", 2400), ("cpu.idle.percent", 50)]
    assert metrics[0].source == "libvirt"


def test_an_unset_allocation_ratio_is_the_configured_else_the_initial_one() -> None:
    """Nova's ComputeNode loads a NULL or 0.0 ratio (a row no resource tracker has
    updated since) as ``[DEFAULT] x_allocation_ratio``, else ``initial_x_*``: a host
    read with 0.0 failed every NUMA request and weighed as full."""
    from berth.config import SchedulerConfig

    node = {"host": "h", "hypervisor_hostname": "h", "vcpus": 8, "memory_mb": 4096,
            "local_gb": 10, "cpu_allocation_ratio": None, "ram_allocation_ratio": 0.0,
            "disk_allocation_ratio": 2.0}
    record = hs.record_of(node, None, CELL1, {})
    assert (record.cpu_allocation_ratio, record.ram_allocation_ratio,
            record.disk_allocation_ratio) == (4.0, 1.0, 2.0)
    config = SchedulerConfig.from_dict(
        {"DEFAULT": {"cpu_allocation_ratio": 16.0, "initial_ram_allocation_ratio": 1.5}})
    record = hs.record_of(node, None, CELL1, {}, hs.fallback_ratios(config))
    assert (record.cpu_allocation_ratio, record.ram_allocation_ratio,
            record.disk_allocation_ratio) == (16.0, 1.5, 2.0)


def test_a_node_whose_usage_was_never_updated_is_not_scheduled(feed: Any) -> None:
    """``free_disk_gb`` NULL: created, its resource tracker not run yet. Nova's host
    state ignores its usage and has no uuid a candidate could name (alone: NoValidHost;
    beside others its CPU weigher fails the request); Berth leaves it out until the
    row is updated."""
    nova, env = feed
    snap = nova.refresh()
    row = snap.row_of("a2", "a2.node")
    assert snap.num("has_service")[row] == 1
    later = NOW + dt.timedelta(seconds=30)
    with env["cells"][CELL1].begin() as conn:
        conn.execute(sa.update(hs.compute_nodes).where(hs.compute_nodes.c.host == "a2").values(
            free_disk_gb=None, updated_at=later))
    env["clock"][0] += 30
    snap = nova.refresh()
    assert snap.num("has_service")[snap.row_of("a2", "a2.node")] == 0
    with env["cells"][CELL1].begin() as conn:
        conn.execute(sa.update(hs.compute_nodes).where(hs.compute_nodes.c.host == "a2").values(
            free_disk_gb=100, updated_at=later + dt.timedelta(seconds=30)))
    env["clock"][0] += 30
    snap = nova.refresh()
    assert snap.num("has_service")[snap.row_of("a2", "a2.node")] == 1
