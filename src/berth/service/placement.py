"""The scheduler's side of Placement: fetch candidates, map them to rows, claim.

* :class:`PlacementCandidates` runs ``GET /allocation_candidates`` at microversion 1.36
  through the typed client, or straight on the store when it runs in this process
  (:class:`~berth.placement.local.LocalPlacement`). An HTTP error or a connection failure
  gives *no candidates* (Nova logs and answers ``(None, None, None)``, which becomes
  NoValidHost).
* :func:`candidate_set` maps the answer to snapshot rows: a row is considered only if its
  compute node uuid (= the root provider uuid) is in ``provider_summaries``; its
  allocation requests are every request that allocates from that uuid (Nova's
  ``alloc_reqs_by_rp_uuid``). An in-process answer of the engine's flat fast path (each
  candidate one provider) stays as provider indexes: rows come from one array lookup and
  an allocation request is built only for the rows the scheduler reads (the chosen host
  and its alternates) — the same dicts the API would have sent.
* :class:`PlacementClaimer` writes ``PUT /allocations/{consumer}`` with the project and
  user for a *new* consumer (consumer generation null): a consumer that exists already
  belongs to another instance and the claim is refused, never merged into it.
  Provider-generation conflicts are retried a bounded number of times and counted; a
  refusal (capacity) answers False. ``rollback`` deletes allocations.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import numpy as np

from berth.claims import CANDIDATES_MICROVERSION, INSUFFICIENT, CandidateSet, ClaimRefusal
from berth.config import SchedulerConfig
from berth.errors import ServiceUnavailable, one_line
from berth.filters.base import Reject
from berth.model.request import RequestSpec
from berth.placement import candidates as engine
from berth.placement.client import (
    ConflictError,
    ConsumerAllocations,
    ConsumerPost,
    PlacementAPIError,
    PlacementClient,
)
from berth.placement.local import LocalPlacement
from berth.snapshot import HostSnapshot
from berth.webauth.client import KeystoneUnavailable

#: Transport errors raised before anything of the request was sent.
NOTHING_SENT = (httpx.ConnectError, httpx.ConnectTimeout, KeystoneUnavailable)

LOG = logging.getLogger(__name__)
#: Placement's refusal of an allocation for capacity: the class and the provider.
_CAPACITY_REFUSAL = re.compile(
    r"Unable to create allocation for '([A-Z0-9_]+)' on resource provider '([0-9a-fA-F-]+)'\. "
    r"The requested amount would exceed the capacity")

#: Attempts of one claim when placement reports a concurrent update (Nova's ``@retries``).
CLAIM_ATTEMPTS = 4
#: Seconds a merged claim's earlier allocations are kept for its request's rollback.
MERGE_MEMORY = 300.0


@dataclass
class FlatAnswer:
    """An in-process answer of the engine's flat path: every candidate is one provider
    (a graph index in ``providers``, in answer order) asking for ``resources``."""

    graph: engine.ProviderGraph
    query: Any
    result: engine.FlatResult
    version: tuple[int, int]

    @property
    def providers(self) -> np.ndarray:
        """Graph indexes of the candidates."""
        return self.result.providers

    def request(self, provider: int) -> dict[str, Any]:
        """The allocation request of one candidate, as the API renders it (1.34+)."""
        uuid = self.graph.uuids[provider]
        return {"allocations": {uuid: {"resources": dict(self.result.resources)}},
                "mappings": {"": [uuid]}}

    def render(self) -> dict[str, Any]:
        """The whole response body."""
        return engine.render_result(self.graph, self.query, self.result, self.version)


@dataclass
class CandidatesAnswer:
    """What ``GET /allocation_candidates`` answered (empty on any failure).

    ``flat`` holds an in-process flat answer unrendered; :meth:`materialize` renders it
    into ``allocation_requests`` and ``provider_summaries``.
    """

    allocation_requests: list[dict[str, Any]] = field(default_factory=list)
    provider_summaries: dict[str, Any] = field(default_factory=dict)
    version: str | None = CANDIDATES_MICROVERSION
    error: str | None = None
    flat: FlatAnswer | None = None

    @property
    def empty(self) -> bool:
        """No allocation request at all."""
        if self.flat is not None:
            return len(self.flat.providers) == 0
        return not self.allocation_requests

    def materialize(self) -> None:
        """Render a flat answer into the API's lists (no-op otherwise)."""
        if self.flat is not None:
            body = self.flat.render()
            self.allocation_requests = list(body["allocation_requests"])
            self.provider_summaries = dict(body["provider_summaries"])
            self.flat = None

    def merge(self, other: CandidatesAnswer) -> None:
        """Append another answer's requests and merge its summaries (PCPU fallback)."""
        self.materialize()
        other.materialize()
        self.allocation_requests.extend(other.allocation_requests)
        self.provider_summaries.update(other.provider_summaries)


