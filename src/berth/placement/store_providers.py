"""Resource providers of the Placement store: read, list with filters, create, update, delete."""

from __future__ import annotations

import uuid as uuid_mod
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from berth.placement import errors
from berth.placement.db import (
    allocations,
    inventories,
    placement_aggregates,
    resource_provider_aggregates,
    resource_provider_traits,
    resource_providers,
    traits,
    utcnow,
)
from berth.placement.store_base import _INSERT_CHILD_RP, StoreBase
from berth.placement.store_raw import _RAW_INSERT_ROOT_RP, _RAW_SET_OWN_ROOT
from berth.placement.store_records import MAX_INT, ProviderFilters, ProviderRecord


class ProvidersMixin(StoreBase):
    """Resource provider operations of :class:`~berth.placement.store.PlacementStore`."""

    # ------------------------------------------------------------------ providers

    def get_provider(self, uuid: str) -> ProviderRecord | None:
        """One provider by uuid, or None."""
        with self._read() as conn:
            return self._get_provider(conn, uuid)

    def list_providers(self, filters: ProviderFilters) -> list[ProviderRecord]:
        """Providers matching every filter, in creation order."""
        rp = resource_providers
        stmt = self._provider_select()
        with self._read() as conn:
            if filters.name:  # Placement ignores an empty name or uuid
                stmt = stmt.where(rp.c.name == filters.name)
            if filters.uuid:
                stmt = stmt.where(rp.c.uuid == filters.uuid)
            if filters.in_tree is not None:
                root_id = conn.execute(
                    sa.select(rp.c.root_provider_id).where(rp.c.uuid == filters.in_tree)
                ).scalar()
                if root_id is None:
                    return []
                stmt = stmt.where(rp.c.root_provider_id == root_id)
            # Placement's order, where a filter no provider meets ends with an empty list
            # before the names of the filters after it are checked: the required traits
            # (unknown: 400; none has them: []), the forbidden traits (unknown: 400),
            # member_of (no member: []), then the resource classes (unknown: 400).
            if filters.required is not None:
                req = filters.required
                self._check_trait_names(conn, {t for any_of in req.required for t in any_of})
                if req.required:
                    have = [rp.c.id.in_(self._trait_members(any_of)) for any_of in req.required]
                    if conn.execute(sa.select(rp.c.id).where(*have).limit(1)).first() is None:
                        return []
                    stmt = stmt.where(*have)
                if req.forbidden:
                    self._check_trait_names(conn, set(req.forbidden))
                    stmt = stmt.where(rp.c.id.not_in(self._trait_members(req.forbidden)))
            if filters.member_of is not None:
                if filters.member_of.required:
                    within = [rp.c.id.in_(self._agg_members(any_of))
                              for any_of in filters.member_of.required]
                    if conn.execute(sa.select(rp.c.id).where(*within).limit(1)).first() is None:
                        return []
                    stmt = stmt.where(*within)
                if filters.member_of.forbidden:
                    stmt = stmt.where(
                        rp.c.id.not_in(self._agg_members(filters.member_of.forbidden))
                    )
            if filters.resources:
                by_name, _ = self._rc_maps(conn)
                for rc_name, amount in filters.resources.items():
                    rc_id = by_name.get(rc_name)
                    if rc_id is None:
                        raise errors.BadRequest(
                            "Invalid resource class in resources parameter: No such resource "
                            f"class {rc_name}."
                        )
                    if amount > MAX_INT:
                        # No inventory allows more than MAX_INT per allocation (max_unit).
                        return []
                    stmt = stmt.where(rp.c.id.in_(self._fitting(rc_id, amount)))
            rows = conn.execute(stmt.order_by(rp.c.id)).all()
        return [self._record(r) for r in rows]

    @staticmethod
    def _check_trait_names(conn: Connection, names: set[str]) -> None:
        """400 naming the traits of ``names`` that do not exist."""
        if not names:
            return
        found = {r[0] for r in conn.execute(sa.select(traits.c.name).where(
            traits.c.name.in_(sorted(names))))}
        missing = sorted(names - found)
        if missing:
            raise errors.BadRequest(
                f'Invalid trait(s) in "required" parameter: No such trait(s): '
                f"{', '.join(missing)}."
            )

    @staticmethod
    def _agg_members(agg_uuids: Iterable[str]) -> sa.Select[Any]:
        return (
            sa.select(resource_provider_aggregates.c.resource_provider_id)
            .join(
                placement_aggregates,
                placement_aggregates.c.id == resource_provider_aggregates.c.aggregate_id,
            )
            .where(placement_aggregates.c.uuid.in_(list(agg_uuids)))
        )

    @staticmethod
    def _trait_members(names: Iterable[str]) -> sa.Select[Any]:
        return (
            sa.select(resource_provider_traits.c.resource_provider_id)
            .join(traits, traits.c.id == resource_provider_traits.c.trait_id)
            .where(traits.c.name.in_(list(names)))
        )

    @staticmethod
    def _fitting(rc_id: int, amount: int) -> sa.Select[Any]:
        usage = (
            sa.select(
                allocations.c.resource_provider_id.label("rp_id"),
                sa.func.sum(allocations.c.used).label("used"),
            )
            .where(allocations.c.resource_class_id == rc_id)
            .group_by(allocations.c.resource_provider_id)
            .subquery()
        )
        inv = inventories
        used = sa.func.coalesce(usage.c.used, 0)
        return (
            sa.select(inv.c.resource_provider_id)
            .select_from(inv.outerjoin(usage, usage.c.rp_id == inv.c.resource_provider_id))
            .where(
                inv.c.resource_class_id == rc_id,
                (inv.c.total - inv.c.reserved) * inv.c.allocation_ratio >= used + amount,
                inv.c.min_unit <= amount,
                inv.c.max_unit >= amount,
                sa.literal(amount) % inv.c.step_size == 0,
            )
        )

    def create_provider(
        self, name: str, uuid: str | None, parent_uuid: str | None
    ) -> ProviderRecord:
        """Create a provider (generation 0); 409 duplicate_name, 400 bad parent."""
        rp_uuid = uuid or str(uuid_mod.uuid4())
        prefix = f'Unable to create resource provider "{name}", {rp_uuid}: '
        if not name:  # the schema lets "" through; Placement's object refuses it first
            raise errors.BadRequest(prefix + "Object action create failed because: name is "
                                    "required")
        if parent_uuid is not None and parent_uuid == rp_uuid:
            raise errors.BadRequest(
                prefix + "Object action create failed because: parent provider UUID cannot be "
                "same as UUID. Please set parent provider UUID to None if there is no parent."
            )
        if parent_uuid is None:
            from berth.placement import provider_writes  # built on this module

            fast = provider_writes.create_root(self, name, rp_uuid)
            if fast is not None:
                return fast
        rp = resource_providers
        try:
            with self._write() as conn:
                parent_id = root_id = None
                if parent_uuid is not None:
                    prow = conn.execute(
                        sa.select(rp.c.id, rp.c.root_provider_id).where(rp.c.uuid == parent_uuid)
                    ).first()
                    if prow is None:
                        raise errors.BadRequest(
                            prefix + "Object action create failed because: parent provider "
                            "UUID does not exist."
                        )
                    parent_id, root_id = prow.id, prow.root_provider_id
                now = utcnow()
                # Uniqueness is left to the constraints: the common case costs one INSERT.
                if parent_id is None:
                    cursor = self._raw(conn, _RAW_INSERT_ROOT_RP, (rp_uuid, name, now))
                    new_id = int(cursor.fetchone()[0])
                    cursor.close()
                    self._raw(conn, _RAW_SET_OWN_ROOT, (new_id,)).close()
                    self._touch(conn, new_id)
                else:
                    new_id = conn.execute(
                        _INSERT_CHILD_RP,
                        {
                            "uuid": rp_uuid,
                            "name": name,
                            "parent": parent_id,
                            "root": root_id,
                            "now": now,
                        },
                    ).scalar_one()
                    self._touch(conn, new_id)
                return ProviderRecord(
                    id=new_id,
                    uuid=rp_uuid,
                    name=name,
                    generation=0,
                    parent_uuid=parent_uuid,
                    root_uuid=rp_uuid if parent_uuid is None else self._uuid_of(conn, root_id),
                    created_at=now,
                    updated_at=None,
                )
        except sa.exc.IntegrityError:
            # The name or uuid exists (or a concurrent writer just inserted it).
            with self._read() as conn:
                self._check_duplicate(conn, name, rp_uuid)
            raise errors.Conflict(
                f"Conflicting resource provider name: {name} already exists.",
                code=errors.DUPLICATE_NAME,
            ) from None

    @staticmethod
    def _uuid_of(conn: Connection, rp_id: int | None) -> str:
        return str(
            conn.execute(
                sa.select(resource_providers.c.uuid).where(resource_providers.c.id == rp_id)
            ).scalar_one()
        )

    @staticmethod
    def _check_duplicate(conn: Connection, name: str, rp_uuid: str) -> None:
        rp = resource_providers
        rows = conn.execute(
            sa.select(rp.c.name, rp.c.uuid).where(sa.or_(rp.c.name == name, rp.c.uuid == rp_uuid))
        ).all()
        dups = []
        if any(r.name == name for r in rows):
            dups.append(f"name: {name}")
        if any(r.uuid == rp_uuid for r in rows):
            dups.append(f"uuid: {rp_uuid}")
        if dups:
            raise errors.Conflict(
                f"Conflicting resource provider {', '.join(dups)} already exists.",
                code=errors.DUPLICATE_NAME,
            )

    def update_provider(
        self,
        uuid: str,
        name: str,
        *,
        set_parent: bool,
        parent_uuid: str | None,
        allow_reparent: bool,
    ) -> ProviderRecord:
        """Rename and/or re-parent a provider; the generation does not change."""
        rp = resource_providers
        prefix = f"Unable to save resource provider {uuid}: Object action "
        try:
            with self._write() as conn:
                cur = self._get_provider(conn, uuid)
                if cur is None:
                    raise errors.NotFound(
                        f"No resource provider with uuid {uuid} found", outside_handler=True
                    )
                values: dict[str, Any] = {"name": name, "updated_at": utcnow()}
                if set_parent and parent_uuid != cur.parent_uuid:
                    if parent_uuid is None:
                        if not allow_reparent:
                            raise errors.BadRequest(
                                prefix + "update failed because: un-parenting a provider is "
                                "not currently allowed."
                            )
                        values["parent_provider_id"] = None
                        self._reroot(conn, cur.id, cur.id)
                    else:
                        prow = conn.execute(
                            sa.select(rp.c.id, rp.c.root_provider_id).where(
                                rp.c.uuid == parent_uuid
                            )
                        ).first()
                        if prow is None:
                            raise errors.BadRequest(
                                prefix + "create failed because: parent provider UUID does not "
                                "exist."
                            )
                        if cur.parent_uuid is not None and not allow_reparent:
                            raise errors.BadRequest(
                                prefix + "update failed because: re-parenting a provider is not "
                                "currently allowed."
                            )
                        if prow.id in self._subtree_ids(conn, cur.id):
                            raise errors.BadRequest(
                                prefix + "update failed because: creating loop in the provider "
                                "tree is not allowed."
                            )
                        values["parent_provider_id"] = prow.id
                        self._reroot(conn, cur.id, prow.root_provider_id)
                if name != cur.name:
                    clash = conn.execute(
                        sa.select(rp.c.id).where(rp.c.name == name, rp.c.id != cur.id)
                    ).first()
                    if clash is not None:
                        raise errors.Conflict(
                            f"Conflicting resource provider {name} already exists.",
                            code=errors.DUPLICATE_NAME,
                        )
                conn.execute(sa.update(rp).where(rp.c.id == cur.id).values(**values))
                self._touch(conn, cur.id)
                out = self._get_provider(conn, uuid)
                assert out is not None
                return out
        except sa.exc.IntegrityError:
            raise errors.Conflict(
                f"Conflicting resource provider {name} already exists.", code=errors.DUPLICATE_NAME
            ) from None

    @staticmethod
    def _subtree_ids(conn: Connection, rp_id: int) -> set[int]:
        rp = resource_providers
        root_id = conn.execute(sa.select(rp.c.root_provider_id).where(rp.c.id == rp_id)).scalar()
        rows = conn.execute(
            sa.select(rp.c.id, rp.c.parent_provider_id).where(rp.c.root_provider_id == root_id)
        ).all()
        children: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            if r.parent_provider_id is not None:
                children[r.parent_provider_id].append(r.id)
        out = {rp_id}
        stack = [rp_id]
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in out:
                    out.add(child)
                    stack.append(child)
        return out

    def _reroot(self, conn: Connection, rp_id: int, new_root: int) -> None:
        ids = self._subtree_ids(conn, rp_id)
        self._touch(conn, *ids)
        conn.execute(
            sa.update(resource_providers)
            .where(resource_providers.c.id.in_(ids))
            .values(root_provider_id=new_root)
        )

    def delete_provider(self, uuid: str) -> None:
        """Delete a provider with its inventory, trait and aggregate links."""
        rp = resource_providers
        with self._write() as conn:
            row = conn.execute(sa.select(rp.c.id).where(rp.c.uuid == uuid)).first()
            if row is None:
                raise errors.NotFound(f"No resource provider with uuid {uuid} found for delete")
            rp_id = row.id
            # Placement looks for children first, then allocations.
            if conn.execute(
                sa.select(rp.c.id).where(rp.c.parent_provider_id == rp_id).limit(1)
            ).first():
                raise errors.Conflict(
                    f"Unable to delete parent resource provider {uuid}: It has child resource "
                    "providers.",
                    code=errors.PROVIDER_CANNOT_DELETE_PARENT,
                )
            if conn.execute(
                sa.select(allocations.c.id)
                .where(allocations.c.resource_provider_id == rp_id)
                .limit(1)
            ).first():
                raise errors.Conflict(
                    f"Unable to delete resource provider {uuid}: Resource provider has "
                    "allocations.",
                    code=errors.PROVIDER_IN_USE,
                )
            conn.execute(sa.delete(inventories).where(inventories.c.resource_provider_id == rp_id))
            conn.execute(
                sa.delete(resource_provider_traits).where(
                    resource_provider_traits.c.resource_provider_id == rp_id
                )
            )
            conn.execute(
                sa.delete(resource_provider_aggregates).where(
                    resource_provider_aggregates.c.resource_provider_id == rp_id
                )
            )
            conn.execute(sa.delete(rp).where(rp.c.id == rp_id))
            self._touch(conn, rp_id)
