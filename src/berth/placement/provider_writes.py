"""The provider writes a compute node makes when it registers: one statement each on
PostgreSQL, two round trips on SQLite.

A compute agent (``berth compute``, the agents of ``berth serve``, Nova's resource
tracker) registers its node with three calls: create the provider, replace its
inventories, replace its traits (and a fourth for a host in aggregates: replace them).
Through the general path of :class:`PlacementStore` each is a SQLAlchemy transaction of
7-13 statements, each statement a round trip and a compiled construct; at 10,000 hosts
that is most of the registration time.

The paths here do the same writes on the store's raw DBAPI connections:

* On PostgreSQL, one statement each: a data-modifying WITH that reads what the
  provider has, compares its generation, writes the rows, bumps the generation
  (compare-and-swap) and logs the change with its transaction id, atomic on its own. No
  row but the provider's is locked, so writes of different providers commit side by
  side. A pipeline of ten statements costs psycopg about four times the client CPU of
  one. A trait or class deleted or renamed meanwhile cannot slip in between: those
  writes lock the link or inventory table first (``store_traits``), which waits for
  these statements and makes the next ones read after them.
* On SQLite (in process, where a statement costs little), one read (the provider, what
  it has now, the names counter), then one write transaction (the rows, the
  generation's compare-and-swap, the change counter and the change log, COMMIT). The
  compare-and-swap is what makes the read outside the write transaction sound: every
  change to a provider's inventories, traits or usage bumps its generation.

They handle the common case only. Anything else — a missing provider, a generation
that does not match, an unknown class or trait, an inventory removed (which needs the
in-use check), a capacity the microversion refuses, a constraint violated, a lost
compare-and-swap or names that changed in between — writes nothing and returns
``None``, and the caller takes the general path, which gives Placement's exact answer.

They are the store's own (:class:`PlacementStore` calls them first and owns the raw
connections, the class-name cache and the change log they use); nothing else calls them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from berth.placement.db import utcnow
from berth.placement.store import (
    _RAW_BUMP_SEQ,
    _RAW_CAS_RP,
    _RAW_CLASS_NAMES,
    _RAW_LOG_CHANGES,
    _RAW_NAMES_SEQ,
    _SQLITE_STAMP,
    InventoryRecord,
    ProviderRecord,
    RawConnection,
    Unexpected,
    _capacity_ok,
    _fields,
    marks,
)
from berth.placement.store_base import StoreBase
from berth.placement.store_raw import PG_XID

_PROVIDER_GEN = "SELECT id, generation FROM resource_providers WHERE uuid = ?"
_INVENTORY_ROWS = (
    "SELECT i.resource_class_id, i.total, i.reserved, i.min_unit, i.max_unit, i.step_size, "
    "i.allocation_ratio, i.created_at, i.updated_at FROM inventories i "
    "JOIN resource_providers rp ON rp.id = i.resource_provider_id WHERE rp.uuid = ?"
)
_TRAIT_IDS = "SELECT id, name FROM traits WHERE name IN ({})"
_PROVIDER_TRAIT_IDS = (
    "SELECT rpt.trait_id FROM resource_provider_traits rpt "
    "JOIN resource_providers rp ON rp.id = rpt.resource_provider_id WHERE rp.uuid = ?"
)
#: 1 while the trait and class names are those read (a rename or delete bumps it).
_SAME_NAMES = "SELECT CASE WHEN names_seq = ? THEN 1 ELSE 0 END FROM berth_state WHERE id = 1"
_INSERT_ROOT = (
    "INSERT INTO resource_providers (uuid, name, generation, created_at) VALUES (?, ?, 0, ?) "
    "RETURNING id"
)
_OWN_ROOT = "UPDATE resource_providers SET root_provider_id = id WHERE uuid = ?"
_INSERT_INVENTORIES = (
    "INSERT INTO inventories (resource_provider_id, resource_class_id, total, reserved, "
    "min_unit, max_unit, step_size, allocation_ratio, created_at, updated_at) VALUES {}"
)
_UPDATE_INVENTORY = (
    "UPDATE inventories SET total = ?, reserved = ?, min_unit = ?, max_unit = ?, "
    "step_size = ?, allocation_ratio = ?, updated_at = ? "
    "WHERE resource_provider_id = ? AND resource_class_id = ?"
)
_AGGREGATE_IDS = "SELECT id, uuid FROM placement_aggregates WHERE uuid IN ({})"
_CLEAR_AGGREGATES = "DELETE FROM resource_provider_aggregates WHERE resource_provider_id = ?"
_INSERT_AGGREGATES = (
    "INSERT INTO resource_provider_aggregates (resource_provider_id, aggregate_id) VALUES {}"
)
_CLEAR_TRAITS = "DELETE FROM resource_provider_traits WHERE resource_provider_id = ?"
_INSERT_TRAITS = "INSERT INTO resource_provider_traits (resource_provider_id, trait_id) VALUES {}"
#: The change log row of a provider this transaction created, which the cached graph
#: must load (by uuid: its id is not known before the transaction runs).
_LOG_CREATED = (
    "INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta) "
    "SELECT b.change_seq, rp.id, NULL, NULL FROM berth_state b, resource_providers rp "
    "WHERE b.id = 1 AND rp.uuid = ?"
)
#: PostgreSQL: a new root provider in one statement (its id taken from the sequence
#: first, so that it is its own root), with its log row.
_PG_CREATE_ROOT = (
    "WITH nid AS (SELECT nextval(pg_get_serial_sequence('resource_providers', 'id')) AS id), "
    "ins AS (INSERT INTO resource_providers "
    "(id, uuid, name, generation, created_at, root_provider_id) "
    "SELECT id, ?, ?, 0, ?, id FROM nid RETURNING id), "
    "b AS MATERIALIZED (SELECT nextval('berth_change_seq') AS seq, " + PG_XID + " AS xid), "
    "l AS (INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta, xid) "
    "SELECT b.seq, ins.id, NULL, NULL, b.xid FROM b, ins RETURNING seq) "
    "SELECT ins.id, l.seq FROM ins, l"
)
#: PostgreSQL: replace a provider's traits in one statement. It writes only when the
#: provider is at the generation given, every name is a known trait and the set
#: changes; then it bumps the generation (compare-and-swap) and logs the provider. It
#: answers the generation read, how many names were found,
#: whether the set changes, the change number (NULL: nothing written) and the names
#: found in id order (:func:`_pg_replace_links`). Parameters: uuid, names, the stamp,
#: generation, distinct names.
_PG_SET_TRAITS = (
    "WITH rp AS (SELECT id, generation FROM resource_providers WHERE uuid = ?), "
    "want AS (SELECT id, name FROM traits WHERE name = ANY(CAST(? AS text[]))), "
    "cur AS (SELECT x.trait_id AS id FROM resource_provider_traits x, rp "
    "WHERE x.resource_provider_id = rp.id), "
    "diff AS (SELECT EXISTS (SELECT id FROM want EXCEPT SELECT id FROM cur) "
    "OR EXISTS (SELECT id FROM cur EXCEPT SELECT id FROM want) AS changed), "
    "cas AS (UPDATE resource_providers SET generation = generation + 1, updated_at = ? "
    "WHERE id = (SELECT id FROM rp) AND generation = ? "
    "AND (SELECT count(*) FROM want) = ? AND (SELECT changed FROM diff) RETURNING id), "
    "del AS (DELETE FROM resource_provider_traits "
    "WHERE resource_provider_id = (SELECT id FROM cas) "
    "AND trait_id NOT IN (SELECT id FROM want)), "
    "ins AS (INSERT INTO resource_provider_traits (resource_provider_id, trait_id) "
    "SELECT cas.id, want.id FROM cas, want WHERE want.id NOT IN (SELECT id FROM cur)), "
    "b AS MATERIALIZED (SELECT nextval('berth_change_seq') AS seq, " + PG_XID + " AS xid "
    "WHERE EXISTS (SELECT 1 FROM cas)), "
    "l AS (INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta, xid) "
    "SELECT b.seq, cas.id, NULL, NULL, b.xid FROM b, cas RETURNING seq) "
    "SELECT rp.generation, (SELECT count(*) FROM want), (SELECT changed FROM diff), "
    "(SELECT seq FROM l), ARRAY(SELECT name FROM want ORDER BY id) FROM rp"
)
#: PostgreSQL: replace a provider's inventories in one statement, the way
#: :data:`_PG_SET_TRAITS` replaces traits. It writes when the provider is at the
#: generation given, every class is known and none of the provider's is left out (a
#: removal needs the in-use check of the general path): the changed rows are updated,
#: the new ones inserted, the generation always bumped. It answers the generation
#: read, whether it fits, the change number (NULL: nothing written), the provider's
#: classes before with their stamps (in class id order) and the classes updated.
#: Parameters: uuid; the classes and their totals, reserved, min and max units, step
#: sizes and ratios as arrays; how many classes; the stamp; the generation; the stamp
#: twice more.
_PG_SET_INVENTORIES = (
    "WITH rp AS (SELECT id, generation FROM resource_providers WHERE uuid = ?), "
    "new AS (SELECT c.id AS rc_id, n.total, n.reserved, n.min_unit, n.max_unit, "
    "n.step_size, n.ratio FROM unnest(CAST(? AS text[]), CAST(? AS bigint[]), "
    "CAST(? AS bigint[]), CAST(? AS bigint[]), CAST(? AS bigint[]), CAST(? AS bigint[]), "
    "CAST(? AS float8[])) AS n(rc, total, reserved, min_unit, max_unit, step_size, ratio) "
    "JOIN resource_classes c ON c.name = n.rc), "
    "old AS (SELECT i.resource_class_id AS rc_id, i.created_at, i.updated_at "
    "FROM inventories i, rp WHERE i.resource_provider_id = rp.id), "
    "fit AS (SELECT (SELECT count(*) FROM new) = ? AND NOT EXISTS (SELECT 1 FROM old "
    "WHERE rc_id NOT IN (SELECT rc_id FROM new)) AS ok), "
    "cas AS (UPDATE resource_providers SET generation = generation + 1, updated_at = ? "
    "WHERE id = (SELECT id FROM rp) AND generation = ? AND (SELECT ok FROM fit) "
    "RETURNING id), "
    "upd AS (UPDATE inventories i SET total = n.total, reserved = n.reserved, "
    "min_unit = n.min_unit, max_unit = n.max_unit, step_size = n.step_size, "
    "allocation_ratio = n.ratio, updated_at = ? FROM new n, cas "
    "WHERE i.resource_provider_id = cas.id AND i.resource_class_id = n.rc_id "
    "AND (i.total, i.reserved, i.min_unit, i.max_unit, i.step_size, i.allocation_ratio) "
    "IS DISTINCT FROM (n.total, n.reserved, n.min_unit, n.max_unit, n.step_size, n.ratio) "
    "RETURNING i.resource_class_id), "
    "ins AS (INSERT INTO inventories (resource_provider_id, resource_class_id, total, "
    "reserved, min_unit, max_unit, step_size, allocation_ratio, created_at, updated_at) "
    "SELECT cas.id, n.rc_id, n.total, n.reserved, n.min_unit, n.max_unit, n.step_size, "
    "n.ratio, ?, NULL FROM cas, new n WHERE n.rc_id NOT IN (SELECT rc_id FROM old)), "
    "b AS MATERIALIZED (SELECT nextval('berth_change_seq') AS seq, " + PG_XID + " AS xid "
    "WHERE EXISTS (SELECT 1 FROM cas)), "
    "l AS (INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta, xid) "
    "SELECT b.seq, cas.id, NULL, NULL, b.xid FROM b, cas RETURNING seq) "
    "SELECT rp.generation, (SELECT ok FROM fit), (SELECT seq FROM l), "
    "ARRAY(SELECT c.name FROM old o JOIN resource_classes c ON c.id = o.rc_id "
    "ORDER BY o.rc_id), ARRAY(SELECT created_at FROM old ORDER BY rc_id), "
    "ARRAY(SELECT updated_at FROM old ORDER BY rc_id), "
    "ARRAY(SELECT c.name FROM upd u JOIN resource_classes c ON c.id = u.resource_class_id) "
    "FROM rp"
)
#: PostgreSQL: replace a provider's aggregates (all known already) in one statement:
#: written, with the generation's compare-and-swap and the log row, when the provider
#: is at the generation given and every aggregate exists. It answers as
#: :data:`_PG_SET_TRAITS` does (the set always counts as changed: Placement bumps the
#: generation of a provider whose aggregates are set, even to the same). Parameters:
#: uuid, the aggregates' uuids, the stamp, the generation, how many aggregates.
_PG_SET_AGGREGATES = (
    "WITH rp AS (SELECT id, generation FROM resource_providers WHERE uuid = ?), "
    "want AS (SELECT id, uuid FROM placement_aggregates "
    "WHERE uuid = ANY(CAST(? AS text[]))), "
    "cur AS (SELECT x.aggregate_id AS id FROM resource_provider_aggregates x, rp "
    "WHERE x.resource_provider_id = rp.id), "
    "cas AS (UPDATE resource_providers SET generation = generation + 1, updated_at = ? "
    "WHERE id = (SELECT id FROM rp) AND generation = ? AND (SELECT count(*) FROM want) = ? "
    "RETURNING id), "
    "del AS (DELETE FROM resource_provider_aggregates "
    "WHERE resource_provider_id = (SELECT id FROM cas) "
    "AND aggregate_id NOT IN (SELECT id FROM want)), "
    "ins AS (INSERT INTO resource_provider_aggregates (resource_provider_id, aggregate_id) "
    "SELECT cas.id, want.id FROM cas, want WHERE want.id NOT IN (SELECT id FROM cur)), "
    "b AS MATERIALIZED (SELECT nextval('berth_change_seq') AS seq, " + PG_XID + " AS xid "
    "WHERE EXISTS (SELECT 1 FROM cas)), "
    "l AS (INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta, xid) "
    "SELECT b.seq, cas.id, NULL, NULL, b.xid FROM b, cas RETURNING seq) "
    "SELECT rp.generation, (SELECT count(*) FROM want), TRUE, (SELECT seq FROM l), "
    "ARRAY(SELECT uuid FROM want ORDER BY id) FROM rp"
)


def as_datetime(value: Any) -> dt.datetime | None:
    """A timestamp column as read on a raw connection (text on SQLite)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value))


