"""The conductor: build on the selected host, fall back to the alternates.

For each instance the scheduler returned ``[selected, alternate, ...]``. The conductor
builds on the selected host (whose resources the scheduler already claimed). When a build
fails it deletes that claim, then walks the alternates in order: it claims the
alternate's allocation request (which the scheduler did not claim) and builds there; an
alternate whose claim placement refuses is skipped. After ``[scheduler] max_attempts``
builds, or when the alternates run out, :class:`~berth.errors.MaxRetriesExceeded`.

Each instance of a multi-create is built on its own (seed 004: "only when all alternates
fail does the build request fail" — that instance's build request): one instance running
out of hosts does not stop the others (:meth:`Conductor.build_all`), and when it is done
no instance that was not built holds a claim, whatever went wrong.

A boot into a server group (:meth:`Conductor.schedule_and_build`) adds its instances to
the group's members before they are scheduled, as Nova's API does, and removes those that
end up not built. Every build into a hard-policy group goes through the late group check
first (:mod:`berth.service.group_check`, Nova's ``_validate_instance_group_policy``): a
build that would break the policy, as two racing boots can, is a :class:`BuildFailed`
like any other and goes on to the alternates. The check sits here, in the conductor's
per-build call into the compute side (:meth:`Conductor.spawn`), not in the driver: a
driver only builds, and a custom one gets the check without re-implementing it.

With ``RetryFilter`` in ``[filter_scheduler] enabled_filters`` the conductor reschedules
as Nova did before alternates (seeds 000-002, Nova's ``populate_retry``): each instance
is built on its selected host only; when that build fails its claim is deleted and the
scheduler is asked again for that instance, the request carrying ``retry``
(``num_attempts`` and the ``[host, node]`` pairs tried so far) so that RetryFilter keeps
it off the hosts that failed. More than ``max_attempts`` attempts is
MaxRetriesExceeded; a scheduler that finds no host left answers NoValidHost, and that is
the instance's error. As in Nova no retry information exists when ``max_attempts`` is 1
or exactly one host or node is forced: such a build is not rescheduled.

The compute driver is pluggable (:class:`ComputeDriver`); :class:`FakeDriver` can be told
to fail on given hosts or for a host's first N attempts, for tests and simulations.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from berth.config import SchedulerConfig
from berth.errors import BerthError, MaxRetriesExceeded, NoValidHost, ServiceUnavailable
from berth.model.request import ComputeNodeRef, RequestSpec, SchedulerRetries
from berth.model.selection import Selection
from berth.pipeline import Decision
from berth.placement.dbfaults import as_unavailable, unavailable
from berth.service.builds import ACTIVE, FAILED, BuildRecords
from berth.service.compute import ComputeAgent, DeviceClaimFailed, agent_key
from berth.service.group_check import HARD_POLICIES, GroupPolicyCheck, GroupPolicyViolation
from berth.service.groups import ServerGroupStore
from berth.service.instances import InstanceStore, spec_to_dict
from berth.service.placement import PlacementClaimer
from berth.service.records import RunningInstances
from berth.service.scheduler import SchedulerService

LOG = logging.getLogger(__name__)


class BuildFailed(Exception):
    """The driver could not build the instance on the host (a reschedulable failure)."""


class UnknownService(LookupError):
    """No compute service runs on the host named."""


class ServiceUnreachable(Exception):
    """The host's compute agent did not answer: nothing was changed."""


class ComputeDriver(Protocol):
    """Builds instances on hosts. Server-group policies are not a driver's business:
    the conductor checks them before it calls :meth:`spawn`. The host should report
    the instance by the time ``spawn`` returns (the late group check reads the
    reports)."""

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        """Build ``instance_uuid`` on the selection's host or raise :class:`BuildFailed`."""
        ...

    def set_service(self, host: str, *, disabled: bool | None, reason: str | None,
                    forced_down: bool | None) -> list[dict[str, Any]]:
        """An operator's switches on ``host``'s compute service, set on every node's
        agent (:meth:`~berth.service.compute.ComputeAgent.set_service`); each node's
        service state afterwards. :class:`UnknownService`, :class:`ServiceUnreachable`."""
        ...

    def retire_service(self, host: str) -> list[str]:
        """``host``'s compute service is being deleted: its agents stop and are
        forgotten (no report brings the host back); their node uuids.
        :class:`UnknownService`, :class:`ServiceUnreachable`."""
        ...


