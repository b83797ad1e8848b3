"""``berth nova-scheduler``'s options that need no deployment: config files and
directories, and when hosts are discovered."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from berth.errors import ConfigError
from berth.nova.command import _discover, config_files


def test_a_config_dir_is_read_after_the_files_in_name_order(tmp_path: Path) -> None:
    d = tmp_path / "nova.conf.d"
    d.mkdir()
    for name in ("20-b.conf", "10-a.conf", "notes.txt"):
        (d / name).write_text("")
    assert config_files(["/etc/nova/nova.conf"], [str(d)]) == [
        "/etc/nova/nova.conf", str(d / "10-a.conf"), str(d / "20-b.conf")]
    with pytest.raises(ConfigError, match=r"^--config-dir /no/such: not a directory$"):
        config_files([], ["/no/such"])
    with pytest.raises(ConfigError, match="nova.conf is needed"):
        config_files([], [])


def test_a_config_dir_alone_is_a_nova_conf(tmp_path: Path) -> None:
    d = tmp_path / "nova.conf.d"
    d.mkdir()
    (d / "50-db.conf").write_text("[api_database]\nconnection = sqlite://\n")
    done = subprocess.run([sys.executable, "-m", "berth.cli", "nova-scheduler",
                           "--config-dir", str(d)], capture_output=True, text=True, timeout=60)
    # Read: the next thing missing is [placement], not [api_database].
    assert done.returncode == 2
    assert done.stderr.strip() == ("berth nova-scheduler: [placement]: neither auth_type nor "
                                   "endpoint_override is set"), done.stderr


def test_hosts_are_discovered_at_start_then_every_interval() -> None:
    """Nova's periodic task runs immediately; a failure waits for the next turn."""
    calls: list[int] = []

    class Feed:
        def discover_hosts(self) -> list[str]:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("the API database is away")
            return []

    stop = threading.Event()
    thread = threading.Thread(target=_discover, args=(Feed(), 0.05, stop))
    thread.start()
    try:
        deadline = 5.0
        while len(calls) < 2 and deadline > 0:
            stop.wait(0.01)
            deadline -= 0.01
        assert len(calls) >= 2
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    stop = threading.Event()
    stop.set()  # stopping at once: the first discovery still ran
    calls.clear()
    _discover(Feed(), 3600, stop)
    assert calls == [1]


def test_the_services_row_is_taken_over_kept_up_and_elects_as_nova() -> None:
    import datetime as dt

    import sqlalchemy as sa

    from berth.nova.service_row import SERVICE_TABLES, SERVICE_VERSION, ServiceRow, service_rows

    engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool)
    SERVICE_TABLES.create_all(engine)
    clock = [1_800_000_000.0]
    stamp = dt.datetime.fromtimestamp(clock[0], dt.UTC).replace(tzinfo=None)
    with engine.begin() as conn:  # the replaced nova-scheduler's row, and another's
        conn.execute(sa.insert(service_rows), [
            {"host": "ctl1", "binary": "nova-scheduler", "topic": "scheduler",
             "report_count": 7, "version": 70, "created_at": stamp, "deleted": 0,
             "last_seen_up": stamp - dt.timedelta(hours=1)},
            {"host": "ctl0", "binary": "nova-scheduler", "topic": "scheduler",
             "report_count": 3, "version": 74, "created_at": stamp, "deleted": 0,
             "last_seen_up": stamp - dt.timedelta(seconds=5)},
            {"host": "ctl1", "binary": "nova-compute", "topic": "compute", "report_count": 1,
             "version": 74, "created_at": stamp, "deleted": 0, "last_seen_up": None}])
    mine = ServiceRow(engine, "ctl1", clock=lambda: clock[0])
    mine.register()
    other = ServiceRow(engine, "ctl2", clock=lambda: clock[0])
    other.register()  # a new host: a new row
    with engine.connect() as conn:
        rows = {(r.host, r.binary): r for r in conn.execute(sa.select(service_rows))}
    assert rows[("ctl1", "nova-scheduler")].version == SERVICE_VERSION  # taken over
    assert rows[("ctl1", "nova-scheduler")].id == mine.row_id
    assert rows[("ctl2", "nova-scheduler")].report_count == 0 and rows[("ctl2", "nova-scheduler")].uuid
    # ctl0 beat 5 s ago: the first of those up; once it is down, ctl1 (beating).
    assert mine.beat() and mine.beat()
    assert mine.leader(60) == "ctl0"
    clock[0] += 120
    assert mine.beat()
    assert mine.leader(60) == "ctl1"
    with engine.connect() as conn:
        count = conn.execute(sa.select(service_rows.c.report_count).where(
            service_rows.c.id == mine.row_id)).scalar()
    assert count == 10
    with engine.begin() as conn:  # an operator deletes the row: not written again
        conn.execute(sa.update(service_rows).where(service_rows.c.id == mine.row_id).values(
            deleted=mine.row_id))
    assert mine.beat() is False and mine.gone and mine.beat() is False
