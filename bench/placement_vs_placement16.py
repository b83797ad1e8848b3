"""Berth's Placement API beside the real Placement 16, in the same run, through HTTP.

    make placement-env        # the real Placement's own environment (never imported)
    .venv/bin/python bench/placement_vs_placement16.py --sizes 1000 5000
    .venv/bin/python bench/placement_vs_placement16.py --db postgresql+psycopg://postgres@127.0.0.1:5432/test

Both servers start fresh (SQLite files, or Berth on the PostgreSQL URL given) with the
same PYTHONHASHSEED. One client writes the same fleet into each, one request at a time,
timing every write by kind: POST /resource_providers, PUT inventories (VCPU 32 at ratio
4.0, MEMORY_MB 128 GiB, DISK_GB 2 TB), PUT traits (every 2nd provider HW_CPU_X86_AVX2),
PUT aggregates (every 3rd in one aggregate), PUT allocations (every 4th provider gets a
consumer). Then it times GET /allocation_candidates (p50 / p99 over --repeat runs):

* ``full``:     resources=VCPU:1,MEMORY_MB:256,DISK_GB:10&limit=1000
* ``filtered``: the same plus member_of=<agg>&required=HW_CPU_X86_AVX2

and checks that both answer the same requests (the same list when ``limit`` cuts the
answer, as the hash seeds agree; the same set otherwise). The p99 of a query includes
its first run, which builds the candidate engine's snapshot after the writes. Not a test: it prints a table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from peers import placement as peer  # noqa: E402

HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}
SEED = 0


def _start_berth(workdir: Path, db: str | None) -> tuple[subprocess.Popen[bytes], str]:
    port = peer.free_port()
    log = workdir / "berth.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "berth.cli", "placement", "serve", "--auth-strategy",
             "noauth2", "--port", str(port), "--db", db or f"sqlite:///{workdir}/berth.sqlite"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONHASHSEED": str(SEED)})
    url = f"http://127.0.0.1:{port}"
    peer.wait_up(url + "/", proc, log)
    return proc, url


def _load(url: str, size: int, nested: bool) -> dict[str, list[float]]:
    """Write the fleet; seconds per write, by kind."""
    kinds = ("provider", "inventory", "traits", "aggregates", "allocation")
    if nested:
        kinds = ("provider", "inventory", "child provider", "child inventory", "traits",
                 "aggregates")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    agg = str(uuidlib.UUID(int=1))
    with httpx.Client(base_url=url, headers=HEADERS, timeout=120) as http:

        def timed(kind: str, method: str, path: str, body: Any) -> Any:
            started = time.perf_counter()
            resp = http.request(method, path, json=body)
            times[kind].append(time.perf_counter() - started)
            assert resp.status_code in (200, 201, 204), (path, resp.status_code, resp.text)
            return resp.json() if resp.content else None

        for i in range(size):
            u = str(uuidlib.UUID(int=i + 1000))
            timed("provider", "POST", "/resource_providers", {"uuid": u, "name": f"cn{i:05d}"})
            root_inventory = {"DISK_GB": {"total": 2000}} if nested else {
                "VCPU": {"total": 32, "allocation_ratio": 4.0},
                "MEMORY_MB": {"total": 131072}, "DISK_GB": {"total": 2000}}
            gen = timed("inventory", "PUT", f"/resource_providers/{u}/inventories", {
                "resource_provider_generation": 0, "inventories": root_inventory}
            )["resource_provider_generation"]
            if i % 2 == 0:
                gen = timed("traits", "PUT", f"/resource_providers/{u}/traits", {
                    "resource_provider_generation": gen, "traits": ["HW_CPU_X86_AVX2"]}
                )["resource_provider_generation"]
            if i % 3 == 0:
                timed("aggregates", "PUT", f"/resource_providers/{u}/aggregates", {
                    "resource_provider_generation": gen, "aggregates": [agg]})
            if nested:
                # Two NUMA children holding the CPUs and memory; the root keeps the disk.
                for cell in range(2):
                    c = str(uuidlib.UUID(int=(i + 1000) * 4 + cell + 10**9))
                    timed("child provider", "POST", "/resource_providers", {
                        "uuid": c, "name": f"cn{i:05d}_numa{cell}", "parent_provider_uuid": u})
                    timed("child inventory", "PUT", f"/resource_providers/{c}/inventories", {
                        "resource_provider_generation": 0, "inventories": {
                            "VCPU": {"total": 16, "allocation_ratio": 4.0},
                            "MEMORY_MB": {"total": 65536}}})
            if i % 4 == 0 and not nested:
                timed("allocation", "PUT", f"/allocations/{uuidlib.UUID(int=i + 10**6)}", {
                    "allocations": {u: {"resources": {"VCPU": 2, "MEMORY_MB": 4096}}},
                    "project_id": "p", "user_id": "u", "consumer_generation": None,
                    "consumer_type": "INSTANCE"})
    return times


QUERIES = {
    "full": "resources=VCPU:1,MEMORY_MB:256,DISK_GB:10&limit=1000",
    "filtered": f"resources=VCPU:1,MEMORY_MB:256,DISK_GB:10&limit=1000&member_of="
                f"{uuidlib.UUID(int=1)}&required=HW_CPU_X86_AVX2",
}
#: On the nested fleet: the unnumbered group spread over root and NUMA children, and
#: Nova's form for a NUMA guest (one numbered group per guest cell, isolated).
NESTED_QUERIES = {
    "nested": "resources=VCPU:1,MEMORY_MB:256,DISK_GB:10&limit=1000",
    "nested granular": "resources=DISK_GB:10&resources1=VCPU:2,MEMORY_MB:1024&"
                       "resources2=VCPU:2,MEMORY_MB:1024&group_policy=isolate&limit=1000",
}


def _query(url: str, query: str, repeat: int) -> tuple[list[float], Any]:
    times = []
    body = None
    with httpx.Client(base_url=url, headers=HEADERS, timeout=120) as http:
        for _ in range(repeat):
            started = time.perf_counter()
            resp = http.get("/allocation_candidates?" + query)
            times.append(time.perf_counter() - started)
            assert resp.status_code == 200, resp.text
            body = resp.json()
    return times, body


def _same(ours: list[Any], theirs: list[Any], truncated: bool) -> bool:
    """The same requests: in the same order when ``limit`` cut the answer (Berth keeps
    Placement's order then), as sets otherwise (Berth answers in provider order)."""
    key = [sorted((u, sorted(a["resources"].items())) for u, a in r["allocations"].items())
           for r in ours]
    other = [sorted((u, sorted(a["resources"].items())) for u, a in r["allocations"].items())
             for r in theirs]
    return key == other if truncated else sorted(key) == sorted(other)


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--nested", action="store_true",
                        help="each compute node a tree: the root with the disk, two NUMA "
                             "children with the CPUs and memory (no allocations)")
    parser.add_argument("--db", help="Berth's database URL (default a fresh SQLite file); "
                                     "the real Placement always runs on SQLite")
    args = parser.parse_args()
    why = peer.available()
    if why:
        print(why, file=sys.stderr)
        return 2
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
          f"{os.getloadavg()[0]:.2f}, Berth on {'PostgreSQL' if args.db else 'SQLite'}")
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            real = peer.Placement(Path(tmp) / "real", hash_seed=SEED).start()
            berth, berth_url = _start_berth(Path(tmp), args.db)
            try:
                rows = []
                writes = {"placement16": _load(real.url, size, args.nested),
                          "berth": _load(berth_url, size, args.nested)}
                for kind in writes["berth"]:
                    a, b = writes["placement16"][kind], writes["berth"][kind]
                    rows.append((f"write {kind}", _ms(a, 0.5), _ms(a, 0.99), _ms(b, 0.5),
                                 _ms(b, 0.99)))
                for name, query in (NESTED_QUERIES if args.nested else QUERIES).items():
                    a, ours = _query(real.url, query, args.repeat)
                    b, theirs = _query(berth_url, query, args.repeat)
                    same = _same(ours["allocation_requests"], theirs["allocation_requests"],
                                 truncated=len(ours["allocation_requests"]) == 1000
                                 and (size > 1000 or args.nested))
                    rows.append((f"candidates {name} ({len(ours['allocation_requests'])}"
                                 f"{', same' if same else ', DIFFERENT'})",
                                 _ms(a, 0.5), _ms(a, 0.99), _ms(b, 0.5), _ms(b, 0.99)))
                print(f"\n## {size} {'compute nodes (trees of 3 providers)' if args.nested else 'providers'}\n")
                print("| operation | Placement 16 p50 | p99 | Berth p50 | p99 | speed-up (p50) |")
                print("|---|---|---|---|---|---|")
                for label, ap50, ap99, bp50, bp99 in rows:
                    print(f"| {label} | {ap50:.1f} ms | {ap99:.1f} ms | {bp50:.1f} ms | "
                          f"{bp99:.1f} ms | {ap50 / bp50:.1f}x |")
                total = {k: sum(sum(v) for v in w.values()) for k, w in writes.items()}
                print(f"\nwhole load: Placement 16 {total['placement16']:.1f} s, Berth "
                      f"{total['berth']:.1f} s ({sum(len(v) for v in writes['berth'].values())} "
                      "writes each)")
            finally:
                berth.terminate()
                berth.wait(timeout=30)
                real.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
