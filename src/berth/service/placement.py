"""The scheduler's side of Placement: fetch candidates, map them to rows, claim.

* :class:`PlacementCandidates` runs ``GET /allocation_candidates`` at microversion 1.36
  through the typed client. An HTTP error or a connection failure gives *no candidates*
  (Nova logs and answers ``(None, None, None)``, which becomes NoValidHost).
* :func:`candidate_set` maps the answer to snapshot rows: a row is considered only if its
  compute node uuid (= the root provider uuid) is in ``provider_summaries``; its
  allocation requests are every request that allocates from that uuid (Nova's
  ``alloc_reqs_by_rp_uuid``).
* :class:`PlacementClaimer` writes ``PUT /allocations/{consumer}`` with the project and
  user and the consumer generation (a move merges the consumer's existing allocations). Generation conflicts are retried a bounded number of times and
  counted; a refusal (capacity) answers False. ``rollback`` deletes allocations.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from berth.claims import CANDIDATES_MICROVERSION, CandidateSet
from berth.model.request import RequestSpec
from berth.placement.client import ConflictError, PlacementAPIError, PlacementClient
from berth.snapshot import HostSnapshot

LOG = logging.getLogger(__name__)

#: Attempts of one claim when placement reports a concurrent update (Nova's ``@retries``).
CLAIM_ATTEMPTS = 4


@dataclass
class CandidatesAnswer:
    """What ``GET /allocation_candidates`` answered (empty on any failure)."""

    allocation_requests: list[dict[str, Any]] = field(default_factory=list)
    provider_summaries: dict[str, Any] = field(default_factory=dict)
    version: str | None = CANDIDATES_MICROVERSION
    error: str | None = None

    def merge(self, other: CandidatesAnswer) -> None:
        """Append another answer's requests and merge its summaries (PCPU fallback)."""
        self.allocation_requests.extend(other.allocation_requests)
        self.provider_summaries.update(other.provider_summaries)


class PlacementCandidates:
    """Allocation candidates through a :class:`PlacementClient` pinned at 1.36."""

    def __init__(self, client: PlacementClient) -> None:
        self.client = client

    def get(self, params: Sequence[tuple[str, str]]) -> CandidatesAnswer:
        """Run the query; errors are logged and give an empty answer, as in Nova."""
        grouped: dict[str, list[str]] = defaultdict(list)
        for key, value in params:
            grouped[key].append(value)
        try:
            body = self.client.allocation_candidates(grouped)
        except PlacementAPIError as exc:
            LOG.warning("GET /allocation_candidates failed: %s", exc)
            return CandidatesAnswer(version=None, error=str(exc))
        except httpx.HTTPError as exc:
            LOG.warning("placement is unreachable: %s", exc)
            return CandidatesAnswer(version=None, error=f"placement unreachable: {exc}")
        return CandidatesAnswer(list(body.get("allocation_requests") or []),
                                dict(body.get("provider_summaries") or {}))


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
    by_rp: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for alloc_req in answer.allocation_requests:
        for rp_uuid in alloc_req.get("allocations", {}):
            by_rp[rp_uuid].append(alloc_req)
    if index is None:
        index = rows_by_uuid(snapshot)
    by_row: dict[int, list[dict[str, Any]]] = {}
    for rp_uuid in answer.provider_summaries:
        row = index.get(rp_uuid)
        if row is not None:
            by_row[row] = by_rp.get(rp_uuid, [])
    return CandidateSet(by_row=by_row, version=answer.version or CANDIDATES_MICROVERSION)


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


def merge_allocations(
    current: Mapping[str, Mapping[str, int]], new: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, int]]:
    """Nova's move-claim payload: the consumer's existing allocations plus the new ones."""
    merged: dict[str, dict[str, int]] = {rp: dict(res) for rp, res in current.items()}
    for rp, body in new.items():
        resources = body.get("resources", body)
        target = merged.setdefault(rp, {})
        for rc, amount in resources.items():
            target[rc] = target.get(rc, 0) + int(amount)
    return merged


class PlacementClaimer:
    """A :class:`~berth.claims.Claimer` writing allocations through the client.

    The client must speak a microversion >= 1.28 (consumer generations); the default
    1.39 client is fine. Thread-safe: counters are guarded by a lock.
    """

    def __init__(self, client: PlacementClient, attempts: int = CLAIM_ATTEMPTS) -> None:
        self.client = client
        self.attempts = attempts
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
    ) -> bool:
        """PUT the allocation; True on 204, False when placement refuses it.

        The first PUT assumes a new consumer (generation None), which saves a round trip
        for every fresh instance. If the consumer already exists (a move), placement
        answers a consumer-generation conflict; the consumer is then read, its
        allocations merged with the new ones and its generation sent — Nova's payload.
        A provider-generation race (placement's "Inventory and/or allocations changed")
        is retried up to ``attempts`` times in all and counted; a second
        consumer-generation conflict means someone else is changing the consumer, which
        Nova reports as AllocationUpdateFailed and Berth as a refused claim.
        """
        self._count("claims")
        wanted = allocation_request.get("allocations", {})
        allocations: dict[str, dict[str, int]] = {
            rp: dict(body.get("resources", {})) for rp, body in wanted.items()}
        generation: int | None = None
        read_consumer = False
        attempt = 0
        while True:
            try:
                if read_consumer:
                    current = self.client.get_allocations(consumer_uuid)
                    if current.allocations:
                        allocations = merge_allocations(current.allocations, wanted)
                    generation = current.consumer_generation
                self.client.put_allocations(
                    consumer_uuid, allocations,
                    project_id=spec.project_id or "unknown",
                    user_id=spec.user_id or "unknown",
                    consumer_generation=generation,
                )
            except ConflictError as exc:
                if not exc.is_generation_conflict:
                    self._count("refusals")
                    LOG.debug("claim for %s refused: %s", consumer_uuid, exc.detail)
                    return False
                if "consumer generation conflict" in exc.detail:
                    if not read_consumer:
                        read_consumer = True
                        continue
                    self._count("consumer_conflicts")
                    LOG.warning("claim for %s: the consumer changed meanwhile: %s",
                                consumer_uuid, exc.detail)
                    return False
                attempt += 1
                if attempt >= self.attempts:
                    self._count("exhausted")
                    LOG.warning("claim for %s: out of retries: %s", consumer_uuid, exc.detail)
                    return False
                self._count("conflict_retries")
                continue
            except PlacementAPIError as exc:
                self._count("errors")
                LOG.warning("unable to submit allocation for %s: %s", consumer_uuid, exc)
                return False
            except httpx.HTTPError as exc:
                self._count("errors")
                LOG.warning("placement unreachable while claiming for %s: %s", consumer_uuid, exc)
                return False
            self._count("successes")
            return True

    def rollback(self, consumer_uuids: Sequence[str]) -> None:
        """DELETE every consumer's allocations (missing ones are fine)."""
        for consumer in consumer_uuids:
            self.delete(consumer)

    def delete(self, consumer_uuid: str) -> bool:
        """DELETE one consumer's allocations; False if it had none or placement failed."""
        self._count("rollbacks")
        try:
            self.client.delete_allocations(consumer_uuid)
        except PlacementAPIError as exc:
            if exc.status != 404:
                LOG.warning("could not delete allocations of %s: %s", consumer_uuid, exc)
            return False
        except httpx.HTTPError as exc:
            LOG.warning("placement unreachable deleting allocations of %s: %s", consumer_uuid, exc)
            return False
        return True
