"""The Placement data store: every read and write of reference section 3 in SQL.

Each public method runs in its own transaction and raises ``berth.placement.errors``
with the reference's verbatim messages. Concurrency contract:

* generations are compare-and-swap in SQL
  (``UPDATE ... SET generation = generation + 1 WHERE id = ? AND generation = ?``);
  a zero rowcount means another writer won;
* an allocation write is one transaction: delete the consumer's old rows, re-read usage
  and inventory, check capacity, insert, then CAS every touched provider. A lost CAS
  retries the whole transaction (``allocation_conflict_retry_count``, 10);
* on SQLite write transactions start with ``BEGIN IMMEDIATE`` so writers serialize;
* every graph-affecting write bumps ``berth_state.change_seq`` as its last statement,
  which is how ``provider_graph()`` knows its cache is stale.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import uuid as uuid_mod
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import os_resource_classes
import os_traits
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from berth.placement import db, errors
from berth.placement.db import (
    allocations,
    consumer_types,
    consumers,
    inventories,
    placement_aggregates,
    projects,
    resource_classes,
    resource_provider_aggregates,
    resource_provider_traits,
    resource_providers,
    traits,
    users,
    utcnow,
)
from berth.placement.query import MemberOf, RequiredTraits

INCOMPLETE_ID = "00000000-0000-0000-0000-000000000000"
RETRY_COUNT = 10
MAX_INT = 2147483647
STANDARD_RCS = frozenset(os_resource_classes.STANDARDS)
CONCURRENT_MSG = "Another thread concurrently updated the data. Please retry your update"


# Prebuilt statements for the hottest paths: building Core constructs per call costs more
# than executing them on SQLite, and text() statements have trivial cache keys.
_READ_SEQ = sa.text("SELECT change_seq FROM berth_state WHERE id = 1")
_READ_STATE = sa.text("SELECT change_seq, full_seq FROM berth_state WHERE id = 1")
_MARK_FULL = sa.text("UPDATE berth_state SET full_seq = :seq WHERE id = 1")
_PRUNE_CHANGES = sa.text("DELETE FROM berth_provider_changes WHERE seq < :seq")
_CHANGED_SINCE = sa.text(
    "SELECT DISTINCT provider_id FROM berth_provider_changes WHERE seq > :old AND seq <= :new"
)
#: A cached graph further behind than this is rebuilt in full; the change log keeps
#: CHANGE_LOG_KEEP sequence numbers, comfortably more.
INCREMENTAL_LIMIT = 2000
CHANGE_LOG_KEEP = 5000
_TOUCHED = "berth_touched"
_FULL = "berth_full"
# Raw DBAPI statements (``?`` placeholders, rewritten for psycopg) for the write hot
# path: they skip SQLAlchemy's per-execution context, which costs more than SQLite itself.
_RAW_BUMP_SEQ = (
    "UPDATE berth_state SET change_seq = change_seq + 1 WHERE id = 1 RETURNING change_seq"
)
_RAW_LOG_CHANGE = "INSERT INTO berth_provider_changes (seq, provider_id) VALUES (?, ?)"
_RAW_INSERT_ROOT_RP = (
    "INSERT INTO resource_providers (uuid, name, generation, created_at) "
    "VALUES (?, ?, 0, ?) RETURNING id"
)
_RAW_SET_OWN_ROOT = "UPDATE resource_providers SET root_provider_id = id WHERE id = ?"

# Prebuilt Core statements: SQLAlchemy memoizes a statement's cache key on the object, so
# reusing one object per statement shape skips construction and key generation per call.
_rp = resource_providers
_SEL_RC_MAP = sa.select(resource_classes.c.id, resource_classes.c.name).order_by(
    resource_classes.c.id
)
_BUMP_RP = (
    sa.update(_rp)
    .where(_rp.c.id == sa.bindparam("rp_id"), _rp.c.generation == sa.bindparam("expected"))
    .values(generation=sa.bindparam("new_gen"), updated_at=sa.bindparam("now"))
)
_SEL_RPS_BY_UUID = sa.select(_rp.c.id, _rp.c.uuid, _rp.c.generation).where(
    _rp.c.uuid.in_(sa.bindparam("uuids", expanding=True))
)
_SEL_RPS_BY_ID = sa.select(_rp.c.id, _rp.c.uuid, _rp.c.generation).where(
    _rp.c.id.in_(sa.bindparam("ids", expanding=True))
)
_SEL_OLD_ALLOCS = sa.select(
    allocations.c.resource_provider_id,
    allocations.c.resource_class_id,
    allocations.c.used,
    allocations.c.consumer_id,
).where(allocations.c.consumer_id.in_(sa.bindparam("consumers", expanding=True)))
_SEL_USAGE_BY_RPS = (
    sa.select(
        allocations.c.resource_provider_id,
        allocations.c.resource_class_id,
        sa.func.sum(allocations.c.used).label("used"),
    )
    .where(allocations.c.resource_provider_id.in_(sa.bindparam("ids", expanding=True)))
    .group_by(allocations.c.resource_provider_id, allocations.c.resource_class_id)
)
_DEL_ALLOCS = sa.delete(allocations).where(
    allocations.c.consumer_id.in_(sa.bindparam("consumers", expanding=True))
)
_SEL_INVS_BY_RPS = sa.select(inventories).where(
    inventories.c.resource_provider_id.in_(sa.bindparam("ids", expanding=True))
)
_INS_ALLOC = sa.insert(allocations)
_SEL_CONSUMER = sa.select(
    consumers.c.id,
    consumers.c.generation,
    consumers.c.project_id,
    consumers.c.user_id,
    consumers.c.consumer_type_id,
).where(consumers.c.uuid == sa.bindparam("uuid"))
_INS_CONSUMER = (
    sa.insert(consumers)
    .values(
        uuid=sa.bindparam("uuid"),
        project_id=sa.bindparam("project"),
        user_id=sa.bindparam("user"),
        generation=0,
        consumer_type_id=sa.bindparam("ctype"),
        created_at=sa.bindparam("now"),
    )
    .returning(consumers.c.id)
)
_BUMP_CONSUMER = (
    sa.update(consumers)
    .where(
        consumers.c.id == sa.bindparam("cid"), consumers.c.generation == sa.bindparam("expected")
    )
    .values(generation=sa.bindparam("new_gen"), updated_at=sa.bindparam("now"))
)
_DEL_CONSUMER = sa.delete(consumers).where(consumers.c.id == sa.bindparam("cid"))
_INSERT_CHILD_RP = sa.text(
    "INSERT INTO resource_providers "
    "(uuid, name, generation, parent_provider_id, root_provider_id, created_at) "
    "VALUES (:uuid, :name, 0, :parent, :root, :now) RETURNING id"
)


class _MissingProvider(errors.BadRequest):
    """An allocation names an unknown provider; new consumers are kept (Placement quirk)."""


class _Retry(Exception):
    """A provider generation CAS lost a race; the transaction is retried."""


class _Unset:
    """Marker: no consumer generation was sent (microversion below 1.28)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


@dataclass(frozen=True, slots=True)
class ProviderRecord:
    """A resource provider row with its parent and root uuids resolved."""

    id: int
    uuid: str
    name: str
    generation: int
    parent_uuid: str | None
    root_uuid: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None

    @property
    def last_modified(self) -> dt.datetime | None:
        """The newer of updated_at and created_at."""
        return self.updated_at or self.created_at


@dataclass(frozen=True, slots=True)
class InventoryRecord:
    """One inventory row of a provider."""

    resource_class: str
    total: int
    reserved: int
    min_unit: int
    max_unit: int
    step_size: int
    allocation_ratio: float
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None

    @property
    def capacity(self) -> int:
        """int((total - reserved) * allocation_ratio)."""
        return int((self.total - self.reserved) * self.allocation_ratio)

    def as_dict(self) -> dict[str, Any]:
        """The wire representation (without the generation)."""
        return {
            "total": self.total,
            "reserved": self.reserved,
            "min_unit": self.min_unit,
            "max_unit": self.max_unit,
            "step_size": self.step_size,
            "allocation_ratio": float(self.allocation_ratio),
        }


def inventory_from_body(resource_class: str, body: Mapping[str, Any]) -> InventoryRecord:
    """Build an inventory record from a request body, applying the API defaults."""
    return InventoryRecord(
        resource_class=resource_class,
        total=int(body["total"]),
        reserved=int(body.get("reserved", 0)),
        min_unit=int(body.get("min_unit", 1)),
        max_unit=int(body.get("max_unit", MAX_INT)),
        step_size=int(body.get("step_size", 1)),
        allocation_ratio=float(body.get("allocation_ratio", 1.0)),
    )


@dataclass
class ConsumerWrite:
    """The new complete allocation set of one consumer."""

    consumer_uuid: str
    project_id: str
    user_id: str
    allocations: list[tuple[str, str, int]]  # (provider uuid, resource class, used)
    consumer_type: str | None = None  # None: leave the stored type alone (< 1.38)
    generation: int | None | _Unset = UNSET  # UNSET: no check (< 1.28)


@dataclass
class ConsumerAllocations:
    """GET /allocations/{consumer} data."""

    allocations: dict[str, dict[str, int]]  # provider uuid -> class -> used
    generations: dict[str, int]  # provider uuid -> generation
    project_id: str | None = None
    user_id: str | None = None
    consumer_generation: int | None = None
    consumer_type: str | None = None
    last_modified: dt.datetime | None = None


@dataclass
class _ConsumerState:
    id: int
    uuid: str
    generation: int
    created: bool


@dataclass
class ProviderFilters:
    """Filters of GET /resource_providers."""

    name: str | None = None
    uuid: str | None = None
    member_of: MemberOf | None = None
    resources: dict[str, int] = field(default_factory=dict)
    in_tree: str | None = None
    required: RequiredTraits | None = None


