"""The Placement store's allocation write hot path: one consumer's write in one or two
round trips on a raw connection, patching the cached graph (see
:meth:`~berth.placement.store.PlacementStore.write_allocations`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from berth.placement.change_log import snapshot_sees
from berth.placement.db import utcnow
from berth.placement.store_base import INCREMENTAL_LIMIT, StoreBase
from berth.placement.store_raw import (
    _PG_BUMP_AND_LOG_CHANGES,
    _RAW_ALLOC_TARGETS,
    _RAW_BUMP_SEQ,
    _RAW_CAS_CONSUMER,
    _RAW_CAS_RP,
    _RAW_CLASS_NAMES,
    _RAW_CONSUMER,
    _RAW_FRESH_CONSUMER,
    _RAW_INSERT_ALLOCS,
    _RAW_LOG_CHANGES,
    _RAW_NAMES_SEQ,
    _RAW_NEW_CONSUMER,
    _RAW_TAKE_ALLOCS,
    _SQLITE_STAMP,
    RawConnection,
    Unexpected,
    encode_usage_delta,
    marks,
)
from berth.placement.store_records import ConsumerWrite

_RAW_DELETE_CONSUMER = "DELETE FROM consumers WHERE uuid = ?"
_RAW_PROVIDER_UUIDS = "SELECT id, uuid FROM resource_providers WHERE id IN ({})"


class FastWritesMixin(StoreBase):
    """The raw-SQL fast paths of :meth:`AllocationsMixin.write_allocations` and of a
    consumer's deletion."""

    def _delete_consumer_raw(self, consumer: str) -> dict[str, dict[str, int]] | None:
        """Delete the consumer and its allocations in two round trips on a raw
        connection, logging the usage given back per provider (no provider generation
        changes, Placement's rule); what it held (provider uuid -> class -> amount), or
        None when it held nothing (nothing is written then). Database errors propagate,
        as from the general path."""
        raw = self._take_raw()
        ok = False
        try:
            begin = ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ())
            # The usage comes from the rows the DELETE itself removed (a SELECT first could
            # disagree with a writer that commits in between).
            removed = self._run(raw, [begin, (_RAW_TAKE_ALLOCS, (consumer,))])[1]
            if not removed:
                ok = True  # rolled back on give-back
                return None
            deltas: dict[int, dict[int, int]] = {}
            for rp_id, rc_id, used in removed:
                per = deltas.setdefault(rp_id, {})
                per[rc_id] = per.get(rc_id, 0) - used
            touched = sorted(deltas)
            log = [v for rp_id in touched for v in (rp_id, None, encode_usage_delta(deltas[rp_id]))]
            values = marks(len(touched), "(?, ?, ?)")
            stmts: list[tuple[Any, ...]] = [(_RAW_DELETE_CONSUMER, (consumer,))]
            if self.is_sqlite:
                stmts += [(_RAW_BUMP_SEQ, ()), (_RAW_LOG_CHANGES.format(values), log)]
            else:  # the bump and the log in one statement
                stmts.append((_PG_BUMP_AND_LOG_CHANGES.format(values), log))
            stmts += [(_RAW_PROVIDER_UUIDS.format(marks(len(touched))), touched),
                      (_RAW_CLASS_NAMES, ()), ("COMMIT", ())]
            res = self._run(raw, stmts)
            ok = True
            # The change's number: the counter's bump (SQLite), the log's rows (PostgreSQL).
            self._prune_now_and_then(raw, int(res[1][0][0]))
        finally:
            self._give_raw(raw, ok)
        uuid_of = {int(i): str(u) for i, u in res[-3]}
        class_of = {int(i): str(n) for i, n in res[-2]}
        freed: dict[str, dict[str, int]] = {}
        for rp_id, rc_id, used in removed:
            per_rc = freed.setdefault(uuid_of[rp_id], {})
            per_rc[class_of[rc_id]] = per_rc.get(class_of[rc_id], 0) + used
        return freed

    def _fast_write(self, w: ConsumerWrite) -> bool:
        """The common allocation write in one or two round trips; False: use the general
        path.

        Handles one consumer that is new (generation None) or at a known generation with
        the same project, user and type, whose project/user/type ids are cached, with a
        non-empty allocation set in known classes. A new consumer on providers the cached
        graph knows is written in one round trip (:meth:`_write_new_from_cache`), anything
        else after reading the database (:meth:`_write_from_reads`). Any other case, and
        anything the general path would refuse (a missing provider or inventory, a unit
        or capacity violation, a lost compare-and-swap, a consumer that exists after all),
        rolls back and answers False: the general path then gives the exact Placement
        answer.
        """
        gen = w.generation
        if not w.allocations or not (gen is None or type(gen) is int):
            return False
        ids = self._id_cache
        project = ids.get(("projects", w.project_id))
        user = ids.get(("users", w.user_id))
        ctype = None
        if w.consumer_type is not None:
            ctype = ids.get(("consumer_types", w.consumer_type))
            if ctype is None:
                return False
        if project is None or user is None:
            return False
        try:
            raw = self._take_raw()
        except sa.exc.DBAPIError:
            return False
        ok = False
        try:
            done = self._fast_write_on(raw, w, gen, project, user, ctype)
            ok = True
            return done
        finally:
            self._give_raw(raw, ok)

    def _fast_write_on(
        self,
        raw: RawConnection,
        w: ConsumerWrite,
        gen: int | None,
        project: int,
        user: int,
        ctype: int | None,
    ) -> bool:
        rcs = self._write_rcs
        if rcs is None:
            try:
                names_seq_rows, class_rows = self._run(
                    raw, [(_RAW_NAMES_SEQ, ()), (_RAW_CLASS_NAMES, ())]
                )
            except sa.exc.DBAPIError:
                return False
            rcs = (int(names_seq_rows[0][0]), {r[1]: int(r[0]) for r in class_rows})
            self._write_rcs = rcs
        names_seq, by_name = rcs
        # Requested amounts per (provider uuid, class id), in first-seen order (the
        # order the rows are inserted in, as the general path does).
        requested: dict[tuple[str, int], int] = {}
        for rp_uuid, rc, used in w.allocations:
            rc_id = by_name.get(rc)
            if rc_id is None or type(used) is not int:
                return False
            key = (rp_uuid, rc_id)
            requested[key] = requested.get(key, 0) + used
        now = utcnow()
        stamp: Any = now.strftime(_SQLITE_STAMP) if self.is_sqlite else now
        if gen is None:
            plan = self._cached_plan(w, requested, names_seq, by_name)
            if plan is not None:
                done = self._write_new_from_cache(
                    raw, w, project, user, ctype, stamp, names_seq, *plan
                )
                if done is not None:
                    return done
                if not raw.reset():
                    return False
        return self._write_from_reads(
            raw, w, gen, project, user, ctype, stamp, requested, names_seq, by_name
        )

    def _cached_plan(
        self,
        w: ConsumerWrite,
        requested: Mapping[tuple[str, int], int],
        names_seq: int,
        by_name: Mapping[str, int],
    ) -> tuple[dict[tuple[int, int], int], dict[int, int], dict[tuple[int, int], int]] | None:
        """The write of a new consumer planned from the cached providers: the ids, the
        generations to compare-and-swap and the usages the capacity check used.

        None when the cache cannot vouch for it (unknown provider or inventory, a check
        that fails on the cached numbers, another thread updating the cache).
        """
        if not self._graph_lock.acquire(blocking=False):
            return None
        try:
            if self._graph is None or self._names_seq != names_seq:
                return None
            ids, providers, rc_by_id = self._ids_by_uuid, self._providers, self._rc_by_id
            for rp_uuid, rc, used in w.allocations:
                rp_id = ids.get(rp_uuid)
                inv = None if rp_id is None else providers[rp_id].inventories.get(rc)
                if (
                    inv is None
                    or rc_by_id.get(by_name[rc]) != rc
                    or inv.step_size < 1
                    or not inv.min_unit <= used <= inv.max_unit
                    or used % inv.step_size
                ):
                    return None
            added: dict[tuple[int, int], int] = {}
            gens: dict[int, int] = {}
            usages: dict[tuple[int, int], int] = {}
            for (rp_uuid, rc_id), amount in requested.items():
                rp_id = ids[rp_uuid]
                prov = providers[rp_id]
                name = rc_by_id[rc_id]
                inv = prov.inventories[name]
                used_now = prov.usages.get(name, 0)
                # A new consumer has nothing to give back: any growth past capacity is
                # refused (the reads below, or the general path, decide that).
                if used_now + amount > (inv.total - inv.reserved) * inv.allocation_ratio:
                    return None
                added[(rp_id, rc_id)] = amount
                gens[rp_id] = prov.generation
                usages[(rp_id, rc_id)] = used_now
            return added, gens, usages
        finally:
            self._graph_lock.release()

    def _write_new_from_cache(
        self,
        raw: RawConnection,
        w: ConsumerWrite,
        project: int,
        user: int,
        ctype: int | None,
        stamp: Any,
        names_seq: int,
        added: dict[tuple[int, int], int],
        gens: dict[int, int],
        usages: dict[tuple[int, int], int],
    ) -> bool | None:
        """A new consumer's write in one round trip, trusting the cache: the provider
        compare-and-swaps prove that nothing was added to those providers and no inventory
        changed since it was read (every such write bumps the generation), so usage can
        only have dropped since; the consumer must not exist and hold no allocations.

        True when written; False for the general path; None when the cache was stale
        (a lost compare-and-swap, names changed): read the database instead.
        """
        consumer = w.consumer_uuid
        prefix: list[tuple[Any, ...]] = [
            ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
            (_RAW_NEW_CONSUMER, (consumer, project, user, ctype, stamp, stamp)),
            (_RAW_FRESH_CONSUMER, (consumer, names_seq), True),
        ]
        try:
            change = self._finish_write(
                raw, prefix, consumer, added, {}, gens, None, sorted(gens), stamp
            )
        except Unexpected:
            return None
        if change is None:
            return False  # e.g. the consumer exists
        self._write_through(change, names_seq, sorted(gens), gens, {}, added, usages)
        return True

    def _write_from_reads(
        self,
        raw: RawConnection,
        w: ConsumerWrite,
        gen: int | None,
        project: int,
        user: int,
        ctype: int | None,
        stamp: Any,
        requested: Mapping[tuple[str, int], int],
        names_seq: int,
        by_name: Mapping[str, int],
    ) -> bool:
        """The write after reading the consumer, its old allocations and the targets'
        generations, inventories and usages in one round trip; then one more."""
        uuids = sorted({k[0] for k in requested})
        rc_ids = sorted({k[1] for k in requested})
        consumer = w.consumer_uuid
        first: tuple[str, Sequence[Any]] = (
            (_RAW_NEW_CONSUMER, (consumer, project, user, ctype, stamp, stamp))
            if gen is None
            else (_RAW_CONSUMER, (consumer,))
        )
        try:
            res = self._run(
                raw,
                [
                    ("BEGIN IMMEDIATE" if self.is_sqlite else "BEGIN", ()),
                    first,
                    (_RAW_TAKE_ALLOCS, (consumer,)),
                    (
                        _RAW_ALLOC_TARGETS.format(marks(len(rc_ids)), marks(len(uuids))),
                        (*rc_ids, *uuids),
                    ),
                ],
            )
        except sa.exc.DBAPIError:
            return False  # e.g. the consumer exists after all: rolled back on give-back
        _begin, consumer_rows, old_rows, target_rows = res
        if gen is None:
            cid = consumer_rows[0][0]
        else:
            row = consumer_rows[0] if consumer_rows else None
            if (
                row is None
                or row[1] != gen
                or row[2] != project
                or row[3] != user
                or (ctype is not None and row[4] != ctype)
            ):
                return False
            cid = row[0]
        if not target_rows or target_rows[0][11] != names_seq:
            if target_rows:
                self._write_rcs = None  # a class was created, deleted or renamed
            return False
        rp_ids: dict[str, int] = {}
        gens: dict[int, int] = {}
        invs: dict[tuple[int, int], tuple[Any, ...]] = {}
        for rp_id, rp_uuid, rp_gen, rc_id, *inv in target_rows:
            rp_ids[rp_uuid] = rp_id
            gens[rp_id] = rp_gen
            if rc_id is not None:
                invs[(rp_id, rc_id)] = tuple(inv)
        if len(rp_ids) != len(uuids):
            return False  # a provider does not exist
        mine: dict[tuple[int, int], int] = {}
        for rp_id, rc_id, used in old_rows:
            mine[(rp_id, rc_id)] = mine.get((rp_id, rc_id), 0) + used
        for rp_uuid, rc, used in w.allocations:
            found = invs.get((rp_ids[rp_uuid], by_name[rc]))
            if found is None:
                return False
            _total, _reserved, min_unit, max_unit, step, _ratio, _used, _seq = found
            if step < 1 or used < min_unit or used > max_unit or used % step != 0:
                return False
        added: dict[tuple[int, int], int] = {}
        others: dict[tuple[int, int], int] = {}
        for (rp_uuid, rc_id), amount in requested.items():
            target = (rp_ids[rp_uuid], rc_id)
            total, reserved, _min, _max, _step, ratio, used_now, _seq = invs[target]
            other = int(used_now or 0)  # this consumer's old rows are already deleted
            new_total = other + amount
            if (
                new_total > (total - reserved) * ratio
                and new_total > other + mine.get(target, 0)
            ):
                return False  # would exceed the capacity
            added[target] = amount
            others[target] = other
        touched = sorted(set(gens) | {k[0] for k in mine})
        consumer_cas = None if gen is None else (cid, gen)
        try:
            change = self._finish_write(
                raw, [], consumer, added, mine, gens, consumer_cas, touched, stamp
            )
        except Unexpected:
            return False  # another writer won a compare-and-swap
        if change is None:
            return False
        self._write_through(change, names_seq, touched, gens, mine, added, others)
        return True

    def _finish_write(
        self,
        raw: RawConnection,
        prefix: list[tuple[Any, ...]],
        consumer: str,
        added: Mapping[tuple[int, int], int],
        mine: Mapping[tuple[int, int], int],
        gens: Mapping[int, int],
        consumer_cas: tuple[int, int] | None,
        touched: Sequence[int],
        stamp: Any,
    ) -> tuple[int, int | None] | None:
        """Insert the rows, compare-and-swap the providers (in id order) and the consumer,
        log the touched providers with their new generations and usage deltas (``added``
        less the consumer's old rows ``mine``; on SQLite with the change counter's bump)
        and commit, in one round trip after ``prefix``. Returns the change number and, on
        PostgreSQL, the transaction's id; None when it failed (a database error: the
        general path answers).

        Raises Unexpected when a compare-and-swap or an assertion of ``prefix`` failed
        (nothing is committed then: the database aborts the transaction).
        """
        stmts: list[tuple[Any, ...]] = list(prefix)
        stmts.append(
            (
                _RAW_INSERT_ALLOCS + marks(len(added), "(?, ?, ?, ?, ?, NULL)"),
                [
                    v
                    for (rp_id, rc_id), used in added.items()
                    for v in (rp_id, consumer, rc_id, used, stamp)
                ],
            )
        )
        stmts += [(_RAW_CAS_RP, (g + 1, stamp, rp_id, g), True) for rp_id, g in sorted(gens.items())]
        if consumer_cas is not None:
            cid, cgen = consumer_cas
            stmts.append((_RAW_CAS_CONSUMER, (cgen + 1, stamp, cid, cgen), True))
        deltas: dict[int, dict[int, int]] = {rp_id: {} for rp_id in touched}
        for (rp_id, rc_id), used in mine.items():
            deltas[rp_id][rc_id] = -used
        for (rp_id, rc_id), used in added.items():
            deltas[rp_id][rc_id] = deltas[rp_id].get(rc_id, 0) + used
        log: list[Any] = []
        for rp_id in touched:
            gen = gens.get(rp_id)
            log += (rp_id, None if gen is None else gen + 1, encode_usage_delta(deltas[rp_id]))
        values = marks(len(touched), "(?, ?, ?)")
        if self.is_sqlite:
            stmts += [(_RAW_BUMP_SEQ, ()), (_RAW_LOG_CHANGES.format(values), log)]
        else:  # the bump and the log in one statement
            stmts.append((_PG_BUMP_AND_LOG_CHANGES.format(values), log))
        stmts.append(("COMMIT", ()))
        try:
            res = self._run(raw, stmts)
        except sa.exc.DBAPIError:
            # Aborted (the general path then answers exactly), or the connection failed
            # and whether it committed is unknown: the general path is safe then too, as
            # a committed write left its consumer at a generation this one does not send.
            return None
        if self.is_sqlite:
            seq, xid = int(res[-3][0][0]), None
        else:
            seq, xid = int(res[-2][0][0]), int(res[-2][0][1])
        self._prune_now_and_then(raw, seq)
        return seq, xid

    def _write_through(
        self,
        change: tuple[int, int | None],
        names_seq: int,
        touched: Sequence[int],
        gens: Mapping[int, int],
        mine: Mapping[tuple[int, int], int],
        added: Mapping[tuple[int, int], int],
        others: Mapping[tuple[int, int], int],
    ) -> None:
        """Patch the cached providers with a just committed allocation write.

        Only when the cache agrees with what the write read, and on SQLite when the
        write's change number directly follows the cache's (nobody else committed a
        change in between); otherwise the next provider_graph() reloads the touched
        providers from the log. On PostgreSQL the cache follows the log by transaction:
        the write is patched in unless the cached snapshot has it already, and its log
        rows are skipped when read (usage deltas add up in any order; a provider's
        generation only grows).
        """
        seq, xid = change
        if not self._graph_lock.acquire(blocking=False):
            return  # a reload is running; it or the next one reads the change log
        try:
            if self._graph is None or names_seq != self._names_seq:
                return
            if xid is None and seq != self._seq + 1:
                return
            if xid is not None and (snapshot_sees(self._snap, xid)
                                    or len(self._own_xids) >= INCREMENTAL_LIMIT):
                # A refresh in between read it from the log; or this store writes
                # without reading the graph again: the log keeps the rest.
                return
            providers, rc_by_id = self._providers, self._rc_by_id
            new_usages: dict[int, dict[str, int]] = {}
            for key in {*mine, *added}:
                rp_id, rc_id = key
                cur = providers.get(rp_id)
                name = rc_by_id.get(rc_id)
                if cur is None or name is None:
                    return
                usages = new_usages.get(rp_id)
                if usages is None:
                    usages = new_usages[rp_id] = dict(cur.usages)
                before = cur.usages.get(name, 0)
                removed = mine.get(key, 0)
                if key in others and before != others[key] + removed:
                    return  # the cache disagrees with the database: reload instead
                after = before - removed + added.get(key, 0)
                if after < 0:
                    # The cache has not seen the rows this write gave back yet (on
                    # PostgreSQL it may lag the database): patching would lose them.
                    return
                if after:
                    usages[name] = after
                else:
                    usages.pop(name, None)
            patched = {}
            for rp_id in touched:
                cur = providers.get(rp_id)
                if cur is None:
                    return
                generation = cur.generation
                if rp_id in gens:
                    if gens[rp_id] != generation:
                        return
                    generation += 1
                patched[rp_id] = type(cur)(
                    cur.uuid,
                    cur.name,
                    generation,
                    cur.parent_uuid,
                    cur.root_uuid,
                    cur.inventories,
                    new_usages.get(rp_id, cur.usages),
                    cur.traits,
                    cur.aggregates,
                )
            providers.update(patched)
            self._dirty.update(patched)
            if xid is None:
                self._seq = seq
            else:
                self._own_xids.add(xid)
        finally:
            self._graph_lock.release()