def _stamp(now: dt.datetime) -> str:
    """A timestamp as SQLite's rows hold it."""
    return now.strftime(_SQLITE_STAMP)


def _commit_change(
    store: StoreBase,
    raw: RawConnection,
    stmts: list[tuple[Any, ...]],
    log: tuple[str, Sequence[Any]],
) -> list[Any] | None:
    """SQLite: run ``stmts`` (after BEGIN), bump the change counter, log (``log``: the
    statement and its parameters) and commit, in one call; the results of ``stmts``.
    None (nothing committed) when a statement failed or an expectation did not hold."""
    tail: list[tuple[Any, ...]] = [(_RAW_BUMP_SEQ, ()), log]
    batch = [("BEGIN IMMEDIATE", ()), *stmts, *tail, ("COMMIT", ())]
    try:
        res = store._run(raw, batch)
    except (Unexpected, sa.exc.DBAPIError):
        return None
    bumped = res[-1 - len(tail)]  # committed: never answer None from here on
    store._prune_now_and_then(raw, int(bumped[0][0]) if bumped else None)
    return res[1:-1 - len(tail)]


def _one_statement(store: StoreBase, raw: RawConnection, sql: str,
                   params: Sequence[Any]) -> list[Any] | None:
    """The rows of one statement (atomic on its own), or None when it failed."""
    try:
        (rows,) = store._run(raw, [(sql, params)])
    except (Unexpected, sa.exc.DBAPIError):
        return None
    return rows  # type: ignore[no-any-return]


