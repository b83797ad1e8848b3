"""Usages and allocations of the Placement store: reads, the general allocation write
path (transaction, capacity checks, compare-and-swap, retries) and consumer deletion.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from berth.placement import errors
from berth.placement.db import (
    allocations,
    consumer_types,
    consumers,
    inventories,
    projects,
    resource_providers,
    users,
    utcnow,
)
from berth.placement.store_base import (
    _BUMP_CONSUMER,
    _DEL_ALLOCS,
    _DEL_CONSUMER,
    _INS_ALLOC,
    _INS_CONSUMER,
    _NEW_IDS,
    _SEL_CONSUMER,
    _SEL_INVS_BY_RPS,
    _SEL_OLD_ALLOCS,
    _SEL_RPS_BY_ID,
    _SEL_RPS_BY_UUID,
    _SEL_USAGE_BY_RPS,
)
from berth.placement.store_fast_writes import FastWritesMixin
from berth.placement.store_records import (
    CONCURRENT_MSG,
    RETRY_COUNT,
    ConsumerAllocations,
    ConsumerWrite,
    InventoryRecord,
    ProviderRecord,
    _ConsumerState,
    _MissingProvider,
    _Retry,
    _Unset,
    inventory_from_row,
)

#: GET and DELETE /allocations/{consumer} (every instance delete runs both), built once.
_SEL_CONSUMER_ALLOCS = (
    sa.select(
        resource_providers.c.uuid,
        resource_providers.c.generation,
        allocations.c.resource_class_id,
        allocations.c.used,
        allocations.c.created_at,
        allocations.c.updated_at,
    )
    .join(resource_providers, resource_providers.c.id == allocations.c.resource_provider_id)
    .where(allocations.c.consumer_id == sa.bindparam("consumer"))
    .order_by(allocations.c.id)
)
_SEL_CONSUMER_OWNER = (
    sa.select(
        consumers.c.generation,
        projects.c.external_id.label("project"),
        users.c.external_id.label("user"),
        consumer_types.c.name.label("ctype"),
    )
    .select_from(
        consumers.join(projects, projects.c.id == consumers.c.project_id)
        .join(users, users.c.id == consumers.c.user_id)
        .outerjoin(consumer_types, consumer_types.c.id == consumers.c.consumer_type_id)
    )
    .where(consumers.c.uuid == sa.bindparam("consumer"))
)


class AllocationsMixin(FastWritesMixin):
    """Usage and allocation operations of :class:`~berth.placement.store.PlacementStore`."""

    # ------------------------------------------------------------------ usages

    def provider_usages(self, uuid: str) -> tuple[ProviderRecord, dict[str, int]] | None:
        """Per-class usage of a provider, one entry per inventoried class."""
        from berth.placement import provider_reads  # built on this module

        try:
            return provider_reads.usages(self, uuid)
        except provider_reads.Fallback:
            pass
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            _, by_id = self._rc_maps(conn)
            inv_rcs = conn.execute(
                sa.select(inventories.c.resource_class_id).where(
                    inventories.c.resource_provider_id == prov.id
                )
            ).all()
            used: dict[int, int] = {
                int(r[0]): int(r[1] or 0)
                for r in conn.execute(
                    sa.select(allocations.c.resource_class_id, sa.func.sum(allocations.c.used))
                    .where(allocations.c.resource_provider_id == prov.id)
                    .group_by(allocations.c.resource_class_id)
                ).all()
            }
            return prov, {by_id[r[0]]: int(used.get(r[0], 0) or 0) for r in inv_rcs}

    def project_usages(
        self,
        project_id: str,
        user_id: str | None,
        consumer_type: str | None,
        grouped: bool,
    ) -> dict[str, Any]:
        """GET /usages data: flat (< 1.38) or grouped by consumer type (>= 1.38)."""
        c = consumers
        with self._read() as conn:
            _, rc_by_id = self._rc_maps(conn)
            stmt = (
                sa.select(
                    allocations.c.resource_class_id,
                    allocations.c.used,
                    c.c.id.label("consumer_id"),
                    consumer_types.c.name.label("ctype"),
                )
                .select_from(
                    allocations.join(c, c.c.uuid == allocations.c.consumer_id)
                    .join(projects, projects.c.id == c.c.project_id)
                    .join(users, users.c.id == c.c.user_id)
                    .outerjoin(consumer_types, consumer_types.c.id == c.c.consumer_type_id)
                )
                .where(projects.c.external_id == project_id)
            )
            if user_id is not None:
                stmt = stmt.where(users.c.external_id == user_id)
            if grouped and consumer_type not in (None, "all"):
                if consumer_type == "unknown":
                    stmt = stmt.where(c.c.consumer_type_id.is_(None))
                else:
                    stmt = stmt.where(consumer_types.c.name == consumer_type)
            rows = conn.execute(stmt).all()
        if not grouped:
            flat: dict[str, int] = defaultdict(int)
            for r in rows:
                flat[rc_by_id[r.resource_class_id]] += r.used
            return dict(flat)
        groups: dict[str, dict[str, int]] = {}
        members: dict[str, set[int]] = defaultdict(set)
        for r in rows:
            key = "all" if consumer_type == "all" else (r.ctype or "unknown")
            bucket = groups.setdefault(key, {})
            rc = rc_by_id[r.resource_class_id]
            bucket[rc] = bucket.get(rc, 0) + r.used
            members[key].add(r.consumer_id)
        for key, bucket in groups.items():
            bucket["consumer_count"] = len(members[key])
        return groups

    # ------------------------------------------------------------------ allocations

    def provider_allocations(
        self, uuid: str
    ) -> (
        tuple[ProviderRecord, dict[str, dict[str, int]], dict[str, int], dt.datetime | None] | None
    ):
        """A provider's allocations by consumer, the consumers' generations, last-modified."""
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            _, by_id = self._rc_maps(conn)
            rows = conn.execute(
                sa.select(
                    allocations.c.consumer_id,
                    allocations.c.resource_class_id,
                    allocations.c.used,
                    allocations.c.created_at,
                    allocations.c.updated_at,
                    consumers.c.generation,
                )
                .select_from(
                    allocations.outerjoin(consumers, consumers.c.uuid == allocations.c.consumer_id)
                )
                .where(allocations.c.resource_provider_id == prov.id)
                .order_by(allocations.c.id)
            ).all()
        out: dict[str, dict[str, int]] = {}
        gens: dict[str, int] = {}
        stamps = []
        for r in rows:
            out.setdefault(r.consumer_id, {})[by_id[r.resource_class_id]] = r.used
            gens[r.consumer_id] = r.generation if r.generation is not None else 0
            stamps.append(r.updated_at or r.created_at)
        last = max((s for s in stamps if s is not None), default=None)
        return prov, out, gens, last

    def consumer_allocations(self, consumer_uuid: str) -> ConsumerAllocations:
        """GET /allocations/{consumer} data (empty for an unknown consumer)."""
        with self._read() as conn:
            _, by_id = self._rc_maps(conn)
            rows = conn.execute(_SEL_CONSUMER_ALLOCS, {"consumer": consumer_uuid}).all()
            result = ConsumerAllocations(allocations={}, generations={})
            if not rows:
                return result
            for r in rows:
                result.allocations.setdefault(r.uuid, {})[by_id[r.resource_class_id]] = r.used
                result.generations[r.uuid] = r.generation
            result.last_modified = max(
                (r.updated_at or r.created_at for r in rows if (r.updated_at or r.created_at)),
                default=None,
            )
            crow = conn.execute(_SEL_CONSUMER_OWNER, {"consumer": consumer_uuid}).first()
            if crow is not None:
                result.project_id = crow.project
                result.user_id = crow.user
                result.consumer_generation = crow.generation
                result.consumer_type = crow.ctype
            return result

    def _external_id(self, conn: Connection, table: sa.Table, external: str) -> int:
        """Id of a project, user or consumer type, created on first use.

        Those rows are never deleted, so ids seen committed are cached per process;
        ids inserted by this transaction are not (a rollback would orphan them).
        """
        key_ = (table.name, external)
        cached = self._id_cache.get(key_)
        if cached is not None:
            return cached
        col = table.c.external_id if "external_id" in table.c else table.c.name
        found = conn.execute(sa.select(table.c.id).where(col == external)).scalar()
        if found is not None:
            # A row this transaction inserted (for an earlier consumer of the same
            # request) waits for the commit too: a rollback takes it away, and SQLite
            # gives its id to the next row, another project's.
            if key_ not in conn.info.get(_NEW_IDS, {}) and len(self._id_cache) < 100_000:
                self._id_cache[key_] = int(found)
            return int(found)
        key = "external_id" if "external_id" in table.c else "name"
        self._insert_ignore(conn, table, [{key: external}])
        new_id = int(conn.execute(sa.select(table.c.id).where(col == external)).scalar_one())
        # Cached once the transaction commits (see _remember_new_ids).
        conn.info.setdefault(_NEW_IDS, {})[key_] = new_id
        return new_id

    def _remember_new_ids(self, new_ids: Mapping[tuple[str, str], int]) -> None:
        """Cache the ids a committed transaction created."""
        if new_ids and len(self._id_cache) < 100_000:
            self._id_cache.update(new_ids)

    def _inspect_consumers(
        self, conn: Connection, writes: Sequence[ConsumerWrite], *, create_only: bool = False
    ) -> dict[str, _ConsumerState]:
        """Check consumer generations, create missing consumers, update project/user/type
        (with ``create_only``, only create: Placement changes an existing consumer in the
        transaction that writes its allocations, and a failed write leaves it as it was)."""
        states: dict[str, _ConsumerState] = {}
        for w in writes:
            project = self._external_id(conn, projects, w.project_id)
            user = self._external_id(conn, users, w.user_id)
            ctype_id = (
                self._external_id(conn, consumer_types, w.consumer_type)
                if w.consumer_type is not None
                else None
            )
            row = conn.execute(_SEL_CONSUMER, {"uuid": w.consumer_uuid}).first()
            if row is not None:
                if not isinstance(w.generation, _Unset) and w.generation != row.generation:
                    raise errors.Conflict(
                        f"consumer generation conflict - expected {row.generation} but "
                        f"got {w.generation}",
                        code=errors.CONCURRENT_UPDATE,
                    )
                changes: dict[str, Any] = {}
                if row.project_id != project:
                    changes["project_id"] = project
                if row.user_id != user:
                    changes["user_id"] = user
                if ctype_id is not None and row.consumer_type_id != ctype_id:
                    changes["consumer_type_id"] = ctype_id
                if changes and not create_only:
                    changes["updated_at"] = utcnow()
                    conn.execute(
                        sa.update(consumers).where(consumers.c.id == row.id).values(**changes)
                    )
                states[w.consumer_uuid] = _ConsumerState(
                    row.id, w.consumer_uuid, row.generation, False
                )
            else:
                if not isinstance(w.generation, _Unset) and w.generation is not None:
                    raise errors.Conflict(
                        f"consumer generation conflict - expected null but got {w.generation}",
                        code=errors.CONCURRENT_UPDATE,
                    )
                new_id = conn.execute(
                    _INS_CONSUMER,
                    {
                        "uuid": w.consumer_uuid,
                        "project": project,
                        "user": user,
                        "ctype": ctype_id,
                        "now": utcnow(),
                    },
                ).scalar_one()
                states[w.consumer_uuid] = _ConsumerState(new_id, w.consumer_uuid, 0, True)
        return states

    def write_allocations(
        self,
        writes: Sequence[ConsumerWrite],
        *,
        post: bool,
    ) -> None:
        """Replace the allocations of every consumer in ``writes`` in one transaction.

        A lost provider CAS retries the whole transaction. Quirk kept from Placement: it
        commits new consumers before looking the providers up, so when a provider is
        missing the new consumers stay (the next write must send generation 0).

        The common case (one consumer, see :meth:`_fast_write`) first tries a raw-SQL
        path of one or two round trips that patches the cached graph on success;
        whatever it does not handle falls through to the general path below.
        """
        if len(writes) == 1 and self._fast_write(writes[0]):
            return
        for _attempt in range(RETRY_COUNT):
            try:
                with self._write() as conn:
                    new_ids = conn.info[_NEW_IDS]
                    states = self._inspect_consumers(conn, writes)
                    self._replace_allocations(conn, writes, states, post=post)
                self._remember_new_ids(new_ids)
                return
            except _Retry:
                continue
            except _MissingProvider:
                with (
                    contextlib.suppress(errors.PlacementError, sa.exc.IntegrityError),
                    self._write() as conn,
                ):
                    self._inspect_consumers(conn, writes, create_only=True)
                raise
            except sa.exc.IntegrityError:
                # Another request created the same consumer between our read and insert.
                raise errors.Conflict(
                    "Inventory and/or allocations changed while attempting to allocate: "
                    f"{CONCURRENT_MSG}",
                    code=errors.CONCURRENT_UPDATE,
                ) from None
        raise errors.Conflict(
            f"Inventory and/or allocations changed while attempting to allocate: {CONCURRENT_MSG}",
            code=errors.CONCURRENT_UPDATE,
        )

    def _replace_allocations(
        self,
        conn: Connection,
        writes: Sequence[ConsumerWrite],
        states: Mapping[str, _ConsumerState],
        *,
        post: bool,
        interim: Mapping[int, Mapping[str, InventoryRecord]] | None = None,
    ) -> None:
        """Delete old rows, check capacity, insert new rows, CAS providers and consumers."""
        wanted_uuids = sorted({a[0] for w in writes for a in w.allocations})
        prov_rows = (
            {r.uuid: r for r in conn.execute(_SEL_RPS_BY_UUID, {"uuids": wanted_uuids})}
            if wanted_uuids
            else {}
        )
        for w in writes:
            for rp_uuid, _rc, _used in w.allocations:
                if rp_uuid not in prov_rows:
                    raise _MissingProvider(
                        f"Allocation for resource provider '{rp_uuid}' that does not exist."
                    )
        by_name, by_id = self._rc_maps(conn)
        for w in writes:
            for _rp, rc, _used in w.allocations:
                if rc not in by_name:
                    if post:
                        raise errors.BadRequest(
                            f"Unable to allocate inventory No such resource class {rc}."
                        )
                    raise errors.BadRequest(
                        f"Unable to allocate inventory for consumer {w.consumer_uuid}: No such "
                        f"resource class {rc}."
                    )
        consumer_uuids = [w.consumer_uuid for w in writes]
        old_rows = conn.execute(_SEL_OLD_ALLOCS, {"consumers": consumer_uuids}).all()
        # Every provider losing this consumer's allocations changes usage.
        for r in old_rows:
            self._touch_usage(conn, r.resource_provider_id, r.resource_class_id, -r.used)
        # Providers to bump: every one in the new data, plus those whose allocations a
        # consumer clears with an empty ``allocations``.
        bump_ids: dict[int, int] = {}
        id_to_uuid: dict[int, str] = {}
        for r in prov_rows.values():
            bump_ids[r.id] = r.generation
            id_to_uuid[r.id] = r.uuid
        clearing = {w.consumer_uuid for w in writes if not w.allocations}
        clear_ids = {r.resource_provider_id for r in old_rows if r.consumer_id in clearing}
        for row in (
            conn.execute(_SEL_RPS_BY_ID, {"ids": sorted(clear_ids - set(bump_ids))})
            if clear_ids - set(bump_ids)
            else []
        ):
            bump_ids[row.id] = row.generation
            id_to_uuid[row.id] = row.uuid

        # Requested amounts per (provider id, class id).
        requested: dict[tuple[int, int], int] = defaultdict(int)
        items: list[tuple[str, int, int, int]] = []  # consumer, rp id, rc id, used
        for w in writes:
            for rp_uuid, rc, used in w.allocations:
                key = (prov_rows[rp_uuid].id, by_name[rc])
                requested[key] += used
                items.append((w.consumer_uuid, key[0], key[1], used))
        before: dict[tuple[int, int], int] = {}
        if requested:
            rp_ids = {k[0] for k in requested}
            for r in conn.execute(_SEL_USAGE_BY_RPS, {"ids": sorted(rp_ids)}):
                before[(r.resource_provider_id, r.resource_class_id)] = int(r.used)
        if old_rows:
            conn.execute(_DEL_ALLOCS, {"consumers": consumer_uuids})
        if requested:
            mine: dict[tuple[int, int], int] = defaultdict(int)
            for r in old_rows:
                mine[(r.resource_provider_id, r.resource_class_id)] += r.used
            inv_map: dict[tuple[int, int], InventoryRecord] = {}
            rp_ids = {k[0] for k in requested}
            for r in conn.execute(_SEL_INVS_BY_RPS, {"ids": sorted(rp_ids)}):
                inv_map[(r.resource_provider_id, r.resource_class_id)] = inventory_from_row(
                    by_id[r.resource_class_id], r)
            if interim is not None:
                for rp_id, invs in interim.items():
                    for rc_name, inv in invs.items():
                        inv_map[(rp_id, by_name[rc_name])] = inv
            # Placement's order of checks: providers with no inventory of any class the
            # write asks for (every class and every such provider named), then allocation
            # by allocation in the body's order: its inventory, its unit constraints,
            # and the capacity with what was asked of that provider and class so far.
            asked = sorted({rc_id for _, _, rc_id, _ in items})
            with_inventory = {rp for rp, rc in inv_map if rc in asked}
            bare = sorted({id_to_uuid[rp] for _, rp, _, _ in items
                           if rp not in with_inventory})
            if bare:
                raise errors.Conflict(
                    f"Unable to allocate inventory: Inventory for "
                    f"'{', '.join(by_id[rc] for rc in asked)}' on resource provider "
                    f"'{', '.join(bare)}' invalid.")
            so_far: dict[tuple[int, int], int] = defaultdict(int)
            for _consumer, rp_id, rc_id, used in items:
                key = (rp_id, rc_id)
                so_far[key] += used
                found = inv_map.get(key)
                where = f"'{by_id[rc_id]}' on resource provider '{id_to_uuid[rp_id]}'"
                if found is None:
                    raise errors.Conflict(
                        f"Unable to allocate inventory: Inventory for {where} invalid."
                    )
                if used < found.min_unit or used > found.max_unit or used % found.step_size != 0:
                    raise errors.Conflict(
                        f"Unable to allocate inventory: Unable to create allocation for {where}. "
                        "The requested amount would violate inventory constraints."
                    )
                prev = before.get(key, 0)
                others = prev - mine.get(key, 0)
                capacity = (found.total - found.reserved) * found.allocation_ratio
                if (others + used > capacity or others + so_far[key] > capacity) \
                        and others + so_far[key] > prev:
                    raise errors.Conflict(
                        f"Unable to allocate inventory: Unable to create allocation for {where}. "
                        "The requested amount would exceed the capacity."
                    )
            for (rp_id, rc_id), amount in requested.items():
                self._touch_usage(conn, rp_id, rc_id, amount)
            now = utcnow()
            merged: dict[tuple[str, int, int], int] = defaultdict(int)
            for consumer, rp_id, rc_id, used in items:
                merged[(consumer, rp_id, rc_id)] += used
            conn.execute(
                _INS_ALLOC,
                [
                    {
                        "resource_provider_id": rp_id,
                        "consumer_id": consumer,
                        "resource_class_id": rc_id,
                        "used": used,
                        "created_at": now,
                        "updated_at": None,
                    }
                    for (consumer, rp_id, rc_id), used in merged.items()
                ],
            )
        for rp_id in sorted(bump_ids):
            if not self._bump(conn, rp_id, bump_ids[rp_id], usage_only=True):
                raise _Retry()
        # Consumers in a fixed order, like providers, so concurrent writers cannot deadlock.
        # A consumer cleared with an empty ``allocations`` that held none is neither bumped
        # nor deleted: Placement writes (and counts) only consumers with allocation rows.
        held = {r.consumer_id for r in old_rows}
        for w in sorted(writes, key=lambda w: w.consumer_uuid):
            if not w.allocations and w.consumer_uuid not in held:
                continue
            state = states[w.consumer_uuid]
            result = conn.execute(
                _BUMP_CONSUMER,
                {
                    "cid": state.id,
                    "expected": state.generation,
                    "new_gen": state.generation + 1,
                    "now": utcnow(),
                },
            )
            if result.rowcount != 1:
                raise errors.Conflict(
                    f"consumer generation conflict - expected {state.generation} but got "
                    f"{state.generation}",
                    code=errors.CONCURRENT_UPDATE,
                )
            if not w.allocations:
                conn.execute(_DEL_CONSUMER, {"cid": state.id})

    def delete_consumer_allocations(self, consumer_uuid: str) -> dict[str, dict[str, int]]:
        """Delete all allocations of a consumer and the consumer itself; returns what it
        held (provider uuid -> class -> amount)."""
        freed = self._delete_consumer_raw(consumer_uuid)
        if freed is None:
            raise errors.NotFound(f"No allocations for consumer '{consumer_uuid}'")
        return freed
