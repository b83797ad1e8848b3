"""Several scheduler processes against one PostgreSQL resource store never overcommit.

Four processes each open their own stack on a fresh database, then fire requests at a
cloud that fills up before the last request. Afterwards every provider's usage is within
its capacity, every placed instance holds exactly one allocation of the flavor's size,
nothing else holds allocations, and generation-conflict retries stayed within bounds.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest

from pgdb import fresh_pg_database

HOSTS = 50
PROCESSES = 4
REQUESTS = 2000
SLOTS_PER_HOST = 32  # 1,600 slots for 2,000 requests: the cloud ends full
FLAVOR = {"vcpus": 1, "memory_mb": 1024, "root_gb": 10}

pytestmark = pytest.mark.postgres


def _config() -> Any:
    """The service tests' filters, with hosts that stay 'up' for the whole run (no agent
    reports periodically here, and registering plus scheduling outlasts 60 s)."""
    from .conftest import TEST_CONFIG

    return TEST_CONFIG.replace("DEFAULT", service_down_time=3600)


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards (skip if PostgreSQL is down)."""
    with fresh_pg_database("berth_sched") as url:
        yield url


def _worker(url: str, index: int, count: int, queue: Any) -> None:
    """One scheduler process: ``count`` single-instance requests, then its tallies."""
    from berth.errors import NoValidHost
    from berth.model.request import Flavor, RequestSpec
    from berth.placement.db import create_db_engine
    from berth.service.stack import open_stack

    stack = open_stack(url, _config(), engine=create_db_engine(url))
    service = stack.scheduler(seed=index)
    flavor = Flavor(name="unit", id=1, **FLAVOR)  # type: ignore[arg-type]
    placed: list[tuple[str, str]] = []
    failed = 0
    for _ in range(count):
        spec = RequestSpec(flavor=flavor, project_id="p", user_id="u")
        try:
            decision = service.select_destinations(spec, return_alternates=False)
        except NoValidHost:
            failed += 1
            continue
        placed.append((decision.instance_uuids[0], str(decision.selections[0][0].compute_node_uuid)))
    queue.put({"placed": placed, "failed": failed, "claims": service.claimer.stats.as_dict(),
               "candidate_errors": list(service.stats.candidate_errors)[:5]})
    stack.close()


def test_four_schedulers_fill_a_cloud_without_overcommitting(pg_database: str) -> None:
    import sqlalchemy as sa

    from berth.placement import db as pdb
    from berth.service.compute import ComputeNodeSpec
    from berth.service.placement import CLAIM_ATTEMPTS
    from berth.service.stack import open_stack

    stack = open_stack(pg_database, _config())
    reserved = stack.config.reserved_host_memory_mb
    stack.register_hosts([
        ComputeNodeSpec(host=f"cn{i:03d}", vcpus=SLOTS_PER_HOST, cpu_allocation_ratio=1.0,
                        memory_mb=SLOTS_PER_HOST * FLAVOR["memory_mb"] + reserved,
                        local_gb=SLOTS_PER_HOST * FLAVOR["root_gb"])
        for i in range(HOSTS)])

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    share = REQUESTS // PROCESSES
    procs = [ctx.Process(target=_worker, args=(pg_database, i, share, queue))
             for i in range(PROCESSES)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0

    placed = [item for r in results for item in r["placed"]]
    failed = sum(r["failed"] for r in results)
    assert len(placed) + failed == REQUESTS
    # The cloud has exactly HOSTS * SLOTS_PER_HOST slots and every one of them is taken.
    assert len(placed) == HOSTS * SLOTS_PER_HOST

    with stack.engine.connect() as conn:
        rc_names = dict(conn.execute(sa.select(pdb.resource_classes.c.id,
                                               pdb.resource_classes.c.name)).all())
        capacity = {(r.resource_provider_id, r.resource_class_id):
                    (r.total - r.reserved) * r.allocation_ratio
                    for r in conn.execute(sa.select(pdb.inventories))}
        used = conn.execute(sa.select(pdb.allocations.c.resource_provider_id,
                                      pdb.allocations.c.resource_class_id,
                                      sa.func.sum(pdb.allocations.c.used))
                            .group_by(pdb.allocations.c.resource_provider_id,
                                      pdb.allocations.c.resource_class_id)).all()
        per_consumer = dict(conn.execute(
            sa.select(pdb.allocations.c.consumer_id,
                      sa.func.count(sa.distinct(pdb.allocations.c.resource_provider_id)))
            .group_by(pdb.allocations.c.consumer_id)).all())
    for rp_id, rc_id, amount in used:
        assert amount <= capacity[(rp_id, rc_id)], (rp_id, rc_names[rc_id], amount)
    assert set(per_consumer) == {u for u, _ in placed}
    assert all(n == 1 for n in per_consumer.values())
    for instance, rp_uuid in placed[:: max(1, len(placed) // 50)]:
        held = stack.client.get_allocations(instance).allocations
        assert held == {rp_uuid: {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 10}}

    claims = [r["claims"] for r in results]
    total_claims = sum(c["claims"] for c in claims)
    retries = sum(c["conflict_retries"] for c in claims)
    assert retries <= total_claims * (CLAIM_ATTEMPTS - 1)
    assert sum(c["successes"] for c in claims) == len(placed)
    print(f"\n{len(placed)} placed, {failed} NoValidHost, {total_claims} claims, "
          f"{retries} conflict retries, {sum(c['exhausted'] for c in claims)} out of retries, "
          f"{sum(c['refusals'] for c in claims)} refusals")
    stack.close()


def _open_together(url: str, barrier: Any, queue: Any) -> None:
    """Open a stack as soon as every process is ready; report the error, if any."""
    from berth.placement.db import create_db_engine
    from berth.service.stack import open_stack

    barrier.wait()
    try:
        open_stack(url, _config(), engine=create_db_engine(url)).close()
        queue.put(None)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        queue.put(repr(exc))


def test_schedulers_starting_together_on_a_fresh_database_create_its_tables_once(
    pg_database: str,
) -> None:
    """The service's own tables (compute records, server groups) are created by whichever
    process comes first; the others wait for it instead of failing."""
    from berth.placement.db import prepare

    prepare(pg_database).dispose()  # the migrated placement schema, no service tables yet
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_open_together, args=(pg_database, barrier, queue))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    errors = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert errors == [None] * PROCESSES
