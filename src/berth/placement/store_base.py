"""The Placement store's plumbing: transactions, the change log they write, the
prebuilt statements, the provider row helpers and the hot path's raw connections.

:class:`StoreBase` holds the state every section of
:class:`~berth.placement.store.PlacementStore` shares; the sections are mixins on it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from berth.placement import errors
from berth.placement.db import (
    allocations,
    consumers,
    inventories,
    resource_classes,
    resource_providers,
    utcnow,
)
from berth.placement.store_raw import (
    _PG_LOG_CHANGE,
    _PG_NEXT_CHANGE,
    _PG_PRUNE,
    _RAW_BUMP_SEQ,
    _RAW_LOG_CHANGE,
    _RAW_PRUNE,
    PG_XID,
    RawConnection,
    encode_usage_delta,
    raw_pool,
)
from berth.placement.store_records import ProviderRecord

# Prebuilt statements for the hottest paths: building Core constructs per call costs more
# than executing them on SQLite, and text() statements have trivial cache keys.
_READ_SEQ = sa.text("SELECT change_seq FROM berth_state WHERE id = 1")
_PG_READ_SEQ = sa.text(
    "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM berth_change_seq")
_MARK_FULL = sa.text("UPDATE berth_state SET full_seq = :seq WHERE id = 1")
_PG_MARK_FULL = sa.text(f"UPDATE berth_state SET full_seq = :seq, full_xid = {PG_XID} WHERE id = 1")
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


class StoreBase:
    """The store's shared state and plumbing (transactions, change log, raw connections)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._graph_lock = threading.Lock()
        # The cached graph state, guarded by _graph_lock. ``_providers`` (engine Provider
        # by provider id) is the database as of change ``_seq`` and names ``_names_seq``;
        # ``_graph`` was built from it, minus ``_dirty`` (providers patched since) or a
        # ``_structural`` change that needs a full rebuild.
        self._graph: Any = None
        # Where the cache is current to: a change number on SQLite; on PostgreSQL a
        # snapshot, and the transactions of this store's own writes patched in since
        # (their log rows are skipped). See ``change_log``.
        self._seq = -1
        self._snap = ""
        self._server = ""  # PostgreSQL: the server ``_snap`` was taken on (PG_SERVER)
        self._own_xids: set[int] = set()
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
        self._raw_pool = raw_pool(engine)
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
            touched = conn.info.pop(_TOUCHED, set())
            usage, gens = conn.info.pop(_USAGE, {}), conn.info.pop(_GENS, {})
            full = conn.info.pop(_FULL, False)
            changed = sorted((usage.keys() | gens.keys()) - touched)
            seq: int | None
            xid: int | None
            if self.is_sqlite:
                cursor = self._raw(conn, _RAW_BUMP_SEQ, ())
                seq, xid = int(cursor.fetchone()[0]), None
                cursor.close()
            elif touched or changed or full:
                # No counter row to lock: a number, and this transaction's id for readers.
                cursor = self._raw(conn, _PG_NEXT_CHANGE, ())
                seq, xid = (int(v) for v in cursor.fetchone())
                cursor.close()
            else:
                seq = xid = None  # PostgreSQL, nothing for a cached graph to follow
            if seq is not None:
                log: list[tuple[Any, ...]] = [(seq, rp_id, None, None) for rp_id in touched]
                log += [
                    (seq, rp_id, gens.get(rp_id), encode_usage_delta(usage.get(rp_id, {})))
                    for rp_id in changed
                ]
                if log and xid is None:
                    self._raw_many(conn, _RAW_LOG_CHANGE, log)
                elif log:
                    self._raw_many(conn, _PG_LOG_CHANGE, [(*row, xid) for row in log])
                if full:
                    conn.execute(_MARK_FULL if xid is None else _PG_MARK_FULL, {"seq": seq})
            if conn.info.pop(_NAMES, False):
                conn.execute(_BUMP_NAMES)
            if seq is not None and seq % 500 == 0:
                if self.is_sqlite:
                    conn.execute(_PRUNE_CHANGES, {"seq": seq - CHANGE_LOG_KEEP})
                else:
                    self._raw(conn, _PG_PRUNE, (seq - CHANGE_LOG_KEEP,)).close()

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

    def _lock_links(self, conn: Connection, table: sa.Table) -> None:
        """PostgreSQL: before a trait or class is deleted or renamed, wait for every
        write of ``table`` (provider-trait links, inventories) in flight and hold off new
        ones until this transaction ends. The registration writes resolve names to ids
        in one statement without locking the names (``provider_writes``): a statement
        that waited here takes its snapshot after this transaction, so it sees the name
        gone; the general path takes its lock on ``table`` before it looks names up
        (:meth:`_lock_for_links`); and this transaction's in-use check sees every link
        written before it. The wait is bounded (``lock_timeout``, 10 s: a writer left
        open elsewhere must not stall every registration queued behind this lock); past
        it the request is answered 503, as any lock timeout. SQLite's writers take turns
        already."""
        if not self.is_sqlite:
            conn.execute(sa.text("SET LOCAL lock_timeout = '10s'"))
            conn.execute(sa.text(f"LOCK TABLE {table.name} IN SHARE MODE"))

    def _lock_for_links(self, conn: Connection, table: sa.Table) -> None:
        """PostgreSQL: take the lock a write of ``table`` takes anyway (ROW EXCLUSIVE)
        before looking names up, so that a deletion or rename of a name holding
        :meth:`_lock_links` is waited for and its effect read by the lookups after it."""
        if not self.is_sqlite:
            conn.execute(sa.text(f"LOCK TABLE {table.name} IN ROW EXCLUSIVE MODE"))

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """A read-only transaction."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def change_seq(self) -> int:
        """The number of the latest change (one cheap query): the change counter on
        SQLite, the log's number sequence on PostgreSQL (numbers of transactions that
        rolled back are skipped)."""
        with self._read() as conn:
            return int(conn.execute(_READ_SEQ if self.is_sqlite else _PG_READ_SEQ).scalar_one())

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
        # A statement built once: building one per call (and its cache key) cost more
        # than running it (a GET of a provider, and every write's provider read).
        row = conn.execute(_PROVIDER_BY_UUID, {"b_uuid": uuid}).first()
        return None if row is None else self._record(row)

    def _require_provider(self, conn: Connection, uuid: str) -> ProviderRecord:
        prov = self._get_provider(conn, uuid)
        if prov is None:
            raise errors.NotFound(
                f"No resource provider with uuid {uuid} found", outside_handler=True
            )
        return prov

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

    def _insert_ignore(self, conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> int:
        """Insert the rows that do not exist yet; how many went in (for one row exact,
        for several as the driver counts an executemany, -1 when it does not)."""
        if not rows:
            return 0
        if self.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        else:
            from sqlalchemy.dialects.postgresql import insert as dialect_insert  # type: ignore[assignment]
        stmt = dialect_insert(table).on_conflict_do_nothing()
        if len(rows) == 1:  # the rows it returns say whether it went in
            return len(conn.execute(stmt.returning(*table.primary_key.columns), rows[0]).all())
        return int(conn.execute(stmt, rows).rowcount)

    # ------------------------------------------------------------------ hot path plumbing

    def _run(self, raw: RawConnection, stmts: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        self.raw_statements += len(stmts)
        return raw.run(stmts)

    def _prune_now_and_then(self, raw: RawConnection, seq: int | None) -> None:
        """Drop the change log's oldest rows at every 500th change (``seq``, the change a
        raw write just committed); a failure is left to the next prune."""
        if seq is not None and seq % 500 == 0:
            with contextlib.suppress(sa.exc.DBAPIError):
                self._run(raw, [(_RAW_PRUNE if self.is_sqlite else _PG_PRUNE,
                                 (seq - CHANGE_LOG_KEEP,))])

    def _take_raw(self, *, fresh: bool = False) -> RawConnection:
        """A kept raw connection, or a new one (none is shared between two callers)."""
        return self._raw_pool.take(fresh=fresh)

    def _give_raw(self, raw: RawConnection, ok: bool) -> None:
        """Keep ``raw`` for the next call if it is usable."""
        self._raw_pool.give(raw, ok)

    def close(self) -> None:
        """Close the connections this store keeps for its hot paths (the engine's pool
        belongs to the caller)."""
        self._raw_pool.close()


_PROVIDER_SELECT = StoreBase._build_provider_select()
_PROVIDER_BY_UUID = _PROVIDER_SELECT.where(resource_providers.c.uuid == sa.bindparam("b_uuid"))
