"""Instances and migrations of ``berth serve``: what a move needs to know, in SQL.

Nova keeps every instance's request spec (flavor, image, hints, server group, zone,
project and user) in its API database and a ``migrations`` row per move; a move reads
the spec back to ask the scheduler again. Berth keeps the same in two tables beside the
compute records and server groups (created with ``create_all``):

* ``berth_instances``: uuid, host, node, status (``ACTIVE``; ``MOVING`` while a move
  runs; ``VERIFY_RESIZE`` after a migration or resize until it is confirmed or
  reverted) and the spec as JSON. A boot records each instance it built; ``berth serve
  --cloud`` records the file's instances.
* ``berth_migrations``: uuid (also the migration's placement consumer), instance,
  type (``migration``, ``resize``, ``evacuation``, ``live-migration``), status
  (``pre-migrating``, or ``accepted`` for a live migration, as Nova's conductor makes
  them; ``finished``, ``confirmed``, ``reverted``, ``done``, ``completed``, ``error``,
  ``failed``), source
  and destination, and the spec before the move (what a revert restores).

A move starts with a compare-and-swap on the instance's status, so two moves of one
instance never run at once, from any number of processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from berth.model.request import Flavor, ImageMeta, ImageMetaProps, InstanceGroup, RequestSpec
from berth.placement.db import create_tables
from berth.placement.dbfaults import call_with_retry
from berth.placement.store_raw import raw_pool

ACTIVE = "ACTIVE"
MOVING = "MOVING"
VERIFY_RESIZE = "VERIFY_RESIZE"
#: Being deleted (its claims go, then its record).
DELETING = "DELETING"

instances_metadata = sa.MetaData()

instances_table = sa.Table(
    "berth_instances",
    instances_metadata,
    sa.Column("uuid", sa.String(36), primary_key=True),
    sa.Column("host", sa.String(255), nullable=False, index=True),
    sa.Column("nodename", sa.String(255), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
)

migrations_table = sa.Table(
    "berth_migrations",
    instances_metadata,
    sa.Column("uuid", sa.String(36), primary_key=True),
    sa.Column("instance_uuid", sa.String(36), nullable=False, index=True),
    sa.Column("migration_type", sa.String(32), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("source_host", sa.String(255), nullable=False),
    sa.Column("source_node", sa.String(255), nullable=False),
    sa.Column("dest_host", sa.String(255), nullable=True),
    sa.Column("dest_node", sa.String(255), nullable=True),
    sa.Column("old_spec", sa.Text, nullable=False),
)


# --------------------------------------------------------------------------- specs
def spec_to_dict(spec: RequestSpec) -> dict[str, Any]:
    """What Nova persists of a request spec, as JSON-ready data. The server group is
    kept by uuid (its members and hosts are read afresh for every request); the move
    hint ``_nova_check_type`` and the routing fields are not kept."""
    f = spec.flavor
    image = spec.image
    hints = {k: list(v) for k, v in (spec.scheduler_hints or {}).items()
             if k != "_nova_check_type"}
    return {
        "flavor": {"name": f.name, "vcpus": f.vcpus, "memory_mb": f.memory_mb,
                   "root_gb": f.root_gb, "ephemeral_gb": f.ephemeral_gb, "swap": f.swap,
                   "id": f.id, "flavorid": f.flavorid, "extra_specs": dict(f.extra_specs)},
        "image": None if image is None else {
            "id": image.id, "name": image.name, "disk_format": image.disk_format,
            "properties": dict(image.properties.raw)},
        "hints": hints,
        "group": spec.instance_group.uuid if spec.instance_group is not None else None,
        "project_id": spec.project_id, "user_id": spec.user_id,
        "availability_zone": spec.availability_zone, "is_bfv": spec.is_bfv,
    }


def spec_from_dict(data: dict[str, Any], group: InstanceGroup | None = None) -> RequestSpec:
    """The inverse of :func:`spec_to_dict`; ``group`` is the stored group it names."""
    image = data.get("image")
    return RequestSpec(
        flavor=Flavor(**data["flavor"]),
        image=None if image is None else ImageMeta(
            id=image.get("id"), name=image.get("name"), disk_format=image.get("disk_format"),
            properties=ImageMetaProps(image.get("properties") or {})),
        scheduler_hints=data.get("hints") or None, instance_group=group,
        project_id=data.get("project_id"), user_id=data.get("user_id"),
        availability_zone=data.get("availability_zone"), is_bfv=bool(data.get("is_bfv")))


@dataclass
class InstanceRecord:
    """One instance: where it runs, its state and its stored spec (as JSON data)."""

    uuid: str
    host: str
    nodename: str
    status: str
    spec: dict[str, Any]


@dataclass
class MigrationRecord:
    """One move of an instance (Nova's ``Migration``)."""

    uuid: str
    instance_uuid: str
    migration_type: str
    status: str
    source_host: str
    source_node: str
    dest_host: str | None
    dest_node: str | None
    old_spec: dict[str, Any]


#: The migrations' statements, built once: building a SQLAlchemy statement and its cache
#: key per call cost several times the statement's own run.
_M = migrations_table.c
_MIGRATIONS_OF = sa.select(migrations_table).where(
    _M.instance_uuid == sa.bindparam("instance_uuid"))
_MIGRATIONS_OF_IN = _MIGRATIONS_OF.where(_M.status == sa.bindparam("status"))
#: The same hot paths as raw DBAPI statements on the engine's kept connections (see
#: :class:`~berth.placement.store_raw.RawPool`): through SQLAlchemy a boot's record and a
#: delete's read, swap and removal cost more in its execution context than in SQLite.
_RAW_UPSERT_INSTANCE = (
    "INSERT INTO berth_instances (uuid, host, nodename, status, spec) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (uuid) DO UPDATE SET host = excluded.host, nodename = excluded.nodename, "
    "status = excluded.status, spec = excluded.spec"
)
_RAW_GET_INSTANCE = "SELECT uuid, host, nodename, status, spec FROM berth_instances WHERE uuid = ?"
_RAW_REMOVE_INSTANCE = "DELETE FROM berth_instances WHERE uuid = ?"


def _instance(row: Sequence[Any]) -> InstanceRecord:
    """A row of ``berth_instances`` (its columns in the table's order)."""
    uuid, host, nodename, status, spec = row
    return InstanceRecord(uuid, host, nodename, status, json.loads(spec))


def _migration(row: Any) -> MigrationRecord:
    return MigrationRecord(row.uuid, row.instance_uuid, row.migration_type, row.status,
                           row.source_host, row.source_node, row.dest_host, row.dest_node,
                           json.loads(row.old_spec))


class InstanceStore:
    """The two tables, with the status compare-and-swap a move starts with."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._raw = raw_pool(engine)
        create_tables(engine, instances_metadata)

    # ----------------------------------------------------------------- instances
    def record(self, uuid: str, host: str, nodename: str, spec: RequestSpec | dict[str, Any],
               status: str = ACTIVE) -> None:
        """Insert or replace the instance's row."""
        self.record_many([(uuid, host, nodename, spec)], status=status)

    def record_many(self, rows: Iterable[tuple[str, str, str, RequestSpec | dict[str, Any]]],
                    status: str = ACTIVE) -> None:
        """:meth:`record` for several instances, in one transaction."""
        upserts = self.upserts(rows, status)
        if not upserts:
            return
        batch = [("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()), *upserts, ("COMMIT", ())]
        # Upserts: safe to run twice.
        call_with_retry(lambda: self._raw.run(batch), safe=True, what="recording instances")

    @staticmethod
    def upserts(rows: Iterable[tuple[str, str, str, RequestSpec | dict[str, Any]]],
                status: str = ACTIVE) -> list[tuple[str, tuple[Any, ...]]]:
        """The raw statements that insert or replace these instances' rows, for a
        transaction of the caller's on this store's database (a build that settles
        records its instance in the same transaction)."""
        return [(_RAW_UPSERT_INSTANCE, (
            uuid, host, node, status,
            json.dumps(spec if isinstance(spec, dict) else spec_to_dict(spec), sort_keys=True)))
            for uuid, host, node, spec in rows]

    def get(self, uuid: str) -> InstanceRecord | None:
        """The instance, or None."""
        rows = call_with_retry(lambda: self._raw.run([(_RAW_GET_INSTANCE, (uuid,))]),
                               safe=True, what=f"reading instance {uuid}")[0]
        return _instance(rows[0]) if rows else None

    def all(self) -> list[InstanceRecord]:
        """Every instance, by host then uuid."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(instances_table).order_by(
                instances_table.c.host, instances_table.c.uuid)).all()
        return [_instance(r) for r in rows]

    def swap_status(self, uuid: str, expected: Iterable[str], status: str) -> bool:
        """Set the status only if it is one of ``expected`` now; False otherwise."""
        wanted = list(expected)
        if not wanted:
            return False
        sql = (f"UPDATE berth_instances SET status = ? WHERE uuid = ? "
               f"AND status IN ({', '.join('?' * len(wanted))})")
        # In a transaction of its own, so that a connection lost before the COMMIT is
        # known to have changed nothing (and is retried), and one lost during it is not.
        batch = [("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
                 (sql, (status, uuid, *wanted)), ("COMMIT", ())]
        return bool(call_with_retry(lambda: self._raw.run(batch), safe=False,
                                    what=f"changing the status of instance {uuid}")[1])

    def remove(self, uuid: str, *, also: Sequence[tuple[str, Sequence[Any]]] = ()) -> None:
        """Forget a deleted instance (its migrations stay, as history). ``also``: raw
        statements on this store's database written in the same transaction (the
        instance leaving its server groups)."""
        batch: list[tuple[str, Sequence[Any]]] = [(_RAW_REMOVE_INSTANCE, (uuid,))]
        if also:
            batch = [("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()), *also, *batch,
                     ("COMMIT", ())]
        # Deletes: safe to run twice.
        call_with_retry(lambda: self._raw.run(batch), safe=True, what=f"removing instance {uuid}")

    def update(self, uuid: str, *, status: str, host: str | None = None,
               nodename: str | None = None, spec: dict[str, Any] | None = None) -> None:
        """Change the instance's status and, when given, its host, node and spec."""
        values: dict[str, Any] = {"status": status}
        if host is not None:
            values["host"] = host
        if nodename is not None:
            values["nodename"] = nodename
        if spec is not None:
            values["spec"] = json.dumps(spec, sort_keys=True)
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            conn.execute(sa.update(instances_table)
                         .where(instances_table.c.uuid == uuid).values(**values))

    # ----------------------------------------------------------------- migrations
    def add_migration(self, migration: MigrationRecord) -> None:
        """Store a new migration."""
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            conn.execute(sa.insert(migrations_table).values(
                uuid=migration.uuid, instance_uuid=migration.instance_uuid,
                migration_type=migration.migration_type, status=migration.status,
                source_host=migration.source_host, source_node=migration.source_node,
                dest_host=migration.dest_host, dest_node=migration.dest_node,
                old_spec=json.dumps(migration.old_spec, sort_keys=True)))

    def set_migration(self, uuid: str, *, status: str, dest_host: str | None = None,
                      dest_node: str | None = None) -> None:
        """Change a migration's status (and its destination, when given)."""
        values: dict[str, Any] = {"status": status}
        if dest_host is not None:
            values["dest_host"] = dest_host
            values["dest_node"] = dest_node
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            conn.execute(sa.update(migrations_table)
                         .where(migrations_table.c.uuid == uuid).values(**values))

    def migrations(self, instance_uuid: str | None = None,
                   status: str | None = None) -> list[MigrationRecord]:
        """Migrations, of one instance and in one status when given, in no set order."""
        if instance_uuid is not None:
            # The common question (a delete asks it of every instance), prebuilt.
            query = _MIGRATIONS_OF if status is None else _MIGRATIONS_OF_IN
            params: dict[str, Any] = {"instance_uuid": instance_uuid}
            if status is not None:
                params["status"] = status
            with self.engine.connect() as conn:
                return [_migration(r) for r in conn.execute(query, params).all()]
        query = sa.select(migrations_table)
        if status is not None:
            query = query.where(migrations_table.c.status == status)
        with self.engine.connect() as conn:
            return [_migration(r) for r in conn.execute(query).all()]

    def get_migration(self, uuid: str) -> MigrationRecord | None:
        """The migration, or None."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(migrations_table)
                               .where(migrations_table.c.uuid == uuid)).first()
        return None if row is None else _migration(row)


#: Migration statuses whose consumer holds the source allocation by right.
LIVE_MIGRATION_STATUSES = ("pre-migrating", "accepted", "finished")


def live_migration_consumers(engine: Engine) -> set[str]:
    """The migration consumers that hold allocations by right: a move under way or a
    migration or resize waiting for confirmation. The audit counts them as standing
    behind a record (the migration's), not as orphans."""
    create_tables(engine, instances_metadata)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(migrations_table.c.uuid).where(
            migrations_table.c.status.in_(LIVE_MIGRATION_STATUSES))).all()
    return {str(r.uuid) for r in rows}
