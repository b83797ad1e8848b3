"""Records, constants and small helpers of the Placement store (:mod:`berth.placement.store`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import os_resource_classes

from berth.placement import errors
from berth.placement.bounds import MAX_INT
from berth.placement.query import MemberOf, RequiredTraits

INCOMPLETE_ID = "00000000-0000-0000-0000-000000000000"
RETRY_COUNT = 10
STANDARD_RCS = frozenset(os_resource_classes.STANDARDS)
CONCURRENT_MSG = "Another thread concurrently updated the data. Please retry your update"


class _MissingProvider(errors.BadRequest):
    """An allocation names an unknown provider; new consumers are kept (Placement quirk)."""


class _Retry(Exception):
    """A provider generation CAS lost a race; the transaction is retried."""


class _Unset:
    """Marker: no consumer generation was sent (microversion below 1.28)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


@dataclass(frozen=True, slots=True)
class ProviderRecord:
    """A resource provider row with its parent and root uuids resolved."""

    id: int
    uuid: str
    name: str
    generation: int
    parent_uuid: str | None
    root_uuid: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None

    @property
    def last_modified(self) -> dt.datetime | None:
        """The newer of updated_at and created_at."""
        return self.updated_at or self.created_at


@dataclass(frozen=True, slots=True)
class InventoryRecord:
    """One inventory row of a provider."""

    resource_class: str
    total: int
    reserved: int
    min_unit: int
    max_unit: int
    step_size: int
    allocation_ratio: float
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None

    @property
    def capacity(self) -> int:
        """int((total - reserved) * allocation_ratio)."""
        return int((self.total - self.reserved) * self.allocation_ratio)

    def as_dict(self) -> dict[str, Any]:
        """The wire representation (without the generation)."""
        return inventory_dict(self)


def inventory_dict(inv: Any) -> dict[str, Any]:
    """An inventory's wire representation (without the generation), from any object
    with its fields (a stored row, or the candidate engine's snapshot of it)."""
    return {
        "total": inv.total,
        "reserved": inv.reserved,
        "min_unit": inv.min_unit,
        "max_unit": inv.max_unit,
        "step_size": inv.step_size,
        "allocation_ratio": float(inv.allocation_ratio),
    }


def inventory_from_row(resource_class: str, row: Any) -> InventoryRecord:
    """An inventory record from an ``inventories`` row (with its stamps)."""
    return InventoryRecord(
        resource_class=resource_class,
        total=row.total,
        reserved=row.reserved,
        min_unit=row.min_unit,
        max_unit=row.max_unit,
        step_size=row.step_size,
        allocation_ratio=row.allocation_ratio,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def inventory_from_body(resource_class: str, body: Mapping[str, Any]) -> InventoryRecord:
    """Build an inventory record from a request body, applying the API defaults."""
    return InventoryRecord(
        resource_class=resource_class,
        total=int(body["total"]),
        reserved=int(body.get("reserved", 0)),
        min_unit=int(body.get("min_unit", 1)),
        max_unit=int(body.get("max_unit", MAX_INT)),
        step_size=int(body.get("step_size", 1)),
        allocation_ratio=float(body.get("allocation_ratio", 1.0)),
    )


@dataclass
class ConsumerWrite:
    """The new complete allocation set of one consumer."""

    consumer_uuid: str
    project_id: str
    user_id: str
    allocations: list[tuple[str, str, int]]  # (provider uuid, resource class, used)
    consumer_type: str | None = None  # None: leave the stored type alone (< 1.38)
    generation: int | None | _Unset = UNSET  # UNSET: no check (< 1.28)


@dataclass
class ConsumerAllocations:
    """GET /allocations/{consumer} data."""

    allocations: dict[str, dict[str, int]]  # provider uuid -> class -> used
    generations: dict[str, int]  # provider uuid -> generation
    project_id: str | None = None
    user_id: str | None = None
    consumer_generation: int | None = None
    consumer_type: str | None = None
    last_modified: dt.datetime | None = None


@dataclass
class _ConsumerState:
    id: int
    uuid: str
    generation: int
    created: bool


@dataclass
class ProviderFilters:
    """Filters of GET /resource_providers."""

    name: str | None = None
    uuid: str | None = None
    member_of: MemberOf | None = None
    resources: dict[str, int] = field(default_factory=dict)
    in_tree: str | None = None
    required: RequiredTraits | None = None


def _capacity_message(version: tuple[int, int], rc: str, rp_uuid: str) -> str:
    if version >= (1, 26):
        tail = "The reserved value is greater than total."
    else:
        tail = "The reserved value is greater than or equal to total."
    return f"Invalid inventory for '{rc}' on resource provider '{rp_uuid}'. {tail}"


def _capacity_ok(inv: InventoryRecord, version: tuple[int, int]) -> bool:
    """Placement's write-time check of ``int((total - reserved) * allocation_ratio)``:
    positive below 1.26, not negative from 1.26 (so the ratio counts, a negative one too)."""
    capacity = int((inv.total - inv.reserved) * inv.allocation_ratio)
    return capacity >= 0 if version >= (1, 26) else capacity > 0


def _fields(inv: InventoryRecord) -> dict[str, Any]:
    return {"resource_class": inv.resource_class, **inventory_dict(inv)}
