"""Database schema, engine set-up and start-up migration of the Placement store.

The tables mirror Placement's data model (reference section 3). Every graph-affecting
write logs the providers it changed (``berth_provider_changes``), so a reader can tell with
one cheap query whether its cached provider graph is still current and what to patch. On
SQLite, whose writers take turns, ``berth_state`` holds a change counter each write bumps
as its last statement. On PostgreSQL a counter row would make every write of every
process wait for the one before to commit; there a write numbers its log rows from a
sequence and records its transaction id, and a reader remembers the snapshot it read in
(``store_graph``).

SQLite runs in WAL mode; write transactions open with ``BEGIN IMMEDIATE`` so that two
writers never both read a generation and then both try to bump it.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
from importlib import resources
from typing import Any

import os_resource_classes
import os_traits
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from berth.placement.change_log import PG_FORGET_FOREIGN

metadata = sa.MetaData()

#: Custom resource classes get ids from here on; standard ones use 0..20.
CUSTOM_RC_MIN_ID = 10000

resource_providers = sa.Table(
    "resource_providers",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=False, unique=True),
    sa.Column("name", sa.Unicode(200), nullable=False, unique=True),
    sa.Column("generation", sa.Integer, nullable=False, default=0),
    sa.Column("root_provider_id", sa.Integer, nullable=True, index=True),
    sa.Column("parent_provider_id", sa.Integer, nullable=True, index=True),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=True),
)

resource_classes = sa.Table(
    "resource_classes",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String(255), nullable=False, unique=True),
    sa.Column("created_at", sa.DateTime, nullable=True),
    sa.Column("updated_at", sa.DateTime, nullable=True),
)

traits = sa.Table(
    "traits",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.Unicode(255), nullable=False, unique=True),
    sa.Column("created_at", sa.DateTime, nullable=True),
    sa.Column("updated_at", sa.DateTime, nullable=True),
)

inventories = sa.Table(
    "inventories",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("resource_provider_id", sa.Integer, nullable=False),
    sa.Column("resource_class_id", sa.Integer, nullable=False, index=True),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("reserved", sa.Integer, nullable=False),
    sa.Column("min_unit", sa.Integer, nullable=False),
    sa.Column("max_unit", sa.Integer, nullable=False),
    sa.Column("step_size", sa.Integer, nullable=False),
    sa.Column("allocation_ratio", sa.Float, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=True),
    sa.UniqueConstraint("resource_provider_id", "resource_class_id", name="uniq_inventories0rp0rc"),
)

placement_aggregates = sa.Table(
    "placement_aggregates",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=False, unique=True),
    sa.Column("created_at", sa.DateTime, nullable=True),
)

resource_provider_aggregates = sa.Table(
    "resource_provider_aggregates",
    metadata,
    sa.Column("resource_provider_id", sa.Integer, primary_key=True),
    sa.Column("aggregate_id", sa.Integer, primary_key=True, index=True),
)

resource_provider_traits = sa.Table(
    "resource_provider_traits",
    metadata,
    sa.Column("resource_provider_id", sa.Integer, primary_key=True),
    sa.Column("trait_id", sa.Integer, primary_key=True, index=True),
)

projects = sa.Table(
    "projects",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("external_id", sa.String(255), nullable=False, unique=True),
)

users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("external_id", sa.String(255), nullable=False, unique=True),
)

consumer_types = sa.Table(
    "consumer_types",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False, unique=True),
)

consumers = sa.Table(
    "consumers",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uuid", sa.String(36), nullable=False, unique=True),
    sa.Column("project_id", sa.Integer, nullable=False, index=True),
    sa.Column("user_id", sa.Integer, nullable=False),
    sa.Column("generation", sa.Integer, nullable=False, default=0),
    sa.Column("consumer_type_id", sa.Integer, nullable=True),
    sa.Column("created_at", sa.DateTime, nullable=True),
    sa.Column("updated_at", sa.DateTime, nullable=True),
)

allocations = sa.Table(
    "allocations",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("resource_provider_id", sa.Integer, nullable=False),
    sa.Column("consumer_id", sa.String(36), nullable=False, index=True),
    sa.Column("resource_class_id", sa.Integer, nullable=False),
    sa.Column("used", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=True),
    sa.Column("updated_at", sa.DateTime, nullable=True),
    sa.Index("allocations_rp_rc_idx", "resource_provider_id", "resource_class_id"),
)

berth_state = sa.Table(
    "berth_state",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("change_seq", sa.BigInteger, nullable=False),
    # The last change that needs a full graph rebuild (e.g. a resource class rename).
    sa.Column("full_seq", sa.BigInteger, nullable=False, server_default="0"),
    # Bumped whenever a trait or resource class name is created, deleted or renamed, so a
    # cached graph re-reads the (thousands of) names only when they may have changed.
    sa.Column("names_seq", sa.BigInteger, nullable=False, server_default="0"),
    # PostgreSQL: the transaction id of the last change that needs a full graph rebuild,
    # and the highest transaction id whose log rows were pruned (0: none).
    sa.Column("full_xid", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("pruned_xid", sa.BigInteger, nullable=False, server_default="0"),
)

#: Which providers each change (``seq``) touched; pruned to the recent past. A row with
#: ``usage_delta`` set says that change only moved the provider's usages (by the encoded
#: per-class amounts) and, when ``generation`` is set, its generation to that value: a
#: reader applies it without re-reading the provider. A row without says "reload it".
berth_provider_changes = sa.Table(
    "berth_provider_changes",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("seq", sa.BigInteger, nullable=False, index=True),
    sa.Column("provider_id", sa.Integer, nullable=False),
    sa.Column("generation", sa.BigInteger, nullable=True),
    sa.Column("usage_delta", sa.Text, nullable=True),
    # PostgreSQL: the writing transaction's id (pg_current_xact_id()); NULL on SQLite.
    sa.Column("xid", sa.BigInteger, nullable=True, index=True),
)


def utcnow() -> dt.datetime:
    """Naive UTC now, the form timestamps are stored in."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)


