"""The registration fast paths (create a root provider, replace its inventories and
traits in two round trips): the same database rows, answers and cached graph as the
general path, and every case they do not handle answered by the general path exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from berth.placement import errors, provider_writes
from berth.placement.store import InventoryRecord, PlacementStore

INV = {
    "VCPU": InventoryRecord("VCPU", 32, 0, 1, 32, 1, 4.0),
    "MEMORY_MB": InventoryRecord("MEMORY_MB", 131072, 512, 1, 131072, 1, 1.0),
    "DISK_GB": InventoryRecord("DISK_GB", 2000, 0, 1, 2000, 1, 1.0),
}
TRAITS = ["HW_CPU_X86_AVX2", "COMPUTE_VOLUME_EXTEND", "HW_CPU_X86_SSE42"]
V = (1, 39)


@contextmanager
def _general_path() -> Iterator[None]:
    """The fast paths turned off meanwhile: every call takes the general path."""
    saved = (provider_writes.create_root, provider_writes.set_inventories,
             provider_writes.set_traits, provider_writes.set_aggregates)
    provider_writes.create_root = lambda *a: None  # type: ignore[assignment]
    provider_writes.set_inventories = lambda *a: None  # type: ignore[assignment]
    provider_writes.set_traits = lambda *a: None  # type: ignore[assignment]
    provider_writes.set_aggregates = lambda *a: None  # type: ignore[assignment]
    try:
        yield
    finally:
        (provider_writes.create_root, provider_writes.set_inventories,
         provider_writes.set_traits, provider_writes.set_aggregates) = saved


def _rows(engine: Any, rp_uuid: str) -> dict[str, Any]:
    """What the database holds for one provider, as the API would show it."""
    with engine.connect() as conn:
        rp = conn.execute(sa.text(
            "SELECT id, name, generation, root_provider_id, parent_provider_id "
            "FROM resource_providers WHERE uuid = :u"), {"u": rp_uuid}).one()
        inv = conn.execute(sa.text(
            "SELECT rc.name, i.total, i.reserved, i.min_unit, i.max_unit, i.step_size, "
            "i.allocation_ratio FROM inventories i JOIN resource_classes rc "
            "ON rc.id = i.resource_class_id WHERE i.resource_provider_id = :i "
            "ORDER BY rc.name"), {"i": rp.id}).all()
        trs = conn.execute(sa.text(
            "SELECT t.name FROM resource_provider_traits x JOIN traits t ON t.id = x.trait_id "
            "WHERE x.resource_provider_id = :i ORDER BY t.name"), {"i": rp.id}).all()
    return {"name": rp.name, "generation": rp.generation, "own_root": rp.root_provider_id == rp.id,
            "parent": rp.parent_provider_id, "inventories": [tuple(r) for r in inv],
            "traits": [r[0] for r in trs]}


def _register(store: PlacementStore, name: str) -> tuple[str, Any, Any, Any]:
    rp_uuid = str(uuid.uuid4())
    prov = store.create_provider(name, rp_uuid, None)
    gen, invs = store.set_inventories(rp_uuid, 0, INV, V)
    result = store.set_provider_traits(rp_uuid, TRAITS, gen)
    return rp_uuid, prov, (gen, invs), result


def test_registration_writes_what_the_general_path_writes(engine: Any) -> None:
    store = PlacementStore(engine)
    through_core: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        through_core.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    raw_before = store.raw_statements
    try:
        a, prov_a, inv_a, traits_a = _register(store, f"fast-{uuid.uuid4().hex[:6]}")
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    # The fast paths did it all, no statement through SQLAlchemy: six round trips on
    # SQLite; on PostgreSQL one statement each.
    assert through_core == []
    if store.is_sqlite:
        assert store.raw_statements - raw_before >= 20
    else:
        assert store.raw_statements - raw_before == 3
    with _general_path():
        b, prov_b, inv_b, traits_b = _register(store, f"slow-{uuid.uuid4().hex[:6]}")
    rows_a, rows_b = _rows(engine, a), _rows(engine, b)
    assert rows_a.pop("name") != rows_b.pop("name")
    assert rows_a == rows_b
    assert rows_a["generation"] == 2 and rows_a["own_root"] and rows_a["parent"] is None
    # The answers: the provider record, the inventories, the traits in id order.
    assert (prov_a.generation, prov_a.root_uuid, prov_a.parent_uuid) == (0, a, None)
    assert prov_a.id == store.get_provider(a).id
    assert inv_a[0] == inv_b[0] == 1
    assert {k: v.as_dict() for k, v in inv_a[1].items()} == \
        {k: v.as_dict() for k, v in inv_b[1].items()}
    assert all(v.created_at is not None for v in inv_a[1].values())
    assert traits_a == traits_b


def test_the_cached_graph_sees_every_fast_write(engine: Any) -> None:
    store = PlacementStore(engine)
    store.provider_graph()  # a cache to be kept current
    rp_uuid, *_ = _register(store, f"cached-{uuid.uuid4().hex[:6]}")
    store.provider_graph()
    fresh = PlacementStore(engine)
    fresh.provider_graph()
    rp_id = fresh._ids_by_uuid[rp_uuid]
    assert store._providers[rp_id] == fresh._providers[rp_id]
    assert store._providers[rp_id].generation == 2
    assert set(store._providers[rp_id].traits) == set(TRAITS)


def test_refusals_are_the_general_paths(engine: Any) -> None:
    store = PlacementStore(engine)
    name = f"dup-{uuid.uuid4().hex[:6]}"
    rp_uuid, *_ = _register(store, name)
    with pytest.raises(errors.Conflict, match="already exists"):
        store.create_provider(name, str(uuid.uuid4()), None)
    with pytest.raises(errors.Conflict, match="already exists"):
        store.create_provider("other-" + name, rp_uuid, None)
    with pytest.raises(errors.Conflict) as gen_conflict:
        store.set_inventories(rp_uuid, 0, INV, V)
    assert gen_conflict.value.code == errors.CONCURRENT_UPDATE
    missing = str(uuid.uuid4())
    with pytest.raises(errors.NotFound, match=f"No resource provider with uuid {missing}"):
        store.set_inventories(missing, 0, INV, V)
    assert store.set_provider_traits(missing, TRAITS, 0) is None
    with pytest.raises(errors.BadRequest, match="No such resource class CUSTOM_NOPE"):
        store.set_inventories(rp_uuid, 2, {**INV, "CUSTOM_NOPE": InventoryRecord(
            "CUSTOM_NOPE", 1, 0, 1, 1, 1, 1.0)}, V)
    with pytest.raises(errors.BadRequest, match="No such trait CUSTOM_NOPE"):
        store.set_provider_traits(rp_uuid, ["CUSTOM_NOPE"], 2)
    with pytest.raises(errors.Conflict, match="generation"):
        store.set_provider_traits(rp_uuid, [], 1)
    assert _rows(engine, rp_uuid)["generation"] == 2  # nothing of the above wrote


def test_changes_and_removals(engine: Any) -> None:
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"chg-{uuid.uuid4().hex[:6]}")
    # Same traits again: no write, same generation (as the general path answers).
    assert store.set_provider_traits(rp_uuid, list(reversed(TRAITS)), 2) == (2, sorted(
        TRAITS, key=lambda n: _trait_id(engine, n)))
    bigger = {**INV, "VCPU": InventoryRecord("VCPU", 64, 0, 1, 64, 1, 4.0)}
    gen, invs = store.set_inventories(rp_uuid, 2, bigger, V)
    assert gen == 3 and invs["VCPU"].total == 64 and invs["VCPU"].updated_at is not None
    assert invs["DISK_GB"].updated_at is None  # unchanged rows keep their stamps
    # A removal takes the general path (it checks the class is not in use).
    gen, invs = store.set_inventories(rp_uuid, 3, {"VCPU": bigger["VCPU"]}, V)
    assert gen == 4 and list(invs) == ["VCPU"]
    gen, names = store.set_provider_traits(rp_uuid, [], 4)
    assert (gen, names) == (5, [])
    assert _rows(engine, rp_uuid)["inventories"] == [("VCPU", 64, 0, 1, 64, 1, 4.0)]


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_a_concurrent_change_between_read_and_write_is_a_conflict(engine: Any) -> None:
    """The fast path reads outside its write transaction; a change that lands in
    between loses the compare-and-swap, and the general path answers the conflict.
    (PostgreSQL's one statement has no in between: the tests below race it.)"""
    store, other = PlacementStore(engine), PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"race-{uuid.uuid4().hex[:6]}")
    real_run = store._run
    fired = []

    def run(raw: Any, stmts: Any) -> Any:
        if stmts and stmts[0][0].startswith("BEGIN") and not fired:
            fired.append(True)
            other.set_provider_traits(rp_uuid, TRAITS[:1], 2)  # the other writer wins
        return real_run(raw, stmts)

    store._run = run  # type: ignore[method-assign]
    with pytest.raises(errors.Conflict):
        store.set_inventories(rp_uuid, 2, {**INV, "DISK_GB": InventoryRecord(
            "DISK_GB", 10, 0, 1, 10, 1, 1.0)}, V)
    assert fired
    assert _rows(engine, rp_uuid)["inventories"] == sorted(
        (rc, i.total, i.reserved, i.min_unit, i.max_unit, i.step_size, i.allocation_ratio)
        for rc, i in INV.items())


