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

The compute driver is pluggable (:class:`ComputeDriver`); :class:`FakeDriver` can be told
to fail on given hosts or for a host's first N attempts, for tests and simulations.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from berth.config import SchedulerConfig
from berth.errors import BerthError, MaxRetriesExceeded, NoValidHost
from berth.model.request import RequestSpec
from berth.model.selection import Selection
from berth.pipeline import Decision
from berth.service.compute import ComputeAgent
from berth.service.placement import PlacementClaimer
from berth.service.scheduler import SchedulerService

LOG = logging.getLogger(__name__)


class BuildFailed(Exception):
    """The driver could not build the instance on the host (a reschedulable failure)."""


class ComputeDriver(Protocol):
    """Builds instances on hosts."""

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        """Build ``instance_uuid`` on the selection's host or raise :class:`BuildFailed`."""
        ...


@dataclass
class FakeDriver:
    """A driver that succeeds unless told otherwise.

    ``fail_hosts`` always fail; ``fail_first`` maps a host to how many of its attempts
    fail before it succeeds; a host whose agent in ``agents`` is down (silent or forced
    down) fails every build, as a host that is not running builds nothing. Successful
    builds are recorded in ``built`` and, when the host has a :class:`ComputeAgent`,
    accounted and reported by it; the agent also counts the failed builds (not those of
    a down host, which never got to try) and resets the count on a success.
    """

    fail_hosts: set[str] = field(default_factory=set)
    fail_first: dict[str, int] = field(default_factory=dict)
    agents: Mapping[str, ComputeAgent] = field(default_factory=dict)
    built: dict[str, str] = field(default_factory=dict)
    attempts: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        """Fail as configured, else record the instance (and report it via the agent)."""
        host = selection.service_host
        agent = self.agents.get(host)
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
            agent.record_successful_build()
            agent.spawn(instance_uuid, spec.flavor, spec.project_id)


@dataclass
class BuildResult:
    """Where an instance was built and the hosts tried before it."""

    instance_uuid: str
    host: str
    nodename: str
    tried: list[str]


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
    ``build_instances`` with host lists)."""

    def __init__(
        self,
        scheduler: SchedulerService,
        driver: ComputeDriver,
        claimer: PlacementClaimer | None = None,
        config: SchedulerConfig | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.driver = driver
        self.claimer = claimer or scheduler.claimer
        self.config = config or scheduler.config

    def build_instances(
        self, spec: RequestSpec, instance_uuids: Sequence[str] | None = None
    ) -> list[BuildResult]:
        """Schedule ``spec`` and build each instance; NoValidHost or MaxRetriesExceeded.

        Without ``instance_uuids`` the instances are named here, before scheduling (as
        Nova's API has named them by the time its conductor asks), so the scheduler
        claims for them."""
        if instance_uuids is None:
            instance_uuids = self.scheduler.new_instance_uuids(spec.num_instances)
        decision = self.select_destinations(spec, instance_uuids)
        outcome = self.build_all(decision, spec)
        if outcome.failed:
            # The others were built all the same; the error says which ones.
            error = outcome.failed[0].error
            error.details["built"] = [b.instance_uuid for b in outcome.built]
            error.details["failed"] = [f.instance_uuid for f in outcome.failed]
            raise error
        return outcome.built

    def select_destinations(
        self, spec: RequestSpec, instance_uuids: Sequence[str], *, explain: bool = False
    ) -> Decision:
        """Ask the scheduler for host lists, claiming for ``instance_uuids``.

        The scheduler rolls its claims back itself when it raises NoValidHost; on any
        other error it may have claimed for some instances already, so every instance's
        claim is released here before the error goes on.
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
                except MaxRetriesExceeded as exc:
                    outcome.failed.append(BuildFailure(uuid, exc, list(exc.details.get("tried", []))))
                except Exception:  # one instance's bug must not strand the others' claims
                    LOG.exception("building %s failed", uuid)
                    self.claimer.delete(uuid)  # a claim on an alternate may have been made
                    outcome.failed.append(BuildFailure(
                        uuid, BerthError(f"internal error building instance {uuid} (logged)"),
                        []))
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
        that or any other error the instance holds no claim any more."""
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
                self.driver.spawn(selection, instance_uuid, spec)
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
