"""``berth nova-scheduler``'s own row in Nova's ``services`` table, kept as
nova-scheduler keeps its row (the database servicegroup driver).

Nova's scheduler writes one row, in the database of ``[database] connection``:
``binary = nova-scheduler``, ``topic = scheduler``, its ``host``, a uuid and its service
version; every ``[DEFAULT] report_interval`` seconds it adds one to ``report_count`` and
stamps ``last_seen_up``. Nothing in Nova needs the row to schedule, but ``openstack
compute service list`` shows it (with the replaced nova-scheduler's row on the same host
marked down otherwise), and the schedulers elect from those rows the one that maps new
compute hosts to their cells: the first, by host name, of those up.

A row that exists for the host is taken over (the nova-scheduler this process replaces
wrote it); a row deleted under a running scheduler is not written again (Nova logs the
same error and waits for a restart).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

LOG = logging.getLogger(__name__)

BINARY = "nova-scheduler"
TOPIC = "scheduler"
#: The service version Nova 34 writes (``nova.objects.service.SERVICE_VERSION``).
SERVICE_VERSION = 74

SERVICE_TABLES = sa.MetaData()
#: Nova's ``services`` table, every column a row needs.
service_rows = sa.Table(
    "services", SERVICE_TABLES,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36)), sa.Column("host", sa.String(255)),
    sa.Column("binary", sa.String(255)), sa.Column("topic", sa.String(255)),
    sa.Column("report_count", sa.Integer, nullable=False, default=0, server_default="0"),
    sa.Column("disabled", sa.Boolean, default=False),
    sa.Column("disabled_reason", sa.String(255)), sa.Column("last_seen_up", sa.DateTime),
    sa.Column("forced_down", sa.Boolean, default=False),
    sa.Column("version", sa.Integer, default=0),
    sa.Column("created_at", sa.DateTime), sa.Column("updated_at", sa.DateTime),
    sa.Column("deleted_at", sa.DateTime), sa.Column("deleted", sa.Integer, default=0),
)


def _utc(epoch: float) -> dt.datetime:
    """Nova's stamps: naive UTC."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).replace(tzinfo=None)


class ServiceRow:
    """This scheduler's row: :meth:`register` once, :meth:`beat` every report interval,
    :meth:`leader` to know which scheduler discovers hosts."""

    def __init__(self, engine: Any, host: str, *, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.host = host
        self.clock = clock
        self.row_id: int | None = None
        self.gone = False

    def register(self) -> None:
        """Take over the host's live row (its version brought to this one), or create
        it. Two schedulers of one host starting together create it once (Nova's unique
        host, binary and deleted): the loser reads the winner's."""
        for _ in range(2):
            found = self._find()
            if found is not None:
                self.row_id = int(found.id)
                if found.version != SERVICE_VERSION:
                    with self.engine.begin() as conn:
                        conn.execute(sa.update(service_rows).where(
                            service_rows.c.id == self.row_id).values(
                                version=SERVICE_VERSION, updated_at=_utc(self.clock())))
                return
            now = _utc(self.clock())
            try:
                with self.engine.begin() as conn:
                    result = conn.execute(sa.insert(service_rows).values(
                        uuid=str(uuidlib.uuid4()), host=self.host, binary=BINARY, topic=TOPIC,
                        report_count=0, disabled=False, forced_down=False,
                        version=SERVICE_VERSION, created_at=now, deleted=0))
                    key = result.inserted_primary_key
                self.row_id = int(key[0]) if key and key[0] is not None else None
                if self.row_id is not None:
                    return
            except sa.exc.IntegrityError:
                continue  # created meanwhile by another process of this host: read it
        found = self._find()
        self.row_id = int(found.id) if found is not None else None

    def _find(self) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(service_rows.c.id, service_rows.c.version).where(
                service_rows.c.host == self.host, service_rows.c.binary == BINARY,
                service_rows.c.deleted == 0)).first()

    def beat(self) -> bool:
        """One heartbeat: ``report_count`` + 1 and ``last_seen_up`` now. False (and
        logged once) when the row is gone."""
        if self.row_id is None or self.gone:
            return False
        now = _utc(self.clock())
        with self.engine.begin() as conn:
            done = conn.execute(sa.update(service_rows).where(
                service_rows.c.id == self.row_id, service_rows.c.deleted == 0).values(
                    report_count=service_rows.c.report_count + 1, last_seen_up=now,
                    updated_at=now)).rowcount
        if not done:
            self.gone = True
            LOG.error("The services table record for the %s service on host %s is gone. "
                      "You either need to stop this service if it should be deleted or "
                      "restart it to recreate the record in the database.", BINARY, self.host)
        return bool(done)

    def leader(self, service_down_time: float) -> str | None:
        """The scheduler that discovers hosts: the first by host name of the
        ``nova-scheduler`` rows up (heartbeat, else creation, within
        ``service_down_time``; not forced down), as Nova elects it."""
        now = _utc(self.clock())
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(
                service_rows.c.host, service_rows.c.last_seen_up, service_rows.c.created_at,
                service_rows.c.forced_down).where(
                    service_rows.c.binary == BINARY, service_rows.c.deleted == 0)).all()
        up = sorted(str(r.host) for r in rows if not r.forced_down and _up(
            r.last_seen_up or r.created_at, now, service_down_time))
        return up[0] if up else None


def _up(stamp: dt.datetime | None, now: dt.datetime, down_after: float) -> bool:
    return stamp is not None and abs((now - stamp).total_seconds()) <= down_after
