"""Inventories of the Placement store: read, create, replace, update, delete."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from berth.placement import errors
from berth.placement.db import allocations, inventories, utcnow
from berth.placement.store_base import StoreBase
from berth.placement.store_records import (
    CONCURRENT_MSG,
    InventoryRecord,
    ProviderRecord,
    _capacity_message,
    _capacity_ok,
    _fields,
    inventory_from_row,
)


def _already_there(rc: str, uuid: str) -> errors.Conflict:
    """POST of an inventory class the provider has (read, or met on the unique key)."""
    return errors.Conflict(
        f"Update conflict: Inventory for '{rc}' on resource provider '{uuid}' already "
        "exists.", code=errors.CONCURRENT_UPDATE)


class InventoriesMixin(StoreBase):
    """Inventory operations of :class:`~berth.placement.store.PlacementStore`."""

    # ------------------------------------------------------------------ inventories

    def _inventories(self, conn: Connection, rp_id: int) -> dict[str, InventoryRecord]:
        _, by_id = self._rc_maps(conn)
        rows = conn.execute(
            sa.select(inventories).where(inventories.c.resource_provider_id == rp_id)
        ).all()
        out = {}
        for r in rows:
            name = by_id.get(r.resource_class_id, str(r.resource_class_id))
            out[name] = inventory_from_row(name, r)
        return out

    def get_inventories(
        self, uuid: str
    ) -> tuple[ProviderRecord, dict[str, InventoryRecord]] | None:
        """A provider and its inventories, or None when the provider does not exist."""
        from berth.placement import provider_reads  # built on this module

        try:
            return provider_reads.inventories(self, uuid)
        except provider_reads.Fallback:
            pass
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            return prov, self._inventories(conn, prov.id)

    @staticmethod
    def _in_use(conn: Connection, rp_id: int, rc_ids: Iterable[int]) -> list[int]:
        ids = list(rc_ids)
        if not ids:
            return []
        rows = conn.execute(
            sa.select(allocations.c.resource_class_id)
            .where(
                allocations.c.resource_provider_id == rp_id,
                allocations.c.resource_class_id.in_(ids),
            )
            .distinct()
        ).all()
        return sorted(r[0] for r in rows)

    @staticmethod
    def _insert_inventory(
        conn: Connection, rp_id: int, rc_id: int, inv: InventoryRecord, now: dt.datetime
    ) -> None:
        conn.execute(
            sa.insert(inventories).values(
                resource_provider_id=rp_id,
                resource_class_id=rc_id,
                total=inv.total,
                reserved=inv.reserved,
                min_unit=inv.min_unit,
                max_unit=inv.max_unit,
                step_size=inv.step_size,
                allocation_ratio=inv.allocation_ratio,
                created_at=now,
                updated_at=None,
            )
        )

    @staticmethod
    def _update_inventory_row(
        conn: Connection, rp_id: int, rc_id: int, inv: InventoryRecord, now: dt.datetime
    ) -> None:
        conn.execute(
            sa.update(inventories)
            .where(
                inventories.c.resource_provider_id == rp_id,
                inventories.c.resource_class_id == rc_id,
            )
            .values(
                total=inv.total,
                reserved=inv.reserved,
                min_unit=inv.min_unit,
                max_unit=inv.max_unit,
                step_size=inv.step_size,
                allocation_ratio=inv.allocation_ratio,
                updated_at=now,
            )
        )

    def create_inventory(
        self, uuid: str, inv: InventoryRecord, version: tuple[int, int]
    ) -> tuple[InventoryRecord, int]:
        """Add one inventory class; returns the stored record and the new generation."""
        with self._write() as conn:
            self._lock_for_links(conn, inventories)
            prov = self._require_provider(conn, uuid)
            if not _capacity_ok(inv, version):
                raise errors.BadRequest(
                    f"Unable to create inventory for resource provider {uuid}: "
                    + _capacity_message(version, inv.resource_class, uuid)
                )
            by_name, _ = self._rc_maps(conn)
            rc_id = by_name.get(inv.resource_class)
            if rc_id is None:
                raise errors.BadRequest(
                    f"Unable to create inventory for resource provider {uuid}: No such resource "
                    f"class {inv.resource_class}."
                )
            existing = self._inventories(conn, prov.id)
            if inv.resource_class in existing:
                raise _already_there(inv.resource_class, uuid)
            now = utcnow()
            try:
                self._insert_inventory(conn, prov.id, rc_id, inv, now)
            except sa.exc.IntegrityError:
                # Created by a concurrent request since it was read (read committed on
                # PostgreSQL): Placement's DBDuplicateEntry, a 409.
                raise _already_there(inv.resource_class, uuid) from None
            if not self._bump(conn, prov.id, prov.generation):
                raise errors.Conflict(
                    f"Update conflict: {CONCURRENT_MSG}", code=errors.CONCURRENT_UPDATE
                )
            stored = InventoryRecord(**{**_fields(inv), "created_at": now})
            return stored, prov.generation + 1

    def set_inventories(
        self,
        uuid: str,
        generation: int,
        new: Mapping[str, InventoryRecord],
        version: tuple[int, int],
    ) -> tuple[int, dict[str, InventoryRecord]]:
        """Replace all inventory of a provider (PUT .../inventories)."""
        from berth.placement import provider_writes  # built on this module

        fast = provider_writes.set_inventories(self, uuid, generation, new, version)
        if fast is not None:
            return fast
        with self._write() as conn:
            self._lock_for_links(conn, inventories)
            prov = self._require_provider(conn, uuid)
            if prov.generation != generation:
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
            # Placement's order: the capacities, then the classes, then what is in use.
            for rc, inv in new.items():
                if not _capacity_ok(inv, version):
                    raise errors.BadRequest(
                        f"Unable to update inventory for resource provider {uuid}: "
                        + _capacity_message(version, rc, uuid)
                    )
            by_name, by_id = self._rc_maps(conn)
            for rc in new:
                if rc not in by_name:
                    raise errors.BadRequest(
                        f"Unknown resource class in inventory for resource provider {uuid}: No "
                        f"such resource class {rc}."
                    )
            self._replace_inventory(conn, prov, new, by_name, by_id)
            if not self._bump(conn, prov.id, generation):
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
            return generation + 1, self._inventories(conn, prov.id)

    def _replace_inventory(
        self,
        conn: Connection,
        prov: ProviderRecord,
        new: Mapping[str, InventoryRecord],
        by_name: Mapping[str, int],
        by_id: Mapping[int, str],
        in_use_prefix: str = "update conflict: ",
    ) -> None:
        """Write ``new`` as the provider's whole inventory; 409 when a class it drops is
        in use (the message after ``in_use_prefix``, as the caller's handler in
        Placement words it). Capacities are the caller's to check (the reshaper checks
        none, as Placement's does not)."""
        old = self._inventories(conn, prov.id)
        removed = [by_name[rc] for rc in old if rc not in new]
        in_use = self._in_use(conn, prov.id, removed)
        if in_use:
            names = ", ".join(by_id[i] for i in in_use)
            raise errors.Conflict(
                f"{in_use_prefix}Inventory for '{names}' on resource provider '{prov.uuid}' "
                "in use.",
                code=errors.INVENTORY_INUSE,
            )
        if removed:
            conn.execute(
                sa.delete(inventories).where(
                    inventories.c.resource_provider_id == prov.id,
                    inventories.c.resource_class_id.in_(removed),
                )
            )
        now = utcnow()
        for rc, inv in new.items():
            if rc in old:
                if _fields(old[rc]) != _fields(inv):
                    self._update_inventory_row(conn, prov.id, by_name[rc], inv, now)
            else:
                self._insert_inventory(conn, prov.id, by_name[rc], inv, now)

    def update_inventory(
        self, uuid: str, generation: int, inv: InventoryRecord, version: tuple[int, int]
    ) -> tuple[InventoryRecord, int]:
        """Update one inventory class (PUT .../inventories/{rc})."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            if prov.generation != generation:
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
            # The body's capacity is checked before the class is looked up, as Placement
            # validates it before it touches the provider's inventory.
            if not _capacity_ok(inv, version):
                raise errors.BadRequest(
                    f"Unable to update inventory for resource provider {uuid}: "
                    + _capacity_message(version, inv.resource_class, uuid)
                )
            self._lock_for_links(conn, inventories)
            by_name, _ = self._rc_maps(conn)
            rc_id = by_name.get(inv.resource_class)
            if rc_id is None:
                raise errors.NotFound(
                    f"No such resource class {inv.resource_class}.", outside_handler=True
                )
            existing = self._inventories(conn, prov.id)
            if inv.resource_class not in existing:
                raise errors.BadRequest(
                    f"No inventory record with resource class for resource provider {uuid}: No "
                    f"inventory of class {inv.resource_class} found."
                )
            now = utcnow()
            self._update_inventory_row(conn, prov.id, rc_id, inv, now)
            if not self._bump(conn, prov.id, generation):
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
            old = existing[inv.resource_class]
            stored = InventoryRecord(
                **{**_fields(inv), "created_at": old.created_at, "updated_at": now}
            )
            return stored, generation + 1

    def delete_inventory(self, uuid: str, rc: str) -> None:
        """Delete one inventory class (generation +1)."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            by_name, _ = self._rc_maps(conn)
            rc_id = by_name.get(rc)
            existing = self._inventories(conn, prov.id)
            if rc_id is None or rc not in existing:
                # Placement's inner text: the unknown class, else the missing inventory.
                inner = (f"No such resource class {rc}." if rc_id is None
                         else f"No inventory of class {rc} found for delete")
                raise errors.NotFound(f"No inventory of class {rc} found for delete: {inner}")
            if self._in_use(conn, prov.id, [rc_id]):
                raise errors.Conflict(
                    f"Unable to delete inventory of class {rc}: Inventory for '{rc}' on resource "
                    f"provider '{uuid}' in use.",
                    code=errors.CONCURRENT_UPDATE,
                )
            conn.execute(
                sa.delete(inventories).where(
                    inventories.c.resource_provider_id == prov.id,
                    inventories.c.resource_class_id == rc_id,
                )
            )
            if not self._bump(conn, prov.id, prov.generation):
                raise errors.Conflict(
                    f"Update conflict: {CONCURRENT_MSG}", code=errors.CONCURRENT_UPDATE
                )

    def delete_inventories(self, uuid: str) -> None:
        """Delete all inventory of a provider (generation +1)."""
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            by_name, by_id = self._rc_maps(conn)
            # Placement answers DELETE's InventoryInUse with its message alone.
            self._replace_inventory(conn, prov, {}, by_name, by_id, in_use_prefix="")
            if not self._bump(conn, prov.id, prov.generation):
                raise errors.Conflict(
                    "resource provider generation conflict", code=errors.CONCURRENT_UPDATE
                )
