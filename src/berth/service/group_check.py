"""The late server-group check: a hard policy re-checked when a build reaches its host.

Nova's compute manager checks the group again before it builds
(``_validate_instance_group_policy``), because the scheduler's decision was taken
before any concurrent boot's instance existed: two boots into one anti-affinity group
can both be sent to the same host. Under a lock per group it re-reads the group and
where its *other* members run, then:

* anti-affinity: when this host already runs ``max_server_per_host`` other members
  (rule of the group, 1 without it), "Anti-affinity instance group policy was violated";
* affinity: when the other members run on some hosts and not this one, "Affinity
  instance group policy was violated";
* soft-affinity, soft-anti-affinity: nothing (the weighers are the whole policy).

A violation is a reschedule: :class:`~berth.service.conductor.BuildFailed`, so the
conductor deletes the claim and goes on with the alternates. As in Nova it does not
count as a failed build of the host (Nova's ``RESCHEDULED_BY_POLICY``).

Option: ``[workarounds] disable_group_policy_check_upcall`` (default false) turns the
check off.

Where the other members are, with a group store (the service's case): under the
group's row lock in the shared database (``SELECT ... FOR UPDATE``; SQLite's write
lock), so the checks of every process are serialized per group as Nova serializes
them per compute service, the check reads the group's members and the hosts their
claims are on (:class:`~berth.service.groups.ClaimedHosts`), counting the members that
passed their own check (their build record names the host) or are not Berth's builds
(no record: a cloud file's instances); then, in the same transaction, it records this
build as admitted on the host. A member that is claimed but not yet checked will be
checked after this one and see it; a member whose build failed has no claim left and
counts nowhere (a build rescheduled after passing its check withdraws its admission).
Concurrent boots' instances count as soon as they pass their check, as Nova counts an
instance once its ``host`` is set.

Without a group store the check reads the group as the request carries it and locates
members through ``running`` (the compute records,
:class:`~berth.service.records.RunningInstances`, whose driver must have its host report
the instance by the time ``spawn`` returns), under a lock of this process only, plus the
builds it let through that have not finished.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from berth.model.request import InstanceGroup
from berth.service.groups import ServerGroupStore

LOG = logging.getLogger(__name__)

#: The policies the late check enforces.
HARD_POLICIES = frozenset({"affinity", "anti-affinity"})


class GroupPolicyViolation(Exception):
    """Building the instance on this host would break its server group's policy."""


class InstanceLocator(Protocol):
    """Where instances are now: by their claims
    (:class:`~berth.service.groups.ClaimedHosts`) or by their hosts' reports
    (:class:`~berth.service.records.RunningInstances`)."""

    def hosts_of(self, instance_uuids: Iterable[str]) -> dict[str, str]:
        """The host each instance runs on; those running nowhere are left out."""
        ...


class GroupPolicyCheck:
    """Nova's late affinity check.

    ``groups`` None checks against the group as the request carries it (its members as
    resolved, plus the request's own instances) instead of re-reading it, and is
    consistent within this process only.
    """

    def __init__(self, running: InstanceLocator, groups: ServerGroupStore | None = None) -> None:
        self.running = running
        self.groups = groups
        self._guard = threading.Lock()
        self._group_locks: dict[str, threading.Lock] = {}
        #: instance -> host: builds that passed the check and have not finished
        self._building: dict[str, str] = {}

    @contextlib.contextmanager
    def admit(self, group: InstanceGroup, instance_uuid: str, host: str) -> Iterator[None]:
        """Check that building ``instance_uuid`` on ``host`` keeps ``group``'s policy
        (:class:`GroupPolicyViolation` when not), then count the build as on ``host``
        while the body (the driver's build) runs, and afterwards as long as its claim
        stays; a body that raises withdraws the admission."""
        store = self.groups
        if store is not None and group.uuid:
            # One process's builds queue here rather than on the database's row lock.
            with self._lock_of(group.uuid):
                store.admit(group.uuid, instance_uuid, host,
                            lambda current, where: judge(current, instance_uuid, host, where))
            try:
                yield
            except BaseException:
                store.withdraw(instance_uuid)
                raise
            return
        with self._lock_of(group.uuid or group.name):
            where = self._located(group, instance_uuid)
            judge(group, instance_uuid, host, where)
            with self._guard:
                self._building[instance_uuid] = host
        try:
            yield
        finally:
            with self._guard:
                self._building.pop(instance_uuid, None)

    def _located(self, group: InstanceGroup, instance_uuid: str) -> dict[str, str]:
        """Where the request's group's other members are, by ``running`` and the builds
        in flight here."""
        others = set(group.members)
        others.discard(instance_uuid)
        if group.policy not in HARD_POLICIES or not others:
            return {}
        where = self.running.hosts_of(others)
        with self._guard:
            where.update((u, h) for u, h in self._building.items() if u in others)
        return where

    def _lock_of(self, key: str) -> threading.Lock:
        with self._guard:
            lock = self._group_locks.get(key)
            if lock is None:
                lock = self._group_locks[key] = threading.Lock()
            return lock


def judge(group: InstanceGroup, instance_uuid: str, host: str, where: Mapping[str, str]) -> None:
    """Raise :class:`GroupPolicyViolation` when ``instance_uuid`` on ``host`` breaks the
    hard policy of ``group`` whose members are on the hosts ``where`` says (the
    instance itself is left out); soft policies pass."""
    if group.policy not in HARD_POLICIES:
        return
    where = {u: h for u, h in where.items() if u != instance_uuid}
    name = group.name or group.uuid
    if group.policy == "anti-affinity":
        limit = int(group.rules.get("max_server_per_host", 1))
        here = [u for u, h in where.items() if h == host]
        if len(here) >= limit:
            raise GroupPolicyViolation(
                f"Anti-affinity instance group policy was violated. Server group "
                f"{name}: {len(here)} other member(s) on {host}, max_server_per_host "
                f"{limit}")
    else:
        hosts = set(where.values())
        if hosts and host not in hosts:
            raise GroupPolicyViolation(
                f"Affinity instance group policy was violated. Server group {name}: "
                f"its other members run on {', '.join(sorted(hosts))}, not {host}")