def _log_reload(rp_id: int) -> tuple[str, Sequence[Any]]:
    """The change log of a provider the cached graph must reload: the store's own
    log statement (generation and usage delta NULL: reload it)."""
    return (_RAW_LOG_CHANGES.format(marks(1, "(?, ?, ?)")), (rp_id, None, None))


def _with_raw(store: StoreBase, work: Any) -> Any:
    """``work(raw)`` on a kept raw connection; None when none could be had."""
    try:
        raw = store._take_raw()
    except sa.exc.DBAPIError:
        return None
    ok = False
    try:
        out = work(raw)
        ok = out is not None
        return out
    finally:
        store._give_raw(raw, ok)


def _class_ids(store: StoreBase, raw: RawConnection, names_seq: int) -> dict[str, int]:
    """Resource class name -> id as of ``names_seq`` (cached per names counter)."""
    cached = store._write_rcs
    if cached is not None and cached[0] == names_seq:
        return cached[1]
    (rows,) = store._run(raw, [(_RAW_CLASS_NAMES, ())])
    by_name = {r[1]: int(r[0]) for r in rows}
    store._write_rcs = (names_seq, by_name)
    return by_name


# -- POST /resource_providers --------------------------------------------------------

def create_root(store: StoreBase, name: str, rp_uuid: str) -> ProviderRecord | None:
    """A new root provider; None for the general path (a taken name or uuid...)."""
    now = utcnow()

    def work(raw: RawConnection) -> ProviderRecord | None:
        if not store.is_sqlite:
            rows = _one_statement(store, raw, _PG_CREATE_ROOT, (rp_uuid, name, now))
            if not rows:
                return None
            store._prune_now_and_then(raw, int(rows[0][1]))
            return ProviderRecord(id=int(rows[0][0]), uuid=rp_uuid, name=name, generation=0,
                                  parent_uuid=None, root_uuid=rp_uuid, created_at=now,
                                  updated_at=None)
        stmts: list[tuple[Any, ...]] = [
            (_INSERT_ROOT, (rp_uuid, name, _stamp(now))),
            (_OWN_ROOT, (rp_uuid,), True),
        ]
        res = _commit_change(store, raw, stmts, (_LOG_CREATED, (rp_uuid,)))
        if res is None:
            return None
        return ProviderRecord(id=int(res[0][0][0]), uuid=rp_uuid, name=name, generation=0,
                              parent_uuid=None, root_uuid=rp_uuid, created_at=now,
                              updated_at=None)

    return _with_raw(store, work)  # type: ignore[no-any-return]