class PlacementAccess(Protocol):
    """The calls the scheduler makes: :class:`PlacementClient` or :class:`LocalPlacement`."""

    def allocation_candidates(self, params: Mapping[str, str | Sequence[str]]) -> dict[str, Any]:
        """GET /allocation_candidates."""
        ...

    def get_allocations(self, consumer: str) -> ConsumerAllocations:
        """GET /allocations/{consumer}."""
        ...

    def put_allocations(
        self, consumer: str, allocations: Mapping[str, Mapping[str, int]], *, project_id: str,
        user_id: str, consumer_generation: int | None, consumer_type: str = "INSTANCE",
        microversion: str | None = None,
    ) -> None:
        """PUT /allocations/{consumer} (at ``microversion`` when given)."""
        ...

    def delete_allocations(self, consumer: str) -> None:
        """DELETE /allocations/{consumer}."""
        ...

    def post_allocations(self, consumers: Mapping[str, ConsumerPost], *,
                         microversion: str | None = None) -> None:
        """POST /allocations: every consumer's new allocations in one transaction."""
        ...

    def get_inventories(self, uuid: str) -> tuple[int, dict[str, dict[str, Any]]]:
        """GET /resource_providers/{uuid}/inventories: (generation, {class: record})."""
        ...

    def provider_usages(self, uuid: str) -> dict[str, int]:
        """GET /resource_providers/{uuid}/usages."""
        ...


class PlacementCandidates:
    """Allocation candidates at microversion 1.36, through the API or in process."""

    def __init__(self, client: PlacementClient | LocalPlacement) -> None:
        self.client = client
        if isinstance(client, LocalPlacement) and client.version != (1, 36):
            raise ValueError(f"candidates are read at microversion {CANDIDATES_MICROVERSION}, "
                             f"not {client.version[0]}.{client.version[1]}")

    def warm(self) -> None:
        """Read what the first query needs now (the store's providers, in process;
        nothing through the API)."""
        if isinstance(self.client, LocalPlacement):
            self.client.warm()

    def get(self, params: Sequence[tuple[str, str]]) -> CandidatesAnswer:
        """Run the query; errors are logged and give an empty answer, as in Nova."""
        grouped: dict[str, list[str]] = defaultdict(list)
        for key, value in params:
            grouped[key].append(value)
        try:
            if isinstance(self.client, LocalPlacement):
                graph, query, result = self.client.search(grouped)
                if isinstance(result, engine.FlatResult):
                    return CandidatesAnswer(flat=FlatAnswer(graph, query, result,
                                                            self.client.version))
                body = engine.render_result(graph, query, result, self.client.version)
            else:
                body = self.client.allocation_candidates(grouped)
        except PlacementAPIError as exc:
            text = one_line(exc)  # placement's detail
            LOG.warning("GET /allocation_candidates failed: %s", text)
            return CandidatesAnswer(version=None, error=text)
        except httpx.HTTPError as exc:
            LOG.warning("placement is unreachable: %s", exc)
            return CandidatesAnswer(version=None, error=f"placement unreachable: {exc}")
        return CandidatesAnswer(list(body.get("allocation_requests") or []),
                                dict(body.get("provider_summaries") or {}))


