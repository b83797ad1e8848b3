"""Benchmark GET /allocation_candidates: in-process engine and over HTTP.

    .venv/bin/python bench/placement_candidates.py                  # engine + HTTP, 1k and 10k
    .venv/bin/python bench/placement_candidates.py --sizes 1000 --no-http
    .venv/bin/python bench/placement_candidates.py --db postgresql+psycopg://postgres@127.0.0.1/test

Fleet: N compute nodes with VCPU (32, ratio 4.0), MEMORY_MB (128 GiB) and DISK_GB (2 TB);
every 2nd has trait HW_CPU_X86_AVX2, every 3rd is in one aggregate; every 4th carries an
allocation. Queries timed (p50 / p99 over --repeat runs):

* ``full``:     resources=VCPU:1,MEMORY_MB:256,DISK_GB:10   (every provider is a candidate)
* ``filtered``: the same plus member_of=<agg>&required=HW_CPU_X86_AVX2

The HTTP part starts ``python -m berth.placement serve`` on a free port with a fresh
database, populates it through the API with a few client threads (provider creation is
timed too), then times the queries through the real server. Not a test: it prints a table.
Reference: Placement 16 takes ~100-140 ms at 1,000 providers and 430-540 ms at 5,000.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx

from berth.placement.candidates import allocation_candidates, allocation_candidates_json
from berth.placement.candidates_builders import GraphBuilder, inv
from berth.placement.candidates_graph import Provider, ProviderGraph
from berth.placement.client import PlacementClient

AGG = "5e1d3c3a-1b7c-4a8e-9a57-3f1f0c8e2b11"
TRAIT = "HW_CPU_X86_AVX2"
FULL = {"resources": ["VCPU:1,MEMORY_MB:256,DISK_GB:10"]}
FILTERED = {**FULL, "member_of": [AGG], "required": [TRAIT]}
MV = (1, 39)


def fleet(n: int) -> list[dict[str, Any]]:
    """The benchmark fleet as plain data (shared by the in-process and HTTP runs)."""
    rows = []
    for i in range(n):
        rows.append(
            {
                "uuid": str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"bench-cn-{i}")),
                "name": f"cn{i:05d}",
                "traits": [TRAIT] if i % 2 == 0 else [],
                "aggregates": [AGG] if i % 3 == 0 else [],
                "used": {"VCPU": 4, "MEMORY_MB": 8192, "DISK_GB": 40} if i % 4 == 0 else {},
            }
        )
    return rows


INVENTORY = {
    "VCPU": {"total": 32, "allocation_ratio": 4.0},
    "MEMORY_MB": {"total": 131072, "reserved": 512},
    "DISK_GB": {"total": 2000},
}


def build_graph(rows: list[dict[str, Any]]) -> ProviderGraph:
    b = GraphBuilder()
    invs = {rc: inv(**spec) for rc, spec in INVENTORY.items()}
    for r in rows:
        b.provider(
            r["name"],
            uuid=r["uuid"],
            used=r["used"],
            traits=r["traits"],
            aggregates=r["aggregates"],
            **invs,
        )
    return b.graph()


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p99 * 1000


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    fn()  # warm caches (graph summaries, JIT-free but import-heavy paths)
    samples = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - t0)
    return samples, result


def bench_engine(n: int, repeat: int, table: list[tuple[str, ...]]) -> None:
    rows = fleet(n)
    built = build_graph(rows)
    # Time the constructor alone (the store rebuilds the graph after every change).
    samples, graph = timed(
        lambda: ProviderGraph(built.providers, built.known_traits, list(built.class_id)), 5
    )
    p50, p99 = percentiles(samples)
    table.append((f"engine {n}", "ProviderGraph build", f"{p50:.1f}", f"{p99:.1f}", ""))
    # A claim on one provider: patch the graph instead of rebuilding it, then query.
    first = graph.providers[0]
    claimed = Provider(
        first.uuid,
        first.name,
        first.generation + 1,
        first.parent_uuid,
        first.root_uuid,
        first.inventories,
        {"VCPU": 8, "MEMORY_MB": 4096, "DISK_GB": 20},
        first.traits,
        first.aggregates,
    )
    allocation_candidates_json(graph, FULL, MV)
    samples, _ = timed(lambda: graph.with_updates([claimed]), repeat)
    p50, p99 = percentiles(samples)
    table.append((f"engine {n}", "with_updates (1 claim)", f"{p50:.2f}", f"{p99:.2f}", ""))
    samples, _ = timed(
        lambda: allocation_candidates_json(graph.with_updates([claimed]), FULL, MV), repeat
    )
    p50, p99 = percentiles(samples)
    table.append(
        (f"engine {n}", "with_updates + full (json bytes)", f"{p50:.2f}", f"{p99:.2f}", "")
    )
    for label, query in (("full", FULL), ("filtered", FILTERED)):
        samples, body = timed(lambda q=query: allocation_candidates(graph, q, MV), repeat)
        p50, p99 = percentiles(samples)
        count = str(len(body["allocation_requests"]))
        table.append((f"engine {n}", f"{label} (dict)", f"{p50:.2f}", f"{p99:.2f}", count))
        samples, raw = timed(lambda q=query: allocation_candidates_json(graph, q, MV), repeat)
        p50, p99 = percentiles(samples)
        table.append((f"engine {n}", f"{label} (json bytes)", f"{p50:.2f}", f"{p99:.2f}", count))


def bench_engine_nested(n: int, repeat: int, table: list[tuple[str, ...]]) -> None:
    """N providers as N/3 compute roots (DISK_GB) with two NUMA children (VCPU, MEMORY_MB):
    the general (multi-provider) path, 4 candidates per tree."""
    b = GraphBuilder()
    for i in range(n // 3):
        root = b.provider(f"cn{i}", DISK_GB=inv(2000))
        for k in range(2):
            b.provider(
                f"cn{i}-numa{k}",
                parent=root,
                used={"VCPU": k},
                VCPU=inv(16, allocation_ratio=4.0),
                MEMORY_MB=inv(65536),
            )
    graph = b.graph()
    samples, raw = timed(lambda: allocation_candidates_json(graph, FULL, MV), max(3, repeat // 5))
    p50, p99 = percentiles(samples)
    count = str(raw.count(b'"allocations"'))
    table.append((f"engine {n}", "nested full (json bytes)", f"{p50:.2f}", f"{p99:.2f}", count))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(db: str | None) -> Iterator[str]:
    """A fresh ``berth.placement serve`` process; yields its base URL."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        url = db or f"sqlite:///{os.path.join(tmp, 'bench.sqlite')}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "berth.placement", "serve", "--auth-strategy", "noauth2", "--db", url, "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(base + "/", timeout=1.0)
                    break
                except httpx.HTTPError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        err = proc.stderr.read().decode() if proc.stderr else ""
                        raise RuntimeError(f"placement server did not start: {err}") from None
                    time.sleep(0.1)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def populate(base: str, rows: list[dict[str, Any]], threads: int) -> dict[str, float]:
    """Create the fleet through the API; returns rates per step (providers per second)."""
    clients = [PlacementClient(base) for _ in range(threads)]
    chunks = [rows[i::threads] for i in range(threads)]
    gens: dict[str, int] = {}

    def run(step: Callable[[PlacementClient, dict[str, Any]], None]) -> float:
        def worker(k: int) -> None:
            for r in chunks[k]:
                step(clients[k], r)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(worker, range(threads)))
        return len(rows) / (time.perf_counter() - t0)

    def create(c: PlacementClient, r: dict[str, Any]) -> None:
        gens[r["uuid"]] = c.create_provider(r["name"], uuid=r["uuid"]).generation

    def inventory(c: PlacementClient, r: dict[str, Any]) -> None:
        gens[r["uuid"]] = c.set_inventories(r["uuid"], gens[r["uuid"]], INVENTORY)

    def traits_and_aggs(c: PlacementClient, r: dict[str, Any]) -> None:
        if r["traits"]:
            gens[r["uuid"]] = c.set_provider_traits(r["uuid"], gens[r["uuid"]], r["traits"])
        if r["aggregates"]:
            gens[r["uuid"]] = c.set_aggregates(r["uuid"], gens[r["uuid"]], r["aggregates"])

    def allocate(c: PlacementClient, r: dict[str, Any]) -> None:
        if r["used"]:
            consumer = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "consumer-" + r["uuid"]))
            c.put_allocations(
                consumer,
                {r["uuid"]: r["used"]},
                project_id="bench",
                user_id="bench",
                consumer_generation=None,
            )

    rates = {
        "POST /resource_providers": run(create),
        "PUT inventories": run(inventory),
        "PUT traits + aggregates": run(traits_and_aggs),
        "PUT allocations": run(allocate),
    }
    for c in clients:
        c.close()
    return rates