# -- PUT /resource_providers/{uuid}/inventories ----------------------------------------

def set_inventories(
    store: StoreBase,
    uuid: str,
    generation: int,
    new: Mapping[str, InventoryRecord],
    version: tuple[int, int],
) -> tuple[int, dict[str, InventoryRecord]] | None:
    """Replace a provider's inventories when none is removed; None for the general
    path."""
    if any(not _capacity_ok(inv, version) for inv in new.values()):
        return None

    def work(raw: RawConnection) -> tuple[int, dict[str, InventoryRecord]] | None:
        if not store.is_sqlite:
            return _pg_set_inventories(store, raw, uuid, generation, new)
        try:
            prov, rows, seq_rows = store._run(
                raw, [(_PROVIDER_GEN, (uuid,)), (_INVENTORY_ROWS, (uuid,)), (_RAW_NAMES_SEQ, ())])
            if not prov or int(prov[0][1]) != generation:
                return None
            names_seq = int(seq_rows[0][0])
            by_name = _class_ids(store, raw, names_seq)
        except sa.exc.DBAPIError:
            return None
        rp_id = int(prov[0][0])
        if any(rc not in by_name for rc in new):
            return None
        by_id = {v: k for k, v in by_name.items()}
        old: dict[str, InventoryRecord] = {}
        for rc_id, total, reserved, min_unit, max_unit, step, ratio, created, updated in rows:
            rc = by_id.get(int(rc_id))
            if rc is None:
                return None
            old[rc] = InventoryRecord(rc, total, reserved, min_unit, max_unit, step, ratio,
                                      as_datetime(created), as_datetime(updated))
        if any(rc not in new for rc in old):
            return None  # a removal: the general path checks whether it is in use
        now = utcnow()
        stamp = _stamp(now)
        inserts: list[Any] = []
        stmts: list[tuple[Any, ...]] = [(_SAME_NAMES, (names_seq,), True)]
        result: dict[str, InventoryRecord] = {}
        for rc, inv in new.items():
            fields = (inv.total, inv.reserved, inv.min_unit, inv.max_unit, inv.step_size,
                      inv.allocation_ratio)
            before = old.get(rc)
            if before is None:
                inserts += (rp_id, by_name[rc], *fields, stamp, None)
                result[rc] = _replace_stamps(inv, now, None)
            elif _fields(before) != _fields(inv):
                stmts.append((_UPDATE_INVENTORY, (*fields, stamp, rp_id, by_name[rc]), True))
                result[rc] = _replace_stamps(inv, before.created_at, now)
            else:
                result[rc] = before
        if inserts:
            count = len(inserts) // 10
            stmts.append((_INSERT_INVENTORIES.format(
                marks(count, "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")), inserts))
        stmts.append((_RAW_CAS_RP, (generation + 1, stamp, rp_id, generation), True))
        if _commit_change(store, raw, stmts, _log_reload(rp_id)) is None:
            return None
        return generation + 1, result

    return _with_raw(store, work)  # type: ignore[no-any-return]


