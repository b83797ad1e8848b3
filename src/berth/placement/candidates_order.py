"""The order Placement answers allocation candidates in, so that ``limit`` keeps the
same first N (reference section 4.12, "limit").

Placement gathers the allocation requests of a query in Python sets and answers
``list(that set)``, truncated to ``limit``. Its order is therefore the iteration order
of a set of allocation requests, each hashed as the tuple of its ``(provider id,
resource class, amount)`` hashes sorted by hash. Python salts the hash of a string per
process (``PYTHONHASHSEED``), so each Placement process answers a truncated query with
its own arbitrary, not provider-order, subset: neither the oldest providers nor the
newest are favoured.

Berth is Python too: it computes the very same hashes (from the providers' internal
ids) and replays the set insertions Placement makes, in the order Placement's queries
yield the requests:

* flat (one group, no trees, no sharing): Placement walks its set of ``(id, root id)``
  pairs of the providers with room for the group's last class, and collects the
  qualifying providers' requests in the answer's set;
* the unsuffixed group over provider trees or sharing providers: Placement gathers
  ``(id, root id, class id)`` triples in sets class by class (sharing providers paired
  with each anchor they serve; narrowed by ``root_required``, ``member_of`` and
  forbidden aggregates, cut to the trees every class has, and at the end to the trees
  that meet the trait filters), walks them tree by tree, forms each tree's combinations
  in product order (classes by id) into a set per tree, unions those into the group's
  set (a request of sharing providers alone stays with the first tree), and the merge
  walks that set anchor by anchor into the answer's set. Berth replays each step with
  the same tuples (:mod:`~berth.placement.candidates_gather`), so the same sets come
  out;
* several groups (numbered groups, with or without the unsuffixed one, ``same_subtree``,
  resourceless groups, sharing providers): Placement lists each group's own requests
  (a numbered group in the walk above, a sharing provider's request followed by its
  copies at its other anchors; a resourceless group in the walk of the providers that
  meet its filters; the unsuffixed group in the iteration of its set), files them by
  anchor, first seen first, and adds each anchor's product of lists (less what
  ``group_policy``, ``same_subtree`` and capacity refuse; an equal request formed
  again is not added again) to the answer's set; Berth forms the same sequence.

Sharing providers' anchors come from a database join
(``anchors_for_sharing_providers``): its rows are taken in the order SQLite returns
them when providers joined each aggregate in id order; when they joined in another
order Placement's own order depends on its database's row order and Berth's may differ
in a few places (the same requests either way).

Two processes started with the same ``PYTHONHASHSEED`` keep the same N (the suite
checks this against Placement 16 itself); with random seeds Berth's N is as arbitrary
as Placement's. Only truncation uses this order: without ``limit`` the list stays in
provider order (the set of requests is the same either way).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from berth.placement.candidates_gather import (
    copy_anchors,
    gather,
    id_arrays,
    tree_sequence,
    walk_filters,
)
from berth.placement.candidates_graph import ProviderGraph
from berth.placement.candidates_query import RequestGroup
from berth.placement.candidates_search import MergeTrace, group_mask


class _Hashed:
    """An object whose hash is a given value (a stand-in for one of Placement's
    objects in a tuple or a set); equal only to itself, as distinct requests are."""

    __slots__ = ("value", "index")

    def __init__(self, value: int, index: int = -1) -> None:
        self.value = value
        self.index = index

    def __hash__(self) -> int:
        return self.value

    def __eq__(self, other: object) -> bool:
        return self is other


def request_hash(rows: Iterable[tuple[int, str, int]]) -> int:
    """The hash of an allocation request made of ``(provider id, class, amount)`` rows,
    as Placement's ``AllocationRequest.__hash__`` computes it."""
    return hash(tuple(_Hashed(h) for h in sorted(hash(row) for row in rows)))


def set_order(hashes: Sequence[int], sequence: Iterable[int]) -> list[int]:
    """The positions of ``sequence`` in the order a Python set filled in that order
    iterates them (``hashes[i]`` is the hash of item ``i``)."""
    filled = set()
    for i in sequence:
        filled.add(_Hashed(hashes[i], i))
    return [item.index for item in filled]


