"""Offline scheduling on the online path: a cloud file in a scratch store.

``berth schedule`` (and every what-if built on it) runs what ``berth serve`` runs: the
cloud file's hosts are registered through their compute agents into a Placement store
in a scratch SQLite database (:func:`~berth.service.seeding.seed_cloud`, the same
registration ``berth serve --cloud`` does), and requests go through a
:class:`~berth.service.scheduler.SchedulerService`: request filters, the placement query
built from the request, the allocation-candidate engine, the core and the claims. The
database lives in the process's memory and is gone when the context closes.

The instant is fixed (``now``): agents report at it and the scheduler decides at it, so
a what-if at a given time answers the same whenever it runs.
"""

from __future__ import annotations

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


@contextmanager
def offline_cloud(path: str, config: SchedulerConfig, *, now: float) -> Iterator[OfflineCloud]:
    """Load the cloud file at ``path`` and register it into a scratch store at the
    instant ``now``; the store is removed on exit."""
    cloud = load_cloud(path, config, now=now)
    stack = open_stack(scratch_url(), config, durable=False)
    stack.clock = lambda: now
    try:
        seed_cloud(stack, cloud, path, now=now, fresh=True)
        yield OfflineCloud(cloud, stack)
    finally:
        stack.close()


def scratch_url() -> str:
    """A new SQLite database in this process's memory (SQLite's ``memdb`` VFS): every
    connection of the stack's engine opens the same one by its name, with the locking
    of a database file (a writer's ``BEGIN IMMEDIATE``, a reader's shared lock), and it
    is freed when the engine's last connection closes. A commit costs a third of one
    to a file (no journal or WAL pages to write), and a replay commits four times an
    event."""
    return f"sqlite:///file:/berth-offline-{uuid.uuid4().hex}?vfs=memdb&uri=true"
