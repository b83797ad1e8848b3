"""Host state from reports: the compute-record store, the compute agent, the snapshot feed.

A compute node publishes two things, as Nova's resource tracker does:

* to **Placement** (through the typed client): its resource provider (uuid = the compute
  node uuid), inventories — VCPU, MEMORY_MB, DISK_GB with ``reserved`` from the DEFAULT
  ``reserved_*`` options and the allocation ratios resolved per reference §10.3/§11.4,
  PCPU (ratio 1) when it has dedicated CPUs — its traits (``COMPUTE_STATUS_DISABLED``
  while the service is disabled) and its aggregate membership;
* to the **compute-record store** (:class:`ComputeRecordStore`, tables ``berth_compute_*``
  in the same SQL database, created by the first process to start, with ``create_all``;
  the placement migrations are untouched): capabilities and state — hypervisor,
  ``cpu_info``, supported instances, NUMA topology, PCI pools, metrics, stats, usage,
  instances and the service row with its heartbeat.

Every write to the record store takes the next value of one change counter, so a
scheduler reads only what changed since its last look (:class:`SnapshotFeed`) and
applies it with ``HostSnapshot.upsert`` (O(1) per report, no rebuild). ComputeFilter's
"is up" is then the heartbeat's age against ``service_down_time`` at the ``now`` the
scheduler passes to the pure core.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from berth.config import SchedulerConfig
from berth.errors import InputError
from berth.model.aggregate import Aggregate
from berth.model.compute import Instance, MetricItem, ServiceRecord
from berth.model.request import Flavor
from berth.placement.client import ConflictError, NotFoundError, PlacementClient
from berth.placement.db import create_tables
from berth.placement.dbfaults import call_with_retry
from berth.placement.store_raw import raw_pool
from berth.provider_tree import ProviderSpec
from berth.snapshot import HostRecord, HostSnapshot

LOG = logging.getLogger(__name__)

STATUS_DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"

records_metadata = sa.MetaData()

compute_nodes = sa.Table(
    "berth_compute_nodes",
    records_metadata,
    sa.Column("uuid", sa.String(36), primary_key=True),
    sa.Column("host", sa.String(255), nullable=False, index=True),
    sa.Column("nodename", sa.String(255), nullable=False),
    sa.Column("report", sa.Text, nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=True),
    sa.Column("seq", sa.BigInteger, nullable=False, index=True),
)

host_aggregates = sa.Table(
    "berth_host_aggregates",
    records_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("uuid", sa.String(36), nullable=False, unique=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("hosts", sa.Text, nullable=False),
    sa.Column("metadata", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
)

record_counter = sa.Table(
    "berth_compute_counter",
    records_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
)

#: Heartbeats sent alone, for nodes whose last report is still their state: one row per
#: node, numbered from the same change counter as the reports, so a scheduler's catch-up
#: reads a heartbeat as a number, not as a whole report to parse and apply again.
heartbeats = sa.Table(
    "berth_compute_heartbeats",
    records_metadata,
    sa.Column("uuid", sa.String(36), primary_key=True),
    sa.Column("heartbeat", sa.Float, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False, index=True),
)

#: The change number of the last :meth:`ComputeRecordStore.set_aggregates`. The rows of
#: ``berth_host_aggregates`` carry it too, but an emptied set has no row left to carry
#: it, so a scheduler could not tell "no aggregates any more" from "nothing changed".
aggregates_changed = sa.Table(
    "berth_host_aggregates_changed",
    records_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
)


# --------------------------------------------------------------------------- reports
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


_RECORD_FIELDS = _field_names(HostRecord)
_SERVICE_FIELDS = _field_names(ServiceRecord)
_METRIC_FIELDS = _field_names(MetricItem)
_INSTANCE_FIELDS = _field_names(Instance)


def record_to_report(record: HostRecord) -> dict[str, Any]:
    """A host record as JSON-ready data (hardware objects through their ``to_dict``).

    Field by field rather than ``dataclasses.asdict``: a record is built fresh for each
    report and every value is plain data already, so the deep copy ``asdict`` makes
    was most of the cost of a report. Containers a receiver could keep are copied."""
    data = {name: getattr(record, name) for name in _RECORD_FIELDS}
    data["supported_instances"] = [list(s) for s in record.supported_instances]
    data["stats"] = dict(record.stats)
    data["numa_topology"] = (record.numa_topology.to_dict()
                             if record.numa_topology is not None else None)
    data["pci_stats"] = _pci_pools(record.pci_stats)
    service = record.service
    data["service"] = ({name: getattr(service, name) for name in _SERVICE_FIELDS}
                       if service is not None else None)
    data["instances"] = [{**{name: getattr(i, name) for name in _INSTANCE_FIELDS},
                          "image_properties": dict(i.image_properties)}
                         for i in record.instances.values()]
    data["metrics"] = [{name: getattr(m, name) for name in _METRIC_FIELDS}
                       for m in record.metrics]
    return data


def _pci_pools(stats: Any) -> list[dict[str, Any]] | None:
    if stats is None:
        return None
    for name in ("to_pools", "pools_as_dicts"):
        method = getattr(stats, name, None)
        if callable(method):
            return list(method())
    pools = getattr(stats, "pools", None)
    if pools is not None:
        return [dict(p) if isinstance(p, Mapping) else dict(p.__dict__) for p in pools]
    raise InputError("pci_stats: this PCI stats object cannot be serialized into a report")


def report_to_record(report: Mapping[str, Any]) -> HostRecord:
    """The inverse of :func:`record_to_report`."""
    data = dict(report)
    numa = data.pop("numa_topology", None)
    pci = data.pop("pci_stats", None)
    service = data.pop("service", None)
    instances = data.pop("instances", None) or []
    metrics = data.pop("metrics", None) or []
    record = HostRecord(**data)
    if numa is not None:
        from berth.hardware.numa import NUMATopology

        record.numa_topology = NUMATopology.from_dict(numa)
    if pci is not None:
        from berth.hardware.pci import PciDeviceStats

        record.pci_stats = PciDeviceStats.from_pools(pci, record.numa_topology)
    record.service = ServiceRecord(**service) if service else None
    record.instances = {i["uuid"]: Instance(**i) for i in instances}
    record.metrics = [MetricItem(**m) for m in metrics]
    return record


def report_beat(report: Mapping[str, Any]) -> float | None:
    """The heartbeat a report carries (its service's ``last_seen_up``), or None."""
    service = report.get("service")
    if isinstance(service, Mapping) and service.get("last_seen_up") is not None:
        return float(service["last_seen_up"])
    return None


def report_with_beat(report: Mapping[str, Any], beat: float) -> dict[str, Any]:
    """``report`` with its service's heartbeat set to ``beat`` (``last_seen_up`` and
    ``updated_at``, as a heartbeat updates Nova's service row)."""
    out = dict(report)
    if isinstance(report.get("service"), Mapping):
        out["service"] = {**dict(report["service"]), "last_seen_up": beat, "updated_at": beat}
    return out


def _newest(report: dict[str, Any], beat: float | None) -> dict[str, Any]:
    """``report`` with ``beat`` when that is newer than the report's own heartbeat."""
    if beat is None:
        return report
    own = report_beat(report)
    return report_with_beat(report, beat) if own is None or beat > own else report


class Changes(NamedTuple):
    """What changed in the record store after a change number."""

    #: Reports written since, oldest first.
    reports: list[dict[str, Any]]
    #: The newest change number (everything up to it has committed).
    top: int
    #: Whether the aggregates changed.
    aggregates_changed: bool
    #: Heartbeats sent alone since (node uuid -> heartbeat).
    beats: dict[str, float]


def aggregate_to_row(agg: Aggregate) -> dict[str, Any]:
    """An aggregate as a table row (hosts and metadata as JSON text)."""
    return {"id": agg.id, "uuid": agg.uuid, "name": agg.name,
            "hosts": json.dumps(list(agg.hosts)), "metadata": json.dumps(agg.metadata)}


#: The statements of every report and every scheduler refresh, built once (building a
#: statement and its cache key per call cost several times its run).
_NEXT_SEQ = (sa.update(record_counter).where(record_counter.c.id == 1)
             .values(seq=record_counter.c.seq + 1).returning(record_counter.c.seq))
_UPDATE_NODE = (sa.update(compute_nodes).where(compute_nodes.c.uuid == sa.bindparam("b_uuid"))
                .values(host=sa.bindparam("host"), nodename=sa.bindparam("nodename"),
                        report=sa.bindparam("report"), heartbeat=sa.bindparam("heartbeat"),
                        seq=sa.bindparam("seq")))
_READ_TOP_SQL = "SELECT seq FROM berth_compute_counter WHERE id = 1"
#: Raw DBAPI statements (``?`` placeholders) of a report and of a scheduler's catch-up:
#: one round trip each on PostgreSQL, and no SQLAlchemy execution context per statement
#: (which cost more than SQLite itself: a report took ~0.4 ms through it).
_RAW_NEXT_SEQ = "UPDATE berth_compute_counter SET seq = seq + 1 WHERE id = 1 RETURNING seq"
_RAW_UPSERT_NODE = (
    "INSERT INTO berth_compute_nodes (uuid, host, nodename, report, heartbeat, seq) "
    "VALUES (?, ?, ?, ?, ?, (SELECT seq FROM berth_compute_counter WHERE id = 1)) "
    "ON CONFLICT (uuid) DO UPDATE SET host = excluded.host, nodename = excluded.nodename, "
    "report = excluded.report, heartbeat = excluded.heartbeat, seq = excluded.seq"
)
_RAW_CHANGED_SINCE = "SELECT seq, report FROM berth_compute_nodes WHERE seq > ? ORDER BY seq"
_RAW_BEATS_SINCE = "SELECT seq, uuid, heartbeat FROM berth_compute_heartbeats WHERE seq > ?"
_RAW_UPSERT_BEATS = (
    "INSERT INTO berth_compute_heartbeats (uuid, heartbeat, seq) VALUES {} "
    "ON CONFLICT (uuid) DO UPDATE SET heartbeat = excluded.heartbeat, seq = excluded.seq"
)
#: Heartbeat rows per statement (two parameters each, under SQLite's old 999 limit).
_BEATS_PER_STATEMENT = 400
_RAW_AGGREGATES_SEQ = "SELECT seq FROM berth_host_aggregates_changed WHERE id = 1"


class ComputeRecordStore:
    """Compute-node reports and host aggregates in SQL, with a change counter.

    A scheduler asks :meth:`changes` before every request and the answer is nearly
    always "nothing new"; every agent report is a write. Both run on connections kept
    outside the pool in autocommit mode (:class:`~berth.placement.store_raw.RawPool`):
    one round trip each, no pool checkout, no SQLAlchemy execution context (40 µs
    against 90 µs through SQLAlchemy on PostgreSQL for the check).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._raw = raw_pool(engine)
        self._deferred: list[tuple[str, Mapping[str, Any], float | None]] | None = None
        self._defer_lock = threading.Lock()
        self._preloaded: dict[str, dict[str, Any]] | None = None
        create_tables(engine, records_metadata)
        for table in (record_counter, aggregates_changed):
            try:
                with engine.begin() as conn:
                    if conn.execute(sa.select(table.c.id)).first() is None:
                        conn.execute(sa.insert(table).values(id=1, seq=0))
            except sa.exc.IntegrityError:  # another process created it meanwhile
                pass

    @staticmethod
    def _next_seq(conn: sa.Connection) -> int:
        return int(conn.execute(_NEXT_SEQ).scalar_one())

    def begin_deferred(self) -> None:
        """Collect the reports published from now on until :meth:`end_deferred`, which
        writes them in one transaction (a registration wave: thousands of hosts, each
        reporting once or twice, would otherwise be as many transactions)."""
        with self._defer_lock:
            self._deferred = []

    def end_deferred(self) -> int:
        """Write the collected reports (the latest of each node) in one transaction;
        returns how many were collected."""
        with self._defer_lock:
            items, self._deferred = self._deferred or [], None
        self.publish_many(items)
        return len(items)

    def _defer(self, uuid: str, report: Mapping[str, Any], heartbeat: float | None) -> bool:
        """Keep the report for :meth:`end_deferred` when a wave is open."""
        with self._defer_lock:
            if self._deferred is None:
                return False
            self._deferred.append((uuid, report, heartbeat))
            return True

    def publish_many(self, items: Sequence[tuple[str, Mapping[str, Any], float | None]]) -> None:
        """Insert or replace many reports in one transaction (one counter update)."""
        if not items:
            return
        latest = {uuid: (report, beat) for uuid, report, beat in items}
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            top = int(conn.execute(
                sa.update(record_counter).where(record_counter.c.id == 1)
                .values(seq=record_counter.c.seq + len(latest)).returning(record_counter.c.seq)
            ).scalar_one())
            uuids = list(latest)
            existing: set[str] = set()
            for start in range(0, len(uuids), 1000):
                existing.update(conn.execute(
                    sa.select(compute_nodes.c.uuid)
                    .where(compute_nodes.c.uuid.in_(uuids[start:start + 1000]))).scalars())
            rows = []
            for offset, uuid in enumerate(uuids):
                report, beat = latest[uuid]
                rows.append({"uuid": uuid, "host": report["host"],
                             "nodename": report.get("nodename") or report["host"],
                             "report": json.dumps(report, sort_keys=True, default=str),
                             "heartbeat": beat, "seq": top - len(uuids) + 1 + offset})
            new = [r for r in rows if r["uuid"] not in existing]
            old = [r for r in rows if r["uuid"] in existing]
            if new:
                conn.execute(sa.insert(compute_nodes), new)
            if old:
                conn.execute(_UPDATE_NODE, [{**r, "b_uuid": r["uuid"]} for r in old])

    def publish(self, uuid: str, report: Mapping[str, Any], heartbeat: float | None) -> int:
        """Insert or replace one node's report; returns its change number (0 when it
        waits for :meth:`end_deferred`)."""
        if self._defer(uuid, report, heartbeat):
            return 0
        text = json.dumps(report, sort_keys=True, default=str)
        # The counter's row lock (BEGIN IMMEDIATE on SQLite) orders the writers: a change
        # number is visible only once every smaller one has committed.
        batch = [
            ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
            (_RAW_NEXT_SEQ, ()),
            (_RAW_UPSERT_NODE, (uuid, report["host"], report.get("nodename") or report["host"],
                                text, heartbeat)),
            ("COMMIT", ()),
        ]
        # Safe to run twice: the same row again, and one more change number.
        out = call_with_retry(lambda: self._raw.run(batch), safe=True,
                              what=f"publishing the report of {uuid}")
        return int(out[1][0][0])

    def set_aggregates(self, aggregates: Iterable[Aggregate]) -> None:
        """Replace every host aggregate."""
        rows = [aggregate_to_row(a) for a in aggregates]
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            seq = self._next_seq(conn)
            conn.execute(sa.delete(host_aggregates))
            if rows:
                conn.execute(sa.insert(host_aggregates), [{**r, "seq": seq} for r in rows])
            conn.execute(sa.update(aggregates_changed).where(aggregates_changed.c.id == 1)
                         .values(seq=seq))

    def aggregates(self) -> list[Aggregate]:
        """Every host aggregate, by id."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(host_aggregates).order_by(host_aggregates.c.id)).all()
        return [Aggregate(id=r.id, uuid=r.uuid, name=r.name, hosts=tuple(json.loads(r.hosts)),
                          metadata=json.loads(r.metadata)) for r in rows]

    def latest(self) -> int:
        """The newest change number."""
        ((seq,),) = call_with_retry(lambda: self._raw.run([(_READ_TOP_SQL, ())]), safe=True,
                                    what="reading the reports' change number")[0]
        return int(seq)

    def close(self) -> None:
        """Close the kept connections."""
        self._raw.close()

    def changes(self, since: int) -> Changes:
        """What changed after the change number ``since`` (see :class:`Changes`)."""
        if since and self.latest() == since:
            return Changes([], since, False, {})
        # Change numbers are taken under the counter's row lock by each writer, so
        # everything up to ``top`` has committed once ``top`` is visible; a report with
        # a larger number, committed after ``top`` was read, waits for the next call.
        batch = [(_READ_TOP_SQL, ()), (_RAW_CHANGED_SINCE, (since,)), (_RAW_AGGREGATES_SEQ, ()),
                 (_RAW_BEATS_SINCE, (since,))]
        top_rows, rows, agg_rows, beat_rows = call_with_retry(
            lambda: self._raw.run(batch), safe=True, what="reading the reports that changed")
        top, agg_seq = int(top_rows[0][0]), int(agg_rows[0][0])
        agg_changed = since == 0 or agg_seq > since
        return Changes([json.loads(report) for seq, report in rows if seq <= top], top,
                       agg_changed,
                       {uuid: float(beat) for seq, uuid, beat in beat_rows if seq <= top})

    def heartbeats(self, beats: Mapping[str, float]) -> int:
        """Store heartbeats alone (node uuid -> heartbeat) for nodes whose last report
        is still their state, in one transaction under one change number; returns it
        (0 for no heartbeats). A report written later carries its own, newer one."""
        if not beats:
            return 0
        items = list(beats.items())
        batch: list[tuple[Any, ...]] = [("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
                                        (_RAW_NEXT_SEQ, ())]
        for start in range(0, len(items), _BEATS_PER_STATEMENT):
            chunk = items[start:start + _BEATS_PER_STATEMENT]
            marks = ", ".join(["(?, ?, (SELECT seq FROM berth_compute_counter WHERE id = 1))"]
                              * len(chunk))
            batch.append((_RAW_UPSERT_BEATS.format(marks),
                          [value for uuid, beat in chunk for value in (uuid, float(beat))]))
        batch.append(("COMMIT", ()))
        # Safe to run twice: the same heartbeats again, under one more change number.
        out = call_with_retry(lambda: self._raw.run(batch), safe=True,
                              what=f"storing {len(items)} heartbeats")
        return int(out[1][0][0])

    def preload(self, uuids: Iterable[str] | None = None) -> None:
        """Read the stored reports of ``uuids`` (every one by default) at once; until
        :meth:`drop_preload`, :meth:`report_of` answers from what was read (a
        registration wave asks for every host's: one query each otherwise)."""
        if uuids is None:
            found = self._stored_reports()
        else:
            wanted = list(uuids)
            found = []
            for start in range(0, len(wanted), 500):
                found += self._stored_reports(wanted[start:start + 500])
        self._preloaded = dict(found)

    def drop_preload(self) -> None:
        """:meth:`report_of` reads the database again."""
        self._preloaded = None

    def report_of(self, uuid: str) -> dict[str, Any] | None:
        """The last report stored for the compute node ``uuid`` (with its newest
        heartbeat), or None."""
        if self._preloaded is not None:
            return self._preloaded.get(uuid)
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(compute_nodes.c.report, heartbeats.c.heartbeat)
                .select_from(compute_nodes.outerjoin(
                    heartbeats, heartbeats.c.uuid == compute_nodes.c.uuid))
                .where(compute_nodes.c.uuid == uuid)).first()
        return None if row is None else _newest(dict(json.loads(row.report)), row.heartbeat)

    def reports(self) -> list[dict[str, Any]]:
        """Every stored report (with its newest heartbeat), by host and node name."""
        return [report for _, report in self._stored_reports()]

    def _stored_reports(self, uuids: Sequence[str] | None = None
                        ) -> list[tuple[str, dict[str, Any]]]:
        """(node uuid, report with its newest heartbeat) of every stored report, or of
        those of ``uuids``, by host and node name."""
        query = (sa.select(compute_nodes.c.uuid, compute_nodes.c.report, heartbeats.c.heartbeat)
                 .select_from(compute_nodes.outerjoin(
                     heartbeats, heartbeats.c.uuid == compute_nodes.c.uuid))
                 .order_by(compute_nodes.c.host, compute_nodes.c.nodename))
        if uuids is not None:
            query = query.where(compute_nodes.c.uuid.in_(uuids))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [(r.uuid, _newest(dict(json.loads(r.report)), r.heartbeat)) for r in rows]


