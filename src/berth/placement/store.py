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
  which is how ``provider_graph()`` knows its cache is stale; trait and class name
  changes also bump ``names_seq``.

Hot paths (``provider_graph()`` and the common ``write_allocations()``) run raw SQL on
DBAPI connections the store keeps; on PostgreSQL one call's statements travel as one
pipeline. A new consumer on a provider the cached graph knows is written in one round
trip *trusting the cache*, which is sound because every write that adds usage to a
provider or changes its inventory bumps its generation: the compare-and-swap on the
cached generation proves the cached inventory still holds and the usage can only have
dropped. After its own write, when no other change committed in between, the store
patches its cached graph instead of reading the change back.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
import uuid as uuid_mod
import weakref
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
_MARK_FULL = sa.text("UPDATE berth_state SET full_seq = :seq WHERE id = 1")
_PRUNE_CHANGES = sa.text("DELETE FROM berth_provider_changes WHERE seq < :seq")
#: A cached graph further behind than this is rebuilt in full; the change log keeps
#: CHANGE_LOG_KEEP sequence numbers, comfortably more.
INCREMENTAL_LIMIT = 2000
CHANGE_LOG_KEEP = 5000
_TOUCHED = "berth_touched"
_USAGE = "berth_usage"
_GENS = "berth_gens"
_FULL = "berth_full"
_NAMES = "berth_names"
_NEW_IDS = "berth_new_ids"
_BUMP_NAMES = sa.text("UPDATE berth_state SET names_seq = names_seq + 1 WHERE id = 1")
# Raw DBAPI statements (``?`` placeholders, rewritten for psycopg) for the write hot
# path: they skip SQLAlchemy's per-execution context, which costs more than SQLite itself.
_RAW_BUMP_SEQ = (
    "UPDATE berth_state SET change_seq = change_seq + 1 WHERE id = 1 RETURNING change_seq"
)
_RAW_LOG_CHANGE = (
    "INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta) "
    "VALUES (?, ?, ?, ?)"
)
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
        # The cached graph state, guarded by _graph_lock. ``_providers`` (engine Provider
        # by provider id) is the database as of change ``_seq`` and names ``_names_seq``;
        # ``_graph`` was built from it, minus ``_dirty`` (providers patched since) or a
        # ``_structural`` change that needs a full rebuild.
        self._graph: Any = None
        self._graph_seq: int | None = None
        self._seq = -1
        self._names_seq = -1
        self._providers: dict[int, Any] = {}
        self._ids_by_uuid: dict[str, int] = {}
        self._dirty: dict[int, Any] = {}
        self._structural = False
        self._trait_names: list[str] = []
        self._class_names: list[str] = []
        self._rc_by_id: dict[int, str] = {}
        #: (names_seq, class name -> id) for the allocation fast path.
        self._write_rcs: tuple[int, dict[str, int]] | None = None
        self._id_cache: dict[tuple[str, str], int] = {}
        self._spare: list[RawConnection] = []
        weakref.finalize(self, _close_all, self._spare)
        #: Statements run on the hot-path raw connections (BEGIN/COMMIT included).
        self.raw_statements = 0

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A write transaction (BEGIN IMMEDIATE on SQLite) that bumps the change counter."""
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            conn.info[_TOUCHED] = set()
            conn.info[_USAGE] = {}
            conn.info[_GENS] = {}
            conn.info[_FULL] = False
            conn.info[_NAMES] = False
            conn.info[_NEW_IDS] = {}
            yield conn
            cursor = self._raw(conn, _RAW_BUMP_SEQ, ())
            seq = int(cursor.fetchone()[0])
            cursor.close()
            touched = conn.info.pop(_TOUCHED, set())
            usage, gens = conn.info.pop(_USAGE, {}), conn.info.pop(_GENS, {})
            log: list[tuple[int, int, int | None, str | None]] = [
                (seq, rp_id, None, None) for rp_id in touched
            ]
            log += [
                (seq, rp_id, gens.get(rp_id), encode_usage_delta(usage.get(rp_id, {})))
                for rp_id in sorted((usage.keys() | gens.keys()) - touched)
            ]
            if log:
                self._raw_many(conn, _RAW_LOG_CHANGE, log)
            if conn.info.pop(_FULL, False):
                conn.execute(_MARK_FULL, {"seq": seq})
            if conn.info.pop(_NAMES, False):
                conn.execute(_BUMP_NAMES)
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
    def _touch_usage(conn: Connection, rp_id: int, rc_id: int, delta: int) -> None:
        """Record that this transaction changes a provider's usage of a class by
        ``delta`` (logged as a delta, unless something else of the provider changes
        too: then it is logged for a reload)."""
        per = conn.info.setdefault(_USAGE, {}).setdefault(rp_id, {})
        per[rc_id] = per.get(rc_id, 0) + delta

    @staticmethod
    def _touch_all(conn: Connection) -> None:
        """Record a change that needs a full graph rebuild."""
        conn.info[_FULL] = True

    @staticmethod
    def _touch_names(conn: Connection) -> None:
        """Record that a trait or resource class name was created, deleted or renamed."""
        conn.info[_NAMES] = True

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
    def _bump(conn: Connection, rp_id: int, expected: int, *, usage_only: bool = False) -> bool:
        """CAS the provider generation; False when another writer got there first.

        ``usage_only``: the transaction changes nothing else of the provider than its
        usages (recorded with :meth:`_touch_usage`), so the change log can carry the new
        generation instead of asking readers to reload the provider.
        """
        if usage_only:
            conn.info.setdefault(_GENS, {})[rp_id] = expected + 1
        else:
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
        if parent_uuid is None:
            from berth.placement import provider_writes  # built on this module

            fast = provider_writes.create_root(self, name, rp_uuid)
            if fast is not None:
                return fast
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
        from berth.placement import provider_writes  # built on this module

        fast = provider_writes.set_inventories(self, uuid, generation, new, version)
        if fast is not None:
            return fast
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
            # The body's capacity is checked before the class is looked up, as Placement
            # validates it before it touches the provider's inventory.
            if not _capacity_ok(inv, version):
                raise errors.BadRequest(
                    f"Unable to update inventory for resource provider {uuid}: "
                    + _capacity_message(version, inv.resource_class, uuid)
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
        from berth.placement import provider_writes  # built on this module

        fast = provider_writes.set_traits(self, uuid, names, generation)
        if fast is not None:
            return fast
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
            self._touch_names(conn)
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
            self._touch_names(conn)

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
                    self._touch_names(conn)
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
            self._touch_names(conn)
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
            self._touch_names(conn)

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
        new_id = int(conn.execute(sa.select(table.c.id).where(col == external)).scalar_one())
        # Cached once the transaction commits (see _remember_new_ids).
        conn.info.setdefault(_NEW_IDS, {})[key_] = new_id
        return new_id

    def _remember_new_ids(self, new_ids: Mapping[tuple[str, str], int]) -> None:
        """Cache the ids a committed transaction created."""
        if new_ids and len(self._id_cache) < 100_000:
            self._id_cache.update(new_ids)

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

        The common case (one consumer, see :meth:`_fast_write`) first tries a raw-SQL
        path of one or two round trips that patches the cached graph on success;
        whatever it does not handle falls through to the general path below.
        """
        if len(writes) == 1 and self._fast_write(writes[0]):
            return
        for _attempt in range(RETRY_COUNT):
            try:
                with self._write() as conn:
                    new_ids = conn.info[_NEW_IDS]
                    states = self._inspect_consumers(conn, writes)
                    self._replace_allocations(conn, writes, states, post=post)
                self._remember_new_ids(new_ids)
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
        for r in old_rows:
            self._touch_usage(conn, r.resource_provider_id, r.resource_class_id, -r.used)
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
            for (rp_id, rc_id), amount in requested.items():
                self._touch_usage(conn, rp_id, rc_id, amount)
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
            if not self._bump(conn, rp_id, bump_ids[rp_id], usage_only=True):
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

    def _fast_write(self, w: ConsumerWrite) -> bool:
        """The common allocation write in one or two round trips; False: use the general
        path.

        Handles one consumer that is new (generation None) or at a known generation with
        the same project, user and type, whose project/user/type ids are cached, with a
        non-empty allocation set in known classes. A new consumer on providers the cached
        graph knows is written in one round trip (:meth:`_write_new_from_cache`), anything
        else after reading the database (:meth:`_write_from_reads`). Any other case, and
        anything the general path would refuse (a missing provider or inventory, a unit
        or capacity violation, a lost compare-and-swap, a consumer that exists after all),
        rolls back and answers False: the general path then gives the exact Placement
        answer.
        """
        gen = w.generation
        if not w.allocations or not (gen is None or type(gen) is int):
            return False
        ids = self._id_cache
        project = ids.get(("projects", w.project_id))
        user = ids.get(("users", w.user_id))
        ctype = None
        if w.consumer_type is not None:
            ctype = ids.get(("consumer_types", w.consumer_type))
            if ctype is None:
                return False
        if project is None or user is None:
            return False
        try:
            raw = self._take_raw()
        except sa.exc.DBAPIError:
            return False
        ok = False
        try:
            done = self._fast_write_on(raw, w, gen, project, user, ctype)
            ok = True
            return done
        finally:
            self._give_raw(raw, ok)

    def _fast_write_on(
        self,
        raw: RawConnection,
        w: ConsumerWrite,
        gen: int | None,
        project: int,
        user: int,
        ctype: int | None,
    ) -> bool:
        rcs = self._write_rcs
        if rcs is None:
            try:
                names_seq_rows, class_rows = self._run(
                    raw, [(_RAW_NAMES_SEQ, ()), (_RAW_CLASS_NAMES, ())]
                )
            except sa.exc.DBAPIError:
                return False
            rcs = (int(names_seq_rows[0][0]), {r[1]: int(r[0]) for r in class_rows})
            self._write_rcs = rcs
        names_seq, by_name = rcs
        # Requested amounts per (provider uuid, class id), in first-seen order (the
        # order the rows are inserted in, as the general path does).
        requested: dict[tuple[str, int], int] = {}
        for rp_uuid, rc, used in w.allocations:
            rc_id = by_name.get(rc)
            if rc_id is None or type(used) is not int:
                return False
            key = (rp_uuid, rc_id)
            requested[key] = requested.get(key, 0) + used
        now = utcnow()
        stamp: Any = now.strftime(_SQLITE_STAMP) if self.is_sqlite else now
        if gen is None:
            plan = self._cached_plan(w, requested, names_seq, by_name)
            if plan is not None:
                done = self._write_new_from_cache(
                    raw, w, project, user, ctype, stamp, names_seq, *plan
                )
                if done is not None:
                    return done
                if not raw.reset():
                    return False
        return self._write_from_reads(
            raw, w, gen, project, user, ctype, stamp, requested, names_seq, by_name
        )

    def _cached_plan(
        self,
        w: ConsumerWrite,
        requested: Mapping[tuple[str, int], int],
        names_seq: int,
        by_name: Mapping[str, int],
    ) -> tuple[dict[tuple[int, int], int], dict[int, int], dict[tuple[int, int], int]] | None:
        """The write of a new consumer planned from the cached providers: the ids, the
        generations to compare-and-swap and the usages the capacity check used.

        None when the cache cannot vouch for it (unknown provider or inventory, a check
        that fails on the cached numbers, another thread updating the cache).
        """
        if not self._graph_lock.acquire(blocking=False):
            return None
        try:
            if self._graph is None or self._names_seq != names_seq:
                return None
            ids, providers, rc_by_id = self._ids_by_uuid, self._providers, self._rc_by_id
            for rp_uuid, rc, used in w.allocations:
                rp_id = ids.get(rp_uuid)
                inv = None if rp_id is None else providers[rp_id].inventories.get(rc)
                if (
                    inv is None
                    or rc_by_id.get(by_name[rc]) != rc
                    or inv.step_size < 1
                    or not inv.min_unit <= used <= inv.max_unit
                    or used % inv.step_size
                ):
                    return None
            added: dict[tuple[int, int], int] = {}
            gens: dict[int, int] = {}
            usages: dict[tuple[int, int], int] = {}
            for (rp_uuid, rc_id), amount in requested.items():
                rp_id = ids[rp_uuid]
                prov = providers[rp_id]
                name = rc_by_id[rc_id]
                inv = prov.inventories[name]
                used_now = prov.usages.get(name, 0)
                # A new consumer has nothing to give back: any growth past capacity is
                # refused (the reads below, or the general path, decide that).
                if used_now + amount > (inv.total - inv.reserved) * inv.allocation_ratio:
                    return None
                added[(rp_id, rc_id)] = amount
                gens[rp_id] = prov.generation
                usages[(rp_id, rc_id)] = used_now
            return added, gens, usages
        finally:
            self._graph_lock.release()

    def _write_new_from_cache(
        self,
        raw: RawConnection,
        w: ConsumerWrite,
        project: int,
        user: int,
        ctype: int | None,
        stamp: Any,
        names_seq: int,
        added: dict[tuple[int, int], int],
        gens: dict[int, int],
        usages: dict[tuple[int, int], int],
    ) -> bool | None:
        """A new consumer's write in one round trip, trusting the cache: the provider
        compare-and-swaps prove that nothing was added to those providers and no inventory
        changed since it was read (every such write bumps the generation), so usage can
        only have dropped since; the consumer must not exist and hold no allocations.

        True when written; False for the general path; None when the cache was stale
        (a lost compare-and-swap, names changed): read the database instead.
        """
        consumer = w.consumer_uuid
        prefix: list[tuple[Any, ...]] = [
            ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
            (_RAW_NEW_CONSUMER, (consumer, project, user, ctype, stamp, stamp)),
            (_RAW_FRESH_CONSUMER, (consumer, names_seq), True),
        ]
        try:
            seq = self._finish_write(
                raw, prefix, consumer, added, {}, gens, None, sorted(gens), stamp
            )
        except _Unexpected:
            return None
        if seq is None:
            return False  # e.g. the consumer exists
        self._write_through(seq, names_seq, sorted(gens), gens, {}, added, usages)
        return True

    def _write_from_reads(
        self,
        raw: RawConnection,
        w: ConsumerWrite,
        gen: int | None,
        project: int,
        user: int,
        ctype: int | None,
        stamp: Any,
        requested: Mapping[tuple[str, int], int],
        names_seq: int,
        by_name: Mapping[str, int],
    ) -> bool:
        """The write after reading the consumer, its old allocations and the targets'
        generations, inventories and usages in one round trip; then one more."""
        uuids = sorted({k[0] for k in requested})
        rc_ids = sorted({k[1] for k in requested})
        consumer = w.consumer_uuid
        first: tuple[str, Sequence[Any]] = (
            (_RAW_NEW_CONSUMER, (consumer, project, user, ctype, stamp, stamp))
            if gen is None
            else (_RAW_CONSUMER, (consumer,))
        )
        try:
            res = self._run(
                raw,
                [
                    ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
                    first,
                    (_RAW_TAKE_ALLOCS, (consumer,)),
                    (
                        _RAW_ALLOC_TARGETS.format(_marks(len(rc_ids)), _marks(len(uuids))),
                        (*rc_ids, *uuids),
                    ),
                ],
            )
        except sa.exc.DBAPIError:
            return False  # e.g. the consumer exists after all: rolled back on give-back
        _begin, consumer_rows, old_rows, target_rows = res
        if gen is None:
            cid = consumer_rows[0][0]
        else:
            row = consumer_rows[0] if consumer_rows else None
            if (
                row is None
                or row[1] != gen
                or row[2] != project
                or row[3] != user
                or (ctype is not None and row[4] != ctype)
            ):
                return False
            cid = row[0]
        if not target_rows or target_rows[0][11] != names_seq:
            if target_rows:
                self._write_rcs = None  # a class was created, deleted or renamed
            return False
        rp_ids: dict[str, int] = {}
        gens: dict[int, int] = {}
        invs: dict[tuple[int, int], tuple[Any, ...]] = {}
        for rp_id, rp_uuid, rp_gen, rc_id, *inv in target_rows:
            rp_ids[rp_uuid] = rp_id
            gens[rp_id] = rp_gen
            if rc_id is not None:
                invs[(rp_id, rc_id)] = tuple(inv)
        if len(rp_ids) != len(uuids):
            return False  # a provider does not exist
        mine: dict[tuple[int, int], int] = {}
        for rp_id, rc_id, used in old_rows:
            mine[(rp_id, rc_id)] = mine.get((rp_id, rc_id), 0) + used
        for rp_uuid, rc, used in w.allocations:
            found = invs.get((rp_ids[rp_uuid], by_name[rc]))
            if found is None:
                return False
            _total, _reserved, min_unit, max_unit, step, _ratio, _used, _seq = found
            if step < 1 or used < min_unit or used > max_unit or used % step != 0:
                return False
        added: dict[tuple[int, int], int] = {}
        others: dict[tuple[int, int], int] = {}
        for (rp_uuid, rc_id), amount in requested.items():
            target = (rp_ids[rp_uuid], rc_id)
            total, reserved, _min, _max, _step, ratio, used_now, _seq = invs[target]
            other = int(used_now or 0)  # this consumer's old rows are already deleted
            new_total = other + amount
            if (
                new_total > (total - reserved) * ratio
                and new_total > other + mine.get(target, 0)
            ):
                return False  # would exceed the capacity
            added[target] = amount
            others[target] = other
        touched = sorted(set(gens) | {k[0] for k in mine})
        consumer_cas = None if gen is None else (cid, gen)
        try:
            seq = self._finish_write(
                raw, [], consumer, added, mine, gens, consumer_cas, touched, stamp
            )
        except _Unexpected:
            return False  # another writer won a compare-and-swap
        if seq is None:
            return False
        self._write_through(seq, names_seq, touched, gens, mine, added, others)
        return True

    def _finish_write(
        self,
        raw: RawConnection,
        prefix: list[tuple[Any, ...]],
        consumer: str,
        added: Mapping[tuple[int, int], int],
        mine: Mapping[tuple[int, int], int],
        gens: Mapping[int, int],
        consumer_cas: tuple[int, int] | None,
        touched: Sequence[int],
        stamp: Any,
    ) -> int | None:
        """Insert the rows, compare-and-swap the providers (in id order) and the consumer,
        bump the change counter, log the touched providers with their new generations and
        usage deltas (``added`` less the consumer's old rows ``mine``) and commit, in one
        round trip after ``prefix``. Returns the change number; None when it failed (a
        database error: the general path answers).

        Raises _Unexpected when a compare-and-swap or an assertion of ``prefix`` failed
        (nothing is committed then: the database aborts the transaction).
        """
        stmts: list[tuple[Any, ...]] = list(prefix)
        stmts.append(
            (
                _RAW_INSERT_ALLOCS + _marks(len(added), "(?, ?, ?, ?, ?, NULL)"),
                [
                    v
                    for (rp_id, rc_id), used in added.items()
                    for v in (rp_id, consumer, rc_id, used, stamp)
                ],
            )
        )
        stmts += [(_RAW_CAS_RP, (g + 1, stamp, rp_id, g), True) for rp_id, g in sorted(gens.items())]
        if consumer_cas is not None:
            cid, cgen = consumer_cas
            stmts.append((_RAW_CAS_CONSUMER, (cgen + 1, stamp, cid, cgen), True))
        deltas: dict[int, dict[int, int]] = {rp_id: {} for rp_id in touched}
        for (rp_id, rc_id), used in mine.items():
            deltas[rp_id][rc_id] = -used
        for (rp_id, rc_id), used in added.items():
            deltas[rp_id][rc_id] = deltas[rp_id].get(rc_id, 0) + used
        log: list[Any] = []
        for rp_id in touched:
            gen = gens.get(rp_id)
            log += (rp_id, None if gen is None else gen + 1, encode_usage_delta(deltas[rp_id]))
        values = _marks(len(touched), "(?, ?, ?)")
        if self.is_sqlite:
            stmts += [(_RAW_BUMP_SEQ, ()), (_RAW_LOG_CHANGES.format(values), log)]
        else:  # the bump and the log in one statement
            stmts.append((_PG_BUMP_AND_LOG_CHANGES.format(values), log))
        stmts.append(("COMMIT", ()))
        try:
            res = self._run(raw, stmts)
        except sa.exc.DBAPIError:
            # Aborted (the general path then answers exactly), or the connection failed
            # and whether it committed is unknown: the general path is safe then too, as
            # a committed write left its consumer at a generation this one does not send.
            return None
        seq = int(res[-3 if self.is_sqlite else -2][0][0])
        if seq % 500 == 0:
            with contextlib.suppress(sa.exc.DBAPIError):
                self._run(raw, [(_RAW_PRUNE, (seq - CHANGE_LOG_KEEP,))])
        return seq

    def _write_through(
        self,
        seq: int,
        names_seq: int,
        touched: Sequence[int],
        gens: Mapping[int, int],
        mine: Mapping[tuple[int, int], int],
        added: Mapping[tuple[int, int], int],
        others: Mapping[tuple[int, int], int],
    ) -> None:
        """Patch the cached providers with a just committed allocation write.

        Only when the write's change number directly follows the cache's (nobody else
        committed a change in between) and the cache agrees with what the write read;
        otherwise the next provider_graph() reloads the touched providers from the log.
        """
        if not self._graph_lock.acquire(blocking=False):
            return  # a reload is running; it or the next one reads the change log
        try:
            if self._graph is None or seq != self._seq + 1 or names_seq != self._names_seq:
                return
            providers, rc_by_id = self._providers, self._rc_by_id
            new_usages: dict[int, dict[str, int]] = {}
            for key in {*mine, *added}:
                rp_id, rc_id = key
                cur = providers.get(rp_id)
                name = rc_by_id.get(rc_id)
                if cur is None or name is None:
                    return
                usages = new_usages.get(rp_id)
                if usages is None:
                    usages = new_usages[rp_id] = dict(cur.usages)
                before = cur.usages.get(name, 0)
                removed = mine.get(key, 0)
                if key in others and before != others[key] + removed:
                    return  # the cache disagrees with the database: reload instead
                after = before - removed + added.get(key, 0)
                if after > 0:
                    usages[name] = after
                else:
                    usages.pop(name, None)
            patched = {}
            for rp_id in touched:
                cur = providers.get(rp_id)
                if cur is None:
                    return
                generation = cur.generation
                if rp_id in gens:
                    if gens[rp_id] != generation:
                        return
                    generation += 1
                patched[rp_id] = type(cur)(
                    cur.uuid,
                    cur.name,
                    generation,
                    cur.parent_uuid,
                    cur.root_uuid,
                    cur.inventories,
                    new_usages.get(rp_id, cur.usages),
                    cur.traits,
                    cur.aggregates,
                )
            providers.update(patched)
            self._dirty.update(patched)
            self._seq = seq
        finally:
            self._graph_lock.release()

    def delete_consumer_allocations(self, consumer_uuid: str) -> None:
        """Delete all allocations of a consumer and the consumer itself."""
        with self._write() as conn:
            # No provider generation changes (Placement's rule): the log carries the
            # usage given back, taken from the rows the DELETE itself removed (a SELECT
            # first could disagree with a writer that commits in between).
            removed = conn.execute(
                sa.delete(allocations)
                .where(allocations.c.consumer_id == consumer_uuid)
                .returning(
                    allocations.c.resource_provider_id,
                    allocations.c.resource_class_id,
                    allocations.c.used,
                )
            ).all()
            if not removed:
                raise errors.NotFound(f"No allocations for consumer '{consumer_uuid}'")
            for rp_id, rc_id, used in removed:
                self._touch_usage(conn, rp_id, rc_id, -used)
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

        One cheap query reads the DB counters and, in the same snapshot, the change log
        since the cached state. Allocation writes log their usage deltas and new
        generations, so when every change since then is one (other schedulers' claims)
        the cache is patched from the log alone (:meth:`_apply_log`). Otherwise only the
        providers the log names are reloaded (a resource class rename, or a cache too far
        behind, forces a full reload) and the graph is patched for them; trait and class
        names are re-read only when the names counter moved. This store's own allocation
        writes patch the cache as they commit (when nobody else wrote in between), so after
        them the query is all it costs.
        """
        with self._graph_lock:
            for attempt in range(2):
                raw = self._take_raw(fresh=attempt > 0)
                ok = False
                try:
                    graph = self._refresh_graph(raw)
                    ok = True
                    return graph
                except (sa.exc.OperationalError, sa.exc.InterfaceError):
                    # A kept connection the server dropped: once more on a new one.
                    if attempt:
                        raise
                finally:
                    self._give_raw(raw, ok)
        raise AssertionError("unreachable")

    def _refresh_graph(self, raw: RawConnection) -> Any:
        if self._graph is None:
            self._load_all(raw)
            return self._current_graph()
        old = self._seq
        rows = self._run(raw, [(_RAW_STATE_AND_LOG, (old, old + INCREMENTAL_LIMIT))])[0]
        seq, full_seq, names_seq = rows[0][:3]
        if seq == old and names_seq == self._names_seq:
            return self._current_graph()
        if full_seq <= old <= seq and seq - old <= INCREMENTAL_LIMIT:
            if names_seq == self._names_seq and self._apply_log(rows, seq):
                return self._current_graph()
            if self._load_changes(raw):
                return self._current_graph()
        self._load_all(raw)
        return self._current_graph()

    def _apply_log(self, rows: Sequence[Any], seq: int) -> bool:
        """Bring the cached providers to change ``seq`` from the change log rows read with
        it (:data:`_RAW_STATE_AND_LOG`), when every change since the cached state was an
        allocation write that logged its usage deltas: no provider is re-read. False
        (nothing changed) when a change needs a provider reloaded, or the log does not fit
        the cache; :meth:`_load_changes` then reads those providers.
        """
        providers, rc_by_id = self._providers, self._rc_by_id
        sums: dict[int, dict[int, int]] = {}
        latest: dict[int, tuple[int, int]] = {}  # provider -> (change, generation)
        # The rows come in no particular order: sum the deltas, and keep the generation
        # of each provider's latest change.
        for _seq, _full, _names, change, rp_id, generation, delta in rows:
            if change is None:
                continue
            if delta is None or rp_id not in providers:
                return False
            per = sums.setdefault(rp_id, {})
            for rc_id, amount in decode_usage_delta(delta).items():
                per[rc_id] = per.get(rc_id, 0) + amount
            if generation is not None and (rp_id not in latest or change > latest[rp_id][0]):
                latest[rp_id] = (change, int(generation))
        patched = {}
        for rp_id, per in sums.items():
            cur = providers[rp_id]
            usages = dict(cur.usages)
            for rc_id, amount in per.items():
                name = rc_by_id.get(rc_id)
                if name is None:
                    return False
                after = usages.get(name, 0) + amount
                if after < 0:
                    return False  # the cache disagrees with the log: reload instead
                if after:
                    usages[name] = after
                else:
                    usages.pop(name, None)
            patched[rp_id] = type(cur)(
                cur.uuid,
                cur.name,
                latest[rp_id][1] if rp_id in latest else cur.generation,
                cur.parent_uuid,
                cur.root_uuid,
                cur.inventories,
                usages,
                cur.traits,
                cur.aggregates,
            )
        providers.update(patched)
        self._dirty.update(patched)
        self._seq = seq
        return True

    def _current_graph(self) -> Any:
        """The graph of the cached providers, patched or rebuilt for what changed."""
        from berth.placement import candidates

        if self._structural or self._graph is None:
            providers = self._providers
            ids = sorted(providers)
            self._graph = candidates.ProviderGraph(
                [providers[i] for i in ids], self._trait_names, self._class_names, ids
            )
        elif self._dirty:
            # The common case while scheduling: usages of a few providers changed. The
            # engine patches its columns for those instead of rebuilding every index.
            self._graph = self._graph.with_updates(list(self._dirty.values()))
        self._structural = False
        self._dirty.clear()
        self._graph_seq = self._seq
        return self._graph

    def _begin_snapshot(self) -> tuple[str, tuple[()]]:
        if self.is_sqlite:
            return ("BEGIN", ())  # WAL: the first read fixes the snapshot
        return ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", ())

    def _load_changes(self, raw: RawConnection) -> bool:
        """Reload the providers changed since the cached state, in one snapshot: its
        counters and the change log, then those providers (and the names if they
        changed): two round trips on PostgreSQL. False when a full reload is needed."""
        old = self._seq
        _begin, ((seq, full_seq, names_seq),), changed_rows = self._run(
            raw, [self._begin_snapshot(), (_RAW_STATE, ()), (_RAW_CHANGED_IDS, (old,))]
        )
        changed = sorted(int(r[0]) for r in changed_rows)
        if (
            full_seq > old
            or seq < old
            or seq - old > INCREMENTAL_LIMIT
            or len(changed) > _CHANGED_LIMIT
        ):
            self._run(raw, [("ROLLBACK", ())])
            return False
        names = names_seq != self._names_seq
        stmts: list[tuple[str, Sequence[Any]]] = []
        if changed:
            stmts += [
                self._by_ids(_RAW_PROVIDERS, "rp.id", changed),
                self._by_ids(_RAW_INVENTORIES, "resource_provider_id", changed),
                self._by_ids(_RAW_USAGES, "resource_provider_id", changed),
                self._by_ids(_RAW_TRAITS, "rpt.resource_provider_id", changed),
                self._by_ids(_RAW_AGGREGATES, "rpa.resource_provider_id", changed),
            ]
        if names:
            stmts += [(_RAW_TRAIT_NAMES, ()), (_RAW_CLASS_NAMES, ())]
        stmts.append(("COMMIT", ()))
        res = self._run(raw, stmts)
        if not changed:
            res = [[], [], [], [], [], *res]
        rc_by_id = dict(res[6]) if names else self._rc_by_id
        try:
            fresh = self._decode(rc_by_id, *res[:5])
        except KeyError:
            return False  # a class id the cached names do not know
        # Nothing below raises: the cache changes all at once.
        providers, dirty = self._providers, self._dirty
        for rp_id in changed:
            new = fresh.get(rp_id)
            cur = providers.get(rp_id)
            if new is None:
                if cur is not None:
                    del providers[rp_id]
                    if self._ids_by_uuid.get(cur.uuid) == rp_id:
                        del self._ids_by_uuid[cur.uuid]
                    dirty.pop(rp_id, None)
                    self._structural = True
            elif cur is None:
                providers[rp_id] = new
                self._ids_by_uuid[new.uuid] = rp_id
                self._structural = True
            elif new != cur:
                providers[rp_id] = new
                dirty[rp_id] = new
        if names:
            self._set_names([r[0] for r in res[5]], res[6], names_seq)
        self._seq = seq
        return True

    def _by_ids(self, sql: str, column: str, ids: Sequence[int]) -> tuple[str, Sequence[Any]]:
        """``sql`` (``{}`` marks where a WHERE goes, else at the end) for rows of ``ids``."""
        params: list[Any]
        if self.is_sqlite:
            where, params = f" WHERE {column} IN ({_marks(len(ids))})", list(ids)
        else:
            where, params = f" WHERE {column} = ANY(?)", [list(ids)]
        return (sql.format(where) if "{}" in sql else sql + where), params

    def _load_all(self, raw: RawConnection) -> None:
        """Load every provider and name in one snapshot."""
        res = self._run(
            raw,
            [
                self._begin_snapshot(),
                (_RAW_STATE, ()),
                (_RAW_PROVIDERS, ()),
                (_RAW_INVENTORIES, ()),
                (_RAW_USAGES.format(""), ()),
                (_RAW_TRAITS, ()),
                (_RAW_AGGREGATES, ()),
                (_RAW_TRAIT_NAMES, ()),
                (_RAW_CLASS_NAMES, ()),
                ("COMMIT", ()),
            ],
        )
        ((seq, _full_seq, names_seq),) = res[1]
        providers = self._decode(dict(res[8]), *res[2:7])
        self._providers = providers
        self._ids_by_uuid = {p.uuid: rp_id for rp_id, p in providers.items()}
        self._dirty = {}
        self._structural = True
        self._set_names([r[0] for r in res[7]], res[8], names_seq)
        self._seq = seq

    def _set_names(
        self, trait_names: list[str], class_rows: Sequence[Any], names_seq: int
    ) -> None:
        if trait_names != self._trait_names or [r[1] for r in class_rows] != self._class_names:
            self._structural = True
        self._trait_names = trait_names
        self._class_names = [r[1] for r in class_rows]
        self._rc_by_id = {int(r[0]): r[1] for r in class_rows}
        self._names_seq = names_seq
        self._write_rcs = (names_seq, {r[1]: int(r[0]) for r in class_rows})

    @staticmethod
    def _decode(
        rc_by_id: Mapping[int, str],
        prov_rows: Sequence[Any],
        inv_rows: Sequence[Any],
        use_rows: Sequence[Any],
        trait_rows: Sequence[Any],
        agg_rows: Sequence[Any],
    ) -> dict[int, Any]:
        """Engine Provider objects by id from the rows of the ``_RAW_*`` graph queries."""
        from berth.placement import candidates

        invs: dict[int, dict[str, Any]] = defaultdict(dict)
        inventory_cls = candidates.Inventory
        for rp_id, rc_id, total, reserved, min_u, max_u, step, ratio in inv_rows:
            name = rc_by_id[rc_id]
            invs[rp_id][name] = inventory_cls(
                name, total, reserved, min_u, max_u, step, float(ratio)
            )
        usages: dict[int, dict[str, int]] = defaultdict(dict)
        for rp_id, rc_id, used in use_rows:
            usages[rp_id][rc_by_id[rc_id]] = int(used)
        rp_traits: dict[int, set[str]] = defaultdict(set)
        for rp_id, name in trait_rows:
            rp_traits[rp_id].add(name)
        rp_aggs: dict[int, set[str]] = defaultdict(set)
        for rp_id, agg in agg_rows:
            rp_aggs[rp_id].add(agg)
        empty: frozenset[str] = frozenset()
        provider_cls = candidates.Provider
        out = {}
        for rp_id, uuid, name, generation, parent_uuid, root_uuid in prov_rows:
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

    # ------------------------------------------------------------------ hot path plumbing

    def _run(self, raw: RawConnection, stmts: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        self.raw_statements += len(stmts)
        return raw.run(stmts)

    def _take_raw(self, *, fresh: bool = False) -> RawConnection:
        """A kept raw connection, or a new one (none is shared between two callers)."""
        pool = self.engine.pool
        while not fresh:
            try:
                raw = self._spare.pop()
            except IndexError:
                break
            if raw.pool is pool and raw.pid == os.getpid():
                return raw
            raw.close()  # the engine was disposed, or we are in a forked child
        return RawConnection(self.engine)

    def _give_raw(self, raw: RawConnection, ok: bool) -> None:
        """Keep ``raw`` for the next call if it is usable (an open transaction, after an
        error or an abandoned fast path, is rolled back first)."""
        if raw.reset() and len(self._spare) < _KEEP_RAW and raw.pool is self.engine.pool:
            self._spare.append(raw)
        else:
            raw.close()

    def close(self) -> None:
        """Close the connections this store keeps for its hot paths (the engine's pool
        belongs to the caller)."""
        _close_all(self._spare)


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


# ---------------------------------------------------------------------- hot path: raw SQL
#
# provider_graph() and the common write_allocations() run on DBAPI connections the store
# keeps (``RawConnection``), with ``?`` placeholders (rewritten for psycopg). On PostgreSQL the
# connection is in autocommit mode with explicit BEGIN/COMMIT, and the statements of one
# ``run`` go out as a psycopg pipeline: one network round trip however many there are.

#: Raw connections kept per store between calls: as many as an API process has threads
#: (16 for ``berth api``), which may all be writing at once; a PostgreSQL connection
#: costs milliseconds to open. A store keeps only as many as it needed at once: a
#: scheduler, one request at a time, keeps one or two.
_KEEP_RAW = 16
#: More changed providers than this are read with a full reload.
_CHANGED_LIMIT = 5000
_RAW_STATE = "SELECT change_seq, full_seq, names_seq FROM berth_state WHERE id = 1"
_RAW_NAMES_SEQ = "SELECT names_seq FROM berth_state WHERE id = 1"
_RAW_CHANGED_IDS = "SELECT DISTINCT provider_id FROM berth_provider_changes WHERE seq > ?"
_RAW_PROVIDERS = (
    "SELECT rp.id, rp.uuid, rp.name, rp.generation, par.uuid, root.uuid "
    "FROM resource_providers rp "
    "LEFT JOIN resource_providers par ON par.id = rp.parent_provider_id "
    "LEFT JOIN resource_providers root ON root.id = rp.root_provider_id"
)
_RAW_INVENTORIES = (
    "SELECT resource_provider_id, resource_class_id, total, reserved, min_unit, max_unit, "
    "step_size, allocation_ratio FROM inventories"
)
_RAW_USAGES = (
    "SELECT resource_provider_id, resource_class_id, SUM(used) FROM allocations{} "
    "GROUP BY resource_provider_id, resource_class_id"
)
_RAW_TRAITS = (
    "SELECT rpt.resource_provider_id, t.name FROM resource_provider_traits rpt "
    "JOIN traits t ON t.id = rpt.trait_id"
)
_RAW_AGGREGATES = (
    "SELECT rpa.resource_provider_id, pa.uuid FROM resource_provider_aggregates rpa "
    "JOIN placement_aggregates pa ON pa.id = rpa.aggregate_id"
)
_RAW_TRAIT_NAMES = "SELECT name FROM traits ORDER BY id"
_RAW_CLASS_NAMES = "SELECT id, name FROM resource_classes ORDER BY id"

_RAW_NEW_CONSUMER = (
    "INSERT INTO consumers "
    "(uuid, project_id, user_id, generation, consumer_type_id, created_at, updated_at) "
    "VALUES (?, ?, ?, 1, ?, ?, ?) RETURNING id"
)
_RAW_CONSUMER = (
    "SELECT id, generation, project_id, user_id, consumer_type_id FROM consumers WHERE uuid = ?"
)
_RAW_TAKE_ALLOCS = (
    "DELETE FROM allocations WHERE consumer_id = ? "
    "RETURNING resource_provider_id, resource_class_id, used"
)
#: Per requested provider and inventoried requested class: the provider's id and
#: generation, the inventory, the class's current usage, and the names counter.
_RAW_ALLOC_TARGETS = (
    "SELECT rp.id, rp.uuid, rp.generation, i.resource_class_id, i.total, i.reserved, "
    "i.min_unit, i.max_unit, i.step_size, i.allocation_ratio, "
    "(SELECT SUM(a.used) FROM allocations a WHERE a.resource_provider_id = rp.id "
    "AND a.resource_class_id = i.resource_class_id), "
    "(SELECT names_seq FROM berth_state WHERE id = 1) "
    "FROM resource_providers rp LEFT JOIN inventories i "
    "ON i.resource_provider_id = rp.id AND i.resource_class_id IN ({}) "
    "WHERE rp.uuid IN ({})"
)
_RAW_INSERT_ALLOCS = (
    "INSERT INTO allocations "
    "(resource_provider_id, consumer_id, resource_class_id, used, created_at, updated_at) "
    "VALUES "
)
_RAW_CAS_RP = "UPDATE resource_providers SET generation = ?, updated_at = ? WHERE id = ? AND generation = ?"
_RAW_CAS_CONSUMER = "UPDATE consumers SET generation = ?, updated_at = ? WHERE id = ? AND generation = ?"
#: The log rows of an allocation write: per touched provider, its generation after the
#: write (NULL: unchanged) and its usage deltas (see :func:`encode_usage_delta`).
_RAW_LOG_CHANGES = (
    "INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta) "
    "SELECT b.change_seq, v.column1, CAST(v.column2 AS BIGINT), CAST(v.column3 AS TEXT) "
    "FROM berth_state b, (VALUES {}) AS v WHERE b.id = 1"
)
#: PostgreSQL: the counter's bump and the log rows of :data:`_RAW_LOG_CHANGES` in one
#: statement (a data-modifying WITH), returning the change number.
_PG_BUMP_AND_LOG_CHANGES = (
    "WITH b AS (UPDATE berth_state SET change_seq = change_seq + 1 WHERE id = 1 "
    "RETURNING change_seq) "
    "INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta) "
    "SELECT b.change_seq, v.column1, CAST(v.column2 AS BIGINT), CAST(v.column3 AS TEXT) "
    "FROM b, (VALUES {}) AS v RETURNING seq"
)
#: The counters and, in the same snapshot, the change log after the cached state (at
#: most ``INCREMENTAL_LIMIT`` changes: a cache further behind is rebuilt anyway). With no
#: change, one row of counters and NULLs.
_RAW_STATE_AND_LOG = (
    "SELECT b.change_seq, b.full_seq, b.names_seq, c.seq, c.provider_id, c.generation, "
    "c.usage_delta FROM berth_state b LEFT JOIN berth_provider_changes c "
    "ON c.seq > ? AND c.seq <= ? WHERE b.id = 1"
)
#: 1 when the consumer holds no allocations and the names are still those of ``?``.
_RAW_FRESH_CONSUMER = (
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM allocations WHERE consumer_id = ?) THEN 0 "
    "WHEN (SELECT names_seq FROM berth_state WHERE id = 1) = ? THEN 1 ELSE 0 END"
)
_RAW_PRUNE = "DELETE FROM berth_provider_changes WHERE seq < ?"
_SQLITE_STAMP = "%Y-%m-%d %H:%M:%S.%f"  # SQLAlchemy's DateTime storage format on SQLite


def encode_usage_delta(deltas: Mapping[int, int]) -> str:
    """A provider's usage change per resource class id as log text: ``"0:1,1:512"``
    (``""``: none; the write changed only the generation)."""
    return ",".join(f"{rc_id}:{amount}" for rc_id, amount in sorted(deltas.items()))


def decode_usage_delta(text: str) -> dict[int, int]:
    """The inverse of :func:`encode_usage_delta`."""
    out: dict[int, int] = {}
    if text:
        for part in text.split(","):
            rc_id, _, amount = part.partition(":")
            out[int(rc_id)] = int(amount)
    return out


def _marks(n: int, mark: str = "?") -> str:
    return ", ".join([mark] * n)


_PG_SQL: dict[str, str] = {}


class _Unexpected(Exception):
    """A statement run with ``expect`` did not change exactly one row / return 1."""


def _pg_expect(sql: str) -> str:
    """``sql`` as a statement that fails with a division by zero unless it updates one
    row (DML) or returns 1 (SELECT)."""
    if sql.startswith("SELECT"):
        return f"SELECT 1 / ({sql})"
    return f"WITH expect AS ({sql} RETURNING 1) SELECT 1 / COUNT(*) FROM expect"


def _pg_sql(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (memoized; hot SQL holds no ``%``)."""
    out = _PG_SQL.get(sql)
    if out is None:
        out = sql.replace("?", "%s")
        if len(_PG_SQL) < 4096:
            _PG_SQL[sql] = out
    return out


class RawConnection:
    """One DBAPI connection a store keeps for its hot paths, detached from the pool.

    PostgreSQL: autocommit mode, so a lone read is one round trip and a transaction is
    explicit ``BEGIN`` ... ``COMMIT``; several statements go out as one pipeline.
    SQLite: the engine's connections already leave transactions to us.
    """

    __slots__ = ("dbapi", "error", "fairy", "pg", "pid", "pool", "stale_prepared")

    def __init__(self, engine: Engine) -> None:
        fairy = engine.raw_connection()
        try:
            fairy.detach()
            dbapi = fairy.dbapi_connection
            self.pg = engine.dialect.name != "sqlite"
            if self.pg:
                dbapi.rollback()  # type: ignore[union-attr]
                dbapi.autocommit = True  # type: ignore[union-attr]
        except BaseException:
            fairy.close()
            raise
        self.fairy, self.dbapi, self.pool = fairy, dbapi, engine.pool
        self.error = engine.dialect.loaded_dbapi.Error
        self.pid = os.getpid()
        self.stale_prepared = False

    def run(self, stmts: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Execute ``(sql, params[, expect])`` in order; per statement its rows, or its
        rowcount when it returns none. DBAPI errors are raised as SQLAlchemy's wrappers
        (IntegrityError, ...).

        A statement with ``expect`` true must update exactly one row, or (a SELECT) return
        1; otherwise :class:`_Unexpected` is raised and nothing after it takes effect: on
        PostgreSQL the check runs in the database (a division by zero aborts the
        transaction, so a pipelined COMMIT rolls back), on SQLite before the next statement.
        """
        dbapi: Any = self.dbapi
        sql: str = ""
        params: Sequence[Any] = ()
        try:
            if not self.pg:
                cur = dbapi.cursor()
                out = []
                for stmt in stmts:
                    sql, params = stmt[0], stmt[1]
                    cur.execute(sql, params)
                    got = cur.fetchall() if cur.description is not None else cur.rowcount
                    if len(stmt) > 2 and stmt[2] and got != 1 and got != [(1,)]:
                        cur.close()
                        raise _Unexpected(sql)
                    out.append(got)
                cur.close()
                return out
            cursors = []
            if len(stmts) == 1:
                sql, params = stmts[0][0], stmts[0][1]
                cur = dbapi.cursor()
                cur.execute(_pg_sql(_pg_expect(sql) if len(stmts[0]) > 2 and stmts[0][2] else sql),
                            params or None)
                cursors.append(cur)
            else:
                failed: Exception | None = None
                try:
                    with dbapi.pipeline():
                        for stmt in stmts:
                            sql, params = stmt[0], stmt[1]
                            cur = dbapi.cursor()
                            try:
                                cur.execute(
                                    _pg_sql(_pg_expect(sql) if len(stmt) > 2 and stmt[2] else sql),
                                    params or None,
                                )
                            except self.error as exc:
                                # Leave the pipeline normally (psycopg logs a warning when
                                # an exception passes its exit); the first error counts.
                                failed = exc
                                break
                            cursors.append(cur)
                except self.error as exc:
                    failed = failed or exc
                if failed is not None:
                    raise failed
            return [c.fetchall() if c.description is not None else c.rowcount for c in cursors]
        except self.error as exc:
            if self.pg:
                # psycopg marks a statement it prepares inside a pipeline as prepared before
                # the server answers; when the pipeline aborts first, that is not so.
                self.stale_prepared = True
                if getattr(exc, "sqlstate", None) == "22012":
                    raise _Unexpected(sql) from exc
            raise sa.exc.DBAPIError.instance(sql, params, exc, self.error) from exc

    def reset(self) -> bool:
        """Roll back whatever is open; False when the connection is unusable."""
        dbapi: Any = self.dbapi
        try:
            if self.pg:
                if dbapi.broken or dbapi.closed:
                    return False
                if dbapi.info.transaction_status != 0:  # not IDLE
                    dbapi.execute("ROLLBACK")
                if self.stale_prepared:
                    # Forget every prepared statement (psycopg then sends DEALLOCATE ALL
                    # before the next statement) rather than trust its bookkeeping.
                    dbapi._prepared.clear()
                    self.stale_prepared = False
            elif dbapi.in_transaction:
                dbapi.execute("ROLLBACK")
            return True
        except Exception:  # noqa: BLE001 - any failure here means "do not reuse"
            return False

    def close(self) -> None:
        """Close the DBAPI connection (never one inherited across a fork: that would cut
        the parent's session)."""
        if self.pid == os.getpid():
            with contextlib.suppress(Exception):
                self.fairy.close()
        else:
            _INHERITED.append(self)


#: Connections inherited from a parent process: kept referenced, never used or closed.
_INHERITED: list[RawConnection] = []


def _close_all(conns: list[RawConnection]) -> None:
    while conns:
        conns.pop().close()