class _OrderCache:
    """The latest few orders, by everything they depend on (thread-safe LRU)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._orders: OrderedDict[tuple[object, ...], list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[object, ...]) -> list[int] | None:
        with self._lock:
            found = self._orders.get(key)
            if found is not None:
                self._orders.move_to_end(key)
            return found

    def put(self, key: tuple[object, ...], order: list[int]) -> None:
        with self._lock:
            self._orders[key] = order
            while len(self._orders) > self.size:
                self._orders.popitem(last=False)

    def __len__(self) -> int:
        return len(self._orders)

    def clear(self) -> None:
        with self._lock:
            self._orders.clear()


#: The latest flat orders (see :func:`flat_order`) and tree orders (:func:`tree_order`).
_FLAT_ORDERS = _OrderCache(8)
_TREE_ORDERS = _OrderCache(8)
#: The latest lists of one group's requests in a merge of several (:func:`merged_order`).
_GROUP_ORDERS = _OrderCache(16)


def flat_order(graph: ProviderGraph, providers: Sequence[int] | npt.NDArray[np.int64],
               resources: dict[str, int],
               last_class_fit: Sequence[int] | npt.NDArray[np.int64],
               cap: int | None = None, *, keep: int | None = None) -> list[int]:
    """Placement's order of a flat answer: positions into ``providers`` (the first
    ``keep`` of them when given: what a ``limit`` keeps).

    Placement walks the providers in the order of its set of ``(id, root id)`` pairs of
    those with room for the group's *last* class (``last_class_fit``, in id order),
    keeps those that qualify, and collects their requests in the answer's set (only the
    first ``cap`` it forms: ``max_allocation_candidates``). The hashes are computed for
    all providers at once (:func:`tuple_hashes`).

    The order depends only on the ids of the providers walked and chosen, the amounts
    and ``cap``; successive requests of one flavor nearly always share them (a claim
    rarely takes a host out of either set), so the last few orders are kept by those
    inputs (at 10,000 providers an order costs ~20 ms, most of a scheduler's request)."""
    ids, roots = id_arrays(graph)
    fit = np.asarray(last_class_fit, dtype=np.int64)
    chosen = np.asarray(providers, dtype=np.int64)
    fit_ids, fit_roots, mine = ids[fit], ids[roots[fit]], ids[chosen]
    key = (fit_ids.tobytes(), fit_roots.tobytes(), mine.tobytes(),
           tuple(resources.items()), cap)
    found = _FLAT_ORDERS.get(key)
    if found is not None:
        return found[:keep]
    walk = fit[_pair_walk(fit_ids, fit_roots)]
    position = np.full(graph.size, -1, dtype=np.int64)
    position[chosen] = np.arange(len(chosen))
    sequence = position[walk]
    sequence = sequence[sequence >= 0][:cap].tolist()
    lanes = [tuple_hashes([mine, np.full(len(mine), hash(rc), dtype=np.int64),
                           np.full(len(mine), n, dtype=np.int64)])
             for rc, n in resources.items()]
    ordered = np.sort(np.stack(lanes, axis=1), axis=1)
    hashes = tuple_hashes([ordered[:, k] for k in range(ordered.shape[1])]).tolist()
    order = set_order(hashes, sequence)
    _FLAT_ORDERS.put(key, order)
    return order[:keep]


_XXPRIME_1 = np.uint64(11400714785074694791)
_XXPRIME_2 = np.uint64(14029467366897019727)
_XXPRIME_5 = np.uint64(2870177450012600261)


def tuple_hashes(lanes: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """``hash(tuple)`` of many equal-length tuples at once, from their items' hashes
    (``lanes[k][i]`` is the hash of item ``k`` of tuple ``i``): CPython's tuple hash
    (xxHash's round on 64-bit lanes), as ``hash((a, b, c))`` computes it. Small ints
    hash to themselves, so ids and amounts are their own lanes."""
    acc = np.full(len(lanes[0]), _XXPRIME_5, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for lane in lanes:
            acc = acc + lane.astype(np.uint64) * _XXPRIME_2
            acc = (acc << np.uint64(31)) | (acc >> np.uint64(33))
            acc = acc * _XXPRIME_1
        acc = acc + (np.uint64(len(lanes)) ^ (_XXPRIME_5 ^ np.uint64(3527539)))
    out = acc.view(np.int64).copy()
    out[out == -1] = 1546275796
    return out


def _pair_walk(ids: npt.NDArray[np.int64], roots: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Positions into ``ids`` in the order Placement walks its set of ``(id, root id)``
    pairs: its own objects (tuples of two ints) in a set, so no stand-in is needed."""
    pairs = list(zip(ids.tolist(), roots.tolist()))
    at = dict(zip(pairs, range(len(pairs))))
    return np.fromiter(map(at.__getitem__, set(pairs)), dtype=np.int64, count=len(pairs))


def general_order(graph: ProviderGraph, amounts: Sequence[dict[int, dict[str, int]]],
                  group: RequestGroup, cap: int | None = None, *,
                  by_class: Sequence[tuple[int, ...]] | None = None,
                  allowed: npt.NDArray[np.bool_] | None = None) -> list[int]:
    """Placement's order of the general path's answer to one ``group`` without sharing
    providers (``amounts`` per candidate, in the engine's order; several groups and
    sharing providers take :func:`general_merged_order`): positions into it. The merge
    stops after ``cap`` requests (``max_allocation_candidates``). ``by_class``, when
    the engine knows it: each request's provider per class of ``group``, in class id
    order (then the hashes and the walk are computed from it as arrays). ``allowed``:
    the roots ``root_required`` allows (None: no ``root_required``)."""
    combos = _combos(graph, group, by_class, len(amounts))
    root = graph.root
    if combos is not None:
        hashes = _combo_hashes(graph, group, combos)
        anchors = np.asarray(root, dtype=np.int64)[combos[:, 0]].tolist()
    else:
        hashes = request_hashes(graph, amounts)
        anchors = [root[next(iter(a))] for a in amounts]
    walk = None
    if _walks_trees(graph, group):
        keys = list(by_class) if combos is not None and by_class is not None \
            else _class_keys(graph, group, amounts)
        walk = _tree_walk(graph, group, keys, allowed)
    elif group.suffix and group.resources and amounts and all(len(a) == 1 for a in amounts):
        providers = np.fromiter((next(iter(a)) for a in amounts), dtype=np.int64,
                                count=len(amounts))
        return _single_provider_order(graph, group, providers[:, None],
                                      np.asarray(anchors, dtype=np.int64), hashes, cap)
    return _answer_order(hashes, anchors, walk, len(amounts), cap)


def tree_order(graph: ProviderGraph, group: RequestGroup, combos: npt.NDArray[np.int64],
               anchors: npt.NDArray[np.int64], cap: int | None = None, *,
               keep: int | None = None,
               allowed: npt.NDArray[np.bool_] | None = None) -> list[int]:
    """:func:`general_order` of a tree result kept as arrays (one provider per class of
    ``group`` per request, ``combos`` with columns in class id order, at ``anchors``):
    positions into it, the first ``keep`` of them when given.

    The order depends only on the ids of the providers with room for each class and
    those the walk's filters mark (``allowed``: the roots ``root_required`` allows),
    those of the requests' providers, the amounts and ``cap``; as for
    :func:`flat_order`, successive requests of one flavor nearly always share them, so
    the last few orders are kept by those inputs."""
    ids, roots = id_arrays(graph)
    classes = sorted(group.resources, key=lambda rc: graph.class_id[rc])
    fits = []
    tree = _in_tree_root(graph, group)
    for rc in classes:
        fit = graph.fit_mask(rc, group.resources[rc])
        if tree is not None:
            fit = fit & (graph.root_array == tree)
        at = np.flatnonzero(fit)
        fits.append((ids[at].tobytes(), ids[roots[at]].tobytes()))
    walks = _walks_trees(graph, group)  # a numbered group's requests are never walked
    key = (ids[combos].tobytes(), combos.shape, tuple((rc, group.resources[rc]) for rc in classes),
           tuple(fits), group.in_tree, walks, cap,
           _filters_key(graph, group, allowed) if walks else ())
    found = _TREE_ORDERS.get(key)
    if found is None:
        hashes = _combo_hashes(graph, group, combos)
        if walks:
            walk = _tree_walk(graph, group, list(map(tuple, combos.tolist())), allowed)
            found = _answer_order(hashes, anchors.tolist(), walk, len(combos), cap)
        elif group.suffix:
            found = _single_provider_order(graph, group, combos, anchors, hashes, cap)
        else:
            found = _answer_order(hashes, anchors.tolist(), None, len(combos), cap)
        _TREE_ORDERS.put(key, found)
    return found[:keep]


def _single_provider_order(graph: ProviderGraph, group: RequestGroup,
                           combos: npt.NDArray[np.int64], anchors: npt.NDArray[np.int64],
                           hashes: Sequence[int], cap: int | None) -> list[int]:
    """Placement's order of a numbered group's requests (one provider each, its
    single-provider path, as :func:`flat_order` for the unnumbered group of a flat
    cloud): formed as a list in the order of its set of ``(id, root id)`` pairs of the
    providers with room for the group's last class, gathered by anchor (first seen
    first) and added to the answer's set."""
    ids, roots = id_arrays(graph)
    last_rc, amount = list(group.resources.items())[-1]
    fit = graph.fit_mask(last_rc, amount)
    tree = _in_tree_root(graph, group)
    if tree is not None:
        fit = fit & (graph.root_array == tree)
    at = np.flatnonzero(fit)
    walk = at[_pair_walk(ids[at], ids[roots[at]])]
    position = np.full(graph.size, -1, dtype=np.int64)
    position[combos[:, 0]] = np.arange(len(combos))
    sequence = position[walk]
    sequence = sequence[sequence >= 0]
    if len(sequence) != len(combos):  # not that shape after all: the engine's order
        return _answer_order(hashes, anchors.tolist(), None, len(combos), cap)
    by_anchor: dict[int, list[int]] = {}
    for i in sequence.tolist():
        by_anchor.setdefault(int(anchors[i]), []).append(i)
    return set_order(hashes, [i for members in by_anchor.values() for i in members][:cap])


def merged_order(graph: ProviderGraph, combos: npt.NDArray[np.int64], classes: Sequence[str],
                 amounts: Sequence[int], anchors: npt.NDArray[np.int64],
                 cap: int | None = None, *, keep: int | None = None,
                 groups: Sequence[RequestGroup],
                 parts: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
                 picks: npt.NDArray[np.int64],
                 allowed: npt.NDArray[np.bool_] | None = None) -> list[int]:
    """Placement's order of several groups' requests kept as arrays (provider
    ``combos[i, c]`` gives ``amounts[c]`` of ``classes[c]``; amounts of one provider and
    class add up), at ``anchors``: positions into them, the first ``keep`` when given.

    Placement lists each group's own requests (``parts``: a numbered group's in the
    walk of its providers, the unsuffixed group over trees in the iteration of its set),
    files them by anchor (first seen first, groups in the query's order), and adds the
    product of each anchor's lists (the last group varying fastest) to the answer's
    set: a request's place in that set depends on its hash and on what was added
    before it. Request ``i`` takes item ``picks[i, g]`` of group ``g``'s list. Kept by
    the hashes in the order they are added."""
    hashes = _merged_hashes(graph, combos, classes, amounts)
    sequence = _merge_sequence(graph, groups, parts, picks, anchors, allowed)
    return _merged_set_order(hashes, sequence, cap, keep)


def general_merged_order(graph: ProviderGraph, amounts: Sequence[dict[int, dict[str, int]]],
                         cap: int | None = None, *, keep: int | None = None,
                         groups: Sequence[RequestGroup], merge: MergeTrace,
                         allowed: npt.NDArray[np.bool_] | None = None) -> list[int]:
    """:func:`merged_order` of the general path's requests (``amounts`` per request:
    provider -> class -> amount), from how its merge formed them (``merge``): several
    groups, ``same_subtree``, resourceless groups and sharing providers. A resourceless
    group's list is the walk of the set of ``(id, root id)`` pairs of the providers that
    meet its filters; its requests add no resources to the merged ones. One request
    formed at several anchors (sharing providers) is added once, where first formed;
    ``cap`` counts distinct requests."""
    hashes = np.asarray(request_hashes(graph, amounts), dtype=np.int64)
    sequence = _merge_sequence(graph, groups, merge.parts, merge.picks, merge.anchors, allowed,
                               merge.sharing)
    return _merged_set_order(hashes, sequence, cap, keep, merge.candidate)


def _merged_set_order(hashes: npt.NDArray[np.int64], sequence: npt.NDArray[np.int64],
                      cap: int | None, keep: int | None,
                      index: npt.NDArray[np.int64] | None = None) -> list[int]:
    """Positions of the requests with ``hashes`` in the iteration order of a set they
    were added to in ``sequence`` (until it holds ``cap``); the first ``keep`` of them.
    With ``index``, the sequence is of combinations and ``index[k]`` the request
    combination ``k`` forms (one request may be formed more than once: it is added
    once). Kept by the hashes and requests in the order they are added."""
    formed = sequence if index is None else index[sequence]
    added = hashes[formed]
    key = ("merged", added.tobytes(), formed.tobytes() if index is not None else b"", cap)
    found = _TREE_ORDERS.get(key)
    if found is None:
        if index is None:
            found = set_order(added.tolist(),
                              range(len(added) if cap is None else min(cap, len(added))))
        else:
            items: dict[int, _Hashed] = {}
            filled: set[_Hashed] = set()
            for k, request in enumerate(formed.tolist()):
                item = items.get(request)
                if item is None:
                    item = items[request] = _Hashed(int(added[k]), k)
                filled.add(item)
                if cap is not None and len(filled) >= cap:
                    break
            found = [item.index for item in filled]
        _TREE_ORDERS.put(key, found)
    return formed[np.asarray(found[:keep], dtype=np.int64)].tolist()  # type: ignore[no-any-return]


def _merge_sequence(graph: ProviderGraph, groups: Sequence[RequestGroup],
                    parts: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
                    picks: npt.NDArray[np.int64], anchors: npt.NDArray[np.int64],
                    allowed: npt.NDArray[np.bool_] | None = None,
                    sharing: Sequence[frozenset[int]] | None = None) -> npt.NDArray[np.int64]:
    """The requests in the order Placement's merge forms them (see :func:`merged_order`):
    by the rank of their anchor (where it is first seen in the first group's list, in
    which every anchor that has requests appears), then by their item's place in each
    group's list. ``sharing``: the request's sharing providers as each group found them
    (None: none narrowed, those of the graph)."""
    ranks = [_group_ranks(graph, group, part_anchors, part_combos, allowed,
                          graph.sharing if sharing is None else sharing[g])
             for g, (group, (part_anchors, part_combos)) in enumerate(zip(groups, parts))]
    first_anchors, _ = parts[0]
    listed = first_anchors[np.argsort(ranks[0], kind="stable")]
    seen, at = np.unique(listed, return_index=True)
    anchor_rank = np.full(graph.size, len(listed), dtype=np.int64)
    anchor_rank[seen] = at
    keys = [rank[picks[:, g]] for g, rank in reversed(list(enumerate(ranks)))]
    keys.append(anchor_rank[anchors])
    return np.lexsort(keys)


def _group_ranks(graph: ProviderGraph, group: RequestGroup, anchors: npt.NDArray[np.int64],
                 combos: npt.NDArray[np.int64], allowed: npt.NDArray[np.bool_] | None = None,
                 sharing: frozenset[int] | None = None) -> npt.NDArray[np.int64]:
    """Each of one group's requests' place in the list Placement forms for the group:
    a group of one provider walks the set of ``(id, root id)`` pairs of the providers
    with room for its last class (as :func:`flat_order`; a resourceless group, of those
    that meet its filters); the unsuffixed group over
    trees or sharing providers iterates the set its trees' sets were gathered in (as
    :func:`tree_order`). In a group of one provider, a sharing provider's request at its
    own root is followed by its copies at its other anchors, in the order of
    :func:`~berth.placement.candidates_gather.copy_anchors`. ``sharing``: the request's
    sharing providers as the group found them (None: the graph's). The list is kept by
    everything it depends on (the walk's providers, the requests' providers and
    anchors, the group), as the other orders are."""
    count = len(combos)
    ids, roots = id_arrays(graph)
    sharing = graph.sharing if sharing is None else sharing
    single = group.use_same_provider or not (graph.has_trees or sharing)
    tree = _in_tree_root(graph, group)
    classes = [list(group.resources)[-1]] if single and group.resources else \
        sorted(group.resources, key=lambda rc: graph.class_id[rc])
    fits = [] if group.resources else [np.flatnonzero(group_mask(graph, group))]
    for rc in classes:
        fit = graph.fit_mask(rc, group.resources[rc])
        if tree is not None:
            fit = fit & (graph.root_array == tree)
        fits.append(np.flatnonzero(fit))
    walks = not single and _walks_trees(graph, group)
    key = ("group", single, walks, tuple(group.resources.items()), group.in_tree,
           ids[combos].tobytes(), combos.shape, ids[anchors].tobytes(),
           tuple((ids[at].tobytes(), ids[roots[at]].tobytes()) for at in fits),
           _filters_key(graph, group, allowed) if walks else (),
           _sharing_key(graph, graph.sharing if single else sharing))
    order = _GROUP_ORDERS.get(key)
    if order is None:
        if single:
            walked = fits[0]
            position = np.full(graph.size, len(walked), dtype=np.int64)
            position[walked[_pair_walk(ids[walked], ids[roots[walked]])]] = \
                np.arange(len(walked))
            order = np.lexsort((_copy_ranks(graph, combos[:, 0], anchors),
                                position[combos[:, 0]])).tolist()
        else:
            hashes = _combo_hashes(graph, group, combos)
            walk = _tree_walk(graph, group, list(map(tuple, combos.tolist())), allowed,
                              sharing) if walks else None
            order = [i for i, _ in _group_set_order(hashes, anchors.tolist(), walk, count)]
        _GROUP_ORDERS.put(key, order)
    ranks = np.empty(count, dtype=np.int64)
    ranks[np.asarray(order, dtype=np.int64)] = np.arange(count, dtype=np.int64)
    return ranks


def _copy_ranks(graph: ProviderGraph, providers: npt.NDArray[np.int64],
                anchors: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each request's place among its provider's requests in a group of one provider:
    0 at the provider's own root, then its copies in the order of
    :func:`~berth.placement.candidates_gather.copy_anchors`."""
    ranks = np.zeros(len(providers), dtype=np.int64)
    if not graph.sharing:
        return ranks
    root = graph.root
    order: dict[int, dict[int, int]] = {}
    for i, (p, anchor) in enumerate(zip(providers.tolist(), anchors.tolist(), strict=True)):
        if p in graph.sharing and anchor != root[p]:
            if p not in order:
                order[p] = {a: k for k, a in enumerate(copy_anchors(graph, p), start=1)}
            ranks[i] = order[p].get(anchor, len(order[p]) + 1)
    return ranks


def _sharing_key(graph: ProviderGraph, sharing: Iterable[int]) -> tuple[bytes, ...]:
    """What the sharing providers' pairs depend on, for a kept order's key: each one's
    id and its aggregates' members' ids (empty without sharing providers)."""
    if not graph.sharing:
        return ()
    ids, _ = id_arrays(graph)
    out = []
    for s in sorted(sharing):
        members = sorted({j for a in graph.providers[s].aggregates for j in graph.by_agg[a]})
        out.append(ids[np.asarray([s, *members], dtype=np.int64)].tobytes())
    return tuple(out)


def _merged_hashes(graph: ProviderGraph, combos: npt.NDArray[np.int64], classes: Sequence[str],
                   amounts: Sequence[int]) -> npt.NDArray[np.int64]:
    """:func:`request_hashes` of requests kept as arrays (see :func:`merged_order`):
    a request's rows are its distinct (provider, class) pairs with their summed amounts."""
    ids, _ = id_arrays(graph)
    count, width = combos.shape
    rows = np.empty((count, width), dtype=np.int64)
    first = np.ones((count, width), dtype=np.bool_)  # the column that carries the row
    for c in range(width):
        total = np.zeros(count, dtype=np.int64)
        for o in range(width):
            if classes[o] != classes[c]:
                continue
            same = combos[:, o] == combos[:, c]
            total += np.where(same, amounts[o], 0)
            if o < c:
                first[:, c] &= ~same
        rows[:, c] = tuple_hashes([ids[combos[:, c]], np.full(count, hash(classes[c]),
                                                              dtype=np.int64), total])
    out = np.empty(count, dtype=np.int64)
    # Requests with the same carrying columns at a time (a bit per column).
    codes = (first.astype(np.int64) << np.arange(width, dtype=np.int64)).sum(axis=1)
    for code in np.unique(codes).tolist():
        at = np.flatnonzero(codes == code)
        pattern = [c for c in range(width) if code >> c & 1]
        matrix = np.sort(rows[at][:, pattern], axis=1)
        out[at] = tuple_hashes([matrix[:, j] for j in range(matrix.shape[1])])
    return out


def _in_tree_root(graph: ProviderGraph, group: RequestGroup) -> int | None:
    """The root of ``in_tree``'s tree (None: no ``in_tree``, or an unknown one)."""
    if group.in_tree is None or group.in_tree not in graph.index:
        return None
    return int(graph.root[graph.index[group.in_tree]])


def _answer_order(hashes: Sequence[int], anchors: Sequence[int],
                  walk: list[tuple[int, int]] | None, count: int, cap: int | None) -> list[int]:
    """Placement's set stages over one group's requests with ``hashes`` at ``anchors``,
    formed in the order ``walk`` (None: the engine's order)."""
    # The merge walks the group's set anchor by anchor (first seen first) into the
    # answer's set.
    by_anchor: dict[int, list[int]] = {}
    for i, anchor in _group_set_order(hashes, anchors, walk, count):
        by_anchor.setdefault(anchor, []).append(i)
    return set_order(hashes, [i for members in by_anchor.values() for i in members][:cap])


def _group_set_order(hashes: Sequence[int], anchors: Sequence[int],
                     walk: list[tuple[int, int]] | None, count: int) -> list[tuple[int, int]]:
    """The iteration order of the set of one group's requests, each with its anchor:
    each tree's requests gathered in a set of their own, in the order ``walk``
    (``(request, tree)`` pairs; None: the engine's order at ``anchors``), unioned in (a
    union, not one add per request: the table grows as Placement's does). A request
    formed at several trees (sharing providers alone) is one request, equal to itself
    wherever formed: it stays with the first tree that added it."""
    by_tree: dict[int, list[int]] = {}
    for i, tree in walk if walk is not None else zip(range(count), anchors):
        by_tree.setdefault(tree, []).append(i)
    items = [_Hashed(h, i) for i, h in enumerate(hashes)]
    group_set: set[_Hashed] = set()
    anchor_of: dict[int, int] = {}
    for tree, members in by_tree.items():
        tree_set = set()
        for i in members:
            tree_set.add(items[i])
            anchor_of.setdefault(i, tree)
        group_set |= tree_set
    return [(item.index, anchor_of[item.index]) for item in group_set]


def _combos(graph: ProviderGraph, group: RequestGroup | None,
            by_class: Sequence[tuple[int, ...]] | None,
            count: int) -> npt.NDArray[np.int64] | None:
    """``by_class`` as a matrix (request x class), when every request has one provider
    for each class of ``group``; None otherwise."""
    if group is None or by_class is None or len(by_class) != count or not count:
        return None
    width = len(group.resources)
    if width == 0 or any(len(c) != width for c in by_class):
        return None
    return np.asarray(by_class, dtype=np.int64).reshape(count, width)


def _combo_hashes(graph: ProviderGraph, group: RequestGroup,
                  combos: npt.NDArray[np.int64]) -> list[int]:
    """:func:`request_hash` of requests of one provider per class (columns of
    ``combos`` in class id order): one row per class, the class's amount."""
    ids, _ = id_arrays(graph)
    classes = sorted(group.resources, key=lambda rc: graph.class_id[rc])
    count = len(combos)
    lanes = [tuple_hashes([ids[combos[:, k]], np.full(count, hash(rc), dtype=np.int64),
                           np.full(count, group.resources[rc], dtype=np.int64)])
             for k, rc in enumerate(classes)]
    ordered = np.sort(np.stack(lanes, axis=1), axis=1)
    return tuple_hashes([ordered[:, k] for k in range(ordered.shape[1])]).tolist()


def request_hashes(graph: ProviderGraph,
                   amounts: Sequence[dict[int, dict[str, int]]]) -> list[int]:
    """:func:`request_hash` of every request (``amounts`` per request: provider ->
    class -> amount), computed for all rows at once (:func:`tuple_hashes`)."""
    if not amounts:
        return []
    ids = graph.ids
    class_hash: dict[str, int] = {}
    row_ids: list[int] = []
    row_classes: list[int] = []
    row_amounts: list[int] = []
    sizes: list[int] = []
    for a in amounts:
        size = 0
        for p, per_rc in a.items():
            for rc, n in per_rc.items():
                row_ids.append(ids[p])
                h = class_hash.get(rc)
                if h is None:
                    h = class_hash[rc] = hash(rc)
                row_classes.append(h)
                row_amounts.append(n)
                size += 1
        sizes.append(size)
    rows = tuple_hashes([np.asarray(row_ids, dtype=np.int64),
                         np.asarray(row_classes, dtype=np.int64),
                         np.asarray(row_amounts, dtype=np.int64)])
    # Requests of one size at a time: their row hashes as a matrix, sorted per request.
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes_arr)[:-1]))
    out = np.empty(len(amounts), dtype=np.int64)
    for size in np.unique(sizes_arr).tolist():
        which = np.flatnonzero(sizes_arr == size)
        if size == 0:
            out[which] = hash(())
            continue
        matrix = np.sort(rows[starts[which][:, None] + np.arange(size)], axis=1)
        out[which] = tuple_hashes([matrix[:, k] for k in range(size)])
    return out.tolist()


def _walks_trees(graph: ProviderGraph, group: RequestGroup) -> bool:
    """Whether Placement's walk for ``group`` is replayed: the unsuffixed group with
    resources (over trees or sharing providers)."""
    return not (group.suffix or not group.resources)


def _filters_key(graph: ProviderGraph, group: RequestGroup,
                 allowed: npt.NDArray[np.bool_] | None) -> tuple[bytes, ...]:
    """What the walk's filters (:func:`walk_filters`) depend on, for a kept order's key:
    the ids of the providers each mask marks."""
    filters = walk_filters(graph, group, allowed)
    if filters is None:
        return ()
    ids, _ = id_arrays(graph)
    masks = [filters.anchors, filters.member, filters.bad_aggs, *filters.required,
             filters.forbidden]
    return tuple(b"-" if m is None else ids[np.flatnonzero(m)].tobytes() for m in masks)


def _class_keys(graph: ProviderGraph, group: RequestGroup,
                amounts: Sequence[dict[int, dict[str, int]]]) -> list[tuple[int, ...]] | None:
    """Each request's provider per class of ``group`` in class id order, or None when
    a request does not have exactly one provider per class."""
    order = sorted(group.resources, key=lambda rc: graph.class_id[rc])
    keys = []
    for a in amounts:
        providers = {rc: p for p, per_rc in a.items() for rc in per_rc}
        if len(providers) != len(order):
            return None
        keys.append(tuple(providers[rc] for rc in order))
    return keys


def _tree_walk(graph: ProviderGraph, group: RequestGroup,
               keys: Sequence[tuple[int, ...]] | None,
               allowed: npt.NDArray[np.bool_] | None = None,
               sharing: Iterable[int] = ()) -> list[tuple[int, int]] | None:
    """The requests (positions into ``keys``: each request's provider per class in
    class id order) in the order Placement forms them for one unsuffixed group over
    trees or sharing providers, each with the tree (anchor) that forms it: the walk of
    :func:`~berth.placement.candidates_gather.gather`'s set, tree by tree, each tree's
    classes in id order in product order. A request of sharing providers alone is
    formed at every tree it serves. ``allowed``: the roots ``root_required`` allows;
    ``sharing``: the request's sharing providers as ``member_of`` narrowed them. None
    outside that shape, or when the walk does not form every request."""
    if keys is None or not _walks_trees(graph, group):
        return None
    found = gather(graph, group, allowed, sharing)
    if not found:
        return None
    width = len(group.resources)
    position = dict(zip(keys, range(len(keys))))
    walk: list[tuple[int, int]] = []
    for anchor, per_class in tree_sequence(graph, found).items():
        if len(per_class) != width:
            continue  # a tree short of a class forms no request
        lists = [per_class[c] for c in sorted(per_class)]
        walk.extend((i, anchor) for i in map(position.get, itertools.product(*lists))
                    if i is not None)
    return walk if len({i for i, _ in walk}) == len(keys) else None
