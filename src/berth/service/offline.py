"""Offline scheduling on the online path: a cloud file in a scratch store.

``berth schedule`` (and every what-if built on it) runs what ``berth serve`` runs: the
cloud file's hosts are registered through their compute agents into a Placement store
in a scratch SQLite database (:func:`~berth.service.seeding.seed_cloud`, the same
registration ``berth serve --cloud`` does), and requests go through a
:class:`~berth.service.scheduler.SchedulerService`: request filters, the placement query
built from the request, the allocation-candidate engine, the core and the claims. The
database lives in the process's memory (a temporary file when it could outgrow that)
and is gone when the context closes.

The instant is fixed (``now``): agents report at it and the scheduler decides at it, so
a what-if at a given time answers the same whenever it runs.
"""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from berth.cloudfile import Cloud, load_cloud
from berth.config import SchedulerConfig
from berth.service.seeding import seed_cloud
from berth.service.stack import Stack, open_stack


@dataclass
class OfflineCloud:
    """A loaded cloud file and the stack it was registered into."""

    cloud: Cloud
    stack: Stack


#: SQLite's ``memdb`` VFS refuses to grow a database past 1 GiB (its compile-time
#: default; Python cannot raise it). A scratch store whose estimate passes half of
#: that goes to a temporary file instead.
MEMORY_BUDGET = 512 * 1024 * 1024
#: Bytes a registered compute node takes (provider, inventories, traits, its report
#: with a few dozen instances), and bytes an event of a replay leaves behind (its build
#: record, which is never removed: instance uuids are never re-issued): measured at
#: 3.3 KB and 0.41 KB, with room to spare.
BYTES_PER_HOST = 8 * 1024
BYTES_PER_EVENT = 512


@contextmanager
def offline_cloud(path: str, config: SchedulerConfig, *, now: float, events: int = 0,
                  events_per_host: int = 0) -> Iterator[OfflineCloud]:
    """Load the cloud file at ``path`` and register it into a scratch store at the
    instant ``now``; the store is removed on exit. ``events`` (and ``events_per_host``
    times the cloud's compute nodes): at most how many requests will run in it (a
    replay's trace, a capacity report's fill), for the choice of the store's medium
    (:func:`scratch`)."""
    cloud = load_cloud(path, config, now=now)
    hosts = len(cloud.snapshot)
    # Nested and sharing providers are budgeted as compute nodes (rows of their own).
    providers = hosts + len(cloud.sharing) + sum(len(p.children) for p in cloud.providers.values())
    with scratch(providers, events + events_per_host * hosts) as url:
        # Thrown away on exit: its commits need not reach the disk.
        stack = open_stack(url, config, durable=False)
        stack.clock = lambda: now
        # A copy of a running cloud (berth capacity --url) holds instances named by its
        # seeded generator, which a scratch store's seeded one could repeat.
        stack.taken_uuids = frozenset(
            uuid for instances in cloud.snapshot.obj("instances") for uuid in instances)
        try:
            seed_cloud(stack, cloud, path, now=now, fresh=True)
            yield OfflineCloud(cloud, stack)
        finally:
            stack.close()


@contextmanager
def scratch(hosts: int, events: int = 0) -> Iterator[str]:
    """The URL of a new, empty SQLite database for a scratch store of ``hosts`` compute
    nodes (or resource providers) and ``events`` requests.

    In this process's memory (SQLite's ``memdb`` VFS) when its estimate fits
    :data:`MEMORY_BUDGET`: every connection of the stack's engine opens the same
    database by its name, with the locking of a database file (a writer's ``BEGIN
    IMMEDIATE``, a reader's shared lock). A connection of its own holds it until exit
    (SQLite frees such a database when its last connection closes, and a pool may close
    all of its own). A commit there costs about a third of one to a file (no journal or
    WAL pages to write), and a replay commits four times an event. Larger stores go to
    a file in a temporary directory, removed on exit. Either way the same SQL runs.
    """
    if hosts * BYTES_PER_HOST + events * BYTES_PER_EVENT <= MEMORY_BUDGET:
        name = f"file:/berth-offline-{uuid.uuid4().hex}?vfs=memdb"
        anchor = sqlite3.connect(name, uri=True)
        try:
            yield f"sqlite:///{name}&uri=true"
        finally:
            anchor.close()
        return
    with tempfile.TemporaryDirectory(prefix="berth-offline-") as directory:
        yield f"sqlite:///{directory}/cloud.sqlite"
