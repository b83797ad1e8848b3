"""The Placement store's raw-SQL hot path: :class:`RawConnection`, the ``_RAW_*``
statements and the usage-delta text of the change log.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

# ---------------------------------------------------------------------- hot path: raw SQL
#
# provider_graph() and the common write_allocations() run on DBAPI connections the store
# keeps (``RawConnection``), with ``?`` placeholders (rewritten for psycopg). On PostgreSQL the
# connection is in autocommit mode with explicit BEGIN/COMMIT, and the statements of one
# ``run`` go out as a psycopg pipeline: one network round trip however many there are.

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
#: PostgreSQL: the writing transaction's id, as the log's ``xid`` column holds it.
PG_XID = "CAST(CAST(pg_current_xact_id() AS text) AS bigint)"
#: PostgreSQL: a change's number and the writing transaction's id. No row is locked: a
#: reader finds the change by its transaction id (``store_graph``), not by its number.
_PG_NEXT_CHANGE = "SELECT nextval('berth_change_seq'), " + PG_XID
_PG_LOG_CHANGE = (
    "INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta, xid) "
    "VALUES (?, ?, ?, ?, ?)"
)
#: PostgreSQL: the log rows of :data:`_RAW_LOG_CHANGES` with their change number and
#: transaction id in one statement, returning both (one row per logged provider).
_PG_BUMP_AND_LOG_CHANGES = (
    "WITH b AS MATERIALIZED (SELECT nextval('berth_change_seq') AS seq, " + PG_XID + " AS xid) "
    "INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta, xid) "
    "SELECT b.seq, v.column1, CAST(v.column2 AS BIGINT), CAST(v.column3 AS TEXT), b.xid "
    "FROM b, (VALUES {}) AS v RETURNING seq, xid"
)
#: SQLite: the counters and, in the same snapshot, the change log after the cached state
#: (at most ``INCREMENTAL_LIMIT`` changes: a cache further behind is rebuilt anyway). With
#: no change, one row of counters and NULLs. PostgreSQL's is ``change_log``'s.
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
#: PostgreSQL: the same prune, which keeps the rows of transactions some snapshot may
#: still not see (at or above the oldest running transaction) and records the highest
#: transaction id it removed, so that a reader whose snapshot might not have seen those
#: rows loads the graph whole instead.
_PG_PRUNE = (
    "WITH d AS (DELETE FROM berth_provider_changes WHERE seq < ? AND (xid IS NULL OR xid < "
    "CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text) AS bigint)) RETURNING xid) "
    "UPDATE berth_state SET pruned_xid = GREATEST(pruned_xid, (SELECT max(xid) FROM d)) "
    "WHERE id = 1 AND EXISTS (SELECT 1 FROM d)"
)
#: The "statement" a connection that could not be made reports: nothing ran, so the
#: operation may be run again (:func:`~berth.placement.dbfaults.rolled_back`).
CONNECTING = "-- connecting"
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


def marks(n: int, mark: str = "?") -> str:
    """``n`` placeholders (or row templates) for a raw statement, comma-separated."""
    return ", ".join([mark] * n)


_PG_SQL: dict[str, str] = {}


class Unexpected(Exception):
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


def _lost(dbapi: Any, exc: BaseException) -> bool:
    """Whether a psycopg error left its connection unusable: psycopg says it is broken
    or closed, libpq's status is not OK, or an error in the chain is the server ending
    the session (SQLSTATE class 08, 57P01-57P03)."""
    if getattr(dbapi, "broken", False) or dbapi.closed:
        return True
    with contextlib.suppress(Exception):
        if int(dbapi.pgconn.status) != 0:  # CONNECTION_OK
            return True
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        state = str(getattr(seen, "sqlstate", "") or "")
        if state.startswith("08") or state in ("57P01", "57P02", "57P03"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RawConnection:
    """One DBAPI connection a store keeps for its hot paths, detached from the pool.

    PostgreSQL: autocommit mode, so a lone read is one round trip and a transaction is
    explicit ``BEGIN`` ... ``COMMIT``; several statements go out as one pipeline.
    SQLite: the engine's connections already leave transactions to us.
    """

    __slots__ = ("dbapi", "error", "fairy", "pg", "pid", "pool", "stale_prepared")

    def __init__(self, engine: Engine) -> None:
        error = engine.dialect.loaded_dbapi.Error
        try:
            fairy = engine.raw_connection()
        except error as exc:
            # The pool passes the driver's own error up when no connection can be made
            # (SQLAlchemy wraps it only for engine.connect()): wrapped here as a lost
            # connection, which is retried or answered 503 (nothing was run yet).
            raise sa.exc.DBAPIError.instance(CONNECTING, None, exc, error,
                                             connection_invalidated=True) from exc
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
        1; otherwise :class:`Unexpected` is raised and nothing after it takes effect: on
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
                        raise Unexpected(sql)
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
                    raise Unexpected(sql) from exc
            # A connection the server dropped can fail with a message that does not say
            # so ("cannot exit pipeline mode while busy", raised while leaving a pipeline
            # whose connection is gone): the connection's state does, and marks the error
            # as a lost connection for the retry and 503 logic.
            lost = self.pg and _lost(dbapi, exc)
            raise sa.exc.DBAPIError.instance(sql, params, exc, self.error,
                                             connection_invalidated=lost) from exc

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


class RawPool:
    """The :class:`RawConnection` objects one engine's hot paths keep between calls
    (none is shared between two callers; at most ``keep`` are kept)."""

    def __init__(self, engine: Engine, keep: int = _KEEP_RAW) -> None:
        self.engine = engine
        self.keep = keep
        self.spare: list[RawConnection] = []
        weakref.finalize(self, _close_all, self.spare)

    def take(self, *, fresh: bool = False) -> RawConnection:
        """A kept connection, or a new one."""
        pool = self.engine.pool
        while not fresh:
            try:
                raw = self.spare.pop()
            except IndexError:
                break
            if raw.pool is pool and raw.pid == os.getpid():
                return raw
            raw.close()  # the engine was disposed, or we are in a forked child
        return RawConnection(self.engine)

    def give(self, raw: RawConnection, ok: bool) -> None:
        """Keep ``raw`` for the next call if it is usable (an open transaction, after an
        error or an abandoned fast path, is rolled back first). A connection found
        unusable after an error takes the kept ones with it, as SQLAlchemy's pool does
        on a disconnect: a database restart or terminated backends leave them all dead,
        and a retry must get a new one, not the next dead one."""
        usable = raw.reset()
        if usable and len(self.spare) < self.keep and raw.pool is self.engine.pool:
            self.spare.append(raw)
            return
        raw.close()
        if not usable and not ok:
            _close_all(self.spare)

    def run(self, stmts: Sequence[tuple[Any, ...]]) -> list[Any]:
        """:meth:`RawConnection.run` on a kept connection (callers retry through
        :func:`~berth.placement.dbfaults.call_with_retry`)."""
        raw = self.take()
        ok = False
        try:
            out = raw.run(stmts)
            ok = True
            return out
        finally:
            self.give(raw, ok)

    def close(self) -> None:
        """Close the kept connections."""
        _close_all(self.spare)


def raw_pool(engine: Engine) -> RawPool:
    """The :class:`RawPool` of ``engine``, one per engine for every store on it (kept on
    the engine, so it goes with it): the stores of one process share at most
    ``_KEEP_RAW`` idle connections instead of keeping as many each."""
    pool: RawPool | None = getattr(engine, "_berth_raw_pool", None)
    if pool is None:
        with _POOL_LOCK:
            pool = getattr(engine, "_berth_raw_pool", None)
            if pool is None:
                pool = RawPool(engine)
                engine._berth_raw_pool = pool  # type: ignore[attr-defined]
    return pool


_POOL_LOCK = threading.Lock()

#: Connections inherited from a parent process: kept referenced, never used or closed.
_INHERITED: list[RawConnection] = []


def _close_all(conns: list[RawConnection]) -> None:
    while conns:
        conns.pop().close()