class FlatRequests(Mapping[int, list[dict[str, Any]]]):
    """Rows -> allocation requests of a flat answer, each request built on first read.

    ``rows`` (snapshot rows, answer order) and ``providers`` (their graph indexes) are
    parallel arrays; a row's provider is found through a row-indexed array, so nothing
    is built per candidate up front.
    """

    def __init__(self, answer: FlatAnswer, rows: np.ndarray, providers: np.ndarray) -> None:
        self.answer = answer
        self.rows = rows
        size = int(rows.max()) + 1 if len(rows) else 0
        self._provider = np.full(size, -1, dtype=np.int64)
        self._provider[rows] = providers
        self._built: dict[int, list[dict[str, Any]]] = {}

    def _provider_of(self, row: object) -> int:
        if not isinstance(row, (int, np.integer)) or not 0 <= row < len(self._provider):
            return -1
        return int(self._provider[row])

    def __getitem__(self, row: int) -> list[dict[str, Any]]:
        built = self._built.get(row)
        if built is None:
            provider = self._provider_of(row)
            if provider < 0:
                raise KeyError(row)
            built = self._built[row] = [self.answer.request(provider)]
        return built

    def __contains__(self, row: object) -> bool:
        return self._provider_of(row) >= 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows.tolist())

    def row_array(self) -> np.ndarray:
        """The rows as they are kept (see :class:`berth.claims.RowArray`)."""
        return self.rows

    def __len__(self) -> int:
        return len(self.rows)


def rows_by_uuid(snapshot: HostSnapshot) -> dict[str, int]:
    """Compute node uuid -> snapshot row (cached per snapshot generation)."""

    def build() -> dict[str, int]:
        return {str(u): row for row, u in enumerate(snapshot.obj("uuid")) if u}

    return snapshot.cached("service.rows_by_uuid", build)


def candidate_set(
    snapshot: HostSnapshot, answer: CandidatesAnswer, index: Mapping[str, int] | None = None
) -> CandidateSet:
    """Map placement's answer to rows (reference §8.1 step 6 and §8.2 steps 1-2).

    ``index`` maps compute node uuids to rows (default: built from the snapshot).
    """
    if index is None:
        index = rows_by_uuid(snapshot)
    if answer.flat is not None:
        flat = answer.flat
        rows = graph_rows(flat.graph, index)[flat.providers]
        known = rows >= 0
        return CandidateSet(
            by_row=FlatRequests(flat, rows[known], flat.providers[known]),  # type: ignore[arg-type]
            version=answer.version or CANDIDATES_MICROVERSION,
            no_allocation_requests=answer.empty)
    by_rp: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for alloc_req in answer.allocation_requests:
        for rp_uuid in alloc_req.get("allocations", {}):
            by_rp[rp_uuid].append(alloc_req)
    by_row: dict[int, list[dict[str, Any]]] = {}
    for rp_uuid in answer.provider_summaries:
        row = index.get(rp_uuid)
        if row is not None:
            by_row[row] = by_rp.get(rp_uuid, [])
    return CandidateSet(by_row=by_row, version=answer.version or CANDIDATES_MICROVERSION,
                        no_allocation_requests=answer.empty)


def graph_rows(graph: engine.ProviderGraph, index: Mapping[str, int]) -> np.ndarray:
    """Snapshot row (-1: none) of every provider of ``graph``, by graph index.

    Remembered with the graph (a graph patched after a claim keeps it) and rebuilt when
    the index changes: a :class:`~berth.service.records.RowIndex` says so with its
    ``version``; any other mapping is re-read every time.
    """
    version = getattr(index, "version", None)
    memo = graph.cached_fragments("berth.graph_rows")  # (index, version, rows)
    if version is None or memo is None or memo[0] is not index or memo[1] != version:
        get = index.get
        rows = np.fromiter((get(u, -1) for u in graph.uuids), dtype=np.int64,
                           count=len(graph.uuids))
        memo = (index, version, rows)
        graph.store_fragments("berth.graph_rows", memo)
    rows_of: np.ndarray = memo[2]
    return rows_of