class RowIndex(dict[str, int]):
    """Compute node uuid -> snapshot row; ``version`` counts the entries that changed
    (so a mapping derived from it knows when to rebuild)."""

    version = 0

    def __setitem__(self, uuid: str, row: int) -> None:
        if self.get(uuid) != row:
            self.version += 1
            super().__setitem__(uuid, row)


class SnapshotFeed:
    """A scheduler's :class:`HostSnapshot`, kept current from the record store.

    :meth:`refresh` reads only the reports changed since the last call and upserts them;
    aggregates are re-read when they changed. ``uuid_rows`` indexes rows by compute node
    uuid for mapping placement's answer.
    """

    def __init__(self, store: ComputeRecordStore) -> None:
        self.store = store
        self.snapshot = HostSnapshot()
        self.seq = 0
        self.uuid_rows = RowIndex()
        self._lock = threading.Lock()

    def refresh(self) -> HostSnapshot:
        """Apply every change since the last refresh; returns the snapshot."""
        with self._lock:
            changes = self.store.changes(self.seq)
            if changes.aggregates_changed:
                self.snapshot.set_aggregates(self.store.aggregates())
            for report in changes.reports:
                record = report_to_record(report)
                row = self.snapshot.upsert(record)
                if record.uuid:
                    self.uuid_rows[record.uuid] = row
            services = self.snapshot.obj("service")
            for uuid, beat in changes.beats.items():
                at = self.uuid_rows.get(uuid)
                if at is None:
                    continue  # no report of it yet: its first report carries a beat
                service = services[at]
                if service is None or service.last_seen_up is None or beat > service.last_seen_up:
                    self._set_beat(at, beat)
            self.seq = changes.top
        return self.snapshot

    def _set_beat(self, row: int, beat: float) -> None:
        """A host's new heartbeat: its service record and its column (both paths of
        ComputeFilter read the same)."""
        services = self.snapshot.obj("service")
        service = services[row]
        if service is not None:
            services[row] = replace(service, last_seen_up=beat, updated_at=beat)
        self.snapshot.update_host(row, service_heartbeat=beat)