def _trait_id(engine: Any, name: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT id FROM traits WHERE name = :n"),
                                {"n": name}).scalar_one())


def test_aggregates_the_general_path_knows_are_replaced_by_the_fast_path(engine: Any) -> None:
    """A host joining aggregates that exist already: two round trips, the rows, answer,
    generation and cached graph the general path gives; a new aggregate, a stale
    generation or a missing provider are the general path's."""
    store = PlacementStore(engine)
    aggs = [str(uuid.uuid4()) for _ in range(3)]
    seed, *_ = _register(store, f"seed-{uuid.uuid4().hex[:6]}")
    # The first use of each aggregate creates it: the general path.
    assert store.set_aggregates(seed, aggs, 2)[0] == 3
    store.provider_graph()
    a, *_ = _register(store, f"agg-{uuid.uuid4().hex[:6]}")
    with _general_path():
        b, *_ = _register(store, f"agg-{uuid.uuid4().hex[:6]}")
    through_core: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        through_core.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        fast = store.set_aggregates(a, list(reversed(aggs)) + aggs[:1], 2)
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert through_core == []
    with _general_path():
        general = store.set_aggregates(b, list(reversed(aggs)) + aggs[:1], 2)
    assert fast == general and fast[0] == 3
    assert store.get_aggregates(a)[1] == store.get_aggregates(b)[1] == fast[1]
    assert store.get_aggregates(a)[0].generation == 3
    # Replaced by fewer, then none.
    assert store.set_aggregates(a, aggs[1:2], 3) == (4, aggs[1:2])
    graph = store.provider_graph()
    fresh = PlacementStore(engine)
    fresh.provider_graph()
    rp_id = fresh._ids_by_uuid[a]
    assert store._providers[rp_id] == fresh._providers[rp_id]
    assert graph.agg_mask(aggs[1])[graph.index[a]] and not graph.agg_mask(aggs[0])[graph.index[a]]
    assert store.set_aggregates(a, [], 4) == (5, [])
    # What the fast path leaves to the general path.
    with pytest.raises(errors.Conflict) as stale:
        store.set_aggregates(a, aggs, 4)
    assert stale.value.code == errors.CONCURRENT_UPDATE
    new = str(uuid.uuid4())
    assert store.set_aggregates(a, [new], 5) == (6, [new])
    with pytest.raises(errors.NotFound):
        store.set_aggregates(str(uuid.uuid4()), aggs, 0)