def _capacity_message(version: tuple[int, int], rc: str, rp_uuid: str) -> str:
    if version >= (1, 26):
        tail = "The reserved value is greater than total."
    else:
        tail = "The reserved value is greater than or equal to total."
    return f"Invalid inventory for '{rc}' on resource provider '{rp_uuid}'. {tail}"


def _capacity_ok(inv: InventoryRecord, version: tuple[int, int]) -> bool:
    if version >= (1, 26):
        return inv.reserved <= inv.total
    return inv.reserved < inv.total


class PlacementStore:
    """All Placement data operations over one SQLAlchemy engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._graph_lock = threading.Lock()
        self._graph: Any = None
        self._graph_seq: int | None = None
        self._providers: dict[int, Any] = {}
        self._names: tuple[list[str], list[str]] = ([], [])
        self._id_cache: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite) that bumps the change counter."""
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            conn.info[_TOUCHED] = set()
            conn.info[_FULL] = False
            yield conn
            cursor = self._raw(conn, _RAW_BUMP_SEQ, ())
            seq = int(cursor.fetchone()[0])
            cursor.close()
            touched = conn.info.pop(_TOUCHED, set())
            if touched:
                self._raw_many(conn, _RAW_LOG_CHANGE, [(seq, rp_id) for rp_id in touched])
            if conn.info.pop(_FULL, False):
                conn.execute(_MARK_FULL, {"seq": seq})
            if seq % 500 == 0:
                conn.execute(_PRUNE_CHANGES, {"seq": seq - CHANGE_LOG_KEEP})

    def _raw(self, conn: Connection, sql: str, params: Sequence[Any]) -> Any:
        """Execute on the transaction's DBAPI connection; returns the cursor."""
        if not self.is_sqlite:
            sql = sql.replace("?", "%s")
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(sql, tuple(params))
        except self.engine.dialect.loaded_dbapi.Error as exc:
            # Wrap like SQLAlchemy does, so IntegrityError/DataError handling is uniform.
            raise sa.exc.DBAPIError.instance(
                sql, params, exc, self.engine.dialect.loaded_dbapi.Error
            ) from exc
        return cursor

    def _raw_many(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """executemany on the transaction's DBAPI connection."""
        if not self.is_sqlite:
            sql = sql.replace("?", "%s")
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.executemany(sql, [tuple(r) for r in rows])
        except self.engine.dialect.loaded_dbapi.Error as exc:
            raise sa.exc.DBAPIError.instance(
                sql, rows, exc, self.engine.dialect.loaded_dbapi.Error
            ) from exc
        cursor.close()

    @staticmethod
    def _touch(conn: Connection, *rp_ids: int) -> None:
        """Record providers whose graph view this transaction changes."""
        conn.info.setdefault(_TOUCHED, set()).update(rp_ids)

    @staticmethod
    def _touch_all(conn: Connection) -> None:
        """Record a change that needs a full graph rebuild."""
        conn.info[_FULL] = True

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """A read-only transaction."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def change_seq(self) -> int:
        """The current change counter (one cheap query)."""
        with self._read() as conn:
            return int(conn.execute(_READ_SEQ).scalar_one())

    @staticmethod
    def _rc_maps(conn: Connection) -> tuple[dict[str, int], dict[int, str]]:
        rows = conn.execute(_SEL_RC_MAP).all()
        by_name = {r.name: r.id for r in rows}
        return by_name, {v: k for k, v in by_name.items()}

    @staticmethod
    def _provider_select() -> sa.Select[Any]:
        return _PROVIDER_SELECT

    @staticmethod
    def _build_provider_select() -> sa.Select[Any]:
        parent = resource_providers.alias("parent")
        root = resource_providers.alias("root")
        rp = resource_providers
        return sa.select(
            rp.c.id,
            rp.c.uuid,
            rp.c.name,
            rp.c.generation,
            parent.c.uuid.label("parent_uuid"),
            root.c.uuid.label("root_uuid"),
            rp.c.created_at,
            rp.c.updated_at,
        ).select_from(
            rp.outerjoin(parent, rp.c.parent_provider_id == parent.c.id).outerjoin(
                root, rp.c.root_provider_id == root.c.id
            )
        )

    @staticmethod
    def _record(row: Any) -> ProviderRecord:
        return ProviderRecord(
            id=row.id,
            uuid=row.uuid,
            name=row.name,
            generation=row.generation,
            parent_uuid=row.parent_uuid,
            root_uuid=row.root_uuid or row.uuid,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def _get_provider(self, conn: Connection, uuid: str) -> ProviderRecord | None:
        row = conn.execute(self._provider_select().where(resource_providers.c.uuid == uuid)).first()
        return None if row is None else self._record(row)

    @staticmethod
    def _bump(conn: Connection, rp_id: int, expected: int) -> bool:
        """CAS the provider generation; False when another writer got there first."""
        conn.info.setdefault(_TOUCHED, set()).add(rp_id)
        result = conn.execute(
            _BUMP_RP,
            {"rp_id": rp_id, "expected": expected, "new_gen": expected + 1, "now": utcnow()},
        )
        return result.rowcount == 1

    # ------------------------------------------------------------------ providers

    def get_provider(self, uuid: str) -> ProviderRecord | None:
        """One provider by uuid, or None."""
        with self._read() as conn:
            return self._get_provider(conn, uuid)

    def list_providers(self, filters: ProviderFilters) -> list[ProviderRecord]:
        """Providers matching every filter, in creation order."""
        rp = resource_providers
        stmt = self._provider_select()
        with self._read() as conn:
            if filters.name is not None:
                stmt = stmt.where(rp.c.name == filters.name)
            if filters.uuid is not None:
                stmt = stmt.where(rp.c.uuid == filters.uuid)
            if filters.in_tree is not None:
                root_id = conn.execute(
                    sa.select(rp.c.root_provider_id).where(rp.c.uuid == filters.in_tree)
                ).scalar()
                if root_id is None:
                    return []
                stmt = stmt.where(rp.c.root_provider_id == root_id)
            if filters.member_of is not None:
                for any_of in filters.member_of.required:
                    stmt = stmt.where(rp.c.id.in_(self._agg_members(any_of)))
                if filters.member_of.forbidden:
                    stmt = stmt.where(
                        rp.c.id.not_in(self._agg_members(filters.member_of.forbidden))
                    )
            if filters.required is not None:
                req = filters.required
                names = req.names()
                if names:
                    found = {
                        r[0]
                        for r in conn.execute(
                            sa.select(traits.c.name).where(traits.c.name.in_(names))
                        )
                    }
                    missing = sorted(names - found)
                    if missing:
                        raise errors.BadRequest(
                            'Invalid trait(s) in "required" parameter: No such trait(s): '
                            f"{', '.join(missing)}."
                        )
                for any_of in req.required:
                    stmt = stmt.where(rp.c.id.in_(self._trait_members(any_of)))
                if req.forbidden:
                    stmt = stmt.where(rp.c.id.not_in(self._trait_members(req.forbidden)))
            if filters.resources:
                by_name, _ = self._rc_maps(conn)
                for rc_name, amount in filters.resources.items():
                    rc_id = by_name.get(rc_name)
                    if rc_id is None:
                        raise errors.BadRequest(
                            "Invalid resource class in resources parameter: No such resource "
                            f"class {rc_name}."
                        )
                    if amount > MAX_INT:
                        # No inventory allows more than MAX_INT per allocation (max_unit).
                        return []
                    stmt = stmt.where(rp.c.id.in_(self._fitting(rc_id, amount)))
            rows = conn.execute(stmt.order_by(rp.c.id)).all()
        return [self._record(r) for r in rows]

    @staticmethod
    def _agg_members(agg_uuids: Iterable[str]) -> sa.Select[Any]:
        return (
            sa.select(resource_provider_aggregates.c.resource_provider_id)
            .join(
                placement_aggregates,
                placement_aggregates.c.id == resource_provider_aggregates.c.aggregate_id,
            )
            .where(placement_aggregates.c.uuid.in_(list(agg_uuids)))
        )

    @staticmethod
    def _trait_members(names: Iterable[str]) -> sa.Select[Any]:
        return (
            sa.select(resource_provider_traits.c.resource_provider_id)
            .join(traits, traits.c.id == resource_provider_traits.c.trait_id)
            .where(traits.c.name.in_(list(names)))
        )

    @staticmethod
    def _fitting(rc_id: int, amount: int) -> sa.Select[Any]:
        usage = (
            sa.select(
                allocations.c.resource_provider_id.label("rp_id"),
                sa.func.sum(allocations.c.used).label("used"),
            )
            .where(allocations.c.resource_class_id == rc_id)
            .group_by(allocations.c.resource_provider_id)
            .subquery()
        )
        inv = inventories
        used = sa.func.coalesce(usage.c.used, 0)
        return (
            sa.select(inv.c.resource_provider_id)
            .select_from(inv.outerjoin(usage, usage.c.rp_id == inv.c.resource_provider_id))
            .where(
                inv.c.resource_class_id == rc_id,
                (inv.c.total - inv.c.reserved) * inv.c.allocation_ratio >= used + amount,
                inv.c.min_unit <= amount,
                inv.c.max_unit >= amount,
                sa.literal(amount) % inv.c.step_size == 0,
            )
        )

    def create_provider(
        self, name: str, uuid: str | None, parent_uuid: str | None
    ) -> ProviderRecord:
        """Create a provider (generation 0); 409 duplicate_name, 400 bad parent."""
        rp_uuid = uuid or str(uuid_mod.uuid4())
        prefix = f'Unable to create resource provider "{name}", {rp_uuid}: '
        if parent_uuid is not None and parent_uuid == rp_uuid:
            raise errors.BadRequest(
                prefix + "Object action create failed because: parent provider UUID cannot be "
                "same as UUID. Please set parent provider UUID to None if there is no parent."
            )
        rp = resource_providers
        try:
            with self._write() as conn:
                parent_id = root_id = None
                if parent_uuid is not None:
                    prow = conn.execute(
                        sa.select(rp.c.id, rp.c.root_provider_id).where(rp.c.uuid == parent_uuid)
                    ).first()
                    if prow is None:
                        raise errors.BadRequest(
                            prefix + "Object action create failed because: parent provider "
                            "UUID does not exist."
                        )
                    parent_id, root_id = prow.id, prow.root_provider_id
                now = utcnow()
                # Uniqueness is left to the constraints: the common case costs one INSERT.
                if parent_id is None:
                    cursor = self._raw(conn, _RAW_INSERT_ROOT_RP, (rp_uuid, name, now))
                    new_id = int(cursor.fetchone()[0])
                    cursor.close()
                    self._raw(conn, _RAW_SET_OWN_ROOT, (new_id,)).close()
                    self._touch(conn, new_id)
                else:
                    new_id = conn.execute(
                        _INSERT_CHILD_RP,
                        {
                            "uuid": rp_uuid,
                            "name": name,
                            "parent": parent_id,
                            "root": root_id,
                            "now": now,
                        },
                    ).scalar_one()
                    self._touch(conn, new_id)
                return ProviderRecord(
                    id=new_id,
                    uuid=rp_uuid,
                    name=name,
                    generation=0,
                    parent_uuid=parent_uuid,
                    root_uuid=rp_uuid if parent_uuid is None else self._uuid_of(conn, root_id),
                    created_at=now,
                    updated_at=None,
                )
        except sa.exc.IntegrityError:
            # The name or uuid exists (or a concurrent writer just inserted it).
            with self._read() as conn:
                self._check_duplicate(conn, name, rp_uuid)
            raise errors.Conflict(
                f"Conflicting resource provider name: {name} already exists.",
                code=errors.DUPLICATE_NAME,
            ) from None

    @staticmethod
    def _uuid_of(conn: Connection, rp_id: int | None) -> str:
        return str(
            conn.execute(
                sa.select(resource_providers.c.uuid).where(resource_providers.c.id == rp_id)
            ).scalar_one()
        )

    @staticmethod
    def _check_duplicate(conn: Connection, name: str, rp_uuid: str) -> None:
        rp = resource_providers
        rows = conn.execute(
            sa.select(rp.c.name, rp.c.uuid).where(sa.or_(rp.c.name == name, rp.c.uuid == rp_uuid))
        ).all()
        dups = []
        if any(r.name == name for r in rows):
            dups.append(f"name: {name}")
        if any(r.uuid == rp_uuid for r in rows):
            dups.append(f"uuid: {rp_uuid}")
        if dups:
            raise errors.Conflict(
                f"Conflicting resource provider {', '.join(dups)} already exists.",
                code=errors.DUPLICATE_NAME,
            )

    def update_provider(
        self,
        uuid: str,
        name: str,
        *,
        set_parent: bool,
        parent_uuid: str | None,
        allow_reparent: bool,
    ) -> ProviderRecord:
        """Rename and/or re-parent a provider; the generation does not change."""
        rp = resource_providers
        prefix = f"Unable to save resource provider {uuid}: Object action "
        try:
            with self._write() as conn:
                cur = self._get_provider(conn, uuid)
                if cur is None:
                    raise errors.NotFound(
                        f"No resource provider with uuid {uuid} found", outside_handler=True
                    )
                values: dict[str, Any] = {"name": name, "updated_at": utcnow()}
                if set_parent and parent_uuid != cur.parent_uuid:
                    if parent_uuid is None:
                        if not allow_reparent:
                            raise errors.BadRequest(
                                prefix + "update failed because: un-parenting a provider is "
                                "not currently allowed."
                            )
                        values["parent_provider_id"] = None
                        self._reroot(conn, cur.id, cur.id)
                    else:
                        prow = conn.execute(
                            sa.select(rp.c.id, rp.c.root_provider_id).where(
                                rp.c.uuid == parent_uuid
                            )
                        ).first()
                        if prow is None:
                            raise errors.BadRequest(
                                prefix + "create failed because: parent provider UUID does not "
                                "exist."
                            )
                        if cur.parent_uuid is not None and not allow_reparent:
                            raise errors.BadRequest(
                                prefix + "update failed because: re-parenting a provider is not "
                                "currently allowed."
                            )
                        if prow.id in self._subtree_ids(conn, cur.id):
                            raise errors.BadRequest(
                                prefix + "update failed because: creating loop in the provider "
                                "tree is not allowed."
                            )
                        values["parent_provider_id"] = prow.id
                        self._reroot(conn, cur.id, prow.root_provider_id)
                if name != cur.name:
                    clash = conn.execute(
                        sa.select(rp.c.id).where(rp.c.name == name, rp.c.id != cur.id)
                    ).first()
                    if clash is not None:
                        raise errors.Conflict(
                            f"Conflicting resource provider {name} already exists.",
                            code=errors.DUPLICATE_NAME,
                        )
                conn.execute(sa.update(rp).where(rp.c.id == cur.id).values(**values))
                self._touch(conn, cur.id)
                out = self._get_provider(conn, uuid)
                assert out is not None
                return out
        except sa.exc.IntegrityError:
            raise errors.Conflict(
                f"Conflicting resource provider {name} already exists.", code=errors.DUPLICATE_NAME
            ) from None

    @staticmethod
    def _subtree_ids(conn: Connection, rp_id: int) -> set[int]:
        rp = resource_providers
        root_id = conn.execute(sa.select(rp.c.root_provider_id).where(rp.c.id == rp_id)).scalar()
        rows = conn.execute(
            sa.select(rp.c.id, rp.c.parent_provider_id).where(rp.c.root_provider_id == root_id)
        ).all()
        children: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            if r.parent_provider_id is not None:
                children[r.parent_provider_id].append(r.id)
        out = {rp_id}
        stack = [rp_id]
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in out:
                    out.add(child)
                    stack.append(child)
        return out

    def _reroot(self, conn: Connection, rp_id: int, new_root: int) -> None:
        ids = self._subtree_ids(conn, rp_id)
        self._touch(conn, *ids)
        conn.execute(
            sa.update(resource_providers)
            .where(resource_providers.c.id.in_(ids))
            .values(root_provider_id=new_root)
        )

    def delete_provider(self, uuid: str) -> None:
        """Delete a provider with its inventory, trait and aggregate links."""
        rp = resource_providers
        with self._write() as conn:
            row = conn.execute(sa.select(rp.c.id).where(rp.c.uuid == uuid)).first()
            if row is None:
                raise errors.NotFound(f"No resource provider with uuid {uuid} found for delete")
            rp_id = row.id
            if conn.execute(
                sa.select(allocations.c.id)
                .where(allocations.c.resource_provider_id == rp_id)
                .limit(1)
            ).first():
                raise errors.Conflict(
                    f"Unable to delete resource provider {uuid}: Resource provider has "
                    "allocations.",
                    code=errors.PROVIDER_IN_USE,
                )
            if conn.execute(
                sa.select(rp.c.id).where(rp.c.parent_provider_id == rp_id).limit(1)
            ).first():
                raise errors.Conflict(
                    f"Unable to delete parent resource provider {uuid}: It has child resource "
                    "providers.",
                    code=errors.PROVIDER_CANNOT_DELETE_PARENT,
                )
            conn.execute(sa.delete(inventories).where(inventories.c.resource_provider_id == rp_id))
            conn.execute(
                sa.delete(resource_provider_traits).where(
                    resource_provider_traits.c.resource_provider_id == rp_id
                )
            )
            conn.execute(
                sa.delete(resource_provider_aggregates).where(
                    resource_provider_aggregates.c.resource_provider_id == rp_id
                )
            )
            conn.execute(sa.delete(rp).where(rp.c.id == rp_id))
            self._touch(conn, rp_id)

    # ------------------------------------------------------------------ inventories

    def _inventories(self, conn: Connection, rp_id: int) -> dict[str, InventoryRecord]:
        _, by_id = self._rc_maps(conn)
        rows = conn.execute(
            sa.select(inventories).where(inventories.c.resource_provider_id == rp_id)
        ).all()
        out = {}
        for r in rows:
            name = by_id.get(r.resource_class_id, str(r.resource_class_id))
            out[name] = InventoryRecord(
                resource_class=name,
                total=r.total,
                reserved=r.reserved,
                min_unit=r.min_unit,
                max_unit=r.max_unit,
                step_size=r.step_size,
                allocation_ratio=r.allocation_ratio,
                created_at=r.created_at,
                updated_at=r.updated_at,
            )
        return out

    def get_inventories(
        self, uuid: str
    ) -> tuple[ProviderRecord, dict[str, InventoryRecord]] | None:
        """A provider and its inventories, or None when the provider does not exist."""
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            return prov, self._inventories(conn, prov.id)

    def _require_provider(self, conn: Connection, uuid: str) -> ProviderRecord:
        prov = self._get_provider(conn, uuid)
        if prov is None:
            raise errors.NotFound(
                f"No resource provider with uuid {uuid} found", outside_handler=True
            )
        return prov

    @staticmethod
    def _in_use(conn: Connection, rp_id: int, rc_ids: Iterable[int]) -> list[int]:
        ids = list(rc_ids)
        if not ids:
            return []
        rows = conn.execute(
            sa.select(allocations.c.resource_class_id)
            .where(
                allocations.c.resource_provider_id == rp_id,
                allocations.c.resource_class_id.in_(ids),
            )
            .distinct()
        ).all()
        return sorted(r[0] for r in rows)

    @staticmethod
    def _insert_inventory(
        conn: Connection, rp_id: int, rc_id: int, inv: InventoryRecord, now: dt.datetime
    ) -> None:
        conn.execute(
            sa.insert(inventories).values(
                resource_provider_id=rp_id,
                resource_class_id=rc_id,
                total=inv.total,
                reserved=inv.reserved,
                min_unit=inv.min_unit,
                max_unit=inv.max_unit,
                step_size=inv.step_size,
                allocation_ratio=inv.allocation_ratio,
                created_at=now,
                updated_at=None,
            )
        )

    @staticmethod
    def _update_inventory_row(
        conn: Connection, rp_id: int, rc_id: int, inv: InventoryRecord, now: dt.datetime
    ) -> None:
        conn.execute(
            sa.update(inventories)
            .where(
                inventories.c.resource_provider_id == rp_id,
                inventories.c.resource_class_id == rc_id,
            )
            .values(
                total=inv.total,
                reserved=inv.reserved,
                min_unit=inv.min_unit,
                max_unit=inv.max_unit,
                step_size=inv.step_size,
                allocation_ratio=inv.allocation_ratio,
                updated_at=now,
            )
        )

    def create_inventory(
        self, uuid: str, inv: InventoryRecord, version: tuple[int, int]
    ) -> tuple[InventoryRecord, int]:
        """Add one inventory class; returns the stored record and the new generation."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            by_name, _ = self._rc_maps(conn)
            rc_id = by_name.get(inv.resource_class)
            if rc_id is None:
                raise errors.BadRequest(
                    f"Unable to create inventory for resource provider {uuid}: No such resource "
                    f"class {inv.resource_class}."
                )
            if not _capacity_ok(inv, version):
                raise errors.BadRequest(
                    f"Unable to create inventory for resource provider {uuid}: "
                    + _capacity_message(version, inv.resource_class, uuid)
                )
            existing = self._inventories(conn, prov.id)
            if inv.resource_class in existing:
                raise errors.Conflict(
                    f"Update conflict: Inventory for '{inv.resource_class}' on resource provider "
                    f"'{uuid}' already exists.",
                    code=errors.CONCURRENT_UPDATE,
                )
            now = utcnow()
            self._insert_inventory(conn, prov.id, rc_id, inv, now)
            if not self._bump(conn, prov.id, prov.generation):
                raise errors.Conflict(
                    f"Update conflict: {CONCURRENT_MSG}", code=errors.CONCURRENT_UPDATE
                )
            stored = InventoryRecord(**{**_fields(inv), "created_at": now})
            return stored, prov.generation + 1

    def set_inventories(
        self,
        uuid: str,
        generation: int,
        new: Mapping[str, InventoryRecord],
        version: tuple[int, int],
    ) -> tuple[int, dict[str, InventoryRecord]]:
        """Replace all inventory of a provider (PUT .../inventories)."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            if prov.generation != generation:
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
            by_name, by_id = self._rc_maps(conn)
            for rc in new:
                if rc not in by_name:
                    raise errors.BadRequest(
                        f"Unknown resource class in inventory for resource provider {uuid}: No "
                        f"such resource class {rc}."
                    )
            self._replace_inventory(conn, prov, new, by_name, by_id, version, reshaper=False)
            if not self._bump(conn, prov.id, generation):
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
            return generation + 1, self._inventories(conn, prov.id)

    def _replace_inventory(
        self,
        conn: Connection,
        prov: ProviderRecord,
        new: Mapping[str, InventoryRecord],
        by_name: Mapping[str, int],
        by_id: Mapping[int, str],
        version: tuple[int, int],
        *,
        reshaper: bool,
    ) -> None:
        old = self._inventories(conn, prov.id)
        removed = [by_name[rc] for rc in old if rc not in new]
        in_use = self._in_use(conn, prov.id, removed)
        if in_use:
            names = ", ".join(by_id[i] for i in in_use)
            raise errors.Conflict(
                f"update conflict: Inventory for '{names}' on resource provider '{prov.uuid}' "
                "in use.",
                code=errors.INVENTORY_INUSE,
            )
        for rc, inv in new.items():
            if not _capacity_ok(inv, version):
                prefix = (
                    "malformed reshaper data: "
                    if reshaper
                    else f"Unable to update inventory for resource provider {prov.uuid}: "
                )
                raise errors.BadRequest(prefix + _capacity_message(version, rc, prov.uuid))
        if removed:
            conn.execute(
                sa.delete(inventories).where(
                    inventories.c.resource_provider_id == prov.id,
                    inventories.c.resource_class_id.in_(removed),
                )
            )
        now = utcnow()
        for rc, inv in new.items():
            if rc in old:
                if _fields(old[rc]) != _fields(inv):
                    self._update_inventory_row(conn, prov.id, by_name[rc], inv, now)
            else:
                self._insert_inventory(conn, prov.id, by_name[rc], inv, now)

    def update_inventory(
        self, uuid: str, generation: int, inv: InventoryRecord, version: tuple[int, int]
    ) -> tuple[InventoryRecord, int]:
        """Update one inventory class (PUT .../inventories/{rc})."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            if prov.generation != generation:
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
            by_name, _ = self._rc_maps(conn)
            rc_id = by_name.get(inv.resource_class)
            if rc_id is None:
                raise errors.NotFound(
                    f"No such resource class {inv.resource_class}.", outside_handler=True
                )
            existing = self._inventories(conn, prov.id)
            if inv.resource_class not in existing:
                raise errors.BadRequest(
                    f"No inventory record with resource class for resource provider {uuid}: No "
                    f"inventory of class {inv.resource_class} found."
                )
            if not _capacity_ok(inv, version):
                raise errors.BadRequest(
                    f"Unable to update inventory for resource provider {uuid}: "
                    + _capacity_message(version, inv.resource_class, uuid)
                )
            now = utcnow()
            self._update_inventory_row(conn, prov.id, rc_id, inv, now)
            if not self._bump(conn, prov.id, generation):
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
            old = existing[inv.resource_class]
            stored = InventoryRecord(
                **{**_fields(inv), "created_at": old.created_at, "updated_at": now}
            )
            return stored, generation + 1

    def delete_inventory(self, uuid: str, rc: str) -> None:
        """Delete one inventory class (generation +1)."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            by_name, _ = self._rc_maps(conn)
            rc_id = by_name.get(rc)
            existing = self._inventories(conn, prov.id)
            if rc_id is None or rc not in existing:
                raise errors.NotFound(
                    f"No inventory of class {rc} found for delete: No inventory of class {rc} "
                    "found."
                )
            if self._in_use(conn, prov.id, [rc_id]):
                raise errors.Conflict(
                    f"Unable to delete inventory of class {rc}: Inventory for '{rc}' on resource "
                    f"provider '{uuid}' in use.",
                    code=errors.CONCURRENT_UPDATE,
                )
            conn.execute(
                sa.delete(inventories).where(
                    inventories.c.resource_provider_id == prov.id,
                    inventories.c.resource_class_id == rc_id,
                )
            )
            if not self._bump(conn, prov.id, prov.generation):
                raise errors.Conflict(
                    f"Update conflict: {CONCURRENT_MSG}", code=errors.CONCURRENT_UPDATE
                )

    def delete_inventories(self, uuid: str) -> None:
        """Delete all inventory of a provider (generation +1)."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            by_name, by_id = self._rc_maps(conn)
            self._replace_inventory(conn, prov, {}, by_name, by_id, (1, 39), reshaper=False)
            if not self._bump(conn, prov.id, prov.generation):
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )

    # ------------------------------------------------------------------ aggregates

    @staticmethod
    def _aggregates(conn: Connection, rp_id: int) -> list[str]:
        rows = conn.execute(
            sa.select(placement_aggregates.c.uuid)
            .join(
                resource_provider_aggregates,
                resource_provider_aggregates.c.aggregate_id == placement_aggregates.c.id,
            )
            .where(resource_provider_aggregates.c.resource_provider_id == rp_id)
            .order_by(placement_aggregates.c.id)
        ).all()
        return [r[0] for r in rows]

    def get_aggregates(self, uuid: str) -> tuple[ProviderRecord, list[str]]:
        """A provider and its aggregate uuids (404 if the provider is missing)."""
        with self._read() as conn:
            prov = self._require_provider(conn, uuid)
            return prov, self._aggregates(conn, prov.id)

    def set_aggregates(
        self, uuid: str, aggs: Sequence[str], generation: int | None
    ) -> tuple[int, list[str]]:
        """Replace a provider's aggregates; with a generation (>= 1.19) CAS and bump it."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            gen_msg = (
                "Resource provider's generation already changed. Please update the generation "
                "and try again."
            )
            if generation is not None and prov.generation != generation:
                raise errors.Conflict(gen_msg, code=errors.CONCURRENT_UPDATE)
            wanted = list(dict.fromkeys(aggs))
            if wanted:
                existing = {
                    r.uuid: r.id
                    for r in conn.execute(
                        sa.select(placement_aggregates.c.uuid, placement_aggregates.c.id).where(
                            placement_aggregates.c.uuid.in_(wanted)
                        )
                    )
                }
                missing = [a for a in wanted if a not in existing]
                if missing:
                    self._insert_ignore(
                        conn,
                        placement_aggregates,
                        [{"uuid": a, "created_at": utcnow()} for a in missing],
                    )
                    for r in conn.execute(
                        sa.select(placement_aggregates.c.uuid, placement_aggregates.c.id).where(
                            placement_aggregates.c.uuid.in_(missing)
                        )
                    ):
                        existing[r.uuid] = r.id
                agg_ids = [existing[a] for a in wanted]
            else:
                agg_ids = []
            self._touch(conn, prov.id)
            conn.execute(
                sa.delete(resource_provider_aggregates).where(
                    resource_provider_aggregates.c.resource_provider_id == prov.id
                )
            )
            if agg_ids:
                conn.execute(
                    sa.insert(resource_provider_aggregates),
                    [{"resource_provider_id": prov.id, "aggregate_id": a} for a in agg_ids],
                )
            new_gen = prov.generation
            if generation is not None:
                if not self._bump(conn, prov.id, generation):
                    raise errors.Conflict(gen_msg, code=errors.CONCURRENT_UPDATE)
                new_gen += 1
            return new_gen, self._aggregates(conn, prov.id)

    def _insert_ignore(self, conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if self.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        else:
            from sqlalchemy.dialects.postgresql import insert as dialect_insert  # type: ignore[assignment]
        conn.execute(dialect_insert(table).on_conflict_do_nothing(), rows)

    # ------------------------------------------------------------------ traits

    @staticmethod
    def _provider_traits(conn: Connection, rp_id: int) -> list[str]:
        rows = conn.execute(
            sa.select(traits.c.name)
            .join(resource_provider_traits, resource_provider_traits.c.trait_id == traits.c.id)
            .where(resource_provider_traits.c.resource_provider_id == rp_id)
            .order_by(traits.c.id)
        ).all()
        return [r[0] for r in rows]

    def get_provider_traits(self, uuid: str) -> tuple[ProviderRecord, list[str]] | None:
        """A provider and its trait names, or None if missing."""
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            return prov, self._provider_traits(conn, prov.id)

    def set_provider_traits(
        self, uuid: str, names: Sequence[str], generation: int
    ) -> tuple[int, list[str]] | None:
        """Replace a provider's traits; None when the provider is missing."""
        gen_msg = (
            "Resource provider's generation already changed. Please update the generation and "
            "try again."
        )
        with self._write() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            if prov.generation != generation:
                raise errors.Conflict(gen_msg, code=errors.CONCURRENT_UPDATE)
            wanted = list(dict.fromkeys(names))
            found = {
                r.name: r.id
                for r in conn.execute(
                    sa.select(traits.c.name, traits.c.id).where(traits.c.name.in_(wanted))
                )
            }
            missing = [n for n in wanted if n not in found]
            if missing:
                raise errors.BadRequest(f"No such trait {', '.join(missing)}")
            current = set(self._provider_traits(conn, prov.id))
            if current == set(wanted):
                return prov.generation, self._provider_traits(conn, prov.id)
            conn.execute(
                sa.delete(resource_provider_traits).where(
                    resource_provider_traits.c.resource_provider_id == prov.id
                )
            )
            if wanted:
                conn.execute(
                    sa.insert(resource_provider_traits),
                    [{"resource_provider_id": prov.id, "trait_id": found[n]} for n in wanted],
                )
            if not self._bump(conn, prov.id, generation):
                raise errors.Conflict(gen_msg, code=errors.CONCURRENT_UPDATE)
            return generation + 1, self._provider_traits(conn, prov.id)

    def delete_provider_traits(self, uuid: str) -> bool:
        """Remove all traits of a provider; False when the provider is missing."""
        with self._write() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return False
            result = conn.execute(
                sa.delete(resource_provider_traits).where(
                    resource_provider_traits.c.resource_provider_id == prov.id
                )
            )
            if result.rowcount and not self._bump(conn, prov.id, prov.generation):
                raise errors.Conflict(
                    f"Update conflict: {CONCURRENT_MSG}", code=errors.CONCURRENT_UPDATE
                )
            return True

    def list_traits(
        self,
        *,
        names_in: Sequence[str] | None = None,
        prefix: str | None = None,
        associated: bool | None = None,
    ) -> list[tuple[str, dt.datetime | None]]:
        """Trait names (with timestamps) in DB order, filtered."""
        stmt = sa.select(traits.c.name, traits.c.created_at, traits.c.updated_at)
        if names_in is not None:
            stmt = stmt.where(traits.c.name.in_(list(names_in)))
        if prefix is not None:
            stmt = stmt.where(traits.c.name.startswith(prefix, autoescape=True))
        if associated is not None:
            linked = sa.select(resource_provider_traits.c.trait_id)
            stmt = stmt.where(traits.c.id.in_(linked) if associated else traits.c.id.not_in(linked))
        with self._read() as conn:
            rows = conn.execute(stmt.order_by(traits.c.id)).all()
        return [(r.name, r.updated_at or r.created_at) for r in rows]

    def get_trait(self, name: str) -> dt.datetime | None:
        """The trait's timestamp; NotFound when it does not exist."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(traits.c.created_at, traits.c.updated_at).where(traits.c.name == name)
            ).first()
        if row is None:
            raise errors.NotFound(f"No such trait(s): {name}.")
        return row.updated_at or row.created_at or utcnow()

    def ensure_trait(self, name: str) -> tuple[bool, dt.datetime]:
        """Create a custom trait if missing; returns (created, timestamp)."""
        with self._write() as conn:
            row = conn.execute(sa.select(traits.c.created_at).where(traits.c.name == name)).first()
            if row is not None:
                return False, row.created_at or utcnow()
            now = utcnow()
            self._insert_ignore(conn, traits, [{"name": name, "created_at": now}])
            return True, now

    def delete_trait(self, name: str) -> None:
        """Delete a custom trait that no provider uses."""
        with self._write() as conn:
            row = conn.execute(sa.select(traits.c.id).where(traits.c.name == name)).first()
            if row is None:
                raise errors.NotFound(f"No such trait(s): {name}.")
            if not os_traits.is_custom(name):
                raise errors.BadRequest(f"Cannot delete standard trait {name}.")
            if conn.execute(
                sa.select(resource_provider_traits.c.trait_id)
                .where(resource_provider_traits.c.trait_id == row.id)
                .limit(1)
            ).first():
                raise errors.Conflict(f"The trait {name} is in use by a resource provider.")
            conn.execute(sa.delete(traits).where(traits.c.id == row.id))

    # ------------------------------------------------------------------ resource classes

    def list_resource_classes(self) -> list[tuple[str, dt.datetime | None]]:
        """Resource classes in id order (standard first), with timestamps."""
        with self._read() as conn:
            rows = conn.execute(
                sa.select(
                    resource_classes.c.name,
                    resource_classes.c.created_at,
                    resource_classes.c.updated_at,
                ).order_by(resource_classes.c.id)
            ).all()
        return [(r.name, r.updated_at or r.created_at) for r in rows]

    def get_resource_class(self, name: str) -> dt.datetime | None:
        """The class's timestamp (None for standard ones); NotFound if unknown."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(resource_classes.c.created_at, resource_classes.c.updated_at).where(
                    resource_classes.c.name == name
                )
            ).first()
        if row is None:
            raise errors.NotFound(f"No such resource class {name}.")
        return row.updated_at or row.created_at

    def create_resource_class(self, name: str, *, exists_ok: bool = False) -> bool:
        """Create a custom class with an id >= 10000; returns False if it already existed."""
        for _attempt in range(RETRY_COUNT):
            try:
                with self._write() as conn:
                    if conn.execute(
                        sa.select(resource_classes.c.id).where(resource_classes.c.name == name)
                    ).first():
                        if exists_ok:
                            return False
                        raise errors.Conflict(f"Conflicting resource class already exists: {name}")
                    next_id = conn.execute(
                        sa.select(
                            sa.func.coalesce(
                                sa.func.max(resource_classes.c.id), db.CUSTOM_RC_MIN_ID - 1
                            )
                            + 1
                        ).where(resource_classes.c.id >= db.CUSTOM_RC_MIN_ID)
                    ).scalar_one()
                    conn.execute(
                        sa.insert(resource_classes).values(
                            id=next_id, name=name, created_at=utcnow(), updated_at=None
                        )
                    )
                    return True
            except sa.exc.IntegrityError:
                continue
        raise errors.Conflict(f"Conflicting resource class already exists: {name}")

    def rename_resource_class(self, old: str, new: str) -> dt.datetime:
        """Rename a custom class (1.2-1.6)."""
        with self._write() as conn:
            row = conn.execute(
                sa.select(resource_classes.c.id).where(resource_classes.c.name == old)
            ).first()
            if row is None:
                raise errors.NotFound(f"No such resource class {old}.")
            if old in STANDARD_RCS or row.id < db.CUSTOM_RC_MIN_ID:
                raise errors.BadRequest(f"Cannot update standard resource class {old}")
            if conn.execute(
                sa.select(resource_classes.c.id).where(resource_classes.c.name == new)
            ).first():
                raise errors.Conflict(f"Resource class already exists: {new}")
            now = utcnow()
            conn.execute(
                sa.update(resource_classes)
                .where(resource_classes.c.id == row.id)
                .values(name=new, updated_at=now)
            )
            # Inventories show the class by name on every provider.
            self._touch_all(conn)
            return now

    def delete_resource_class(self, name: str) -> None:
        """Delete a custom class no inventory uses."""
        with self._write() as conn:
            row = conn.execute(
                sa.select(resource_classes.c.id).where(resource_classes.c.name == name)
            ).first()
            if row is None:
                raise errors.NotFound(f"No such resource class {name}.")
            if name in STANDARD_RCS or row.id < db.CUSTOM_RC_MIN_ID:
                raise errors.BadRequest(
                    f"Error in delete resource class: Cannot delete standard resource class {name}."
                )
            if conn.execute(
                sa.select(inventories.c.id)
                .where(inventories.c.resource_class_id == row.id)
                .limit(1)
            ).first():
                raise errors.Conflict(
                    f"Error in delete resource class: Cannot delete resource class {name}. Class "
                    "is in use in inventory."
                )
            conn.execute(sa.delete(resource_classes).where(resource_classes.c.id == row.id))

    # ------------------------------------------------------------------ usages

    def provider_usages(self, uuid: str) -> tuple[ProviderRecord, dict[str, int]] | None:
        """Per-class usage of a provider, one entry per inventoried class."""
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            _, by_id = self._rc_maps(conn)
            inv_rcs = conn.execute(
                sa.select(inventories.c.resource_class_id).where(
                    inventories.c.resource_provider_id == prov.id
                )
            ).all()
            used: dict[int, int] = {
                int(r[0]): int(r[1] or 0)
                for r in conn.execute(
                    sa.select(allocations.c.resource_class_id, sa.func.sum(allocations.c.used))
                    .where(allocations.c.resource_provider_id == prov.id)
                    .group_by(allocations.c.resource_class_id)
                ).all()
            }
            return prov, {by_id[r[0]]: int(used.get(r[0], 0) or 0) for r in inv_rcs}

    def project_usages(
        self,
        project_id: str,
        user_id: str | None,
        consumer_type: str | None,
        grouped: bool,
    ) -> dict[str, Any]:
        """GET /usages data: flat (< 1.38) or grouped by consumer type (>= 1.38)."""
        c = consumers
        with self._read() as conn:
            _, rc_by_id = self._rc_maps(conn)
            stmt = (
                sa.select(
                    allocations.c.resource_class_id,
                    allocations.c.used,
                    c.c.id.label("consumer_id"),
                    consumer_types.c.name.label("ctype"),
                )
                .select_from(
                    allocations.join(c, c.c.uuid == allocations.c.consumer_id)
                    .join(projects, projects.c.id == c.c.project_id)
                    .join(users, users.c.id == c.c.user_id)
                    .outerjoin(consumer_types, consumer_types.c.id == c.c.consumer_type_id)
                )
                .where(projects.c.external_id == project_id)
            )
            if user_id is not None:
                stmt = stmt.where(users.c.external_id == user_id)
            if grouped and consumer_type not in (None, "all"):
                if consumer_type == "unknown":
                    stmt = stmt.where(c.c.consumer_type_id.is_(None))
                else:
                    stmt = stmt.where(consumer_types.c.name == consumer_type)
            rows = conn.execute(stmt).all()
        if not grouped:
            flat: dict[str, int] = defaultdict(int)
            for r in rows:
                flat[rc_by_id[r.resource_class_id]] += r.used
            return dict(flat)
        groups: dict[str, dict[str, int]] = {}
        members: dict[str, set[int]] = defaultdict(set)
        for r in rows:
            key = "all" if consumer_type == "all" else (r.ctype or "unknown")
            bucket = groups.setdefault(key, {})
            rc = rc_by_id[r.resource_class_id]
            bucket[rc] = bucket.get(rc, 0) + r.used
            members[key].add(r.consumer_id)
        for key, bucket in groups.items():
            bucket["consumer_count"] = len(members[key])
        return groups

    # ------------------------------------------------------------------ allocations

    def provider_allocations(
        self, uuid: str
    ) -> (
        tuple[ProviderRecord, dict[str, dict[str, int]], dict[str, int], dt.datetime | None] | None
    ):
        """A provider's allocations by consumer, the consumers' generations, last-modified."""
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            _, by_id = self._rc_maps(conn)
            rows = conn.execute(
                sa.select(
                    allocations.c.consumer_id,
                    allocations.c.resource_class_id,
                    allocations.c.used,
                    allocations.c.created_at,
                    allocations.c.updated_at,
                    consumers.c.generation,
                )
                .select_from(
                    allocations.outerjoin(consumers, consumers.c.uuid == allocations.c.consumer_id)
                )
                .where(allocations.c.resource_provider_id == prov.id)
                .order_by(allocations.c.id)
            ).all()
        out: dict[str, dict[str, int]] = {}
        gens: dict[str, int] = {}
        stamps = []
        for r in rows:
            out.setdefault(r.consumer_id, {})[by_id[r.resource_class_id]] = r.used
            gens[r.consumer_id] = r.generation if r.generation is not None else 0
            stamps.append(r.updated_at or r.created_at)
        last = max((s for s in stamps if s is not None), default=None)
        return prov, out, gens, last

    def consumer_allocations(self, consumer_uuid: str) -> ConsumerAllocations:
        """GET /allocations/{consumer} data (empty for an unknown consumer)."""
        with self._read() as conn:
            _, by_id = self._rc_maps(conn)
            rows = conn.execute(
                sa.select(
                    resource_providers.c.uuid,
                    resource_providers.c.generation,
                    allocations.c.resource_class_id,
                    allocations.c.used,
                    allocations.c.created_at,
                    allocations.c.updated_at,
                )
                .join(
                    resource_providers,
                    resource_providers.c.id == allocations.c.resource_provider_id,
                )
                .where(allocations.c.consumer_id == consumer_uuid)
                .order_by(allocations.c.id)
            ).all()
            result = ConsumerAllocations(allocations={}, generations={})
            if not rows:
                return result
            for r in rows:
                result.allocations.setdefault(r.uuid, {})[by_id[r.resource_class_id]] = r.used
                result.generations[r.uuid] = r.generation
            result.last_modified = max(
                (r.updated_at or r.created_at for r in rows if (r.updated_at or r.created_at)),
                default=None,
            )
            crow = conn.execute(
                sa.select(
                    consumers.c.generation,
                    projects.c.external_id.label("project"),
                    users.c.external_id.label("user"),
                    consumer_types.c.name.label("ctype"),
                )
                .select_from(
                    consumers.join(projects, projects.c.id == consumers.c.project_id)
                    .join(users, users.c.id == consumers.c.user_id)
                    .outerjoin(consumer_types, consumer_types.c.id == consumers.c.consumer_type_id)
                )
                .where(consumers.c.uuid == consumer_uuid)
            ).first()
            if crow is not None:
                result.project_id = crow.project
                result.user_id = crow.user
                result.consumer_generation = crow.generation
                result.consumer_type = crow.ctype
            return result

    def _external_id(self, conn: Connection, table: sa.Table, external: str) -> int:
        """Id of a project, user or consumer type, created on first use.

        Those rows are never deleted, so ids seen committed are cached per process;
        ids inserted by this transaction are not (a rollback would orphan them).
        """
        key_ = (table.name, external)
        cached = self._id_cache.get(key_)
        if cached is not None:
            return cached
        col = table.c.external_id if "external_id" in table.c else table.c.name
        found = conn.execute(sa.select(table.c.id).where(col == external)).scalar()
        if found is not None:
            if len(self._id_cache) < 100_000:
                self._id_cache[key_] = int(found)
            return int(found)
        key = "external_id" if "external_id" in table.c else "name"
        self._insert_ignore(conn, table, [{key: external}])
        return int(conn.execute(sa.select(table.c.id).where(col == external)).scalar_one())

    def _inspect_consumers(
        self, conn: Connection, writes: Sequence[ConsumerWrite]
    ) -> dict[str, _ConsumerState]:
        """Check consumer generations, create missing consumers, update project/user/type."""
        states: dict[str, _ConsumerState] = {}
        for w in writes:
            project = self._external_id(conn, projects, w.project_id)
            user = self._external_id(conn, users, w.user_id)
            ctype_id = (
                self._external_id(conn, consumer_types, w.consumer_type)
                if w.consumer_type is not None
                else None
            )
            row = conn.execute(_SEL_CONSUMER, {"uuid": w.consumer_uuid}).first()
            if row is not None:
                if not isinstance(w.generation, _Unset) and w.generation != row.generation:
                    raise errors.Conflict(
                        f"consumer generation conflict - expected {row.generation} but "
                        f"got {w.generation}",
                        code=errors.CONCURRENT_UPDATE,
                    )
                changes: dict[str, Any] = {}
                if row.project_id != project:
                    changes["project_id"] = project
                if row.user_id != user:
                    changes["user_id"] = user
                if ctype_id is not None and row.consumer_type_id != ctype_id:
                    changes["consumer_type_id"] = ctype_id
                if changes:
                    changes["updated_at"] = utcnow()
                    conn.execute(
                        sa.update(consumers).where(consumers.c.id == row.id).values(**changes)
                    )
                states[w.consumer_uuid] = _ConsumerState(
                    row.id, w.consumer_uuid, row.generation, False
                )
            else:
                if not isinstance(w.generation, _Unset) and w.generation is not None:
                    raise errors.Conflict(
                        f"consumer generation conflict - expected null but got {w.generation}",
                        code=errors.CONCURRENT_UPDATE,
                    )
                new_id = conn.execute(
                    _INS_CONSUMER,
                    {
                        "uuid": w.consumer_uuid,
                        "project": project,
                        "user": user,
                        "ctype": ctype_id,
                        "now": utcnow(),
                    },
                ).scalar_one()
                states[w.consumer_uuid] = _ConsumerState(new_id, w.consumer_uuid, 0, True)
        return states

    def write_allocations(
        self,
        writes: Sequence[ConsumerWrite],
        *,
        post: bool,
    ) -> None:
        """Replace the allocations of every consumer in ``writes`` in one transaction.

        A lost provider CAS retries the whole transaction. Quirk kept from Placement: it
        commits new consumers before looking the providers up, so when a provider is
        missing the new consumers stay (the next write must send generation 0).
        """
        for _attempt in range(RETRY_COUNT):
            try:
                with self._write() as conn:
                    states = self._inspect_consumers(conn, writes)
                    self._replace_allocations(conn, writes, states, post=post)
                return
            except _Retry:
                continue
            except _MissingProvider:
                with (
                    contextlib.suppress(errors.PlacementError, sa.exc.IntegrityError),
                    self._write() as conn,
                ):
                    self._inspect_consumers(conn, writes)
                raise
            except sa.exc.IntegrityError:
                # Another request created the same consumer between our read and insert.
                raise errors.Conflict(
                    "Inventory and/or allocations changed while attempting to allocate: "
                    f"{CONCURRENT_MSG}",
                    code=errors.CONCURRENT_UPDATE,
                ) from None
        raise errors.Conflict(
            f"Inventory and/or allocations changed while attempting to allocate: {CONCURRENT_MSG}",
            code=errors.CONCURRENT_UPDATE,
        )

    def _replace_allocations(
        self,
        conn: Connection,
        writes: Sequence[ConsumerWrite],
        states: Mapping[str, _ConsumerState],
        *,
        post: bool,
        interim: Mapping[int, Mapping[str, InventoryRecord]] | None = None,
    ) -> None:
        """Delete old rows, check capacity, insert new rows, CAS providers and consumers."""
        wanted_uuids = sorted({a[0] for w in writes for a in w.allocations})
        prov_rows = (
            {r.uuid: r for r in conn.execute(_SEL_RPS_BY_UUID, {"uuids": wanted_uuids})}
            if wanted_uuids
            else {}
        )
        for w in writes:
            for rp_uuid, _rc, _used in w.allocations:
                if rp_uuid not in prov_rows:
                    raise _MissingProvider(
                        f"Allocation for resource provider '{rp_uuid}' that does not exist."
                    )
        by_name, by_id = self._rc_maps(conn)
        for w in writes:
            for _rp, rc, _used in w.allocations:
                if rc not in by_name:
                    if post:
                        raise errors.BadRequest(
                            f"Unable to allocate inventory No such resource class {rc}."
                        )
                    raise errors.BadRequest(
                        f"Unable to allocate inventory for consumer {w.consumer_uuid}: No such "
                        f"resource class {rc}."
                    )
        consumer_uuids = [w.consumer_uuid for w in writes]
        old_rows = conn.execute(_SEL_OLD_ALLOCS, {"consumers": consumer_uuids}).all()
        # Every provider losing this consumer's allocations changes usage.
        self._touch(conn, *{r.resource_provider_id for r in old_rows})
        # Providers to bump: every one in the new data, plus those whose allocations a
        # consumer clears with an empty ``allocations``.
        bump_ids: dict[int, int] = {}
        id_to_uuid: dict[int, str] = {}
        for r in prov_rows.values():
            bump_ids[r.id] = r.generation
            id_to_uuid[r.id] = r.uuid
        clearing = {w.consumer_uuid for w in writes if not w.allocations}
        clear_ids = {r.resource_provider_id for r in old_rows if r.consumer_id in clearing}
        for row in (
            conn.execute(_SEL_RPS_BY_ID, {"ids": sorted(clear_ids - set(bump_ids))})
            if clear_ids - set(bump_ids)
            else []
        ):
            bump_ids[row.id] = row.generation
            id_to_uuid[row.id] = row.uuid

        # Requested amounts per (provider id, class id).
        requested: dict[tuple[int, int], int] = defaultdict(int)
        items: list[tuple[str, int, int, int]] = []  # consumer, rp id, rc id, used
        for w in writes:
            for rp_uuid, rc, used in w.allocations:
                key = (prov_rows[rp_uuid].id, by_name[rc])
                requested[key] += used
                items.append((w.consumer_uuid, key[0], key[1], used))
        before: dict[tuple[int, int], int] = {}
        if requested:
            rp_ids = {k[0] for k in requested}
            for r in conn.execute(_SEL_USAGE_BY_RPS, {"ids": sorted(rp_ids)}):
                before[(r.resource_provider_id, r.resource_class_id)] = int(r.used)
        if old_rows:
            conn.execute(_DEL_ALLOCS, {"consumers": consumer_uuids})
        if requested:
            mine: dict[tuple[int, int], int] = defaultdict(int)
            for r in old_rows:
                mine[(r.resource_provider_id, r.resource_class_id)] += r.used
            inv_map: dict[tuple[int, int], InventoryRecord] = {}
            rp_ids = {k[0] for k in requested}
            for r in conn.execute(_SEL_INVS_BY_RPS, {"ids": sorted(rp_ids)}):
                inv_map[(r.resource_provider_id, r.resource_class_id)] = InventoryRecord(
                    resource_class=by_id[r.resource_class_id],
                    total=r.total,
                    reserved=r.reserved,
                    min_unit=r.min_unit,
                    max_unit=r.max_unit,
                    step_size=r.step_size,
                    allocation_ratio=r.allocation_ratio,
                )
            if interim is not None:
                for rp_id, invs in interim.items():
                    for rc_name, inv in invs.items():
                        inv_map[(rp_id, by_name[rc_name])] = inv
            for _consumer, rp_id, rc_id, used in items:
                found = inv_map.get((rp_id, rc_id))
                where = f"'{by_id[rc_id]}' on resource provider '{id_to_uuid[rp_id]}'"
                if found is None:
                    raise errors.Conflict(
                        f"Unable to allocate inventory: Inventory for {where} invalid."
                    )
                if used < found.min_unit or used > found.max_unit or used % found.step_size != 0:
                    raise errors.Conflict(
                        f"Unable to allocate inventory: Unable to create allocation for {where}. "
                        "The requested amount would violate inventory constraints."
                    )
            for key, amount in requested.items():
                inv = inv_map[key]
                prev = before.get(key, 0)
                others = prev - mine.get(key, 0)
                new_total = others + amount
                capacity = (inv.total - inv.reserved) * inv.allocation_ratio
                if new_total > capacity and new_total > prev:
                    where = f"'{by_id[key[1]]}' on resource provider '{id_to_uuid[key[0]]}'"
                    raise errors.Conflict(
                        f"Unable to allocate inventory: Unable to create allocation for {where}. "
                        "The requested amount would exceed the capacity."
                    )
            now = utcnow()
            merged: dict[tuple[str, int, int], int] = defaultdict(int)
            for consumer, rp_id, rc_id, used in items:
                merged[(consumer, rp_id, rc_id)] += used
            conn.execute(
                _INS_ALLOC,
                [
                    {
                        "resource_provider_id": rp_id,
                        "consumer_id": consumer,
                        "resource_class_id": rc_id,
                        "used": used,
                        "created_at": now,
                        "updated_at": None,
                    }
                    for (consumer, rp_id, rc_id), used in merged.items()
                ],
            )
        for rp_id in sorted(bump_ids):
            if not self._bump(conn, rp_id, bump_ids[rp_id]):
                raise _Retry()
        # Consumers in a fixed order, like providers, so concurrent writers cannot deadlock.
        for w in sorted(writes, key=lambda w: w.consumer_uuid):
            state = states[w.consumer_uuid]
            result = conn.execute(
                _BUMP_CONSUMER,
                {
                    "cid": state.id,
                    "expected": state.generation,
                    "new_gen": state.generation + 1,
                    "now": utcnow(),
                },
            )
            if result.rowcount != 1:
                raise errors.Conflict(
                    f"consumer generation conflict - expected {state.generation} but got "
                    f"{state.generation}",
                    code=errors.CONCURRENT_UPDATE,
                )
            if not w.allocations:
                conn.execute(_DEL_CONSUMER, {"cid": state.id})

    def delete_consumer_allocations(self, consumer_uuid: str) -> None:
        """Delete all allocations of a consumer and the consumer itself."""
        with self._write() as conn:
            self._touch(
                conn,
                *conn.execute(
                    sa.select(allocations.c.resource_provider_id).where(
                        allocations.c.consumer_id == consumer_uuid
                    )
                ).scalars(),
            )
            result = conn.execute(
                sa.delete(allocations).where(allocations.c.consumer_id == consumer_uuid)
            )
            if not result.rowcount:
                raise errors.NotFound(f"No allocations for consumer '{consumer_uuid}'")
            conn.execute(sa.delete(consumers).where(consumers.c.uuid == consumer_uuid))

    # ------------------------------------------------------------------ reshaper

    def reshape(
        self,
        new_inventories: Mapping[str, tuple[int, dict[str, InventoryRecord]]],
        writes: Sequence[ConsumerWrite],
        version: tuple[int, int],
    ) -> None:
        """Atomically move inventory and allocations (POST /reshaper)."""
        for _attempt in range(RETRY_COUNT):
            try:
                with self._write() as conn:
                    self._reshape(conn, new_inventories, writes, version)
                return
            except _Retry:
                continue
        raise errors.Conflict(f"update conflict: {CONCURRENT_MSG}", code=errors.CONCURRENT_UPDATE)

    def _reshape(
        self,
        conn: Connection,
        new_inventories: Mapping[str, tuple[int, dict[str, InventoryRecord]]],
        writes: Sequence[ConsumerWrite],
        version: tuple[int, int],
    ) -> None:
        provs: dict[str, ProviderRecord] = {}
        for rp_uuid in new_inventories:
            prov = self._get_provider(conn, rp_uuid)
            if prov is None:
                raise errors.BadRequest(
                    f"Resource provider {rp_uuid} in inventories not found: No such resource "
                    f"provider {rp_uuid}.",
                    code=errors.RESOURCE_PROVIDER_NOT_FOUND,
                )
            provs[rp_uuid] = prov
        for rp_uuid, (gen, _invs) in new_inventories.items():
            if provs[rp_uuid].generation != gen:
                raise errors.Conflict(
                    f"resource provider generation conflict for provider {rp_uuid}: actual: "
                    f"{provs[rp_uuid].generation}, given: {gen}",
                    code=errors.CONCURRENT_UPDATE,
                )
        # Consumers: generation checks and creation inside this same transaction.
        states: dict[str, _ConsumerState] = {}
        for w in writes:
            row = conn.execute(
                sa.select(consumers.c.id, consumers.c.generation).where(
                    consumers.c.uuid == w.consumer_uuid
                )
            ).first()
            if row is not None:
                if not isinstance(w.generation, _Unset) and w.generation != row.generation:
                    raise errors.Conflict(
                        f"consumer generation conflict - expected {row.generation} but got "
                        f"{w.generation}",
                        code=errors.CONCURRENT_UPDATE,
                    )
            elif not isinstance(w.generation, _Unset) and w.generation is not None:
                raise errors.Conflict(
                    f"consumer generation conflict - expected null but got {w.generation}",
                    code=errors.CONCURRENT_UPDATE,
                )
        by_name, by_id = self._rc_maps(conn)
        for _gen, invs in new_inventories.values():
            for rc in invs:
                if rc not in by_name:
                    raise errors.BadRequest(
                        f"malformed reshaper data: No such resource class {rc}."
                    )
        for w in writes:
            for _rp, rc, _used in w.allocations:
                if rc not in by_name:
                    raise errors.BadRequest(
                        f"malformed reshaper data: No such resource class {rc}."
                    )
        for w in writes:
            project = self._external_id(conn, projects, w.project_id)
            user = self._external_id(conn, users, w.user_id)
            ctype_id = (
                self._external_id(conn, consumer_types, w.consumer_type)
                if w.consumer_type is not None
                else None
            )
            row = conn.execute(
                sa.select(consumers.c.id, consumers.c.generation).where(
                    consumers.c.uuid == w.consumer_uuid
                )
            ).first()
            if row is None:
                cid = conn.execute(
                    sa.insert(consumers)
                    .values(
                        uuid=w.consumer_uuid,
                        project_id=project,
                        user_id=user,
                        generation=0,
                        consumer_type_id=ctype_id,
                        created_at=utcnow(),
                    )
                    .returning(consumers.c.id)
                ).scalar_one()
                states[w.consumer_uuid] = _ConsumerState(cid, w.consumer_uuid, 0, True)
            else:
                values: dict[str, Any] = {"project_id": project, "user_id": user}
                if ctype_id is not None:
                    values["consumer_type_id"] = ctype_id
                conn.execute(sa.update(consumers).where(consumers.c.id == row.id).values(**values))
                states[w.consumer_uuid] = _ConsumerState(
                    row.id, w.consumer_uuid, row.generation, False
                )
        # Step 1: interim inventory = old union new (new wins) for non-empty new lists.
        interim: dict[int, dict[str, InventoryRecord]] = {}
        gens: dict[str, int] = {u: p.generation for u, p in provs.items()}
        for rp_uuid, (_gen, invs) in sorted(
            new_inventories.items(), key=lambda item: provs[item[0]].id
        ):
            prov = provs[rp_uuid]
            for rc, inv in invs.items():
                if not _capacity_ok(inv, version):
                    raise errors.BadRequest(
                        "malformed reshaper data: " + _capacity_message(version, rc, rp_uuid)
                    )
            if invs:
                merged = dict(self._inventories(conn, prov.id))
                merged.update(invs)
                interim[prov.id] = merged
                self._write_inventory_set(conn, prov.id, merged, by_name)
                if not self._bump(conn, prov.id, gens[rp_uuid]):
                    raise _Retry()
                gens[rp_uuid] += 1
        # Step 2: allocations against the interim inventory.
        if writes:
            self._replace_allocations(conn, writes, states, post=True, interim=None)
            for rp_uuid in provs:
                gens[rp_uuid] = int(
                    conn.execute(
                        sa.select(resource_providers.c.generation).where(
                            resource_providers.c.uuid == rp_uuid
                        )
                    ).scalar_one()
                )
        # Step 3: final inventory exactly as given.
        for rp_uuid, (_gen, invs) in sorted(
            new_inventories.items(), key=lambda item: provs[item[0]].id
        ):
            prov = provs[rp_uuid]
            self._replace_inventory(conn, prov, invs, by_name, by_id, version, reshaper=True)
            if not self._bump(conn, prov.id, gens[rp_uuid]):
                raise _Retry()

    def _write_inventory_set(
        self,
        conn: Connection,
        rp_id: int,
        invs: Mapping[str, InventoryRecord],
        by_name: Mapping[str, int],
    ) -> None:
        old = self._inventories(conn, rp_id)
        now = utcnow()
        for rc, inv in invs.items():
            if rc in old:
                if _fields(old[rc]) != _fields(inv):
                    self._update_inventory_row(conn, rp_id, by_name[rc], inv, now)
            else:
                self._insert_inventory(conn, rp_id, by_name[rc], inv, now)

    # ------------------------------------------------------------------ graph

    def provider_graph(self) -> Any:
        """The allocation-candidate engine's ProviderGraph, current as of this call.

        One cheap query compares the DB change counter with the cached graph's. When they
        differ, only the providers the change log names since then are reloaded (a
        resource class rename, or a cache too far behind, forces a full reload), and the
        graph is rebuilt from the cached Provider objects plus the fresh ones.
        """
        with self._graph_lock, self._snapshot() as conn:
            seq, full_seq = (int(v) for v in conn.execute(_READ_STATE).one())
            if self._graph is not None and seq == self._graph_seq:
                return self._graph
            old_seq = self._graph_seq
            if (
                self._graph is not None
                and old_seq is not None
                and full_seq <= old_seq
                and seq - old_seq <= INCREMENTAL_LIMIT
            ):
                changed = sorted(
                    int(r[0]) for r in conn.execute(_CHANGED_SINCE, {"old": old_seq, "new": seq})
                )
                fresh = self._load_providers(conn, changed)
                providers = dict(self._providers)
                for rp_id in changed:
                    if rp_id in fresh:
                        providers[rp_id] = fresh[rp_id]
                    else:
                        providers.pop(rp_id, None)
            else:
                providers = self._load_providers(conn, None)
            trait_names = list(
                conn.execute(sa.select(traits.c.name).order_by(traits.c.id)).scalars()
            )
            class_names = list(
                conn.execute(
                    sa.select(resource_classes.c.name).order_by(resource_classes.c.id)
                ).scalars()
            )
        if (
            self._graph is not None
            and providers == self._providers
            and (trait_names, class_names) == self._names
        ):
            # The changes since the cached graph touched nothing it holds (e.g. a consumer
            # or project row, or a rewrite to the same values): keep it.
            self._graph_seq = seq
            return self._graph
        from berth.placement import candidates

        updated = [p for i, p in providers.items() if self._providers.get(i) is not p]
        if (
            self._graph is not None
            and providers.keys() == self._providers.keys()
            and (trait_names, class_names) == self._names
        ):
            # The common case while scheduling: usages of a few providers changed. The
            # engine patches its columns for those instead of rebuilding every index.
            graph = self._graph.with_updates(updated)
        else:
            graph = candidates.ProviderGraph(
                [providers[i] for i in sorted(providers)], trait_names, class_names
            )
        self._providers = providers
        self._names = (trait_names, class_names)
        self._graph, self._graph_seq = graph, seq
        return graph

    @contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        """A read transaction that sees one consistent snapshot across statements."""
        conn_ctx = self.engine.connect()
        if not self.is_sqlite:
            conn_ctx = conn_ctx.execution_options(isolation_level="REPEATABLE READ")
        with conn_ctx as conn, conn.begin():
            yield conn

    def _load_providers(self, conn: Connection, ids: Sequence[int] | None) -> dict[int, Any]:
        """Engine Provider objects by id: all of them (``ids`` None) or just ``ids``."""
        from berth.placement import candidates

        if ids is not None and not ids:
            return {}
        if ids is not None and len(ids) > 500:
            out: dict[int, Any] = {}
            for start in range(0, len(ids), 500):
                out.update(self._load_providers(conn, ids[start : start + 500]))
            return out
        rp = resource_providers
        _, rc_by_id = self._rc_maps(conn)
        parent = rp.alias("parent")
        root = rp.alias("root")
        prov_q = sa.select(
            rp.c.id,
            rp.c.uuid,
            rp.c.name,
            rp.c.generation,
            parent.c.uuid,
            root.c.uuid,
        ).select_from(
            rp.outerjoin(parent, rp.c.parent_provider_id == parent.c.id).outerjoin(
                root, rp.c.root_provider_id == root.c.id
            )
        )
        inv_q = sa.select(
            inventories.c.resource_provider_id,
            inventories.c.resource_class_id,
            inventories.c.total,
            inventories.c.reserved,
            inventories.c.min_unit,
            inventories.c.max_unit,
            inventories.c.step_size,
            inventories.c.allocation_ratio,
        )
        use_q = sa.select(
            allocations.c.resource_provider_id,
            allocations.c.resource_class_id,
            sa.func.sum(allocations.c.used),
        ).group_by(allocations.c.resource_provider_id, allocations.c.resource_class_id)
        trait_q = sa.select(resource_provider_traits.c.resource_provider_id, traits.c.name).join(
            traits, traits.c.id == resource_provider_traits.c.trait_id
        )
        agg_q = sa.select(
            resource_provider_aggregates.c.resource_provider_id, placement_aggregates.c.uuid
        ).join(
            placement_aggregates,
            placement_aggregates.c.id == resource_provider_aggregates.c.aggregate_id,
        )
        if ids is not None:
            id_list = list(ids)
            prov_q = prov_q.where(rp.c.id.in_(id_list))
            inv_q = inv_q.where(inventories.c.resource_provider_id.in_(id_list))
            use_q = use_q.where(allocations.c.resource_provider_id.in_(id_list))
            trait_q = trait_q.where(resource_provider_traits.c.resource_provider_id.in_(id_list))
            agg_q = agg_q.where(resource_provider_aggregates.c.resource_provider_id.in_(id_list))
        invs: dict[int, dict[str, Any]] = defaultdict(dict)
        inventory_cls = candidates.Inventory
        for rp_id, rc_id, total, reserved, min_u, max_u, step, ratio in conn.execute(
            inv_q
        ).tuples():
            name = rc_by_id[rc_id]
            invs[rp_id][name] = inventory_cls(
                name, total, reserved, min_u, max_u, step, float(ratio)
            )
        usages: dict[int, dict[str, int]] = defaultdict(dict)
        for rp_id, rc_id, used in conn.execute(use_q).tuples():
            usages[rp_id][rc_by_id[rc_id]] = int(used)
        rp_traits: dict[int, set[str]] = defaultdict(set)
        for rp_id, name in conn.execute(trait_q).tuples():
            rp_traits[rp_id].add(name)
        rp_aggs: dict[int, set[str]] = defaultdict(set)
        for rp_id, agg in conn.execute(agg_q).tuples():
            rp_aggs[rp_id].add(agg)
        empty: frozenset[str] = frozenset()
        provider_cls = candidates.Provider
        out = {}
        for rp_id, uuid, name, generation, parent_uuid, root_uuid in conn.execute(prov_q).tuples():
            out[rp_id] = provider_cls(
                uuid,
                name,
                generation,
                parent_uuid,
                root_uuid or uuid,
                invs.get(rp_id, {}),
                usages.get(rp_id, {}),
                frozenset(rp_traits[rp_id]) if rp_id in rp_traits else empty,
                frozenset(rp_aggs[rp_id]) if rp_id in rp_aggs else empty,
            )
        return out


_PROVIDER_SELECT = PlacementStore._build_provider_select()


def _fields(inv: InventoryRecord) -> dict[str, Any]:
    return {
        "resource_class": inv.resource_class,
        "total": inv.total,
        "reserved": inv.reserved,
        "min_unit": inv.min_unit,
        "max_unit": inv.max_unit,
        "step_size": inv.step_size,
        "allocation_ratio": float(inv.allocation_ratio),
    }