def placement_rejections(
    snapshot: HostSnapshot,
    answer: CandidatesAnswer,
    candidates: CandidateSet,
    spec: RequestSpec,
    index: Mapping[str, int] | None = None,
    config: SchedulerConfig | None = None,
) -> dict[int, Reject]:
    """Why each row placement left out got no candidate, for an explanation.

    An in-process flat answer is explained by the engine itself
    (:func:`~berth.placement.candidates_explain.explain_flat`: the trait, aggregate,
    capacity or limit condition, with its numbers), and a node the store has no provider
    for says so. Otherwise placement's answer carries no reasons: a row whose reported
    capacity cannot hold the flavor gets that estimate (as ``berth schedule`` computes
    candidates offline, with ``config``'s reserved amounts), any other a generic reason
    (traits, aggregates, a disabled compute, the limit).
    """
    if index is None:
        index = rows_by_uuid(snapshot)
    out: dict[int, Reject] = {}
    flat = answer.flat
    known: set[str] | None = None
    if flat is not None:
        from berth.placement.candidates_explain import explain_flat

        why = explain_flat(flat.graph, flat.query, flat.result)
        if why is not None:
            rows = graph_rows(flat.graph, index)
            for p, exclusion in why.items():
                row = int(rows[p])
                if row >= 0:
                    out[row] = Reject(exclusion.reason, dict(exclusion.numbers))
        known = set(flat.graph.uuids)
    generic = Reject.of("no allocation candidate from placement (required traits, "
                        "aggregates, a disabled compute or the limit)")
    missing = Reject.of("no resource provider in placement")
    uuids = snapshot.obj("uuid")
    left = [row for row in range(len(snapshot)) if row not in candidates.by_row
            and row not in out]
    estimate: dict[int, Reject] = {}
    if left and known is None:
        from berth.claims import InMemoryPlacement

        estimate = InMemoryPlacement(snapshot, config).candidates(
            spec, np.asarray(left, dtype=np.int64)).rejections
    # A disabled service's provider carries COMPUTE_STATUS_DISABLED, which every boot
    # forbids (the compute_status request filter): that, not a capacity estimate, is why.
    disabled = snapshot.num("service_disabled")
    status = Reject("compute service disabled", {"trait": "COMPUTE_STATUS_DISABLED"})
    for row in left:
        if known is not None and uuids[row] not in known:
            out[row] = missing
        elif known is None and disabled[row] == 1:
            out[row] = status
        else:
            out[row] = estimate.get(row, generic)
    return out


@dataclass
class ClaimStats:
    """Counters of one claimer (shared by its threads)."""

    claims: int = 0
    successes: int = 0
    refusals: int = 0
    conflict_retries: int = 0
    exhausted: int = 0
    consumer_conflicts: int = 0
    errors: int = 0
    rollbacks: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return dict(self.__dict__)


class TrialClaimer:
    """A :class:`~berth.claims.Claimer` for a what-if: each claim is checked against
    placement's own numbers — every provider's inventory (capacity ``(total - reserved)
    * allocation_ratio``) and usages, read once per provider — plus the claims of the
    same request before it, and nothing is written. The decision is the one a boot
    would get now, and no other request ever sees it."""

    def __init__(self, client: PlacementAccess) -> None:
        self.client = client
        self._room: dict[str, dict[str, tuple[int, int]]] = {}
        self._pending: dict[tuple[str, str], int] = defaultdict(int)

    def _of(self, provider: str) -> dict[str, tuple[int, int]]:
        room = self._room.get(provider)
        if room is None:
            _, inventory = self.client.get_inventories(provider)
            used = self.client.provider_usages(provider)
            room = {rc: (int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"]),
                         int(used.get(rc, 0))) for rc, inv in inventory.items()}
            self._room[provider] = room
        return room

    def claim(self, consumer_uuid: str, allocation_request: dict[str, Any], spec: RequestSpec,
              version: str | None) -> bool | ClaimRefusal:
        asked = [(rp, rc, int(amount))
                 for rp, body in allocation_request.get("allocations", {}).items()
                 for rc, amount in body.get("resources", {}).items()]
        for rp, rc, amount in asked:
            capacity, used = self._of(rp).get(rc, (0, 0))
            free = capacity - used - self._pending[(rp, rc)]
            if amount > free:
                return ClaimRefusal(INSUFFICIENT, resource_class=rc, provider=rp,
                                    requested=amount, free=max(free, 0))
        for rp, rc, amount in asked:
            self._pending[(rp, rc)] += amount
        return True

    def rollback(self, consumer_uuids: Sequence[str]) -> None:
        """Nothing was written; the request's tally is dropped."""
        self._pending.clear()