class RunningInstances:
    """Where each instance runs, as its host last reported it: the compute side's view
    (Nova's instances and their ``host``), read from the record store, never from a
    scheduler's snapshot.

    Kept current like :class:`SnapshotFeed`, without the snapshot: every look first
    applies the reports changed since the previous look (nearly always none, one read
    of the change counter), so a look costs the changes since the last one, not a scan
    of every host. An instance runs on a host from the first report of that host that
    lists it until a report of that host no longer does; an instance no report lists
    (never built, or its build failed) runs nowhere.
    """

    def __init__(self, store: ComputeRecordStore) -> None:
        self.store = store
        self.seq = 0
        #: node key -> the instances its last report listed
        self._listed: dict[str, frozenset[str]] = {}
        #: instance -> (node key, host)
        self._where: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def hosts_of(self, instance_uuids: Iterable[str]) -> dict[str, str]:
        """The host each of ``instance_uuids`` runs on now; those running nowhere are
        left out."""
        with self._lock:
            self._catch_up()
            where = self._where
            return {u: where[u][1] for u in instance_uuids if u in where}

    def _catch_up(self) -> None:
        changes = self.store.changes(self.seq)
        for report in changes.reports:
            host = report["host"]
            node = report.get("uuid") or f"{host}/{report.get('nodename') or host}"
            listed = frozenset(i["uuid"] for i in report.get("instances") or ())
            for gone in self._listed.get(node, frozenset()) - listed:
                if self._where.get(gone, ("",))[0] == node:  # not since reported elsewhere
                    del self._where[gone]
            for uuid in listed:
                self._where[uuid] = (node, host)
            self._listed[node] = listed
        self.seq = changes.top


