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

Where members run is read fresh: the group from the :class:`ServerGroupStore` (so a
concurrent boot's instances, members before they are scheduled, count), the hosts from
the compute records (:class:`~berth.service.compute.RunningInstances`), plus the builds
this check has let through that have not finished yet. A build counts as on its host
from the moment it passes the check (as Nova sets the instance's host before it checks)
until the driver returns, and afterwards as its host reports it; a member that was never
built, or whose build failed, runs nowhere and counts nowhere. The lock is held for the
check alone, not for the driver's build, so builds into one group do not wait for each
other's drivers.

The lock and the builds in flight are this process's, as Nova's lock is one compute
service's: two builds in one process are serialized, two processes building on their own
hosts are not. A driver must have its host report the instance by the time its
``spawn`` returns (:class:`~berth.service.conductor.FakeDriver` does, through the
host's agent), or the check stops seeing that member once its build has finished.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Protocol

from berth.model.request import InstanceGroup
from berth.service.groups import ServerGroupStore

LOG = logging.getLogger(__name__)

#: The policies the late check enforces.
HARD_POLICIES = frozenset({"affinity", "anti-affinity"})


class GroupPolicyViolation(Exception):
    """Building the instance on this host would break its server group's policy."""


class InstanceLocator(Protocol):
    """Where instances run now (:class:`~berth.service.compute.RunningInstances`)."""

    def hosts_of(self, instance_uuids: Iterable[str]) -> dict[str, str]:
        """The host each instance runs on; those running nowhere are left out."""
        ...


class GroupPolicyCheck:
    """Nova's late affinity check, for the builds of one process.

    ``groups`` None checks against the group as the request carries it (its members as
    resolved, plus the request's own instances) instead of re-reading it.
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
        while the body (the driver's build) runs."""
        with self._lock_of(group.uuid or group.name):
            self.check(group, instance_uuid, host)
            with self._guard:
                self._building[instance_uuid] = host
        try:
            yield
        finally:
            with self._guard:
                self._building.pop(instance_uuid, None)

    def check(self, group: InstanceGroup, instance_uuid: str, host: str) -> None:
        """Raise :class:`GroupPolicyViolation` when ``instance_uuid`` on ``host`` breaks
        the group's policy as the group and its members stand now."""
        current = self._current(group)
        if current is None or current.policy not in HARD_POLICIES:
            return
        others = set(current.members)
        others.discard(instance_uuid)
        if not others:
            return
        where = self.running.hosts_of(others)
        with self._guard:
            where.update((u, h) for u, h in self._building.items() if u in others)
        name = current.name or current.uuid
        if current.policy == "anti-affinity":
            limit = int(current.rules.get("max_server_per_host", 1))
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

    def _current(self, group: InstanceGroup) -> InstanceGroup | None:
        """The group as stored now (None when it is gone: nothing to check, as in
        Nova), or as the request carries it without a store."""
        if self.groups is None or not group.uuid:
            return group
        return self.groups.get(group.uuid)

    def _lock_of(self, key: str) -> threading.Lock:
        with self._guard:
            lock = self._group_locks.get(key)
            if lock is None:
                lock = self._group_locks[key] = threading.Lock()
            return lock
