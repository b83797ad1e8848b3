"""Racing writers: several client processes against two server processes on one database.

Generation checks are compare-and-swap in SQL, so of N writers holding the same provider
generation exactly one wins, and concurrent claims never push usage past capacity.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from placement.support import Api, Server, start_server

WRITERS = 6


def _race(args: tuple[str, str, str, dict[str, Any], Any]) -> int:
    """One writer: wait for the barrier, send the request, return the status."""
    base, method, path, body, barrier = args
    with httpx.Client(base_url=base, timeout=60) as http:
        headers = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}
        http.get("/", headers=headers)  # open the connection before the start line
        barrier.wait()
        return http.request(method, path, json=body, headers=headers).status_code


def race(
    bases: list[str], method: str, paths_bodies: list[tuple[str, dict[str, Any]]]
) -> list[int]:
    """Run one request per entry in its own process, all released together."""
    ctx = mp.get_context("fork")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(len(paths_bodies))
        jobs = [
            (bases[i % len(bases)], method, path, body, barrier)
            for i, (path, body) in enumerate(paths_bodies)
        ]
        with ctx.Pool(len(jobs)) as pool:
            return pool.map(_race, jobs)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def two_servers(request: pytest.FixtureRequest) -> Iterator[list[Server]]:
    """The session server of each database plus a 2-process server on the same data."""
    first = request.getfixturevalue("server" if request.param == "sqlite" else "pg_server")
    second = start_server(first.db, "--workers", "2")
    yield [first, second]
    second.stop()


def test_exactly_one_inventory_writer_wins(two_servers: list[Server]) -> None:
    api = Api(two_servers[0].url)
    rp = api.provider(VCPU=1)
    gen = api.generation(rp)
    jobs = [
        (
            f"/resource_providers/{rp}/inventories",
            {"resource_provider_generation": gen, "inventories": {"VCPU": {"total": 10 + i}}},
        )
        for i in range(WRITERS)
    ]
    statuses = race([s.url for s in two_servers], "PUT", jobs)
    assert sorted(statuses) == [200] + [409] * (WRITERS - 1)
    assert api.generation(rp) == gen + 1


def test_exactly_one_trait_writer_wins(two_servers: list[Server]) -> None:
    api = Api(two_servers[0].url)
    rp = api.provider()
    traits = [
        "HW_CPU_X86_AVX",
        "HW_CPU_X86_AVX2",
        "HW_CPU_X86_SSE",
        "HW_CPU_X86_SSE2",
        "HW_CPU_X86_MMX",
        "HW_CPU_X86_VMX",
    ]
    jobs = [
        (
            f"/resource_providers/{rp}/traits",
            {"traits": [traits[i]], "resource_provider_generation": 0},
        )
        for i in range(WRITERS)
    ]
    statuses = race([s.url for s in two_servers], "PUT", jobs)
    assert sorted(statuses) == [200] + [409] * (WRITERS - 1)


def test_one_new_inventory_class_posted_by_many_writers_is_created_once(
        two_servers: list[Server]) -> None:
    """POST of the same new class by racing writers: one 201, the others Placement's
    409 (on PostgreSQL the loser met the unique key and answered 500)."""
    api = Api(two_servers[0].url)
    for _ in range(3):
        rp = api.provider(VCPU=1)
        gen = api.generation(rp)
        jobs = [(f"/resource_providers/{rp}/inventories",
                 {"resource_class": "DISK_GB", "total": 10, "resource_provider_generation": gen})
                for _ in range(WRITERS)]
        statuses = race([s.url for s in two_servers], "POST", jobs)
        assert sorted(statuses) == [201] + [409] * (WRITERS - 1)


def test_one_new_trait_put_by_many_writers_is_created_by_one(two_servers: list[Server]) -> None:
    """PUT /traits/{name} by racing writers: 201 for the one that created it, 204 for
    the others (Placement's TraitExists), never several 201s."""
    for _ in range(3):
        name = f"CUSTOM_RACE_{uuid.uuid4().hex[:10].upper()}"
        statuses = race([s.url for s in two_servers], "PUT",
                        [(f"/traits/{name}", {}) for _ in range(WRITERS)])
        assert sorted(statuses) == [201] + [204] * (WRITERS - 1)


def test_claims_never_exceed_capacity(two_servers: list[Server]) -> None:
    api = Api(two_servers[0].url)
    capacity = 3
    rp = api.provider(VCPU=capacity)
    jobs = [
        (
            f"/allocations/{uuid.uuid4()}",
            {
                "allocations": {rp: {"resources": {"VCPU": 1}}},
                "project_id": "p",
                "user_id": "u",
                "consumer_generation": None,
                "consumer_type": "INSTANCE",
            },
        )
        for _ in range(WRITERS)
    ]
    statuses = race([s.url for s in two_servers], "PUT", jobs)
    assert statuses.count(204) == capacity
    assert statuses.count(409) == WRITERS - capacity
    assert api.get(f"/resource_providers/{rp}/usages").json()["usages"] == {"VCPU": capacity}


def test_one_new_consumer_claimed_by_many_writers_once(two_servers: list[Server]) -> None:
    api = Api(two_servers[0].url)
    rp = api.provider(VCPU=100)
    consumer = str(uuid.uuid4())
    body = {
        "allocations": {rp: {"resources": {"VCPU": 1}}},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": None,
        "consumer_type": "INSTANCE",
    }
    statuses = race(
        [s.url for s in two_servers], "PUT", [(f"/allocations/{consumer}", body)] * WRITERS
    )
    assert statuses.count(204) == 1
    assert statuses.count(409) == WRITERS - 1
    got = api.get(f"/allocations/{consumer}", mv="1.39").json()
    assert got["consumer_generation"] == 1
    assert api.get(f"/resource_providers/{rp}/usages").json()["usages"] == {"VCPU": 1}


def _claim_and_compare(args: tuple[str, list[str], int, Any]) -> bool:
    """Claim, move and release on random providers, refreshing the cached graph as we go
    (other processes' allocation writes reach it as usage deltas in the change log); after
    every process is done, the cache must equal a graph built from scratch."""
    import random

    from berth.placement import db, errors
    from berth.placement.store import ConsumerWrite, PlacementStore

    url, uuids, seed, barrier = args
    store = PlacementStore(db.create_db_engine(url))
    rnd = random.Random(seed)
    store.provider_graph()
    held: dict[str, int] = {}  # consumer -> generation
    for step in range(80):
        kind = rnd.choice(["claim", "claim", "claim", "move", "release", "pair"])
        with contextlib.suppress(errors.PlacementError):
            if kind == "move" and held:
                consumer = rnd.choice(sorted(held))
                write = ConsumerWrite(consumer, "p", "u", [(rnd.choice(uuids), "VCPU", 2)], "X",
                                      held[consumer])
                store.write_allocations([write], post=False)
                held[consumer] += 1
            elif kind == "release" and held:
                consumer = rnd.choice(sorted(held))
                del held[consumer]
                store.delete_consumer_allocations(consumer)
            elif kind == "pair":
                pair = [str(uuid.uuid4()), str(uuid.uuid4())]
                store.write_allocations(
                    [ConsumerWrite(c, "p", "u", [(rnd.choice(uuids), "VCPU", 1)], "X", None)
                     for c in pair],
                    post=True,
                )
                held.update(dict.fromkeys(pair, 1))
            else:
                consumer = str(uuid.uuid4())
                write = ConsumerWrite(consumer, "p", "u", [(rnd.choice(uuids), "VCPU", 1)], "X",
                                      None)
                store.write_allocations([write], post=False)
                held[consumer] = 1
        if step % 3 == 0:
            store.provider_graph()
    barrier.wait()
    same = bool(
        store.provider_graph().providers == PlacementStore(store.engine).provider_graph().providers
    )
    store.engine.dispose()
    return same


def test_cached_graphs_in_several_processes_stay_exact(two_servers: list[Server]) -> None:
    api = Api(two_servers[0].url)
    uuids = [api.provider(VCPU=100) for _ in range(5)]
    db_url = two_servers[0].db
    ctx = mp.get_context("fork")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            results = pool.map(_claim_and_compare, [(db_url, uuids, i, barrier) for i in range(4)])
    assert results == [True, True, True, True]
