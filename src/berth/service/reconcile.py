"""Crash recovery: find the claims no build stands behind, and release them.

A process that dies mid-boot (``kill -9``, a lost machine) leaves its claims in
Placement and its instances among their groups' members. Every claim has a build record
written before it (:mod:`berth.service.builds`), so what to release is decided from the
shared database alone, by :func:`scan`:

* **abandoned**: a ``building`` record not updated for ``build_timeout`` seconds (a live
  process's heartbeat refreshes its builds in flight); it becomes ``failed``;
* **completed**: an abandoned build whose instance its host reports running, on the host
  its claim is on (the build finished after its conductor died, as when an API process
  is killed while the compute agent builds): it becomes ``active``, its claim stays;
* **leaked**: allocations of a ``failed`` (or abandoned) build, or of a deleted instance;
* **stale members**: a failed or abandoned build still in its server group;
* **orphaned**: allocations of a consumer without any build record (not written by a
  Berth boot: an operator's, or a database restored from elsewhere); the consumer of a
  migration under way or awaiting confirmation has its migration record instead
  (:mod:`berth.service.instances`) and is not an orphan;
* **missing**: an ``active`` build without allocations (reported only).

:func:`repair` releases abandoned builds, leaked allocations and stale members; orphaned
allocations only when asked (``berth audit --fix``), since Berth cannot tell whose they
are. The :class:`Reconciler` runs scan and repair every ``interval`` seconds in any
number of API or ``serve`` processes: no leader, one :class:`Lease` row in the database
lets one of them work at a time (the repairs are compare-and-swaps, so two at once would
still be safe, only wasteful). It also runs the process's build heartbeat.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from berth.placement.client import NotFoundError
from berth.placement.db import allocations, create_tables, resource_classes, resource_providers
from berth.service.builds import ACTIVE, BUILDING, DELETED, FAILED, BuildRecords, builds
from berth.service.groups import ServerGroupStore
from berth.service.instances import InstanceStore, live_migration_consumers
from berth.service.records import compute_nodes, decode_report

LOG = logging.getLogger(__name__)

#: Seconds a build may go without an update before it counts as abandoned. Builds in a
#: live process are refreshed every heartbeat, so this bounds how long a crashed
#: process's claims are held, not how long a build may take.
DEFAULT_BUILD_TIMEOUT = 180.0
#: Seconds between heartbeats and reconciliation passes (at most).
DEFAULT_INTERVAL = 10.0

leases_metadata = sa.MetaData()

leases = sa.Table(
    "berth_leases",
    leases_metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("holder", sa.String(64), nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)


class Lease:
    """A named lease row: held by one holder until ``expires_at``.

    :meth:`acquire` is one conditional UPDATE (the holder renews, anyone takes an
    expired lease) or, for a lease never taken, an INSERT that a concurrent taker's
    primary key refuses: atomic on PostgreSQL and SQLite alike.
    """

    def __init__(self, engine: Engine, name: str, holder: str, ttl: float) -> None:
        self.engine = engine
        self.name = name
        self.holder = holder
        self.ttl = ttl
        create_tables(engine, leases_metadata)

    def acquire(self, now: float) -> bool:
        """Take or renew the lease; False while another holder's has not expired."""
        row = leases.c
        with self.engine.begin() as conn:
            taken = conn.execute(
                sa.update(leases)
                .where(row.name == self.name,
                       sa.or_(row.holder == self.holder, row.expires_at < now))
                .values(holder=self.holder, expires_at=now + self.ttl)).rowcount
        if taken:
            return True
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(leases).values(name=self.name, holder=self.holder,
                                                      expires_at=now + self.ttl))
        except sa.exc.IntegrityError:
            return False
        return True

    def release(self) -> None:
        """Give the lease up (if held) so another process need not wait for expiry."""
        with self.engine.begin() as conn:
            conn.execute(sa.delete(leases).where(leases.c.name == self.name,
                                                 leases.c.holder == self.holder))


