"""Aggregates, traits and resource classes of the Placement store."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import os_traits
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from berth.placement import db, errors
from berth.placement.db import (
    inventories,
    placement_aggregates,
    resource_classes,
    resource_provider_aggregates,
    resource_provider_traits,
    traits,
    utcnow,
)
from berth.placement.store_base import StoreBase
from berth.placement.store_records import CONCURRENT_MSG, RETRY_COUNT, STANDARD_RCS, ProviderRecord


class TraitsMixin(StoreBase):
    """Aggregate, trait and resource class operations of
    :class:`~berth.placement.store.PlacementStore`.
    """

    # ------------------------------------------------------------------ aggregates

    @staticmethod
    def _aggregates(conn: Connection, rp_id: int) -> list[str]:
        rows = conn.execute(
            sa.select(placement_aggregates.c.uuid)
            .join(
                resource_provider_aggregates,
                resource_provider_aggregates.c.aggregate_id == placement_aggregates.c.id,
            )
            .where(resource_provider_aggregates.c.resource_provider_id == rp_id)
            .order_by(placement_aggregates.c.id)
        ).all()
        return [r[0] for r in rows]

    def find_aggregates(self, uuid: str) -> tuple[ProviderRecord, list[str]] | None:
        """A provider and its aggregate uuids, or None if the provider is missing."""
        from berth.placement import provider_reads  # built on this module

        try:
            return provider_reads.aggregates(self, uuid)
        except provider_reads.Fallback:
            pass
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            return None if prov is None else (prov, self._aggregates(conn, prov.id))

    def get_aggregates(self, uuid: str) -> tuple[ProviderRecord, list[str]]:
        """A provider and its aggregate uuids (404 if the provider is missing)."""
        found = self.find_aggregates(uuid)
        if found is None:
            raise errors.NotFound(
                f"No resource provider with uuid {uuid} found", outside_handler=True)
        return found

    def set_aggregates(
        self, uuid: str, aggs: Sequence[str], generation: int | None
    ) -> tuple[int, list[str]]:
        """Replace a provider's aggregates; with a generation (>= 1.19) CAS and bump it."""
        if generation is not None:
            from berth.placement import provider_writes  # built on this module

            fast = provider_writes.set_aggregates(self, uuid, aggs, generation)
            if fast is not None:
                return fast
        with self._write() as conn:
            prov = self._require_provider(conn, uuid)
            gen_msg = (
                "Resource provider's generation already changed. Please update the generation "
                "and try again."
            )
            if generation is not None and prov.generation != generation:
                raise errors.Conflict(gen_msg, code=errors.CONCURRENT_UPDATE)
            wanted = list(dict.fromkeys(aggs))
            if wanted:
                existing = {
                    r.uuid: r.id
                    for r in conn.execute(
                        sa.select(placement_aggregates.c.uuid, placement_aggregates.c.id).where(
                            placement_aggregates.c.uuid.in_(wanted)
                        )
                    )
                }
                missing = [a for a in wanted if a not in existing]
                if missing:
                    self._insert_ignore(
                        conn,
                        placement_aggregates,
                        [{"uuid": a, "created_at": utcnow()} for a in missing],
                    )
                    for r in conn.execute(
                        sa.select(placement_aggregates.c.uuid, placement_aggregates.c.id).where(
                            placement_aggregates.c.uuid.in_(missing)
                        )
                    ):
                        existing[r.uuid] = r.id
                agg_ids = [existing[a] for a in wanted]
            else:
                agg_ids = []
            self._touch(conn, prov.id)
            conn.execute(
                sa.delete(resource_provider_aggregates).where(
                    resource_provider_aggregates.c.resource_provider_id == prov.id
                )
            )
            if agg_ids:
                conn.execute(
                    sa.insert(resource_provider_aggregates),
                    [{"resource_provider_id": prov.id, "aggregate_id": a} for a in agg_ids],
                )
            new_gen = prov.generation
            if generation is not None:
                if not self._bump(conn, prov.id, generation):
                    raise errors.Conflict(gen_msg, code=errors.CONCURRENT_UPDATE)
                new_gen += 1
            return new_gen, self._aggregates(conn, prov.id)

    # ------------------------------------------------------------------ traits

    @staticmethod
    def _provider_traits(conn: Connection, rp_id: int) -> list[str]:
        rows = conn.execute(
            sa.select(traits.c.name)
            .join(resource_provider_traits, resource_provider_traits.c.trait_id == traits.c.id)
            .where(resource_provider_traits.c.resource_provider_id == rp_id)
            .order_by(traits.c.id)
        ).all()
        return [r[0] for r in rows]

    def get_provider_traits(self, uuid: str) -> tuple[ProviderRecord, list[str]] | None:
        """A provider and its trait names, or None if missing."""
        from berth.placement import provider_reads  # built on this module

        try:
            return provider_reads.traits(self, uuid)
        except provider_reads.Fallback:
            pass
        with self._read() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            return prov, self._provider_traits(conn, prov.id)

    def set_provider_traits(
        self, uuid: str, names: Sequence[str], generation: int
    ) -> tuple[int, list[str]] | None:
        """Replace a provider's traits; None when the provider is missing."""
        gen_msg = (
            "Resource provider's generation already changed. Please update the generation and "
            "try again."
        )
        from berth.placement import provider_writes  # built on this module

        fast = provider_writes.set_traits(self, uuid, names, generation)
        if fast is not None:
            return fast
        with self._write() as conn:
            self._lock_for_links(conn, resource_provider_traits)
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return None
            if prov.generation != generation:
                raise errors.Conflict(gen_msg, code=errors.CONCURRENT_UPDATE)
            wanted = list(dict.fromkeys(names))
            found = {
                r.name: r.id
                for r in conn.execute(
                    sa.select(traits.c.name, traits.c.id).where(traits.c.name.in_(wanted))
                )
            }
            missing = [n for n in wanted if n not in found]
            if missing:
                raise errors.BadRequest(f"No such trait {', '.join(missing)}")
            current = set(self._provider_traits(conn, prov.id))
            if current == set(wanted):
                return prov.generation, self._provider_traits(conn, prov.id)
            conn.execute(
                sa.delete(resource_provider_traits).where(
                    resource_provider_traits.c.resource_provider_id == prov.id
                )
            )
            if wanted:
                conn.execute(
                    sa.insert(resource_provider_traits),
                    [{"resource_provider_id": prov.id, "trait_id": found[n]} for n in wanted],
                )
            if not self._bump(conn, prov.id, generation):
                raise errors.Conflict(gen_msg, code=errors.CONCURRENT_UPDATE)
            return generation + 1, self._provider_traits(conn, prov.id)

    def delete_provider_traits(self, uuid: str) -> bool:
        """Remove all traits of a provider; False when the provider is missing."""
        with self._write() as conn:
            prov = self._get_provider(conn, uuid)
            if prov is None:
                return False
            result = conn.execute(
                sa.delete(resource_provider_traits).where(
                    resource_provider_traits.c.resource_provider_id == prov.id
                )
            )
            if result.rowcount and not self._bump(conn, prov.id, prov.generation):
                raise errors.Conflict(
                    f"Update conflict: {CONCURRENT_MSG}", code=errors.CONCURRENT_UPDATE
                )
            return True

    def list_traits(
        self,
        *,
        names_in: Sequence[str] | None = None,
        prefix: str | None = None,
        associated: bool | None = None,
    ) -> list[tuple[str, dt.datetime | None]]:
        """Trait names (with timestamps) in DB order, filtered."""
        stmt = sa.select(traits.c.name, traits.c.created_at, traits.c.updated_at)
        if names_in is not None:
            stmt = stmt.where(traits.c.name.in_(list(names_in)))
        if prefix is not None:
            # Placement's LIKE 'prefix%': a "_" or "%" in the prefix is a wildcard, and
            # letters match in either case on SQLite and MySQL (its usual databases);
            # PostgreSQL's LIKE would tell case, so ILIKE there.
            pattern = prefix + "%"
            stmt = stmt.where(traits.c.name.like(pattern) if self.is_sqlite
                              else traits.c.name.ilike(pattern))
        if associated is not None:
            linked = sa.select(resource_provider_traits.c.trait_id)
            stmt = stmt.where(traits.c.id.in_(linked) if associated else traits.c.id.not_in(linked))
        with self._read() as conn:
            rows = conn.execute(stmt.order_by(traits.c.id)).all()
        return [(r.name, r.updated_at or r.created_at) for r in rows]

    def get_trait(self, name: str) -> dt.datetime | None:
        """The trait's timestamp; NotFound when it does not exist."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(traits.c.created_at, traits.c.updated_at).where(traits.c.name == name)
            ).first()
        if row is None:
            raise errors.NotFound(f"No such trait(s): {name}.")
        return row.updated_at or row.created_at or utcnow()

    def ensure_trait(self, name: str) -> tuple[bool, dt.datetime]:
        """Create a custom trait if missing; returns (created, timestamp)."""
        with self._write() as conn:
            row = conn.execute(sa.select(traits.c.created_at).where(traits.c.name == name)).first()
            if row is not None:
                return False, row.created_at or utcnow()
            now = utcnow()
            if not self._insert_ignore(conn, traits, [{"name": name, "created_at": now}]):
                # Created by a concurrent request since it was read: Placement's
                # TraitExists, answered 204 as an existing trait.
                row = conn.execute(sa.select(traits.c.created_at).where(
                    traits.c.name == name)).first()
                return False, (row.created_at if row is not None else None) or now
            self._touch_names(conn)
            return True, now

    def delete_trait(self, name: str) -> None:
        """Delete a custom trait that no provider uses."""
        with self._write() as conn:
            self._lock_links(conn, resource_provider_traits)
            row = conn.execute(sa.select(traits.c.id).where(traits.c.name == name)).first()
            if row is None:
                raise errors.NotFound(f"No such trait(s): {name}.")
            if not os_traits.is_custom(name):
                raise errors.BadRequest(f"Cannot delete standard trait {name}.")
            if conn.execute(
                sa.select(resource_provider_traits.c.trait_id)
                .where(resource_provider_traits.c.trait_id == row.id)
                .limit(1)
            ).first():
                raise errors.Conflict(f"The trait {name} is in use by a resource provider.")
            conn.execute(sa.delete(traits).where(traits.c.id == row.id))
            self._touch_names(conn)

    # ------------------------------------------------------------------ resource classes

    def list_resource_classes(self) -> list[tuple[str, dt.datetime | None]]:
        """Resource classes in id order (standard first), with timestamps."""
        with self._read() as conn:
            rows = conn.execute(
                sa.select(
                    resource_classes.c.name,
                    resource_classes.c.created_at,
                    resource_classes.c.updated_at,
                ).order_by(resource_classes.c.id)
            ).all()
        return [(r.name, r.updated_at or r.created_at) for r in rows]

    def get_resource_class(self, name: str) -> dt.datetime | None:
        """The class's timestamp (None for standard ones); NotFound if unknown."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(resource_classes.c.created_at, resource_classes.c.updated_at).where(
                    resource_classes.c.name == name
                )
            ).first()
        if row is None:  # Placement's NotFound leaves the handler: no Vary header
            raise errors.NotFound(f"No such resource class {name}.", outside_handler=True)
        return row.updated_at or row.created_at

    def create_resource_class(self, name: str, *, exists_ok: bool = False) -> bool:
        """Create a custom class with an id >= 10000; returns False if it already existed."""
        for _attempt in range(RETRY_COUNT):
            try:
                with self._write() as conn:
                    if conn.execute(
                        sa.select(resource_classes.c.id).where(resource_classes.c.name == name)
                    ).first():
                        if exists_ok:
                            return False
                        raise errors.Conflict(f"Conflicting resource class already exists: {name}")
                    next_id = conn.execute(
                        sa.select(
                            sa.func.coalesce(
                                sa.func.max(resource_classes.c.id), db.CUSTOM_RC_MIN_ID - 1
                            )
                            + 1
                        ).where(resource_classes.c.id >= db.CUSTOM_RC_MIN_ID)
                    ).scalar_one()
                    conn.execute(
                        sa.insert(resource_classes).values(
                            id=next_id, name=name, created_at=utcnow(), updated_at=None
                        )
                    )
                    self._touch_names(conn)
                    return True
            except sa.exc.IntegrityError:
                continue
        raise errors.Conflict(f"Conflicting resource class already exists: {name}")

    def rename_resource_class(self, old: str, new: str) -> dt.datetime:
        """Rename a custom class (1.2-1.6)."""
        with self._write() as conn:
            self._lock_links(conn, inventories)
            row = conn.execute(
                sa.select(resource_classes.c.id).where(resource_classes.c.name == old)
            ).first()
            if row is None:  # as Placement's, from outside its handler
                raise errors.NotFound(f"No such resource class {old}.", outside_handler=True)
            if old in STANDARD_RCS or row.id < db.CUSTOM_RC_MIN_ID:
                raise errors.BadRequest(f"Cannot update standard resource class {old}")
            if new != old and conn.execute(  # its own name again: Placement saves it
                sa.select(resource_classes.c.id).where(resource_classes.c.name == new)
            ).first():
                raise errors.Conflict(f"Resource class already exists: {new}")
            now = utcnow()
            conn.execute(
                sa.update(resource_classes)
                .where(resource_classes.c.id == row.id)
                .values(name=new, updated_at=now)
            )
            # Inventories show the class by name on every provider.
            self._touch_all(conn)
            self._touch_names(conn)
            return now

    def delete_resource_class(self, name: str) -> None:
        """Delete a custom class no inventory uses."""
        with self._write() as conn:
            self._lock_links(conn, inventories)
            row = conn.execute(
                sa.select(resource_classes.c.id).where(resource_classes.c.name == name)
            ).first()
            if row is None:  # as Placement's, from outside its handler
                raise errors.NotFound(f"No such resource class {name}.", outside_handler=True)
            if name in STANDARD_RCS or row.id < db.CUSTOM_RC_MIN_ID:
                raise errors.BadRequest(
                    f"Error in delete resource class: Cannot delete standard resource class {name}."
                )
            if conn.execute(
                sa.select(inventories.c.id)
                .where(inventories.c.resource_class_id == row.id)
                .limit(1)
            ).first():
                raise errors.Conflict(
                    f"Error in delete resource class: Cannot delete resource class {name}. Class "
                    "is in use in inventory."
                )
            conn.execute(sa.delete(resource_classes).where(resource_classes.c.id == row.id))
            self._touch_names(conn)
