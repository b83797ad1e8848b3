"""The provider snapshot the allocation-candidate engine searches, with its indexes.

A ``ProviderGraph`` is built once from the store's rows and is immutable afterwards; the
store caches it and rebuilds it only when providers, inventories, usages, traits or
aggregates change. Everything a request needs repeatedly is precomputed here:

* per resource class, NumPy arrays over *all* providers (capacity as a float, used,
  min_unit, max_unit, step_size), so a capacity fit is five vectorized comparisons;
* trait and aggregate posting sets (and lazily cached boolean masks built from them);
* tree membership (root, parent, members of each tree) and the sharing providers with
  their anchors (reference section 5, "anchors of a sharing provider").

Provider indexes follow the order of the ``providers`` iterable, which the store passes
in creation (internal id) order; that order is also the order candidates come out in.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import os_resource_classes

SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"
"""A provider with this trait shares its inventory with the trees of its aggregates."""

MAX_UNIT = 2147483647
"""The API's largest inventory integer; no larger amount can ever fit."""

CUSTOM_CLASS_BASE_ID = 10000
"""Custom resource classes get ids from here on, standard ones 0..20 (reference section 3)."""

_PLAIN = re.compile(r"[0-9A-Za-z_-]*")  # needs no JSON escaping

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Inventory:
    """One inventory record of a provider (reference section 4.3)."""

    resource_class: str
    total: int
    reserved: int
    min_unit: int
    max_unit: int
    step_size: int
    allocation_ratio: float


@dataclass(frozen=True, slots=True)
class Provider:
    """A resource provider as the engine sees it: inventories, usage, traits, aggregates."""

    uuid: str
    name: str
    generation: int
    parent_uuid: str | None
    root_uuid: str
    inventories: Mapping[str, Inventory]
    usages: Mapping[str, int]
    traits: frozenset[str]
    aggregates: frozenset[str]


def capacity_of(inv: Inventory) -> int:
    """Placement's capacity: ``int((total - reserved) * allocation_ratio)``."""
    return int((inv.total - inv.reserved) * inv.allocation_ratio)


@dataclass(slots=True)
class ClassColumns:
    """Per-provider columns of one resource class, over every provider of the graph.

    Providers without inventory of the class get ``cap = -inf`` so that no amount fits.
    ``cap`` is ``(total - reserved) * allocation_ratio`` unrounded: ``used + n <= cap``
    for integers is the same test as against its floor, and matches the reference's SQL.
    """

    cap: FloatArray
    used: IntArray
    min_unit: IntArray
    max_unit: IntArray
    step: IntArray
    #: (largest min_unit, smallest max_unit, largest step) over the providers with an
    #: inventory of the class; computed on first use, kept while inventories are.
    bounds: tuple[int, int, int] | None = None

    def unit_bounds(self) -> tuple[int, int, int]:
        """:attr:`bounds`, computed if needed."""
        if self.bounds is None:
            has = np.isfinite(self.cap)
            if has.any():
                self.bounds = (int(self.min_unit[has].max()), int(self.max_unit[has].min()),
                               int(self.step[has].max()))
            else:
                self.bounds = (0, 0, 1)
        return self.bounds

    def fit_mask(self, amount: int) -> BoolArray:
        """Providers where ``amount`` of this class fits (capacity, min/max unit, step).

        A unit test that every provider with the class passes is skipped (providers
        without it already fail on capacity, which is -inf for them).
        """
        if amount > MAX_UNIT:
            # No max_unit is above MAX_INT, and larger numbers would overflow int64.
            return np.zeros(len(self.cap), dtype=np.bool_)
        mask: BoolArray = self.used + amount <= self.cap
        largest_min, smallest_max, largest_step = self.unit_bounds()
        if largest_min > amount:
            mask &= self.min_unit <= amount
        if smallest_max < amount:
            mask &= self.max_unit >= amount
        if largest_step > 1:
            mask &= amount % self.step == 0
        return mask


@dataclass(slots=True)
class _Caches:
    """Lazily filled, request-independent derived data (guarded by a lock)."""

    trait_masks: dict[str, BoolArray] = field(default_factory=dict)
    agg_masks: dict[str, BoolArray] = field(default_factory=dict)
    summaries: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    fragments: dict[str, tuple[Any, ...]] = field(default_factory=dict)


