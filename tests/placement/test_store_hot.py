"""The store's hot paths: the cached provider graph, its write-through after this store's
own allocation writes, the few-statement allocation write, and the names counter.

Every test compares a store's cache with a graph built from scratch by a new store: the
cache must never show anything the database does not hold.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from berth.placement import db, errors
from berth.placement.change_log import PG_SNAPSHOT
from berth.placement.store import (
    _RAW_CLASS_NAMES,
    _RAW_TRAIT_NAMES,
    ConsumerWrite,
    InventoryRecord,
    PlacementStore,
    decode_usage_delta,
    encode_usage_delta,
)

INV = {
    "VCPU": InventoryRecord("VCPU", 8, 0, 1, 8, 1, 1.0),
    "MEMORY_MB": InventoryRecord("MEMORY_MB", 4096, 0, 1, 4096, 1, 1.0),
}


def _providers(engine: Any, n: int, tag: str) -> list[str]:
    store = PlacementStore(engine)
    uuids = []
    for i in range(n):
        rp = store.create_provider(f"{tag}-{i}", None, None)
        store.set_inventories(rp.uuid, 0, INV, (1, 39))
        uuids.append(rp.uuid)
    store.close()
    return uuids


def _fresh(engine: Any) -> tuple[Any, ...]:
    store = PlacementStore(engine)
    try:
        return tuple(store.provider_graph().providers)
    finally:
        store.close()


def _claim(store: PlacementStore, rp: str, vcpu: int = 1, consumer: str | None = None,
           generation: int | None = None) -> str:
    consumer = consumer or str(uuid.uuid4())
    store.write_allocations(
        [ConsumerWrite(consumer, "proj", "user", [(rp, "VCPU", vcpu), (rp, "MEMORY_MB", 64)],
                       "INSTANCE", generation)],
        post=False,
    )
    return consumer


class _Statements:
    """Counts the SQL statements one store runs (SQLAlchemy's and its raw connections')."""

    def __init__(self, store: PlacementStore) -> None:
        self.store = store
        self.orm = 0
        event.listen(store.engine, "before_cursor_execute", self._count)
        self.sql: list[str] = []
        run = store._run

        def spy(raw: Any, stmts: Any) -> Any:
            self.sql.extend(s[0] for s in stmts)
            return run(raw, stmts)

        store._run = spy  # type: ignore[method-assign]

    def _count(self, *_args: Any) -> None:
        self.orm += 1

    def reset(self) -> None:
        self.orm = 0
        self.sql.clear()


def test_the_graph_after_an_own_claim_is_patched_with_one_query(engine: Any) -> None:
    rps = _providers(engine, 3, "own")
    store = PlacementStore(engine)
    store.provider_graph()
    _claim(store, rps[0])  # creates project/user: the general path, which caches the ids
    store.provider_graph()
    count = _Statements(store)
    _claim(store, rps[1], vcpu=2)
    assert count.orm == 0  # the raw fast path
    assert count.sql[0].startswith("BEGIN") and count.sql[-1] == "COMMIT"
    count.reset()
    graph = store.provider_graph()
    assert count.orm == 0 and len(count.sql) == 1  # the counters only
    assert graph.providers == _fresh(engine)
    by_uuid = {p.uuid: p for p in graph.providers}
    assert by_uuid[rps[1]].usages == {"VCPU": 2, "MEMORY_MB": 64}
    store.close()


def test_claims_in_another_store_are_applied_from_the_log_with_one_query(engine: Any) -> None:
    rps = _providers(engine, 3, "other")
    mine, theirs = PlacementStore(engine), PlacementStore(engine)
    mine.provider_graph()
    theirs.provider_graph()
    _claim(mine, rps[0])  # creates project/user: the general path, which caches the ids
    _claim(theirs, rps[0])
    mine.provider_graph()
    theirs.provider_graph()
    count = _Statements(mine)
    moved = _claim(theirs, rps[1], vcpu=2)
    _claim(theirs, rps[1], vcpu=3)
    _claim(theirs, rps[2])
    graph = mine.provider_graph()
    # The counters and the log, in one statement: no provider, inventory or usage read.
    assert count.orm == 0 and len(count.sql) == 1, count.sql
    assert graph.providers == _fresh(engine)
    by_uuid = {p.uuid: p for p in graph.providers}
    assert by_uuid[rps[1]].usages == {"VCPU": 5, "MEMORY_MB": 128}
    # A move (the consumer's old rows given back on one provider, new ones on another),
    # a release, and writes of several consumers at once (the general path): all of
    # them log their deltas too.
    _claim(theirs, rps[2], vcpu=1, consumer=moved, generation=1)
    theirs.delete_consumer_allocations(_claim(theirs, rps[0]))
    theirs.write_allocations(
        [
            ConsumerWrite(str(uuid.uuid4()), "proj", "user", [(rp, "VCPU", 1)], "INSTANCE", None)
            for rp in rps[:2]
        ],
        post=True,
    )
    count.reset()
    graph = mine.provider_graph()
    assert graph.providers == _fresh(engine)
    assert count.orm == 0 and len(count.sql) == 1, count.sql
    _claim(theirs, rps[1])
    _claim(mine, rps[0])  # another store's change came in between
    _claim(theirs, rps[0], vcpu=2)
    if mine.is_sqlite:  # the cache follows a change counter: no write-through then
        assert mine._seq < mine.change_seq()
    else:  # patched in by transaction; its log row is skipped when read
        assert len(mine._own_xids) == 1
    assert mine.provider_graph().providers == _fresh(engine)
    assert theirs.provider_graph().providers == _fresh(engine)
    mine.close()
    theirs.close()


def test_a_deleted_provider_s_id_given_to_a_new_one_is_another_provider(engine: Any) -> None:
    """SQLite gives the id of a deleted highest-numbered provider to the next one created.
    A cache following the log must see another provider there: before, it kept the old
    uuid on that id, so a claim naming the deleted provider went onto the new one."""
    rps = _providers(engine, 2, "reuse")
    mine, theirs = PlacementStore(engine), PlacementStore(engine)
    mine.provider_graph()
    _claim(mine, rps[0])  # the general path caches the project and user ids
    mine.provider_graph()
    gone = theirs.get_provider(rps[1])
    assert gone is not None
    theirs.delete_provider(rps[1])
    new = theirs.create_provider("reuse-new", None, None)
    theirs.set_inventories(new.uuid, 0, INV, (1, 39))
    if engine.dialect.name == "sqlite":
        assert theirs.get_provider(new.uuid).id == gone.id  # type: ignore[union-attr]
    assert mine.provider_graph().providers == _fresh(engine)
    with pytest.raises(errors.BadRequest, match="does not exist"):
        _claim(mine, rps[1])
    consumer = _claim(mine, new.uuid, vcpu=3)
    assert {p.uuid: p.usages for p in mine.provider_graph().providers}[new.uuid] == {
        "VCPU": 3, "MEMORY_MB": 64}
    theirs.delete_consumer_allocations(consumer)
    theirs.delete_provider(new.uuid)  # the cache's uuid index must have followed it
    assert mine.provider_graph().providers == _fresh(engine)
    with pytest.raises(errors.BadRequest, match="does not exist"):
        _claim(mine, new.uuid)
    mine.close()
    theirs.close()


def test_an_inventory_change_among_claims_reloads_that_provider(engine: Any) -> None:
    rps = _providers(engine, 2, "mixed")
    mine, theirs = PlacementStore(engine), PlacementStore(engine)
    mine.provider_graph()
    _claim(theirs, rps[0])
    _claim(theirs, rps[1])
    gen = theirs.get_provider(rps[0]).generation  # type: ignore[union-attr]
    theirs.set_inventories(
        rps[0], gen, {**INV, "VCPU": InventoryRecord("VCPU", 6, 0, 1, 6, 1, 1.0)}, (1, 39)
    )
    _claim(theirs, rps[0])
    graph = mine.provider_graph()
    assert graph.providers == _fresh(engine)
    by_uuid = {p.uuid: p for p in graph.providers}
    assert by_uuid[rps[0]].inventories["VCPU"].total == 6
    assert by_uuid[rps[0]].usages["VCPU"] == 2
    mine.close()
    theirs.close()


def test_usage_deltas_round_trip() -> None:
    assert encode_usage_delta({2: 40, 0: 1, 1: -512}) == "0:1,1:-512,2:40"
    assert decode_usage_delta("0:1,1:-512,2:40") == {0: 1, 1: -512, 2: 40}
    assert decode_usage_delta(encode_usage_delta({})) == {}


def _exact(store: PlacementStore, engine: Any) -> None:
    """The store's cached providers equal the database's whenever the database is still at
    the change the cache claims to hold: on SQLite its change number; on PostgreSQL its
    snapshot, with the store's own writes patched in since."""
    if store._graph is None:
        return
    if store.is_sqlite and store._seq != store.change_seq():
        return
    if not store.is_sqlite:
        with engine.connect() as conn:
            unseen = {int(r[0]) for r in conn.execute(sa.text(
                "SELECT xid FROM berth_provider_changes WHERE NOT pg_visible_in_snapshot("
                "CAST(CAST(xid AS text) AS xid8), CAST(:s AS pg_snapshot))"), {"s": store._snap})}
        if not unseen <= store._own_xids:
            return
    cached = tuple(store._providers[i] for i in sorted(store._providers))
    assert cached == _fresh(engine)