class PlacementClaimer:
    """A :class:`~berth.claims.Claimer` writing allocations through the client.

    The client must speak a microversion >= 1.28 (consumer generations); the default
    1.39 client is fine. Thread-safe: counters are guarded by a lock.
    """

    def __init__(self, client: PlacementAccess, attempts: int = CLAIM_ATTEMPTS, *,
                 merge_existing: bool = False) -> None:
        self.client = client
        self.attempts = attempts
        #: Nova's claim of a move: a consumer holding allocations keeps them and adds
        #: the destination's (see :meth:`claim`); off for Berth's own boots.
        self.merge_existing = merge_existing
        #: The allocations merged claims found (by consumer, with when): a rollback
        #: puts them back rather than taking the source's away too.
        self._before_merge: dict[str, tuple[float, dict[str, dict[str, int]]]] = {}
        self.stats = ClaimStats()
        self._lock = threading.Lock()

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def claim(
        self,
        consumer_uuid: str,
        allocation_request: dict[str, Any],
        spec: RequestSpec,
        version: str | None,
    ) -> bool | ClaimRefusal:
        """PUT the allocation at the allocation request's microversion ``version`` (as
        Nova does: 1.36 sends no consumer type, so placement records "unknown"); True on
        204, False when placement refuses it.

        The claim is sent as a new consumer (consumer generation null, microversion >=
        1.28). Placement refuses it with a consumer-generation conflict when the
        consumer exists. For Berth's own boots (the default) its allocations belong to
        another instance (a re-issued uuid, or a concurrent claim for the same one): the
        claim is refused and counted (``consumer_conflicts``) rather than merged into
        them, unless they are exactly this claim (an earlier attempt of it committed and
        its answer was lost with the database connection).

        With ``merge_existing`` (the scheduler of a real Nova), it is Nova's
        ``claim_resources``: a consumer that holds allocations is an instance being
        evacuated, whose source allocations stay; the claim adds the destination's
        providers it does not hold yet and is written with the consumer generation just
        read. Should the consumer change in between, this host is refused and the next
        one tried (Nova fails the whole request with AllocationUpdateFailed).

        A refusal says why (:class:`~berth.claims.ClaimRefusal`: for capacity, the class,
        the amount asked and the amount free). A provider-generation race (placement's
        "Inventory and/or allocations changed") is retried up to ``attempts`` times in
        all and counted.
        """
        self._count("claims")
        wanted = allocation_request.get("allocations", {})
        allocations: dict[str, dict[str, int]] = {
            rp: dict(body.get("resources", {})) for rp, body in wanted.items()}
        payload, generation = allocations, None
        before: dict[str, dict[str, int]] = {}
        attempt = 0
        while True:
            try:
                self.client.put_allocations(
                    consumer_uuid, payload,
                    project_id=spec.project_id or "unknown",
                    user_id=spec.user_id or "unknown",
                    consumer_generation=generation,
                    microversion=version,
                )
            except ConflictError as exc:
                if not exc.is_generation_conflict:
                    self._count("refusals")
                    LOG.debug("claim for %s refused: %s", consumer_uuid, exc.detail)
                    return self._refusal(exc.detail, allocations)
                if "consumer generation conflict" in exc.detail:
                    if generation is None and self.merge_existing:
                        merged = self._doubled_up(consumer_uuid, allocations)
                        if merged is not None:
                            payload, generation, before = merged
                            continue
                    elif generation is not None:
                        self._count("consumer_conflicts")
                        LOG.warning("claim for %s refused: the consumer changed after it was "
                                    "read: %s", consumer_uuid, exc.detail)
                        return ClaimRefusal("the consumer changed meanwhile")
                    if self._already_ours(consumer_uuid, allocations):
                        self._count("successes")
                        return True
                    self._count("consumer_conflicts")
                    LOG.warning("claim for %s refused: the consumer exists already (another "
                                "instance's allocations): %s", consumer_uuid, exc.detail)
                    return ClaimRefusal("the consumer exists already")
                attempt += 1
                if attempt >= self.attempts:
                    self._count("exhausted")
                    LOG.warning("claim for %s: out of retries: %s", consumer_uuid, exc.detail)
                    return ClaimRefusal(f"concurrent updates ({attempt} attempts)")
                self._count("conflict_retries")
                continue
            except PlacementAPIError as exc:
                self._count("errors")
                LOG.warning("unable to submit allocation for %s: %s", consumer_uuid, exc)
                return ClaimRefusal(f"placement error {exc.status}")
            except httpx.HTTPError as exc:
                self._count("errors")
                if not isinstance(exc, NOTHING_SENT):
                    # The PUT may have been applied, its answer lost (a read timeout, a
                    # connection that broke). Before another host is tried, read the
                    # consumer: a claim that committed is this host's, and one that did
                    # not is refused; if it cannot be read, the request stops here (as
                    # Nova's does), or the next host's claim would be added to it.
                    held = self._holds(consumer_uuid, payload)
                    if held is None:
                        raise ServiceUnavailable(
                            f"placement gave no answer to the claim for {consumer_uuid} "
                            f"({one_line(exc)}) and its allocations cannot be read") from None
                    if held:
                        LOG.info("claim for %s had committed before its answer was lost",
                                 consumer_uuid)
                        return self._claimed(consumer_uuid, generation, before)
                LOG.warning("placement unreachable while claiming for %s: %s", consumer_uuid, exc)
                return ClaimRefusal("placement unreachable")
            return self._claimed(consumer_uuid, generation, before)

    def _claimed(self, consumer_uuid: str, generation: int | None,
                 before: dict[str, dict[str, int]]) -> bool:
        """Count a claim made; a merged one remembers what the consumer held before."""
        self._count("successes")
        if generation is not None or self._before_merge:
            with self._lock:
                now = time.monotonic()
                self._before_merge = {c: v for c, v in self._before_merge.items()
                                      if now - v[0] < MERGE_MEMORY and c != consumer_uuid}
                if generation is not None:
                    self._before_merge[consumer_uuid] = (now, before)
        return True

    def _holds(self, consumer_uuid: str, allocations: Mapping[str, Mapping[str, int]]) -> bool | None:
        """Whether the consumer holds exactly ``allocations``; None if it cannot be read."""
        try:
            current = self.client.get_allocations(consumer_uuid).allocations
        except (PlacementAPIError, httpx.HTTPError, ServiceUnavailable):
            return None
        return {rp: dict(r) for rp, r in (current or {}).items()} == {
            rp: dict(r) for rp, r in allocations.items()}

    def _doubled_up(self, consumer_uuid: str, allocations: Mapping[str, Mapping[str, int]]
                    ) -> tuple[dict[str, dict[str, int]], int | None,
                               dict[str, dict[str, int]]] | None:
        """Nova's doubled-up allocation of a move (``_move_operation_alloc_request``):
        the consumer's current allocations, plus the claim's on the providers it does not
        hold yet (a sharing provider it uses already keeps its amounts); with the
        consumer generation read, and what it held before. None when the consumer holds
        nothing (or cannot be read)."""
        try:
            current = self.client.get_allocations(consumer_uuid)
        except (PlacementAPIError, httpx.HTTPError, ServiceUnavailable):
            return None
        if not current.allocations:
            return None
        merged = {rp: dict(res) for rp, res in current.allocations.items()}
        for rp, res in allocations.items():
            if rp not in merged:
                merged[rp] = dict(res)
        LOG.debug("claim for %s: a move; source and destination held together: %s",
                  consumer_uuid, merged)
        before = {rp: dict(res) for rp, res in current.allocations.items()}
        return merged, current.consumer_generation, before

    def _refusal(self, detail: str, allocations: Mapping[str, Mapping[str, int]]) -> ClaimRefusal:
        """What placement's refusal says, with the amounts: the class and provider its
        message names, what the claim asked there, and what is free there (read back,
        capacity less usage, when an explanation asks); only the reason when it names
        none or the reads fail."""
        found = _CAPACITY_REFUSAL.search(detail)
        if found is None:
            return ClaimRefusal("refused by placement" if "constraints" not in detail
                                else "violates the inventory's min_unit, max_unit or step_size")
        rc, rp = found.group(1), found.group(2)

        def free() -> int | None:
            try:
                _, inventory = self.client.get_inventories(rp)
                used = self.client.provider_usages(rp).get(rc, 0)
                inv = inventory.get(rc)
                if inv is None:
                    return None
                capacity = int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
                return capacity - int(used)
            except (PlacementAPIError, httpx.HTTPError, ServiceUnavailable, KeyError,
                    TypeError):
                return None  # the provider went away, or placement cannot be read

        return ClaimRefusal(INSUFFICIENT, resource_class=rc, provider=rp,
                            requested=allocations.get(rp, {}).get(rc), lookup=free)

    def _already_ours(self, consumer_uuid: str, allocations: Mapping[str, Mapping[str, int]]) -> bool:
        """Whether the consumer holds exactly this claim: an earlier attempt of this very
        claim committed although its answer was lost (a connection dropped during the
        commit, retried as a new consumer). Issued uuids are unique (build records), so
        another instance never holds the same uuid with the same allocations."""
        if allocations and self._holds(consumer_uuid, allocations):
            LOG.info("claim for %s had committed before its answer was lost", consumer_uuid)
            return True
        return False

    def rollback(self, consumer_uuids: Sequence[str]) -> None:
        """Remove every consumer's allocations (missing ones are fine): several at once
        in one POST /allocations when they are as this claimer left them, else one
        DELETE each."""
        uuids = list(consumer_uuids)
        with self._lock:
            restore = {u: self._before_merge.pop(u)[1] for u in uuids if u in self._before_merge}
        uuids = [u for u in uuids if u not in restore]
        for consumer, before in restore.items():
            self._restore(consumer, before)
        if len(uuids) > 1 and self._release_together(uuids):
            return
        for consumer in uuids:
            self.delete(consumer)

    def _restore(self, consumer_uuid: str, before: dict[str, dict[str, int]]) -> None:
        """Put back what a merged claim's consumer held before it (a move's source):
        Nova never takes those away when a request fails."""
        self._count("rollbacks")
        try:
            current = self.client.get_allocations(consumer_uuid)
            self.client.put_allocations(
                consumer_uuid, before, project_id=current.project_id or "unknown",
                user_id=current.user_id or "unknown",
                consumer_generation=current.consumer_generation)
        except (PlacementAPIError, httpx.HTTPError, ServiceUnavailable) as exc:
            LOG.warning("could not put back the allocations %s held before its move's "
                        "claim: %s", consumer_uuid, exc)

    def _release_together(self, uuids: Sequence[str]) -> bool:
        """Empty every consumer's allocations in one transaction (a new consumer's
        claim leaves it at generation 1). False, with nothing changed, when placement
        refuses it (a consumer gone or written since) or cannot be reached."""
        body = {uuid: ConsumerPost(allocations={}, project_id="unknown", user_id="unknown",
                                   consumer_generation=1) for uuid in uuids}
        try:
            self.client.post_allocations(body)
        except (PlacementAPIError, httpx.HTTPError, ServiceUnavailable) as exc:
            LOG.debug("releasing %d claims together refused (%s); one by one", len(uuids), exc)
            return False
        self._count("rollbacks", len(uuids))
        return True

    def delete(self, consumer_uuid: str) -> bool:
        """DELETE one consumer's allocations; False if it had none or placement failed."""
        self._count("rollbacks")
        try:
            self.client.delete_allocations(consumer_uuid)
        except PlacementAPIError as exc:
            if exc.status != 404:
                LOG.warning("could not delete allocations of %s: %s", consumer_uuid, exc)
            return False
        except (httpx.HTTPError, ServiceUnavailable) as exc:
            # The claim stays until the reconciler releases it (its build never settles).
            LOG.warning("placement unreachable deleting allocations of %s: %s", consumer_uuid, exc)
            return False
        return True
