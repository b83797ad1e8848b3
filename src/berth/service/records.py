"""The compute-record store and the schedulers' views of it.

A compute node's capabilities and state — hypervisor, ``cpu_info``, supported instances,
NUMA topology, PCI pools, metrics, stats, usage, instances and the service row with its
heartbeat — are its report (:func:`record_to_report`), kept in the compute-record store
(:class:`ComputeRecordStore`, tables ``berth_compute_*`` in the same SQL database,
created by the first process to start, with ``create_all``; the placement migrations are
untouched). A heartbeat sent alone is a number in ``berth_compute_heartbeats``.

Every write to the record store takes the next value of one change counter, so a
scheduler reads only what changed since its last look (:class:`SnapshotFeed`) and
applies it with ``HostSnapshot.upsert`` (O(1) per report, no rebuild); a heartbeat alone
updates one column. ComputeFilter's "is up" is then the heartbeat's age against
``service_down_time`` at the ``now`` the scheduler passes to the pure core.
:class:`RunningInstances` follows the same changes for where each instance runs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any, NamedTuple

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from berth.errors import InputError
from berth.model.aggregate import Aggregate
from berth.model.compute import Instance, MetricItem, ServiceRecord
from berth.model.request import CellMapping
from berth.placement.db import create_tables
from berth.placement.dbfaults import call_with_retry
from berth.placement.store_raw import raw_pool
from berth.snapshot import HostRecord, HostSnapshot

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

#: Compute nodes deleted (their compute service was: ``DELETE /os-services/{host}``),
#: numbered from the same change counter, so a scheduler drops their rows.
deletions = sa.Table(
    "berth_compute_deletions",
    records_metadata,
    sa.Column("uuid", sa.String(36), primary_key=True),
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


#: Nova's cell mappings, as a cloud file names them: a scheduler leaves the hosts of a
#: disabled cell out unless the request names that cell (Nova's host manager reads the
#: enabled cells only). Written with the aggregates, under their change number: a
#: scheduler told the aggregates changed reads both again.
cells = sa.Table(
    "berth_cells",
    records_metadata,
    sa.Column("uuid", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("disabled", sa.Boolean, nullable=False),
)


# --------------------------------------------------------------------------- reports
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


_RECORD_FIELDS = _field_names(HostRecord)
_SERVICE_FIELDS = _field_names(ServiceRecord)
_METRIC_FIELDS = _field_names(MetricItem)
# record_to_report spells an instance's fields out: a new field must be added there.
assert _field_names(Instance) == ("uuid", "instance_type_id", "image_properties", "project_id",
                                 "claims")


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
    # Spelled out (a comprehension over the field names cost three times as much, and
    # a report carries every instance of its host: 60-120 at a busy replay's peak).
    data["instances"] = [{"uuid": i.uuid, "instance_type_id": i.instance_type_id,
                          "image_properties": dict(i.image_properties),
                          "project_id": i.project_id}
                         if i.claims is None else
                         {"uuid": i.uuid, "instance_type_id": i.instance_type_id,
                          "image_properties": dict(i.image_properties),
                          "project_id": i.project_id, "claims": i.claims}
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


def encode_report(report: Mapping[str, Any]) -> str:
    """A report's stored text. Through orjson: a report lists every instance of its
    host, and the standard encoder took ~13x as long (40 µs a report of 60 instances,
    twice for every boot and delete of a replay). Keys that are not strings become
    strings and NumPy numbers numbers (a simulated clock's time can be one); datetimes,
    UUIDs and dataclasses are written as orjson writes them (ISO 8601, the uuid's text,
    an object) and anything else JSON has no type for as ``str(value)`` (reports are
    plain data: :func:`record_to_report` makes them so). A NaN or an infinity is written
    as null, where the standard encoder wrote text that is not JSON."""
    return orjson.dumps(report, default=str, option=_REPORT_OPTIONS).decode()


_REPORT_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def encode_reports(reports: Sequence[Mapping[str, Any]]) -> str:
    """Several reports as one JSON list, each written as :func:`encode_report` writes
    one (what agents cast to the schedulers)."""
    return orjson.dumps(reports, default=str, option=_REPORT_OPTIONS).decode()


def decode_report(text: str | bytes) -> dict[str, Any]:
    """A stored report (text written by :func:`encode_report`, or by the standard
    encoder before it, whose ``NaN`` and ``Infinity`` orjson refuses)."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        data = json.loads(text)
    return dict(data)


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
    #: Nodes deleted since (their uuids); a report of one written after its deletion
    #: (registered again) is among ``reports``, to apply after.
    deleted: tuple[str, ...] = ()


def aggregate_to_row(agg: Aggregate) -> dict[str, Any]:
    """An aggregate as a table row (hosts and metadata as JSON text)."""
    return {"id": agg.id, "uuid": agg.uuid, "name": agg.name,
            "hosts": json.dumps(list(agg.hosts)), "metadata": json.dumps(agg.metadata)}


#: The statements of every report and every scheduler refresh, built once (building a
#: statement and its cache key per call cost several times its run).
_NEXT_SEQ = (sa.update(record_counter).where(record_counter.c.id == 1)
             .values(seq=record_counter.c.seq + 1).returning(record_counter.c.seq))
_READ_TOP_SQL = "SELECT seq FROM berth_compute_counter WHERE id = 1"
#: Raw DBAPI statements (``?`` placeholders) of a report and of a scheduler's catch-up:
#: one round trip each on PostgreSQL, and no SQLAlchemy execution context per statement
#: (which cost more than SQLite itself: a report took ~0.4 ms through it).
_RAW_NEXT_SEQ = "UPDATE berth_compute_counter SET seq = seq + 1 WHERE id = 1 RETURNING seq"
_RAW_UPSERT_NODES = (
    "INSERT INTO berth_compute_nodes (uuid, host, nodename, report, heartbeat, seq) "
    "VALUES {} "
    "ON CONFLICT (uuid) DO UPDATE SET host = excluded.host, nodename = excluded.nodename, "
    "report = excluded.report, heartbeat = excluded.heartbeat, seq = excluded.seq"
)
#: The change number a row of a write takes: the counter, as this transaction left it.
_SEQ_NOW = "(SELECT seq FROM berth_compute_counter WHERE id = 1)"
_NODE_ROW = f"(?, ?, ?, ?, ?, {_SEQ_NOW})"
#: Report rows per statement (a registration wave writes thousands at once).
_NODES_PER_STATEMENT = 100
_RAW_CHANGED_SINCE = "SELECT seq, report FROM berth_compute_nodes WHERE seq > ? ORDER BY seq"
_RAW_BEATS_SINCE = "SELECT seq, uuid, heartbeat FROM berth_compute_heartbeats WHERE seq > ?"
_RAW_UPSERT_BEATS = (
    "INSERT INTO berth_compute_heartbeats (uuid, heartbeat, seq) VALUES {} "
    "ON CONFLICT (uuid) DO UPDATE SET heartbeat = excluded.heartbeat, seq = excluded.seq"
)
_BEAT_ROW = f"(?, ?, {_SEQ_NOW})"
#: Heartbeat rows per statement (two parameters each, under SQLite's old 999 limit).
_BEATS_PER_STATEMENT = 400
_RAW_AGGREGATES_SEQ = "SELECT seq FROM berth_host_aggregates_changed WHERE id = 1"
_RAW_DELETED_SINCE = "SELECT seq, uuid FROM berth_compute_deletions WHERE seq > ?"


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

    def publish_many(self, items: Sequence[tuple[str, Mapping[str, Any], float | None]]) -> int:
        """Insert or replace many reports (the latest of each node) in one transaction
        under one change number; returns it (0 for no reports)."""
        if not items:
            return 0
        latest = {uuid: (report, beat) for uuid, report, beat in items}
        rows = [(uuid, report["host"], report.get("nodename") or report["host"],
                 encode_report(report), beat)
                for uuid, (report, beat) in latest.items()]
        return self._write_numbered(_RAW_UPSERT_NODES, _NODE_ROW, _NODES_PER_STATEMENT, rows,
                                    what=f"publishing {len(rows)} reports")

    def _write_numbered(self, upsert: str, row: str, per_statement: int,
                        rows: Sequence[tuple[Any, ...]], *, what: str) -> int:
        """Upsert ``rows`` (``per_statement`` to an ``upsert`` of ``row`` marks) in one
        transaction under the next change number; returns it. The counter's row lock
        (BEGIN IMMEDIATE on SQLite) orders the writers: a change number is visible only
        once every smaller one has committed. Safe to run twice (the same rows again,
        under one more change number), so a lost connection is retried."""
        if not self.is_sqlite and 0 < len(rows) <= per_statement:
            # One statement, its own transaction: the counter's update in a WITH, whose
            # number every row takes (one round trip and no pipeline; a pipeline of four
            # cost the fleet ~0.3 ms of CPU a report).
            one = (f"WITH next AS ({_RAW_NEXT_SEQ}) "
                   + upsert.format(", ".join([row.replace(_SEQ_NOW, "(SELECT seq FROM next)")]
                                             * len(rows)))
                   + " RETURNING (SELECT seq FROM next)")
            params = [value for values in rows for value in values]
            found = call_with_retry(lambda: self._raw.run([(one, params)]), safe=True, what=what)
            return int(found[0][0][0])
        batch: list[tuple[Any, ...]] = [("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
                                        (_RAW_NEXT_SEQ, ())]
        for start in range(0, len(rows), per_statement):
            chunk = rows[start:start + per_statement]
            batch.append((upsert.format(", ".join([row] * len(chunk))),
                          [value for values in chunk for value in values]))
        batch.append(("COMMIT", ()))
        out = call_with_retry(lambda: self._raw.run(batch), safe=True, what=what)
        return int(out[1][0][0])

    def publish(self, uuid: str, report: Mapping[str, Any], heartbeat: float | None) -> int:
        """Insert or replace one node's report; returns its change number (0 when it
        waits for :meth:`end_deferred`)."""
        if self._defer(uuid, report, heartbeat):
            return 0
        return self.publish_many([(uuid, report, heartbeat)])

    def set_aggregates(self, aggregates: Iterable[Aggregate],
                       cell_mappings: Iterable[CellMapping] | None = None) -> None:
        """Replace every host aggregate, and every cell mapping unless ``cell_mappings``
        is None (the cells stored stay then)."""
        rows = [aggregate_to_row(a) for a in aggregates]
        cell_rows = (None if cell_mappings is None else
                     [{"uuid": c.uuid, "name": c.name, "disabled": bool(c.disabled)}
                      for c in cell_mappings])
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            seq = self._next_seq(conn)
            conn.execute(sa.delete(host_aggregates))
            if rows:
                conn.execute(sa.insert(host_aggregates), [{**r, "seq": seq} for r in rows])
            if cell_rows is not None:
                conn.execute(sa.delete(cells))
                if cell_rows:
                    conn.execute(sa.insert(cells), cell_rows)
            conn.execute(sa.update(aggregates_changed).where(aggregates_changed.c.id == 1)
                         .values(seq=seq))

    def cell_mappings(self) -> list[CellMapping]:
        """Every stored cell mapping, by name."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(cells).order_by(cells.c.name, cells.c.uuid)).all()
        return [CellMapping(uuid=str(r.uuid), name=str(r.name), disabled=bool(r.disabled))
                for r in rows]

    def disabled_cells(self) -> frozenset[str]:
        """The uuids of the cells marked disabled."""
        return frozenset(c.uuid for c in self.cell_mappings() if c.disabled)

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
        """What changed after the change number ``since`` (see :class:`Changes`). One
        batch of reads whether or not anything changed: a look at the counter first
        saved four empty range reads when nothing had, and cost a round trip more on
        every request of a busy cloud, where something nearly always has."""
        # Change numbers are taken under the counter's row lock by each writer, so
        # everything up to ``top`` has committed once ``top`` is visible; a report with
        # a larger number, committed after ``top`` was read, waits for the next call.
        batch = [(_READ_TOP_SQL, ()), (_RAW_CHANGED_SINCE, (since,)), (_RAW_AGGREGATES_SEQ, ()),
                 (_RAW_BEATS_SINCE, (since,)), (_RAW_DELETED_SINCE, (since,))]
        top_rows, rows, agg_rows, beat_rows, gone_rows = call_with_retry(
            lambda: self._raw.run(batch), safe=True, what="reading the reports that changed")
        top, agg_seq = int(top_rows[0][0]), int(agg_rows[0][0])
        agg_changed = since == 0 or agg_seq > since
        return Changes([decode_report(report) for seq, report in rows if seq <= top], top,
                       agg_changed,
                       {uuid: float(beat) for seq, uuid, beat in beat_rows if seq <= top},
                       tuple(uuid for seq, uuid in gone_rows if seq <= top))

    def delete_nodes(self, uuids: Sequence[str]) -> int:
        """Forget compute nodes (their service was deleted): their reports and
        heartbeats go, and a deletion under the next change number tells the
        schedulers to drop their rows; returns it (0 for none)."""
        if not uuids:
            return 0
        marks = ", ".join("?" * len(uuids))
        batch: list[tuple[Any, ...]] = [
            ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()), (_RAW_NEXT_SEQ, ()),
            (f"DELETE FROM berth_compute_nodes WHERE uuid IN ({marks})", list(uuids)),
            (f"DELETE FROM berth_compute_heartbeats WHERE uuid IN ({marks})", list(uuids)),
            ("INSERT INTO berth_compute_deletions (uuid, seq) VALUES {} ON CONFLICT (uuid) "
             "DO UPDATE SET seq = excluded.seq".format(", ".join(
                 ["(?, (SELECT seq FROM berth_compute_counter WHERE id = 1))"] * len(uuids))),
             list(uuids)),
            ("COMMIT", ())]
        out = call_with_retry(lambda: self._raw.run(batch), safe=True,
                              what=f"deleting {len(uuids)} compute nodes")
        return int(out[1][0][0])

    def heartbeats(self, beats: Mapping[str, float]) -> int:
        """Store heartbeats alone (node uuid -> heartbeat) for nodes whose last report
        is still their state, in one transaction under one change number; returns it
        (0 for no heartbeats). A report written later carries its own, newer one."""
        if not beats:
            return 0
        return self._write_numbered(_RAW_UPSERT_BEATS, _BEAT_ROW, _BEATS_PER_STATEMENT,
                                    [(uuid, float(beat)) for uuid, beat in beats.items()],
                                    what=f"storing {len(beats)} heartbeats")

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

    def node_names(self, uuids: Iterable[str]) -> dict[str, str]:
        """``host/node`` of each of these compute nodes (by uuid) that has a record."""
        wanted = list(dict.fromkeys(uuids))
        names: dict[str, str] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(wanted), 500):
                for uuid, host, node in conn.execute(sa.select(
                        compute_nodes.c.uuid, compute_nodes.c.host, compute_nodes.c.nodename)
                        .where(compute_nodes.c.uuid.in_(wanted[i:i + 500]))):
                    names[str(uuid)] = f"{host}/{node}"
        return names

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
        return None if row is None else _newest(decode_report(row.report), row.heartbeat)

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
        return [(r.uuid, _newest(decode_report(r.report), r.heartbeat)) for r in rows]


class RowIndex(dict[str, int]):
    """Compute node uuid -> snapshot row; ``version`` counts the entries that changed
    (so a mapping derived from it knows when to rebuild)."""

    version = 0

    def __setitem__(self, uuid: str, row: int) -> None:
        if self.get(uuid) != row:
            self.version += 1
            super().__setitem__(uuid, row)

    def __delitem__(self, uuid: str) -> None:
        self.version += 1
        super().__delitem__(uuid)

    def drop(self, snapshot: HostSnapshot, uuids: Iterable[str]) -> None:
        """Remove the rows of the nodes ``uuids`` from ``snapshot`` and index the rows
        that moved."""
        keys = []
        hosts, nodes = snapshot.obj("host"), snapshot.obj("nodename")
        for uuid in uuids:
            row = self.get(uuid)
            if row is not None:
                keys.append((hosts[row], nodes[row]))
                del self[uuid]
        if snapshot.remove(keys):
            for row, uuid in enumerate(snapshot.obj("uuid").tolist()):
                if uuid:
                    self[uuid] = row


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
                self.snapshot.disabled_cells = self.store.disabled_cells()
            if changes.deleted:
                self.uuid_rows.drop(self.snapshot, changes.deleted)
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