def test_interleaved_writes_of_two_stores_keep_both_caches_exact(engine: Any) -> None:
    rnd = random.Random(7)
    rps = _providers(engine, 4, "mix")
    stores = [PlacementStore(engine), PlacementStore(engine)]
    held: dict[str, tuple[str, int]] = {}  # consumer -> (provider, generation)
    for store in stores:
        store.provider_graph()
    for step in range(120):
        store = rnd.choice(stores)
        kind = rnd.choice(["claim", "claim", "claim", "move", "big", "release", "inventory",
                           "trait", "graph", "several"])
        try:
            if kind == "claim":
                rp = rnd.choice(rps)
                consumer = _claim(store, rp, vcpu=rnd.randint(1, 3))
                held[consumer] = (rp, 1)
            elif kind == "move" and held:
                consumer = rnd.choice(sorted(held))
                _old, gen = held[consumer]
                rp = rnd.choice(rps)
                _claim(store, rp, vcpu=1, consumer=consumer, generation=gen)
                held[consumer] = (rp, gen + 1)
            elif kind == "several":  # the general path: two consumers in one write
                pair = [str(uuid.uuid4()), str(uuid.uuid4())]
                store.write_allocations(
                    [ConsumerWrite(c, "proj", "user", [(rnd.choice(rps), "VCPU", 1)],
                                   "INSTANCE", None) for c in pair],
                    post=True,
                )
                held.update((c, ("", 1)) for c in pair)
            elif kind == "big":
                _claim(store, rnd.choice(rps), vcpu=8)  # usually refused: capacity
            elif kind == "release" and held:
                consumer = rnd.choice(sorted(held))
                del held[consumer]
                store.delete_consumer_allocations(consumer)
            elif kind == "inventory":
                rp = rnd.choice(rps)
                gen = store.get_provider(rp).generation  # type: ignore[union-attr]
                total = rnd.randint(4, 12)
                inv = {**INV, "VCPU": InventoryRecord("VCPU", total, 0, 1, 8, 1, 1.0)}
                store.set_inventories(rp, gen, inv, (1, 39))
            elif kind == "trait":
                rp = rnd.choice(rps)
                gen = store.get_provider(rp).generation  # type: ignore[union-attr]
                store.set_provider_traits(rp, rnd.choice([[], ["HW_CPU_X86_AVX"]]), gen)
            elif kind == "graph":
                assert store.provider_graph().providers == _fresh(engine), step
        except errors.PlacementError:
            pass
        for each in stores:
            _exact(each, engine)
    for store in stores:
        assert store.provider_graph().providers == _fresh(engine)
        store.close()


