"""Placement's two roles in a request, as interfaces: candidates and claims.

* A :class:`CandidateSet` is what ``GET /allocation_candidates`` answered, already mapped
  to snapshot rows: the hosts placement considers able to hold the request, each with its
  allocation requests. The adapter computes it before calling the pure core.
* A :class:`Claimer` writes an allocation (``PUT /allocations/{consumer}``) and removes
  the allocations of a request that could not be placed whole.

:class:`InMemoryPlacement` plays both roles over a snapshot, for the core's tests and
for estimating, in an explanation, why placement left a host out. Scheduling itself,
offline (``berth schedule``) and online, goes through the Placement-backed
implementation with the store adapter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from berth.config import SchedulerConfig
from berth.filters.base import Reject
from berth.model.request import RequestSpec
from berth.snapshot import HostSnapshot

#: The microversion Nova's scheduler asks placement for candidates with.
CANDIDATES_MICROVERSION = "1.36"


@dataclass
class CandidateSet:
    """Allocation candidates by snapshot row, plus why other rows got none.

    ``by_row`` holds only rows placement returned; rows absent from it are not considered
    at all (like compute nodes missing from ``provider_summaries``). ``rejections``
    explains, for an explanation, why placement left a row out.

    ``no_allocation_requests`` says placement answered no allocation request at all:
    that, and only that, is Nova's NoValidHost with an empty reason (§8.1.3.5). An answer
    whose requests map to no known compute node is not empty: no host is in play and the
    request fails the usual way (§8.2.7). Left None, it is derived from ``by_row`` (a set
    built without a placement answer, where every request belongs to a row).
    """

    by_row: dict[int, list[dict[str, Any]]]
    version: str | None = CANDIDATES_MICROVERSION
    rejections: dict[int, Reject] = field(default_factory=dict)
    no_allocation_requests: bool | None = None

    def __post_init__(self) -> None:
        if self.no_allocation_requests is None:
            self.no_allocation_requests = len(self.by_row) == 0
        self._rows: np.ndarray | None = None

    def row_array(self) -> np.ndarray:
        """The rows of :attr:`by_row` as an int64 array (computed once; a mapping that
        keeps its rows as an array, see :class:`RowArray`, hands them over)."""
        if self._rows is None:
            by_row = self.by_row
            if isinstance(by_row, RowArray):
                self._rows = np.asarray(by_row.row_array(), dtype=np.int64)
            else:
                self._rows = np.fromiter(by_row, dtype=np.int64, count=len(by_row))
        return self._rows


@runtime_checkable
class RowArray(Protocol):
    """A ``by_row`` mapping that keeps its rows as an array."""

    def row_array(self) -> np.ndarray:
        """The rows, in iteration order."""


@dataclass(frozen=True)
class ClaimRefusal:
    """Why placement refused a claim; false, as the ``False`` a claimer may also answer.

    ``reason`` is short and constant ("insufficient capacity", "the consumer exists
    already", ...); for a capacity refusal ``resource_class``, ``provider`` and the
    ``requested`` and ``free`` amounts (free: capacity less usage, as placement counts
    them, after the refusal) say what did not fit.
    """

    reason: str
    resource_class: str | None = None
    provider: str | None = None
    requested: int | None = None
    free: int | None = None
    #: Reads the free amount when it is first asked for (a claimer that must ask
    #: placement for it does so only for an explanation).
    lookup: Callable[[], int | None] | None = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:
        return False

    def free_amount(self) -> int | None:
        """``free``, or what ``lookup`` reads."""
        if self.free is None and self.lookup is not None:
            return self.lookup()
        return self.free

    def render(self) -> str:
        """``insufficient MEMORY_MB (requested 8192, free 4096)``."""
        what = self.reason
        if self.resource_class is not None and self.reason == INSUFFICIENT:
            what = f"insufficient {self.resource_class}"
        amounts = [f"{name} {value}" for name, value in (("requested", self.requested),
                                                         ("free", self.free_amount()))
                   if value is not None]
        return f"{what} ({', '.join(amounts)})" if amounts else what


#: The reason of a refusal for capacity.
INSUFFICIENT = "insufficient capacity"


class Claimer(Protocol):
    """Claims resources for an instance and rolls back a request's claims."""

    def claim(
        self,
        consumer_uuid: str,
        allocation_request: dict[str, Any],
        spec: RequestSpec,
        version: str | None,
    ) -> bool | ClaimRefusal:
        """Write the allocation; false if placement refused it: ``False``, or a
        :class:`ClaimRefusal` saying why."""
        ...

    def rollback(self, consumer_uuids: Sequence[str]) -> None:
        """Delete the allocations of these consumers."""
        ...


def provider_id(snapshot: HostSnapshot, row: int) -> str:
    """The resource-provider id of a row: its uuid, or ``host/node`` if it has none."""
    uuid = snapshot.obj("uuid")[row]
    if uuid:
        return str(uuid)
    return f"{snapshot.obj('host')[row]}/{snapshot.obj('nodename')[row]}"


def requested_resources(spec: RequestSpec) -> dict[str, int]:
    """The flavor's basic resources as placement amounts (reference §8.5, flavor basics).

    ``DISK_GB = ephemeral_gb + ceil(swap_mb / 1024) + root_gb`` (root left out for a
    boot-from-volume request); zero amounts are dropped.
    """
    flavor = spec.flavor
    disk = flavor.ephemeral_gb + math.ceil(flavor.swap / 1024) + (0 if spec.is_bfv else flavor.root_gb)
    amounts = {"VCPU": flavor.vcpus, "MEMORY_MB": flavor.memory_mb, "DISK_GB": disk}
    return {rc: int(amount) for rc, amount in amounts.items() if amount}


class InMemoryPlacement:
    """Candidates and claims computed from a snapshot's own capacity columns.

    Each row is the inventory its compute would report to placement (as the compute
    agents do): VCPU ``vcpus_total`` at ``cpu_allocation_ratio``, MEMORY_MB
    ``total_usable_ram_mb`` at ``ram_allocation_ratio``, DISK_GB ``total_usable_disk_gb``
    at ``disk_allocation_ratio``, each with ``reserved`` from ``config``'s
    ``reserved_host_cpus`` / ``reserved_host_memory_mb`` / ``reserved_host_disk_mb``
    (rounded up to GB; at most the total), ``max_unit`` the total. Placement's capacity
    rule then holds (§8.5): ``used + amount <= (total - reserved) * ratio``, where
    ``used`` (the allocations) is what the host reports as used minus its reserved
    amount — the compute counts the reserved amount as used, placement does not. Claims
    add to ``used``. Without ``config`` nothing is reserved: the snapshot's usage is
    taken as placement's (hand-built snapshots that report no reserved amount).
    """

    RESOURCE_CLASSES = ("VCPU", "MEMORY_MB", "DISK_GB")

    def __init__(self, snapshot: HostSnapshot, config: SchedulerConfig | None = None) -> None:
        self.snapshot = snapshot

        def column(values: np.ndarray) -> np.ndarray:
            return np.nan_to_num(values, nan=0.0)

        total = {
            "VCPU": column(snapshot.num("vcpus_total")),
            "MEMORY_MB": column(snapshot.num("total_usable_ram_mb")),
            "DISK_GB": column(snapshot.num("total_usable_disk_gb")),
        }
        ratio = {
            "VCPU": column(snapshot.num("cpu_allocation_ratio")),
            "MEMORY_MB": column(snapshot.num("ram_allocation_ratio")),
            "DISK_GB": column(snapshot.num("disk_allocation_ratio")),
        }
        reported_used = {
            "VCPU": column(snapshot.num("vcpus_used")),
            "MEMORY_MB": total["MEMORY_MB"] - column(snapshot.num("free_ram_mb")),
            "DISK_GB": total["DISK_GB"] - column(snapshot.num("free_disk_mb")) / 1024.0,
        }
        option = {
            "VCPU": config.reserved_host_cpus,
            "MEMORY_MB": config.reserved_host_memory_mb,
            "DISK_GB": math.ceil(config.reserved_host_disk_mb / 1024),
        } if config is not None else dict.fromkeys(total, 0)
        reserved = {rc: np.minimum(float(option[rc]), total[rc]) for rc in total}
        self.capacity: dict[str, np.ndarray] = {
            rc: (total[rc] - reserved[rc]) * ratio[rc] for rc in total}
        self.max_unit: dict[str, np.ndarray] = {rc: total[rc].copy() for rc in total}
        self.used: dict[str, np.ndarray] = {
            rc: np.maximum(reported_used[rc] - reserved[rc], 0.0) for rc in total}
        self._rows_by_provider = {provider_id(snapshot, r): r for r in range(len(snapshot))}
        self.allocations: dict[str, dict[int, dict[str, int]]] = {}

    def candidates(self, spec: RequestSpec, rows: np.ndarray | None = None) -> CandidateSet:
        """Every row (or every row of ``rows``) with room for the flavor's resources."""
        amounts = requested_resources(spec)
        n = len(self.snapshot)
        if rows is None:
            rows = np.arange(n, dtype=np.int64)
        ok = np.ones(len(rows), dtype=bool)
        rejections: dict[int, Reject] = {}
        for rc, amount in amounts.items():
            free = self.capacity[rc][rows] - self.used[rc][rows]
            fits = (free >= amount) & (self.max_unit[rc][rows] >= amount)
            if not fits.all():
                for pos in np.flatnonzero(~fits & ok).tolist():
                    rejections[int(rows[pos])] = Reject.of(
                        f"insufficient {rc} in placement",
                        requested=amount,
                        free=round(float(max(free[pos], 0.0)), 3),
                    )
            ok &= fits
        by_row: dict[int, list[dict[str, Any]]] = {}
        for row in rows[ok].tolist():
            rp = provider_id(self.snapshot, row)
            by_row[row] = [
                {"allocations": {rp: {"resources": dict(amounts)}}, "mappings": {"": [rp]}}
            ]
        return CandidateSet(by_row=by_row, rejections=rejections)

    def claim(
        self,
        consumer_uuid: str,
        allocation_request: dict[str, Any],
        spec: RequestSpec,
        version: str | None,
    ) -> bool | ClaimRefusal:
        """Record the allocation if every provider still has room; all or nothing."""
        planned: dict[int, dict[str, int]] = {}
        for rp, body in allocation_request.get("allocations", {}).items():
            row = self._rows_by_provider.get(rp)
            if row is None:
                return ClaimRefusal("no such resource provider", provider=rp)
            planned[row] = {rc: int(v) for rc, v in body.get("resources", {}).items()}
        for row, resources in planned.items():
            for rc, amount in resources.items():
                if rc not in self.capacity:
                    return ClaimRefusal("no such inventory", resource_class=rc,
                                        provider=provider_id(self.snapshot, row))
                if self.used[rc][row] + amount > self.capacity[rc][row]:
                    return ClaimRefusal(
                        INSUFFICIENT, resource_class=rc,
                        provider=provider_id(self.snapshot, row), requested=amount,
                        free=int(self.capacity[rc][row] - self.used[rc][row]))
        for row, resources in planned.items():
            for rc, amount in resources.items():
                self.used[rc][row] += amount
        # A consumer that holds allocations already (an evacuated instance) keeps them:
        # placement's claim for a move merges the old and the new.
        held = self.allocations.setdefault(consumer_uuid, {})
        for row, resources in planned.items():
            target = held.setdefault(row, {})
            for rc, amount in resources.items():
                target[rc] = target.get(rc, 0) + amount
        return True

    def rollback(self, consumer_uuids: Sequence[str]) -> None:
        """Give back what these consumers held."""
        for consumer in consumer_uuids:
            for row, resources in self.allocations.pop(consumer, {}).items():
                for rc, amount in resources.items():
                    self.used[rc][row] -= amount

    # ------------------------------------------------------------ moves (berth.moves)
    def adopt(self, consumer_uuid: str, row: int, resources: Mapping[str, int]) -> None:
        """Name an allocation the snapshot's usage already counts (an instance the cloud
        file lists on ``row``), so a move can hand it from consumer to consumer."""
        self.allocations[consumer_uuid] = {row: {rc: int(v) for rc, v in resources.items() if v}}

    def allocations_of(self, consumer: str) -> dict[str, dict[str, int]]:
        """The consumer's allocations by provider id."""
        return {provider_id(self.snapshot, row): dict(res)
                for row, res in self.allocations.get(consumer, {}).items()}

    def move_allocations(self, source: str, target: str, spec: RequestSpec) -> None:
        """``target`` takes over every allocation of ``source`` (its own are given back)."""
        self.rollback([target])
        moved = self.allocations.pop(source, {})
        if moved:
            self.allocations[target] = moved

    def merge_allocations(self, source: str, target: str, spec: RequestSpec) -> None:
        """``target`` keeps its allocations and takes over those of ``source``."""
        moved = self.allocations.pop(source, {})
        held = self.allocations.setdefault(target, {})
        for row, resources in moved.items():
            into = held.setdefault(row, {})
            for rc, amount in resources.items():
                into[rc] = into.get(rc, 0) + amount
        if not held:
            del self.allocations[target]

    def replace_allocations(self, consumer: str, allocations: Mapping[str, Mapping[str, int]],
                            spec: RequestSpec) -> None:
        """Set the consumer's allocations to exactly ``allocations`` (no capacity check:
        only ever allocations the consumer held before)."""
        self.rollback([consumer])
        planned = {self._rows_by_provider[rp]: {rc: int(v) for rc, v in res.items()}
                   for rp, res in allocations.items() if rp in self._rows_by_provider}
        for row, resources in planned.items():
            for rc, amount in resources.items():
                self.used[rc][row] += amount
        if planned:
            self.allocations[consumer] = planned

    def delete(self, consumer: str) -> bool:
        """Give back what the consumer held; False if it held nothing."""
        held = consumer in self.allocations
        self.rollback([consumer])
        return held