#: Build attempts a :class:`FakeDriver` remembers (the latest).
ATTEMPTS_KEPT = 1000


@dataclass
class FakeDriver:
    """A driver that succeeds unless told otherwise.

    ``fail_hosts`` always fail; ``fail_first`` maps a host to how many of its attempts
    fail before it succeeds (both by service host name: every node of it); ``delay``
    seconds pass in every build (builds in flight, for crash tests); a node whose agent
    in ``agents`` (keyed by :func:`~berth.service.compute.agent_key`) is down (silent or
    forced down) fails every build, as a host that is not running builds nothing.
    Successful builds are recorded in ``built`` and, when the node has a
    :class:`ComputeAgent`, accounted and reported by it; the agent also counts the
    failed builds (not those of a down host, which never got to try) and resets the
    count on a success.
    """

    fail_hosts: set[str] = field(default_factory=set)
    fail_first: dict[str, int] = field(default_factory=dict)
    agents: MutableMapping[str, ComputeAgent] = field(default_factory=dict)
    built: dict[str, str] = field(default_factory=dict)
    #: The latest build attempts, (instance, host), newest last: a window, since a
    #: ``berth serve`` runs for as long as it is up.
    attempts: deque[tuple[str, str]] = field(
        default_factory=lambda: deque(maxlen=ATTEMPTS_KEPT))
    delay: float = 0.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        """Fail as configured, else record the instance (and report it via the agent)."""
        host = selection.service_host
        if self.delay:
            time.sleep(self.delay)
        agent = self.agents.get(agent_key(host, selection.nodename))
        down = agent is not None and agent.down
        with self._lock:
            self.attempts.append((instance_uuid, host))
            if down or host in self.fail_hosts:
                fail = True
            elif self.fail_first.get(host, 0) > 0:
                self.fail_first[host] -= 1
                fail = True
            else:
                fail = False
            if not fail:
                self.built[instance_uuid] = host
        if down:
            raise BuildFailed(f"build of {instance_uuid} failed on {host}: the host is down")
        if fail:
            if agent is not None:
                agent.record_failed_build()
            raise BuildFailed(f"build of {instance_uuid} failed on {host}")
        if agent is not None:
            failures = agent.failed_builds
            agent.record_successful_build()
            try:
                # The NUMA cells and PCI devices are claimed on the node as Nova's
                # resource tracker claims them; when they no longer fit (another
                # scheduler's boot took them first) the build fails and is rescheduled.
                agent.spawn(instance_uuid, spec.flavor, spec.project_id,
                            image_properties=spec.image.properties.raw if spec.image else None,
                            numa=spec.numa_topology, pci_requests=spec.pci_requests,
                            numa_limits=(selection.limits or {}).get("numa_topology"))
            except DeviceClaimFailed as exc:
                with self._lock:
                    self.built.pop(instance_uuid, None)
                agent.failed_builds = failures  # still consecutive: this one failed too
                agent.record_failed_build()
                raise BuildFailed(f"build of {instance_uuid} failed on {host}: "
                                  f"{exc.message}") from None


    # ----------------------------------------------------------------- moves
    def move(self, selection: Selection, instance_uuid: str, spec: RequestSpec,
             source_host: str) -> None:
        """Build the moved instance on the destination (failing as configured, like a
        spawn); the source keeps its usage until the move is confirmed or reverted.
        The source of an evacuation is down and does nothing until it comes back."""
        source = self.agents.get(source_host)
        # Held before the build: a resize on its own host then holds the old flavor and
        # runs the new one side by side.
        if source is not None:
            source.hold(instance_uuid, publish=False)
        try:
            self.spawn(selection, instance_uuid, spec)
        except BaseException:
            if source is not None:
                source.unhold(instance_uuid, publish=False)
            raise
        if source is not None:
            source.report()

    def confirm_move(self, instance_uuid: str, source_host: str) -> None:
        """The move was confirmed: the source lets go of the instance's usage."""
        source = self.agents.get(source_host)
        if source is not None:
            source.release(instance_uuid)

    def revert_move(self, instance_uuid: str, dest_host: str, source_host: str) -> None:
        """The move was reverted: gone from the destination, back on the source."""
        dest = self.agents.get(dest_host)
        if dest is not None:
            dest.destroy(instance_uuid)
        source = self.agents.get(source_host)
        if source is not None:
            source.unhold(instance_uuid)
        with self._lock:
            self.built[instance_uuid] = source_host

    def forget_evacuated(self, instance_uuid: str, source_host: str) -> None:
        """The source of an evacuation is back: it lets go of the instance, and its
        usage is taken again from placement (which no longer counts the instance)."""
        source = self.agents.get(source_host)
        if source is not None:
            source.release(instance_uuid, publish=False)
            source.restore_usage()
            source.report()

    def set_service(self, host: str, *, disabled: bool | None, reason: str | None,
                    forced_down: bool | None) -> list[dict[str, Any]]:
        """Set the switches on the agents of ``host`` (see :class:`ComputeDriver`)."""
        mine = [a for a in list(self.agents.values()) if a.node.host == host]
        if not mine:
            raise UnknownService(host)
        return [a.set_service(disabled=disabled, reason=reason, forced_down=forced_down)
                for a in mine]

    def retire_service(self, host: str) -> list[str]:
        """Stop and forget the agents of ``host`` (see :class:`ComputeDriver`)."""
        keys = [k for k, a in list(self.agents.items()) if a.node.host == host]
        if not keys:
            raise UnknownService(host)
        retired = []
        for key in keys:
            agent = self.agents.pop(key)
            agent.silent = True
            retired.append(agent.uuid)
        return retired

    def terminate(self, instance_uuid: str, host: str, nodename: str | None) -> None:
        """The instance is deleted: its host forgets it and reports."""
        agent = self.agents.get(agent_key(host, nodename)) or self.agents.get(host)
        if agent is not None:
            agent.destroy(instance_uuid)
        with self._lock:
            self.built.pop(instance_uuid, None)

    def rebuild(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        """Rebuild the instance in place with the spec's image (a build on its own host,
        failing as configured)."""
        self.spawn(selection, instance_uuid, spec)


class SchedulerAPI(Protocol):
    """What the conductor needs of a scheduler: the in-process
    :class:`~berth.service.scheduler.SchedulerService`, or a client that calls
    scheduler processes over the bus (:class:`~berth.service.scheduler_rpc.RemoteScheduler`)."""

    config: SchedulerConfig
    claimer: Any

    def new_instance_uuids(self, count: int) -> list[str]:
        """Name ``count`` instances before they are scheduled."""
        ...

    def select_destinations(self, spec: RequestSpec, instance_uuids: Sequence[str] | None = None,
                            *, return_alternates: bool = True, explain: bool = False) -> Decision:
        """Host lists for the instances, claimed; NoValidHost when not all fit."""
        ...


def build_with_late_check(
    group_check: GroupPolicyCheck, config: SchedulerConfig, selection: Selection,
    instance_uuid: str, spec: RequestSpec, build: Callable[[], None],
) -> None:
    """The build on the compute side: the late group check (for a hard policy, unless
    ``[workarounds] disable_group_policy_check_upcall``), then ``build`` (the driver's).
    A violation is a :class:`BuildFailed` with Nova's message; it never reaches the
    driver, so the host does not count it as a failed build."""
    group = spec.instance_group
    if (group is None or group.policy not in HARD_POLICIES
            or config.workarounds.disable_group_policy_check_upcall):
        build()
        return
    try:
        with group_check.admit(group, instance_uuid, selection.service_host):
            build()
    except GroupPolicyViolation as exc:
        raise BuildFailed(f"Build of instance {instance_uuid} was re-scheduled: {exc}") from None


@dataclass
class BuildResult:
    """Where an instance was built and the hosts tried before it.

    ``host_list`` is the host list the instance was built from (the selected host and
    its alternates; after a reschedule through the scheduler, the last one it
    returned); None: the one of the request's decision."""

    instance_uuid: str
    host: str
    nodename: str
    tried: list[str]
    host_list: list[Selection] | None = None


@dataclass
class BuildFailure:
    """An instance that was not built: why (MaxRetriesExceeded, or an internal error
    whose trace is logged) and the hosts tried."""

    instance_uuid: str
    error: BerthError
    tried: list[str]


@dataclass
class BuildOutcome:
    """The instances of one request that were built, and those that were not."""

    built: list[BuildResult] = field(default_factory=list)
    failed: list[BuildFailure] = field(default_factory=list)


class Conductor:
    """Schedules, builds, and reschedules onto alternates (reference §8.6, Nova's
    ``build_instances`` with host lists).

    ``builds`` records every instance from before its claim to its outcome (none: no
    records, and nothing for the reconciler to recover after a crash). ``groups`` is
    where boots record their instances as group members (none: the members live only
    in the request); ``instances`` is where built instances are recorded with their
    request spec, for moves (none: not recorded); with ``builds`` it must be on the
    same database (a build settles and records its instance in one transaction).
    ``group_check`` is the late group
    check; the conductors of one process should share one (its lock and its builds in flight), as
    :meth:`~berth.service.stack.Stack.conductor` does; without it the conductor makes
    its own over the scheduler's record store. ``late_check_on_compute`` leaves the
    check to the compute side (the agents of ``berth compute``, reached through a
    driver that calls them over the bus, run :func:`build_with_late_check` there, as
    Nova's compute manager does).
    """

    def __init__(
        self,
        scheduler: SchedulerService | SchedulerAPI,
        driver: ComputeDriver,
        claimer: PlacementClaimer | None = None,
        config: SchedulerConfig | None = None,
        groups: ServerGroupStore | None = None,
        group_check: GroupPolicyCheck | None = None,
        builds: BuildRecords | None = None,
        instances: InstanceStore | None = None,
        *,
        late_check_on_compute: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.builds = builds
        #: Where built instances are recorded with their spec (what a move reads back).
        self.instances = instances
        self.driver = driver
        self.claimer = claimer or scheduler.claimer
        self.config = config or scheduler.config
        self.groups = groups
        self.group_check: GroupPolicyCheck | None = None
        if not late_check_on_compute:
            if group_check is None:
                if groups is not None:
                    locator: Any = groups.placements
                elif isinstance(scheduler, SchedulerService):
                    locator = RunningInstances(scheduler.feed.store)
                else:
                    raise ValueError("a conductor over a remote scheduler needs groups, "
                                     "group_check or late_check_on_compute")
                group_check = GroupPolicyCheck(locator, groups)
            self.group_check = group_check

    def build_instances(
        self, spec: RequestSpec, instance_uuids: Sequence[str] | None = None
    ) -> list[BuildResult]:
        """Schedule ``spec`` and build each instance; NoValidHost or MaxRetriesExceeded.

        Without ``instance_uuids`` the instances are named here, before scheduling (as
        Nova's API has named them by the time its conductor asks), so the scheduler
        claims for them."""
        if instance_uuids is None:
            instance_uuids = self.scheduler.new_instance_uuids(spec.num_instances)
        _, outcome = self.schedule_and_build(spec, instance_uuids)
        if outcome.failed:
            # The others were built all the same; the error says which ones.
            error = outcome.failed[0].error
            error.details["built"] = [b.instance_uuid for b in outcome.built]
            error.details["failed"] = [f.instance_uuid for f in outcome.failed]
            raise error
        return outcome.built

    def schedule_and_build(
        self, spec: RequestSpec, instance_uuids: Sequence[str], *, explain: bool = False
    ) -> tuple[Decision, BuildOutcome]:
        """One boot: the instances are recorded as building, join the request's server
        group, the scheduler chooses (and claims) hosts, each instance is built on its
        own host list, and each record settles as active or failed.

        The build records come first, before anything is claimed, so a crash at any
        later point leaves records the reconciler finds. The instances are members
        before they are scheduled, as Nova's API adds them, so a concurrent boot's late
        check counts each one once it is claimed. Those that end up not built leave the
        group again, whatever went wrong (NoValidHost too). The request's group
        (``spec.instance_group``) gains the instances as well.
        """
        group = spec.instance_group
        group_uuid = group.uuid if group is not None and self.groups is not None else ""
        if self.builds is not None:
            self.builds.begin(instance_uuids, f"req-{uuidlib.uuid4()}", group_uuid or None,
                              spec=json.dumps(spec_to_dict(spec), sort_keys=True))
        if group is not None:
            known = set(group.members)
            group.members.extend(u for u in instance_uuids if u not in known)
        built: set[str] = set()
        settled: set[str] = set()
        try:
            if group_uuid and self.groups is not None:
                self.groups.add_members(group_uuid, instance_uuids)
            decision = self.select_destinations(spec, instance_uuids, explain=explain)
            outcome = self.build_all(decision, spec)
            recorded = self._settle(outcome, settled, spec)
            built.update(b.instance_uuid for b in outcome.built)
            if self.instances is not None and not recorded:
                self.instances.record_many((b.instance_uuid, b.host, b.nodename, spec)
                                           for b in outcome.built)
            return decision, outcome
        except BaseException as exc:
            if self.builds is not None:
                for uuid in instance_uuids:
                    if uuid not in settled:
                        self._settle_one(uuid, FAILED, reason=f"not built: {exc}")
            raise
        finally:
            if group_uuid and self.groups is not None:
                self.groups.remove_members(group_uuid,
                                           [u for u in instance_uuids if u not in built])

    def _settle(self, outcome: BuildOutcome, settled: set[str], spec: RequestSpec) -> bool:
        """Settle the build records of ``outcome``. A build whose record is no longer
        ours (the reconciler took it as abandoned: this process was silent past the
        build timeout) does not count as built: its claim goes and it moves to
        ``outcome.failed``. True when each built instance's row (of ``spec``) was
        recorded in its build's settling transaction: the caller has none left to
        record."""
        if self.builds is None:
            return False
        instances = self.instances
        kept: list[BuildResult] = []
        for result in outcome.built:
            also = (instances.upserts([(result.instance_uuid, result.host, result.nodename,
                                        spec)])
                    if instances is not None else ())
            try:
                ours = self.builds.settle(result.instance_uuid, ACTIVE, host=result.host,
                                          also=also)
            except ServiceUnavailable as exc:
                # It is built and its claim is held: the answer says so (a client that
                # retried an error would build it twice), and the record is written
                # once the database takes it (the reconciler's heartbeat round).
                LOG.warning("build of %s on %s finished, but its record cannot be written "
                            "now (%s); it is written when the database is back",
                            result.instance_uuid, result.host, exc.message)
                self.builds.defer(result.instance_uuid, ACTIVE, host=result.host, also=also,
                                  undo=functools.partial(self._undo_build, result))
                kept.append(result)
                settled.add(result.instance_uuid)
                continue
            error = BerthError(f"build of instance {result.instance_uuid} was abandoned (its "
                               f"process was silent past the build timeout)")
            completed = False if ours else self._completed_meanwhile(result)
            if completed is None:  # the record cannot be read now: decided later
                self.builds.defer(result.instance_uuid, ACTIVE, host=result.host, also=also,
                                  undo=functools.partial(self._undo_build, result))
                kept.append(result)
            elif ours or completed:
                kept.append(result)
            else:
                LOG.error("build of %s on %s cannot be recorded (%s); its claim is "
                          "released and its host drops it", result.instance_uuid, result.host,
                          error.message)
                self.claimer.delete(result.instance_uuid)
                self._undo_build(result)
                outcome.failed.append(BuildFailure(result.instance_uuid, error, result.tried))
            settled.add(result.instance_uuid)
        outcome.built = kept
        for failure in outcome.failed:
            if failure.instance_uuid not in settled:
                self._settle_one(failure.instance_uuid, FAILED, reason=failure.error.message)
                settled.add(failure.instance_uuid)
        return instances is not None

    def _completed_meanwhile(self, result: BuildResult) -> bool | None:
        """Whether the reconciler of some process recorded this build as active on its
        host while this one could not (it found the instance running there, with its
        claim): it is built, and its claim and instance row stand. None when the record
        cannot be read now."""
        assert self.builds is not None
        try:
            record = self.builds.get(result.instance_uuid)
        except ServiceUnavailable:
            return None
        if record is None or (record.state, record.host) != (ACTIVE, result.host):
            return False
        LOG.info("build of %s on %s was recorded by a reconciler meanwhile",
                 result.instance_uuid, result.host)
        return True

    def _undo_build(self, result: BuildResult) -> None:
        """Have the host drop an instance whose build does not count (best effort: the
        driver may have no such call, or its host may not answer)."""
        terminate = getattr(self.driver, "terminate", None)
        if not callable(terminate):
            return
        try:
            terminate(result.instance_uuid, result.host, result.nodename)
        except Exception:  # logged; the build is refused all the same
            LOG.exception("could not have %s drop %s", result.host, result.instance_uuid)

    def _settle_one(self, instance_uuid: str, state: str, *, host: str | None = None,
                    reason: str | None = None) -> bool:
        """One record; a database error is logged (the record stays ``building``, turns
        stale and the reconciler settles it) and counts as not settled."""
        if self.builds is None:
            return True
        try:
            return self.builds.settle(instance_uuid, state, host=host, reason=reason)
        except Exception:
            LOG.exception("could not record %s as %s; the reconciler will", instance_uuid,
                          state)
            return False

    def select_destinations(
        self, spec: RequestSpec, instance_uuids: Sequence[str], *, explain: bool = False
    ) -> Decision:
        """Ask the scheduler for host lists, claiming for ``instance_uuids``.

        The core rolls its own claims back when it raises; an error in the scheduler
        service after the core has returned (its claims made) would not, so on any error
        but NoValidHost every instance's claim is released here before the error goes on.
        """
        try:
            return self.scheduler.select_destinations(spec, instance_uuids, explain=explain)
        except NoValidHost:
            raise
        except BaseException:
            for uuid in instance_uuids:
                self.claimer.delete(uuid)
            raise

    def build_all(self, decision: Decision, spec: RequestSpec) -> BuildOutcome:
        """Build every instance of ``decision``, each on its own host list.

        An instance that runs out of hosts (MaxRetriesExceeded) or hits an unexpected
        error (logged with its trace) is recorded as failed and the next instance is
        built all the same. Afterwards no instance that was not built holds a claim:
        :meth:`build_one` releases its own on every failure, and whatever was never
        attempted (the loop itself interrupted) is released here.
        """
        outcome = BuildOutcome()
        settled: set[str] = set()
        try:
            for uuid, hosts in zip(decision.instance_uuids, decision.selections):
                try:
                    outcome.built.append(self.build_one(uuid, hosts, spec))
                except (MaxRetriesExceeded, NoValidHost) as exc:
                    outcome.failed.append(BuildFailure(uuid, exc, list(exc.details.get("tried", []))))
                except ServiceUnavailable as exc:  # the database: the others may fare better
                    self.claimer.delete(uuid)
                    outcome.failed.append(BuildFailure(uuid, exc, []))
                except Exception as exc:  # one instance's bug must not strand the others' claims
                    self.claimer.delete(uuid)  # a claim on an alternate may have been made
                    if unavailable(exc):
                        outcome.failed.append(BuildFailure(uuid, as_unavailable(exc), []))
                    else:
                        LOG.exception("building %s failed", uuid)
                        outcome.failed.append(BuildFailure(uuid, BerthError(
                            f"internal error building instance {uuid} (logged)"), []))
                settled.add(uuid)
        finally:
            for uuid in decision.instance_uuids:
                if uuid not in settled:
                    self.claimer.delete(uuid)
        return outcome

    def build_one(
        self, instance_uuid: str, host_list: Sequence[Selection], spec: RequestSpec
    ) -> BuildResult:
        """Build on ``host_list[0]`` (already claimed), else on the alternates in order.

        MaxRetriesExceeded after ``max_attempts`` builds or without alternates left; on
        that or any other error the instance holds no claim any more. With RetryFilter
        enabled the scheduler is asked again instead (:meth:`build_with_retries`)."""
        if self.reschedules_through_scheduler:
            return self.build_with_retries(instance_uuid, host_list, spec)
        max_attempts = self.config.scheduler.max_attempts
        tried: list[str] = []
        attempts = 0
        for position, selection in enumerate(host_list):
            if attempts >= max_attempts:
                break
            if position > 0:
                alloc_req = selection.allocation_request_dict
                if alloc_req is not None and not self.claimer.claim(
                        instance_uuid, alloc_req, spec, selection.allocation_request_version):
                    LOG.info("alternate %s refused the claim for %s; next alternate",
                             selection.service_host, instance_uuid)
                    continue
            attempts += 1
            tried.append(selection.service_host)
            try:
                self.spawn(selection, instance_uuid, spec)
            except BuildFailed as exc:
                LOG.info("%s; rescheduling", exc)
                # The claim on the failed host goes before another host is claimed.
                self.claimer.delete(instance_uuid)
                continue
            except BaseException:
                # Not a reschedulable failure: the build stops here, and its claim too.
                self.claimer.delete(instance_uuid)
                raise
            return BuildResult(instance_uuid, selection.service_host, selection.nodename, tried)
        raise MaxRetriesExceeded(
            f"Exceeded maximum number of retries. Exhausted all hosts available for retrying "
            f"build failures for instance {instance_uuid}.",
            instance_uuid=instance_uuid, tried=tried)

    @property
    def reschedules_through_scheduler(self) -> bool:
        """True when RetryFilter is enabled: failed builds go back to the scheduler
        (seeds 000-002) instead of to the alternates."""
        return "RetryFilter" in self.config.filter_scheduler.enabled_filters

    def build_with_retries(
        self, instance_uuid: str, host_list: Sequence[Selection], spec: RequestSpec
    ) -> BuildResult:
        """Nova's pre-alternates reschedule loop for one instance (``populate_retry``).

        Attempt 1 is ``host_list[0]`` (claimed by the scheduler). A failed build's claim
        is deleted, ``retry.num_attempts`` grows and the tried ``[host, node]`` joins
        ``retry.hosts``; beyond ``max_attempts`` (or with no retry information: one
        attempt allowed, or a single forced host or node) MaxRetriesExceeded, else the
        scheduler places this one instance again, with RetryFilter reading ``retry``.
        Its NoValidHost ends the instance too. No claim is left on any error."""
        max_attempts = self.config.scheduler.max_attempts
        forced = len(spec.force_hosts or []) == 1 or len(spec.force_nodes or []) == 1
        retry = None if max_attempts == 1 or forced else SchedulerRetries(num_attempts=1)
        hosts = list(host_list[:1])
        tried: list[str] = []
        while True:
            selection = hosts[0]
            tried.append(selection.service_host)
            if retry is not None:
                retry.hosts.append(ComputeNodeRef(selection.service_host, selection.nodename))
            try:
                self.spawn(selection, instance_uuid, spec)
            except BuildFailed as exc:
                self.claimer.delete(instance_uuid)
                if retry is None or retry.num_attempts >= max_attempts:
                    why = ("a build with one attempt allowed or on a single forced host is "
                           "not rescheduled" if retry is None else
                           f"Exceeded maximum number of retries ({max_attempts}) for "
                           f"instance {instance_uuid}")
                    raise MaxRetriesExceeded(f"{exc}; {why}.", instance_uuid=instance_uuid,
                                             tried=tried) from None
                retry.num_attempts += 1
                LOG.info("%s; asking the scheduler again (attempt %d of %d, RetryFilter "
                         "excludes %s)", exc, retry.num_attempts, max_attempts,
                         ", ".join(f"{r.host}/{r.hypervisor_hostname}" for r in retry.hosts))
                hosts = self._reschedule(instance_uuid, spec, retry, tried)
                continue
            except BaseException:
                self.claimer.delete(instance_uuid)
                raise
            return BuildResult(instance_uuid, selection.service_host, selection.nodename,
                               tried, hosts)

    def _reschedule(self, instance_uuid: str, spec: RequestSpec, retry: SchedulerRetries,
                    tried: list[str]) -> list[Selection]:
        """This instance alone, scheduled (and claimed) again with ``retry``."""
        again = copy.deepcopy(spec)
        again.num_instances = 1
        again.retry = copy.deepcopy(retry)
        try:
            decision = self.select_destinations(again, [instance_uuid])
        except NoValidHost as exc:
            exc.details.update(instance_uuid=instance_uuid, tried=list(tried))
            raise
        return list(decision.selections[0])

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec,
              build: Callable[[], None] | None = None) -> None:
        """The per-build call into the compute side (:func:`build_with_late_check`), or
        the build alone when the compute side runs the late check itself.

        ``build`` replaces the driver's ``spawn`` (a move builds on the destination
        with the driver's move call, under the same check, as Nova's destination
        compute checks the group policy for a move too)."""
        run = build or (lambda: self.driver.spawn(selection, instance_uuid, spec))
        if self.group_check is None:
            run()
            return
        build_with_late_check(self.group_check, self.config, selection, instance_uuid, spec, run)
