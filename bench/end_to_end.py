"""Benchmark the full scheduling path through the resource store (not a test).

    .venv/bin/python bench/end_to_end.py                         # 10,000 hosts, 10,000 requests
    .venv/bin/python bench/end_to_end.py --hosts 2000 --requests 2000 --runs sqlite,pg1
    .venv/bin/python bench/end_to_end.py --pg-url postgresql+psycopg://postgres@127.0.0.1/test

Each run gets a fresh database (a temporary SQLite file, or a new PostgreSQL database that
is dropped afterwards), seeds N compute nodes (32 vCPU, 128 GiB, 2 TB, no cells or
aggregates), then fires single-instance requests of
three flavors through :class:`~berth.service.scheduler.SchedulerService` with the default
filters and weighers: request filters -> GET /allocation_candidates (1.36, limit 1000) ->
CandidateSet -> filters -> weighers -> claim (PUT /allocations) -> alternates. As in
``berth serve``, the scheduler calls the store in its own process (LocalPlacement: the
API's semantics without JSON); runs named ``...-api`` go through the Placement API's WSGI
app instead, for comparison.

Seeding writes the providers, inventories and compute records in bulk with SQL (the
agent path — one provider and several API calls per host — would dominate the run at
10,000 hosts); everything timed goes through the public path. Runs: ``sqlite`` (one
process), ``pg1`` / ``pg4`` (PostgreSQL with 1 or 4 scheduler processes sharing the
requests). Printed: placements/s over the whole run and p50/p99 request latency.

The hosts do not report during the run and host states are fresh for every request, as
in Nova 34, so every host weighs the same and each scheduler fills the first host of its
own tie order before the next (placement's answer drops a full host); several processes
start on different hosts, as Nova's do. ``--option
filter_scheduler.consume_between_reports=true`` times Berth's opt-in spreading between
reports instead.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from typing import Any

import sqlalchemy as sa

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
FLAVORS = [("m1.tiny", 1, 512, 1), ("m1.small", 1, 2048, 20), ("m1.medium", 2, 4096, 40)]


def seed(url: str, hosts: int) -> None:
    """Migrate the database and bulk-insert ``hosts`` compute nodes (providers,
    inventories, compute records)."""
    from berth.config import SchedulerConfig
    from berth.placement import db as pdb
    from berth.service.compute import ComputeAgent, ComputeNodeSpec, inventories_for
    from berth.service.records import (
        ComputeRecordStore,
        compute_nodes,
        record_counter,
        record_to_report,
    )

    config = SchedulerConfig.default()
    engine = pdb.prepare(url)
    records = ComputeRecordStore(engine)
    now = pdb.utcnow()
    clock = time.time()
    nodes = [ComputeNodeSpec(host=f"cn{i:05d}", vcpus=32, memory_mb=131072, local_gb=2000)
             for i in range(hosts)]
    with engine.begin() as conn:
        rc_ids = dict(conn.execute(sa.select(pdb.resource_classes.c.name,
                                             pdb.resource_classes.c.id)).all())
        conn.execute(sa.insert(pdb.resource_providers), [
            {"uuid": n.uuid, "name": n.host, "generation": 1, "created_at": now} for n in nodes])
        ids = dict(conn.execute(sa.select(pdb.resource_providers.c.uuid,
                                          pdb.resource_providers.c.id)).all())
        conn.execute(sa.update(pdb.resource_providers)
                     .values(root_provider_id=pdb.resource_providers.c.id))
        rows = []
        for n in nodes:
            for rc, inv in inventories_for(n, config).items():
                rows.append({"resource_provider_id": ids[n.uuid], "resource_class_id": rc_ids[rc],
                             "created_at": now, **inv})
        conn.execute(sa.insert(pdb.inventories), rows)
        pdb.mark_reload_all(conn)
        seq = int(conn.execute(sa.update(record_counter).values(seq=record_counter.c.seq + 1)
                               .returning(record_counter.c.seq)).scalar_one())
        reports = []
        for n in nodes:
            agent = ComputeAgent(n, client=None, records=records, config=config)  # type: ignore[arg-type]
            agent.created_at = clock
            reports.append({"uuid": n.uuid, "host": n.host, "nodename": n.host, "heartbeat": clock,
                            "seq": seq, "report": json.dumps(record_to_report(
                                agent.host_record(clock)), default=str)})
        conn.execute(sa.insert(compute_nodes), reports)
    # A bulk load outruns autovacuum, which would analyze these tables within a minute
    # in a real cloud; without statistics PostgreSQL may scan every provider per read.
    # The allocation and consumer tables stay unanalyzed: stamped empty now, the
    # planner would keep scanning them whole while the run fills them.
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(
                f"ANALYZE resource_providers, inventories, {compute_nodes.name}"))
    engine.dispose()


def worker(
    url: str, index: int, count: int, queue: Any, through_api: bool = False,
    options: tuple[tuple[str, str, str], ...] = (),
) -> None:
    """Open a stack on ``url`` and run ``count`` requests; report latencies."""
    from berth.config import SchedulerConfig
    from berth.errors import NoValidHost
    from berth.model.request import Flavor, RequestSpec
    from berth.placement.db import create_db_engine
    from berth.service.stack import open_stack

    # Hosts do not report during the run; keep them "up" however long it lasts.
    config = SchedulerConfig.default().replace("DEFAULT", service_down_time=86400)
    for group, name, value in options:
        config = config.replace(group, **{name: value})
    stack = open_stack(url, config, engine=create_db_engine(url), through_api=through_api)
    service = stack.scheduler(seed=index)
    flavors = [Flavor(name=n, vcpus=v, memory_mb=m, root_gb=d, id=i)
               for i, (n, v, m, d) in enumerate(FLAVORS)]
    service.feed.refresh()
    # Warm-up: the first request loads the provider graph and the snapshot.
    service.select_destinations(RequestSpec(flavor=flavors[0], project_id="p", user_id="u"),
                                service.new_instance_uuids(1))
    queue.put(("ready", index))
    latencies: list[float] = []
    failures = 0
    for i in range(count):
        spec = RequestSpec(flavor=flavors[(i + index) % len(flavors)], project_id="p", user_id="u")
        started = time.perf_counter()
        try:
            # Named by the caller, as Nova's API names instances before scheduling them.
            service.select_destinations(spec, service.new_instance_uuids(spec.num_instances))
        except NoValidHost:
            failures += 1
        latencies.append(time.perf_counter() - started)
    queue.put(("done", {"latencies": latencies, "failures": failures,
                        "claims": service.claimer.stats.as_dict(), "end": time.time()}))
    stack.close()


def run(
    name: str, url: str, hosts: int, requests: int, processes: int, through_api: bool = False,
    options: tuple[tuple[str, str, str], ...] = (),
) -> dict[str, Any]:
    """Seed a fresh database and time ``requests`` requests over ``processes`` workers."""
    t0 = time.perf_counter()
    seed(url, hosts)
    seeded = time.perf_counter() - t0
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    share = [requests // processes + (1 if i < requests % processes else 0)
             for i in range(processes)]
    procs = [ctx.Process(target=worker, args=(url, i, share[i], queue, through_api, options))
             for i in range(processes)]
    for p in procs:
        p.start()
    ready = 0
    while ready < processes:
        kind, _ = queue.get(timeout=1800)
        ready += kind == "ready"
    start = time.time()
    results = []
    while len(results) < processes:
        kind, value = queue.get(timeout=7200)
        if kind == "done":
            results.append(value)
    end = max(r["end"] for r in results)
    for p in procs:
        p.join(timeout=60)
    latencies = sorted(x for r in results for x in r["latencies"])
    done = len(latencies) - sum(r["failures"] for r in results)
    return {
        "run": name, "hosts": hosts, "requests": requests, "processes": processes,
        "seed_s": seeded, "placed": done, "rate": done / (end - start),
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "retries": sum(r["claims"]["conflict_retries"] for r in results),
        "refusals": sum(r["claims"]["refusals"] for r in results),
    }


def _pg_database(admin_url: str) -> tuple[str, Any]:
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"berth_bench_{uuidlib.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name})
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()

    return admin_url.rsplit("/", 1)[0] + f"/{name}", drop


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10000)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--runs", default="sqlite,pg1,pg4",
                        help="comma list of sqlite, pg1, pg4 (default), and the same with "
                             "-api (sqlite-api, pg1-api, pg4-api): schedulers go through the "
                             "Placement API's WSGI app instead of calling the store")
    parser.add_argument("--option", action="append", default=[], metavar="GROUP.NAME=VALUE",
                        help="a nova.conf option for the schedulers, e.g. "
                             "filter_scheduler.shuffle_best_same_weighed_hosts=true "
                             "(repeatable)")
    parser.add_argument("--pg-url", default=os.environ.get("BERTH_TEST_PG_URL", PG_ADMIN_URL))
    args = parser.parse_args(argv)
    options = []
    for text in args.option:
        key, eq, value = text.partition("=")
        group, dot, option = key.rpartition(".")
        if not eq or not dot:
            parser.error(f"--option {text!r}: expected GROUP.NAME=VALUE")
        options.append((group, option, value))
    rows = []
    for name in args.runs.split(","):
        name = name.strip()
        kind, _, api = name.partition("-")
        if api not in ("", "api"):
            parser.error(f"--runs: unknown run {name!r}")
        if kind == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(run(name, f"sqlite:///{tmp}/bench.sqlite", args.hosts,
                                args.requests, 1, through_api=bool(api),
                                options=tuple(options)))
        elif kind in ("pg1", "pg4"):
            url, drop = _pg_database(args.pg_url)
            try:
                rows.append(run(name, url, args.hosts, args.requests, int(kind[2:]),
                                through_api=bool(api), options=tuple(options)))
            finally:
                drop()
        else:
            parser.error(f"--runs: unknown run {name!r}")
        print(_format([rows[-1]], header=len(rows) == 1), flush=True)
    return 0


def _format(rows: list[dict[str, Any]], header: bool = True) -> str:
    cols = [("run", "{}"), ("hosts", "{}"), ("requests", "{}"), ("processes", "{}"),
            ("placed", "{}"), ("rate", "{:.1f}/s"), ("p50_ms", "{:.1f}"), ("p99_ms", "{:.1f}"),
            ("retries", "{}"), ("refusals", "{}"), ("seed_s", "{:.1f}")]
    lines = ["  ".join(f"{c:>10}" for c, _ in cols)] if header else []
    for row in rows:
        lines.append("  ".join(f"{fmt.format(row[c]):>10}" for c, fmt in cols))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
