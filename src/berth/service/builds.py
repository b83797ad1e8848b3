"""Build records: every instance a boot names, from before its claim to its outcome.

Nova's conductor writes an instance record (``vm_state = building``) before it asks the
scheduler, and a crash leaves that record behind for an operator or a periodic task to
find. Berth keeps the same thing in table ``berth_builds`` of the shared database:

=================  ==============================================================
``instance_uuid``  the instance (= the Placement consumer of its claim); never re-used
``request_id``     the boot it came from (a multi-create shares one)
``state``          ``building`` (written before anything is claimed), then ``active``
                   (built, with its ``host``) or ``failed`` (with a ``reason``); an
                   active instance that is deleted becomes ``deleted`` (the row stays:
                   its uuid is never issued again)
``owner``          the process whose conductor builds it (a row of ``berth_owners``)
``group_uuid``     the server group it joined, if any
=================  ==============================================================

Every process that builds registers once in ``berth_owners`` (a random token, its
start number, a heartbeat). Its heartbeat (:meth:`BuildRecords.heartbeat`, run by the
process's reconciler thread) also refreshes ``updated_at`` of the builds it has in
flight, so a ``building`` record not updated for longer than the build timeout was
abandoned (its process crashed, or lost the record while the database was down):
:mod:`berth.service.reconcile` releases its claim and its group membership. Settling a build is a compare-and-swap from ``building`` held by
this owner (:meth:`BuildRecords.settle`), so a build the reconciler took over is never
reported built afterwards.

The start number also keeps seeded runs from re-issuing instance uuids: a scheduler
seeded with ``--seed N`` draws its uuids from ``(N, start number)``
(:func:`instance_uuid_rng`), which differs at every start on the same database, and the
table's primary key refuses a uuid that was ever issued (:class:`InstanceExists`).

Lost database connections are retried where that is safe
(:mod:`berth.placement.dbfaults`).

Times are seconds since the epoch from each process's clock: processes on several
machines need synchronized clocks (NTP), as Nova's ``service_down_time`` does.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Engine

from berth.errors import InstanceExists, ServiceUnavailable
from berth.placement.db import create_tables, lock_schema
from berth.placement.dbfaults import call_with_retry, retried
from berth.placement.store_raw import Unexpected, raw_pool

builds_metadata = sa.MetaData()

BUILDING, ACTIVE, FAILED, DELETED = "building", "active", "failed", "deleted"
STATES = (BUILDING, ACTIVE, FAILED, DELETED)

LOG = logging.getLogger(__name__)

builds = sa.Table(
    "berth_builds",
    builds_metadata,
    sa.Column("instance_uuid", sa.String(36), primary_key=True),
    sa.Column("request_id", sa.String(64), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("owner", sa.String(64), nullable=False, index=True),
    sa.Column("group_uuid", sa.String(36), nullable=True),
    sa.Column("host", sa.String(255), nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    # The instance's request spec (JSON) while it builds: a build that finishes after
    # its process went away is recorded with it by the reconciler. Cleared as it settles.
    sa.Column("spec", sa.Text, nullable=True),
    sa.Index("berth_builds_state_idx", "state", "updated_at"),
)

owners = sa.Table(
    "berth_owners",
    builds_metadata,
    # The start number: a seeded run's uuids depend on it.
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("token", sa.String(64), nullable=False, unique=True),
    sa.Column("description", sa.String(255), nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
)

#: Owner of the records of instances Berth did not build (a cloud file's).
EXTERNAL_OWNER = "external"


@dataclass(frozen=True)
class BuildRecord:
    """One row of ``berth_builds``."""

    instance_uuid: str
    request_id: str
    state: str
    owner: str
    group_uuid: str | None
    host: str | None
    reason: str | None
    created_at: float
    updated_at: float
    #: The request spec as JSON text, while the build is under way (None otherwise).
    spec: str | None = None


#: The statements every boot runs (its build records' insert and settle), as raw DBAPI
#: statements on the engine's kept connections (see
#: :class:`~berth.placement.store_raw.RawPool`): SQLAlchemy's execution context cost more
#: than running them.
_RAW_INSERT_BUILD = (
    "INSERT INTO berth_builds (instance_uuid, request_id, state, owner, group_uuid, host, "
    "reason, created_at, updated_at, spec) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, ?, ?)"
)
_RAW_SETTLE = (
    "UPDATE berth_builds SET state = ?, host = ?, reason = ?, updated_at = ?, spec = NULL "
    f"WHERE instance_uuid = ? AND state = '{BUILDING}' AND owner = ?"
)
#: An abandoned build found running: active on its host, unless it changed since read.
_RAW_COMPLETE = (
    "UPDATE berth_builds SET state = ?, host = ?, reason = NULL, updated_at = ?, spec = NULL "
    f"WHERE instance_uuid = ? AND state = '{BUILDING}' AND owner = ? AND updated_at = ?"
)
#: An active instance deleted (in the transaction that removes its instance row).
_RAW_DELETED = (
    f"UPDATE berth_builds SET state = '{DELETED}', updated_at = ? "
    f"WHERE instance_uuid = ? AND state = '{ACTIVE}'"
)


def _record(row: sa.Row[tuple[object, ...]]) -> BuildRecord:
    m = row._mapping
    return BuildRecord(str(m["instance_uuid"]), str(m["request_id"]), str(m["state"]),
                       str(m["owner"]), m["group_uuid"], m["host"], m["reason"],
                       float(m["created_at"]), float(m["updated_at"]), m.get("spec"))


def _undo(undo: Callable[[], None], host: str | None, instance_uuid: str) -> None:
    try:
        undo()
    except Exception:  # logged; the next report shows what the host kept
        LOG.exception("could not have %s drop %s", host, instance_uuid)


def add_spec_column(engine: Engine) -> None:
    """Give a ``berth_builds`` written by an earlier Berth its ``spec`` column (under
    the schema lock of :func:`~berth.placement.db.create_tables`: processes starting
    together add it once)."""
    if "spec" in {c["name"] for c in sa.inspect(engine).get_columns(builds.name)}:
        return
    with engine.connect().execution_options(immediate=True) as conn, conn.begin():
        lock_schema(conn)
        if "spec" not in {c["name"] for c in sa.inspect(conn).get_columns(builds.name)}:
            if conn.dialect.name == "postgresql":
                # The table's lock waits behind every open transaction on it (a process
                # of an earlier version idle in one): bounded, not the schema lock's wait.
                conn.execute(sa.text("SET LOCAL lock_timeout = '10s'"))
            conn.execute(sa.text("ALTER TABLE berth_builds ADD COLUMN spec TEXT"))


def instance_uuid_rng(seed: int | None, start: int, index: int = 0) -> random.Random:
    """The generator of a scheduler's instance uuids: random without a seed; with one,
    derived from the seed, the process's start number and the scheduler's ``index`` in
    the process, so a seeded run replays on a fresh database, while a restart on the
    same database, or a second scheduler with the same seed, draws other uuids."""
    if seed is None:
        return random.Random()
    return random.Random(f"berth.instance-uuids:{seed}:{start}:{index}")


class BuildRecords:
    """The build records of one process (its owner token), over the shared database.

    Creating one registers the process in ``berth_owners``: :attr:`start` is its start
    number, :attr:`owner` its token.
    """

    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time,
                 register: bool = True) -> None:
        """``register``: this process builds, and registers in ``berth_owners``; a
        reader that builds nothing (``berth audit`` without ``--fix``) writes nothing."""
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._raw = raw_pool(engine)
        self.clock = clock
        inspector = sa.inspect(engine)
        if register or not all(inspector.has_table(t.name) for t in builds_metadata.sorted_tables):
            create_tables(engine, builds_metadata)
            add_spec_column(engine)
        # A listing of a database an earlier Berth wrote (no spec column) reads the rest.
        self._columns = [c for c in builds.c if c.name != "spec" or "spec" in {
            col["name"] for col in sa.inspect(engine).get_columns(builds.name)}]
        self.owner = uuidlib.uuid4().hex
        #: Instances this process is building (their records get the heartbeat).
        self._in_flight: set[str] = set()
        #: Builds that finished while the database could not record them: per instance,
        #: the settle to write (state, host, the statements written with it), tried again
        #: on every heartbeat (:meth:`settle_deferred`).
        self._deferred: dict[str, tuple[str, str | None, Sequence[tuple[str, Sequence[Any]]],
                                        Callable[[], None] | None]] = {}
        self._lock = threading.Lock()
        self.start = 0
        if not register:
            return
        now = self._now()
        description = f"{socket.gethostname()}:{os.getpid()}"
        with engine.begin() as conn:
            self.start = int(conn.execute(
                sa.insert(owners).values(token=self.owner, description=description[:255],
                                         started_at=now, heartbeat=now)
                .returning(owners.c.id)).scalar_one())

    def _now(self) -> float:
        return float(self.clock())

    # ----------------------------------------------------------------- this process
    @retried(safe=True)
    def heartbeat(self) -> None:
        """Tell the other processes this one is alive and its builds in flight are not
        abandoned (their ``updated_at`` moves on)."""
        now = self._now()
        with self._lock:
            flying = sorted(self._in_flight)
        with self.engine.begin() as conn:
            conn.execute(sa.update(owners).where(owners.c.token == self.owner)
                         .values(heartbeat=now))
            for i in range(0, len(flying), 500):
                conn.execute(sa.update(builds).where(
                    builds.c.instance_uuid.in_(flying[i:i + 500]), builds.c.state == BUILDING,
                    builds.c.owner == self.owner).values(updated_at=now))

    @retried(safe=False)
    def begin(self, instance_uuids: Sequence[str], request_id: str,
              group_uuid: str | None = None, spec: str | None = None) -> None:
        """Record ``instance_uuids`` as building (before anything is claimed for them),
        with their request ``spec`` (JSON text) for a reconciler that finds one built
        after this process went away.

        :class:`InstanceExists` when any of them was ever issued before: nothing is
        written then."""
        if not instance_uuids:
            return
        now = self._now()
        inserts = [(_RAW_INSERT_BUILD,
                     (u, request_id, BUILDING, self.owner, group_uuid, now, now, spec))
                   for u in instance_uuids]
        try:
            self._raw.run([("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()), *inserts,
                           ("COMMIT", ())])
        except sa.exc.IntegrityError:
            taken = sorted(self.existing(instance_uuids))
            raise InstanceExists(f"instance uuid(s) issued before: {', '.join(taken)}",
                                 instances=taken) from None
        with self._lock:
            self._in_flight.update(instance_uuids)

    def settle(self, instance_uuid: str, state: str, *, host: str | None = None,
               reason: str | None = None,
               also: Sequence[tuple[str, Sequence[Any]]] = ()) -> bool:
        """Move this process's ``building`` record to ``active`` (on ``host``) or
        ``failed`` (for ``reason``); False when it is no longer building here (the
        reconciler took it over: the build must be undone).
        :class:`~berth.errors.ServiceUnavailable` when the database cannot tell.

        ``also``: raw statements on this store's database written in the same
        transaction, only if the record settles (the instance's own row: an active build
        and its instance are stored together or not at all)."""
        if state not in (ACTIVE, FAILED):
            raise ValueError(f"a build settles as active or failed, not {state!r}")
        with self._lock:
            # Even if the write below fails, the record no longer gets the heartbeat:
            # it turns stale and the reconciler settles it.
            self._in_flight.discard(instance_uuid)
        try:
            return call_with_retry(lambda: self._settle(instance_uuid, state, host, reason, also),
                                   safe=False, what=f"settling build {instance_uuid}")
        except ServiceUnavailable:
            # The connection went during the commit: read what happened, if we can.
            record = self.get(instance_uuid)
            if record is not None and (record.state, record.host) == (state, host):
                return True
            raise

    def defer(self, instance_uuid: str, state: str, *, host: str | None = None,
              also: Sequence[tuple[str, Sequence[Any]]] = (),
              undo: Callable[[], None] | None = None) -> None:
        """Settle the record later: the build finished but the database could not record
        it. Its record keeps the heartbeat meanwhile (the reconciler must not take a
        finished build for an abandoned one), and :meth:`settle_deferred` writes it.
        ``undo``: what drops the instance should a reconciler have failed its build
        meanwhile (its claim released)."""
        with self._lock:
            self._deferred[instance_uuid] = (state, host, also, undo)
            self._in_flight.add(instance_uuid)

    def settle_deferred(self) -> list[str]:
        """Write the settles :meth:`defer` kept, each in its own transaction; those the
        database still cannot take wait for the next call. The instances settled (or
        found taken over by the reconciler meanwhile), in order."""
        with self._lock:
            pending = dict(self._deferred)
        done: list[str] = []
        for instance_uuid, (state, host, also, undo) in pending.items():
            try:
                ours = self.settle(instance_uuid, state, host=host, also=also)
            except ServiceUnavailable:
                with self._lock:
                    self._in_flight.add(instance_uuid)  # still waiting: keep it fresh
                continue
            try:
                record = None if ours else self.get(instance_uuid)
            except ServiceUnavailable:
                with self._lock:
                    self._in_flight.add(instance_uuid)  # cannot tell yet: the next round
                continue
            with self._lock:
                self._deferred.pop(instance_uuid, None)
            if ours or (record is not None and (record.state, record.host) == (state, host)):
                # (Recorded already: a commit whose answer was lost, or a reconciler that
                # found it running.)
                LOG.info("build of %s on %s recorded now that the database is back",
                         instance_uuid, host)
            else:
                LOG.warning("build of %s on %s was taken over by the reconciler before it "
                            "could be recorded: %s; its host drops it", instance_uuid, host,
                            "no record" if record is None else f"{record.state} "
                            f"({record.reason or 'no reason'})")
                if undo is not None:
                    # Off this round's thread: a host that does not answer must not hold
                    # up this process's heartbeats (its other builds would look abandoned).
                    threading.Thread(target=_undo, args=(undo, host, instance_uuid),
                                     name="berth-undo-build", daemon=True).start()
            done.append(instance_uuid)
        return done

    @property
    def deferred(self) -> list[str]:
        """The instances whose settle waits for the database."""
        with self._lock:
            return sorted(self._deferred)

    def _settle(self, instance_uuid: str, state: str, host: str | None,
                reason: str | None, also: Sequence[tuple[str, Sequence[Any]]]) -> bool:
        # In a transaction of its own: a connection lost before the COMMIT changed
        # nothing and is retried; one lost during it is not (see call_with_retry).
        # The settle must change the one record, or nothing after it takes effect.
        try:
            self._raw.run([
                ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
                (_RAW_SETTLE, (state, host, reason, self._now(), instance_uuid, self.owner),
                 True),
                *also,
                ("COMMIT", ())])
        except Unexpected:
            return False
        return True

    def deleting(self, instance_uuid: str) -> list[tuple[str, tuple[Any, ...]]]:
        """The raw statements that record an active instance as deleted, for a
        transaction of the caller's on this store's database (the one that removes the
        instance's row). An instance that is gone holds no allocation, and an
        ``active`` record says it should: the audit would list it for good."""
        return [(_RAW_DELETED, (self._now(), instance_uuid))]

    @retried(safe=False)
    def adopt(self, hosts: Mapping[str, str | None], request_id: str) -> None:
        """Record instances that exist without a build by Berth (a cloud file's, or the
        usage it states beyond them) as ``active``; those recorded already are kept."""
        if not hosts:
            return
        now = self._now()
        with self.engine.begin() as conn:
            known = self._existing(conn, hosts)
            rows = [{"instance_uuid": u, "request_id": request_id, "state": ACTIVE,
                     "owner": EXTERNAL_OWNER, "group_uuid": None, "host": h, "reason": None,
                     "created_at": now, "updated_at": now}
                    for u, h in hosts.items() if u not in known]
            if rows:
                conn.execute(sa.insert(builds), rows)

    # ----------------------------------------------------------------- any process
    @retried(safe=True)
    def get(self, instance_uuid: str) -> BuildRecord | None:
        """The record of ``instance_uuid``, or None."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(*self._columns).where(
                builds.c.instance_uuid == instance_uuid)).first()
        return None if row is None else _record(row)

    @retried(safe=True)
    def existing(self, instance_uuids: Iterable[str]) -> set[str]:
        """Which of ``instance_uuids`` have a record."""
        with self.engine.connect() as conn:
            return self._existing(conn, instance_uuids)

    @staticmethod
    def _existing(conn: sa.Connection, instance_uuids: Iterable[str]) -> set[str]:
        wanted = list(dict.fromkeys(instance_uuids))
        found: set[str] = set()
        for i in range(0, len(wanted), 500):
            found.update(conn.execute(sa.select(builds.c.instance_uuid).where(
                builds.c.instance_uuid.in_(wanted[i:i + 500]))).scalars())
        return found

    @retried(safe=True)
    def abandoned(self, timeout: float, now: float | None = None) -> list[BuildRecord]:
        """``building`` records not updated for ``timeout`` seconds: no live process
        is building them (a live owner's heartbeat keeps its builds' records fresh)."""
        cutoff = (self._now() if now is None else now) - timeout
        query = (sa.select(*self._columns)
                 .where(builds.c.state == BUILDING, builds.c.updated_at < cutoff)
                 .order_by(builds.c.created_at))
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(query)]

    def fail_abandoned(self, record: BuildRecord, reason: str) -> bool:
        """Mark an abandoned ``building`` record failed, unless it changed since it was
        read (its owner's heartbeat came, or another reconciler got there first)."""
        with self.engine.begin() as conn:
            done = conn.execute(
                sa.update(builds)
                .where(builds.c.instance_uuid == record.instance_uuid,
                       builds.c.state == BUILDING, builds.c.owner == record.owner,
                       builds.c.updated_at == record.updated_at)
                .values(state=FAILED, reason=reason, updated_at=self._now(), spec=None))
        return done.rowcount == 1

    def complete_abandoned(self, record: BuildRecord, host: str,
                           also: Sequence[tuple[str, Sequence[Any]]] = ()) -> bool:
        """Mark an abandoned ``building`` record ``active`` on ``host`` (its instance runs
        there: the build finished after its conductor went away), unless it changed
        since it was read; ``also``: raw statements written with it (the instance's
        row), only if it is marked."""
        try:
            self._raw.run([
                ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
                (_RAW_COMPLETE, (ACTIVE, host, self._now(), record.instance_uuid, record.owner,
                                 record.updated_at), True),
                *also,
                ("COMMIT", ())])
        except Unexpected:
            return False
        return True

    def purge(self, before: float, *, batch: int = 1000) -> int:
        """Delete the records of deleted and failed instances settled before ``before``
        (seconds since the epoch); how many went.

        A record is kept while its instance still holds an allocation or a place in a
        server group: the reconciler releases those of failed builds by their records (a
        purged one would leave an orphan only ``berth audit --fix`` releases). Purging
        cannot let a uuid be issued twice: a seeded scheduler draws its uuids from its
        start number, which is never reused (``berth_owners`` keeps every start), and an
        unseeded one draws them at random. Nova's counterpart is ``nova-manage db
        archive_deleted_rows`` followed by ``purge``.
        """
        from berth.placement.db import allocations
        from berth.service.groups import group_members

        kept = (
            builds.c.state.in_((FAILED, DELETED)),
            builds.c.updated_at < before,
            ~sa.exists().where(allocations.c.consumer_id == builds.c.instance_uuid),
            ~sa.exists().where(group_members.c.instance_uuid == builds.c.instance_uuid),
        )
        purged = 0
        while True:  # in batches: no long transaction over a big table
            done = self._purge_batch(kept, batch)
            if not done:
                return purged
            purged += done

    @retried(safe=True)  # a batch deletes only what its conditions still allow
    def _purge_batch(self, kept: Sequence[Any], batch: int) -> int:
        # BEGIN IMMEDIATE on SQLite: a deferred transaction whose read saw another
        # process's commit could not write (no busy wait, "database is locked").
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            uuids = list(conn.execute(
                sa.select(builds.c.instance_uuid).where(*kept).limit(batch)).scalars())
            if not uuids:
                return 0
            return int(conn.execute(sa.delete(builds).where(
                builds.c.instance_uuid.in_(uuids), *kept)).rowcount)

    @retried(safe=True)
    def in_state(self, state: str, instance_uuids: Iterable[str]) -> list[BuildRecord]:
        """The records of ``instance_uuids`` that are in ``state``."""
        query = sa.select(*self._columns).where(builds.c.state == state)
        with self.engine.connect() as conn:
            wanted = list(dict.fromkeys(instance_uuids))
            if not self.is_sqlite:
                # One array parameter: the reconciler asks this for every member of every
                # server group each pass, and 500 bound values per statement cost more
                # to send than to look up.
                uuids = sa.bindparam("uuids", wanted, type_=ARRAY(sa.String))
                return [_record(r) for r in conn.execute(
                    query.where(builds.c.instance_uuid == sa.any_(uuids)))]
            out: list[BuildRecord] = []
            for i in range(0, len(wanted), 500):
                out += [_record(r) for r in conn.execute(
                    query.where(builds.c.instance_uuid.in_(wanted[i:i + 500])))]
            return out