#: Seconds a SQLite statement waits for another connection's lock before it fails.
SQLITE_BUSY_TIMEOUT = 30


def error_line(exc: BaseException) -> str:
    """A database error in one line: the driver's first line (SQLAlchemy's own text adds
    the statement and a "Background on this error" link on lines of their own)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def shown_url(url: str) -> str:
    """``url`` as it may be printed: the password masked (unparsable text as given)."""
    try:
        return sa.engine.make_url(url if "://" in url else f"sqlite:///{url}").render_as_string(
            hide_password=True)
    except Exception:  # not a URL at all: nothing to mask
        return url


def create_db_engine(url: str, *, durable: bool = True) -> Engine:
    """Create an engine for ``url`` (a SQLAlchemy URL or a bare SQLite file path).

    SQLite: WAL journal, a 30 s busy timeout (``?timeout=SECONDS`` in the URL sets
    another) and an ``immediate`` execution option that makes the next transaction
    start with ``BEGIN IMMEDIATE``. ``durable`` false (a scratch store thrown away
    after use, as offline runs make) commits without syncing to disk
    (``synchronous=OFF``: a commit took half the time).
    """
    if "://" not in url:
        url = f"sqlite:///{url}"
    if url.startswith("sqlite"):
        if sa.engine.make_url(url).database in (None, "", ":memory:"):
            from berth.errors import ConfigError

            # Each pooled connection would open a database of its own, and it would go
            # with the process: nothing a server or another process could share.
            raise ConfigError("no database file: an in-memory SQLite database is not shared "
                              "between connections or processes; give a file (sqlite:///PATH)")
        connect_args: dict[str, Any] = {"check_same_thread": False}
        if "timeout" not in sa.engine.make_url(url).query:
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT
        engine = sa.create_engine(
            url,
            connect_args=connect_args,
            pool_size=16,
            max_overflow=16,
        )
        _configure_sqlite(engine, durable)
        return engine
    try:
        return sa.create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True,
                                connect_args=_pg_connect_args(url))
    except ModuleNotFoundError as exc:
        from berth.errors import ConfigError

        raise ConfigError(
            f"{shown_url(url)}: the database driver {exc.name!r} is not installed; for PostgreSQL "
            "install berth's postgresql extra (pip install 'berth[postgresql]') and use a "
            "postgresql+psycopg:// URL") from None


def _pg_connect_args(url: str) -> dict[str, Any]:
    """PostgreSQL sessions wait for a lock at most :data:`SQLITE_BUSY_TIMEOUT` seconds, as
    SQLite's do (``lock_timeout``; without one a request waits as long as another holds
    the lock, and every server thread with it); the wait past it is answered 503. Options
    the URL gives (``?options=...``) are kept, and a ``lock_timeout`` among them wins."""
    if not url.startswith("postgresql"):
        return {}
    given = sa.engine.make_url(url).query.get("options", "")
    given = " ".join(given) if isinstance(given, tuple) else given
    if "lock_timeout" in given:
        return {}
    return {"options": f"-c lock_timeout={SQLITE_BUSY_TIMEOUT * 1000} {given}".strip()}


def _configure_sqlite(engine: Engine, durable: bool = True) -> None:
    """Take transaction control away from pysqlite so BEGIN IMMEDIATE is possible."""
    synchronous = "NORMAL" if durable else "OFF"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if engine.url.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA foreign_keys=OFF")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Straight on the driver's connection: through ``exec_driver_sql`` the BEGIN
        # cost as much as a small statement (every transaction of a boot pays it).
        # A driver error is raised as SQLAlchemy would have raised it (a locked
        # database is an OperationalError the retry and 503 logic know).
        sql = "BEGIN IMMEDIATE" if conn.get_execution_options().get("immediate") else "BEGIN"
        driver = conn.connection.driver_connection
        assert driver is not None  # a connection being begun is open
        try:
            driver.execute(sql)
        except sqlite3.Error as exc:
            raise sa.exc.DBAPIError.instance(sql, (), exc, sqlite3.Error) from exc


_MIGRATE_LOCK = threading.Lock()
#: Advisory lock key serializing migrations across processes on PostgreSQL ("berth").
_PG_LOCK_KEY = 0x6265727468

#: The newest revision in ``migrations/versions`` (a test keeps the two in step). A database
#: already there skips loading Alembic, which keeps server start-up fast.
HEAD_REVISION = "0005_xid_changes"


def current_revision(engine: Engine) -> str | None:
    """The Alembic revision stamped in the database, or None."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()


