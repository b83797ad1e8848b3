"""The Placement store's cached provider graph for the allocation-candidates engine,
kept current from the change log.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from berth.placement.change_log import (
    PG_CHANGED_IDS,
    PG_SNAPSHOT,
    PG_STATE,
    pg_state_and_log,
    snapshot_sees,
)
from berth.placement.store_base import INCREMENTAL_LIMIT, StoreBase
from berth.placement.store_raw import (
    _CHANGED_LIMIT,
    _RAW_AGGREGATES,
    _RAW_CHANGED_IDS,
    _RAW_CLASS_NAMES,
    _RAW_INVENTORIES,
    _RAW_PROVIDERS,
    _RAW_STATE,
    _RAW_STATE_AND_LOG,
    _RAW_TRAIT_NAMES,
    _RAW_TRAITS,
    _RAW_USAGES,
    RawConnection,
    decode_usage_delta,
    marks,
)

#: PostgreSQL's catch-up statement; one more row than a patch from the log may take.
_PG_STATE_AND_LOG = pg_state_and_log(INCREMENTAL_LIMIT + 1)


class GraphMixin(StoreBase):
    """The cached :meth:`provider_graph` of :class:`~berth.placement.store.PlacementStore`."""

    # ------------------------------------------------------------------ graph

    def provider_graph(self) -> Any:
        """The allocation-candidate engine's ProviderGraph, current as of this call.

        One cheap query reads the DB counters and, in the same snapshot, the change log
        since the cached state (on PostgreSQL: the rows of transactions the cached
        snapshot did not see, ``change_log``). Allocation writes log their usage deltas and new
        generations, so when every change since then is one (other schedulers' claims)
        the cache is patched from the log alone (:meth:`_apply_log`). Otherwise only the
        providers the log names are reloaded (a resource class rename, or a cache too far
        behind, forces a full reload) and the graph is patched for them; trait and class
        names are re-read only when the names counter moved. This store's own allocation
        writes patch the cache as they commit (on SQLite when nobody else wrote in
        between), so after them the query is all it costs.
        """
        with self._graph_lock:
            for attempt in range(2):
                raw = self._take_raw(fresh=attempt > 0)
                ok = False
                try:
                    graph = self._refresh_graph(raw)
                    ok = True
                    return graph
                except (sa.exc.OperationalError, sa.exc.InterfaceError):
                    # A kept connection the server dropped: once more on a new one.
                    if attempt:
                        raise
                finally:
                    self._give_raw(raw, ok)
        raise AssertionError("unreachable")

    def _refresh_graph(self, raw: RawConnection) -> Any:
        if self._graph is None:
            self._load_all(raw)
            return self._current_graph()
        if self.is_sqlite:
            old = self._seq
            rows = self._run(raw, [(_RAW_STATE_AND_LOG, (old, old + INCREMENTAL_LIMIT))])[0]
            position, full_seq, names_seq = rows[0][:3]
            if position == old and names_seq == self._names_seq:
                return self._current_graph()
            incremental = full_seq <= old <= position and position - old <= INCREMENTAL_LIMIT
        else:  # the log rows of transactions the cached snapshot did not see
            rows = self._run(raw, [(_PG_STATE_AND_LOG, (self._snap, self._server))])[0]
            position, reload_all, names_seq = rows[0][:3]
            if not reload_all and rows[0][3] is None and names_seq == self._names_seq:
                self._moved_to(position)
                return self._current_graph()
            incremental = not reload_all and len(rows) <= INCREMENTAL_LIMIT
        if incremental:
            if names_seq == self._names_seq and self._apply_log(rows, position):
                return self._current_graph()
            if self._load_changes(raw):
                return self._current_graph()
        self._load_all(raw)
        return self._current_graph()

    def _moved_to(self, position: int | str) -> None:
        """The cached providers are current as of ``position``: a change number
        (SQLite), or a snapshot (PostgreSQL), which shows this store's own writes patched
        in before (they are no longer skipped in the log)."""
        if isinstance(position, int):
            self._seq = position
            return
        self._snap = position
        if self._own_xids:
            self._own_xids = {x for x in self._own_xids if not snapshot_sees(position, x)}

    def _apply_log(self, rows: Sequence[Any], position: int | str) -> bool:
        """Bring the cached providers to ``position`` from the change log rows read with
        it (:data:`_RAW_STATE_AND_LOG`, :func:`pg_state_and_log`), when every change
        since the cached state was an allocation write that logged its usage deltas: no
        provider is re-read. False (nothing changed) when a change needs a provider
        reloaded, or the log does not fit the cache; :meth:`_load_changes` then reads
        those providers. Rows of this store's own writes that were patched in as they
        committed (PostgreSQL: by transaction id) are skipped.
        """
        providers, rc_by_id, own = self._providers, self._rc_by_id, self._own_xids
        sums: dict[int, dict[int, int]] = {}
        latest: dict[int, int] = {}  # provider -> its highest logged generation
        # The rows come in no particular order: sum the deltas, and keep each provider's
        # highest generation (a provider's generation only grows).
        for _pos, _full, _names, change, rp_id, generation, delta in rows:
            if change is None or change in own:
                continue
            if delta is None or rp_id not in providers:
                return False
            per = sums.setdefault(rp_id, {})
            for rc_id, amount in decode_usage_delta(delta).items():
                per[rc_id] = per.get(rc_id, 0) + amount
            if generation is not None and int(generation) > latest.get(rp_id, -1):
                latest[rp_id] = int(generation)
        patched = {}
        for rp_id, per in sums.items():
            cur = providers[rp_id]
            usages = dict(cur.usages)
            for rc_id, amount in per.items():
                name = rc_by_id.get(rc_id)
                if name is None:
                    return False
                after = usages.get(name, 0) + amount
                if after < 0:
                    return False  # the cache disagrees with the log: reload instead
                if after:
                    usages[name] = after
                else:
                    usages.pop(name, None)
            patched[rp_id] = type(cur)(
                cur.uuid,
                cur.name,
                max(latest.get(rp_id, -1), cur.generation),
                cur.parent_uuid,
                cur.root_uuid,
                cur.inventories,
                usages,
                cur.traits,
                cur.aggregates,
            )
        providers.update(patched)
        self._dirty.update(patched)
        self._moved_to(position)
        return True

    def _current_graph(self) -> Any:
        """The graph of the cached providers, patched or rebuilt for what changed."""
        from berth.placement import candidates

        if self._structural or self._graph is None:
            providers = self._providers
            ids = sorted(providers)
            self._graph = candidates.ProviderGraph(
                [providers[i] for i in ids], self._trait_names, self._class_names, ids
            )
        elif self._dirty:
            # The common case while scheduling: usages of a few providers changed. The
            # engine patches its columns for those instead of rebuilding every index.
            self._graph = self._graph.with_updates(list(self._dirty.values()))
        self._structural = False
        self._dirty.clear()
        return self._graph

    def _begin_snapshot(self) -> tuple[str, tuple[()]]:
        if self.is_sqlite:
            return ("BEGIN", ())  # WAL: the first read fixes the snapshot
        return ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", ())

    def _load_changes(self, raw: RawConnection) -> bool:
        """Reload the providers changed since the cached state, in one snapshot: its
        counters and the change log, then those providers (and the names if they
        changed): two round trips on PostgreSQL. False when a full reload is needed."""
        old = self._seq
        if self.is_sqlite:
            _begin, ((position, full_seq, names_seq),), changed_rows = self._run(
                raw, [self._begin_snapshot(), (_RAW_STATE, ()), (_RAW_CHANGED_IDS, (old,))]
            )
            reload_all = (full_seq > old or position < old
                          or position - old > INCREMENTAL_LIMIT)
        else:
            _begin, ((position, reload_all, names_seq),), changed_rows = self._run(
                raw, [self._begin_snapshot(), (PG_STATE, (self._snap, self._server)),
                      (PG_CHANGED_IDS, (self._snap,))]
            )
        changed = sorted(int(r[0]) for r in changed_rows)
        if reload_all or len(changed) > _CHANGED_LIMIT:
            self._run(raw, [("ROLLBACK", ())])
            return False
        names = names_seq != self._names_seq
        stmts: list[tuple[str, Sequence[Any]]] = []
        if changed:
            stmts += [
                self._by_ids(_RAW_PROVIDERS, "rp.id", changed),
                self._by_ids(_RAW_INVENTORIES, "resource_provider_id", changed),
                self._by_ids(_RAW_USAGES, "resource_provider_id", changed),
                self._by_ids(_RAW_TRAITS, "rpt.resource_provider_id", changed),
                self._by_ids(_RAW_AGGREGATES, "rpa.resource_provider_id", changed),
            ]
        if names:
            stmts += [(_RAW_TRAIT_NAMES, ()), (_RAW_CLASS_NAMES, ())]
        stmts.append(("COMMIT", ()))
        res = self._run(raw, stmts)
        if not changed:
            res = [[], [], [], [], [], *res]
        rc_by_id = dict(res[6]) if names else self._rc_by_id
        try:
            fresh = self._decode(rc_by_id, *res[:5])
        except KeyError:
            return False  # a class id the cached names do not know
        # Nothing below raises: the cache changes all at once.
        providers, dirty = self._providers, self._dirty
        for rp_id in changed:
            new = fresh.get(rp_id)
            cur = providers.get(rp_id)
            if new is None:
                if cur is not None:
                    del providers[rp_id]
                    if self._ids_by_uuid.get(cur.uuid) == rp_id:
                        del self._ids_by_uuid[cur.uuid]
                    dirty.pop(rp_id, None)
                    self._structural = True
            elif cur is None:
                providers[rp_id] = new
                self._ids_by_uuid[new.uuid] = rp_id
                self._structural = True
            elif new.uuid != cur.uuid:
                # SQLite hands a deleted provider's id to the next new one (its highest
                # rowid is reused): another provider now, not a change of this one.
                providers[rp_id] = new
                if self._ids_by_uuid.get(cur.uuid) == rp_id:
                    del self._ids_by_uuid[cur.uuid]
                self._ids_by_uuid[new.uuid] = rp_id
                dirty.pop(rp_id, None)
                self._structural = True
            elif new != cur:
                providers[rp_id] = new
                dirty[rp_id] = new
        if names:
            self._set_names([r[0] for r in res[5]], res[6], names_seq)
        self._moved_to(position)
        return True

    def _by_ids(self, sql: str, column: str, ids: Sequence[int]) -> tuple[str, Sequence[Any]]:
        """``sql`` (``{}`` marks where a WHERE goes, else at the end) for rows of ``ids``."""
        params: list[Any]
        if self.is_sqlite:
            where, params = f" WHERE {column} IN ({marks(len(ids))})", list(ids)
        else:
            where, params = f" WHERE {column} = ANY(?)", [list(ids)]
        return (sql.format(where) if "{}" in sql else sql + where), params

    def _load_all(self, raw: RawConnection) -> None:
        """Load every provider and name in one snapshot."""
        res = self._run(
            raw,
            [
                self._begin_snapshot(),
                (_RAW_STATE, ()) if self.is_sqlite else (PG_SNAPSHOT, ()),
                (_RAW_PROVIDERS, ()),
                (_RAW_INVENTORIES, ()),
                (_RAW_USAGES.format(""), ()),
                (_RAW_TRAITS, ()),
                (_RAW_AGGREGATES, ()),
                (_RAW_TRAIT_NAMES, ()),
                (_RAW_CLASS_NAMES, ()),
                ("COMMIT", ()),
            ],
        )
        (state,) = res[1]
        position, names_seq = state[0], state[2]
        if not self.is_sqlite:
            self._server = state[3]
            # Every write patched in committed before this snapshot (the lock is held),
            # so none is left to skip; after a failover their ids mean nothing anyway.
            self._own_xids = set()
        providers = self._decode(dict(res[8]), *res[2:7])
        self._providers = providers
        self._ids_by_uuid = {p.uuid: rp_id for rp_id, p in providers.items()}
        self._dirty = {}
        self._structural = True
        self._set_names([r[0] for r in res[7]], res[8], names_seq)
        self._moved_to(position)

    def _set_names(
        self, trait_names: list[str], class_rows: Sequence[Any], names_seq: int
    ) -> None:
        if trait_names != self._trait_names or [r[1] for r in class_rows] != self._class_names:
            self._structural = True
        self._trait_names = trait_names
        self._class_names = [r[1] for r in class_rows]
        self._rc_by_id = {int(r[0]): r[1] for r in class_rows}
        self._names_seq = names_seq
        self._write_rcs = (names_seq, {r[1]: int(r[0]) for r in class_rows})

    @staticmethod
    def _decode(
        rc_by_id: Mapping[int, str],
        prov_rows: Sequence[Any],
        inv_rows: Sequence[Any],
        use_rows: Sequence[Any],
        trait_rows: Sequence[Any],
        agg_rows: Sequence[Any],
    ) -> dict[int, Any]:
        """Engine Provider objects by id from the rows of the ``_RAW_*`` graph queries."""
        from berth.placement import candidates

        invs: dict[int, dict[str, Any]] = defaultdict(dict)
        inventory_cls = candidates.Inventory
        for rp_id, rc_id, total, reserved, min_u, max_u, step, ratio in inv_rows:
            name = rc_by_id[rc_id]
            invs[rp_id][name] = inventory_cls(
                name, total, reserved, min_u, max_u, step, float(ratio)
            )
        usages: dict[int, dict[str, int]] = defaultdict(dict)
        for rp_id, rc_id, used in use_rows:
            usages[rp_id][rc_by_id[rc_id]] = int(used)
        rp_traits: dict[int, set[str]] = defaultdict(set)
        for rp_id, name in trait_rows:
            rp_traits[rp_id].add(name)
        rp_aggs: dict[int, set[str]] = defaultdict(set)
        for rp_id, agg in agg_rows:
            rp_aggs[rp_id].add(agg)
        empty: frozenset[str] = frozenset()
        provider_cls = candidates.Provider
        out = {}
        for rp_id, uuid, name, generation, parent_uuid, root_uuid in prov_rows:
            out[rp_id] = provider_cls(
                uuid,
                name,
                generation,
                parent_uuid,
                root_uuid or uuid,
                invs.get(rp_id, {}),
                usages.get(rp_id, {}),
                frozenset(rp_traits[rp_id]) if rp_id in rp_traits else empty,
                frozenset(rp_aggs[rp_id]) if rp_id in rp_aggs else empty,
            )
        return out
