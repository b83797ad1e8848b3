"""The reads of one provider that compute agents make, on a kept raw connection.

A compute service reads its provider's inventories, traits, aggregates and usages when
it starts (Nova's resource tracker reads what exists before it writes; a restarted
``berth compute`` fleet does it for every host), and Nova's does again periodically.
Through SQLAlchemy each read was a pool checkout with its ping, a statement built and
compiled per call, the provider read on its own, and for inventories and usages the whole
resource class table: 0.5-1.7 ms of a process's CPU on PostgreSQL. Here each is one
statement (the provider joined to its rows: one snapshot, one round trip) on the store's
kept raw connections, with the general path's answer in the general path's types. A
database error on a kept connection falls back to the general path (which the API
retries)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from berth.placement.provider_writes import as_datetime
from berth.placement.store_base import StoreBase
from berth.placement.store_records import InventoryRecord, ProviderRecord

#: The provider's columns, then (``{}``) those of its rows: one row per row of the
#: provider's (one with NULLs there when it has none), none without the provider.
_PROVIDER_AND = (
    "SELECT rp.id, rp.uuid, rp.name, rp.generation, par.uuid, root.uuid, rp.created_at, "
    "rp.updated_at, {} FROM resource_providers rp "
    "LEFT JOIN resource_providers par ON par.id = rp.parent_provider_id "
    "LEFT JOIN resource_providers root ON root.id = rp.root_provider_id {} "
    "WHERE rp.uuid = ? ORDER BY {}"
)
_TRAITS = _PROVIDER_AND.format(
    "t.name", "LEFT JOIN resource_provider_traits x ON x.resource_provider_id = rp.id "
    "LEFT JOIN traits t ON t.id = x.trait_id", "t.id")
_AGGREGATES = _PROVIDER_AND.format(
    "a.uuid", "LEFT JOIN resource_provider_aggregates x ON x.resource_provider_id = rp.id "
    "LEFT JOIN placement_aggregates a ON a.id = x.aggregate_id", "a.id")
_INVENTORIES = _PROVIDER_AND.format(
    "i.resource_class_id, c.name, i.total, i.reserved, i.min_unit, i.max_unit, i.step_size, "
    "i.allocation_ratio, i.created_at, i.updated_at",
    "LEFT JOIN inventories i ON i.resource_provider_id = rp.id "
    "LEFT JOIN resource_classes c ON c.id = i.resource_class_id", "i.resource_class_id")
#: Per inventoried class, what the provider's allocations use of it (0 when none).
_USAGES = _PROVIDER_AND.format(
    "i.resource_class_id, c.name, (SELECT COALESCE(SUM(a.used), 0) FROM allocations a "
    "WHERE a.resource_provider_id = rp.id AND a.resource_class_id = i.resource_class_id)",
    "LEFT JOIN inventories i ON i.resource_provider_id = rp.id "
    "LEFT JOIN resource_classes c ON c.id = i.resource_class_id", "i.resource_class_id")
#: Where the provider's columns end in a row.
_P = 8


class Fallback(Exception):
    """The raw read could not run: the caller takes the general path."""


def _read(store: StoreBase, uuid: str, sql: str) -> tuple[ProviderRecord | None, list[Any]]:
    """The provider ``uuid`` (None when there is none) and its rows of ``sql`` (the
    columns after the provider's; none when it has none), read by one statement;
    :class:`Fallback` when the database would not answer."""
    try:
        raw = store._take_raw()
    except sa.exc.DBAPIError:
        raise Fallback from None
    ok = False
    try:
        (rows,) = store._run(raw, [(sql, (uuid,))])
        ok = True
    except sa.exc.DBAPIError:
        raise Fallback from None
    finally:
        store._give_raw(raw, ok)
    if not rows:
        return None, []
    r = rows[0]
    prov = ProviderRecord(id=int(r[0]), uuid=r[1], name=r[2], generation=int(r[3]),
                          parent_uuid=r[4], root_uuid=r[5] or r[1],
                          created_at=as_datetime(r[6]), updated_at=as_datetime(r[7]))
    return prov, [row[_P:] for row in rows if row[_P] is not None]


def _class_name(rc_id: Any, name: Any) -> str:
    return str(name) if name is not None else str(rc_id)


def traits(store: StoreBase, uuid: str) -> tuple[ProviderRecord, list[str]] | None:
    """The provider and its trait names (in trait id order), or None without it."""
    prov, rows = _read(store, uuid, _TRAITS)
    return None if prov is None else (prov, [r[0] for r in rows])


def aggregates(store: StoreBase, uuid: str) -> tuple[ProviderRecord, list[str]] | None:
    """The provider and its aggregate uuids (in aggregate id order), or None without it."""
    prov, rows = _read(store, uuid, _AGGREGATES)
    return None if prov is None else (prov, [r[0] for r in rows])


def inventories(store: StoreBase, uuid: str
                ) -> tuple[ProviderRecord, dict[str, InventoryRecord]] | None:
    """The provider and its inventories by class, or None without it."""
    prov, rows = _read(store, uuid, _INVENTORIES)
    if prov is None:
        return None
    out = {}
    for r in rows:
        name = _class_name(r[0], r[1])
        out[name] = InventoryRecord(
            resource_class=name, total=int(r[2]), reserved=int(r[3]), min_unit=int(r[4]),
            max_unit=int(r[5]), step_size=int(r[6]), allocation_ratio=float(r[7]),
            created_at=as_datetime(r[8]), updated_at=as_datetime(r[9]))
    return prov, out


def usages(store: StoreBase, uuid: str) -> tuple[ProviderRecord, dict[str, int]] | None:
    """The provider and, per inventoried class, what its allocations use; None without
    it."""
    prov, rows = _read(store, uuid, _USAGES)
    if prov is None:
        return None
    return prov, {_class_name(r[0], r[1]): int(r[2]) for r in rows}
