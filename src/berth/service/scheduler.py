"""The scheduler service: a request, end to end through the resource store.

Written down once (reference §8.1)::

    server-group policy without its filter/weigher -> UnsupportedPolicy (§8.6)
      ▼
    refresh the host snapshot from compute reports (only what changed)
      │
      ▼  not a rebuild:
    request filters (§9)            RequestFilterFailed -> NoValidHost("Scheduling failed: ...")
      ▼
    placement query (§8.5)          unknown forced host/node -> NoValidHost
      ▼
    GET /allocation_candidates @1.36   (+ the VCPU fallback query for pinned CPUs)
      ▼                             no allocation requests -> NoValidHost("")
    CandidateSet: rows of the compute nodes in provider_summaries, with their requests
      ▼
    Scheduler.select_destinations (filters, weighers, claims through PlacementClaimer)
      ▼
    only with [filter_scheduler] consume_between_reports (Berth, off by default):
    the chosen rows keep the request's consumption until their hosts report again
      ▼
    per instance: the selected host + alternates, each with its allocation request

As in Nova 34 (§2.4), every request starts from the hosts as they last reported: a
request's virtual consumption lives in its own working set only. Placement's usage,
which every claim updates, is what keeps the next request off a full host.

On a rebuild nothing is claimed and placement is not consulted. The pure core gets the
scheduling instant and a seeded generator from here; this is the only place that reads
the clock.
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from berth.claims import CandidateSet, Claimer
from berth.config import SchedulerConfig
from berth.errors import InputError, NoValidHost
from berth.filters.availability_zone import available_zones
from berth.model.aggregate import Aggregate
from berth.model.request import RequestSpec, new_instance_uuids
from berth.pipeline import Decision, Scheduler
from berth.request_filters import NetworkLookup, RequestFilterFailed, process_reqspec
from berth.resource_request import NodeRef, resources_from_request_spec
from berth.service.placement import (
    CandidatesAnswer,
    PlacementCandidates,
    PlacementClaimer,
    candidate_set,
    placement_rejections,
)
from berth.service.records import SnapshotFeed
from berth.snapshot import HostSnapshot

LOG = logging.getLogger(__name__)


#: Reports (row rewrites) after which the long-lived heap counts as renewed; see
#: :meth:`SchedulerService._freeze_long_lived`.
REFREEZE_MIN_CHANGES = 1000


#: Request latencies a scheduler keeps for its statistics (the latest ones).
LATENCY_WINDOW = 100_000


@dataclass
class ServiceStats:
    """Counters and timings of one scheduler service."""

    requests: int = 0
    placed: int = 0
    no_valid_host: int = 0
    candidate_queries: int = 0
    fallback_queries: int = 0
    #: The latest errors of the candidates queries (a window, as ``latencies``).
    candidate_errors: deque[str] = field(default_factory=lambda: deque(maxlen=100))
    #: Seconds of the latest requests (a window: a scheduler runs for months), and how
    #: many requests were timed in all.
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    timed: int = 0

    def record_latency(self, seconds: float) -> None:
        self.latencies.append(seconds)
        self.timed += 1

    def latencies_since(self, seen: int) -> list[float]:
        """The latencies of the requests timed after the first ``seen`` (those still in
        the window)."""
        new = self.timed - seen
        if new <= 0:
            return []
        window = list(self.latencies)
        return window[-new:] if new < len(window) else window


class SchedulerService:
    """Request filters, the placement query, candidates, the core and claims, wired.

    ``candidates``/``claimer`` talk to Placement; ``feed`` supplies the host snapshot;
    ``network_lookup`` and ``min_compute_version`` are handed to the request filters.
    ``clock`` gives the scheduling instant; ``seed`` makes decisions replayable;
    ``freeze_heap`` (default on) lets the service freeze its long-lived heap, see
    :meth:`_freeze_long_lived`.

    Each service breaks ties among equally weighed hosts in its own order (the core's
    ``tie_salt``, derived from ``seed``, or random without one), as every Nova scheduler
    process walks hosts in its own arbitrary order: several schedulers in front of
    identical hosts then do not all claim the same host first.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        feed: SnapshotFeed,
        candidates: PlacementCandidates,
        claimer: PlacementClaimer,
        *,
        scheduler: Scheduler | None = None,
        network_lookup: NetworkLookup | None = None,
        min_compute_version: int | None = None,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
        freeze_heap: bool = True,
        uuid_rng: random.Random | None = None,
        taken_uuids: frozenset[str] = frozenset(),
        check_zone: bool = True,
    ) -> None:
        self.config = config
        #: Refuse a zone no enabled service is in, as Nova's API does (Berth's own APIs
        #: and offline commands stand where it stands); not behind a real Nova's API,
        #: whose scheduler takes the request as it comes.
        self.check_zone = check_zone
        self.feed = feed
        self.candidates = candidates
        self.claimer = claimer
        self.scheduler = scheduler or Scheduler(config, tie_salt=tie_salt(seed))
        self.network_lookup = network_lookup
        self.min_compute_version = min_compute_version
        self.clock = clock
        self.rng = random.Random(seed)
        self.uuid_rng = uuid_rng or self.rng
        self.taken_uuids = taken_uuids
        self.stats = ServiceStats()
        # The snapshot is shared and refreshed (and, with consume_between_reports,
        # consumed from) in place, so one request at a time per service (run several
        # services to go parallel).
        self._lock = threading.Lock()
        self._frozen_at: int | None = None
        self.freeze_heap = freeze_heap
        #: Called after every request with (outcome, seconds, placed=, cause=):
        #: ``Metrics.observe_decision`` in a serving process.
        self.observers: list[Callable[..., None]] = []

    # ----------------------------------------------------------------- helpers
    def _freeze_long_lived(self, snapshot: HostSnapshot) -> None:
        """Move the heap as it is into the collector's permanent generation
        (``gc.freeze``) after the first request, and again once the snapshot has been
        largely rewritten.

        The snapshot and the store's candidate graph are a few hundred objects per host
        and live for the process's life; every full collection walks them all, which at
        10,000 hosts took a third of a request's time. Frozen objects are still freed by
        reference counting when dropped; only cycle detection skips them. Objects made
        later are collected as usual. ``freeze_heap=False`` leaves the collector alone
        (for a service embedded in a process that manages its own heap).
        """
        if not self.freeze_heap:
            return
        changed = snapshot.structure_generation
        if self._frozen_at is None or changed - self._frozen_at >= max(
            REFREEZE_MIN_CHANGES, len(snapshot) // 2
        ):
            gc.freeze()
            self._frozen_at = changed

    def _find_nodes(self, snapshot: HostSnapshot) -> Callable[[str | None, str | None], list[NodeRef]]:
        def find(host: str | None, node: str | None) -> list[NodeRef]:
            hosts, nodes, uuids = snapshot.obj("host"), snapshot.obj("nodename"), snapshot.obj("uuid")
            return [NodeRef(str(uuids[r]), hosts[r], nodes[r]) for r in range(len(snapshot))
                    if uuids[r] and (host is None or hosts[r] == host)
                    and (node is None or nodes[r] == node)]

        return find

    def _aggregates(self, snapshot: HostSnapshot) -> list[Aggregate]:
        return snapshot.aggregates

    def query_candidates(
        self, spec: RequestSpec, snapshot: HostSnapshot, *, explain: bool = False
    ) -> CandidateSet:
        """Request filters, the query (and its PCPU fallback) and the row mapping.

        With ``explain``, the rows placement left out carry their reasons, and an empty
        answer goes on to the core (which raises NoValidHost with the explanation)
        instead of raising here.
        """
        try:
            process_reqspec(spec, self.config, self._aggregates(snapshot),
                            network_lookup=self.network_lookup,
                            min_compute_version=self.min_compute_version)
        except RequestFilterFailed as exc:
            raise NoValidHost(exc.message, cause="request_filter") from exc
        resources = resources_from_request_spec(spec, self.config, self._find_nodes(snapshot))
        self.stats.candidate_queries += 1
        answer: CandidatesAnswer = self.candidates.get(resources.to_queryparams())
        if answer.error:
            self.stats.candidate_errors.append(answer.error)
        if resources.cpu_pinning_requested and not self.config.workarounds.disable_fallback_pcpu_query:
            fallback = resources_from_request_spec(spec, self.config, self._find_nodes(snapshot),
                                                   enable_pinning_translate=False)
            self.stats.fallback_queries += 1
            answer.merge(self.candidates.get(fallback.to_queryparams()))
        if answer.empty and not explain:
            raise NoValidHost(cause="placement")
        candidates = candidate_set(snapshot, answer, self.feed.uuid_rows)
        if explain:
            candidates.rejections = placement_rejections(snapshot, answer, candidates, spec,
                                                         self.feed.uuid_rows, self.config)
        return candidates

    def refresh(self) -> HostSnapshot:
        """The snapshot, brought up to date, read under the request lock."""
        with self._lock:
            return self.feed.refresh()

    # ----------------------------------------------------------------- entry point
    def new_instance_uuids(self, count: int) -> list[str]:
        """``count`` instance uuids, for callers that name instances before scheduling
        them (the API, the conductor), as Nova's API does: from ``uuid_rng``, by default
        the decisions' seeded generator (a seeded run replays). A service over a shared
        database gets its own generator, which a restart never repeats
        (:func:`~berth.service.builds.instance_uuid_rng`). A uuid among
        ``taken_uuids`` is drawn again."""
        uuids = new_instance_uuids(self.uuid_rng, count)
        if self.taken_uuids:
            for i, uuid in enumerate(uuids):
                while uuid in self.taken_uuids:
                    uuid = new_instance_uuids(self.uuid_rng, 1)[0]
                uuids[i] = uuid
        return uuids

    def select_destinations(
        self,
        spec: RequestSpec,
        instance_uuids: Sequence[str] | None = None,
        *,
        return_alternates: bool = True,
        explain: bool = False,
        builds_in_flight: bool = True,
        claim: bool = True,
        check_zone: bool = True,
    ) -> Decision:
        """Place every instance of ``spec``; raises NoValidHost (claims rolled back).
        ``check_zone`` false: a move, which keeps the zone its instance was booted in
        unchecked (Nova's API checks a zone when a server is created only).
        ``claim`` false is Nova's path for a conductor that sends no instance uuids
        (RPC 4.0-4.2): hosts are chosen, nothing is claimed.
        ``builds_in_flight`` false: the core counts placed instances as built (see
        :meth:`berth.pipeline.Scheduler.select_destinations`).

        Without ``instance_uuids`` the service names ``spec.num_instances`` instances
        itself (:meth:`new_instance_uuids`) and claims for them: Berth has no old
        conductor to serve, so only the core, called directly without uuids, takes
        Nova's non-claiming legacy path. A rebuild claims nothing either way.
        """
        started = time.perf_counter()
        with self._lock:
            self.stats.requests += 1
            try:
                decision = self._select(spec, instance_uuids, return_alternates, explain,
                                        builds_in_flight, claim, check_zone=check_zone)
            except NoValidHost as exc:
                self.stats.no_valid_host += 1
                self._observe("no_valid_host", started, cause=exc.cause or "hosts",
                              rejections=exc.rejections)
                LOG.info("NoValidHost for %d x %s (%s) in %.1f ms: %s", spec.num_instances,
                         spec.flavor.name, exc.cause or "hosts",
                         1000 * (time.perf_counter() - started), exc.message)
                raise
            except Exception:
                self._observe("error", started)
                raise
            finally:
                self.stats.record_latency(time.perf_counter() - started)
                self._freeze_long_lived(self.feed.snapshot)
            self.stats.placed += len(decision.selections)
        self._observe("placed", started, placed=len(decision.selections),
                      rejections=decision.rejections)
        if LOG.isEnabledFor(logging.INFO):
            LOG.info("placed %d x %s in %.1f ms: %s", len(decision.selections),
                     spec.flavor.name, 1000 * (time.perf_counter() - started),
                     ", ".join(f"{uuid[:8]}->{sels[0].service_host}"
                               + (f"/{sels[0].nodename}"
                                  if sels[0].nodename != sels[0].service_host else "")
                               for uuid, sels in zip(decision.instance_uuids,
                                                     decision.selections)))
        return decision

    def warm(self) -> None:
        """Read the hosts and placement's providers now, so the first request costs
        what the others do (at 10,000 hosts it took a second more: the providers were
        read on the first query)."""
        with self._lock:
            self.feed.refresh()
            self.candidates.warm()

    def what_if(self, spec: RequestSpec) -> Decision:
        """The explained decision a boot of ``spec`` would get now, with nothing claimed.

        The same steps as :meth:`select_destinations` (request filters, placement's
        candidates, the filters and weighers, a claim per instance) with throwaway
        instance uuids and a :class:`~berth.service.placement.TrialClaimer`: each claim
        is checked against placement's inventories and usages, none is written. The
        random draws (``host_subset_size``) start from a copy of the service's generator:
        the next real boot draws the same. Raises NoValidHost with the explanation."""
        import uuid as uuidlib

        from berth.service.placement import TrialClaimer

        client = getattr(self.claimer, "client", None)
        if client is None:
            raise InputError("what-if: this scheduler claims through no placement client",
                             field="what-if")
        uuids = [str(uuidlib.uuid4()) for _ in range(spec.num_instances)]
        with self._lock:
            return self._select(spec, uuids, True, True, trial=TrialClaimer(client))

    def _observe(self, outcome: str, started: float, *, placed: int = 0,
                 cause: str | None = None, rejections: dict[str, int] | None = None) -> None:
        """Tell the observers (metrics) about one request."""
        seconds = time.perf_counter() - started
        for observer in self.observers:
            observer(outcome, seconds, placed=placed, cause=cause, rejections=rejections or {})

    def _select(
        self, spec: RequestSpec, instance_uuids: Sequence[str] | None,
        return_alternates: bool, explain: bool, builds_in_flight: bool = True,
        claim: bool = True, *, trial: Claimer | None = None, check_zone: bool = True,
    ) -> Decision:
        """The request under the service's lock. ``trial`` (a claimer that writes
        nothing) makes it a what-if: its claims, a copy of the random generator, and
        nothing consumed in the snapshot."""
        # Nova's conductor refuses an unsupported group policy before asking the
        # scheduler: before the request filters and the placement query.
        self.scheduler.check_group_policy(spec)
        snapshot = self.feed.refresh()
        now = self.clock()
        rng = self.rng
        claimer: Claimer | None = self.claimer if claim else None
        if trial is not None:
            rng, claimer = random.Random(), trial
            rng.setstate(self.rng.getstate())
        if spec.is_rebuild():
            return self.scheduler.select_destinations(
                spec, snapshot, now=now, rng=rng, candidates=None, claimer=None,
                instance_uuids=instance_uuids, return_alternates=return_alternates,
                explain=explain)
        if check_zone:
            self._check_zone(spec, snapshot)
        if not claim:
            instance_uuids = None
        elif instance_uuids is None:
            instance_uuids = self.new_instance_uuids(spec.num_instances)
        # The request filters and the query fill in the spec (destination, traits);
        # the caller's spec stays as it was.
        import copy

        spec = copy.deepcopy(spec)
        candidates = self.query_candidates(spec, snapshot, explain=explain)
        decision = self.scheduler.select_destinations(
            spec, snapshot, now=now, rng=rng, candidates=candidates, claimer=claimer,
            instance_uuids=instance_uuids, return_alternates=return_alternates,
            explain=explain, copy_spec=False, builds_in_flight=builds_in_flight)
        if trial is None and self.config.filter_scheduler.consume_between_reports:
            self._consume_locally(snapshot, spec, decision)
        return decision

    def _check_zone(self, spec: RequestSpec, snapshot: HostSnapshot) -> None:
        """Refuse a zone no enabled compute service is in, as Nova's API refuses it
        ("The requested availability zone is not available", a 400) before anything is
        scheduled."""
        zone = spec.availability_zone
        if not self.check_zone or not zone:
            return
        known = available_zones(snapshot, self.config.default_availability_zone)
        if zone not in known:
            raise InputError(
                f"availability_zone: the requested availability zone {zone!r} is not "
                f"available (available: {', '.join(sorted(known)) or 'none'})",
                field="availability_zone")

    def _consume_locally(self, snapshot: HostSnapshot, spec: RequestSpec, decision: Decision) -> None:
        """Reflect the claims in this service's snapshot until the hosts report again
        (``consume_between_reports``; the numbers of §2.3, not NUMA or PCI usage)."""
        flavor = spec.flavor
        for selections in decision.selections:
            row = snapshot.row_of(selections[0].service_host, selections[0].nodename)
            if row is None:
                continue
            consume_row(snapshot, row, flavor.vcpus, flavor.memory_mb,
                        flavor.root_gb + flavor.ephemeral_gb)


def tie_salt(seed: int | None) -> int:
    """A scheduler's tie salt: derived from its seed (replayable), random without one."""
    if seed is None:
        return random.SystemRandom().getrandbits(64)
    return random.Random(f"berth.tie-order:{seed}").getrandbits(64)


def consume_row(snapshot: HostSnapshot, row: int, vcpus: int, memory_mb: int, disk_gb: int) -> None:
    """Nova's ``consume_from_request`` numbers (§2.3), written into the shared snapshot:
    RAM, disk (root + ephemeral), vCPUs, one more instance and one more IO operation."""
    snapshot.update_host(
        row,
        free_ram_mb=snapshot.num("free_ram_mb")[row] - memory_mb,
        free_disk_mb=snapshot.num("free_disk_mb")[row] - disk_gb * 1024,
        vcpus_used=snapshot.num("vcpus_used")[row] + vcpus,
        num_instances=snapshot.num("num_instances")[row] + 1,
        num_io_ops=snapshot.num("num_io_ops")[row] + 1,
    )