def ordered_traits(graph: ProviderGraph, traits: Iterable[str]) -> list[str]:
    """A provider's traits in the store's order (:attr:`ProviderGraph.trait_rank`);
    names the graph does not rank go last, by name."""
    rank = graph.trait_rank
    last = len(rank)
    return sorted(traits, key=lambda t: (rank.get(t, last), t))


class ProviderGraph:
    """An immutable snapshot of providers plus the indexes the candidate search needs.

    ``traits`` and ``resource_classes`` are every known name (standard and custom); they
    decide the "No such trait(s)" and "No such resource class" 400s, independently of
    whether any provider uses the name.
    """

    def __init__(
        self,
        providers: Iterable[Provider],
        traits: Iterable[str],
        resource_classes: Iterable[str],
        ids: Iterable[int] | None = None,
    ) -> None:
        self.providers: tuple[Provider, ...] = tuple(providers)
        #: Each provider's internal id in the store (creation order; 1, 2, ... when the
        #: caller has none): Placement's answer order derives from them
        #: (:mod:`berth.placement.candidates_order`).
        self.ids: list[int] = (list(ids) if ids is not None
                               else list(range(1, len(self.providers) + 1)))
        trait_names = list(traits)
        #: Every known trait, in the store's (trait id) order.
        self.trait_names: list[str] = trait_names
        self.known_traits: frozenset[str] = frozenset(trait_names)
        #: Each trait's position in the store (trait id order: the standard traits,
        #: then custom ones as they were created), the order Placement lists a
        #: provider's traits in.
        self.trait_rank: dict[str, int] = {name: i for i, name in enumerate(trait_names)}
        class_names = list(resource_classes)
        self._class_names = class_names
        self.known_classes: frozenset[str] = frozenset(class_names)
        n = len(self.providers)
        self.size = n
        self.uuids: list[str] = [p.uuid for p in self.providers]
        self.index: dict[str, int] = {u: i for i, u in enumerate(self.uuids)}
        # JSON string literals of the uuids, for the pre-encoded response path. Store
        # uuids never need escaping; one regex over all of them checks that at C speed.
        if _PLAIN.fullmatch("".join(self.uuids)):
            self.uuid_json: list[str] = [f'"{u}"' for u in self.uuids]
        else:
            self.uuid_json = [json.dumps(u) for u in self.uuids]

        # One pass over the providers collects everything below; the graph is rebuilt
        # after every change, so this constructor is on the scheduling path too.
        index = self.index
        root: list[int] = []
        parent: list[int | None] = []
        by_trait: dict[str, list[int]] = {}
        by_agg: dict[str, list[int]] = {}
        per_class: dict[str, list[tuple[float, ...]]] = {}
        for i, p in enumerate(self.providers):
            # A root_uuid that names no provider in the snapshot (not expected from a
            # consistent store) makes the provider its own root.
            root.append(index.get(p.root_uuid, i))
            parent.append(index.get(p.parent_uuid) if p.parent_uuid else None)
            for t in p.traits:
                by_trait.setdefault(t, []).append(i)
            for a in p.aggregates:
                by_agg.setdefault(a, []).append(i)
            usages = p.usages
            for rc, v in p.inventories.items():
                per_class.setdefault(rc, []).append(
                    (
                        i,
                        v.total,
                        v.reserved,
                        v.allocation_ratio,
                        v.min_unit,
                        v.max_unit,
                        v.step_size,
                        usages.get(rc, 0),
                    )
                )

        # Resource class ids order the classes inside a combination (reference 5, step 4):
        # standard classes in the library's order, custom ones in the order given (the
        # store passes them in id order), then any class only an inventory mentions.
        self.class_id: dict[str, int] = {
            name: i for i, name in enumerate(os_resource_classes.STANDARDS)
        }
        for name in [*class_names, *per_class]:
            if name not in self.class_id:
                self.class_id[name] = CUSTOM_CLASS_BASE_ID + len(self.class_id)

        # Tree structure.
        self.root: list[int] = root
        self.parent: list[int | None] = parent
        self.root_array: IntArray = np.asarray(root, dtype=np.int64).reshape(n)
        self.has_trees: bool = any(par is not None for par in parent)
        self.tree_members: dict[int, list[int]] = {}
        if self.has_trees:
            for i, r in enumerate(root):
                self.tree_members.setdefault(r, []).append(i)
        else:
            self.tree_members = {i: [i] for i in range(n)}
        self.is_root_mask: BoolArray = np.asarray(
            [par is None for par in parent], dtype=np.bool_
        ).reshape(n)

        # Posting sets: trait / aggregate name -> provider indexes holding it directly.
        self.by_trait: dict[str, frozenset[int]] = {k: frozenset(v) for k, v in by_trait.items()}
        self.by_agg: dict[str, frozenset[int]] = {k: frozenset(v) for k, v in by_agg.items()}

        # Sharing providers and their anchors: the roots of every provider with at least
        # one aggregate in common (which includes the sharing provider's own root).
        self.sharing: frozenset[int] = self.by_trait.get(SHARING_TRAIT, frozenset())
        self.sharing_anchors: dict[int, tuple[int, ...]] = {}
        for s in sorted(self.sharing):
            roots = {root[s]}
            for agg in self.providers[s].aggregates:
                roots.update(root[j] for j in self.by_agg[agg])
            self.sharing_anchors[s] = tuple(sorted(roots))

        # Per-class columns over all providers, from one 2-D array per class (float64
        # holds every inventory integer exactly: they are at most 2**31 - 1).
        self.columns: dict[str, ClassColumns] = {}
        for rc, rows in per_class.items():
            table = np.array(rows, dtype=np.float64).reshape(len(rows), 8)
            idx = table[:, 0].astype(np.int64)
            cap = np.full(n, -np.inf, dtype=np.float64)
            cap[idx] = (table[:, 1] - table[:, 2]) * table[:, 3]
            used = np.zeros(n, dtype=np.int64)
            used[idx] = table[:, 7]
            min_unit = np.zeros(n, dtype=np.int64)
            min_unit[idx] = table[:, 4]
            max_unit = np.zeros(n, dtype=np.int64)
            max_unit[idx] = table[:, 5]
            step = np.ones(n, dtype=np.int64)
            step[idx] = np.maximum(table[:, 6], 1)
            self.columns[rc] = ClassColumns(cap, used, min_unit, max_unit, step)

        self._caches = _Caches()
        self._lock = threading.Lock()

    # -- lookups -------------------------------------------------------------------------

    def fits(self, i: int, rc: str, amount: int) -> bool:
        """Scalar capacity fit of ``amount`` of ``rc`` on provider ``i``."""
        inv = self.providers[i].inventories.get(rc)
        if inv is None:
            return False
        used = self.providers[i].usages.get(rc, 0)
        return (
            used + amount <= (inv.total - inv.reserved) * inv.allocation_ratio
            and inv.min_unit <= amount <= inv.max_unit
            and amount % max(inv.step_size, 1) == 0
        )

    def fit_mask(self, rc: str, amount: int) -> BoolArray:
        """Boolean mask over all providers where ``amount`` of ``rc`` fits."""
        cols = self.columns.get(rc)
        if cols is None:
            return np.zeros(self.size, dtype=np.bool_)
        return cols.fit_mask(amount)

    def trait_mask(self, trait: str) -> BoolArray:
        """Boolean mask of the providers that have ``trait`` themselves (cached)."""
        mask = self._caches.trait_masks.get(trait)
        if mask is None:
            mask = self._mask_of(self.by_trait.get(trait, frozenset()))
            with self._lock:
                self._caches.trait_masks[trait] = mask
        return mask

    def agg_mask(self, agg: str) -> BoolArray:
        """Boolean mask of the providers directly linked to aggregate ``agg`` (cached)."""
        mask = self._caches.agg_masks.get(agg)
        if mask is None:
            mask = self._mask_of(self.by_agg.get(agg, frozenset()))
            with self._lock:
                self._caches.agg_masks[agg] = mask
        return mask

    def _mask_of(self, members: frozenset[int]) -> BoolArray:
        mask = np.zeros(self.size, dtype=np.bool_)
        if members:
            mask[np.fromiter(members, dtype=np.int64, count=len(members))] = True
        return mask

    def is_ancestor_or_self(self, ancestor: int, node: int) -> bool:
        """True when ``ancestor`` is ``node`` or one of its parents, transitively."""
        cur: int | None = node
        # Bounded walk: a (never expected) parent cycle in the snapshot must not hang us.
        for _ in range(self.size + 1):
            if cur is None:
                return False
            if cur == ancestor:
                return True
            cur = self.parent[cur]
        return False

    def cached_summaries(self, key: str) -> list[dict[str, Any]] | None:
        """Per-provider summary dicts cached under ``key`` (None when not built yet)."""
        return self._caches.summaries.get(key)

    def store_summaries(self, key: str, rows: list[dict[str, Any]]) -> None:
        """Cache per-provider summary dicts under ``key``; they are never mutated later."""
        with self._lock:
            self._caches.summaries[key] = rows

    def with_updates(self, changed: Iterable[Provider]) -> ProviderGraph:
        """A new graph with ``changed`` providers replaced (by uuid) or added.

        The scheduling loop changes usages far more often than anything else. When the
        changed providers keep their tree position, traits, aggregates and set of
        inventory classes, the new graph shares every index with this one and only
        patches the capacity columns and the per-provider caches of those providers:
        O(changed) work plus a copy of the touched columns. Anything else (a new
        provider, a moved one, a trait, aggregate or class added or removed) rebuilds
        the whole graph. This graph is left untouched either way.
        """
        providers = list(self.providers)
        structural = False
        positions: list[int] = []
        ids = list(self.ids)
        for p in changed:
            i = self.index.get(p.uuid)
            if i is None:
                providers.append(p)
                ids.append(max(ids, default=0) + 1)
                structural = True
                continue
            old = providers[i]
            if (
                old.parent_uuid != p.parent_uuid
                or old.root_uuid != p.root_uuid
                or old.traits != p.traits
                or old.aggregates != p.aggregates
                or old.inventories.keys() != p.inventories.keys()
            ):
                structural = True
            providers[i] = p
            positions.append(i)
        if structural:
            return ProviderGraph(providers, self.trait_names, self._class_names, ids)

        new = object.__new__(ProviderGraph)
        new.__dict__.update(self.__dict__)
        new.providers = tuple(providers)
        new.columns = dict(self.columns)
        touched = {rc for i in positions for rc in providers[i].inventories}
        for rc in touched:
            old_cols = self.columns[rc]
            # A claim changes usage only: then the other columns are shared, not copied
            # (five 10,000-row copies per class per claim cost more than the search).
            same_inventory = all(
                self.providers[i].inventories.get(rc) == providers[i].inventories.get(rc)
                for i in positions
            )
            if same_inventory:
                cols = ClassColumns(
                    old_cols.cap, old_cols.used.copy(), old_cols.min_unit, old_cols.max_unit,
                    old_cols.step, old_cols.bounds,
                )
            else:
                cols = ClassColumns(
                    old_cols.cap.copy(),
                    old_cols.used.copy(),
                    old_cols.min_unit.copy(),
                    old_cols.max_unit.copy(),
                    old_cols.step.copy(),
                )
            for i in positions:
                v = providers[i].inventories.get(rc)
                if v is None:
                    continue
                cols.used[i] = providers[i].usages.get(rc, 0)
                if not same_inventory:
                    cols.cap[i] = (v.total - v.reserved) * v.allocation_ratio
                    cols.min_unit[i] = v.min_unit
                    cols.max_unit[i] = v.max_unit
                    cols.step[i] = max(v.step_size, 1)
            new.columns[rc] = cols
        # Trait and aggregate masks are unchanged (and so shareable); per-provider
        # fragments ("provider:" keys) are reset for the changed providers only; whole
        # summary rows are dropped and rebuilt lazily.
        fragments: dict[str, tuple[Any, ...]] = {}
        for key, value in self._caches.fragments.items():
            if key.startswith("provider:"):
                arrays = tuple(a.copy() for a in value)
                for a in arrays:
                    # Object arrays hold the fragments, boolean ones say "built".
                    a[positions] = False if a.dtype == np.bool_ else None
                fragments[key] = arrays
            else:
                fragments[key] = value
        new._caches = _Caches(
            trait_masks=self._caches.trait_masks,
            agg_masks=self._caches.agg_masks,
            fragments=fragments,
        )
        new._lock = threading.Lock()
        return new

    def cached_fragments(self, key: str) -> tuple[Any, ...] | None:
        """Per-provider pre-encoded JSON summaries cached under ``key`` (None if absent)."""
        return self._caches.fragments.get(key)

    def store_fragments(self, key: str, fragments: tuple[Any, ...]) -> None:
        """Cache per-provider pre-encoded JSON summaries under ``key``."""
        with self._lock:
            self._caches.fragments[key] = fragments