def _pg_array(values: Iterable[str | int | float]) -> str:
    """``values`` as a PostgreSQL array literal, for a ``CAST(? AS type[])`` parameter.
    psycopg dumps a Python list element by element in Python: the lists of an
    inventories statement cost the API process ~190 µs of CPU a call, the literals
    ~10 µs. Strings are double-quoted (backslash and quote escaped); numbers are
    written as Python prints them, which PostgreSQL reads back exactly."""
    return "{" + ",".join(
        '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' if isinstance(v, str)
        else repr(v) for v in values) + "}"


def _pg_set_inventories(store: StoreBase, raw: RawConnection, uuid: str, generation: int,
                        new: Mapping[str, InventoryRecord],
                        ) -> tuple[int, dict[str, InventoryRecord]] | None:
    """:func:`set_inventories` on PostgreSQL: one statement (:data:`_PG_SET_INVENTORIES`)."""
    now = utcnow()
    invs = list(new.values())
    rows = _one_statement(store, raw, _PG_SET_INVENTORIES, (
        uuid, _pg_array(new), _pg_array(i.total for i in invs),
        _pg_array(i.reserved for i in invs), _pg_array(i.min_unit for i in invs),
        _pg_array(i.max_unit for i in invs), _pg_array(i.step_size for i in invs),
        _pg_array(float(i.allocation_ratio) for i in invs), len(invs),
        now, generation, now, now))
    if not rows:
        return None  # no such provider
    read_generation, fits, seq, old_names, created, updated, changed = rows[0]
    if int(read_generation) != generation or not fits:
        return None  # a stale generation, an unknown class, or a removal
    if seq is None:
        return None  # the compare-and-swap lost to a concurrent write: nothing written
    store._prune_now_and_then(raw, int(seq))
    before = {name: (c, u) for name, c, u in zip(old_names, created, updated, strict=True)}
    result: dict[str, InventoryRecord] = {}
    for rc, inv in new.items():
        if rc not in before:
            result[rc] = _replace_stamps(inv, now, None)
        elif rc in changed:
            result[rc] = _replace_stamps(inv, before[rc][0], now)
        else:
            result[rc] = _replace_stamps(inv, *before[rc])
    return generation + 1, result