def run_migrations(engine: Engine) -> None:
    """Upgrade the schema to the newest Alembic revision shipped inside the package."""
    if current_revision(engine) == HEAD_REVISION:
        return
    from alembic import command
    from alembic.config import Config

    with _MIGRATE_LOCK:
        script_dir = resources.files("berth.placement") / "migrations"
        cfg = Config()
        cfg.set_main_option("script_location", str(script_dir))
        with engine.connect().execution_options(immediate=True) as conn:
            if conn.dialect.name == "postgresql":
                # Servers starting together on one database take turns; the transaction-
                # scoped lock is released when the migration transaction commits (a
                # migration may take long: the turn is waited for without a bound).
                conn.execute(sa.text("SET LOCAL lock_timeout = 0"))
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()


def create_tables(engine: Engine, metadata: sa.MetaData) -> None:
    """``metadata.create_all`` for tables kept beside the migrated schema (the scheduler
    service's), safe when several processes start together on one database: on
    PostgreSQL they take turns on the migration lock, on SQLite on the write lock."""
    with engine.connect().execution_options(immediate=True) as conn, conn.begin():
        lock_schema(conn)
        metadata.create_all(conn)


def lock_schema(conn: Connection) -> None:
    """Take the schema lock for the rest of ``conn``'s transaction: on PostgreSQL the
    migration lock (an advisory lock); on SQLite the write lock a transaction begun
    with the ``immediate`` execution option holds already."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SET LOCAL lock_timeout = 0"))  # behind a migration, maybe
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def sync_standards(engine: Engine) -> None:
    """Insert the standard resource classes (ids 0..20) and traits that are missing."""
    now = utcnow()
    with engine.connect().execution_options(immediate=True) as conn, conn.begin():
        have_rc = {r[0] for r in conn.execute(sa.select(resource_classes.c.name))}
        rows = [
            {"id": i, "name": name, "created_at": None, "updated_at": None}
            for i, name in enumerate(os_resource_classes.STANDARDS)
            if name not in have_rc
        ]
        if rows:
            conn.execute(sa.insert(resource_classes), rows)
        have_tr = {r[0] for r in conn.execute(sa.select(traits.c.name))}
        trows = [
            {"name": name, "created_at": now, "updated_at": None}
            for name in os_traits.get_traits()
            if name not in have_tr
        ]
        if trows:
            conn.execute(sa.insert(traits), trows)
        if conn.execute(sa.select(berth_state.c.id)).first() is None:
            conn.execute(sa.insert(berth_state).values(id=1, change_seq=0, full_seq=0, names_seq=0))
        elif rows or trows:
            # Running stores cache the names; tell them these changed.
            conn.execute(
                sa.update(berth_state)
                .where(berth_state.c.id == 1)
                .values(names_seq=berth_state.c.names_seq + 1)
            )


def mark_reload_all(conn: Connection) -> None:
    """Tell every running store to load its provider graph whole at its next read, from
    a transaction that wrote providers with plain SQL (a bulk load that logged nothing):
    a change that needs a full reload, numbered on SQLite, by this transaction's id on
    PostgreSQL (``change_log``)."""
    bump: dict[str, Any] = {"change_seq": berth_state.c.change_seq + 1,
                            "full_seq": berth_state.c.change_seq + 1}
    if conn.dialect.name == "postgresql":
        bump["full_xid"] = sa.text("CAST(CAST(pg_current_xact_id() AS text) AS bigint)")
    conn.execute(sa.update(berth_state).where(berth_state.c.id == 1).values(**bump))


def forget_foreign(engine: Engine) -> None:
    """PostgreSQL, at start-up: :data:`~berth.placement.change_log.PG_FORGET_FOREIGN`.

    The counters' row is locked first: a write that marked it (a full reload) and is
    still running commits before the statement takes its snapshot, so its mark is below
    that snapshot's ``xmax`` and stays; later writes wait for this transaction. Without
    the lock the statement's UPDATE would wait for such a write, then re-check the row
    against its older snapshot's ``xmax`` and clear the mark: running caches would never
    load the graph whole for that change."""
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT 1 FROM berth_state WHERE id = 1 FOR UPDATE"))
        conn.execute(sa.text(PG_FORGET_FOREIGN))


def prepare(url: str, *, durable: bool = True) -> Engine:
    """Create the engine, migrate to head, forget change log rows of another cluster's
    history (:data:`~berth.placement.change_log.PG_FORGET_FOREIGN`) and sync the
    standard names (start-up path); ``durable`` as :func:`create_db_engine`'s."""
    engine = create_db_engine(url, durable=durable)
    run_migrations(engine)
    if engine.dialect.name == "postgresql":
        forget_foreign(engine)
    try:
        sync_standards(engine)
    except sa.exc.IntegrityError:
        # Another process synced concurrently; its rows are the same ones.
        sync_standards(engine)
    return engine
