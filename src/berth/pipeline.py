"""The scheduling pipeline, written down once (reference §8.2, §8.3, §10.4).

``Scheduler`` is built once from a frozen configuration (filters and weighers are loaded
and instantiated then, so a bad name fails at start-up). ``select_destinations`` is a
pure function of its arguments: a host snapshot, a request, the placement candidates the
adapter fetched, a claimer, the scheduling instant and a seeded random generator. It
reads no database, no global and no clock, so the same inputs give the same decision.

Per request::

    deep-copy the spec ─ check the server-group policy has its filter/weigher
      ▼
    hosts = rows placement returned candidates for (all rows on a rebuild), with a
            service record, minus disabled cells, restricted to the requested cell
      │
      ▼  for each instance k (its uuid set on the spec; no uuids: Nova's legacy path,
      │  spec.num_instances hosts, nothing claimed, alternates without candidates)
    hosts = sorted_hosts(hosts, k)            # the list only ever shrinks
      │     ├ destination / ignore / force pre-filters (forced hosts skip the filters)
      │     ├ enabled filters in order; once-per-request ones only for k = 0;
      │     │ on a rebuild only RUN_ON_REBUILD ones; stop when no host is left;
      │     │ each validates the request when it first runs (a malformed spec of a
      │     │ filter that does not run for this request is never an error, as in Nova)
      │     ├ rank (weighers, or least-cost functions), stable, best first; only the
      │     │ head of the order is materialized (HostOrder), exactly as a full sort;
      │     │ the first ranking's ties go by row, or by the scheduler's tie order
      │     ├ shuffle the hosts tied for best (shuffle_best_same_weighed_hosts)
      │     └ pick at random among the best host_subset_size; it goes first
      ├ claim the first candidate of the first host that accepts (the rest keep order)
      └ consume on the chosen host; server group learns the host and the instance
      ▼
    fewer claimed than asked → roll back every claim of the request, NoValidHost
      ▼
    alternates: re-sort once more if k > 0, then per instance walk the list for hosts of
    the same cell, not chosen by any instance, with candidates; max_attempts - 1 of them
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from berth import plugins
from berth.claims import INSUFFICIENT, CandidateSet, Claimer, ClaimRefusal
from berth.config import SchedulerConfig
from berth.errors import NoValidHost, UnsupportedPolicy
from berth.explain import (
    Diagnosis,
    FilterStep,
    HostRejection,
    HostWeighing,
    InstanceDiagnosis,
    RandomPick,
    WeigherTerm,
)
from berth.filters.base import BaseHostFilter, Reject
from berth.host_order import HostOrder, Level, Levels, best_of, head_of, tie_keys
from berth.host_state import CandidateOverlay, Hosts, HostState, WorkingSet
from berth.model.compute import Instance
from berth.model.request import RequestSpec
from berth.model.selection import Selection, scheduler_limits, selection_dict
from berth.snapshot import HostSnapshot
from berth.weighers.base import BaseHostWeigher
from berth.weighers.handler import PerHostRanker, Ranker, Ranking, WeigherRanker

#: How many of the best hosts an explanation shows the weight breakdown of.
EXPLAIN_TOP_HOSTS = 5

#: Filters a hard server-group policy needs (reference §8.6).
POLICY_FILTERS = {
    "affinity": "ServerGroupAffinityFilter",
    "anti-affinity": "ServerGroupAntiAffinityFilter",
}
#: Weighers a soft server-group policy needs.
POLICY_WEIGHERS = {
    "soft-affinity": "ServerGroupSoftAffinityWeigher",
    "soft-anti-affinity": "ServerGroupSoftAntiAffinityWeigher",
}


@dataclass
class Decision:
    """Per instance, the chosen host first and then its alternates.

    ``instance_uuids`` are the caller's uuids, one per selection; empty when the caller
    passed none (Nova's legacy path has no instance to name).
    """

    selections: list[list[Selection]]
    instance_uuids: list[str]
    diagnosis: Diagnosis | None = None
    #: Hosts each filter removed, summed over the instances (for metrics).
    rejections: dict[str, int] = field(default_factory=dict)

    @property
    def hosts(self) -> list[tuple[str, str]]:
        """``(host, nodename)`` chosen for each instance."""
        return [(s[0].service_host, s[0].nodename) for s in self.selections]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: per instance its uuid, the chosen host's selection fields
        and its alternates, and the diagnosis when there is one: the shape ``POST /boot``
        answers with too (which adds what the builds ``tried``)."""
        answer: dict[str, Any] = {
            "instances": [
                {
                    "instance_uuid": self.instance_uuids[i] if i < len(self.instance_uuids) else None,
                    **selection_dict(sels[0]),
                    "alternates": [selection_dict(s) for s in sels[1:]],
                }
                for i, sels in enumerate(self.selections)
            ],
        }
        if self.diagnosis is not None:
            answer["diagnosis"] = self.diagnosis.to_dict()
        return answer


@dataclass
class _Request:
    """Mutable state of one ``select_destinations`` call."""

    spec: RequestSpec
    ws: WorkingSet
    rng: random.Random
    explain: bool
    diagnosis: Diagnosis | None
    #: Nova's claiming path (candidates and instance uuids); False on the legacy path.
    claiming: bool = False
    current: InstanceDiagnosis | None = None
    selected_rows: list[int] = field(default_factory=list)
    #: Rows whose claim placement refused for capacity: this request only adds usage,
    #: so they are not asked again for its later instances.
    full_rows: set[int] = field(default_factory=set)
    #: Why each of ``full_rows`` was refused (for the explanation of a later instance).
    full_why: dict[int, str | None] = field(default_factory=dict)
    placement_step: FilterStep | None = None
    #: The hosts of cells the request may not use (a move kept in its cell, disabled
    #: cells), explained after placement's step.
    cell_step: FilterStep | None = None
    version: str | None = None
    #: One entry per ranking done in this request (see :class:`Level`).
    levels: Levels = field(default_factory=lambda: Levels())
    #: Filters whose ``validate_request`` has run for this request (by position).
    validated: set[int] = field(default_factory=set)
    #: Hosts each filter removed, summed over the instances.
    rejected: dict[str, int] = field(default_factory=dict)
    #: The step that left the current instance no host: a filter's name, or "claims"
    #: when hosts were left but placement refused each of their claims.
    emptied_by: str | None = None
    #: The bulk view of the last host list filtered or ranked: the next filter, the
    #: ranker and the next instance share it (and its interned codes) while no host is
    #: filtered out (the pipeline passes the very same array then).
    last_hosts: Hosts | None = None

    def hosts(self, rows: np.ndarray) -> Hosts:
        """The :class:`Hosts` view of ``rows``, shared while ``rows`` is the same array."""
        hosts = self.last_hosts
        if hosts is None or hosts.rows is not rows:
            hosts = self.last_hosts = self.ws.hosts(rows)
        return hosts


#: What a request writes into its spec, beyond top-level attributes: each is copied for
#: the request (the flavor, image, hints and host lists are only read, and shared).
_WRITTEN_INTO = ("instance_group", "requested_resources", "request_level_params",
                 "requested_destination", "numa_topology", "pci_requests", "retry")


def private_copy(spec: RequestSpec) -> RequestSpec:
    """A copy of ``spec`` a request may write to without the caller seeing it: a new
    top level, with its own copies of the parts a request writes into (group members
    and hosts, request groups' provider mappings, the NUMA topology it fits, ...). A
    deep copy of the whole spec cost a twentieth of a request at 1,000 hosts."""
    new = copy.copy(spec)
    for name in _WRITTEN_INTO:
        value = getattr(spec, name)
        if value is not None:
            setattr(new, name, copy.deepcopy(value))
    return new


#: Numbers of placement's reasons that hold aggregate uuids (``" or "``-separated).
_AGGREGATE_NUMBERS = ("one_of", "aggregate")


def _with_aggregate_names(reject: Any, names: dict[str, str]) -> Any:
    """``reject`` with the aggregate uuids of its numbers shown by their host
    aggregates' names (a uuid no host aggregate carries stays as it is)."""
    numbers = getattr(reject, "numbers", None)
    if not isinstance(numbers, dict):
        return reject
    changed = {}
    for key in _AGGREGATE_NUMBERS:
        text = numbers.get(key)
        if isinstance(text, str):
            parts = text.split(" or ")
            shown = " or ".join(names.get(part, part) for part in parts)
            if shown != text:
                changed[key] = shown
    if not changed:
        return reject
    return type(reject)(reject.reason, {**numbers, **changed})


def _zone_of(aggregates: list[Any]) -> str | None:
    """Selection's AZ (§8.4): a value of ``availability_zone`` from the host's aggregates
    that carry the key, read as ``aggregate_metadata_get_by_host`` reads it (§1.2: each
    value split on ``,`` and stripped); None when no aggregate carries it.

    Nova takes the first element of that set, an arbitrary one when there are several;
    Berth takes the first piece in aggregate order, so the answer is reproducible.
    """
    for agg in aggregates:
        if "availability_zone" in agg.metadata:
            return str(agg.metadata["availability_zone"]).split(",")[0].strip()
    return None


def _claimed_members(ws: WorkingSet, member_hosts: dict[str, str],
                     flavors: dict[str, Any]) -> None:
    """The group's members claimed on a host the snapshot does not list them on yet (its
    report since the build has not come): stubs on that host with their flavor id, so the
    group filters and weighers count them (server-group bookkeeping, as a multi-create's
    own)."""
    snapshot = ws.snapshot
    index = snapshot.instance_rows()
    missing = {u: h for u, h in member_hosts.items() if index.get(u) is None}
    if not missing:
        return
    wanted = set(missing.values())
    rows: dict[str, int] = {}
    for row, host in enumerate(snapshot.obj("host")):
        if host in wanted and host not in rows:
            rows[host] = row
    for uuid, host in missing.items():
        found = rows.get(host)
        if found is not None:
            ws.add_instance(found, Instance(uuid=uuid, instance_type_id=flavors.get(uuid)))


class Scheduler:
    """Filters, weighers and options, loaded once; decisions on demand.

    ``filters``/``weighers`` may be passed directly (tests, embedding); otherwise they are
    loaded from ``config`` and unknown names raise :class:`~berth.errors.PluginNotFound`.
    ``ranker`` replaces weighing (the least-cost strategy supplies one).

    ``per_host=True`` runs Nova's shape instead of the columnar engine: every filter's
    ``host_passes`` host by host, every weigher's ``_weigh_object``/``weight_multiplier``
    host by host, and a full stable sort per instance. It is the reference the columnar
    path is benchmarked and property-tested against; decisions are identical.

    ``tie_salt`` orders equally weighed hosts of a request's first ranking by
    :func:`tie_keys` instead of by row, as each Nova scheduler process walks hosts in its
    own arbitrary order (the scheduler service gives each process its own salt). A ranker
    that orders hosts itself (least-cost weighing) keeps row order.
    """

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        filters: Sequence[BaseHostFilter] | None = None,
        weighers: Sequence[BaseHostWeigher] | None = None,
        ranker: Ranker | None = None,
        per_host: bool = False,
        tie_salt: int | None = None,
    ) -> None:
        self.config = config or SchedulerConfig.default()
        self.per_host = per_host
        self.tie_salt = tie_salt
        self.filters = list(filters) if filters is not None else plugins.load_filters(self.config)
        if ranker is None and self.config.filter_scheduler.weighing_strategy == "least_cost":
            from berth.weighers.least_cost import LeastCostRanker

            ranker = LeastCostRanker.from_config(self.config)
            self.weighers: list[BaseHostWeigher] = []
        else:
            self.weighers = (
                list(weighers) if weighers is not None else plugins.load_weighers(self.config)
            )
        if ranker is None:
            ranker = PerHostRanker(self.weighers) if per_host else WeigherRanker(self.weighers)
        self.ranker: Ranker = ranker

    # ------------------------------------------------------------------ entry point
    def select_destinations(
        self,
        spec: RequestSpec,
        snapshot: HostSnapshot,
        *,
        now: float,
        rng: random.Random,
        candidates: CandidateSet | None = None,
        claimer: Claimer | None = None,
        instance_uuids: Sequence[str] | None = None,
        return_alternates: bool = True,
        explain: bool = False,
        copy_spec: bool = True,
        builds_in_flight: bool = True,
    ) -> Decision:
        """Choose a host (and alternates) for every instance of ``spec``.

        ``candidates`` None means placement is not consulted (a rebuild): every row is
        considered. Claims are made only with both candidates and ``instance_uuids``
        (one instance per uuid); without uuids — Nova's legacy path for an old
        conductor (§8.2.5) — ``spec.num_instances`` hosts are chosen among placement's
        rows, nothing is claimed, alternates need no candidates and no Selection
        carries an allocation request. Callers standing where Nova's API and conductor
        stand mint the uuids (:func:`~berth.model.request.new_instance_uuids`).

        Raises :class:`~berth.errors.NoValidHost` (with the diagnosis when ``explain``)
        when fewer hosts than instances could be chosen; earlier claims are rolled back
        first. The request works on a copy of ``spec``; a caller that hands over a
        private copy already may pass ``copy_spec=False`` (the copy is then written to:
        instance uuid, group members, provider mappings).

        ``builds_in_flight`` false counts each placed instance as built and running rather
        than as a build in progress (``num_io_ops`` stays): a steady-state what-if.
        """
        if copy_spec:
            spec = private_copy(spec)
        self.check_group_policy(spec)
        uuids = list(instance_uuids) if instance_uuids is not None else None
        num_instances = len(uuids) if uuids else spec.num_instances
        if spec.instance_group is not None and uuids:
            # Nova's API adds the new instances to the group before scheduling, so the
            # (soft) anti-affinity rules count the earlier instances of a multi-create.
            members = spec.instance_group.members
            members.extend(u for u in uuids if u not in members)
        # Placement's answer is in play unless this is a rebuild; claims need the uuids.
        placement = candidates if candidates is not None and not spec.is_rebuild() else None
        claiming = placement is not None and uuids is not None
        # The overlay keeps this request's candidate edits (NUMA/PCI filters) out of the
        # caller's mapping without copying it.
        ws = WorkingSet(snapshot, now,
                        CandidateOverlay(placement.by_row) if placement is not None else None,
                        share_stubs=self.config.filter_scheduler.track_instance_changes,
                        builds_in_flight=builds_in_flight,
                        pack_numa_cells=bool(
                            self.config.compute.packing_host_numa_cells_allocation_strategy))
        ws.memo["instances"] = num_instances  # rankers memoize only for multi-creates
        if spec.instance_group is not None and spec.instance_group.member_hosts:
            _claimed_members(ws, spec.instance_group.member_hosts,
                             spec.instance_group.member_flavors)
        req = _Request(spec, ws, rng, explain, Diagnosis() if explain else None,
                       claiming=claiming)
        req.levels.salt = self.tie_salt
        req.version = placement.version if claiming and placement is not None else None

        initial = self._initial_rows(req, placement)
        hosts: np.ndarray | HostOrder = initial
        if placement is not None and placement.no_allocation_requests:
            # Placement returned no allocation request: Nova's NoValidHost with an empty
            # reason. (Requests that map to no known node go on: no host, not enough hosts.)
            if req.diagnosis is not None:
                diag = InstanceDiagnosis(0, uuids[0] if uuids else None,
                                         hosts_considered=len(snapshot))
                if req.placement_step is not None:
                    diag.steps.append(req.placement_step)
                req.diagnosis.instances.append(diag)
            raise NoValidHost(diagnosis=req.diagnosis, cause="placement")
        claimed_uuids: list[str] = []
        claimed_rows: list[int] = []
        claimed_requests: list[dict[str, Any] | None] = []
        index = 0
        rolled_back = False
        # The claiming path walks the uuids; the legacy path num_instances slots (Nova
        # counts spec.num_instances when the uuid list is empty, and then fails).
        slots = len(uuids) if claiming and uuids is not None else num_instances
        try:
            for index in range(slots):
                instance_uuid = uuids[index] if uuids else None
                if instance_uuid:
                    spec.instance_uuid = instance_uuid
                if req.diagnosis is not None:
                    considered = len(hosts)
                    if index == 0 and req.placement_step is not None:
                        considered = req.placement_step.hosts_in
                    req.current = InstanceDiagnosis(index, instance_uuid, hosts_considered=considered)
                    req.diagnosis.instances.append(req.current)
                req.emptied_by = None
                order = self._sorted_hosts(req, self._next_input(hosts), index)
                hosts = order
                if len(order) == 0:
                    break
                row, alloc_req = self._claim(req, order, instance_uuid, claimer)
                if row is None:
                    req.emptied_by = "claims"
                    if req.current is not None:
                        req.current.random_pick = None  # nothing was picked
                    break
                if claiming and instance_uuid:
                    claimed_uuids.append(instance_uuid)
                claimed_rows.append(row)
                claimed_requests.append(alloc_req)
                if alloc_req is not None:
                    for group in spec.requested_resources or []:
                        mapping = alloc_req.get("mappings", {}).get(getattr(group, "requester_id", None))
                        if mapping is not None:
                            group.provider_uuids = mapping
                self._consume(req, row, instance_uuid)
                if req.current is not None:
                    req.current.chosen = (snapshot.obj("host")[row], snapshot.obj("nodename")[row])

            if len(claimed_rows) < num_instances:
                if claimer is not None and claiming and claimed_uuids:
                    rolled_back = True
                    claimer.rollback(claimed_uuids)
                for row in claimed_rows:
                    ws.set_updated(row, None)
                refused = NoValidHost("There are not enough hosts available.",
                                      diagnosis=req.diagnosis, cause="hosts",
                                      rejections=req.rejected)
                refused.fitted, refused.requested = len(claimed_rows), num_instances
                refused.emptied_by = req.emptied_by
                refused.placed = [(snapshot.obj("host")[row], snapshot.obj("nodename")[row])
                                  for row in claimed_rows]
                refused.claimed = [(uuid, alloc) for uuid, alloc
                                   in zip(claimed_uuids, claimed_requests) if alloc is not None]
                raise refused

            num_alts = self.config.scheduler.max_attempts - 1 if return_alternates else 0
            assert isinstance(hosts, HostOrder)
            selections = self._alternates(req, hosts, index, num_alts, claimed_rows, claimed_requests,
                                          req.version)
            return Decision(selections, uuids[:len(selections)] if uuids else [], req.diagnosis,
                            req.rejected)
        except BaseException:
            # Anything unexpected after a claim (a plugin's error, an interrupt) leaves no
            # claim behind either; NoValidHost above has rolled back already.
            if claimer is not None and claiming and claimed_uuids and not rolled_back:
                claimer.rollback(claimed_uuids)
            raise

    # ------------------------------------------------------------------ steps
    def check_group_policy(self, spec: RequestSpec) -> None:
        """Raise :class:`~berth.errors.UnsupportedPolicy` when the server group's policy
        needs a filter or weigher that is not enabled (reference §8.6).

        Nova checks this in the conductor (``setup_instance_group``), before the request
        reaches the scheduler, so an adapter calls it before the request filters and the
        placement query; the core checks again for callers that come to it directly.
        """
        group = spec.instance_group
        if group is None:
            return
        if group.policy not in group.VALID_POLICIES:
            raise UnsupportedPolicy(f"server group policy {group.policy!r} is not one of "
                                    f"{', '.join(group.VALID_POLICIES)}")
        needed_filter = POLICY_FILTERS.get(group.policy)
        if needed_filter and needed_filter not in {type(f).__name__ for f in self.filters}:
            raise UnsupportedPolicy(
                f"ServerGroup policy {group.policy!r} is not supported: {needed_filter} "
                "is not in [filter_scheduler] enabled_filters"
            )
        needed_weigher = POLICY_WEIGHERS.get(group.policy)
        if needed_weigher:
            configured = set(self.config.filter_scheduler.weight_classes)
            all_weighers = bool(configured & plugins.ALL_WEIGHERS_NAMES)
            if not all_weighers and needed_weigher not in {type(w).__name__ for w in self.weighers}:
                raise UnsupportedPolicy(
                    f"ServerGroup policy {group.policy!r} is not supported: {needed_weigher} "
                    "is not in [filter_scheduler] weight_classes"
                )

    def _initial_rows(self, req: _Request, candidates: CandidateSet | None) -> np.ndarray:
        """Rows in play: placement's answer (or every row), with a service record, in the
        requested cell when the request names one (and may not cross cells), else in the
        enabled cells."""
        snapshot = req.ws.snapshot
        n = len(snapshot)
        keep = np.zeros(n, dtype=bool)
        if candidates is None:
            keep[:] = True
        else:
            keep[candidates.row_array()] = True
        # A compute node without a service record is skipped (§10.2.3).
        keep &= snapshot.num("has_service")
        cell_codes = snapshot.codes("cell_uuid")
        cell_table = snapshot.table("cell_uuid")
        disabled: frozenset[str] = snapshot.disabled_cells
        unreachable: frozenset[str] = snapshot.unreachable_cells
        dest = req.spec.requested_destination
        only_cell = dest.cell.uuid if dest and dest.cell and not dest.allow_cross_cell_move else None
        if only_cell is not None or disabled or unreachable:
            # Nova queries the requested cell alone, disabled or not; otherwise every
            # enabled cell (§10.2.1); a cell whose database did not answer is skipped.
            allowed = np.array(
                [(c == only_cell if only_cell is not None else c not in disabled)
                 and c not in unreachable for c in cell_table],
                dtype=bool,
            )
            before = keep.copy()
            keep &= allowed[cell_codes] if len(cell_table) else keep
            if req.diagnosis is not None:
                self._record_cells(req, before, keep, only_cell)
        if req.diagnosis is not None and candidates is not None:
            # Placement's own rejections are the first lines of the explanation.
            self._record_placement(req, candidates)
        return np.flatnonzero(keep).astype(np.int64)

    def _record_cells(self, req: _Request, before: np.ndarray, after: np.ndarray,
                      only_cell: str | None) -> None:
        """The explanation of the rows the cell rule took out (none: no step)."""
        dropped = np.flatnonzero(before & ~after)
        if len(dropped) == 0:
            return
        snapshot = req.ws.snapshot
        name = "requested cell" if only_cell is not None else "enabled cells"
        reject = (Reject.of("not in the requested cell (no cross-cell move)", cell=only_cell)
                  if only_cell is not None else Reject.of("cell is disabled"))
        unreachable = Reject.of("its cell's database did not answer")
        cells = snapshot.codes("cell_uuid")
        table = snapshot.table("cell_uuid")
        step = FilterStep(name, int(before.sum()), int(after.sum()))
        for row in dropped.tolist():
            why = (unreachable if table[int(cells[row])] in snapshot.unreachable_cells
                   else reject)
            step.rejections.append(HostRejection(
                snapshot.obj("host")[row], snapshot.obj("nodename")[row], name, why))
        req.cell_step = step

    def _record_placement(self, req: _Request, candidates: CandidateSet) -> None:
        snapshot = req.ws.snapshot
        step = FilterStep("placement", len(snapshot), len(candidates.by_row))
        names = {a.uuid: a.name for a in snapshot.aggregates if a.uuid and a.name}
        named: dict[int, Any] = {}
        for row, reject in candidates.rejections.items():
            shown = named.get(id(reject))
            if shown is None:
                shown = named[id(reject)] = _with_aggregate_names(reject, names)
            step.rejections.append(HostRejection(
                snapshot.obj("host")[row], snapshot.obj("nodename")[row], "placement", shown))
        req.placement_step = step

    def _next_input(self, hosts: np.ndarray | HostOrder) -> np.ndarray:
        """The rows the next ranking starts from: the reference path keeps Nova's list
        order; the columnar path keeps ascending rows (the levels remember the order)."""
        if isinstance(hosts, np.ndarray):
            return hosts
        if self.per_host or hosts.is_explicit:
            # A ranker that orders hosts itself breaks ties by input position.
            return hosts.to_array()
        return hosts.rows

    def _sorted_hosts(self, req: _Request, rows: np.ndarray, index: int) -> HostOrder:
        """Filter, weigh and order ``rows``; the randomly chosen best host comes first."""
        filtered = self._filtered_hosts(req, rows, index)
        if len(filtered) == 0:
            return HostOrder.empty()
        if index == 0 and self.tie_salt is not None and isinstance(self.ranker, PerHostRanker):
            # Nova's shape: the hosts enter the first ranking in this scheduler's order.
            filtered = filtered[np.argsort(tie_keys(self.tie_salt, filtered))]
        hosts = req.hosts(filtered)
        ranking = self.ranker.rank(hosts, req.spec)
        weights = ranking.weights
        fs = self.config.filter_scheduler
        subset_size = fs.host_subset_size
        n = len(filtered)
        explicit = ranking.explicit_order
        if self.per_host or explicit is not None:
            # Nova's shape: the whole list, sorted (or as the ranker ordered it).
            order = list(ranking.order.tolist())
            if fs.shuffle_best_same_weighed_hosts and order:
                best = weights[order[0]]
                tied = [p for p in order if weights[p] == best]
                req.rng.shuffle(tied)
                order = tied + order[len(tied):]
            subset = order[:subset_size] if subset_size < len(order) else order
            chosen = req.rng.choice(subset)
            among = len(subset)
            order.remove(chosen)
            order.insert(0, chosen)
            ordered = filtered[np.asarray(order, dtype=np.int64)]
            level = Level(np.sort(filtered), None, ordered)
        else:
            # Columnar: only the hosts that can be chosen are ordered (see HostOrder).
            level = Level(filtered, weights, filtered[:0], len(req.ws.snapshot))
            req.levels.append(level)
            tied_count = 0
            if fs.shuffle_best_same_weighed_hosts:
                finite = weights[~np.isnan(weights)]
                if len(finite):
                    tied_count = int(np.count_nonzero(weights == finite.max()))
            wanted = n if subset_size >= n else max(subset_size, tied_count)
            head = (best_of(req.levels, filtered, weights) if wanted == 1 else
                    head_of(req.levels, len(req.levels) - 1, filtered, wanted).tolist())
            req.levels.pop()
            if tied_count:
                tied = head[:tied_count]
                req.rng.shuffle(tied)
                head = tied + head[tied_count:]
            subset = head[:subset_size] if subset_size < n else head
            chosen = req.rng.choice(subset)
            among = len(subset)
            head.remove(chosen)
            head.insert(0, chosen)
            level.prefix = np.asarray(head, dtype=np.int64)
        req.levels.append(level)
        result = HostOrder(req.levels, len(req.levels) - 1)
        if req.current is not None:
            self._record_weighing(req, hosts, ranking, result)
            if among > 1:
                self._record_pick(req, hosts, ranking, result, among)
        return result

    def _filtered_hosts(self, req: _Request, rows: np.ndarray, index: int) -> np.ndarray:
        """Pre-filters (destination, ignore, force) then the enabled filters (§10.4)."""
        spec, ws = req.spec, req.ws
        snapshot = ws.snapshot
        if index == 0 and req.current is not None and req.placement_step is not None:
            req.current.steps.append(req.placement_step)
        if index == 0 and req.current is not None and req.cell_step is not None:
            req.current.steps.append(req.cell_step)
        dest = spec.requested_destination
        if dest is not None and dest.host:
            mask = snapshot.obj("host")[rows] == dest.host
            if dest.node:
                mask &= snapshot.obj("nodename")[rows] == dest.node
            rows = self._apply(req, "requested destination", rows, mask,
                               Reject.of("not the requested destination", host=dest.host))
        if spec.ignore_hosts:
            ignored = {h.lower() for h in spec.ignore_hosts}
            mask = ~np.isin(snapshot.host_names_lower()[rows], list(ignored))
            rows = self._apply(req, "ignore_hosts", rows, mask, Reject.of("host is ignored"))
            if len(rows) == 0:
                return rows
        if spec.force_hosts:
            forced = {h.lower() for h in spec.force_hosts}
            mask = np.isin(snapshot.host_names_lower()[rows], list(forced))
            rows = self._apply(req, "force_hosts", rows, mask, Reject.of("not a forced host"))
        if spec.force_nodes:
            mask = np.isin(snapshot.obj("nodename")[rows], list(spec.force_nodes))
            rows = self._apply(req, "force_nodes", rows, mask, Reject.of("not a forced node"))
        # Nova reads the hint's value (an empty list is no check type).
        check_type = (spec.scheduler_hints or {}).get("_nova_check_type")
        if (spec.force_hosts or spec.force_nodes) and not check_type:
            if req.current is not None:
                for f in self.filters:
                    req.current.steps.append(FilterStep(type(f).__name__, len(rows), len(rows),
                                                        skipped="hosts are forced"))
            return rows

        rebuild = spec.is_rebuild()
        for position, f in enumerate(self.filters):
            name = type(f).__name__
            if not f.run_filter_for_index(index):
                self._skip(req, name, rows, "runs once per request")
                continue
            if rebuild and not f.RUN_ON_REBUILD:
                self._skip(req, name, rows, "does not run on rebuild")
                continue
            if position not in req.validated:
                # Validated when first reached with hosts to check, as Nova fails only at
                # a spec a host reaches: forced hosts skip the filters, a rebuild runs only
                # the rebuild filters, and the chain stops at the first empty result.
                req.validated.add(position)
                f.validate_request(spec)
            if self.per_host:
                # Nova's shape: the base class's host-by-host loop over host_passes.
                mask = BaseHostFilter.filter_all_hosts(f, req.hosts(rows), spec)
            else:
                mask = np.asarray(f.filter_all_hosts(req.hosts(rows), spec), dtype=bool)
            rows = self._apply(req, name, rows, mask, f)
            if len(rows) == 0:
                break
        return rows

    def _apply(
        self, req: _Request, name: str, rows: np.ndarray, mask: np.ndarray,
        why: BaseHostFilter | Reject,
    ) -> np.ndarray:
        # The same array when every host passes: later rankings of the request recognize
        # an unchanged host list by identity.
        kept = rows if bool(mask.all()) else rows[mask]
        if len(kept) != len(rows):
            req.rejected[name] = req.rejected.get(name, 0) + len(rows) - len(kept)
            if len(kept) == 0:
                req.emptied_by = name
        if req.current is not None:
            step = FilterStep(name, len(rows), len(kept))
            snapshot = req.ws.snapshot
            for row in rows[~mask].tolist():
                if isinstance(why, Reject):
                    reject = why
                else:
                    # The bulk path is authoritative; a per-host pass here is reported as such.
                    reject = why.check(HostState(req.ws, row), req.spec) or Reject(
                        f"rejected by {name}"
                    )
                step.rejections.append(HostRejection(
                    snapshot.obj("host")[row], snapshot.obj("nodename")[row], name, reject))
            req.current.steps.append(step)
        return kept

    def _skip(self, req: _Request, name: str, rows: np.ndarray, why: str) -> None:
        if req.current is not None:
            req.current.steps.append(FilterStep(name, len(rows), len(rows), skipped=why))

    def _record_weighing(
        self, req: _Request, hosts: Hosts, ranking: Ranking, order: HostOrder
    ) -> None:
        assert req.current is not None
        snapshot = req.ws.snapshot
        req.current.weighing = []
        req.current.ranked_by = "cost" if ranking.by_cost else "weight"
        position = {row: pos for pos, row in enumerate(hosts.rows.tolist())}
        for row in order.head(EXPLAIN_TOP_HOSTS).tolist():
            pos = position[row]
            terms = [
                WeigherTerm(c.name, float(c.raw[pos]), float(c.normalized[pos]),
                            float(c.multiplier[pos]))
                for c in ranking.columns
            ]
            req.current.weighing.append(HostWeighing(
                snapshot.obj("host")[row], snapshot.obj("nodename")[row],
                float(ranking.weights[pos]), terms))

    def _record_pick(self, req: _Request, hosts: Hosts, ranking: Ranking, order: HostOrder,
                     among: int) -> None:
        """Say that the first host was drawn at random among ``among``, and which host
        ranked best."""
        assert req.current is not None
        weights = np.asarray(ranking.weights, dtype=float)
        if not len(weights) or np.isnan(weights).all():
            return
        best = int(np.nanargmax(weights))
        snapshot = req.ws.snapshot
        best_row = int(hosts.rows[best])
        picked = {row: pos for pos, row in enumerate(hosts.rows.tolist())}[int(order.head(1)[0])]
        req.current.random_pick = RandomPick(
            among=among, subset_size=self.config.filter_scheduler.host_subset_size,
            best=(snapshot.obj("host")[best_row], snapshot.obj("nodename")[best_row]),
            best_weight=float(weights[best]), picked_weight=float(weights[picked]))

    def _claim(
        self, req: _Request, rows: HostOrder, instance_uuid: str | None, claimer: Claimer | None
    ) -> tuple[int | None, dict[str, Any] | None]:
        """The first host, in order, whose first candidate is claimed; on the legacy path
        simply the first host (§8.2.5). Without a claimer the first candidate counts as
        claimed."""
        if not req.claiming or req.ws.candidates is None or instance_uuid is None:
            return int(rows.head(1)[0]), None
        snapshot = req.ws.snapshot
        full = req.full_rows
        for row in rows:
            if row in full:
                if req.current is not None:
                    req.current.full_hosts.append(
                        (snapshot.obj("host")[row], snapshot.obj("nodename")[row],
                         req.full_why.get(row)))
                continue
            cands = req.ws.candidates.get(row)
            if not cands:
                continue
            alloc_req = cands[0]
            if claimer is None:
                return row, alloc_req
            claimed = claimer.claim(instance_uuid, alloc_req, req.spec, req.version)
            if claimed:
                return row, alloc_req
            why = claimed.render() if isinstance(claimed, ClaimRefusal) else None
            if isinstance(claimed, ClaimRefusal) and claimed.reason == INSUFFICIENT:
                full.add(row)
                req.full_why[row] = why
            if req.current is not None:
                req.current.claim_failures.append(
                    (snapshot.obj("host")[row], snapshot.obj("nodename")[row], why))
        return None, None

    def _consume(self, req: _Request, row: int, instance_uuid: str | None) -> None:
        """Virtual consumption, and the server group learns the host and the member (a
        stub instance only when the instance has a uuid, as in Nova)."""
        ws, spec = req.ws, req.spec
        ws.consume(row, spec)
        req.selected_rows.append(row)
        group = spec.instance_group
        if group is not None:
            group.hosts.append(ws.snapshot.obj("host")[row])
            if instance_uuid and instance_uuid not in ws.instances(row):
                # The stub carries the flavor so TypeAffinityFilter sees its own kind.
                ws.add_instance(row, Instance(uuid=instance_uuid,
                                              instance_type_id=spec.flavor.id))

    def _alternates(
        self,
        req: _Request,
        hosts: HostOrder,
        index: int,
        num_alts: int,
        claimed_rows: list[int],
        claimed_requests: list[dict[str, Any] | None],
        version: str | None,
    ) -> list[list[Selection]]:
        """The chosen host plus up to ``num_alts`` same-cell alternates, per instance."""
        if index > 0 and num_alts > 0:
            saved, req.current = req.current, None  # the re-sort is not an instance of its own
            hosts = self._sorted_hosts(req, self._next_input(hosts), index)
            req.current = saved
        cells = req.ws.snapshot.codes("cell_uuid")
        chosen = set(claimed_rows)
        # Every instance of a cell gets the same alternates (the first hosts in order of
        # that cell, not chosen, with candidates): one walk of the order serves all cells.
        found: dict[int, list[tuple[int, dict[str, Any] | None]]] = {
            int(cells[row]): [] for row in claimed_rows}
        open_cells = set(found) if num_alts > 0 else set()
        # Alternates need (and carry) a candidate only when the request claims (§8.2.8).
        candidates = req.ws.candidates if req.claiming else None
        for alt in hosts if open_cells else ():
            cell = int(cells[alt])
            if cell not in open_cells or alt in chosen:
                continue
            alt_req: dict[str, Any] | None = None
            if candidates is not None:
                cands = candidates.get(alt)
                if not cands:
                    continue
                alt_req = cands[0]
            found[cell].append((alt, alt_req))
            if len(found[cell]) >= num_alts:
                open_cells.discard(cell)
                if not open_cells:
                    break
        built: dict[tuple[int, int], dict[str, Any]] = {}
        selections: list[list[Selection]] = []
        for row, alloc_req in zip(claimed_rows, claimed_requests):
            entry = [self._selection(req.ws, row, alloc_req, version, built)]
            if num_alts > 0:
                entry += [self._selection(req.ws, alt, alt_req, version, built)
                          for alt, alt_req in found[int(cells[row])]]
            selections.append(entry)
        return selections

    def _selection(
        self, ws: WorkingSet, row: int, alloc_req: dict[str, Any] | None, version: str | None,
        built: dict[tuple[int, int], dict[str, Any]] | None = None,
    ) -> Selection:
        """``Selection.from_host_state`` (reference §8.4). ``built`` remembers the fields
        of hosts already selected in this request (alternates repeat across instances);
        each Selection still gets its own ``limits`` dict."""
        key = (row, id(alloc_req))
        fields = built.get(key) if built is not None else None
        if fields is None:
            # HostState's attributes, read from the working set without the view.
            snapshot = ws.snapshot
            code = int(snapshot.codes("aggregates")[row])
            zone = snapshot.table_cached(("selection_zone", code), lambda: _zone_of(
                snapshot.aggregates_of_signature(code)))
            fields = {
                "compute_node_uuid": ws.obj("uuid", row),
                "service_host": ws.obj("host", row),
                "nodename": ws.obj("nodename", row),
                "cell_uuid": snapshot.interned_value("cell_uuid", row),
                "limits": scheduler_limits(ws.limits(row)),
                "allocation_request": json.dumps(alloc_req),
                "allocation_request_version": version if alloc_req is not None else None,
                "availability_zone": zone or self.config.default_availability_zone,
            }
            if built is not None:
                built[key] = fields
        return Selection(fields["compute_node_uuid"], fields["service_host"], fields["nodename"],
                         fields["cell_uuid"], dict(fields["limits"]), fields["allocation_request"],
                         fields["allocation_request_version"], fields["availability_zone"])