def test_a_move_of_a_claim_the_cache_has_not_seen_is_not_lost(engine: Any) -> None:
    """A consumer claimed through the general path (which leaves the cache to the log)
    and moved at once through the fast path: the move gives back usage the cache does
    not hold yet. The write-through must leave that to the log, not clamp it at zero
    (the claim's +1, read later, then outlived the move's -1)."""
    rps = _providers(engine, 3, "unseen")
    store = PlacementStore(engine)
    _claim(store, rps[2])  # creates project/user: the general path caches their ids
    store.provider_graph()
    pair = [str(uuid.uuid4()), str(uuid.uuid4())]
    store.write_allocations(
        [ConsumerWrite(c, "proj", "user", [(rps[0], "VCPU", 1)], "INSTANCE", None)
         for c in pair],
        post=True,
    )
    _claim(store, rps[1], vcpu=2, consumer=pair[0], generation=1)
    assert store.provider_graph().providers == _fresh(engine)
    store.close()


def test_fast_path_refusals_answer_like_the_general_path(engine: Any) -> None:
    rps = _providers(engine, 1, "refuse")
    store = PlacementStore(engine)
    store.provider_graph()
    consumer = _claim(store, rps[0], vcpu=6)
    with pytest.raises(errors.Conflict) as exc:
        _claim(store, rps[0], vcpu=3)
    assert exc.value.message == (
        "Unable to allocate inventory: Unable to create allocation for 'VCPU' on resource "
        f"provider '{rps[0]}'. The requested amount would exceed the capacity."
    )
    with pytest.raises(errors.Conflict) as exc:
        _claim(store, rps[0], vcpu=1, consumer=consumer, generation=None)
    assert exc.value.message == "consumer generation conflict - expected 1 but got None"
    with pytest.raises(errors.Conflict) as exc:
        _claim(store, rps[0], vcpu=1, consumer=consumer, generation=5)
    assert exc.value.message == "consumer generation conflict - expected 1 but got 5"
    with pytest.raises(errors.Conflict) as exc:
        _claim(store, rps[0], vcpu=9)
    assert "would violate inventory constraints" in exc.value.message
    missing = str(uuid.uuid4())
    with pytest.raises(errors.BadRequest) as bad:
        _claim(store, missing)
    assert bad.value.message == f"Allocation for resource provider '{missing}' that does not exist."
    # A move of the existing consumer (its generation) goes through and is patched in.
    _claim(store, rps[0], vcpu=2, consumer=consumer, generation=1)
    got = store.consumer_allocations(consumer)
    assert got.consumer_generation == 2 and got.allocations[rps[0]]["VCPU"] == 2
    assert store.provider_graph().providers == _fresh(engine)
    store.close()


