"""Placement's gathering of one group's providers, replayed with the same Python sets.

For the unsuffixed group over provider trees or sharing providers, Placement
(``get_trees_matching_all``) gathers ``(id, root id, class id)`` triples class by class
in sets: each class's providers with room paired with their root, plus every sharing
provider with room paired with each anchor it serves (``anchors_for_sharing_providers``),
narrowed to the roots ``root_required`` allows, to ``member_of`` (the provider or its
root in the aggregates) and away from forbidden aggregates (neither in one), then united
with the classes before and cut to the trees both have; with trait filters and no
sharing provider in the request, cut at the end to the trees whose providers (those
without a forbidden trait) together have every required trait. It then walks that set
tree by tree (first seen first) to form the group's requests.

The iteration order of that set decides two things this module's callers need:

* the order Placement forms the requests in (:mod:`~berth.placement.candidates_order`);
* with sharing providers, which anchor keeps a request made only of sharing providers:
  Placement collects one group's requests in a set, where such a request (equal at
  every anchor it serves) stays with the first tree that formed it
  (:mod:`~berth.placement.candidates_search`).

Each step here is the same set operation on the same tuples (internal ids are ints,
and the uuids hash as Placement's do under the same ``PYTHONHASHSEED``), so the same set
comes out. One input is the database's: the rows of ``anchors_for_sharing_providers``,
taken here in the order SQLite returns them when providers joined each aggregate in id
order (by sharing provider id, then aggregate, then member provider id).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from berth.placement.candidates_graph import BoolArray, IntArray, ProviderGraph
from berth.placement.candidates_query import RequestGroup

#: One gathered triple: (provider id, root or anchor id, class id).
Triple = tuple[int, int, int]


class WalkFilters(NamedTuple):
    """What narrows the gathering besides room, as provider masks: the roots
    ``root_required`` allows, the providers in ``member_of``'s aggregates, those in a
    forbidden aggregate, per any-of set of required traits the providers with one of
    them, and those with a forbidden trait (None: not asked)."""

    anchors: BoolArray | None
    member: BoolArray | None
    bad_aggs: BoolArray | None
    required: tuple[BoolArray, ...]
    forbidden: BoolArray | None


def any_mask(graph: ProviderGraph, mask_of: Callable[[str], BoolArray],
             names: Iterable[str]) -> BoolArray:
    """The providers ``mask_of`` marks for any of ``names``."""
    hit = np.zeros(graph.size, dtype=np.bool_)
    for name in names:
        hit |= mask_of(name)
    return hit


def member_of_mask(graph: ProviderGraph, group: RequestGroup) -> BoolArray:
    """Providers directly in the group's member_of aggregates (AND of any-of sets)."""
    mask = np.ones(graph.size, dtype=np.bool_)
    for any_of in group.member_of:
        mask &= any_mask(graph, graph.agg_mask, any_of)
    return mask


def walk_filters(graph: ProviderGraph, group: RequestGroup,
                 allowed: BoolArray | None) -> WalkFilters | None:
    """``group``'s :class:`WalkFilters` with ``allowed`` (the roots ``root_required``
    allows), or None when it has none."""
    if allowed is None and not (group.member_of or group.forbidden_aggs or group.required
                                or group.forbidden):
        return None
    member = member_of_mask(graph, group) if group.member_of else None
    bad_aggs = any_mask(graph, graph.agg_mask, group.forbidden_aggs) if group.forbidden_aggs \
        else None
    required = tuple(any_mask(graph, graph.trait_mask, any_of) for any_of in group.required)
    forbidden = any_mask(graph, graph.trait_mask, group.forbidden) if group.forbidden else None
    return WalkFilters(allowed, member, bad_aggs, required, forbidden)


def id_arrays(graph: ProviderGraph) -> tuple[IntArray, IntArray]:
    """The providers' internal ids and each one's root (as a position), as arrays
    (kept on the graph: neither changes while a graph only has its usages patched)."""
    cached = graph.cached_fragments("order:ids")
    if cached is None:
        cached = (np.asarray(graph.ids, dtype=np.int64), np.asarray(graph.root, dtype=np.int64))
        graph.store_fragments("order:ids", cached)
    return cached[0], cached[1]


def positions_by_id(graph: ProviderGraph) -> dict[int, int]:
    """Each provider's position by its internal id (kept on the graph, as
    :func:`id_arrays`)."""
    cached = graph.cached_fragments("order:by_id")
    if cached is None:
        cached = (dict(zip(graph.ids, range(graph.size))),)
        graph.store_fragments("order:by_id", cached)
    return cached[0]  # type: ignore[no-any-return]


def anchor_rows(graph: ProviderGraph, shared: Iterable[int]) -> set[tuple[int, str, int, str]]:
    """``anchors_for_sharing_providers`` of the sharing providers ``shared``
    (positions): the set of ``(id, uuid, anchor root id, anchor uuid)`` rows, filled in
    the order the database returns them (see the module's docstring)."""
    ids, uuids, root = graph.ids, graph.uuids, graph.root
    rows = []
    for s in sorted(shared, key=ids.__getitem__):
        aggs = sorted(graph.providers[s].aggregates,
                      key=lambda a: (min(ids[j] for j in graph.by_agg[a]), a))
        for agg in aggs:
            for m in sorted(graph.by_agg[agg], key=ids.__getitem__):
                r = root[m]
                rows.append((ids[s], uuids[s], ids[r], uuids[r]))
    return set(rows)