def bench_http(
    n: int,
    repeat: int,
    db: str | None,
    threads: int,
    table: list[tuple[str, ...]],
    populated: bool = False,
) -> None:
    rows = fleet(n)
    with server(db) as base:
        # With ``populated`` the database already holds this fleet (an earlier --db run).
        if not populated:
            t0 = time.perf_counter()
            rates = populate(base, rows, threads)
            total = time.perf_counter() - t0
            for step, rate in rates.items():
                table.append((f"http {n}", f"{step} ({threads} threads)", f"{rate:.0f}/s", "", ""))
            table.append(
                (f"http {n}", "whole fleet set-up", f"{n / total:.0f} providers/s", "", "")
            )
        headers = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}
        with PlacementClient(base) as client, httpx.Client(base_url=base, headers=headers) as raw:
            for label, query in (("full", FULL), ("filtered", FILTERED)):
                params = {k: v[0] for k, v in query.items()}
                first_t0 = time.perf_counter()
                client.allocation_candidates(params)  # includes the ProviderGraph build
                first_ms = (time.perf_counter() - first_t0) * 1000
                samples, body = timed(lambda p=params: client.allocation_candidates(p), repeat)
                p50, p99 = percentiles(samples)
                count = str(len(body["allocation_requests"]))
                table.append(
                    (f"http {n}", f"{label} (client, parsed)", f"{p50:.2f}", f"{p99:.2f}", count)
                )
                samples, _ = timed(
                    lambda p=params: raw.get("/allocation_candidates", params=p), repeat
                )
                p50, p99 = percentiles(samples)
                table.append(
                    (f"http {n}", f"{label} (raw bytes)", f"{p50:.2f}", f"{p99:.2f}", count)
                )
                table.append(
                    (f"http {n}", f"{label}: first call (graph build)", f"{first_ms:.1f}", "", "")
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--no-http", action="store_true", help="only time the engine in-process")
    parser.add_argument(
        "--db", default=None, help="database URL for the server (default: temp SQLite)"
    )
    parser.add_argument("--threads", type=int, default=4, help="client threads for populating")
    parser.add_argument(
        "--populated",
        action="store_true",
        help="--db already holds the fleet of the (single) size given: only time queries",
    )
    args = parser.parse_args(argv)

    table: list[tuple[str, ...]] = []
    for n in args.sizes:
        bench_engine(n, args.repeat, table)
        bench_engine_nested(n, args.repeat, table)
    if not args.no_http:
        for n in args.sizes:
            bench_http(n, args.repeat, args.db, args.threads, table, args.populated)

    header = ("run", "what", "p50 ms", "p99 ms", "candidates")
    widths = [max(len(str(row[i])) for row in [header, *table]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *table]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