def test_names_are_read_again_only_when_a_name_changes(engine: Any) -> None:
    rps = _providers(engine, 2, "names")
    store = PlacementStore(engine)
    store.provider_graph()
    count = _Statements(store)
    other = PlacementStore(engine)
    other.set_inventories(rps[0], 1, {"VCPU": INV["VCPU"]}, (1, 39))
    graph = store.provider_graph()
    assert _RAW_TRAIT_NAMES not in count.sql and _RAW_CLASS_NAMES not in count.sql
    assert graph.providers == _fresh(engine)
    count.reset()
    other.ensure_trait("CUSTOM_HOT_NEW")
    graph = store.provider_graph()
    assert _RAW_TRAIT_NAMES in count.sql and "CUSTOM_HOT_NEW" in graph.known_traits
    other.create_resource_class("CUSTOM_HOT_CLASS")
    assert "CUSTOM_HOT_CLASS" in store.provider_graph().known_classes
    # The fast write path notices the new class too.
    gen = other.get_provider(rps[1]).generation  # type: ignore[union-attr]
    inv = InventoryRecord("CUSTOM_HOT_CLASS", 4, 0, 1, 4, 1, 1.0)
    other.set_inventories(rps[1], gen, {**INV, "CUSTOM_HOT_CLASS": inv}, (1, 39))
    _claim(store, rps[1])
    store.write_allocations(
        [ConsumerWrite(str(uuid.uuid4()), "proj", "user", [(rps[1], "CUSTOM_HOT_CLASS", 3)],
                       "INSTANCE", None)],
        post=False,
    )
    other.delete_trait("CUSTOM_HOT_NEW")
    graph = store.provider_graph()
    assert "CUSTOM_HOT_NEW" not in graph.known_traits
    assert graph.providers == _fresh(engine)
    by_uuid = {p.uuid: p for p in graph.providers}
    assert by_uuid[rps[1]].usages["CUSTOM_HOT_CLASS"] == 3
    store.close()
    other.close()


def test_a_dropped_connection_is_replaced(engine: Any) -> None:
    if engine.dialect.name == "sqlite":
        pytest.skip("PostgreSQL sessions only")
    rps = _providers(engine, 1, "drop")
    store = PlacementStore(engine)
    store.provider_graph()
    _claim(store, rps[0])
    pids = [raw.dbapi.info.backend_pid for raw in store._raw_pool.spare]  # type: ignore[attr-defined]
    assert pids
    with engine.connect() as conn:
        for pid in pids:
            conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    _claim(store, rps[0])  # the fast path fails over to the general one
    assert store.provider_graph().providers == _fresh(engine)
    _claim(store, rps[0])
    assert store.provider_graph().providers == _fresh(engine)
    store.close()