def copy_anchors(graph: ProviderGraph, p: int) -> list[int]:
    """The anchors (positions) a sharing provider's request is copied to by a group of
    one provider, in Placement's order: the iteration of its :func:`anchor_rows`, less
    its own root (whose request comes first)."""
    by_id = positions_by_id(graph)
    own = graph.ids[graph.root[p]]
    return [by_id[row[2]] for row in anchor_rows(graph, [p]) if row[2] != own]


def gather(graph: ProviderGraph, group: RequestGroup, allowed: BoolArray | None,
           sharing: Iterable[int]) -> set[Triple] | None:
    """Placement's set of ``(id, root or anchor id, class id)`` triples for ``group``
    (see the module's docstring); ``sharing``: the request's sharing providers
    (positions) as the groups before narrowed them (``group``'s own ``member_of``
    narrows them further). None when ``in_tree`` names no provider; an empty set when a
    class has no provider left."""
    root, class_id = graph.root, graph.class_id
    tree: int | None = None
    if group.in_tree is not None:
        if group.in_tree not in graph.index:
            return None
        tree = root[graph.index[group.in_tree]]
    id_array, root_array = id_arrays(graph)
    filters = walk_filters(graph, group, allowed)
    sharing = list(sharing)

    def id_set(mask: BoolArray | None) -> set[int] | None:
        return None if mask is None else set(id_array[np.flatnonzero(mask)].tolist())

    anchor_ids, member_ids, bad_ids = (None, None, None) if filters is None else \
        (id_set(filters.anchors), id_set(filters.member), id_set(filters.bad_aggs))
    if filters is not None and filters.member is not None:
        # The request-wide set, narrowed in place to member_of (a quirk).
        sharing = [s for s in sharing if filters.member[s]]
    found: set[Triple] = set()
    for rc, amount in group.resources.items():
        fit = graph.fit_mask(rc, amount)
        if tree is not None:
            fit &= graph.root_array == tree
        at = fit.nonzero()[0]
        pairs = set(zip(id_array[at].tolist(), id_array[root_array[at]].tolist()))
        cid = class_id[rc]
        with_class: set[Triple] = set()
        with_class |= set((a, b, cid) for a, b in pairs)
        shared = [s for s in sharing if fit[s]] if tree is None else []
        if shared:
            rows = anchor_rows(graph, shared)
            served = set((row[0], row[2]) for row in rows)
            with_class |= set((a, b, cid) for a, b in served)
        if anchor_ids:
            with_class = set(t for t in with_class if t[1] in anchor_ids)
        if member_ids is not None:
            with_class = set(t for t in with_class if t[0] in member_ids or t[1] in member_ids)
        if bad_ids is not None:
            with_class = set(t for t in with_class
                             if not (t[0] in bad_ids or t[1] in bad_ids))
        if not with_class:
            return set()
        if not found:
            found = with_class
        else:
            common = {t[1] for t in found} & {t[1] for t in with_class}
            found |= with_class
            found = set(t for t in found if t[1] in common)
    if filters is not None and (filters.required or filters.forbidden is not None) \
            and not sharing:
        kept = _trait_trees(graph, found, filters)
        found = set(t for t in found if (t[0], t[1]) in kept)
    return found


def tree_sequence(graph: ProviderGraph, found: Iterable[Triple]) -> dict[int, dict[int, list[int]]]:
    """The gathered providers by tree (anchor position, first seen first) and class id
    (first seen first), as positions: what Placement's walk forms each tree's requests
    from (the classes then in id order)."""
    by_id = positions_by_id(graph)
    per_tree: dict[int, dict[int, list[int]]] = {}
    for rp_id, root_id, rc_id in found:
        per_tree.setdefault(by_id[root_id], {}).setdefault(rc_id, []).append(by_id[rp_id])
    return per_tree


def _trait_trees(graph: ProviderGraph, found: set[Triple],
                 filters: WalkFilters) -> set[tuple[int, int]]:
    """The ``(id, root id)`` pairs of the gathered providers whose tree may meet the
    trait filters (``_get_trees_with_traits``): with required traits, the trees whose
    gathered providers without a forbidden trait have, together, one of each any-of
    set; without, the trees with one such provider."""
    by_id = positions_by_id(graph)
    id_array, root_array = id_arrays(graph)
    rps = {t[0] for t in found}
    at = np.fromiter((by_id[i] for i in rps), dtype=np.int64, count=len(rps))
    roots = id_array[root_array[at]]
    good = np.ones(len(at), dtype=np.bool_) if filters.forbidden is None \
        else ~filters.forbidden[at]
    if filters.required:
        ok = np.ones(len(at), dtype=np.bool_)
        for hit in filters.required:
            ok &= np.isin(roots, np.unique(roots[good & hit[at]]))
    else:
        ok = np.isin(roots, np.unique(roots[good]))
    return set(zip(id_array[at[ok]].tolist(), roots[ok].tolist()))