# -- PUT /resource_providers/{uuid}/traits ---------------------------------------------

def set_traits(
    store: StoreBase, uuid: str, names: Sequence[str], generation: int
) -> tuple[int, list[str]] | None:
    """Replace a provider's traits; None for the general path."""
    wanted = list(dict.fromkeys(names))

    def work(raw: RawConnection) -> tuple[int, list[str]] | None:
        if not store.is_sqlite:
            return _pg_replace_links(store, raw, _PG_SET_TRAITS, uuid, wanted, generation)
        stmts: list[tuple[Any, ...]] = [(_PROVIDER_GEN, (uuid,)), (_PROVIDER_TRAIT_IDS, (uuid,)),
                                        (_RAW_NAMES_SEQ, ())]
        if wanted:
            stmts.append(_names_query(_TRAIT_IDS, wanted))
        try:
            prov, current_rows, seq_rows, *found_rows = store._run(raw, stmts)
        except sa.exc.DBAPIError:
            return None
        known = _known_names(prov, found_rows, wanted, generation)
        if known is None:
            return None  # a stale generation, or an unknown trait the general path names
        rp_id, ids, by_id = known
        if {int(r[0]) for r in current_rows} == set(ids):
            return generation, [by_id[i] for i in ids]
        stamp = _stamp(utcnow())
        write: list[tuple[Any, ...]] = [
            (_SAME_NAMES, (int(seq_rows[0][0]),), True),
            *_replace_links(_CLEAR_TRAITS, _INSERT_TRAITS, rp_id, ids),
        ]
        write.append((_RAW_CAS_RP, (generation + 1, stamp, rp_id, generation), True))
        if _commit_change(store, raw, write, _log_reload(rp_id)) is None:
            return None
        return generation + 1, [by_id[i] for i in ids]

    return _with_raw(store, work)  # type: ignore[no-any-return]