def test_a_0002_database_is_migrated_and_the_store_works(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = db.create_db_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(db.__file__).parent / "migrations"))
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002_provider_changes")
        conn.commit()
        conn.execute(sa.text("INSERT INTO berth_state (id, change_seq, full_seq) VALUES (1, 7, 0)"))
        conn.commit()
    assert db.current_revision(engine) == "0002_provider_changes"
    engine.dispose()
    engine = db.prepare(url)
    assert db.current_revision(engine) == db.HEAD_REVISION
    with engine.connect() as conn:
        state = conn.execute(sa.text("SELECT change_seq, names_seq FROM berth_state")).one()
    assert tuple(state) == (7, 1)  # the standard names were synced: a names change
    rps = _providers(engine, 1, "old")
    store = PlacementStore(engine)
    _claim(store, rps[0])
    assert store.provider_graph().providers == _fresh(engine)
    store.close()
    engine.dispose()


def test_stale_caches_and_taken_consumers_fall_back_again_and_again(
    engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache made stale by another store sends a write that the database refuses (the
    provider's compare-and-swap); so does a consumer that exists. Over and over, on the
    same kept connection, each falls back to reading the database, with no error and
    nothing logged (psycopg prepares statements inside such pipelines)."""
    rps = _providers(engine, 2, "stale")
    mine, theirs = PlacementStore(engine), PlacementStore(engine)
    mine.provider_graph()
    _claim(mine, rps[0])  # caches project and user
    taken = _claim(mine, rps[1])
    caplog.clear()
    for step in range(40):
        mine.provider_graph()
        first = _claim(theirs, rps[0], vcpu=3)
        if step % 2:
            theirs.delete_consumer_allocations(_claim(theirs, rps[1]))
        second = _claim(mine, rps[0], vcpu=3)  # a stale generation: refused, read, written
        with pytest.raises(errors.Conflict):
            _claim(mine, rps[1], consumer=taken)
        if step % 4 == 3:
            with pytest.raises(errors.Conflict):  # full: the general path says so
                _claim(mine, rps[0], vcpu=3)
        _exact(mine, engine)
        for consumer in (first, second):
            theirs.delete_consumer_allocations(consumer)
    assert mine.provider_graph().providers == _fresh(engine)
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    mine.close()
    theirs.close()



def test_a_raw_batch_answers_per_statement_and_a_failed_expectation_undoes_it(
        engine: Any) -> None:
    """Several statements go to the database as one (PostgreSQL: one pipeline):
    each answers its own rows or row count, values travel intact whatever their quotes,
    ``%`` or type, and a failed expectation stops the batch and undoes its transaction,
    leaving the kept connection usable."""
    from berth.placement.store_raw import RawPool, Unexpected

    rp = _providers(engine, 1, "batch%'q")[0]
    pool = RawPool(engine)
    pg = engine.dialect.name != "sqlite"
    begin = "BEGIN" if pg else "BEGIN IMMEDIATE"
    name = "it's 100% \\ \"odd\"; -- ok"
    listed = (("SELECT COUNT(*) FROM resource_providers WHERE id = ANY(?)", ([1, 2, 70000],))
              if pg else ("SELECT COUNT(*) FROM resource_providers WHERE id IN (?, ?, ?)",
                          (1, 2, 70000)))
    got = pool.run([
        (begin, ()),
        ("UPDATE resource_providers SET name = ? WHERE uuid = ?", (name, rp), True),
        ("SELECT name, generation FROM resource_providers WHERE uuid = ?", (rp,)),
        listed,
        ("COMMIT", ()),
    ])
    assert len(got) == 5
    assert got[1] in (1, [(1,)])  # PostgreSQL checks the expectation in a SELECT
    assert got[2] == [(name, 1)]
    assert got[3][0][0] >= 1
    with pytest.raises(Unexpected):
        pool.run([
            (begin, ()),
            ("UPDATE resource_providers SET name = ? WHERE uuid = ?", ("gone", rp), True),
            ("UPDATE resource_providers SET generation = 9 WHERE uuid = ?", ("nope",), True),
            ("COMMIT", ()),
        ])
    assert pool.run([("SELECT name FROM resource_providers WHERE uuid = ?", (rp,))]) == [
        [(name,)]]
    pool.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_claims_on_shared_providers_from_many_threads_add_up(engine: Any) -> None:
    """Claims of two providers each, named in opposite orders, from many threads at
    once: the database sees no deadlock, every claim is written exactly once (a client
    retries Placement's "concurrently updated" conflict, as Nova does), and the usages
    and generations add up."""
    import threading

    a, b = _providers(engine, 2, "order")
    big = {"VCPU": InventoryRecord("VCPU", 1000, 0, 1, 1000, 1, 1.0), "MEMORY_MB": INV["MEMORY_MB"]}
    setup = PlacementStore(engine)
    for rp in (a, b):
        setup.set_inventories(rp, 1, big, (1, 39))
    setup.close()
    stores = [PlacementStore(engine) for _ in range(6)]
    for s in stores:
        s.provider_graph()
        _claim(s, a)  # caches project and user
    with engine.connect() as conn:
        gens0 = dict(conn.execute(sa.text(
            "SELECT uuid, generation FROM resource_providers WHERE uuid IN (:a, :b)"),
            {"a": a, "b": b}).all())
    errors_seen: list[BaseException] = []
    consumers: list[str] = []

    def deadlocks() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            )).scalar_one())

    def work(s: PlacementStore, first: str, second: str) -> None:
        for _ in range(15):
            consumer = str(uuid.uuid4())
            for _attempt in range(20):
                try:
                    s.provider_graph()
                    s.write_allocations([ConsumerWrite(
                        consumer, "proj", "user", [(first, "VCPU", 1), (second, "VCPU", 1)],
                        "INSTANCE", None)], post=False)
                    consumers.append(consumer)
                    break
                except errors.Conflict as exc:
                    if "concurrently updated" not in exc.message:
                        errors_seen.append(exc)
                        break
                except BaseException as exc:  # noqa: BLE001 - asserted below
                    errors_seen.append(exc)
                    break

    threads = [threading.Thread(target=work, args=(s, a, b) if i % 2 else (s, b, a))
               for i, s in enumerate(stores)]
    before = deadlocks()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors_seen, errors_seen[:3]
    assert deadlocks() == before
    assert len(consumers) == 90
    with engine.connect() as conn:
        used = dict(conn.execute(sa.text(
            "SELECT r.uuid, sum(a.used) FROM allocations a JOIN resource_providers r "
            "ON r.id = a.resource_provider_id JOIN resource_classes c "
            "ON c.id = a.resource_class_id WHERE c.name = 'VCPU' AND a.consumer_id = "
            "ANY(:c) GROUP BY r.uuid"), {"c": consumers}).all())
        gens = dict(conn.execute(sa.text(
            "SELECT uuid, generation FROM resource_providers WHERE uuid IN (:a, :b)"),
            {"a": a, "b": b}).all())
    assert used == {a: 90, b: 90}
    assert gens == {a: gens0[a] + 90, b: gens0[b] + 90}
    assert stores[0].provider_graph().providers == _fresh(engine)
    for s in stores:
        s.close()


def test_the_change_log_is_pruned_by_the_write_that_reaches_a_500th_change(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim and a consumer's deletion each prune the log when their change number is
    a multiple of 500, keeping the latest CHANGE_LOG_KEEP (here 100); the cache stays
    exact."""
    import berth.placement.store_base as store_base

    monkeypatch.setattr(store_base, "CHANGE_LOG_KEEP", 100)
    rp = _providers(engine, 1, "prune")[0]
    store = PlacementStore(engine)
    store.provider_graph()

    def oldest() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT min(seq) FROM berth_provider_changes")).scalar_one())

    held: list[str] = []
    for target in (500, 1000):
        while store.change_seq() < target - 1:
            if len(held) < 4:
                held.append(_claim(store, rp))
            else:
                store.delete_consumer_allocations(held.pop())
        if target == 500:  # reached by a claim
            held.append(_claim(store, rp))
        else:  # reached by a deletion
            store.delete_consumer_allocations(held.pop())
        assert store.change_seq() == target
        assert oldest() == target - 100
    assert store.provider_graph().providers == _fresh(engine)
    store.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_cache_whose_unseen_changes_were_pruned_is_loaded_whole(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: a prune removes only rows of finished transactions and records the
    highest it removed; a store whose snapshot had not seen some of them loads the graph
    whole instead of patching from what is left."""
    import berth.placement.store_base as store_base

    monkeypatch.setattr(store_base, "CHANGE_LOG_KEEP", 5)
    rp = _providers(engine, 1, "pruned")[0]
    behind, writer = PlacementStore(engine), PlacementStore(engine)
    behind.provider_graph()
    writer.provider_graph()
    held: list[str] = []
    # The first 500th change at least 10 after now: its prune removes some that
    # ``behind`` has not seen.
    target = (writer.change_seq() + 10) // 500 * 500 + 500
    while writer.change_seq() < target + 1:
        if len(held) < 3:
            held.append(_claim(writer, rp))
        else:
            writer.delete_consumer_allocations(held.pop(0))
    with engine.connect() as conn:
        pruned = conn.execute(sa.text("SELECT pruned_xid FROM berth_state")).scalar_one()
    assert pruned > 0
    count = _Statements(behind)
    assert behind.provider_graph().providers == _fresh(engine)
    assert PG_SNAPSHOT in count.sql  # loaded whole
    behind.close()
    writer.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_own_claims_patched_in_are_bounded_and_caught_up_from_the_log(
        engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL: a store that keeps claiming without reading its graph again patches
    in at most INCREMENTAL_LIMIT of its own writes; the log carries the rest, and the
    next read is exact and forgets them."""
    import berth.placement.store_fast_writes as fast_writes

    monkeypatch.setattr(fast_writes, "INCREMENTAL_LIMIT", 3)
    rps = _providers(engine, 2, "bounded")
    store = PlacementStore(engine)
    store.provider_graph()
    _claim(store, rps[0])  # creates project/user: the general path, which caches the ids
    store.provider_graph()
    for _ in range(5):
        _claim(store, rps[1])
    assert len(store._own_xids) == 3
    assert store.provider_graph().providers == _fresh(engine)
    assert store._own_xids == set()
    store.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_transaction_left_open_does_not_stop_a_cache_following_the_log(engine: Any) -> None:
    """PostgreSQL: with a transaction holding an id and left open (an idle session),
    every snapshot has it running; the cache still follows every claim from the log,
    exactly."""
    rps = _providers(engine, 2, "open")
    mine, theirs = PlacementStore(engine), PlacementStore(engine)
    mine.provider_graph()
    _claim(theirs, rps[0])  # creates project/user: the general path, which caches the ids
    with engine.connect() as idle:
        idle.execute(sa.text("SELECT pg_current_xact_id()"))  # an id, and left open
        for step in range(6):
            _claim(theirs, rps[step % 2], vcpu=1 + step % 2)
            graph = mine.provider_graph()
            assert graph.providers == _fresh(engine), step
            assert not mine._own_xids
        idle.rollback()
    _claim(theirs, rps[1])
    assert mine.provider_graph().providers == _fresh(engine)
    mine.close()
    theirs.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_log_rows_of_another_clusters_history_are_forgotten_at_start(engine: Any) -> None:
    """A database restored from a logical dump starts its transaction ids over: log
    rows and markers with ids this cluster has not reached would be read as new once
    its ids pass theirs. Start-up forgets them; the caches then follow as before."""
    rp = _providers(engine, 1, "restored")[0]
    with engine.begin() as conn:
        future = int(conn.execute(sa.text(
            "SELECT CAST(CAST(pg_current_xact_id() AS text) AS bigint)")).scalar_one()) + 10**6
        rp_id = conn.execute(sa.text("SELECT id FROM resource_providers WHERE uuid = :u"),
                             {"u": rp}).scalar_one()
        conn.execute(sa.text(
            "INSERT INTO berth_provider_changes (seq, provider_id, generation, usage_delta, xid) "
            "VALUES (nextval('berth_change_seq'), :p, NULL, '0:7', :x)"), {"p": rp_id, "x": future})
        conn.execute(sa.text("UPDATE berth_state SET full_xid = :x, pruned_xid = :x"),
                     {"x": future})
    db.prepare(engine.url.render_as_string(hide_password=False)).dispose()
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT count(*) FROM berth_provider_changes WHERE xid = :x"), {"x": future}
        ).scalar_one() == 0
        assert tuple(conn.execute(sa.text(
            "SELECT full_xid, pruned_xid FROM berth_state")).one()) == (0, 0)
    store = PlacementStore(engine)
    store.provider_graph()
    _claim(PlacementStore(engine), rp)
    assert store.provider_graph().providers == _fresh(engine)
    store.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_cache_read_on_another_server_is_loaded_whole(engine: Any) -> None:
    """After a failover to a standby that had not replayed everything, or a restore to
    an earlier point, transaction ids go back: new transactions get ids the cached
    snapshot counts as seen, and the log would never bring them. The snapshot is
    remembered with its server; another server's answer reloads the graph whole.
    Simulated: the cached snapshot is moved 200 ids ahead, as the old server's was, and
    said to come from another server."""
    rp = _providers(engine, 1, "failover")[0]
    mine, theirs = PlacementStore(engine), PlacementStore(engine)
    mine.provider_graph()
    xmin, xmax, running = mine._snap.split(":")
    mine._snap = f"{xmin}:{int(xmax) + 200}:{running}"
    mine._server = "1.5"  # the old server started 1.5 s after the epoch
    mine._own_xids = {int(xmax) + 100}  # one of its writes there, patched in
    for _ in range(3):
        _claim(theirs, rp)
    count = _Statements(mine)
    assert mine.provider_graph().providers == _fresh(engine)
    assert PG_SNAPSHOT in count.sql  # loaded whole
    assert mine._own_xids == set()
    _claim(theirs, rp)
    count.reset()
    assert mine.provider_graph().providers == _fresh(engine)
    assert PG_SNAPSHOT not in count.sql  # the same server from there on: the log
    mine.close()
    theirs.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_start_up_keeps_a_full_reload_mark_committed_while_it_runs(engine: Any) -> None:
    """A process starting while another marks the graph for a full reload (a class
    rename, a bulk load) must not clear the mark: it forgets only what another
    cluster's history left. Played here: the start-up's delete waits on a foreign log
    row another session holds, while the mark is written."""
    import threading
    import time

    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO berth_provider_changes (seq, provider_id, xid) "
            "VALUES (nextval('berth_change_seq'), 1, 1099511627776)"))
        conn.execute(sa.text("UPDATE berth_state SET full_xid = 0 WHERE id = 1"))
    holder = engine.connect()
    holder.execute(sa.text(
        "SELECT 1 FROM berth_provider_changes WHERE xid = 1099511627776 FOR UPDATE"))
    marked: list[int] = []

    def mark() -> None:
        with engine.begin() as conn:
            marked.append(int(conn.execute(sa.text(
                "SELECT CAST(CAST(pg_current_xact_id() AS text) AS bigint)")).scalar_one()))
            db.mark_reload_all(conn)

    starting = threading.Thread(target=db.forget_foreign, args=(engine,))
    starting.start()
    time.sleep(0.3)  # the start-up waits on the held row
    marking = threading.Thread(target=mark)
    marking.start()
    time.sleep(0.3)
    holder.rollback()
    holder.close()
    starting.join(10)
    marking.join(10)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT full_xid FROM berth_state")).scalar_one() == marked[0]
        assert conn.execute(sa.text(
            "SELECT count(*) FROM berth_provider_changes WHERE xid = 1099511627776")
        ).scalar_one() == 0


def test_a_bulk_load_marked_for_a_full_reload_is_read_whole(engine: Any) -> None:
    """Providers written with plain SQL log nothing; ``db.mark_reload_all`` in the same
    transaction makes a running store load its graph whole at its next read."""
    store = PlacementStore(engine)
    store.provider_graph()
    now = db.utcnow()
    with engine.begin() as conn:
        conn.execute(sa.insert(db.resource_providers),
                     [{"uuid": str(uuid.uuid4()), "name": f"bulk-{uuid.uuid4().hex[:8]}",
                       "generation": 0, "created_at": now}])
        conn.execute(sa.update(db.resource_providers).where(
            db.resource_providers.c.root_provider_id.is_(None)).values(
            root_provider_id=db.resource_providers.c.id))
        db.mark_reload_all(conn)
    assert store.provider_graph().providers == _fresh(engine)
    store.close()
