"""Time the two store calls of one scheduling request, straight on PlacementStore (not a test).

    .venv/bin/python bench/store_hot_paths.py                       # 10,000 providers, 2,000 rounds
    .venv/bin/python bench/store_hot_paths.py --hosts 2000 --rounds 500 --runs sqlite

Each run seeds a fresh database (a temporary SQLite file, or a new PostgreSQL database that
is dropped afterwards) with N compute-node providers in bulk (VCPU, MEMORY_MB, DISK_GB, like
``bench/end_to_end.py``), builds the provider graph once, then times ``rounds`` times
``provider_graph()`` followed by ``write_allocations()`` of one new consumer on a random
provider (3 resource classes), which is what the scheduler does per request. Then, for a
quarter as many rounds, another store claims first, and ``provider_graph()`` must reload
what it changed (``inc_*``: the cost per call with a second scheduler writing).

Printed per call: median and p99 milliseconds, and SQL statements per call — every
cursor execution SQLAlchemy sees (``before_cursor_execute``, including BEGIN on SQLite)
plus the store's raw DBAPI executions (``PlacementStore._raw`` / ``_raw_many``; an
executemany counts once), plus COMMITs, plus the statements of the store's hot-path raw
connections (``PlacementStore.raw_statements``: BEGIN and COMMIT count; on PostgreSQL the
statements of one pipeline share a network round trip).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from end_to_end import _pg_database  # noqa: E402 - the sibling bench's throwaway databases

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
INVENTORY = {
    "VCPU": {"total": 32, "reserved": 0, "min_unit": 1, "max_unit": 32, "step_size": 1,
             "allocation_ratio": 16.0},
    "MEMORY_MB": {"total": 131072, "reserved": 512, "min_unit": 1, "max_unit": 131072,
                  "step_size": 1, "allocation_ratio": 1.5},
    "DISK_GB": {"total": 2000, "reserved": 0, "min_unit": 1, "max_unit": 2000, "step_size": 1,
                "allocation_ratio": 1.0},
}


def seed(url: str, hosts: int) -> None:
    """Migrate and bulk-insert ``hosts`` root providers with three inventories each."""
    from berth.placement import db as pdb

    engine = pdb.prepare(url)
    now = pdb.utcnow()
    with engine.begin() as conn:
        rc_ids = dict(conn.execute(sa.select(pdb.resource_classes.c.name,
                                             pdb.resource_classes.c.id)).all())
        conn.execute(sa.insert(pdb.resource_providers), [
            {"uuid": str(uuidlib.uuid4()), "name": f"cn{i:05d}", "generation": 1,
             "created_at": now} for i in range(hosts)])
        ids = [r[0] for r in conn.execute(sa.select(pdb.resource_providers.c.id))]
        conn.execute(sa.update(pdb.resource_providers)
                     .values(root_provider_id=pdb.resource_providers.c.id))
        conn.execute(sa.insert(pdb.inventories), [
            {"resource_provider_id": rp_id, "resource_class_id": rc_ids[rc], "created_at": now,
             **inv} for rp_id in ids for rc, inv in INVENTORY.items()])
        pdb.mark_reload_all(conn)
    engine.dispose()


class Counter:
    """Counts the statements of one store: SQLAlchemy's cursor executions and commits on its
    engine, the store's raw DBAPI calls of the general write path (``_raw``/``_raw_many``)
    and the statements of its hot-path raw connections (``raw_statements``, if present)."""

    def __init__(self, store: Any) -> None:
        from berth.placement.store import PlacementStore

        self.store = store
        self.events = 0

        def on_event(*_args: Any) -> None:
            self.events += 1

        event.listen(store.engine, "before_cursor_execute", on_event)
        event.listen(store.engine, "commit", on_event)
        for name in ("_raw", "_raw_many"):
            original = getattr(PlacementStore, name)

            def wrapped(inner: Any, *args: Any, _orig: Any = original) -> Any:
                self.events += 1
                return _orig(inner, *args)

            setattr(PlacementStore, name, wrapped)
        self.reset()

    @property
    def n(self) -> int:
        return self.events + getattr(self.store, "raw_statements", 0) - self.base

    def reset(self) -> None:
        self.events = 0
        self.base = getattr(self.store, "raw_statements", 0)


def run(name: str, url: str, hosts: int, rounds: int) -> dict[str, Any]:
    """Seed, warm up, and time ``rounds`` (provider_graph + write_allocations) pairs."""
    from berth.placement import db as pdb
    from berth.placement.store import ConsumerWrite, PlacementStore

    seed(url, hosts)
    engine = pdb.create_db_engine(url)
    store = PlacementStore(engine)
    counter = Counter(store)
    t0 = time.perf_counter()
    graph = store.provider_graph()
    full_ms = 1000 * (time.perf_counter() - t0)
    uuids = list(graph.uuids)
    rng = random.Random(1)
    resources = [("VCPU", 1), ("MEMORY_MB", 512), ("DISK_GB", 1)]

    def claim(by: Any = store) -> None:
        rp = rng.choice(uuids)
        by.write_allocations([ConsumerWrite(
            str(uuidlib.uuid4()), "project", "user", [(rp, rc, n) for rc, n in resources],
            "INSTANCE", None)], post=False)

    for _ in range(20):  # warm-up: statement caches, id caches
        store.provider_graph()
        claim()
    graph_ms, write_ms, graph_n, write_n = [], [], [], []
    perf = time.perf_counter
    for _ in range(rounds):
        counter.reset()
        t = perf()
        store.provider_graph()
        graph_ms.append(1000 * (perf() - t))
        graph_n.append(counter.n)
        counter.reset()
        t = perf()
        claim()
        write_ms.append(1000 * (perf() - t))
        write_n.append(counter.n)
    # Another writer (a second scheduler) claims before each round: the graph reloads the
    # provider it changed, and our claim may find its cached generation stale.
    other = PlacementStore(engine)
    for _ in range(5):
        claim(other)
    inc_ms, inc_n = [], []
    for _ in range(max(rounds // 4, 1)):
        claim(other)
        counter.reset()
        t = perf()
        store.provider_graph()
        inc_ms.append(1000 * (perf() - t))
        inc_n.append(counter.n)
        claim()
    # The graph a fresh store builds must equal the cached one.
    final = store.provider_graph()
    fresh = PlacementStore(engine).provider_graph()
    consistent = final.providers == fresh.providers
    for each in (store, other):
        getattr(each, "close", lambda: None)()
    engine.dispose()

    def p99(xs: list[float]) -> float:
        return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))]

    return {
        "run": name, "hosts": hosts, "rounds": rounds, "full_ms": full_ms,
        "graph_ms": statistics.median(graph_ms), "graph_p99": p99(graph_ms),
        "graph_sql": statistics.mean(graph_n),
        "write_ms": statistics.median(write_ms), "write_p99": p99(write_ms),
        "write_sql": statistics.mean(write_n), "inc_ms": statistics.median(inc_ms),
        "inc_sql": statistics.mean(inc_n), "consistent": consistent,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the selected backends and print a table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--runs", default="sqlite,pg", help="comma list of sqlite, pg")
    parser.add_argument("--pg-url", default=os.environ.get("BERTH_TEST_PG_URL", PG_ADMIN_URL))
    args = parser.parse_args(argv)
    header = True
    for name in args.runs.split(","):
        name = name.strip()
        if name == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                row = run(name, f"sqlite:///{tmp}/bench.sqlite", args.hosts, args.rounds)
        elif name == "pg":
            url, drop = _pg_database(args.pg_url)
            try:
                row = run(name, url, args.hosts, args.rounds)
            finally:
                drop()
        else:
            parser.error(f"--runs: unknown run {name!r}")
        print(_format(row, header), flush=True)
        header = False
    return 0


def _format(row: dict[str, Any], header: bool) -> str:
    cols = [("run", "{}"), ("hosts", "{}"), ("rounds", "{}"), ("full_ms", "{:.0f}"),
            ("graph_ms", "{:.3f}"), ("graph_p99", "{:.3f}"), ("graph_sql", "{:.1f}"),
            ("write_ms", "{:.3f}"), ("write_p99", "{:.3f}"), ("write_sql", "{:.1f}"),
            ("inc_ms", "{:.3f}"), ("inc_sql", "{:.1f}"), ("consistent", "{}")]
    lines = ["  ".join(f"{c:>10}" for c, _ in cols)] if header else []
    lines.append("  ".join(f"{fmt.format(row[c]):>10}" for c, fmt in cols))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