def _pg_replace_links(store: StoreBase, raw: RawConnection, sql: str, uuid: str,
                      wanted: list[str], generation: int) -> tuple[int, list[str]] | None:
    """:func:`set_traits` and :func:`set_aggregates` on PostgreSQL: one statement
    (:data:`_PG_SET_TRAITS`, :data:`_PG_SET_AGGREGATES`)."""
    rows = _one_statement(store, raw, sql,
                          (uuid, _pg_array(wanted), utcnow(), generation, len(wanted)))
    if not rows:
        return None  # no such provider
    read_generation, found, changed, seq, names = rows[0]
    if int(read_generation) != generation or int(found) != len(wanted):
        return None  # a stale generation, or a name the general path refuses or creates
    if not changed:
        return generation, list(names)
    if seq is None:
        return None  # the compare-and-swap lost to a concurrent write: nothing written
    store._prune_now_and_then(raw, int(seq))
    return generation + 1, list(names)


# -- PUT /resource_providers/{uuid}/aggregates -----------------------------------------

def set_aggregates(
    store: StoreBase, uuid: str, aggregates: Sequence[str], generation: int
) -> tuple[int, list[str]] | None:
    """Replace a provider's aggregates (1.19+: a generation to compare and bump) when
    every one of them is known already; None for the general path (which creates the
    new ones). Aggregate rows are never deleted, so only the provider's generation
    needs the compare-and-swap."""
    wanted = list(dict.fromkeys(aggregates))

    def work(raw: RawConnection) -> tuple[int, list[str]] | None:
        if not store.is_sqlite:
            return _pg_replace_links(store, raw, _PG_SET_AGGREGATES, uuid, wanted, generation)
        stmts: list[tuple[Any, ...]] = [(_PROVIDER_GEN, (uuid,))]
        if wanted:
            stmts.append(_names_query(_AGGREGATE_IDS, wanted))
        try:
            prov, *found_rows = store._run(raw, stmts)
        except sa.exc.DBAPIError:
            return None
        known = _known_names(prov, found_rows, wanted, generation)
        if known is None:
            return None  # a stale generation, or a new aggregate the general path creates
        rp_id, ids, by_id = known
        write = _replace_links(_CLEAR_AGGREGATES, _INSERT_AGGREGATES, rp_id, ids)
        write.append((_RAW_CAS_RP, (generation + 1, _stamp(utcnow()), rp_id, generation),
                      True))
        if _commit_change(store, raw, write, _log_reload(rp_id)) is None:
            return None
        return generation + 1, [by_id[i] for i in ids]

    return _with_raw(store, work)  # type: ignore[no-any-return]


def _known_names(prov: list[Any], found_rows: list[Any], wanted: list[str], generation: int
                 ) -> tuple[int, list[int], dict[int, str]] | None:
    """(provider id, the ids of ``wanted`` ascending, id -> name) from a provider row and
    the rows of the names found, when the provider is at ``generation`` and every name
    is known; None otherwise."""
    if not prov or int(prov[0][1]) != generation:
        return None
    found = {r[1]: int(r[0]) for r in found_rows[0]} if found_rows else {}
    if len(found) != len(wanted):
        return None
    return int(prov[0][0]), sorted(found.values()), {v: k for k, v in found.items()}


def _names_query(sql: str, names: list[str]) -> tuple[Any, ...]:
    """The statement reading the ids of ``names`` (``sql`` takes them as ``IN`` marks)."""
    return (sql.format(marks(len(names), "?")), names)


def _replace_links(clear: str, insert: str, rp_id: int, ids: list[int]
                   ) -> list[tuple[Any, ...]]:
    """The statements that make ``ids`` a provider's only links of one kind (traits,
    aggregates): delete them all, insert the new ones in one statement (``insert``
    with ``VALUES`` marks)."""
    stmts: list[tuple[Any, ...]] = [(clear, (rp_id,))]
    if ids:
        stmts.append((insert.format(marks(len(ids), "(?, ?)")),
                      [v for i in ids for v in (rp_id, i)]))
    return stmts


def _replace_stamps(inv: InventoryRecord, created: dt.datetime | None,
                    updated: dt.datetime | None) -> InventoryRecord:
    return replace(inv, created_at=created, updated_at=updated)
