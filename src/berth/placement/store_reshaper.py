"""The Placement store's reshaper: inventory and allocations moved in one transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from berth.placement import errors
from berth.placement.db import (
    consumer_types,
    consumers,
    inventories,
    projects,
    resource_providers,
    users,
    utcnow,
)
from berth.placement.store_allocations import AllocationsMixin
from berth.placement.store_inventories import InventoriesMixin
from berth.placement.store_records import (
    CONCURRENT_MSG,
    RETRY_COUNT,
    ConsumerWrite,
    InventoryRecord,
    ProviderRecord,
    _ConsumerState,
    _fields,
    _Retry,
    _Unset,
)


class ReshaperMixin(InventoriesMixin, AllocationsMixin):
    """POST /reshaper of :class:`~berth.placement.store.PlacementStore`."""

    # ------------------------------------------------------------------ reshaper

    def reshape(
        self,
        new_inventories: Mapping[str, tuple[int, dict[str, InventoryRecord]]],
        writes: Sequence[ConsumerWrite],
    ) -> None:
        """Atomically move inventory and allocations (POST /reshaper). Inventory
        capacities are not checked: Placement's reshaper does not check them."""
        for _attempt in range(RETRY_COUNT):
            try:
                with self._write() as conn:
                    self._reshape(conn, new_inventories, writes)
                return
            except _Retry:
                continue
        raise errors.Conflict(f"update conflict: {CONCURRENT_MSG}", code=errors.CONCURRENT_UPDATE)

    def _reshape(
        self,
        conn: Connection,
        new_inventories: Mapping[str, tuple[int, dict[str, InventoryRecord]]],
        writes: Sequence[ConsumerWrite],
    ) -> None:
        provs: dict[str, ProviderRecord] = {}
        # Each provider in turn, as Placement: found, then at the given generation.
        for rp_uuid, (gen, _invs) in new_inventories.items():
            prov = self._get_provider(conn, rp_uuid)
            if prov is None:
                raise errors.BadRequest(
                    f"Resource provider {rp_uuid} in inventories not found: No such resource "
                    f"provider {rp_uuid}.",
                    code=errors.RESOURCE_PROVIDER_NOT_FOUND,
                )
            if prov.generation != gen:
                raise errors.Conflict(
                    f"resource provider generation conflict for provider {rp_uuid}: actual: "
                    f"{prov.generation}, given: {gen}",
                    code=errors.CONCURRENT_UPDATE,
                )
            provs[rp_uuid] = prov
        # Consumers: generation checks and creation inside this same transaction.
        states: dict[str, _ConsumerState] = {}
        for w in writes:
            row = conn.execute(
                sa.select(consumers.c.id, consumers.c.generation).where(
                    consumers.c.uuid == w.consumer_uuid
                )
            ).first()
            if row is not None:
                if not isinstance(w.generation, _Unset) and w.generation != row.generation:
                    raise errors.Conflict(
                        f"consumer generation conflict - expected {row.generation} but got "
                        f"{w.generation}",
                        code=errors.CONCURRENT_UPDATE,
                    )
            elif not isinstance(w.generation, _Unset) and w.generation is not None:
                raise errors.Conflict(
                    f"consumer generation conflict - expected null but got {w.generation}",
                    code=errors.CONCURRENT_UPDATE,
                )
        self._lock_for_links(conn, inventories)
        by_name, by_id = self._rc_maps(conn)
        for _gen, invs in new_inventories.values():
            for rc in invs:
                if rc not in by_name:
                    raise errors.BadRequest(
                        f"malformed reshaper data: No such resource class {rc}."
                    )
        for w in writes:
            for _rp, rc, _used in w.allocations:
                if rc not in by_name:
                    raise errors.BadRequest(
                        f"malformed reshaper data: No such resource class {rc}."
                    )
        for w in writes:
            project = self._external_id(conn, projects, w.project_id)
            user = self._external_id(conn, users, w.user_id)
            ctype_id = (
                self._external_id(conn, consumer_types, w.consumer_type)
                if w.consumer_type is not None
                else None
            )
            row = conn.execute(
                sa.select(consumers.c.id, consumers.c.generation).where(
                    consumers.c.uuid == w.consumer_uuid
                )
            ).first()
            if row is None:
                cid = conn.execute(
                    sa.insert(consumers)
                    .values(
                        uuid=w.consumer_uuid,
                        project_id=project,
                        user_id=user,
                        generation=0,
                        consumer_type_id=ctype_id,
                        created_at=utcnow(),
                    )
                    .returning(consumers.c.id)
                ).scalar_one()
                states[w.consumer_uuid] = _ConsumerState(cid, w.consumer_uuid, 0, True)
            else:
                values: dict[str, Any] = {"project_id": project, "user_id": user}
                if ctype_id is not None:
                    values["consumer_type_id"] = ctype_id
                conn.execute(sa.update(consumers).where(consumers.c.id == row.id).values(**values))
                states[w.consumer_uuid] = _ConsumerState(
                    row.id, w.consumer_uuid, row.generation, False
                )
        # Step 1: interim inventory = old union new (new wins) for non-empty new lists.
        interim: dict[int, dict[str, InventoryRecord]] = {}
        gens: dict[str, int] = {u: p.generation for u, p in provs.items()}
        for rp_uuid, (_gen, invs) in sorted(
            new_inventories.items(), key=lambda item: provs[item[0]].id
        ):
            prov = provs[rp_uuid]
            if invs:
                merged = dict(self._inventories(conn, prov.id))
                merged.update(invs)
                interim[prov.id] = merged
                self._write_inventory_set(conn, prov.id, merged, by_name)
                if not self._bump(conn, prov.id, gens[rp_uuid]):
                    raise _Retry()
                gens[rp_uuid] += 1
        # Step 2: allocations against the interim inventory.
        if writes:
            self._replace_allocations(conn, writes, states, post=True, interim=None)
            for rp_uuid in provs:
                gens[rp_uuid] = int(
                    conn.execute(
                        sa.select(resource_providers.c.generation).where(
                            resource_providers.c.uuid == rp_uuid
                        )
                    ).scalar_one()
                )
        # Step 3: final inventory exactly as given.
        for rp_uuid, (_gen, invs) in sorted(
            new_inventories.items(), key=lambda item: provs[item[0]].id
        ):
            prov = provs[rp_uuid]
            self._replace_inventory(conn, prov, invs, by_name, by_id)
            if not self._bump(conn, prov.id, gens[rp_uuid]):
                raise _Retry()

    def _write_inventory_set(
        self,
        conn: Connection,
        rp_id: int,
        invs: Mapping[str, InventoryRecord],
        by_name: Mapping[str, int],
    ) -> None:
        old = self._inventories(conn, rp_id)
        now = utcnow()
        for rc, inv in invs.items():
            if rc in old:
                if _fields(old[rc]) != _fields(inv):
                    self._update_inventory_row(conn, rp_id, by_name[rc], inv, now)
            else:
                self._insert_inventory(conn, rp_id, by_name[rc], inv, now)