class AllocationDeleter(Protocol):
    """``DELETE /allocations/{consumer}``: the Placement client or the store in process."""

    def delete_allocations(self, consumer: str) -> None:
        """Delete the consumer's allocations (NotFoundError when it has none)."""
        ...


@dataclass
class Holding:
    """One consumer's allocations: per host, the resources it holds there."""

    consumer: str
    resources: dict[str, dict[str, int]] = field(default_factory=dict)
    state: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"consumer": self.consumer, "state": self.state, "reason": self.reason,
                "allocations": self.resources}


@dataclass
class Findings:
    """What :func:`scan` found (see the module docstring)."""

    abandoned: list[Any] = field(default_factory=list)
    #: Abandoned builds whose instance runs on its claimed host: (record, host).
    completed: list[tuple[Any, str]] = field(default_factory=list)
    #: The node each completed build's instance runs on (its compute record's).
    nodes: dict[str, str] = field(default_factory=dict)
    leaked: list[Holding] = field(default_factory=list)
    orphaned: list[Holding] = field(default_factory=list)
    stale_members: dict[str, list[str]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing to report."""
        return not (self.abandoned or self.completed or self.leaked or self.orphaned
                    or self.stale_members or self.missing)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``berth audit --json``)."""
        return {
            "abandoned_builds": [{"instance_uuid": b.instance_uuid, "owner": b.owner,
                                  "request_id": b.request_id, "updated_at": b.updated_at}
                                 for b in self.abandoned],
            "completed_builds": [{"instance_uuid": b.instance_uuid, "host": host}
                                 for b, host in self.completed],
            "leaked": [h.as_dict() for h in self.leaked],
            "orphaned": [h.as_dict() for h in self.orphaned],
            "stale_members": {g: list(m) for g, m in sorted(self.stale_members.items())},
            "active_without_allocations": list(self.missing),
        }


@dataclass
class Repairs:
    """What :func:`repair` did."""

    builds_failed: list[str] = field(default_factory=list)
    allocations_deleted: list[str] = field(default_factory=list)
    members_removed: dict[str, list[str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing was changed."""
        return not (self.builds_failed or self.allocations_deleted or self.members_removed)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"builds_failed": self.builds_failed,
                "allocations_deleted": self.allocations_deleted,
                "members_removed": self.members_removed}


def _holdings(engine: Engine, cutoff: float) -> dict[str, Holding]:
    """The consumers with allocations a pass may act on or report, with their resources
    per host and their build state: those without a build record (orphans, or the
    consumers of migrations), those whose build failed or whose instance was deleted,
    and those of builds abandoned (``building`` and not updated since ``cutoff``, as
    :meth:`BuildRecords.abandoned` asks). The database picks them: a pass costs what it finds, not what the cloud holds
    (every allocation of every instance, every ten seconds in the lease holder)."""
    root = resource_providers.alias("root")
    rp = resource_providers.alias("rp")
    query = (
        sa.select(allocations.c.consumer_id, sa.func.coalesce(compute_nodes.c.host, root.c.name),
                  resource_classes.c.name, allocations.c.used, builds.c.state, builds.c.reason)
        .select_from(
            allocations.join(rp, rp.c.id == allocations.c.resource_provider_id)
            .join(root, root.c.id == sa.func.coalesce(rp.c.root_provider_id, rp.c.id))
            .join(resource_classes, resource_classes.c.id == allocations.c.resource_class_id)
            .outerjoin(compute_nodes, compute_nodes.c.uuid == root.c.uuid)
            .outerjoin(builds, builds.c.instance_uuid == allocations.c.consumer_id))
        .where(sa.or_(builds.c.instance_uuid.is_(None), builds.c.state.in_([FAILED, DELETED]),
                      sa.and_(builds.c.state == BUILDING, builds.c.updated_at < cutoff))))
    held: dict[str, Holding] = {}
    with engine.connect() as conn:
        for consumer, host, rc, used, state, reason in conn.execute(query):
            holding = held.get(consumer)
            if holding is None:
                holding = held[consumer] = Holding(str(consumer), state=state, reason=reason)
            per = holding.resources.setdefault(str(host), defaultdict(int))
            per[str(rc)] += int(used)
    for holding in held.values():
        holding.resources = {h: dict(r) for h, r in holding.resources.items()}
    return held


def _active_without_allocations(engine: Engine) -> list[str]:
    """The instances of ``active`` builds that hold no allocation, in uuid order."""
    query = (sa.select(builds.c.instance_uuid)
             .where(builds.c.state == ACTIVE,
                    ~sa.exists().where(allocations.c.consumer_id == builds.c.instance_uuid))
             .order_by(builds.c.instance_uuid))
    with engine.connect() as conn:
        return [str(u) for (u,) in conn.execute(query)]


def _running(engine: Engine, instance_uuids: list[str]) -> dict[str, tuple[str, str]]:
    """The host and node each of ``instance_uuids`` runs on, as the compute reports
    list them."""
    wanted = set(instance_uuids)
    where: dict[str, tuple[str, str]] = {}
    with engine.connect() as conn:
        for host, node, report in conn.execute(sa.select(
                compute_nodes.c.host, compute_nodes.c.nodename, compute_nodes.c.report)):
            for instance in decode_report(report).get("instances") or ():
                if instance.get("uuid") in wanted:
                    where[instance["uuid"]] = (host, node)
    return where


def scan(builds_: BuildRecords, groups: ServerGroupStore, *, timeout: float,
         now: float | None = None) -> Findings:
    """What needs releasing now (nothing is changed)."""
    now = time.time() if now is None else now
    findings = Findings()
    quiet = builds_.abandoned(timeout, now)
    held = _holdings(builds_.engine, now - timeout)
    running = _running(builds_.engine, [b.instance_uuid for b in quiet]) if quiet else {}
    for record in quiet:
        host, node = running.get(record.instance_uuid, (None, None))
        holding = held.get(record.instance_uuid)
        if host is not None and holding is not None and host in holding.resources:
            findings.completed.append((record, host))
            findings.nodes[record.instance_uuid] = node or host
        else:
            findings.abandoned.append(record)
    abandoned = {b.instance_uuid for b in findings.abandoned}
    # A migration's consumer holds the source of a move under way or awaiting
    # confirmation: its migration record stands behind it.
    migrating = live_migration_consumers(builds_.engine)
    for consumer, holding in sorted(held.items()):
        if holding.state is None and consumer in migrating:
            continue
        if holding.state is None:
            findings.orphaned.append(holding)
        elif holding.state in (FAILED, DELETED) or consumer in abandoned:
            if consumer in abandoned:
                holding.reason = "build abandoned"
            elif holding.state == DELETED:
                holding.reason = "instance deleted"
            findings.leaked.append(holding)
    members = {g.uuid: g.members for g in groups.all() if g.members}
    everyone = [m for ms in members.values() for m in ms]
    gone = {b.instance_uuid for b in builds_.in_state(FAILED, everyone)} | abandoned
    for group_uuid, ms in members.items():
        stale = [m for m in ms if m in gone]
        if stale:
            findings.stale_members[group_uuid] = stale
    findings.missing = _active_without_allocations(builds_.engine)
    return findings


def repair(findings: Findings, builds_: BuildRecords, groups: ServerGroupStore,
           placement: AllocationDeleter, *, orphans: bool = False,
           timeout: float = DEFAULT_BUILD_TIMEOUT,
           instances: InstanceStore | None = None) -> Repairs:
    """Release what ``findings`` lists: abandoned builds become failed (each only if it
    did not change since the scan), then their and the failed builds' allocations are
    deleted and the stale members leave their groups; orphaned allocations too when
    ``orphans``."""
    done = Repairs()
    kept: set[str] = set()
    for record, host in findings.completed:
        # The instance's row, from the spec its build record kept, with the record: the
        # instance can then be listed, moved and deleted like any other.
        also = (instances.upserts([(record.instance_uuid, host,
                                    findings.nodes.get(record.instance_uuid, host),
                                    json.loads(record.spec))])
                if instances is not None and record.spec else ())
        if builds_.complete_abandoned(record, host, also=also):
            LOG.warning("instance %s: its build finished on %s, but its owner %s did not "
                        "record it within the build timeout (the process went away, or "
                        "could not reach the database); recorded as active",
                        record.instance_uuid, host, record.owner)
    for record in findings.abandoned:
        reason = (f"build abandoned: no update for {timeout:g} s (its owner {record.owner} "
                  f"went away, or could not reach the database)")
        if builds_.fail_abandoned(record, reason):
            done.builds_failed.append(record.instance_uuid)
            LOG.warning("instance %s: %s", record.instance_uuid, reason)
        else:
            kept.add(record.instance_uuid)  # its owner is back, or another pass took it
    doomed = [h.consumer for h in findings.leaked if h.consumer not in kept]
    if orphans:
        doomed += [h.consumer for h in findings.orphaned]
    for consumer in doomed:
        try:
            placement.delete_allocations(consumer)
        except NotFoundError:
            continue
        done.allocations_deleted.append(consumer)
        LOG.warning("deleted the allocations of %s (no build stands behind them)", consumer)
    for group_uuid, stale in findings.stale_members.items():
        leaving = [m for m in stale if m not in kept]
        if leaving:
            groups.remove_members(group_uuid, leaving)
            done.members_removed[group_uuid] = leaving
            LOG.warning("server group %s: removed %d never-built member(s)", group_uuid,
                        len(leaving))
    return done


class Reconciler:
    """Heartbeat and periodic reconciliation for one process (any number may run).

    Every ``interval`` seconds: the process's build heartbeat, then, if this process
    holds the ``reconciler`` lease, :func:`scan` and :func:`repair` (orphans are left to
    ``berth audit --fix``). A database error skips the round (logged).
    """

    LEASE = "reconciler"

    def __init__(
        self,
        builds_: BuildRecords,
        groups: ServerGroupStore,
        placement: AllocationDeleter,
        *,
        timeout: float = DEFAULT_BUILD_TIMEOUT,
        interval: float | None = None,
        clock: Callable[[], float] = time.time,
        instances: InstanceStore | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"build timeout: expected seconds > 0, got {timeout}")
        self.builds = builds_
        self.groups = groups
        self.placement = placement
        self.instances = instances
        self.timeout = timeout
        # Heartbeats must come several times per timeout, or live builds look abandoned.
        self.interval = interval if interval is not None else min(DEFAULT_INTERVAL, timeout / 4)
        self.clock = clock
        self.lease = Lease(builds_.engine, self.LEASE, builds_.owner, ttl=3 * self.interval)
        self.passes = 0
        self.repairs: list[Repairs] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> Repairs | None:
        """One round; the repairs made, or None when another process holds the lease."""
        self.builds.heartbeat()
        self.builds.settle_deferred()
        now = self.clock()
        if not self.lease.acquire(now):
            return None
        findings = scan(self.builds, self.groups, timeout=self.timeout, now=now)
        done = repair(findings, self.builds, self.groups, self.placement,
                      timeout=self.timeout, instances=self.instances)
        self.passes += 1
        if not done.empty:
            self.repairs.append(done)
        return done

    def start(self) -> None:
        """Run rounds in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="berth-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and give the lease up."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        try:
            self.lease.release()
        except sa.exc.SQLAlchemyError:
            LOG.warning("could not release the reconciler lease (it expires by itself)")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the database may be down: try again next round
                LOG.exception("reconciliation round failed")
            self._stop.wait(self.interval)