# --------------------------------------------------------------------------- agent
@dataclass
class ComputeNodeSpec:
    """What a compute node is: its size, capabilities and placement traits.

    ``vcpus`` are shared (VCPU) CPUs and ``pcpus`` dedicated ones (PCPU, like
    ``[compute] cpu_dedicated_set``). Ratios None resolve per reference §10.3.
    ``stats`` are extra host stats reported as they are (ComputeCapabilitiesFilter's
    ``stats.*`` keys); ``io_workload`` is the I/O-heavy operations the node runs besides
    this system's builds (the ``io_workload`` stat, IoOpsFilter's ``num_io_ops``).
    """

    host: str
    vcpus: int
    memory_mb: int
    local_gb: int
    uuid: str | None = None
    nodename: str | None = None
    cell_uuid: str | None = None
    pcpus: int = 0
    hypervisor_type: str = "QEMU"
    hypervisor_version: int = 8002000
    cpu_info: Mapping[str, Any] | str = field(default_factory=dict)
    supported_instances: list[list[str]] = field(
        default_factory=lambda: [["x86_64", "qemu", "hvm"]])
    host_ip: str | None = None
    numa_topology: Any = None
    pci_stats: Any = None
    metrics: list[MetricItem] = field(default_factory=list)
    traits: list[str] = field(default_factory=list)
    cpu_allocation_ratio: float | None = None
    ram_allocation_ratio: float | None = None
    disk_allocation_ratio: float | None = None
    stats: dict[str, str] = field(default_factory=dict)
    io_workload: int = 0
    #: Inventories of the root provider beyond VCPU, PCPU, MEMORY_MB and DISK_GB
    #: (custom classes, VGPU...), each a full Placement inventory record.
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Providers nested under the root (NUMA cells, PCI PFs...), each after its parent.
    children: list[ProviderSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("vcpus", "memory_mb", "local_gb", "pcpus", "io_workload"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"compute node {self.host}: {name} must be an integer >= 0, "
                                 f"got {value!r}")
        if self.uuid is None:
            from berth.cloudfile import stable_uuid

            self.uuid = stable_uuid("node", self.host, self.nodename or self.host)


def agent_key(host: str, nodename: str | None) -> str:
    """The name a compute node's agent goes by (``Stack.agents``, the fake driver): the
    host name when the node is named like its host, else ``host/node`` — the nodes of a
    multi-node service host (Ironic) each have their own agent."""
    return host if not nodename or nodename == host else f"{host}/{nodename}"


#: Stats an agent computes itself; any other stat of a node is its own (``node.stats``).
AGENT_STATS = frozenset({"num_instances", "io_workload", "failed_builds"})


def node_from_record(record: HostRecord, traits: Iterable[str] = (), pcpus: int = 0) -> ComputeNodeSpec:
    """The node a stored record describes, for an agent re-created on a restart.

    A record does not hold what only placement knows: the provider's ``traits``
    (COMPUTE_STATUS_DISABLED is the service's state, not the node's, and is dropped)
    and its PCPU total (``pcpus``). The ratios are the record's resolved ones.
    """
    stats = {str(k): str(v) for k, v in (record.stats or {}).items() if k not in AGENT_STATS}
    raw_io = str((record.stats or {}).get("io_workload", "0"))
    io_workload = int(raw_io) if raw_io.isdigit() else 0
    if not raw_io.isdigit():
        stats["io_workload"] = raw_io  # reported as the node reported it
    return ComputeNodeSpec(
        host=record.host, nodename=record.nodename, uuid=record.uuid, cell_uuid=record.cell_uuid,
        vcpus=int(record.vcpus_total), memory_mb=int(record.total_usable_ram_mb),
        local_gb=int(record.total_usable_disk_gb), pcpus=pcpus,
        hypervisor_type=record.hypervisor_type or "QEMU",
        hypervisor_version=int(record.hypervisor_version or 0), cpu_info=record.cpu_info,
        supported_instances=[list(s) for s in record.supported_instances],
        host_ip=record.host_ip, numa_topology=record.numa_topology, pci_stats=record.pci_stats,
        metrics=list(record.metrics), traits=sorted(set(traits) - {STATUS_DISABLED_TRAIT}),
        cpu_allocation_ratio=record.cpu_allocation_ratio,
        ram_allocation_ratio=record.ram_allocation_ratio,
        disk_allocation_ratio=record.disk_allocation_ratio,
        stats=stats, io_workload=io_workload)


def resolved_ratio(value: float | None, kind: str, config: SchedulerConfig) -> float:
    """A node's ratio: its own when set and non-zero, else the option, else initial_*."""
    if value:
        return float(value)
    configured = getattr(config, f"{kind}_allocation_ratio")
    if configured:
        return float(configured)
    return float(getattr(config, f"initial_{kind}_allocation_ratio"))


def inventories_for(node: ComputeNodeSpec, config: SchedulerConfig) -> dict[str, dict[str, Any]]:
    """The inventories the node reports to placement (reference §8.5, capacity rule)."""
    inv: dict[str, dict[str, Any]] = {}
    if node.vcpus:
        inv["VCPU"] = {"total": node.vcpus, "reserved": min(config.reserved_host_cpus, node.vcpus),
                       "min_unit": 1, "max_unit": node.vcpus, "step_size": 1,
                       "allocation_ratio": resolved_ratio(node.cpu_allocation_ratio, "cpu", config)}
    if node.pcpus:
        inv["PCPU"] = {"total": node.pcpus, "reserved": 0, "min_unit": 1,
                       "max_unit": node.pcpus, "step_size": 1, "allocation_ratio": 1.0}
    if node.memory_mb:
        inv["MEMORY_MB"] = {
            "total": node.memory_mb,
            "reserved": min(config.reserved_host_memory_mb, node.memory_mb),
            "min_unit": 1, "max_unit": node.memory_mb, "step_size": 1,
            "allocation_ratio": resolved_ratio(node.ram_allocation_ratio, "ram", config)}
    if node.local_gb:
        inv["DISK_GB"] = {
            "total": node.local_gb,
            "reserved": min(math.ceil(config.reserved_host_disk_mb / 1024), node.local_gb),
            "min_unit": 1, "max_unit": node.local_gb, "step_size": 1,
            "allocation_ratio": resolved_ratio(node.disk_allocation_ratio, "disk", config)}
    for rc, extra in node.resources.items():
        inv[rc] = dict(extra)
    return inv


def child_uuid(node: ComputeNodeSpec, name: str) -> str:
    """The uuid of the nested provider ``name`` of ``node`` (stable across runs)."""
    from berth.cloudfile import stable_uuid

    assert node.uuid is not None
    return stable_uuid("provider", node.uuid, name)


def publish_provider(client: PlacementClient, uuid: str, name: str, *,
                     parent: str | None = None, inventory: Mapping[str, Mapping[str, Any]],
                     traits: Sequence[str], aggregates: Sequence[str] | None = None) -> None:
    """Create the provider if it is missing, then replace its inventories, traits and
    (when given) aggregates, retrying on a generation conflict."""
    for attempt in range(5):
        try:
            try:
                generation = client.get_provider(uuid).generation
            except NotFoundError:
                try:
                    generation = client.create_provider(
                        name, uuid=uuid, parent_provider_uuid=parent).generation
                except ConflictError:  # created concurrently
                    generation = client.get_provider(uuid).generation
            for rc in inventory:
                if rc.startswith("CUSTOM_"):
                    client.create_resource_class(rc)
            generation = client.set_inventories(uuid, generation, inventory)
            for trait in traits:
                if trait.startswith("CUSTOM_"):
                    client.create_trait(trait)
            generation = client.set_provider_traits(uuid, generation, sorted(traits))
            if aggregates is not None:
                client.set_aggregates(uuid, generation, sorted(aggregates))
            return
        except ConflictError as exc:
            if not exc.is_generation_conflict or attempt == 4:
                raise
            LOG.debug("provider %s changed meanwhile; retrying", uuid)


@dataclass
class _Placed:
    instance: Instance
    flavor: Flavor


def _same_state(a: HostRecord, b: HostRecord) -> bool:
    """Whether two records of a node differ in nothing but their heartbeat."""
    if a.service is not None and b.service is not None:
        b = replace(b, service=replace(b.service, last_seen_up=a.service.last_seen_up,
                                       updated_at=a.service.updated_at))
    return replace(b, updated=a.updated) == a


def _flavor_of(resources: Mapping[str, int], flavor_id: int | str | None) -> Flavor:
    """The flavor numbers an allocation on one node stands for (VCPU and PCPU are both
    the flavor's vCPUs; disk is root + ephemeral, counted here as root)."""
    return Flavor(name="restored", id=flavor_id,
                  vcpus=int(resources.get("VCPU", 0)) + int(resources.get("PCPU", 0)),
                  memory_mb=int(resources.get("MEMORY_MB", 0)),
                  root_gb=int(resources.get("DISK_GB", 0)))


def _int_stat(stats: Mapping[str, Any], key: str) -> int:
    try:
        return max(0, int(stats.get(key, 0) or 0))
    except (TypeError, ValueError):
        return 0


class ComputeAgent:
    """One compute node's reporter (Nova's resource tracker and service heartbeat).

    ``register()`` takes over the usage of the node's stored record (a restart), creates
    the provider and publishes everything; ``report()`` publishes state and heartbeat;
    ``spawn``/``destroy`` change the node's usage and report at once. The periodic
    reports of a process's agents come from one thread
    (:class:`~berth.service.reporting.Reporter`): mostly a heartbeat, now and then the
    whole state, and Placement again only after a publication that failed.

    The agent owns its provider's traits and aggregate membership: registration
    replaces them with the node's own, so nothing an earlier run published survives
    (traits set on the provider by other means are removed too).
    """

    def __init__(
        self,
        node: ComputeNodeSpec,
        client: PlacementClient,
        records: ComputeRecordStore,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.client = client
        self.records = records
        self.config = config or SchedulerConfig.default()
        self.clock = clock
        self.disabled = False
        self.disabled_reason: str | None = None
        self.forced_down = False
        #: A silent agent does not report periodically (a host that is down); what it
        #: still publishes keeps its last heartbeat.
        self.silent = False
        #: Consecutive failed builds (reset by a successful one), reported as the
        #: ``failed_builds`` stat while ``[compute]
        #: consecutive_build_service_disable_threshold`` is non-zero.
        self.failed_builds = 0
        self.created_at = clock()
        #: The heartbeat of the last report (None before the first).
        self.last_heartbeat: float | None = None
        self._placed: dict[str, _Placed] = {}
        #: Instances moved away whose usage stays until the move is confirmed.
        self._held: dict[str, _Placed] = {}
        #: Usage by workloads this system did not place (seeded clouds), as a flavor.
        self.baseline: Flavor | None = None
        #: Instances this system did not place and knows only by count (seeded clouds).
        self.baseline_instances = 0
        self._published_inventory: dict[str, dict[str, Any]] | None = None
        self._published_traits: set[str] | None = None
        self._children_published = False
        #: The provider may differ from the node: nothing published yet, or the last
        #: :meth:`sync_placement` failed part-way (the periodic reports try again).
        self.placement_pending = True
        #: The last report published, heartbeat aside (:meth:`report` ``if_changed``).
        self._last_record: HostRecord | None = None
        self._lock = threading.RLock()

    @property
    def uuid(self) -> str:
        """The compute node uuid (= the root resource provider uuid)."""
        assert self.node.uuid is not None
        return self.node.uuid

    @property
    def down(self) -> bool:
        """The host does not run builds: its agent is silent or its service forced down."""
        return self.silent or self.forced_down

    # ----------------------------------------------------------------- placement side
    def traits(self) -> set[str]:
        """The provider traits: the node's plus COMPUTE_STATUS_DISABLED when disabled."""
        traits = set(self.node.traits)
        if self.disabled:
            traits.add(STATUS_DISABLED_TRAIT)
        return traits

    def _ensure_provider(self) -> tuple[int, bool]:
        """The provider's generation, and whether this call created it. An agent that
        has published nothing yet tries to create it first (a new host: one call)."""
        name = self.node.nodename or self.node.host
        if self._published_inventory is None:
            try:
                return self.client.create_provider(name, uuid=self.uuid).generation, True
            except ConflictError:  # it exists (a restart), or its name is taken
                pass
        try:
            return self.client.get_provider(self.uuid).generation, False
        except NotFoundError:
            try:
                return self.client.create_provider(name, uuid=self.uuid).generation, True
            except ConflictError:  # created concurrently
                return self.client.get_provider(self.uuid).generation, False

    def sync_placement(self, aggregates: Sequence[Aggregate] | None = None) -> None:
        """Publish inventories and traits when they differ from what this agent last
        published (always on its first call, so a provider left from an earlier run
        loses what the node no longer has), and, when ``aggregates`` is given, the
        node's membership in them — an empty membership too. A provider this call
        created has no traits or aggregates yet, so empty ones are not written to it."""
        with self._lock:
            inventory = inventories_for(self.node, self.config)
            traits = self.traits()
            if (aggregates is None and not self.placement_pending
                    and inventory == self._published_inventory
                    and traits == self._published_traits):
                return  # the provider holds all this already: no call (as Nova's cache)
            self.placement_pending = True
            for attempt in range(5):
                generation, created = self._ensure_provider()
                try:
                    if inventory != self._published_inventory:
                        for rc in inventory:
                            if rc.startswith("CUSTOM_"):
                                self.client.create_resource_class(rc)
                        generation = self.client.set_inventories(self.uuid, generation, inventory)
                        self._published_inventory = inventory
                    if created and not traits:
                        self._published_traits = traits
                    if self._published_traits is None or traits != self._published_traits:
                        for trait in traits:
                            if trait.startswith("CUSTOM_"):
                                self.client.create_trait(trait)
                        generation = self.client.set_provider_traits(
                            self.uuid, generation, sorted(traits))
                        self._published_traits = traits
                    if aggregates is not None:
                        mine = sorted(a.uuid for a in aggregates if self.node.host in a.hosts)
                        if mine or not created:
                            self.client.set_aggregates(self.uuid, generation, mine)
                    break
                except ConflictError as exc:
                    if not exc.is_generation_conflict or attempt == 4:
                        raise
                    LOG.debug("provider %s changed meanwhile; retrying", self.uuid)
            self._sync_children()
            self.placement_pending = False

    def _sync_children(self) -> None:
        """Publish the nested providers once (named ``<node>_<name>``, as Nova names
        the children it makes); a node without any leaves what is there alone."""
        if self._children_published or not self.node.children:
            return
        root_name = self.node.nodename or self.node.host
        uuids: dict[str | None, str] = {None: self.uuid}
        for child in self.node.children:
            uuid = uuids[child.name] = child_uuid(self.node, child.name)
            publish_provider(self.client, uuid, f"{root_name}_{child.name}",
                             parent=uuids[child.parent], inventory=child.resources,
                             traits=child.traits)
        self._children_published = True

    # ----------------------------------------------------------------- usage
    def spawn(self, instance_uuid: str, flavor: Flavor, project_id: str | None = None,
              publish: bool = True, image_properties: Mapping[str, Any] | None = None) -> None:
        """Account for a new instance on this node and report."""
        with self._lock:
            self._placed[instance_uuid] = _Placed(
                Instance(uuid=instance_uuid, instance_type_id=flavor.id, project_id=project_id,
                         image_properties=dict(image_properties or {})),
                flavor)
        if publish:
            self.report()

    def destroy(self, instance_uuid: str, publish: bool = True) -> None:
        """Forget an instance and report."""
        with self._lock:
            self._placed.pop(instance_uuid, None)
        if publish:
            self.report()

    # Moves: the source of a migration keeps the instance's usage (as Nova's resource
    # tracker counts an outgoing migration) but no longer lists the instance, which
    # runs on the destination now, until the move is confirmed (release) or reverted
    # (unhold).
    def hold(self, instance_uuid: str, publish: bool = True) -> None:
        """The instance left for another host; its usage stays here."""
        with self._lock:
            placed = self._placed.pop(instance_uuid, None)
            if placed is not None:
                self._held[instance_uuid] = placed
        if publish:
            self.report()

    def release(self, instance_uuid: str, publish: bool = True) -> None:
        """The move was confirmed: the held usage goes."""
        with self._lock:
            self._held.pop(instance_uuid, None)
        if publish:
            self.report()

    def unhold(self, instance_uuid: str, publish: bool = True) -> None:
        """The move was reverted: the instance runs here again, as it was."""
        with self._lock:
            placed = self._held.pop(instance_uuid, None)
            if placed is not None:
                self._placed[instance_uuid] = placed
        if publish:
            self.report()

    def record_failed_build(self) -> None:
        """Count a failed build (the ``failed_builds`` stat, BuildFailureWeigher's
        input), as Nova's compute does only while ``[compute]
        consecutive_build_service_disable_threshold`` is non-zero."""
        if not self.config.compute.consecutive_build_service_disable_threshold:
            return
        with self._lock:
            self.failed_builds += 1

    def record_successful_build(self) -> None:
        """A build succeeded: the failures are no longer consecutive (Nova resets its
        counter the same way)."""
        with self._lock:
            self.failed_builds = 0

    def set_disabled(self, disabled: bool, reason: str | None = None) -> None:
        """Disable/enable the service: the trait and the service row change together."""
        with self._lock:
            self.disabled = disabled
            self.disabled_reason = reason if disabled else None
        self.sync_placement()
        self.report()

    # ----------------------------------------------------------------- reports
    def host_record(self, now: float) -> HostRecord:
        """The node's state as the scheduler sees it (Nova's ComputeNode + Service)."""
        config, node = self.config, self.node
        with self._lock:
            placed = list(self._placed.values())
            held = [p.flavor for p in self._held.values()]
            baseline = [self.baseline] if self.baseline is not None else []
            baseline_instances = self.baseline_instances
            failed = self.failed_builds
            disabled, reason, forced = self.disabled, self.disabled_reason, self.forced_down
        flavors = [p.flavor for p in placed] + held + baseline
        vcpus_used = config.reserved_host_cpus + sum(f.vcpus for f in flavors)
        ram_used = config.reserved_host_memory_mb + sum(f.memory_mb for f in flavors)
        disk_used = math.ceil(config.reserved_host_disk_mb / 1024) + sum(
            f.root_gb + f.ephemeral_gb for f in flavors)
        cpu_info = node.cpu_info if isinstance(node.cpu_info, str) else json.dumps(
            dict(node.cpu_info), sort_keys=True)
        stats = dict(node.stats)
        stats.setdefault("io_workload", str(node.io_workload))
        stats["num_instances"] = str(len(placed) + baseline_instances)
        # Nova's computes report failed_builds only while the threshold is non-zero.
        stats.pop("failed_builds", None)
        if config.compute.consecutive_build_service_disable_threshold:
            stats["failed_builds"] = str(failed)
        service = ServiceRecord(host=node.host, disabled=disabled, disabled_reason=reason,
                                forced_down=forced, last_seen_up=now, created_at=self.created_at,
                                updated_at=now)
        return HostRecord(
            host=node.host, nodename=node.nodename or node.host, cell_uuid=node.cell_uuid,
            uuid=node.uuid,
            total_usable_ram_mb=node.memory_mb, free_ram_mb=node.memory_mb - ram_used,
            total_usable_disk_gb=node.local_gb, disk_mb_used=disk_used * 1024,
            free_disk_mb=(node.local_gb - disk_used) * 1024,
            vcpus_total=node.vcpus, vcpus_used=vcpus_used,
            hypervisor_type=node.hypervisor_type, hypervisor_version=node.hypervisor_version,
            hypervisor_hostname=node.nodename or node.host, host_ip=node.host_ip,
            cpu_info=cpu_info, supported_instances=[list(s) for s in node.supported_instances],
            stats=stats, metrics=list(node.metrics), numa_topology=node.numa_topology,
            pci_stats=node.pci_stats,
            cpu_allocation_ratio=resolved_ratio(node.cpu_allocation_ratio, "cpu", config),
            ram_allocation_ratio=resolved_ratio(node.ram_allocation_ratio, "ram", config),
            disk_allocation_ratio=resolved_ratio(node.disk_allocation_ratio, "disk", config),
            service=service, instances={p.instance.uuid: p.instance for p in placed},
            updated=now,
        )

    def report(self, now: float | None = None, *, if_changed: bool = False) -> int | None:
        """Publish state and heartbeat (now, or ``now``); returns the record's change
        number. A silent agent publishes its state under its last heartbeat: a host
        that is down stays down however its usage changes.

        With ``if_changed``, a state equal to the last one published (heartbeat aside)
        is not published: None, and the caller sends the heartbeat alone."""
        with self._lock:
            if now is None:
                silent_beat = self.last_heartbeat if self.silent else None
                now = self.clock() if silent_beat is None else silent_beat
            record = self.host_record(now)
            last = self._last_record
            self.last_heartbeat = now
            if if_changed and last is not None and _same_state(record, last):
                return None
            self._last_record = record
        return self.records.publish(self.uuid, record_to_report(record), now)

    def beat(self) -> float:
        """The heartbeat of now, for a report of it alone (the state went out with the
        last report: every change reports at once)."""
        with self._lock:
            now = self.last_heartbeat = self.clock()
        return now

    def register(self, aggregates: Sequence[Aggregate] | None = None) -> None:
        """Take over the stored record's usage (:meth:`restore_usage`), create the
        provider, publish inventories/traits/aggregates, then the record."""
        self.restore_usage()
        self.sync_placement(aggregates)
        self.report()

    def restore_usage(self) -> None:
        """Take over what the node's stored record says it runs, as a compute service
        restarted on the same database does (Nova reads its instances back from its
        database; the usage a fresh agent reports must not drop them).

        Every instance of the record that still holds an allocation on this node is
        placed again, sized by that allocation (so the reports agree with placement);
        instances without one are gone. The rest of the provider's usage — consumers
        this agent does not know as instances, such as a seeded cloud's pre-existing
        workload — becomes the ``baseline``. ``failed_builds`` and the last heartbeat
        come back too. Nothing happens without a stored record.
        """
        previous = self.records.report_of(self.uuid)
        if previous is None:
            return
        record = report_to_record(previous)
        placed: dict[str, _Placed] = {}
        for uuid, instance in record.instances.items():
            held = self.client.get_allocations(uuid).allocations.get(self.uuid)
            if not held:
                LOG.info("compute %s: instance %s holds no allocation here any more; "
                         "not restored", self.node.host, uuid)
                continue
            placed[uuid] = _Placed(instance, _flavor_of(held, instance.instance_type_id))
        try:
            usages = self.client.provider_usages(self.uuid)
        except NotFoundError:
            usages = {}
        known = [p.flavor for p in placed.values()]
        rest = Flavor(
            name="preexisting",
            vcpus=max(0, usages.get("VCPU", 0) + usages.get("PCPU", 0)
                      - sum(f.vcpus for f in known)),
            memory_mb=max(0, usages.get("MEMORY_MB", 0) - sum(f.memory_mb for f in known)),
            root_gb=max(0, usages.get("DISK_GB", 0) - sum(f.root_gb for f in known)))
        stats = record.stats or {}
        with self._lock:
            self._placed.update(placed)
            self.baseline = rest if (rest.vcpus or rest.memory_mb or rest.root_gb) else None
            self.baseline_instances = max(
                0, _int_stat(stats, "num_instances") - len(record.instances))
            self.failed_builds = _int_stat(stats, "failed_builds")
            if record.service is not None and record.service.last_seen_up is not None:
                self.last_heartbeat = float(record.service.last_seen_up)