def _blocked_write(engine: Any, hold_sql: str | list[str], params: dict[str, Any], write: Any,
                   monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run ``write()`` in a thread while another transaction holds the locks of
    ``hold_sql`` (one statement or several, uncommitted); commit that transaction once
    ``write`` waits on its locks; return what ``write`` returned (``value``) or raised
    (``error``), and what the one-statement fast path answered (``fast``: its rows, None
    when the statement failed or was not tried). Fails unless the write did wait on the
    holder."""
    import threading
    import time

    fast: list[Any] = []
    one_statement = provider_writes._one_statement

    def recorded(*args: Any) -> Any:
        fast.append(one_statement(*args))
        return fast[-1]

    monkeypatch.setattr(provider_writes, "_one_statement", recorded)
    holder = engine.connect()
    txn = holder.begin()
    for sql in [hold_sql] if isinstance(hold_sql, str) else hold_sql:
        holder.execute(sa.text(sql), {k: v for k, v in params.items() if f":{k}" in sql})
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = write()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    waited = False
    with engine.connect() as probe:  # wait until the write waits on the holder's lock
        while not waited and time.monotonic() < deadline:
            waited = probe.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar_one() > 0
            # pg_stat_activity is read once per transaction: a probe that began before
            # the write waited would never see it wait (on a loaded machine, it did not).
            probe.rollback()
            time.sleep(0.01)
    txn.commit()
    holder.close()
    thread.join(10)
    assert waited, "the write never waited on the holder's lock"
    out["fast"] = fast[0] if fast else None
    return out


#: A holder's uncommitted inventory row of class ``:n`` on provider ``:u``: a write in
#: flight that a class's deletion or rename must wait for.
_INVENTORY_IN_FLIGHT = (
    "INSERT INTO inventories (resource_provider_id, resource_class_id, total, reserved, "
    "min_unit, max_unit, step_size, allocation_ratio, created_at) "
    "SELECT rp.id, c.id, 4, 0, 1, 4, 1, 1.0, now() FROM resource_providers rp, "
    "resource_classes c WHERE rp.uuid = :u AND c.name = :n"
)


def _log_rows(engine: Any, rp_uuid: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM berth_provider_changes c JOIN resource_providers rp "
            "ON rp.id = c.provider_id WHERE rp.uuid = :u"), {"u": rp_uuid}).scalar_one())


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_one_statement_traits_lose_a_race_to_a_committed_bump(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's one-statement path: another transaction bumps the provider's
    generation while the statement waits for the row; the compare-and-swap then finds
    no row, nothing of the statement stays, and the general path answers the conflict."""
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"lose-{uuid.uuid4().hex[:6]}")
    logged = _log_rows(engine, rp_uuid)
    out = _blocked_write(
        engine, "UPDATE resource_providers SET generation = 3 WHERE uuid = :u", {"u": rp_uuid},
        lambda: store.set_provider_traits(rp_uuid, TRAITS[:1], 2), monkeypatch)
    assert isinstance(out.get("error"), errors.Conflict), out
    assert out["fast"] and out["fast"][0][3] is None  # answered: nothing written
    rows = _rows(engine, rp_uuid)
    assert rows["generation"] == 3 and rows["traits"] == sorted(TRAITS)
    assert _log_rows(engine, rp_uuid) == logged


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_trait_deleted_while_the_one_statement_write_waits_is_unknown_to_it(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trait's deletion locks the link table first: a one-statement traits write
    waits for it, then reads after it, finds the trait gone and writes nothing; the
    general path answers that the trait does not exist."""
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"tgone-{uuid.uuid4().hex[:6]}")
    gone = f"CUSTOM_GONE_{uuid.uuid4().hex[:6].upper()}"
    store.ensure_trait(gone)
    logged = _log_rows(engine, rp_uuid)
    out = _blocked_write(
        engine, ["LOCK TABLE resource_provider_traits IN SHARE MODE",
                 "DELETE FROM traits WHERE name = :n"], {"n": gone},
        lambda: store.set_provider_traits(rp_uuid, [TRAITS[0], gone], 2), monkeypatch)
    assert isinstance(out.get("error"), errors.BadRequest) and gone in str(out["error"]), out
    assert out["fast"] and out["fast"][0][1] == 1  # it found one trait of two: no write
    rows = _rows(engine, rp_uuid)
    assert rows["generation"] == 2 and rows["traits"] == sorted(TRAITS)
    assert _log_rows(engine, rp_uuid) == logged


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_trait_a_write_in_flight_links_is_not_deleted(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other order: a link written by a transaction still in flight. The deletion
    waits for it, sees the link and refuses, so no link is left to a deleted trait."""
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"tkeep-{uuid.uuid4().hex[:6]}")
    kept = f"CUSTOM_KEPT_{uuid.uuid4().hex[:6].upper()}"
    store.ensure_trait(kept)
    out = _blocked_write(
        engine, "INSERT INTO resource_provider_traits (resource_provider_id, trait_id) "
        "SELECT rp.id, t.id FROM resource_providers rp, traits t "
        "WHERE rp.uuid = :u AND t.name = :n", {"u": rp_uuid, "n": kept},
        lambda: store.delete_trait(kept), monkeypatch)
    assert isinstance(out.get("error"), errors.Conflict), out
    assert kept in _rows(engine, rp_uuid)["traits"]


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_the_general_paths_look_names_up_after_a_deletion_they_waited_for(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The general traits and inventories writes take their table's lock before they
    look names up: one that waits for a deletion reads after it, and refuses the name,
    instead of linking a trait or class that no longer exists."""
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"ggone-{uuid.uuid4().hex[:6]}")
    trait = f"CUSTOM_GONE_{uuid.uuid4().hex[:6].upper()}"
    store.ensure_trait(trait)
    rc = f"CUSTOM_GONE_{uuid.uuid4().hex[:6].upper()}"
    store.create_resource_class(rc)
    with _general_path():
        out = _blocked_write(
            engine, ["LOCK TABLE resource_provider_traits IN SHARE MODE",
                     "DELETE FROM traits WHERE name = :n"], {"n": trait},
            lambda: store.set_provider_traits(rp_uuid, [TRAITS[0], trait], 2), monkeypatch)
        assert isinstance(out.get("error"), errors.BadRequest) and trait in str(out["error"]), out
        more = {**INV, rc: InventoryRecord(rc, 4, 0, 1, 4, 1, 1.0)}
        out = _blocked_write(
            engine, ["LOCK TABLE inventories IN SHARE MODE",
                     "DELETE FROM resource_classes WHERE name = :n"], {"n": rc},
            lambda: store.set_inventories(rp_uuid, 2, more, V), monkeypatch)
        assert isinstance(out.get("error"), errors.BadRequest) and rc in str(out["error"]), out
    rows = _rows(engine, rp_uuid)
    assert rows["generation"] == 2 and rows["traits"] == sorted(TRAITS)
    assert len(rows["inventories"]) == 3


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_class_rename_waits_for_an_inventory_write_in_flight(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"cren-{uuid.uuid4().hex[:6]}")
    old = f"CUSTOM_OLD_{uuid.uuid4().hex[:6].upper()}"
    new = f"CUSTOM_NEW_{uuid.uuid4().hex[:6].upper()}"
    store.create_resource_class(old)
    out = _blocked_write(
        engine, _INVENTORY_IN_FLIGHT, {"u": rp_uuid, "n": old},
        lambda: store.rename_resource_class(old, new), monkeypatch)
    assert "error" not in out, out
    assert any(row[0] == new for row in _rows(engine, rp_uuid)["inventories"])


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_one_statement_inventories_lose_a_race_to_a_committed_bump(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"invrace-{uuid.uuid4().hex[:6]}")
    logged = _log_rows(engine, rp_uuid)
    smaller = {**INV, "DISK_GB": InventoryRecord("DISK_GB", 10, 0, 1, 10, 1, 1.0)}
    out = _blocked_write(
        engine, "UPDATE resource_providers SET generation = 3 WHERE uuid = :u", {"u": rp_uuid},
        lambda: store.set_inventories(rp_uuid, 2, smaller, V), monkeypatch)
    assert isinstance(out.get("error"), errors.Conflict), out
    assert out["fast"] and out["fast"][0][2] is None  # answered: nothing written
    rows = _rows(engine, rp_uuid)
    assert rows["generation"] == 3
    assert ("DISK_GB", 2000, 0, 1, 2000, 1, 1.0) in rows["inventories"]
    assert _log_rows(engine, rp_uuid) == logged


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_class_deleted_while_the_one_statement_write_waits_is_unknown_to_it(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resource class's deletion (or rename) locks the inventory table first: a
    one-statement inventories write waits for it, then reads after it, finds the class
    gone and writes nothing; the general path answers that the class is unknown."""
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"cgone-{uuid.uuid4().hex[:6]}")
    gone = f"CUSTOM_GONE_{uuid.uuid4().hex[:6].upper()}"
    store.create_resource_class(gone)
    logged = _log_rows(engine, rp_uuid)
    more = {**INV, gone: InventoryRecord(gone, 4, 0, 1, 4, 1, 1.0)}
    out = _blocked_write(
        engine, ["LOCK TABLE inventories IN SHARE MODE",
                 "DELETE FROM resource_classes WHERE name = :n"], {"n": gone},
        lambda: store.set_inventories(rp_uuid, 2, more, V), monkeypatch)
    assert isinstance(out.get("error"), errors.BadRequest), out
    assert out["fast"] and out["fast"][0][1] is False  # three classes of four: no write
    rows = _rows(engine, rp_uuid)
    assert rows["generation"] == 2 and len(rows["inventories"]) == 3
    assert _log_rows(engine, rp_uuid) == logged


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_class_a_write_in_flight_inventories_is_not_deleted(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PlacementStore(engine)
    rp_uuid, *_ = _register(store, f"ckeep-{uuid.uuid4().hex[:6]}")
    kept = f"CUSTOM_KEPT_{uuid.uuid4().hex[:6].upper()}"
    store.create_resource_class(kept)
    out = _blocked_write(
        engine, _INVENTORY_IN_FLIGHT, {"u": rp_uuid, "n": kept},
        lambda: store.delete_resource_class(kept), monkeypatch)
    assert isinstance(out.get("error"), errors.Conflict), out
    assert any(row[0] == kept for row in _rows(engine, rp_uuid)["inventories"])


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_one_statement_inventories_answer_the_stored_stamps(engine: Any) -> None:
    """The answer's stamps are the rows': new rows created now, changed rows updated
    now, unchanged rows as they were; the same write again changes no row."""
    store = PlacementStore(engine)
    rp_uuid, _prov, (gen, first), _traits = _register(store, f"stamps-{uuid.uuid4().hex[:6]}")
    bigger = {**INV, "VCPU": InventoryRecord("VCPU", 64, 0, 1, 64, 1, 4.0)}
    gen, second = store.set_inventories(rp_uuid, 2, bigger, V)
    gen, third = store.set_inventories(rp_uuid, gen, bigger, V)
    with engine.connect() as conn:
        stored = {r[0]: (r[1], r[2]) for r in conn.execute(sa.text(
            "SELECT rc.name, i.created_at, i.updated_at FROM inventories i "
            "JOIN resource_classes rc ON rc.id = i.resource_class_id "
            "JOIN resource_providers rp ON rp.id = i.resource_provider_id "
            "WHERE rp.uuid = :u"), {"u": rp_uuid})}
    assert gen == 4
    assert {rc: (i.created_at, i.updated_at) for rc, i in third.items()} == stored
    assert second["VCPU"].created_at == first["VCPU"].created_at
    assert second["VCPU"].updated_at == stored["VCPU"][1] is not None
    assert second["MEMORY_MB"] == first["MEMORY_MB"]


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_one_statement_aggregates_lose_a_race_to_a_committed_bump(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PlacementStore(engine)
    aggs = [str(uuid.uuid4()) for _ in range(2)]
    seed, *_ = _register(store, f"aggseed-{uuid.uuid4().hex[:6]}")
    store.set_aggregates(seed, aggs, 2)  # the aggregates exist from here on
    rp_uuid, *_ = _register(store, f"aggrace-{uuid.uuid4().hex[:6]}")
    logged = _log_rows(engine, rp_uuid)
    out = _blocked_write(
        engine, "UPDATE resource_providers SET generation = 3 WHERE uuid = :u", {"u": rp_uuid},
        lambda: store.set_aggregates(rp_uuid, aggs, 2), monkeypatch)
    assert isinstance(out.get("error"), errors.Conflict), out
    assert out["fast"] and out["fast"][0][3] is None  # answered: nothing written
    assert store.get_aggregates(rp_uuid)[1] == []
    assert _log_rows(engine, rp_uuid) == logged
    gen, got = store.set_aggregates(rp_uuid, aggs, 3)
    assert (gen, sorted(got)) == (4, sorted(aggs))


def test_array_literals_read_back_as_the_values_they_were_made_of(pg_database: str) -> None:
    engine = sa.create_engine(pg_database)
    names = ["CUSTOM_A", 'quo"te', "back\\slash", "com,ma", "{brace}", "sp ace", "", "NULL"]
    numbers = [0, -1, 2**62, 10**15]
    ratios = [1.0, 0.1, 16.5, 1e-05, 3.3333333333333335]
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT CAST(%s AS text[]), CAST(%s AS bigint[]), CAST(%s AS float8[]), "
            "CAST(%s AS text[])",
            (provider_writes._pg_array(names), provider_writes._pg_array(numbers),
             provider_writes._pg_array(ratios), provider_writes._pg_array([]))).one()
    engine.dispose()
    assert list(row) == [names, numbers, ratios, []]
